// The feature table (attncheck/features.hpp) is the one contract: every feature crosses the exec protocol (its
// caps frame and its forward or backward frame), the C ABI's table and the JSON of a stored case without loss; the
// capability check names it when it is not declared and stays silent when it is; and the Python client's bits and
// keywords are the table's.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "attncheck/features.hpp"
#include "attncheck/report_json.hpp"
#include "c_plugin.hpp"
#include "protocol.hpp"
#include "test_support.hpp"

namespace attncheck {
namespace {

// A call that uses `f` and no other feature (B 1, H 2, T_q 3, T_k 4, D 2, float64); nullopt for a claim about
// results that no call uses.
std::optional<Problem> witness(Feature f) {
  Problem p = test::wave_problem(DType::f64, 1, 2, 3, 4, 2);
  switch (f) {
    case Feature::gqa:
      p.k = test::wave({1, 1, 4, 2}, DType::f64, 0.2);
      p.v = test::wave({1, 1, 4, 2}, DType::f64, 0.3);
      break;
    case Feature::key_padding: p.key_lengths = {3}; break;
    case Feature::window: p.window = 1; break;
    case Feature::backward:
      p.d_output = test::wave({1, 2, 3, 2}, DType::f64, 0.7);
      p.want_weights = false;  // a backward call returns gradients only
      break;
    case Feature::lse: p.want_lse = true; break;
    case Feature::sinks: p.sinks = {0.5, -std::numeric_limits<double>::infinity()}; break;
    case Feature::softcap: p.softcap = 5.0; break;
    case Feature::alibi: p.alibi_slopes = {0.5, 0.25}; break;
    case Feature::bidirectional: p.causal = false; break;
    case Feature::documents: p.doc_bounds = {{2}}; break;
    case Feature::query_documents:
      p.doc_bounds = {{2}};
      p.q_doc_bounds = {{1}};
      break;
    case Feature::chunked_local: p.chunk_size = 2; break;
    case Feature::prefix: p.prefix_length = 1; break;
    case Feature::right_window: p.window_right = 0; break;
    case Feature::block_mask: {
      BlockMask m;
      m.block_q = 2;
      m.block_k = 2;
      m.q_blocks = 2;
      m.k_blocks = 2;
      m.kinds = {2, 0, 1, 2};
      m.partial = DenseMask{1, 1, 3, 4, {1, 1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1}};
      p.block_mask = m;
      break;
    }
    case Feature::dense_mask: p.dense_mask = DenseMask{1, 2, 3, 4, std::vector<std::uint8_t>(24, 1)}; break;
    case Feature::v_head_dim: p.v = test::wave({1, 2, 4, 3}, DType::f64, 0.3); break;
    case Feature::strided: p.layout = InputLayout::token_major; break;
    case Feature::paged: p.paged = PagedPlan{}; break;
    case Feature::bias:  // broadcast over the batch, one [T_q, T_k] per head
      p.bias = ScoreBias{.B = 1, .H = 2, .T_q = 3, .T_k = 4, .values = {}};
      for (int n = 0; n < 24; ++n) p.bias->values.push_back(0.25 * double(n % 5) - 0.5);
      break;
    case Feature::temperature:  // one per batch entry and query, broadcast over the heads
      p.temperature = QueryTemperature{.B = 1, .H = 1, .T_q = 3, .values = {0.5, 1.25, 3}};
      break;
    case Feature::rope:
    case Feature::rope_interleaved:  // rotary_dim 2 of D = 2, a decode-like offset
      p.rope = Rope{.variant = f == Feature::rope ? RopeVariant::half_split : RopeVariant::interleaved,
                    .rotary_dim = 2,
                    .base = 10000,
                    .factor = 2,
                    .q_positions = {7, 8, 9},
                    .k_positions = {6, 7, 8, 9}};
      break;
    case Feature::qk_norm:
    case Feature::qk_norm_eps_outside:  // k alone normalised, weights of D = 2
      p.qk_norm = QkNorm{.k_weight = {0.75, 1.25}, .eps = 1e-3, .eps_outside = f == Feature::qk_norm_eps_outside};
      break;
    case Feature::rope_ntk:
    case Feature::rope_llama3:  // rotary_dim 2 of D = 2 needs linear or Llama 3; NTK's 4 needs D = 4
      p = test::wave_problem(DType::f64, 1, 2, 3, 4, 4);
      p.rope = Rope{.rotary_dim = 4, .base = 100, .factor = 8, .q_positions = {7, 8, 9}, .k_positions = {6, 7, 8, 9}};
      p.rope->scaling = f == Feature::rope_ntk ? RopeScaling::ntk : RopeScaling::llama3;
      p.rope->original_max_position = 64;
      p.rope->low_freq_factor = 0.5;
      break;
    case Feature::dropout:  // a seed past 2^63, as a u64 crosses every codec
      p.dropout = Dropout{.p = 0.25, .seed = 0xFEEDFACECAFEBEEFull, .offset = 12345};
      break;
    case Feature::kv_ggml_q8_0:
    case Feature::kv_ggml_q4_0:
    case Feature::kv_ggml_q4_1:
    case Feature::kv_ggml_q5_0:
    case Feature::kv_ggml_q5_1: {  // two rows of ggml's blocks (D = 64), scales of both signs and a minimum
      const QuantFormat fmt = QuantFormat(std::uint8_t(QuantFormat::ggml_q8_0) +
                                          std::uint8_t(std::uint8_t(f) - std::uint8_t(Feature::kv_ggml_q8_0)));
      p = test::wave_problem(DType::f64, 1, 2, 3, 4, 64);
      QuantizedKV qk{.format = fmt,
                     .k = quant_extents(QuantGranularity::block32, p.k.shape()),
                     .v = quant_extents(QuantGranularity::block32, p.v.shape())};
      for (QuantScales* s : {&qk.k, &qk.v})
        for (Index n = 0; n < s->B * s->H * s->T * s->C; ++n) {
          s->scales.push_back(double(Eigen::half(float(n % 3 == 0 ? -0.0625 : 0.03125 * double(n % 5 + 1)))));
          if (quant_has_min(fmt)) s->mins.push_back(double(Eigen::half(float(-0.25 * double(n % 4)))));
        }
      p.k = quantize_dequantize(fmt, qk.k, p.k);
      p.v = quantize_dequantize(fmt, qk.v, p.v);
      p.quant = qk;
      break;
    }
    case Feature::kv_e4m3fn:
    case Feature::kv_e5m2:
    case Feature::kv_int8:
    case Feature::kv_scale_per_head:
    case Feature::kv_scale_per_token:
    case Feature::kv_zero_points: {  // K and V as a cache holds them: per tensor, per kv head, per token
      const QuantFormat fmt = f == Feature::kv_e5m2   ? QuantFormat::e5m2
                              : f == Feature::kv_int8 || f == Feature::kv_zero_points ? QuantFormat::int8
                                                                                      : QuantFormat::e4m3fn;
      const QuantGranularity g = f == Feature::kv_scale_per_head    ? QuantGranularity::kv_head
                                 : f == Feature::kv_scale_per_token ? QuantGranularity::token_head
                                                                    : QuantGranularity::tensor;
      QuantizedKV qk{.format = fmt, .k = quant_extents(g, p.k.shape()), .v = quant_extents(g, p.v.shape())};
      for (QuantScales* s : {&qk.k, &qk.v})
        for (Index n = 0; n < s->B * s->H * s->T; ++n) {
          s->scales.push_back(double(float(0.0625 + 0.011 * double(n))));  // not powers of two
          if (f == Feature::kv_zero_points) s->zero_points.push_back(double(n % 7) - 3);
        }
      p.k = quantize_dequantize(fmt, qk.k, p.k);
      p.v = quantize_dequantize(fmt, qk.v, p.v);
      p.quant = qk;
      break;
    }
    case Feature::q_quant: {  // an e4m3fn cache per tensor, and Q in e4m3fn with a scale per query head
      QuantizedKV qk{.format = QuantFormat::e4m3fn,
                     .k = quant_extents(QuantGranularity::tensor, p.k.shape()),
                     .v = quant_extents(QuantGranularity::tensor, p.v.shape()),
                     .q = quant_extents(QuantGranularity::kv_head, p.q.shape())};
      qk.k.scales = {0.0625};
      qk.v.scales = {0.125};
      qk.q->scales = {double(float(0.0731)), double(float(0.0419))};
      p.q = quantize_dequantize(qk.format, *qk.q, p.q);
      p.k = quantize_dequantize(qk.format, qk.k, p.k);
      p.v = quantize_dequantize(qk.format, qk.v, p.v);
      p.quant = qk;
      break;
    }
    case Feature::paged_quant: {  // an e4m3fn cache scaled per token and kv head, in pages
      QuantizedKV qk{.format = QuantFormat::e4m3fn,
                     .k = quant_extents(QuantGranularity::token_head, p.k.shape()),
                     .v = quant_extents(QuantGranularity::token_head, p.v.shape())};
      for (QuantScales* s : {&qk.k, &qk.v})
        for (Index n = 0; n < s->B * s->H * s->T; ++n) s->scales.push_back(double(float(0.0625 + 0.013 * double(n))));
      p.k = quantize_dequantize(qk.format, qk.k, p.k);
      p.v = quantize_dequantize(qk.format, qk.v, p.v);
      p.quant = qk;
      p.paged = PagedPlan{};
      break;
    }
    case Feature::index_list:  // per kv head (here one per query head), padding and a duplicate
      p.index_list = IndexList{.block_size = 1, .group = 1, .B = 1, .H = 2, .T_q = 3, .max_k = 2,
                               .indices = {0, -1, 1, 0, 2, 2, 0, 1, -1, -1, 3, 1}};
      break;
    case Feature::index_list_blocks:  // blocks of 2 keys
      p.index_list = IndexList{.block_size = 2, .group = 1, .B = 1, .H = 2, .T_q = 3, .max_k = 1,
                               .indices = {0, 1, -1, 1, 0, 0}};
      break;
    case Feature::index_list_per_query_head:  // two query heads over one kv head, a list each
      p.k = test::wave({1, 1, 4, 2}, DType::f64, 0.2);
      p.v = test::wave({1, 1, 4, 2}, DType::f64, 0.3);
      p.index_list = IndexList{.block_size = 1, .group = 1, .B = 1, .H = 2, .T_q = 3, .max_k = 2,
                               .indices = {0, -1, 1, 0, 2, 2, 0, 1, -1, -1, 3, 1}};
      break;
    case Feature::index_list_physical:  // as index_list, in a paged call: the entries cross as the pool's slots
      p.index_list = IndexList{.block_size = 1, .group = 1, .B = 1, .H = 2, .T_q = 3, .max_k = 2,
                               .indices = {0, -1, 1, 0, 2, 2, 0, 1, -1, -1, 3, 1}, .physical = true};
      p.paged = PagedPlan{.order = PagedPlan::Order::reversed, .spare_pages = 1};
      break;
    case Feature::tree:  // a prefix key, then node 0 and node 1 roots, node 2 node 0's child (bottom-right)
    case Feature::tree_bitmask: {  // the same, packed most significant bit first
      p.alignment = CausalAlignment::BottomRight;
      TokenTree t{.form = TokenTree::Form::parents, .B = 1, .T_q = 3, .parents = {-1, -1, 0}};
      p.tree = f == Feature::tree ? t : packed_tree(t, {4}, true);
      break;
    }
    case Feature::layout_invariant:
    case Feature::batch_invariant:
    case Feature::bias_grad:
    case Feature::q_dot_ggml_q8:
    case Feature::p_fp8:
    case Feature::index_list_counted:
    case Feature::index_list_current_block: return std::nullopt;
  }
  return p;
}

// What a witness of `f` uses besides f: what f is declared with, and for a quantised cache's granularity the format
// its witness comes in (a granularity shapes a format's scales and is declared beside whichever formats a kernel
// reads).
std::set<Feature> comes_with(Feature f) {
  if (f == Feature::kv_scale_per_head || f == Feature::kv_scale_per_token || f == Feature::q_quant)
    return {Feature::kv_e4m3fn};
  if (f == Feature::paged_quant) return {Feature::paged, Feature::kv_e4m3fn, Feature::kv_scale_per_token};
  if (f == Feature::index_list_per_query_head) return {Feature::index_list, Feature::gqa};
  if (f == Feature::index_list_physical) return {Feature::index_list, Feature::paged};
  if (const auto& r = feature(f).requires_feature) return {*r};
  return {};
}

// The reference's capabilities with every feature declared.
Capabilities all_features() {
  Capabilities caps = reference_implementation()->capabilities();
  caps.features = FeatureSet::all();
  return caps;
}

// Those without `f` (and without what requires it).
Capabilities without(Feature f) {
  Capabilities caps = all_features();
  for (const FeatureRow& r : kFeatures)
    if (r.id == f || r.requires_feature == f) caps.features.remove(r.id);
  return caps;
}

// Capabilities that declare `f` (and what it requires) and no other feature.
Capabilities only(Feature f) {
  Capabilities caps;
  caps.features = {f};
  if (const auto& req = feature(f).requires_feature) caps.features.add(*req);
  if (caps.features.has(Feature::paged)) {
    caps.page_sizes = {16};
    caps.page_layouts = 1;
  }
  return caps;
}

std::set<Feature> declared_in(const Capabilities& caps) {
  std::set<Feature> out;
  for (const FeatureRow& r : kFeatures)
    if (caps.declares(r.id)) out.insert(r.id);
  return out;
}

std::string problem_json(const Problem& p) { return reports::to_json(p).dump(); }

TEST(Contract, everyFeatureHasAWitnessThatUsesItAndNoOther) {
  for (const FeatureRow& f : kFeatures) {
    const std::optional<Problem> w = witness(f.id);
    EXPECT_EQ(w.has_value(), f.used != nullptr) << f.name;
    if (!w) continue;
    for (const FeatureRow& g : kFeatures) {
      if (!g.used) continue;
      EXPECT_EQ(g.used(*w), g.id == f.id || comes_with(f.id).count(g.id) > 0) << f.name << " uses " << g.name;
    }
  }
}

TEST(Contract, theCapabilityCheckNamesAnUndeclaredFeatureAndOnlyThen) {
  for (const FeatureRow& f : kFeatures) {
    const std::optional<Problem> w = witness(f.id);
    if (!w) continue;
    const std::vector<Need> missing = call_needs(*w, without(f.id));
    ASSERT_EQ(missing.size(), 1u) << f.name;
    EXPECT_EQ(missing[0].feature, f.id) << f.name;
    EXPECT_EQ(missing[0].words, f.needs(*w)) << f.name;
    EXPECT_EQ(needs_outside(*w, without(f.id)), std::vector<std::string>{f.needs(*w)}) << f.name;
    EXPECT_TRUE(needs_outside(*w, all_features()).empty()) << f.name;
    // The C loader and the exec client refuse such a call (it would be sent unfaithfully), but the LSE, which an
    // implementation that does not declare it simply does not return.
    if (f.ignored_when_undeclared) {
      EXPECT_NO_THROW(detail::check_within_capabilities(*w, without(f.id), "impl", f.id == Feature::backward)) << f.name;
    } else {
      try {
        detail::check_within_capabilities(*w, without(f.id), "impl", f.id == Feature::backward);
        ADD_FAILURE() << f.name << ": a call that needs it was not refused";
      } catch (const std::logic_error& e) {
        EXPECT_NE(std::string(e.what()).find(f.needs(*w)), std::string::npos) << e.what();
      }
    }
    EXPECT_NO_THROW(detail::check_within_capabilities(*w, all_features(), "impl", f.id == Feature::backward)) << f.name;
  }
}

TEST(Contract, describeCapabilitiesSaysEachDeclaredFeatureInItsWords) {
  for (const FeatureRow& f : kFeatures) {
    const std::string on = describe_capabilities(only(f.id)), off = describe_capabilities(without(f.id));
    EXPECT_NE(on.find("; " + std::string(f.words)), std::string::npos) << on;
    EXPECT_EQ(off.find("; " + std::string(f.words)), std::string::npos) << off;
    if (!f.words_off.empty()) {
      EXPECT_NE(off.find("; " + std::string(f.words_off)), std::string::npos) << off;
    }
  }
}

TEST(Contract, everyFeatureDeclaredCrossesTheExecCapsFrameAndTheCAbiTable) {
  for (const FeatureRow& f : kFeatures) {
    const std::set<Feature> want = declared_in(only(f.id));
    // The exec protocol's caps frame (version 3).
    wire::Handshake h;
    h.version = wire::kProtocolVersion;
    h.caps = only(f.id);
    h.name = "contract";
    const wire::Handshake d = wire::decode_caps(wire::encode_caps(h).substr(wire::kHeaderSize));
    EXPECT_EQ(declared_in(d.caps), want) << f.name;
    // The C ABI: an ABI-4 table with the feature's bits (the backward by its function).
    attncheck_plugin_v4 t{};
    t.abi_version = ATTNCHECK_PLUGIN_ABI_V4;
    t.table_size = ATTNCHECK_PLUGIN_V4_SIZE;
    t.dtypes = ATTNCHECK_DTYPE_F64;
    t.name = "contract";
    for (const Feature g : want) {
      t.flags |= feature(g).abi_flag;
      t.flags3 |= feature(g).flags3;
      t.flags4 |= feature(g).flags4;
      t.flags4b |= feature(g).flags4b;
    }
    if (f.id == Feature::backward)
      t.backward = [](const attncheck_backward_call*, char*, size_t) -> std::int32_t { return ATTNCHECK_OK; };
    const std::int64_t page_sizes[] = {16};
    if (want.count(Feature::paged)) {
      t.page_sizes = page_sizes;
      t.num_page_sizes = 1;
      t.page_layouts = ATTNCHECK_PAGED_TOKEN_MAJOR;
    }
    const auto* v1 = reinterpret_cast<const attncheck_plugin_v1*>(&t);
    const Capabilities c =
        detail::declared_capabilities(v1, reinterpret_cast<const attncheck_plugin_v2*>(&t),
                                      reinterpret_cast<const attncheck_plugin_v3*>(&t), &t);
    EXPECT_EQ(declared_in(c), want) << f.name;
  }
}

// Version 4's caps frame ends with flags4 and flags4b: a bit the table does not define is refused naming it, a
// version-4 frame that ends at flags4 (a client built before flags4b) declares none of flags4b's, and a version-3
// frame (an older client's) has neither and still reads.
TEST(Contract, theVersion4CapsFrameCarriesFlags4AndAVersion3OneStillReads) {
  wire::Handshake h;
  h.caps = all_features();
  h.name = "contract";
  for (const std::uint32_t version : {3u, 4u}) {
    h.version = version;
    const std::string payload = wire::encode_caps(h).substr(wire::kHeaderSize);
    const wire::Handshake d = wire::decode_caps(payload);
    EXPECT_EQ(d.version, version);
    std::set<Feature> want = declared_in(h.caps);
    if (version < 4)  // ABI 4's features are not in a version-3 frame: such a client is never sent them
      std::erase_if(want, [](Feature f) { return feature(f).flags4 != 0 || feature(f).flags4b != 0; });
    EXPECT_EQ(declared_in(d.caps), want) << version;
    if (version == 4) {  // flags4 and flags4b are the frame's last two u32s
      const std::uint32_t unknown = 0x80000000u;
      for (const std::size_t from_end : {8u, 4u}) {
        std::string bad = payload;
        std::memcpy(bad.data() + bad.size() - from_end, &unknown, 4);
        const std::string word = from_end == 8 ? "flags4 bits are 2147483648 (expected ATTNCHECK_CAP4_* bits"
                                               : "flags4b bits are 2147483648 (expected ATTNCHECK_CAP4B_* bits";
        try {
          wire::decode_caps(bad);
          ADD_FAILURE() << word << " read";
        } catch (const wire::ProtocolError& e) {
          EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
        }
      }
      const wire::Handshake old = wire::decode_caps(payload.substr(0, payload.size() - 4));
      std::set<Feature> before = declared_in(h.caps);
      std::erase_if(before, [](Feature f) { return feature(f).flags4b != 0; });
      EXPECT_EQ(declared_in(old.caps), before);
    }
  }
}

// An ABI-4 table compiled before flags4b (its table_size ends at flags4) declares none of flags4b's features, whatever
// the bytes past its end hold: the loader never reads them.
TEST(Contract, anAbi4TableThatEndsAtFlags4DeclaresNothingOfFlags4b) {
  attncheck_plugin_v4 t{};
  t.abi_version = ATTNCHECK_PLUGIN_ABI_V4;
  t.table_size = ATTNCHECK_PLUGIN_V4_MIN_SIZE;
  t.dtypes = ATTNCHECK_DTYPE_F64;
  t.name = "contract";
  t.flags4 = ATTNCHECK_CAP4_INDEX_LIST;
  t.flags4b = 0xFFFFFFFFu;  // past table_size: another struct's bytes, as far as the loader knows
  const auto* v1 = reinterpret_cast<const attncheck_plugin_v1*>(&t);
  const Capabilities c = detail::declared_capabilities(v1, reinterpret_cast<const attncheck_plugin_v2*>(&t),
                                                       reinterpret_cast<const attncheck_plugin_v3*>(&t), &t);
  EXPECT_TRUE(c.declares(Feature::index_list));
  EXPECT_FALSE(c.declares(Feature::index_list_counted));
  t.table_size = ATTNCHECK_PLUGIN_V4_SIZE;
  t.flags4b = ATTNCHECK_CAP4B_INDEX_LIST_COUNTED;
  EXPECT_TRUE(detail::declared_capabilities(v1, reinterpret_cast<const attncheck_plugin_v2*>(&t),
                                            reinterpret_cast<const attncheck_plugin_v3*>(&t), &t)
                  .declares(Feature::index_list_counted));
}

TEST(Contract, aCallUsingEachFeatureCrossesTheExecFramesAndJsonUnchanged) {
  for (const FeatureRow& f : kFeatures) {
    const std::optional<Problem> w = witness(f.id);
    if (!w) continue;
    // JSON (a stored case): every field as it was.
    const Problem j = reports::problem_from_json(reports::to_json(*w), "contract");
    EXPECT_EQ(problem_json(j), problem_json(*w)) << f.name;
    // The exec protocol: a forward frame, or a backward frame for the backward.
    const Problem e = f.id == Feature::backward
                          ? wire::decode_backward(wire::encode_backward(*w).substr(wire::kHeaderSize))
                          : wire::decode_forward(wire::encode_forward(*w).substr(wire::kHeaderSize));
    EXPECT_TRUE(f.used(e)) << f.name;
    if (w->paged) {  // a decoded paged call carries its block table
      // explicitly, as the wire gave it
      EXPECT_EQ(e.paged_kv().block_table, w->paged_kv().block_table);
      Problem dense = e;
      dense.paged.reset();
      Problem orig = *w;
      orig.paged.reset();
      EXPECT_EQ(problem_json(dense), problem_json(orig));
    } else {
      EXPECT_EQ(problem_json(e), problem_json(*w)) << f.name;
    }
  }
}

// The Python client's FLAGS2 and FLAGS3 (attncheck_plugin.py) are the table's bits, and serve() takes a keyword
// named as each feature (the claims, which no call carries, included); its FEATURES (the names `features=` takes)
// are the table's on/off declarations, and ABI_WORDS turns each C name into the keyword.
TEST(Contract, pythonClientNamesEveryFeatureAsTheTableDoes) {
  const std::string cmd = "PYTHONPATH=" ATTNCHECK_PYTHON_DIR
                          " /usr/bin/python3 -c 'import attncheck_plugin as a, inspect, json; "
                          "print(json.dumps({\"flags2\": a.FLAGS2, \"flags3\": a.FLAGS3, \"flags4\": a.FLAGS4, \"flags4b\": a.FLAGS4B, \"call\": a.CALL_FLAGS, "
                          "\"caps\": a.CAPS_FLAGS, \"result\": a.RESULT_FLAGS, \"d_sinks\": a.GRADIENTS_D_SINKS, "
                          "\"keywords\": list(inspect.signature(a.serve_declared).parameters), "
                          "\"features\": a.FEATURES, \"abi_words\": a.ABI_WORDS}))'";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(cmd.c_str(), "r"), ::pclose);
  ASSERT_TRUE(pipe);
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, pipe.get())) > 0;) out.append(buf, n);
  const nlohmann::json py = nlohmann::json::parse(out);
  std::map<std::string, std::uint32_t> flags2, flags3, flags4, flags4b;
  for (const FeatureRow& f : kFeatures) {
    if (f.flags2) flags2[std::string(f.name)] = f.flags2;
    if (f.flags3) flags3[std::string(f.name)] = f.flags3;
    if (f.flags4) flags4[std::string(f.name)] = f.flags4;
    if (f.flags4b) flags4b[std::string(f.name)] = f.flags4b;
    const auto& kw = py.at("keywords");
    EXPECT_NE(std::find(kw.begin(), kw.end(), std::string(f.name)), kw.end()) << "serve() has no keyword " << f.name;
    const auto& names = py.at("features");
    if (f.id != Feature::backward) {  // a function, not a flag
      EXPECT_NE(std::find(names.begin(), names.end(), std::string(f.name)), names.end()) << "FEATURES lacks " << f.name;
    }
    if (f.c_name.starts_with("ATTNCHECK_")) {  // a macro (the backward is declared by a function pointer instead)
      EXPECT_EQ(py.at("abi_words").value(std::string(f.c_name), ""), f.name) << f.c_name;
    }
  }
  EXPECT_EQ(py.at("flags2").get<decltype(flags2)>(), flags2);
  EXPECT_EQ(py.at("flags3").get<decltype(flags3)>(), flags3);
  EXPECT_EQ(py.at("flags4").get<decltype(flags4)>(), flags4);
  EXPECT_EQ(py.at("flags4b").get<decltype(flags4b)>(), flags4b);
  // The frames' other flags: a call's, the caps frame's, a result's and a gradients frame's.
  using namespace wire;
  const std::map<std::string, std::uint32_t> call{
      {"scale", call_scale},         {"weights", call_weights},       {"key_lengths", call_key_lengths},
      {"window", call_window},       {"softcap", call_softcap},       {"alibi", call_alibi},
      {"sinks", call_sinks},         {"lse", call_lse},               {"not_causal", call_not_causal},
      {"paged", call_paged},         {"prefix", call_prefix},         {"window_right", call_window_right},
      {"chunk", call_chunk},         {"documents", call_documents},   {"block_mask", call_block_mask},
      {"dense_mask", call_dense_mask}, {"layout", call_layout},       {"v_head_dim", call_v_head_dim},
      {"bias", call_bias},           {"temperature", call_temperature}, {"rope", call_rope},
      {"qk_norm", call_qk_norm},     {"dropout", call_dropout},       {"quant", call_quant},
      {"quant_q", call_quant_q},     {"index_list", call_index_list}, {"tree", call_tree}};
  EXPECT_EQ(py.at("call").get<decltype(flags3)>(), call);
  const std::map<std::string, std::uint32_t> caps{{"returns_weights", caps_returns_weights},
                                                  {"custom_scale", caps_custom_scale},
                                                  {"cross_lengths", caps_cross_lengths},
                                                  {"nonfinite_safe", caps_nonfinite_safe}};
  EXPECT_EQ(py.at("caps").get<decltype(flags3)>(), caps);
  const std::map<std::string, std::uint32_t> result{{"weights", result_weights}, {"lse", result_lse}};
  EXPECT_EQ(py.at("result").get<decltype(flags3)>(), result);
  EXPECT_EQ(py.at("d_sinks").get<std::uint32_t>(), std::uint32_t(gradients_d_sinks));
}

// The source explains itself: a comment says why, not which issue asked (the issue's number is history, kept
// by git).
TEST(Source, namesNoIssue) {
  namespace fs = std::filesystem;
  const std::regex issue("[Ii]ssues? [0-9]");
  const std::set<std::string> kinds{".cpp", ".hpp", ".h", ".c", ".py", ".cmake", ".sh"};
  int files = 0;
  for (const char* dir : {"attention", "properties", "harness", "mutants", "reports", "cli", "examples", "fuzz",
                          "hostile", "scripts", "cmake"})
    for (const fs::directory_entry& e : fs::recursive_directory_iterator(fs::path(ATTNCHECK_SOURCE_DIR) / dir)) {
      const fs::path& f = e.path();
      if (!e.is_regular_file() || (!kinds.count(f.extension().string()) && f.filename() != "CMakeLists.txt")) continue;
      std::ifstream in(f);
      std::stringstream text;
      text << in.rdbuf();
      ++files;
      EXPECT_FALSE(std::regex_search(text.str(), issue)) << f;
    }
  EXPECT_GT(files, 100);
}

}  // namespace
}  // namespace attncheck
