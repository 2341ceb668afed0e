// The streamed (tiled, online-softmax) causal forward behind attention() without weights and the streaming
// oracle; private to the core.
#pragma once

#include "attncheck/attention.hpp"

namespace attncheck::detail {

/// Causal attention under opts (alignment, key lengths, window) with O(T·D) extra memory. `stats`, when not
/// null, receives [B,H,T_q,4]: per row m, l and, with `bounds`, max|s| and max scale·Σ|q·k| (see RowStats).
template <class S>
Tensor<S> streamed_forward(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const AttentionOptions& opts,
                           double scale, Tensor<double>* stats, bool bounds);

}  // namespace attncheck::detail
