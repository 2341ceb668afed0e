// Law 9, oracle-agreement: outputs and weights agree with the float64 oracle within the derived bound (or
// FlashAttention's rule, whichever is larger).
#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace oracle_agreement_law {

const char* kWhy =
    "The implementation's outputs and weights agree with attncheck's float64 oracle run on the same (already "
    "rounded) inputs. Non-finite values are checked first. Tolerance per element: the larger of (a) the bound "
    "derived in attention/src/tolerance.cpp for a kernel that accumulates in float (score error "
    "gamma_D.scale.sum|q.k| + 4u_a|s|, turned by softmax into a relative weight error rho = exp(2 Delta + "
    "gamma_T + 5u_a) - 1, the output error max|v|(rho + gamma_T(1 + rho)), rounding to the dtype, subnormal "
    "floors; doubled) and (b) FlashAttention's rule: 2 x the error of attncheck's own kernel at the same dtype "
    "on the same inputs, plus a floor of u_s.max|v| (a valid kernel summing in another order can be off by "
    "about as much as the plain one in the other direction; the floor covers the plain one being exact by luck).";

// Long context: the weights at the sampled keys for every query row, against the streamed oracle's, with the
// same two rules (the reference's own sampled weights for FlashAttention's).
Verdict check_sampled_weights(const Implementation& impl, const Problem& p, const OracleRun& r) {
  const std::vector<Index> keys = sampled_keys(impl, p);
  const WeightSample got = sample_weights(impl, p, keys), mine = sample_weights(*reference_implementation(), p, keys);
  const Shape& s = got.w.shape();
  Tensor<double> want(s), tol(s);
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index i = 0; i < s.T; ++i)
        for (Index n = 0; n < s.D; ++n) {
          const Index j = keys[std::size_t(n)];
          want(b, h, i, n) = r.weight(p, b, h, i, j);
          // Hidden weights stay exact (tolerance 0) whatever the rule.
          tol(b, h, i, n) = visible(p, b, h, i, j) ? std::max(r.weight_tol(p, b, h, i, j),
                                                           2 * std::abs(mine.w(b, h, i, n) - want(b, h, i, n)) +
                                                               unit_roundoff(p.dtype))
                                                : 0.0;
        }
  const auto seen = seen_rows(p);
  return on_sample(compare("oracle-agreement", "weights", want, got.w, &tol, seen), got, p);
}

// Why a non-finite value from p is a bug and not overflow: every input is finite, and neither the product q·k
// (a kernel may form it before scaling) nor the scaled score can overflow the accumulation type (float for every
// dtype but float64; float16 kernels may keep QKᵀ in float16), so softmax is finite and every output a convex
// combination of V. Empty when that does not hold (a score may overflow: the law's comparison says what it saw).
std::string no_overflow(const Problem& p) {
  const auto finite = [](const Tensor<double>& t) { return t.values().allFinite(); };
  if (!finite(p.q) || !finite(p.k) || !finite(p.v)) return "";
  const double product = double(p.q.shape().D) * p.q.values().cwiseAbs().maxCoeff() * p.k.values().cwiseAbs().maxCoeff();
  const double score = product * scale_of(p);
  const double limit = p.dtype == DType::f64 ? max_finite(DType::f64)
                       : p.dtype == DType::f16 ? max_finite(DType::f16)
                                               : max_finite(DType::f32);
  if (!(std::max(product, score) < limit / 2)) return "";
  return "every input is finite and neither a product q·k (|q·k| <= " + format_number(product, 3) +
         ") nor a scaled score (|score| <= " + format_number(score, 3) + ") can overflow " +
         std::string(dtype_name(p.dtype == DType::f64 ? DType::f64 : p.dtype == DType::f16 ? DType::f16 : DType::f32));
}

// A non-finite value where the oracle's is finite, from inputs that cannot overflow: said as such (the message
// begins "non-finite output:", as a call's failure kind does), naming the entry.
std::optional<Violation> with_nonfinite_reason(std::optional<Violation> v, const Problem& p) {
  if (!v || !v->actual || v->worst_index.size() != 4 || std::isfinite(v->magnitude)) return v;
  const auto& w = v->worst_index;
  if (std::isfinite((*v->actual)(w[0], w[1], w[2], w[3]))) return v;
  if (const std::string why = no_overflow(p); !why.empty()) v->message = "non-finite output: " + v->message + ", although " + why;
  return v;
}

Verdict check(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  Outcome o = call(impl, outputs_first(impl, p));  // weights only once the outputs pass
  OracleRun r = run_oracle(p);
  const Outcome mine = widen_by_reference_error(p, r);
  const auto seen = seen_rows(p);
  if (auto v = with_nonfinite_reason(compare("oracle-agreement", "output", r.out, o.output, &r.tol_out, seen), p)) {
    v->weights = o.weights;
    return v;
  }
  if (r.streamed || samples_weights(impl, p)) return c.outputs_only ? Verdict() : check_sampled_weights(impl, p, r);
  r.tol_w.values() = r.tol_w.values().cwiseMax(2 * (mine.weights->values() - r.w.values()).cwiseAbs() +
                                               Eigen::VectorXd::Constant(r.w.size(), unit_roundoff(p.dtype)));
  o.weights = weights_of(impl, c, o);
  if (o.weights) {
    // Future weights stay exact (tolerance 0) whatever the rule.
    const Include hidden = hidden_keys(p);
    for (Index b = 0; b < r.tol_w.shape().B; ++b)
      for (Index h = 0; h < r.tol_w.shape().H; ++h)
        for (Index i = 0; i < r.tol_w.shape().T; ++i)
          for (Index j = 0; j < r.tol_w.shape().D; ++j)
            if (hidden(b, h, i, j)) r.tol_w(b, h, i, j) = 0;
    if (auto v = with_nonfinite_reason(compare("oracle-agreement", "weights", r.w, *o.weights, &r.tol_w, seen), p)) {
      v->weights = o.weights;
      return v;
    }
  }
  return std::nullopt;
}

}  // namespace oracle_agreement_law
}  // namespace

Law oracle_agreement() {
  using namespace oracle_agreement_law;
  return {"oracle-agreement", "outputs and weights agree with the float64 oracle within the derived bound", kWhy,
          LawDoc{"9", "outputs and weights agree with the float64 oracle",
                 "max(derived bound, 2 × the core's own error at the dtype + u_s·max|v|)"},
          always_applies, gen_plain, check, 0};
}

}  // namespace attncheck::law_kit
