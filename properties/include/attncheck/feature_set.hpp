// The features of a call an implementation declares, one name each, and a set of them. The rest of each
// feature's row (its bits, names and words in every codec, whether a call uses it) is kFeatures in
// attncheck/features.hpp; Capabilities holds the limits and a FeatureSet of what is declared.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace attncheck {

enum class Feature : std::uint8_t {
  /// K and V with fewer heads than Q (H_kv dividing H). Undeclared: the generators never draw H_kv < H.
  gqa,
  /// Problem::key_lengths (key padding).
  key_padding,
  /// Problem::window (a sliding window).
  window,
  /// A backward pass (Implementation::backward): the gradient laws apply.
  backward,
  /// ABI 3 (ATTNCHECK_CAP3_*): each row's log-sum-exp when asked (Problem::want_lse); sink logits (and, with a
  /// backward, their gradient); logit softcapping; ALiBi slopes; causal = false.
  lse,
  sinks,
  softcap,
  alibi,
  bidirectional,
  /// ABI 3, masks beyond causal (ATTNCHECK_CAP3_DOCUMENTS): Problem::doc_bounds (packed documents).
  documents,
  /// ABI 3 (ATTNCHECK_CAP3_QUERY_DOCUMENTS, with documents): Problem::q_doc_bounds, documents whose queries have
  /// lengths of their own (FlashAttention varlen's cu_seqlens_q != cu_seqlens_k), each aligned on its own lengths.
  query_documents,
  /// ABI 3 (ATTNCHECK_CAP3_CHUNKED_LOCAL, _PREFIX, _RIGHT_WINDOW): chunk_size, prefix_length and window_right.
  chunked_local,
  prefix,
  right_window,
  /// ABI 3 (ATTNCHECK_CAP3_BLOCK_MASK, _DENSE_MASK): Problem::block_mask and dense_mask.
  block_mask,
  dense_mask,
  /// ABI 3 (ATTNCHECK_CAP3_V_HEAD_DIM): V may have a head dimension D_v of its own (the output's; MLA's 576 and
  /// 512, 192 and 128), every pair (D_k, D_v) that Capabilities::supports_head_dims accepts.
  v_head_dim,
  /// ABI 3 (ATTNCHECK_CAP3_STRIDED, _LAYOUT_INVARIANT): reads q, k and v through any strides (Problem::layout:
  /// gaps, stride 0, views of one buffer), and gives bit-identical results whatever they are. Not where its pages
  /// sit: page-permutation and shared-pages compare within the derived bound whatever is declared.
  strided,
  layout_invariant,
  /// ABI 3 (ATTNCHECK_CAP3_BATCH_INVARIANT): a sequence's results are bit-identical whatever else is in the batch,
  /// whatever the batch size, and whatever number of its queries a call holds (the batch-invariance law).
  batch_invariant,
  /// K and V as a page pool and a block table (ATTNCHECK_CAP3_PAGED), in the page sizes and layouts of
  /// Capabilities::page_sizes and page_layouts.
  paged,
  /// ABI 4 (ATTNCHECK_CAP4_BIAS): an additive score bias (Problem::bias, [B or 1, H or 1, T_q, T_k]).
  bias,
  /// ABI 4 (ATTNCHECK_CAP4_BIAS_GRAD, with the bias and a backward): the backward returns dBias
  /// (Gradients::dbias, the bias's shape: dS summed over its broadcast axes).
  bias_grad,
  /// ABI 4 (ATTNCHECK_CAP4_TEMPERATURE): a per-query temperature (Problem::temperature, [B or 1, H or 1, T_q]) that
  /// divides each query's scaled scores, before the softcap.
  temperature,
  /// ABI 4 (ATTNCHECK_CAP4_ROPE, _ROPE_INTERLEAVED): rotary position embeddings of q and k in the call
  /// (Problem::rope), half-split (GPT-NeoX, Llama) and interleaved (GPT-J) pairs: one row each, as a kernel
  /// implements one of them.
  rope,
  rope_interleaved,
  /// ABI 4 (ATTNCHECK_CAP4_QK_NORM, _QK_NORM_EPS_OUTSIDE): QK-norm of q and k in the call (Problem::qk_norm), with eps
  /// inside the square root (RMSNorm as written) and outside it: one row each, as a kernel implements one.
  qk_norm,
  qk_norm_eps_outside,
  /// ABI 4 (ATTNCHECK_CAP4_DROPOUT): dropout on the weights (Problem::dropout: p, a seed and an offset), the kept ones
  /// divided by 1 - p; the weights the implementation returns (or that probing recovers) are the dropped ones, and
  /// its keep mask is a function of the seed, the offset and each cell's coordinates only. Drawn only by the laws
  /// about it (ProblemOptions::allow leaves it out): every other law compares calls whose masks would differ.
  dropout,
  /// ABI 4 (ATTNCHECK_CAP4_ROPE_NTK, _ROPE_LLAMA3), with the half-split rope (Feature::rope, which a declaration
  /// requires: an interleaved-only kernel's scalings are not drawn yet): its NTK-aware and Llama 3 scalings
  /// (Rope::scaling), one row each, as a kernel implements some of them, in either declared pairing; linear scaling
  /// comes with every rope.
  rope_ntk,
  rope_llama3,
  /// ABI 4 (ATTNCHECK_CAP4_KV_E4M3FN, _KV_E5M2, _KV_INT8): K and V may arrive quantised in that format
  /// (Problem::quant: the codes with their scales; k and v hold the dequantised values), one row per format as a kernel
  /// reads some of them; per tensor always, per kv head and per (token, kv head) where declared (kv_scale_per_head,
  /// kv_scale_per_token), int8 zero points where declared (kv_zero_points). Forward calls only, paged where declared
  /// (paged_quant). Drawn
  /// only by the laws about them (ProblemOptions::allow leaves them out): a law that derives values of K or V would
  /// have to requantise them.
  kv_e4m3fn,
  kv_e5m2,
  kv_int8,
  kv_scale_per_head,
  kv_scale_per_token,
  kv_zero_points,
  /// ABI 4 (ATTNCHECK_CAP4_KV_GGML_Q8_0 ... _Q5_1): K and V may arrive in ggml's blocks of 32 along D (llama.cpp's
  /// -ctk/-ctv cache types), their float16 scales (and minimums) inside the blocks: one row per block type. Drawn with
  /// the other formats by the kv-quant-* laws, with D a multiple of 32.
  kv_ggml_q8_0,
  kv_ggml_q4_0,
  kv_ggml_q4_1,
  kv_ggml_q5_0,
  kv_ggml_q5_1,
  /// A compute precision, not a call's feature: with K in ggml's blocks, each row of Q rounded to ggml's Q8_0 blocks
  /// (Q8_1 with Q4_1 and Q5_1) for the dot, as ggml's CPU kernel does. The bounds widen by it (tolerance.cpp step
  /// 12b); the law runner marks each case of an implementation that declares it (QuantizedKV::q_dot_ggml_q8).
  q_dot_ggml_q8,
  /// Q quantised too, in the cache's FP8 or int8 format with scales of its own (FlashAttention 3's q descale):
  /// QuantizedKV::q. Drawn by the kv-quant-* laws with a declared FP8 or int8 format.
  q_quant,
  /// A compute precision, like q_dot_ggml_q8: in a quantised call, P = exp(s - m) cast to FP8 e4m3 (possibly scaled
  /// into its range first) for the product with V, as FlashAttention 3's FP8 forward does (tolerance.cpp step 12c).
  p_fp8,
  /// Quantised K and V in paged pools (ATTNCHECK_CAP4_PAGED_QUANT): a call both paged and quantised, its pools holding
  /// codes (attncheck/quant.hpp's QuantPool: each key's row and per-token scale at its page and slot). Needs paged
  /// K and V; drawn in paged cases with a declared format.
  paged_quant,
  /// ABI 4 (ATTNCHECK_CAP4_INDEX_LIST): selected keys, an index list per batch entry, kv head and query (DeepSeek's
  /// DSA, NSA's selection): each query sees the keys its row lists, intersected with every other rule
  /// (AttentionOptions::index_list). Drawn only by the laws about it (index-list-*).
  index_list,
  /// With index_list: block indices (block_size > 1; NSA's and MoBA's selected blocks).
  index_list_blocks,
  /// With index_list: one list per query head (MoBA's and NSA's per-head selections) where K and V have fewer heads.
  index_list_per_query_head,
  /// ABI 4 (ATTNCHECK_CAP4_TREE): a tree of draft tokens per batch entry given by its parents (speculative decoding:
  /// EAGLE, SGLang's top-k trees): each node sees the prefix and its ancestors (AttentionOptions::tree). Drawn only by
  /// the laws about it (tree-*).
  tree,
  /// ABI 4 (ATTNCHECK_CAP4_TREE_BITMASK): the tree as a packed bitmask of its cells (FlashInfer's packed_custom_mask
  /// with mask_indptr), in the bit order the call gives. Drawn only by the laws about it (tree-*).
  tree_bitmask,
  /// With index_list and paged: in a paged call the entries are the pool's slots (page·page_size + slot: DeepSeek's
  /// FlashMLA sparse indices), not key positions. Drawn in half the paged cases of the index-list laws.
  index_list_physical,
  /// With index_list: a key listed n times in a row weighs n times (duplicates counted: a gather kernel attending
  /// over every entry it reads, as FlashMLA's sparse kernels do) rather than once (a row is a set). A meaning, not a
  /// call option: every list drawn for a declaring implementation is counted (IndexList::counted). ABI 4's second
  /// word (ATTNCHECK_CAP4B_INDEX_LIST_COUNTED of flags4b).
  index_list_counted,
  /// With index_list: each query's own block (of its aligned position; its own key with key indices) is selected
  /// besides the row's entries, as MoBA always selects the current block. A meaning, as index_list_counted: every list
  /// drawn for a declaring implementation has it (IndexList::current_block). ATTNCHECK_CAP4B_INDEX_LIST_CURRENT_BLOCK.
  index_list_current_block,
};

/// How many features there are (kFeatures has a row for each).
inline constexpr std::size_t kFeatureCount = std::size_t(Feature::index_list_current_block) + 1;
static_assert(kFeatureCount <= 64, "FeatureSet: one bit per Feature in 64 bits");

/// A set of features, one bit per Feature.
class FeatureSet {
 public:
  constexpr FeatureSet() = default;
  constexpr FeatureSet(std::initializer_list<Feature> fs) {
    for (const Feature f : fs) bits_ |= bit(f);
  }
  /// Every feature.
  static constexpr FeatureSet all() {
    FeatureSet s;
    s.bits_ = (std::uint64_t{1} << kFeatureCount) - 1;
    return s;
  }
  constexpr bool has(Feature f) const { return (bits_ & bit(f)) != 0; }
  constexpr bool empty() const { return bits_ == 0; }
  /// Whether every feature of `other` is in this set.
  constexpr bool contains(FeatureSet other) const { return (bits_ & other.bits_) == other.bits_; }
  /// Whether some feature of `other` is in this set.
  constexpr bool intersects(FeatureSet other) const { return (bits_ & other.bits_) != 0; }
  constexpr FeatureSet& add(Feature f) {
    bits_ |= bit(f);
    return *this;
  }
  constexpr FeatureSet& add(std::initializer_list<Feature> fs) {
    for (const Feature f : fs) bits_ |= bit(f);
    return *this;
  }
  constexpr FeatureSet& remove(Feature f) {
    bits_ &= ~bit(f);
    return *this;
  }
  constexpr FeatureSet& remove(std::initializer_list<Feature> fs) {
    for (const Feature f : fs) bits_ &= ~bit(f);
    return *this;
  }
  /// Adds `f` when `on`, removes it otherwise.
  constexpr FeatureSet& set(Feature f, bool on) { return on ? add(f) : remove(f); }
  friend constexpr bool operator==(FeatureSet, FeatureSet) = default;

 private:
  static constexpr std::uint64_t bit(Feature f) { return std::uint64_t{1} << unsigned(f); }
  std::uint64_t bits_ = 0;
};

}  // namespace attncheck
