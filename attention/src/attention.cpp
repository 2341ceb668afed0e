// The reference scaled causal attention: shape checks, masked softmax over the key axis, weights·V.
#include "attncheck/attention.hpp"
#include "attncheck/cancel.hpp"

#include "attncheck/format.hpp"
#include "kernels.hpp"

#include <Random123/philox.h>

#include <cmath>
#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace attncheck {
namespace {

template <class A> using ArrayA = Eigen::Array<A, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class S> using ConstRef = Eigen::Ref<const Matrix<S>>;

void require_positive(const char* who, const char* name, Index rows, Index cols) {
  if (rows < 1 || cols < 1)
    throw ShapeError(std::string(who) + ": " + name + " is " + shape_string(rows, cols) +
                     "; every extent must be positive");
}

// "who: k is [5,8] but q is [5,16] (D differs)"
[[noreturn]] void mismatch(const char* who, const std::string& a, const std::string& a_shape, const std::string& b,
                           const std::string& b_shape, const std::string& why) {
  throw ShapeError(std::string(who) + ": " + a + " is " + a_shape + " but " + b + " is " + b_shape + " (" + why +
                   ")");
}

// exp that is exactly 0 at -inf. Eigen's vectorised float exp returns ~2.9e-39 there, and a future weight
// must be exactly 0, not "close to zero".
template <class A> ArrayA<A> exact_exp(const ArrayA<A>& z) {
  return (z == -std::numeric_limits<A>::infinity()).select(ArrayA<A>::Zero(z.rows(), z.cols()), z.exp());
}

// Softmax along the key axis of z, where -inf entries are masked out, with an optional sink logit: one more
// column in every row, with no value, dropped from the weights (so a row sums to 1 - p_sink). Subtracts the row
// max (the sink included) first, so large scores cannot overflow exp. A row with nothing visible and no sink
// (max = -inf) becomes all zeros, not NaN. `lse`, when not null, receives each row's m + log(sum), -inf for
// such a row.
template <class A> Matrix<A> softmax_rows(const ArrayA<A>& z, std::optional<double> sink = {}, Matrix<A>* lse = nullptr) {
  const A neg_inf = -std::numeric_limits<A>::infinity();
  const A sigma = sink ? static_cast<A>(*sink) : neg_inf;
  Eigen::Array<A, Eigen::Dynamic, 1> row_max = z.rowwise().maxCoeff().max(sigma);
  const Eigen::Array<A, Eigen::Dynamic, 1> m = row_max;
  row_max = (row_max == neg_inf).select(A(0), row_max);  // empty row: z - 0 keeps every entry at -inf
  const ArrayA<A> e = exact_exp<A>(z.colwise() - row_max);
  Eigen::Array<A, Eigen::Dynamic, 1> sum = e.rowwise().sum();
  if (sigma != neg_inf) sum += (sigma - row_max).exp();
  Matrix<A> w(z.rows(), z.cols());
  if (lse) lse->resize(z.rows(), 1);
  for (Index i = 0; i < z.rows(); ++i) {
    if (sum(i) == A(0))
      w.row(i).setZero();
    else
      w.row(i) = (e.row(i) / sum(i)).matrix();
    if (lse) (*lse)(i, 0) = sum(i) == A(0) ? neg_inf : m(i) + std::log(sum(i));
  }
  return w;
}

template <class S>
void check_head(const char* who, const ConstRef<S>& q, const ConstRef<S>& k, const ConstRef<S>& v, Index mask_rows,
                Index mask_cols) {
  require_positive(who, "q", q.rows(), q.cols());
  require_positive(who, "k", k.rows(), k.cols());
  require_positive(who, "v", v.rows(), v.cols());
  if (k.cols() != q.cols())
    mismatch(who, "k", shape_string(k.rows(), k.cols()), "q", shape_string(q.rows(), q.cols()), "D differs");
  if (v.rows() != k.rows())
    mismatch(who, "v", shape_string(v.rows(), v.cols()), "k", shape_string(k.rows(), k.cols()),
             "T differs: V needs one row per key");
  if (mask_rows != q.rows() || mask_cols != k.rows())
    mismatch(who, "mask", shape_string(mask_rows, mask_cols), "QKᵀ", shape_string(q.rows(), k.rows()),
             "the mask must be T_q x T_k");
}

template <class S> Matrix<Acc<S>> scaled_scores(const ConstRef<S>& q, const ConstRef<S>& k, double scale) {
  using A = Acc<S>;
  // scores [T_q,T_k] = Q [T_q,D] · Kᵀ [D,T_k], then scaled; both widened to the accumulation type first.
  Matrix<A> s = q.template cast<A>() * k.template cast<A>().transpose();
  s *= static_cast<A>(scale);
  return s;
}

// One head under a boolean mask. Row i of the output only ever reads the value rows it can see, so NaN or
// Inf in a masked value cannot reach it (0·Inf would be NaN).
template <class S>
HeadTrace<S> attend_bool(const char* who, const ConstRef<S>& q, const ConstRef<S>& k, const ConstRef<S>& v,
                         const BoolMask& mask, double scale, const HeadModifiers& mods = {}) {
  using A = Acc<S>;
  check_head<S>(who, q, k, v, mask.rows(), mask.cols());
  HeadTrace<S> t;
  t.scale = scale;
  t.scores = scaled_scores<S>(q, k, scale);
  // Softcap, then ALiBi and the bias, on the visible scores (a hidden one is never read: it stays as it was).
  if (mods.modifies_scores())
    for (Index i = 0; i < t.scores.rows(); ++i)
      for (Index j = 0; j < t.scores.cols(); ++j)
        if (mask.visible(i, j)) t.scores(i, j) = modified_score<A>(t.scores(i, j), mods, i, j);
  // Select, not add: the masked score's value is never read.
  const ArrayA<A> z = mask.array().select(t.scores.array(), -std::numeric_limits<A>::infinity());
  t.weights = softmax_rows<A>(z, mods.sink, &t.lse);
  if (mods.keep) {  // dropout: a kept weight times 1/(1 - p) in A, a dropped one 0; the LSE stays the softmax's
    const A c = static_cast<A>(mods.keep_scale);
    t.dropped = Matrix<A>::Zero(t.weights.rows(), t.weights.cols());
    for (Index i = 0; i < t.weights.rows(); ++i)
      for (Index j = 0; j < t.weights.cols(); ++j)
        if (mods.keep[i * t.weights.cols() + j]) t.dropped(i, j) = t.weights(i, j) * c;
  }
  const Matrix<A>& W = t.returned_weights();

  const Matrix<A> va = v.template cast<A>();
  Matrix<A> out(q.rows(), v.cols());
  std::vector<Index> seen;
  for (Index i = 0; i < q.rows(); ++i) {
    const auto row = mask.array().row(i);
    const Index n = row.count();
    Index first = 0;
    while (n > 0 && !row(first)) ++first;
    if (n == 0) {
      out.row(i).setZero();
    } else if (row.segment(first, n).all()) {  // causal, padded and windowed rows see one run of keys
      out.row(i).noalias() = W.row(i).segment(first, n) * va.middleRows(first, n);
    } else {
      seen.clear();
      for (Index j = 0; j < row.size(); ++j)
        if (row(j)) seen.push_back(j);
      out.row(i).noalias() = W(i, seen) * va(seen, Eigen::all);
    }
  }
  t.output = out.template cast<S>();
  return t;
}

// One head under an additive mask: scores + bias, softmax, then the plain product weights·V over all keys.
template <class S>
HeadTrace<S> attend_additive(const char* who, const ConstRef<S>& q, const ConstRef<S>& k, const ConstRef<S>& v,
                             const AdditiveMask& mask, double scale) {
  using A = Acc<S>;
  check_head<S>(who, q, k, v, mask.rows(), mask.cols());
  HeadTrace<S> t;
  t.scale = scale;
  t.scores = scaled_scores<S>(q, k, scale);
  const ArrayA<A> z = t.scores.array() + mask.array().template cast<A>();
  t.weights = softmax_rows<A>(z, {}, &t.lse);
  t.output = (t.weights * v.template cast<A>()).template cast<S>();
  return t;
}

// K and V may have H_kv heads for H query heads when H_kv divides H (grouped-query attention).
void check_batched(const char* who, const Shape& q, const Shape& k, const Shape& v) {
  if (k.B != q.B) mismatch(who, "k", to_string(k), "q", to_string(q), "B differs");
  if (k.H < 1 || q.H % k.H != 0)
    mismatch(who, "k", to_string(k), "q", to_string(q),
             "k has H_kv = " + std::to_string(k.H) + " heads and q has H = " + std::to_string(q.H) +
                 "; H must be a multiple of H_kv");
  if (k.D != q.D) mismatch(who, "k", to_string(k), "q", to_string(q), "D differs");
  const auto differs = [&](const Shape& a, const Shape& b) -> const char* {
    if (a.B != b.B) return "B differs";
    if (a.H != b.H) return "H differs: V needs one head per K head";
    if (a.T != b.T) return "T differs: V needs one row per key";
    return nullptr;  // V may have a head dimension D_v of its own (MLA): the output is [B,H,T_q,D_v]

  };
  if (const char* why = differs(v, k)) mismatch(who, "v", to_string(v), "k", to_string(k), why);
}

void check_modifiers(const char* who, const AttentionOptions& o, Index H) {
  if (o.softcap && !(std::isfinite(*o.softcap) && *o.softcap > 0))
    throw ValueError(std::string(who) + ": softcap must be finite and positive, got " + format_number(*o.softcap, 17));
  const auto per_head = [&](const std::vector<double>& x, const char* name, bool minus_inf_ok) {
    if (x.empty()) return;
    if (Index(x.size()) != H)
      throw ShapeError(std::string(who) + ": " + name + " has " + std::to_string(x.size()) + " entries but H = " +
                       std::to_string(H) + " (one per query head)");
    for (std::size_t h = 0; h < x.size(); ++h)
      if (!std::isfinite(x[h]) && !(minus_inf_ok && x[h] == -std::numeric_limits<double>::infinity()))
        throw ValueError(std::string(who) + ": " + name + "[" + std::to_string(h) + "] = " + format_number(x[h], 17) +
                         (minus_inf_ok ? " must be finite or -inf" : " must be finite"));
  };
  per_head(o.alibi_slopes, "alibi_slopes", false);
  per_head(o.sinks, "sinks", true);
}

// `mask_of(b, h)` is the mask of batch entry b, head h (one mask for all when nothing varies).
template <class S, class MaskOf>
Tensor<S> attention_masked(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, MaskOf&& mask_of,
                           const AttentionOptions& opts, Tensor<S>* weights, Tensor<double>* lse = nullptr) {
  constexpr const char* who = "attention";
  check_batched(who, q.shape(), k.shape(), v.shape());
  const Shape& qs = q.shape();
  const Index T_k = k.shape().T, H_kv = k.shape().H;
  const double scale = resolve_scale(opts.scale, qs.D, who);

  // output [B,H,T_q,D_v]; weights [B,H,T_q,T_k]; query head h reads kv head h / (H / H_kv)
  Tensor<S> out(Shape{qs.B, qs.H, qs.T, v.shape().D});
  if (weights) *weights = Tensor<S>(Shape{qs.B, qs.H, qs.T, T_k});
  if (lse) *lse = Tensor<double>(Shape{qs.B, qs.H, qs.T, 1});
  for (Index b = 0; b < qs.B; ++b) {
    for (Index h = 0; h < qs.H; ++h) {
      throw_if_cancelled(who);  // a head at a time: the materialised path holds up to 2^22 weights per head
      const auto& mask = mask_of(b, h);
      if (mask.rows() != qs.T || mask.cols() != T_k)
        mismatch(who, "mask", shape_string(mask.rows(), mask.cols()), "QKᵀ", shape_string(qs.T, T_k),
                 "the mask must be T_q x T_k");
      const Index g = kv_head(h, qs.H, H_kv);
      HeadTrace<S> t;
      if constexpr (std::is_same_v<std::decay_t<decltype(mask)>, BoolMask>)
        t = attend_bool<S>(who, q.head(b, h), k.head(b, g), v.head(b, g), mask, scale,
                           head_modifiers(opts, b, h, qs.T, T_k));
      else
        t = attend_additive<S>(who, q.head(b, h), k.head(b, g), v.head(b, g), mask, scale);
      out.head(b, h) = t.output;
      if (weights) weights->head(b, h) = t.returned_weights().template cast<S>();
      if (lse) lse->head(b, h) = t.lse.template cast<double>();
    }
  }
  return out;
}

// An explicit mask is the whole rule: padding and windows belong in it.
void require_no_rule_options(const AttentionOptions& opts) {
  if (!opts.key_lengths.empty() || opts.window || opts.window_right || opts.prefix_length != 0 ||
      opts.chunk_size != 0 || !opts.doc_bounds.empty() || !opts.q_doc_bounds.empty() || opts.block_mask ||
      opts.dense_mask || opts.index_list || opts.tree)
    throw ValueError("attention: key_lengths, windows, prefix_length, chunk_size, doc_bounds, q_doc_bounds, block_mask, "
                     "dense_mask, index_list and tree apply to the causal path; with an explicit mask, fold them into the mask");
  if (!opts.causal)
    throw ValueError("attention: causal = false applies to the causal path; an explicit mask is the whole rule");
  if (opts.softcap || !opts.alibi_slopes.empty() || !opts.sinks.empty() || opts.bias || has_prologue(opts) ||
      opts.dropout)
    throw ValueError("attention: softcap, alibi_slopes, sinks, bias, temperature, rope, qk_norm and dropout apply to the "
                     "causal path "
                     "(ALiBi needs positions; fold a bias into the additive mask, a temperature or rope into q and k)");
}

}  // namespace

namespace {
// A dense mask (or a block mask's partial cells) must have B or 1 entries, H or 1 heads, T_q x T_k cells.
void check_dense(const char* who, const char* name, const DenseMask& m, Index B, Index H, Index T_q, Index T_k) {
  const auto bad = [&](const std::string& why) {
    throw ShapeError(std::string(who) + ": " + name + " is [" + std::to_string(m.B) + "," + std::to_string(m.H) +
                     "," + std::to_string(m.T_q) + "," + std::to_string(m.T_k) + "] with " +
                     std::to_string(m.cells.size()) + " cells; expected [" + std::to_string(B) + " or 1," +
                     std::to_string(H) + " or 1," + (T_q < 0 ? std::string("T_q") : std::to_string(T_q)) + "," +
                     std::to_string(T_k) + "]: " + why);
  };
  if (m.B != 1 && m.B != B) bad("B differs");
  if (m.H != 1 && m.H != H) bad("H differs");
  if (T_q >= 0 && m.T_q != T_q) bad("T_q differs");
  if (m.T_q < 1) bad("T_q must be positive");
  if (m.T_k != T_k) bad("T_k differs");
  if (m.cells.size() != std::size_t(m.B * m.H * m.T_q * m.T_k)) bad("the cell count is not B·H·T_q·T_k");
}

// An index list must be [B, H or H_kv (its group the rest), T_q, max_k] with that many entries, each -1 or a key (or
// block) index below T_k's count of them.
void check_index_list(const char* who, const IndexList& l, Index B, Index H, Index T_q, Index T_k) {
  const std::string pre = std::string(who) + ": index_list ";
  const auto bad = [&](const std::string& why) {
    throw ShapeError(pre + "is [" + std::to_string(l.B) + "," + std::to_string(l.H) + "," + std::to_string(l.T_q) +
                     "," + std::to_string(l.max_k) + "] with " + std::to_string(l.indices.size()) +
                     " entries and a group of " + std::to_string(l.group) + "; expected [" + std::to_string(B) + "," +
                     "H or H_kv," + (T_q < 0 ? std::string("T_q") : std::to_string(T_q)) + ",max_k] with H = " +
                     std::to_string(H) + " query heads = list heads · group: " + why);
  };
  if (l.B != B) bad("B differs");
  if (l.group < 1 || l.H < 1 || l.H * l.group != H) bad("the list heads times the group are not H");
  if (T_q >= 0 && l.T_q != T_q) bad("T_q differs");
  if (l.max_k < 0) bad("max_k is negative");
  if (l.indices.size() != std::size_t(l.B * l.H * l.T_q * l.max_k)) bad("the entry count is not B·H·T_q·max_k");
  if (l.block_size < 1)
    throw ValueError(pre + "block size is " + std::to_string(l.block_size) + "; expected 1 (key indices) or more");
  const Index units = (T_k + l.block_size - 1) / l.block_size;
  for (std::size_t n = 0; n < l.indices.size(); ++n)
    if (l.indices[n] < -1 || l.indices[n] >= units)
      throw ValueError(pre + "entry " + std::to_string(n) + " is " + std::to_string(l.indices[n]) + "; expected -1 " +
                       "(padding) or a " + (l.block_size > 1 ? "block" : "key") + " index in [0, " +
                       std::to_string(units) + ")");
}

// A tree must be [B, T_q]: parents each -1 or an earlier node, or a bitmask whose entries each hold T_q rows of their
// L keys from their offset; every entry must hold its nodes (L >= T_q). A left window and ALiBi read a node's place,
// the prefix's length plus its depth (Visibility::place); a right window, chunks and documents are refused rather
// than read at an index.
void check_tree(const char* who, const AttentionOptions& o, Index B, Index T_q, Index T_k) {
  const TokenTree& t = *o.tree;
  const std::string pre = std::string(who) + ": tree ";
  if (t.B != B || t.T_q != T_q)
    throw ShapeError(pre + "is [" + std::to_string(t.B) + "," + std::to_string(t.T_q) + "]; expected [B,T_q] = [" +
                     std::to_string(B) + "," + std::to_string(T_q) + "]");
  if (o.window_right || o.chunk_size != 0 || !o.doc_bounds.empty())
    throw ValueError(pre + "comes with a right window, a chunk or documents, which would read a node's position (its "
                     "place in the sequence it continues, the prefix plus its depth) in ways not modelled yet; "
                     "expected a tree with the causal rule, a left window, ALiBi, padding and masks only");
  for (Index b = 0; b < B; ++b) {
    const Index L = o.key_lengths.empty() ? T_k : o.key_lengths.at(std::size_t(b));
    if (L < T_q)
      throw ValueError(pre + "of batch entry " + std::to_string(b) + " has " + std::to_string(T_q) +
                       " nodes but the entry holds " + std::to_string(L) + " keys; expected the nodes to be its last "
                       "T_q keys");
  }
  if (t.form == TokenTree::Form::parents) {
    if (t.parents.size() != std::size_t(B * T_q))
      throw ShapeError(pre + "has " + std::to_string(t.parents.size()) + " parents; expected B·T_q = " +
                       std::to_string(B * T_q));
    for (Index b = 0; b < B; ++b)
      for (Index n = 0; n < T_q; ++n)
        if (t.parent(b, n) < -1 || t.parent(b, n) >= n)
          throw ValueError(pre + "node " + std::to_string(n) + " of batch entry " + std::to_string(b) + " has parent " +
                           std::to_string(t.parent(b, n)) + "; expected -1 (the prefix) or an earlier node in [0, " +
                           std::to_string(n) + ")");
    return;
  }
  if (t.form != TokenTree::Form::bitmask) throw ValueError(pre + "has an unknown form; expected parents or a bitmask");
  if (t.offsets.size() != std::size_t(B + 1))
    throw ShapeError(pre + "bitmask has " + std::to_string(t.offsets.size()) + " offsets; expected B + 1 = " +
                     std::to_string(B + 1));
  for (Index b = 0; b < B; ++b) {
    const Index L = o.key_lengths.empty() ? T_k : o.key_lengths.at(std::size_t(b));
    const Index need = (T_q * L + 7) / 8, at = t.offsets[std::size_t(b)];
    if (at < 0 || at > Index(t.bits.size()) || Index(t.bits.size()) - at < need)
      throw ShapeError(pre + "bitmask of batch entry " + std::to_string(b) + " starts at byte " + std::to_string(at) +
                       " of " + std::to_string(t.bits.size()) + "; expected " + std::to_string(need) +
                       " bytes there (T_q rows of " + std::to_string(L) + " keys)");
  }
}

// A bias must be [B or 1, H or 1, T_q, T_k] with that many finite values.
void check_bias(const char* who, const ScoreBias& bias, Index B, Index H, Index T_q, Index T_k) {
  const auto bad = [&](const std::string& why) {
    throw ShapeError(std::string(who) + ": bias is [" + std::to_string(bias.B) + "," + std::to_string(bias.H) + "," +
                     std::to_string(bias.T_q) + "," + std::to_string(bias.T_k) + "] with " +
                     std::to_string(bias.values.size()) + " values; expected [" + std::to_string(B) + " or 1," +
                     std::to_string(H) + " or 1," + (T_q < 0 ? std::string("T_q") : std::to_string(T_q)) + "," +
                     std::to_string(T_k) + "]: " + why);
  };
  if (bias.B != 1 && bias.B != B) bad("B differs");
  if (bias.H != 1 && bias.H != H) bad("H differs");
  if (T_q >= 0 && bias.T_q != T_q) bad("T_q differs");
  if (bias.T_q < 0) bad("T_q is negative");
  if (bias.T_k != T_k) bad("T_k differs");
  if (bias.values.size() != std::size_t(bias.B * bias.H * bias.T_q * bias.T_k)) bad("the value count is not B·H·T_q·T_k");
  for (std::size_t n = 0; n < bias.values.size(); ++n)
    if (std::isnan(bias.values[n]) || bias.values[n] == std::numeric_limits<double>::infinity())
      throw ValueError(std::string(who) + ": bias value " + std::to_string(n) + " is " +
                       format_number(bias.values[n], 17) +
                       "; each must be finite or -inf (a bias of -inf hides its cell as a mask does)");
}
}  // namespace

namespace {
// A temperature must be [B or 1, H or 1, T_q] with that many values, each finite and > 0.
void check_temperature(const char* who, const QueryTemperature& t, Index B, Index H, Index T_q) {
  const auto bad = [&](const std::string& why) {
    throw ShapeError(std::string(who) + ": temperature is [" + std::to_string(t.B) + "," + std::to_string(t.H) +
                     "," + std::to_string(t.T_q) + "] with " + std::to_string(t.values.size()) + " values; expected [" +
                     std::to_string(B) + " or 1," + std::to_string(H) + " or 1," +
                     (T_q < 0 ? std::string("T_q") : std::to_string(T_q)) + "]: " + why);
  };
  if (t.B != 1 && t.B != B) bad("B differs");
  if (t.H != 1 && t.H != H) bad("H differs");
  if (T_q >= 0 && t.T_q != T_q) bad("T_q differs");
  if (t.T_q < 0) bad("T_q is negative");
  if (t.values.size() != std::size_t(t.B * t.H * t.T_q)) bad("the value count is not B·H·T_q");
  for (std::size_t n = 0; n < t.values.size(); ++n)
    if (!(std::isfinite(t.values[n]) && t.values[n] > 0))
      throw ValueError(std::string(who) + ": temperature value " + std::to_string(n) + " is " +
                       format_number(t.values[n], 17) + "; each must be finite and > 0 (it divides the scores)");
}
}  // namespace

namespace {
// A rope's own fields and its positions ([B, T_q] and [B, T_k]); its rotary_dim against D is fold_rope's.
void check_rope(const char* who, const Rope& r, Index B, Index T_k, Index T_q) {
  const std::string pre = std::string(who) + ": rope ";
  if (r.rotary_dim < 2 || r.rotary_dim % 2 != 0)
    throw ValueError(pre + "rotary_dim is " + std::to_string(r.rotary_dim) + "; expected an even number >= 2");
  if (!(std::isfinite(r.base) && r.base > 0))
    throw ValueError(pre + "base is " + format_number(r.base, 17) + "; expected finite and > 0");
  if (!(std::isfinite(r.factor) && r.factor > 0))
    throw ValueError(pre + "factor is " + format_number(r.factor, 17) + "; expected finite and > 0");
  if (r.scaling != RopeScaling::linear && !(r.factor >= 1))
    throw ValueError(pre + "factor is " + format_number(r.factor, 17) + "; expected >= 1 for " +
                     (r.scaling == RopeScaling::ntk ? "ntk" : "llama3") + " scaling");
  if (r.scaling == RopeScaling::ntk && r.rotary_dim < 4)
    throw ValueError(pre + "rotary_dim is " + std::to_string(r.rotary_dim) +
                     " with ntk scaling; expected >= 4 (the base grows by factor^(r/(r - 2)))");
  if (r.scaling == RopeScaling::llama3 &&
      !(std::isfinite(r.low_freq_factor) && std::isfinite(r.high_freq_factor) && r.low_freq_factor > 0 &&
        r.high_freq_factor > r.low_freq_factor && std::isfinite(r.original_max_position) && r.original_max_position > 0))
    throw ValueError(pre + "llama3 scaling has low_freq_factor " + format_number(r.low_freq_factor, 17) +
                     ", high_freq_factor " + format_number(r.high_freq_factor, 17) + ", original_max_position " +
                     format_number(r.original_max_position, 17) +
                     "; expected 0 < low_freq_factor < high_freq_factor and original_max_position > 0, all finite");
  const auto positions = [&](const char* name, const std::vector<Index>& p, Index T) {
    if (T >= 0 && p.size() != std::size_t(B * T))
      throw ShapeError(pre + name + " has " + std::to_string(p.size()) + " entries; expected B·T = " +
                       std::to_string(B) + "·" + std::to_string(T) + " = " + std::to_string(B * T));
    for (std::size_t n = 0; n < p.size(); ++n)
      if (p[n] < 0 || p[n] > (Index{1} << 40))
        throw ValueError(pre + name + "[" + std::to_string(n) + "] is " + std::to_string(p[n]) +
                         "; expected a position id in [0, 2^40]");
  };
  positions("q_positions", r.q_positions, T_q);
  positions("k_positions", r.k_positions, T_k);
}
}  // namespace

namespace {
// Dropout's p in [0, 1); a keep mask, when given, [B,H,T_q,T_k] of 0s and 1s.
void check_dropout(const char* who, const Dropout& d, Index B, Index H, Index T_q, Index T_k) {
  const std::string pre = std::string(who) + ": dropout ";
  if (!(d.p >= 0 && d.p < 1)) throw ValueError(pre + "p = " + format_number(d.p, 17) + "; expected a value in [0, 1)");
  if (d.keep.empty()) return;
  if (d.H != H || (T_q >= 0 && d.T_q != T_q) || d.T_k != T_k || d.keep.size() != std::size_t(B * d.H * d.T_q * d.T_k))
    throw ShapeError(pre + "keep mask has " + std::to_string(d.keep.size()) + " cells over H = " + std::to_string(d.H) +
                     ", T_q = " + std::to_string(d.T_q) + ", T_k = " + std::to_string(d.T_k) + "; expected [B,H,T_q,T_k] = [" +
                     std::to_string(B) + "," + std::to_string(H) + "," + (T_q < 0 ? std::string("T_q") : std::to_string(T_q)) +
                     "," + std::to_string(T_k) + "]");
  for (std::size_t n = 0; n < d.keep.size(); ++n)
    if (d.keep[n] > 1)
      throw ValueError(pre + "keep mask cell " + std::to_string(n) + " is " + std::to_string(int(d.keep[n])) +
                       "; expected 0 (dropped) or 1 (kept)");
}

// A QK-norm's eps and weights (their count against D is fold_qk_norm's and check_call's).
void check_qk_norm(const char* who, const QkNorm& n) {
  const std::string pre = std::string(who) + ": qk_norm ";
  if (!(std::isfinite(n.eps) && n.eps > 0))
    throw ValueError(pre + "eps is " + format_number(n.eps, 17) + "; expected finite and > 0");
  if (n.q_weight.empty() && n.k_weight.empty())
    throw ValueError(pre + "has neither q_weight nor k_weight; expected at least one side normalised");
  for (const auto& [name, w] : {std::pair{"q_weight", &n.q_weight}, {"k_weight", &n.k_weight}})
    for (std::size_t c = 0; c < w->size(); ++c)
      if (!std::isfinite((*w)[c]))
        throw ValueError(pre + name + "[" + std::to_string(c) + "] is " + format_number((*w)[c], 17) +
                         "; expected finite");
}
}  // namespace

void check_options(const char* who, const AttentionOptions& o, Index B, Index H, Index T_k, Index T_q) {
  if (o.dense_mask) check_dense(who, "dense_mask", *o.dense_mask, B, H, T_q, T_k);
  if (o.index_list) check_index_list(who, *o.index_list, B, H, T_q, T_k);
  if (o.qk_norm) check_qk_norm(who, *o.qk_norm);
  if (o.rope) check_rope(who, *o.rope, B, T_k, T_q);
  if (o.bias) check_bias(who, *o.bias, B, H, T_q, T_k);
  if (o.temperature) check_temperature(who, *o.temperature, B, H, T_q);
  if (o.dropout) check_dropout(who, *o.dropout, B, H, T_q, T_k);
  if (o.block_mask) {
    const BlockMask& m = *o.block_mask;
    const std::string pre = std::string(who) + ": block_mask ";
    if (m.block_q < 1 || m.block_k < 1)
      throw ValueError(pre + "has blocks of " + std::to_string(m.block_q) + " x " + std::to_string(m.block_k) +
                       "; both must be >= 1");
    if (m.B != 1 && m.B != B) throw ShapeError(pre + "has B = " + std::to_string(m.B) + "; expected " + std::to_string(B) + " or 1");
    if (m.H != 1 && m.H != H) throw ShapeError(pre + "has H = " + std::to_string(m.H) + "; expected " + std::to_string(H) + " or 1");
    const Index nk = (T_k + m.block_k - 1) / m.block_k;
    if (m.k_blocks != nk)
      throw ShapeError(pre + "has " + std::to_string(m.k_blocks) + " key blocks; T_k = " + std::to_string(T_k) +
                       " in blocks of " + std::to_string(m.block_k) + " needs " + std::to_string(nk));
    if (T_q >= 0 && m.q_blocks != (T_q + m.block_q - 1) / m.block_q)
      throw ShapeError(pre + "has " + std::to_string(m.q_blocks) + " query blocks; T_q = " + std::to_string(T_q) +
                       " in blocks of " + std::to_string(m.block_q) + " needs " +
                       std::to_string((T_q + m.block_q - 1) / m.block_q));
    if (m.kinds.size() != std::size_t(m.B * m.H * m.q_blocks * m.k_blocks))
      throw ShapeError(pre + "has " + std::to_string(m.kinds.size()) + " kinds; expected B·H·q_blocks·k_blocks = " +
                       std::to_string(m.B * m.H * m.q_blocks * m.k_blocks));
    bool partial = false;
    for (std::size_t n = 0; n < m.kinds.size(); ++n) {
      if (m.kinds[n] > std::uint8_t(BlockKind::Full))
        throw ValueError(pre + "kind " + std::to_string(n) + " is " + std::to_string(int(m.kinds[n])) +
                         "; expected 0 (empty), 1 (partial) or 2 (full)");
      partial |= m.kinds[n] == std::uint8_t(BlockKind::Partial);
    }
    if (partial) check_dense(who, "block_mask.partial", m.partial, B, H, T_q, T_k);
    if (partial && m.partial.T_q > m.q_blocks * m.block_q)
      throw ShapeError(pre + "partial cells have T_q = " + std::to_string(m.partial.T_q) + " but the blocks cover " +
                       std::to_string(m.q_blocks * m.block_q) + " queries");
  }
  if (!o.key_lengths.empty()) {
    if (Index(o.key_lengths.size()) != B)
      throw ShapeError(std::string(who) + ": key_lengths has " + std::to_string(o.key_lengths.size()) +
                       " entries but B = " + std::to_string(B) + " (one length per batch entry)");
    for (std::size_t b = 0; b < o.key_lengths.size(); ++b)
      if (o.key_lengths[b] < 0 || o.key_lengths[b] > T_k)
        throw ValueError(std::string(who) + ": key_lengths[" + std::to_string(b) + "] = " +
                         std::to_string(o.key_lengths[b]) + " is outside [0, T_k = " + std::to_string(T_k) + "]");
  }
  if (o.tree) check_tree(who, o, B, T_q, T_k);  // after the key lengths: its entries hold that many keys
  if (o.window && *o.window < 0)
    throw ValueError(std::string(who) + ": window must be >= 0 (0: a query sees only its own position), got " +
                     std::to_string(*o.window));
  if (o.prefix_length < 0)
    throw ValueError(std::string(who) + ": prefix_length must be >= 0 (0: no prefix), got " +
                     std::to_string(o.prefix_length));
  if (o.window_right && *o.window_right < 0)
    throw ValueError(std::string(who) + ": window_right must be >= 0 (0: a query sees no key after its own), got " +
                     std::to_string(*o.window_right));
  if (o.chunk_size < 0)
    throw ValueError(std::string(who) + ": chunk_size must be >= 0 (0: no chunks), got " + std::to_string(o.chunk_size));
  if (!o.doc_bounds.empty()) {
    if (Index(o.doc_bounds.size()) != B)
      throw ShapeError(std::string(who) + ": doc_bounds has " + std::to_string(o.doc_bounds.size()) +
                       " lists but B = " + std::to_string(B) + " (one list of document bounds per batch entry)");
    for (std::size_t b = 0; b < o.doc_bounds.size(); ++b)
      for (std::size_t d = 0; d < o.doc_bounds[b].size(); ++d)
        if (o.doc_bounds[b][d] < 0 || (d > 0 && o.doc_bounds[b][d] < o.doc_bounds[b][d - 1]))
          throw ValueError(std::string(who) + ": doc_bounds[" + std::to_string(b) + "][" + std::to_string(d) +
                           "] = " + std::to_string(o.doc_bounds[b][d]) +
                           (o.doc_bounds[b][d] < 0 ? " is negative" : " is below the bound before it") +
                           " (bounds are non-decreasing key positions)");
  }
  if (!o.q_doc_bounds.empty()) {
    if (o.doc_bounds.empty())
      throw ValueError(std::string(who) + ": q_doc_bounds needs doc_bounds (the keys' documents), which is empty");
    if (Index(o.q_doc_bounds.size()) != B)
      throw ShapeError(std::string(who) + ": q_doc_bounds has " + std::to_string(o.q_doc_bounds.size()) +
                       " lists but B = " + std::to_string(B) + " (one list of query document bounds per batch entry)");
    for (std::size_t b = 0; b < o.q_doc_bounds.size(); ++b) {
      const std::vector<Index>& qb = o.q_doc_bounds[b];
      if (qb.size() != o.doc_bounds[b].size())
        throw ShapeError(std::string(who) + ": q_doc_bounds[" + std::to_string(b) + "] has " +
                         std::to_string(qb.size()) + " bounds but doc_bounds[" + std::to_string(b) + "] has " +
                         std::to_string(o.doc_bounds[b].size()) + " (the same documents, for queries and for keys)");
      for (std::size_t d = 0; d < qb.size(); ++d)
        if (qb[d] < 0 || (d > 0 && qb[d] < qb[d - 1]))
          throw ValueError(std::string(who) + ": q_doc_bounds[" + std::to_string(b) + "][" + std::to_string(d) +
                           "] = " + std::to_string(qb[d]) +
                           (qb[d] < 0 ? " is negative" : " is below the bound before it") +
                           " (bounds are non-decreasing query indices)");
    }
  }
  check_modifiers(who, o, H);
}

void check_call(const char* who, const Shape& q, const Shape& k, const Shape& v, const AttentionOptions& opts) {
  check_batched(who, q, k, v);
  if (opts.scale) resolve_scale(opts.scale, q.D, who);
  check_options(who, opts, q.B, q.H, k.T, q.T);
  if (opts.quant) {
    check_quant_scales(who, "k", opts.quant->format, opts.quant->k, k);
    check_quant_scales(who, "v", opts.quant->format, opts.quant->v, v);
    if (const std::optional<QuantScales>& qs = opts.quant->q) {
      if (quant_blocked(opts.quant->format) || !qs->zero_points.empty())
        throw ValueError(std::string(who) + ": a quantised q comes in FP8 or int8 and without zero points, but has " +
                         (qs->zero_points.empty() ? std::string(quant_format_name(opts.quant->format)) + " codes"
                                                  : std::string("zero points")));
      check_quant_scales(who, "q", opts.quant->format, *qs, q);
    }
  }
  if (opts.qk_norm)
    for (const auto& [name, w] : {std::pair{"q_weight", &opts.qk_norm->q_weight}, {"k_weight", &opts.qk_norm->k_weight}})
      if (!w->empty() && Index(w->size()) != q.D)
        throw ShapeError(std::string(who) + ": qk_norm " + name + " has " + std::to_string(w->size()) +
                         " entries; expected D = " + std::to_string(q.D));
  if (opts.rope && opts.rope->rotary_dim > q.D)
    throw ShapeError(std::string(who) + ": rope rotary_dim is " + std::to_string(opts.rope->rotary_dim) +
                     "; expected an even number in [2, D = " + std::to_string(q.D) + "]");
}

double resolve_scale(const std::optional<double>& scale, Index D, const char* who) {
  if (!scale) return 1.0 / std::sqrt(static_cast<double>(D));
  if (!std::isfinite(*scale) || *scale <= 0)
    throw ValueError(std::string(who) + ": scale must be finite and positive, got " + format_number(*scale, 17));
  return *scale;
}

template <class S>
HeadTrace<S> attend(const Matrix<S>& q, const Matrix<S>& k, const Matrix<S>& v, const BoolMask& mask,
                    std::optional<double> scale) {
  return attend_bool<S>("attend", q, k, v, mask, resolve_scale(scale, q.cols(), "attend"));
}

template <class S>
HeadTrace<S> attend(const Matrix<S>& q, const Matrix<S>& k, const Matrix<S>& v, const BoolMask& mask, double scale,
                    const HeadModifiers& mods) {
  return attend_bool<S>("attend", q, k, v, mask, resolve_scale(scale, q.cols(), "attend"), mods);
}

template <class S>
HeadTrace<S> attend(const Matrix<S>& q, const Matrix<S>& k, const Matrix<S>& v, const AdditiveMask& mask,
                    std::optional<double> scale) {
  return attend_additive<S>("attend", q, k, v, mask, resolve_scale(scale, q.cols(), "attend"));
}

template <class S>
ProjectionTrace<S> single_head_attention(const Matrix<S>& x, const Matrix<S>& w_q, const Matrix<S>& w_k,
                                         const Matrix<S>& w_v, const AttentionOptions& opts) {
  constexpr const char* who = "single_head_attention";
  require_positive(who, "X", x.rows(), x.cols());
  require_positive(who, "W_q", w_q.rows(), w_q.cols());
  // Step 1-2: X [T,C] and W [C,d] give Q, K, V [T,d].
  if (w_q.rows() != x.cols())
    mismatch(who, "W_q", shape_string(w_q.rows(), w_q.cols()), "X", shape_string(x.rows(), x.cols()),
             "W_q needs one row per input channel C = " + std::to_string(x.cols()));
  const std::pair<const char*, const Matrix<S>*> others[] = {{"W_k", &w_k}, {"W_v", &w_v}};
  for (const auto& [name, w] : others)
    if (w->rows() != w_q.rows() || w->cols() != w_q.cols())
      mismatch(who, name, shape_string(w->rows(), w->cols()), "W_q", shape_string(w_q.rows(), w_q.cols()),
               w->rows() != w_q.rows() ? "C differs" : "d differs");
  using A = Acc<S>;
  const Matrix<A> xa = x.template cast<A>();
  ProjectionTrace<S> p;
  p.Q = (xa * w_q.template cast<A>()).template cast<S>();
  p.K = (xa * w_k.template cast<A>()).template cast<S>();
  p.V = (xa * w_v.template cast<A>()).template cast<S>();
  // Steps 3-6: scores [T,T], causal mask, softmax over keys, weights [T,T], output [T,d].
  const Index T = x.rows();
  p.head = attend_bool<S>(who, p.Q, p.K, p.V, BoolMask::causal(T, T, opts.alignment),
                          resolve_scale(opts.scale, w_q.cols(), who));
  return p;
}

namespace {
// Each node's depth in batch entry b (TokenTree::depth), for the rules that read a node's place.
std::shared_ptr<const std::vector<Index>> tree_depths(const TokenTree& t, Index b, Index length) {
  auto d = std::make_shared<std::vector<Index>>(std::size_t(t.T_q));
  for (Index n = 0; n < t.T_q; ++n) (*d)[std::size_t(n)] = t.depth(b, n, length);
  return d;
}
}  // namespace

Visibility visibility(const AttentionOptions& opts, Index b, Index T_q, Index T_k, Index h) {
  Visibility vis{.T_q = T_q,
                 .T_k = T_k,
                 .alignment = opts.alignment,
                 .window = opts.window,
                 .causal = opts.causal,
                 .prefix = opts.prefix_length,
                 .window_right = opts.window_right,
                 .chunk = opts.chunk_size};
  if (!opts.key_lengths.empty()) vis.key_length = opts.key_lengths.at(std::size_t(b));
  if (!opts.doc_bounds.empty()) vis.doc_bounds = &opts.doc_bounds.at(std::size_t(b));
  if (!opts.q_doc_bounds.empty()) vis.q_doc_bounds = &opts.q_doc_bounds.at(std::size_t(b));
  if (opts.block_mask) vis.block = &*opts.block_mask;
  if (opts.dense_mask) vis.dense = &*opts.dense_mask;
  if (opts.index_list) vis.index = &*opts.index_list;
  if (opts.tree) {
    vis.tree = &*opts.tree;
    if (opts.window || !opts.alibi_slopes.empty())  // rules that read a node's place
      vis.depths = tree_depths(*opts.tree, b, vis.key_length < 0 ? T_k : vis.key_length);
  }
  // A bias of -inf hides its cell: the head's cells are scanned so that a finite bias keeps the runs unbroken.
  if (opts.bias) {
    const double* at = opts.bias->head(b, h);
    if (std::find(at, at + opts.bias->T_q * opts.bias->T_k, -std::numeric_limits<double>::infinity()) !=
        at + opts.bias->T_q * opts.bias->T_k)
      vis.bias = &*opts.bias;
  }
  vis.batch = b;
  vis.head = h;
  return vis;
}

bool bias_hides_cells(const ScoreBias& bias) {
  return std::find(bias.values.begin(), bias.values.end(), -std::numeric_limits<double>::infinity()) !=
         bias.values.end();
}

bool visibility_per_head(const AttentionOptions& opts) {
  return (opts.block_mask && (opts.block_mask->H > 1 || opts.block_mask->partial.H > 1)) ||
         (opts.dense_mask && opts.dense_mask->H > 1) || (opts.bias && opts.bias->H > 1 && bias_hides_cells(*opts.bias)) ||
         (opts.index_list && opts.index_list->H * opts.index_list->group > 1);
}

HeadModifiers head_modifiers(const AttentionOptions& opts, Index b, Index h, Index T_q, Index T_k) {
  if (has_prologue(opts))
    throw std::logic_error("head_modifiers: the temperature and rope must be folded into q and k first "
                           "(fold_queries, fold_keys, folded_options)");
  HeadModifiers m;
  m.tempered = opts.temperature_folded;
  if (opts.rope_folded) {
    m.rope = &*opts.rope_folded;
    m.rope_batch = b;
  }
  if (opts.qk_norm_folded) m.qk_norm = &*opts.qk_norm_folded;
  m.softcap = opts.softcap;
  if (!opts.alibi_slopes.empty()) m.alibi_slope = opts.alibi_slopes.at(std::size_t(h));
  if (opts.bias) {
    m.bias = opts.bias->head(b, h);
    m.bias_cols = opts.bias->T_k;
  }
  if (!opts.sinks.empty()) m.sink = opts.sinks.at(std::size_t(h));
  if (opts.index_list && opts.index_list->counted) {
    m.counted = &*opts.index_list;
    m.list_b = b;
    m.list_h = h;
  }
  if (opts.dropout) {
    if (opts.dropout->keep.empty())
      throw std::logic_error("head_modifiers: the dropout's keep mask must be drawn first (with_dropout_mask)");
    m.keep = opts.dropout->head(b, h);
    m.keep_scale = opts.dropout->keep_scale();
  }
  m.dequantised_kv = opts.quant.has_value();
  m.dequantised_q = opts.quant && opts.quant->q;
  m.p_fp8 = opts.quant && opts.quant->p_fp8;
  if (opts.quant) {
    for (const double x : opts.quant->k.mins) m.k_min_magnitude = std::max(m.k_min_magnitude, std::abs(x));
    for (const double x : opts.quant->v.mins) m.v_min_magnitude = std::max(m.v_min_magnitude, std::abs(x));
    m.q_dot_ggml_q8 = opts.quant->q_dot_ggml_q8 && quant_blocked(opts.quant->format);
  }
  m.rows = Visibility{.T_q = T_q, .T_k = T_k, .alignment = opts.alignment};
  if (opts.tree && !opts.alibi_slopes.empty()) {  // ALiBi reads a node's place: the prefix's length plus its depth
    m.rows.key_length = opts.key_lengths.empty() ? -1 : opts.key_lengths.at(std::size_t(b));
    m.rows.depths = tree_depths(*opts.tree, b, m.rows.key_length < 0 ? T_k : m.rows.key_length);
  }
  if (!opts.q_doc_bounds.empty()) {
    m.rows.doc_bounds = &opts.doc_bounds.at(std::size_t(b));
    m.rows.q_doc_bounds = &opts.q_doc_bounds.at(std::size_t(b));
  }
  return m;
}

template <class S> Tensor<S> fold_temperature(const Tensor<S>& q, const AttentionOptions& opts) {
  if (!opts.temperature) return q;
  const Shape& s = q.shape();
  Tensor<S> r(s);
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) {
      const double* tau = opts.temperature->head(b, h);
      for (Index i = 0; i < s.T; ++i)
        for (Index c = 0; c < s.D; ++c) r(b, h, i, c) = static_cast<S>(static_cast<double>(q(b, h, i, c)) / tau[i]);
    }
  return r;
}

template <class S>
Tensor<S> fold_rope(const Tensor<S>& x, const Rope& rope, const std::vector<Index>& positions, const char* who) {
  const Shape& s = x.shape();
  if (rope.rotary_dim > s.D || rope.rotary_dim < 2 || rope.rotary_dim % 2 != 0)
    throw ShapeError(std::string(who) + ": rope rotary_dim is " + std::to_string(rope.rotary_dim) +
                     "; expected an even number in [2, D = " + std::to_string(s.D) + "]");
  if (positions.size() != std::size_t(s.B * s.T))
    throw ShapeError(std::string(who) + ": rope positions have " + std::to_string(positions.size()) +
                     " entries; expected B·T = " + std::to_string(s.B * s.T) + " for " + to_string(s));
  Tensor<S> r = x;
  for (Index b = 0; b < s.B; ++b)
    for (Index t = 0; t < s.T; ++t) {
      const Index pos = positions[std::size_t(b * s.T + t)];
      for (Index m = 0; m < rope.rotary_dim / 2; ++m) {
        const double theta = rope.angle(pos, m), c = std::cos(theta), sn = std::sin(theta);
        const auto [a, e] = rope.pair(m);
        for (Index h = 0; h < s.H; ++h) {
          const double xa = static_cast<double>(x(b, h, t, a)), xe = static_cast<double>(x(b, h, t, e));
          r(b, h, t, a) = static_cast<S>(xa * c - xe * sn);
          r(b, h, t, e) = static_cast<S>(xe * c + xa * sn);
        }
      }
    }
  return r;
}

template <class S>
Tensor<S> fold_qk_norm(const Tensor<S>& x, const QkNorm& norm, const std::vector<double>& weight, const char* who) {
  const Shape& s = x.shape();
  if (Index(weight.size()) != s.D)
    throw ShapeError(std::string(who) + ": qk_norm weights have " + std::to_string(weight.size()) +
                     " entries; expected D = " + std::to_string(s.D));
  Tensor<S> r(s);
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index t = 0; t < s.T; ++t) {
        double ms = 0;
        for (Index c = 0; c < s.D; ++c) ms += static_cast<double>(x(b, h, t, c)) * static_cast<double>(x(b, h, t, c));
        ms /= double(s.D);
        const double rms = norm.eps_outside ? std::sqrt(ms) + norm.eps : std::sqrt(ms + norm.eps);
        for (Index c = 0; c < s.D; ++c)
          r(b, h, t, c) = static_cast<S>(static_cast<double>(x(b, h, t, c)) / rms * weight[std::size_t(c)]);
      }
  return r;
}

template <class S> Tensor<S> fold_queries(const Tensor<S>& q, const AttentionOptions& opts, const char* who) {
  Tensor<S> x = opts.qk_norm && !opts.qk_norm->q_weight.empty()
                    ? fold_qk_norm(q, *opts.qk_norm, opts.qk_norm->q_weight, who)
                    : q;
  if (opts.rope) x = fold_rope(x, *opts.rope, opts.rope->q_positions, who);
  return fold_temperature(x, opts);
}

template <class S> Tensor<S> fold_keys(const Tensor<S>& k, const AttentionOptions& opts, const char* who) {
  Tensor<S> x = opts.qk_norm && !opts.qk_norm->k_weight.empty()
                    ? fold_qk_norm(k, *opts.qk_norm, opts.qk_norm->k_weight, who)
                    : k;
  return opts.rope ? fold_rope(x, *opts.rope, opts.rope->k_positions, who) : x;
}

AttentionOptions folded_options(const AttentionOptions& opts) {
  AttentionOptions o = opts;
  if (o.temperature) {
    o.temperature.reset();
    o.temperature_folded = true;
  }
  if (o.rope) {
    o.rope_folded = std::move(o.rope);
    o.rope.reset();
  }
  if (o.qk_norm) {
    o.qk_norm_folded = std::move(o.qk_norm);
    o.qk_norm.reset();
  }
  return o;
}

std::vector<std::uint8_t> dropout_keep_mask(const Dropout& d, Index B, Index H, Index T_q, Index T_k) {
  using Philox = r123::Philox4x32_R<10>;
  const Philox rng;
  const Philox::key_type key = {{std::uint32_t(d.seed), std::uint32_t(d.seed >> 32)}};
  const std::size_t n = std::size_t(B * H * T_q * T_k);
  std::vector<std::uint8_t> keep(n);
  const double threshold = d.p * 4294967296.0;  // u = r·2^-32 >= p
  Philox::ctr_type r{};
  for (std::size_t e = 0; e < n; ++e) {
    if (e % 4 == 0) {
      const std::uint64_t c = std::uint64_t(e / 4) + d.offset;
      r = rng(Philox::ctr_type{{std::uint32_t(c), std::uint32_t(c >> 32), 0, 0}}, key);
    }
    keep[e] = double(r.v[e % 4]) >= threshold ? 1 : 0;
  }
  return keep;
}

AttentionOptions with_dropout_mask(const AttentionOptions& opts, Index B, Index H, Index T_q, Index T_k) {
  if (!opts.dropout || !opts.dropout->keep.empty()) return opts;
  AttentionOptions o = opts;
  o.dropout->keep = dropout_keep_mask(*opts.dropout, B, H, T_q, T_k);
  o.dropout->H = H;
  o.dropout->T_q = T_q;
  o.dropout->T_k = T_k;
  return o;
}

double RowStats::lse(Index b, Index h, Index i) const {
  return sum(b, h, i) == 0 ? -std::numeric_limits<double>::infinity() : max(b, h, i) + std::log(sum(b, h, i));
}

template <class S>
Tensor<S> attention(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const AttentionOptions& opts,
                    Tensor<S>* weights, Tensor<double>* lse) {
  check_batched("attention", q.shape(), k.shape(), v.shape());
  const Index B = q.shape().B, T_q = q.shape().T, T_k = k.shape().T;
  check_options("attention", opts, B, q.shape().H, T_k, T_q);
  if (has_prologue(opts))
    return attention<S>(fold_queries(q, opts, "attention"), fold_keys(k, opts, "attention"), v, folded_options(opts),
                        weights, lse);
  if (opts.dropout && opts.dropout->keep.empty())
    return attention<S>(q, k, v, with_dropout_mask(opts, B, q.shape().H, T_q, T_k), weights, lse);
  if (opts.dropout && !weights) {  // dropout is materialised: each head's [T_q,T_k] weights
    Tensor<S> w(Shape{1, 1, 1, 1});
    return attention<S>(q, k, v, opts, &w, lse);
  }
  if (!weights) {  // nothing asks for [T_q,T_k]: stream it
    if (!lse)
      return detail::streamed_forward<S>(q, k, v, opts, resolve_scale(opts.scale, q.shape().D, "attention"), nullptr,
                                         false);
    Tensor<double> stats{Shape{}};
    Tensor<S> out = detail::streamed_forward<S>(q, k, v, opts, resolve_scale(opts.scale, q.shape().D, "attention"),
                                                &stats, false);
    const Shape& qs = q.shape();
    *lse = Tensor<double>(Shape{qs.B, qs.H, qs.T, 1});
    const RowStats rs{stats};
    for (Index b = 0; b < qs.B; ++b)
      for (Index h = 0; h < qs.H; ++h)
        for (Index i = 0; i < qs.T; ++i) {
          // m + log l in the accumulation type, as a kernel holds it
          using A = Acc<S>;
          (*lse)(b, h, i, 0) = rs.sum(b, h, i) == 0 ? -std::numeric_limits<double>::infinity()
                                                     : double(A(rs.max(b, h, i)) + std::log(A(rs.sum(b, h, i))));
        }
    return out;
  }
  // One mask per batch entry and head where they differ (one for all when nothing varies).
  const bool per_b = !opts.key_lengths.empty() || !opts.doc_bounds.empty() ||
                     (opts.block_mask && (opts.block_mask->B > 1 || opts.block_mask->partial.B > 1)) ||
                     (opts.dense_mask && opts.dense_mask->B > 1) || (opts.index_list && opts.index_list->B > 1) ||
                     (opts.tree && opts.tree->B > 1) ||
                     (opts.bias && opts.bias->B > 1 && bias_hides_cells(*opts.bias));
  const Index nb = per_b ? B : 1, nh = visibility_per_head(opts) ? q.shape().H : 1;
  std::vector<BoolMask> masks;
  for (Index b = 0; b < nb; ++b)
    for (Index h = 0; h < nh; ++h) masks.push_back(BoolMask::of(visibility(opts, b, T_q, T_k, h)));
  return attention_masked<S>(
      q, k, v,
      [&](Index b, Index h) -> const BoolMask& {
        return masks[std::size_t((nb == 1 ? 0 : b) * nh + (nh == 1 ? 0 : h))];
      },
      opts, weights, lse);
}

template <class S>
Tensor<S> attention(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const BoolMask& mask,
                    const AttentionOptions& opts, Tensor<S>* weights) {
  require_no_rule_options(opts);
  return attention_masked<S>(q, k, v, [&](Index, Index) -> const BoolMask& { return mask; }, opts, weights);
}

template <class S>
Tensor<S> attention(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const AdditiveMask& mask,
                    const AttentionOptions& opts, Tensor<S>* weights) {
  require_no_rule_options(opts);
  return attention_masked<S>(q, k, v, [&](Index, Index) -> const AdditiveMask& { return mask; }, opts, weights);
}

template <class S>
Tensor<double> oracle(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const AttentionOptions& opts,
                      Tensor<double>* weights, Tensor<double>* lse) {
  return attention<double>(q.template cast<double>(), k.template cast<double>(), v.template cast<double>(), opts,
                           weights, lse);
}

template <class S>
Tensor<double> streaming_oracle(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const AttentionOptions& opts,
                                RowStats* stats) {
  constexpr const char* who = "streaming_oracle";
  check_batched(who, q.shape(), k.shape(), v.shape());
  check_options(who, opts, q.shape().B, q.shape().H, k.shape().T, q.shape().T);
  if (opts.dropout)
    throw ValueError(std::string(who) + ": dropout is checked on the materialised path only (oracle); its cases stay "
                     "below 2^22 weights");
  if (has_prologue(opts))
    return detail::streamed_forward<double>(fold_queries(q.template cast<double>(), opts, who),
                                            fold_keys(k.template cast<double>(), opts, who), v.template cast<double>(),
                                            folded_options(opts),
                                            resolve_scale(opts.scale, q.shape().D, who), stats ? &stats->values : nullptr,
                                            stats != nullptr);
  return detail::streamed_forward<double>(q.template cast<double>(), k.template cast<double>(),
                                          v.template cast<double>(), opts, resolve_scale(opts.scale, q.shape().D, who),
                                          stats ? &stats->values : nullptr, stats != nullptr);
}

double streamed_weight(const Tensor<double>& q, const Tensor<double>& k, const AttentionOptions& opts,
                       const RowStats& stats, Index b, Index h, Index i, Index j) {
  if (!visibility(opts, b, q.shape().T, k.shape().T, h).visible(i, j) || stats.sum(b, h, i) == 0) return 0;
  const double scale = resolve_scale(opts.scale, q.shape().D, "streamed_weight");
  const Index g = kv_head(h, q.shape().H, k.shape().H);
  // q_i and k_j as fold_queries and fold_keys have them: rotated, then q_i/τ.
  Eigen::RowVectorXd q_i = q.head(b, h).row(i), k_j = k.head(b, g).row(j);
  if (opts.qk_norm) {  // as fold_qk_norm has it
    const auto normalise = [&](Eigen::RowVectorXd& x, const std::vector<double>& w) {
      if (w.empty()) return;
      double ms = 0;
      for (Index c = 0; c < x.size(); ++c) ms += x(c) * x(c);
      ms /= double(x.size());
      const double rms = opts.qk_norm->eps_outside ? std::sqrt(ms) + opts.qk_norm->eps : std::sqrt(ms + opts.qk_norm->eps);
      for (Index c = 0; c < x.size(); ++c) x(c) = x(c) / rms * w[std::size_t(c)];
    };
    normalise(q_i, opts.qk_norm->q_weight);
    normalise(k_j, opts.qk_norm->k_weight);
  }
  if (opts.rope) {
    const Index T_q = q.shape().T, T_k = k.shape().T;
    const auto rotate = [&](Eigen::RowVectorXd& x, Index pos) {
      for (Index m = 0; m < opts.rope->rotary_dim / 2; ++m) {
        const double theta = opts.rope->angle(pos, m), c = std::cos(theta), sn = std::sin(theta);
        const auto [a, e] = opts.rope->pair(m);
        const double xa = x(a), xe = x(e);
        x(a) = xa * c - xe * sn;
        x(e) = xe * c + xa * sn;
      }
    };
    rotate(q_i, opts.rope->q_positions[std::size_t(b * T_q + i)]);
    rotate(k_j, opts.rope->k_positions[std::size_t(b * T_k + j)]);
  }
  if (opts.temperature) q_i /= (*opts.temperature)(b, h, i);
  const double s = modified_score<double>(q_i.dot(k_j) * scale,
                                          head_modifiers(folded_options(opts), b, h, q.shape().T, k.shape().T), i, j);
  return std::exp(s - stats.max(b, h, i)) / stats.sum(b, h, i);
}

#define ATTNCHECK_INSTANTIATE(S)                                                                              \
  template HeadTrace<S> attend(const Matrix<S>&, const Matrix<S>&, const Matrix<S>&, const BoolMask&,          \
                               std::optional<double>);                                                        \
  template HeadTrace<S> attend(const Matrix<S>&, const Matrix<S>&, const Matrix<S>&, const AdditiveMask&,      \
                               std::optional<double>);                                                        \
  template HeadTrace<S> attend(const Matrix<S>&, const Matrix<S>&, const Matrix<S>&, const BoolMask&, double,  \
                               const HeadModifiers&);                                                         \
  template ProjectionTrace<S> single_head_attention(const Matrix<S>&, const Matrix<S>&, const Matrix<S>&,     \
                                                    const Matrix<S>&, const AttentionOptions&);               \
  template Tensor<S> attention(const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, const AttentionOptions&, \
                               Tensor<S>*, Tensor<double>*);                                                  \
  template Tensor<S> attention(const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, const BoolMask&,         \
                               const AttentionOptions&, Tensor<S>*);                                          \
  template Tensor<S> attention(const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, const AdditiveMask&,     \
                               const AttentionOptions&, Tensor<S>*);                                          \
  template Tensor<double> oracle(const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, const AttentionOptions&, \
                                 Tensor<double>*, Tensor<double>*);                                           \
  template Tensor<double> streaming_oracle(const Tensor<S>&, const Tensor<S>&, const Tensor<S>&,              \
                                           const AttentionOptions&, RowStats*);                               \
  template Tensor<S> fold_temperature(const Tensor<S>&, const AttentionOptions&);                              \
  template Tensor<S> fold_rope(const Tensor<S>&, const Rope&, const std::vector<Index>&, const char*);         \
  template Tensor<S> fold_qk_norm(const Tensor<S>&, const QkNorm&, const std::vector<double>&, const char*);  \
  template Tensor<S> fold_queries(const Tensor<S>&, const AttentionOptions&, const char*);                     \
  template Tensor<S> fold_keys(const Tensor<S>&, const AttentionOptions&, const char*);

ATTNCHECK_INSTANTIATE(float)
ATTNCHECK_INSTANTIATE(double)
ATTNCHECK_INSTANTIATE(Eigen::half)
ATTNCHECK_INSTANTIATE(Eigen::bfloat16)

}  // namespace attncheck
