// The generators reach the inputs where bugs live (coverage floors, enforced), shrink to the smallest case,
// stay representable in the dtype, and replay exactly from a seed.
#include <algorithm>
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "attncheck/generators.hpp"

namespace attncheck {
namespace {

// A law that never fails (or fails on `fails`), to drive the generator through run_law.
Law probeLaw(std::function<std::optional<Violation>(const LawCase&)> fails = {}) {
  Law l;
  l.name = "probe";
  l.not_applicable = [](const GenConfig&) { return std::string(); };
  l.gen = [](const GenConfig& cfg) { return gen_problem(cfg); };
  l.check = [fails](const Implementation&, const LawCase& c) -> std::optional<Violation> {
    if (fails) return fails(c);
    return std::nullopt;
  };
  return l;
}

Violation violation(const std::string& m) {
  Violation v;
  v.message = m;
  return v;
}

// Decode steps over a long cache (T_q = 1, T_k >= 33, past a split-KV kernel's first block of 32 keys) come at
// every seed in a default run of 100 cases, whatever RapidCheck's size: a decode-only bug there must be met.
TEST(Generators, decodeStepsOverALongCacheComeAtEverySeed) {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    RunOptions opts;
    opts.seed = seed;
    opts.cases = 100;
    int long_decode = 0;
    const LawResult r = run_law(probeLaw([&](const LawCase& c) -> std::optional<Violation> {
                                  const Problem& p = c.problem;
                                  long_decode += p.q.shape().T == 1 && p.k.shape().T >= 33 &&
                                                 p.alignment == CausalAlignment::BottomRight;
                                  return std::nullopt;
                                }),
                                *reference_implementation(), opts);
    ASSERT_EQ(r.status, LawStatus::held);
    EXPECT_GE(long_decode, 1) << "no decode step over T_k >= 33 at seed " << seed;
    std::cout << "  seed " << seed << ": " << long_decode << " decode steps over T_k >= 33\n";
  }
}

// Floors on the share of cases, over 400 cases. Each expected share (measured: see the test output) is at
// least twice its floor, so by a binomial (Chernoff) tail the chance that a correct generator misses a floor
// at n = 400 is below 1e-9 per run.
TEST(Generators, coverageFloorsAreMetAndVisible) {
  RunOptions opts = options_from_rc_params("probe");
  opts.cases = 400;
  const LawResult r = run_law(probeLaw(), *reference_implementation(), opts);
  ASSERT_EQ(r.status, LawStatus::held);
  const auto share = [&](std::initializer_list<const char*> tags) {
    int n = 0;
    for (const char* t : tags) n += r.coverage.count(t) ? r.coverage.at(t) : 0;
    return double(n) / r.cases_run;
  };
  for (const auto& [tag, n] : r.coverage) std::cout << "  " << tag << ": " << 100.0 * n / r.cases_run << "%\n";
  EXPECT_GE(share({"|score|>1e4"}), 0.05) << "scores beyond ±1e4, where finite masks and missing max-subtraction break";
  EXPECT_GE(share({"T=16..64", "T>64"}), 0.10) << "T >= 16";
  EXPECT_GE(share({"T>64"}), 0.02) << "the tail beyond 64";
  EXPECT_GE(share({"T_k=16m,16m+-1"}), 0.08) << "key lengths at a multiple of 16, or one off it (tile edges)";
  EXPECT_GE(share({"T_k=2^k+-1"}), 0.08) << "key lengths one off a power of two";
  EXPECT_GE(share({"T_k>16 (two key tiles of 16)"}), 0.15) << "more than one key tile of 16";
  EXPECT_GE(share({"D=non-pow2"}), 0.10) << "non-power-of-two D";
  EXPECT_GE(share({"D=odd"}), 0.10) << "odd D";
  EXPECT_GE(share({"T_q!=T_k"}), 0.05) << "T_q != T_k";
  EXPECT_GE(share({"a-query-sees-nothing"}), 0.10)
      << "queries with no visible key (bottom-right with T_q > T_k, or every key padding)";
  // Padding (the reference honours key lengths and windows, so the generator draws them): a sequence that is
  // all padding, one that is not padded at all, and one in between; windows of 0, 1, 2..T-1 and beyond T.
  EXPECT_GE(share({"length=0"}), 0.08) << "a sequence of length 0 (every key padding)";
  EXPECT_GE(share({"length=T_k"}), 0.08) << "a padded batch with a full-length sequence";
  EXPECT_GE(share({"length=partial"}), 0.08) << "a sequence with some padding";
  EXPECT_GE(share({"window=0"}), 0.05) << "window 0: a query sees only its own position";
  EXPECT_GE(share({"window=1"}), 0.05) << "window 1";
  EXPECT_GE(share({"window=2..T-1"}), 0.03) << "a window inside the sequence";
  EXPECT_GE(share({"window>=T"}), 0.05) << "a window at or beyond T (must equal no window)";
  EXPECT_GE(share({"decode (T_q=1<T_k, bottom-right)"}), 0.04) << "decode steps";
  EXPECT_GE(share({"chunk (1<T_q<T_k, bottom-right)"}), 0.03) << "prefill chunks";
  EXPECT_GE(share({"query-documents"}), 0.08) << "documents with query bounds of their own (varlen cu_seqlens_q)";
  EXPECT_GE(share({"H_kv=1<H (MQA)"}), 0.10) << "multi-query attention";
  EXPECT_GE(share({"1<H_kv<H (GQA)"}), 0.03) << "grouped queries with more than one kv head";
  for (const char* regime : {"regime=small-int", "regime=normal", "regime=uniform", "regime=ties", "regime=one-hot",
                             "regime=sparse"})
    EXPECT_GE(share({regime}), 0.03) << regime;
}

// A property that fails whenever T_q >= 2 shrinks to B = H = 1, T_q = 2, D = 1 with every value 0, and the
// keys it does not need shrink away too: T_k = 1 (bottom-right or top-left, both allowed).
TEST(Generators, shrinkingReachesTheSmallestShapeAndZeroValues) {
  RunOptions opts;
  opts.seed = 7;
  const LawResult r = run_law(probeLaw([](const LawCase& c) -> std::optional<Violation> {
                                if (c.problem.q.shape().T >= 2) return violation("T >= 2");
                                return std::nullopt;
                              }),
                              *reference_implementation(), opts);
  ASSERT_EQ(r.status, LawStatus::falsified);
  const Problem& p = r.minimal_case->problem;
  EXPECT_EQ(p.q.shape(), (Shape{1, 1, 2, 1}));
  EXPECT_EQ(p.k.shape(), (Shape{1, 1, 1, 1}));
  EXPECT_TRUE((p.q.values().array() == 0).all() && (p.k.values().array() == 0).all() &&
              (p.v.values().array() == 0).all());
  EXPECT_FALSE(p.scale.has_value());
  EXPECT_GT(r.shrink_steps, 0);
}

// A property that fails when some |q| exceeds 100 keeps one such entry and zeros the rest.
TEST(Generators, valuesShrinkTowardZero) {
  RunOptions opts;
  opts.seed = 11;
  opts.cases = 400;
  const LawResult r = run_law(probeLaw([](const LawCase& c) -> std::optional<Violation> {
                                if (c.problem.q.values().cwiseAbs().maxCoeff() > 100) return violation("|q| > 100");
                                return std::nullopt;
                              }),
                              *reference_implementation(), opts);
  ASSERT_EQ(r.status, LawStatus::falsified);
  const Problem& p = r.minimal_case->problem;
  EXPECT_EQ(p.q.shape().B * p.q.shape().H * p.q.shape().T * p.q.shape().D, 1) << to_string(p.q.shape());
  EXPECT_EQ((p.k.values().array() != 0).count(), 0);
  EXPECT_EQ((p.v.values().array() != 0).count(), 0);
}

// Every generated value is exactly representable in the dtype, so the native call sees the same numbers.
TEST(Generators, valuesAreRepresentableInTheDtype) {
  for (const DType dt : {DType::f16, DType::bf16, DType::f32}) {
    RunOptions opts = options_from_rc_params("probe");
    opts.gen.dtype = dt;
    const LawResult r = run_law(probeLaw([dt](const LawCase& c) -> std::optional<Violation> {
                                  for (const auto* t : {&c.problem.q, &c.problem.k, &c.problem.v})
                                    for (Index i = 0; i < t->size(); ++i)
                                      if (round_to(dt, t->values()[i]) != t->values()[i] || !std::isfinite(t->values()[i]))
                                        return violation("not representable");
                                  return std::nullopt;
                                }),
                                *reference_implementation(), opts);
    EXPECT_EQ(r.status, LawStatus::held) << dtype_name(dt) << ": " << describe(r);
  }
}

// The same seed gives the same cases: every failure can be replayed.
TEST(Generators, aSeedReplaysTheSameCases) {
  std::vector<std::vector<double>> first, second;
  for (auto* store : {&first, &second}) {
    RunOptions opts;
    opts.seed = 1234;
    opts.cases = 20;
    run_law(probeLaw([store](const LawCase& c) -> std::optional<Violation> {
              store->emplace_back(c.problem.q.values().begin(), c.problem.q.values().end());
              return std::nullopt;
            }),
            *reference_implementation(), opts);
  }
  ASSERT_EQ(first.size(), 20u);
  EXPECT_EQ(first, second);
}

// The capabilities narrow the generator: an implementation that takes only T <= 8 never sees more.
TEST(Generators, capabilitiesBoundTheShapes) {
  Capabilities caps;
  caps.max_T = 8;
  caps.cross_lengths = false;
  const auto small = make_implementation("small", "", caps, [](const Problem& p) {
    return reference_implementation()->forward(p);
  });
  const LawResult r = run_law(probeLaw([](const LawCase& c) -> std::optional<Violation> {
                                if (c.problem.q.shape().T > 8 || c.problem.k.shape().T != c.problem.q.shape().T)
                                  return violation("outside the capabilities");
                                return std::nullopt;
                              }),
                              *small, options_from_rc_params("probe"));
  EXPECT_EQ(r.status, LawStatus::held) << describe(r);
}

// Shrinking stays inside the capabilities too: a law that fails on every case with two or more heads makes
// the runner try every shrink step that keeps them, and no step may group heads, pad keys or add a window
// that the kernel never declared (a kernel without GQA reads kv head h for query head h).
TEST(Generators, shrinkingStaysInsideTheCapabilities) {
  const auto plain = make_implementation("plain", "", Capabilities{}, [](const Problem& p) {
    return reference_implementation()->forward(p);
  });
  std::string outside;
  const LawResult r = run_law(probeLaw([&](const LawCase& c) -> std::optional<Violation> {
                                const Problem& p = c.problem;
                                if (outside.empty() && (p.kv_heads() != p.q.shape().H || !p.key_lengths.empty() ||
                                                        p.window.has_value()))
                                  outside = "q " + to_string(p.q.shape()) + ", k " + to_string(p.k.shape());
                                if (p.q.shape().H < 2) return std::nullopt;
                                return violation("fails with two or more heads, so that such cases are shrunk");
                              }),
                              *plain, options_from_rc_params("probe"));
  EXPECT_EQ(r.status, LawStatus::falsified) << describe(r);
  EXPECT_EQ(outside, "") << "a shrink step left the capabilities";
}

// Shrinking deletes any index, not only the last: a failure caused by one large query entry ends as that entry
// alone (B = H = T_q = D = 1), wherever it was drawn, on every seed; its value stays a power of two above 100
// (values shrink to small integers and powers of two), and every other value is 0.
TEST(Generators, shrinkingDeletesAnyIndexDownToTheOneEntryThatFails) {
  for (std::uint64_t seed = 1; seed <= 10; ++seed) {
    RunOptions opts;
    opts.seed = seed;
    opts.cases = 400;
    const LawResult r = run_law(probeLaw([](const LawCase& c) -> std::optional<Violation> {
                                  if (c.problem.q.values().cwiseAbs().maxCoeff() > 100) return violation("|q| > 100");
                                  return std::nullopt;
                                }),
                                *reference_implementation(), opts);
    ASSERT_EQ(r.status, LawStatus::falsified) << "seed " << seed;
    const Problem& p = r.minimal_case->problem;
    EXPECT_EQ(p.q.shape(), (Shape{1, 1, 1, 1})) << "seed " << seed;
    EXPECT_EQ(p.k.shape().T, 1) << "seed " << seed;
    const double x = std::abs(p.q.values()[0]);
    EXPECT_TRUE(x > 100 && std::exp2(std::round(std::log2(x))) == x) << "seed " << seed << ": q = " << x;
    EXPECT_EQ((p.k.values().array() != 0).count() + (p.v.values().array() != 0).count(), 0) << "seed " << seed;
  }
}

// A bug that only a scale other than 1 shows (a gradient missing its scale) vanishes at D = 1 under the default
// scale 1/√D = 1. Dropping a D coordinate is also tried keeping the scale the case had, so on every seed the
// failure ends at D = 1 with an explicit scale, simplified to a power of two, rather than at D = 2.
TEST(Generators, shrinkingKeepsTheScaleWhenItDropsTheLastDCoordinates) {
  for (std::uint64_t seed = 1; seed <= 10; ++seed) {
    RunOptions opts;
    opts.seed = seed;
    opts.cases = 400;
    const LawResult r = run_law(probeLaw([](const LawCase& c) -> std::optional<Violation> {
                                  const Problem& p = c.problem;
                                  const double scale = p.scale ? *p.scale : 1 / std::sqrt(double(p.q.shape().D));
                                  if (scale != 1 && p.q.values().cwiseAbs().maxCoeff() > 0)
                                    return violation("q scaled by something other than 1");
                                  return std::nullopt;
                                }),
                                *reference_implementation(), opts);
    ASSERT_EQ(r.status, LawStatus::falsified) << "seed " << seed;
    const Problem& p = r.minimal_case->problem;
    EXPECT_EQ(p.q.shape(), (Shape{1, 1, 1, 1})) << "seed " << seed;
    ASSERT_TRUE(p.scale.has_value()) << "seed " << seed;
    EXPECT_EQ(std::exp2(std::round(std::log2(*p.scale))), *p.scale) << "seed " << seed << ": scale " << *p.scale;
  }
}

// dO shrinks with its gradient case: a shape step keeps the dO of the entries it keeps (drawn at q's
// coordinates), so a failure that needs q and dO both large at the same entry ends at that entry alone
// (B = H = T_q = D = 1) on every seed that finds it. (Redrawn for each new shape, dO would lose that entry.)
TEST(Generators, theUpstreamGradientShrinksWithTheCase) {
  int found = 0;
  for (std::uint64_t seed = 1; seed <= 10; ++seed) {
    RunOptions opts;
    opts.seed = seed;
    opts.cases = 400;
    Law l = probeLaw([](const LawCase& c) -> std::optional<Violation> {
      const Problem& p = c.problem;
      // Entry by entry, so only where q and dO have the same shape (D_v = D): a case with a V head dim of its
      // own has a dO of another size.
      if (p.v_dim() != p.q.shape().D) return std::nullopt;
      if ((p.q.values().cwiseAbs().array() > 10 && p.d_output->values().cwiseAbs().array() > 10).any())
        return violation("q and dO both above 10 at one entry");
      return std::nullopt;
    });
    l.gen = [](const GenConfig& cfg) { return gen_gradient_case(cfg); };
    const LawResult r = run_law(l, *reference_implementation(), opts);
    if (r.status != LawStatus::falsified) continue;
    ++found;
    EXPECT_EQ(r.minimal_case->problem.q.shape(), (Shape{1, 1, 1, 1})) << "seed " << seed;
  }
  EXPECT_GE(found, 8);
}

// A geometry step that keeps every entry (here: dropping the window) may need values the shrunk ones lost. The
// failure here: any window shows it; without one it needs two query rows that differ and every |k| <= 1. While
// some |k| > 1 the window stays and the values shrink under it, q's first (to 0), so by the time k qualifies q's
// rows are equal. The window still goes on every seed, because such a step is also tried with the values as
// drawn and, in a small case, with generic ones (1, 2, 3, ...).
TEST(Generators, aFeatureShrinksAwayEvenAfterTheValuesItNeededShrank) {
  for (std::uint64_t seed = 1; seed <= 10; ++seed) {
    RunOptions opts;
    opts.seed = seed;
    opts.cases = 400;
    const LawResult r = run_law(probeLaw([](const LawCase& c) -> std::optional<Violation> {
                                  const Problem& p = c.problem;
                                  if (p.q.shape().T < 2) return std::nullopt;
                                  if (p.window) return violation("a window");
                                  const auto q = p.q.head(0, 0);
                                  if (q.row(0) != q.row(1) && p.k.values().cwiseAbs().maxCoeff() <= 1)
                                    return violation("rows 0 and 1 differ, |k| <= 1");
                                  return std::nullopt;
                                }),
                                *reference_implementation(), opts);
    ASSERT_EQ(r.status, LawStatus::falsified) << "seed " << seed;
    const Problem& p = r.minimal_case->problem;
    EXPECT_FALSE(p.window.has_value()) << "seed " << seed << ": window " << *p.window;
    EXPECT_EQ(p.q.shape(), (Shape{1, 1, 2, 1})) << "seed " << seed;
  }
}

// The modifiers: drawn only for an implementation that declares them, about a third of the cases each, one per
// query head; a failure that needs none sheds them all while shrinking, and one that needs a sink on head 1
// keeps that head's sink value however the heads shrink.
TEST(Generators, modifiersAreDrawnWhenDeclaredAndShrinkAwayUnlessNeeded) {
  std::map<std::string, int> seen;
  RunOptions opts;
  const LawResult all = run_law(probeLaw([&](const LawCase& c) -> std::optional<Violation> {
                                  const Problem& p = c.problem;
                                  const std::size_t H = std::size_t(p.q.shape().H);
                                  if (p.softcap) ++seen["softcap"];
                                  if (!p.alibi_slopes.empty()) {
                                    ++seen["alibi"];
                                    EXPECT_EQ(p.alibi_slopes.size(), H);
                                  }
                                  if (!p.sinks.empty()) {
                                    ++seen["sinks"];
                                    EXPECT_EQ(p.sinks.size(), H);
                                  }
                                  return std::nullopt;
                                }),
                                *reference_implementation(), opts);
  EXPECT_EQ(all.status, LawStatus::held);
  for (const char* m : {"softcap", "alibi", "sinks"}) EXPECT_GE(seen[m], 15) << m;
  for (std::uint64_t seed = 1; seed <= 5; ++seed) {
    RunOptions o = opts;
    o.seed = seed;
    const LawResult r = run_law(probeLaw([](const LawCase& c) -> std::optional<Violation> {
                                  if (c.problem.q.shape().T >= 2) return violation("two positions");
                                  return std::nullopt;
                                }),
                                *reference_implementation(), o);
    ASSERT_EQ(r.status, LawStatus::falsified);
    const Problem& p = r.minimal_case->problem;
    EXPECT_FALSE(p.softcap || !p.alibi_slopes.empty() || !p.sinks.empty()) << "seed " << seed;
  }
  // An implementation without the capabilities is never sent them.
  const ImplementationPtr plain = make_implementation(
      "plain", "the reference, declaring no modifier", Capabilities{},
      [](const Problem& p) { return reference_implementation()->forward(p); });
  const LawResult none = run_law(probeLaw([](const LawCase& c) -> std::optional<Violation> {
                                   if (c.problem.modified()) return violation("a modifier");
                                   return std::nullopt;
                                 }),
                                 *plain, RunOptions{});
  EXPECT_EQ(none.status, LawStatus::held);
}

// V with a head dimension of its own (MLA) is drawn in about 7/16 of the cases when declared (a quarter on its own
// share, more where features are combined), smaller and
// larger than D, paged too (V's pool then has rows D_v wide), its dO shaped like the output; a declared list of pairs gives only those pairs; a
// failure that needs D_v != D shrinks to D = 1 with D_v = 2 or D = 2 with D_v = 1, one that does not sheds it; an
// implementation that does not declare it is never sent one.
TEST(Generators, aValueHeadDimIsDrawnWhenDeclaredAndShrinksToWhatTheFailureNeeds) {
  std::map<std::string, int> seen;
  const auto count = [&](const LawCase& c) -> std::optional<Violation> {
    const Problem& p = c.problem;
    const Index D = p.q.shape().D, D_v = p.v_dim();
    if (D_v != D) {
      ++seen[D_v < D ? "smaller" : "larger"];
      if (p.paged) {
        ++seen["paged"];
        const Shape pool = p.paged_kv().pool_shape(p.k.shape().H, D_v);
        EXPECT_EQ(paged_pools(p, p.k, p.v).v.shape(), pool);
      }
      EXPECT_EQ(p.v.shape(), (Shape{p.k.shape().B, p.k.shape().H, p.k.shape().T, D_v}));
      if (p.d_output) {
        EXPECT_EQ(p.d_output->shape(), p.output_shape());
      }
    }
    ++seen["cases"];
    return std::nullopt;
  };
  EXPECT_EQ(run_law(probeLaw(count), *reference_implementation(), RunOptions{}).status, LawStatus::held);
  EXPECT_GE(seen["smaller"] + seen["larger"], 12) << seen["cases"] << " cases";
  // 1/4 on its own share, plus 3/4 x 1/2 (a case that combines features) x 1/2 (its bit): 7/16, about 44 of 100.
  EXPECT_LE(seen["smaller"] + seen["larger"], 60);
  EXPECT_GE(seen["smaller"], 3);
  EXPECT_GE(seen["larger"], 3);
  EXPECT_GE(seen["paged"], 2) << "the reference declares paging: about half the D_v cases are paged";
  // Gradient cases too: dO [B,H,T_q,D_v].
  Law grad = probeLaw(count);
  grad.gen = [](const GenConfig& cfg) { return gen_gradient_case(cfg, {}); };
  seen.clear();
  EXPECT_EQ(run_law(grad, *reference_implementation(), RunOptions{}).status, LawStatus::held);
  EXPECT_GE(seen["smaller"] + seen["larger"], 12);
  // A declared list: (16, 8) and (8, 16) only, besides D = 4 alone.
  Capabilities listed = reference_implementation()->capabilities();
  listed.head_dims = {4};
  listed.head_dim_pairs = {{16, 8}, {8, 16}};
  const ImplementationPtr mla = make_implementation("listed", "the reference, declaring a list", listed,
                                                    [](const Problem& p) { return reference_implementation()->forward(p); });
  const LawResult in_list = run_law(probeLaw([](const LawCase& c) -> std::optional<Violation> {
                                      const Index D = c.problem.q.shape().D, D_v = c.problem.v_dim();
                                      const bool ok = (D == 4 && D_v == 4) || (D == 16 && D_v == 8) || (D == 8 && D_v == 16);
                                      return ok ? std::nullopt : std::optional(violation("D " + std::to_string(D) +
                                                                                         ", D_v " + std::to_string(D_v)));
                                    }),
                                    *mla, RunOptions{});
  EXPECT_EQ(in_list.status, LawStatus::held) << (in_list.violation ? in_list.violation->message : "");
  for (std::uint64_t seed = 1; seed <= 5; ++seed) {
    RunOptions o;
    o.seed = seed;
    const LawResult needs = run_law(probeLaw([](const LawCase& c) -> std::optional<Violation> {
                                      if (c.problem.v_dim() != c.problem.q.shape().D) return violation("D_v != D");
                                      return std::nullopt;
                                    }),
                                    *reference_implementation(), o);
    ASSERT_EQ(needs.status, LawStatus::falsified) << "seed " << seed;
    const Problem& p = needs.minimal_case->problem;
    EXPECT_EQ(p.q.shape().numel() + p.k.shape().numel(), p.q.shape().D == 1 ? 2 : 4) << "seed " << seed;
    EXPECT_EQ(p.v_dim(), p.q.shape().D == 1 ? 2 : 1) << "seed " << seed;
    EXPECT_LE(p.q.shape().D, 2) << "seed " << seed;
    const LawResult other = run_law(probeLaw([](const LawCase& c) -> std::optional<Violation> {
                                      if (c.problem.q.shape().T >= 2) return violation("two positions");
                                      return std::nullopt;
                                    }),
                                    *reference_implementation(), o);
    ASSERT_EQ(other.status, LawStatus::falsified);
    EXPECT_EQ(other.minimal_case->problem.v_dim(), other.minimal_case->problem.q.shape().D) << "seed " << seed;
  }
  const ImplementationPtr plain = make_implementation(
      "plain", "the reference, declaring one head dimension", Capabilities{},
      [](const Problem& p) { return reference_implementation()->forward(p); });
  const LawResult none = run_law(probeLaw([](const LawCase& c) -> std::optional<Violation> {
                                   if (c.problem.v_dim() != c.problem.q.shape().D) return violation("D_v != D");
                                   return std::nullopt;
                                 }),
                                 *plain, RunOptions{});
  EXPECT_EQ(none.status, LawStatus::held);
}

// --long (GenConfig::long_lengths): every case's keys have one of the long lengths, its queries are a decode step
// or a chunk (bottom-right) within long_max_T_q; a failure that needs a position past 2^15 shrinks to one query
// over 2^15 + 1 keys, the shortest long length that shows it; a law that draws square cases only gets ordinary
// lengths when the queries are bounded.
TEST(Generators, longLengthsAreTheOnlyKeyLengthsAndShrinkingMovesBetweenThem) {
  RunOptions o;
  o.cases = 12;
  o.gen.long_lengths = {32767, 32769, 65535, 65537};
  o.gen.long_max_T_q = 64;
  o.gen.max_B = 1;
  o.gen.max_H = 2;
  o.gen.max_D = 4;
  std::map<std::string, int> seen;
  const LawResult all = run_law(probeLaw([&](const LawCase& c) -> std::optional<Violation> {
                                  const Problem& p = c.problem;
                                  const Index T_q = p.q.shape().T, T_k = p.k.shape().T;
                                  EXPECT_TRUE(T_k == 32767 || T_k == 32769 || T_k == 65535 || T_k == 65537) << T_k;
                                  EXPECT_LE(T_q, 64);
                                  EXPECT_EQ(p.alignment, CausalAlignment::BottomRight);
                                  ++seen[T_q == 1 ? "decode" : "chunk"];
                                  return std::nullopt;
                                }),
                                *reference_implementation(), o);
  EXPECT_EQ(all.status, LawStatus::held);
  EXPECT_GE(seen["decode"], 1);
  EXPECT_GE(seen["chunk"], 1);
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    RunOptions r = o;
    r.seed = seed;
    const LawResult past = run_law(probeLaw([](const LawCase& c) -> std::optional<Violation> {
                                     const Problem& p = c.problem;
                                     const Index last = p.k.shape().T - p.q.shape().T;  // the first query's position
                                     if (last + p.q.shape().T - 1 >= 32768) return violation("a position past 2^15");
                                     return std::nullopt;
                                   }),
                                   *reference_implementation(), r);
    ASSERT_EQ(past.status, LawStatus::falsified) << "seed " << seed;
    const Problem& p = past.minimal_case->problem;
    EXPECT_EQ(p.q.shape(), (Shape{1, 1, 1, 1})) << "seed " << seed;
    EXPECT_EQ(p.k.shape().T, 32769) << "seed " << seed;
  }
  Law square = probeLaw([](const LawCase& c) -> std::optional<Violation> {
    if (c.problem.k.shape().T > 1024) return violation("a long square case");
    return std::nullopt;
  });
  square.gen = [](const GenConfig& cfg) { return gen_problem(cfg, ProblemOptions{.allow_cross_lengths = false}); };
  EXPECT_EQ(run_law(square, *reference_implementation(), o).status, LawStatus::held);
}

// The mask families beyond causal are drawn when declared (documents, empty ones among them, chunks, a prefix, a
// right window, no causal rule), every document bound a valid key position list; a failure that needs two
// documents shrinks to exactly one bound with nothing else left, and a failure that needs none sheds them all.
TEST(Generators, maskFamiliesAreDrawnWhenDeclaredAndShrinkToWhatTheFailureNeeds) {
  std::map<std::string, int> seen;
  const LawResult all = run_law(probeLaw([&](const LawCase& c) -> std::optional<Violation> {
                                  const Problem& p = c.problem;
                                  if (!p.doc_bounds.empty()) {
                                    ++seen["documents"];
                                    EXPECT_EQ(Index(p.doc_bounds.size()), p.q.shape().B);
                                    for (const auto& bounds : p.doc_bounds) {
                                      EXPECT_TRUE(std::is_sorted(bounds.begin(), bounds.end()));
                                      if (std::adjacent_find(bounds.begin(), bounds.end()) != bounds.end())
                                        ++seen["empty document"];
                                    }
                                  }
                                  if (p.chunk_size > 0) ++seen["chunks"];
                                  if (p.prefix_length > 0) ++seen["prefix"];
                                  if (p.window_right) ++seen["right window"];
                                  if (!p.causal) ++seen["bidirectional"];
                                  if (!p.causal && p.prefix_length > 0) ++seen["prefix without causal"];
                                  if (p.block_mask) {
                                    const BlockMask& m = *p.block_mask;
                                    ++seen["block mask"];
                                    EXPECT_EQ(m.q_blocks, (p.q.shape().T + m.block_q - 1) / m.block_q);
                                    EXPECT_EQ(m.k_blocks, (p.k.shape().T + m.block_k - 1) / m.block_k);
                                    if (m.H > 1) ++seen["block mask per head"];
                                    if (m.B > 1) ++seen["block mask per batch entry"];
                                    if (m.block_q != m.block_k) ++seen["block_q != block_k"];
                                    for (const auto k : {BlockKind::Empty, BlockKind::Partial, BlockKind::Full})
                                      if (std::count(m.kinds.begin(), m.kinds.end(), std::uint8_t(k)) > 0)
                                        ++seen["kind " + std::to_string(int(k))];
                                  }
                                  if (p.dense_mask) ++seen["dense mask"];
                                  return std::nullopt;
                                }),
                                *reference_implementation(), RunOptions{});
  EXPECT_EQ(all.status, LawStatus::held);
  for (const char* m : {"documents", "empty document", "chunks", "prefix", "right window", "bidirectional",
                        "block mask", "block mask per head", "block mask per batch entry", "block_q != block_k",
                        "kind 0", "kind 1", "kind 2", "dense mask"})
    EXPECT_GE(seen[m], 3) << m;
  EXPECT_EQ(seen["prefix without causal"], 0);
  for (std::uint64_t seed = 1; seed <= 5; ++seed) {
    RunOptions o;
    o.seed = seed;
    // Fails whenever some query's document starts after key 0 (two non-empty documents).
    const LawResult r = run_law(probeLaw([](const LawCase& c) -> std::optional<Violation> {
                                  const Problem& p = c.problem;
                                  for (Index b = 0; b < p.q.shape().B; ++b)
                                    for (Index i = 0; i < p.q.shape().T; ++i)
                                      if (p.visibility(b).keys(i).begin > 0 && !p.window && p.chunk_size == 0 &&
                                          !p.has_cell_masks())
                                        return violation("a second document");
                                  return std::nullopt;
                                }),
                                *reference_implementation(), o);
    ASSERT_EQ(r.status, LawStatus::falsified) << "seed " << seed;
    const Problem& p = r.minimal_case->problem;
    EXPECT_EQ(p.q.shape().T, 1) << "seed " << seed;  // one query, bottom-right over two keys, or T = 2
    ASSERT_EQ(p.doc_bounds.size(), 1u) << "seed " << seed;
    EXPECT_EQ(p.doc_bounds[0].size(), 1u) << "seed " << seed;
    EXPECT_FALSE(p.prefix_length || p.window_right || !p.causal) << "seed " << seed;
    const LawResult plain = run_law(probeLaw([](const LawCase& c) -> std::optional<Violation> {
                                      if (c.problem.q.shape().T >= 2) return violation("two positions");
                                      return std::nullopt;
                                    }),
                                    *reference_implementation(), o);
    ASSERT_EQ(plain.status, LawStatus::falsified);
    // A failure that needs a key the causal rule shows but a block mask hides: one query, a block mask whose
    // one block hides it, broadcast over batch and heads, nothing else.
    const LawResult cells = run_law(probeLaw([](const LawCase& c) -> std::optional<Violation> {
                                      const Problem& p = c.problem;
                                      if (!p.block_mask) return std::nullopt;
                                      Problem plain_rule = p;
                                      plain_rule.block_mask.reset();
                                      plain_rule.dense_mask.reset();
                                      for (Index b = 0; b < p.q.shape().B; ++b)
                                        for (Index h = 0; h < p.q.shape().H; ++h)
                                          for (Index i = 0; i < p.q.shape().T; ++i)
                                            for (Index j = 0; j < p.k.shape().T; ++j)
                                              if (plain_rule.visibility(b, h).visible(i, j) &&
                                                  !p.visibility(b, h).visible(i, j))
                                                return violation("a key the block mask hides");
                                      return std::nullopt;
                                    }),
                                    *reference_implementation(), o);
    ASSERT_EQ(cells.status, LawStatus::falsified) << "seed " << seed;
    const Problem& pc = cells.minimal_case->problem;
    EXPECT_EQ(pc.q.shape().numel(), 1) << "seed " << seed;
    EXPECT_EQ(pc.k.shape().T, 1) << "seed " << seed;
    ASSERT_TRUE(pc.block_mask) << "seed " << seed;
    EXPECT_FALSE(pc.dense_mask || (pc.masked_beyond_causal() && !pc.block_mask)) << "seed " << seed;
    EXPECT_EQ(pc.block_mask->B * pc.block_mask->H, 1) << "seed " << seed;
    EXPECT_EQ(pc.block_mask->kinds.size(), 1u) << "seed " << seed;
    EXPECT_FALSE(plain.minimal_case->problem.masked_beyond_causal() || !plain.minimal_case->problem.causal)
        << "seed " << seed;
  }
}

// Paging is drawn in about half the cases when declared, in declared page sizes and layouts only, with every
// derived table valid for its sequences; a failure that needs a paged call keeps it while the rest shrinks (to
// the plainest plan: contiguous, no spare pages or columns), one that does not shrinks to dense; an
// implementation that does not declare paging is never sent a paged call.
TEST(Generators, pagingIsDrawnWhenDeclaredValidAndShrinksToThePlainestPlan) {
  std::map<std::string, int> seen;
  const LawResult all = run_law(probeLaw([&](const LawCase& c) -> std::optional<Violation> {
                                  const Problem& p = c.problem;
                                  if (!p.paged) return std::nullopt;
                                  ++seen["paged"];
                                  ++seen["size " + std::to_string(p.paged->page_size)];
                                  ++seen[page_layout_name(p.paged->layout)];
                                  const PagedKV pk = p.paged_kv();
                                  EXPECT_NO_THROW(check_paged(pk, p.k.shape().B, p.sequence_lengths()));
                                  if (pk.pages_used(p.k.shape().T) < pk.max_pages) ++seen["table wider than used"];
                                  return std::nullopt;
                                }),
                                *reference_implementation(), RunOptions{});
  EXPECT_EQ(all.status, LawStatus::held);
  EXPECT_GE(seen["paged"], 30);
  EXPECT_LE(seen["paged"], 70);
  for (const char* k : {"size 1", "size 8", "size 16", "size 64", "token-major", "head-major", "table wider than used"})
    EXPECT_GE(seen[k], 1) << k;
  for (std::uint64_t seed = 1; seed <= 5; ++seed) {
    RunOptions o;
    o.seed = seed;
    const LawResult dense = run_law(probeLaw([](const LawCase& c) -> std::optional<Violation> {
                                      if (c.problem.q.shape().T >= 2) return violation("two positions");
                                      return std::nullopt;
                                    }),
                                    *reference_implementation(), o);
    ASSERT_EQ(dense.status, LawStatus::falsified);
    EXPECT_FALSE(dense.minimal_case->problem.paged) << "seed " << seed;
    const LawResult paged = run_law(probeLaw([](const LawCase& c) -> std::optional<Violation> {
                                      if (c.problem.paged && c.problem.k.shape().T >= 3) return violation("paged");
                                      return std::nullopt;
                                    }),
                                    *reference_implementation(), o);
    ASSERT_EQ(paged.status, LawStatus::falsified);
    const Problem& p = paged.minimal_case->problem;
    ASSERT_TRUE(p.paged) << "seed " << seed;
    EXPECT_EQ(p.k.shape().T, 3) << "seed " << seed;
    EXPECT_EQ(p.paged->order, PagedPlan::Order::contiguous) << "seed " << seed;
    EXPECT_EQ(p.paged->spare_pages, 0) << "seed " << seed;
    EXPECT_EQ(p.paged->spare_columns, 0) << "seed " << seed;
    EXPECT_EQ(p.paged->fill, PageFill::zero) << "seed " << seed;
  }
  Capabilities caps = reference_implementation()->capabilities();
  caps.features.remove(Feature::paged);
  const ImplementationPtr dense_only = make_implementation(
      "dense", "the reference, not paged", caps, [](const Problem& p) { return reference_implementation()->forward(p); });
  const LawResult none = run_law(probeLaw([](const LawCase& c) -> std::optional<Violation> {
                                   if (c.problem.paged) return violation("paged");
                                   return std::nullopt;
                                 }),
                                 *dense_only, RunOptions{});
  EXPECT_EQ(none.status, LawStatus::held);
}

// Grouped heads shrink by whole kv groups or by the same query head of every group, so H_kv always divides H:
// a failure that needs two kv groups of two query heads each ends at exactly H = 4, H_kv = 2.
TEST(Generators, groupedHeadsShrinkByWholeGroupsKeepingHDivisible) {
  for (std::uint64_t seed = 1; seed <= 5; ++seed) {
    RunOptions opts;
    opts.seed = seed;
    opts.cases = 400;
    opts.gen.max_H = 8;
    std::string bad;
    const LawResult r = run_law(probeLaw([&](const LawCase& c) -> std::optional<Violation> {
                                  const Index H = c.problem.q.shape().H, H_kv = c.problem.kv_heads();
                                  if (H % H_kv) bad = std::to_string(H) + " heads, " + std::to_string(H_kv) + " kv";
                                  if (H_kv >= 2 && H / H_kv >= 2) return violation("two groups of two");
                                  return std::nullopt;
                                }),
                                *reference_implementation(), opts);
    ASSERT_EQ(r.status, LawStatus::falsified) << "seed " << seed;
    EXPECT_EQ(bad, "") << "seed " << seed;
    EXPECT_EQ(r.minimal_case->problem.q.shape().H, 4) << "seed " << seed;
    EXPECT_EQ(r.minimal_case->problem.kv_heads(), 2) << "seed " << seed;
  }
}

// Values shrink to 0, then to ±1, small integers and powers of two, and only to simpler ones (so shrinking ends).
TEST(Generators, simpleValuesAreZeroThenSmallIntegersAndPowersOfTwo) {
  EXPECT_EQ(simple_values(0, DType::f32), std::vector<double>{});
  EXPECT_EQ(simple_values(-3.7, DType::f32), (std::vector<double>{0, -1, -4}));
  EXPECT_EQ(simple_values(1000.3, DType::f32), (std::vector<double>{0, 1, 1024}));
  EXPECT_EQ(simple_values(5, DType::f32), (std::vector<double>{0, 1, 3, 4}));
  EXPECT_EQ(simple_values(1024, DType::f32), (std::vector<double>{0, 1, 32, 256, 512}));
  EXPECT_EQ(simple_values(0.125, DType::f32), (std::vector<double>{0, 1, 0.25}));
  EXPECT_EQ(simple_values(1, DType::f32), std::vector<double>{0});
}

// Among failing shrinks, clear ones win: a law whose violation is 100x its tolerance at T_q >= 3 but only 1.5x at
// T_q = 2 stops at T_q = 3 once it holds a clear failure, instead of ending where a reader would suspect noise.
// When the first failure is itself unclear (T_q = 2), there is nothing clearer to keep.
TEST(Generators, shrinkingPrefersFailuresWellAboveTheTolerance) {
  int clear_runs = 0;
  for (std::uint64_t seed = 1; seed <= 10; ++seed) {
    RunOptions opts;
    opts.seed = seed;
    Index first_T = 0;
    const LawResult r = run_law(probeLaw([&](const LawCase& c) -> std::optional<Violation> {
                                  const Index T = c.problem.q.shape().T;
                                  if (T < 2) return std::nullopt;
                                  if (!first_T) first_T = T;
                                  Violation v = violation("fails");
                                  v.quantity = "output";
                                  v.tolerance = 1;
                                  v.magnitude = T >= 3 ? 100 : 1.5;
                                  return v;
                                }),
                                *reference_implementation(), opts);
    ASSERT_EQ(r.status, LawStatus::falsified);
    if (first_T == 2) {
      EXPECT_EQ(margin(*r.violation), 1.5) << "seed " << seed;
      continue;
    }
    ++clear_runs;
    EXPECT_EQ(r.minimal_case->problem.q.shape().T, 3) << "seed " << seed << ": " << describe(r);
    EXPECT_EQ(margin(*r.violation), 100) << "seed " << seed;
    EXPECT_NE(describe(r).find("margin: 100x the tolerance"), std::string::npos) << describe(r);
  }
  EXPECT_GT(clear_runs, 0);
}

// --min-T and --shape: no generated (or shrunk) case is shorter than min_T, and a pinned shape is every case's
// shape, even when the law fails and the case is shrunk.
TEST(Generators, minTAndAPinnedShapeHoldWhileShrinking) {
  RunOptions opts;
  opts.gen.min_T = 20;
  opts.gen.max_T = 40;
  std::string bad;
  const LawResult r = run_law(probeLaw([&](const LawCase& c) -> std::optional<Violation> {
                                if (c.problem.q.shape().T < 20 || c.problem.k.shape().T < 20)
                                  bad = to_string(c.problem.q.shape()) + " / " + to_string(c.problem.k.shape());
                                return violation("always");
                              }),
                              *reference_implementation(), opts);
  ASSERT_EQ(r.status, LawStatus::falsified);
  EXPECT_EQ(bad, "");
  EXPECT_EQ(r.minimal_case->problem.q.shape().T, 20);

  opts.gen.shape = std::array<Index, 5>{2, 3, 40, 33, 8};
  const LawResult pinned = run_law(probeLaw([&](const LawCase& c) -> std::optional<Violation> {
                                     if (c.problem.q.shape() != Shape{2, 3, 40, 8} || c.problem.k.shape() != Shape{2, 3, 33, 8})
                                       bad = to_string(c.problem.q.shape()) + " / " + to_string(c.problem.k.shape());
                                     return violation("always");
                                   }),
                                   *reference_implementation(), opts);
  ASSERT_EQ(pinned.status, LawStatus::falsified);
  EXPECT_EQ(bad, "");
  // Every case keeps the pinned shape: q's H (true grouping once raised a pinned H = 3 to 4, for a divisor strictly
  // between 1 and H), and V's D, though the reference declares a V head dimension of its own (a quarter of its
  // unpinned cases have one).
  const LawResult all = run_law(probeLaw([&](const LawCase& c) -> std::optional<Violation> {
                                  const Problem& p = c.problem;
                                  if (p.q.shape() != Shape{2, 3, 40, 8} || p.v.shape() != p.k.shape() ||
                                      p.k.shape().T != 33 || p.k.shape().D != 8 || 3 % p.k.shape().H != 0)
                                    bad = to_string(p.q.shape()) + " " + to_string(p.k.shape()) + " " + to_string(p.v.shape());
                                  return std::nullopt;
                                }),
                                *reference_implementation(), opts);
  EXPECT_EQ(all.status, LawStatus::held);
  EXPECT_EQ(bad, "") << "V of a pinned shape";
}

// The T generator puts weight where tiled kernels break: 2^k, 2^k ± 1 and 16m, 16m ± 1, up to max_T.
TEST(Generators, tileEdgeLengthsAreTheEdgesUpToMaxT) {
  EXPECT_EQ(tile_edge_lengths(1, 20), (std::vector<Index>{1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17}));
  EXPECT_EQ(tile_edge_lengths(60, 70), (std::vector<Index>{63, 64, 65}));
}

// A hang costs a whole call timeout per shrink candidate, so shrinking gives up after max_shrink_timeouts
// of them timed out and says so; with no limit it goes on to the smallest hanging case.
TEST(Generators, shrinkingAHangStopsAfterTheTimeoutBudget) {
  const auto hangs_from_T2 = [](const LawCase& c) -> std::optional<Violation> {
    if (c.problem.q.shape().T >= 2 || c.problem.k.shape().T >= 2)
      throw ImplementationError(ImplementationError::Kind::timeout, "no answer within 1 s");
    return std::nullopt;
  };
  RunOptions opts = options_from_rc_params("probe");
  opts.cases = 100;
  opts.max_shrink_timeouts = 2;
  const LawResult capped = run_law(probeLaw(hangs_from_T2), *reference_implementation(), opts);
  ASSERT_EQ(capped.status, LawStatus::falsified);
  EXPECT_EQ(capped.timeouts, 1 + opts.max_shrink_timeouts) << "the first failure, then the budget";
  EXPECT_NE(capped.note.find("shrinking stopped after 2 shrink candidates timed out"), std::string::npos)
      << capped.note;

  opts.max_shrink_timeouts = 0;
  const LawResult unlimited = run_law(probeLaw(hangs_from_T2), *reference_implementation(), opts);
  ASSERT_EQ(unlimited.status, LawStatus::falsified);
  EXPECT_GT(unlimited.timeouts, capped.timeouts);
  ASSERT_TRUE(unlimited.minimal_case);
  const Shape q = unlimited.minimal_case->problem.q.shape(), k = unlimited.minimal_case->problem.k.shape();
  EXPECT_EQ(std::max(q.T, k.T), 2) << "shrunk to the smallest hanging T";
  EXPECT_EQ(unlimited.note.find("shrinking stopped"), std::string::npos) << unlimited.note;
}

// Shrinking has a time budget: with every failing check slow, a law stops shrinking after shrink_seconds and
// reports the smallest failing case found by then, saying so; with no budget it shrinks on to the smallest.
TEST(Generators, shrinkingStopsAtItsTimeBudgetWithTheSmallestCaseSoFar) {
  const auto slow_from_T2 = [](const LawCase& c) -> std::optional<Violation> {
    if (std::max(c.problem.q.shape().T, c.problem.k.shape().T) < 2) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a slow black box
    return violation("fails once T >= 2");
  };
  RunOptions opts = options_from_rc_params("probe");
  opts.cases = 100;
  opts.shrink_seconds = 0.05;
  const LawResult capped = run_law(probeLaw(slow_from_T2), *reference_implementation(), opts);
  ASSERT_EQ(capped.status, LawStatus::falsified);
  ASSERT_TRUE(capped.minimal_case);
  EXPECT_NE(capped.note.find("shrinking cut short after 0.05 s (--shrink-time)"), std::string::npos) << capped.note;

  opts.shrink_seconds = 0;
  const LawResult unlimited = run_law(probeLaw(slow_from_T2), *reference_implementation(), opts);
  ASSERT_EQ(unlimited.status, LawStatus::falsified);
  ASSERT_TRUE(unlimited.minimal_case);
  const Problem& p = unlimited.minimal_case->problem;
  EXPECT_EQ(std::max(p.q.shape().T, p.k.shape().T), 2) << "shrunk to the smallest failing T";
  EXPECT_GT(unlimited.shrink_steps, capped.shrink_steps);
  EXPECT_EQ(unlimited.note.find("cut short"), std::string::npos) << unlimited.note;
}

// Combinations: every pair of the features a call can carry that the reference declares (it declares them all)
// comes together in a share of the cases, and the coverage tags say which pairs a run reached. Features that
// exclude each other (a prefix needs the causal rule; one mask kind a case; one cross-length regime) are not pairs.
TEST(Generators, everyPairOfDeclaredFeaturesComesTogether) {
  RunOptions opts = options_from_rc_params("probe");
  opts.cases = 400;
  const LawResult r = run_law(probeLaw(), *reference_implementation(), opts);
  ASSERT_EQ(r.status, LawStatus::held);
  const std::vector<std::string> features{"T_q<T_k,bottom-right", "T_q>T_k,bottom-right", "grouped", "padded",
                                          "window", "documents", "chunked", "no-causal", "prefix", "window-right",
                                          "block-mask", "dense-mask", "D_v"};
  const std::set<std::pair<std::string, std::string>> exclusive{
      {"T_q<T_k,bottom-right", "T_q>T_k,bottom-right"}, {"no-causal", "prefix"}, {"block-mask", "dense-mask"}};
  std::string thin;
  for (std::size_t a = 0; a < features.size(); ++a)
    for (std::size_t b = a + 1; b < features.size(); ++b) {
      if (exclusive.count({features[a], features[b]})) continue;
      const std::string tag = "with:" + features[a] + "+" + features[b];
      const int n = r.coverage.count(tag) ? r.coverage.at(tag) : 0;
      if (n < 4) thin += "\n  " + tag + ": " + std::to_string(n) + " of " + std::to_string(r.cases_run);  // 1%
    }
  EXPECT_EQ(thin, "") << "pairs of declared features met in under 1% of the cases";
  int three = r.coverage.count("features-at-once=3+") ? r.coverage.at("features-at-once=3+") : 0;
  EXPECT_GE(three, r.cases_run / 10) << "three or more features at once in at least 10% of the cases";
}

// A call budget shared by the laws of a run: once spent, a law checks no further case and is not checked (never
// held), saying how many cases it did check; the calls it made are counted against the budget of the laws after it.
TEST(Generators, theCallBudgetIsSharedAndEndsTheRunSayingWhatWasNotChecked) {
  Law calls_once = probeLaw();
  calls_once.check = [](const Implementation& impl, const LawCase& c) -> std::optional<Violation> {
    impl.forward(c.problem);
    return std::nullopt;
  };
  RunOptions opts = options_from_rc_params("probe");
  opts.cases = 40;
  opts.max_calls = 50;
  opts.calls_spent = std::make_shared<std::atomic<long>>(0);
  const LawResult first = run_law(calls_once, *reference_implementation(), opts);
  ASSERT_EQ(first.status, LawStatus::held);
  EXPECT_EQ(first.cases_run, 40);
  EXPECT_EQ(first.calls, 40);
  EXPECT_EQ(first.note.find("call budget"), std::string::npos) << first.note;
  const LawResult second = run_law(calls_once, *reference_implementation(), opts);
  ASSERT_EQ(second.status, LawStatus::not_checked) << "30 of its 40 cases were never checked";
  EXPECT_EQ(second.calls, 10) << "the 10 calls left of 50";
  EXPECT_EQ(second.cases_run, 10);
  EXPECT_NE(second.note.find("the call budget (50 calls, --max-calls) ran out: held in the 10 cases checked, 30 not "
                             "checked"),
            std::string::npos)
      << second.note;
  EXPECT_EQ(opts.calls_spent->load(), 50);
  // A law after the budget ran out checks nothing, and is not reported as held (nor as not applicable).
  const LawResult third = run_law(calls_once, *reference_implementation(), opts);
  EXPECT_EQ(third.status, LawStatus::not_checked);
  EXPECT_EQ(third.calls, 0);
  EXPECT_NE(third.note.find("not checked: the call budget (50 calls, --max-calls) ran out before this law"),
            std::string::npos)
      << third.note;
}

// With a calls allowance (RunOptions::law_calls, the default check's --law-calls), a law checks first_cases cases,
// then as many more as the allowance takes at the calls per case those made (to the nearest case), never fewer than
// first_cases nor more than `cases`; without one, every law checks `cases` cases. The parallel path plans the same
// cases as the serial one, and a failure in the second pass counts the first pass's cases.
TEST(Generators, aLawsCallsPerCaseSetItsCasesAfterAFirstPass) {
  const auto calling = [](const char* name, int n) {
    Law l = probeLaw();
    l.name = name;
    l.check = [n](const Implementation& impl, const LawCase& c) -> std::optional<Violation> {
      for (int k = 0; k < n; ++k) impl.forward(c.problem);
      return std::nullopt;
    };
    return l;
  };
  const Law one = calling("one", 1), two = calling("two", 2), three = calling("three", 3), seven = calling("seven", 7);
  RunOptions opts = options_from_rc_params("probe");
  opts.cases = 100;
  opts.law_calls = 100;
  opts.first_cases = 20;
  const ImplementationPtr ref = reference_implementation();
  ASSERT_TRUE(ref->capabilities().reentrant) << "the parallel path below needs it";
  const std::vector<const Law*> all{&one, &two, &three, &seven};
  const auto serial = run_laws(all, *ref, opts, 1);
  // 100 calls at 1, 2 and 3 a case: 100, 50 and 33 cases (33.3 rounded); at 7, 14 would fit: the first pass's 20.
  const int want_cases[] = {100, 50, 33, 20};
  const int per_case[] = {1, 2, 3, 7};
  ASSERT_EQ(serial.size(), 4u);
  for (std::size_t n = 0; n < 4; ++n) {
    EXPECT_EQ(serial[n].status, LawStatus::held) << serial[n].law << ": " << serial[n].note;
    EXPECT_EQ(serial[n].cases_run, want_cases[n]) << serial[n].law;
    EXPECT_EQ(serial[n].calls, long(want_cases[n]) * per_case[n]) << serial[n].law;
    int tagged = 0;  // every case checked is in the coverage, the second pass's too
    for (const auto& [tag, k] : serial[n].coverage)
      if (tag.starts_with("T=") || tag.starts_with("T>")) tagged += k;  // T=1, T=2..15, T=16..64, T>64
    EXPECT_EQ(tagged, want_cases[n]) << serial[n].law;
  }
  const auto parallel = run_laws(all, *ref, opts, 2);
  ASSERT_EQ(parallel.size(), 4u);
  for (std::size_t n = 0; n < 4; ++n) {
    EXPECT_EQ(parallel[n].cases_run, serial[n].cases_run) << parallel[n].law;
    EXPECT_EQ(parallel[n].calls, serial[n].calls) << parallel[n].law;
    EXPECT_EQ(parallel[n].coverage, serial[n].coverage) << parallel[n].law;
  }
  // Without an allowance: every law its 100 cases.
  opts.law_calls = 0;
  EXPECT_EQ(run_law(two, *ref, opts).cases_run, 100);
  // A failure in the second pass: the 25th case fails (and every case after it, so shrinking keeps failing).
  opts.law_calls = 100;
  Law late = calling("late", 1);
  const auto seen = std::make_shared<int>(0);
  late.check = [seen](const Implementation& impl, const LawCase& c) -> std::optional<Violation> {
    impl.forward(c.problem);
    if (++*seen >= 25) return violation("the 25th case and after");
    return std::nullopt;
  };
  const LawResult r = run_law(late, *ref, opts);
  EXPECT_EQ(r.status, LawStatus::falsified);
  EXPECT_EQ(r.cases_run, 25) << "20 in the first pass, the 5th of the second";
}

// run_laws shares a budget out: each applicable law may spend what is left over the applicable laws left, so a
// budget too small for all of them checks every law a little (none takes it all), and what a law leaves unspent
// (a law whose cases cost fewer calls) passes on to the laws after it.
TEST(Generators, runLawsSharesTheCallBudgetSoEveryLawIsCheckedALittle) {
  Law cheap = probeLaw(), costly = probeLaw(), last = probeLaw(), not_applicable = probeLaw();
  const auto calls_per_case = [](int n) {
    return [n](const Implementation& impl, const LawCase& c) -> std::optional<Violation> {
      for (int k = 0; k < n; ++k) impl.forward(c.problem);
      return std::nullopt;
    };
  };
  cheap.name = "cheap", costly.name = "costly", last.name = "last", not_applicable.name = "n/a";
  cheap.check = calls_per_case(1);  // 10 cases: 10 calls of its share of 30
  costly.check = calls_per_case(4);
  last.check = calls_per_case(4);
  not_applicable.not_applicable = [](const GenConfig&) { return std::string("never applies"); };
  RunOptions opts = options_from_rc_params("probe");
  opts.cases = 10;
  opts.max_calls = 90;
  opts.calls_spent = std::make_shared<std::atomic<long>>(0);
  const auto r = run_laws({&cheap, &not_applicable, &costly, &last}, *reference_implementation(), opts, 1);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].status, LawStatus::held) << r[0].note;  // 90 / 3 laws = 30 calls; it needed 10
  EXPECT_EQ(r[0].calls, 10);
  EXPECT_EQ(r[1].status, LawStatus::not_applicable);
  // 80 left over 2 laws: 40 calls, 10 cases of 4 calls: it fits exactly.
  EXPECT_EQ(r[2].status, LawStatus::held) << r[2].note;
  EXPECT_EQ(r[2].calls, 40);
  EXPECT_EQ(r[3].status, LawStatus::held) << r[3].note;  // the 40 left
  // Half the budget: every applicable law gets some of it, and none is held.
  opts.max_calls = 45;
  opts.calls_spent = std::make_shared<std::atomic<long>>(0);
  const auto half = run_laws({&costly, &cheap, &last}, *reference_implementation(), opts, 1);
  for (const LawResult& l : half) {
    EXPECT_GT(l.calls, 0) << l.law << ": " << l.note;
    EXPECT_GT(l.cases_run, 0) << l.law << ": " << l.note;
  }
  EXPECT_EQ(half[0].status, LawStatus::not_checked) << "15 calls: 4 of its 10 cases";
  EXPECT_NE(half[0].note.find("its share of the call budget (15 of --max-calls 45) ran out"), std::string::npos)
      << half[0].note;
  EXPECT_EQ(half[1].status, LawStatus::held) << "14 calls of the 29 left: its 10 cases";
  EXPECT_EQ(half[2].status, LawStatus::not_checked) << "the 19 calls left: 5 of its 10 cases";
  EXPECT_LE(opts.calls_spent->load(), 45 + 3) << "at most one case over the budget";
}

// run_laws hands each law's result over as soon as the law ends (when laws run one after the other), so the
// command can print its row before the next law starts.
TEST(Generators, runLawsHandsOverEachResultAsTheLawEnds) {
  int second_checks = 0;
  Law first = probeLaw(), second = probeLaw();
  second.name = "probe-2";
  second.check = [&](const Implementation&, const LawCase&) -> std::optional<Violation> {
    ++second_checks;
    return std::nullopt;
  };
  RunOptions opts = options_from_rc_params("probe");
  opts.cases = 5;
  std::vector<std::pair<std::size_t, int>> seen;  // (law, checks of the second law by then)
  const auto results = run_laws({&first, &second}, *reference_implementation(), opts, 1,
                                [&](std::size_t k, const LawResult&) { seen.emplace_back(k, second_checks); });
  ASSERT_EQ(results.size(), 2u);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], std::make_pair(std::size_t{0}, 0)) << "the first law's result before the second law ran";
  EXPECT_EQ(seen[1], std::make_pair(std::size_t{1}, 5));
}

}  // namespace
}  // namespace attncheck
