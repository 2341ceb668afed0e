// The score modifiers (softcap, ALiBi, sinks), causal = false and the log-sum-exp, on hand-made cases: each one
// against the formula written out in float64 here, the streamed path against the materialising one, neutral
// settings equal to plain attention, and the backward (d_sinks included) against central differences.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "attncheck/attention.hpp"
#include "attncheck/backward.hpp"
#include "attncheck/format.hpp"
#include "attncheck/tolerance.hpp"
#include "wave.hpp"

namespace attncheck {
namespace {

using test::wave;
constexpr double kInf = std::numeric_limits<double>::infinity();

// The written-out formula for one (b, h, i): s = scale·q·k, softcap, ALiBi, causal (or not), sink column.
struct Row {
  std::vector<double> w;
  std::vector<double> out;
  double lse = -kInf;
};
Row by_hand(const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v, const AttentionOptions& o,
            Index b, Index h, Index i) {
  const Index T_q = q.shape().T, T_k = k.shape().T, D = q.shape().D, g = kv_head(h, q.shape().H, k.shape().H);
  const double scale = o.scale ? *o.scale : 1 / std::sqrt(double(D));
  const Index p = o.alignment == CausalAlignment::TopLeft ? i : i + T_k - T_q;
  std::vector<double> s(std::size_t(T_k), -kInf);
  for (Index j = 0; j < T_k; ++j) {
    if (o.causal && j > p) continue;
    double x = 0;
    for (Index c = 0; c < D; ++c) x += q(b, h, i, c) * k(b, g, j, c);
    x *= scale;
    if (o.temperature) x /= (*o.temperature)(b, h, i);
    if (o.softcap) x = *o.softcap * std::tanh(x / *o.softcap);
    if (!o.alibi_slopes.empty()) x += o.alibi_slopes[std::size_t(h)] * double(j - p);
    if (o.bias) x += (*o.bias)(b, h, i, j);
    s[std::size_t(j)] = x;
  }
  double total = o.sinks.empty() ? 0.0 : std::exp(o.sinks[std::size_t(h)]);
  for (const double x : s) total += std::exp(x);
  Row r;
  r.lse = std::log(total);
  r.out.assign(std::size_t(D), 0.0);
  for (Index j = 0; j < T_k; ++j) {
    r.w.push_back(total == 0 ? 0.0 : std::exp(s[std::size_t(j)]) / total);
    for (Index c = 0; c < D; ++c) r.out[std::size_t(c)] += r.w.back() * v(b, g, j, c);
  }
  return r;
}

// A bias [1, H, T_q, T_k] (broadcast over the batch) of multiples of 1/8 in [-2, 2): exact in half precision.
ScoreBias wave_bias(Index H, Index T_q, Index T_k) {
  ScoreBias bias{.B = 1, .H = H, .T_q = T_q, .T_k = T_k};
  for (Index n = 0; n < H * T_q * T_k; ++n) bias.values.push_back(std::floor(16 * std::sin(0.7 * double(n) + 0.3)) / 8);
  return bias;
}

// A temperature [B, H|1, T_q] of values in [0.5, 3] (at most 4 significant bits: exact in half precision).
QueryTemperature wave_temperature(Index B, Index H, Index T_q) {
  QueryTemperature t{.B = B, .H = H, .T_q = T_q};
  for (Index n = 0; n < B * H * T_q; ++n)
    t.values.push_back(1.75 + std::round(10 * std::sin(0.9 * double(n) + 0.4)) / 8);
  return t;
}

AttentionOptions all_modifiers(Index H, Index T_q, Index T_k) {
  AttentionOptions o;
  o.softcap = 1.5;
  for (Index h = 0; h < H; ++h) {
    o.alibi_slopes.push_back(std::ldexp(1.0, -int(h) - 1));
    o.sinks.push_back(0.25 * double(h) - 0.5);
  }
  o.bias = wave_bias(H, T_q, T_k);
  return o;
}

TEST(Modifiers, everyPathComputesTheWrittenOutFormula) {
  const Shape qs{2, 2, 5, 3}, ks{2, 1, 7, 3};
  const Tensor<double> q = wave<double>(qs, 0.1, 2.0), k = wave<double>(ks, 0.7, 2.0), v = wave<double>(ks, 1.3, 1.0);
  for (const bool causal : {true, false})
    for (const CausalAlignment a : {CausalAlignment::TopLeft, CausalAlignment::BottomRight}) {
      AttentionOptions o = all_modifiers(2, 5, 7);
      o.causal = causal;
      o.alignment = a;
      if (causal) o.temperature = wave_temperature(2, 1, 5);  // one per batch entry and query, broadcast over heads
      Tensor<double> w{Shape{}}, lse{Shape{}}, lse_streamed{Shape{}};
      const Tensor<double> out = attention<double>(q, k, v, o, &w, &lse);
      const Tensor<double> streamed = attention<double>(q, k, v, o, nullptr, &lse_streamed);
      for (Index b = 0; b < 2; ++b)
        for (Index h = 0; h < 2; ++h)
          for (Index i = 0; i < 5; ++i) {
            const Row r = by_hand(q, k, v, o, b, h, i);
            EXPECT_NEAR(lse(b, h, i, 0), r.lse, 1e-13);
            EXPECT_NEAR(lse_streamed(b, h, i, 0), r.lse, 1e-13);
            double visible = 0;
            for (Index j = 0; j < 7; ++j) {
              EXPECT_NEAR(w(b, h, i, j), r.w[std::size_t(j)], 1e-14);
              visible += w(b, h, i, j);
            }
            // The sink takes exp(σ - lse) of the row; the visible weights sum to the rest.
            EXPECT_NEAR(visible, 1 - std::exp(o.sinks[std::size_t(h)] - r.lse), 1e-14);
            for (Index c = 0; c < 3; ++c) {
              EXPECT_NEAR(out(b, h, i, c), r.out[std::size_t(c)], 1e-14);
              EXPECT_NEAR(streamed(b, h, i, c), r.out[std::size_t(c)], 1e-14);
            }
          }
    }
}

TEST(Modifiers, neutralSettingsArePlainAttention) {
  const Shape s{1, 2, 6, 4};
  const Tensor<float> q = wave<float>(s, 0.2, 3.0), k = wave<float>(s, 0.9, 3.0), v = wave<float>(s, 1.1, 1.0);
  const Tensor<float> plain = attention<float>(q, k, v);
  AttentionOptions o;
  o.alibi_slopes = {0.0, 0.0};
  o.sinks = {-kInf, -kInf};
  EXPECT_EQ(attention<float>(q, k, v, o).values(), plain.values());  // exactly: nothing is added
  Tensor<double> lse{Shape{}};
  attention<float>(q, k, v, {}, nullptr, &lse);
  for (Index n = 0; n < lse.size(); ++n) EXPECT_TRUE(std::isfinite(lse.values()[n]));
}

TEST(Modifiers, aRowThatSeesNoKeyHasLseMinusInfOrItsSink) {
  const Shape qs{1, 1, 3, 2}, ks{1, 1, 1, 2};
  const Tensor<double> q = wave<double>(qs, 0.1, 1.0), k = wave<double>(ks, 0.4, 1.0), v = wave<double>(ks, 0.8, 1.0);
  AttentionOptions o;
  o.alignment = CausalAlignment::BottomRight;  // queries 0 and 1 see nothing
  for (Tensor<double>* w : {static_cast<Tensor<double>*>(nullptr), new Tensor<double>(Shape{})}) {
    Tensor<double> lse{Shape{}};
    attention<double>(q, k, v, o, w, &lse);
    EXPECT_EQ(lse(0, 0, 0, 0), -kInf);
    EXPECT_EQ(lse(0, 0, 1, 0), -kInf);
    o.sinks = {0.75};
    const Tensor<double> out = attention<double>(q, k, v, o, w, &lse);
    EXPECT_EQ(lse(0, 0, 0, 0), 0.75);
    EXPECT_EQ(out(0, 0, 0, 0), 0.0);
    o.sinks.clear();
    delete w;
  }
}

TEST(Modifiers, badModifiersAreNamed) {
  const Shape s{1, 2, 2, 2};
  const Tensor<double> x = wave<double>(s, 0.3, 1.0);
  AttentionOptions o;
  o.sinks = {0.0};
  EXPECT_THROW(attention<double>(x, x, x, o), ShapeError);
  o.sinks = {0.0, kInf};
  EXPECT_THROW(attention<double>(x, x, x, o), ValueError);
  o = {};
  o.softcap = 0.0;
  EXPECT_THROW(attention<double>(x, x, x, o), ValueError);
  o = {};
  o.alibi_slopes = {1.0, std::nan("")};
  EXPECT_THROW(attention<double>(x, x, x, o), ValueError);
}

TEST(Modifiers, badBiasesAreNamed) {
  const Shape s{2, 2, 3, 3};
  const Tensor<double> x = wave<double>(s, 0.3, 1.0);
  AttentionOptions o;
  const auto message = [&] {
    try {
      attention<double>(x, x, x, o);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  o.bias = wave_bias(3, 3, 3);
  EXPECT_EQ(message(), "attention: bias is [1,3,3,3] with 27 values; expected [2 or 1,2 or 1,3,3]: H differs");
  o.bias = wave_bias(2, 3, 2);
  EXPECT_EQ(message(), "attention: bias is [1,2,3,2] with 12 values; expected [2 or 1,2 or 1,3,3]: T_k differs");
  o.bias = wave_bias(2, 3, 3);
  o.bias->values.pop_back();
  EXPECT_EQ(message(),
            "attention: bias is [1,2,3,3] with 17 values; expected [2 or 1,2 or 1,3,3]: the value count is not B·H·T_q·T_k");
  o.bias = wave_bias(2, 3, 3);
  o.bias->values[4] = kInf;
  EXPECT_EQ(message(),
            "attention: bias value 4 is inf; each must be finite or -inf (a bias of -inf hides its cell as a "
            "mask does)");
  o.bias->values[4] = std::nan("");
  EXPECT_EQ(message(),
            "attention: bias value 4 is nan; each must be finite or -inf (a bias of -inf hides its cell as a "
            "mask does)");
  o.bias = wave_bias(2, 3, 3);
  EXPECT_THROW(attention<double>(x, x, x, BoolMask::causal(3, 3), o), ValueError);  // an explicit mask is the rule
}

TEST(Modifiers, badTemperaturesAreNamed) {
  const Shape s{2, 2, 3, 3};
  const Tensor<double> x = wave<double>(s, 0.3, 1.0);
  AttentionOptions o;
  const auto message = [&] {
    try {
      attention<double>(x, x, x, o);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  o.temperature = wave_temperature(1, 3, 3);
  EXPECT_EQ(message(), "attention: temperature is [1,3,3] with 9 values; expected [2 or 1,2 or 1,3]: H differs");
  o.temperature = wave_temperature(2, 2, 2);
  EXPECT_EQ(message(), "attention: temperature is [2,2,2] with 8 values; expected [2 or 1,2 or 1,3]: T_q differs");
  o.temperature = wave_temperature(2, 2, 3);
  o.temperature->values.pop_back();
  EXPECT_EQ(message(),
            "attention: temperature is [2,2,3] with 11 values; expected [2 or 1,2 or 1,3]: the value count is not "
            "B·H·T_q");
  for (const double bad : {0.0, -1.0, kInf, std::nan("")}) {
    o.temperature = wave_temperature(2, 2, 3);
    o.temperature->values[5] = bad;
    EXPECT_EQ(message(), "attention: temperature value 5 is " + format_number(bad, 17) +
                             "; each must be finite and > 0 (it divides the scores)");
  }
  o.temperature = wave_temperature(2, 2, 3);
  EXPECT_THROW(attention<double>(x, x, x, BoolMask::causal(3, 3), o), ValueError);  // an explicit mask is the rule
  EXPECT_THROW(head_modifiers(o, 0, 0, 3, 3), std::logic_error);  // a head's modifiers come after the folding
}

// A temperature divides query i's scores by τ_i: it is the call on q_i/τ_i. For powers of two that quotient is exact,
// so every path (materialised, streamed, the LSE, the backward with dQ = dQ'/τ) gives bit for bit what the call on
// the divided q gives; a broadcast temperature is the same values written out; and the backward of a general τ
// matches central differences.
TEST(Modifiers, aTemperatureIsTheQueryDividedByIt) {
  const Shape qs{2, 2, 6, 4}, ks{2, 1, 9, 4};
  const Tensor<float> q = wave<float>(qs, 0.2, 3.0), k = wave<float>(ks, 0.9, 3.0), v = wave<float>(ks, 1.1, 1.0);
  AttentionOptions hot;
  hot.alignment = CausalAlignment::BottomRight;
  hot.softcap = 2.0;
  hot.sinks = {0.5, -1.0};
  AttentionOptions plain = hot;
  hot.temperature = QueryTemperature{.B = 2, .H = 2, .T_q = 6};
  Tensor<float> divided = q;
  for (Index b = 0; b < 2; ++b)
    for (Index h = 0; h < 2; ++h)
      for (Index i = 0; i < 6; ++i) {
        const double tau = std::ldexp(1.0, int((b + 3 * h + 5 * i) % 5) - 2);  // 1/4 .. 4
        hot.temperature->values.push_back(tau);
        for (Index c = 0; c < 4; ++c) divided(b, h, i, c) = float(double(q(b, h, i, c)) / tau);
      }
  for (const bool streamed : {false, true}) {
    Tensor<float> w{Shape{}}, w_plain{Shape{}};
    Tensor<double> lse{Shape{}}, lse_plain{Shape{}};
    const Tensor<float> out = attention<float>(q, k, v, hot, streamed ? nullptr : &w, &lse);
    EXPECT_EQ(out.values(), attention<float>(divided, k, v, plain, streamed ? nullptr : &w_plain, &lse_plain).values());
    EXPECT_EQ(lse.values(), lse_plain.values());
    if (!streamed) EXPECT_EQ(w.values(), w_plain.values());
  }
  const Tensor<float> dO = wave<float>(qs, 2.3, 1.0);
  const AttentionGradients<float> g = attention_backward<float>(q, k, v, dO, hot),
                                  g_plain = attention_backward<float>(divided, k, v, dO, plain);
  EXPECT_EQ(g.dk.values(), g_plain.dk.values());
  EXPECT_EQ(g.dv.values(), g_plain.dv.values());
  for (Index b = 0; b < 2; ++b)
    for (Index h = 0; h < 2; ++h)
      for (Index i = 0; i < 6; ++i)
        for (Index c = 0; c < 4; ++c)
          EXPECT_EQ(g.dq(b, h, i, c), float(double(g_plain.dq(b, h, i, c)) / (*hot.temperature)(b, h, i)));
  // Broadcast over the batch and the heads: the same values, written out.
  AttentionOptions one = plain, every = plain;
  one.temperature = wave_temperature(1, 1, 6);
  every.temperature = QueryTemperature{.B = 2, .H = 2, .T_q = 6};
  for (Index n = 0; n < 4; ++n)
    every.temperature->values.insert(every.temperature->values.end(), one.temperature->values.begin(),
                                     one.temperature->values.end());
  EXPECT_EQ(attention<float>(q, k, v, one).values(), attention<float>(q, k, v, every).values());
  EXPECT_EQ(attention_backward<float>(q, k, v, dO, one).dq.values(),
            attention_backward<float>(q, k, v, dO, every).dq.values());
  // The float64 backward of a general temperature against central differences, dQ and dK.
  Tensor<double> qd = q.cast<double>(), kd = k.cast<double>();
  const Tensor<double> vd = v.cast<double>(), dOd = dO.cast<double>();
  AttentionOptions general = plain;
  general.temperature = wave_temperature(2, 2, 6);
  const auto loss = [&] { return attention<double>(qd, kd, vd, general).values().dot(dOd.values()); };
  const AttentionGradients<double> gd = attention_backward<double>(qd, kd, vd, dOd, general);
  const double step = 1e-5;
  for (auto [x, grad] : {std::pair{&qd, &gd.dq}, {&kd, &gd.dk}})
    for (Index n = 0; n < x->size(); ++n) {
      const double x0 = x->values()[n];
      x->values()[n] = x0 + step;
      const double up = loss();
      x->values()[n] = x0 - step;
      const double down = loss();
      x->values()[n] = x0;
      EXPECT_NEAR(grad->values()[n], (up - down) / (2 * step), 1e-7) << "entry " << n;
    }
  // The streamed oracle backward (and its bound) gives what the materialised one gives.
  const AttentionGradients<double> sd = streaming_oracle_backward<double>(qd, kd, vd, dOd, general);
  for (Index n = 0; n < sd.dq.size(); ++n) EXPECT_NEAR(sd.dq.values()[n], gd.dq.values()[n], 1e-13);
  const GradientCheck m = gradient_check(DType::f16, qd, kd, vd, dOd, general),
                      s = streamed_gradient_check(DType::f16, qd, kd, vd, dOd, general);
  for (Index n = 0; n < m.tolerance.dq.size(); ++n)
    EXPECT_NEAR(s.tolerance.dq.values()[n], m.tolerance.dq.values()[n], 1e-12 * m.tolerance.dq.values()[n]);
  for (Index n = 0; n < m.tolerance.dk.size(); ++n)
    EXPECT_NEAR(s.tolerance.dk.values()[n], m.tolerance.dk.values()[n], 1e-12 * m.tolerance.dk.values()[n]);
}

// The derived bounds hold for a correct kernel that folds τ differently from the reference: q·(1/τ) with 1/τ rounded
// to half precision first (tolerance.cpp step 8 (a)), at float16, forward and backward; and they are not vacuous.
TEST(Modifiers, aTemperatureFoldedAnotherWayIsWithinTheBound) {
  const Shape qs{1, 2, 24, 8};
  const Tensor<Eigen::half> q = wave<Eigen::half>(qs, 0.2, 1.5), k = wave<Eigen::half>(qs, 0.5, 1.5),
                            v = wave<Eigen::half>(qs, 0.8, 1.0), dO = wave<Eigen::half>(qs, 1.7, 1.0);
  AttentionOptions o;
  o.temperature = QueryTemperature{.B = 1, .H = 1, .T_q = 24};
  for (Index i = 0; i < 24; ++i) o.temperature->values.push_back(0.5 + 0.0625 * double((7 * i) % 40));  // 0.5 .. 2.94
  Tensor<Eigen::half> folded = q;
  for (Index h = 0; h < 2; ++h)
    for (Index i = 0; i < 24; ++i) {
      const Eigen::half inv = Eigen::half(1.0 / (*o.temperature)(0, 0, i));
      for (Index c = 0; c < 8; ++c) folded(0, h, i, c) = Eigen::half(float(q(0, h, i, c)) * float(inv));
    }
  const Tensor<Eigen::half> out = attention<Eigen::half>(folded, k, v);
  Tensor<double> w{Shape{}};
  const Tensor<double> want = oracle(q, k, v, o, &w);
  const Tensor<double> qd = q.cast<double>(), kd = k.cast<double>(), vd = v.cast<double>();
  const AttentionOptions f = folded_options(o);
  const Tensor<double> q_folded = fold_temperature(qd, o);
  double worst = 0;
  for (Index h = 0; h < 2; ++h) {
    const HeadTolerance tol =
        head_tolerance(DType::f16, q_folded.head(0, h), kd.head(0, h), vd.head(0, h), BoolMask::causal(24, 24),
                       0.25 * std::sqrt(2.0), want.head(0, h), w.head(0, h), 2.0, head_modifiers(f, 0, h, 24, 24));
    for (Index i = 0; i < 24; ++i)
      for (Index c = 0; c < 8; ++c) {
        const double err = std::abs(double(out(0, h, i, c)) - want(0, h, i, c));
        EXPECT_LE(err, tol.output(i, c)) << h << "," << i << "," << c;
        EXPECT_LT(tol.output(i, c), 0.1);  // not vacuous: a 10% error of an O(1) output is caught
        worst = std::max(worst, err);
      }
  }
  EXPECT_GT(worst, 0.0);  // the other folding does round differently
  const AttentionGradients<Eigen::half> g = attention_backward<Eigen::half>(folded, k, v, dO);
  const GradientCheck c = gradient_check(DType::f16, qd, kd, vd, dO.cast<double>(), o);
  for (Index n = 0; n < g.dk.size(); ++n)
    EXPECT_LE(std::abs(double(g.dk.values()[n]) - c.oracle.dk.values()[n]), c.tolerance.dk.values()[n]) << n;
  for (Index b = 0; b < 1; ++b)
    for (Index h = 0; h < 2; ++h)
      for (Index i = 0; i < 24; ++i)
        for (Index d = 0; d < 8; ++d) {  // this kernel's dQ' times 1/τ: dQ
          const double inv = double(Eigen::half(1.0 / (*o.temperature)(0, 0, i)));
          const double dq = double(Eigen::half(float(g.dq(b, h, i, d)) * float(inv)));
          EXPECT_LE(std::abs(dq - c.oracle.dq(b, h, i, d)), c.tolerance.dq(b, h, i, d)) << h << "," << i << "," << d;
        }
}

// A bias of slope·(j - p) is ALiBi, bit for bit (both add the same exact value in the same place, after the
// softcap); a bias [1, 1, T_q, T_k] is the same bias written out for every batch entry and head; a bias constant
// along each row changes nothing (softmax is shift-invariant) but the LSE, which it shifts by the constant.
TEST(Modifiers, aBiasIsAddedWhereAlibiIs) {
  const Shape qs{2, 2, 6, 4}, ks{2, 1, 9, 4};
  const Tensor<float> q = wave<float>(qs, 0.2, 3.0), k = wave<float>(ks, 0.9, 3.0), v = wave<float>(ks, 1.1, 1.0);
  for (const bool causal : {true, false}) {
    AttentionOptions alibi;
    alibi.causal = causal;
    alibi.alignment = CausalAlignment::BottomRight;
    alibi.softcap = 2.0;
    alibi.alibi_slopes = {0.5, 0.125};
    AttentionOptions biased = alibi;
    biased.alibi_slopes.clear();
    biased.bias = ScoreBias{.B = 1, .H = 2, .T_q = 6, .T_k = 9};
    for (Index h = 0; h < 2; ++h)
      for (Index i = 0; i < 6; ++i)
        for (Index j = 0; j < 9; ++j) biased.bias->values.push_back(alibi.alibi_slopes[std::size_t(h)] * double(j - (i + 3)));
    for (const bool streamed : {false, true}) {
      Tensor<float> w{Shape{}}, w_biased{Shape{}};
      Tensor<double> lse{Shape{}}, lse_biased{Shape{}};
      const Tensor<float> out = attention<float>(q, k, v, alibi, streamed ? nullptr : &w, &lse);
      EXPECT_EQ(attention<float>(q, k, v, biased, streamed ? nullptr : &w_biased, &lse_biased).values(), out.values());
      EXPECT_EQ(lse_biased.values(), lse.values());
      if (!streamed) EXPECT_EQ(w_biased.values(), w.values());
    }
    const AttentionGradients<float> g = attention_backward<float>(q, k, v, q, alibi);
    const AttentionGradients<float> g_biased = attention_backward<float>(q, k, v, q, biased);
    EXPECT_EQ(g_biased.dq.values(), g.dq.values());
    EXPECT_EQ(g_biased.dk.values(), g.dk.values());
    EXPECT_EQ(g_biased.dv.values(), g.dv.values());
    // Broadcast over the batch and the heads: the same values, written out.
    AttentionOptions one = alibi, every = alibi;
    one.alibi_slopes.clear();
    every.alibi_slopes.clear();
    one.bias = wave_bias(1, 6, 9);
    every.bias = ScoreBias{.B = 2, .H = 2, .T_q = 6, .T_k = 9};
    for (Index n = 0; n < 4; ++n)
      every.bias->values.insert(every.bias->values.end(), one.bias->values.begin(), one.bias->values.end());
    EXPECT_EQ(attention<float>(q, k, v, one).values(), attention<float>(q, k, v, every).values());
  }
  // Row-constant, in float64 (the shift is exact there up to the sum's rounding).
  const Tensor<double> qd = q.cast<double>(), kd = k.cast<double>(), vd = v.cast<double>();
  AttentionOptions shifted;
  shifted.bias = ScoreBias{.B = 2, .H = 2, .T_q = 6, .T_k = 9};
  for (Index n = 0; n < 2 * 2 * 6; ++n) shifted.bias->values.insert(shifted.bias->values.end(), 9, 0.25 * double(n % 7) - 1);
  Tensor<double> lse{Shape{}}, lse_shifted{Shape{}};
  const Tensor<double> plain = attention<double>(qd, kd, vd, {}, nullptr, &lse);
  const Tensor<double> out = attention<double>(qd, kd, vd, shifted, nullptr, &lse_shifted);
  for (Index n = 0; n < plain.size(); ++n) EXPECT_NEAR(out.values()[n], plain.values()[n], 1e-14);
  for (Index r = 0; r < lse.size(); ++r)
    EXPECT_NEAR(lse_shifted.values()[r] - lse.values()[r], 0.25 * double(r % 7) - 1, 1e-14);
}

// A bias of -inf is the mask: every path (materialised, streamed, backward) gives bit for bit what the same case gives
// with those cells hidden by a dense mask, a row whose every visible cell is -inf included (an empty row: 0, LSE
// -inf), with a bias per batch entry and head so that the hidden cells differ between heads.
TEST(Modifiers, aBiasOfMinusInfIsTheMask) {
  const Shape qs{2, 2, 6, 4}, ks{2, 1, 9, 4};
  const Tensor<float> q = wave<float>(qs, 0.2, 3.0), k = wave<float>(ks, 0.9, 3.0), v = wave<float>(ks, 1.1, 1.0);
  AttentionOptions biased, masked;
  biased.alignment = masked.alignment = CausalAlignment::BottomRight;
  biased.softcap = masked.softcap = 2.0;
  biased.bias = ScoreBias{.B = 2, .H = 2, .T_q = 6, .T_k = 9};
  masked.bias = biased.bias;
  masked.dense_mask = DenseMask{.B = 2, .H = 2, .T_q = 6, .T_k = 9};
  for (Index n = 0; n < 2 * 2 * 6 * 9; ++n) {
    const Index i = (n / 9) % 6, bh = n / 54;
    const bool hide = n % 3 == 1 || (i == 2 && bh == 1);  // a third of the cells, and all of row 2 of (0, 1)
    biased.bias->values.push_back(hide ? -kInf : 0.25 * double(n % 5));
    masked.bias->values.push_back(hide ? 0.0 : 0.25 * double(n % 5));
    masked.dense_mask->cells.push_back(hide ? 0 : 1);
  }
  for (const bool streamed : {false, true}) {
    Tensor<float> w{Shape{}}, w_masked{Shape{}};
    Tensor<double> lse{Shape{}}, lse_masked{Shape{}};
    const Tensor<float> out = attention<float>(q, k, v, biased, streamed ? nullptr : &w, &lse);
    EXPECT_EQ(out.values(), attention<float>(q, k, v, masked, streamed ? nullptr : &w_masked, &lse_masked).values());
    EXPECT_EQ(lse.values(), lse_masked.values());
    if (!streamed) {
      EXPECT_EQ(w.values(), w_masked.values());
    }
    EXPECT_TRUE(out.values().allFinite());
    EXPECT_EQ(lse(0, 1, 2, 0), -kInf);  // the row that sees no key
    for (Index c = 0; c < 4; ++c) EXPECT_EQ(out(0, 1, 2, c), 0.0f);
  }
  const AttentionGradients<float> g = attention_backward<float>(q, k, v, q, biased);
  const AttentionGradients<float> g_masked = attention_backward<float>(q, k, v, q, masked);
  EXPECT_EQ(g.dq.values(), g_masked.dq.values());
  EXPECT_EQ(g.dk.values(), g_masked.dk.values());
  EXPECT_EQ(g.dv.values(), g_masked.dv.values());
  EXPECT_TRUE(g.dq.values().allFinite() && g.dk.values().allFinite() && g.dv.values().allFinite());
}

// L = Σ dO ∘ attention: the backward's dQ, dK, dV and d_sinks against central differences.
TEST(Modifiers, theBackwardMatchesCentralDifferences) {
  const Shape qs{1, 2, 4, 3}, ks{1, 1, 5, 3};
  Tensor<double> q = wave<double>(qs, 0.1, 1.5), k = wave<double>(ks, 0.7, 1.5), v = wave<double>(ks, 1.3, 1.5);
  const Tensor<double> dO = wave<double>(qs, 2.9, 1.0);
  AttentionOptions o = all_modifiers(2, 4, 5);
  o.alignment = CausalAlignment::BottomRight;
  const auto loss = [&] { return attention<double>(q, k, v, o).values().dot(dO.values()); };
  const AttentionGradients<double> g = attention_backward<double>(q, k, v, dO, o);
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
  ASSERT_EQ(g.dsinks.size(), 2u);
  for (std::size_t s = 0; s < 2; ++s) {
    const double s0 = o.sinks[s];
    o.sinks[s] = s0 + h;
    const double up = loss();
    o.sinks[s] = s0 - h;
    const double down = loss();
    o.sinks[s] = s0;
    EXPECT_NEAR(g.dsinks[s], (up - down) / (2 * h), 1e-7);
  }
  ASSERT_TRUE(g.dbias);
  ASSERT_EQ(g.dbias->shape(), (Shape{1, 2, 4, 5}));  // the bias's own shape: one per head
  for (std::size_t n = 0; n < o.bias->values.size(); ++n) {
    const double b0 = o.bias->values[n];
    o.bias->values[n] = b0 + h;
    const double up = loss();
    o.bias->values[n] = b0 - h;
    const double down = loss();
    o.bias->values[n] = b0;
    EXPECT_NEAR(g.dbias->values()[Index(n)], (up - down) / (2 * h), 1e-7) << "bias entry " << n;
  }
  // The derived bound holds for the float32 reference (the check the gradient laws make).
  const auto f = [](const Tensor<double>& t) { return t.cast<float>(); };
  const AttentionGradients<float> gf = attention_backward<float>(f(q), f(k), f(v), f(dO), o);
  const GradientCheck c = gradient_check(DType::f32, f(q).cast<double>(), f(k).cast<double>(), f(v).cast<double>(),
                                         f(dO).cast<double>(), o);
  for (std::size_t s = 0; s < 2; ++s) {
    EXPECT_LE(std::abs(gf.dsinks[s] - c.oracle.dsinks[s]), c.tolerance.dsinks[s]);
    EXPECT_LT(c.tolerance.dsinks[s], 0.01 * std::abs(c.oracle.dsinks[s]));  // not vacuous: a 1% error is caught
  }
  ASSERT_TRUE(gf.dbias && c.oracle.dbias && c.tolerance.dbias);
  const double scale = c.oracle.dbias->values().cwiseAbs().maxCoeff();
  for (Index n = 0; n < c.oracle.dbias->size(); ++n) {
    EXPECT_LE(std::abs(gf.dbias->values()[n] - c.oracle.dbias->values()[n]), c.tolerance.dbias->values()[n]) << n;
    EXPECT_LT(c.tolerance.dbias->values()[n], 0.01 * scale) << n;  // not vacuous
  }
}

// dBias is dS summed over the bias's broadcast axes: a bias [1, 1, T_q, T_k] gets the sum of what the same values
// written out for every (b, h) get; each row of it sums to 0 without sinks (Σ_j P_ij (dP_ij - Δ_i) = 0); a hidden
// cell's is exactly 0; and the streamed path (and its bound) gives what the materialised one gives.
TEST(Modifiers, dBiasSumsOverTheBroadcastAxesOnEveryPath) {
  const Shape qs{2, 2, 6, 4}, ks{2, 1, 9, 4};
  const Tensor<double> q = wave<double>(qs, 0.2, 2.0), k = wave<double>(ks, 0.9, 2.0), v = wave<double>(ks, 1.1, 1.0),
                       dO = wave<double>(qs, 2.3, 1.0);
  AttentionOptions one, every;
  one.alignment = every.alignment = CausalAlignment::BottomRight;
  one.softcap = every.softcap = 2.0;
  one.window = every.window = 4;
  one.bias = wave_bias(1, 6, 9);
  every.bias = ScoreBias{.B = 2, .H = 2, .T_q = 6, .T_k = 9};
  for (Index n = 0; n < 4; ++n)
    every.bias->values.insert(every.bias->values.end(), one.bias->values.begin(), one.bias->values.end());
  const AttentionGradients<double> g1 = attention_backward<double>(q, k, v, dO, one),
                                   g4 = attention_backward<double>(q, k, v, dO, every);
  ASSERT_TRUE(g1.dbias && g4.dbias);
  ASSERT_EQ(g1.dbias->shape(), (Shape{1, 1, 6, 9}));
  ASSERT_EQ(g4.dbias->shape(), (Shape{2, 2, 6, 9}));
  EXPECT_EQ(g1.dq.values(), g4.dq.values());
  for (Index i = 0; i < 6; ++i) {
    double row = 0;
    for (Index j = 0; j < 9; ++j) {
      double sum = 0;
      for (Index b = 0; b < 2; ++b)
        for (Index h = 0; h < 2; ++h) sum += (*g4.dbias)(b, h, i, j);
      EXPECT_NEAR((*g1.dbias)(0, 0, i, j), sum, 1e-14) << i << "," << j;
      const Index p = i + 3;
      if (j > p || j < p - 4) {
        EXPECT_EQ((*g1.dbias)(0, 0, i, j), 0.0) << "hidden " << i << "," << j;
      }
      row += (*g1.dbias)(0, 0, i, j);
    }
    EXPECT_NEAR(row, 0.0, 1e-14) << "row " << i;
  }
  const AttentionGradients<double> s1 = streaming_oracle_backward<double>(q, k, v, dO, one);
  ASSERT_TRUE(s1.dbias);
  ASSERT_EQ(s1.dbias->shape(), g1.dbias->shape());
  for (Index n = 0; n < s1.dbias->size(); ++n) EXPECT_NEAR(s1.dbias->values()[n], g1.dbias->values()[n], 1e-14);
  const GradientCheck m = gradient_check(DType::bf16, q, k, v, dO, one),
                      s = streamed_gradient_check(DType::bf16, q, k, v, dO, one);
  ASSERT_TRUE(s.tolerance.dbias && m.tolerance.dbias);
  ASSERT_EQ(s.tolerance.dbias->shape(), m.tolerance.dbias->shape());
  for (Index n = 0; n < m.tolerance.dbias->size(); ++n)
    EXPECT_NEAR(s.tolerance.dbias->values()[n], m.tolerance.dbias->values()[n], 1e-12 * m.tolerance.dbias->values()[n]);
}

// ---- Rotary position embeddings --------------------------------------------------------------------------------

// A rope of rotary_dim r over B sequences: queries at `q_start + i`, keys at `k_start + j` (per batch entry b, the
// starts shifted by 3b so that entries differ).
Rope test_rope(RopeVariant variant, Index r, Index B, Index T_q, Index T_k, Index q_start, Index k_start) {
  Rope rope{.variant = variant, .rotary_dim = r, .base = 10000, .factor = 1};
  for (Index b = 0; b < B; ++b) {
    for (Index i = 0; i < T_q; ++i) rope.q_positions.push_back(q_start + 3 * b + i);
    for (Index j = 0; j < T_k; ++j) rope.k_positions.push_back(k_start + 3 * b + j);
  }
  return rope;
}

// x rotated by hand: pair m of (half-split) (m, m + r/2) or (interleaved) (2m, 2m+1) by pos·base^(-2m/r), in double,
// rounded to S once.
template <class S>
Tensor<S> rotated(const Tensor<S>& x, const Rope& rope, const std::vector<Index>& positions) {
  Tensor<S> r = x;
  const Shape& s = x.shape();
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index t = 0; t < s.T; ++t)
        for (Index m = 0; m < rope.rotary_dim / 2; ++m) {
          const Index a = rope.variant == RopeVariant::half_split ? m : 2 * m,
                      e = rope.variant == RopeVariant::half_split ? m + rope.rotary_dim / 2 : 2 * m + 1;
          const double theta = double(positions[std::size_t(b * s.T + t)]) / rope.factor *
                               std::pow(rope.base, -2.0 * double(m) / double(rope.rotary_dim));
          const double xa = double(x(b, h, t, a)), xe = double(x(b, h, t, e));
          r(b, h, t, a) = S(xa * std::cos(theta) - xe * std::sin(theta));
          r(b, h, t, e) = S(xe * std::cos(theta) + xa * std::sin(theta));
        }
  return r;
}

TEST(Modifiers, badRopesAreNamed) {
  const Shape s{2, 2, 3, 4};
  const Tensor<double> x = wave<double>(s, 0.3, 1.0);
  AttentionOptions o;
  const auto message = [&] {
    try {
      attention<double>(x, x, x, o);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  o.rope = test_rope(RopeVariant::half_split, 3, 2, 3, 3, 0, 0);
  EXPECT_EQ(message(), "attention: rope rotary_dim is 3; expected an even number >= 2");
  o.rope = test_rope(RopeVariant::half_split, 6, 2, 3, 3, 0, 0);
  EXPECT_EQ(message(), "attention: rope rotary_dim is 6; expected an even number in [2, D = 4]");
  o.rope = test_rope(RopeVariant::half_split, 4, 2, 3, 3, 0, 0);
  o.rope->k_positions.pop_back();
  EXPECT_EQ(message(), "attention: rope k_positions has 5 entries; expected B·T = 2·3 = 6");
  o.rope = test_rope(RopeVariant::half_split, 4, 2, 3, 3, 0, 0);
  o.rope->q_positions[4] = -1;
  EXPECT_EQ(message(), "attention: rope q_positions[4] is -1; expected a position id in [0, 2^40]");
  o.rope = test_rope(RopeVariant::half_split, 4, 2, 3, 3, 0, 0);
  o.rope->base = 0;
  EXPECT_EQ(message(), "attention: rope base is 0; expected finite and > 0");
  o.rope = test_rope(RopeVariant::half_split, 4, 2, 3, 3, 0, 0);
  EXPECT_THROW(attention<double>(x, x, x, BoolMask::causal(3, 3), o), ValueError);  // an explicit mask is the rule
  EXPECT_THROW(head_modifiers(o, 0, 0, 3, 3), std::logic_error);  // a head's modifiers come after the folding
}

// A rope is the call on rotated inputs: every path (materialised, streamed, the LSE, the backward with dQ = R_qᵀ dQ'
// and dK = R_kᵀ dK') gives what the call without it gives on q and k rotated by hand, for both variants and a
// rotary_dim below D, with grouped kv heads and a temperature beside it; position 0 everywhere is the identity, bit
// for bit.
TEST(Modifiers, aRopeIsTheCallOnRotatedInputs) {
  const Shape qs{2, 2, 5, 6}, ks{2, 1, 7, 6};
  const Tensor<float> q = wave<float>(qs, 0.2, 2.0), k = wave<float>(ks, 0.9, 2.0), v = wave<float>(ks, 1.1, 1.0),
                      dO = wave<float>(qs, 2.3, 1.0);
  for (const RopeVariant variant : {RopeVariant::half_split, RopeVariant::interleaved}) {
    AttentionOptions plain;
    plain.alignment = CausalAlignment::BottomRight;
    plain.softcap = 3.0;
    AttentionOptions roped = plain;
    roped.rope = test_rope(variant, 4, 2, 5, 7, 2, 0);
    const Tensor<float> qr = rotated(q, *roped.rope, roped.rope->q_positions),
                        kr = rotated(k, *roped.rope, roped.rope->k_positions);
    for (const bool streamed : {false, true}) {
      Tensor<float> w{Shape{}}, w_plain{Shape{}};
      Tensor<double> lse{Shape{}}, lse_plain{Shape{}};
      EXPECT_EQ(attention<float>(q, k, v, roped, streamed ? nullptr : &w, &lse).values(),
                attention<float>(qr, kr, v, plain, streamed ? nullptr : &w_plain, &lse_plain).values());
      EXPECT_EQ(lse.values(), lse_plain.values());
      if (!streamed) EXPECT_EQ(w.values(), w_plain.values());
    }
    // The backward: the plain call's gradients turned back by Rᵀ (in float, as the core does; compared to 1e-6).
    const AttentionGradients<float> g = attention_backward<float>(q, k, v, dO, roped),
                                    gp = attention_backward<float>(qr, kr, v, dO, plain);
    EXPECT_EQ(g.dv.values(), gp.dv.values());
    Rope back = *roped.rope;  // Rᵀ is the rotation by -θ: negated positions
    for (Index& x : back.q_positions) x = -x;
    for (Index& x : back.k_positions) x = -x;
    const Tensor<float> dq = rotated(gp.dq, back, back.q_positions), dk = rotated(gp.dk, back, back.k_positions);
    for (Index n = 0; n < dq.size(); ++n) EXPECT_NEAR(g.dq.values()[n], dq.values()[n], 1e-6) << n;
    for (Index n = 0; n < dk.size(); ++n) EXPECT_NEAR(g.dk.values()[n], dk.values()[n], 1e-6) << n;
    // Position 0 everywhere rotates by 0: cos 0 = 1 and sin 0 = 0 exactly.
    AttentionOptions zero = roped;
    std::fill(zero.rope->q_positions.begin(), zero.rope->q_positions.end(), 0);
    std::fill(zero.rope->k_positions.begin(), zero.rope->k_positions.end(), 0);
    EXPECT_EQ(attention<float>(q, k, v, zero).values(), attention<float>(q, k, v, plain).values());
    // With a temperature too: the rotated query divided by it.
    AttentionOptions both = roped;
    both.temperature = wave_temperature(2, 1, 5);
    AttentionOptions tempered = plain;
    tempered.temperature = both.temperature;
    EXPECT_EQ(attention<float>(q, k, v, both).values(), attention<float>(qr, kr, v, tempered).values());
  }
}

// In float64: the output depends on the positions only through their differences (every position moved by 1000), the
// interleaved rope is the half-split one on head dimensions permuted so that (2m, 2m+1) become (m, m + r/2), and the
// backward (rope, temperature and softcap at once) matches central differences.
TEST(Modifiers, aRopeIsRelativeAndItsVariantsAPermutation) {
  const Shape qs{1, 2, 5, 6}, ks{1, 2, 7, 6};
  Tensor<double> q = wave<double>(qs, 0.2, 1.5), k = wave<double>(ks, 0.9, 1.5);
  const Tensor<double> v = wave<double>(ks, 1.1, 1.0), dO = wave<double>(qs, 2.3, 1.0);
  AttentionOptions o;
  o.alignment = CausalAlignment::BottomRight;
  o.rope = test_rope(RopeVariant::half_split, 6, 1, 5, 7, 2, 0);
  AttentionOptions shifted = o;
  for (Index& x : shifted.rope->q_positions) x += 1000;
  for (Index& x : shifted.rope->k_positions) x += 1000;
  const Tensor<double> out = attention<double>(q, k, v, o), moved = attention<double>(q, k, v, shifted);
  for (Index n = 0; n < out.size(); ++n) EXPECT_NEAR(moved.values()[n], out.values()[n], 1e-12) << n;
  // Interleaved on permuted dims: dim 2m of the permuted vector is dim m of the original, 2m+1 is m + r/2.
  const auto permuted = [](const Tensor<double>& x) {
    Tensor<double> r = x;
    const Shape& s = x.shape();
    for (Index b = 0; b < s.B; ++b)
      for (Index h = 0; h < s.H; ++h)
        for (Index t = 0; t < s.T; ++t)
          for (Index m = 0; m < 3; ++m) {
            r(b, h, t, 2 * m) = x(b, h, t, m);
            r(b, h, t, 2 * m + 1) = x(b, h, t, m + 3);
          }
    return r;
  };
  AttentionOptions inter = o;
  inter.rope->variant = RopeVariant::interleaved;
  const Tensor<double> out_inter = attention<double>(permuted(q), permuted(k), v, inter);
  for (Index n = 0; n < out.size(); ++n) EXPECT_NEAR(out_inter.values()[n], out.values()[n], 1e-12) << n;
  EXPECT_GT((attention<double>(q, k, v, inter).values() - out.values()).cwiseAbs().maxCoeff(), 1e-3);  // not the same
  // Central differences of dQ and dK with a rope (interleaved, rotary_dim 4 < D), a temperature and a softcap.
  AttentionOptions all = inter;
  all.rope->rotary_dim = 4;
  all.temperature = wave_temperature(1, 2, 5);
  all.softcap = 2.0;
  const auto loss = [&] { return attention<double>(q, k, v, all).values().dot(dO.values()); };
  const AttentionGradients<double> g = attention_backward<double>(q, k, v, dO, all);
  const double step = 1e-5;
  for (auto [x, grad] : {std::pair{&q, &g.dq}, {&k, &g.dk}})
    for (Index n = 0; n < x->size(); ++n) {
      const double x0 = x->values()[n];
      x->values()[n] = x0 + step;
      const double up = loss();
      x->values()[n] = x0 - step;
      const double down = loss();
      x->values()[n] = x0;
      EXPECT_NEAR(grad->values()[n], (up - down) / (2 * step), 1e-7) << "entry " << n;
    }
  const AttentionGradients<double> sg = streaming_oracle_backward<double>(q, k, v, dO, all);
  for (Index n = 0; n < sg.dq.size(); ++n) EXPECT_NEAR(sg.dq.values()[n], g.dq.values()[n], 1e-13);
  for (Index n = 0; n < sg.dk.size(); ++n) EXPECT_NEAR(sg.dk.values()[n], g.dk.values()[n], 1e-13);
}

// The derived bounds hold for a correct kernel that rotates in its own arithmetic: the angle pos·base^(-2m/r) in
// float, cos and sin rounded to half precision, the rotation's products and sum in half (Hugging Face's
// apply_rotary_pos_emb at float16), at positions from 0 and from 3·10^4 (where the float angle itself is off by up to
// 10^-3: the bound grows with the position); at float16, forward and backward; not vacuous at small positions.
class RopeBound : public testing::TestWithParam<Index> {};
INSTANTIATE_TEST_SUITE_P(Starts, RopeBound, testing::Values(Index{0}, Index{30000}));
TEST_P(RopeBound, aRopeRotatedAnotherWayIsWithinTheBound) {
  using H = Eigen::half;
  const Shape qs{1, 2, 16, 8};
  const Tensor<H> q = wave<H>(qs, 0.2, 1.5), k = wave<H>(qs, 0.5, 1.5), v = wave<H>(qs, 0.8, 1.0),
                  dO = wave<H>(qs, 1.7, 1.0);
  AttentionOptions o;
  o.rope = test_rope(RopeVariant::half_split, 8, 1, 16, 16, GetParam(), GetParam());
  // The kernel's own rotation.
  const auto rotate = [&](const Tensor<H>& x, const std::vector<Index>& pos) {
    Tensor<H> r = x;
    for (Index h = 0; h < 2; ++h)
      for (Index t = 0; t < 16; ++t)
        for (Index m = 0; m < 4; ++m) {
          const float inv = std::pow(10000.0f, -2.0f * float(m) / 8.0f), theta = float(pos[std::size_t(t)]) * inv;
          const H c = H(std::cos(theta)), sn = H(std::sin(theta));
          const H xa = x(0, h, t, m), xe = x(0, h, t, m + 4);
          r(0, h, t, m) = H(float(H(float(xa) * float(c))) - float(H(float(xe) * float(sn))));
          r(0, h, t, m + 4) = H(float(H(float(xe) * float(c))) + float(H(float(xa) * float(sn))));
        }
    return r;
  };
  const Tensor<H> qr = rotate(q, o.rope->q_positions), kr = rotate(k, o.rope->k_positions);
  const Tensor<H> out = attention<H>(qr, kr, v);
  Tensor<double> w{Shape{}};
  const Tensor<double> want = oracle(q, k, v, o, &w);
  const Tensor<double> qd = q.cast<double>(), kd = k.cast<double>(), vd = v.cast<double>();
  const AttentionOptions f = folded_options(o);
  const Tensor<double> q_f = fold_queries(qd, o, "test"), k_f = fold_keys(kd, o, "test");
  double worst = 0;
  for (Index h = 0; h < 2; ++h) {
    const HeadTolerance tol =
        head_tolerance(DType::f16, q_f.head(0, h), k_f.head(0, h), vd.head(0, h), BoolMask::causal(16, 16),
                       1 / std::sqrt(8.0), want.head(0, h), w.head(0, h), 2.0, head_modifiers(f, 0, h, 16, 16));
    for (Index i = 0; i < 16; ++i)
      for (Index c = 0; c < 8; ++c) {
        const double err = std::abs(double(out(0, h, i, c)) - want(0, h, i, c));
        EXPECT_LE(err, tol.output(i, c)) << h << "," << i << "," << c;
        if (GetParam() == 0) {
          EXPECT_LT(tol.output(i, c), 0.15);  // not vacuous: a rotation by the wrong angle moves outputs by O(1)
        }
        worst = std::max(worst, err);
      }
  }
  EXPECT_GT(worst, 0.0);
  // The backward: this kernel's gradients of its rotated inputs, turned back by its own rotation's transpose.
  const AttentionGradients<H> g = attention_backward<H>(qr, kr, v, dO);
  std::vector<Index> back_q = o.rope->q_positions, back_k = o.rope->k_positions;
  for (Index& x : back_q) x = -x;
  for (Index& x : back_k) x = -x;
  const Tensor<H> dq = rotate(g.dq, back_q), dk = rotate(g.dk, back_k);
  const GradientCheck c = gradient_check(DType::f16, qd, kd, vd, dO.cast<double>(), o);
  for (Index n = 0; n < dq.size(); ++n)
    EXPECT_LE(std::abs(double(dq.values()[n]) - c.oracle.dq.values()[n]), c.tolerance.dq.values()[n]) << n;
  for (Index n = 0; n < dk.size(); ++n)
    EXPECT_LE(std::abs(double(dk.values()[n]) - c.oracle.dk.values()[n]), c.tolerance.dk.values()[n]) << n;
}

// In float32 the angle's own rounding dominates: at position 3·10^4 a float angle is off by up to 10^-3 radians, a
// thousand times float's rounding of a score, so without step 9's 5u_f·|θ| this correct kernel would be falsified.
TEST(Modifiers, aRopeInFloatAtALargePositionIsWithinTheBound) {
  const Shape qs{1, 1, 8, 8};
  const Tensor<float> q = wave<float>(qs, 0.2, 1.5), k = wave<float>(qs, 0.5, 1.5), v = wave<float>(qs, 0.8, 1.0);
  AttentionOptions o;
  o.rope = test_rope(RopeVariant::half_split, 8, 1, 8, 8, 30011, 30011);
  const auto rotate = [&](const Tensor<float>& x, const std::vector<Index>& pos) {
    Tensor<float> r = x;
    for (Index t = 0; t < 8; ++t)
      for (Index m = 0; m < 4; ++m) {
        const float theta = float(pos[std::size_t(t)]) * std::pow(10000.0f, -2.0f * float(m) / 8.0f);
        const float c = std::cos(theta), sn = std::sin(theta), xa = x(0, 0, t, m), xe = x(0, 0, t, m + 4);
        r(0, 0, t, m) = xa * c - xe * sn;
        r(0, 0, t, m + 4) = xe * c + xa * sn;
      }
    return r;
  };
  Tensor<float> w_kernel{Shape{}};
  attention<float>(rotate(q, o.rope->q_positions), rotate(k, o.rope->k_positions), v, {}, &w_kernel);
  Tensor<double> w{Shape{}};
  const Tensor<double> want = oracle(q, k, v, o, &w);
  const AttentionOptions f = folded_options(o);
  const Tensor<double> q_f = fold_queries(q.cast<double>(), o, "test"), k_f = fold_keys(k.cast<double>(), o, "test");
  const HeadTolerance tol = head_tolerance(DType::f32, q_f.head(0, 0), k_f.head(0, 0), v.cast<double>().head(0, 0),
                                           BoolMask::causal(8, 8), 1 / std::sqrt(8.0), want.head(0, 0), w.head(0, 0),
                                           2.0, head_modifiers(f, 0, 0, 8, 8));
  const HeadTolerance plain = head_tolerance(DType::f32, q_f.head(0, 0), k_f.head(0, 0), v.cast<double>().head(0, 0),
                                             BoolMask::causal(8, 8), 1 / std::sqrt(8.0), want.head(0, 0),
                                             w.head(0, 0), 2.0, head_modifiers(AttentionOptions{}, 0, 0, 8, 8));
  bool beyond_plain = false;
  for (Index i = 0; i < 8; ++i)
    for (Index j = 0; j <= i; ++j) {
      const double err = std::abs(double(w_kernel(0, 0, i, j)) - w(0, 0, i, j));
      EXPECT_LE(err, tol.weights(i, j)) << i << "," << j;
      beyond_plain = beyond_plain || err > plain.weights(i, j);
    }
  EXPECT_TRUE(beyond_plain) << "the float angle's error shows beyond the bound without step 9";
}

// ---- QK-norm ---------------------------------------------------------------------------------------------------

// Per-dimension weights near 1 (multiples of 1/8, exact in half precision).
std::vector<double> norm_weights(Index D, double phase) {
  std::vector<double> w;
  for (Index c = 0; c < D; ++c) w.push_back(1 + std::round(4 * std::sin(phase + 1.3 * double(c))) / 8);
  return w;
}

// x normalised by hand: each row x / r ⊙ w, r = sqrt(mean x² + eps) or sqrt(mean x²) + eps, in double, rounded once.
template <class S> Tensor<S> normalised(const Tensor<S>& x, const QkNorm& n, const std::vector<double>& w) {
  Tensor<S> r = x;
  const Shape& s = x.shape();
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index t = 0; t < s.T; ++t) {
        double ms = 0;
        for (Index c = 0; c < s.D; ++c) ms += double(x(b, h, t, c)) * double(x(b, h, t, c));
        ms /= double(s.D);
        const double rms = n.eps_outside ? std::sqrt(ms) + n.eps : std::sqrt(ms + n.eps);
        for (Index c = 0; c < s.D; ++c) r(b, h, t, c) = S(double(x(b, h, t, c)) / rms * w[std::size_t(c)]);
      }
  return r;
}

TEST(Modifiers, badQkNormsAreNamed) {
  const Shape s{1, 2, 3, 4};
  const Tensor<double> x = wave<double>(s, 0.3, 1.0);
  AttentionOptions o;
  const auto message = [&] {
    try {
      attention<double>(x, x, x, o);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  o.qk_norm = QkNorm{.q_weight = norm_weights(3, 0.1)};
  EXPECT_EQ(message(), "attention: qk_norm weights have 3 entries; expected D = 4");
  o.qk_norm = QkNorm{.q_weight = norm_weights(4, 0.1), .eps = 0};
  EXPECT_EQ(message(), "attention: qk_norm eps is 0; expected finite and > 0");
  o.qk_norm = QkNorm{};
  EXPECT_EQ(message(), "attention: qk_norm has neither q_weight nor k_weight; expected at least one side normalised");
  o.qk_norm = QkNorm{.k_weight = norm_weights(4, 0.1)};
  o.qk_norm->k_weight[2] = std::nan("");
  EXPECT_EQ(message(), "attention: qk_norm k_weight[2] is nan; expected finite");
  o.qk_norm = QkNorm{.q_weight = norm_weights(4, 0.1)};
  EXPECT_THROW(head_modifiers(o, 0, 0, 3, 3), std::logic_error);  // a head's modifiers come after the folding
}

// QK-norm is the call on normalised inputs: every path gives bit for bit what the call without it gives on q and k
// normalised by hand (either side or both, eps inside or outside the root), and before a rope; the backward turns dQ
// and dK back through the normalisation (central differences in float64, with a rope and a temperature too); and
// a row scaled by c > 0 changes nothing but through eps.
TEST(Modifiers, aQkNormIsTheCallOnNormalisedInputs) {
  const Shape qs{2, 2, 5, 6}, ks{2, 1, 7, 6};
  const Tensor<float> q = wave<float>(qs, 0.2, 2.0), k = wave<float>(ks, 0.9, 2.0), v = wave<float>(ks, 1.1, 1.0);
  for (const bool outside : {false, true})
    for (const int sides : {1, 2, 3}) {
      AttentionOptions plain;
      plain.alignment = CausalAlignment::BottomRight;
      AttentionOptions normed = plain;
      normed.qk_norm = QkNorm{.q_weight = sides & 1 ? norm_weights(6, 0.4) : std::vector<double>{},
                              .k_weight = sides & 2 ? norm_weights(6, 2.1) : std::vector<double>{},
                              .eps = 1e-3,
                              .eps_outside = outside};
      const Tensor<float> qn = sides & 1 ? normalised(q, *normed.qk_norm, normed.qk_norm->q_weight) : q,
                          kn = sides & 2 ? normalised(k, *normed.qk_norm, normed.qk_norm->k_weight) : k;
      for (const bool streamed : {false, true}) {
        Tensor<double> lse{Shape{}}, lse_plain{Shape{}};
        Tensor<float> w{Shape{}}, w_plain{Shape{}};
        EXPECT_EQ(attention<float>(q, k, v, normed, streamed ? nullptr : &w, &lse).values(),
                  attention<float>(qn, kn, v, plain, streamed ? nullptr : &w_plain, &lse_plain).values());
        EXPECT_EQ(lse.values(), lse_plain.values());
      }
      AttentionOptions both = normed;  // then a rope: the normalised rows rotated
      both.rope = test_rope(RopeVariant::interleaved, 4, 2, 5, 7, 3, 1);
      AttentionOptions roped = plain;
      roped.rope = both.rope;
      EXPECT_EQ(attention<float>(q, k, v, both).values(), attention<float>(qn, kn, v, roped).values());
    }
  // A query row and a key row scaled by 2^3 change only the eps's share of r.
  Tensor<double> qd = q.cast<double>(), kd = k.cast<double>();
  const Tensor<double> vd = v.cast<double>(), dO = wave<double>(qs, 2.3, 1.0);
  AttentionOptions o;
  o.alignment = CausalAlignment::BottomRight;
  o.qk_norm = QkNorm{.q_weight = norm_weights(6, 0.4), .k_weight = norm_weights(6, 2.1), .eps = 1e-12};
  Tensor<double> scaled_q = qd, scaled_k = kd;
  for (Index c = 0; c < 6; ++c) {
    scaled_q(1, 0, 2, c) *= 8;
    scaled_k(0, 0, 3, c) *= 8;
  }
  const Tensor<double> out = attention<double>(qd, kd, vd, o), out_scaled = attention<double>(scaled_q, scaled_k, vd, o);
  for (Index n = 0; n < out.size(); ++n) EXPECT_NEAR(out_scaled.values()[n], out.values()[n], 1e-12) << n;
  // Central differences with QK-norm (eps inside, then outside), a rope and a temperature.
  for (const bool outside : {false, true}) {
    AttentionOptions all = o;
    all.qk_norm->eps = 0.05;
    all.qk_norm->eps_outside = outside;
    all.rope = test_rope(RopeVariant::half_split, 4, 2, 5, 7, 2, 0);
    all.temperature = wave_temperature(2, 1, 5);
    const auto loss = [&] { return attention<double>(qd, kd, vd, all).values().dot(dO.values()); };
    const AttentionGradients<double> g = attention_backward<double>(qd, kd, vd, dO, all);
    const double step = 1e-5;
    for (auto [x, grad] : {std::pair{&qd, &g.dq}, {&kd, &g.dk}})
      for (Index n = 0; n < x->size(); ++n) {
        const double x0 = x->values()[n];
        x->values()[n] = x0 + step;
        const double up = loss();
        x->values()[n] = x0 - step;
        const double down = loss();
        x->values()[n] = x0;
        EXPECT_NEAR(grad->values()[n], (up - down) / (2 * step), 1e-7) << outside << " entry " << n;
      }
  }
}

// The derived bounds hold for a correct kernel that normalises in its own arithmetic (the mean of squares and the
// root in float, the weights and the result in half precision: an RMSNorm at float16), forward and backward; and they
// are not vacuous.
TEST(Modifiers, aQkNormComputedAnotherWayIsWithinTheBound) {
  using H = Eigen::half;
  const Shape qs{1, 2, 16, 8};
  const Tensor<H> q = wave<H>(qs, 0.2, 3.0), k = wave<H>(qs, 0.5, 3.0), v = wave<H>(qs, 0.8, 1.0),
                  dO = wave<H>(qs, 1.7, 1.0);
  AttentionOptions o;
  o.qk_norm = QkNorm{.q_weight = norm_weights(8, 0.4), .k_weight = norm_weights(8, 2.1), .eps = 1e-6};
  const auto normalise = [&](const Tensor<H>& x, const std::vector<double>& w) {
    Tensor<H> r = x;
    for (Index h = 0; h < 2; ++h)
      for (Index t = 0; t < 16; ++t) {
        float ms = 0;
        for (Index c = 0; c < 8; ++c) ms += float(x(0, h, t, c)) * float(x(0, h, t, c));
        const float inv = 1.0f / std::sqrt(ms / 8.0f + 1e-6f);
        for (Index c = 0; c < 8; ++c) r(0, h, t, c) = H(float(H(float(x(0, h, t, c)) * inv)) * float(H(float(w[std::size_t(c)]))));
      }
    return r;
  };
  const Tensor<H> qn = normalise(q, o.qk_norm->q_weight), kn = normalise(k, o.qk_norm->k_weight);
  const Tensor<H> out = attention<H>(qn, kn, v);
  Tensor<double> w{Shape{}};
  const Tensor<double> want = oracle(q, k, v, o, &w);
  const Tensor<double> qd = q.cast<double>(), kd = k.cast<double>(), vd = v.cast<double>();
  const AttentionOptions f = folded_options(o);
  const Tensor<double> q_f = fold_queries(qd, o, "test"), k_f = fold_keys(kd, o, "test");
  double worst = 0;
  for (Index h = 0; h < 2; ++h) {
    const HeadTolerance tol =
        head_tolerance(DType::f16, q_f.head(0, h), k_f.head(0, h), vd.head(0, h), BoolMask::causal(16, 16),
                       1 / std::sqrt(8.0), want.head(0, h), w.head(0, h), 2.0, head_modifiers(f, 0, h, 16, 16));
    for (Index i = 0; i < 16; ++i)
      for (Index c = 0; c < 8; ++c) {
        const double err = std::abs(double(out(0, h, i, c)) - want(0, h, i, c));
        EXPECT_LE(err, tol.output(i, c)) << h << "," << i << "," << c;
        EXPECT_LT(tol.output(i, c), 0.15);  // not vacuous
        worst = std::max(worst, err);
      }
  }
  EXPECT_GT(worst, 0.0);
  // The backward: this kernel's gradients of its normalised inputs, turned back through the normalisation in float.
  const AttentionGradients<H> g = attention_backward<H>(qn, kn, v, dO);
  const GradientCheck c = gradient_check(DType::f16, qd, kd, vd, dO.cast<double>(), o);
  AttentionGradients<H> back = g;
  detail::unfold_prologue(back, o, q, k);
  for (Index n = 0; n < back.dq.size(); ++n)
    EXPECT_LE(std::abs(double(back.dq.values()[n]) - c.oracle.dq.values()[n]), c.tolerance.dq.values()[n]) << n;
  for (Index n = 0; n < back.dk.size(); ++n)
    EXPECT_LE(std::abs(double(back.dk.values()[n]) - c.oracle.dk.values()[n]), c.tolerance.dk.values()[n]) << n;
}

TEST(Modifiers, theLseOfLowPrecisionIsWithinItsDerivedBound) {
  const Shape s{1, 2, 40, 16};
  const Tensor<Eigen::half> q = wave<Eigen::half>(s, 0.2, 4.0), k = wave<Eigen::half>(s, 0.5, 4.0),
                            v = wave<Eigen::half>(s, 0.8, 1.0);
  const AttentionOptions o = all_modifiers(2, 40, 40);
  Tensor<double> lse{Shape{}}, want{Shape{}};
  attention<Eigen::half>(q, k, v, o, nullptr, &lse);
  oracle(q, k, v, o, nullptr, &want);
  for (Index h = 0; h < 2; ++h) {
    const Eigen::VectorXd rho = weight_relative_error(DType::f16, q.cast<double>().head(0, h), k.cast<double>().head(0, h),
                                                      BoolMask::causal(40, 40), 0.25, head_modifiers(o, 0, h, 40, 40));
    for (Index i = 0; i < 40; ++i) {
      const double tol = lse_tolerance(DType::f16, rho(i), want(0, h, i, 0));
      EXPECT_LE(std::abs(lse(0, h, i, 0) - want(0, h, i, 0)), tol);
      // Not vacuous: a base-2 LSE (off by (1/ln 2 - 1)·|lse|) or one without its max would be caught.
      if (std::abs(want(0, h, i, 0)) > 2) {
        EXPECT_LT(tol, 0.44 * std::abs(want(0, h, i, 0)));
      }
    }
  }
}

}  // namespace
}  // namespace attncheck
