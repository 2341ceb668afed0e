/* The attncheck plug-in ABI: a shared library exports one C function returning a table (ABI version first,
 * then name, capabilities, a forward call and, from ABI 2, an optional backward call), and attncheck checks
 * every law against it. Plain C99, only <stddef.h> and <stdint.h>; nothing may throw or longjmp across it:
 * errors are status codes plus a message.
 *
 * Each ABI only appends: every ABI-1 and ABI-2 struct keeps its layout and offsets, so a plug-in built against
 * an older header keeps loading unchanged (harness/tests/abi1/ and abi2/ hold frozen copies of those headers,
 * and plug-ins built against them, and prove it).
 *
 * ABI 3 adds, as one revision for the attention people write now:
 *  - declarations of what the implementation accepts, so attncheck never draws a case it does not support:
 *    which cross-length regimes (T_q <= T_k, T_q >= T_k), which head dimensions (a multiple, a maximum, a
 *    list), and the empty-row convention "unspecified output" (ATTNCHECK_EMPTY_ROWS_ANY);
 *  - the log-sum-exp of every row as an extra output, and score modifiers: attention sinks, logit softcapping
 *    and ALiBi;
 *  - paged K and V (a page pool and a block table);
 *  - masks beyond causal: documents (packed sequences), chunked local attention, a bidirectional prefix or no
 *    causal rule at all, a right window, and block or dense masks;
 *  - K and V head dimensions that differ (D_k != D_v, as MLA), and declared invariances (layout, batch,
 *    determinism).
 * Every ABI-3 call field has a neutral value (noted at each) that attncheck sends to a plug-in that does not
 * declare the capability, so a plug-in reads only the fields of what it declares. This attncheck checks the
 * declarations (cross lengths, head dims, empty rows) and sends calls with the LSE, sinks, softcap, ALiBi,
 * causal = 0, paged K and V (in a declared page size and layout), documents, chunked local attention, a prefix,
 * a right window, block masks, dense masks, strided inputs and V with a head dimension of its own (D_v != D) to a
 * plug-in that declares them; the invariances (layout, batch, determinism) are declared here and checked by the
 * laws docs/laws.md names.
 *
 * ABI 4 begins with the table's own size (docs/abi4.md designs the rest: quantised caches, selected keys and tree
 * masks, RoPE, QK-norm, biases, temperature, dropout). An attncheck_plugin_v4 is an attncheck_plugin_v3 field for
 * field, then table_size, which the loader reads before anything else of ABI 4 and never reads past: a field the
 * table does not reach is its neutral value. So a source compiled against a later header, whose
 * attncheck_plugin_v4 has grown, is read as the table it is; and ABI 4's fields are appended to attncheck_plugin_v4
 * itself, feature by feature, without another version. Set both fields with ATTNCHECK_PLUGIN_V4_HEADER. */
#ifndef ATTNCHECK_PLUGIN_H
#define ATTNCHECK_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

/** The versions of the table. attncheck loads each; a table with any other version is rejected, the numbers
 *  named. ABI N is an attncheck_plugin_vN table. */
#define ATTNCHECK_PLUGIN_ABI_V1 1u
#define ATTNCHECK_PLUGIN_ABI_V2 2u
#define ATTNCHECK_PLUGIN_ABI_V3 3u
#define ATTNCHECK_PLUGIN_ABI_V4 4u
/** The newest ABI this header describes: the version of an attncheck_plugin_v4 table. A source names the
 *  version its table was written for (ATTNCHECK_PLUGIN_V4_HEADER in an attncheck_plugin_v4 table,
 *  ATTNCHECK_PLUGIN_ABI_V3 beside an attncheck_plugin_v3 table), never this macro: rebuilt against a later header,
 *  an ABI-1 to ABI-3 source that says ATTNCHECK_PLUGIN_ABI_VERSION claims a newer table than it has, and the
 *  loader would read a tail that is not there (it rejects a tail it can tell is garbage, but it cannot tell every
 *  time). From ABI 4 on the table says its own size, and the loader reads no further. */
#define ATTNCHECK_PLUGIN_ABI_VERSION ATTNCHECK_PLUGIN_ABI_V4

/** Marks the entry point exported from the plug-in's shared library. */
#if defined(_WIN32)
#define ATTNCHECK_PLUGIN_EXPORT __declspec(dllexport)
#else
#define ATTNCHECK_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/** The entry point's symbol name, as the loader looks it up. */
#define ATTNCHECK_PLUGIN_ENTRY_NAME "attncheck_plugin"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types, as bits of attncheck_plugin_v1.dtypes and as the value of attncheck_call.dtype.
 * float16 and bfloat16 elements are passed as their raw 16-bit patterns (uint16_t). */
#define ATTNCHECK_DTYPE_F32 0x1u  /**< IEEE binary32, `float` */
#define ATTNCHECK_DTYPE_F64 0x2u  /**< IEEE binary64, `double` */
#define ATTNCHECK_DTYPE_F16 0x4u  /**< IEEE binary16, raw bits in a uint16_t */
#define ATTNCHECK_DTYPE_BF16 0x8u /**< bfloat16 (top half of a binary32), raw bits in a uint16_t */

/* Causal alignment when T_q != T_k, as bits of attncheck_plugin_v1.alignments and attncheck_call.alignment. */
#define ATTNCHECK_ALIGN_TOP_LEFT 0x1u     /**< query i sees keys j <= i (PyTorch's is_causal) */
#define ATTNCHECK_ALIGN_BOTTOM_RIGHT 0x2u /**< query i sees keys j <= i + T_k - T_q (FlashAttention >= 2.1) */

/* Capability flags, as bits of attncheck_plugin_v1.flags. */
#define ATTNCHECK_CAP_RETURNS_WEIGHTS 0x1u /**< forward fills call->weights when it is not NULL */
#define ATTNCHECK_CAP_CUSTOM_SCALE 0x2u    /**< forward honours call->scale when call->has_scale != 0 */
#define ATTNCHECK_CAP_CROSS_LENGTHS 0x4u   /**< accepts T_q != T_k (with the alignments declared) */
#define ATTNCHECK_CAP_NONFINITE_SAFE 0x8u  /**< a NaN/Inf in a future key or value never reaches an output */
/* ABI 2 only: an ABI-1 table that sets one of these is rejected (it has no fields to carry them). */
#define ATTNCHECK_CAP_GQA 0x10u         /**< k, v may have H_kv heads, H_kv dividing H; query head h reads kv head
                                             h / (H / H_kv) (repeat_interleave, FlashAttention, ggml) */
#define ATTNCHECK_CAP_KEY_LENGTHS 0x20u /**< honours call->key_lengths (key padding) */
#define ATTNCHECK_CAP_WINDOW 0x40u      /**< honours call->window (a left sliding window) */

/* What a query row that sees no key returns (all its keys padding, outside the window, or in its future),
 * as attncheck_plugin_v2.empty_rows. Libraries disagree; attncheck's core returns zero. */
#define ATTNCHECK_EMPTY_ROWS_UNSPECIFIED 0u /**< either is accepted; reports say which one it follows */
#define ATTNCHECK_EMPTY_ROWS_ZERO 1u        /**< output 0, weights 0 (FlashAttention) */
#define ATTNCHECK_EMPTY_ROWS_NAN 2u         /**< NaN (PyTorch's math path: softmax of an all -inf row) */
/** ABI 3: the output (and weights, and LSE) of such a row is unspecified, anything at all, because the caller
 *  discards it (Hugging Face's fully padded rows get uniform weights): laws skip those rows, reports say so. */
#define ATTNCHECK_EMPTY_ROWS_ANY 3u

/* ABI 3: the cross-length regimes accepted, as bits of attncheck_plugin_v3.cross_lengths; 0 means both (as in
 * ABI 1 and 2). Only read when flags has ATTNCHECK_CAP_CROSS_LENGTHS. */
#define ATTNCHECK_CROSS_Q_LE_K 0x1u /**< T_q < T_k: decode steps and prefill chunks against a cache */
#define ATTNCHECK_CROSS_Q_GE_K 0x2u /**< T_q > T_k */

/* ABI 3 capability flags, as bits of attncheck_plugin_v3.flags3. Each names the call fields it enables; a
 * plug-in without the bit always gets those fields' neutral values. */
#define ATTNCHECK_CAP3_LSE 0x1u              /**< fills call->lse when it is not NULL */
#define ATTNCHECK_CAP3_SINKS 0x2u            /**< honours call->sinks (and, with a backward, fills d_sinks) */
#define ATTNCHECK_CAP3_SOFTCAP 0x4u          /**< honours call->softcap */
#define ATTNCHECK_CAP3_ALIBI 0x8u            /**< honours call->alibi_slopes */
#define ATTNCHECK_CAP3_PAGED 0x10u           /**< honours call->paged, in the declared page sizes and layouts */
#define ATTNCHECK_CAP3_DOCUMENTS 0x20u       /**< honours call->q_doc_ids and k_doc_ids (packed sequences) */
#define ATTNCHECK_CAP3_CHUNKED_LOCAL 0x40u   /**< honours call->chunk_size (chunked local attention) */
#define ATTNCHECK_CAP3_PREFIX 0x80u          /**< honours call->prefix_length (prefix-LM) */
#define ATTNCHECK_CAP3_BIDIRECTIONAL 0x100u  /**< honours call->causal = 0 (no causal rule) */
#define ATTNCHECK_CAP3_RIGHT_WINDOW 0x200u   /**< honours call->window_right */
#define ATTNCHECK_CAP3_BLOCK_MASK 0x400u     /**< honours call->block_mask */
#define ATTNCHECK_CAP3_DENSE_MASK 0x800u     /**< honours call->dense_mask */
#define ATTNCHECK_CAP3_V_HEAD_DIM 0x1000u    /**< v may have its own head dimension D_v != D (output [B,H,T_q,D_v]) */
#define ATTNCHECK_CAP3_STRIDED 0x2000u       /**< reads q, k, v through any strides: gaps, stride 0, views of one buffer */
#define ATTNCHECK_CAP3_LAYOUT_INVARIANT 0x4000u /**< bit-identical results whatever the strides */
#define ATTNCHECK_CAP3_BATCH_INVARIANT 0x8000u  /**< a sequence's results bit-identical whatever else is in the batch */
#define ATTNCHECK_CAP3_DETERMINISTIC 0x10000u   /**< forward and backward bit-identical when repeated */
/** With ATTNCHECK_CAP3_DOCUMENTS: q_doc_ids may give the queries documents of lengths of their own
 *  (FlashAttention varlen's cu_seqlens_q != cu_seqlens_k), each document aligned on its own lengths
 *  (attncheck_call.q_doc_ids says how). Without it, a query's id is always the one its aligned position gives. */
#define ATTNCHECK_CAP3_QUERY_DOCUMENTS 0x20000u

/* ABI 4: flags4 of an attncheck_plugin_v4 (docs/abi4.md designs the rest). */
#define ATTNCHECK_CAP4_BIAS 0x1u /**< an additive score bias (attncheck_call.bias) */
/** With ATTNCHECK_CAP4_BIAS and a backward: fills attncheck_backward_call.d_bias, the bias's gradient. */
#define ATTNCHECK_CAP4_BIAS_GRAD 0x2u
/** A per-query temperature (attncheck_call.temperature). */
#define ATTNCHECK_CAP4_TEMPERATURE 0x4u
/** Rotary position embeddings of q and k in the call (attncheck_call.rope), half-split pairs (GPT-NeoX, Llama's
 *  rotate_half) and, with the second bit, interleaved pairs (GPT-J): a kernel declares those it implements. */
#define ATTNCHECK_CAP4_ROPE 0x8u
#define ATTNCHECK_CAP4_ROPE_INTERLEAVED 0x10u
/** QK-norm of q and k in the call (attncheck_call.qk_norm), with eps inside the square root (r = sqrt(mean x^2 + eps))
 *  and, with the second bit, outside it (r = sqrt(mean x^2) + eps): a kernel declares those it implements. */
#define ATTNCHECK_CAP4_QK_NORM 0x20u
#define ATTNCHECK_CAP4_QK_NORM_EPS_OUTSIDE 0x40u
/** Dropout on the weights (attncheck_call.dropout): each weight kept with probability 1 - p and divided by 1 - p, or
 *  dropped to 0, by a keep mask the kernel draws from the seed and the offset. The weights it returns are the dropped
 *  ones: attncheck reads the mask there (or, without ATTNCHECK_CAP_WEIGHTS, by probing with one-hot V). */
#define ATTNCHECK_CAP4_DROPOUT 0x80u
/** With a rope declared: its scalings beyond linear (attncheck_rope.scaling): NTK-aware (the base grown to
 *  base·factor^(r/(r-2))) and Llama 3's (frequencies kept, divided by the factor or blended by wavelength). */
#define ATTNCHECK_CAP4_ROPE_NTK 0x100u
#define ATTNCHECK_CAP4_ROPE_LLAMA3 0x200u
/** Quantised K and V caches (attncheck_call.quant), one bit per storage format the kernel reads: FP8 e4m3fn (no
 *  infinities, 448 the largest), FP8 e5m2 (IEEE-style, 57344), int8 (two's complement). K and V of a call come in the
 *  same format, each with its scales per tensor; per kv head and per (batch entry, kv head, key) where declared, and
 *  int8's zero points where declared (_KV_ZERO_POINTS, with _KV_INT8). */
#define ATTNCHECK_CAP4_KV_E4M3FN 0x400u
#define ATTNCHECK_CAP4_KV_E5M2 0x800u
#define ATTNCHECK_CAP4_KV_INT8 0x1000u
#define ATTNCHECK_CAP4_KV_SCALE_PER_HEAD 0x2000u
#define ATTNCHECK_CAP4_KV_SCALE_PER_TOKEN 0x4000u
#define ATTNCHECK_CAP4_KV_ZERO_POINTS 0x8000u
/** ggml's block formats (ATTNCHECK_QFMT_GGML_*): K and V in blocks of 32 elements along D, each with its float16 scale
 *  (and minimum) inside, as llama.cpp's -ctk/-ctv q8_0, q4_0, q4_1, q5_0 and q5_1 caches store them. */
#define ATTNCHECK_CAP4_KV_GGML_Q8_0 0x10000u
#define ATTNCHECK_CAP4_KV_GGML_Q4_0 0x20000u
#define ATTNCHECK_CAP4_KV_GGML_Q4_1 0x40000u
#define ATTNCHECK_CAP4_KV_GGML_Q5_0 0x80000u
#define ATTNCHECK_CAP4_KV_GGML_Q5_1 0x100000u
/** A compute precision, declared with a ggml block format: each row of q rounded to ggml's Q8_0 blocks (Q8_1 with
 *  Q4_1 and Q5_1 K) for the dot with K, as ggml's CPU kernel does (its vec_dot_type). attncheck's bounds then widen by
 *  that rounding; the call is the same. */
#define ATTNCHECK_CAP4_Q_DOT_GGML_Q8 0x200000u
/** Q quantised too (attncheck_quant_kv.q), in the cache's FP8 or int8 format with scales of its own: FlashAttention
 *  3's FP8 Q with its q descale. */
#define ATTNCHECK_CAP4_Q_QUANT 0x400000u
/** A compute precision, declared with a quantised cache: P = exp(s - m) cast to FP8 e4m3 (possibly scaled into its
 *  range first, and descaled) for its product with V, as FlashAttention 3's FP8 forward does. attncheck's output bounds
 *  then widen by that rounding; the call is the same. */
#define ATTNCHECK_CAP4_P_FP8 0x800000u
/** Quantised K and V in paged pools (with ATTNCHECK_CAP3_PAGED and a format): a call both paged and quantised, as an
 *  FP8 or int8 paged cache holds it. paged->k_pages.data and v_pages.data are NULL (their shapes still the pools'), and
 *  quant->k and quant->v describe the pools: shape the pool's, in its layout's order; key t of sequence b's codes (or
 *  ggml's blocks) at its page and slot; the scales over the pool's first three axes in the same order, so that a key's
 *  scale is at its page and slot too: per kv head along the head's axis ([1,1,H_kv] token-major, [1,H_kv,1]
 *  head-major), per token and head the pool's own ([pages, page_size, H_kv] or [pages, H_kv, page_size]). Free slots
 *  hold anything, their codes and scales alike (NaN codes, NaN or 0 scales). */
#define ATTNCHECK_CAP4_PAGED_QUANT 0x1000000u
/** Selected keys (attncheck_call.index_list): per batch entry, kv head and query, a list of key indices (DeepSeek's DSA
 *  top-k, NSA's selection); each query sees the keys its row lists, and of those only what every other rule allows. */
#define ATTNCHECK_CAP4_INDEX_LIST 0x2000000u
/** With ATTNCHECK_CAP4_INDEX_LIST: block indices (index_list->block_size > 1: NSA's and MoBA's selected blocks). */
#define ATTNCHECK_CAP4_INDEX_LIST_BLOCKS 0x4000000u
/** With ATTNCHECK_CAP4_INDEX_LIST: one list per query head (index_list->per ATTNCHECK_INDEX_PER_QUERY_HEAD, shape
 *  [B, H, T_q, max_k]) where K and V have fewer heads than Q (MoBA's and NSA's per-head selections). */
#define ATTNCHECK_CAP4_INDEX_LIST_PER_QUERY_HEAD 0x8000000u
/** A tree of draft tokens given by its parents (attncheck_call.tree, form ATTNCHECK_TREE_PARENTS: speculative
 *  decoding's verification, EAGLE's and SGLang's trees): each node sees the prefix, its ancestors and itself. A left
 *  window and ALiBi read a node's place, prefix_lengths[b] + its depth (the earlier nodes its row shows), not its
 *  index; a node's key sits at its node's place. Never with a right window, chunks or documents. */
#define ATTNCHECK_CAP4_TREE 0x10000000u
/** The tree as a packed bitmask (form ATTNCHECK_TREE_BITMASK: FlashInfer's packed_custom_mask with mask_indptr). */
#define ATTNCHECK_CAP4_TREE_BITMASK 0x20000000u
/** With ATTNCHECK_CAP4_INDEX_LIST and paged K and V: in a paged call the index list's entries may be slots of the pool
 *  (index_list->space ATTNCHECK_INDEX_PHYSICAL: page * page_size + slot, DeepSeek's FlashMLA sparse indices). */
#define ATTNCHECK_CAP4_INDEX_LIST_PHYSICAL 0x40000000u

/* ABI 4's second word of declarations (attncheck_plugin_v4.flags4b; flags4 has no bit left). */
/** With ATTNCHECK_CAP4_INDEX_LIST: a key listed n times in a row weighs n times (its score plus ln n), as a gather
 *  kernel that attends over every entry it reads (FlashMLA's sparse kernels) computes. Without it a row is a set: a
 *  repeated entry counts once. attncheck sends duplicates either way. */
#define ATTNCHECK_CAP4B_INDEX_LIST_COUNTED 0x1u
/** With ATTNCHECK_CAP4_INDEX_LIST: each query's own block (the block_size keys holding its aligned position, the
 *  causal rule's diagonal; its own key with key indices) is selected besides the row's entries, as MoBA always
 *  selects the current block; the causal rule still cuts inside it. attncheck's lists then need not name it. */
#define ATTNCHECK_CAP4B_INDEX_LIST_CURRENT_BLOCK 0x2u

/* ABI 4: the values of attncheck_rope.variant and .scaling. */
#define ATTNCHECK_ROPE_HALF_SPLIT 0x1u   /**< pair m is (m, m + rotary_dim/2) */
#define ATTNCHECK_ROPE_INTERLEAVED 0x2u  /**< pair m is (2m, 2m + 1) */
#define ATTNCHECK_ROPE_SCALING_NONE 0u   /**< the positions as they are */
#define ATTNCHECK_ROPE_SCALING_LINEAR 1u /**< each position divided by scaling_params[0] */
/** NTK-aware (ATTNCHECK_CAP4_ROPE_NTK): the base grown to base·f^(r/(r-2)), f = scaling_params[0], r = rotary_dim. */
#define ATTNCHECK_ROPE_SCALING_NTK 2u
/** Llama 3's (ATTNCHECK_CAP4_ROPE_LLAMA3): f = scaling_params[0], low and high frequency factors l = [1] and h = [2],
 *  original context L = [3]; pair m's frequency w = base^(-2m/r), its wavelength 2π/w: w where that is below L/h, w/f
 *  where above L/l, (1 - s)·w/f + s·w between, s = (L/wavelength - l)/(h - l). */
#define ATTNCHECK_ROPE_SCALING_LLAMA3 4u
/* ABI 4: the values of attncheck_quant_tensor.format and .granularity. */
#define ATTNCHECK_QFMT_E4M3FN 1u /**< S.EEEE.MMM, bias 7, no infinities, S.1111.111 NaN (torch.float8_e4m3fn) */
#define ATTNCHECK_QFMT_E5M2 2u   /**< S.EEEEE.MM, bias 15, IEEE-style (torch.float8_e5m2, float16's top byte) */
#define ATTNCHECK_QFMT_INT8 3u   /**< a two's-complement byte */
/** ggml's blocks (ggml-common.h): block_q8_0 {d; int8 qs[32]} (d·q), block_q4_0 {d; qs[16]} (d·(n - 8)), block_q4_1
 *  {d; m; qs[16]} (d·n + m), block_q5_0 {d; qh[4]; qs[16]} (d·(n - 16)), block_q5_1 {d; m; qh[4]; qs[16]} (d·n + m):
 *  d and m float16 (little-endian), element j's nibble the low one of qs[j] and element j + 16's its high one, the
 *  fifth bit of element j bit j of qh (a little-endian u32). 34, 18, 20, 22 and 24 bytes. */
#define ATTNCHECK_QFMT_GGML_Q8_0 4u
#define ATTNCHECK_QFMT_GGML_Q4_0 5u
#define ATTNCHECK_QFMT_GGML_Q4_1 6u
#define ATTNCHECK_QFMT_GGML_Q5_0 7u
#define ATTNCHECK_QFMT_GGML_Q5_1 8u
#define ATTNCHECK_QSCALE_TENSOR 0u     /**< scales [1,1,1] */
#define ATTNCHECK_QSCALE_KV_HEAD 1u    /**< scales [1,H_kv,1] */
#define ATTNCHECK_QSCALE_TOKEN_HEAD 2u /**< scales [B,H_kv,T_k] */
#define ATTNCHECK_QSCALE_BLOCK32 3u    /**< ggml's formats: the scales inside the blocks (scales NULL) */
/* ABI 4: the values of attncheck_index_list.space and .per. */
#define ATTNCHECK_INDEX_LOGICAL 1u     /**< key positions 0 .. T_k - 1 */
#define ATTNCHECK_INDEX_PHYSICAL 2u    /**< paged calls: slots of the pool, page * page_size + slot */
#define ATTNCHECK_INDEX_PER_KV_HEAD 1u /**< one list per kv head, shared by its query heads */
#define ATTNCHECK_INDEX_PER_QUERY_HEAD 2u /**< one list per query head (ATTNCHECK_CAP4_INDEX_LIST_PER_QUERY_HEAD) */
/* ABI 4: the values of attncheck_tree_mask.form and .bit_order. */
#define ATTNCHECK_TREE_PARENTS 1u       /**< parents[b*T_q + n]: node n's parent (< n), or -1 */
#define ATTNCHECK_TREE_BITMASK 2u       /**< bits from byte offsets[b]: request b's rows */
#define ATTNCHECK_BITS_LSB_FIRST 1u     /**< cell c at bit c % 8 of byte c / 8 (FlashInfer's "little") */
#define ATTNCHECK_BITS_MSB_FIRST 2u     /**< cell c at bit 7 - c % 8 (numpy.packbits' default, "big") */

/* ABI 4: the values of attncheck_qk_norm.eps_placement. */
#define ATTNCHECK_NORM_EPS_IN_SQRT 1u /**< r = sqrt(mean x^2 + eps) */
#define ATTNCHECK_NORM_EPS_OUTSIDE 2u /**< r = sqrt(mean x^2) + eps */

/* ABI 3: page layouts, as bits of attncheck_plugin_v3.page_layouts and the value of attncheck_paged_kv.layout. */
#define ATTNCHECK_PAGED_TOKEN_MAJOR 0x1u /**< a page pool [num_pages, page_size, H_kv, D] (vLLM, FlashInfer NHD) */
#define ATTNCHECK_PAGED_HEAD_MAJOR 0x2u  /**< a page pool [num_pages, H_kv, page_size, D] (FlashInfer HND) */

/* ABI 3: the kinds of block in an attncheck_block_mask. */
#define ATTNCHECK_BLOCK_EMPTY 0u   /**< every key of the block hidden */
#define ATTNCHECK_BLOCK_PARTIAL 1u /**< the block's entries of the dense `partial` mask say */
#define ATTNCHECK_BLOCK_FULL 2u    /**< every key of the block visible (to this family) */

/* Status codes forward returns. */
#define ATTNCHECK_OK 0          /**< output (and weights, when asked) written in full */
#define ATTNCHECK_ERROR 1       /**< failed; a message says why */
#define ATTNCHECK_UNSUPPORTED 2 /**< the call is outside what the plug-in supports; a message says what */

/** An input tensor: [B,H,T,D] (element (b,h,i,d) at data + b*strides[0] + h*strides[1] + i*strides[2] +
 *  d*strides[3], strides in elements, not bytes). */
typedef struct attncheck_tensor_in {
  const void* data;
  int64_t shape[4];
  int64_t strides[4];
} attncheck_tensor_in;

/** An output tensor the caller owns: [B,H,T_q,D] for the output, [B,H,T_q,T_k] for weights. Write every
 *  element and nothing outside it. */
typedef struct attncheck_tensor_out {
  void* data;
  int64_t shape[4];
  int64_t strides[4];
} attncheck_tensor_out;

/** One forward call: output = softmax(mask(Q Kᵀ · scale)) V for each (b,h), the mask being causal (with
 *  the call's alignment), and from ABI 2 also key padding and a sliding window. With aligned position
 *  p = i (top-left) or i + T_k - T_q (bottom-right), query i of batch entry b sees exactly the keys j with
 *  j <= p, j < key_lengths[b] (when given) and j >= p - window (when window >= 0). */
typedef struct attncheck_call {
  uint32_t dtype;     /**< one ATTNCHECK_DTYPE_* bit, the same for every tensor */
  uint32_t alignment; /**< one ATTNCHECK_ALIGN_* bit; only matters when T_q != T_k */
  int32_t has_scale;  /**< 0: use the default scale 1/sqrt(D); otherwise multiply QKᵀ by `scale` */
  double scale;       /**< finite and > 0 when has_scale != 0 */
  /** [B,H,T_q,D], [B,H_kv,T_k,D], [B,H_kv,T_k,D_v]; H_kv = H unless the plug-in declares ATTNCHECK_CAP_GQA, and
   *  D_v = D unless it declares ATTNCHECK_CAP3_V_HEAD_DIM (then v.shape[3] says D_v) */
  attncheck_tensor_in q, k, v;
  attncheck_tensor_out output;   /**< [B,H,T_q,D_v] */
  attncheck_tensor_out* weights; /**< [B,H,T_q,T_k], or NULL when not wanted (or not offered) */
  /* ABI 2: an ABI-1 plug-in never reads the fields below, and attncheck never sends it a call that needs
   * them (its flags cannot declare them). */
  /** B entries: keys j >= key_lengths[b] of batch entry b are padding (0 <= key_lengths[b] <= T_k); NULL: no
   *  padding. Always NULL unless the plug-in declares ATTNCHECK_CAP_KEY_LENGTHS. */
  const int64_t* key_lengths;
  /** < 0: no window; else the query at aligned position p sees keys p - window .. p only. Always < 0 unless
   *  the plug-in declares ATTNCHECK_CAP_WINDOW. */
  int64_t window;
  /* ABI 3: an ABI-1 or ABI-2 plug-in never reads the fields below. Each has a neutral value, sent to a plug-in
   * that does not declare its capability. The order in which the score of query i (aligned position p) and key
   * j is built: s = scale·(q_i·k_j); then softcap: s = softcap·tanh(s/softcap); then ALiBi: s += slope_h·(j - p);
   * then the mask (every family present must allow j, else s = -inf); then softmax over the visible keys and
   * the sink logit of head h together, the sink's share dropped from the output. The LSE is the log-sum-exp of
   * that softmax's terms (sink included): natural log, -inf for a row that sees no key and has no sink. */
  /** 1: the causal rule (j <= p) applies; 0 (only with ATTNCHECK_CAP3_BIDIRECTIONAL): it does not, and every key
   *  is visible but for padding, the window and the other mask families. ALiBi's p is still the aligned position.
   *  Neutral: 1. */
  int32_t causal;
  uint32_t reserved3; /**< 0 */
  /** Keys j < prefix_length are visible to every query (prefix-LM: the prefix attends bidirectionally), on top
   *  of the causal rule. Neutral: 0. */
  int64_t prefix_length;
  /** < 0: none; else query p sees keys j <= p + window_right only (with `window`, a two-sided window; with the
   *  causal rule 0 changes nothing). Neutral: -1. */
  int64_t window_right;
  /** <= 0: none; else query p sees only keys of its own chunk: j / chunk_size == p / chunk_size (Llama 4's
   *  chunked local attention, positions aligned as p). Neutral: 0. */
  int64_t chunk_size;
  /** [B, T_q] and [B, T_k], row-major: the document of each query and key position; a query sees only keys of
   *  its own document (packed sequences; causal inside a document through the causal rule). The key ids of a
   *  batch entry are non-decreasing and >= 0 (documents are contiguous runs of keys; an id that steps by n + 1
   *  means n empty documents between); a query's id is the id of the key at its aligned position p clamped to
   *  [0, T_k - 1]. Both NULL or both given, in forward and backward calls. Neutral: NULL.
   *  With ATTNCHECK_CAP3_QUERY_DOCUMENTS the query ids are free instead (non-decreasing; an id past the last
   *  key's is a document without keys at the end): document d then holds queries [qs, qe) and keys [ks, ke),
   *  and its query i sits at aligned position p = ks + (i - qs), plus (ke - ks) - (qe - qs) under bottom-right
   *  alignment: each document aligned on its own lengths, as FlashAttention's varlen aligns each sequence. Every
   *  rule that reads p (causal, windows, chunks, ALiBi) reads that one. Query ids that follow from the positions
   *  give the same p as before. */
  const int32_t* q_doc_ids;
  const int32_t* k_doc_ids;
  /** A block mask (FlexAttention's BlockMask), or NULL, in forward and backward calls. Neutral: NULL. */
  const struct attncheck_block_mask* block_mask;
  /** A dense boolean mask, or NULL, in forward and backward calls. Neutral: NULL. */
  const struct attncheck_dense_mask* dense_mask;
  /** > 0: logit softcapping, s = softcap·tanh(s/softcap) on the scaled score (Gemma 2); 0: none. Neutral: 0. */
  double softcap;
  /** H entries (one per query head), or NULL: ALiBi, s += alibi_slopes[h]·(j - p). Neutral: NULL. */
  const double* alibi_slopes;
  /** H entries (one per query head), or NULL: the sink logit of each head, an extra softmax column whose
   *  weight is dropped (gpt-oss); -inf is no sink. Not scaled, capped or biased. The visible weights of a row
   *  then sum to 1 - exp(sink - lse), and the LSE of a row that sees no key is its sink. Neutral: NULL. */
  const double* sinks;
  /** The log-sum-exp of every row, or NULL when not wanted (only a plug-in with ATTNCHECK_CAP3_LSE gets one):
   *  [B,H,T_q] doubles the caller owns; write every element (-inf for a row that sees no key and has no sink).
   *  Neutral: NULL. */
  struct attncheck_lse_out* lse;
  /** Paged K and V, or NULL (only a plug-in with ATTNCHECK_CAP3_PAGED gets one, in a page size and layout it
   *  declares, and only in a forward call: a backward call is never paged). When given, q is as always, k.data
   *  and v.data are NULL, k.shape and v.shape still say [B,H_kv,T_k,D] (T_k the call's key length, which the
   *  alignment and the weights' shape use) and key_lengths is never NULL: it holds each sequence's length
   *  (<= T_k; T_k each when the call has no padding), also for a plug-in without ATTNCHECK_CAP_KEY_LENGTHS.
   *  Neutral: NULL. */
  const struct attncheck_paged_kv* paged;
  /* ABI 4: the fields below are read only by a plug-in whose flags4 declare their feature (a table of ABI 1 to 3
   * never reaches them). */
  /** An additive bias on the scores (ATTNCHECK_CAP4_BIAS), or NULL, in forward and backward calls: s +=
   *  bias[b,h,i,j] after the scale and the softcap, where ALiBi's term is added, before the mask. A value of -inf
   *  hides its cell exactly as a mask does (a row whose every visible cell is -inf sees no key and follows the
   *  empty-row convention); +inf and NaN never come. Neutral: NULL. */
  const struct attncheck_bias* bias;
  /** A per-query temperature (ATTNCHECK_CAP4_TEMPERATURE), or NULL, in forward and backward calls: query i of head h
   *  in batch entry b has its scaled scores divided by tau = temperature[b*temperature_strides[0] +
   *  h*temperature_strides[1] + i*temperature_strides[2]] (strides in elements, 0 over an extent of 1, which
   *  broadcasts) before the softcap: s = scale*(q_i . k_j)/tau, which is attention on the query q_i/tau (Llama 4's
   *  attention temperature tuning multiplies q by its 1/tau). Each tau is finite and > 0. In a backward call dq is
   *  the gradient of q itself (dq_i = dq'_i/tau for q' = q/tau). Neutral: NULL. */
  const double* temperature;
  int64_t temperature_strides[3];
  /** Rotary position embeddings of q and k (ATTNCHECK_CAP4_ROPE or _ROPE_INTERLEAVED, whichever rope->variant is),
   *  or NULL, in forward and backward calls: applied to q and k before the scores (then the scale, the temperature,
   *  the softcap). In a backward call dq and dk are the gradients of q and k themselves. Neutral: NULL. */
  const struct attncheck_rope* rope;
  /** QK-norm of q and k (ATTNCHECK_CAP4_QK_NORM or _QK_NORM_EPS_OUTSIDE, whichever qk_norm->eps_placement is), or
   *  NULL, in forward and backward calls: applied first, before the rope. In a backward call dq and dk are the
   *  gradients of q and k themselves. Neutral: NULL. */
  const struct attncheck_qk_norm* qk_norm;
  /** Dropout on the weights (ATTNCHECK_CAP4_DROPOUT), or NULL, in forward and backward calls: after the softmax each
   *  weight (b,h,i,j) is kept and divided by 1 - p, or dropped to 0, by a keep mask that is a function of the seed,
   *  the offset and (b,h,i,j) with the call's H, T_q and T_k only: not of the values, not of the batch entries after
   *  b (a counter-based RNG, Philox in PyTorch and FlashAttention, whose counter is the cell's index, is so). The
   *  output is the dropped weights times V, the weights written are the dropped ones, the LSE is the softmax's. A
   *  backward call with the same seed and offset differentiates the forward's output, with its mask. Neutral: NULL. */
  const struct attncheck_dropout* dropout;
  /** Quantised K and V (ATTNCHECK_CAP4_KV_E4M3FN, _KV_E5M2 or _KV_INT8, whichever quant->k.format is), or NULL, in
   *  forward calls only (paged only with ATTNCHECK_CAP4_PAGED_QUANT, quant->k and quant->v then the pools'): k.data and
   *  v.data are then NULL, k.shape and v.shape still say
   *  [B,H_kv,T_k,D] and [B,H_kv,T_k,D_v], and the call means attention over the dequantised values
   *  (value(code) - zero_point)·scale of quant->k and quant->v. Neutral: NULL. */
  const struct attncheck_quant_kv* quant;
  /** Selected keys (ATTNCHECK_CAP4_INDEX_LIST), or NULL, in forward and backward calls: query i of batch entry b and
   *  query head h sees key j only if row (b, h / (H / H_kv), i) (row (b, h, i) with index_list->per
   *  ATTNCHECK_INDEX_PER_QUERY_HEAD) lists j (block_size 1) or j / block_size (block
   *  indices, ATTNCHECK_CAP4_INDEX_LIST_BLOCKS), and every other rule of the call allows j. A key listed twice is
   *  listed once. Neutral: NULL. */
  const struct attncheck_index_list* index_list;
  /** A tree of draft tokens (ATTNCHECK_CAP4_TREE, ATTNCHECK_CAP4_TREE_BITMASK), or NULL, in forward and backward calls:
   *  the T_q queries are the tree's nodes, node n of batch entry b its query n and its key prefix_lengths[b] + n (the
   *  last T_q of its L keys: key_lengths[b], or T_k without them); query i sees key j only if the tree shows it (the
   *  prefix and node i's ancestors and itself; a bitmask's cell) and every other rule of the call allows j. Never
   *  with ALiBi, windows, chunks or documents. Neutral: NULL. */
  const struct attncheck_tree_mask* tree;
} attncheck_call;

/** ABI 3: the LSE of every query row, [B,H,T_q], written as double whatever the call's dtype (a kernel that
 *  keeps it in float32 widens it, exactly). Element (b,h,i) at data + b*strides[0] + h*strides[1] +
 *  i*strides[2]: the strides need not be contiguous. */
typedef struct attncheck_lse_out {
  double* data;
  int64_t shape[3];
  int64_t strides[3];
} attncheck_lse_out;

/** ABI 3: a block mask. Query block m holds queries m*block_q .. (m+1)*block_q - 1 and key block n keys
 *  n*block_k .. (n+1)*block_k - 1 (the last block of each may be short). The kind of block (b,h,m,n) is
 *  kinds[b*kind_strides[0] + h*kind_strides[1] + m*kind_strides[2] + n*kind_strides[3]] (a stride 0
 *  broadcasts over batch or heads); inside a PARTIAL block, key j is visible to query i when
 *  partial[b*partial_strides[0] + h*partial_strides[1] + i*partial_strides[2] + j*partial_strides[3]] != 0. */
typedef struct attncheck_block_mask {
  int64_t block_q, block_k;
  int64_t num_q_blocks, num_k_blocks; /**< ceil(T_q / block_q), ceil(T_k / block_k) */
  const uint8_t* kinds;               /**< ATTNCHECK_BLOCK_* values */
  int64_t kind_strides[4];
  const uint8_t* partial;             /**< [B,H,T_q,T_k], read only inside PARTIAL blocks; NULL if none is */
  int64_t partial_strides[4];
} attncheck_block_mask;

/** ABI 3: a dense boolean mask [B,H,T_q,T_k]: key j visible to query i of (b,h) when the byte at
 *  data + b*strides[0] + h*strides[1] + i*strides[2] + j*strides[3] is not 0 (strides 0 broadcast). */
typedef struct attncheck_dense_mask {
  const uint8_t* data;
  int64_t strides[4];
} attncheck_dense_mask;

/** ABI 4 (ATTNCHECK_CAP4_ROPE, _ROPE_INTERLEAVED): rotary position embeddings. Head dimensions c < rotary_dim
 *  are rotated in pairs by the angle of their token's own position id; those past it are untouched. Pair m <
 *  rotary_dim/2 is (m, m + rotary_dim/2) (ATTNCHECK_ROPE_HALF_SPLIT) or (2m, 2m + 1) (ATTNCHECK_ROPE_INTERLEAVED),
 *  rotated by theta = pos'·base^(-2m/rotary_dim), pos' the position (divided by scaling_params[0] under
 *  ATTNCHECK_ROPE_SCALING_LINEAR): x'_a = x_a cos theta - x_b sin theta, x'_b = x_b cos theta + x_a sin theta. */
typedef struct attncheck_rope {
  uint32_t variant;             /**< ATTNCHECK_ROPE_HALF_SPLIT or ATTNCHECK_ROPE_INTERLEAVED */
  uint32_t scaling;             /**< ATTNCHECK_ROPE_SCALING_NONE, _LINEAR, _NTK or _LLAMA3 (the last two declared) */
  int64_t rotary_dim;           /**< even, in [2, D] */
  double base;                  /**< finite and > 0 (10000 in Llama 2, 500000 in Llama 3) */
  double scaling_params[4];     /**< [0]: the factor (> 0); Llama 3's [1] low and [2] high frequency factor and [3]
                                     original context; 0 otherwise */
  const int64_t* q_positions;   /**< [B, T_q] row-major: each query's position id, in [0, 2^40] */
  const int64_t* k_positions;   /**< [B, T_k]: each key's */
  const int64_t* mrope_sections;  /**< NULL (MRoPE's sections: not sent yet) */
  size_t num_mrope_sections;      /**< 0 */
  struct attncheck_tensor_out* k_rotated_out; /**< NULL (the rotated K written back: not asked for yet) */
} attncheck_rope;

/** ABI 4 (ATTNCHECK_CAP4_QK_NORM, _QK_NORM_EPS_OUTSIDE): each row x of q (with q_weight) and of k (with k_weight)
 *  over its head dimension becomes w * x / r, r = sqrt(mean x^2 + eps) (ATTNCHECK_NORM_EPS_IN_SQRT) or
 *  sqrt(mean x^2) + eps (ATTNCHECK_NORM_EPS_OUTSIDE). */
typedef struct attncheck_qk_norm {
  const double* q_weight;  /**< [D], or NULL: q is not normalised */
  const double* k_weight;  /**< [D], or NULL: k is not normalised */
  double eps;              /**< finite and > 0 */
  uint32_t eps_placement;  /**< ATTNCHECK_NORM_EPS_IN_SQRT or _OUTSIDE */
  uint32_t reserved;       /**< 0 */
} attncheck_qk_norm;

/** ABI 4 (ATTNCHECK_CAP4_DROPOUT): dropout's probability, seed and offset. */
typedef struct attncheck_dropout {
  double p;             /**< in [0, 1): the probability a weight is dropped */
  uint64_t seed;        /**< the RNG's key */
  uint64_t offset;      /**< where in its stream the call starts (PyTorch's philox offset) */
  uint32_t reserved[2]; /**< 0 */
} attncheck_dropout;

/** ABI 4: one quantised cache, K's or V's. Element (b,h,t,c) is the byte codes[b*strides[0] + h*strides[1] +
 *  t*strides[2] + c*strides[3]] (strides in bytes, which are elements); its scale (and zero point) is that of (b,h,t)
 *  under the granularity, at scales[b*scale_strides[0] + h*scale_strides[1] + t*scale_strides[2]] with the strides of
 *  an extent of 1 being 0: [1,1,1] per tensor, [1,H_kv,1] per kv head, [B,H_kv,T_k] per token and kv head. Its value
 *  is (value(code) - zero_point)·scale, computed exactly: every scale is a finite float32 > 0, every code a finite
 *  value of the format (never a NaN or an infinity), every zero point an integer in [-128, 127]. In ggml's formats
 *  (ATTNCHECK_QSCALE_BLOCK32) `codes` holds the blocks: element (b,h,t,c) is in the block at codes + b*strides[0] +
 *  h*strides[1] + t*strides[2] + (c/32)*strides[3] (strides[3] the block's size), scales and zero_points are NULL. */
typedef struct attncheck_quant_tensor {
  uint32_t format;      /**< ATTNCHECK_QFMT_* */
  uint32_t granularity; /**< ATTNCHECK_QSCALE_* */
  const uint8_t* codes;
  int64_t shape[4];   /**< [B,H_kv,T_k,D] (V: D_v) */
  int64_t strides[4]; /**< in bytes */
  const float* scales;
  int64_t scale_shape[3]; /**< the granularity's extents */
  int64_t scale_strides[3];
  const int8_t* zero_points; /**< int8 with ATTNCHECK_CAP4_KV_ZERO_POINTS: shaped and strided as the scales; else NULL */
} attncheck_quant_tensor;

/** ABI 4: a call's quantised K and V, in one format, each with scales of its own. */
typedef struct attncheck_quant_kv {
  attncheck_quant_tensor k, v;
  /** Q quantised too (ATTNCHECK_CAP4_Q_QUANT; appended, so a plug-in built before it never reads it): shape
   *  [B,H,T_q,D], the same format, granularity ATTNCHECK_QSCALE_TENSOR ([1,1,1]), _KV_HEAD (here per query head,
   *  [1,H,1]) or _TOKEN_HEAD ([B,H,T_q]), zero_points NULL; call->q.data is NULL then. Otherwise q.codes is NULL and
   *  the call's q is as always. */
  attncheck_quant_tensor q;
} attncheck_quant_kv;

/** ABI 4: selected keys (ATTNCHECK_CAP4_INDEX_LIST). Row (b, g, i) is max_k int32 entries at indices +
 *  b*strides[0] + g*strides[1] + i*strides[2] + n*strides[3] (strides in elements): each -1 (padding, anywhere in the
 *  row, never to be read as a key) or a key index in [0, T_k) (a block index in [0, ceil(T_k / block_size)) with
 *  block_size > 1). attncheck sends duplicates, padding between entries, keys past a sequence's length and keys the
 *  causal rule hides: the call's rules still decide. */
typedef struct attncheck_index_list {
  uint32_t space;      /**< ATTNCHECK_INDEX_LOGICAL, or _PHYSICAL (ATTNCHECK_CAP4_INDEX_LIST_PHYSICAL, paged calls) */
  uint32_t per;        /**< ATTNCHECK_INDEX_PER_KV_HEAD, or _PER_QUERY_HEAD (then shape[1] is H) */
  int64_t block_size;  /**< 1: key indices; > 1: block indices */
  int64_t max_k;       /**< entries per row (0: every row empty) */
  const int32_t* indices;
  int64_t shape[4];    /**< [B, H_kv (or H), T_q, max_k] */
  int64_t strides[4];
} attncheck_index_list;

/** ABI 4: a tree of draft tokens per batch entry (ATTNCHECK_CAP4_TREE, _TREE_BITMASK), in one of two forms:
 *  - ATTNCHECK_TREE_PARENTS: parents[b*nodes + n] is node n's parent in [0, n), or -1 (a child of the prefix);
 *  - ATTNCHECK_TREE_BITMASK: request b's nodes rows of L_b = prefix_lengths[b] + nodes cells each (its row stride),
 *    row-major from byte offsets[b] (each request from a byte boundary, as FlashInfer's segment_packbits packs
 *    them), cell (i, j) = c = i*L_b + j in bit_order; key j visible to node i where its bit is 1. Any cells may be
 *    set, not only a tree's. */
typedef struct attncheck_tree_mask {
  uint32_t form;                  /**< ATTNCHECK_TREE_PARENTS or ATTNCHECK_TREE_BITMASK */
  uint32_t bit_order;             /**< the bitmask's: ATTNCHECK_BITS_LSB_FIRST or _MSB_FIRST (0 with parents) */
  int64_t nodes;                  /**< T_q */
  const int64_t* prefix_lengths;  /**< [B]: L_b - nodes, the keys every node sees */
  const int32_t* parents;         /**< [B, nodes] with ATTNCHECK_TREE_PARENTS, else NULL */
  const uint8_t* bits;            /**< with ATTNCHECK_TREE_BITMASK, else NULL */
  const int64_t* offsets;         /**< [B + 1] byte offsets into bits with ATTNCHECK_TREE_BITMASK, else NULL */
} attncheck_tree_mask;

/** ABI 4 (ATTNCHECK_CAP4_BIAS): an additive score bias [B or 1, H or 1, T_q, T_k] of the call's dtype (T5's relative
 *  buckets, a learned bias, a score_mod written out): element (b,h,i,j) at data + b*strides[0] + h*strides[1] +
 *  i*strides[2] + j*strides[3] (strides in elements; 0 over an extent of 1, which broadcasts). Every value is
 *  finite; a key to hide comes in a mask, never as -inf here. */
typedef struct attncheck_bias {
  const void* data;
  int64_t shape[4]; /**< B or 1, H or 1, T_q, T_k */
  int64_t strides[4];
} attncheck_bias;

/** ABI 3: paged K and V. Key t of sequence b lives in page block_table[b*block_table_stride + t/page_size],
 *  slot t % page_size: element (t, g, d) of the K pool at k_pages.data + page*k_pages.strides[0] + ... in the
 *  order of the layout ([page, slot, head, d] token-major or [page, head, slot, d] head-major). Slots past a
 *  sequence's length, pages no table references, and table entries past ceil(len / page_size) hold anything
 *  (NaN, Inf, out-of-range page numbers) and must never be read. Two sequences may share a page (a common
 *  prefix), and the pages of a sequence need not be in order. attncheck passes pools at the call's dtype with
 *  contiguous strides and block_table_stride = max_pages. */
typedef struct attncheck_paged_kv {
  uint32_t layout;   /**< one ATTNCHECK_PAGED_* bit */
  uint32_t reserved; /**< 0 */
  int64_t num_pages, page_size;
  attncheck_tensor_in k_pages, v_pages; /**< shape in the layout's order; v_pages' last extent is D_v */
  const int32_t* block_table;           /**< [B, max_pages] with row stride block_table_stride */
  int64_t max_pages, block_table_stride;
} attncheck_paged_kv;

/** The forward call. Writes at most message_size bytes (NUL included) of explanation into `message`
 *  when it does not return ATTNCHECK_OK. Must not throw, longjmp or keep pointers past the return. */
typedef int32_t (*attncheck_forward_fn)(const attncheck_call* call, char* message, size_t message_size);

/** One backward call (ABI 2): the gradients of L = sum(output ∘ d_output) with respect to q, k and v, for the
 *  forward call `forward` describes (its inputs and options). In a backward call forward->output is a
 *  scratch buffer [B,H,T_q,D] the plug-in may use (to recompute O, say); what it holds afterwards is ignored.
 *  forward->weights is NULL. Every tensor has the call's dtype. */
typedef struct attncheck_backward_call {
  const attncheck_call* forward;
  attncheck_tensor_in d_output; /**< dO [B,H,T_q,D_v], the output's shape */
  /** dQ [B,H,T_q,D]; dK [B,H_kv,T_k,D], dV [B,H_kv,T_k,D_v]: the gradient of a kv head shared by a group of
   *  query heads sums over the group. Write every element and nothing outside them. */
  attncheck_tensor_out dq, dk, dv;
  /* ABI 3 */
  /** H entries when forward->sinks is given: the gradient of L with respect to each head's sink logit (summed
   *  over batch entries and rows: -Σ exp(sink_h - lse_i)·(dO_i·O_i)), 0 for a sink of -inf; write every one.
   *  Else NULL. */
  double* d_sinks;
  /* ABI 4 */
  /** With forward->bias given and ATTNCHECK_CAP4_BIAS_GRAD declared: the gradient of L with respect to the bias,
   *  of the call's dtype and the bias's shape [B or 1, H or 1, T_q, T_k] (dS, the gradient of each score after
   *  the softcap, summed over the axes the bias broadcasts over; 0 on a hidden cell); write every element. Else
   *  its data is NULL. */
  attncheck_tensor_out d_bias;
} attncheck_backward_call;

/** The backward call (ABI 2): same status codes and message rules as the forward call. */
typedef int32_t (*attncheck_backward_fn)(const attncheck_backward_call* call, char* message, size_t message_size);

/** The table a plug-in hands over. Its first field is always the ABI version, so any loader can read it. */
typedef struct attncheck_plugin_v1 {
  uint32_t abi_version; /**< ATTNCHECK_PLUGIN_ABI_V1 for this table, first, always */
  uint32_t dtypes;      /**< ATTNCHECK_DTYPE_* bits accepted (at least one) */
  uint32_t alignments;  /**< ATTNCHECK_ALIGN_* bits honoured when T_q != T_k; top-left if 0 */
  uint32_t flags;       /**< ATTNCHECK_CAP_* bits */
  int64_t max_T;        /**< the largest T_q and T_k accepted; 0 means no limit */
  const char* name;        /**< short name, e.g. "my-kernel" */
  const char* description; /**< one line, may be NULL */
  attncheck_forward_fn forward;
} attncheck_plugin_v1;

/** The ABI-2 table: every field of attncheck_plugin_v1 in the same order (so the same offsets), then the
 *  ABI-2 fields. abi_version is ATTNCHECK_PLUGIN_ABI_V2; the entry point returns it cast to
 *  `const attncheck_plugin_v1*`, and the loader casts it back after reading the version. */
typedef struct attncheck_plugin_v2 {
  uint32_t abi_version; /**< ATTNCHECK_PLUGIN_ABI_V2, first, always */
  uint32_t dtypes;      /**< ATTNCHECK_DTYPE_* bits accepted (at least one) */
  uint32_t alignments;  /**< ATTNCHECK_ALIGN_* bits honoured when T_q != T_k; top-left if 0 */
  uint32_t flags;       /**< ATTNCHECK_CAP_* bits, the ABI-2 ones included */
  int64_t max_T;        /**< the largest T_q and T_k accepted; 0 means no limit */
  const char* name;        /**< short name, e.g. "my-kernel" */
  const char* description; /**< one line, may be NULL */
  attncheck_forward_fn forward;
  /* ABI 2 */
  uint32_t empty_rows;            /**< one ATTNCHECK_EMPTY_ROWS_* value */
  uint32_t reserved;              /**< 0 */
  attncheck_backward_fn backward; /**< NULL: forward only (attncheck then checks the forward laws only) */
} attncheck_plugin_v2;

/** ABI 3: a head dimension accepted: D_k = k, D_v = v (0: the same as k). */
typedef struct attncheck_head_dim {
  int64_t k, v;
} attncheck_head_dim;

/** The ABI-3 table: every field of attncheck_plugin_v2 in the same order (so the same offsets), then the
 *  ABI-3 fields. abi_version is ATTNCHECK_PLUGIN_ABI_V3; returned cast to `const attncheck_plugin_v1*`. */
typedef struct attncheck_plugin_v3 {
  uint32_t abi_version; /**< ATTNCHECK_PLUGIN_ABI_V3, first, always */
  uint32_t dtypes;      /**< ATTNCHECK_DTYPE_* bits accepted (at least one) */
  uint32_t alignments;  /**< ATTNCHECK_ALIGN_* bits honoured when T_q != T_k; top-left if 0 */
  uint32_t flags;       /**< ATTNCHECK_CAP_* bits */
  int64_t max_T;        /**< the largest T_q and T_k accepted; 0 means no limit */
  const char* name;        /**< short name, e.g. "my-kernel" */
  const char* description; /**< one line, may be NULL */
  attncheck_forward_fn forward;
  uint32_t empty_rows;            /**< one ATTNCHECK_EMPTY_ROWS_* value, ATTNCHECK_EMPTY_ROWS_ANY included */
  uint32_t reserved;              /**< 0 */
  attncheck_backward_fn backward; /**< NULL: forward only */
  /* ABI 3 */
  uint32_t flags3;        /**< ATTNCHECK_CAP3_* bits */
  uint32_t cross_lengths; /**< ATTNCHECK_CROSS_* bits: the T_q != T_k regimes accepted; 0: both */
  /** The head dimensions accepted: D (and D_v) a multiple of head_dim_multiple (0 or 1: any) and at most
   *  max_head_dim (0: no limit); with head_dims (num_head_dims entries), only those. attncheck draws only such
   *  D; UNSUPPORTED for one of them is a finding. */
  int64_t head_dim_multiple;
  int64_t max_head_dim;
  const attncheck_head_dim* head_dims;
  size_t num_head_dims;
  /** With ATTNCHECK_CAP3_PAGED: the page sizes accepted (num_page_sizes entries, each in [1, 2^20]) and
   *  ATTNCHECK_PAGED_* bits; at least one of each (the loader refuses a table declaring PAGED without). attncheck
   *  draws paged calls only in these. */
  const int64_t* page_sizes;
  size_t num_page_sizes;
  uint32_t page_layouts;
  uint32_t reserved3; /**< 0 */
} attncheck_plugin_v3;

/** The ABI-4 table: every field of attncheck_plugin_v3 in the same order (so the same offsets), then table_size
 *  and the ABI-4 fields. abi_version is ATTNCHECK_PLUGIN_ABI_V4; returned cast to `const attncheck_plugin_v1*`.
 *  Later ABI-4 features append their fields here: a table compiled before them is shorter, says so in
 *  table_size, and the loader takes every field past it as neutral (its feature not declared). */
typedef struct attncheck_plugin_v4 {
  uint32_t abi_version; /**< ATTNCHECK_PLUGIN_ABI_V4, first, always */
  uint32_t dtypes;      /**< ATTNCHECK_DTYPE_* bits accepted (at least one) */
  uint32_t alignments;  /**< ATTNCHECK_ALIGN_* bits honoured when T_q != T_k; top-left if 0 */
  uint32_t flags;       /**< ATTNCHECK_CAP_* bits */
  int64_t max_T;        /**< the largest T_q and T_k accepted; 0 means no limit */
  const char* name;        /**< short name, e.g. "my-kernel" */
  const char* description; /**< one line, may be NULL */
  attncheck_forward_fn forward;
  uint32_t empty_rows;            /**< one ATTNCHECK_EMPTY_ROWS_* value, ATTNCHECK_EMPTY_ROWS_ANY included */
  uint32_t reserved;              /**< 0 */
  attncheck_backward_fn backward; /**< NULL: forward only */
  uint32_t flags3;                /**< ATTNCHECK_CAP3_* bits */
  uint32_t cross_lengths;         /**< ATTNCHECK_CROSS_* bits: the T_q != T_k regimes accepted; 0: both */
  int64_t head_dim_multiple;      /**< as in attncheck_plugin_v3 */
  int64_t max_head_dim;
  const attncheck_head_dim* head_dims;
  size_t num_head_dims;
  const int64_t* page_sizes;
  size_t num_page_sizes;
  uint32_t page_layouts;
  uint32_t reserved3; /**< 0 */
  /* ABI 4 */
  /** sizeof the table as its source was compiled (ATTNCHECK_PLUGIN_V4_SIZE): a multiple of 8, at least
   *  ATTNCHECK_PLUGIN_V4_MIN_SIZE and at most 4096. The loader reads no field past it. */
  uint32_t table_size;
  /** ATTNCHECK_CAP4_* bits. */
  uint32_t flags4;
  /** ATTNCHECK_CAP4B_* bits (read only where table_size reaches them). */
  uint32_t flags4b;
  uint32_t reserved4; /**< 0 */
} attncheck_plugin_v4;

/** The size of the attncheck_plugin_v4 this header describes, and the smallest an ABI-4 table can be (up to and
 *  including flags4). */
#define ATTNCHECK_PLUGIN_V4_SIZE ((uint32_t)sizeof(attncheck_plugin_v4))
#define ATTNCHECK_PLUGIN_V4_MIN_SIZE ((uint32_t)(offsetof(attncheck_plugin_v4, flags4) + sizeof(uint32_t)))
/** The first fields of an ABI-4 table, for a designated initializer: `static const attncheck_plugin_v4 table =
 *  {ATTNCHECK_PLUGIN_V4_HEADER, .dtypes = ..., ...};` sets the version and the size from the one struct type. */
#define ATTNCHECK_PLUGIN_V4_HEADER .abi_version = ATTNCHECK_PLUGIN_ABI_V4, .table_size = ATTNCHECK_PLUGIN_V4_SIZE

/** The one entry point: returns a table with static storage duration (never NULL): an attncheck_plugin_v1,
 *  or an attncheck_plugin_v2, _v3 or _v4 cast to this type (its abi_version says which). */
ATTNCHECK_PLUGIN_EXPORT const attncheck_plugin_v1* attncheck_plugin(void);

#ifdef __cplusplus
}
#endif

#endif /* ATTNCHECK_PLUGIN_H */
