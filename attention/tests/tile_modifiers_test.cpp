// The streamed paths' tile of modified scores (attention/src/tile_modifiers.hpp): its tanh stays within the share
// of tolerance.cpp step 7, a score's value does not depend on where it sits in its tile, and ALiBi, the bias and
// ln n are modified_score's to the bit. (Compiled here for this test's flags; the copies run the same source.)
#include "tile_modifiers.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attncheck/attention.hpp"
#include "attncheck/dtype.hpp"

namespace attncheck {
namespace {

using Tile = Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// A deterministic sweep of magnitudes 2^-60 .. 2^7 (each binade at 97 points, both signs): every branch of
// tanh_in_place (the rational part below 0.625, e^{2|x|} above, e^{2|x|} = inf past 354).
std::vector<double> sweep() {
  std::vector<double> xs;
  for (int e = -60; e <= 9; ++e)
    for (int k = 0; k < 97; ++k) {
      const double x = std::ldexp(1.0 + k / 97.0, e);
      xs.push_back(x);
      xs.push_back(-x);
    }
  for (const double x : {0.625, std::nextafter(0.625, 0.0), 354.0, 400.0, 1e300}) xs.push_back(x);
  return xs;
}

// In double: within 3u of tanh, relative (Cephes' rational part peaks at 2.5e-16 = 2.25u; the exp branch rounds
// e^{2|x|} to 1 ulp, through 2/(e+1) and the difference from 1, whose result is at least 0.55: under 3u). Measured
// against long double's tanhl, whose own error (2^-64) is a thousandth of that.
TEST(TileModifiers, tanhInDoubleWithinThreeUlp) {
  const double u = unit_roundoff(DType::f64);
  std::vector<double> xs = sweep(), t = xs;
  detail::tanh_in_place(t.data(), Index(t.size()));
  for (std::size_t n = 0; n < xs.size(); ++n) {
    const long double want = tanhl(static_cast<long double>(xs[n]));
    EXPECT_LE(std::fabs(static_cast<double>((t[n] - want) / want)), 3 * u) << "x = " << xs[n];
  }
}

// A float score's tanh, in float: within the 3u_a·|x| that step 7 leaves tanh (its 5u_a·|s_raw| less the
// division's and the product's u_a each). Every float in [2^-30, 48] at a stride of about 61 ulp (about 18
// million: both branches, the split at 0.625 where the worst error sits, and e^{2|x|} = inf past 44); measured
// over every float there once, the worst is 2.16 u_f·|x|.
TEST(TileModifiers, tanhOfAFloatWithinItsShareOfTheBound) {
  const double u_f = unit_roundoff(DType::f32);
  Tile tile(1, 4096);
  Index filled = 0;
  const auto check = [&] {
    Tile t = tile.leftCols(filled);
    detail::tanh_tile<float>(t);
    for (Index c = 0; c < filled; ++c) {
      const float x = tile(0, c);
      const double err = std::fabs(static_cast<double>(t(0, c) - tanhl(static_cast<long double>(x))));
      ASSERT_LE(err, 3 * u_f * std::fabs(x)) << "x = " << x;
    }
    filled = 0;
  };
  for (float x = std::ldexp(1.0f, -30); x < 48; x = std::nextafter(x + x * 61 * std::ldexp(1.0f, -24), 64.0f)) {
    tile(0, filled++) = x;
    if (filled == tile.cols()) check();
  }
  for (const float x : {0.625f, std::nextafter(0.625f, 0.0f), 0.6253521f, 44.0f, 45.0f, 1e30f}) {
    tile(0, filled++) = x;
  }
  check();
}

template <class T>
void expect_specials() {
  const T inf = std::numeric_limits<T>::infinity();
  T x[] = {std::numeric_limits<T>::quiet_NaN(), inf, -inf, T(-0.0), T(0.0), T(-1e30)};
  detail::tanh_in_place(x, 6);
  EXPECT_TRUE(std::isnan(x[0]));
  EXPECT_EQ(x[1], T(1));
  EXPECT_EQ(x[2], T(-1));
  EXPECT_EQ(x[3], T(0));
  EXPECT_TRUE(std::signbit(x[3]));
  EXPECT_FALSE(std::signbit(x[4]));
  EXPECT_EQ(x[5], T(-1));
}

TEST(TileModifiers, nonFiniteAndSignedZero) {
  expect_specials<double>();
  expect_specials<float>();
}

// The exact laws compare calls that tile a row differently (batch invariance cuts the queries, a window moves the
// first tile): a score must come out the same wherever in its tile, and whatever the tile's width, it sits.
TEST(TileModifiers, aScoresValueDoesNotDependOnItsPlaceInTheTile) {
  AttentionOptions opts;
  opts.softcap = 7.5;
  const HeadModifiers m = head_modifiers(opts, 0, 0, 64, 64);
  std::vector<float> scores;
  for (int k = 0; k < 45; ++k) scores.push_back(std::ldexp(static_cast<float>(k % 9) - 4.3f, k % 7 - 3));
  Tile alone(1, 1);
  for (std::size_t n = 0; n < scores.size(); ++n) {
    alone(0, 0) = scores[n];
    detail::modify_tile<float>(alone, m, 0, 0);
    for (const Index width : {3, 16, 17, 45})
      for (Index at = 0; at < width; ++at) {
        Tile t = Tile::Constant(2, width, 0.25f);
        t(1, at) = scores[n];
        detail::modify_tile<float>(t, m, 0, 0);
        ASSERT_EQ(t(1, at), alone(0, 0)) << "score " << scores[n] << " at column " << at << " of " << width;
      }
  }
}

// ALiBi (slope·(j - p) at the query's aligned position), the bias and softcap: the tile's softcap within 5u_a·|s_raw|
// of cap·tanh(s/cap) in long double (step 7's share), and ALiBi and the bias added as modified_score adds them, to
// the bit (cap·t then + slope·d then + b, each rounded in float).
TEST(TileModifiers, aliBiAndTheBiasAsModifiedScoreAddsThem) {
  const Index T_q = 5, T_k = 37;
  AttentionOptions opts;
  opts.softcap = 3.0;
  opts.alibi_slopes = {0.37};
  ScoreBias bias{.B = 1, .H = 1, .T_q = T_q, .T_k = T_k, .values = {}};
  for (Index n = 0; n < T_q * T_k; ++n) bias.values.push_back(std::ldexp(double(n % 11) - 5.0, int(n % 5) - 2));
  opts.bias = bias;
  const HeadModifiers m = head_modifiers(opts, 0, 0, T_q, T_k);
  ASSERT_TRUE(m.bias);
  const double u = unit_roundoff(DType::f32);
  Tile raw(3, 29);
  for (Index r = 0; r < raw.rows(); ++r)
    for (Index c = 0; c < raw.cols(); ++c) raw(r, c) = std::ldexp(float((r * 7 + c * 3) % 13) - 6.1f, int(c % 4) - 1);
  const Index i0 = 1, j0 = 5;
  Tile tile = raw;
  Tile th;
  detail::modify_tile<float>(tile, m, i0, j0, &th);
  AttentionOptions no_cap = opts;
  no_cap.softcap.reset();
  const HeadModifiers plain = head_modifiers(no_cap, 0, 0, T_q, T_k);
  for (Index r = 0; r < raw.rows(); ++r)
    for (Index c = 0; c < raw.cols(); ++c) {
      const float s = raw(r, c), cap = 3.0f;
      const long double exact = 3.0L * tanhl(static_cast<long double>(s) / 3.0L);
      const float capped = cap * th(r, c);
      EXPECT_LE(std::fabs(static_cast<double>(capped - exact)), 5 * u * std::fabs(s)) << r << "," << c;
      EXPECT_EQ(tile(r, c), modified_score<float>(capped, plain, i0 + r, j0 + c)) << r << "," << c;
    }
}

}  // namespace
}  // namespace attncheck
