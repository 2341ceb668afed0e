// Each mutant, on a hand-made input at its minimal shape, at every dtype: it really differs from the
// reference (with the values worked out by hand below), and each control agrees with the float64 oracle
// within the core's derived tolerance. These run without any law, so the zoo is checked on its own.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "attncheck/backward.hpp"
#include "attncheck/generators.hpp"
#include "attncheck/law.hpp"
#include "attncheck/mutants.hpp"
#include "attncheck/tolerance.hpp"

namespace attncheck {
namespace {

constexpr DType kDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16};
const double kNaN = std::numeric_limits<double>::quiet_NaN();

// A problem at `dtype` from row-major values (small integers and NaN: exact in every dtype).
Problem make_problem(DType dtype, Shape qs, Index T_k, std::vector<double> q, std::vector<double> k,
                     std::vector<double> v, CausalAlignment a = kDefaultAlignment, Index H_kv = 0) {
  const auto tensor = [](Shape s, const std::vector<double>& x) {
    return Tensor<double>(s, Eigen::Map<const Eigen::VectorXd>(x.data(), Index(x.size())));
  };
  Problem p;
  p.dtype = dtype;
  p.q = tensor(qs, q);
  p.k = tensor({qs.B, H_kv ? H_kv : qs.H, T_k, qs.D}, k);  // H_kv 0: as many kv heads as query heads
  p.v = tensor({qs.B, H_kv ? H_kv : qs.H, T_k, qs.D}, v);
  p.alignment = a;
  return p;
}

Outcome run(const std::string& name, const Problem& p) {
  const Mutant* m = find_mutant(name);
  if (!m) throw std::logic_error("no zoo entry " + name);
  return m->impl->forward(p);
}

Outcome reference(const Problem& p) { return reference_implementation()->forward(p); }

// The mutant's output differs from the reference's somewhere (NaN against a number counts).
bool outputs_differ(const Outcome& a, const Outcome& b) {
  for (Index n = 0; n < a.output.size(); ++n) {
    const double x = a.output.values()[n], y = b.output.values()[n];
    if (!(x == y) && !(std::isnan(x) && std::isnan(y))) return true;
  }
  return false;
}

TEST(Zoo, NamesAreUniqueAndPrefixedAndEveryEntryIsDocumented) {
  std::set<std::string> seen;
  int controls = 0;
  for (const Mutant& m : mutant_zoo()) {
    const std::string& n = m.impl->name();
    EXPECT_TRUE(seen.insert(n).second) << n;
    EXPECT_EQ(n.rfind(m.control ? "control:" : "mutant:", 0), 0u) << n;
    EXPECT_FALSE(m.bug.empty()) << n;
    EXPECT_FALSE(m.why_minimal.empty()) << n;
    EXPECT_EQ(find_mutant(n), &m);
    if (m.control) {
      ++controls;
      EXPECT_TRUE(m.killed_by.empty()) << n;
    } else {
      EXPECT_FALSE(m.killed_by.empty()) << n;
      EXPECT_GE(m.minimal_shape.numel(), 1) << n;
    }
  }
  EXPECT_GE(controls, 2);
  EXPECT_GE(mutant_zoo().size() - controls, 10u);
  EXPECT_EQ(find_mutant("mutant:no-such-thing"), nullptr);
}

// All-zero q and k make every score 0: the reference gives query 0 weight 1 on key 0, any mutant that lets
// query 0 see key 1 (or shares key 0's column with query 1) gives it exactly 1/2.
TEST(Zoo, FutureKeyGetsHalfTheWeightWhenScoresAreZero) {
  for (const char* name : {"mutant:mask-zero", "mutant:anti-causal", "mutant:look-ahead", "mutant:softmax-query-axis",
                           "mutant:mask-after-softmax"})
    for (DType t : kDTypes) {
      SCOPED_TRACE(std::string(name) + " at " + std::string(dtype_name(t)));
      const Problem p = make_problem(t, {1, 1, 2, 1}, 2, {0, 0}, {0, 0}, {1, 3});
      const Outcome ref = reference(p), m = run(name, p);
      EXPECT_EQ((*ref.weights)(0, 0, 0, 0), 1.0);
      EXPECT_EQ((*m.weights)(0, 0, 0, 0), 0.5);  // 1/2 is exact in every dtype
    }
}

// Mask applied to one slice: the other head (or batch) puts 1/2 on the future key.
TEST(Zoo, PartlyExpandedMaskLeavesTheOtherSliceUnmasked) {
  for (DType t : kDTypes) {
    const Problem ph = make_problem(t, {1, 2, 2, 1}, 2, {0, 0, 0, 0}, {0, 0, 0, 0}, {1, 3, 1, 3});
    const Outcome mh = run("mutant:mask-head0-only", ph);
    EXPECT_EQ((*mh.weights)(0, 0, 0, 1), 0.0) << "head 0 is masked";
    EXPECT_EQ((*mh.weights)(0, 1, 0, 1), 0.5) << "head 1 is not";
    const Problem pb = make_problem(t, {2, 1, 2, 1}, 2, {0, 0, 0, 0}, {0, 0, 0, 0}, {1, 3, 1, 3});
    const Outcome mb = run("mutant:mask-batch0-only", pb);
    EXPECT_EQ((*mb.weights)(0, 0, 0, 1), 0.0) << "batch 0 is masked";
    EXPECT_EQ((*mb.weights)(1, 0, 0, 1), 0.5) << "batch 1 is not";
    // And at B = 2 (head mutant) or H = 2 (batch mutant) they are right: the axis matters.
    EXPECT_FALSE(outputs_differ(run("mutant:mask-head0-only", pb), reference(pb)));
    EXPECT_FALSE(outputs_differ(run("mutant:mask-batch0-only", ph), reference(ph)));
  }
}

// T = 1, v0 = 2: the only correct output is 2 (weight 1 on key 0).
TEST(Zoo, QueryZeroLosesItsOnlyKey) {
  for (const char* name : {"mutant:diagonal-masked", "mutant:first-row-skipped"})
    for (DType t : kDTypes) {
      SCOPED_TRACE(std::string(name) + " at " + std::string(dtype_name(t)));
      const Problem p = make_problem(t, {1, 1, 1, 1}, 1, {1}, {1}, {2});
      EXPECT_EQ(reference(p).output(0, 0, 0, 0), 2.0);
      const Outcome m = run(name, p);
      EXPECT_EQ(m.output(0, 0, 0, 0), 0.0);
      EXPECT_EQ((*m.weights)(0, 0, 0, 0), 0.0);
    }
}

// A NaN in the future value v1: row 0 of the reference reads only v0; a plain weights·V reads 0·NaN.
TEST(Zoo, PlainProductLetsAFutureNaNIntoRowZero) {
  for (const char* name : {"mutant:additive-nan-leak", "mutant:mask-minus-1e4", "mutant:mask-zero"})
    for (DType t : kDTypes) {
      SCOPED_TRACE(std::string(name) + " at " + std::string(dtype_name(t)));
      const Problem p = make_problem(t, {1, 1, 2, 1}, 2, {1, 1}, {1, 1}, {2, kNaN});
      EXPECT_EQ(reference(p).output(0, 0, 0, 0), 2.0);
      EXPECT_TRUE(std::isnan(run(name, p).output(0, 0, 0, 0)));
    }
}

// -1e4 leaks once a future score beats the visible one by more than ~1e4 - 104 (exp(-104) underflows float):
// q0 = 100, k = (-100, 100), D = 1: scores -1e4 and 1e4, so the future key wins outright (weight 1).
// 100 and -100 are exact in every dtype; the scores are formed in float (or double).
TEST(Zoo, MinusTenThousandLeaksAtLargeScores) {
  for (DType t : kDTypes) {
    const Problem p = make_problem(t, {1, 1, 2, 1}, 2, {100, 0}, {-100, 100}, {1, 3});
    const Outcome m = run("mutant:mask-minus-1e4", p);
    EXPECT_EQ((*m.weights)(0, 0, 0, 1), 1.0) << dtype_name(t);
    EXPECT_EQ(m.output(0, 0, 0, 0), 3.0) << dtype_name(t);
    EXPECT_EQ(reference(p).output(0, 0, 0, 0), 1.0);
  }
}

// The -inf mask mutants loop over the keys their own rule allows, so a future NaN stays out of row 0: their
// one bug is the rule, not a second one hiding in the product.
TEST(Zoo, SelectMaskMutantsKeepAFutureNaNOutOfRowZero) {
  for (const char* name : {"mutant:mask-lowest", "mutant:diagonal-masked", "mutant:mask-head0-only",
                           "mutant:alignment-ignored", "mutant:softmax-query-axis", "mutant:scale-forgotten"}) {
    const Problem p = make_problem(DType::f32, {1, 1, 2, 1}, 2, {1, 1}, {1, 1}, {2, kNaN});
    EXPECT_FALSE(std::isnan(run(name, p).output(0, 0, 0, 0))) << name;
  }
}

// In half the fill is -65504: q0 = 256, k0 = -256 makes the visible score -65536 (formed exactly in float), so
// the masked key 1 at -65504 takes almost all the weight (exp(-32) is left for key 0). float's fill, -3.4e38,
// never loses to a real score.
TEST(Zoo, HalfPrecisionLowestLosesToAVeryNegativeScore) {
  const Problem p16 = make_problem(DType::f16, {1, 1, 1, 1}, 2, {256}, {-256, 0}, {1, 3});
  EXPECT_GT((*run("mutant:mask-lowest", p16).weights)(0, 0, 0, 1), 0.99);
  EXPECT_EQ((*reference(p16).weights)(0, 0, 0, 1), 0.0);
  Problem p32 = p16;
  p32.dtype = DType::f32;
  EXPECT_EQ((*run("mutant:mask-lowest", p32).weights)(0, 0, 0, 1), 0.0);
}

// Bottom-right with T_q = 2 > T_k = 1: query 0 sees nothing. The reference gives it a zero row; a finite
// fill makes the row's max the fill itself, so the masked key gets weight 1 (the output stays 0: the mutant
// mixes values over visible keys only).
TEST(Zoo, FiniteFillGivesAnEmptyRowAMaskedKey) {
  for (DType t : kDTypes) {
    const Problem p = make_problem(t, {1, 1, 2, 1}, 1, {0, 0}, {0}, {5}, CausalAlignment::BottomRight);
    EXPECT_EQ((*reference(p).weights)(0, 0, 0, 0), 0.0);
    const Outcome m = run("mutant:mask-lowest", p);
    EXPECT_EQ((*m.weights)(0, 0, 0, 0), 1.0) << dtype_name(t);
  }
}

// Bottom-right with T_q = 1 < T_k = 2: query 0 sees both keys (zero scores: weights 1/2, output (1+3)/2 = 2);
// the top-left-only mutant lets it see key 0 alone (output 1).
TEST(Zoo, AlignmentIgnoredUsesTopLeftForABottomRightRequest) {
  for (DType t : kDTypes) {
    const Problem p = make_problem(t, {1, 1, 1, 1}, 2, {0}, {0, 0}, {1, 3}, CausalAlignment::BottomRight);
    EXPECT_EQ(reference(p).output(0, 0, 0, 0), 2.0);
    EXPECT_EQ(run("mutant:alignment-ignored", p).output(0, 0, 0, 0), 1.0) << dtype_name(t);
  }
}

// H = 4 query heads over H_kv = 2 kv heads whose values are 1 and 3 (zero scores): heads 0..3 read kv heads
// 0, 0, 1, 1 (outputs 1, 1, 3, 3); h % H_kv reads 0, 1, 0, 1.
TEST(Zoo, KvModuloSwapsTheMiddleHeadsKvHeads) {
  for (DType t : kDTypes) {
    const Problem p = make_problem(t, {1, 4, 1, 1}, 1, {0, 0, 0, 0}, {0, 0}, {1, 3}, kDefaultAlignment, 2);
    const Outcome r = reference(p), m = run("mutant:gqa-kv-modulo", p);
    for (Index h = 0; h < 4; ++h) {
      EXPECT_EQ(r.output(0, h, 0, 0), h < 2 ? 1.0 : 3.0);
      EXPECT_EQ(m.output(0, h, 0, 0), h % 2 ? 3.0 : 1.0) << dtype_name(t) << " head " << h;
    }
  }
}

// A group of 3 (H = 3, H_kv = 1, value 5): every head reads kv head 0 (output 5); h >> floor(log2 3) sends
// head 2 to kv head 1, past the end of K and V (read as zeros: output 0).
TEST(Zoo, PowerOfTwoGroupMathReadsPastTheLastKvHead) {
  for (DType t : kDTypes) {
    const Problem p = make_problem(t, {1, 3, 1, 1}, 1, {0, 0, 0}, {0}, {5}, kDefaultAlignment, 1);
    const Outcome r = reference(p), m = run("mutant:gqa-group-pow2", p);
    for (Index h = 0; h < 3; ++h) EXPECT_EQ(r.output(0, h, 0, 0), 5.0);
    EXPECT_EQ(m.output(0, 1, 0, 0), 5.0) << dtype_name(t);
    EXPECT_EQ(m.output(0, 2, 0, 0), 0.0) << dtype_name(t);
  }
}

// A decode step (one query, bottom-right, zero scores over values 1 and 3) must average both (2). The decode
// mutants see key 0 alone, drop key 1, or read slot 1 as a copy of slot 0: all give 1. On a square call (a full
// prefill: rows 1 and 2) they are right.
TEST(Zoo, DecodeMutantsMissTheNewestKeyButPrefillRight) {
  for (DType t : kDTypes) {
    const Problem step = make_problem(t, {1, 1, 1, 1}, 2, {0}, {0, 0}, {1, 3}, CausalAlignment::BottomRight);
    const Problem prefill = make_problem(t, {1, 1, 2, 1}, 2, {0, 0}, {0, 0}, {1, 3}, CausalAlignment::BottomRight);
    EXPECT_EQ(reference(step).output(0, 0, 0, 0), 2.0);
    for (const char* name : {"mutant:decode-top-left", "mutant:decode-drops-newest", "mutant:decode-cache-off-by-one"}) {
      EXPECT_EQ(run(name, step).output(0, 0, 0, 0), 1.0) << name << " at " << dtype_name(t);
      const Outcome o = run(name, prefill);
      EXPECT_EQ(o.output(0, 0, 0, 0), 1.0) << name << " at " << dtype_name(t);
      EXPECT_EQ(o.output(0, 0, 1, 0), 2.0) << name << " at " << dtype_name(t);
    }
  }
}

// A prefill chunk of two queries over three keys (values 1, 3, 5; zero scores): rows see keys 0..1 and 0..2
// (outputs 2 and 3). Masked from position 0 they see 0 and 0..1 (1 and 2); a decode step stays right.
TEST(Zoo, ChunkMaskedFromZeroMissesTheEarlierChunksKeys) {
  for (DType t : kDTypes) {
    const Problem chunk = make_problem(t, {1, 1, 2, 1}, 3, {0, 0}, {0, 0, 0}, {1, 3, 5}, CausalAlignment::BottomRight);
    const Outcome r = reference(chunk), m = run("mutant:chunk-masked-from-zero", chunk);
    EXPECT_EQ(r.output(0, 0, 0, 0), 2.0);
    EXPECT_EQ(r.output(0, 0, 1, 0), 3.0);
    EXPECT_EQ(m.output(0, 0, 0, 0), 1.0) << dtype_name(t);
    EXPECT_EQ(m.output(0, 0, 1, 0), 2.0) << dtype_name(t);
    const Problem step = make_problem(t, {1, 1, 1, 1}, 3, {0}, {0, 0, 0}, {1, 3, 5}, CausalAlignment::BottomRight);
    EXPECT_EQ(run("mutant:chunk-masked-from-zero", step).output(0, 0, 0, 0), 3.0) << dtype_name(t);
  }
}

// One score of 32·32 = 1024 (D = 1, scale 1): exp(1024) overflows float and double, Inf/Inf = NaN.
TEST(Zoo, NoMaxSubtractionOverflowsToNaN) {
  for (DType t : kDTypes) {
    const Problem p = make_problem(t, {1, 1, 1, 1}, 1, {32}, {32}, {1});
    EXPECT_EQ(reference(p).output(0, 0, 0, 0), 1.0);
    const Outcome m = run("mutant:no-max-subtraction", p);
    EXPECT_TRUE(std::isnan((*m.weights)(0, 0, 0, 0))) << dtype_name(t);
    EXPECT_TRUE(std::isnan(m.output(0, 0, 0, 0))) << dtype_name(t);
  }
}

// D = 2, q1 = (1,1), k = ((0,0),(1,1)): query 1's scores are 0 and 2·scale. The correct scale 1/√2 gives
// key 1 the weight σ(√2); scale 1 gives σ(2) and 1/D gives σ(1). At D = 1 all three scales agree.
TEST(Zoo, WrongDefaultScaleChangesTheWeights) {
  const auto sigmoid = [](double x) { return 1 / (1 + std::exp(-x)); };
  const std::pair<const char*, double> cases[] = {{"mutant:scale-forgotten", 2.0}, {"mutant:scale-one-over-d", 1.0}};
  for (const auto& [name, score] : cases) {
    const Problem p = make_problem(DType::f64, {1, 1, 2, 2}, 2, {0, 0, 1, 1}, {0, 0, 1, 1}, {1, 1, 3, 3});
    EXPECT_NEAR((*reference(p).weights)(0, 0, 1, 1), sigmoid(std::sqrt(2.0)), 1e-15);
    EXPECT_NEAR((*run(name, p).weights)(0, 0, 1, 1), sigmoid(score), 1e-15) << name;
    const Problem d1 = make_problem(DType::f64, {1, 1, 2, 1}, 2, {0, 1}, {0, 1}, {1, 3});
    EXPECT_FALSE(outputs_differ(run(name, d1), reference(d1))) << name << " must be right at D = 1";
    Problem given = p;
    given.scale = 0.5;  // an explicit scale is honoured
    EXPECT_FALSE(outputs_differ(run(name, given), reference(given))) << name;
  }
  // Rows for columns: T_k = 2, D = 1, q1 = k1 = 1: scale 1/√2 instead of 1.
  const Problem p = make_problem(DType::f64, {1, 1, 2, 1}, 2, {0, 1}, {0, 1}, {1, 3});
  EXPECT_NEAR((*reference(p).weights)(0, 0, 1, 1), sigmoid(1.0), 1e-15);
  EXPECT_NEAR((*run("mutant:scale-rows-for-cols", p).weights)(0, 0, 1, 1), sigmoid(1 / std::sqrt(2.0)), 1e-15);
}

// H = 2, T = 2, D = 1, zero scores, v = (1,3 | 5,7) in [B,H,T,D] memory. The [B,T,H,D] reader sees head 0's
// values as memory 0 and 2 (1 and 5): its query 1 averages them to 3 and writes the result at memory 2,
// which is head 1's query 0, whose correct output is 5.
TEST(Zoo, LayoutMutantMixesHeadsWhenHAndTExceedOne) {
  for (DType t : kDTypes) {
    const Problem p = make_problem(t, {1, 2, 2, 1}, 2, {0, 0, 0, 0}, {0, 0, 0, 0}, {1, 3, 5, 7});
    EXPECT_EQ(reference(p).output(0, 1, 0, 0), 5.0);
    EXPECT_EQ(run("mutant:layout-bthd", p).output(0, 1, 0, 0), 3.0) << dtype_name(t);
    const Problem one_head = make_problem(t, {2, 1, 2, 1}, 2, {0, 0, 0, 0}, {0, 0, 0, 0}, {1, 3, 5, 7});
    EXPECT_FALSE(outputs_differ(run("mutant:layout-bthd", one_head), reference(one_head)));
  }
}

// The same call twice: the second adds onto the first's sums (v0 = 2, T = 1: 2, then 4 — or more, if an
// earlier call of the same size already left something behind).
TEST(Zoo, StaleAccumulatorAnswersARepeatedCallDifferently) {
  for (DType t : kDTypes) {
    const Problem p = make_problem(t, {1, 1, 1, 1}, 1, {1}, {1}, {2});
    const double first = run("mutant:stale-accumulator", p).output(0, 0, 0, 0);
    const double second = run("mutant:stale-accumulator", p).output(0, 0, 0, 0);
    EXPECT_EQ(second - first, 2.0) << dtype_name(t);
  }
}

// The tiled family (key tiles of 16, split-K chunks of 32) at each mutant's minimal case: one query (T_q = 1,
// bottom-right) over T_k keys with D = 1; k and v are 0 except where given, q = 1.
Problem one_query(DType t, Index T_k, std::vector<std::pair<Index, double>> k, std::vector<std::pair<Index, double>> v) {
  std::vector<double> kk(std::size_t(T_k), 0.0), vv(std::size_t(T_k), 0.0);
  for (const auto& [j, x] : k) kk[std::size_t(j)] = x;
  for (const auto& [j, x] : v) vv[std::size_t(j)] = x;
  return make_problem(t, {1, 1, 1, 1}, T_k, {1}, kk, vv, CausalAlignment::BottomRight);
}

// Key 16 scores 1, the 16 keys before it 0, and only v16 = 1: the output is its weight e/(16+e). Skipping the
// second key tile gives 0; the inverted rescale multiplies the first tile's sum by e instead of 1/e, giving
// 1/(16e+1). With T_k = 16 (one tile) neither mistake can show.
TEST(Zoo, TiledMutantsGoWrongOnlyOnceAQuerySeesTwoKeyTiles) {
  const double e = std::exp(1.0);
  const Problem p = one_query(DType::f64, 17, {{16, 1}}, {{16, 1}});
  EXPECT_NEAR(reference(p).output(0, 0, 0, 0), e / (16 + e), 1e-15);
  EXPECT_EQ(run("mutant:tiled-key-step", p).output(0, 0, 0, 0), 0.0);
  EXPECT_NEAR(run("mutant:tiled-inverted-rescale", p).output(0, 0, 0, 0), 1 / (16 * e + 1), 1e-15);
  const Problem one_tile = one_query(DType::f64, 16, {{15, 1}}, {{15, 1}});
  for (const char* name : {"mutant:tiled-key-step", "mutant:tiled-inverted-rescale"})
    EXPECT_NEAR(run(name, one_tile).output(0, 0, 0, 0), reference(one_tile).output(0, 0, 0, 0), 1e-15) << name;
}

// The first key tile scores 1000 and key 16 scores 0 (every v = 1, so the right output is 1): a running max
// taken from the second tile alone rescales by exp(1000), which overflows in float and double alike.
TEST(Zoo, TiledLocalMaxOverflowsWhenALaterTileScoresFarLower) {
  for (DType t : kDTypes) {
    std::vector<std::pair<Index, double>> k, v;
    for (Index j = 0; j < 17; ++j) {
      if (j < 16) k.emplace_back(j, 1000);
      v.emplace_back(j, 1);
    }
    const Problem p = one_query(t, 17, k, v);
    EXPECT_EQ(reference(p).output(0, 0, 0, 0), 1.0);
    EXPECT_TRUE(std::isnan(run("mutant:tiled-local-max", p).output(0, 0, 0, 0))) << dtype_name(t);
  }
}

// All scores 0 over 33 keys and only v32 = 33: the right output is 1; the split-K chunk count rounded down
// (33 / 32 = 1) never reads key 32 and gives 0. At T_k = 32 or 64 nothing is dropped.
TEST(Zoo, TiledSplitTailDropsTheKeysAfterTheLastFullChunk) {
  for (DType t : kDTypes) {
    const Problem p = one_query(t, 33, {}, {{32, 33}});
    EXPECT_EQ(reference(p).output(0, 0, 0, 0), 1.0) << dtype_name(t);
    EXPECT_EQ(run("mutant:tiled-split-tail", p).output(0, 0, 0, 0), 0.0) << dtype_name(t);
    const Problem even = one_query(t, 64, {}, {{63, 64}});
    EXPECT_EQ(run("mutant:tiled-split-tail", even).output(0, 0, 0, 0), reference(even).output(0, 0, 0, 0));
  }
}

// H = 2, T = 1, zero scores, v = (1 | 2): head 0's last query tile also computes its out-of-range row 1 (head
// 1's query, head 0's key) and stores it over head 1's row 0, which becomes 1 instead of 2. With H = 1 the
// spill lands past the end, where nothing reads it.
TEST(Zoo, TiledSpillRowsOverwritesTheNextHead) {
  for (DType t : kDTypes) {
    const Problem p = make_problem(t, {1, 2, 1, 1}, 1, {0, 0}, {0, 0}, {1, 2});
    EXPECT_EQ(reference(p).output(0, 1, 0, 0), 2.0);
    EXPECT_EQ(run("mutant:tiled-spill-rows", p).output(0, 1, 0, 0), 1.0) << dtype_name(t);
    const Problem one_head = make_problem(t, {1, 1, 1, 1}, 1, {0}, {0}, {2});
    EXPECT_FALSE(outputs_differ(run("mutant:tiled-spill-rows", one_head), reference(one_head)));
  }
}

// Deterministic inputs that exercise several tiles (T up to 7 with tiles of 3), T_q != T_k, both alignments.
struct OracleCase {
  Shape q;
  Index T_k;
  CausalAlignment a;
};
const OracleCase kOracleCases[] = {{{1, 1, 1, 1}, 1, CausalAlignment::TopLeft},
                                   {{2, 3, 7, 5}, 7, CausalAlignment::TopLeft},
                                   {{1, 2, 4, 3}, 7, CausalAlignment::BottomRight},
                                   {{1, 2, 6, 3}, 2, CausalAlignment::BottomRight},
                                   {{1, 1, 5, 8}, 3, CausalAlignment::TopLeft},
                                   // Past the tiled family's tiles: query tiles of 32, key tiles of 16, chunks of 32.
                                   {{1, 2, 40, 3}, 40, CausalAlignment::TopLeft},
                                   {{1, 1, 5, 2}, 70, CausalAlignment::BottomRight}};

// Entries where `impl` leaves the core's derived tolerance around the float64 oracle, plus future weights that
// are not exactly 0, on one case at one dtype. Values come from a fixed formula, rounded to the dtype (so the
// oracle sees what the kernel sees).
int oracle_violations(const Implementation& impl, DType t, const OracleCase& c) {
  const auto fill = [&](Shape s, double phase) {
    Tensor<double> x(s);
    for (Index n = 0; n < x.size(); ++n)
      x.values()[n] =
          visit_dtype(t, [&](auto tag) { return double(decltype(tag)(3 * std::sin(0.7 * double(n) + phase))); });
    return x;
  };
  Problem p;
  p.dtype = t;
  p.alignment = c.a;
  p.q = fill(c.q, 0.1);
  p.k = fill({c.q.B, c.q.H, c.T_k, c.q.D}, 1.3);
  p.v = fill({c.q.B, c.q.H, c.T_k, c.q.D}, 2.9);
  const Outcome o = impl.forward(p);
  Tensor<double> ow(Shape{1, 1, 1, 1});
  const Tensor<double> oo = oracle(p.q, p.k, p.v, AttentionOptions{.scale = {}, .alignment = c.a}, &ow);
  const BoolMask mask = BoolMask::causal(c.q.T, c.T_k, c.a);
  const double scale = 1 / std::sqrt(double(c.q.D));
  int bad = 0;
  for (Index b = 0; b < c.q.B; ++b)
    for (Index h = 0; h < c.q.H; ++h) {
      const HeadTolerance tol =
          head_tolerance(t, p.q.head(b, h), p.k.head(b, h), p.v.head(b, h), mask, scale, oo.head(b, h), ow.head(b, h));
      for (Index i = 0; i < c.q.T; ++i) {
        // A row that sees no key follows the implementation's convention (empty-row-convention checks it): an
        // all-NaN row is the nan convention, fine unless the implementation declares zero.
        if (!mask.array().row(i).any() && impl.capabilities().empty_rows != EmptyRows::zero &&
            o.output.head(b, h).row(i).array().isNaN().all())
          continue;
        for (Index d = 0; d < c.q.D; ++d) bad += !(std::abs(o.output(b, h, i, d) - oo(b, h, i, d)) <= tol.output(i, d));
        for (Index j = 0; j < c.T_k && o.weights; ++j) {  // a flash kernel returns none
          bad += !(std::abs((*o.weights)(b, h, i, j) - ow(b, h, i, j)) <= tol.weights(i, j));
          bad += !mask.visible(i, j) && (*o.weights)(b, h, i, j) != 0.0;  // exact, not small
        }
      }
    }
  return bad;
}

// Controls against the float64 oracle, within the core's derived tolerance, at every dtype.
// A split-KV case: q = 49 against 33 keys of 85.19 (float32, D = 1, scores about 4,174). The LSE of each
// split of 16 keys is rounded in float, so the control's weights sum to 1 only within that rounding (more than the
// old row-sum bound, 8e-6, allowed), and the weight-dependent laws hold.
TEST(Zoo, SplitKvWeightsCarryTheirLogSumExpRoundingAndTheLawsAllowIt) {
  std::vector<double> k(33, double(float(85.19))), v(33);
  for (Index j = 0; j < 33; ++j) v[std::size_t(j)] = double(j % 5);
  LawCase c;
  c.problem = make_problem(DType::f32, {1, 1, 1, 1}, 33, {49}, k, v, CausalAlignment::BottomRight);
  const Outcome o = run("control:split-kv-lse", c.problem);
  double sum = 0;
  for (Index j = 0; j < 33; ++j) sum += (*o.weights)(0, 0, 0, j);
  EXPECT_GT(std::abs(sum - 1), 1e-5) << "the float log-sum-exp should show in the row sum (" << sum << ")";
  const Implementation& impl = *find_mutant("control:split-kv-lse")->impl;
  for (const char* law : {"row-stochastic", "convex-hull", "oracle-agreement"}) {
    const auto v = find_law(law)->check(impl, c).violation;
    EXPECT_FALSE(v) << law << ": " << v->message;
  }
}

// A nan-convention case: bottom-right, T_q = 2 > T_k = 1 (query 0 sees no key), dO = [0, 1]. The oracle's
// dk is 0 and dv is 1; the control's NaN stays in query 0's dQ (accepted), the mutant's reaches dk and dv.
TEST(Zoo, NanConventionBackwardKeepsTheEmptyRowsNanOutOfDkAndDv) {
  LawCase c;
  c.problem = make_problem(DType::f32, {1, 1, 2, 1}, 1, {1, 2}, {1}, {1}, CausalAlignment::BottomRight);
  c.problem.d_output = Tensor<double>({1, 1, 2, 1}, Eigen::Vector2d(0, 1));
  const Gradients ok = find_mutant("control:grad-nan-rows")->impl->backward(c.problem);
  EXPECT_TRUE(std::isnan(ok.dq(0, 0, 0, 0)));
  EXPECT_EQ(ok.dk(0, 0, 0, 0), 0);
  EXPECT_EQ(ok.dv(0, 0, 0, 0), 1);
  const Law& oracle = *find_law("grad-oracle");
  const auto held = oracle.check(*find_mutant("control:grad-nan-rows")->impl, c).violation;
  EXPECT_FALSE(held) << held->message;
  const auto v = oracle.check(*find_mutant("mutant:grad-nan-row-leak")->impl, c).violation;
  ASSERT_TRUE(v);
  EXPECT_TRUE(v->quantity == "dk" || v->quantity == "dv") << v->message;
  EXPECT_NE(v->message.find("nan"), std::string::npos) << v->message;
}

// The controls of the exact laws' false alarms each really differ from the reference the way they claim, and the law
// that once demanded bit-identity there holds. Inputs are small multiples of 1/4: exact in float32.
double quarter(int trial, Index n) { return double(((trial * 7919 + int(n) * 104729) % 17) - 8) / 4.0; }
Problem quarters(int trial, Shape qs, Index T_k) {
  std::vector<double> q(std::size_t(qs.numel())), k(std::size_t(qs.B * qs.H * T_k * qs.D)), v(k.size());
  for (std::size_t n = 0; n < q.size(); ++n) q[n] = quarter(trial, Index(n));
  for (std::size_t n = 0; n < k.size(); ++n) k[n] = quarter(trial + 1000, Index(n)), v[n] = quarter(trial + 2000, Index(n));
  return make_problem(DType::f32, qs, T_k, q, k, v);
}
bool same_bits(const Tensor<double>& a, const Tensor<double>& b) {
  return std::memcmp(a.values().data(), b.values().data(), sizeof(double) * std::size_t(a.size())) == 0;
}

// A row that sees no key (bottom-right, T_q = 2 > T_k = 1: query 0) is 0 · v0 in FlashAttention's reference: -0 for
// v0 < 0. Changing v0 (in query 0's future) flips the zero's sign, and causal-perturbation must not call that a leak.
TEST(Zoo, SignedZerosControlReturnsMinusZeroAndCausalPerturbationAcceptsIt) {
  const Implementation& impl = *find_mutant("control:signed-zeros")->impl;
  LawCase c;
  c.problem = make_problem(DType::f32, {1, 1, 2, 1}, 1, {1, 2}, {1}, {-1}, CausalAlignment::BottomRight);
  const Outcome o = impl.forward(c.problem);
  EXPECT_EQ(o.output(0, 0, 0, 0), 0);
  EXPECT_TRUE(std::signbit(o.output(0, 0, 0, 0))) << "the control should return -0 there";
  EXPECT_FALSE(std::signbit(reference(c.problem).output(0, 0, 0, 0)));
  Problem later = c.problem;
  later.v(0, 0, 0, 0) = 3;  // key 0 is after position t = 0's last key (none): its future
  EXPECT_FALSE(std::signbit(impl.forward(later).output(0, 0, 0, 0)));
  c.variant = later;
  c.params["t"] = 0;
  const auto v = find_law("causal-perturbation")->check(impl, c).violation;
  EXPECT_FALSE(v) << v->message;
}

// Sinks of -inf as a softmax column: the row sums T_k + 1 terms, grouped otherwise than T_k, so some case differs from
// the call without sinks in its bits; sink-mass and neutral-modifiers hold on it.
TEST(Zoo, SinkColumnControlDiffersFromNoSinksAndTheSinkLawsAcceptIt) {
  const Implementation& impl = *find_mutant("control:sink-column")->impl;
  int differing = 0;
  for (int trial = 0; trial < 40 && differing < 3; ++trial) {
    LawCase c;
    c.problem = quarters(trial, {1, 1, 6, 2}, 6);
    c.problem.want_weights = false;
    Problem minus_inf = c.problem;
    minus_inf.sinks = {-std::numeric_limits<double>::infinity()};
    if (same_bits(impl.forward(c.problem).output, impl.forward(minus_inf).output)) continue;
    ++differing;
    c.problem.sinks = {0.5};
    for (const char* law : {"sink-mass", "neutral-modifiers"}) {
      const auto v = find_law(law)->check(impl, c).violation;
      EXPECT_FALSE(v) << law << " at trial " << trial << ": " << v->message;
    }
  }
  EXPECT_GT(differing, 0) << "no case where sinks of -inf and no sinks differ: the control shows nothing";
}

// Pages walked in physical order: reversing the pages reorders the sum, so some case differs in its bits;
// page-permutation holds on it.
TEST(Zoo, PhysicalOrderPagingDiffersAfterAPermutationAndPagePermutationAcceptsIt) {
  const Implementation& impl = *find_mutant("control:paged-physical-order")->impl;
  int differing = 0;
  for (int trial = 0; trial < 40 && differing < 3; ++trial) {
    LawCase c;
    c.problem = quarters(trial, {1, 1, 7, 2}, 7);
    c.problem.want_weights = false;
    c.problem.paged = PagedPlan{.page_size = 1};
    Problem moved = c.problem;
    moved.paged->order = PagedPlan::Order::reversed;
    if (same_bits(impl.forward(c.problem).output, impl.forward(moved).output)) continue;
    ++differing;
    c.variant = moved;
    const auto v = find_law("page-permutation")->check(impl, c).violation;
    EXPECT_FALSE(v) << "trial " << trial << ": " << v->message;
  }
  EXPECT_GT(differing, 0) << "no case where the physical order changes the bits: the control shows nothing";
}

// A layout-invariant kernel without weights, probed: under V-is-K the one-hot probes must not go through K's memory,
// so the probed weights are the reference's, and layout-invariance holds.
TEST(Zoo, ProbedWeightsNeverGoThroughALayoutThatHidesV) {
  const Implementation& impl = *find_mutant("control:strided-probed-weights")->impl;
  ASSERT_TRUE(impl.capabilities().weights_probed && impl.capabilities().declares(Feature::layout_invariant));
  LawCase c;
  c.problem = quarters(3, {1, 1, 3, 2}, 3);
  c.problem.v = c.problem.k;
  Problem laid = c.problem;
  laid.layout = InputLayout::v_is_k;
  const Outcome ref = reference(c.problem), got = impl.forward(laid);
  ASSERT_TRUE(got.weights);
  EXPECT_TRUE(same_bits(*ref.weights, *got.weights));
  c.variant = laid;
  const auto v = find_law("layout-invariance")->check(impl, c).violation;
  EXPECT_FALSE(v) << v->message;
}

// A correct backward under flush-to-zero at D = 6, one query over two keys (bottom-right): P_1 = e^-81.6 = 3.5e-36,
// dS_1 = P_1·dO·v_1 = 2.7e-38 is normal, but scale·dS_1 = 0.94·2^-126 is not, so the control's dK of key 1 is 0
// where the oracle's is 1.4e-36 = 0.94·2^-126·|q| (more than the ν·scale·|q| a flushed dS alone would cost):
// grad-oracle's floor covers the flushed partial times what it multiplies (backward.cpp step 9b).
TEST(Zoo, FlushedPartialProductTimesWhatItMultipliesIsWithinTheGradientBound) {
  LawCase c;
  c.problem = make_problem(DType::f32, {1, 1, 1, 6}, 2, {128, 0, 0, 0, 0, 0},
                           {0, 0, 0, 0, 0, 0, -1.5625, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0},
                           CausalAlignment::BottomRight);
  c.problem.d_output = Tensor<double>({1, 1, 1, 6}, Eigen::VectorXd(Eigen::VectorXd::Unit(6, 0) / 128));
  const Implementation& impl = *find_mutant("control:ftz")->impl;
  const Gradients g = impl.backward(c.problem);
  const GradientCheck oracle = gradient_check(DType::f32, c.problem.q, c.problem.k, c.problem.v,
                                              *c.problem.d_output, c.problem.options(), 2.0);
  const double nu = std::ldexp(1.0, -126), scale = 1 / std::sqrt(6.0);
  EXPECT_EQ(g.dk(0, 0, 1, 0), 0) << "the control should flush scale·dS there";
  EXPECT_GT(std::abs(oracle.oracle.dk(0, 0, 1, 0)), 2 * scale * nu * 128) << "the flushed term should exceed ν·scale·|q|";
  const auto v = find_law("grad-oracle")->check(impl, c).violation;
  EXPECT_FALSE(v) << v->message;
}

TEST(Zoo, ControlsAgreeWithTheOracleWithinTheDerivedTolerance) {
  for (const Mutant& m : mutant_zoo()) {
    if (!m.control) continue;
    for (DType t : kDTypes)
      for (const OracleCase& c : kOracleCases)
        EXPECT_EQ(oracle_violations(*m.impl, t, c), 0)
            << m.impl->name() << " at " << dtype_name(t) << " q " << to_string(c.q) << " T_k " << c.T_k;
  }
}

// The same comparison is not blind: it flags a mutant whose error is a wrong scale (every case with D > 1 and a
// query that weighs two keys), and a reversed mask.
TEST(Zoo, TheOracleComparisonFlagsMutants) {
  for (const char* name : {"mutant:scale-forgotten", "mutant:anti-causal"})
    for (DType t : kDTypes) {
      int bad = 0;
      for (const OracleCase& c : kOracleCases) bad += oracle_violations(*find_mutant(name)->impl, t, c);
      EXPECT_GT(bad, 0) << name << " at " << dtype_name(t);
    }
}

// The kill test and matrix show the smallest counterexample: fewest q then k elements, then fewest options,
// then fewest nonzero inputs, then the largest margin, then the first.
TEST(SmallestCounterexample, ordersBySizeThenOptionsThenNonzeroInputsThenMargin) {
  const auto result = [](const std::string& law, Problem p, double magnitude, double tolerance) {
    LawResult r;
    r.law = law;
    r.status = LawStatus::falsified;
    r.minimal_case = LawCase{.problem = std::move(p), .variant = {}, .params = {}, .tags = {}};
    Violation v;
    v.magnitude = magnitude;
    v.tolerance = tolerance;
    r.violation = v;
    return r;
  };
  const Problem small = make_problem(DType::f32, {1, 1, 1, 1}, 1, {0}, {0}, {0});
  const Problem big = make_problem(DType::f32, {1, 1, 2, 1}, 2, {0, 0}, {0, 0}, {0, 0});
  const Problem nonzero = make_problem(DType::f32, {1, 1, 1, 1}, 1, {3}, {0}, {0});
  Problem windowed = small;
  windowed.window = 0;

  EXPECT_EQ(smallest_counterexample({}), nullptr);
  std::vector<LawResult> rs{result("big", big, 1, 0), result("small", small, 1, 1)};
  EXPECT_EQ(smallest_counterexample(rs)->law, "small");  // size before margin (exact beats 1x)
  rs = {result("windowed", windowed, 1, 0), result("plain", small, 2, 1)};
  EXPECT_EQ(smallest_counterexample(rs)->law, "plain");  // no option before margin
  rs = {result("nonzero", nonzero, 1, 0), result("zeros", small, 2, 1)};
  EXPECT_EQ(smallest_counterexample(rs)->law, "zeros");  // fewer nonzero inputs before margin
  rs = {result("2x", small, 2, 1), result("8x", small, 8, 1), result("8x again", small, 8, 1)};
  EXPECT_EQ(smallest_counterexample(rs)->law, "8x");  // then the largest margin, then the first
  rs[1].status = LawStatus::held;
  EXPECT_EQ(smallest_counterexample(rs)->law, "8x again");  // only falsified laws count
}

}  // namespace
}  // namespace attncheck

namespace attncheck {
namespace {

// Every zoo entry runs on drawn cases of everything it declares (its families, padding, paging, the LSE, a
// backward when it has one), at every dtype: the sanitizer stage's check of the zoo's own code (an out-of-range
// read in a kernel would make a kill depend on memory), where the kill tests, whose question is the default
// build's, do not run. Each entry is called on every case; whether a law would hold is not asked.
TEST(Zoo, everyEntryRunsOnDrawnCasesOfWhatItDeclares) {
  Law exercise{.name = "exercise",
               .summary = "calls the implementation",
               .why = "sanitizer coverage",
               .doc = {},
               .not_applicable = [](const GenConfig&) { return std::string(); },
               .gen = [](const GenConfig& cfg) { return gen_problem(cfg); },
               .check = [](const Implementation& impl, const LawCase& c) -> std::optional<Violation> {
                 impl.forward(c.problem);
                 return std::nullopt;
               }};
  Law backward = exercise;
  backward.gen = [](const GenConfig& cfg) { return gen_gradient_case(cfg); };
  backward.check = [](const Implementation& impl, const LawCase& c) -> std::optional<Violation> {
    impl.backward(c.problem);
    return std::nullopt;
  };
  for (const Mutant& m : mutant_zoo())
    for (const DType t : kDTypes) {
      if (!m.impl->capabilities().supports(t)) continue;
      RunOptions o;
      o.cases = 6;
      o.gen.dtype = t;
      o.gen.max_T = 24;
      for (const Law* law : {&exercise, &backward}) {
        if (law == &backward && !m.impl->capabilities().declares(Feature::backward)) continue;
        const LawResult r = run_law(*law, *m.impl, o);
        // A mutant may fail a call (an error status, a wrong size): it was still called, and ran to the end.
        EXPECT_GE(r.calls, r.status == LawStatus::held ? 6 : 1) << m.impl->name() << " at " << dtype_name(t);
      }
    }
}

}  // namespace
}  // namespace attncheck
