// C ABI plug-ins through load_implementation: the correct example agrees with itself in and out of process
// and holds every law; every broken one is a falsified law with a minimal case, never a crash of the
// harness; a bad spec is a SpecError that says what was wrong.
#include <gtest/gtest.h>

#include "attncheck/harness.hpp"
#include "attncheck/law.hpp"
#include "test_support.hpp"

namespace attncheck {
namespace {

using test::example_plugin;

std::string spec(const std::string& name) { return "plugin:" + example_plugin(name); }

LawResult run(const std::string& law, const Implementation& impl, int cases = 30) {
  const Law* l = find_law(law);
  if (!l) throw std::logic_error("no law " + law);
  RunOptions o;
  o.cases = cases;
  o.gen.dtype = impl.capabilities().dtypes.front();
  return run_law(*l, impl, o);
}

std::string message_of(const LawResult& r) { return r.violation ? r.violation->message : ""; }

TEST(CPlugin, isolatedAndInProcessGiveBitIdenticalResults) {
  const auto isolated = load_implementation(spec("attention_plugin"));
  const auto in_process = load_implementation(spec("attention_plugin"), HarnessOptions{.isolate = false});
  for (const DType t : {DType::f32, DType::f64, DType::bf16}) {
    Problem p = test::wave_problem(t, 2, 3, 5, 7, 4);
    p.alignment = CausalAlignment::BottomRight;
    const Outcome a = isolated->forward(p), b = in_process->forward(p);
    // Same code on the same bits: the wire must not change a single bit of inputs or results.
    EXPECT_EQ(a.output.values(), b.output.values()) << dtype_name(t);
    ASSERT_TRUE(a.weights && b.weights);
    EXPECT_EQ(a.weights->values(), b.weights->values()) << dtype_name(t);
  }
}

TEST(CPlugin, declaresTheCapabilitiesOfItsTable) {
  const auto impl = load_implementation(spec("attention_plugin"));
  const Capabilities& c = impl->capabilities();
  EXPECT_EQ(c.dtypes, (std::vector<DType>{DType::f32, DType::f64, DType::bf16}));
  EXPECT_TRUE(c.returns_weights && c.custom_scale && c.cross_lengths && c.nonfinite_safe);
  EXPECT_EQ(c.max_T, 4096);
  EXPECT_NE(impl->description().find("c-example"), std::string::npos) << impl->description();
}

TEST(CPlugin, correctExampleHoldsEveryLaw) {
  const auto impl = load_implementation(spec("attention_plugin"));
  for (const Law& law : laws()) {
    const LawResult r = run(law.name, *impl, 15);
    EXPECT_NE(r.status, LawStatus::falsified) << law.name << ": " << message_of(r);
  }
}

TEST(CPlugin, maskFilledWithZeroIsFalsifiedAtTheSmallestCase) {
  const auto impl = load_implementation(spec("attention_plugin_mask_zero"));
  const LawResult r = run("zero-future-weight", *impl);
  ASSERT_EQ(r.status, LawStatus::falsified);
  ASSERT_TRUE(r.minimal_case);
  // The smallest case with a future key at all: one query (T_q = 1) that must not see the second key.
  EXPECT_EQ(r.minimal_case->problem.q.shape(), (Shape{1, 1, 1, 1}));
  EXPECT_EQ(r.minimal_case->problem.k.shape().T, 2);
}

TEST(CPlugin, crashIsAFalsifiedLawAndTheNextCallGetsAFreshWorker) {
  const auto impl = load_implementation(spec("bad_plugin_crash"));
  const LawResult r = run("oracle-agreement", *impl);
  ASSERT_EQ(r.status, LawStatus::falsified);
  EXPECT_NE(message_of(r).find("crash"), std::string::npos) << message_of(r);
  EXPECT_NE(message_of(r).find("signal 11"), std::string::npos) << message_of(r);
  ASSERT_TRUE(r.minimal_case);
  EXPECT_EQ(r.minimal_case->problem.q.shape().T, 3);  // it crashes from T = 3 on
  EXPECT_NO_THROW(impl->forward(test::wave_problem(DType::f64, 1, 1, 2, 2, 2)));
}

TEST(CPlugin, hangIsATimeoutAndTheWorkerIsReplaced) {
  const auto impl = load_implementation(spec("bad_plugin_hang"), HarnessOptions{.call_timeout_s = 0.3});
  const LawResult r = run("oracle-agreement", *impl, 10);
  ASSERT_EQ(r.status, LawStatus::falsified);
  EXPECT_NE(message_of(r).find("timeout"), std::string::npos) << message_of(r);
  ASSERT_TRUE(r.minimal_case);
  EXPECT_EQ(r.minimal_case->problem.k.shape().T, 4);  // it hangs from T_k = 4 on
  EXPECT_NO_THROW(impl->forward(test::wave_problem(DType::f64, 1, 1, 3, 3, 2)));
}

TEST(CPlugin, errorStatusCarriesThePluginsMessage) {
  const auto impl = load_implementation(spec("bad_plugin_error"));
  const LawResult r = run("oracle-agreement", *impl);
  ASSERT_EQ(r.status, LawStatus::falsified);
  EXPECT_NE(message_of(r).find("error status"), std::string::npos) << message_of(r);
  EXPECT_NE(message_of(r).find("D to be a multiple of 4, got D = 1"), std::string::npos) << message_of(r);
}

TEST(CPlugin, writingPastTheOutputIsAWrongSize) {
  const auto impl = load_implementation(spec("bad_plugin_wrong_size"));
  const LawResult r = run("oracle-agreement", *impl);
  ASSERT_EQ(r.status, LawStatus::falsified);
  EXPECT_NE(message_of(r).find("wrong size"), std::string::npos) << message_of(r);
  EXPECT_NE(message_of(r).find("wrote past the end of its output [1,1,1,1]"), std::string::npos) << message_of(r);
}

TEST(CPlugin, nanFromFiniteInputsIsAFalsifiedLaw) {
  const auto impl = load_implementation(spec("bad_plugin_nan"));
  const LawResult r = run("oracle-agreement", *impl, 100);
  ASSERT_EQ(r.status, LawStatus::falsified);
  EXPECT_NE(message_of(r).find("non-finite output"), std::string::npos) << message_of(r);
  ASSERT_TRUE(r.minimal_case);
  // exp overflows in float64 only past 709: the minimal case still has a score that large.
  const Problem& p = r.minimal_case->problem;
  const double s = (p.q.values().cwiseAbs().maxCoeff() * p.k.values().cwiseAbs().maxCoeff()) * p.q.shape().D;
  EXPECT_GT(s / std::sqrt(double(p.q.shape().D)), 709.0);
}

TEST(CPlugin, abiMismatchNamesBothVersions) {
  for (const bool isolate : {true, false}) {
    try {
      load_implementation(spec("bad_plugin_abi_version"), HarnessOptions{.isolate = isolate});
      ADD_FAILURE() << "loaded a plug-in with ABI version 99";
    } catch (const SpecError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("ABI version 99"), std::string::npos) << m;
      EXPECT_NE(m.find("loads ABI version 1"), std::string::npos) << m;
    }
  }
}

TEST(CPlugin, missingEntryPointNamesTheSymbol) {
  for (const bool isolate : {true, false}) {
    try {
      load_implementation(spec("bad_plugin_no_entry"), HarnessOptions{.isolate = isolate});
      ADD_FAILURE() << "loaded a plug-in without attncheck_plugin";
    } catch (const SpecError& e) {
      EXPECT_NE(std::string(e.what()).find("has no symbol attncheck_plugin"), std::string::npos) << e.what();
    }
  }
}

TEST(CPlugin, missingOrUnloadableFileIsASpecError) {
  EXPECT_THROW(load_implementation("plugin:/nonexistent/libnothing.so"), SpecError);
  try {
    load_implementation("plugin:" ATTNCHECK_SOURCE_DIR "/CMakeLists.txt");
    ADD_FAILURE() << "loaded a text file";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot load"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_implementation("plugin:"), SpecError);
  EXPECT_THROW(load_implementation("mutant:mask-zero"), SpecError);  // not the harness's scheme
}

}  // namespace
}  // namespace attncheck
