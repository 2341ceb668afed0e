// Law 12, strict-causality-nonfinite (exact): NaN or Inf in future inputs never reaches an earlier output.
#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace strict_causality_nonfinite_law {

const char* kWhy =
    "Under a boolean (select) mask, NaN or Inf placed in future queries, keys or values never reaches an "
    "earlier output: the masked scores are never read and the future values are never multiplied. An "
    "additive mask turns inf + (-inf) and 0 * Inf into NaN; a weights @ V product over all keys lets a future "
    "NaN through. Applies to implementations that claim select semantics (Capabilities::nonfinite_safe). "
    "Exact: no tolerance.";

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    LawCase c = *gen_problem(cfg, outputs_only().causal_rule());
    const Problem& p = c.problem;
    const Index t = *rc::gen::inRange<Index>(0, std::max<Index>(p.q.shape().T - 1, 1));
    const double inf = std::numeric_limits<double>::infinity();
    const double bad = *rc::gen::element(std::numeric_limits<double>::quiet_NaN(), inf, -inf);
    const auto fill = [&](const Shape& s) {
      Tensor<double> r(s);
      r.values().setConstant(bad);
      return r;
    };
    // Which of q, k, v get the non-finite value (at least one); shrinks toward v only.
    const int which = *rc::gen::inRange(1, 8);
    c.variant = perturb_future(p, t, (which & 4) ? fill(p.q.shape()) : p.q, (which & 2) ? fill(p.k.shape()) : p.k,
                               (which & 1) ? fill(p.v.shape()) : p.v);
    c.params["t"] = double(t);
    c.tags.push_back(std::isnan(bad) ? "future=NaN" : "future=Inf");
    return c;
  });
}

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  return check_earlier_outputs_unchanged("strict-causality-nonfinite", "set to NaN/Inf", impl, c);
}

std::string not_applicable(const GenConfig& g) {
  return g.caps.nonfinite_safe ? std::string()
                               : std::string("the implementation does not claim select-mask semantics "
                                             "(Capabilities::nonfinite_safe)");
}

}  // namespace strict_causality_nonfinite_law
}  // namespace

Law strict_causality_nonfinite() {
  using namespace strict_causality_nonfinite_law;
  return {"strict-causality-nonfinite", "NaN or Inf in future inputs never reaches an earlier output", kWhy,
          LawDoc{"12",
                 "NaN/Inf in future inputs never reaches an earlier output (for kernels that claim select-mask semantics)",
                 "exact"},
          not_applicable, gen, check, 0};
}

}  // namespace attncheck::law_kit
