// Scaled causal attention, the reference: the single-head [T,d] path step by step, and batched [B,H,T,D].
//
//   X        [T,C]                       input tokens (projection path only)
//   W_q,W_k,W_v [C,d]                    projections
//   Q,K,V    [T,d]   = X W               (batched: Q [B,H,T_q,D], K,V [B,H,T_k,D])
//   scores   [T_q,T_k] = Q Kᵀ · scale    scale defaults to 1/√D
//   modified [T_q,T_k]                   score modifiers, in this order (causal path, AttentionOptions):
//                                         softcap s = cap·tanh(s/cap), then ALiBi s += slope_h·(j - p) and
//                                         the additive bias s += bias_bhij
//   masked   [T_q,T_k]                   causal mask: select (BoolMask) or add (AdditiveMask)
//   weights  [T_q,T_k] = softmax over the key axis (each row sums to 1; with a sink logit σ_h, the softmax
//                        has one more column, exp(σ_h - lse), that is dropped: the row sums to 1 - p_sink)
//   output   [T_q,D] = weights V
//   lse      [T_q]   = log(Σ_visible exp(s_ij) + exp(σ_h)), natural log, -inf for a row that sees no key
//                      (and no sink)
//
// Low precision (half, bfloat16) is widened to float for every product, softmax and sum, and only the
// output (and returned weights) are rounded back, as production kernels do. A row with no visible key gets
// all-zero weights and a zero output, never NaN.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "attncheck/dtype.hpp"
#include "attncheck/mask.hpp"
#include "attncheck/quant.hpp"
#include "attncheck/tensor.hpp"

namespace attncheck {

/// An additive score bias [B or 1, H or 1, T_q, T_k] (1 broadcasts): T5's relative position buckets, a learned
/// bias, a FlexAttention score_mod written out as a tensor. Each value is added to its score after the softcap,
/// where ALiBi's is (so slope·(j - p) as a bias is ALiBi), before the mask.
struct ScoreBias {
  Index B = 1, H = 1, T_q = 0, T_k = 0;
  /// [B,H,T_q,T_k] row-major; each finite, or -inf: a bias of -inf hides its cell exactly as a mask does (the
  /// cell is not visible: Visibility::bias), so a row whose every visible cell is -inf sees no key.
  std::vector<double> values{};
  /// Head (b, h)'s T_q x T_k values, row-major (broadcast over B or H where that extent is 1).
  const double* head(Index b, Index h) const {
    return values.data() + std::size_t(((B == 1 ? 0 : b) * H + (H == 1 ? 0 : h)) * T_q * T_k);
  }
  double operator()(Index b, Index h, Index i, Index j) const { return head(b, h)[std::size_t(i * T_k + j)]; }
  /// The same bias written out for every one of B batch entries and H heads: [B, H, T_q, T_k].
  ScoreBias written_out(Index B_out, Index H_out) const {
    ScoreBias w{.B = B_out, .H = H_out, .T_q = T_q, .T_k = T_k, .values = {}};
    w.values.reserve(std::size_t(B_out * H_out * T_q * T_k));
    for (Index b = 0; b < B_out; ++b)
      for (Index h = 0; h < H_out; ++h) w.values.insert(w.values.end(), head(b, h), head(b, h) + T_q * T_k);
    return w;
  }
  bool operator==(const ScoreBias&) const = default;
};

/// A per-query temperature [B or 1, H or 1, T_q] (1 broadcasts): query i of head h in batch entry b has its
/// scaled scores divided by τ_bhi before the softcap, s = scale·(q_i·k_j)/τ_bhi, which is attention on the query
/// q_i/τ_bhi (Llama 4's attention temperature tuning multiplies q by its factor 1/τ). Each value finite and > 0.
struct QueryTemperature {
  Index B = 1, H = 1, T_q = 0;
  std::vector<double> values{};  ///< [B,H,T_q] row-major
  /// Head (b, h)'s T_q values (broadcast over B or H where that extent is 1).
  const double* head(Index b, Index h) const {
    return values.data() + std::size_t(((B == 1 ? 0 : b) * H + (H == 1 ? 0 : h)) * T_q);
  }
  double operator()(Index b, Index h, Index i) const { return head(b, h)[std::size_t(i)]; }
  bool operator==(const QueryTemperature&) const = default;
};

/// Rotary position embeddings applied to q and k inside the call (ABI 4: FlashInfer, vLLM and TensorRT-LLM fuse
/// them into attention). Head dimensions below rotary_dim are rotated in pairs by the angle of their token's own
/// position id; those past it are untouched. Pair m < rotary_dim/2 is (m, m + rotary_dim/2) (half_split: GPT-NeoX,
/// Llama's rotate_half) or (2m, 2m + 1) (interleaved: GPT-J), rotated by θ = (pos/factor)·base^(-2m/rotary_dim):
/// x'_a = x_a·cos θ - x_b·sin θ, x'_b = x_b·cos θ + x_a·sin θ. So q'_i·k'_j depends on the two positions only
/// through their difference. A declared scaling changes each pair's frequency ω_m = base^(-2m/r) (r = rotary_dim):
///  - linear (position interpolation): θ = (pos/factor)·ω_m; factor 1 is no scaling;
///  - ntk (NTK-aware, static): the base grows to base·factor^(r/(r-2)), θ = pos·ω'_m (needs r >= 4);
///  - llama3 (Llama 3.1's rope_scaling): with λ_m = 2π/ω_m, λ_lo = original_max_position/low_freq_factor and
///    λ_hi = original_max_position/high_freq_factor, ω'_m = ω_m where λ_m < λ_hi, ω_m/factor where λ_m > λ_lo, and
///    between them (1 - s)·ω_m/factor + s·ω_m, s = (original_max_position/λ_m - low_freq_factor)/(high_freq_factor -
///    low_freq_factor); θ = pos·ω'_m.
enum class RopeVariant : std::uint8_t { half_split, interleaved };
enum class RopeScaling : std::uint8_t { linear, ntk, llama3 };
struct Rope {
  RopeVariant variant = RopeVariant::half_split;
  Index rotary_dim = 0;  ///< even, in [2, D]
  double base = 10000;   ///< finite and > 0 (10^4 in Llama 2, 5·10^5 in Llama 3)
  double factor = 1;     ///< the scaling's factor: finite and > 0 (>= 1 for ntk and llama3)
  std::vector<Index> q_positions{};  ///< [B, T_q] row-major: each query's position id, in [0, 2^40]
  std::vector<Index> k_positions{};  ///< [B, T_k]: each key's
  RopeScaling scaling = RopeScaling::linear;
  /// llama3 only: 0 < low_freq_factor < high_freq_factor, original_max_position > 0 (Llama 3.1: 1, 4, 8192).
  double low_freq_factor = 1, high_freq_factor = 4, original_max_position = 8192;
  /// The two head dimensions pair m rotates.
  std::pair<Index, Index> pair(Index m) const {
    return variant == RopeVariant::half_split ? std::pair{m, m + rotary_dim / 2} : std::pair{2 * m, 2 * m + 1};
  }
  /// Pair m's frequency under the scaling (linear's is the plain ω_m: its factor divides the position), in double.
  double frequency(Index m) const {
    const double e = -2.0 * double(m) / double(rotary_dim);
    if (scaling == RopeScaling::ntk)
      return std::pow(base * std::pow(factor, double(rotary_dim) / double(rotary_dim - 2)), e);
    const double w = std::pow(base, e);
    if (scaling != RopeScaling::llama3) return w;
    const double wavelen = 2 * 3.14159265358979323846 / w;
    if (wavelen < original_max_position / high_freq_factor) return w;
    if (wavelen > original_max_position / low_freq_factor) return w / factor;
    const double smooth = (original_max_position / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
    return (1 - smooth) * w / factor + smooth * w;
  }
  /// Pair m's angle at position pos, in double.
  double angle(Index pos, Index m) const {
    return scaling == RopeScaling::linear ? double(pos) / factor * frequency(m) : double(pos) * frequency(m);
  }
  /// The largest |angle| of any pair at position pos.
  double max_angle(Index pos) const {
    double most = 0;
    for (Index m = 0; m < rotary_dim / 2; ++m) most = std::max(most, std::abs(angle(pos, m)));
    return most;
  }
  bool operator==(const Rope&) const = default;
};

/// QK-norm (ABI 4: Qwen3, Gemma 3 and OLMo 2 normalise each head's q and k before the rope): each row x of q (and
/// of k) becomes w ⊙ x / r, with r = sqrt(mean_c x_c² + eps) (eps inside the square root, RMSNorm as written) or
/// sqrt(mean_c x_c²) + eps (outside). A side without weights is not normalised.
struct QkNorm {
  std::vector<double> q_weight{};  ///< [D], each finite; empty: q is not normalised
  std::vector<double> k_weight{};  ///< [D]; empty: k is not normalised
  double eps = 1e-6;               ///< finite and > 0
  bool eps_outside = false;        ///< true: r = sqrt(mean x²) + eps
  bool operator==(const QkNorm&) const = default;
};

/// Dropout on the attention weights (ABI 4: training kernels fuse it): after the softmax each weight of head (b, h) is
/// kept, divided by 1 - p, or dropped to 0, by a keep mask drawn from a counter-based RNG under (seed, offset); the
/// output is the dropped weights times V, and the LSE stays the softmax's. The mask is a function of the seed, the
/// offset and the cell's coordinates (b, h, i, j) with the call's H, T_q and T_k: not of the values, and not of the
/// batch entries after b (every kernel whose counter is a cell's index is so: Philox in PyTorch and FlashAttention).
struct Dropout {
  double p = 0;  ///< in [0, 1)
  std::uint64_t seed = 0, offset = 0;
  /// Empty: the core draws its own mask (dropout_keep_mask: Philox4x32-10). Otherwise [B,H,T_q,T_k] row-major, each 0
  /// or 1: the mask a kernel applied (the laws read it off the kernel's weights), which the core then applies.
  std::vector<std::uint8_t> keep{};
  Index H = 0, T_q = 0, T_k = 0;  ///< keep's extents past B (with keep)
  /// Head (b, h)'s T_q x T_k keep mask (keep must be set).
  const std::uint8_t* head(Index b, Index h) const { return keep.data() + std::size_t((b * H + h) * T_q * T_k); }
  /// What a kept weight is multiplied by: 1 / (1 - p).
  double keep_scale() const { return 1 / (1 - p); }
  bool operator==(const Dropout&) const = default;
};

/// The core's own keep mask for a call of B x H heads over T_q x T_k cells, [B,H,T_q,T_k]: cell e = ((b·H + h)·T_q +
/// i)·T_k + j is kept iff its uniform u = r·2^-32 >= p, r lane e mod 4 of Philox4x32-10 (Random123) under the key
/// (seed's low and high words) at the counter (e/4 + offset as a 64-bit number in words 0 and 1, 0, 0).
std::vector<std::uint8_t> dropout_keep_mask(const Dropout& d, Index B, Index H, Index T_q, Index T_k);

/// Options shared by every path.
struct AttentionOptions {
  /// Multiplies QKᵀ; when empty, 1/√D. Must be finite and positive.
  std::optional<double> scale{};
  /// Causal alignment for T_q != T_k; ignored when an explicit mask is passed.
  CausalAlignment alignment = kDefaultAlignment;
  /// Key padding: for batch entry b, keys j >= key_lengths[b] are padding (no weight, their values never reach
  /// an output). Empty: no padding; otherwise one length in [0, T_k] per batch entry. Causal path only.
  std::vector<Index> key_lengths{};
  /// Sliding window (FlashAttention's left window w >= 0): a query at aligned position p sees only keys
  /// p - w <= j <= p. Empty: no window. Causal path only.
  std::optional<Index> window{};
  /// Score modifiers (ABI 3), applied to each scaled score s = scale·q·k in the order softcap, ALiBi, mask,
  /// sink (attncheck/plugin.h documents the same order):
  /// Logit softcapping (Gemma 2): s = softcap·tanh(s/softcap). Must be finite and positive; empty: none.
  std::optional<double> softcap{};
  /// ALiBi: one slope per query head, s += slope_h·(j - p) for key j and the query's aligned position p.
  /// Empty: none; otherwise H finite entries.
  std::vector<double> alibi_slopes{};
  /// Attention sinks (gpt-oss): one logit per query head, an extra column in every row's softmax that has no
  /// value and is dropped from the weights and the output; included in the LSE. Empty: none; otherwise H
  /// entries, each finite or -inf (a sink of -inf is plain attention).
  std::vector<double> sinks{};
  /// An additive bias on the scores, after the softcap, where ALiBi is added. Empty: none. Causal path only.
  std::optional<ScoreBias> bias{};
  /// A per-query temperature: each query's scaled scores divided by its τ, before the softcap. Empty: none.
  /// Causal path only. Every entry point folds it into q (fold_temperature) before anything else reads q.
  std::optional<QueryTemperature> temperature{};
  /// Set by folded_options, never by a caller: q already holds q/τ. Only the bounds read it, to add the
  /// roundings of the folding a kernel may do in its own way (tolerance.cpp step 8, backward.cpp step 13).
  bool temperature_folded = false;
  /// Rotary position embeddings of q and k (before the scale, the temperature and the softcap). Empty: none.
  /// Causal path only. Every entry point folds them into q and k (fold_queries, fold_keys) first.
  std::optional<Rope> rope{};
  /// Set by folded_options, never by a caller: the rope q and k already went through. Only the bounds read it
  /// (tolerance.cpp step 9, backward.cpp step 14).
  std::optional<Rope> rope_folded{};
  /// QK-norm of q and k (first of all: before the rope). Empty: none. Causal path only; folded as the rope is.
  std::optional<QkNorm> qk_norm{};
  /// Set by folded_options: q and k already went through this QK-norm (tolerance.cpp step 10, backward.cpp step 15).
  std::optional<QkNorm> qk_norm_folded{};
  /// Dropout on the weights, after the softmax (the LSE is the softmax's). Empty: none. Causal path only; every path
  /// materialises a call with dropout (weights [T_q,T_k] per head), whatever its size.
  std::optional<Dropout> dropout{};
  /// K and V arrive quantised (attncheck/quant.hpp): k and v hold their dequantised values, exact doubles a kernel
  /// rounds into its own type, so the bounds widen (tolerance.cpp step 12). Empty: none. Forward calls only.
  std::optional<QuantizedKV> quant{};
  /// false: no causal rule (bidirectional); padding and the window still apply. Causal path only.
  bool causal = true;
  /// Masks beyond causal (Visibility says how each cuts the keys; causal path only):
  /// keys j < prefix_length are visible to every query despite the causal rule (prefix-LM). 0: none.
  Index prefix_length = 0;
  /// A right window wr >= 0: a query at aligned position p sees keys j <= p + wr only. Empty: none.
  std::optional<Index> window_right{};
  /// Chunked local attention: a query sees only keys of its own chunk of chunk_size positions. 0: none.
  Index chunk_size = 0;
  /// Packed documents: for each batch entry, the bounds where one document ends and the next begins
  /// (non-decreasing, >= 0; a repeated bound is an empty document); a query sees only keys of its own
  /// document. Empty: one document per entry; otherwise B lists.
  std::vector<std::vector<Index>> doc_bounds{};
  /// The queries' own document bounds (FlashAttention varlen's cu_seqlens_q beside cu_seqlens_k): for each batch
  /// entry as many query indices as doc_bounds has key positions (non-decreasing, >= 0); each document's queries
  /// are then aligned on its own lengths (Visibility says how). Empty: a query's document follows from its
  /// aligned position. Only with doc_bounds.
  std::vector<std::vector<Index>> q_doc_bounds{};
  /// A block mask (FlexAttention's BlockMask) and a dense boolean mask, each [B or 1, H or 1] over [T_q,T_k]
  /// (1 broadcasts): a key is visible only where each given allows it. Empty: none.
  std::optional<BlockMask> block_mask{};
  std::optional<DenseMask> dense_mask{};
  /// Selected keys (IndexList): each query sees only the keys its row lists, intersected with every other rule.
  /// Empty: none. Causal path only.
  std::optional<IndexList> index_list{};
  /// A tree of draft tokens (TokenTree): each node sees the prefix and its ancestors, intersected with every other
  /// rule. Empty: none. Causal path only; not with ALiBi, windows, chunks or documents (a node's position is its depth
  /// in the tree, which those families would read: not modelled, so refused).
  std::optional<TokenTree> tree{};
  /// Threads for the streamed forward (attention() without weights): 0 takes every core. The result's bits
  /// do not depend on it: each (batch, head, query block) is computed whole by one thread.
  int threads = 0;
};

/// opts with its dropout's keep mask drawn (dropout_keep_mask) for a call of B x H heads over T_q x T_k when it has a
/// dropout without one; opts itself otherwise. head_modifiers reads the mask: every entry point draws it first.
AttentionOptions with_dropout_mask(const AttentionOptions& opts, Index B, Index H, Index T_q, Index T_k);

/// Throws ShapeError or ValueError, naming `who`, what was expected and what came, when opts do not fit a call
/// with B batch entries, H query heads, T_q queries and T_k keys (key lengths, windows, prefix, chunks, documents,
/// block and dense masks, modifiers). T_q < 0: not known (the block and dense masks' T_q is not checked).
void check_options(const char* who, const AttentionOptions& opts, Index B, Index H, Index T_k, Index T_q = -1);

/// The one check of a whole call, whoever reads it (the core's entry points, the exec wire, a JSON report, the C
/// loader): q [B,H,T_q,D], k [B,H_kv,T_k,D] with H_kv dividing H, v [B,H_kv,T_k,D_v]; a scale, when given,
/// finite and positive; then check_options. Throws ShapeError or ValueError naming `who`.
void check_call(const char* who, const Shape& q, const Shape& k, const Shape& v, const AttentionOptions& opts);

/// The visibility rule of batch entry b, query head h, under these options (causal alignment, padding, windows,
/// documents, block and dense masks: only those two depend on the head).
Visibility visibility(const AttentionOptions& opts, Index b, Index T_q, Index T_k, Index h = 0);
/// Whether the visibility differs between the heads of a batch entry (a block or dense mask with H > 1).
bool visibility_per_head(const AttentionOptions& opts);
/// Whether the bias holds a -inf (which hides its cell).
bool bias_hides_cells(const ScoreBias& bias);

/// q [B,H,T_q,D] with each query row divided by its temperature under opts (each element computed in double and
/// rounded to S once, as a kernel that scales q in the dtype does); q itself without a temperature. opts must
/// have been checked against q (check_options).
template <class S> Tensor<S> fold_temperature(const Tensor<S>& q, const AttentionOptions& opts);
/// x [B,H,T,D] (q or k) with each token's head dimensions below rotary_dim rotated by its position (positions[b·T +
/// t]), each element computed in double and rounded to S once. Throws ShapeError naming `who` when rotary_dim does
/// not fit D or the positions do not fit [B, T].
template <class S>
Tensor<S> fold_rope(const Tensor<S>& x, const Rope& rope, const std::vector<Index>& positions, const char* who);
/// x [B,H,T,D] with each row normalised by QK-norm with `weight` ([D]), in double and rounded to S once. Throws
/// ShapeError naming `who` when the weights do not fit D.
template <class S>
Tensor<S> fold_qk_norm(const Tensor<S>& x, const QkNorm& norm, const std::vector<double>& weight, const char* who);
/// What the call does to q before the scores: QK-norm, the rope, then the temperature (q itself without any).
template <class S> Tensor<S> fold_queries(const Tensor<S>& q, const AttentionOptions& opts, const char* who);
/// What the call does to k: QK-norm, then the rope (k itself without either).
template <class S> Tensor<S> fold_keys(const Tensor<S>& k, const AttentionOptions& opts, const char* who);
/// Whether opts has a prologue the entry points fold into q and k (a temperature, a rope).
inline bool has_prologue(const AttentionOptions& opts) { return opts.temperature || opts.rope || opts.qk_norm; }
/// opts without its temperature and rope, marked as folded (temperature_folded, rope_folded): the options of the call
/// on fold_queries' q and fold_keys' k.
AttentionOptions folded_options(const AttentionOptions& opts);

/// One head's score modifiers, as attend() takes them: query i sits at aligned position p = position(i).
struct HeadModifiers {
  std::optional<double> softcap{};
  double alibi_slope = 0;        ///< 0: no bias
  /// The head's additive bias, T_q x T_k row-major with rows of bias_cols (points into AttentionOptions::bias);
  /// null: none.
  const double* bias = nullptr;
  Index bias_cols = 0;
  std::optional<double> sink{};  ///< the sink logit (may be -inf); empty: none
  /// q holds a folded temperature (AttentionOptions::temperature_folded): no score changes, the bounds widen.
  bool tempered = false;
  /// q and k went through this rope (AttentionOptions::rope_folded), at batch entry rope_batch: the bounds widen by
  /// its rotation's rounding (tolerance.cpp step 9). Null: none.
  const Rope* rope = nullptr;
  Index rope_batch = 0;
  /// q and k went through this QK-norm (AttentionOptions::qk_norm_folded): the bounds widen by its rounding
  /// (tolerance.cpp step 10). Null: none.
  const QkNorm* qk_norm = nullptr;
  /// Dropout: the head's T_q x T_k keep mask (points into AttentionOptions::dropout's, which must hold one: the core
  /// draws it first) and what a kept weight is multiplied by, 1/(1 - p). Null: none.
  const std::uint8_t* keep = nullptr;
  double keep_scale = 1;
  /// The call's K and V are dequantised values (AttentionOptions::quant), which a kernel rounds into its type: the
  /// bounds widen by that rounding (tolerance.cpp step 12).
  bool dequantised_kv = false;
  /// The largest |minimum| of K's and V's ggml blocks (Q4_1, Q5_1; 0 otherwise): a kernel may form d·n and m apart
  /// (ggml's dot takes d·Σq·n + m·Σq), each rounding on its own (tolerance.cpp step 12).
  double k_min_magnitude = 0, v_min_magnitude = 0;
  /// K is in ggml's blocks and the kernel rounds each row of q to ggml's Q8_0 (Q8_1) blocks for its dot with it
  /// (QuantizedKV::q_dot_ggml_q8): the bounds widen by that rounding (tolerance.cpp step 12b).
  bool q_dot_ggml_q8 = false;
  /// q too is dequantised values (QuantizedKV::q): the scores' bound widens by its dequantisation (step 12).
  bool dequantised_q = false;
  /// The kernel casts P to FP8 e4m3 for P·V (QuantizedKV::p_fp8): the output's bound widens (step 12c).
  bool p_fp8 = false;
  /// An index list whose repeated entries count (IndexList::counted), this head's rows (batch entry list_b, query
  /// head list_h): a key listed n > 1 times has ln n added to its score, so it weighs n·e^s (tolerance.cpp step 7).
  /// Null: none, or a list whose rows are sets.
  const IndexList* counted = nullptr;
  Index list_b = 0, list_h = 0;
  /// ln n for the key j of query i under `counted` (0 where it is listed once).
  double log_count(Index i, Index j) const {
    const Index n = counted->count(list_b, list_h, i, j);
    return n > 1 ? std::log(double(n)) : 0.0;
  }
  /// Where the queries sit (alignment, and documents with query bounds of their own): only position() is read.
  Visibility rows{};
  Index position(Index i) const { return rows.position(i); }
  /// ALiBi's distance j - p, on the places of a tree's nodes (Visibility::key_place, place) where there is one.
  Index alibi_distance(Index i, Index j) const {
    return rows.depths ? rows.key_place(j) - rows.place(i) : j - rows.position(i);
  }
  /// Whether a score is changed (softcap, ALiBi, a bias or counted duplicates); a sink changes the softmax, not a score.
  bool modifies_scores() const { return softcap || alibi_slope != 0 || bias || counted; }
  bool any() const { return modifies_scores() || sink; }
};
/// The modifiers query head h of batch entry b gets under these options (T_q queries over T_k keys); points into
/// opts. A temperature or rope must have been folded into q and k first (folded_options): std::logic_error
/// otherwise.
HeadModifiers head_modifiers(const AttentionOptions& opts, Index b, Index h, Index T_q, Index T_k);
/// The modified score: softcap, then ALiBi, then the bias and a counted key's ln n, as every path computes it (in the
/// accumulation type A; a bias value is one of the call's dtype, exact in A; ln n rounds, tolerance.cpp step 7).
/// The streamed paths modify a whole tile at once, the same steps with tanh on packets (attention/src/
/// tile_modifiers.hpp); both tanhs are within tolerance.cpp's share.
template <class A> A modified_score(A s, const HeadModifiers& m, Index i, Index j) {
  using std::tanh;
  if (m.softcap) {
    const A cap = static_cast<A>(*m.softcap);
    s = cap * tanh(s / cap);
  }
  if (m.alibi_slope != 0) s += static_cast<A>(m.alibi_slope) * static_cast<A>(m.alibi_distance(i, j));
  if (m.bias) s += static_cast<A>(m.bias[i * m.bias_cols + j]);
  if (m.counted) s += static_cast<A>(m.log_count(i, j));
  return s;
}

/// One head's intermediate values, so callers can check every step, not only the output.
template <class S> struct HeadTrace {
  Matrix<Acc<S>> scores;   ///< [T_q,T_k] QKᵀ·scale, before the mask
  Matrix<Acc<S>> weights;  ///< [T_q,T_k] softmax of the masked scores, in the accumulation type
  /// With dropout (HeadModifiers::keep): [T_q,T_k] the weights after it, kept ones times 1/(1 - p), dropped ones 0;
  /// empty otherwise.
  Matrix<Acc<S>> dropped;
  Matrix<S> output;        ///< [T_q,D] weights·V (the dropped weights with dropout), rounded to S
  /// The weights a kernel returns: after dropout where there is one.
  const Matrix<Acc<S>>& returned_weights() const { return dropped.size() > 0 ? dropped : weights; }
  Matrix<Acc<S>> lse;      ///< [T_q,1] log Σ exp over the visible modified scores and the sink; -inf: none
  double scale = 0;        ///< the scale actually used
};

/// One head: Q [T_q,D], K,V [T_k,D] under a boolean mask [T_q,T_k].
template <class S>
HeadTrace<S> attend(const Matrix<S>& q, const Matrix<S>& k, const Matrix<S>& v, const BoolMask& mask,
                    std::optional<double> scale = {});
/// One head under a boolean mask with score modifiers (`scale` already resolved).
template <class S>
HeadTrace<S> attend(const Matrix<S>& q, const Matrix<S>& k, const Matrix<S>& v, const BoolMask& mask, double scale,
                    const HeadModifiers& mods);
/// One head under an additive mask.
template <class S>
HeadTrace<S> attend(const Matrix<S>& q, const Matrix<S>& k, const Matrix<S>& v, const AdditiveMask& mask,
                    std::optional<double> scale = {});

/// The single-head projection path's intermediates (the source card's six steps).
template <class S> struct ProjectionTrace {
  Matrix<S> Q, K, V;  ///< [T,d] each
  HeadTrace<S> head;  ///< scores, weights, output
};

/// The source card's path: X [T,C], W_q/W_k/W_v [C,d] → Q,K,V [T,d] → causal attention with a BoolMask.
template <class S>
ProjectionTrace<S> single_head_attention(const Matrix<S>& x, const Matrix<S>& w_q, const Matrix<S>& w_k,
                                         const Matrix<S>& w_v, const AttentionOptions& opts = {});

/// Batched causal attention: Q [B,H,T_q,D], K,V [B,H_kv,T_k,D] → output [B,H,T_q,D]. H_kv divides H
/// (grouped-query attention; H_kv = 1 is multi-query): query head h reads kv head h / (H / H_kv), as
/// repeat_interleave, FlashAttention and ggml do. When `weights` is not null it receives [B,H,T_q,T_k] and the
/// path is the materialising one, bit for bit the single-head path's; without, the forward is streamed: query
/// blocks against key tiles with an online softmax, hidden tiles skipped, heads and blocks on threads, O(T·D)
/// extra memory (identical bits whatever opts.threads). When `lse` is not null it receives [B,H,T_q,1], each
/// row's log-sum-exp in the accumulation type, widened.
template <class S>
Tensor<S> attention(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const AttentionOptions& opts = {},
                    Tensor<S>* weights = nullptr, Tensor<double>* lse = nullptr);
/// Batched attention under an explicit boolean mask [T_q,T_k], broadcast over batch and heads.
template <class S>
Tensor<S> attention(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const BoolMask& mask,
                    const AttentionOptions& opts = {}, Tensor<S>* weights = nullptr);
/// Batched attention under an explicit additive mask [T_q,T_k], broadcast over batch and heads.
template <class S>
Tensor<S> attention(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const AdditiveMask& mask,
                    const AttentionOptions& opts = {}, Tensor<S>* weights = nullptr);

/// The float64 oracle: the same computation on the inputs widened to double (exact), so every other
/// dtype can be compared against it.
template <class S>
Tensor<double> oracle(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const AttentionOptions& opts = {},
                      Tensor<double>* weights = nullptr, Tensor<double>* lse = nullptr);

/// Per-row statistics of the streamed float64 oracle, from which any weight of a row follows without a
/// [T_q,T_k] matrix: w_ij = exp(s_ij - m_i) / l_i for a visible key j (s the modified score), 0 otherwise. A
/// sink counts as one more term in m and l (and in max|s|), so the LSE is m + log l.
struct RowStats {
  Tensor<double> values{Shape{}};  ///< [B,H,T_q,4]: m, l, max|s|, max scale·Σ_c|q_c k_c| (over visible keys)
  double lse(Index b, Index h, Index i) const;                                      ///< m + log l; -inf: none
  double max(Index b, Index h, Index i) const { return values(b, h, i, 0); }        ///< m_i (-inf: no key)
  double sum(Index b, Index h, Index i) const { return values(b, h, i, 1); }        ///< l_i (0: no key)
  double abs_score(Index b, Index h, Index i) const { return values(b, h, i, 2); }  ///< max_j |s_ij|
  double abs_dot(Index b, Index h, Index i) const { return values(b, h, i, 3); }    ///< max_j scale·Σ|q k|
};

/// The float64 oracle streamed like the core's forward (tiled, online softmax): O(T·D) memory at any T, so
/// long contexts can be checked. `stats`, when not null, receives each row's RowStats.
template <class S>
Tensor<double> streaming_oracle(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v,
                                const AttentionOptions& opts = {}, RowStats* stats = nullptr);

/// The oracle's weight (b, h, i, j) from its streamed row statistics and the float64 inputs (O(D)).
double streamed_weight(const Tensor<double>& q, const Tensor<double>& k, const AttentionOptions& opts,
                       const RowStats& stats, Index b, Index h, Index i, Index j);

/// The kv head query head h of H reads when K and V have H_kv heads: h / (H / H_kv).
inline Index kv_head(Index h, Index H, Index H_kv) { return h / (H / H_kv); }

/// K or V [B,H_kv,T,D] repeated to [B,H,T,D] by kv_head (PyTorch's repeat_interleave over heads): what a
/// kernel without grouped queries is called with.
template <class S> Tensor<S> repeat_kv_heads(const Tensor<S>& kv, Index H) {
  const Shape& s = kv.shape();
  Tensor<S> r({s.B, H, s.T, s.D});
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < H; ++h) r.head(b, h) = kv.head(b, kv_head(h, H, s.H));
  return r;
}

/// The scale a call with these options uses for head dimension D (1/√D unless overridden); throws
/// ValueError naming `who` when the override is not finite and positive.
double resolve_scale(const std::optional<double>& scale, Index D, const char* who);

}  // namespace attncheck
