// Laws on long contexts (more than 2^22 weights): the streamed oracle and the sampled weights hold on the
// reference at every dtype, and each sampled check still catches the bug it is there for.
#include <gtest/gtest.h>

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
// cannot get, and the reference holds each one that applies. The gradient laws say why they do not apply.
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
      EXPECT_EQ(r.status, LawStatus::not_applicable) << describe(r);
      EXPECT_NE(r.note.find("materialises"), std::string::npos) << r.note;
    }
  }
  EXPECT_GE(held, 15);
}

}  // namespace
}  // namespace attncheck
