// The source card's exercise: single head, T=3, d=2, fixed X and projections, every step checked by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "attncheck/attention.hpp"

namespace attncheck {
namespace {

// X [T=3, C=3] and projections [C=3, d=2], chosen so the arithmetic can be done on paper:
//   W_q = W_k select the first two channels, so Q = K = X[:, 0:2] = [[1,0],[0,1],[1,1]];
//   V = X W_v = [[1,2],[3,4],[1+3+5, 2+4+6]] = [[1,2],[3,4],[9,12]].
//   QKᵀ = [[1,0,1],[0,1,1],[1,1,2]] and scale r = 1/√2, so scores = r·QKᵀ.
template <class S> struct CardInputs {
  Matrix<S> x{3, 3}, w_q{3, 2}, w_k{3, 2}, w_v{3, 2};
  CardInputs() {
    x << S(1), S(0), S(0), S(0), S(1), S(0), S(1), S(1), S(1);
    w_q << S(1), S(0), S(0), S(1), S(0), S(0);
    w_k = w_q;
    w_v << S(1), S(2), S(3), S(4), S(5), S(6);
  }
};

// The expected values, derived from the closed forms below (e = e^r ≈ 2.0281150):
//   row 0 sees key 0 only:          w0 = [1, 0, 0]                         out0 = v0 = [1, 2]
//   row 1 scores [0, r]:            w1 = [1, e, 0] / (1 + e) ≈ [0.33024, 0.66976, 0]
//                                   out1 = [3 - 2·w1₀, 4 - 2·w1₀] ≈ [2.33952, 3.33952]
//   row 2 scores [r, r, 2r]:        w2 = [1, 1, e] / (2 + e) ≈ [0.24826, 0.24826, 0.50348]
//                                   out2 = ([4, 6] + e·[9, 12]) / (2 + e) ≈ [5.52443, 7.53141]
struct Expected {
  Eigen::Matrix3d scores, weights;
  Eigen::Matrix<double, 3, 2> output;
  Expected() {
    const double r = 1 / std::sqrt(2.0), e = std::exp(r);
    scores << r, 0, r, 0, r, r, r, r, 2 * r;
    weights << 1, 0, 0, 1 / (1 + e), e / (1 + e), 0, 1 / (2 + e), 1 / (2 + e), e / (2 + e);
    output << 1, 2, 3 - 2 / (1 + e), 4 - 2 / (1 + e), (4 + 9 * e) / (2 + e), (6 + 12 * e) / (2 + e);
  }
};

TEST(SourceCard, everyStepHasTheShapeWrittenDownFirst) {
  const CardInputs<double> in;
  const auto p = single_head_attention(in.x, in.w_q, in.w_k, in.w_v);
  // X [T,C] = [3,3] → Q,K,V [T,d] = [3,2] → scores, weights [T,T] = [3,3] → output [T,d] = [3,2]
  EXPECT_EQ(p.Q.rows(), 3); EXPECT_EQ(p.Q.cols(), 2);
  EXPECT_EQ(p.K.rows(), 3); EXPECT_EQ(p.K.cols(), 2);
  EXPECT_EQ(p.V.rows(), 3); EXPECT_EQ(p.V.cols(), 2);
  EXPECT_EQ(p.head.scores.rows(), 3); EXPECT_EQ(p.head.scores.cols(), 3);
  EXPECT_EQ(p.head.weights.rows(), 3); EXPECT_EQ(p.head.weights.cols(), 3);
  EXPECT_EQ(p.head.output.rows(), 3); EXPECT_EQ(p.head.output.cols(), 2);
  EXPECT_DOUBLE_EQ(p.head.scale, 1 / std::sqrt(2.0));
}

TEST(SourceCard, scoresWeightsAndOutputsMatchTheHandDerivation) {
  const CardInputs<double> in;
  const Expected want;
  const auto p = single_head_attention(in.x, in.w_q, in.w_k, in.w_v);
  // Projections are sums of small integers: exact.
  Matrix<double> qk(3, 2), v(3, 2);
  qk << 1, 0, 0, 1, 1, 1;
  v << 1, 2, 3, 4, 9, 12;
  EXPECT_EQ(p.Q, qk);
  EXPECT_EQ(p.K, qk);
  EXPECT_EQ(p.V, v);
  // The rest goes through a handful of roundings (product, scale, exp, sum, divide, weighted sum), each
  // relative error ≤ u = 2^-53, on values ≤ 12: 16·u·12 bounds it with room to spare.
  const double tol = 16 * std::ldexp(1.0, -53) * 12;
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) {
      EXPECT_NEAR(p.head.scores(i, j), want.scores(i, j), tol) << "scores(" << i << "," << j << ")";
      EXPECT_NEAR(p.head.weights(i, j), want.weights(i, j), tol) << "weights(" << i << "," << j << ")";
    }
    for (int c = 0; c < 2; ++c) EXPECT_NEAR(p.head.output(i, c), want.output(i, c), tol) << "output(" << i << "," << c << ")";
  }
}

// Invariant 1: every row of weights sums to 1 (three terms: |Σ - 1| ≤ γ_3 + division error < 8u).
TEST(SourceCard, everyRowOfWeightsSumsToOne) {
  const CardInputs<double> in;
  const auto p = single_head_attention(in.x, in.w_q, in.w_k, in.w_v);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(p.head.weights.row(i).sum(), 1.0, 8 * std::ldexp(1.0, -53)) << "row " << i;
}

// Invariant 2: future (upper-triangle) weights are exactly 0, not small.
TEST(SourceCard, futureWeightsAreExactlyZero) {
  const CardInputs<double> in;
  const auto p = single_head_attention(in.x, in.w_q, in.w_k, in.w_v);
  for (int i = 0; i < 3; ++i)
    for (int j = i + 1; j < 3; ++j) EXPECT_EQ(p.head.weights(i, j), 0.0) << "weights(" << i << "," << j << ")";
}

// Invariant 3 and exercise 4: an extreme last token leaves positions 0 and 1 bit-identical.
template <class S> void expectExtremeLastTokenChangesNothingEarlier(S extreme) {
  const CardInputs<S> in;
  CardInputs<S> changed;
  changed.x.row(2).setConstant(extreme);
  const auto a = single_head_attention(in.x, in.w_q, in.w_k, in.w_v);
  const auto b = single_head_attention(changed.x, changed.w_q, changed.w_k, changed.w_v);
  for (int i = 0; i < 2; ++i)
    for (int c = 0; c < 2; ++c)
      EXPECT_EQ(std::memcmp(&a.head.output(i, c), &b.head.output(i, c), sizeof(S)), 0)
          << "output(" << i << "," << c << ") changed: " << double(a.head.output(i, c)) << " vs "
          << double(b.head.output(i, c)) << " with last token " << double(extreme);
  // ...and the last position does see the change (otherwise the check proves nothing).
  EXPECT_NE(double(a.head.output(2, 0)), double(b.head.output(2, 0)));
}

TEST(SourceCard, extremeLastTokenLeavesEarlierOutputsBitIdentical) {
  expectExtremeLastTokenChangesNothingEarlier<double>(1e300);
  expectExtremeLastTokenChangesNothingEarlier<double>(-1e6);
  expectExtremeLastTokenChangesNothingEarlier<float>(3e38f);
  expectExtremeLastTokenChangesNothingEarlier<double>(std::numeric_limits<double>::infinity());
  expectExtremeLastTokenChangesNothingEarlier<float>(std::numeric_limits<float>::quiet_NaN());
  expectExtremeLastTokenChangesNothingEarlier<Eigen::half>(Eigen::half(60000));
}

// The batched path over one (b,h) gives the same numbers as the single-head path.
TEST(SourceCard, batchedPathAgreesWithSingleHeadPath) {
  const CardInputs<double> in;
  const auto p = single_head_attention(in.x, in.w_q, in.w_k, in.w_v);
  Tensor<double> q({1, 1, 3, 2}), k({1, 1, 3, 2}), v({1, 1, 3, 2}), w({1, 1, 1, 1});
  q.head(0, 0) = p.Q;
  k.head(0, 0) = p.K;
  v.head(0, 0) = p.V;
  const Tensor<double> out = attention(q, k, v, {}, &w);
  EXPECT_EQ(out.shape(), (Shape{1, 1, 3, 2}));
  EXPECT_EQ(w.shape(), (Shape{1, 1, 3, 3}));
  EXPECT_EQ(Matrix<double>(out.head(0, 0)), p.head.output);
  EXPECT_EQ(Matrix<double>(w.head(0, 0)), p.head.weights);
}

}  // namespace
}  // namespace attncheck
