// The backward pass of scaled causal attention: dQ, dK, dV from the upstream gradient dO, at every dtype
// (low precision accumulates in float, as the forward does), the float64 oracle backward, and the derived
// bound a correct kernel's gradients stay within (the derivation is in backward.cpp).
//
//   dO   [B,H,T_q,D]    upstream gradient of the output
//   P    [T_q,T_k]      the forward's weights (softmax of the masked, scaled scores)
//   dV   [T_k,D]  = Pᵀ dO                  (summed over the query heads of a kv head's group)
//   dP   [T_q,T_k] = dO Vᵀ
//   Δ_i           = Σ_j P_ij dP_ij = dO_i · O_i
//   dS   [T_q,T_k] = P ∘ (dP - Δ)          exactly 0 on every key query i cannot see
//   dQ   [T_q,D]  = scale · dS K
//   dK   [T_k,D]  = scale · dSᵀ Q          (summed over the group)
//
// Score modifiers (AttentionOptions): softcap multiplies dS by its derivative 1 - tanh²(s_raw/cap) before dQ and
// dK; ALiBi adds a constant (nothing to differentiate); a sink σ_h is a softmax column with no value, so its dP
// is 0 and its dS is -P_sink·Δ_i: d_sinks[h] = -Σ_{b,i} exp(σ_h - lse_i)·Δ_i. An additive bias is added to the
// modified score, so its gradient is dS itself (before softcap's derivative, which belongs to s_raw), summed over
// the bias's broadcast axes: dBias[b', h', i, j] = Σ over the (b, h) it is read for of dS_bhij, 0 on hidden cells.
#pragma once

#include <optional>

#include "attncheck/attention.hpp"
#include "attncheck/tolerance.hpp"

namespace attncheck {

/// dQ [B,H,T_q,D], dK and dV [B,H_kv,T_k,D] (a shared kv head's gradient sums over its group of query heads).
template <class S> struct AttentionGradients {
  Tensor<S> dq{Shape{}}, dk{Shape{}}, dv{Shape{}};
  /// With sinks: H entries, the gradient of each head's sink logit (summed over batch entries and rows, in the
  /// accumulation type, widened); empty otherwise.
  std::vector<double> dsinks{};
  /// With an additive bias: the gradient of L with respect to it, in the bias's shape [B or 1, H or 1, T_q, T_k]
  /// (dS summed over its broadcast axes in the accumulation type, rounded to S once); empty otherwise.
  std::optional<Tensor<S>> dbias{};
};

/// Above this many weights (B·H·T_q·T_k, 2^22: 32 MiB of doubles) attention_backward streams (below, it
/// materialises each head's [T_q,T_k] weights, bit for bit as it always has). The properties' long-context
/// threshold (kMaterialisedWeights) is the same number.
inline constexpr double kStreamedBackwardWeights = double(1 << 22);

/// The reference backward of attention(q, k, v, opts) for the upstream gradient `d_output` [B,H,T_q,D]: the
/// forward's weights are recomputed by the core's own forward (so forward and backward agree), every product
/// and sum runs in Acc<S>, and each gradient is rounded to S once. A row that sees no key contributes nothing:
/// its dQ is 0 and it adds nothing to any dK or dV. Throws ShapeError/ValueError as attention() does, and when
/// d_output's shape is not q's.
/// Above kStreamedBackwardWeights it streams (backward_streamed.cpp, FlashAttention-2's backward): the forward's
/// m and l per row, then P = exp(s - m)/l recomputed tile by tile, O(T·D) extra memory, (b, h, query block)
/// and (b, kv head, key tile) items on opts.threads threads with bits that do not depend on them.
template <class S>
AttentionGradients<S> attention_backward(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v,
                                         const Tensor<S>& d_output, const AttentionOptions& opts = {});

/// The float64 oracle backward: attention_backward on the inputs widened to double (exact).
template <class S>
AttentionGradients<double> oracle_backward(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v,
                                           const Tensor<S>& d_output, const AttentionOptions& opts = {});

/// The float64 oracle backward streamed (backward_streamed.cpp): the same gradients as oracle_backward within
/// float64 reassociation, at any T in O(T·D) extra memory. V may have its own head dimension D_v (read from v's
/// shape; dO is then [B,H,T_q,D_v], dV [B,H_kv,T_k,D_v]).
template <class S>
AttentionGradients<double> streaming_oracle_backward(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v,
                                                     const Tensor<S>& d_output, const AttentionOptions& opts = {});

/// The float64 oracle's gradients and, per element, the allowed |actual - oracle| of a kernel at `dtype` that
/// accumulates in float (double for float64) and received the same (already rounded) inputs and dO.
struct GradientCheck {
  AttentionGradients<double> oracle;
  AttentionGradients<double> tolerance;  ///< same shapes as the gradients
};

/// The oracle and the derived bound (backward.cpp derives it), `safety` multiplying the first-order bound as
/// in head_tolerance. Above kStreamedBackwardWeights it is streamed_gradient_check's (the same bound streamed).
GradientCheck gradient_check(DType dtype, const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                             const Tensor<double>& d_output, const AttentionOptions& opts, double safety = 2.0);

/// The rows a long context's gradient check is asked for (streamed_gradient_check's `only`): dQ of the query rows
/// `queries`, dK and dV of the keys `keys` (in every batch entry and head). Each comes with the rest of the block
/// of rows or tile of keys the check computes it in; every other row of the oracle and of its bound is NaN. The
/// rows' softmax statistics and Δ are still taken over every row: a key's dK and dV sum over all its queries.
struct GradientRows {
  std::vector<Index> queries, keys;
};

/// gradient_check streamed, for long contexts: the streamed oracle and the same bound (backward.cpp's
/// derivation, the same formula term by term), whose sums of |P|, |dS|, |dO|·|V| are accumulated tile by tile
/// in the oracle's own passes: O(T·D) extra memory at any T. Agrees with gradient_check within float64
/// reassociation (backward_test checks it). With `only`, dQ, dK and dV of those rows alone (GradientRows): the
/// passes over the key tiles and the query blocks, most of the work, shrink to theirs.
GradientCheck streamed_gradient_check(DType dtype, const Tensor<double>& q, const Tensor<double>& k,
                                      const Tensor<double>& v, const Tensor<double>& d_output,
                                      const AttentionOptions& opts, double safety = 2.0,
                                      const GradientRows* only = nullptr);

/// weight_relative_error's ρ_i for every row of every head, [B,H,T_q,1], with each head's modifiers and mask
/// (the same formula on the same row statistics), streamed: no [T_q,T_k] matrix.
Tensor<double> streamed_weight_relative_error(DType dtype, const Tensor<double>& q, const Tensor<double>& k,
                                              const AttentionOptions& opts);

namespace detail {
/// backward.cpp steps 13-14: the gradients of the call on fold_queries' q and fold_keys' k (under folded_options)
/// turned into those of the call with its prologue: dQ = R_qᵀ (dQ'/τ) and dK = R_kᵀ dK', in Acc<S> and rounded to S
/// (dV, dBias and the sinks' are unchanged).
/// q and k are the call's own (unfolded) inputs, which the QK-norm's Jacobian reads (step 15).
template <class S>
void unfold_prologue(AttentionGradients<S>& g, const AttentionOptions& opts, const Tensor<S>& q, const Tensor<S>& k);
/// The same for a check: the oracle's dQ and dK turned back, and their bounds with them (steps 13-15).
void unfold_prologue(GradientCheck& r, const AttentionOptions& opts, const Tensor<double>& q, const Tensor<double>& k,
                     DType dtype, double safety);
/// attention_backward's streamed path (inputs already checked).
template <class S>
AttentionGradients<S> streamed_backward(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v,
                                        const Tensor<S>& d_output, const AttentionOptions& opts);
}  // namespace detail

}  // namespace attncheck
