// Mutants whose mistake is in the softmax step: its axis, its order with the mask, its stability, its rows.
// The mask itself is right (a select to -inf) and values are mixed over visible keys only, as the reference.
#include <limits>

#include "parts.hpp"

namespace attncheck::zoo {

std::vector<Mutant> softmax_mutants() {
  std::vector<Mutant> z;

  // softmax(scores, dim=-2): the shapes are right, so nothing complains.
  z.push_back(Mutant{
      .impl = head_impl("mutant:softmax-query-axis", "softmax over the query axis (columns) instead of keys",
                        [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
                          using A = Scalar<decltype(Q)>;
                          const Matrix<A> zm = causal_select<A>(scores(Q, K, c.resolved_scale()), c);
                          HeadOut<A> r;
                          r.weights = softmax_rows<A>(zm.transpose()).transpose();  // each column sums to 1
                          r.output = mix_visible(r.weights, V, c);
                          return r;
                        }),
      .bug = "softmax over the query axis instead of the key axis: columns sum to 1, rows do not",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal =
          "one query weighing two keys shows it: T_q = 1, T_k = 2 under bottom-right, where each column holds one "
          "entry, so both weights are 1 and the row sums to 2 (at T_k = 1 the single weight is 1 either way)",
      .killed_by = {"row-stochastic", "first-position"},
  });

  // Softmax over the full row, then the mask applied to the probabilities (like a dropout mask).
  z.push_back(Mutant{
      .impl = head_impl("mutant:mask-after-softmax", "softmax over all keys, then future weights zeroed",
                        [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
                          using A = Scalar<decltype(Q)>;
                          HeadOut<A> r;
                          r.weights = softmax_rows<A>(scores(Q, K, c.resolved_scale()));
                          for (Index i = 0; i < r.weights.rows(); ++i)
                            for (Index j = 0; j < r.weights.cols(); ++j)
                              if (!c.visible(i, j)) r.weights(i, j) = A(0);
                          r.output = mix_visible(r.weights, V, c);
                          return r;
                        }),
      .bug = "mask applied after softmax: future weights are zeroed after normalising, so rows sum to less "
             "than 1 and the future still sets the denominator",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "query 0 and one future key (T_q = 1, T_k = 2, top-left): the future key still takes its share of "
                     "the denominator (1/2 at equal scores)",
      .killed_by = {"row-stochastic", "causal-perturbation"},
  });

  // exp(s) / Σ exp(s) straight from the formula, without subtracting the row max.
  z.push_back(Mutant{
      .impl = head_impl("mutant:no-max-subtraction", "softmax without subtracting the row max",
                        [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
                          using A = Scalar<decltype(Q)>;
                          const Matrix<A> zm = causal_select<A>(scores(Q, K, c.resolved_scale()), c);
                          HeadOut<A> r;
                          r.weights = Matrix<A>::Zero(zm.rows(), zm.cols());
                          for (Index i = 0; i < zm.rows(); ++i) {
                            A sum = 0;
                            for (Index j = 0; j < zm.cols(); ++j) sum += (r.weights(i, j) = std::exp(zm(i, j)));
                            if (sum != A(0)) r.weights.row(i) /= sum;  // a row with nothing visible stays 0
                          }
                          r.output = mix_visible(r.weights, V, c);
                          return r;
                        }),
      .bug = "softmax without max-subtraction: exp overflows to Inf once a score passes ~88.7 (float "
             "accumulation) or ~709.8 (double), and Inf/Inf = NaN",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one score above exp's overflow threshold is enough: T = D = 1 with q*k*scale > 88.7 in float "
                     "gives weight Inf/Inf = NaN",
      .killed_by = {"row-stochastic", "oracle-agreement"},
  });

  // The row loop starts at 1: row 0 "only sees key 0" and was meant to be special-cased, but never was.
  z.push_back(Mutant{
      .impl = head_impl("mutant:first-row-skipped", "the query loop starts at 1: query 0 gets a zero row",
                        [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
                          using A = Scalar<decltype(Q)>;
                          const Matrix<A> zm = causal_select<A>(scores(Q, K, c.resolved_scale()), c);
                          const Matrix<A> all = softmax_rows<A>(zm);
                          HeadOut<A> r;
                          r.weights = Matrix<A>::Zero(zm.rows(), zm.cols());
                          for (Index i = 1; i < zm.rows(); ++i) r.weights.row(i) = all.row(i);
                          r.output = mix_visible(r.weights, V, c);
                          return r;
                        }),
      .bug = "first position attends to nothing: the query loop starts at 1, leaving row 0's weights and "
             "output at 0",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "query 0 exists at T = 1: its weights sum to 0 instead of 1 (and its output is 0 instead of v0)",
      .killed_by = {"first-position", "row-stochastic", "oracle-agreement"},
  });
  // The running max kept in bfloat16 (to save registers or shared memory), the exponentials in float: at
  // ordinary scores the rounding of m cancels between numerator and denominator, but once |m|·2^-9 passes exp's
  // range (~88.7 in float) the row overflows (Inf/Inf = NaN) or underflows to l = 0 (a silent zero row).
  z.push_back(Mutant{
      .impl = head_impl("mutant:row-max-in-bf16", "the row max is held in bfloat16 while the exponentials are float",
                        [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
                          using A = Scalar<decltype(Q)>;
                          const Matrix<A> zm = causal_select<A>(scores(Q, K, c.resolved_scale()), c);
                          HeadOut<A> r;
                          r.weights = Matrix<A>::Zero(zm.rows(), zm.cols());
                          for (Index i = 0; i < zm.rows(); ++i) {
                            A m = -std::numeric_limits<A>::infinity(), l = 0;
                            for (Index j = 0; j < zm.cols(); ++j) m = std::max(m, zm(i, j));
                            if (m == -std::numeric_limits<A>::infinity()) continue;  // nothing visible
                            m = A(float(Eigen::bfloat16(float(m))));
                            for (Index j = 0; j < zm.cols(); ++j) l += (r.weights(i, j) = std::exp(zm(i, j) - m));
                            if (l != A(0)) r.weights.row(i) /= l;
                          }
                          r.output = mix_visible(r.weights, V, c);
                          return r;
                        }),
      .bug = "running max stored in bfloat16: a row whose scores lie beyond ~4.5e4 in magnitude gets a max off by "
             "more than exp's range, so its weights overflow (NaN) or underflow to a silent zero row",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query, one key, D = 1, with a score whose bfloat16 rounding is more than ~88.7 away (|s| "
                     "above ~4.5e4)",
      .killed_by = {"extreme-scores", "oracle-agreement"},
  });

  // Scores clamped from below "to keep exp finite in half precision": a row whose visible scores all lie below
  // the clamp is flattened to equal weights, whatever their differences.
  z.push_back(Mutant{
      .impl = head_impl("mutant:score-clamp-min", "scores clamped below at -1e4 before the softmax",
                        [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
                          using A = Scalar<decltype(Q)>;
                          const Matrix<A> s = scores(Q, K, c.resolved_scale()).cwiseMax(A(-1e4));
                          HeadOut<A> r;
                          r.weights = softmax_rows<A>(causal_select<A>(s, c));
                          r.output = mix_visible(r.weights, V, c);
                          return r;
                        }),
      .bug = "scores clamped from below at -1e4 (a guard against -inf in half precision): a row whose visible "
             "scores all lie below -1e4 gets equal weights",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over two keys (T_q = 1, T_k = 2 under bottom-right) whose scores both lie below -1e4 "
                     "and differ (D = 1: q times two different keys)",
      .killed_by = {"extreme-scores", "oracle-agreement"},
      .also_minimal = {{1, 1, 1, 2}},
  });
  return z;
}

}  // namespace attncheck::zoo
