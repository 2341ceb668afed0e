// Law 1, row-stochastic: every row of weights with a visible key is >= 0, finite and sums to 1.
#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace row_stochastic_law {

const char* kWhy =
    "Softmax turns each query's scores into a probability distribution over the keys it can see: every weight "
    "is finite and >= 0, and a row with at least one visible key sums to 1. A mask applied after softmax, "
    "softmax over the query axis, or an overflow to NaN breaks it. Tolerance on |sum - 1|: the T_k-term sum "
    "and the division give gamma_{2T_k}(u_a) + 2u_a in the accumulation type (2T_k covers an online softmax's "
    "rescalings), rounding each weight to the dtype adds u_s in all plus, for each weight below the dtype's "
    "smallest normal, that normal (a flush-to-zero kernel returns it as 0); a split-KV or tiled kernel that "
    "normalises by a log-sum-exp rounded in the accumulation type moves every weight of the row, and so its sum, "
    "by a factor within exp(+-lambda), lambda = 10 u_a (max|s| + ln T_k) (attention/src/tolerance.cpp, step 2b; "
    "max|s| bounded by Cauchy-Schwarz); the whole is doubled, and the check's own double sum adds "
    "gamma_{T_k}(2^-53).";

// λ_i per query row of head (b, h): the exponent error of a rounded log-sum-exp (tolerance.cpp, step 2b), from
// the Cauchy-Schwarz bound on the row's largest visible |score|.
Eigen::VectorXd lse_error(const Problem& p, Index b, Index h) {
  const Visibility vis = p.visibility(b, h);
  const Eigen::VectorXd s_max = row_abs_score_bound(p, b, h);
  Eigen::VectorXd lambda(s_max.size());
  for (Index i = 0; i < s_max.size(); ++i) lambda(i) = lse_exponent_error(p.dtype, s_max(i), vis.count(i));
  return lambda;
}

// Weight [b,h,i,j] is negative or not finite.
Violation bad_weight(Index b, Index h, Index i, Index j, double x) {
  Violation v;
  v.quantity = "weights";
  v.worst_index = {b, h, i, j};
  v.magnitude = x;
  v.message = "row-stochastic: weights" + idx({b, h, i, j}) + " is " + num(x) +
              (std::isfinite(x) ? " (negative)" : " (not finite)");
  return v;
}

// Row [b,h,i] of the weights sums to `sum`, more than `tol` away from 1.
Violation bad_sum(Index b, Index h, Index i, double sum, double tol) {
  Violation v;
  v.quantity = "weights";
  v.worst_index = {b, h, i};
  v.magnitude = std::abs(sum - 1);
  v.tolerance = tol;
  v.message = "row-stochastic: row " + idx({b, h, i}) + " of the weights sums to " + num(sum) + ", not 1 (off by " +
              num(std::abs(sum - 1)) + ", tolerance " + num(tol) + ")";
  return v;
}

// Long context. Sums: with V's column 0 all ones, output[i,0] = Σ_j w_ij·1, the row sum as the kernel itself
// accumulates it: the weights' own slack (γ_{2T_k} + 2u_a), the T_k-term accumulation of the product γ_{T_k},
// rounding the output to the dtype u_s, the log-sum-exp's factor expm1(λ_i), and the weights and partial sums
// an FTZ kernel flushes (below 2^-126 in float: 2·T_k·N_a); doubled. Signs and finiteness: the sampled weights.
Verdict check_sampled(const Implementation& impl, const Problem& p) {
  const Shape& s = p.q.shape();
  const Index T_k = p.k.shape().T;
  const double u_a = accumulation_roundoff(p.dtype), u_s = unit_roundoff(p.dtype);
  const double n_a = smallest_normal(p.dtype == DType::f64 ? DType::f64 : DType::f32);
  const double base = gamma(2 * T_k, u_a) + gamma(T_k, u_a) + 2 * u_a + u_s + 2 * double(T_k) * n_a;
  Problem ones = p;
  ones.want_weights = false;
  ones.v = Tensor<double>(p.k.shape());
  for (Index b = 0; b < p.k.shape().B; ++b)
    for (Index g = 0; g < p.k.shape().H; ++g) ones.v.head(b, g).col(0).setOnes();
  const Outcome o = call(impl, ones);
  const WeightSample w = sample_weights(impl, p, sampled_keys(impl, p));
  const std::string what = "; row sums read from an all-ones value column";
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) {
      const Eigen::VectorXd lambda = lse_error(p, b, h);
      for (Index i = 0; i < s.T; ++i) {
        if (sees_none(p, b, h, i)) continue;
        const double tol = kSafety * (base + std::expm1(lambda(i)));
        for (Index n = 0; n < Index(w.keys.size()); ++n)
          if (const double x = w.w(b, h, i, n); !std::isfinite(x) || x < 0) {
            Violation v = bad_weight(b, h, i, w.keys[std::size_t(n)], x);
            v.worst_index[3] = n;  // the sampled column; on_sample names the key
            return on_sample(v, w, p);
          }
        const double sum = o.output(b, h, i, 0);
        if (!(std::abs(sum - 1) <= tol)) {
          Violation v = bad_sum(b, h, i, sum, tol);
          v.message += what;
          return on_sample(v, w, p);
        }
      }
    }
  return {std::nullopt, describe_sample(w, p) + what};
}

Verdict check(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  if (samples_weights(impl, p)) return check_sampled(impl, p);
  const Outcome o = call(impl, p);
  const Tensor<double>& w = *o.weights;
  const Shape& s = w.shape();
  const double u_a = accumulation_roundoff(p.dtype), u_s = unit_roundoff(p.dtype), n_s = storage_floor(p.dtype);
  const double base = gamma(2 * s.D, u_a) + 2 * u_a + u_s;
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) {
      const Eigen::VectorXd lambda = lse_error(p, b, h);
      const Visibility vis = p.visibility(b, h);
      for (Index i = 0; i < s.T; ++i) {
        if (vis.keys(i).empty()) continue;  // a row that sees no key: its convention, not this law
        double sum = 0, flushed = 0;  // flushed: the weights an FTZ kernel may have returned as 0
        for (Index j = 0; j < s.D; ++j) {
          const double x = w(b, h, i, j);
          if (!std::isfinite(x) || x < 0) {
            Violation v = bad_weight(b, h, i, j, x);
            v.weights = w;
            v.actual = w;
            return v;
          }
          sum += x;
          if (x < n_s && vis.visible(i, j)) flushed += n_s;
        }
        const double tol = kSafety * (base + std::expm1(lambda(i)) + flushed) + gamma(s.D, std::ldexp(1.0, -53));
        if (std::abs(sum - 1) > tol) {
          Violation v = bad_sum(b, h, i, sum, tol);
          v.weights = w;
          v.actual = w;
          return v;
        }
      }
    }
  return std::nullopt;
}

}  // namespace row_stochastic_law
}  // namespace

Law row_stochastic() {
  using namespace row_stochastic_law;
  // Without sinks: with one, a row sums to 1 - p_sink (sink-mass).
  const auto gen = [](const GenConfig& cfg) {
    ProblemOptions po;
    po.allow.remove({Feature::sinks});
    return gen_problem(cfg, po);
  };
  return {"row-stochastic", "every row of weights with a visible key is >= 0, finite and sums to 1", kWhy,
          LawDoc{"1", "every row of weights with a visible key is ≥ 0, finite, sums to 1",
                 "γ₂ₜ(u_a) + 2u_a + u_s, doubled"},
          needs_weights, gen, check, 0};
}

}  // namespace attncheck::law_kit
