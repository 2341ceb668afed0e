// Black-box probing: weights recovered from outputs alone equal the weights the reference returns, bit for
// bit, and the scale and alignment an implementation really uses are found, also when they are wrong.
#include "attncheck/probe.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "attncheck/harness.hpp"
#include "attncheck/law.hpp"
#include "test_support.hpp"

namespace attncheck {
namespace {

// The reference's materialised path for every call: its outputs are its weights times V, with or without the
// weights asked for. (Asked for no weights, the reference itself streams, online softmax over key tiles: the
// same weights up to rounding, not bit for bit.)
ImplementationPtr materialised_reference() {
  const auto ref = reference_implementation();
  return make_implementation("materialised", "the reference, weights always computed", ref->capabilities(),
                             [ref](const Problem& p) {
                               Problem with_w = p;
                               with_w.want_weights = true;
                               Outcome o = ref->forward(with_w);
                               if (!p.want_weights) o.weights.reset();
                               return o;
                             });
}

TEST(Probe, recoveredWeightsEqualReturnedWeightsExactly) {
  const auto ref = materialised_reference();
  // T_k > D, so the keys come in several blocks, the last one partial (7 = 3 + 3 + 1).
  for (const DType t : {DType::f32, DType::f64, DType::f16, DType::bf16})
    for (const CausalAlignment a : {CausalAlignment::TopLeft, CausalAlignment::BottomRight}) {
      Problem p = test::wave_problem(t, 2, 2, 5, 7, 3);
      p.alignment = a;
      const Outcome o = ref->forward(p);
      ASSERT_TRUE(o.weights);
      // One product by 1 and exact zeros otherwise: the recovered weight is the returned one, not close to it.
      EXPECT_EQ(recover_weights(*ref, p).values(), o.weights->values()) << dtype_name(t);
    }
}

// A kernel without weights, recovered by probing, counting every call it gets. `wrong` adds 1 to every output
// (so its outputs fail on every case, all-zero inputs included).
std::pair<ImplementationPtr, std::shared_ptr<int>> counted_blind(bool wrong) {
  const auto ref = reference_implementation();
  Capabilities caps;
  caps.returns_weights = false;
  auto calls = std::make_shared<int>(0);
  const auto blind = make_implementation("blind", "outputs only", caps, [ref, calls, wrong](const Problem& p) {
    ++*calls;
    Outcome o = ref->forward(p);
    o.weights.reset();
    if (wrong) o.output.values().array() += 1;
    return o;
  });
  return {with_recovered_weights(blind), calls};
}

// Cheap checks first: oracle-agreement on a kernel whose weights are probed checks the outputs in one call and
// probes the weights only when the outputs pass. A kernel with wrong outputs is found and shrunk with one call
// per case; a correct one costs more calls per case (the probes), and the law reports every call.
TEST(Probe, outputsAreCheckedBeforeWeightsAreProbedAndEveryCallIsCounted) {
  const Law* law = find_law("oracle-agreement");
  ASSERT_NE(law, nullptr);
  for (const bool wrong : {true, false}) {
    const auto [impl, calls] = counted_blind(wrong);
    int evaluations = 0;
    Law counted = *law;
    counted.check = [&](const Implementation& i, const LawCase& c) {
      ++evaluations;
      return law->check(i, c);
    };
    RunOptions opts;
    opts.cases = 20;
    const LawResult r = run_law(counted, *impl, opts);
    EXPECT_EQ(r.calls, *calls) << "every call counted, the probes included";
    if (wrong) {
      ASSERT_EQ(r.status, LawStatus::falsified);
      EXPECT_EQ(r.violation->quantity, "output");
      EXPECT_EQ(*calls, evaluations) << "one call per case: the weights were never probed";
    } else {
      EXPECT_EQ(r.status, LawStatus::held);
      EXPECT_GT(*calls, 2 * evaluations) << "outputs, then outputs and probes";
    }
  }
}

TEST(Probe, wrapperGivesWeightsToAnImplementationWithoutThem) {
  const auto ref = materialised_reference();
  Capabilities caps;
  caps.returns_weights = false;
  const auto blind = make_implementation("blind", "outputs only", caps, [ref](const Problem& p) {
    Outcome o = ref->forward(p);
    o.weights.reset();
    return o;
  });
  const auto probed = with_recovered_weights(blind);
  EXPECT_TRUE(probed->capabilities().returns_weights);
  const Problem p = test::wave_problem(DType::f32, 1, 2, 4, 4, 2);
  const Outcome o = probed->forward(p);
  ASSERT_TRUE(o.weights);
  EXPECT_EQ(o.weights->values(), ref->forward(p).weights->values());
}

TEST(Probe, findsTheReferenceConventions) {
  const Conventions c = probe_conventions(*reference_implementation());
  EXPECT_EQ(c.dtype, DType::f64);
  EXPECT_EQ(c.scale_rule, "1/√D");
  EXPECT_EQ(c.causal, "causal");
  ASSERT_EQ(c.alignment.size(), 2u);
  EXPECT_EQ(c.alignment[0].second, "top-left");
  EXPECT_EQ(c.alignment[1].second, "bottom-right");
  ASSERT_TRUE(c.custom_scale_used);
  EXPECT_NEAR(*c.custom_scale_used, kProbeCustomScale, 1e-12);
  EXPECT_NE(c.summary.find("scale 1/√D (0.5 at D=4, 0.125 at D=64)"), std::string::npos) << c.summary;
}

TEST(Probe, findsAWrongScaleAndAnIgnoredAlignment) {
  // Scales by 1/D whatever it is asked, and always aligns bottom-right: the two mistakes probing exists for.
  Capabilities caps;
  caps.dtypes = {DType::f32};
  const auto odd = make_implementation("odd", "1/D, bottom-right", caps, [](const Problem& p) {
    return run_typed(p, [](const auto& q, const auto& k, const auto& v, const Problem&, auto* w) {
      return attention(
          q, k, v, AttentionOptions{.scale = 1.0 / double(q.shape().D), .alignment = CausalAlignment::BottomRight}, w);
    });
  });
  const Conventions c = probe_conventions(*odd);
  EXPECT_EQ(c.dtype, DType::f32);
  EXPECT_EQ(c.scale_rule, "1/D");
  ASSERT_EQ(c.alignment.size(), 2u);
  EXPECT_EQ(c.alignment[0].second, "bottom-right");  // asked top-left
  ASSERT_TRUE(c.custom_scale_used);
  EXPECT_NEAR(*c.custom_scale_used, 0.25, 1e-5);  // asked 0.375 at D=4, used 1/4
  EXPECT_NE(c.summary.find("asked top-left: bottom-right"), std::string::npos) << c.summary;
}

TEST(Probe, findsAMaskThatLetsTheFutureIn) {
  Capabilities caps;
  caps.cross_lengths = false;
  const auto leaky = make_implementation("leaky", "no mask", caps, [](const Problem& p) {
    return run_typed(p, [](const auto& q, const auto& k, const auto& v, const Problem&, auto* w) {
      return attention(q, k, v, BoolMask::full(q.shape().T, k.shape().T), {}, w);
    });
  });
  const Conventions c = probe_conventions(*leaky);
  EXPECT_EQ(c.causal, "not causal: at T=4 the queries see keys 0:{0,1,2,3} 1:{0,1,2,3} 2:{0,1,2,3} 3:{0,1,2,3}");
  EXPECT_TRUE(c.alignment.empty());
}

// The reference's outputs, except that a row that sees no key is NaN (ggml's soft_max_ext path and PyTorch's
// math path do this), with no weights: the laws get them by probing.
ImplementationPtr nan_rows_without_weights(std::optional<EmptyRows> declared) {
  Capabilities caps;
  caps.returns_weights = false;
  caps.features.add({Feature::key_padding, Feature::window});
  caps.empty_rows = declared;
  const auto ref = reference_implementation();
  return make_implementation("nan-rows", "NaN where a query sees no key", caps, [ref](const Problem& p) {
    Outcome o = ref->forward(p);
    o.weights.reset();
    const Shape& s = p.q.shape();
    for (Index b = 0; b < s.B; ++b)
      for (Index h = 0; h < s.H; ++h)
        for (Index i = 0; i < s.T; ++i)
          if (p.visibility(b).keys(i).empty()) o.output.head(b, h).row(i).setConstant(std::nan(""));
    return o;
  });
}

// A false alarm once raised: under bottom-right alignment with T_q > T_k the first queries see no key, their
// probed weights are NaN, and zero-future-weight used to report that NaN as a leak. A kernel that follows the
// nan convention (declared or not) passes every weight law through probing; one that declares zero and returns
// NaN is caught, so the laws can still fail.
TEST(Probe, nanInRowsThatSeeNoKeyIsNoFalseAlarmThroughProbedWeights) {
  Problem p = test::wave_problem(DType::f32, 1, 1, 4, 2, 2);
  p.alignment = CausalAlignment::BottomRight;  // queries 0 and 1 sit at positions -2 and -1
  const Tensor<double> w = recover_weights(*nan_rows_without_weights(std::nullopt), p);
  ASSERT_TRUE(std::isnan(w(0, 0, 0, 0)) && std::isnan(w(0, 0, 1, 1)));
  ASSERT_EQ(w(0, 0, 2, 0), reference_implementation()->forward(p).weights->operator()(0, 0, 2, 0));

  for (const std::optional<EmptyRows> declared : {std::optional<EmptyRows>{}, std::optional{EmptyRows::nan}}) {
    const auto probed = with_recovered_weights(nan_rows_without_weights(declared));
    for (const char* name : {"zero-future-weight", "window-zero-weight", "key-padding-invariance", "row-stochastic",
                             "oracle-agreement", "empty-row-convention"}) {
      RunOptions opts;
      opts.seed = 10;
      const LawResult r = run_law(*find_law(name), *probed, opts);
      EXPECT_EQ(r.status, LawStatus::held) << (declared ? "declared nan: " : "undeclared: ") << describe(r);
      if (std::string(name) == "empty-row-convention") {
        EXPECT_NE(r.note.find("nan convention"), std::string::npos) << r.note;
      }
    }
  }
  const auto liar = with_recovered_weights(nan_rows_without_weights(EmptyRows::zero));
  for (const char* name : {"zero-future-weight", "empty-row-convention"}) {
    RunOptions opts;
    opts.seed = 10;
    EXPECT_EQ(run_law(*find_law(name), *liar, opts).status, LawStatus::falsified) << name << " missed NaN rows "
                                                                                     "of a kernel that declares zero";
  }
}

}  // namespace
}  // namespace attncheck
