// C ABI plug-ins through load_implementation: the correct example agrees with itself in and out of process
// and holds every law, a frozen ABI-1 plug-in too; ABI 2 carries GQA, key lengths, a window and a backward
// pass intact; every broken one is a falsified law with a minimal case, never a crash of the harness; a bad
// spec is a SpecError that says what was wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "attncheck/harness.hpp"
#include "attncheck/law.hpp"
#include "test_support.hpp"

namespace attncheck {
namespace {

using test::example_plugin;

std::string spec(const std::string& name) { return "plugin:" + example_plugin(name); }

LawResult run(const std::string& law, const Implementation& impl, int cases = 30, int max_shrink_timeouts = 2) {
  const Law* l = find_law(law);
  if (!l) throw std::logic_error("no law " + law);
  RunOptions o;
  o.cases = cases;
  o.gen.dtype = impl.capabilities().dtypes.front();
  o.max_shrink_timeouts = max_shrink_timeouts;
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

// B=2, H=4 over H_kv=2 kv heads, T_q=3 bottom-right over T_k=5, D=2, key lengths {4, 3}, window 1: every
// ABI-2 field matters. Batch entry 1's queries sit at positions 2, 3, 4 and see keys {1,2}, {2} and none (its
// keys 3 and 4 are padding, and the window starts at 3).
Problem abi2_problem(DType t) {
  Problem p = test::wave_problem(t, 2, 4, 3, 5, 2);
  p.k = test::wave({2, 2, 5, 2}, t, 0.2);
  p.v = test::wave({2, 2, 5, 2}, t, 0.3);
  p.alignment = CausalAlignment::BottomRight;
  p.key_lengths = {4, 3};
  p.window = 1;
  p.d_output = test::wave(p.q.shape(), t, 0.4);
  return p;
}

TEST(CPlugin, frozenAbi1PluginLoadsAndHoldsEveryLaw) {
  for (const bool isolate : {true, false}) {
    const auto impl = load_implementation("plugin:" ATTNCHECK_ABI1_PLUGIN, HarnessOptions{.isolate = isolate});
    const Capabilities& c = impl->capabilities();
    EXPECT_TRUE(c.returns_weights && c.custom_scale && c.cross_lengths && c.nonfinite_safe);
    // An ABI-1 table has no field for the ABI-2 capabilities: each is off, and no call ever needs them.
    EXPECT_FALSE(c.features.intersects({Feature::gqa, Feature::key_padding, Feature::window, Feature::backward}));
    EXPECT_FALSE(c.empty_rows);
    EXPECT_THROW(impl->forward(abi2_problem(DType::f64)), std::logic_error);
    if (!isolate) continue;  // the laws once, through the worker as a run does
    for (const Law& law : laws()) {
      const LawResult r = run(law.name, *impl, 10);
      EXPECT_NE(r.status, LawStatus::falsified) << law.name << ": " << message_of(r);
    }
  }
}

TEST(CPlugin, abi2ExampleDeclaresGqaKeyLengthsWindowAndBackward) {
  const auto impl = load_implementation(spec("attention_plugin"));
  const Capabilities& c = impl->capabilities();
  EXPECT_TRUE(c.features.contains({Feature::gqa, Feature::key_padding, Feature::window, Feature::backward}));
  EXPECT_EQ(c.empty_rows, EmptyRows::zero);
  // A table without a backward entry gets no backward capability.
  EXPECT_FALSE(load_implementation(spec("attention_plugin_empty_nan"))->capabilities().declares(Feature::backward));
}

TEST(CPlugin, abi2CallsCrossTheWorkerBitExactly) {
  const auto isolated = load_implementation(spec("attention_plugin"));
  const auto in_process = load_implementation(spec("attention_plugin"), HarnessOptions{.isolate = false});
  for (const DType t : {DType::f32, DType::f64, DType::bf16}) {
    const Problem p = abi2_problem(t);
    const Outcome a = isolated->forward(p), b = in_process->forward(p);
    EXPECT_EQ(a.output.values(), b.output.values()) << dtype_name(t);
    // Same code on the same bits: key lengths, window, kv heads and dO reached the worker unchanged.
    const Gradients ga = isolated->backward(p), gb = in_process->backward(p);
    EXPECT_EQ(ga.dq.values(), gb.dq.values()) << dtype_name(t);
    EXPECT_EQ(ga.dk.values(), gb.dk.values()) << dtype_name(t);
    EXPECT_EQ(ga.dv.values(), gb.dv.values()) << dtype_name(t);
    EXPECT_EQ(ga.dk.shape(), p.k.shape());
  }
  // The options really reached the plug-in: its outputs are the reference core's (which honours them).
  const Problem p = abi2_problem(DType::f64);
  const double worst =
      (isolated->forward(p).output.values() - reference_implementation()->forward(p).output.values()).cwiseAbs().maxCoeff();
  // float64, T_k = 5, D = 2, |values| <= 1: both round a handful of products; 1e-14 is ~50 ulps of 1.
  EXPECT_LT(worst, 1e-14);
}

// The example's backward is the gradient of its own forward: central differences of L = sum(O ∘ dO), in
// float64, with grouped heads (a kv head's gradient sums over its group), padding, a window and a row that
// sees no key (whose gradient is 0).
TEST(CPlugin, abi2ExampleGradientsAreCentralDifferencesOfItsForward) {
  const auto impl = load_implementation(spec("attention_plugin"), HarnessOptions{.isolate = false});
  Problem p = abi2_problem(DType::f64);
  p.want_weights = false;
  const Gradients g = impl->backward(p);
  const auto loss = [&](const Problem& x) {
    return impl->forward(x).output.values().cwiseProduct(p.d_output->values()).sum();
  };
  // Step h = 2^-20: the truncation error h²/6 · (third derivative) is ~1e-13 for inputs and scores of order 1,
  // the rounding error ~eps·|L|/h ~1e-10 (|L| <= 24 here); 1e-7 leaves a wide margin and is far below any
  // real gradient mistake (a missing scale or group sum changes entries by ~0.1).
  const double h = std::ldexp(1.0, -20), tol = 1e-7;
  const std::pair<Tensor<double> Problem::*, const Tensor<double>*> parts[] = {
      {&Problem::q, &g.dq}, {&Problem::k, &g.dk}, {&Problem::v, &g.dv}};
  for (const auto& [member, grad] : parts)
    for (Index n = 0; n < grad->size(); ++n) {
      Problem plus = p, minus = p;
      (plus.*member).values()[n] += h;
      (minus.*member).values()[n] -= h;
      EXPECT_NEAR(grad->values()[n], (loss(plus) - loss(minus)) / (2 * h), tol) << "element " << n;
    }
  // Keys no query of batch entry 1 sees (0: outside every window; 3, 4: padding) get no gradient at all, and
  // its last query, which sees no key, none either.
  for (const Index j : {0, 3, 4})
    for (Index c = 0; c < 2; ++c) EXPECT_EQ(g.dk(1, 0, j, c), 0.0) << j;
  for (Index c = 0; c < 2; ++c) EXPECT_EQ(g.dq(1, 0, 2, c), 0.0);
}

TEST(CPlugin, emptyRowsNanPluginDeclaresNanAndHoldsEveryLaw) {
  const auto impl = load_implementation(spec("attention_plugin_empty_nan"));
  EXPECT_EQ(impl->capabilities().empty_rows, EmptyRows::nan);
  // It does return NaN there: batch entry 1's last row sees no key.
  const Outcome o = impl->forward(abi2_problem(DType::f64));
  EXPECT_TRUE(std::isnan(o.output(1, 0, 2, 0)));
  EXPECT_TRUE(std::isfinite(o.output(1, 0, 0, 0)));
  for (const Law& law : laws()) {
    const LawResult r = run(law.name, *impl, 15);
    EXPECT_NE(r.status, LawStatus::falsified) << law.name << ": " << message_of(r);
  }
}

TEST(CPlugin, aTableClaimingWhatItsVersionCannotCarryIsASpecError) {
  for (const bool isolate : {true, false}) {
    try {
      load_implementation(spec("bad_plugin_v1_key_lengths"), HarnessOptions{.isolate = isolate});
      ADD_FAILURE() << "loaded an ABI-1 table that claims key lengths";
    } catch (const SpecError& e) {
      EXPECT_NE(std::string(e.what()).find("has ABI version 1 but its flags are 0x22, with ATTNCHECK_CAP_KEY_LENGTHS "
                                           "(0x20), which only an ABI-2 table can carry (expected flags within 0xf"),
                std::string::npos)
          << e.what();
    }
    try {
      load_implementation(spec("bad_plugin_empty_rows"), HarnessOptions{.isolate = isolate});
      ADD_FAILURE() << "loaded a table with empty_rows 7";
    } catch (const SpecError& e) {
      EXPECT_NE(std::string(e.what()).find("empty_rows is 7 (expected 0 ATTNCHECK_EMPTY_ROWS_UNSPECIFIED, 1 "
                                           "ATTNCHECK_EMPTY_ROWS_ZERO or 2 ATTNCHECK_EMPTY_ROWS_NAN; 3 "
                                           "ATTNCHECK_EMPTY_ROWS_ANY needs an ABI-3 table)"),
                std::string::npos)
          << e.what();
    }
  }
}

// ABI 3's declarations, read from the table in process and carried by the worker's protocol: the same.
TEST(CPlugin, abi3DeclarationsReachTheCapabilitiesInAndOutOfProcess) {
  for (const bool isolate : {true, false}) {
    const auto impl = load_implementation(spec("attention_plugin_declared"), HarnessOptions{.isolate = isolate});
    const Capabilities& c = impl->capabilities();
    EXPECT_TRUE(c.cross_lengths && c.q_shorter && !c.q_longer) << isolate;
    EXPECT_EQ(c.head_dim_multiple, 8) << isolate;
    EXPECT_EQ(c.max_head_dim, 128) << isolate;
    EXPECT_TRUE(c.head_dims.empty()) << isolate;
    EXPECT_EQ(c.empty_rows, EmptyRows::any) << isolate;
    EXPECT_TRUE(c.supports_head_dim(8) && c.supports_head_dim(128) && !c.supports_head_dim(12) &&
                !c.supports_head_dim(136));
  }
  // The frozen ABI-2 plug-in declares none of it: every regime, every D.
  const ImplementationPtr abi2 = load_implementation("plugin:" ATTNCHECK_ABI2_PLUGIN);
  const Capabilities& old = abi2->capabilities();
  EXPECT_TRUE(old.q_shorter && old.q_longer && old.head_dim_multiple == 1 && old.max_head_dim == 0);
  EXPECT_EQ(old.empty_rows, EmptyRows::zero);
}

// abi2_problem with every ABI-3 modifier: softcap 2, ALiBi slopes, sinks (one -inf: no sink for head 3), and the
// LSE wanted. Batch entry 1's last row sees no key: its LSE is the sink alone (or -inf for head 3).
Problem modifiers_problem(DType t, bool causal = true) {
  Problem p = abi2_problem(t);
  p.softcap = 2.0;
  p.alibi_slopes = {0.5, 0.25, 0.125, 0.0625};
  p.sinks = {0.5, -1.0, 2.0, -std::numeric_limits<double>::infinity()};
  p.causal = causal;
  p.want_lse = true;
  return p;
}

TEST(CPlugin, abi3ModifierFlagsSetTheCapabilitiesInAndOutOfProcess) {
  for (const bool isolate : {true, false}) {
    const Capabilities c =
        load_implementation(spec("attention_plugin_modifiers"), HarnessOptions{.isolate = isolate})->capabilities();
    EXPECT_TRUE(
        c.features.contains({Feature::lse, Feature::sinks, Feature::softcap, Feature::alibi, Feature::bidirectional}))
        << isolate;
    EXPECT_EQ(c.abi3_flags, 0x10Fu) << isolate;
    const Capabilities plain = load_implementation(spec("attention_plugin"), HarnessOptions{.isolate = isolate})->capabilities();
    EXPECT_FALSE(plain.features.intersects(
        {Feature::lse, Feature::sinks, Feature::softcap, Feature::alibi, Feature::bidirectional}))
        << isolate;
  }
  // ABI-1 and ABI-2 tables have no flags3: none of them.
  for (const char* old : {"plugin:" ATTNCHECK_ABI1_PLUGIN, "plugin:" ATTNCHECK_ABI2_PLUGIN}) {
    const Capabilities c = load_implementation(old)->capabilities();
    EXPECT_FALSE(
        c.features.intersects({Feature::lse, Feature::sinks, Feature::softcap, Feature::alibi, Feature::bidirectional}))
        << old;
  }
}

// Softcap, ALiBi, sinks, causal = 0, the LSE and d_sinks reach the plug-in and come back: the example agrees with
// the reference core (which honours them all), and the worker changes no bit of it.
TEST(CPlugin, abi3ModifiersLseAndDSinksCrossTheWorkerAndAgreeWithTheReference) {
  const auto isolated = load_implementation(spec("attention_plugin_modifiers"));
  const auto in_process = load_implementation(spec("attention_plugin_modifiers"), HarnessOptions{.isolate = false});
  const auto ref = reference_implementation();
  for (const bool causal : {true, false}) {
    const Problem p = modifiers_problem(DType::f64, causal);
    const Outcome a = isolated->forward(p), b = in_process->forward(p), r = ref->forward(p);
    ASSERT_TRUE(a.lse && b.lse && r.lse) << causal;
    EXPECT_EQ(a.output.values(), b.output.values());
    EXPECT_EQ(a.lse->values(), b.lse->values());
    EXPECT_EQ(a.lse->shape(), (Shape{2, 4, 3, 1}));
    // float64, T_k = 5, D = 2, |values| <= 1, scores capped at 2: a handful of rounded products, tanh, exp and
    // log on each side; 1e-13 is ~500 ulps of the largest value and far below any modifier's effect (>= 0.01).
    const auto worst = [](const Tensor<double>& x, const Tensor<double>& y) {
      double m = 0;
      for (Index n = 0; n < x.size(); ++n)
        m = std::max(m, x.values()[n] == y.values()[n] ? 0.0 : std::abs(x.values()[n] - y.values()[n]));
      return m;
    };
    EXPECT_LT(worst(a.output, r.output), 1e-13) << causal;
    EXPECT_LT(worst(*a.weights, *r.weights), 1e-13) << causal;
    EXPECT_LT(worst(*a.lse, *r.lse), 1e-13) << causal;
    // The row that sees no key (batch 1, last query, causal only): its LSE is the sink's logit alone.
    if (causal) {
      EXPECT_EQ((*a.lse)(1, 0, 2, 0), 0.5);
      EXPECT_EQ((*a.lse)(1, 3, 2, 0), -std::numeric_limits<double>::infinity());
    }
    const Gradients ga = isolated->backward(p), gb = in_process->backward(p), gr = ref->backward(p);
    ASSERT_EQ(ga.dsinks.size(), 4u);
    EXPECT_EQ(ga.dsinks, gb.dsinks);
    EXPECT_EQ(ga.dq.values(), gb.dq.values());
    EXPECT_LT(worst(ga.dq, gr.dq), 1e-13);
    EXPECT_LT(worst(ga.dk, gr.dk), 1e-13);
    EXPECT_LT(worst(ga.dv, gr.dv), 1e-13);
    for (std::size_t h = 0; h < 4; ++h) EXPECT_NEAR(ga.dsinks[h], gr.dsinks[h], 1e-13) << h;
    EXPECT_EQ(ga.dsinks[3], 0.0);  // a sink of -inf has no weight, so no gradient
    EXPECT_GT(std::abs(ga.dsinks[0]), 1e-3);  // not trivially zero
  }
  // No LSE asked: none returned (and none asked of a plug-in that does not declare it).
  Problem p = modifiers_problem(DType::f32);
  p.want_lse = false;
  EXPECT_FALSE(isolated->forward(p).lse);
  Problem plain = abi2_problem(DType::f64);
  plain.want_lse = true;
  EXPECT_FALSE(load_implementation(spec("attention_plugin"))->forward(plain).lse);
}

// The example's d_sinks is the derivative of its own loss L = sum(O ∘ dO) with respect to each sink logit.
TEST(CPlugin, modifiersExampleDSinksAreCentralDifferencesOfItsForward) {
  const auto impl = load_implementation(spec("attention_plugin_modifiers"), HarnessOptions{.isolate = false});
  Problem p = modifiers_problem(DType::f64);
  p.want_weights = p.want_lse = false;
  const Gradients g = impl->backward(p);
  const auto loss = [&](const Problem& x) {
    return impl->forward(x).output.values().cwiseProduct(p.d_output->values()).sum();
  };
  // As for the ABI-2 gradients: step 2^-20, truncation ~1e-13, rounding ~1e-10; 1e-7 leaves a wide margin.
  const double h = std::ldexp(1.0, -20);
  for (std::size_t head = 0; head < 3; ++head) {  // head 3's sink is -inf: no neighbourhood to difference
    Problem plus = p, minus = p;
    plus.sinks[head] += h;
    minus.sinks[head] -= h;
    EXPECT_NEAR(g.dsinks[head], (loss(plus) - loss(minus)) / (2 * h), 1e-7) << head;
  }
}

TEST(CPlugin, anUndeclaredModifierIsNeverSent) {
  const auto impl = load_implementation(spec("attention_plugin"));
  for (int which = 0; which < 4; ++which) {
    Problem p = abi2_problem(DType::f64);
    if (which == 0) p.softcap = 2.0;
    if (which == 1) p.alibi_slopes = {1, 1, 1, 1};
    if (which == 2) p.sinks = {0, 0, 0, 0};
    if (which == 3) p.causal = false;
    EXPECT_THROW(impl->forward(p), std::logic_error) << which;
  }
}

using test::paged_problem;
using test::with_v_head_dim;

// The masks' call fields arrive as plugin.h defines them, forward and backward, in process and through the
// plug-in host (where the problem crosses the exec protocol first): the echo plug-in writes back q_doc_ids,
// prefix_length, window_right, chunk_size and causal (output and dq) and k_doc_ids (weights and dk).
TEST(CPlugin, theMaskFieldsReachThePluginAsDefined) {
  const std::vector<std::vector<double>> k_ids = {{1, 1, 3, 3, 3, 4}, {0, 0, 0, 0, 0, 0}};
  const std::vector<std::vector<double>> q_ids = {{3, 3, 3, 4}, {0, 0, 0, 0}};
  for (const bool isolate : {true, false})
    for (const bool causal : {true, false}) {
      const auto echo = load_implementation("plugin:" ATTNCHECK_MASKS_ECHO_PLUGIN, HarnessOptions{.isolate = isolate});
      const Capabilities& c = echo->capabilities();
      EXPECT_TRUE(c.features.contains(
          {Feature::documents, Feature::chunked_local, Feature::prefix, Feature::right_window, Feature::bidirectional}))
          << isolate;
      EXPECT_EQ(c.abi3_flags, 0x3E0u) << isolate;
      const Problem p = test::masks_problem(5, causal);
      const Outcome o = echo->forward(p);
      const Gradients g = echo->backward(p);
      ASSERT_TRUE(o.weights);
      for (Index b = 0; b < 2; ++b) {
        const Visibility v = p.visibility(b);
        for (Index h = 0; h < 2; ++h)
          for (Index i = 0; i < 4; ++i) {
            const std::string at = std::to_string(isolate) + std::to_string(causal) + " b" + std::to_string(b) +
                                   " h" + std::to_string(h) + " i" + std::to_string(i);
            for (const Tensor<double>* t : {&o.output, &g.dq}) {
              EXPECT_EQ((*t)(b, h, i, 0), q_ids[b][i]) << at;
              EXPECT_EQ((*t)(b, h, i, 0), double(v.query_document(i))) << at;
              EXPECT_EQ((*t)(b, h, i, 1), 2.0) << at;  // prefix_length
              EXPECT_EQ((*t)(b, h, i, 2), 1.0) << at;  // window_right
              EXPECT_EQ((*t)(b, h, i, 3), 3.0) << at;  // chunk_size
              EXPECT_EQ((*t)(b, h, i, 4), causal ? 1.0 : 0.0) << at;
            }
            for (Index j = 0; j < 6; ++j) {
              EXPECT_EQ((*o.weights)(b, h, i, j), k_ids[b][j]) << at << " j" << j;
              EXPECT_EQ((*o.weights)(b, h, i, j), double(document_of(p.doc_bounds[b], j))) << at;
            }
          }
        for (Index j = 0; j < 6; ++j) EXPECT_EQ(g.dk(b, 0, j, 0), k_ids[b][j]) << isolate << " b" << b << " j" << j;
      }
      // A call without them gets the neutral values: no ids (NULL), 0, -1, 0, causal 1.
      Problem plain = test::wave_problem(DType::f64, 1, 1, 2, 3, 5);
      plain.want_weights = true;
      plain.d_output = test::wave(plain.q.shape(), DType::f64, 0.4);
      const Outcome n = echo->forward(plain);
      const Gradients ng = echo->backward(plain);
      for (const Tensor<double>* t : {&n.output, &ng.dq})
        for (Index i = 0; i < 2; ++i) {
          EXPECT_EQ((*t)(0, 0, i, 0), -100.0) << isolate;
          EXPECT_EQ((*t)(0, 0, i, 1), 0.0) << isolate;
          EXPECT_EQ((*t)(0, 0, i, 2), -1.0) << isolate;
          EXPECT_EQ((*t)(0, 0, i, 3), 0.0) << isolate;
          EXPECT_EQ((*t)(0, 0, i, 4), 1.0) << isolate;
        }
      EXPECT_EQ((*n.weights)(0, 0, 0, 2), -100.0) << isolate;
      EXPECT_EQ(ng.dk(0, 0, 2, 0), -100.0) << isolate;
    }
}

// The plain example declares strided inputs and layout invariance, and holds layout-invariance bit for bit, isolated
// (the layout crosses the worker's protocol, flag 65536) and in process; the same kernel reading every input as
// contiguous is falsified, on a layout that shows it at the smallest shape.
TEST(CPlugin, stridedInputsReachThePluginAndAKernelThatIgnoresThemIsCaught) {
  for (const bool isolate : {true, false}) {
    const auto right = load_implementation(spec("attention_plugin"), HarnessOptions{.isolate = isolate});
    EXPECT_TRUE(right->capabilities().features.contains({Feature::strided, Feature::layout_invariant}));
    const LawResult held = run("layout-invariance", *right);
    EXPECT_EQ(held.status, LawStatus::held) << message_of(held);
    const auto wrong = load_implementation(spec("attention_plugin_contiguous_reads"), HarnessOptions{.isolate = isolate});
    const LawResult r = run("layout-invariance", *wrong);
    ASSERT_EQ(r.status, LawStatus::falsified) << (isolate ? "isolated" : "in process");
    ASSERT_TRUE(r.minimal_case);
    EXPECT_NE(r.minimal_case->variant->layout, InputLayout::contiguous);
    EXPECT_LE(r.minimal_case->problem.q.shape().numel() + r.minimal_case->problem.k.shape().numel(), 3)
        << message_of(r);
  }
}

// The plain example declares V with a head dimension of its own (MLA): a call with D_v = 5 != D = 2 reaches it in
// process and across the worker's protocol (flag 131072), forward and backward, and its output [B,H,T_q,D_v] and
// gradients agree with the reference's within float64 reassociation; the gradient and oracle laws hold on it.
TEST(CPlugin, aValueHeadDimOfItsOwnReachesThePluginAndAgreesWithTheReference) {
  for (const bool isolate : {true, false}) {
    const auto impl = load_implementation(spec("attention_plugin"), HarnessOptions{.isolate = isolate});
    ASSERT_TRUE(impl->capabilities().declares(Feature::v_head_dim));
    Problem p = test::wave_problem(DType::f64, 1, 2, 3, 4, 2);
    p.alignment = CausalAlignment::BottomRight;
    p.v = test::wave({1, 2, 4, 5}, DType::f64, 0.3);
    p.d_output = test::wave({1, 2, 3, 5}, DType::f64, 0.7);
    const Outcome got = impl->forward(p), want = reference_implementation()->forward(p);
    ASSERT_EQ(got.output.shape(), (Shape{1, 2, 3, 5}));
    for (Index n = 0; n < got.output.size(); ++n)
      EXPECT_NEAR(got.output.values()[n], want.output.values()[n], 1e-13) << n;
    const Gradients g = impl->backward(p), r = reference_implementation()->backward(p);
    ASSERT_EQ(g.dv.shape(), (Shape{1, 2, 4, 5}));
    for (const auto& [x, y] : {std::pair{&g.dq, &r.dq}, {&g.dk, &r.dk}, {&g.dv, &r.dv}})
      for (Index n = 0; n < x->size(); ++n) EXPECT_NEAR(x->values()[n], y->values()[n], 1e-13) << n;
    for (const char* law : {"oracle-agreement", "grad-oracle"}) {
      const LawResult held = run(law, *impl);
      EXPECT_EQ(held.status, LawStatus::held) << law << ": " << message_of(held);
    }
  }
}

// The -DMASKS example declares the masks beyond causal and causal = 0, honours them (it agrees with the reference,
// which honours them all, forward and backward), and the worker changes no bit of its answers.
TEST(CPlugin, theMasksExampleHonoursEveryFamilyAndAgreesWithTheReference) {
  const auto isolated = load_implementation(spec("attention_plugin_masks"));
  const auto in_process = load_implementation(spec("attention_plugin_masks"), HarnessOptions{.isolate = false});
  const auto ref = reference_implementation();
  const Capabilities& c = isolated->capabilities();
  EXPECT_TRUE(c.features.contains({Feature::documents, Feature::query_documents, Feature::chunked_local,
                                   Feature::prefix, Feature::right_window, Feature::bidirectional, Feature::backward}));
  EXPECT_EQ(c.abi3_flags, 0x203E0u);
  const auto worst = [](const Tensor<double>& x, const Tensor<double>& y) {
    double m = 0;
    for (Index n = 0; n < x.size(); ++n)
      m = std::max(m, x.values()[n] == y.values()[n] ? 0.0 : std::abs(x.values()[n] - y.values()[n]));
    return m;
  };
  // Each family alone and all together, and documents with query bounds of their own: each changes which keys
  // some query sees.
  for (int which = 0; which < 7; ++which)
    for (const bool causal : {true, false}) {
      const Problem all = test::masks_problem(2, causal);
      Problem p = test::wave_problem(DType::f64, 2, 2, 4, 6, 2);
      p.alignment = all.alignment;
      p.causal = causal;
      p.want_weights = true;
      p.d_output = all.d_output;
      if (which == 0) p.doc_bounds = all.doc_bounds;
      if (which == 1) p.chunk_size = all.chunk_size;
      if (which == 2) p.prefix_length = all.prefix_length;
      if (which == 3) p.window_right = all.window_right;
      if (which == 5) p = all;
      if (which == 6) {  // query 0 in document 0 (no key), 1 in 1 (keys 0-1), 2 in 3 (keys 2-4), 3 in 4 (key 5)
        p.doc_bounds = all.doc_bounds;
        p.q_doc_bounds = {{1, 2, 2, 3, 4}, {}};
      }
      const std::string what = std::to_string(which) + (causal ? " causal" : " bidirectional");
      const Outcome a = isolated->forward(p), b = in_process->forward(p), r = ref->forward(p);
      ASSERT_TRUE(a.weights && b.weights && r.weights) << what;
      EXPECT_EQ(a.output.values(), b.output.values()) << what;
      EXPECT_EQ(a.weights->values(), b.weights->values()) << what;
      // float64, T_k = 6, D = 2, |values| <= 1: a handful of rounded products and exps on each side; 1e-13 is
      // ~500 ulps of the largest value, and a key seen or hidden moves a weight by more than 0.01.
      EXPECT_LT(worst(a.output, r.output), 1e-13) << what;
      EXPECT_LT(worst(*a.weights, *r.weights), 1e-13) << what;
      for (Index bb = 0; bb < 2; ++bb)  // the weights are 0 exactly where the definitions hide a key
        for (Index i = 0; i < 4; ++i)
          for (Index j = 0; j < 6; ++j)
            EXPECT_EQ((*a.weights)(bb, 0, i, j) != 0.0, p.visibility(bb).visible(i, j))
                << what << " " << bb << " " << i << " " << j;
      const Gradients ga = isolated->backward(p), gb = in_process->backward(p), gr = ref->backward(p);
      EXPECT_EQ(ga.dq.values(), gb.dq.values()) << what;
      EXPECT_LT(worst(ga.dq, gr.dq), 1e-13) << what;
      EXPECT_LT(worst(ga.dk, gr.dk), 1e-13) << what;
      EXPECT_LT(worst(ga.dv, gr.dv), 1e-13) << what;
    }
}

// A mask family goes only to a plug-in that declares it: refused before the call (an internal error: a law or a
// test sent it), naming the family and the flag, in and out of process, for ABI-2 and ABI-3 plug-ins alike.
TEST(CPlugin, anUndeclaredMaskFamilyIsNeverSent) {
  const Problem all = test::masks_problem(2);
  for (const bool isolate : {true, false})
    for (const std::string& target : {spec("attention_plugin"), std::string("plugin:" ATTNCHECK_ABI2_PLUGIN)}) {
      const auto impl = load_implementation(target, HarnessOptions{.isolate = isolate});
      for (int which = 0; which < 4; ++which) {
        Problem p = test::wave_problem(DType::f64, 2, 2, 4, 6, 2);
        p.alignment = all.alignment;
        const char* flag[] = {"ATTNCHECK_CAP3_DOCUMENTS", "ATTNCHECK_CAP3_CHUNKED_LOCAL", "ATTNCHECK_CAP3_PREFIX",
                              "ATTNCHECK_CAP3_RIGHT_WINDOW"};
        if (which == 0) p.doc_bounds = all.doc_bounds;
        if (which == 1) p.chunk_size = 3;
        if (which == 2) p.prefix_length = 2;
        if (which == 3) p.window_right = 1;
        try {
          impl->forward(p);
          ADD_FAILURE() << target << " got mask family " << which;
        } catch (const std::logic_error& e) {
          EXPECT_NE(std::string(e.what()).find(flag[which]), std::string::npos) << e.what();
        }
        p.d_output = all.d_output;
        if (!impl->capabilities().declares(Feature::backward)) continue;
        EXPECT_THROW(impl->backward(p), std::logic_error) << target << " " << which;
      }
    }
  const Capabilities plain = load_implementation(spec("attention_plugin"))->capabilities();
  EXPECT_FALSE(
      plain.features.intersects({Feature::documents, Feature::chunked_local, Feature::prefix, Feature::right_window}));
}

// The extents of test::cell_masks_problem's masks that the loader's strides must get right: kinds, partial cells and
// dense mask each broadcast (1) or not (2) over batch and heads.
const std::array<Index, 6> kCellExtents[] = {{1, 2, 2, 1, 2, 1}, {2, 1, 1, 2, 1, 2}, {2, 2, 2, 2, 2, 2}, {1, 1, 1, 1, 1, 1}};

// The -DBLOCK_MASKS example declares block and dense masks (flags3 0x400, 0x800, with causal = 0: 0xd00), reads
// them through the strides the loader fills (stride 0 over a broadcast extent), in process and through the plug-in
// host (where they cross the exec protocol first), and agrees with the reference forward and backward; its weights
// are 0 exactly where the masks hide a key, per head.
// ABI 4: the example's ABI-4 build declares the additive bias (flags4 ATTNCHECK_CAP4_BIAS) and reads call->bias
// through its strides, broadcast (stride 0) or not, forward and backward, in and out of process; a plug-in that does
// not declare it is never sent one.
TEST(CPlugin, theAbi4ExampleReadsTheBiasThroughItsStrides) {
  const auto isolated = load_implementation(spec("attention_plugin_v4"));
  const auto in_process = load_implementation(spec("attention_plugin_v4"), HarnessOptions{.isolate = false});
  const auto ref = reference_implementation();
  EXPECT_TRUE(isolated->capabilities().declares(Feature::bias));
  EXPECT_TRUE(in_process->capabilities().declares(Feature::bias));
  EXPECT_TRUE(isolated->capabilities().declares(Feature::bias_grad));
  EXPECT_FALSE(load_implementation(spec("attention_plugin"))->capabilities().declares(Feature::bias));
  const auto worst = [](const Tensor<double>& x, const Tensor<double>& y) {
    double m = 0;
    for (Index n = 0; n < x.size(); ++n) m = std::max(m, std::abs(x.values()[n] - y.values()[n]));
    return m;
  };
  for (const auto& [B_b, H_b] : {std::pair<Index, Index>{1, 1}, {2, 1}, {1, 2}, {2, 2}}) {
    Problem p = test::wave_problem(DType::f64, 2, 2, 3, 5, 2);
    p.alignment = CausalAlignment::BottomRight;
    p.d_output = test::wave(p.q.shape(), DType::f64, 0.4);
    p.bias = ScoreBias{.B = B_b, .H = H_b, .T_q = 3, .T_k = 5, .values = {}};
    for (Index n = 0; n < B_b * H_b * 15; ++n) p.bias->values.push_back(0.25 * double((n * 7) % 13) - 1.5);
    const std::string what = std::to_string(B_b) + "x" + std::to_string(H_b);
    const Outcome a = isolated->forward(p), b = in_process->forward(p), r = ref->forward(p);
    EXPECT_EQ(a.output.values(), b.output.values()) << what;
    // float64, T_k = 5, D = 2, |values| <= 1.5: 1e-13 is hundreds of ulps; leaving the bias out (or reading it at
    // the wrong strides) moves the output by more than 0.01.
    EXPECT_LT(worst(a.output, r.output), 1e-13) << what;
    Problem unbiased = p;
    unbiased.bias.reset();
    EXPECT_GT(worst(ref->forward(unbiased).output, r.output), 1e-2) << what;
    const Gradients ga = isolated->backward(p), gb = in_process->backward(p), gr = ref->backward(p);
    EXPECT_LT(worst(ga.dq, gr.dq), 1e-13) << what;
    EXPECT_LT(worst(ga.dk, gr.dk), 1e-13) << what;
    EXPECT_LT(worst(ga.dv, gr.dv), 1e-13) << what;
    // dBias (ATTNCHECK_CAP4_BIAS_GRAD) in the bias's shape, through d_bias's strides, summed where it broadcasts.
    ASSERT_TRUE(ga.dbias && gb.dbias && gr.dbias) << what;
    ASSERT_EQ(ga.dbias->shape(), (Shape{B_b, H_b, 3, 5})) << what;
    EXPECT_EQ(ga.dbias->values(), gb.dbias->values()) << what;
    EXPECT_LT(worst(*ga.dbias, *gr.dbias), 1e-13) << what;
    EXPECT_GT(gr.dbias->values().cwiseAbs().maxCoeff(), 1e-3) << what;
  }
  Problem p = test::wave_problem(DType::f64, 1, 2, 3, 5, 2);
  p.bias = ScoreBias{.B = 1, .H = 1, .T_q = 3, .T_k = 5, .values = std::vector<double>(15, 0.5)};
  try {
    load_implementation(spec("attention_plugin"))->forward(p);
    ADD_FAILURE() << "a bias was sent to a plug-in that does not declare it";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("an additive bias ([1,1,3,5])"), std::string::npos) << e.what();
  }
}

// The ABI-4 build declares per-query temperatures (ATTNCHECK_CAP4_TEMPERATURE) and reads call->temperature through
// its strides, broadcast (stride 0) or not, forward and backward (dq that of q itself), in and out of process; a
// plug-in that does not declare it is never sent one.
TEST(CPlugin, theAbi4ExampleReadsTheTemperatureThroughItsStrides) {
  const auto isolated = load_implementation(spec("attention_plugin_v4"));
  const auto in_process = load_implementation(spec("attention_plugin_v4"), HarnessOptions{.isolate = false});
  const auto ref = reference_implementation();
  EXPECT_TRUE(isolated->capabilities().declares(Feature::temperature));
  EXPECT_FALSE(load_implementation(spec("attention_plugin"))->capabilities().declares(Feature::temperature));
  const auto worst = [](const Tensor<double>& x, const Tensor<double>& y) {
    double m = 0;
    for (Index n = 0; n < x.size(); ++n) m = std::max(m, std::abs(x.values()[n] - y.values()[n]));
    return m;
  };
  for (const auto& [B_t, H_t] : {std::pair<Index, Index>{1, 1}, {2, 1}, {1, 2}, {2, 2}}) {
    Problem p = test::wave_problem(DType::f64, 2, 2, 3, 5, 2);
    p.alignment = CausalAlignment::BottomRight;
    p.d_output = test::wave(p.q.shape(), DType::f64, 0.4);
    p.temperature = QueryTemperature{.B = B_t, .H = H_t, .T_q = 3, .values = {}};
    for (Index n = 0; n < B_t * H_t * 3; ++n) p.temperature->values.push_back(0.25 + 0.375 * double((n * 5) % 7));
    const std::string what = std::to_string(B_t) + "x" + std::to_string(H_t);
    const Outcome a = isolated->forward(p), b = in_process->forward(p), r = ref->forward(p);
    EXPECT_EQ(a.output.values(), b.output.values()) << what;
    EXPECT_LT(worst(a.output, r.output), 1e-13) << what;
    Problem plain = p;  // leaving the temperature out (or reading it at the wrong strides) moves the output
    plain.temperature.reset();
    EXPECT_GT(worst(ref->forward(plain).output, r.output), 1e-2) << what;
    const Gradients ga = isolated->backward(p), gb = in_process->backward(p), gr = ref->backward(p);
    EXPECT_EQ(ga.dq.values(), gb.dq.values()) << what;
    EXPECT_LT(worst(ga.dq, gr.dq), 1e-13) << what;
    EXPECT_LT(worst(ga.dk, gr.dk), 1e-13) << what;
    EXPECT_LT(worst(ga.dv, gr.dv), 1e-13) << what;
  }
  Problem p = test::wave_problem(DType::f64, 1, 2, 3, 5, 2);
  p.temperature = QueryTemperature{.B = 1, .H = 1, .T_q = 3, .values = {0.5, 1, 2}};
  try {
    load_implementation(spec("attention_plugin"))->forward(p);
    ADD_FAILURE() << "a temperature was sent to a plug-in that does not declare it";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("a per-query temperature ([1,1,3])"), std::string::npos) << e.what();
  }
}

// The ABI-4 build declares rotary embeddings in both pairings (ATTNCHECK_CAP4_ROPE, _ROPE_INTERLEAVED) and reads
// call->rope (its variant, rotary_dim, base, linear factor and each token's position id), forward and backward (dq and
// dk turned back by R^T), in and out of process; a plug-in that does not declare it is never sent one.
TEST(CPlugin, theAbi4ExampleRotatesQAndKByTheirPositions) {
  const auto isolated = load_implementation(spec("attention_plugin_v4"));
  const auto in_process = load_implementation(spec("attention_plugin_v4"), HarnessOptions{.isolate = false});
  const auto ref = reference_implementation();
  EXPECT_TRUE(isolated->capabilities().declares(Feature::rope));
  EXPECT_TRUE(isolated->capabilities().declares(Feature::rope_interleaved));
  EXPECT_FALSE(load_implementation(spec("attention_plugin"))->capabilities().declares(Feature::rope));
  const auto worst = [](const Tensor<double>& x, const Tensor<double>& y) {
    double m = 0;
    for (Index n = 0; n < x.size(); ++n) m = std::max(m, std::abs(x.values()[n] - y.values()[n]));
    return m;
  };
  for (const RopeVariant variant : {RopeVariant::half_split, RopeVariant::interleaved})
    for (const double factor : {1.0, 4.0}) {
      Problem p = test::wave_problem(DType::f64, 2, 2, 3, 5, 6);
      p.alignment = CausalAlignment::BottomRight;
      p.d_output = test::wave(p.q.shape(), DType::f64, 0.4);
      p.rope = Rope{.variant = variant, .rotary_dim = 4, .base = 500000, .factor = factor};
      // QK-norm too (applied first): both sides with eps inside at factor 1, k alone with eps outside at 4.
      p.qk_norm = QkNorm{.k_weight = {1.25, 0.75, 1, 1.5, 0.5, 1}, .eps = 0.05, .eps_outside = factor != 1};
      if (factor == 1) p.qk_norm->q_weight = {0.75, 1, 1.25, 0.5, 1.5, 1};
      for (Index b = 0; b < 2; ++b) {
        for (Index i = 0; i < 3; ++i) p.rope->q_positions.push_back(100 * b + 2 + i + 7);
        for (Index j = 0; j < 5; ++j) p.rope->k_positions.push_back(100 * b + j + 7);
      }
      const std::string what = std::string(variant == RopeVariant::half_split ? "half-split" : "interleaved") +
                               " factor " + std::to_string(factor);
      const Outcome a = isolated->forward(p), b = in_process->forward(p), r = ref->forward(p);
      EXPECT_EQ(a.output.values(), b.output.values()) << what;
      EXPECT_LT(worst(a.output, r.output), 1e-13) << what;
      Problem plain = p;  // without the rope (or with positions, pairs or factor read wrong) the output moves
      plain.rope.reset();
      EXPECT_GT(worst(ref->forward(plain).output, r.output), 1e-3) << what;
      plain = p;  // and without the QK-norm
      plain.qk_norm.reset();
      EXPECT_GT(worst(ref->forward(plain).output, r.output), 1e-3) << what;
      const Gradients ga = isolated->backward(p), gr = ref->backward(p);
      EXPECT_LT(worst(ga.dq, gr.dq), 1e-13) << what;
      EXPECT_LT(worst(ga.dk, gr.dk), 1e-13) << what;
      EXPECT_LT(worst(ga.dv, gr.dv), 1e-13) << what;
    }
  Problem p = test::wave_problem(DType::f64, 1, 2, 3, 5, 2);
  p.rope = Rope{.rotary_dim = 2, .q_positions = {0, 1, 2}, .k_positions = {0, 1, 2, 3, 4}};
  try {
    load_implementation(spec("attention_plugin"))->forward(p);
    ADD_FAILURE() << "a rope was sent to a plug-in that does not declare it";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("rotary embeddings of q and k (half-split pairs, rotary_dim 2)"),
              std::string::npos)
        << e.what();
  }
}

TEST(CPlugin, theBlockMasksExampleReadsBlockAndDenseMasksThroughTheirStrides) {
  const auto isolated = load_implementation(spec("attention_plugin_block_masks"));
  const auto in_process = load_implementation(spec("attention_plugin_block_masks"), HarnessOptions{.isolate = false});
  const auto ref = reference_implementation();
  for (const auto* impl : {&isolated, &in_process}) {
    const Capabilities& c = (*impl)->capabilities();
    EXPECT_TRUE(
        c.features.contains({Feature::block_mask, Feature::dense_mask, Feature::bidirectional, Feature::backward}));
    EXPECT_EQ(c.abi3_flags, 0xD00u);
  }
  const auto worst = [](const Tensor<double>& x, const Tensor<double>& y) {
    double m = 0;
    for (Index n = 0; n < x.size(); ++n)
      m = std::max(m, x.values()[n] == y.values()[n] ? 0.0 : std::abs(x.values()[n] - y.values()[n]));
    return m;
  };
  for (const auto& extents : kCellExtents)
    for (int which = 0; which < 3; ++which)  // the block mask, the dense mask, both
      for (const bool causal : {true, false}) {
        Problem p = test::cell_masks_problem(2, causal, extents);
        if (which == 1) p.block_mask.reset();
        if (which == 0) p.dense_mask.reset();
        const std::string what = std::to_string(extents[0]) + std::to_string(extents[1]) + std::to_string(extents[2]) +
                                 std::to_string(extents[3]) + std::to_string(extents[4]) + std::to_string(extents[5]) +
                                 " " + std::to_string(which) + (causal ? " causal" : " bidirectional");
        const Outcome a = isolated->forward(p), b = in_process->forward(p), r = ref->forward(p);
        ASSERT_TRUE(a.weights && b.weights && r.weights) << what;
        EXPECT_EQ(a.output.values(), b.output.values()) << what;
        EXPECT_EQ(a.weights->values(), b.weights->values()) << what;
        // float64, T_k = 6, D = 2, |values| <= 1: as for the masks example, 1e-13 is ~500 ulps, and a key seen or
        // hidden moves a weight by more than 0.01.
        EXPECT_LT(worst(a.output, r.output), 1e-13) << what;
        EXPECT_LT(worst(*a.weights, *r.weights), 1e-13) << what;
        for (Index bb = 0; bb < 2; ++bb)
          for (Index h = 0; h < 2; ++h) {
            const Visibility v = p.visibility(bb, h);
            for (Index i = 0; i < 4; ++i)
              for (Index j = 0; j < 6; ++j)
                EXPECT_EQ((*a.weights)(bb, h, i, j) != 0.0, v.visible(i, j))
                    << what << " " << bb << " " << h << " " << i << " " << j;
          }
        const Gradients ga = isolated->backward(p), gb = in_process->backward(p), gr = ref->backward(p);
        EXPECT_EQ(ga.dq.values(), gb.dq.values()) << what;
        EXPECT_LT(worst(ga.dq, gr.dq), 1e-13) << what;
        EXPECT_LT(worst(ga.dk, gr.dk), 1e-13) << what;
        EXPECT_LT(worst(ga.dv, gr.dv), 1e-13) << what;
      }
}

// A block or dense mask goes only to a plug-in that declares it: refused before the call, forward and backward,
// naming the flag, in and out of process, for ABI-2 and ABI-3 plug-ins alike (the neutral value, NULL, is all they
// ever get; the plain example reads call->block_mask and dense_mask, and passes every law).
TEST(CPlugin, anUndeclaredBlockOrDenseMaskIsNeverSent) {
  for (const bool isolate : {true, false})
    for (const std::string& target :
         {spec("attention_plugin"), spec("attention_plugin_masks"), std::string("plugin:" ATTNCHECK_ABI2_PLUGIN)}) {
      const auto impl = load_implementation(target, HarnessOptions{.isolate = isolate});
      EXPECT_FALSE(impl->capabilities().features.intersects({Feature::block_mask, Feature::dense_mask})) << target;
      for (const bool dense : {false, true}) {
        Problem p = test::cell_masks_problem(2);
        p.key_lengths.clear();  // only the mask outside the capabilities
        if (dense)
          p.block_mask.reset();
        else
          p.dense_mask.reset();
        const char* flag = dense ? "ATTNCHECK_CAP3_DENSE_MASK" : "ATTNCHECK_CAP3_BLOCK_MASK";
        for (const bool backward : {false, true}) {
          if (backward && !impl->capabilities().declares(Feature::backward)) continue;
          try {
            backward ? (void)impl->backward(p) : (void)impl->forward(p);
            ADD_FAILURE() << target << " got a " << flag;
          } catch (const std::logic_error& e) {
            EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
          }
        }
      }
    }
}

// A mask whose shape does not fit the call would be read out of bounds through the strides: the loader refuses it
// before the plug-in sees it.
TEST(CPlugin, aCellMaskThatDoesNotFitTheCallIsRefusedBeforeThePluginReadsIt) {
  const auto impl = load_implementation(spec("attention_plugin_block_masks"), HarnessOptions{.isolate = false});
  Problem p = test::cell_masks_problem(2);
  p.dense_mask->cells.pop_back();
  try {
    impl->forward(p);
    ADD_FAILURE() << "sent a dense mask one cell short";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("this call's fields do not fit it: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("dense_mask is ["), std::string::npos) << e.what();
  }
  p = test::cell_masks_problem(2);
  p.block_mask->k_blocks = 3;
  EXPECT_THROW(impl->forward(p), std::logic_error);
}

TEST(CPlugin, thePagedExampleDeclaresPagingInAndOutOfProcess) {
  for (const bool isolate : {true, false}) {
    const Capabilities c =
        load_implementation(spec("attention_plugin_paged"), HarnessOptions{.isolate = isolate})->capabilities();
    EXPECT_TRUE(c.features.contains({Feature::paged, Feature::gqa, Feature::key_padding, Feature::v_head_dim}))
        << isolate;  // V's pool may be D_v wide
    EXPECT_EQ(c.page_sizes, (std::vector<Index>{1, 8, 16, 64, 256})) << isolate;
    EXPECT_EQ(c.page_layouts, 3u) << isolate;
    EXPECT_EQ(c.abi3_flags, 0x10u | 0x1000u) << isolate;  // ATTNCHECK_CAP3_PAGED | ATTNCHECK_CAP3_V_HEAD_DIM
    EXPECT_TRUE(c.supports_paging(16, PageLayout::head_major) && !c.supports_paging(4, PageLayout::token_major));
    EXPECT_FALSE(load_implementation(spec("attention_plugin"), HarnessOptions{.isolate = isolate})
                     ->capabilities()
                     .declares(Feature::paged));
  }
  for (const char* old : {"plugin:" ATTNCHECK_ABI1_PLUGIN, "plugin:" ATTNCHECK_ABI2_PLUGIN})
    EXPECT_FALSE(load_implementation(old)->capabilities().declares(Feature::paged)) << old;
}

// A paged call reaches the plug-in as the pools and the table alone: the example answers ATTNCHECK_ERROR when
// k.data or v.data is not NULL, key_lengths is NULL or a live table entry is not a page of the pool, and reads
// K and V only through the table (junk entries and NaN slots would show). Its answer is bit-identical to its
// answer to the same problem dense (the same arithmetic on the same values: so the table and the pools were the
// problem's), the same through the worker, and agrees with the reference.
TEST(CPlugin, aPagedCallReachesThePluginThroughTheTableAlone) {
  const auto isolated = load_implementation(spec("attention_plugin_paged"));
  const auto in_process = load_implementation(spec("attention_plugin_paged"), HarnessOptions{.isolate = false});
  const auto ref = reference_implementation();
  for (const DType t : {DType::f64, DType::f32, DType::bf16})
    for (const PageLayout layout : {PageLayout::token_major, PageLayout::head_major})
      for (const Index page_size : {1, 8}) {
        const Problem p = paged_problem(t, layout, page_size);
        Problem dense = p;
        dense.paged.reset();
        const std::string what = std::string(dtype_name(t)) + " " + page_layout_name(layout) + " " + std::to_string(page_size);
        const Outcome a = isolated->forward(p), b = in_process->forward(p), d = in_process->forward(dense);
        ASSERT_TRUE(a.weights && b.weights && d.weights) << what;
        EXPECT_EQ(a.output.values(), b.output.values()) << what;
        EXPECT_EQ(a.weights->values(), b.weights->values()) << what;
        EXPECT_EQ(b.output.values(), d.output.values()) << what;
        EXPECT_EQ(b.weights->values(), d.weights->values()) << what;
        if (t != DType::f64) continue;
        const Outcome r = ref->forward(p);
        EXPECT_LT((a.output.values() - r.output.values()).cwiseAbs().maxCoeff(), 1e-13) << what;
        EXPECT_LT((a.weights->values() - r.weights->values()).cwiseAbs().maxCoeff(), 1e-13) << what;
        // V's pool D_v = D + 1 wide: through the worker as in process, and as the reference.
        const Problem pv = with_v_head_dim(p);
        Problem dense_v = pv;
        dense_v.paged.reset();
        const Outcome av = isolated->forward(pv);
        EXPECT_EQ(av.output.values(), in_process->forward(dense_v).output.values()) << what << " D_v";
        EXPECT_LT((av.output.values() - ref->forward(pv).output.values()).cwiseAbs().maxCoeff(), 1e-13) << what;
      }
  // Without key padding the plug-in still gets key_lengths (T_k each), else it would refuse.
  Problem p = paged_problem(DType::f64, PageLayout::token_major, 8);
  p.key_lengths.clear();
  Problem dense = p;
  dense.paged.reset();
  EXPECT_EQ(isolated->forward(p).output.values(), in_process->forward(dense).output.values());
}

// Paged calls go only to a plug-in that declares them, in a page size and layout it declares, and never as a
// backward: each is refused before the call (an internal error: a law or a test sent it).
TEST(CPlugin, aPagedCallIsNeverSentOutsideTheDeclarations) {
  for (const bool isolate : {true, false}) {
    const HarnessOptions o{.isolate = isolate};
    const Problem p = paged_problem(DType::f64, PageLayout::token_major, 8);
    EXPECT_THROW(load_implementation(spec("attention_plugin"), o)->forward(p), std::logic_error) << isolate;
    EXPECT_THROW(load_implementation("plugin:" ATTNCHECK_ABI2_PLUGIN, o)->forward(p), std::logic_error) << isolate;
    const auto paged = load_implementation(spec("attention_plugin_paged"), o);
    Problem odd = paged_problem(DType::f64, PageLayout::token_major, 2);  // 2 is not a declared page size
    EXPECT_THROW(paged->forward(odd), std::logic_error) << isolate;
    // The C example with a backward: a paged backward is refused too.
    Problem bwd = p;
    bwd.d_output = test::wave(p.q.shape(), DType::f64, 0.4);
    EXPECT_THROW(load_implementation(spec("attention_plugin"), o)->backward(bwd), std::logic_error) << isolate;
  }
}

TEST(CPlugin, aPagedDeclarationWithoutAPageSizeIsASpecError) {
  for (const bool isolate : {true, false}) {
    try {
      load_implementation(spec("bad_plugin_v3_paged_no_sizes"), HarnessOptions{.isolate = isolate});
      ADD_FAILURE() << "loaded an ABI-3 table declaring paged K and V without a page size";
    } catch (const SpecError& e) {
      EXPECT_NE(std::string(e.what()).find("flags3 declare ATTNCHECK_CAP3_PAGED but its page_sizes list has 0 "
                                           "entries and its page_layouts are 0x3 (expected at least one page size"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(CPlugin, anAbi3TableWithAnImpossibleDeclarationIsASpecError) {
  for (const bool isolate : {true, false}) {
    try {
      load_implementation(spec("bad_plugin_v3_head_dims"), HarnessOptions{.isolate = isolate});
      ADD_FAILURE() << "loaded an ABI-3 table with head_dim_multiple -8";
    } catch (const SpecError& e) {
      EXPECT_NE(std::string(e.what()).find("head_dim_multiple is -8 (expected 0 or 1 for any D"), std::string::npos)
          << e.what();
    }
  }
}

TEST(CPlugin, gradientsWithOneHeadPerQueryHeadAreAWrongSize) {
  for (const bool isolate : {true, false}) {
    const auto impl = load_implementation(spec("bad_plugin_dk_shape"), HarnessOptions{.isolate = isolate});
    Problem p = test::wave_problem(DType::f64, 1, 2, 3, 3, 2);
    p.k = test::wave({1, 1, 3, 2}, DType::f64, 0.2);
    p.v = test::wave({1, 1, 3, 2}, DType::f64, 0.3);
    p.d_output = test::wave(p.q.shape(), DType::f64, 0.4);
    try {
      impl->backward(p);
      ADD_FAILURE() << "accepted a dk written for 2 heads into 1";
    } catch (const ImplementationError& e) {
      EXPECT_EQ(e.kind(), ImplementationError::Kind::wrong_size);
      EXPECT_NE(std::string(e.what()).find("wrote past the end of its dk [1,1,3,2]"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("dk has k's shape [B,H_kv,T_k,D]"), std::string::npos) << e.what();
    }
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
  // No shrink budget (0): at 0.3 s a timed-out candidate is cheap, and shrinking goes on to the smallest hang.
  const LawResult r = run("oracle-agreement", *impl, 10, 0);
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

// An output element the plug-in never wrote still holds its sentinel, in every call: the second call's buffer of the
// same size is the first's memory, kept (c_plugin.cpp's KeptMappings), and its sentinels are written again.
TEST(CPlugin, anOutputRowLeftUnwrittenIsAWrongSizeEvenInAReusedBuffer) {
  for (const bool isolate : {true, false}) {
    const auto impl = load_implementation(spec("bad_plugin_unwritten"), HarnessOptions{.isolate = isolate});
    Problem p = test::wave_problem(DType::f32, 1, 1, 3, 3, 4);
    const Outcome first = impl->forward(p);  // without a scale it writes every row
    EXPECT_LT((first.output.values() - reference_implementation()->forward(p).output.values()).cwiseAbs().maxCoeff(),
              1e-5);
    p.scale = 0.5;  // the same buffers' sizes
    try {
      impl->forward(p);
      ADD_FAILURE() << "a call that left its last row unwritten returned";
    } catch (const ImplementationError& e) {
      EXPECT_EQ(e.kind(), ImplementationError::Kind::wrong_size) << e.what();
      EXPECT_NE(std::string(e.what()).find("left 4 of 12 elements of its output [1,1,3,4] unwritten (the first at "
                                           "[0,0,2,0])"),
                std::string::npos)
          << e.what();
    }
  }
}

// Far past the sentinels: the inaccessible pages after them fault, and the worker says which buffer it was.
TEST(CPlugin, writingFarPastTheDSinksIsACrashThatNamesThem) {
  const auto impl = load_implementation(spec("bad_plugin_d_sinks_far"));
  Problem p = test::wave_problem(DType::f32, 1, 2, 3, 3, 4);
  p.sinks = {0.5, -1.0};
  p.d_output = p.q;  // dO has the output's shape [B,H,T_q,D]
  try {
    impl->backward(p);
    ADD_FAILURE() << "a backward that wrote 800 KB past its d_sinks returned";
  } catch (const ImplementationError& e) {
    EXPECT_EQ(e.kind(), ImplementationError::Kind::crash) << e.what();
    EXPECT_NE(std::string(e.what()).find("wrote far past the end of its d_sinks (2 doubles, one per query head)"),
              std::string::npos)
        << e.what();
  }
}

TEST(CPlugin, aStatusPluginHDoesNotDefineIsAnAbiError) {
  const auto impl = load_implementation(spec("bad_plugin_unknown_status"), HarnessOptions{.isolate = false});
  try {
    impl->forward(test::wave_problem(DType::f32, 1, 1, 2, 2, 2));
    ADD_FAILURE() << "a forward that returned status 7 was taken for an answer";
  } catch (const ImplementationError& e) {
    EXPECT_EQ(e.kind(), ImplementationError::Kind::protocol) << e.what();
    EXPECT_NE(std::string(e.what()).find("ABI error: its forward returned status 7"), std::string::npos) << e.what();
  }
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
      EXPECT_NE(m.find("loads ABI version 1, 2, 3 or 4"), std::string::npos) << m;
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
