// Gradient law grad-dv-weights: dV = Wᵀ dO with W the weights the implementation's own forward applies
// (returned, or recovered by probing), within a derived bound.
#include "registry.hpp"
#include "support.hpp"

#include <limits>
#include <string>
#include <vector>

namespace attncheck::law_kit {
namespace {
namespace grad_dv_weights_law {

const char* kWhy =
    "O = W V is linear in V, so dV = W^T dO with W the weights the forward applied: the backward must "
    "differentiate the forward it belongs to (for a shared kv head, summed over its group). A backward that "
    "builds dV from unnormalised exp(scores), or recomputes the weights with another row's log-sum-exp, breaks "
    "it even when its forward is right. Tolerance per element: the forward's returned weights and the "
    "backward's own (recomputed) weights are each within rho + u_s relative of the exact ones (rho from "
    "attention/src/tolerance.cpp), so they differ by at most 2(rho + u_s) W_ij (and by at most 1), plus the "
    "n-term sum (gamma_n, n = group size x T_q), the final rounding u_s|dV|, and the exp and flush-to-zero floors "
    "(every product and partial sum below the smallest normal may be 0); doubled. Rows that see no key add "
    "nothing (under the nan convention their dO is 0). At a long context (B*H*T_q*T_k > 2^22) W is not held: dV "
    "is compared at sampled keys (both ends, the middle, both sides of every power of two), from every query's "
    "weight on them, probed by one-hot values, with rho streamed with the head's modifiers.";

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  ProblemOptions po;
  po.want_weights = true;
  return rc::gen::map(gen_gradient_case(cfg, po), [cfg](LawCase c) { return zero_empty_row_d_output(cfg, std::move(c)); });
}

// A long context: W cannot be held, so the law samples keys (sampled_keys: both ends, the middle, both sides of
// every power of two) and reads every query's weight on them by one-hot probing (sample_weights); dV is checked
// in full on those keys, with the same bound per element. ρ comes streamed, with the head's modifiers
// (streamed_weight_relative_error: tolerance.cpp's formula on the same row statistics).
Verdict check_sampled(const Implementation& impl, const Problem& p) {
  const Gradients g = call_backward(impl, p);
  const WeightSample ws = sample_weights(impl, p, sampled_keys(p));
  const Tensor<double> rho = streamed_weight_relative_error(p.dtype, p.q, p.k, p.options());
  const Tensor<double>& dO = *p.d_output;
  const Shape& s = p.q.shape();
  const Index n_keys = Index(ws.keys.size()), Dv = p.v.shape().D;
  const double u_s = unit_roundoff(p.dtype), u_a = accumulation_roundoff(p.dtype);
  const double floors = smallest_normal(p.dtype == DType::f64 ? DType::f64 : DType::f32) + storage_floor(p.dtype);
  const double g_n = gamma(s.T * (s.H / p.kv_heads()), u_a);
  const Shape sampled{s.B, p.kv_heads(), n_keys, Dv};
  Tensor<double> want(sampled), tol(sampled), got(sampled);
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) {
      const Index kv = kv_of(p, h);
      const Visibility vis = p.visibility(b, h);
      for (Index i = 0; i < s.T; ++i) {
        if (vis.keys(i).empty()) continue;  // as check(): a row that sees no key adds nothing
        const double r = rho(b, h, i, 0);
        for (Index c = 0; c < n_keys; ++c) {
          const double w = ws.w(b, h, i, c);
          const double dw = std::isinf(r) ? 1.0 : std::min(1.0, 2 * (r + u_s) * w);
          want.head(b, kv).row(c) += w * dO.head(b, h).row(i);
          tol.head(b, kv).row(c) += kSafety * (dw + g_n * w + 2 * floors) * dO.head(b, h).row(i).cwiseAbs();
        }
      }
    }
  tol.values() += kSafety * u_s * want.values().cwiseAbs();
  tol.values().array() += storage_floor(p.dtype) + kSafety * double(s.T * (s.H / p.kv_heads())) * floors;
  for (Index b = 0; b < s.B; ++b)
    for (Index kv = 0; kv < p.kv_heads(); ++kv)
      for (Index c = 0; c < n_keys; ++c) got.head(b, kv).row(c) = g.dv.head(b, kv).row(ws.keys[std::size_t(c)]);
  const std::string what = "dV compared at the sampled keys only; " + describe_sample(ws, p);
  auto v = compare("grad-dv-weights", "dv", want, got, &tol, {});
  if (v) {
    const std::vector<Index> at = v->worst_index;
    v->worst_index[2] = ws.keys[std::size_t(at[2])];  // the real key, in the index and in the message
    const std::string from = "dv" + idx({at[0], at[1], at[2], at[3]}),
                      to = "dv" + idx({at[0], at[1], v->worst_index[2], at[3]});
    if (const auto pos = v->message.find(from); pos != std::string::npos) v->message.replace(pos, from.size(), to);
    v->expected.reset();  // [.., keys, D_v], not dV's shape
    v->actual.reset();
    v->tolerances.reset();
    v->message += " (expected: W^T dO with the weights W its own forward applied) [" + what + "]";
  }
  return {std::move(v), what};
}

Verdict check(const Implementation& impl, const LawCase& c) {
  if (long_context(c.problem)) return check_sampled(impl, c.problem);
  Problem p = c.problem;
  p.want_weights = true;
  const Outcome o = call(impl, p);
  const Gradients g = call_backward(impl, p);
  const Tensor<double>& W = *o.weights;
  const Tensor<double>& dO = *p.d_output;
  const Shape& s = p.q.shape();
  const double u_s = unit_roundoff(p.dtype), u_a = accumulation_roundoff(p.dtype);
  // Eigen's float exp floor (2^-126), the dtype's flush-to-zero floor, and the accumulation type's smallest
  // normal, below which an FTZ kernel flushes a product (attention/src/backward.cpp, steps 1 and 9).
  const double floors = smallest_normal(p.dtype == DType::f64 ? DType::f64 : DType::f32) + storage_floor(p.dtype);
  const double g_n = gamma(s.T * (s.H / p.kv_heads()), u_a);
  Tensor<double> want(p.v.shape()), tol(p.v.shape());
  // ρ with the head's modifiers, on q and k with their prologue folded in (tolerance.cpp steps 7 to 9).
  const AttentionOptions folded = folded_options(p.options());
  const Tensor<double> q = fold_queries(p.q, p.options(), "grad-dv-weights"),
                       k = fold_keys(p.k, p.options(), "grad-dv-weights");
  for (Index b = 0; b < s.B; ++b) {
    for (Index h = 0; h < s.H; ++h) {
      const BoolMask mask = BoolMask::of(p.visibility(b, h));
      const Index kv = kv_of(p, h);
      const Eigen::VectorXd rho = weight_relative_error(p.dtype, q.head(b, h), k.head(b, kv), mask, scale_of(p),
                                                        head_modifiers(folded, b, h, s.T, p.k.shape().T));
      for (Index i = 0; i < s.T; ++i) {
        // A row that sees no key adds nothing to dV (its weights are 0, or NaN under the nan convention, where
        // its dO is 0 and a correct backward leaves it out).
        if (sees_none(p, b, h, i)) continue;
        for (Index j = 0; j < p.k.shape().T; ++j) {
          const double w = W(b, h, i, j);
          const double dw = std::isinf(rho(i)) ? 1.0 : std::min(1.0, 2 * (rho(i) + u_s) * w);
          want.head(b, kv).row(j) += w * dO.head(b, h).row(i);
          tol.head(b, kv).row(j) += kSafety * (dw + g_n * w + 2 * floors) * dO.head(b, h).row(i).cwiseAbs();
        }
      }
    }
  }
  tol.values() += kSafety * u_s * want.values().cwiseAbs();
  tol.values().array() += storage_floor(p.dtype) + kSafety * double(s.T * (s.H / p.kv_heads())) * floors;
  auto v = compare("grad-dv-weights", "dv", want, g.dv, &tol, {});
  if (v) {
    v->message += " (expected: W^T dO with the weights W its own forward applied)";
    v->weights = o.weights;
  }
  return v;
}

std::string applies(const GenConfig& g) {
  if (auto why = needs_backward(g); !why.empty()) return why;
  return needs_weights(g);
}

}  // namespace grad_dv_weights_law
}  // namespace

Law grad_dv_weights() {
  using namespace grad_dv_weights_law;
  return {"grad-dv-weights", "dV = W^T dO with W the implementation's own forward weights, within the derived bound",
          kWhy,
          LawDoc{"37", "dV = Wᵀ dO with the implementation's own weights (returned or probed)",
                 "2(ρ+u_s)·W per weight, γ_n, u_s|dV|, floors; doubled"},
          applies,
          gen,               check,
          0,                 true};
}

}  // namespace attncheck::law_kit
