// The streamed forward (attention() without weights) and the streaming oracle against the materialising
// path: within the derived bound at every dtype under GQA, padding, windows and both alignments; the same bits
// whatever the thread count; hidden NaN never read; row statistics and streamed tolerances equal to the
// materialised ones.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "attncheck/attention.hpp"
#include "attncheck/tolerance.hpp"
#include "wave.hpp"

namespace attncheck {
namespace {

using test::wave;

// Geometries that cross the query block (64) and the key tile (128), with and without the rules.
struct Geometry {
  Index B, H, H_kv, T_q, T_k, D;
  CausalAlignment alignment;
  std::vector<Index> key_lengths;
  std::optional<Index> window;
};

std::vector<Geometry> geometries() {
  using enum CausalAlignment;
  return {
      {1, 1, 1, 1, 1, 1, TopLeft, {}, {}},
      {1, 2, 1, 65, 65, 3, TopLeft, {}, {}},
      {2, 4, 2, 130, 130, 8, TopLeft, {}, {}},
      {1, 2, 2, 200, 300, 5, BottomRight, {}, {}},
      {1, 2, 2, 300, 200, 5, BottomRight, {}, {}},
      {1, 1, 1, 100, 260, 4, TopLeft, {}, {}},
      {2, 2, 1, 257, 257, 16, TopLeft, {257, 70}, {}},
      {2, 1, 1, 257, 257, 7, TopLeft, {0, 129}, {}},
      {1, 2, 1, 300, 300, 6, TopLeft, {}, Index{0}},
      {1, 2, 2, 300, 300, 6, TopLeft, {}, Index{100}},
      {2, 3, 3, 190, 190, 9, BottomRight, {150, 5}, Index{37}},
      {1, 1, 1, 1, 5, 3, BottomRight, {3}, Index{0}},  // the one query sees no key: begin 4, end 3
      {1, 1, 1, 70, 200, 3, BottomRight, {100}, Index{2}},  // a whole block that sees nothing
      // Rows whose window left every key behind come last, their empty range starting past T_k (at 130 + 100 - 3
      // for query 230): the block's keys stop at the last row that sees one (this read past K before).
      {1, 2, 1, 260, 130, 4, TopLeft, {}, Index{3}},
      {2, 1, 1, 200, 200, 4, TopLeft, {60, 200}, Index{5}},  // past the padding of entry 0
  };
}

AttentionOptions options_of(const Geometry& g) {
  return AttentionOptions{.alignment = g.alignment, .key_lengths = g.key_lengths, .window = g.window};
}

template <class S> void streamedMeetsTheDerivedBound(double magnitude) {
  for (const Geometry& g : geometries()) {
    const Shape qs{g.B, g.H, g.T_q, g.D}, ks{g.B, g.H_kv, g.T_k, g.D};
    const auto q = wave<S>(qs, 0.3, magnitude), k = wave<S>(ks, 1.1, magnitude), v = wave<S>(ks, 2.0, 1.0);
    const AttentionOptions opts = options_of(g);
    const Tensor<S> streamed = attention(q, k, v, opts);
    Tensor<double> w64({1, 1, 1, 1});
    const Tensor<double> ref = oracle(q, k, v, opts, &w64);
    const auto q64 = q.template cast<double>(), k64 = k.template cast<double>(), v64 = v.template cast<double>();
    for (Index b = 0; b < g.B; ++b) {
      const BoolMask mask = BoolMask::of(visibility(opts, b, g.T_q, g.T_k));
      for (Index h = 0; h < g.H; ++h) {
        const Index kh = kv_head(h, g.H, g.H_kv);
        const auto tol = head_tolerance(dtype_of<S>(), q64.head(b, h), k64.head(b, kh), v64.head(b, kh), mask,
                                        1 / std::sqrt(double(g.D)), ref.head(b, h), w64.head(b, h));
        const Matrix<double> diff =
            (streamed.head(b, h).template cast<double>() - Matrix<double>(ref.head(b, h))).cwiseAbs();
        ASSERT_TRUE((diff.array() <= tol.output.array()).all())
            << dtype_name(dtype_of<S>()) << " T_q=" << g.T_q << " T_k=" << g.T_k << " head (" << b << "," << h
            << "): worst " << (diff.array() - tol.output.array()).maxCoeff();
      }
    }
  }
}

TEST(Streamed, float32WithinTheDerivedBound) { streamedMeetsTheDerivedBound<float>(3.0); }
TEST(Streamed, float64WithinTheDerivedBound) { streamedMeetsTheDerivedBound<double>(3.0); }
TEST(Streamed, float16WithinTheDerivedBound) { streamedMeetsTheDerivedBound<Eigen::half>(2.0); }
TEST(Streamed, bfloat16WithinTheDerivedBound) { streamedMeetsTheDerivedBound<Eigen::bfloat16>(2.0); }
TEST(Streamed, largeScoresWithinTheDerivedBound) { streamedMeetsTheDerivedBound<float>(40.0); }

// Each (b, h, query block) is computed whole by one thread, so the thread count cannot change a bit.
TEST(Streamed, identicalBitsWhateverTheThreadCount) {
  const Shape s{1, 4, 700, 64};  // ~5e7 multiply-adds: above the threshold where threads start
  const auto q = wave<float>(s, 0.3, 2), k = wave<float>(s, 1.1, 2), v = wave<float>(s, 2.0, 1);
  AttentionOptions one;
  one.threads = 1;
  const Tensor<float> serial = attention(q, k, v, one);
  for (const int n : {2, 3, 8}) {
    AttentionOptions many;
    many.threads = n;
    const Tensor<float> par = attention(q, k, v, many);
    EXPECT_EQ(0, std::memcmp(serial.data(), par.data(), sizeof(float) * std::size_t(serial.size()))) << n << " threads";
  }
}

// NaN in hidden keys and values (the future, padding, outside a window) is never read.
TEST(Streamed, hiddenNaNNeverReachesAnOutput) {
  const Index T = 300, D = 8;
  const Shape s{2, 1, T, D};
  const auto q = wave<float>(s, 0.3, 1), k = wave<float>(s, 1.1, 1), v = wave<float>(s, 2.0, 1);
  const AttentionOptions opts{.key_lengths = {T, 150}, .window = Index{40}};
  const Tensor<float> before = attention(q, k, v, opts);
  Tensor<float> k_bad = k, v_bad = v;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (Index j = 200; j < T; ++j)
    for (Index c = 0; c < D; ++c) k_bad(0, 0, j, c) = v_bad(0, 0, j, c) = nan;  // future of queries < 200
  for (Index j = 150; j < T; ++j)
    for (Index c = 0; c < D; ++c) k_bad(1, 0, j, c) = v_bad(1, 0, j, c) = nan;  // padding of entry 1
  const Tensor<float> after = attention(q, k_bad, v_bad, opts);
  for (Index i = 0; i < 200; ++i)
    for (Index c = 0; c < D; ++c) ASSERT_EQ(before(0, 0, i, c), after(0, 0, i, c)) << "row " << i;
  for (Index i = 0; i < T; ++i)
    for (Index c = 0; c < D; ++c) ASSERT_EQ(before(1, 0, i, c), after(1, 0, i, c)) << "entry 1 row " << i;
}

// The streaming oracle agrees with the materialising one to float64 rounding, its row statistics give back
// every weight, and the streamed tolerance is head_tolerance's output bound.
TEST(StreamingOracle, agreesWithTheMaterialisingOracleRowStatsAndTolerance) {
  for (const Geometry& g : geometries()) {
    const Shape qs{g.B, g.H, g.T_q, g.D}, ks{g.B, g.H_kv, g.T_k, g.D};
    const auto q = wave<double>(qs, 0.3, 4), k = wave<double>(ks, 1.1, 4), v = wave<double>(ks, 2.0, 1);
    const AttentionOptions opts = options_of(g);
    RowStats stats;
    const Tensor<double> streamed = streaming_oracle(q, k, v, opts, &stats);
    Tensor<double> w({1, 1, 1, 1});
    const Tensor<double> ref = oracle(q, k, v, opts, &w);
    const double scale = 1 / std::sqrt(double(g.D));
    for (Index b = 0; b < g.B; ++b) {
      const Visibility vis = visibility(opts, b, g.T_q, g.T_k);
      const BoolMask mask = BoolMask::of(vis);
      for (Index h = 0; h < g.H; ++h) {
        const Index kh = kv_head(h, g.H, g.H_kv);
        ASSERT_LE((Matrix<double>(streamed.head(b, h)) - Matrix<double>(ref.head(b, h))).cwiseAbs().maxCoeff(),
                  1e-13);
        const Matrix<double> s = Matrix<double>(q.head(b, h)) * Matrix<double>(k.head(b, kh)).transpose() * scale;
        const Matrix<double> a =
            Matrix<double>(q.head(b, h)).cwiseAbs() * Matrix<double>(k.head(b, kh)).cwiseAbs().transpose() * scale;
        Eigen::VectorXd abs_dot = Eigen::VectorXd::Zero(g.T_q), abs_score = Eigen::VectorXd::Zero(g.T_q);
        for (Index i = 0; i < g.T_q; ++i) {
          const KeyRange r = vis.keys(i);
          for (Index j = 0; j < g.T_k; ++j)
            // The weight recomputes its score as a plain dot product, the tile as a GEMM: the scores differ by
            // up to 2γ_D·max scale·Σ|q·k| ≈ 2·16·2^-53·64 ≈ 2.3e-13 here, and so does the weight, relatively.
            ASSERT_NEAR(streamed_weight(q, k, opts, stats, b, h, i, j), w(b, h, i, j), 1e-12) << i << "," << j;
          if (r.empty()) continue;
          EXPECT_NEAR(stats.abs_score(b, h, i), s.row(i).segment(r.begin, r.size()).cwiseAbs().maxCoeff(), 1e-12);
          EXPECT_NEAR(stats.abs_dot(b, h, i), a.row(i).segment(r.begin, r.size()).maxCoeff(), 1e-12);
          abs_dot(i) = stats.abs_dot(b, h, i);
          abs_score(i) = stats.abs_score(b, h, i);
        }
        for (const DType t : {DType::f32, DType::f16}) {
          const auto full = head_tolerance(t, q.head(b, h), k.head(b, kh), v.head(b, kh), mask, scale, ref.head(b, h),
                                           w.head(b, h));
          Eigen::VectorXd rho;
          const Matrix<double> tol =
              streamed_output_tolerance(t, q.shape().D, v.head(b, kh), vis, abs_dot, abs_score, ref.head(b, h), &rho);
          ASSERT_LE(((tol - full.output).array().abs() / full.output.array().max(1e-300)).maxCoeff(), 1e-9);
          for (Index i = 0; i < g.T_q; ++i)
            for (Index j = 0; j < g.T_k; ++j)
              if (mask.visible(i, j)) {
                ASSERT_NEAR(weight_tolerance(t, w(b, h, i, j), rho(i)), full.weights(i, j),
                            1e-9 * full.weights(i, j));
              }
        }
      }
    }
  }
}

TEST(VisibleValueRange, equalsTheBruteForceMinAndMax) {
  const Index T = 150, D = 3;
  const Matrix<double> v = wave<double>({1, 1, T, D}, 0.7, 5).head(0, 0);
  for (const Geometry& g : geometries()) {
    Visibility vis{.T_q = T, .T_k = T, .alignment = g.alignment, .window = g.window};
    vis.key_length = g.key_lengths.empty() ? -1 : std::min(T, g.key_lengths.back());
    const VisibleRange r = visible_value_range(v, vis);
    for (Index i = 0; i < T; ++i) {
      const KeyRange kr = vis.keys(i);
      for (Index c = 0; c < D; ++c) {
        const double lo = kr.empty() ? 0 : v.col(c).segment(kr.begin, kr.size()).minCoeff();
        const double hi = kr.empty() ? 0 : v.col(c).segment(kr.begin, kr.size()).maxCoeff();
        ASSERT_EQ(r.min(i, c), lo) << i << "," << c;
        ASSERT_EQ(r.max(i, c), hi) << i << "," << c;
      }
    }
  }
}

}  // namespace
}  // namespace attncheck
