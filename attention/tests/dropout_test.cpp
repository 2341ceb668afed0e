// Dropout in the core: p = 0 is no dropout bit for bit; the mask is Philox4x32-10's (a known answer) and keeps 1 - p
// of the cells; a given mask is applied (kept weights over 1 - p, the LSE the softmax's); the backward matches central
// differences under a fixed mask; a kernel that drops in its own order is within the derived bounds; bad dropouts are
// named.
#include <gtest/gtest.h>

#include <cmath>

#include "attncheck/backward.hpp"
#include "attncheck/error.hpp"

namespace attncheck {
namespace {

template <class S> Tensor<S> wave(const Shape& s, double seed, double amp) {
  Tensor<S> t(s);
  for (Index n = 0; n < t.size(); ++n) t.values()[n] = S(std::sin(seed + 1.7 * double(n)) * amp);
  return t;
}

TEST(Dropout, pZeroIsNoDropoutBitForBit) {
  const Shape s{2, 2, 9, 5};
  const Tensor<float> q = wave<float>(s, 0.1, 2), k = wave<float>(s, 0.6, 2), v = wave<float>(s, 1.1, 1),
                      dO = wave<float>(s, 2.3, 1);
  AttentionOptions d;
  d.dropout = Dropout{.p = 0, .seed = 12345, .offset = 77};
  Tensor<float> w0(Shape{}), w1(Shape{});
  Tensor<double> l0(Shape{}), l1(Shape{});
  const Tensor<float> o0 = attention<float>(q, k, v, {}, &w0, &l0), o1 = attention<float>(q, k, v, d, &w1, &l1);
  EXPECT_EQ(o0.values(), o1.values());
  EXPECT_EQ(w0.values(), w1.values());
  EXPECT_EQ(l0.values(), l1.values());
  const AttentionGradients<float> g0 = attention_backward<float>(q, k, v, dO), g1 = attention_backward<float>(q, k, v, dO, d);
  EXPECT_EQ(g0.dq.values(), g1.dq.values());
  EXPECT_EQ(g0.dk.values(), g1.dk.values());
  EXPECT_EQ(g0.dv.values(), g1.dv.values());
}

TEST(Dropout, theMaskIsPhiloxAndKeepsOneMinusP) {
  // Random123's known answer: Philox4x32-10 of counter 0 under key 0 is 6627e8d5 e169c58d bc57ac4c 9b00dbd8, so the
  // uniforms of cells 0-3 are 0.3990, 0.8808, 0.7359, 0.6055.
  const auto first4 = [](double p) {
    const std::vector<std::uint8_t> m = dropout_keep_mask(Dropout{.p = p}, 1, 1, 1, 4);
    return std::vector<int>(m.begin(), m.end());
  };
  EXPECT_EQ(first4(0.399), (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(first4(0.3991), (std::vector<int>{0, 1, 1, 1}));
  EXPECT_EQ(first4(0.7), (std::vector<int>{0, 1, 1, 0}));
  EXPECT_EQ(first4(0.74), (std::vector<int>{0, 1, 0, 0}));
  // The offset moves the counter: offset 1 gives cells 4-7 of offset 0.
  const std::vector<std::uint8_t> a = dropout_keep_mask(Dropout{.p = 0.5, .seed = 3}, 1, 1, 4, 4),
                                  b = dropout_keep_mask(Dropout{.p = 0.5, .seed = 3, .offset = 1}, 1, 1, 3, 4);
  EXPECT_TRUE(std::equal(b.begin(), b.end(), a.begin() + 4));
  // The kept fraction of 2^20 cells: Hoeffding, P(|K/n - (1 - p)| >= t) <= 2·exp(-2nt²), t for 1e-9.
  for (const double p : {0.1, 0.5, 0.9}) {
    const Index n = Index(1) << 20;
    const std::vector<std::uint8_t> m = dropout_keep_mask(Dropout{.p = p, .seed = 99, .offset = 5}, 4, 4, 256, 256);
    const double kept = double(std::count(m.begin(), m.end(), 1)) / double(n);
    EXPECT_LE(std::abs(kept - (1 - p)), std::sqrt(std::log(2e9) / (2 * double(n)))) << p;
  }
}

TEST(Dropout, keptWeightsAreDividedByOneMinusPAndTheLseIsTheSoftmaxs) {
  const Shape s{1, 2, 6, 4};
  const Tensor<double> q = wave<double>(s, 0.3, 1.5), k = wave<double>(s, 0.9, 1.5), v = wave<double>(s, 1.4, 1);
  AttentionOptions d;
  d.dropout = Dropout{.p = 0.25, .seed = 7, .offset = 0};
  d = with_dropout_mask(d, 1, 2, 6, 6);
  Tensor<double> w(Shape{}), wd(Shape{}), l(Shape{}), ld(Shape{});
  attention<double>(q, k, v, {}, &w, &l);
  const Tensor<double> out = attention<double>(q, k, v, d, &wd, &ld);
  EXPECT_EQ(l.values(), ld.values());
  Index dropped = 0;
  for (Index h = 0; h < 2; ++h) {
    const std::uint8_t* keep = d.dropout->head(0, h);
    Matrix<double> want = Matrix<double>::Zero(6, 6);
    for (Index i = 0; i < 6; ++i)
      for (Index j = 0; j <= i; ++j) {
        want(i, j) = keep[i * 6 + j] ? w(0, h, i, j) / 0.75 : 0.0;
        dropped += keep[i * 6 + j] ? 0 : 1;
        EXPECT_NEAR(wd(0, h, i, j), want(i, j), 1e-15) << h << "," << i << "," << j;
      }
    const Matrix<double> o = want * Matrix<double>(v.head(0, h));
    for (Index i = 0; i < 6; ++i)
      for (Index c = 0; c < 4; ++c) EXPECT_NEAR(out(0, h, i, c), o(i, c), 1e-14);
  }
  EXPECT_GT(dropped, 0);  // the case drops something
  // Without weights asked for, the same output (a call with dropout is materialised).
  const Tensor<double> streamed = attention<double>(q, k, v, d);
  EXPECT_EQ(streamed.values(), out.values());
}

// L = Σ dO ∘ attention(q, k, v) under a fixed keep mask: its gradient is what attention_backward returns.
TEST(Dropout, theBackwardMatchesCentralDifferencesUnderItsMask) {
  const Shape s{1, 2, 5, 3};
  Tensor<double> q = wave<double>(s, 0.1, 1.5), k = wave<double>({1, 1, 5, 3}, 0.7, 1.5),
                 v = wave<double>({1, 1, 5, 3}, 1.3, 1.5);
  const Tensor<double> dO = wave<double>(s, 2.9, 1.5);
  AttentionOptions o;
  o.dropout = Dropout{.p = 0.4, .seed = 11};
  o.sinks = {0.5, -1};
  o = with_dropout_mask(o, 1, 2, 5, 5);
  const AttentionGradients<double> g = attention_backward<double>(q, k, v, dO, o);
  const auto loss = [&] { return attention<double>(q, k, v, o).values().dot(dO.values()); };
  const double h = 1e-5;
  for (auto [x, grad] : {std::pair{&q, &g.dq}, {&k, &g.dk}, {&v, &g.dv}})
    for (Index n = 0; n < x->size(); ++n) {
      const double x0 = x->values()[n];
      x->values()[n] = x0 + h;
      const double up = loss();
      x->values()[n] = x0 - h;
      const double down = loss();
      x->values()[n] = x0;
      EXPECT_NEAR(grad->values()[n], (up - down) / (2 * h), 1e-7) << "entry " << n;
    }
}

// A float16 kernel that multiplies V by the kept softmax weights and divides the output by 1 - p at the end (another
// order than the core's), forward and backward, is within tolerance.cpp step 11's and backward.cpp step 16's bounds.
TEST(Dropout, aKernelDroppingInItsOwnOrderIsWithinTheBound) {
  using H = Eigen::half;
  const Shape s{1, 2, 16, 8};
  const Tensor<H> q = wave<H>(s, 0.2, 2.0), k = wave<H>(s, 0.5, 2.0), v = wave<H>(s, 0.8, 1.0), dO = wave<H>(s, 1.7, 1.0);
  AttentionOptions o;
  o.dropout = Dropout{.p = 0.3, .seed = 5, .offset = 9};
  o = with_dropout_mask(o, 1, 2, 16, 16);
  Tensor<double> want_w(Shape{});
  const Tensor<double> want = oracle(q, k, v, o, &want_w);
  const Tensor<double> qd = q.cast<double>(), kd = k.cast<double>(), vd = v.cast<double>();
  Tensor<H> plain_w(Shape{});
  attention<H>(q, k, v, {}, &plain_w);
  double worst = 0;
  for (Index h = 0; h < 2; ++h) {
    const std::uint8_t* keep = o.dropout->head(0, h);
    const HeadTolerance tol =
        head_tolerance(DType::f16, qd.head(0, h), kd.head(0, h), vd.head(0, h), BoolMask::causal(16, 16),
                       1 / std::sqrt(8.0), want.head(0, h), want_w.head(0, h), 2.0, head_modifiers(o, 0, h, 16, 16));
    for (Index i = 0; i < 16; ++i)
      for (Index c = 0; c < 8; ++c) {
        float acc = 0;
        for (Index j = 0; j <= i; ++j)
          if (keep[i * 16 + j]) acc += float(plain_w(0, h, i, j)) * float(v(0, 0 + h, j, c));
        const double got = double(H(acc / (1.0f - 0.3f)));
        const double err = std::abs(got - want(0, h, i, c));
        EXPECT_LE(err, tol.output(i, c)) << h << "," << i << "," << c;
        EXPECT_LT(tol.output(i, c), 0.1);  // not vacuous
        worst = std::max(worst, err);
      }
  }
  EXPECT_GT(worst, 0.0);
  // The core's float16 backward under the same mask, against the float64 oracle's within step 16's bound.
  const AttentionGradients<H> g = attention_backward<H>(q, k, v, dO, o);
  const GradientCheck c = gradient_check(DType::f16, qd, kd, vd, dO.cast<double>(), o);
  for (auto [got, ref, tol] : {std::tuple{&g.dq, &c.oracle.dq, &c.tolerance.dq}, {&g.dk, &c.oracle.dk, &c.tolerance.dk},
                               {&g.dv, &c.oracle.dv, &c.tolerance.dv}})
    for (Index n = 0; n < got->size(); ++n)
      EXPECT_LE(std::abs(double(got->values()[n]) - ref->values()[n]), tol->values()[n]) << n;
}

TEST(Dropout, badDropoutsAreNamed) {
  const Shape s{1, 1, 3, 2};
  const Tensor<double> q = wave<double>(s, 0.1, 1);
  const auto fails = [&](AttentionOptions o, const char* what) {
    try {
      attention<double>(q, q, q, o);
      ADD_FAILURE() << "no error for " << what;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  AttentionOptions o;
  o.dropout = Dropout{.p = 1};
  fails(o, "p = 1; expected a value in [0, 1)");
  o.dropout->p = -0.5;
  fails(o, "p = -0.5");
  o.dropout = Dropout{.p = 0.5, .keep = {1, 0, 1}, .H = 1, .T_q = 3, .T_k = 3};
  fails(o, "keep mask has 3 cells over H = 1, T_q = 3, T_k = 3; expected [B,H,T_q,T_k] = [1,1,3,3]");
  o.dropout->keep = {1, 0, 1, 1, 1, 2, 0, 0, 0};
  fails(o, "keep mask cell 5 is 2; expected 0 (dropped) or 1 (kept)");
  Tensor<double> w(Shape{});
  EXPECT_THROW(streaming_oracle(q, q, q, AttentionOptions{.dropout = Dropout{.p = 0.5}}), ValueError);
}

}  // namespace
}  // namespace attncheck
