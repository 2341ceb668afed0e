// Laws on long contexts (more than 2^22 weights): the streamed oracle and the sampled weights hold on the
// reference at every dtype, and each sampled check still catches the bug it is there for.
#include <gtest/gtest.h>

#include <array>
#include <cmath>

#include "attncheck/generators.hpp"
#include "attncheck/law.hpp"

namespace attncheck {
namespace {

// B=1, H=1, T=2100: 4.41e6 weights, just past the long-context threshold, yet cheap at D=4.
constexpr Index kT = 2100, kD = 4;

LawCase long_case(DType dtype, std::uint64_t seed) {
  LawCase c;
  Problem& p = c.problem;
  p.dtype = dtype;
  const auto draw = [&](double phase) {
    Tensor<double> t({1, 1, kT, kD});
    for (Index n = 0; n < t.size(); ++n)
      t.values()[n] = round_to(dtype, 2 * std::sin(1.37 * double(n) + phase + double(seed)));
    return t;
  };
  p.q = draw(0.3);
  p.k = draw(1.1);
  p.v = draw(2.0);
  return c;
}

LawCase with_shifted_keys(LawCase c) {
  Problem v = c.problem;
  for (Index j = 0; j < kT; ++j)
    for (Index d = 0; d < kD; ++d) v.k(0, 0, j, d) = round_to(v.dtype, v.k(0, 0, j, d) + 0.75 * double(d + 1));
  c.variant = v;
  return c;
}

std::optional<Violation> check(const std::string& law, const Implementation& impl, const LawCase& c) {
  const Law* l = find_law(law);
  if (!l) throw std::logic_error("no law " + law);
  return evaluate_case(*l, impl, c);
}

const std::vector<std::string> kWeightLaws = {"row-stochastic", "zero-future-weight", "oracle-agreement"};

TEST(LongContext, referenceHoldsTheSampledLawsAtEveryDtype) {
  for (const DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    const LawCase c = with_shifted_keys(long_case(dt, 1));
    for (const std::string& law : kWeightLaws) {
      const auto v = check(law, *reference_implementation(), c);
      EXPECT_FALSE(v) << law << " at " << dtype_name(dt) << ": " << v->message;
    }
    const auto v = check("shift-invariance", *reference_implementation(), c);
    EXPECT_FALSE(v) << "shift-invariance at " << dtype_name(dt) << ": " << v->message;
    for (const std::string law : {"convex-hull", "first-position", "determinism"})
      EXPECT_FALSE(check(law, *reference_implementation(), c)) << law;
  }
}

// The same core with every key visible: future keys get weight, which the sampled keys see.
ImplementationPtr sees_the_future() {
  return make_implementation("test:no-mask", "no causal mask", reference_implementation()->capabilities(),
                             [](const Problem& p) {
                               return run_typed(p, [](const auto& q, const auto& k, const auto& v, const Problem&,
                                                      auto* w) {
                                 return attention(q, k, v, BoolMask::full(q.shape().T, k.shape().T), {}, w);
                               });
                             });
}

// The reference with every output scaled by 1.01: rows sum to 1.01.
ImplementationPtr scaled_outputs() {
  return make_implementation("test:scaled", "outputs times 1.01", reference_implementation()->capabilities(),
                             [](const Problem& p) {
                               Outcome o = reference_implementation()->forward(p);
                               o.output.values() *= 1.01;
                               return o;
                             });
}

TEST(LongContext, sampledChecksCatchTheirBugs) {
  const LawCase c = long_case(DType::f32, 2);
  const auto leak = check("zero-future-weight", *sees_the_future(), c);
  ASSERT_TRUE(leak);
  EXPECT_NE(leak->message.find("weights sampled at keys"), std::string::npos) << leak->message;
  EXPECT_GT(leak->worst_index[3], leak->worst_index[2]) << "the leak is on a future key";
  const auto agreement = check("oracle-agreement", *sees_the_future(), c);
  ASSERT_TRUE(agreement);
  const auto sums = check("row-stochastic", *scaled_outputs(), c);
  ASSERT_TRUE(sums);
  EXPECT_NEAR(sums->magnitude, 0.01, 1e-4) << sums->message;
}

// Every law, drawn cases included (GQA, padding, windows), runs on long contexts: none asks for [T_q,T_k] it
// cannot get, and the reference holds each one that applies. The gradient laws apply too (their oracle backward
// and its bound are streamed); at float32 only grad-finite-difference does not, being float64 only.
TEST(LongContext, everyLawHoldsOnTheReferenceOrSaysWhyNot) {
  RunOptions o;
  o.cases = 2;
  o.gen.min_T = kT;
  o.gen.max_T = o.gen.max_T_tail = kT;
  o.gen.max_B = 1;
  o.gen.max_H = 2;
  o.gen.max_D = kD;
  int held = 0;
  for (const Law& law : laws()) {
    const LawResult r = run_law(law, *reference_implementation(), o);
    EXPECT_NE(r.status, LawStatus::falsified) << describe(r);
    if (r.status == LawStatus::held) ++held;
    if (law.name.rfind("grad-", 0) == 0) {
      if (law.name == "grad-finite-difference") {
        EXPECT_EQ(r.status, LawStatus::not_applicable) << describe(r);
        EXPECT_NE(r.note.find("float64 only"), std::string::npos) << r.note;
      } else if (law.name == "grad-bias") {  // a bias per cell of T = 2100 is past the 2^18 cells a case holds
        EXPECT_EQ(r.status, LawStatus::not_applicable) << describe(r);
        EXPECT_NE(r.note.find("T >= 2100"), std::string::npos) << r.note;
      } else {
        EXPECT_EQ(r.status, LawStatus::held) << describe(r);
        EXPECT_EQ(r.cases_run, 2) << law.name;
      }
    }
  }
  EXPECT_GE(held, 20);
}

// A pinned long shape (what `attncheck check --shape 1,1,16384,16384,64` runs, here just past the threshold) at
// float64: every gradient law applies and holds on the reference, grad-finite-difference included, and
// grad-dv-weights says which keys it sampled; grad-bias and grad-dropout-mask say why they do not apply (a bias per
// cell of a long context is past the 2^18 cells a case holds; dropout is checked on the materialised path, up to 2^18
// weights).
TEST(LongContext, gradientLawsHoldAtAPinnedLongShape) {
  RunOptions o;
  o.cases = 1;
  o.gen.dtype = DType::f64;
  o.gen.shape = std::array<Index, 5>{1, 1, kT, kT, kD};
  ASSERT_GT(double(kT) * double(kT), kMaterialisedWeights);
  int grad_laws = 0;
  for (const Law& law : laws()) {
    if (law.name.rfind("grad-", 0) != 0) continue;
    const LawResult r = run_law(law, *reference_implementation(), o);
    if (law.name == "grad-bias") {
      EXPECT_EQ(r.status, LawStatus::not_applicable) << describe(r);
      EXPECT_NE(r.note.find("2^18 cells"), std::string::npos) << r.note;
      continue;
    }
    if (law.name == "grad-dropout-mask") {
      EXPECT_EQ(r.status, LawStatus::not_applicable) << describe(r);
      EXPECT_NE(r.note.find("2^18 weights"), std::string::npos) << r.note;
      continue;
    }
    ++grad_laws;
    EXPECT_EQ(r.status, LawStatus::held) << describe(r);
    EXPECT_EQ(r.cases_run, 1) << law.name;
    if (law.name == "grad-dv-weights") {
      EXPECT_NE(r.note.find("dV compared at the sampled keys only; long context"), std::string::npos) << r.note;
    }
    if (law.name == "grad-oracle") {  // what it compared, in the result: not every row
      EXPECT_NE(r.note.find("long context: dQ compared on 1012 of 2100 query rows, dK and dV on 1012 of 2100 keys"),
                std::string::npos)
          << r.note;  // 15 blocks of 64 and the last, of 52
    }
  }
  EXPECT_EQ(grad_laws, 6);
}

// The reference whose backward forgets the scale in dQ (dQ = dS K): at a long context grad-oracle compares the rows
// of its 16 blocks of 64 against the streamed oracle and catches it; and one whose dV misses the queries of the second
// half (a split over queries never reduced), which grad-dv-weights sees at its sampled keys past T/2.
ImplementationPtr broken_backward(const std::string& name, bool dq_unscaled) {
  return make_implementation(
      "test:" + name, name, reference_implementation()->capabilities(),
      [](const Problem& p) { return reference_implementation()->forward(p); },
      [dq_unscaled](const Problem& p) {
        Gradients g = reference_implementation()->backward(p);
        const double scale = p.scale ? *p.scale : 1 / std::sqrt(double(p.q.shape().D));
        if (dq_unscaled) {
          g.dq.values() /= scale;
          return g;
        }
        Problem first_half = p;  // dV is linear in dO: dO = 0 past T/2 leaves only the first half's share
        for (Index i = p.q.shape().T / 2; i < p.q.shape().T; ++i) first_half.d_output->head(0, 0).row(i).setZero();
        g.dv = reference_implementation()->backward(first_half).dv;
        return g;
      });
}

TEST(LongContext, gradientLawsCatchABuggyBackward) {
  LawCase c = long_case(DType::f32, 3);
  Tensor<double> dO({1, 1, kT, kD});
  for (Index n = 0; n < dO.size(); ++n) dO.values()[n] = round_to(DType::f32, std::cos(0.61 * double(n)));
  c.problem.d_output = dO;
  c.problem.scale = 0.25;  // 1/sqrt(4) would be 0.5 as well; an explicit scale other than 1 either way
  for (const std::string law : {"grad-oracle", "grad-key-sum-zero", "grad-dv-weights"})
    EXPECT_FALSE(check(law, *reference_implementation(), c)) << law;
  const auto unscaled = check("grad-oracle", *broken_backward("dq-unscaled", true), c);
  ASSERT_TRUE(unscaled);
  EXPECT_EQ(unscaled->quantity, "dq") << unscaled->message;
  const auto half = check("grad-dv-weights", *broken_backward("dv-first-half", false), c);
  ASSERT_TRUE(half);
  EXPECT_GE(half->worst_index[2], kT / 2) << half->message;
  EXPECT_NE(half->message.find("sampled keys"), std::string::npos) << half->message;
  EXPECT_TRUE(check("grad-oracle", *broken_backward("dv-first-half", false), c));
}

}  // namespace
}  // namespace attncheck
