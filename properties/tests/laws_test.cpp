// Every law holds on the reference core. One test per law (label `property`), named after it; RC_PARAMS
// sets the seed and case count, and a failure prints the minimal case and the RC_PARAMS line that replays it.
#include <gtest/gtest.h>

#include <set>

#include "attncheck/law.hpp"

namespace attncheck {
namespace {

void expectHoldsOnReference(const std::string& name, std::initializer_list<DType> dtypes = {DType::f32}) {
  const Law* law = find_law(name);
  ASSERT_NE(law, nullptr) << "no law named " << name;
  for (const DType dt : dtypes) {
    RunOptions opts = options_from_rc_params(name);
    opts.gen.dtype = dt;
    const LawResult r = run_law(*law, *reference_implementation(), opts);
    EXPECT_EQ(r.status, LawStatus::held) << describe(r);
    EXPECT_GT(r.cases_run, 0);
    std::cout << describe(r);
  }
}

constexpr std::initializer_list<DType> kAllDtypes = {DType::f32, DType::f64, DType::f16, DType::bf16};

TEST(Law, rowStochastic) { expectHoldsOnReference("row-stochastic", {DType::f32, DType::f16}); }
TEST(Law, zeroFutureWeight) { expectHoldsOnReference("zero-future-weight", {DType::f32, DType::bf16}); }
TEST(Law, causalPerturbation) { expectHoldsOnReference("causal-perturbation", {DType::f32, DType::f16}); }
TEST(Law, prefixConsistency) { expectHoldsOnReference("prefix-consistency"); }
TEST(Law, scaleVariance) { expectHoldsOnReference("scale-variance", {DType::f32, DType::f16}); }
TEST(Law, firstPosition) { expectHoldsOnReference("first-position", {DType::f32, DType::bf16}); }
TEST(Law, convexHull) { expectHoldsOnReference("convex-hull", {DType::f32, DType::f16}); }
TEST(Law, shiftInvariance) { expectHoldsOnReference("shift-invariance"); }
TEST(Law, batchHeadIndependence) { expectHoldsOnReference("batch-head-independence"); }
TEST(Law, oracleAgreement) { expectHoldsOnReference("oracle-agreement", kAllDtypes); }
TEST(Law, pathsAgree) { expectHoldsOnReference("paths-agree"); }
TEST(Law, determinism) { expectHoldsOnReference("determinism"); }
TEST(Law, strictCausalityNonfinite) { expectHoldsOnReference("strict-causality-nonfinite", {DType::f32, DType::f16}); }
TEST(Law, gradOracle) { expectHoldsOnReference("grad-oracle", kAllDtypes); }
TEST(Law, gradCausality) { expectHoldsOnReference("grad-causality", kAllDtypes); }
TEST(Law, gradKeySumZero) { expectHoldsOnReference("grad-key-sum-zero", kAllDtypes); }
TEST(Law, gradDvWeights) { expectHoldsOnReference("grad-dv-weights", kAllDtypes); }
TEST(Law, gradFiniteDifference) { expectHoldsOnReference("grad-finite-difference", {DType::f64}); }

// A gradient law is not applicable, with its reason, to an implementation without a backward; the forward
// laws are unaffected.
TEST(Law, gradientLawsNeedABackward) {
  Capabilities caps;
  caps.nonfinite_safe = true;  // as the reference: every forward law applies
  const auto forward_only = make_implementation("forward-only", "the reference forward, no backward", caps,
                                                [](const Problem& p) { return reference_implementation()->forward(p); });
  for (const Law& l : laws()) {
    RunOptions opts;
    opts.cases = 5;
    opts.gen.dtype = DType::f64;
    const LawResult r = run_law(l, *forward_only, opts);
    if (l.needs_backward) {
      EXPECT_EQ(r.status, LawStatus::not_applicable) << l.name;
      EXPECT_NE(r.note.find("backward"), std::string::npos) << r.note;
    } else {
      EXPECT_NE(r.status, LawStatus::not_applicable) << l.name;
    }
  }
}

// Every law in laws() has a test above: a new law without one fails here.
TEST(Law, everyLawHasATest) {
  const std::set<std::string> tested = {"row-stochastic", "zero-future-weight", "causal-perturbation",
                                        "prefix-consistency", "scale-variance", "first-position", "convex-hull",
                                        "shift-invariance", "batch-head-independence", "oracle-agreement",
                                        "paths-agree", "determinism", "strict-causality-nonfinite",
                                        "grad-oracle", "grad-causality", "grad-key-sum-zero", "grad-dv-weights",
                                        "grad-finite-difference"};
  for (const auto& l : laws()) EXPECT_TRUE(tested.count(l.name)) << l.name << " has no test";
  EXPECT_EQ(laws().size(), tested.size());
}

}  // namespace
}  // namespace attncheck
