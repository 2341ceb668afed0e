// Scaled causal attention, the reference: the single-head [T,d] path step by step, and batched [B,H,T,D].
//
//   X        [T,C]                       input tokens (projection path only)
//   W_q,W_k,W_v [C,d]                    projections
//   Q,K,V    [T,d]   = X W               (batched: Q [B,H,T_q,D], K,V [B,H,T_k,D])
//   scores   [T_q,T_k] = Q Kᵀ · scale    scale defaults to 1/√D
//   masked   [T_q,T_k]                   causal mask: select (BoolMask) or add (AdditiveMask)
//   weights  [T_q,T_k] = softmax over the key axis (each row sums to 1)
//   output   [T_q,D] = weights V
//
// Low precision (half, bfloat16) is widened to float for every product, softmax and sum, and only the
// output (and returned weights) are rounded back, as production kernels do. A row with no visible key gets
// all-zero weights and a zero output, never NaN.
#pragma once

#include <optional>
#include <vector>

#include "attncheck/dtype.hpp"
#include "attncheck/mask.hpp"
#include "attncheck/tensor.hpp"

namespace attncheck {

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
};

/// The visibility rule of batch entry b under these options (causal alignment, padding, window).
Visibility visibility(const AttentionOptions& opts, Index b, Index T_q, Index T_k);

/// One head's intermediate values, so callers can check every step, not only the output.
template <class S> struct HeadTrace {
  Matrix<Acc<S>> scores;   ///< [T_q,T_k] QKᵀ·scale, before the mask
  Matrix<Acc<S>> weights;  ///< [T_q,T_k] softmax of the masked scores, in the accumulation type
  Matrix<S> output;        ///< [T_q,D] weights·V, rounded to S
  double scale = 0;        ///< the scale actually used
};

/// One head: Q [T_q,D], K,V [T_k,D] under a boolean mask [T_q,T_k].
template <class S>
HeadTrace<S> attend(const Matrix<S>& q, const Matrix<S>& k, const Matrix<S>& v, const BoolMask& mask,
                    std::optional<double> scale = {});
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
/// repeat_interleave, FlashAttention and ggml do. When `weights` is not null it receives [B,H,T_q,T_k].
template <class S>
Tensor<S> attention(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const AttentionOptions& opts = {},
                    Tensor<S>* weights = nullptr);
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
                      Tensor<double>* weights = nullptr);

/// The kv head query head h of H reads when K and V have H_kv heads: h / (H / H_kv).
inline Index kv_head(Index h, Index H, Index H_kv) { return h / (H / H_kv); }

/// The scale a call with these options uses for head dimension D (1/√D unless overridden); throws
/// ValueError naming `who` when the override is not finite and positive.
double resolve_scale(const std::optional<double>& scale, Index D, const char* who);

}  // namespace attncheck
