// A scaled rope's frequencies: factor 1 is no scaling; Llama 3's keeps the high frequencies, divides the low ones by
// the factor and blends between, continuously at the band's edges; NTK's grows the base; a float32 kernel computing
// them its own way at a large position is within tolerance.cpp step 9b's bound.
#include <gtest/gtest.h>

#include <cmath>

#include "attncheck/attention.hpp"
#include "attncheck/error.hpp"
#include "attncheck/tolerance.hpp"

namespace attncheck {
namespace {

Rope scaled(RopeScaling s, double factor, Index r = 16, double base = 10000) {
  Rope rope{.rotary_dim = r, .base = base, .factor = factor};
  rope.scaling = s;
  rope.original_max_position = 64;
  return rope;
}

TEST(RopeScaling, factorOneIsNoScaling) {
  const Rope plain = scaled(RopeScaling::linear, 1);
  for (const RopeScaling s : {RopeScaling::ntk, RopeScaling::llama3})
    for (Index m = 0; m < 8; ++m) EXPECT_DOUBLE_EQ(scaled(s, 1).frequency(m), plain.frequency(m)) << int(s) << m;
}

TEST(RopeScaling, llama3KeepsHighFrequenciesDividesLowOnesAndBlendsContinuously) {
  const Rope plain = scaled(RopeScaling::linear, 1), l3 = scaled(RopeScaling::llama3, 8);
  int kept = 0, divided = 0, blended = 0;
  for (Index m = 0; m < 8; ++m) {
    const double w = plain.frequency(m), wavelen = 2 * M_PI / w, f = l3.frequency(m);
    if (wavelen < 64.0 / 4) {
      EXPECT_EQ(f, w) << m;
      ++kept;
    } else if (wavelen > 64.0 / 1) {
      EXPECT_DOUBLE_EQ(f, w / 8) << m;
      ++divided;
    } else {
      EXPECT_GT(f, w / 8) << m;
      EXPECT_LT(f, w) << m;
      ++blended;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
  // At the band's edges the blend meets the two rules: a base that puts pair 1's wavelength at λ_hi, then at λ_lo.
  for (const auto& [edge, want] : {std::pair{16.0, 1.0}, {64.0, 1.0 / 8}}) {
    // ω_1 = base^(-2/r) = 2π/edge, so base = (edge/2π)^(r/2), r = 4.
    Rope at = scaled(RopeScaling::llama3, 8, 4, std::pow(edge / (2 * M_PI), 2.0));
    EXPECT_NEAR(at.frequency(1), want * 2 * M_PI / edge, 1e-12) << edge;
  }
}

TEST(RopeScaling, ntkGrowsTheBase) {
  const Rope ntk = scaled(RopeScaling::ntk, 4), plain = scaled(RopeScaling::linear, 1);
  EXPECT_EQ(ntk.frequency(0), 1.0);  // the highest frequency is kept
  for (Index m = 1; m < 8; ++m) EXPECT_LT(ntk.frequency(m), plain.frequency(m)) << m;
  // The lowest one is divided by factor^(2m/(r-2)) exactly: base·4^(16/14) to the power -14/16 is base^(-14/16)/4.
  EXPECT_NEAR(ntk.frequency(7), plain.frequency(7) / 4, 1e-15);
}

TEST(RopeScaling, badScalingsAreNamed) {
  const Tensor<double> q(Shape{1, 1, 2, 4});
  AttentionOptions o;
  o.rope = scaled(RopeScaling::ntk, 2, 2);
  o.rope->q_positions = o.rope->k_positions = {0, 1};
  try {
    attention<double>(q, q, q, o);
    ADD_FAILURE() << "ntk with rotary_dim 2 accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("rotary_dim is 2 with ntk scaling; expected >= 4"), std::string::npos)
        << e.what();
  }
  o.rope = scaled(RopeScaling::llama3, 8, 4);
  o.rope->q_positions = o.rope->k_positions = {0, 1};
  o.rope->high_freq_factor = 0.5;
  EXPECT_THROW(attention<double>(q, q, q, o), ValueError);
  o.rope->high_freq_factor = 4;
  o.rope->factor = 0.5;
  EXPECT_THROW(attention<double>(q, q, q, o), ValueError);
}

// A float32 kernel computing Llama 3's frequencies and the angle in float (Hugging Face's _compute_llama3_parameters
// and rotary embedding) at a position of 3·10^4: each rotated element within step 9's ε(pos), and the 9b part needed.
TEST(RopeScaling, aFloatKernelsScaledAnglesAreWithinTheBound) {
  for (const RopeScaling s : {RopeScaling::llama3, RopeScaling::ntk}) {
    Rope rope = scaled(s, 8, 64, 500000);
    rope.original_max_position = 8192;
    const Index pos = 30011;
    double worst = 0, bound = 0;
    for (Index m = 0; m < 32; ++m) {
      float w;
      if (s == RopeScaling::ntk) {
        const float b = float(rope.base) * std::pow(8.0f, 64.0f / 62.0f);
        w = std::pow(b, -2.0f * float(m) / 64.0f);
      } else {
        w = std::pow(float(rope.base), -2.0f * float(m) / 64.0f);
        const float wavelen = 2 * float(M_PI) / w, lo = 8192.0f / 1, hi = 8192.0f / 4;
        if (wavelen > lo) {
          w = w / 8;
        } else if (wavelen >= hi) {
          const float sm = (8192.0f / wavelen - 1) / (4 - 1);
          w = (1 - sm) * w / 8 + sm * w;
        }
      }
      const float theta = float(pos) * w;
      const double x_a = 0.75, x_b = -0.5;  // one pair, rotated in float and in double
      const double got = double(float(x_a) * std::cos(theta) - float(x_b) * std::sin(theta));
      const double t = rope.angle(pos, m), want = x_a * std::cos(t) - x_b * std::sin(t);
      worst = std::max(worst, std::abs(got - want) / (std::abs(x_a) + std::abs(x_b)));
    }
    bound = rope_rotation_error(DType::f32, rope, pos);
    EXPECT_LE(worst, bound) << int(s);
    EXPECT_LT(bound, 0.05) << int(s);  // not vacuous
    EXPECT_GT(worst, 1e-6) << int(s);  // the angle in float does err at this position
  }
}

}  // namespace
}  // namespace attncheck
