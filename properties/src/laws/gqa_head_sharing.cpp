// Law 16, gqa-head-sharing: with grouped queries, perturbing kv head g changes only the query heads of group g,
// and perturbing query head h changes only head h (exact).
#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace gqa_head_sharing_law {

const char* kWhy =
    "With grouped-query attention (K and V with H_kv heads, H_kv dividing H) query head h reads kv head "
    "h / (H / H_kv), the convention of repeat_interleave, FlashAttention and ggml. So changing kv head g of "
    "batch entry b must leave every query head outside group g (with G = H / H_kv, heads g*G .. (g+1)*G - 1 of "
    "entry b), and every other batch entry, bit-identical; and changing query head h must leave every other head "
    "bit-identical. Exact: the unchanged heads' arithmetic is the same. A kernel that picks the kv head as "
    "h % H_kv, or computes the group size wrongly, breaks the first; one that mixes query heads, the second. "
    "Needs an implementation that declares grouped-query attention.";

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    LawCase c = *gen_problem(cfg, outputs_only());
    const Problem& p = c.problem;
    const Shape s = p.q.shape();
    const Index T_k = p.k.shape().T;
    // Which kv head and which query head change, and their new values: all drawn unconditionally.
    const Index b = *rc::gen::inRange<Index>(0, s.B), g = *rc::gen::inRange<Index>(0, p.kv_heads());
    const Index h = *rc::gen::inRange<Index>(0, s.H);
    const double m = *gen_magnitude();
    Problem v = p;
    v.q.head(b, h) = (*gen_tensor({1, 1, s.T, s.D}, Regime::normal, m, cfg.dtype)).head(0, 0);
    v.k.head(b, g) = (*gen_tensor({1, 1, T_k, s.D}, Regime::normal, m, cfg.dtype)).head(0, 0);
    v.v.head(b, g) = (*gen_tensor({1, 1, T_k, p.v_dim()}, Regime::normal, m, cfg.dtype)).head(0, 0);
    c.variant = v;  // holds both changes; the check makes them one at a time
    c.params["b"] = double(b);
    c.params["g"] = double(g);
    c.params["h"] = double(h);
    return c;
  });
}

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const char* law = "gqa-head-sharing";
  const Index cb = int_param(c, law, "b", 0, p.q.shape().B - 1), cg = int_param(c, law, "g", 0, p.kv_heads() - 1),
              ch = int_param(c, law, "h", 0, p.q.shape().H - 1);
  const Index group = p.q.shape().H / p.kv_heads();
  const Problem& changed = variant_of(c, law);
  const Outcome a = call(impl, p);
  // Kv head g alone changed: only the heads of its group may change.
  Problem kv_changed = p;
  kv_changed.k = changed.k;
  kv_changed.v = changed.v;
  const Outcome kv = call(impl, kv_changed);
  auto v = compare(law, "output", a.output, kv.output, nullptr,
                   [&](Index b, Index h, Index, Index) { return b != cb || h / group != cg; });
  if (v) {
    v->message += "; only kv head " + std::to_string(cg) + " of batch entry " + std::to_string(cb) +
                  " was changed, which query heads " + std::to_string(cg * group) + ".." +
                  std::to_string((cg + 1) * group - 1) + " alone read (H = " + std::to_string(p.q.shape().H) +
                  ", H_kv = " + std::to_string(p.kv_heads()) + ")";
    v->weights = kv.weights;
    return v;
  }
  // Query head h alone changed: only head h may change.
  Problem q_changed = p;
  q_changed.q = changed.q;
  const Outcome q = call(impl, q_changed);
  v = compare(law, "output", a.output, q.output, nullptr,
              [&](Index b, Index h, Index, Index) { return b != cb || h != ch; });
  if (v) {
    v->message += "; only query head " + std::to_string(ch) + " of batch entry " + std::to_string(cb) + " was changed";
    v->weights = q.weights;
  }
  return v;
}

std::string not_applicable(const GenConfig& g) {
  if (!g.caps.declares(Feature::gqa))
    return "needs grouped-query attention (K and V with fewer heads than Q), which this implementation does not "
           "declare";
  return g.max_H < 2 ? "needs two query heads to share a kv head, but --max-H is 1" : "";
}

}  // namespace gqa_head_sharing_law
}  // namespace

Law gqa_head_sharing() {
  using namespace gqa_head_sharing_law;
  return {"gqa-head-sharing",
          "changing kv head g changes only the query heads of group g; changing query head h changes only head h",
          kWhy,
          LawDoc{"15",
                 "changing kv head g changes only the query heads of group g; changing query head h changes only head h",
                 "exact (bit-identical)"},
          not_applicable,
          gen,
          check,
          0};
}

}  // namespace attncheck::law_kit
