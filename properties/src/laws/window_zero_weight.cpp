// window-zero-weight (exact): every key older than a query's window gets weight exactly 0.
#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace window_zero_weight_law {

const char* kWhy =
    "With a left window w (FlashAttention's window_size, Mistral's and Gemma's sliding windows) the query at "
    "aligned position p sees only the keys p - w <= j <= p: every older key is masked like a future one, and "
    "exp(-inf) is exactly 0 in every dtype, so its weight is exactly 0, not small (in a row that sees no key "
    "a NaN weight is the nan convention). A window one key too wide, a window measured from the query index "
    "instead of its aligned position, or a window applied only inside the diagonal tile of a tiled kernel "
    "leaves weight there. Exact: no tolerance. Applies to implementations that honour windows "
    "(Feature::window).";

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  ProblemOptions po;
  po.require.add(Feature::window);
  return gen_problem(cfg, po);
}

Verdict check(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  if (!p.window) return std::nullopt;
  // Positions depend on the batch entry only through its documents' query bounds.
  std::vector<Visibility> vis;
  for (Index b = 0; b < p.q.shape().B; ++b) vis.push_back(p.visibility(b));
  return hidden_weights_are_zero("window-zero-weight", impl, p, [&](Index b, Index, Index i, Index j) {
    return j < vis[std::size_t(b)].position(i) - *p.window;
  });
}

std::string not_applicable(const GenConfig& g) {
  if (!g.caps.declares(Feature::window))
    return "the implementation does not honour a sliding window (Feature::window)";
  return needs_weights(g);
}

}  // namespace window_zero_weight_law
}  // namespace

Law window_zero_weight() {
  using namespace window_zero_weight_law;
  return {"window-zero-weight", "every key older than a query's window gets weight exactly 0", kWhy,
          LawDoc{"19", "every key older than a query's window gets weight exactly 0", "exact"},
          not_applicable,
          gen, check, 0};
}

}  // namespace attncheck::law_kit
