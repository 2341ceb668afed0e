// Gradient law grad-key-sum-zero: Σ_j dK_j = 0 for every (b, kv head), within a derived bound.
#include <cmath>

#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace grad_key_sum_zero_law {

const char* kWhy =
    "Softmax is invariant to adding one number to every score of a row, so the row's score gradient sums to 0: "
    "sum_j dS_ij = sum_j P_ij dP_ij - Delta_i sum_j P_ij = 0. Hence sum_j dK_j = scale sum_i q_i sum_j dS_ij = 0 "
    "for every (b, kv head), GQA groups, padding and windows included. A backward whose Delta is not "
    "rowsum(dO o O), that accumulates dK from P instead of dS, or leaks dS to hidden keys breaks it. Tolerance: "
    "the exact dK sums to 0 and each computed dK_jc is within the grad-oracle bound t_jc of the oracle, which "
    "is itself within t_jc of the exact value, so |sum_j dK_jc| <= 2 sum_j t_jc + gamma_T(u_double) sum_j "
    "|dK_jc| (the sum taken here, in double).";

// Σ_j dS_ij = Δ_i·p_sink with a sink, a softcap scales each dS_ij by its own derivative, and a rope turns each dK_j
// back by its own key's rotation (dK_j = R_jᵀ dK'_j, whose sum is not 0), and QK-norm by its own key's Jacobian: none
// is drawn.
rc::Gen<LawCase> gen(const GenConfig& cfg) {
  ProblemOptions po = outputs_only();
  po.allow.remove({Feature::softcap, Feature::sinks, Feature::rope, Feature::rope_interleaved, Feature::qk_norm,
                   Feature::qk_norm_eps_outside});
  return rc::gen::map(gen_gradient_case(cfg, po), [cfg](LawCase c) { return zero_empty_row_d_output(cfg, std::move(c)); });
}

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Gradients g = call_backward(impl, p);
  // Only dK's bound is read: at a long context the streamed check skips dQ's pass over every query block.
  GradientRows dk_only;
  for (Index j = 0; j < p.k.shape().T; ++j) dk_only.keys.push_back(j);
  const GradientCheck r = run_gradient_oracle(p, long_context(p) ? &dk_only : nullptr);
  const Shape& s = g.dk.shape();
  Tensor<double> sum({s.B, s.H, 1, s.D}), tol({s.B, s.H, 1, s.D});
  const double g_T = gamma(s.T, unit_roundoff(DType::f64));
  for (Index b = 0; b < s.B; ++b)
    for (Index kv = 0; kv < s.H; ++kv)
      for (Index d = 0; d < s.D; ++d) {
        double total = 0, abs_total = 0, t = 0;
        for (Index j = 0; j < s.T; ++j) {
          total += g.dk(b, kv, j, d);
          // A non-finite dK fails on its own (its sum is not finite); it must not turn the bound into NaN.
          if (std::isfinite(g.dk(b, kv, j, d))) abs_total += std::abs(g.dk(b, kv, j, d));
          t += r.tolerance.dk(b, kv, j, d);
        }
        sum(b, kv, 0, d) = total;
        tol(b, kv, 0, d) = 2 * t + g_T * abs_total;
      }
  auto v = compare("grad-key-sum-zero", "dk-sum", Tensor<double>(sum.shape()), sum, &tol, {});
  if (v) v->message += " (the sum over keys j of dk[b,g,j,c], which must be 0)";
  return v;
}

}  // namespace grad_key_sum_zero_law
}  // namespace

Law grad_key_sum_zero() {
  using namespace grad_key_sum_zero_law;
  return {"grad-key-sum-zero", "the dK of every (b, kv head) sums to 0 over keys, within the derived bound",
          kWhy,
          LawDoc{"36", "Σ_j dK_j = 0 per (b, kv head)", "2·Σ_j grad-oracle bound + γ_T(u₆₄)·Σ|dK|"},
          needs_backward,
          gen,                 check,
          0,                   true};
}

}  // namespace attncheck::law_kit
