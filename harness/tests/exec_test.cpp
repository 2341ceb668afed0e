// exec: implementations: the protocol carries every dtype bit-exactly, version 2's GQA, key lengths, window
// and backward frames intact, and version-1 clients still work; one child serves every call, and a child that
// raises, exits, crashes, hangs, returns the wrong shape or a NaN is a falsified law; a child that cannot
// start or speaks another protocol is a SpecError.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <thread>

#include "attncheck/harness.hpp"
#include "attncheck/law.hpp"
#include "protocol.hpp"
#include "test_support.hpp"

namespace attncheck {
namespace {

const std::string kPython = "/usr/bin/python3";

bool numpy_available() {
  static const bool ok = std::system((kPython + " -c 'import numpy' 2>/dev/null").c_str()) == 0;
  return ok;
}

std::string python_spec(const std::string& script, const std::string& args = "") {
  return "exec:PYTHONPATH=" ATTNCHECK_PYTHON_DIR " " + kPython + " " + script + (args.empty() ? "" : " " + args);
}

std::string bad_client(const std::string& mode) { return python_spec(ATTNCHECK_TESTS_DIR "/bad_client.py", mode); }

LawResult run(const std::string& law, const Implementation& impl, int cases = 30) {
  RunOptions o;
  o.cases = cases;
  o.gen.dtype = impl.capabilities().dtypes.front();
  return run_law(*find_law(law), impl, o);
}

std::string message_of(const LawResult& r) { return r.violation ? r.violation->message : ""; }

#define REQUIRE_NUMPY() \
  if (!numpy_available()) GTEST_SKIP() << kPython << " cannot import numpy (apt-get install python3-numpy)"

TEST(Exec, everyDtypeCrossesTheWireBitExactly) {
  const auto served = load_implementation("exec:" ATTNCHECK_SERVE_REFERENCE);
  const auto local = reference_implementation();
  EXPECT_EQ(served->capabilities().dtypes, local->capabilities().dtypes);
  for (const DType t : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    Problem p = test::wave_problem(t, 2, 2, 3, 5, 3);
    p.scale = 0.75;
    p.alignment = CausalAlignment::BottomRight;
    const Outcome a = served->forward(p), b = local->forward(p);
    EXPECT_EQ(a.output.values(), b.output.values()) << dtype_name(t);
    ASSERT_TRUE(a.weights && b.weights);
    EXPECT_EQ(a.weights->values(), b.weights->values()) << dtype_name(t);
  }
}

TEST(Exec, numpyExampleHoldsOracleAgreement) {
  REQUIRE_NUMPY();
  const auto impl = load_implementation(python_spec(ATTNCHECK_EXAMPLES_SOURCE_DIR "/python/numpy_attention.py"));
  EXPECT_TRUE(impl->capabilities().returns_weights);
  const LawResult r = run("oracle-agreement", *impl, 20);
  EXPECT_EQ(r.status, LawStatus::held) << message_of(r);
}

// B=2, H=4 over H_kv=2 kv heads, T_q=3 bottom-right over T_k=5, D=2, key lengths {4, 3}, window 1, and dO.
Problem abi2_problem() {
  Problem p = test::wave_problem(DType::f64, 2, 4, 3, 5, 2);
  p.k = test::wave({2, 2, 5, 2}, DType::f64, 0.2);
  p.v = test::wave({2, 2, 5, 2}, DType::f64, 0.3);
  p.alignment = CausalAlignment::BottomRight;
  p.key_lengths = {4, 3};
  p.window = 1;
  p.d_output = test::wave(p.q.shape(), DType::f64, 0.4);
  return p;
}

std::string numpy_example() { return python_spec(ATTNCHECK_EXAMPLES_SOURCE_DIR "/python/numpy_attention.py"); }

TEST(Exec, numpyExampleDeclaresEveryVersion2Capability) {
  REQUIRE_NUMPY();
  const Capabilities c = load_implementation(numpy_example())->capabilities();
  EXPECT_TRUE(c.features.contains({Feature::gqa, Feature::key_padding, Feature::window, Feature::backward}));
  EXPECT_EQ(c.empty_rows, EmptyRows::zero);
}

// Two independent implementations, the C example in-process and the numpy example over the wire, agree on
// GQA, padding, a window and the gradients: the keywords and the backward frames arrive intact.
TEST(Exec, numpyExampleAgreesWithTheCExampleForwardAndBackward) {
  REQUIRE_NUMPY();
  const auto numpy = load_implementation(numpy_example());
  const auto c = load_implementation("plugin:" + test::example_plugin("attention_plugin"),
                                     HarnessOptions{.isolate = false});
  const Problem p = abi2_problem();
  const Outcome a = numpy->forward(p), b = c->forward(p);
  // float64, T_k = 5, D = 2, |values| <= 1: each side rounds a handful of products and sums, ~10 ulps of 1.
  const double tol = 1e-14;
  EXPECT_LT((a.output.values() - b.output.values()).cwiseAbs().maxCoeff(), tol);
  ASSERT_TRUE(a.weights && b.weights);
  EXPECT_LT((a.weights->values() - b.weights->values()).cwiseAbs().maxCoeff(), tol);
  const Gradients ga = numpy->backward(p), gb = c->backward(p);
  EXPECT_EQ(ga.dk.shape(), p.k.shape());
  EXPECT_LT((ga.dq.values() - gb.dq.values()).cwiseAbs().maxCoeff(), tol);
  EXPECT_LT((ga.dk.values() - gb.dk.values()).cwiseAbs().maxCoeff(), tol);
  EXPECT_LT((ga.dv.values() - gb.dv.values()).cwiseAbs().maxCoeff(), tol);
  EXPECT_GT(ga.dk.values().cwiseAbs().maxCoeff(), 0.01);  // not trivially zero
}

// abi2_problem with protocol version 3's modifiers: softcap 2, ALiBi slopes, sinks (one -inf: no sink for head 3)
// and the LSE wanted.
Problem modifiers_problem(bool causal) {
  Problem p = abi2_problem();
  p.softcap = 2.0;
  p.alibi_slopes = {0.5, 0.25, 0.125, 0.0625};
  p.sinks = {0.5, -1.0, 2.0, -std::numeric_limits<double>::infinity()};
  p.causal = causal;
  p.want_lse = true;
  return p;
}

// An additive bias [B_b, H_b, T_q, T_k] for p (B_b, H_b each p's or 1) of multiples of 1/4 in [-1.5, 1.5]: exact in
// every dtype, and large enough that leaving it out moves the output.
ScoreBias modifiers_bias(const Problem& p, Index B_b, Index H_b) {
  ScoreBias bias{.B = B_b, .H = H_b, .T_q = p.q.shape().T, .T_k = p.k.shape().T, .values = {}};
  for (Index n = 0; n < B_b * H_b * bias.T_q * bias.T_k; ++n) bias.values.push_back(0.25 * double((n * 7) % 13) - 1.5);
  return bias;
}

// A temperature [B_t, H_t, T_q] of values in [0.5, 2.75], no two neighbours alike.
QueryTemperature modifiers_temperature(const Problem& p, Index B_t, Index H_t) {
  QueryTemperature t{.B = B_t, .H = H_t, .T_q = p.q.shape().T, .values = {}};
  for (Index n = 0; n < B_t * H_t * t.T_q; ++n) t.values.push_back(0.5 + 0.25 * double((n * 5) % 10));
  return t;
}

double worst(const Tensor<double>& a, const Tensor<double>& b) {
  double m = 0;
  for (Index n = 0; n < a.size(); ++n)
    m = std::max(m, a.values()[n] == b.values()[n] ? 0.0 : std::abs(a.values()[n] - b.values()[n]));
  return m;
}

// The reference served over the wire declares every version-3 modifier and the LSE (its caps frame's flags3), and
// softcap, ALiBi slopes, sinks, causal = false, the LSE and d_sinks cross in both directions bit-exactly.
TEST(Exec, version3ModifiersLseAndDSinksCrossTheWireBitExactly) {
  const auto served = load_implementation("exec:" ATTNCHECK_SERVE_REFERENCE);
  const auto local = reference_implementation();
  const Capabilities& c = served->capabilities();
  EXPECT_TRUE(
      c.features.contains({Feature::lse, Feature::sinks, Feature::softcap, Feature::alibi, Feature::bidirectional}));
  // Paged K and V (0x10), the masks beyond causal (0x20, 0x40, 0x80, 0x200, block 0x400, dense 0x800, query
  // documents 0x20000) and V's own head dimension (0x1000) too.
  EXPECT_EQ(c.abi3_flags, 0x21FFFu);
  EXPECT_TRUE(c.declares(Feature::v_head_dim));
  for (const bool causal : {true, false})
    for (const DType t : {DType::f32, DType::f64, DType::bf16}) {
      Problem p = modifiers_problem(causal);
      for (Tensor<double>* x : {&p.q, &p.k, &p.v, &*p.d_output}) *x = test::wave(x->shape(), t, x->values()[0]);
      p.dtype = t;
      const Outcome a = served->forward(p), b = local->forward(p);
      ASSERT_TRUE(a.lse && b.lse);
      EXPECT_EQ(a.output.values(), b.output.values()) << dtype_name(t);
      EXPECT_EQ(a.lse->values(), b.lse->values()) << dtype_name(t);
      const Gradients ga = served->backward(p), gb = local->backward(p);
      EXPECT_EQ(ga.dq.values(), gb.dq.values()) << dtype_name(t);
      EXPECT_EQ(ga.dsinks, gb.dsinks) << dtype_name(t);
      ASSERT_EQ(ga.dsinks.size(), 4u);
    }
  Problem p = modifiers_problem(true);
  p.want_lse = false;
  EXPECT_FALSE(served->forward(p).lse);  // asked for none, none kept
}

// The Python client: the modifiers arrive as keywords, the LSE (a tuple's third entry, or a dict's "lse" of shape
// [B,H,T_q]) and d_sinks come back, and all of it agrees with the reference core.
TEST(Exec, pythonClientPassesTheModifiersAndReturnsTheLseAndDSinks) {
  REQUIRE_NUMPY();
  const auto ref = reference_implementation();
  for (const char* mode : {"", "dict"}) {
    const auto impl = load_implementation(python_spec(ATTNCHECK_TESTS_DIR "/modifiers_client.py", mode));
    const Capabilities& c = impl->capabilities();
    EXPECT_TRUE(
        c.features.contains({Feature::lse, Feature::sinks, Feature::softcap, Feature::alibi, Feature::bidirectional}))
        << mode;
    EXPECT_TRUE(c.declares(Feature::bias) && c.declares(Feature::bias_grad) && c.declares(Feature::temperature) &&
                c.declares(Feature::rope) && c.declares(Feature::rope_interleaved) && c.declares(Feature::qk_norm) &&
                c.declares(Feature::qk_norm_eps_outside))
        << mode;  // version 4
    for (const bool causal : {true, false}) {
      Problem p = modifiers_problem(causal);
      p.window.reset();  // the client declares no window
      p.bias = modifiers_bias(p, causal ? 1 : 2, causal ? 4 : 1);  // broadcast over B, then over H
      p.temperature = modifiers_temperature(p, causal ? 2 : 1, causal ? 1 : 4);  // over H, then over B
      // Rotary embeddings, one pairing each way, positions from 3 (queries bottom-right of their keys).
      p.rope = Rope{.variant = causal ? RopeVariant::half_split : RopeVariant::interleaved,
                    .rotary_dim = p.q.shape().D - p.q.shape().D % 2,
                    .base = 100,
                    .factor = causal ? 1.0 : 2.0};
      for (Index b = 0; b < p.q.shape().B; ++b) {
        for (Index i = 0; i < p.q.shape().T; ++i) p.rope->q_positions.push_back(3 + b + i);
        for (Index j = 0; j < p.k.shape().T; ++j) p.rope->k_positions.push_back(3 + b + j);
      }
      // QK-norm of both sides (eps inside), then of k alone (eps outside), before the rope.
      const Index D = p.q.shape().D;
      p.qk_norm = QkNorm{.k_weight = std::vector<double>(std::size_t(D), 1.25), .eps = 0.05, .eps_outside = !causal};
      if (causal) p.qk_norm->q_weight = std::vector<double>(std::size_t(D), 0.75);
      const Outcome a = impl->forward(p), r = ref->forward(p);
      ASSERT_TRUE(a.lse && a.weights) << mode;
      // float64, T_k = 5, D = 2: numpy and the core round a handful of products, tanh, exp, log differently.
      EXPECT_LT(worst(a.output, r.output), 1e-13) << mode << causal;
      EXPECT_LT(worst(*a.weights, *r.weights), 1e-13) << mode << causal;
      EXPECT_LT(worst(*a.lse, *r.lse), 1e-13) << mode << causal;
      const Gradients g = impl->backward(p), gr = ref->backward(p);
      EXPECT_LT(worst(g.dq, gr.dq), 1e-13) << mode;
      EXPECT_LT(worst(g.dk, gr.dk), 1e-13) << mode;
      ASSERT_EQ(g.dsinks.size(), 4u) << mode;
      for (std::size_t h = 0; h < 4; ++h) EXPECT_NEAR(g.dsinks[h], gr.dsinks[h], 1e-13) << mode << h;
      EXPECT_GT(std::abs(g.dsinks[0]), 1e-3);
      // dBias in the bias's shape, summed over its broadcast axis, as the core sums it.
      ASSERT_TRUE(g.dbias && gr.dbias) << mode;
      ASSERT_EQ(g.dbias->shape(), gr.dbias->shape()) << mode;
      EXPECT_LT(worst(*g.dbias, *gr.dbias), 1e-13) << mode;
      EXPECT_GT(gr.dbias->values().cwiseAbs().maxCoeff(), 1e-3);
    }
  }
}

// Each law holds on `impl` in 20 float64 cases of T <= 16 (the numpy client computes in float64), every case checked.
void expect_laws_hold_in_20_cases(const Implementation& impl, std::initializer_list<const char*> names) {
  for (const char* law : names) {
    RunOptions o;
    o.cases = 20;
    o.gen.dtype = DType::f64;
    o.gen.max_T = o.gen.max_T_tail = 16;
    const LawResult res = run_law(*find_law(law), impl, o);
    EXPECT_EQ(res.status, LawStatus::held)
        << law << ": " << res.note << (res.violation ? res.violation->message : std::string());
    EXPECT_EQ(res.cases_run, 20) << law;
    std::cout << law << ": " << res.cases_run << " cases, " << res.calls << " calls\n";
  }
}

// The numpy client's dropout (numpy's Philox, laid out its own way): its keep mask is not the reference's, and the
// dropout laws, reading the mask off its weights, hold on it forward and backward.
TEST(Exec, pythonClientDropoutHoldsTheDropoutLaws) {
  REQUIRE_NUMPY();
  const auto impl = load_implementation(python_spec(ATTNCHECK_TESTS_DIR "/modifiers_client.py", ""));
  ASSERT_TRUE(impl->capabilities().declares(Feature::dropout));
  Problem p = test::wave_problem(DType::f64, 1, 2, 8, 8, 2);
  p.dropout = Dropout{.p = 0.5, .seed = 3, .offset = 7};
  const Outcome a = impl->forward(p), r = reference_implementation()->forward(p);
  ASSERT_TRUE(a.weights && r.weights);
  Index differ = 0;
  for (Index n = 0; n < a.weights->size(); ++n)
    differ += (a.weights->values()[n] == 0) != (r.weights->values()[n] == 0);
  EXPECT_GT(differ, 0);  // another RNG: another mask
  expect_laws_hold_in_20_cases(
      *impl, {"dropout-as-its-mask", "dropout-mask-determinism", "dropout-keep-rate", "grad-dropout-mask"});
}

// The numpy client's quantised caches: it gets codes and scales (k and v None) and dequantises them itself; the
// quantised-cache laws hold on it in every format and granularity it declares.
TEST(Exec, pythonClientQuantisedCachesHoldTheQuantLaws) {
  REQUIRE_NUMPY();
  const auto impl = load_implementation(python_spec(ATTNCHECK_TESTS_DIR "/modifiers_client.py", ""));
  ASSERT_TRUE(impl->capabilities().declares(Feature::kv_e4m3fn) &&
              impl->capabilities().declares(Feature::kv_zero_points));
  expect_laws_hold_in_20_cases(
      *impl, {"kv-quant-oracle", "kv-quant-k-scale", "kv-quant-v-scale", "kv-quant-requantise", "kv-quant-dense"});
}

// The PyTorch example (examples/python/torch_modifiers.py, autograd as its backward) on the same calls.
TEST(Exec, torchModifiersExampleAgreesWithTheReference) {
  if (std::system((kPython + " -c 'import torch' 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << kPython << " cannot import torch (apt-get install python3-torch)";
  const auto impl = load_implementation(python_spec(ATTNCHECK_EXAMPLES_SOURCE_DIR "/python/torch_modifiers.py"));
  const auto ref = reference_implementation();
  for (const bool causal : {true, false}) {
    const Problem p = modifiers_problem(causal);
    const Outcome a = impl->forward(p), r = ref->forward(p);
    ASSERT_TRUE(a.lse);
    EXPECT_LT(worst(a.output, r.output), 1e-13) << causal;
    EXPECT_LT(worst(*a.lse, *r.lse), 1e-13) << causal;
    const Gradients g = impl->backward(p), gr = ref->backward(p);
    EXPECT_LT(worst(g.dq, gr.dq), 1e-13);
    EXPECT_LT(worst(g.dk, gr.dk), 1e-13);
    EXPECT_LT(worst(g.dv, gr.dv), 1e-13);
    ASSERT_EQ(g.dsinks.size(), 4u);
    for (std::size_t h = 0; h < 4; ++h) EXPECT_NEAR(g.dsinks[h], gr.dsinks[h], 1e-13) << h;
  }
}

// A client that declares only the LSE and sinks gets only those: its function raises on any other keyword.
TEST(Exec, pythonClientPassesOnlyTheModifiersItDeclares) {
  REQUIRE_NUMPY();
  const auto impl = load_implementation(python_spec(ATTNCHECK_TESTS_DIR "/modifiers_client.py", "strict"));
  const Capabilities& c = impl->capabilities();
  EXPECT_TRUE(c.features.contains({Feature::lse, Feature::sinks}) && !c.declares(Feature::softcap) &&
              !c.declares(Feature::alibi) && !c.declares(Feature::bidirectional));
  Problem p = modifiers_problem(true);
  p.window.reset();
  p.d_output.reset();
  EXPECT_THROW(impl->forward(p), std::logic_error);  // softcap and ALiBi are never sent to it
  p.softcap.reset();
  p.alibi_slopes.clear();
  const Outcome a = impl->forward(p), r = reference_implementation()->forward(p);
  ASSERT_TRUE(a.lse);
  EXPECT_LT(worst(*a.lse, *r.lse), 1e-13);
}

// test::masks_problem at `dtype` (its values rounded there).
Problem masks_problem_at(DType dtype, bool causal, Index D = 2) {
  Problem p = test::masks_problem(D, causal);
  p.dtype = dtype;
  p.q = test::wave(p.q.shape(), dtype, 0.1);
  p.k = test::wave(p.k.shape(), dtype, 0.2);
  p.v = test::wave(p.v.shape(), dtype, 0.3);
  p.d_output = test::wave(p.q.shape(), dtype, 0.4);
  return p;
}

// The reference served over the wire declares the masks beyond causal, and a call with every family (documents with
// empty ones, chunks, a prefix, a right window, causal or not) crosses as its fields and document ids, is decoded
// back into the same visibility, and is answered bit for bit as the reference answers it in process, forward and
// backward.
// ABI 4's additive bias, broadcast or not, in forward and backward frames at every dtype: the served reference
// answers what the local one does, bit for bit, and a bias left out would show.
TEST(Exec, aBiasCrossesTheWireBitExactly) {
  const auto served = load_implementation("exec:" ATTNCHECK_SERVE_REFERENCE);
  const auto local = reference_implementation();
  EXPECT_TRUE(served->capabilities().declares(Feature::bias) && served->capabilities().declares(Feature::bias_grad));
  for (const DType t : {DType::f32, DType::f64, DType::f16, DType::bf16})
    for (const auto [B_b, H_b] : {std::pair<Index, Index>{1, 1}, {2, 1}, {1, 4}, {2, 4}}) {
      Problem p = modifiers_problem(true);
      p.dtype = t;
      p.q = test::wave(p.q.shape(), t, 0.1);
      p.k = test::wave(p.k.shape(), t, 0.2);
      p.v = test::wave(p.v.shape(), t, 0.3);
      p.d_output = test::wave(p.q.shape(), t, 0.4);
      p.bias = modifiers_bias(p, B_b, H_b);
      const std::string what = std::string(dtype_name(t)) + " " + std::to_string(B_b) + "x" + std::to_string(H_b);
      const Outcome a = served->forward(p), b = local->forward(p);
      EXPECT_EQ(a.output.values(), b.output.values()) << what;
      Problem unbiased = p;
      unbiased.bias.reset();
      EXPECT_GT(worst(local->forward(unbiased).output, b.output), 1e-2) << what;
      const Gradients ga = served->backward(p), gb = local->backward(p);
      EXPECT_EQ(ga.dq.values(), gb.dq.values()) << what;
      EXPECT_EQ(ga.dk.values(), gb.dk.values()) << what;
      EXPECT_EQ(ga.dv.values(), gb.dv.values()) << what;
      ASSERT_TRUE(ga.dbias && gb.dbias) << what;
      ASSERT_EQ(ga.dbias->shape(), (Shape{B_b, H_b, p.q.shape().T, p.k.shape().T})) << what;
      EXPECT_EQ(ga.dbias->values(), gb.dbias->values()) << what;
    }
}

TEST(Exec, maskCallsCrossTheWireBitExactly) {
  const auto served = load_implementation("exec:" ATTNCHECK_SERVE_REFERENCE);
  const auto local = reference_implementation();
  const Capabilities& c = served->capabilities();
  EXPECT_TRUE(c.features.contains(
      {Feature::documents, Feature::chunked_local, Feature::prefix, Feature::right_window, Feature::bidirectional}));
  for (const bool causal : {true, false})
    for (const DType t : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
      const Problem p = masks_problem_at(t, causal);
      const std::string what = std::string(dtype_name(t)) + (causal ? " causal" : " bidirectional");
      const Outcome a = served->forward(p), b = local->forward(p);
      EXPECT_EQ(a.output.values(), b.output.values()) << what;
      ASSERT_TRUE(a.weights && b.weights) << what;
      EXPECT_EQ(a.weights->values(), b.weights->values()) << what;
      const Gradients ga = served->backward(p), gb = local->backward(p);
      EXPECT_EQ(ga.dq.values(), gb.dq.values()) << what;
      EXPECT_EQ(ga.dk.values(), gb.dk.values()) << what;
      EXPECT_EQ(ga.dv.values(), gb.dv.values()) << what;
    }
  // With paged K and V too: the mask fields come before the paging, and the served reference reads both back.
  for (const PageLayout layout : {PageLayout::token_major, PageLayout::head_major}) {
    Problem p = test::paged_problem(DType::f64, layout, 8);
    p.doc_bounds = {{1, 3}, {2}};
    p.chunk_size = 4;
    p.prefix_length = 1;
    p.window_right = 0;
    const Outcome a = served->forward(p), b = local->forward(p);
    EXPECT_EQ(a.output.values(), b.output.values()) << page_layout_name(layout);
    ASSERT_TRUE(a.weights && b.weights);
    EXPECT_EQ(a.weights->values(), b.weights->values()) << page_layout_name(layout);
  }
}

// The extents of test::cell_masks_problem's kinds, partial cells and dense mask: broadcast (1) or not (2).
const std::array<Index, 6> kCellExtents[] = {{1, 2, 2, 1, 2, 1}, {2, 1, 1, 2, 1, 2}, {2, 2, 2, 2, 2, 2}, {1, 1, 1, 1, 1, 1}};

// The reference served over the wire declares block and dense masks (flags3 0x400, 0x800), and a call with them
// (every broadcast, causal or not, every dtype) crosses as flags 16384 and 32768 and is answered bit for bit as the
// reference answers it in process, forward and backward.
TEST(Exec, blockAndDenseMaskCallsCrossTheWireBitExactly) {
  const auto served = load_implementation("exec:" ATTNCHECK_SERVE_REFERENCE);
  const auto local = reference_implementation();
  EXPECT_TRUE(served->capabilities().features.contains({Feature::block_mask, Feature::dense_mask}));
  EXPECT_EQ(served->capabilities().abi3_flags & 0xC00u, 0xC00u);
  for (const auto& extents : kCellExtents)
    for (const bool causal : {true, false})
      for (const DType t : {DType::f32, DType::f64, DType::bf16}) {
        Problem p = test::cell_masks_problem(2, causal, extents);
        p.dtype = t;
        p.q = test::wave(p.q.shape(), t, 0.1);
        p.k = test::wave(p.k.shape(), t, 0.2);
        p.v = test::wave(p.v.shape(), t, 0.3);
        p.d_output = test::wave(p.q.shape(), t, 0.4);
        const std::string what = std::string(dtype_name(t)) + (causal ? " causal " : " bidirectional ") +
                                 std::to_string(extents[0]) + std::to_string(extents[1]) + std::to_string(extents[4]);
        const Outcome a = served->forward(p), b = local->forward(p);
        EXPECT_EQ(a.output.values(), b.output.values()) << what;
        ASSERT_TRUE(a.weights && b.weights) << what;
        EXPECT_EQ(a.weights->values(), b.weights->values()) << what;
        const Gradients ga = served->backward(p), gb = local->backward(p);
        EXPECT_EQ(ga.dq.values(), gb.dq.values()) << what;
        EXPECT_EQ(ga.dk.values(), gb.dk.values()) << what;
        EXPECT_EQ(ga.dv.values(), gb.dv.values()) << what;
      }
}

// examples/python/numpy_block_masks.py (the BlockMask's to_dense() and the dense mask folded into one mask per head)
// agrees with the reference on the block mask alone, the dense mask alone and both, for every broadcast: the Python
// client decodes the kinds, the partial cells and the cells as PROTOCOL.md lays them out. A client that does not
// declare them (numpy_packed.py) is never sent one.
TEST(Exec, pythonClientPassesBlockAndDenseMasksAsDefined) {
  REQUIRE_NUMPY();
  const auto impl = load_implementation(python_spec(ATTNCHECK_EXAMPLES_SOURCE_DIR "/python/numpy_block_masks.py"));
  const Capabilities& c = impl->capabilities();
  EXPECT_TRUE(c.features.contains({Feature::block_mask, Feature::dense_mask, Feature::bidirectional, Feature::gqa,
                                   Feature::key_padding, Feature::window}));
  EXPECT_EQ(c.abi3_flags, 0xD00u);
  const auto ref = reference_implementation();
  for (const auto& extents : kCellExtents)
    for (int which = 0; which < 3; ++which)
      for (const bool causal : {true, false}) {
        Problem p = test::cell_masks_problem(2, causal, extents);
        p.d_output.reset();
        if (which == 1) p.block_mask.reset();
        if (which == 0) p.dense_mask.reset();
        const Outcome a = impl->forward(p), r = ref->forward(p);
        // As above: float64, T_k = 6, D = 2, a handful of rounded operations each side.
        EXPECT_LT(worst(a.output, r.output), 1e-13) << which << causal;
        ASSERT_TRUE(a.weights);
        EXPECT_LT(worst(*a.weights, *r.weights), 1e-13) << which << causal;
      }
  const auto undeclared = load_implementation(python_spec(ATTNCHECK_EXAMPLES_SOURCE_DIR "/python/numpy_packed.py"));
  EXPECT_FALSE(undeclared->capabilities().features.intersects({Feature::block_mask, Feature::dense_mask}));
  Problem masked = test::cell_masks_problem(2);
  masked.d_output.reset();
  EXPECT_THROW(undeclared->forward(masked), std::logic_error);
}

// The Python client passes the masks' keywords as serve() documents them (int32 id arrays [B,T_q] and [B,T_k],
// ints, None for no right window), forward and backward: the echo client writes them back. Without the
// declarations the function gets none of those keywords and no call with a family is sent.
TEST(Exec, pythonClientPassesTheMaskKeywordsAsDefined) {
  REQUIRE_NUMPY();
  const auto echo = load_implementation(python_spec(ATTNCHECK_TESTS_DIR "/masks_client.py"));
  const Capabilities& c = echo->capabilities();
  EXPECT_TRUE(c.features.contains(
      {Feature::documents, Feature::chunked_local, Feature::prefix, Feature::right_window, Feature::bidirectional}));
  EXPECT_EQ(c.abi3_flags, 0x3E0u);
  const std::vector<std::vector<double>> k_ids = {{1, 1, 3, 3, 3, 4}, {0, 0, 0, 0, 0, 0}};
  const std::vector<std::vector<double>> q_ids = {{3, 3, 3, 4}, {0, 0, 0, 0}};
  for (const bool causal : {true, false}) {
    const Problem p = test::masks_problem(5, causal);
    const Outcome o = echo->forward(p);
    const Gradients g = echo->backward(p);
    ASSERT_TRUE(o.weights);
    for (Index b = 0; b < 2; ++b)
      for (Index i = 0; i < 4; ++i) {
        for (const Tensor<double>* t : {&o.output, &g.dq}) {
          EXPECT_EQ((*t)(b, 1, i, 0), q_ids[b][i]) << causal << b << i;
          EXPECT_EQ((*t)(b, 1, i, 1), 2.0);
          EXPECT_EQ((*t)(b, 1, i, 2), 1.0);
          EXPECT_EQ((*t)(b, 1, i, 3), 3.0);
          EXPECT_EQ((*t)(b, 1, i, 4), causal ? 1.0 : 0.0);
        }
        for (Index j = 0; j < 6; ++j) EXPECT_EQ((*o.weights)(b, 0, i, j), k_ids[b][j]) << b << i << j;
      }
    for (Index b = 0; b < 2; ++b)
      for (Index j = 0; j < 6; ++j) EXPECT_EQ(g.dk(b, 1, j, 3), k_ids[b][j]) << b << j;
  }
  // Neutral: None, 0, None (-1), 0, True.
  Problem plain = test::wave_problem(DType::f64, 1, 1, 2, 3, 5);
  plain.want_weights = true;
  const Outcome n = echo->forward(plain);
  EXPECT_EQ(n.output(0, 0, 1, 0), -100.0);
  EXPECT_EQ(n.output(0, 0, 1, 1), 0.0);
  EXPECT_EQ(n.output(0, 0, 1, 2), -1.0);
  EXPECT_EQ(n.output(0, 0, 1, 3), 0.0);
  EXPECT_EQ(n.output(0, 0, 1, 4), 1.0);
  const auto undeclared = load_implementation(python_spec(ATTNCHECK_TESTS_DIR "/masks_client.py", "none"));
  const Capabilities& u = undeclared->capabilities();
  EXPECT_FALSE(u.features.intersects(
      {Feature::documents, Feature::chunked_local, Feature::prefix, Feature::right_window, Feature::bidirectional}));
  EXPECT_EQ(undeclared->forward(plain).output(0, 0, 1, 2), -1.0);  // the function raises when given a mask keyword
  Problem masked = test::masks_problem(5);
  masked.d_output.reset();
  EXPECT_THROW(undeclared->forward(masked), std::logic_error);
}

// examples/python/numpy_packed.py (one boolean mask from the definitions) agrees with the reference on each family
// alone and on all of them together, causal or not.
TEST(Exec, numpyPackedExampleAgreesWithTheReference) {
  REQUIRE_NUMPY();
  const auto impl = load_implementation(python_spec(ATTNCHECK_EXAMPLES_SOURCE_DIR "/python/numpy_packed.py"));
  const Capabilities& c = impl->capabilities();
  EXPECT_TRUE(c.features.contains({Feature::documents, Feature::chunked_local, Feature::prefix, Feature::right_window,
                                   Feature::bidirectional, Feature::gqa, Feature::key_padding, Feature::window}));
  const auto ref = reference_implementation();
  for (int which = 0; which < 5; ++which)
    for (const bool causal : {true, false}) {
      Problem p = test::masks_problem(2, causal);
      p.d_output.reset();
      if (which != 0) p.doc_bounds.clear();
      if (which != 1 && which != 4) p.chunk_size = 0;
      if (which != 2 && which != 4) p.prefix_length = 0;
      if (which != 3 && which != 4) p.window_right.reset();
      if (which == 4) p.doc_bounds = test::masks_problem(2).doc_bounds;
      const Outcome a = impl->forward(p), r = ref->forward(p);
      // As above: float64, T_k = 6, D = 2, a handful of rounded operations each side.
      EXPECT_LT(worst(a.output, r.output), 1e-13) << which << causal;
      ASSERT_TRUE(a.weights);
      EXPECT_LT(worst(*a.weights, *r.weights), 1e-13) << which << causal;
    }
}

// The reference served over the wire declares paged K and V (flags3 0x10, its page sizes and both layouts), and a
// paged call crosses as its table and pools, junk entries and NaN free slots included, and is answered bit for
// bit as the reference answers it in process (which reads the pools back through the table too).
TEST(Exec, pagedCallsCrossTheWireBitExactly) {
  const auto served = load_implementation("exec:" ATTNCHECK_SERVE_REFERENCE);
  const auto local = reference_implementation();
  const Capabilities& c = served->capabilities();
  EXPECT_TRUE(c.declares(Feature::paged));
  EXPECT_EQ(c.page_sizes, local->capabilities().page_sizes);
  EXPECT_EQ(c.page_layouts, 3u);
  for (const DType t : {DType::f32, DType::f64, DType::f16, DType::bf16})
    for (const PageLayout layout : {PageLayout::token_major, PageLayout::head_major})
      for (const Index page_size : {1, 8}) {
        Problem p = test::paged_problem(t, layout, page_size);
        const std::string what = std::string(dtype_name(t)) + " " + page_layout_name(layout) + " " + std::to_string(page_size);
        for (const PageFill fill : {PageFill::nan, PageFill::huge, PageFill::zero}) {
          p.paged->fill = fill;
          const Outcome a = served->forward(p), b = local->forward(p);
          EXPECT_EQ(a.output.values(), b.output.values()) << what;
          ASSERT_TRUE(a.weights && b.weights) << what;
          EXPECT_EQ(a.weights->values(), b.weights->values()) << what;
        }
        // V's pool with rows of its own width (D_v = D + 1: FlashMLA's paged latent cache).
        const Problem pv = test::with_v_head_dim(p);
        EXPECT_EQ(served->forward(pv).output.values(), local->forward(pv).output.values()) << what << " D_v";
        p.key_lengths.clear();  // no padding: the frame says T_k for each sequence
        EXPECT_EQ(served->forward(p).output.values(), local->forward(p).output.values()) << what;
      }
}

// An index list crosses the wire per kv head (two query heads to each of two kv heads), padding, repeated entries,
// keys the causal rule hides and block indices included, and the served reference answers it bit for bit as the
// reference does in process.
TEST(Exec, indexListCallsCrossTheWireBitExactly) {
  const auto served = load_implementation("exec:" ATTNCHECK_SERVE_REFERENCE);
  const auto local = reference_implementation();
  EXPECT_TRUE(served->capabilities().declares(Feature::index_list_blocks));
  for (const DType t : {DType::f32, DType::bf16})
    for (const Index block : {1, 2}) {
      Problem p = test::wave_problem(t, 2, 4, 3, 5, 2);
      p.k = test::wave({2, 2, 5, 2}, t, 0.2);
      p.v = test::wave({2, 2, 5, 2}, t, 0.3);
      const Index units = (5 + block - 1) / block;
      IndexList l{.block_size = block, .group = 2, .B = 2, .H = 2, .T_q = 3, .max_k = 3, .indices = {}};
      for (Index r = 0; r < 2 * 2 * 3; ++r)
        for (const Index x : {r % units, Index(-1), (r * 7 + 1) % units}) l.indices.push_back(std::int32_t(x));
      p.index_list = l;
      const Outcome a = served->forward(p), b = local->forward(p);
      EXPECT_EQ(a.output.values(), b.output.values()) << block;
      ASSERT_TRUE(a.weights && b.weights);
      EXPECT_EQ(a.weights->values(), b.weights->values()) << block;
    }
}

// An index list of a paged call crosses as the pool's slots (space 2) in shuffled pages with spares, and the served
// reference, reading the slots back through the table, answers bit for bit as the reference does in process with the
// key positions; slots that hold no key of their sequence, and slots in a call without pages, are refused by name.
TEST(Exec, physicalIndexListsCrossAsSlotsOfThePool) {
  const auto served = load_implementation("exec:" ATTNCHECK_SERVE_REFERENCE);
  const auto local = reference_implementation();
  EXPECT_TRUE(served->capabilities().declares(Feature::index_list_physical));
  for (const Index page_size : {1, 8}) {
    Problem p = test::paged_problem(DType::f32, PageLayout::token_major, page_size);
    p.window.reset();
    IndexList l{.block_size = 1, .group = 2, .B = 2, .H = 2, .T_q = 3, .max_k = 3, .indices = {}, .physical = true};
    for (Index r = 0; r < 2 * 2 * 3; ++r)
      for (const Index x : {r % 5, Index(-1), (r * 7 + 1) % 5}) l.indices.push_back(std::int32_t(x));
    p.index_list = l;
    const std::vector<std::int32_t> slots = physical_indices(l, p.paged_kv(), p.sequence_lengths());
    EXPECT_NE(slots, l.indices) << page_size << ": shuffled pages put some key at another slot";
    const Outcome a = served->forward(p), b = local->forward(p);
    EXPECT_EQ(a.output.values(), b.output.values()) << page_size;
    ASSERT_TRUE(a.weights && b.weights);
    EXPECT_EQ(a.weights->values(), b.weights->values()) << page_size;
  }
  Problem p = test::paged_problem(DType::f32, PageLayout::token_major, 1);
  p.window.reset();
  p.index_list = IndexList{.block_size = 1,
                           .group = 2,
                           .B = 2,
                           .H = 2,
                           .T_q = 3,
                           .max_k = 1,
                           .indices = std::vector<std::int32_t>(12, 0),
                           .physical = true};
  std::string frame = wire::encode_forward(p).substr(wire::kHeaderSize);
  const std::vector<std::int32_t> slots = physical_indices(*p.index_list, p.paged_kv(), p.sequence_lengths());
  const std::string needle(reinterpret_cast<const char*>(slots.data()), slots.size() * sizeof(std::int32_t));
  const std::size_t at = frame.find(needle);
  ASSERT_NE(at, std::string::npos);
  const std::int32_t nowhere = std::int32_t(p.paged_kv().num_pages * 1 + 5);  // past the pool
  std::memcpy(frame.data() + at, &nowhere, 4);
  try {
    wire::decode_forward(frame);
    ADD_FAILURE() << "a slot past the pool was read as a key";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("which holds no key of batch entry 0"), std::string::npos) << e.what();
  }
}

// A tree crosses the wire as parents and as a bitmask in both bit orders, over entries of different lengths (so
// different prefixes, row strides and byte offsets), with grouped heads, and the served reference answers it bit for
// bit as the reference does in process, forward and backward; a tree frame that does not fit is refused by name.
TEST(Exec, treeCallsCrossTheWireBitExactly) {
  const auto served = load_implementation("exec:" ATTNCHECK_SERVE_REFERENCE);
  const auto local = reference_implementation();
  EXPECT_TRUE(served->capabilities().declares(Feature::tree));
  EXPECT_TRUE(served->capabilities().declares(Feature::tree_bitmask));
  for (const DType t : {DType::f32, DType::bf16})
    for (const int form : {0, 1, 2}) {
      Problem p = test::wave_problem(t, 2, 4, 3, 6, 2);
      p.k = test::wave({2, 2, 6, 2}, t, 0.2);
      p.v = test::wave({2, 2, 6, 2}, t, 0.3);
      p.alignment = CausalAlignment::BottomRight;
      p.key_lengths = {6, 4};
      const TokenTree tree{.form = TokenTree::Form::parents, .B = 2, .T_q = 3, .parents = {-1, 0, 0, -1, -1, 1}};
      p.tree = form == 0 ? tree : packed_tree(tree, {6, 4}, form == 2);
      const Outcome a = served->forward(p), b = local->forward(p);
      EXPECT_EQ(a.output.values(), b.output.values()) << form;
      ASSERT_TRUE(a.weights && b.weights);
      EXPECT_EQ(a.weights->values(), b.weights->values()) << form;
      p.d_output = test::wave(p.output_shape(), t, 0.7);
      const Gradients ga = served->backward(p), gb = local->backward(p);
      EXPECT_EQ(ga.dq.values(), gb.dq.values()) << form;
      EXPECT_EQ(ga.dk.values(), gb.dk.values()) << form;
    }
  Problem p = test::wave_problem(DType::f32, 1, 2, 3, 4, 2);
  p.alignment = CausalAlignment::BottomRight;
  p.tree = TokenTree{.form = TokenTree::Form::parents, .B = 1, .T_q = 3, .parents = {-1, 2, 0}};
  try {
    served->forward(p);
    ADD_FAILURE() << "a parent after its child was answered";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("node 1 of batch entry 0 has parent 2; expected -1 (the prefix) or an "
                                         "earlier node in [0, 1)"),
              std::string::npos)
        << e.what();
  }
}

// A paged quantised call crosses as its table and its pools of codes (and scales at each key's page and slot, free
// slots NaN codes and NaN scales), and the served reference, reading it back through the table, answers bit for bit as
// the reference does in process; in every format, per tensor, kv head and token, in both layouts.
TEST(Exec, pagedQuantisedCallsCrossTheWireBitExactly) {
  const auto served = load_implementation("exec:" ATTNCHECK_SERVE_REFERENCE);
  const auto local = reference_implementation();
  EXPECT_TRUE(served->capabilities().declares(Feature::paged_quant));
  for (const QuantFormat f : kQuantFormats)
    for (const QuantGranularity g : {QuantGranularity::tensor, QuantGranularity::kv_head, QuantGranularity::token_head})
      for (const PageLayout layout : {PageLayout::token_major, PageLayout::head_major})
        for (const Index page_size : {1, 8}) {
          if (quant_blocked(f) && g != QuantGranularity::tensor) continue;  // block32 whatever g says
          const Problem p = test::quantised(test::paged_problem(DType::f32, layout, page_size), f, g);
          const std::string what = std::string(quant_format_name(f)) + " " + std::string(quant_granularity_name(g)) +
                                   " " + page_layout_name(layout) + " " + std::to_string(page_size);
          const Outcome a = served->forward(p), b = local->forward(p);
          EXPECT_EQ(a.output.values(), b.output.values()) << what;
          ASSERT_TRUE(a.weights && b.weights) << what;
          EXPECT_EQ(a.weights->values(), b.weights->values()) << what;
          Problem dense = p;  // and as the unpaged quantised call: the same visible keys, the core masks the rest out
          dense.paged.reset();
          EXPECT_EQ(a.output.values(), local->forward(dense).output.values()) << what;
        }
}

// The Python client: a paged call's keywords (PagedKV: the pools in the layout's shape, an int32 table, int64
// seq_lens equal to key_lengths, k and v None; the client raises otherwise), read back with PagedKV.gather(), give
// the answer the same client gives the problem dense, bit for bit, and the reference's.
TEST(Exec, pythonClientGetsAPagedCallAsPoolsAndABlockTable) {
  REQUIRE_NUMPY();
  const auto ref = reference_implementation();
  for (const std::string mode : {"", "head-major"}) {
    const auto impl = load_implementation(python_spec(ATTNCHECK_TESTS_DIR "/paged_client.py", mode));
    const Capabilities& c = impl->capabilities();
    EXPECT_TRUE(c.declares(Feature::paged)) << mode;
    EXPECT_EQ(c.page_sizes, (std::vector<Index>{1, 2, 8, 16})) << mode;
    EXPECT_EQ(c.page_layouts, mode.empty() ? 3u : 2u) << mode;
    for (const DType t : {DType::f64, DType::bf16})
      for (const PageLayout layout : {PageLayout::token_major, PageLayout::head_major})
        for (const Index page_size : {1, 2, 8}) {
          const std::string what = mode + " " + std::string(dtype_name(t)) + " " + page_layout_name(layout) + " " +
                                   std::to_string(page_size);
          const Problem p = test::paged_problem(t, layout, page_size);
          if (!c.supports_paging(page_size, layout)) {
            EXPECT_THROW(impl->forward(p), std::logic_error) << what;  // never sent
            continue;
          }
          Problem dense = p;
          dense.paged.reset();
          const Outcome a = impl->forward(p), d = impl->forward(dense);
          EXPECT_EQ(a.output.values(), d.output.values()) << what;
          ASSERT_TRUE(a.weights && d.weights) << what;
          EXPECT_EQ(a.weights->values(), d.weights->values()) << what;
          if (t == DType::f64) {
            EXPECT_LT(worst(a.output, ref->forward(p).output), 1e-13) << what;
          }
        }
  }
}

// The Python client gets a paged quantised call as pools of codes (quant.k.codes, paged.k_pages the same arrays) with
// scales over the pools' axes, and paged.gather(*quant.dequantize()) gives the values the reference attends to: within
// a handful of float64 roundings of it, in e4m3fn, int8 with zero points and ggml's q4_1, both layouts.
TEST(Exec, pythonClientGetsAPagedQuantisedCallAsPoolsOfCodes) {
  REQUIRE_NUMPY();
  const auto ref = reference_implementation();
  const auto impl = load_implementation(python_spec(ATTNCHECK_TESTS_DIR "/paged_client.py", ""));
  EXPECT_TRUE(impl->capabilities().declares(Feature::paged_quant));
  for (const QuantFormat f : {QuantFormat::e4m3fn, QuantFormat::int8, QuantFormat::ggml_q4_1})
    for (const QuantGranularity g : {QuantGranularity::tensor, QuantGranularity::kv_head, QuantGranularity::token_head})
      for (const PageLayout layout : {PageLayout::token_major, PageLayout::head_major}) {
        if (quant_blocked(f) && g != QuantGranularity::tensor) continue;
        const Problem p = test::quantised(test::paged_problem(DType::f64, layout, 2), f, g);
        const std::string what = std::string(quant_format_name(f)) + " " + std::string(quant_granularity_name(g)) +
                                 " " + page_layout_name(layout);
        const Outcome a = impl->forward(p), r = ref->forward(p);
        EXPECT_LT(worst(a.output, r.output), 1e-13) << what;
        ASSERT_TRUE(a.weights);
        EXPECT_LT(worst(*a.weights, *r.weights), 1e-13) << what;
      }
}

// examples/python/numpy_paged.py (vLLM's token-major layout, read block by block) agrees with the reference.
TEST(Exec, numpyPagedExampleAgreesWithTheReference) {
  REQUIRE_NUMPY();
  const auto impl = load_implementation(python_spec(ATTNCHECK_EXAMPLES_SOURCE_DIR "/python/numpy_paged.py"));
  const Capabilities& c = impl->capabilities();
  EXPECT_TRUE(
      c.features.contains({Feature::paged, Feature::gqa, Feature::key_padding, Feature::window, Feature::v_head_dim}));
  EXPECT_EQ(c.page_sizes, (std::vector<Index>{1, 8, 16, 32}));
  EXPECT_EQ(c.page_layouts, 1u);
  const auto ref = reference_implementation();
  for (const Index page_size : {1, 8}) {
    const Problem p = test::paged_problem(DType::f64, PageLayout::token_major, page_size);
    const Outcome a = impl->forward(p), r = ref->forward(p);
    EXPECT_LT(worst(a.output, r.output), 1e-13) << page_size;
    ASSERT_TRUE(a.weights);
    EXPECT_LT(worst(*a.weights, *r.weights), 1e-13) << page_size;
    const Problem pv = test::with_v_head_dim(p);  // a value cache of its own width
    EXPECT_LT(worst(impl->forward(pv).output, ref->forward(pv).output), 1e-13) << page_size << " D_v";
  }
  EXPECT_THROW(impl->forward(test::paged_problem(DType::f64, PageLayout::head_major, 8)), std::logic_error);
}

TEST(Exec, aVersion1ClientStillWorks) {
  REQUIRE_NUMPY();
  // The frozen version-1 client first on PYTHONPATH: its caps frame has no version-2 extension.
  const auto impl = load_implementation("exec:PYTHONPATH=" ATTNCHECK_TESTS_DIR "/abi1 " + kPython +
                                        " " ATTNCHECK_TESTS_DIR "/bad_client.py weights");
  const Capabilities& c = impl->capabilities();
  EXPECT_TRUE(c.returns_weights);
  EXPECT_FALSE(c.features.intersects({Feature::gqa, Feature::key_padding, Feature::window, Feature::backward}) ||
               c.empty_rows);
  EXPECT_THROW(impl->forward(abi2_problem()), std::logic_error);  // never sent what it cannot read
  const LawResult r = run("oracle-agreement", *impl, 20);
  EXPECT_EQ(r.status, LawStatus::held) << message_of(r);
}

TEST(Exec, gradientsWithOneHeadPerQueryHeadAreAWrongSize) {
  REQUIRE_NUMPY();
  const auto impl = load_implementation(bad_client("dkshape"));
  Problem p = test::wave_problem(DType::f64, 1, 2, 3, 3, 2);
  p.k = test::wave({1, 1, 3, 2}, DType::f64, 0.2);
  p.v = test::wave({1, 1, 3, 2}, DType::f64, 0.3);
  p.d_output = test::wave(p.q.shape(), DType::f64, 0.4);
  try {
    impl->backward(p);
    ADD_FAILURE() << "accepted dk with 2 heads for 1 kv head";
  } catch (const ImplementationError& e) {
    EXPECT_EQ(e.kind(), ImplementationError::Kind::wrong_size);
    EXPECT_NE(std::string(e.what()).find("dk is [1,2,3,2] but must be [1,1,3,2] (the shape of k, [B,H_kv,T_k,D]"),
              std::string::npos)
        << e.what();
  }
}

TEST(Exec, aBadEmptyRowsConventionIsASpecError) {
  REQUIRE_NUMPY();
  try {
    load_implementation(bad_client("emptyrows"));
    ADD_FAILURE() << "accepted empty_rows='nans'";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("empty_rows is 'nans' (expected None, 'zero', 'nan' or 'any')"),
              std::string::npos)
        << e.what();
  }
}

// Protocol version 3's declarations cross the wire (the Python client's keywords), and no law sends the client
// a call outside them: it fails loudly on one (D not in {2, 4}, T_q > T_k), and fills the rows that see no key
// with 7, which no law may read.
TEST(Exec, aVersion3ClientsDeclarationsArriveAndBoundEveryCall) {
  REQUIRE_NUMPY();
  const auto impl = load_implementation(python_spec(ATTNCHECK_TESTS_DIR "/declared_client.py"));
  const Capabilities& c = impl->capabilities();
  EXPECT_TRUE(c.cross_lengths && c.q_shorter && !c.q_longer);
  EXPECT_EQ(c.head_dims, (std::vector<Index>{2, 4}));
  EXPECT_EQ(c.empty_rows, EmptyRows::any);
  for (const char* law : {"oracle-agreement", "row-stochastic", "zero-future-weight", "key-padding-invariance",
                          "decode-consistency", "causal-perturbation", "scale-variance"}) {
    const LawResult r = run(law, *impl, 25);
    EXPECT_EQ(r.status, LawStatus::held) << law << ": " << message_of(r);
  }
  EXPECT_EQ(run("empty-row-convention", *impl, 5).status, LawStatus::not_applicable);
  EXPECT_EQ(run("varlen-equivalence", *impl, 5).status, LawStatus::not_applicable);  // needs T_q > T_k
}

// attncheck::serve() answers each attncheck in its own version: a version-1 hello (one field) gets a
// version-1 caps frame without the version-2 extension, a version-2 hello gets the extension, a version-3 one
// the version-3 declarations too.
TEST(Exec, serveAnswersEachHelloInItsOwnVersion) {
  for (const std::uint32_t newest : {1u, 2u, 3u}) {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    std::thread server([&] { attncheck::serve([] { return reference_implementation(); }, sv[1], sv[1]); });
    // Frames as PROTOCOL.md lays them out: "ATNC", u32 type, u64 length, payload (little-endian).
    const auto frame = [](std::uint32_t type, const std::vector<std::uint32_t>& fields) {
      std::string f = "ATNC";
      const std::uint64_t length = 4 * fields.size();
      f.append(reinterpret_cast<const char*>(&type), 4).append(reinterpret_cast<const char*>(&length), 8);
      for (const std::uint32_t x : fields) f.append(reinterpret_cast<const char*>(&x), 4);
      return f;
    };
    const std::string hello = newest == 1 ? frame(1, {1}) : frame(1, {1, newest});
    ASSERT_EQ(::write(sv[0], hello.data(), hello.size()), ssize_t(hello.size()));
    char header[16];
    ASSERT_EQ(::recv(sv[0], header, 16, MSG_WAITALL), 16);
    std::uint64_t length = 0;
    std::memcpy(&length, header + 8, 8);
    std::string caps(length, '\0');
    ASSERT_EQ(::recv(sv[0], caps.data(), length, MSG_WAITALL), ssize_t(length));
    std::uint32_t version = 0, flags2 = 0, empty_rows = 0;
    std::memcpy(&version, caps.data(), 4);
    EXPECT_EQ(version, newest);
    // u32 version, dtypes, alignments, flags, i64 max_T, then two strings: "reference" and its description.
    const std::size_t v1_size = 24 + 4 + reference_implementation()->name().size() + 4 +
                                reference_implementation()->description().size();
    // Version 3 appends u32 flags3, u32 regimes, i64 multiple, i64 max D, u32 0 head dims, u32 layouts, u32 m
    // page sizes and m i64: 36 bytes and its page sizes for the reference, which declares no regime or head
    // dimension but paged K and V.
    const std::size_t v3_size = 36 + 8 * reference_implementation()->capabilities().page_sizes.size();
    EXPECT_EQ(caps.size(), newest == 1 ? v1_size : newest == 2 ? v1_size + 8 : v1_size + 8 + v3_size);
    if (newest >= 2 && caps.size() >= v1_size + 8) {
      std::memcpy(&flags2, caps.data() + v1_size, 4);
      std::memcpy(&empty_rows, caps.data() + v1_size + 4, 4);
      const Capabilities& c = reference_implementation()->capabilities();
      EXPECT_EQ(flags2, (c.declares(Feature::gqa) ? 1u : 0u) | (c.declares(Feature::key_padding) ? 2u : 0u) |
                            (c.declares(Feature::window) ? 4u : 0u) | (c.declares(Feature::backward) ? 8u : 0u));
      EXPECT_EQ(empty_rows, 1u);  // the reference's convention: zero
    }
    const std::string bye = frame(6, {});
    ASSERT_EQ(::write(sv[0], bye.data(), bye.size()), ssize_t(bye.size()));
    server.join();
    ::close(sv[0]);
    ::close(sv[1]);
  }
}

TEST(Exec, strayPrintsGoToStderrNotIntoTheProtocol) {
  REQUIRE_NUMPY();
  const auto impl = load_implementation(bad_client("print"));
  const Outcome o = impl->forward(test::wave_problem(DType::f64, 1, 1, 3, 3, 2));
  EXPECT_TRUE(o.output.values().allFinite());
}

struct Misbehaviour {
  std::string mode, kind, detail;
};

// gtest prints a parameter in the test's name; the mode says it all.
void PrintTo(const Misbehaviour& m, std::ostream* os) { *os << m.mode; }

class ExecMisbehaviour : public ::testing::TestWithParam<Misbehaviour> {};

TEST_P(ExecMisbehaviour, isAFalsifiedLawAndTheRunGoesOn) {
  REQUIRE_NUMPY();
  const Misbehaviour& m = GetParam();
  const auto impl = load_implementation(bad_client(m.mode), HarnessOptions{.call_timeout_s = 0.5});
  const LawResult r = run("oracle-agreement", *impl, 20);
  ASSERT_EQ(r.status, LawStatus::falsified);
  EXPECT_EQ(message_of(r).rfind(m.kind + ":", 0), 0u) << message_of(r);
  EXPECT_NE(message_of(r).find(m.detail), std::string::npos) << message_of(r);
  // A case below the misbehaviour's threshold still works: the implementation (restarted if needed) serves on.
  EXPECT_NO_THROW(impl->forward(test::wave_problem(DType::f64, 1, 1, 1, 1, 1)));
}

INSTANTIATE_TEST_SUITE_P(
    Modes, ExecMisbehaviour,
    ::testing::Values(Misbehaviour{"raise", "error status", "ZeroDivisionError: kernel blew up at T_q = 2"},
                      Misbehaviour{"exit", "crash", "exited with status 3"},
                      Misbehaviour{"segv", "crash", "killed by signal 11"},
                      Misbehaviour{"hang", "timeout", "no answer within 0.5 s"},
                      Misbehaviour{"shape", "wrong size", "output is [1,1,1,1] but q is [1,1,1,2]"},
                      Misbehaviour{"nan", "non-finite output", "output[0,0,1,0] is nan"},
                      Misbehaviour{"noweights", "wrong size", "returned no weights"}),
    [](const auto& info) { return info.param.mode; });

// After the first timeout, a hang costs a timeout derived from the slowest answer (at least 1 s), not the
// configured one: shrinking a hanging case would otherwise cost a whole --timeout per candidate. Forward and
// backward calls alike: bad_client's `mode` hangs in one of them once T_k >= 2.
void expect_derived_timeouts(const std::string& mode, bool backward) {
  const auto impl = load_implementation(bad_client(mode), HarnessOptions{.call_timeout_s = 3});
  Problem hangs = test::wave_problem(DType::f64, 1, 1, 2, 2, 1);
  hangs.d_output = test::wave(hangs.q.shape(), DType::f64, 0.4);
  const Problem answers = test::wave_problem(DType::f64, 1, 1, 1, 1, 1);
  EXPECT_NO_THROW(impl->forward(answers));
  const auto message_of_call = [&] {
    try {
      if (backward)
        impl->backward(hangs);
      else
        impl->forward(hangs);
    } catch (const ImplementationError& e) {
      EXPECT_EQ(e.kind(), ImplementationError::Kind::timeout) << e.what();
      return std::string(e.what());
    }
    ADD_FAILURE() << "a hanging call returned";
    return std::string();
  };
  const std::string first = message_of_call();
  EXPECT_NE(first.find("no answer within 3 s"), std::string::npos) << first;
  const std::string second = message_of_call();
  EXPECT_NE(second.find("no answer within 1 s"), std::string::npos) << second;
  EXPECT_NE(second.find("after an earlier timeout"), std::string::npos) << second;
  // A call that answers still works after both hangs.
  EXPECT_NO_THROW(impl->forward(answers));
}

TEST(Exec, afterTheFirstTimeoutLaterHangsGetTheDerivedTimeout) {
  REQUIRE_NUMPY();
  expect_derived_timeouts("hang", false);
}

TEST(Exec, aHangingBackwardGetsTheDerivedTimeoutToo) {
  REQUIRE_NUMPY();
  expect_derived_timeouts("hangbackward", true);
}

// A frame too large for the call is refused from its header, at once, with both sizes named: not read, not
// waited for until the timeout.
TEST(Exec, anOversizedFrameIsRefusedAtOnce) {
  const auto impl = load_implementation("exec:" + kPython + " " ATTNCHECK_TESTS_DIR "/big_frame.py",
                                        HarnessOptions{.call_timeout_s = 60});
  const auto started = std::chrono::steady_clock::now();
  try {
    impl->forward(test::wave_problem(DType::f64, 1, 1, 2, 2, 1));
    ADD_FAILURE() << "accepted a 2^40-byte frame";
  } catch (const ImplementationError& e) {
    EXPECT_EQ(e.kind(), ImplementationError::Kind::protocol) << e.what();
    EXPECT_NE(std::string(e.what()).find("announced a payload of 1099511627776 bytes, more than the "),
              std::string::npos)
        << e.what();
  }
  // "At once": well inside the 60 s a call may take (the refusal needs only the 16-byte header).
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(30));
}

// serve() (the plug-in host's loop) on input from a peer that breaks the protocol: it ends with exit code 2,
// never by an allocation the peer asked for or an exception. `frames` is everything the peer sends.
int serve_input(const std::string& frames) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  const int out = ::open("/dev/null", O_WRONLY);
  EXPECT_EQ(::write(fds[1], frames.data(), frames.size()), ssize_t(frames.size()));
  ::close(fds[1]);
  const int rc = serve([] { return reference_implementation(); }, fds[0], out);
  ::close(fds[0]);
  ::close(out);
  return rc;
}

std::string frame_bytes(std::uint32_t type, std::uint64_t announced, const std::string& payload) {
  std::string f = "ATNC";
  f.append(reinterpret_cast<const char*>(&type), 4);
  f.append(reinterpret_cast<const char*>(&announced), 8);
  return f + payload;
}

const std::string kHello = frame_bytes(1, 4, std::string("\x01\0\0\0", 4));

TEST(Serve, aHeaderAnnouncingAHugePayloadEndsTheSessionWithoutAllocatingIt) {
  EXPECT_EQ(serve_input(kHello + frame_bytes(4, std::uint64_t{1} << 60, "a few bytes")), 2);
}

TEST(Serve, aForwardFrameWhoseShapeOverflowsTheElementCountIsAProtocolError) {
  std::string payload;
  const auto u32 = [&](std::uint32_t x) { payload.append(reinterpret_cast<const char*>(&x), 4); };
  const auto i64 = [&](std::int64_t x) { payload.append(reinterpret_cast<const char*>(&x), 8); };
  u32(2), u32(1), u32(0), u32(0), i64(0);  // float64, top-left, no flags, reserved, scale
  for (int n = 0; n < 8; ++n) i64(std::int64_t{1} << 32);  // q and k [2^32,2^32,2^32,2^32]: 2^131 bytes each
  payload += std::string(64, '\0');
  EXPECT_EQ(serve_input(kHello + frame_bytes(4, payload.size(), payload)), 2);
}

// A paged forward frame written byte by byte as PROTOCOL.md lays it out ("Paged K and V"): one sequence of 3 keys
// (D = 1, float64) in pages of 2, its table row {2, 0, -1} (the third entry junk), and NaN in every free slot.
// serve() answers it as the reference answers the dense problem; a live entry outside the pool, or flag 512
// without flag 4, is a protocol error (exit 2).
std::string paged_frame(std::int32_t second_page, std::uint32_t flags) {
  std::string payload;
  const auto u32 = [&](std::uint32_t x) { payload.append(reinterpret_cast<const char*>(&x), 4); };
  const auto i32 = [&](std::int32_t x) { payload.append(reinterpret_cast<const char*>(&x), 4); };
  const auto i64 = [&](std::int64_t x) { payload.append(reinterpret_cast<const char*>(&x), 8); };
  const auto f64 = [&](double x) { payload.append(reinterpret_cast<const char*>(&x), 8); };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  u32(2), u32(1), u32(flags), u32(0), f64(0);  // float64, top-left, flags, reserved, scale (none)
  for (const std::int64_t x : {1, 1, 2, 1}) i64(x);  // q [B=1, H=1, T_q=2, D=1]
  for (const std::int64_t x : {1, 1, 3, 1}) i64(x);  // k [B=1, H_kv=1, T_k=3, D=1]
  if (flags & 4u) i64(3);                             // the sequence's length
  u32(1), u32(0), i64(2), i64(3), i64(3);             // token-major, reserved, page_size 2, 3 pages, 3 columns
  i32(2), i32(second_page), i32(-1);                  // the table: keys 0, 1 in page 2, key 2 in page 0
  f64(0.5), f64(-1.0);                                // q
  for (const double x : {0.25, nan, nan, nan, 1.0, -2.0}) f64(x);  // K pool: page 0 {k2, free}, 1 free, 2 {k0, k1}
  for (const double x : {3.0, nan, nan, nan, 1.0, 2.0}) f64(x);    // V pool, the same
  return frame_bytes(4, payload.size(), payload);
}

TEST(Serve, aPagedForwardFrameAsProtocolMdLaysItOutIsAnswered) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  std::thread server([&] { attncheck::serve([] { return reference_implementation(); }, sv[1], sv[1]); });
  const std::string hello = frame_bytes(1, 8, std::string("\x01\0\0\0\x03\0\0\0", 8));
  const std::string request = hello + paged_frame(0, 0x204u | 2u) + frame_bytes(6, 0, "");  // 2: weights wanted
  const auto read_frame = [&] {
    char header[16];
    EXPECT_EQ(::recv(sv[0], header, 16, MSG_WAITALL), 16);
    std::uint64_t length = 0;
    std::memcpy(&length, header + 8, 8);
    std::string payload(length, '\0');
    EXPECT_EQ(::recv(sv[0], payload.data(), length, MSG_WAITALL), ssize_t(length));
    return payload;
  };
  ASSERT_EQ(::write(sv[0], request.data(), request.size()), ssize_t(request.size()));
  read_frame();  // caps
  const std::string result = read_frame();
  server.join();
  ::close(sv[0]);
  ::close(sv[1]);
  // i32 status 0, u32 flags 1 (weights follow), an empty message, [1,1,2,1] and 2 doubles, [1,1,2,3] and 6.
  ASSERT_EQ(result.size(), 4 + 4 + 4 + 32 + 16 + 32 + 48u);
  std::int32_t status = -1;
  std::uint32_t flags = 0;
  std::memcpy(&status, result.data(), 4);
  std::memcpy(&flags, result.data() + 4, 4);
  EXPECT_EQ(status, 0);
  EXPECT_EQ(flags, 1u);
  double out[2], w[6];
  std::memcpy(out, result.data() + 12 + 32, 16);
  std::memcpy(w, result.data() + 12 + 32 + 16 + 32, 48);
  Problem dense;
  dense.dtype = DType::f64;
  dense.q = Tensor<double>(Shape{1, 1, 2, 1});
  dense.k = Tensor<double>(Shape{1, 1, 3, 1});
  dense.v = Tensor<double>(Shape{1, 1, 3, 1});
  dense.q.values() << 0.5, -1.0;
  dense.k.values() << 1.0, -2.0, 0.25;
  dense.v.values() << 1.0, 2.0, 3.0;
  const Outcome r = reference_implementation()->forward(dense);
  EXPECT_EQ(out[0], r.output.values()[0]);
  EXPECT_EQ(out[1], r.output.values()[1]);
  for (int n = 0; n < 6; ++n) EXPECT_EQ(w[n], r.weights->values()[n]) << n;
  EXPECT_EQ(serve_input(kHello + paged_frame(3, 0x204u)), 2);  // page 3 of a pool of 3
  EXPECT_EQ(serve_input(kHello + paged_frame(0, 0x200u)), 2);  // no lengths
}

// V with a head dimension of its own (PROTOCOL.md, "forward"): flag 131072, an i64 D_v right after k's shape (at
// 88), then v [B,H_kv,T_k,D_v]; a backward frame's dO has the output's shape [B,H,T_q,D_v]. Both decode to the
// same tensors; a D_v of 0 or equal to D with the flag is refused, naming what was expected.
TEST(Serve, aValueHeadDimOfItsOwnCrossesTheProtocol) {
  Problem p = test::wave_problem(DType::f64, 1, 2, 3, 4, 2);
  p.v = test::wave({1, 2, 4, 5}, DType::f64, 0.3);
  p.d_output = test::wave({1, 2, 3, 5}, DType::f64, 0.7);
  const std::string fwd = wire::encode_forward(p).substr(wire::kHeaderSize);
  std::uint32_t flags = 0;
  std::memcpy(&flags, fwd.data() + 8, 4);
  EXPECT_EQ(flags & 131072u, 131072u);
  std::int64_t d_v = 0;
  std::memcpy(&d_v, fwd.data() + 88, 8);
  EXPECT_EQ(d_v, 5);
  EXPECT_EQ(fwd.size(), 96 + 8 * std::size_t(12 + 16 + 40));  // q [1,2,3,2], k [1,2,4,2], v [1,2,4,5]
  const Problem d = wire::decode_forward(fwd);
  EXPECT_EQ(d.v.shape(), (Shape{1, 2, 4, 5}));
  EXPECT_EQ(d.v.values(), p.v.values());
  const Problem b = wire::decode_backward(wire::encode_backward(p).substr(wire::kHeaderSize));
  ASSERT_TRUE(b.d_output);
  EXPECT_EQ(b.d_output->shape(), (Shape{1, 2, 3, 5}));
  EXPECT_EQ(b.d_output->values(), p.d_output->values());
  for (const std::int64_t bad : {std::int64_t{0}, std::int64_t{2}}) {
    std::string f = fwd;
    std::memcpy(f.data() + 88, &bad, 8);
    try {
      wire::decode_forward(f);
      ADD_FAILURE() << "accepted D_v = " << bad;
    } catch (const wire::ProtocolError& e) {
      EXPECT_NE(std::string(e.what()).find("V head dimension " + std::to_string(bad)), std::string::npos) << e.what();
    }
  }
  // Without a D_v of its own the frame is the one it always was: no flag, no field.
  Problem plain = p;
  plain.v = test::wave({1, 2, 4, 2}, DType::f64, 0.3);
  std::memcpy(&flags, wire::encode_forward(plain).data() + wire::kHeaderSize + 8, 4);
  EXPECT_EQ(flags & 131072u, 0u);
}

// A forward frame with every mask family, as PROTOCOL.md lays it out ("Masks beyond causal"): after the window
// (i64 at 104, flags 4 and 8 being set) come the prefix at 112, the right window at 120, the chunk size at 128, then
// B·T_q = 8 query ids at 136 and B·T_k = 12 key ids at 168. It decodes to the problem's fields and doc_bounds
// (the bound past T_k, which no key id can carry, dropped: the visibility is the same); ids that break the rules
// are a protocol error naming what was expected and what came, and serve() then exits 2.
TEST(Serve, documentIdsDecodeToDocBoundsAndBadIdsAreRefusedNamingWhatWasExpected) {
  Problem p = test::masks_problem(2);
  p.d_output.reset();
  const std::string good = wire::encode_forward(p).substr(wire::kHeaderSize);
  const auto i32_at = [&](std::size_t off) {
    std::int32_t x;
    std::memcpy(&x, good.data() + off, 4);
    return x;
  };
  const auto i64_at = [&](std::size_t off) {
    std::int64_t x;
    std::memcpy(&x, good.data() + off, 8);
    return x;
  };
  std::uint32_t flags = 0;
  std::memcpy(&flags, good.data() + 8, 4);
  EXPECT_EQ(flags, 2u | 4u | 8u | 1024u | 2048u | 4096u | 8192u);
  EXPECT_EQ(i64_at(104), 3);  // the window
  EXPECT_EQ(i64_at(112), 2);  // prefix
  EXPECT_EQ(i64_at(120), 1);  // right window
  EXPECT_EQ(i64_at(128), 3);  // chunk
  const std::vector<std::int32_t> q_ids = {3, 3, 3, 4, 0, 0, 0, 0}, k_ids = {1, 1, 3, 3, 3, 4, 0, 0, 0, 0, 0, 0};
  for (std::size_t n = 0; n < 8; ++n) EXPECT_EQ(i32_at(136 + 4 * n), q_ids[n]) << n;
  for (std::size_t n = 0; n < 12; ++n) EXPECT_EQ(i32_at(168 + 4 * n), k_ids[n]) << n;
  const Problem d = wire::decode_forward(good);
  EXPECT_EQ(d.doc_bounds, (std::vector<std::vector<Index>>{{0, 2, 2, 5}, {}}));
  EXPECT_EQ(d.prefix_length, 2);
  EXPECT_EQ(d.window_right, std::optional<Index>(1));
  EXPECT_EQ(d.chunk_size, 3);
  EXPECT_TRUE(d.causal);
  // Without the families the frame is the one it always was: flags 2, 4, 8 and no field more.
  Problem plain = p;
  plain.doc_bounds.clear();
  plain.prefix_length = plain.chunk_size = 0;
  plain.window_right.reset();
  // 88 bytes of fields and shapes, 2 key lengths, the window, then q (32 doubles), k and v (48 each).
  EXPECT_EQ(wire::encode_forward(plain).size(), wire::kHeaderSize + 112 + 8 * (32 + 2 * 48));
  EXPECT_EQ(serve_input(kHello + frame_bytes(4, good.size(), good)), 0);  // answered, then the input ends
  const auto broken = [&](std::size_t off, std::int32_t value) {
    std::string b = good;
    std::memcpy(b.data() + off, &value, 4);
    return b;
  };
  const auto broken64 = [&](std::size_t off, std::int64_t value) {
    std::string b = good;
    std::memcpy(b.data() + off, &value, 8);
    return b;
  };
  const auto refused = [&](const std::string& payload, const std::string& expected) {
    try {
      wire::decode_forward(payload);
      ADD_FAILURE() << "decoded a frame that should say: " << expected;
    } catch (const wire::ProtocolError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
    EXPECT_EQ(serve_input(kHello + frame_bytes(4, payload.size(), payload)), 2) << expected;
  };
  refused(broken(168 + 4 * 3, 2), "forward frame: k_doc_ids[0][3] is 2 (expected >= 3, the id of the key before it: "
                                  "key ids are non-decreasing)");
  refused(broken(168 + 4 * 6, -1), "forward frame: k_doc_ids[1][0] is -1 (expected an id >= 0)");
  refused(broken(136 + 4 * 1, 2), "forward frame: q_doc_ids[0][1] is 2 (expected >= 3, the id of the query before "
                                  "it: query ids are non-decreasing)");
  refused(broken(136 + 4 * 4, -1), "forward frame: q_doc_ids[1][0] is -1 (expected an id >= 0)");
  refused(broken(136 + 4 * 7, 1 << 20), "forward frame: q_doc_ids[1][3] is 1048576 (expected at most 1024: the "
                                        "last key's document 0 plus 1024 empty ones)");
  {  // query ids of their own (query documents): bounds of their own, as many as the keys' ones
    std::string own = good;
    const std::int32_t ids[] = {0, 1, 3, 4};
    std::memcpy(own.data() + 136, ids, sizeof ids);
    const Problem o = wire::decode_forward(own);
    EXPECT_EQ(o.doc_bounds, d.doc_bounds);
    EXPECT_EQ(o.q_doc_bounds, (std::vector<std::vector<Index>>{{1, 2, 2, 3}, {}}));
    EXPECT_EQ(wire::encode_forward(o).substr(wire::kHeaderSize, 216), own.substr(0, 216)) << "and encode back";
    // A query in a document past the last key's (an empty one at the end, which key ids cannot name).
    const std::int32_t past[] = {0, 0, 0, 1};
    std::memcpy(own.data() + 136 + 16, past, sizeof past);
    const Problem e = wire::decode_forward(own);
    EXPECT_EQ(e.doc_bounds, (std::vector<std::vector<Index>>{{0, 2, 2, 5}, {6}}));
    EXPECT_EQ(e.q_doc_bounds, (std::vector<std::vector<Index>>{{1, 2, 2, 3}, {3}}));
    EXPECT_TRUE(d.q_doc_bounds.empty()) << "ids that follow from the positions decode to no query bounds";
  }
  refused(broken(168 + 4 * 11, std::numeric_limits<std::int32_t>::max()),
          "forward frame: k_doc_ids[1][5] is 2147483647, which makes more than 1036 document bounds in all");
  refused(broken64(112, 0), "forward frame: prefix length 0 (expected >= 1 with flag 1024)");
  refused(broken64(128, -4), "forward frame: chunk size -4 (expected >= 1 with flag 4096)");
  refused(broken64(120, -2), "forward frame: right window -2 (expected >= 0 with flag 2048)");
  refused(good.substr(0, 150), "forward frame: q_doc_ids of 2 x 4 ids but 14 bytes are left");
  // A backward frame carries them too, and is checked the same way.
  Problem bwd = test::masks_problem(2);
  const std::string back = wire::encode_backward(bwd).substr(wire::kHeaderSize);
  EXPECT_EQ(wire::decode_backward(back).doc_bounds, d.doc_bounds);
  std::string bad_back = back;
  const std::int32_t minus_seven = -7;
  std::memcpy(bad_back.data() + 136, &minus_seven, 4);
  try {
    wire::decode_backward(bad_back);
    ADD_FAILURE() << "decoded a backward frame with a bad query id";
  } catch (const wire::ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("backward frame: q_doc_ids[0][0] is -7 (expected an id >= 0)"),
              std::string::npos)
        << e.what();
  }
}

// A forward frame with a block mask and a dense mask, as PROTOCOL.md lays it out ("Block and dense masks"): flags
// 2 + 4 + 16384 + 32768; after the key lengths (88) the block mask at 104 (block_q, block_k, B_m, H_m, q_blocks,
// k_blocks), its 1·2·2·2 kinds at 152, B_p and H_p at 160 and its 2·1·4·6 partial cells at 176; the dense mask's B_d
// and H_d at 224 and its 2·1·4·6 cells at 240; q at 288. It decodes to the same masks, backward too; a frame that
// breaks a rule is a protocol error naming what was expected and what came (and serve() exits 2), and no count it
// announces is allocated before the bytes are there.
TEST(Serve, blockAndDenseMasksRoundTripAndMalformedOnesAreRefusedNamingWhatWasExpected) {
  Problem p = test::cell_masks_problem(2);
  p.d_output.reset();
  const std::string good = wire::encode_forward(p).substr(wire::kHeaderSize);
  const auto i64_at = [&](std::size_t off) {
    std::int64_t x;
    std::memcpy(&x, good.data() + off, 8);
    return x;
  };
  std::uint32_t flags = 0;
  std::memcpy(&flags, good.data() + 8, 4);
  EXPECT_EQ(flags, 2u | 4u | 16384u | 32768u);
  EXPECT_EQ((std::vector<std::int64_t>{i64_at(104), i64_at(112), i64_at(120), i64_at(128), i64_at(136), i64_at(144)}),
            (std::vector<std::int64_t>{3, 4, 1, 2, 2, 2}));
  EXPECT_EQ(good.substr(152, 8), std::string("\1\2\0\1\2\0\1\2", 8));  // (1 + h + 2m + n) % 3
  EXPECT_EQ(i64_at(160), 2);  // B_p
  EXPECT_EQ(i64_at(168), 1);  // H_p
  EXPECT_EQ(i64_at(224), 2);  // B_d
  EXPECT_EQ(i64_at(232), 1);  // H_d
  for (std::size_t n = 0; n < 48; ++n) {
    EXPECT_EQ(good[176 + n], char(p.block_mask->partial.cells[n])) << n;
    EXPECT_EQ(good[240 + n], char(p.dense_mask->cells[n])) << n;
  }
  EXPECT_EQ(good.size(), 288 + 8 * (32 + 2 * 48));  // q [2,2,4,2], k and v [2,2,6,2]
  const Problem d = wire::decode_forward(good);
  EXPECT_EQ(d.block_mask, p.block_mask);
  EXPECT_EQ(d.dense_mask, p.dense_mask);
  for (const auto& extents : kCellExtents) {
    const Problem e = test::cell_masks_problem(2, false, extents);
    const Problem back = wire::decode_backward(wire::encode_backward(e).substr(wire::kHeaderSize));
    EXPECT_EQ(back.block_mask, e.block_mask);
    EXPECT_EQ(back.dense_mask, e.dense_mask);
    EXPECT_FALSE(back.causal);
  }
  // No block partial: no partial cells (B_p = H_p = 0) and no byte more.
  Problem no_partial = p;
  no_partial.dense_mask.reset();
  std::fill(no_partial.block_mask->kinds.begin(), no_partial.block_mask->kinds.end(), std::uint8_t(BlockKind::Full));
  no_partial.block_mask->partial = DenseMask{};
  const std::string np = wire::encode_forward(no_partial).substr(wire::kHeaderSize);
  EXPECT_EQ(np.size(), 176 + 8 * (32 + 2 * 48));
  EXPECT_EQ(wire::decode_forward(np).block_mask, no_partial.block_mask);
  // Without them the frame is the one it always was.
  Problem plain = p;
  plain.block_mask.reset();
  plain.dense_mask.reset();
  EXPECT_EQ(wire::encode_forward(plain).size(), wire::kHeaderSize + 104 + 8 * (32 + 2 * 48));
  EXPECT_EQ(serve_input(kHello + frame_bytes(4, good.size(), good)), 0);  // answered, then the input ends
  const auto broken64 = [&](std::size_t off, std::int64_t value, const std::string& from = "") {
    std::string b = from.empty() ? good : from;
    std::memcpy(b.data() + off, &value, 8);
    return b;
  };
  const auto broken8 = [&](std::size_t off, char value) {
    std::string b = good;
    b[off] = value;
    return b;
  };
  const auto refused = [&](const std::string& payload, const std::string& expected) {
    try {
      wire::decode_forward(payload);
      ADD_FAILURE() << "decoded a frame that should say: " << expected;
    } catch (const wire::ProtocolError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
    EXPECT_EQ(serve_input(kHello + frame_bytes(4, payload.size(), payload)), 2) << expected;
  };
  refused(broken64(104, 0), "forward frame: block mask block_q is 0 (expected in [1, 2^32] with flag 16384)");
  refused(broken64(112, std::int64_t{1} << 40), "forward frame: block mask block_k is 1099511627776 (expected in [1, 2^32]");
  refused(broken64(120, 3), "forward frame: block mask B is 3 (expected 1 (broadcast) or 2, the call's B)");
  refused(broken64(128, 0), "forward frame: block mask H is 0 (expected 1 (broadcast) or 2, the call's H (query heads))");
  refused(broken64(136, 1), "forward frame: block mask has 1 query blocks (expected 2 = ceil(T_q / block_q) = ceil(4 / 3))");
  refused(broken64(144, 3), "forward frame: block mask has 3 key blocks (expected 2 = ceil(T_k / block_k) = ceil(6 / 4))");
  refused(broken8(152 + 5, 3), "forward frame: block mask kind [0][1][0][1] is 3 (expected 0 empty, 1 partial or 2 full)");
  refused(broken64(160, 0), "forward frame: block mask partial cells are 0 x 1 (expected both 0, no partial cells, or "
                            "neither)");
  refused(broken64(168, 0, broken64(160, 0)), "forward frame: block mask has partial blocks but no partial cells");
  refused(broken64(168, 4), "forward frame: block mask partial cells' H is 4 (expected 0 (no partial cells), 1 "
                            "(broadcast) or 2, the call's H (query heads))");
  refused(broken8(176 + 7, 2), "forward frame: block mask partial cells[0][0][1][1] is 2 (expected 0 hidden or 1 visible)");
  refused(broken64(232, 3), "forward frame: dense mask H is 3 (expected 1 (broadcast) or 2, the call's H (query heads))");
  refused(good.substr(0, 250), "forward frame: dense mask of 2 x 1 x 4 x 6 cells but 10 bytes are left");
  refused(broken8(240 + 47, 9), "forward frame: dense mask[1][0][3][5] is 9 (expected 0 hidden or 1 visible)");
  refused(good.substr(0, 155), "forward frame: block mask kinds of 1 x 2 x 2 x 2 blocks but 3 bytes are left");
  // Extents of 2^32 (q's B, H and T_q, k's B and T_k, and the block mask's H: the call's, so that every check before
  // the count passes) would need 2^32 · 1431655766 · 2^30 kinds: refused as more than what is left, not allocated.
  Problem unpadded = p;
  unpadded.key_lengths.clear();  // the block mask then starts at 88
  std::string huge = wire::encode_forward(unpadded).substr(wire::kHeaderSize);
  const auto put64 = [&](std::size_t off, std::int64_t x) { std::memcpy(huge.data() + off, &x, 8); };
  for (const std::size_t off : {24u, 32u, 40u, 56u, 72u, 112u}) put64(off, std::int64_t{1} << 32);
  put64(120, 1431655766);  // ceil(2^32 / 3) query blocks
  put64(128, std::int64_t{1} << 30);  // 2^32 / 4 key blocks
  refused(huge, "forward frame: block mask kinds of 1 x 4294967296 x 1431655766 x 1073741824 blocks but ");
  // A flag beyond 16777216 is refused, naming the bits; flag 65536 (layout) needs a layout code in 1-5.
  std::string unknown = good;
  const std::uint32_t high = flags | 134217728u;
  std::memcpy(unknown.data() + 8, &high, 4);
  refused(unknown, "8388608 quantised K and V, 16777216 quantised Q, 33554432 index list, 67108864 tree)");
  // Quantised Q comes only with its cache.
  std::string q_alone = good;
  const std::uint32_t with_q = flags | 16777216u;
  std::memcpy(q_alone.data() + 8, &with_q, 4);
  refused(q_alone, "flags have 16777216 (quantised Q) without 8388608 (quantised K and V)");
  std::string laid = good;
  const std::uint32_t with_layout = flags | 65536u;
  std::memcpy(laid.data() + 8, &with_layout, 4);
  refused(laid, "forward frame: layout 0 (expected 1 token-major, 2 padded, 3 kv-broadcast, 4 kv-interleaved or 5 "
                "v-is-k with flag 65536)");
  const std::uint32_t padded = 2;
  std::memcpy(laid.data() + 12, &padded, 4);
  EXPECT_EQ(wire::decode_forward(laid).layout, InputLayout::padded);
}

TEST(Exec, aCommandThatDoesNotStartIsASpecError) {
  try {
    load_implementation("exec:/nonexistent/attention-server");
    ADD_FAILURE() << "started a command that does not exist";
  } catch (const SpecError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("exited with status 127"), std::string::npos) << m;
    EXPECT_NE(m.find("PROTOCOL.md"), std::string::npos) << m;
  }
}

TEST(Exec, aChildThatPrintsTextInsteadOfFramesIsASpecError) {
  try {
    load_implementation("exec:echo hello world, I am not a protocol");
    ADD_FAILURE() << "accepted text as a handshake";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("expected a frame starting with \"ATNC\" but got \"hello world, I "),
              std::string::npos)
        << e.what();
  }
}

TEST(Exec, anotherProtocolVersionNamesBoth) {
  try {
    load_implementation("exec:" + kPython + " " ATTNCHECK_TESTS_DIR "/wrong_version.py");
    ADD_FAILURE() << "accepted protocol version 5";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("speaks protocol version 5 but this attncheck speaks versions 1 to 4"),
              std::string::npos)
        << e.what();
  }
}

// A child's allocator keeps what one call frees for the next (attncheck/allocator.hpp); a tunable the user set is
// theirs, and the tunables of theirs that attncheck has no opinion on stay.
TEST(Exec, aChildGetsTheAllocatorTunablesUnlessTheUserSetThem) {
  const auto seen = [] {
    try {
      load_implementation("exec:sh -c 'echo \"tunables<$GLIBC_TUNABLES>\" >&2; exit 3'");
    } catch (const SpecError& e) {
      const std::string m = e.what();
      const auto a = m.rfind("tunables<"), z = m.find('>', a);  // the child's stderr, after the command
      return a == std::string::npos || z == std::string::npos ? "not in the message: " + m : m.substr(a + 9, z - a - 9);
    }
    return std::string("started");
  };
  const char* given = std::getenv("GLIBC_TUNABLES");
  const std::optional<std::string> before = given ? std::optional<std::string>(given) : std::nullopt;
  ::unsetenv("GLIBC_TUNABLES");
  EXPECT_EQ(seen(), "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824");
  ::setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=5:glibc.malloc.tcache_count=0", 1);
  EXPECT_EQ(seen(), "glibc.malloc.trim_threshold=5:glibc.malloc.tcache_count=0:glibc.malloc.mmap_threshold=33554432");
  if (before)
    ::setenv("GLIBC_TUNABLES", before->c_str(), 1);
  else
    ::unsetenv("GLIBC_TUNABLES");
}

TEST(Exec, aChildThatFailsToStartShowsItsStderr) {
  try {
    load_implementation("exec:" + kPython + " -c 'import attncheck_no_such_module'");
    ADD_FAILURE() << "accepted a child that died";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("No module named 'attncheck_no_such_module'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace attncheck
