// Gradient law grad-causality (exact): a key no query with a non-zero dO sees gets exactly zero dK and dV, and
// changing future keys and values leaves dQ of every earlier query bit-identical.
#include <vector>

#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace grad_causality_law {

const char* kWhy =
    "Gradient flows only along the edges the forward used. (a) dK_j and dV_j are sums over the queries that see "
    "key j of terms that carry dO_i (dV: P_ij dO_i; dK: dS_ij q_i, and dS_i is 0 when dO_i is 0), so when dO is 0 "
    "on every query that sees key j they are exactly 0: here dO is 0 after a position t, so every key after the "
    "last one t sees (and every padding key) must get none. (b) dQ_i sums dS_ij k_j over the keys i sees and "
    "dS_ij = 0 on the others, so replacing keys and values in the future of t leaves dQ_i bit-identical for "
    "every i <= t (a zero's sign aside: 0 k_j takes k_j's sign). A backward that forgets the mask on dS, or adds a finite mask constant, breaks both. Exact: "
    "no tolerance.";

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    LawCase c = *gen_gradients_with(cfg, outputs_only().causal_rule());
    Problem& p = c.problem;
    const Shape& s = p.q.shape();
    const Index t = *rc::gen::inRange<Index>(0, std::max<Index>(s.T - 1, 1));
    const Tensor<double> zero(p.output_shape());
    replace_rows(*p.d_output, zero, t + 1);  // dO = 0 on every query after t
    const double m = *gen_magnitude();
    const auto q2 = *gen_tensor(s, Regime::normal, m, cfg.dtype);
    const auto k2 = *gen_tensor(p.k.shape(), Regime::normal, m, cfg.dtype);
    const auto v2 = *gen_tensor(p.v.shape(), Regime::normal, m, cfg.dtype);
    c.variant = perturb_future(p, t, q2, k2, v2);
    c.params["t"] = double(t);
    return c;
  });
}

// Per key of kv head g in batch entry b: whether a query with a non-zero dO sees it. Each such query's visible
// runs are marked in a difference array, so O(T_q + T_k) per head (O(T_q·T_k) only under a block or dense mask,
// which is itself that size): a long context needs no [T_q,T_k] loop.
std::vector<char> reached_keys(const Problem& p, Index b, Index g) {
  const Shape& s = p.q.shape();
  const Index T_k = p.k.shape().T;
  std::vector<Index> diff(std::size_t(T_k + 1), 0);
  for (Index h = 0; h < s.H; ++h) {
    if (kv_of(p, h) != g) continue;
    const Visibility vis = p.visibility(b, h);
    for (Index i = 0; i < s.T; ++i) {
      if (p.d_output->head(b, h).row(i).isZero(0)) continue;
      vis.for_each_run(i, 0, T_k, [&](Index a, Index e) {
        ++diff[std::size_t(a)];
        --diff[std::size_t(e)];
      });
    }
  }
  std::vector<char> reached(std::size_t(T_k), 0);
  Index open = 0;
  for (Index j = 0; j < T_k; ++j) reached[std::size_t(j)] = (open += diff[std::size_t(j)]) > 0;
  return reached;
}

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Index t = int_param(c, "grad-causality", "t", 0, p.q.shape().T - 1);
  const Gradients g = call_backward(impl, p);
  // (a) exactly 0, either sign of zero.
  for (const auto& [name, grad] : {std::pair{"dk", &g.dk}, std::pair{"dv", &g.dv}}) {
    const Shape& s = grad->shape();
    for (Index b = 0; b < s.B; ++b)
      for (Index kv = 0; kv < s.H; ++kv) {
        const std::vector<char> reached = reached_keys(p, b, kv);
        for (Index j = 0; j < s.T; ++j) {
          if (reached[std::size_t(j)]) continue;
          for (Index d = 0; d < s.D; ++d) {
            if ((*grad)(b, kv, j, d) == 0) continue;
            Violation v;
            v.quantity = name;
            v.worst_index = {b, kv, j, d};
            v.magnitude = std::abs((*grad)(b, kv, j, d));
            v.expected = Tensor<double>(s);
            v.actual = *grad;
            v.message = "grad-causality: " + std::string(name) + idx({b, kv, j, d}) + " is " +
                        num((*grad)(b, kv, j, d)) + " but must be exactly 0: every query that sees key " +
                        std::to_string(j) + " has dO = 0 (dO is 0 after position " + std::to_string(t) + ")";
            return v;
          }
        }
      }
  }
  // (b) bit-identical dQ at positions <= t, up to the sign of a zero: a kernel that multiplies the whole dS row
  // by K (numpy, PyTorch) adds 0·k_j for hidden keys, and that zero's sign follows k_j's, so an exact-zero dQ
  // may come out as -0 or +0 (compare's exact comparison, same_value, takes them as equal).
  const Gradients g2 = call_backward(impl, variant_of(c, "grad-causality"));
  auto v = compare("grad-causality", "dq", g.dq, g2.dq, nullptr, [t](Index, Index, Index i, Index) { return i <= t; });
  if (v) v->message += "; only keys and values in the future of position " + std::to_string(t) + " were changed";
  return v;
}

}  // namespace grad_causality_law
}  // namespace

Law grad_causality() {
  using namespace grad_causality_law;
  return {"grad-causality",
          "dK, dV of keys reached by no non-zero dO are exactly 0; future keys and values leave earlier dQ "
          "bit-identical",
          kWhy,
          LawDoc{"35",
                 "(a) keys seen by no query with non-zero dO get dK = dV = 0; (b) changing future keys/values leaves earlier dQ bit-identical",
                 "exact (a zero's sign aside)"},
          needs_backward,
          gen,
          check,
          0,
          true};
}

}  // namespace attncheck::law_kit
