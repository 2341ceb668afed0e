// Properties of the reference core's own paths, which an outside implementation does not have: the
// single-head projection path, attend() and the batched path agree, and perturbing X after position t
// (the projection path's form of causal perturbation) leaves earlier outputs bit-identical.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstring>

#include "attncheck/generators.hpp"
#include "attncheck/tolerance.hpp"

namespace attncheck {
namespace {

Matrix<float> draw(Index rows, Index cols, double magnitude) {
  const Tensor<double> t = *gen_tensor({1, 1, rows, cols}, Regime::normal, magnitude, DType::f32);
  return Matrix<double>(t.head(0, 0)).cast<float>();
}

bool sameBits(const Matrix<float>& a, const Matrix<float>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), sizeof(float) * std::size_t(a.size())) == 0;
}

// The three ways into the core compute the same thing with the same arithmetic: bit-identical.
RC_GTEST_PROP(CorePaths, singleHeadProjectionAttendAndBatchedAgree, ()) {
  const Index T = *rc::gen::inRange<Index>(1, 33), C = *rc::gen::inRange<Index>(1, 17),
              d = *rc::gen::inRange<Index>(1, 17);
  const double m = *gen_magnitude();
  const Matrix<float> x = draw(T, C, m), w_q = draw(C, d, 1), w_k = draw(C, d, 1), w_v = draw(C, d, 1);
  const ProjectionTrace<float> p = single_head_attention(x, w_q, w_k, w_v);
  const HeadTrace<float> a = attend(p.Q, p.K, p.V, BoolMask::causal(T, T));
  RC_ASSERT(sameBits(a.output, p.head.output));
  Tensor<float> q({1, 1, T, d}), k({1, 1, T, d}), v({1, 1, T, d}), w({1, 1, 1, 1});
  q.head(0, 0) = p.Q;
  k.head(0, 0) = p.K;
  v.head(0, 0) = p.V;
  const Tensor<float> out = attention(q, k, v, {}, &w);
  RC_ASSERT(sameBits(Matrix<float>(out.head(0, 0)), p.head.output));
  RC_ASSERT(sameBits(Matrix<float>(w.head(0, 0)), p.head.weights));
}

// Causal perturbation on the projection path: replacing X's rows after t, extreme values included,
// leaves outputs 0..t bit-identical.
RC_GTEST_PROP(CorePaths, changingFutureTokensOfXLeavesEarlierOutputsBitIdentical, ()) {
  const Index T = *rc::gen::inRange<Index>(2, 33), C = *rc::gen::inRange<Index>(1, 17),
              d = *rc::gen::inRange<Index>(1, 17);
  const Index t = *rc::gen::inRange<Index>(0, T - 1);
  const Matrix<float> x = draw(T, C, *gen_magnitude()), w_q = draw(C, d, 1), w_k = draw(C, d, 1), w_v = draw(C, d, 1);
  Matrix<float> x2 = x;
  x2.bottomRows(T - t - 1) = draw(T - t - 1, C, *rc::gen::element(1.0, 1e4, 1e30));
  const auto a = single_head_attention(x, w_q, w_k, w_v), b = single_head_attention(x2, w_q, w_k, w_v);
  RC_ASSERT(sameBits(a.head.output.topRows(t + 1), b.head.output.topRows(t + 1)));
}

}  // namespace
}  // namespace attncheck

namespace attncheck {
namespace {

// The oracle-agreement law also accepts twice the reference's own error (FlashAttention's rule), which is
// vacuous for the reference itself. So the reference is held here to the derived bound alone, on the same
// generated problems, at every dtype.
RC_GTEST_PROP(CorePaths, referenceMeetsTheDerivedBoundAlone, ()) {
  GenConfig cfg;
  cfg.dtype = *rc::gen::element(DType::f32, DType::f64, DType::f16, DType::bf16);
  const Problem p = (*gen_problem(cfg)).problem;
  const double scale = p.scale ? *p.scale : 1 / std::sqrt(double(p.q.shape().D));
  const Outcome o = reference_implementation()->forward(p);
  Tensor<double> w64({1, 1, 1, 1});
  const Tensor<double> out64 =
      attention<double>(p.q, p.k, p.v, AttentionOptions{.scale = scale, .alignment = p.alignment}, &w64);
  const Shape& s = p.q.shape();
  const BoolMask mask = BoolMask::causal(s.T, p.k.shape().T, p.alignment);
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) {
      const HeadTolerance tol = head_tolerance(p.dtype, p.q.head(b, h), p.k.head(b, h), p.v.head(b, h), mask, scale,
                                               out64.head(b, h), w64.head(b, h));
      const Matrix<double> dout = (Matrix<double>(o.output.head(b, h)) - Matrix<double>(out64.head(b, h))).cwiseAbs();
      const Matrix<double> dw = (Matrix<double>(o.weights->head(b, h)) - Matrix<double>(w64.head(b, h))).cwiseAbs();
      Index r = 0, c = 0;
      (dw.array() - tol.weights.array()).maxCoeff(&r, &c);
      RC_LOG() << dtype_name(p.dtype) << " q " << to_string(s) << " k " << to_string(p.k.shape()) << " head (" << b
               << "," << h << "): worst weight (" << r << "," << c << ") off by " << dw(r, c) << ", tolerance "
               << tol.weights(r, c) << "; w64 " << w64(b, h, r, c) << "\n";
      RC_ASSERT((dout.array() <= tol.output.array()).all());
      RC_ASSERT((dw.array() <= tol.weights.array()).all());
    }
}

}  // namespace
}  // namespace attncheck
