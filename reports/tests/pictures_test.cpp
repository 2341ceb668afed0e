// The pictures show the shape of a bug: a tiled kernel's error map lights up exactly the rows that cross a
// tile boundary, a large head is max-pooled without losing its one bad entry, and the variance sweep of a
// kernel that forgets the scale follows the line D.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <regex>
#include <set>

#include "attncheck/reports.hpp"

namespace attncheck::reports {
namespace {

constexpr Index kTile = 3;

// A FlashAttention-style kernel whose running accumulator and sum are never rescaled when a later key tile
// raises the running max (the classic bug): rows whose keys fit in the first tile are right, every row that
// crosses a tile boundary sums terms taken against different maxima.
ImplementationPtr unrescaled_tiled_kernel() {
  return make_implementation("test:tiled-no-rescale", "tiles of 3 keys, accumulator not rescaled", Capabilities{},
                             [](const Problem& p) {
    return run_typed(p, [&](const auto& q, const auto& k, const auto& v, const Problem& pr, auto* w) {
      using S = typename std::decay_t<decltype(q)>::Scalar;
      const Shape& s = q.shape();
      const Index T_k = k.shape().T;
      const double scale = pr.scale ? *pr.scale : 1 / std::sqrt(double(s.D));
      Tensor<S> out(s);
      if (w) *w = Tensor<S>({s.B, s.H, s.T, T_k});
      for (Index b = 0; b < s.B; ++b)
        for (Index h = 0; h < s.H; ++h)
          for (Index i = 0; i < s.T; ++i) {
            const Index last = std::min(last_visible_key(i, s.T, T_k, pr.alignment), T_k - 1);
            double m = -std::numeric_limits<double>::infinity(), l = 0;
            std::vector<double> score(static_cast<std::size_t>(T_k)), acc(static_cast<std::size_t>(s.D));
            for (Index t0 = 0; t0 <= last; t0 += kTile) {
              const Index t1 = std::min(t0 + kTile - 1, last);
              for (Index j = t0; j <= t1; ++j) {
                double dot = 0;
                for (Index c = 0; c < s.D; ++c) dot += double(q(b, h, i, c)) * double(k(b, h, j, c));
                score[std::size_t(j)] = dot * scale;
                m = std::max(m, score[std::size_t(j)]);
              }
              // The bug: l and acc should be multiplied by exp(m_old - m) here.
              for (Index j = t0; j <= t1; ++j) {
                const double e = std::exp(score[std::size_t(j)] - m);
                l += e;
                for (Index c = 0; c < s.D; ++c) acc[std::size_t(c)] += e * double(v(b, h, j, c));
              }
            }
            for (Index c = 0; c < s.D; ++c) out(b, h, i, c) = static_cast<S>(acc[std::size_t(c)] / l);
            for (Index j = 0; j <= last && w; ++j)
              (*w)(b, h, i, j) = static_cast<S>(std::exp(score[std::size_t(j)] - m) / l);
          }
      return out;
    });
  });
}

// The rows of the cells an error map marks past the tolerance (their tooltips name the entry).
std::set<Index> strong_rows(const std::string& svg) {
  std::set<Index> rows;
  static const std::regex over("class=\"over\"><title>i=([0-9]+),");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), over); it != std::sregex_iterator(); ++it)
    rows.insert(std::stoll((*it)[1]));
  return rows;
}

std::size_t count(const std::string& haystack, const std::string& needle) {
  std::size_t n = 0;
  for (auto pos = haystack.find(needle); pos != std::string::npos; pos = haystack.find(needle, pos + needle.size())) ++n;
  return n;
}

TEST(ErrorMap, tiledKernelShowsItsTileStructure) {
  // Scores rise with the key (k_j = j/2 along q), so every new tile raises the running max and the missing
  // rescale shows in every row that sees a second tile: rows 3..8 of T = 9 with tiles of 3.
  constexpr Index T = 9, D = 4;
  LawCase c;
  Problem& p = c.problem;
  p.q = Tensor<double>({1, 1, T, D});
  p.k = Tensor<double>({1, 1, T, D});
  p.v = Tensor<double>({1, 1, T, D});
  for (Index i = 0; i < T; ++i) {
    p.q(0, 0, i, 0) = 2;
    p.k(0, 0, i, 0) = 0.5 * double(i);
    for (Index d = 0; d < D; ++d) p.v(0, 0, i, d) = double((i * 7 + d * 3) % 5) - 2;
  }
  const Law* law = find_law("oracle-agreement");
  ASSERT_NE(law, nullptr);
  const auto v = evaluate_case(*law, *unrescaled_tiled_kernel(), c);
  ASSERT_TRUE(v.has_value()) << "the oracle must catch the missing rescale";
  ASSERT_TRUE(v->tolerances.has_value()) << "a law with a tolerance records it per entry";

  LawReport r;
  r.result.law = law->name;
  r.result.status = LawStatus::falsified;
  r.result.minimal_case = c;
  r.result.violation = v;
  RunInfo run;
  run.implementation = "test:tiled-no-rescale";
  const auto pictures = law_pictures(run, r);
  ASSERT_EQ(pictures.size(), 1u);
  EXPECT_EQ(pictures[0].name, "oracle-agreement-error.svg");
  const std::set<Index> rows = strong_rows(pictures[0].content);
  EXPECT_EQ(rows, (std::set<Index>{3, 4, 5, 6, 7, 8})) << pictures[0].content;
  EXPECT_EQ(count(pictures[0].content, "Downsampled"), 0u);
}

TEST(ErrorMap, largeHeadsAreMaxPooledAndKeepTheirOneBadEntry) {
  constexpr Index T = 100, D = 8;
  Violation v;
  v.quantity = "output";
  v.expected = Tensor<double>({1, 2, T, D});
  v.actual = *v.expected;
  v.tolerances = Tensor<double>({1, 2, T, D});
  v.tolerances->values().setConstant(1e-6);
  (*v.actual)(0, 1, 77, 3) = 1e-3;  // 1000 tolerances off, in head h=1
  v.worst_index = {0, 1, 77, 3};
  const std::string svg = error_map_svg(v, 0, 1, Visibility{T, D, CausalAlignment::TopLeft}, "t");
  EXPECT_NE(svg.find("Downsampled by max-pooling: each cell is the worst of a block of 3&#215;1 entries"), std::string::npos);
  EXPECT_EQ(count(svg, "class=\"over\""), 1u);
  EXPECT_NE(svg.find("rows 75-77 x c 3-3, worst i=77, c=3: error/tolerance 1e+03"), std::string::npos) << svg;
  // Head 0 has nothing to show.
  EXPECT_EQ(count(error_map_svg(v, 0, 0, Visibility{T, D, CausalAlignment::TopLeft}, "t"), "class=\"over\""), 0u);
}

TEST(ErrorMap, aTiledErrorPatternKeepsItsBlocksWhenPooled) {
  // The error pattern of a tiled kernel that forgets to rescale, at a size that must be pooled: T = 192 keys
  // in tiles of 32, and each weight (i, j) of a key tile before the query's own tile is wrong by 10 tolerances.
  // Pooled 4 x 4 (192 / 48), the past-tolerance cells must be exactly the blocks below the diagonal tiles.
  constexpr Index T = 192, tile = 32, pool = 4;
  Violation v;
  v.quantity = "weights";
  v.expected = Tensor<double>({1, 1, T, T});
  v.tolerances = Tensor<double>({1, 1, T, T});
  v.tolerances->values().setConstant(1e-6);
  v.actual = *v.expected;
  for (Index i = 0; i < T; ++i)
    for (Index j = 0; j < i / tile * tile; ++j) (*v.actual)(0, 0, i, j) = 1e-5;
  const std::string svg = error_map_svg(v, 0, 0, Visibility{T, T, CausalAlignment::TopLeft}, "t");
  EXPECT_NE(svg.find("a block of 4&#215;4 entries"), std::string::npos);
  static const std::regex block("class=\"over\"><title>rows ([0-9]+)-[0-9]+ x j ([0-9]+)-");
  std::set<std::pair<Index, Index>> got, want;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), block); it != std::sregex_iterator(); ++it)
    got.insert({std::stoll((*it)[1]) / pool, std::stoll((*it)[2]) / pool});
  for (Index r = 0; r < T / pool; ++r)
    for (Index k = 0; k < T / pool; ++k)
      if (k * pool / tile < r * pool / tile) want.insert({r, k});
  EXPECT_EQ(got, want);
  EXPECT_EQ(want.size(), 15u * 8 * 8) << "the 15 tile blocks below the diagonal, 8 x 8 picture cells each";
}

TEST(ErrorMap, marksNonFiniteEntriesAndOutlinesFutureWeights) {
  Violation v;
  v.quantity = "weights";
  v.expected = Tensor<double>({1, 1, 3, 3});
  for (Index i = 0; i < 3; ++i)
    for (Index j = 0; j <= i; ++j) (*v.expected)(0, 0, i, j) = 1.0 / double(i + 1);
  v.actual = *v.expected;
  v.tolerances = Tensor<double>({1, 1, 3, 3});
  v.tolerances->values().setConstant(1e-7);
  (*v.actual)(0, 0, 2, 1) = std::numeric_limits<double>::quiet_NaN();
  (*v.actual)(0, 0, 1, 1) += 5e-8;  // within the tolerance: light, unmarked
  const std::string svg = error_map_svg(v, 0, 0, Visibility{3, 3, CausalAlignment::TopLeft}, "t");
  EXPECT_EQ(count(svg, "class=\"nonfinite\""), 1u);
  EXPECT_EQ(count(svg, "class=\"over\""), 0u);
  // Top-left, T = 3: (0,1), (0,2), (1,2) are future, outlined in both panels, plus the legend's sample.
  EXPECT_EQ(count(svg, "stroke=\"#d62728\" stroke-width=\"2\""), 3u * 2 + 1);
  Violation bad = v;
  bad.tolerances.reset();
  EXPECT_THROW(error_map_svg(bad, 0, 0, Visibility{3, 3, CausalAlignment::TopLeft}, "t"), std::invalid_argument);
}

TEST(VarianceSweep, forgottenScaleFollowsTheLineD) {
  // QKᵀ never divided by √D: the scores' variance is D, not 1.
  const ImplementationPtr forgotten = make_implementation(
      "test:scale-forgotten", "scale 1", Capabilities{}, [](const Problem& p) {
        return run_typed(p, [&](const auto& q, const auto& k, const auto& v, const Problem& pr, auto* w) {
          return attention(q, k, v, AttentionOptions{.scale = pr.scale.value_or(1.0), .alignment = pr.alignment}, w);
        });
      });
  const Law* law = find_law("scale-variance");
  ASSERT_NE(law, nullptr);
  GenConfig cfg;
  cfg.max_D = 32;
  // The first generated case with D > 1 (at D = 1 the scale 1 is the right one).
  LawCase c;
  for (std::uint64_t seed = 1; c.problem.q.shape().D <= 1; ++seed) c = law->gen(cfg)(rc::Random(seed), 50).value();
  const auto v = evaluate_case(*law, *forgotten, c);
  ASSERT_TRUE(v.has_value());
  ASSERT_EQ(v->series.size(), 6u) << "D = 1, 2, 4, ... up to --max-D = 32";
  for (std::size_t n = 0; n < v->series.size(); ++n) {
    const VariancePoint& pt = v->series[n];
    EXPECT_EQ(pt.D, double(1 << n));
    // Each group mean of x²/D has mean 1 and variance <= 8/256 (the law's own derivation), so the median
    // strays by 0.5 with probability < 1e-7.
    EXPECT_NEAR(pt.variance / pt.D, 1.0, 0.5) << "D=" << pt.D;
    EXPECT_LE(pt.low, pt.variance);
    EXPECT_GE(pt.high, pt.variance);
  }
  const std::string svg = variance_svg(v->series, "t");
  EXPECT_NE(svg.find("D: scale forgotten"), std::string::npos);
  EXPECT_NE(svg.find("1/D: scale applied twice"), std::string::npos);
  EXPECT_EQ(count(svg, "<circle "), 6u);
  EXPECT_EQ(count(svg, "<polygon "), 1u) << "the band";
}

}  // namespace
}  // namespace attncheck::reports
