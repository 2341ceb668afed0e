// The contract's one table: every feature of a call that an implementation declares, named once. The capability
// check (needs_outside, and through it the C loader's and the exec client's), describe_capabilities, the ABI and
// wire bits (harness/src/protocol.cpp derives set_abi3_bools and abi3_bits from it and checks each bit against
// attncheck/plugin.h at compile time) and the Python client's FLAGS3 and serve() keywords (a test reads them and
// compares) all come from here. docs/architecture.md lists what else a new feature touches.
//
// What is not a row: the limits (dtypes, alignments, T_q != T_k regimes, head dimensions, max_T, an explicit
// scale), which are values rather than on/off declarations, and the page sizes and layouts of `paged`, which
// needs_outside checks after the rows.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attncheck/feature_set.hpp"
#include "attncheck/implementation.hpp"

namespace attncheck {

/// One feature: its names in every codec, its words for people, and what a call using it needs.
struct FeatureRow {
  Feature id;
  /// The Python client's serve() keyword, and the feature's name wherever one word names it.
  std::string_view name;
  /// The name a C++ implementation's declaration goes by in the laws' messages where it is not `name`
  /// ("(Feature::key_padding)"): in_declaration_words recognises it there to write the C or Python words.
  std::string_view member{};
  /// The C ABI's bits: ATTNCHECK_CAP_* of the table's flags (ABI 1-2) and ATTNCHECK_CAP3_* of flags3 (ABI 3);
  /// the exec protocol's caps frame carries flags2 (version 2) and the same flags3 (version 3). 0: not that way
  /// (the backward is declared by its function pointer in the C ABI).
  std::uint32_t abi_flag = 0, flags2 = 0, flags3 = 0;
  /// ABI 4's ATTNCHECK_CAP4_* bit of an attncheck_plugin_v4's flags4, which the exec protocol's caps frame carries
  /// as its u32 flags4 from version 4 (docs/abi4.md). 0: not that way.
  std::uint32_t flags4 = 0;
  /// ABI 4's second word of declarations, an attncheck_plugin_v4's flags4b (ATTNCHECK_CAP4B_*: flags4 has no bit
  /// left), which the exec protocol's version-4 caps frame carries after flags4. 0: not that way.
  std::uint32_t flags4b = 0;
  /// How a C plug-in declares it, for messages: the ATTNCHECK_CAP_*, ATTNCHECK_CAP3_* or ATTNCHECK_CAP4_* macro's name.
  std::string_view c_name;
  /// A feature it is only declared with (query documents with documents; layout invariance with strides).
  std::optional<Feature> requires_feature{};
  /// describe_capabilities' words when declared, and when not (empty: not mentioned when not declared).
  std::string_view words, words_off{};
  /// Whether a call uses it; null for a claim about results that no single call uses (batch invariance).
  bool (*used)(const Problem&) = nullptr;
  /// What a call that uses it needs, in needs_outside's words ("a window (3)").
  std::string (*needs)(const Problem&) = nullptr;
  /// true for what a call may ask of any implementation and an undeclaring one ignores (the LSE: it returns
  /// none): needs_outside lists it, the C loader and the exec client send the call anyway.
  bool ignored_when_undeclared = false;
};

namespace feature_words {
inline std::string n(Index x) { return std::to_string(x); }
}  // namespace feature_words

/// Every feature, in the order describe_capabilities and needs_outside list them (Feature's order: a row's index
/// is its id, which a static_assert below checks).
inline constexpr std::array<FeatureRow, kFeatureCount> kFeatures{{
    {.id = Feature::gqa, .name = "gqa", .abi_flag = 0x10, .flags2 = 0x1,
     .c_name = "ATTNCHECK_CAP_GQA", .words = "grouped-query attention", .words_off = "no grouped-query attention",
     .used = [](const Problem& p) { return p.kv_heads() != p.q.shape().H; },
     .needs =
         [](const Problem& p) {
           using feature_words::n;
           return "grouped-query attention (" + n(p.kv_heads()) +
                  (p.kv_heads() == 1 ? " kv head for " : " kv heads for ") + n(p.q.shape().H) + " query heads)";
         }},
    {.id = Feature::key_padding, .name = "key_lengths",
     .member = "key_padding", .abi_flag = 0x20,
     .flags2 = 0x2, .c_name = "ATTNCHECK_CAP_KEY_LENGTHS", .words = "key padding", .words_off = "no key padding",
     .used = [](const Problem& p) { return !p.key_lengths.empty(); },
     .needs = [](const Problem&) { return std::string("key padding (key lengths)"); }},
    {.id = Feature::window, .name = "window", .abi_flag = 0x40, .flags2 = 0x4,
     .c_name = "ATTNCHECK_CAP_WINDOW", .words = "windows", .words_off = "no window",
     .used = [](const Problem& p) { return p.window.has_value(); },
     .needs =
         [](const Problem& p) {
           using feature_words::n;
           return std::string("a window (" + n(*p.window) + ")");
         }},
    {.id = Feature::backward, .name = "backward", .flags2 = 0x8,
     .c_name = "a backward function", .words = "a backward pass", .words_off = "no backward pass",
     .used = [](const Problem& p) { return p.d_output.has_value(); },
     .needs = [](const Problem&) { return std::string("a backward pass"); }},
    {.id = Feature::lse, .name = "lse", .flags3 = 0x1, .c_name = "ATTNCHECK_CAP3_LSE",
     .words = "the log-sum-exp",
     .used = [](const Problem& p) { return p.want_lse; },
     .needs = [](const Problem&) { return std::string("the log-sum-exp"); },
     .ignored_when_undeclared = true},
    {.id = Feature::sinks, .name = "sinks", .flags3 = 0x2,
     .c_name = "ATTNCHECK_CAP3_SINKS", .words = "sinks",
     .used = [](const Problem& p) { return !p.sinks.empty(); },
     .needs = [](const Problem&) { return std::string("attention sinks"); }},
    {.id = Feature::softcap, .name = "softcap", .flags3 = 0x4,
     .c_name = "ATTNCHECK_CAP3_SOFTCAP", .words = "softcap",
     .used = [](const Problem& p) { return p.softcap.has_value(); },
     .needs =
         [](const Problem& p) {
           return std::string("logit softcapping (" + format_number(*p.softcap, 6) + ")");
         }},
    {.id = Feature::alibi, .name = "alibi", .flags3 = 0x8,
     .c_name = "ATTNCHECK_CAP3_ALIBI", .words = "ALiBi",
     .used = [](const Problem& p) { return !p.alibi_slopes.empty(); },
     .needs = [](const Problem&) { return std::string("ALiBi slopes"); }},
    {.id = Feature::bidirectional, .name = "bidirectional", .flags3 = 0x100,
     .c_name = "ATTNCHECK_CAP3_BIDIRECTIONAL", .words = "bidirectional",
     .used = [](const Problem& p) { return !p.causal; },
     .needs = [](const Problem&) { return std::string("no causal rule (bidirectional)"); }},
    {.id = Feature::documents, .name = "documents", .flags3 = 0x20,
     .c_name = "ATTNCHECK_CAP3_DOCUMENTS", .words = "packed documents",
     .used = [](const Problem& p) { return !p.doc_bounds.empty(); },
     .needs = [](const Problem&) { return std::string("packed documents"); }},
    {.id = Feature::query_documents, .name = "query_documents",
     .flags3 = 0x20000, .c_name = "ATTNCHECK_CAP3_QUERY_DOCUMENTS", .requires_feature = Feature::documents,
     .words = "documents with query lengths of their own",
     .used = [](const Problem& p) { return !p.q_doc_bounds.empty(); },
     .needs =
         [](const Problem&) {
           return std::string("documents with query lengths of their own (query document bounds)");
         }},
    {.id = Feature::chunked_local, .name = "chunked_local", .flags3 = 0x40,
     .c_name = "ATTNCHECK_CAP3_CHUNKED_LOCAL", .words = "chunked local attention",
     .used = [](const Problem& p) { return p.chunk_size != 0; },
     .needs =
         [](const Problem& p) {
           using feature_words::n;
           return std::string("chunked local attention (chunks of " + n(p.chunk_size) + ")");
         }},
    {.id = Feature::prefix, .name = "prefix", .flags3 = 0x80,
     .c_name = "ATTNCHECK_CAP3_PREFIX", .words = "a bidirectional prefix",
     .used = [](const Problem& p) { return p.prefix_length != 0; },
     .needs =
         [](const Problem& p) {
           using feature_words::n;
           return std::string("a bidirectional prefix (" + n(p.prefix_length) + ")");
         }},
    {.id = Feature::right_window, .name = "right_window", .flags3 = 0x200,
     .c_name = "ATTNCHECK_CAP3_RIGHT_WINDOW", .words = "right windows",
     .used = [](const Problem& p) { return p.window_right.has_value(); },
     .needs =
         [](const Problem& p) {
           using feature_words::n;
           return std::string("a right window (" + n(*p.window_right) + ")");
         }},
    {.id = Feature::block_mask, .name = "block_mask", .flags3 = 0x400,
     .c_name = "ATTNCHECK_CAP3_BLOCK_MASK", .words = "block masks",
     .used = [](const Problem& p) { return p.block_mask.has_value(); },
     .needs = [](const Problem&) { return std::string("a block mask"); }},
    {.id = Feature::dense_mask, .name = "dense_mask", .flags3 = 0x800,
     .c_name = "ATTNCHECK_CAP3_DENSE_MASK", .words = "dense masks",
     .used = [](const Problem& p) { return p.dense_mask.has_value(); },
     .needs = [](const Problem&) { return std::string("a dense mask"); }},
    {.id = Feature::v_head_dim, .name = "v_head_dim", .flags3 = 0x1000,
     .c_name = "ATTNCHECK_CAP3_V_HEAD_DIM", .words = "a V head dimension of its own",
     .used = [](const Problem& p) { return p.v_dim() != p.q.shape().D; },
     .needs =
         [](const Problem& p) {
           using feature_words::n;
           return std::string("a V head dimension of its own (D_v = " + n(p.v_dim()) + ", D = " + n(p.q.shape().D) + ")");
         }},
    {.id = Feature::strided, .name = "strided", .flags3 = 0x2000,
     .c_name = "ATTNCHECK_CAP3_STRIDED", .words = "strided inputs",
     .used = [](const Problem& p) { return p.layout != InputLayout::contiguous; },
     .needs =
         [](const Problem& p) {
           return std::string("strided inputs (" + input_layout_name(p.layout) + ")");
         }},
    {.id = Feature::layout_invariant, .name = "layout_invariant",
     .flags3 = 0x4000, .c_name = "ATTNCHECK_CAP3_LAYOUT_INVARIANT", .requires_feature = Feature::strided,
     .words = "bit-identical whatever the strides"},
    {.id = Feature::batch_invariant, .name = "batch_invariant",
     .flags3 = 0x8000, .c_name = "ATTNCHECK_CAP3_BATCH_INVARIANT",
     .words = "bit-identical whatever else is in the batch"},
    {.id = Feature::paged, .name = "paged", .flags3 = 0x10,
     .c_name = "ATTNCHECK_CAP3_PAGED", .words = "paged K and V",
     .used = [](const Problem& p) { return p.paged.has_value(); },
     .needs = [](const Problem&) { return std::string("paged K and V"); }},
    {.id = Feature::bias, .name = "bias", .flags4 = 0x1, .c_name = "ATTNCHECK_CAP4_BIAS", .words = "additive biases",
     .used = [](const Problem& p) { return p.bias.has_value(); },
     .needs =
         [](const Problem& p) {
           using feature_words::n;
           return std::string("an additive bias ([" + n(p.bias->B) + "," + n(p.bias->H) + "," + n(p.bias->T_q) + "," +
                              n(p.bias->T_k) + "])");
         }},
    {.id = Feature::bias_grad, .name = "bias_grad", .flags4 = 0x2, .c_name = "ATTNCHECK_CAP4_BIAS_GRAD",
     .requires_feature = Feature::bias, .words = "dBias from the backward"},
    {.id = Feature::temperature, .name = "temperature", .flags4 = 0x4, .c_name = "ATTNCHECK_CAP4_TEMPERATURE",
     .words = "per-query temperatures",
     .used = [](const Problem& p) { return p.temperature.has_value(); },
     .needs =
         [](const Problem& p) {
           using feature_words::n;
           return std::string("a per-query temperature ([" + n(p.temperature->B) + "," + n(p.temperature->H) + "," +
                              n(p.temperature->T_q) + "])");
         }},
    {.id = Feature::rope, .name = "rope", .flags4 = 0x8, .c_name = "ATTNCHECK_CAP4_ROPE",
     .words = "rotary embeddings (half-split)",
     .used = [](const Problem& p) { return p.rope && p.rope->variant == RopeVariant::half_split; },
     .needs =
         [](const Problem& p) {
           return "rotary embeddings of q and k (half-split pairs, rotary_dim " + std::to_string(p.rope->rotary_dim) +
                  ")";
         }},
    {.id = Feature::rope_interleaved, .name = "rope_interleaved", .flags4 = 0x10,
     .c_name = "ATTNCHECK_CAP4_ROPE_INTERLEAVED", .words = "rotary embeddings (interleaved)",
     .used = [](const Problem& p) { return p.rope && p.rope->variant == RopeVariant::interleaved; },
     .needs =
         [](const Problem& p) {
           return "rotary embeddings of q and k (interleaved pairs, rotary_dim " + std::to_string(p.rope->rotary_dim) +
                  ")";
         }},
    {.id = Feature::qk_norm, .name = "qk_norm", .flags4 = 0x20, .c_name = "ATTNCHECK_CAP4_QK_NORM",
     .words = "QK-norm (eps in the root)",
     .used = [](const Problem& p) { return p.qk_norm && !p.qk_norm->eps_outside; },
     .needs = [](const Problem&) { return std::string("QK-norm of q or k (eps inside the square root)"); }},
    {.id = Feature::qk_norm_eps_outside, .name = "qk_norm_eps_outside", .flags4 = 0x40,
     .c_name = "ATTNCHECK_CAP4_QK_NORM_EPS_OUTSIDE", .words = "QK-norm (eps outside the root)",
     .used = [](const Problem& p) { return p.qk_norm && p.qk_norm->eps_outside; },
     .needs = [](const Problem&) { return std::string("QK-norm of q or k (eps outside the square root)"); }},
    {.id = Feature::dropout, .name = "dropout", .flags4 = 0x80, .c_name = "ATTNCHECK_CAP4_DROPOUT",
     .words = "dropout on the weights",
     .used = [](const Problem& p) { return p.dropout.has_value(); },
     .needs =
         [](const Problem& p) {
           return "dropout on the weights (p = " + format_number(p.dropout->p) + ", seed " +
                  std::to_string(p.dropout->seed) + ", offset " + std::to_string(p.dropout->offset) + ")";
         }},
    {.id = Feature::rope_ntk, .name = "rope_ntk", .flags4 = 0x100, .c_name = "ATTNCHECK_CAP4_ROPE_NTK",
     .requires_feature = Feature::rope, .words = "NTK-aware rope scaling",
     .used = [](const Problem& p) { return p.rope && p.rope->scaling == RopeScaling::ntk; },
     .needs =
         [](const Problem& p) {
           return "NTK-aware rope scaling (factor " + format_number(p.rope->factor) + ")";
         }},
    {.id = Feature::rope_llama3, .name = "rope_llama3", .flags4 = 0x200, .c_name = "ATTNCHECK_CAP4_ROPE_LLAMA3",
     .requires_feature = Feature::rope, .words = "Llama 3 rope scaling",
     .used = [](const Problem& p) { return p.rope && p.rope->scaling == RopeScaling::llama3; },
     .needs =
         [](const Problem& p) {
           return "Llama 3 rope scaling (factor " + format_number(p.rope->factor) + ", original context " +
                  format_number(p.rope->original_max_position) + ")";
         }},
    {.id = Feature::kv_e4m3fn, .name = "kv_e4m3fn", .flags4 = 0x400, .c_name = "ATTNCHECK_CAP4_KV_E4M3FN",
     .words = "FP8 e4m3fn K and V caches",
     .used = [](const Problem& p) { return p.quant && p.quant->format == QuantFormat::e4m3fn; },
     .needs = [](const Problem&) { return std::string("K and V quantised to FP8 e4m3fn"); }},
    {.id = Feature::kv_e5m2, .name = "kv_e5m2", .flags4 = 0x800, .c_name = "ATTNCHECK_CAP4_KV_E5M2",
     .words = "FP8 e5m2 K and V caches",
     .used = [](const Problem& p) { return p.quant && p.quant->format == QuantFormat::e5m2; },
     .needs = [](const Problem&) { return std::string("K and V quantised to FP8 e5m2"); }},
    {.id = Feature::kv_int8, .name = "kv_int8", .flags4 = 0x1000, .c_name = "ATTNCHECK_CAP4_KV_INT8",
     .words = "int8 K and V caches",
     .used = [](const Problem& p) { return p.quant && p.quant->format == QuantFormat::int8; },
     .needs = [](const Problem&) { return std::string("K and V quantised to int8"); }},
    {.id = Feature::kv_scale_per_head, .name = "kv_scale_per_head", .flags4 = 0x2000,
     .c_name = "ATTNCHECK_CAP4_KV_SCALE_PER_HEAD", .words = "quantised caches scaled per kv head",
     .used =
         [](const Problem& p) {
           return p.quant && (p.quant->k.granularity == QuantGranularity::kv_head ||
                              p.quant->v.granularity == QuantGranularity::kv_head);
         },
     .needs = [](const Problem&) { return std::string("a quantised cache's scales per kv head"); }},
    {.id = Feature::kv_scale_per_token, .name = "kv_scale_per_token", .flags4 = 0x4000,
     .c_name = "ATTNCHECK_CAP4_KV_SCALE_PER_TOKEN", .words = "quantised caches scaled per token and kv head",
     .used =
         [](const Problem& p) {
           return p.quant && (p.quant->k.granularity == QuantGranularity::token_head ||
                              p.quant->v.granularity == QuantGranularity::token_head);
         },
     .needs = [](const Problem&) { return std::string("a quantised cache's scales per token and kv head"); }},
    {.id = Feature::kv_zero_points, .name = "kv_zero_points", .flags4 = 0x8000,
     .c_name = "ATTNCHECK_CAP4_KV_ZERO_POINTS", .requires_feature = Feature::kv_int8, .words = "int8 zero points",
     .used =
         [](const Problem& p) {
           return p.quant && !(p.quant->k.zero_points.empty() && p.quant->v.zero_points.empty());
         },
     .needs = [](const Problem&) { return std::string("int8 zero points"); }},
    {.id = Feature::kv_ggml_q8_0, .name = "kv_ggml_q8_0", .flags4 = 0x10000, .c_name = "ATTNCHECK_CAP4_KV_GGML_Q8_0",
     .words = "ggml Q8_0 K and V caches",
     .used = [](const Problem& p) { return p.quant && p.quant->format == QuantFormat::ggml_q8_0; },
     .needs = [](const Problem&) { return std::string("K and V in ggml's Q8_0 blocks"); }},
    {.id = Feature::kv_ggml_q4_0, .name = "kv_ggml_q4_0", .flags4 = 0x20000, .c_name = "ATTNCHECK_CAP4_KV_GGML_Q4_0",
     .words = "ggml Q4_0 K and V caches",
     .used = [](const Problem& p) { return p.quant && p.quant->format == QuantFormat::ggml_q4_0; },
     .needs = [](const Problem&) { return std::string("K and V in ggml's Q4_0 blocks"); }},
    {.id = Feature::kv_ggml_q4_1, .name = "kv_ggml_q4_1", .flags4 = 0x40000, .c_name = "ATTNCHECK_CAP4_KV_GGML_Q4_1",
     .words = "ggml Q4_1 K and V caches",
     .used = [](const Problem& p) { return p.quant && p.quant->format == QuantFormat::ggml_q4_1; },
     .needs = [](const Problem&) { return std::string("K and V in ggml's Q4_1 blocks"); }},
    {.id = Feature::kv_ggml_q5_0, .name = "kv_ggml_q5_0", .flags4 = 0x80000, .c_name = "ATTNCHECK_CAP4_KV_GGML_Q5_0",
     .words = "ggml Q5_0 K and V caches",
     .used = [](const Problem& p) { return p.quant && p.quant->format == QuantFormat::ggml_q5_0; },
     .needs = [](const Problem&) { return std::string("K and V in ggml's Q5_0 blocks"); }},
    {.id = Feature::kv_ggml_q5_1, .name = "kv_ggml_q5_1", .flags4 = 0x100000, .c_name = "ATTNCHECK_CAP4_KV_GGML_Q5_1",
     .words = "ggml Q5_1 K and V caches",
     .used = [](const Problem& p) { return p.quant && p.quant->format == QuantFormat::ggml_q5_1; },
     .needs = [](const Problem&) { return std::string("K and V in ggml's Q5_1 blocks"); }},
    // A declaration of how it computes, which no call uses: the bounds of its cases widen (tolerance.cpp step 12b).
    {.id = Feature::q_dot_ggml_q8, .name = "q_dot_ggml_q8", .flags4 = 0x200000, .c_name = "ATTNCHECK_CAP4_Q_DOT_GGML_Q8",
     .words = "Q rounded to ggml's Q8_0 or Q8_1 blocks for the dot with a block-quantised K"},
    {.id = Feature::q_quant, .name = "q_quant", .flags4 = 0x400000, .c_name = "ATTNCHECK_CAP4_Q_QUANT",
     .words = "Q quantised with the cache, with scales of its own",
     .used = [](const Problem& p) { return p.quant && p.quant->q.has_value(); },
     .needs = [](const Problem&) { return std::string("Q quantised with the cache"); }},
    // A declaration of how it computes, which no call uses: the bounds of its quantised cases widen (step 12c).
    {.id = Feature::p_fp8, .name = "p_fp8", .flags4 = 0x800000, .c_name = "ATTNCHECK_CAP4_P_FP8",
     .words = "P cast to FP8 e4m3 for its product with V in a quantised call"},
    {.id = Feature::paged_quant, .name = "paged_quant", .flags4 = 0x1000000, .c_name = "ATTNCHECK_CAP4_PAGED_QUANT",
     .requires_feature = Feature::paged, .words = "quantised K and V in paged pools",
     .used = [](const Problem& p) { return p.quant && p.paged; },
     .needs = [](const Problem&) { return std::string("quantised K and V in paged pools"); }},
    {.id = Feature::index_list, .name = "index_list", .flags4 = 0x2000000, .c_name = "ATTNCHECK_CAP4_INDEX_LIST",
     .words = "selected keys (an index list per kv head and query)",
     .used = [](const Problem& p) { return p.index_list.has_value(); },
     .needs = [](const Problem&) { return std::string("an index list of selected keys"); }},
    {.id = Feature::index_list_blocks, .name = "index_list_blocks", .flags4 = 0x4000000,
     .c_name = "ATTNCHECK_CAP4_INDEX_LIST_BLOCKS", .requires_feature = Feature::index_list,
     .words = "selected blocks of keys (block indices)",
     .used = [](const Problem& p) { return p.index_list && p.index_list->block_size > 1; },
     .needs = [](const Problem& p) {
       return "an index list of blocks of " + std::to_string(p.index_list->block_size) + " keys";
     }},
    {.id = Feature::index_list_per_query_head, .name = "index_list_per_query_head", .flags4 = 0x8000000,
     .c_name = "ATTNCHECK_CAP4_INDEX_LIST_PER_QUERY_HEAD", .requires_feature = Feature::index_list,
     .words = "selected keys per query head",
     .used = [](const Problem& p) { return p.index_list && p.index_list->H != p.k.shape().H; },
     .needs = [](const Problem&) { return std::string("an index list per query head"); }},
    {.id = Feature::tree, .name = "tree", .flags4 = 0x10000000, .c_name = "ATTNCHECK_CAP4_TREE",
     .words = "a tree of draft tokens given by its parents",
     .used = [](const Problem& p) { return p.tree && p.tree->form == TokenTree::Form::parents; },
     .needs = [](const Problem&) { return std::string("a tree of draft tokens given by its parents"); }},
    {.id = Feature::tree_bitmask, .name = "tree_bitmask", .flags4 = 0x20000000, .c_name = "ATTNCHECK_CAP4_TREE_BITMASK",
     .words = "a tree of draft tokens as a packed bitmask",
     .used = [](const Problem& p) { return p.tree && p.tree->form == TokenTree::Form::bitmask; },
     .needs = [](const Problem&) { return std::string("a tree of draft tokens as a packed bitmask"); }},
    {.id = Feature::index_list_physical, .name = "index_list_physical", .flags4 = 0x40000000,
     .c_name = "ATTNCHECK_CAP4_INDEX_LIST_PHYSICAL", .requires_feature = Feature::index_list,
     .words = "selected keys as slots of the paged pool",
     .used = [](const Problem& p) { return p.index_list && p.index_list->physical && p.paged; },
     .needs = [](const Problem&) { return std::string("an index list of the paged pool's slots"); }},
    {.id = Feature::index_list_counted, .name = "index_list_counted", .flags4b = 0x1,
     .c_name = "ATTNCHECK_CAP4B_INDEX_LIST_COUNTED", .requires_feature = Feature::index_list,
     // What the lists mean, not what a call carries (as p_fp8 is a precision): the generator marks every list drawn
     // for a declaring implementation (IndexList::counted), and the oracle counts by it.
     .words = "selected keys with duplicates counted (a key listed n times weighs n times)"},
    {.id = Feature::index_list_current_block, .name = "index_list_current_block", .flags4b = 0x2,
     .c_name = "ATTNCHECK_CAP4B_INDEX_LIST_CURRENT_BLOCK", .requires_feature = Feature::index_list,
     // A meaning as index_list_counted is: the generator marks every list (IndexList::current_block).
     .words = "selected keys with each query's own block always selected (MoBA's current block)"},
}};

constexpr bool rows_in_id_order() {
  for (std::size_t i = 0; i < kFeatures.size(); ++i)
    if (std::size_t(kFeatures[i].id) != i) return false;
  return true;
}
static_assert(rows_in_id_order(), "kFeatures: every row at the index of its Feature");
static_assert(kFeatures.size() == kFeatureCount, "kFeatures: a row for every Feature");

/// The row of `f`.
constexpr const FeatureRow& feature(Feature f) { return kFeatures[std::size_t(f)]; }

/// The features `caps` declares (a feature that requires another only with it).
inline FeatureSet declared_features(const Capabilities& caps) {
  FeatureSet s;
  for (const FeatureRow& f : kFeatures)
    if (caps.declares(f.id) && (!f.requires_feature || caps.declares(*f.requires_feature))) s.add(f.id);
  return s;
}

/// The features a call `p` uses that `caps` does not declare, in the table's order.
std::vector<Feature> undeclared_features(const Problem& p, const Capabilities& caps);

/// How an implementation declares what it does: a C++ one by Capabilities::features, a C plug-in by its table's
/// ATTNCHECK_CAP_* and ATTNCHECK_CAP3_* bits, an exec: client by serve()'s keywords.
enum class DeclaredBy { cpp, c_plugin, exec_client };
/// By the name --impl gives it: "plugin:..." a C plug-in, "exec:..." an exec: client, any other C++.
DeclaredBy declared_by(std::string_view impl_name);
/// `text` with each parenthesised list of declarations in it, as the laws write them ("(Feature::window)",
/// "(ATTNCHECK_CAP3_ALIBI, _SINKS)", "(Feature::block_mask, dense_mask)"), in the words a C plug-in or an
/// exec: client declares them with ("(ATTNCHECK_CAP_WINDOW)", "(alibi=True, sinks=True)"): a reason names what
/// its reader would write. C++'s text is left as the laws wrote it, and so is a list holding a name that is no
/// on/off declaration (the rows of kFeatures, and returns_weights, custom_scale, cross_lengths, nonfinite_safe).
std::string in_declaration_words(std::string_view text, DeclaredBy by);

}  // namespace attncheck
