// The plain pieces a from-scratch attention is built from (the [B,H] loop, scores, a stable masked softmax),
// shared by the zoo so that each mutant's body shows only the code its author wrote, bug included.
#pragma once

#include <cmath>
#include <limits>

#include "attncheck/implementation.hpp"

namespace attncheck::zoo {

/// What one head's code knows about the call.
struct HeadCtx {
  Index b = 0, h = 0;
  Index B = 1, H = 1, T_q = 1, T_k = 1, D = 1;
  Index H_kv = 1;               ///< kv heads (H_kv < H only for kernels that declare grouped-query attention)
  DType dtype = DType::f32;     ///< the inputs' dtype (the head itself computes in Acc<S>)
  std::optional<double> scale;  ///< the problem's scale, as given (empty: the kernel's default)
  CausalAlignment alignment = kDefaultAlignment;
  Index key_length = -1;          ///< this batch entry's key length; negative: no padding
  std::optional<Index> window{};  ///< the sliding window; empty: none
  /// Masks beyond causal, as the problem gives them; only kernels that declare them see any.
  bool causal = true;                        ///< false: no causal rule
  Index prefix = 0;                          ///< a bidirectional prefix; 0: none
  std::optional<Index> window_right{};       ///< a right window; empty: none
  Index chunk = 0;                           ///< chunked local attention; 0: none
  const std::vector<Index>* doc_bounds = nullptr;  ///< this batch entry's document bounds; null: none
  /// This batch entry's query document bounds (documents with query lengths of their own); null: none (positions are aligned globally).
  const std::vector<Index>* q_doc_bounds = nullptr;
  const BlockMask* block_mask = nullptr;           ///< the problem's block mask (read at b, h); null: none
  const DenseMask* dense_mask = nullptr;           ///< the problem's dense mask (read at b, h); null: none
  /// This head's score modifiers (ABI 3), as the problem gives them; only kernels that declare them see any.
  std::optional<double> softcap{};  ///< s = cap·tanh(s/cap); empty: none
  double alibi_slope = 0;           ///< s += slope·(j - p); 0: none
  std::optional<double> sink{};     ///< the head's sink logit (may be -inf); empty: none
  Index position_offset = 0;        ///< p = i + position_offset: 0 top-left, T_k - T_q bottom-right
  const ScoreBias* bias = nullptr;  ///< the problem's additive bias (ABI 4), read at (b, h); null: none
  const QueryTemperature* temperature = nullptr;  ///< the problem's temperature (ABI 4), read at (b, h); null: none

  /// 1/√D unless the problem overrides it: the correct default.
  double resolved_scale() const { return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(D)); }
  /// The correct rule: causal alignment, key padding, the windows and the other mask families.
  Visibility visibility() const {
    return Visibility{.T_q = T_q,
                      .T_k = T_k,
                      .alignment = alignment,
                      .key_length = key_length,
                      .window = window,
                      .causal = causal,
                      .prefix = prefix,
                      .window_right = window_right,
                      .chunk = chunk,
                      .doc_bounds = doc_bounds,
                      .q_doc_bounds = q_doc_bounds,
                      .block = block_mask,
                      .dense = dense_mask,
                      .batch = b,
                      .head = h};
  }
  /// Query i may see key j.
  bool visible(Index i, Index j) const { return visibility().visible(i, j); }
  /// The additive bias of cell (i, j) of this head: 0 without one.
  double bias_at(Index i, Index j) const { return bias ? (*bias)(b, h, i, j) : 0.0; }
  /// Query i's temperature: 1 without one.
  double temperature_at(Index i) const { return temperature ? (*temperature)(b, h, i) : 1.0; }
  /// Query i's aligned position p (what ALiBi measures from).
  Index position(Index i) const { return q_doc_bounds ? visibility().position(i) : i + position_offset; }
};

/// c.visible(i, j) for a loop over the cells row by row: the rule made once and each row's run once (c.visible
/// makes both again for every cell). Holds a copy of the rule: make one where the context is final.
class VisibleCells {
 public:
  explicit VisibleCells(const HeadCtx& c) : v_(c.visibility()) {}
  bool operator()(Index i, Index j) {
    if (i != row_) {
      run_ = v_.run(i);
      row_ = i;
    }
    return run_.contains(j) && v_.cells_allow(i, j);
  }

 private:
  Visibility v_;
  Index row_ = -1;
  KeyRange run_{};
};

/// One head's result in the accumulation type A.
template <class A>
struct HeadOut {
  Matrix<A> weights;  ///< [T_q,T_k]
  Matrix<A> output;   ///< [T_q,D_v]
  Matrix<A> lse{};    ///< [T_q,1] each row's log-sum-exp, for kernels that return it; empty: none computed
};

/// scores [T_q,T_k] = Q [T_q,D] · Kᵀ [D,T_k] · scale.
template <class A>
Matrix<A> scores(const Matrix<A>& Q, const Matrix<A>& K, double scale) {
  Matrix<A> s = Q * K.transpose();
  s *= static_cast<A>(scale);
  return s;
}

/// Softmax along each row, -inf entries masked: subtracts the row max, a row with nothing visible is all 0.
template <class A>
Matrix<A> softmax_rows(const Matrix<A>& z) {
  const A neg_inf = -std::numeric_limits<A>::infinity();
  Matrix<A> w = Matrix<A>::Zero(z.rows(), z.cols());
  for (Index i = 0; i < z.rows(); ++i) {
    A m = neg_inf;
    for (Index j = 0; j < z.cols(); ++j) m = std::max(m, z(i, j));
    if (m == neg_inf) continue;  // nothing visible: a zero row, not 0/0
    A sum = 0;
    for (Index j = 0; j < z.cols(); ++j) sum += (w(i, j) = std::exp(z(i, j) - m));
    for (Index j = 0; j < z.cols(); ++j) w(i, j) /= sum;
  }
  return w;
}

/// Row i of the output from the keys row i may see: Σ_{j visible} W(i,j)·V(j,:). Never reads a future value,
/// so a NaN there cannot reach row i through 0·NaN.
template <class A>
Matrix<A> mix_visible(const Matrix<A>& W, const Matrix<A>& V, const HeadCtx& c) {
  Matrix<A> out = Matrix<A>::Zero(W.rows(), V.cols());
  VisibleCells visible(c);
  for (Index i = 0; i < W.rows(); ++i)
    for (Index j = 0; j < W.cols(); ++j)
      if (visible(i, j)) out.row(i) += W(i, j) * V.row(j);
  return out;
}

/// Scores with every future entry replaced by -inf (a select: the future score is never read).
template <class A>
Matrix<A> causal_select(const Matrix<A>& s, const HeadCtx& c) {
  Matrix<A> z = s;
  VisibleCells visible(c);
  for (Index i = 0; i < z.rows(); ++i)
    for (Index j = 0; j < z.cols(); ++j)
      if (!visible(i, j)) z(i, j) = -std::numeric_limits<A>::infinity();
  return z;
}

/// A whole head under the author's own visibility rule `vis(i, j)`: future scores selected to -inf, softmax
/// over keys, and values mixed over the keys the rule lets through. A wrong rule is the only possible bug.
template <class A, class Vis>
HeadOut<A> attend_where(const Matrix<A>& s, const Matrix<A>& V, Vis vis) {
  Matrix<A> z = s;
  // The rule asked once a cell (a rule may build a whole visibility for each answer).
  Eigen::Array<bool, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> seen(z.rows(), z.cols());
  for (Index i = 0; i < z.rows(); ++i)
    for (Index j = 0; j < z.cols(); ++j)
      if (!(seen(i, j) = vis(i, j))) z(i, j) = -std::numeric_limits<A>::infinity();
  HeadOut<A> r;
  r.weights = softmax_rows(z);
  r.output = Matrix<A>::Zero(z.rows(), V.cols());
  for (Index i = 0; i < z.rows(); ++i)
    for (Index j = 0; j < z.cols(); ++j)
      if (seen(i, j)) r.output.row(i) += r.weights(i, j) * V.row(j);
  return r;
}

/// Which kv head a kernel reads for query head h of H when K and V have H_kv heads: the correct
/// h / (H / H_kv), unless a mutant's author computed it otherwise.
struct GroupedKv {
  Index operator()(Index h, Index H, Index H_kv) const { return kv_head(h, H, H_kv); }
};

/// Kv head `kv` of batch entry b as a kernel indexing the flat [B·H_kv] buffer reads it: an index past H_kv
/// lands in the next batch entry's heads, and past the end of the buffer the zoo reads zeros (its stand-in for
/// whatever memory follows).
template <class A, class S>
Matrix<A> kv_head_as_read(const Tensor<S>& t, Index b, Index kv) {
  const Shape& s = t.shape();
  const Index flat = b * s.H + kv;
  if (flat >= s.B * s.H) return Matrix<A>::Zero(s.T, s.D);
  return t.head(flat / s.H, flat % s.H).template cast<A>();
}

/// The [B,H] loop: widens each head of q and the kv head it reads (`kv_of`) of k and v to the accumulation
/// type A, runs `head(Q, K, V, ctx) -> HeadOut<A>` and rounds the output (and weights, when asked) back to S;
/// `lse`, when not null and the head returns one, receives [B,H,T_q,1] (left as it was otherwise, so a kernel
/// that computes none answers with the wrong size).
template <class A, class S, class HeadFn, class KvOf = GroupedKv>
Tensor<S> per_head_in(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const Problem& p, Tensor<S>* w,
                      HeadFn&& head, KvOf kv_of = {}, Tensor<double>* lse = nullptr) {
  const Shape& s = q.shape();
  HeadCtx c{.B = s.B,
            .H = s.H,
            .T_q = s.T,
            .T_k = k.shape().T,
            .D = s.D,
            .H_kv = k.shape().H,
            .dtype = p.dtype,
            .scale = p.scale,
            .alignment = p.alignment};
  Tensor<S> out(Shape{s.B, s.H, s.T, v.shape().D});  // [B,H,T_q,D_v]
  if (w) *w = Tensor<S>(Shape{s.B, s.H, s.T, c.T_k});
  c.softcap = p.softcap;
  c.causal = p.causal;
  c.prefix = p.prefix_length;
  c.window_right = p.window_right;
  c.chunk = p.chunk_size;
  c.block_mask = p.block_mask ? &*p.block_mask : nullptr;
  c.dense_mask = p.dense_mask ? &*p.dense_mask : nullptr;
  c.bias = p.bias ? &*p.bias : nullptr;
  c.temperature = p.temperature ? &*p.temperature : nullptr;
  c.position_offset = p.alignment == CausalAlignment::BottomRight ? c.T_k - c.T_q : 0;
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) {
      c.b = b;
      c.h = h;
      c.key_length = p.key_lengths.empty() ? -1 : p.key_lengths[std::size_t(b)];
      c.window = p.window;
      c.doc_bounds = p.doc_bounds.empty() ? nullptr : &p.doc_bounds[std::size_t(b)];
      c.q_doc_bounds = p.q_doc_bounds.empty() ? nullptr : &p.q_doc_bounds[std::size_t(b)];
      c.alibi_slope = p.alibi_slopes.empty() ? 0.0 : p.alibi_slopes[std::size_t(h)];
      c.sink = p.sinks.empty() ? std::nullopt : std::optional<double>(p.sinks[std::size_t(h)]);
      const Index g = kv_of(h, c.H, c.H_kv);
      const Matrix<A> Q = q.head(b, h).template cast<A>(), K = kv_head_as_read<A>(k, b, g),
                      V = kv_head_as_read<A>(v, b, g);
      const HeadOut<A> r = head(Q, K, V, c);
      out.head(b, h) = r.output.template cast<S>();
      if (w) w->head(b, h) = r.weights.template cast<S>();
      if (lse && r.lse.size() > 0) {
        if (lse->shape() != Shape{s.B, s.H, s.T, 1}) *lse = Tensor<double>(Shape{s.B, s.H, s.T, 1});
        lse->head(b, h) = r.lse.template cast<double>();
      }
    }
  return out;
}

/// per_head_in at the kernels' usual accumulation type, Acc<S> (float for low precision).
template <class S, class HeadFn, class KvOf = GroupedKv>
Tensor<S> per_head(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const Problem& p, Tensor<S>* w,
                   HeadFn&& head, KvOf kv_of = {}, Tensor<double>* lse = nullptr) {
  return per_head_in<Acc<S>>(q, k, v, p, w, std::forward<HeadFn>(head), kv_of, lse);
}

/// A modified score as the core orders the modifiers: `s` already scaled, then softcap cap·tanh(s/cap), then
/// ALiBi slope·(j - p) for query i at aligned position p.
template <class A>
A modified_score(A s, const HeadCtx& c, Index i, Index j) {
  if (c.softcap) s = A(*c.softcap) * std::tanh(s / A(*c.softcap));
  if (c.alibi_slope != 0) s += A(c.alibi_slope) * A(j - c.position(i));
  return s;
}

/// scores(Q, K, scale) with every modifier applied (modified_score), masked keys included (masking comes later).
template <class A>
Matrix<A> modified_scores(const Matrix<A>& Q, const Matrix<A>& K, const HeadCtx& c) {
  Matrix<A> s = scores(Q, K, c.resolved_scale());
  for (Index i = 0; i < s.rows(); ++i)
    for (Index j = 0; j < s.cols(); ++j) s(i, j) = modified_score(s(i, j), c, i, j);
  return s;
}

/// One row's softmax statistics over its -inf-masked scores `z` and an optional sink logit: the max m (over
/// the sink too), the sum l = Σ exp(z_j - m) + exp(sink - m), lse = m + log l (-inf when there is no term).
template <class A>
struct RowSoftmax {
  A m = -std::numeric_limits<A>::infinity(), l = 0;
  A lse() const { return l > 0 ? m + std::log(l) : -std::numeric_limits<A>::infinity(); }
};
template <class A, class Row>
RowSoftmax<A> row_softmax(const Row& z, std::optional<double> sink) {
  RowSoftmax<A> r;
  const A sk = sink ? A(*sink) : -std::numeric_limits<A>::infinity();
  r.m = sk;
  for (Index j = 0; j < z.size(); ++j) r.m = std::max(r.m, z(j));
  if (r.m == -std::numeric_limits<A>::infinity()) return r;
  for (Index j = 0; j < z.size(); ++j) r.l += std::exp(z(j) - r.m);
  if (sink) r.l += std::exp(sk - r.m);
  return r;
}

/// The correct modified head: modified scores, causal select, softmax with the sink as an extra column
/// (dropped: visible weights sum to 1 - p_sink), values mixed over visible keys, and each row's LSE.
/// The softmax of already masked scores z [T_q,T_k] with the head's sink as an extra column (dropped), values
/// mixed over visible keys, and each row's LSE: what follows the scores in every modified head.
template <class A>
HeadOut<A> softmax_with_sink(const Matrix<A>& z, const Matrix<A>& V, const HeadCtx& c) {
  HeadOut<A> r;
  r.weights = Matrix<A>::Zero(z.rows(), z.cols());
  r.lse = Matrix<A>(z.rows(), 1);
  for (Index i = 0; i < z.rows(); ++i) {
    const RowSoftmax<A> st = row_softmax<A>(z.row(i), c.sink);
    r.lse(i, 0) = st.lse();
    if (st.l == 0) continue;
    for (Index j = 0; j < z.cols(); ++j) r.weights(i, j) = std::exp(z(i, j) - st.m) / st.l;
  }
  r.output = mix_visible(r.weights, V, c);
  return r;
}

template <class A>
HeadOut<A> attend_modified(const Matrix<A>& Q, const Matrix<A>& K, const Matrix<A>& V, const HeadCtx& c) {
  return softmax_with_sink(causal_select(modified_scores(Q, K, c), c), V, c);
}

}  // namespace attncheck::zoo
