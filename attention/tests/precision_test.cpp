// half, bfloat16 and float agree with the float64 oracle within the derived bound of tolerance.hpp, and the
// bound is tight enough to tell the dtypes apart.
#include <gtest/gtest.h>

#include <cmath>

#include "attncheck/attention.hpp"
#include "attncheck/tolerance.hpp"
#include "wave.hpp"

namespace attncheck {
namespace {

using test::wave;

struct Worst {
  double ratio = 0;  // max |actual - oracle| / tolerance over every output and weight
  bool finite = true;
};

template <class S> Worst compareWithOracle(const Shape& s, double magnitude, DType as = dtype_of<S>()) {
  const auto q = wave<S>(s, 0.3, magnitude), k = wave<S>(s, 1.1, magnitude), v = wave<S>(s, 2.0, 1.0);
  Tensor<S> w({1, 1, 1, 1});
  Tensor<double> w64({1, 1, 1, 1});
  const auto out = attention(q, k, v, {}, &w);
  const auto ref = oracle(q, k, v, {}, &w64);
  const auto q64 = q.template cast<double>(), k64 = k.template cast<double>(), v64 = v.template cast<double>();
  const BoolMask mask = BoolMask::causal(s.T, s.T);
  Worst worst;
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) {
      const auto tol = head_tolerance(as, q64.head(b, h), k64.head(b, h), v64.head(b, h), mask,
                                      1 / std::sqrt(double(s.D)), ref.head(b, h), w64.head(b, h));
      const Matrix<double> got = out.head(b, h).template cast<double>();
      const Matrix<double> got_w = w.head(b, h).template cast<double>();
      worst.finite = worst.finite && got.allFinite() && got_w.allFinite();
      worst.ratio = std::max(worst.ratio, ((got - Matrix<double>(ref.head(b, h))).cwiseAbs().array() /
                                           tol.output.array()).maxCoeff());
      const Matrix<double> dw = (got_w - Matrix<double>(w64.head(b, h))).cwiseAbs();
      // Future weights have tolerance 0 and must be exactly 0: 0/0 is skipped by comparing them directly.
      for (Index i = 0; i < s.T; ++i)
        for (Index j = 0; j < s.T; ++j) {
          if (tol.weights(i, j) == 0) {
            worst.finite = worst.finite && dw(i, j) == 0;
            continue;
          }
          worst.ratio = std::max(worst.ratio, dw(i, j) / tol.weights(i, j));
        }
    }
  return worst;
}

TEST(Precision, everyDtypeAgreesWithTheFloat64OracleWithinTheDerivedBound) {
  for (const Shape s : {Shape{1, 1, 3, 2}, Shape{2, 3, 17, 7}, Shape{1, 2, 64, 128}})
    for (const double magnitude : {0.01, 1.0, 30.0}) {
      SCOPED_TRACE(to_string(s) + " magnitude " + std::to_string(magnitude));
      for (const Worst w : {compareWithOracle<float>(s, magnitude), compareWithOracle<Eigen::half>(s, magnitude),
                            compareWithOracle<Eigen::bfloat16>(s, magnitude),
                            compareWithOracle<double>(s, magnitude)}) {
        EXPECT_TRUE(w.finite);
        EXPECT_LE(w.ratio, 1.0);
      }
    }
}

// The bound is not vacuous: half's result, held to float's bound, fails it, and bfloat16's fails half's.
// Small scores (magnitude 0.01) leave the output rounding (2^-11, 2^-8 relative) as the dominant error, which
// the tighter dtype's bound does not allow.
TEST(Precision, theBoundTellsHalfFromFloat) {
  const Shape s{1, 2, 17, 7};
  EXPECT_LE(compareWithOracle<Eigen::half>(s, 0.01).ratio, 1.0);
  EXPECT_GT(compareWithOracle<Eigen::half>(s, 0.01, DType::f32).ratio, 1.0);
  EXPECT_GT(compareWithOracle<Eigen::bfloat16>(s, 0.01, DType::f16).ratio, 1.0);
}

}  // namespace
}  // namespace attncheck
