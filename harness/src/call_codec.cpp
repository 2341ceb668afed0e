// The exec: protocol's call codec (harness/PROTOCOL.md, "forward" and after): a call (a forward or backward frame)
// to and from a Problem, with every check a decoded frame must pass, and a result or gradients frame to and from
// an Outcome. The frames themselves and the handshake are protocol.cpp's.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <tuple>

#include "protocol.hpp"

namespace attncheck::wire {

DocIds doc_ids(const Problem& p) {
  DocIds ids;
  if (p.doc_bounds.empty()) return ids;
  const Index B = p.q.shape().B, T_q = p.q.shape().T, T_k = p.k.shape().T;
  if (Index(p.doc_bounds.size()) != B)
    throw std::logic_error("doc_ids: " + std::to_string(p.doc_bounds.size()) + " document bound lists for a batch of " +
                           std::to_string(B));
  const auto id = [](Index d) {
    if (d > std::numeric_limits<std::int32_t>::max())
      throw std::logic_error("doc_ids: document " + std::to_string(d) + " does not fit an int32");
    return std::int32_t(d);
  };
  ids.q.reserve(std::size_t(B * T_q));
  ids.k.reserve(std::size_t(B * T_k));
  for (Index b = 0; b < B; ++b) {
    const Visibility v = p.visibility(b);
    for (Index i = 0; i < T_q; ++i) ids.q.push_back(id(v.query_document(i)));
    for (Index j = 0; j < T_k; ++j) ids.k.push_back(id(document_of(p.doc_bounds[std::size_t(b)], j)));
  }
  return ids;
}

// The most document bounds a decoded frame may make beyond one per key id (empty documents repeat a bound): the
// bounds are allocated, and an id of 2^31 must be refused, not allocated.
constexpr std::int64_t kMaxExtraBounds = 1024;

std::vector<std::vector<Index>> doc_bounds_from_ids(const std::vector<std::int32_t>& k, Index B, Index T_k,
                                                    const std::string& what) {
  std::vector<std::vector<Index>> bounds(static_cast<std::size_t>(B));
  const std::int64_t budget = std::int64_t(k.size()) + kMaxExtraBounds;
  std::int64_t total = 0;
  for (Index b = 0; b < B; ++b) {
    std::int32_t before = 0;
    for (Index j = 0; j < T_k; ++j) {
      const std::int32_t id = k[std::size_t(b * T_k + j)];
      if (id < before)
        throw ProtocolError(what + ": k_doc_ids[" + std::to_string(b) + "][" + std::to_string(j) + "] is " +
                            std::to_string(id) + " (expected " +
                            (id < 0 ? std::string("an id >= 0") : ">= " + std::to_string(before) +
                                                                       ", the id of the key before it: key ids are "
                                                                       "non-decreasing") +
                            ")");
      total += id - before;
      if (total > budget)
        throw ProtocolError(what + ": k_doc_ids[" + std::to_string(b) + "][" + std::to_string(j) + "] is " +
                            std::to_string(id) + ", which makes more than " + std::to_string(budget) +
                            " document bounds in all (expected at most one per key id plus " +
                            std::to_string(kMaxExtraBounds) + ")");
      // A step from `before` to `id` at key j: id - before documents end at j (all but the last of them empty).
      bounds[std::size_t(b)].insert(bounds[std::size_t(b)].end(), std::size_t(id - before), j);
      before = id;
    }
  }
  return bounds;
}

namespace {
void put_shape(Writer& w, const Shape& s) {
  w.i64(s.B);
  w.i64(s.H);
  w.i64(s.T);
  w.i64(s.D);
}
std::array<std::int64_t, 4> get_shape(Reader& r) { return {r.i64(), r.i64(), r.i64(), r.i64()}; }
Shape checked_shape(const std::array<std::int64_t, 4>& a, const char* which, const char* frame) {
  for (const auto x : a)
    if (x < 1 || x > (std::int64_t{1} << 32))
      throw ProtocolError(std::string(frame) + ": " + which + " shape " + shape_string(a) +
                          " has an extent outside [1, 2^32]");
  return Shape{a[0], a[1], a[2], a[3]};
}
// Bytes of a tensor of raw shape `s`; a shape claiming more than 2^40 bytes is a protocol error, which also
// keeps the product from overflowing.
std::size_t nbytes(const std::array<std::int64_t, 4>& s, DType t, const char* frame = "result frame") {
  constexpr std::size_t kLimit = std::size_t{1} << 40;
  std::size_t n = element_size(t);
  for (const auto x : s) {
    if (x < 0) throw ProtocolError(std::string(frame) + ": shape " + shape_string(s) + " has a negative extent");
    if (x > 0 && n > kLimit / std::size_t(x))
      throw ProtocolError(std::string(frame) + ": shape " + shape_string(s) + " claims more than 2^40 bytes");
    n *= std::size_t(x);
  }
  return n;
}
}  // namespace

std::string shape_string(const std::array<std::int64_t, 4>& s) {
  return "[" + std::to_string(s[0]) + "," + std::to_string(s[1]) + "," + std::to_string(s[2]) + "," +
         std::to_string(s[3]) + "]";
}

std::string to_bytes(const Tensor<double>& t, DType dtype) {
  return visit_dtype(dtype, [&](auto tag) {
    using S = decltype(tag);
    const Tensor<S> native = t.template cast<S>();
    return std::string(reinterpret_cast<const char*>(native.data()), std::size_t(native.size()) * sizeof(S));
  });
}

Tensor<double> from_bytes(std::string_view bytes, const Shape& shape, DType dtype) {
  return visit_dtype(dtype, [&](auto tag) {
    using S = decltype(tag);
    Tensor<S> native(shape);
    if (bytes.size() != std::size_t(native.size()) * sizeof(S))
      throw ProtocolError("from_bytes: " + std::to_string(bytes.size()) + " bytes for a tensor of " +
                          std::to_string(native.size()) + " elements");
    std::memcpy(native.data(), bytes.data(), bytes.size());
    return native.template cast<double>();
  });
}

namespace {

// The paging of a paged problem and its K and V pools at p.dtype, as their raw bytes: what a paged frame carries.
struct WirePages {
  PagedKV layout;
  std::string k_pool, v_pool;
};
WirePages wire_pages(const Problem& p) {
  return visit_dtype(p.dtype, [&](auto tag) {
    using S = decltype(tag);
    const PagedPools<S> pools = paged_pools(p, p.k.template cast<S>(), p.v.template cast<S>());
    const auto bytes = [](const Tensor<S>& t) {
      return std::string(reinterpret_cast<const char*>(t.data()), std::size_t(t.size()) * sizeof(S));
    };
    return WirePages{pools.layout, bytes(pools.k), bytes(pools.v)};
  });
}

// The paging as a paged frame carries it: u32 layout, u32 0, i64 page size, pages and table width, the table.
void put_paging(Writer& w, const PagedKV& pk) {
  w.u32(pk.layout == PageLayout::token_major ? 1u : 2u);
  w.u32(0);
  w.i64(pk.page_size);
  w.i64(pk.num_pages);
  w.i64(pk.max_pages);
  w.raw(pk.block_table.data(), pk.block_table.size() * sizeof(std::int32_t));
}

// A dense mask as a frame carries it: i64 B, i64 H, then B·H·T_q·T_k bytes, 0 hidden and 1 visible (any cell
// not 0 is visible in the core; the wire says it with one value so that a decoder can refuse every other).
void put_cells(Writer& w, const DenseMask& m, Index T_q, Index T_k, const char* what) {
  if (m.T_q != T_q || m.T_k != T_k || m.cells.size() != std::size_t(m.B * m.H * T_q * T_k))
    throw std::logic_error(std::string("encode_forward: ") + what + " are [" + std::to_string(m.B) + "," +
                           std::to_string(m.H) + "," + std::to_string(m.T_q) + "," + std::to_string(m.T_k) +
                           "] with " + std::to_string(m.cells.size()) + " cells for T_q = " + std::to_string(T_q) +
                           ", T_k = " + std::to_string(T_k));
  w.i64(m.B);
  w.i64(m.H);
  std::string bytes(m.cells.size(), '\0');
  for (std::size_t n = 0; n < bytes.size(); ++n) bytes[n] = m.cells[n] != 0 ? '\1' : '\0';
  w.raw(bytes.data(), bytes.size());
}

// The fields a forward and a backward frame share: the call's options, shapes, key lengths, window, the
// modifiers, the masks beyond causal, the paging, then q, k, v (or q and the two pools).
std::string call_payload(const Problem& p) {
  Writer w;
  const bool paged = p.paged.has_value();
  w.u32(dtype_code(p.dtype));
  w.u32(alignment_code(p.alignment));
  w.u32((p.scale ? call_scale : 0u) | (p.want_weights ? call_weights : 0u) |
        (p.key_lengths.empty() && !paged ? 0u : call_key_lengths) | (p.window ? call_window : 0u) |
        (p.softcap ? call_softcap : 0u) | (p.alibi_slopes.empty() ? 0u : call_alibi) |
        (p.sinks.empty() ? 0u : call_sinks) | (p.want_lse ? call_lse : 0u) | (p.causal ? 0u : call_not_causal) |
        (paged ? call_paged : 0u) | (p.prefix_length != 0 ? call_prefix : 0u) |
        (p.window_right ? call_window_right : 0u) | (p.chunk_size != 0 ? call_chunk : 0u) |
        (p.doc_bounds.empty() ? 0u : call_documents) | (p.block_mask ? call_block_mask : 0u) |
        (p.dense_mask ? call_dense_mask : 0u) | (p.layout != InputLayout::contiguous ? call_layout : 0u) |
        (p.v_dim() != p.k.shape().D ? call_v_head_dim : 0u) | (p.bias ? call_bias : 0u) |
        (p.temperature ? call_temperature : 0u) | (p.rope ? call_rope : 0u) | (p.qk_norm ? call_qk_norm : 0u) |
        (p.dropout ? call_dropout : 0u) | (p.quant ? call_quant : 0u) | (p.quant && p.quant->q ? call_quant_q : 0u) |
        (p.index_list ? call_index_list : 0u) | (p.tree ? call_tree : 0u));
  if (paged && p.layout != InputLayout::contiguous)
    throw std::logic_error("encode_forward: a paged call with an input layout (paged K and V come as pools)");
  if (p.v.shape().B != p.k.shape().B || p.v.shape().H != p.k.shape().H || p.v.shape().T != p.k.shape().T)
    throw std::logic_error("encode_forward: v is " + to_string(p.v.shape()) + " for k " + to_string(p.k.shape()));
  w.u32(std::uint32_t(p.layout));  // 0 (reserved) for contiguous inputs
  w.f64(p.scale.value_or(0.0));
  put_shape(w, p.q.shape());
  put_shape(w, p.k.shape());
  if (p.v_dim() != p.k.shape().D) w.i64(p.v_dim());
  // A paged call always carries every sequence's length (T_k each without key padding).
  for (const Index len : paged ? p.sequence_lengths() : p.key_lengths) w.i64(len);
  if (p.window) w.i64(*p.window);
  if (p.softcap) w.f64(*p.softcap);
  const auto heads = [&](const std::vector<double>& xs, const char* what) {
    if (Index(xs.size()) != p.q.shape().H)
      throw std::logic_error(std::string("encode_forward: ") + std::to_string(xs.size()) + " " + what + " for " +
                             std::to_string(p.q.shape().H) + " query heads");
    for (const double x : xs) w.f64(x);
  };
  if (!p.alibi_slopes.empty()) heads(p.alibi_slopes, "ALiBi slopes");
  if (!p.sinks.empty()) heads(p.sinks, "sinks");
  // Masks beyond causal, each only when present: the prefix, the right window, the chunk size, the document ids.
  if (p.prefix_length != 0) w.i64(p.prefix_length);
  if (p.window_right) w.i64(*p.window_right);
  if (p.chunk_size != 0) w.i64(p.chunk_size);
  if (!p.doc_bounds.empty()) {
    const DocIds ids = doc_ids(p);
    w.raw(ids.q.data(), ids.q.size() * sizeof(std::int32_t));
    w.raw(ids.k.data(), ids.k.size() * sizeof(std::int32_t));
  }
  // The block mask, then the dense mask (PROTOCOL.md, "Block and dense masks"): cells as bytes 0 or 1.
  if (p.block_mask) {
    const BlockMask& m = *p.block_mask;
    for (const Index x : {m.block_q, m.block_k, m.B, m.H, m.q_blocks, m.k_blocks}) w.i64(x);
    if (m.kinds.size() != std::size_t(m.B * m.H * m.q_blocks * m.k_blocks))
      throw std::logic_error("encode_forward: a block mask with " + std::to_string(m.kinds.size()) + " kinds for " +
                             std::to_string(m.B) + " x " + std::to_string(m.H) + " x " + std::to_string(m.q_blocks) +
                             " x " + std::to_string(m.k_blocks) + " blocks");
    w.raw(m.kinds.data(), m.kinds.size());
    // No partial cells (no block is partial): B_p = H_p = 0 and no byte more.
    if (m.partial.cells.empty()) {
      w.i64(0);
      w.i64(0);
    } else {
      put_cells(w, m.partial, p.q.shape().T, p.k.shape().T, "the block mask's partial cells");
    }
  }
  if (p.dense_mask) put_cells(w, *p.dense_mask, p.q.shape().T, p.k.shape().T, "the dense mask");
  if (p.bias) {  // version 4 (PROTOCOL.md, "Additive bias"): i64 B_b, i64 H_b, then the values at the call's dtype
    const ScoreBias& b = *p.bias;
    if (b.T_q != p.q.shape().T || b.T_k != p.k.shape().T || b.values.size() != std::size_t(b.B * b.H * b.T_q * b.T_k))
      throw std::logic_error("encode_forward: a bias [" + std::to_string(b.B) + "," + std::to_string(b.H) + "," +
                             std::to_string(b.T_q) + "," + std::to_string(b.T_k) + "] with " +
                             std::to_string(b.values.size()) + " values for " + to_string(p.q.shape()));
    w.i64(b.B);
    w.i64(b.H);
    Tensor<double> t(Shape{b.B, b.H, b.T_q, b.T_k});
    std::copy(b.values.begin(), b.values.end(), t.data());
    w.bytes() += to_bytes(t, p.dtype);
  }
  if (p.temperature) {  // version 4 (PROTOCOL.md, "Temperature"): i64 B_t, i64 H_t, then B_t·H_t·T_q f64 values
    const QueryTemperature& t = *p.temperature;
    if (t.T_q != p.q.shape().T || t.values.size() != std::size_t(t.B * t.H * t.T_q))
      throw std::logic_error("encode_forward: a temperature [" + std::to_string(t.B) + "," + std::to_string(t.H) + "," +
                             std::to_string(t.T_q) + "] with " + std::to_string(t.values.size()) + " values for " +
                             to_string(p.q.shape()));
    w.i64(t.B);
    w.i64(t.H);
    for (const double x : t.values) w.f64(x);
  }
  if (p.rope) {  // version 4 (PROTOCOL.md, "Rotary embeddings"): its fields, then B·T_q and B·T_k i64 positions
    const Rope& r = *p.rope;
    w.u32(r.variant == RopeVariant::half_split ? 1u : 2u);
    w.u32(r.scaling == RopeScaling::linear ? 0u : r.scaling == RopeScaling::ntk ? 2u : 4u);  // plugin.h's codes
    w.i64(r.rotary_dim);
    w.f64(r.base);
    w.f64(r.factor);
    if (r.scaling == RopeScaling::llama3) {
      w.f64(r.low_freq_factor);
      w.f64(r.high_freq_factor);
      w.f64(r.original_max_position);
    }
    for (const Index x : r.q_positions) w.i64(x);
    for (const Index x : r.k_positions) w.i64(x);
  }
  if (p.qk_norm) {  // version 4 (PROTOCOL.md, "QK-norm"): u32 placement, u32 sides, f64 eps, then D f64 per side
    const QkNorm& n = *p.qk_norm;
    for (const std::vector<double>* weights : {&n.q_weight, &n.k_weight})
      if (!weights->empty() && Index(weights->size()) != p.q.shape().D)
        throw std::logic_error("encode_forward: QK-norm weights of " + std::to_string(weights->size()) + " for " +
                               to_string(p.q.shape()));
    w.u32(n.eps_outside ? 2u : 1u);
    w.u32((n.q_weight.empty() ? 0u : 1u) | (n.k_weight.empty() ? 0u : 2u));
    w.f64(n.eps);
    for (const double x : n.q_weight) w.f64(x);
    for (const double x : n.k_weight) w.f64(x);
  }
  if (p.dropout) {  // version 4 (PROTOCOL.md, "Dropout"): f64 p, u64 seed, u64 offset
    w.f64(p.dropout->p);
    w.u64(p.dropout->seed);
    w.u64(p.dropout->offset);
  }
  if (p.index_list) {  // version 4 (PROTOCOL.md, "Selected keys"): u32 space, u32 per, i64 block size, i64 heads,
    // i64 max_k, then B·heads·T_q·max_k × i32
    const IndexList& l = *p.index_list;
    const bool physical = l.physical && paged;  // the pool's slots (PROTOCOL.md: space 2)
    w.u32(physical ? 2 : 1);
    w.u32(l.H == p.k.shape().H ? 1u : 2u);  // per kv head, or per query head
    w.i64(l.block_size);
    w.i64(l.H);
    w.i64(l.max_k);
    const std::vector<std::int32_t> entries =
        physical ? physical_indices(l, p.paged_kv(), p.sequence_lengths()) : l.indices;
    w.raw(entries.data(), entries.size() * sizeof(std::int32_t));
  }
  if (p.tree) {  // version 4 (PROTOCOL.md, "Trees of draft tokens"): u32 form, u32 bit order, then B·T_q × i32
    // parents, or (B + 1) × i64 byte offsets and the bits
    const TokenTree& t = *p.tree;
    const bool bits = t.form == TokenTree::Form::bitmask;
    w.u32(bits ? 2 : 1);
    w.u32(bits ? (t.big_endian ? 2 : 1) : 0);
    if (!bits) {
      w.raw(t.parents.data(), t.parents.size() * sizeof(std::int32_t));
    } else {
      for (const Index o : t.offsets) w.i64(o);
      w.raw(t.bits.data(), std::size_t(t.offsets.back()));
    }
  }
  if (p.quant) {  // version 4 (PROTOCOL.md, "Quantised K and V"): u32 format; per side its scales; q; the codes
    const QuantizedKV& qk = *p.quant;
    // Paged too ("Paged quantised K and V"): the paging first, K's and V's scales and codes then the pools'.
    std::optional<std::array<QuantPool, 2>> pools;
    if (paged) {
      const PagedKV pk = p.paged_kv();
      put_paging(w, pk);
      const std::vector<Index> lengths = p.sequence_lengths();
      pools = {page_quant(qk.format, qk.k, p.k, lengths, pk), page_quant(qk.format, qk.v, p.v, lengths, pk)};
    }
    w.u32(std::uint32_t(qk.format));
    const bool blocked = quant_blocked(qk.format);
    std::vector<const QuantScales*> sides{pools ? &(*pools)[0].scales : &qk.k, pools ? &(*pools)[1].scales : &qk.v};
    if (qk.q) sides.push_back(&*qk.q);  // flag 16777216: Q's scales follow V's
    for (const QuantScales* s : sides) {
      w.u32(std::uint32_t(s->granularity));
      w.u32(s->zero_points.empty() ? 0u : 1u);
      if (blocked) continue;  // ggml's blocks hold their scales
      for (const double x : s->scales) w.f32(float(x));
      for (const double z : s->zero_points) {
        const std::int8_t b = std::int8_t(z);
        w.raw(&b, 1);
      }
    }
    if (qk.q) {  // q's codes in place of its values
      const std::vector<std::uint8_t> codes = quant_codes("encode_forward", "q", qk.format, *qk.q, p.q);
      w.raw(codes.data(), codes.size());
    } else {
      w.bytes() += to_bytes(p.q, p.dtype);
    }
    if (pools) {
      for (const QuantPool& pool : *pools) w.raw(pool.bytes.data(), pool.bytes.size());
      return std::move(w.bytes());
    }
    for (const auto& [s, t, name] : {std::tuple{&qk.k, &p.k, "k"}, {&qk.v, &p.v, "v"}}) {
      std::vector<std::uint8_t> codes = quant_codes("encode_forward", name, qk.format, *s, *t);
      if (blocked) codes = pack_blocks(qk.format, *s, t->shape(), codes);
      w.raw(codes.data(), codes.size());
    }
    return std::move(w.bytes());
  }
  if (!paged) {
    for (const Tensor<double>* t : {&p.q, &p.k, &p.v}) w.bytes() += to_bytes(*t, p.dtype);
    return std::move(w.bytes());
  }
  const WirePages pages = wire_pages(p);
  put_paging(w, pages.layout);
  w.bytes() += to_bytes(p.q, p.dtype);
  w.bytes() += pages.k_pool;
  w.bytes() += pages.v_pool;
  return std::move(w.bytes());
}

// T_k of a paged frame is at most the pool's capacity in keys or this, whichever is larger: the dense K and V
// (and the weights) a served implementation computes have T_k keys, which the frame does not carry, so an
// announced T_k of 2^32 must be refused, not allocated.
constexpr std::int64_t kMaxPagedFreeT = 4096;

// Bit equality, NaN included.
template <class S>
bool same_bits(S a, S b) {
  return std::memcmp(&a, &b, sizeof(S)) == 0 || (a != a && b != b);
}

// What every free slot (no live key there) of both pools holds, when that is one value and one of PageFill's;
// else zero (a pool from elsewhere may hold anything there: it is never read).
template <class S>
PageFill infer_fill(const Tensor<S>& k_pool, const Tensor<S>& v_pool, const PagedKV& pk,
                    const std::vector<Index>& lengths, Index H_kv, Index D, Index D_v) {
  std::vector<char> live(std::size_t(pk.num_pages * pk.page_size), 0);
  for (std::size_t b = 0; b < lengths.size(); ++b)
    for (Index t = 0; t < lengths[b]; ++t)
      live[std::size_t(pk.block_table[b * std::size_t(pk.max_pages) + std::size_t(t / pk.page_size)] * pk.page_size +
                       t % pk.page_size)] = 1;
  std::optional<S> seen;
  for (Index page = 0; page < pk.num_pages; ++page)
    for (Index slot = 0; slot < pk.page_size; ++slot) {
      if (live[std::size_t(page * pk.page_size + slot)]) continue;
      for (Index g = 0; g < H_kv; ++g)
        for (const auto& [pool, width] : {std::pair{&k_pool, D}, std::pair{&v_pool, D_v}})  // v's rows D_v wide
          for (Index d = 0; d < width; ++d) {
            const S x = pool->data()[pk.pool_offset(page, slot, g, d, H_kv, width)];
            if (!seen) seen = x;
            if (!same_bits(*seen, x)) return PageFill::zero;
          }
    }
  if (!seen) return PageFill::zero;
  const std::pair<PageFill, double> fills[] = {{PageFill::zero, 0.0},
                                               {PageFill::nan, std::numeric_limits<double>::quiet_NaN()},
                                               {PageFill::pos_inf, std::numeric_limits<double>::infinity()},
                                               {PageFill::neg_inf, -std::numeric_limits<double>::infinity()},
                                               {PageFill::huge, 1e30}};
  for (const auto& [fill, value] : fills)
    if (same_bits(*seen, S(value))) return fill;
  return PageFill::zero;
}

// A paged frame's paging: the plan holding the table as it came (its fill zero until the pools are read), checked
// against the frame's key lengths and k's shape.
PagedPlan read_paging(Reader& r, const char* what, const std::vector<Index>& lengths, const Shape& ks) {
  const auto fail = [&](const std::string& m) { throw ProtocolError(std::string(what) + ": " + m); };
  const std::uint32_t layout = r.u32(), reserved = r.u32();
  const std::int64_t page_size = r.i64(), num_pages = r.i64(), max_pages = r.i64();
  if (layout != 1 && layout != 2)
    fail("page layout " + std::to_string(layout) + " (expected 1 token-major or 2 head-major)");
  if (reserved != 0) fail("the paging's reserved field is " + std::to_string(reserved) + " (expected 0)");
  constexpr std::int64_t kMaxSeqLen = std::int64_t{1} << 20, kMaxCount = std::int64_t{1} << 32;
  if (page_size < 1 || page_size > kMaxSeqLen)
    fail("page size " + std::to_string(page_size) + " (expected in [1, 2^20])");
  if (num_pages < 1 || num_pages > kMaxCount) fail("num_pages " + std::to_string(num_pages) + " (expected in [1, 2^32])");
  if (max_pages < 1 || max_pages > kMaxCount) fail("max_pages " + std::to_string(max_pages) + " (expected in [1, 2^32])");
  // B·max_pages entries, bounded by what is left before anything is allocated (B·max_pages may reach 2^64).
  const Index B = ks.B;
  if (std::uint64_t(max_pages) > r.left() / sizeof(std::int32_t) / std::uint64_t(B))
    fail("a block table of " + std::to_string(B) + " x " + std::to_string(max_pages) + " entries but " +
         std::to_string(r.left()) + " bytes are left");
  PagedPlan plan;
  plan.page_size = page_size;
  plan.layout = layout == 1 ? PageLayout::token_major : PageLayout::head_major;
  plan.num_pages = num_pages;
  plan.max_pages = max_pages;
  plan.block_table.resize(std::size_t(B * max_pages));
  const std::string_view table = r.raw(plan.block_table.size() * sizeof(std::int32_t));
  std::memcpy(plan.block_table.data(), table.data(), table.size());
  PagedKV pk{page_size, plan.layout, num_pages, max_pages, plan.block_table, PageFill::zero};
  try {
    check_paged(pk, B, lengths);  // every live entry a page of the pool, every sequence within the table
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  }
  if (ks.T > std::max(kMaxPagedFreeT, num_pages * page_size))
    fail("T_k = " + std::to_string(ks.T) + " but the pool holds " + std::to_string(num_pages * page_size) +
         " keys (attncheck's server takes a paged T_k of at most the pool's keys or " +
         std::to_string(kMaxPagedFreeT) + ", whichever is larger)");
  return plan;
}

// A paged call's index list of the pool's slots (space 2) read back as key positions, once its table is read.
void slots_to_keys(Problem& p, const char* what) {
  if (!p.index_list || !p.index_list->physical) return;
  try {
    p.index_list->indices = logical_indices(*p.index_list, p.paged_kv(), p.sequence_lengths());
  } catch (const std::invalid_argument& e) {
    throw ProtocolError(std::string(what) + ": the " + e.what());
  }
}

// A paged frame's paging and pools (after the modifiers), read into p: the plan holding the table as it came,
// q, and dense k and v read back through the table. `lengths` are the frame's key lengths, `raw_q` q's shape.
void read_pages(Reader& r, const char* what, Problem& p, const std::vector<Index>& lengths,
                const std::array<std::int64_t, 4>& raw_q, const Shape& ks, const Shape& vs) {
  PagedPlan plan = read_paging(r, what, lengths, ks);
  const Index B = ks.B, num_pages = plan.num_pages, page_size = plan.page_size;
  const std::uint32_t layout = plan.layout == PageLayout::token_major ? 1u : 2u;
  const PagedKV pk{page_size, plan.layout, num_pages, plan.max_pages, plan.block_table, PageFill::zero};
  // The pools, k's rows D wide and v's D_v (a V head dimension of its own, flag 131072).
  const auto raw_pool = [&](Index width) {
    return layout == 1 ? std::array<std::int64_t, 4>{num_pages, page_size, ks.H, width}
                       : std::array<std::int64_t, 4>{num_pages, ks.H, page_size, width};
  };
  const std::size_t q_bytes = nbytes(raw_q, p.dtype, what), k_bytes = nbytes(raw_pool(ks.D), p.dtype, what),
                    v_bytes = nbytes(raw_pool(vs.D), p.dtype, what);
  p.q = from_bytes(r.raw(q_bytes), Shape{raw_q[0], raw_q[1], raw_q[2], raw_q[3]}, p.dtype);
  const std::string_view k_raw = r.raw(k_bytes), v_raw = r.raw(v_bytes);
  visit_dtype(p.dtype, [&](auto tag) {
    using S = decltype(tag);
    Tensor<S> k_pool(pk.pool_shape(ks.H, ks.D)), v_pool(pk.pool_shape(ks.H, vs.D));
    std::memcpy(k_pool.data(), k_raw.data(), k_raw.size());
    std::memcpy(v_pool.data(), v_raw.data(), v_raw.size());
    plan.fill = infer_fill(k_pool, v_pool, pk, lengths, ks.H, ks.D, vs.D);
    p.k = gather_pages(k_pool, pk, B, ks.H, ks.T, ks.D, lengths).template cast<double>();
    p.v = gather_pages(v_pool, pk, B, ks.H, ks.T, vs.D, lengths).template cast<double>();
  });
  p.paged = std::move(plan);
}

// The product of `extents` (each >= 1) when it is at most `limit`, else nullopt: a count the frame announces,
// checked against the bytes it has left before anything is allocated (four extents of 2^32 overflow 2^64).
std::optional<std::uint64_t> count_within(std::initializer_list<std::int64_t> extents, std::uint64_t limit) {
  std::uint64_t n = 1;
  for (const std::int64_t x : extents) {
    if (x < 1 || std::uint64_t(x) > limit / n) return std::nullopt;
    n *= std::uint64_t(x);
  }
  return n;
}

// B_m or H_m of a block or dense mask: the call's extent or 1 (a broadcast); `zero_ok` also takes 0 (the partial
// cells' "none").
void check_broadcast(const std::function<void(const std::string&)>& fail, const std::string& name, std::int64_t got,
                     Index call, const char* extent, bool zero_ok = false) {
  if (got == 1 || got == call || (zero_ok && got == 0)) return;
  fail(name + " is " + std::to_string(got) + " (expected " + (zero_ok ? "0 (no partial cells), " : "") +
       "1 (broadcast) or " + std::to_string(call) + ", the call's " + extent + ")");
}

// The cells of a dense mask [Bm, Hm, T_q, T_k] (Bm and Hm already read and checked), each byte 0 or 1.
DenseMask read_cells(Reader& r, const std::function<void(const std::string&)>& fail, const std::string& name,
                     Index Bm, Index Hm, const Shape& qs, const Shape& ks) {
  const auto n = count_within({Bm, Hm, qs.T, ks.T}, r.left());
  if (!n)
    fail(name + " of " + std::to_string(Bm) + " x " + std::to_string(Hm) + " x " + std::to_string(qs.T) + " x " +
         std::to_string(ks.T) + " cells but " + std::to_string(r.left()) + " bytes are left");
  DenseMask m;
  m.B = Bm;
  m.H = Hm;
  m.T_q = qs.T;
  m.T_k = ks.T;
  const std::string_view bytes = r.raw(std::size_t(*n));
  m.cells.assign(bytes.begin(), bytes.end());
  for (std::size_t at = 0; at < m.cells.size(); ++at)
    if (m.cells[at] > 1) {
      const Index j = Index(at) % ks.T, i = Index(at) / ks.T % qs.T, h = Index(at) / (ks.T * qs.T) % Hm,
                  b = Index(at) / (ks.T * qs.T * Hm);
      fail(name + "[" + std::to_string(b) + "][" + std::to_string(h) + "][" + std::to_string(i) + "][" +
           std::to_string(j) + "] is " + std::to_string(int(m.cells[at])) + " (expected 0 hidden or 1 visible)");
    }
  return m;
}

// The block mask (flag 16384) and the dense mask (flag 32768) of a frame, read into p and checked: block sizes in
// [1, 2^32], the number of blocks ceil(T / block), B and H the call's or 1, kinds 0, 1 or 2, partial cells present
// when a block is partial, every count within the bytes left.
void read_cell_masks(Reader& r, const char* what, std::uint32_t flags, Problem& p, const Shape& qs, const Shape& ks) {
  const std::function<void(const std::string&)> fail = [&](const std::string& m) {
    throw ProtocolError(std::string(what) + ": " + m);
  };
  if (flags & call_block_mask) {
    BlockMask m;
    m.block_q = r.i64();
    m.block_k = r.i64();
    m.B = r.i64();
    m.H = r.i64();
    m.q_blocks = r.i64();
    m.k_blocks = r.i64();
    constexpr std::int64_t kMaxBlock = std::int64_t{1} << 32;
    for (const auto& [x, name] : {std::pair{m.block_q, "block_q"}, std::pair{m.block_k, "block_k"}})
      if (x < 1 || x > kMaxBlock)
        fail(std::string("block mask ") + name + " is " + std::to_string(x) + " (expected in [1, 2^32] with flag 16384)");
    check_broadcast(fail, "block mask B", m.B, qs.B, "B");
    check_broadcast(fail, "block mask H", m.H, qs.H, "H (query heads)");
    const Index nq = (qs.T + m.block_q - 1) / m.block_q, nk = (ks.T + m.block_k - 1) / m.block_k;
    if (m.q_blocks != nq)
      fail("block mask has " + std::to_string(m.q_blocks) + " query blocks (expected " + std::to_string(nq) +
           " = ceil(T_q / block_q) = ceil(" + std::to_string(qs.T) + " / " + std::to_string(m.block_q) + "))");
    if (m.k_blocks != nk)
      fail("block mask has " + std::to_string(m.k_blocks) + " key blocks (expected " + std::to_string(nk) +
           " = ceil(T_k / block_k) = ceil(" + std::to_string(ks.T) + " / " + std::to_string(m.block_k) + "))");
    const auto n = count_within({m.B, m.H, nq, nk}, r.left());
    if (!n)
      fail("block mask kinds of " + std::to_string(m.B) + " x " + std::to_string(m.H) + " x " + std::to_string(nq) +
           " x " + std::to_string(nk) + " blocks but " + std::to_string(r.left()) + " bytes are left");
    const std::string_view kinds = r.raw(std::size_t(*n));
    m.kinds.assign(kinds.begin(), kinds.end());
    bool partial = false;
    for (std::size_t at = 0; at < m.kinds.size(); ++at) {
      if (m.kinds[at] > std::uint8_t(BlockKind::Full)) {
        const Index y = Index(at) % nk, x = Index(at) / nk % nq, h = Index(at) / (nk * nq) % m.H,
                    b = Index(at) / (nk * nq * m.H);
        fail("block mask kind [" + std::to_string(b) + "][" + std::to_string(h) + "][" + std::to_string(x) + "][" +
             std::to_string(y) + "] is " + std::to_string(int(m.kinds[at])) +
             " (expected 0 empty, 1 partial or 2 full)");
      }
      partial |= m.kinds[at] == std::uint8_t(BlockKind::Partial);
    }
    const std::int64_t Bp = r.i64(), Hp = r.i64();
    check_broadcast(fail, "block mask partial cells' B", Bp, qs.B, "B", true);
    check_broadcast(fail, "block mask partial cells' H", Hp, qs.H, "H (query heads)", true);
    if ((Bp == 0) != (Hp == 0))
      fail("block mask partial cells are " + std::to_string(Bp) + " x " + std::to_string(Hp) +
           " (expected both 0, no partial cells, or neither)");
    if (Bp == 0 && partial) fail("block mask has partial blocks but no partial cells (B_p = H_p = 0)");
    if (Bp != 0) m.partial = read_cells(r, fail, "block mask partial cells", Bp, Hp, qs, ks);
    p.block_mask = std::move(m);
  }
  if (flags & call_dense_mask) {
    const std::int64_t Bd = r.i64(), Hd = r.i64();
    check_broadcast(fail, "dense mask B", Bd, qs.B, "B");
    check_broadcast(fail, "dense mask H", Hd, qs.H, "H (query heads)");
    p.dense_mask = read_cells(r, fail, "dense mask", Bd, Hd, qs, ks);
  }
}

void read_documents(Reader& r, const char* what, Problem& p, const Shape& qs, const Shape& ks);

// The additive bias of a frame (flag 262144): B_b and H_b, each the call's or 1, then B_b·H_b·T_q·T_k values at the
// call's dtype (r.raw refuses a count the bytes left cannot hold); check_call then says whether each is finite.
ScoreBias read_bias(Reader& r, const char* what, DType dtype, const Shape& qs, const Shape& ks) {
  const auto fail = [&](const std::string& m) { throw ProtocolError(std::string(what) + ": " + m); };
  const std::int64_t Bb = r.i64(), Hb = r.i64();
  check_broadcast(fail, "bias B", Bb, qs.B, "B");
  check_broadcast(fail, "bias H", Hb, qs.H, "H (query heads)");
  const Shape s{Bb, Hb, qs.T, ks.T};
  const Tensor<double> t = from_bytes(r.raw(std::size_t(s.numel()) * element_size(dtype)), s, dtype);
  return ScoreBias{.B = Bb, .H = Hb, .T_q = qs.T, .T_k = ks.T, .values = {t.data(), t.data() + t.size()}};
}

// The per-query temperature of a frame (flag 524288): B_t and H_t, each the call's or 1, then B_t·H_t·T_q f64 values
// (r.raw refuses a count the bytes left cannot hold); check_call then says whether each is finite and > 0.
QueryTemperature read_temperature(Reader& r, const char* what, const Shape& qs) {
  const auto fail = [&](const std::string& m) { throw ProtocolError(std::string(what) + ": " + m); };
  const std::int64_t Bt = r.i64(), Ht = r.i64();
  check_broadcast(fail, "temperature B", Bt, qs.B, "B");
  check_broadcast(fail, "temperature H", Ht, qs.H, "H (query heads)");
  const Shape s{Bt, Ht, qs.T, 1};
  const Tensor<double> t = from_bytes(r.raw(std::size_t(s.numel()) * 8), s, DType::f64);
  return QueryTemperature{.B = Bt, .H = Ht, .T_q = qs.T, .values = {t.data(), t.data() + t.size()}};
}

// The rope of a frame (flag 1048576): u32 variant (1 half-split, 2 interleaved), u32 scaling (0 none or linear by the
// factor, 2 NTK-aware, 4 Llama 3's), i64 rotary_dim, f64 base, f64 factor, with Llama 3's f64 low_freq_factor,
// high_freq_factor and original_max_position, then B·T_q and B·T_k i64 positions (r.raw refuses a count the bytes left
// cannot hold); check_call then says whether each field and position is allowed.
Rope read_rope(Reader& r, const char* what, const Shape& qs, const Shape& ks) {
  const std::uint32_t variant = r.u32(), scaling = r.u32();
  if ((variant != 1 && variant != 2) || (scaling != 0 && scaling != 2 && scaling != 4))
    throw ProtocolError(std::string(what) + ": rope variant " + std::to_string(variant) + " and scaling " +
                        std::to_string(scaling) +
                        " (expected 1 half-split or 2 interleaved, and 0 none or linear, 2 NTK or 4 Llama 3)");
  Rope rope{.variant = variant == 1 ? RopeVariant::half_split : RopeVariant::interleaved};
  rope.scaling = scaling == 0 ? RopeScaling::linear : scaling == 2 ? RopeScaling::ntk : RopeScaling::llama3;
  rope.rotary_dim = r.i64();
  rope.base = r.f64();
  rope.factor = r.f64();
  if (rope.scaling == RopeScaling::llama3) {
    rope.low_freq_factor = r.f64();
    rope.high_freq_factor = r.f64();
    rope.original_max_position = r.f64();
  }
  // B·T positions, bounded by what is left before anything is allocated (the product may reach 2^64).
  const auto positions = [&](Index T, const char* name) {
    if (std::uint64_t(T) > r.left() / 8 / std::uint64_t(std::max<Index>(qs.B, 1)))
      throw ProtocolError(std::string(what) + ": rope " + name + " of " + std::to_string(qs.B) + " x " +
                          std::to_string(T) + " positions but " + std::to_string(r.left()) + " bytes are left");
    const Index n = qs.B * T;
    const std::string_view raw = r.raw(std::size_t(n) * 8);
    std::vector<Index> out(static_cast<std::size_t>(n));
    for (Index i = 0; i < n; ++i) {
      std::int64_t x;
      std::memcpy(&x, raw.data() + 8 * i, 8);
      out[std::size_t(i)] = x;
    }
    return out;
  };
  rope.q_positions = positions(qs.T, "q_positions");
  rope.k_positions = positions(ks.T, "k_positions");
  return rope;
}

// The QK-norm of a frame (flag 2097152): u32 placement (1 eps in the root, 2 outside), u32 sides (1 q, 2 k, 3 both),
// f64 eps, then D f64 weights for each side present (r.raw refuses what the bytes left cannot hold); check_call then
// says whether eps and each weight are allowed.
QkNorm read_qk_norm(Reader& r, const char* what, const Shape& qs) {
  const std::uint32_t placement = r.u32(), sides = r.u32();
  if ((placement != 1 && placement != 2) || sides == 0 || sides > 3)
    throw ProtocolError(std::string(what) + ": QK-norm placement " + std::to_string(placement) + " and sides " +
                        std::to_string(sides) + " (expected 1 eps in the root or 2 outside, and 1 q, 2 k or 3 both)");
  QkNorm n{.eps = r.f64(), .eps_outside = placement == 2};
  const auto weights = [&] {
    const std::string_view raw = r.raw(std::size_t(qs.D) * 8);
    std::vector<double> w(static_cast<std::size_t>(qs.D));
    std::memcpy(w.data(), raw.data(), raw.size());
    return w;
  };
  if (sides & 1) n.q_weight = weights();
  if (sides & 2) n.k_weight = weights();
  return n;
}

// The masks beyond causal of a frame (flags 1024 to 32768), read into p: the prefix, the right window, the chunk
// size, the document ids turned back into doc_bounds (the query ids checked against them), the block mask and the
// dense mask.
void read_masks(Reader& r, const char* what, std::uint32_t flags, Problem& p, const Shape& qs, const Shape& ks) {
  const auto fail = [&](const std::string& m) { throw ProtocolError(std::string(what) + ": " + m); };
  if (flags & call_prefix) {
    const std::int64_t prefix = r.i64();
    if (prefix < 1) fail("prefix length " + std::to_string(prefix) + " (expected >= 1 with flag 1024)");
    p.prefix_length = prefix;
  }
  if (flags & call_window_right) {
    const std::int64_t wr = r.i64();
    if (wr < 0) fail("right window " + std::to_string(wr) + " (expected >= 0 with flag 2048)");
    p.window_right = wr;
  }
  if (flags & call_chunk) {
    const std::int64_t chunk = r.i64();
    if (chunk < 1) fail("chunk size " + std::to_string(chunk) + " (expected >= 1 with flag 4096)");
    p.chunk_size = chunk;
  }
  if (flags & call_documents) read_documents(r, what, p, qs, ks);
  read_cell_masks(r, what, flags, p, qs, ks);
}

// The document ids of a frame with flag 8192, turned back into doc_bounds, and into q_doc_bounds where the query ids
// are not the ones the keys' documents give each query's aligned position (documents with query lengths of their
// own: non-decreasing, and naming documents the key ids make).
void read_documents(Reader& r, const char* what, Problem& p, const Shape& qs, const Shape& ks) {
  const auto fail = [&](const std::string& m) { throw ProtocolError(std::string(what) + ": " + m); };
  // B·T_q and B·T_k ids, bounded by what is left before anything is allocated (each product may reach 2^64).
  const auto ids = [&](Index T, const char* name) {
    if (std::uint64_t(T) > r.left() / sizeof(std::int32_t) / std::uint64_t(qs.B))
      fail(std::string(name) + " of " + std::to_string(qs.B) + " x " + std::to_string(T) + " ids but " +
           std::to_string(r.left()) + " bytes are left");
    std::vector<std::int32_t> xs(std::size_t(qs.B * T));
    const std::string_view bytes = r.raw(xs.size() * sizeof(std::int32_t));
    std::memcpy(xs.data(), bytes.data(), bytes.size());
    return xs;
  };
  const std::vector<std::int32_t> q_ids = ids(qs.T, "q_doc_ids"), k_ids = ids(ks.T, "k_doc_ids");
  p.doc_bounds = doc_bounds_from_ids(k_ids, qs.B, ks.T, what);
  bool derived = true;
  for (Index b = 0; b < qs.B && derived; ++b) {
    const Visibility v{.T_q = qs.T, .T_k = ks.T, .alignment = p.alignment, .doc_bounds = &p.doc_bounds[std::size_t(b)]};
    for (Index i = 0; i < qs.T && derived; ++i) derived = q_ids[std::size_t(b * qs.T + i)] == v.query_document(i);
  }
  if (derived) return;
  p.q_doc_bounds.assign(std::size_t(qs.B), {});
  for (Index b = 0; b < qs.B; ++b) {
    std::vector<Index>& kb = p.doc_bounds[std::size_t(b)];
    std::vector<Index>& qb = p.q_doc_bounds[std::size_t(b)];
    Index before = 0;
    for (Index i = 0; i < qs.T; ++i) {
      const std::int32_t id = q_ids[std::size_t(b * qs.T + i)];
      if (id < before)
        fail("q_doc_ids[" + std::to_string(b) + "][" + std::to_string(i) + "] is " + std::to_string(id) +
             (i == 0 ? std::string(" (expected an id >= 0)")
                     : " (expected >= " + std::to_string(before) +
                           ", the id of the query before it: query ids are non-decreasing)"));
      // Documents past the last key's are empty ones at the end (key ids cannot name them): bounds at T_k.
      if (id > Index(kb.size()) + kMaxExtraBounds)
        fail("q_doc_ids[" + std::to_string(b) + "][" + std::to_string(i) + "] is " + std::to_string(id) +
             " (expected at most " + std::to_string(Index(kb.size()) + kMaxExtraBounds) + ": the last key's document " +
             std::to_string(kb.size()) + " plus " + std::to_string(kMaxExtraBounds) + " empty ones)");
      for (; before < id; ++before) qb.push_back(i);  // documents before .. id - 1 end before query i
    }
    if (Index(qb.size()) > Index(kb.size())) kb.resize(qb.size(), ks.T);
    for (; qb.size() < kb.size();) qb.push_back(qs.T);  // the documents past the last query have none
  }
}

// A quantised frame's cache (after the modifiers): the format, each side's granularity, scales and zero points, then q
// at the dtype and K's and V's codes, read into p (k and v their dequantised values). Paged too (`paged_lengths` the
// frame's key lengths): the paging first, and K's and V's scales and codes their pools', read back through the table.
void read_quant(Reader& r, const char* what, Problem& p, const std::array<std::int64_t, 4>& raw_q, const Shape& ks,
                const Shape& vs, bool q_quantised, const std::vector<Index>* paged_lengths) {
  std::optional<PagedPlan> plan;
  std::optional<PagedKV> pk;
  if (paged_lengths) {
    plan = read_paging(r, what, *paged_lengths, ks);
    pk = PagedKV{plan->page_size, plan->layout, plan->num_pages, plan->max_pages, plan->block_table, PageFill::zero};
  }
  const std::uint32_t format = r.u32();
  if (format < 1 || format > 8)
    throw ProtocolError(
        std::string(what) + ": quantised format " + std::to_string(format) +
        " (expected 1 e4m3fn, 2 e5m2, 3 int8, or ggml's blocks: 4 q8_0, 5 q4_0, 6 q4_1, 7 q5_0, 8 q5_1)");
  QuantizedKV qk;
  qk.format = QuantFormat(format);
  const bool blocked = quant_blocked(qk.format);
  const Shape qs{raw_q[0], raw_q[1], raw_q[2], raw_q[3]};
  if (q_quantised && blocked)
    throw ProtocolError(std::string(what) + ": flags have 16777216 (quantised Q) with ggml's " +
                        std::string(quant_format_name(qk.format)) + " blocks: a quantised Q comes in FP8 or int8");
  if (q_quantised) qk.q = QuantScales{};
  std::vector<std::tuple<QuantScales*, const Shape*, const char*>> sides{{&qk.k, &ks, "k"}, {&qk.v, &vs, "v"}};
  if (q_quantised) sides.push_back({&*qk.q, &qs, "q"});
  for (const auto& [s, shape, side] : sides) {
    const std::uint32_t g = r.u32(), zp = r.u32();
    if (blocked ? g != 3 : g > 2)
      throw ProtocolError(std::string(what) + ": the quantised " + side + "'s granularity is " + std::to_string(g) +
                          (blocked ? " (expected 3: ggml's blocks hold their scales)"
                                   : " (expected 0 per tensor, 1 per kv head or 2 per token and kv head)"));
    if (blocked && shape->D % kQuantBlock != 0)
      throw ProtocolError(std::string(what) + ": ggml's blocks need D a multiple of 32, but the quantised " + side +
                          " has D = " + std::to_string(shape->D));
    if (zp > (s == &qk.k || s == &qk.v ? 1u : 0u))
      throw ProtocolError(std::string(what) + ": the quantised " + side + "'s zero-point flag is " +
                          std::to_string(zp) +
                          (s == &qk.k || s == &qk.v ? " (expected 0 or 1)" : " (expected 0: q has none)"));
    const bool pooled = pk && (s == &qk.k || s == &qk.v);  // over the pool's first three axes
    *s = pooled ? quant_pool_extents(QuantGranularity(g), *pk, shape->H) : quant_extents(QuantGranularity(g), *shape);
    if (blocked) continue;  // the scales come in the blocks
    const std::size_t n = std::size_t(s->B * s->H * s->T);
    for (std::size_t i = 0; i < n; ++i) s->scales.push_back(double(r.f32()));
    if (zp)
      for (std::size_t i = 0; i < n; ++i) s->zero_points.push_back(double(std::int8_t(r.raw(1)[0])));
  }
  std::vector<std::tuple<QuantScales*, const Shape*, Tensor<double>*, const char*>> codes_of{{&qk.k, &ks, &p.k, "k"},
                                                                                             {&qk.v, &vs, &p.v, "v"}};
  if (q_quantised) {  // q's codes in place of its values, first
    codes_of.insert(codes_of.begin(), {&*qk.q, &qs, &p.q, "q"});
  } else {
    const std::size_t q_bytes = nbytes(raw_q, p.dtype, what);
    p.q = from_bytes(r.raw(q_bytes), qs, p.dtype);
  }
  for (const auto& [s, shape, t, side] : codes_of) {
    if (pk && (s == &qk.k || s == &qk.v)) {  // the pool's rows, read back through the table
      QuantPool pool;
      pool.shape = pk->pool_shape(shape->H, shape->D);
      pool.row_bytes = blocked ? shape->D / kQuantBlock * Index(quant_block_bytes(qk.format)) : shape->D;
      pool.scales = std::move(*s);
      const std::optional<std::uint64_t> n =
          count_within({pk->num_pages, pk->page_size, shape->H, pool.row_bytes}, r.left());
      if (!n)
        throw ProtocolError(std::string(what) + ": the quantised " + side + "'s pool of " +
                            std::to_string(pk->num_pages) + " pages of " + std::to_string(pk->page_size) +
                            " keys does not fit the " + std::to_string(r.left()) + " bytes left");
      const std::string_view bytes = r.raw(std::size_t(*n));
      pool.bytes.assign(bytes.begin(), bytes.end());
      try {
        *t = unpage_quant(qk.format, pool, *pk, shape->B, shape->T, *paged_lengths, *s);
      } catch (const std::invalid_argument& e) {
        throw ProtocolError(std::string(what) + ": " + e.what());
      }
      // What the free slots hold, as attncheck fills them (0 bytes, or 0xFF with a per-token scale of the fill's
      // value): the plan's fill, so that a problem sent on is sent alike.
      if (s == &qk.k) {
        std::vector<char> live(std::size_t(pk->num_pages * pk->page_size), 0);
        for (std::size_t b = 0; b < paged_lengths->size(); ++b)
          for (Index tt = 0; tt < (*paged_lengths)[b]; ++tt)
            live[std::size_t(pk->block_table[b * std::size_t(pk->max_pages) + std::size_t(tt / pk->page_size)] *
                                 pk->page_size +
                             tt % pk->page_size)] = 1;
        const auto free_slot = std::find(live.begin(), live.end(), 0);
        if (free_slot != live.end()) {
          const Index page = Index(free_slot - live.begin()) / pk->page_size,
                      slot = Index(free_slot - live.begin()) % pk->page_size;
          if (pool.bytes[pool.row(*pk, page, slot, 0)] == 0xFF) {
            plan->fill = PageFill::nan;
            if (pool.scales.granularity == QuantGranularity::token_head && !blocked) {
              const double x = pool.scales.scales[pool.scale_at(*pk, page, slot, 0)];
              plan->fill = std::isnan(x)   ? PageFill::nan
                           : x == 1e30     ? PageFill::huge
                           : std::isinf(x) ? (x > 0 ? PageFill::pos_inf : PageFill::neg_inf)
                                           : PageFill::nan;
            }
          }
        }
      }
      // Every live key's value finite (its code not a NaN or an infinity, its block's d and m finite), every live
      // scale a scale: free slots hold anything.
      for (Index i = 0; i < t->size(); ++i)
        if (!std::isfinite(t->values()[i])) {
          const Shape& sh = t->shape();
          const Index c = i % sh.D, tt = i / sh.D % sh.T, h = i / sh.D / sh.T % sh.H, b = i / sh.D / sh.T / sh.H;
          throw ProtocolError(std::string(what) + ": the quantised " + side + "'s key " + std::to_string(tt) +
                              " of sequence " + std::to_string(b) + " (kv head " + std::to_string(h) + ", element " +
                              std::to_string(c) + ") is " + format_number(t->values()[i]) +
                              " in its pool, not a finite " + std::string(quant_format_name(qk.format)) + " value");
        }
      if (!blocked) try {
          check_quant_scales(what, side, qk.format, *s, *shape);
        } catch (const std::invalid_argument& e) {
          throw ProtocolError(e.what());
        }
      continue;
    }
    if (blocked) {  // B·H_kv·T_k·D/32 blocks; their scales and minimums read out of them
      const std::size_t n = std::size_t(shape->B * shape->H * shape->T * (shape->D / kQuantBlock));
      const std::string_view bytes = r.raw(n * quant_block_bytes(qk.format));
      const std::vector<std::uint8_t> codes =
          unpack_blocks(qk.format, *shape, reinterpret_cast<const std::uint8_t*>(bytes.data()), *s);
      for (const double x : s->scales)
        if (!std::isfinite(x))
          throw ProtocolError(std::string(what) + ": the quantised " + side + " has a block scale of " +
                              format_number(x) + ", not a finite float16");
      for (const double x : s->mins)
        if (!std::isfinite(x))
          throw ProtocolError(std::string(what) + ": the quantised " + side + " has a block minimum of " +
                              format_number(x) + ", not a finite float16");
      *t = dequantize(qk.format, *s, *shape, codes.data());
      continue;
    }
    try {
      check_quant_scales(what, side, qk.format, *s, *shape);
    } catch (const std::invalid_argument& e) {
      throw ProtocolError(e.what());
    }
    const std::string_view bytes = r.raw(std::size_t(shape->numel()));
    for (std::size_t i = 0; i < bytes.size(); ++i)
      if (!std::isfinite(quant_value(qk.format, std::uint8_t(bytes[i])))) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", unsigned(std::uint8_t(bytes[i])));
        throw ProtocolError(std::string(what) + ": the quantised " + side + "'s code " + std::to_string(i) + " is " +
                            hex + ", not a finite " + std::string(quant_format_name(qk.format)) + " value");
      }
    *t = dequantize(qk.format, *s, *shape, reinterpret_cast<const std::uint8_t*>(bytes.data()));
  }
  p.quant = std::move(qk);
  if (plan) p.paged = std::move(plan);
}

// The call as the core checks it (check_call), its refusal a ProtocolError.
Problem checked(Problem p, const char* what) {
  try {
    check_call(what, p);
  } catch (const std::invalid_argument& e) {  // ShapeError, ValueError
    throw ProtocolError(e.what());
  }
  return p;
}

Problem read_call(Reader& r, const char* what, bool backward) {
  Problem p;
  p.dtype = dtype_from_code(r.u32());
  p.alignment = alignment_from_code(r.u32());
  const std::uint32_t flags = r.u32();
  if (flags & ~kCallFlags)
    throw ProtocolError(
        std::string(what) + ": flags are " + std::to_string(flags) +
        " (expected bits within 0x7ffffff: 1 scale, 2 weights, 4 key lengths, 8 window, 16 softcap, "
        "32 ALiBi, 64 sinks, 128 LSE, 256 not causal, 512 paged, 1024 prefix, 2048 right window, "
        "4096 chunk, 8192 documents, 16384 block mask, 32768 dense mask, 65536 layout, 131072 V head "
        "dimension, 262144 bias, 524288 temperature, 1048576 rope, 2097152 QK-norm, 4194304 dropout, 8388608 "
        "quantised K and V, 16777216 quantised Q, 33554432 index list, 67108864 tree)");
  if ((flags & call_paged) && backward)
    throw ProtocolError(std::string(what) + ": flags have 512 (paged), but paged calls are forward only");
  if ((flags & call_paged) && !(flags & call_key_lengths))
    throw ProtocolError(std::string(what) + ": flags have 512 (paged) without 4 (key lengths): a paged call "
                        "carries every sequence's length");
  const std::uint32_t layout = r.u32();  // reserved (0) without flag 65536
  if (flags & call_layout) {
    if (layout < 1 || layout > std::uint32_t(InputLayout::v_is_k))
      throw ProtocolError(std::string(what) + ": layout " + std::to_string(layout) +
                          " (expected 1 token-major, 2 padded, 3 kv-broadcast, 4 kv-interleaved or 5 v-is-k with flag "
                          "65536)");
    if (flags & call_paged)
      throw ProtocolError(std::string(what) + ": flags have 65536 (layout) and 512 (paged): paged K and V come as pools");
    p.layout = InputLayout(layout);
  }
  const double scale = r.f64();
  if (flags & call_scale) p.scale = scale;
  p.want_weights = flags & call_weights;
  p.want_lse = flags & call_lse;
  p.causal = !(flags & call_not_causal);
  const auto raw_q = get_shape(r), raw_k = get_shape(r);
  const Shape qs = checked_shape(raw_q, "q", what), ks = checked_shape(raw_k, "k", what);
  if (ks.B != qs.B || ks.D != qs.D || qs.H % ks.H != 0)
    throw ProtocolError(std::string(what) + ": q is " + to_string(qs) + " and k is " + to_string(ks) +
                        " (expected the same B and D, and k's heads dividing q's)");
  Shape vs = ks;  // v [B,H_kv,T_k,D_v]: D_v follows k's shape with flag 131072
  if (flags & call_v_head_dim) {
    constexpr std::int64_t kMaxExtent = std::int64_t{1} << 16;  // as the caps frame's head dims
    const std::int64_t d_v = r.i64();
    if (d_v < 1 || d_v > kMaxExtent || d_v == ks.D)
      throw ProtocolError(std::string(what) + ": V head dimension " + std::to_string(d_v) + " (expected in [1, " +
                          std::to_string(kMaxExtent) + "] and other than D = " + std::to_string(ks.D) + " with flag 131072)");
    vs.D = d_v;
  }
  // The fields as they come; what their values must be (ranges, counts, order) is check_call's, below.
  if (flags & call_key_lengths)
    for (Index b = 0; b < qs.B; ++b) p.key_lengths.push_back(r.i64());
  if (flags & call_window) p.window = r.i64();
  if (flags & call_softcap) p.softcap = r.f64();
  const auto heads = [&] {
    std::vector<double> xs;
    for (Index h = 0; h < qs.H; ++h) xs.push_back(r.f64());
    return xs;
  };
  if (flags & call_alibi) p.alibi_slopes = heads();
  if (flags & call_sinks) p.sinks = heads();
  try {  // now, before the masks and pages that read the lengths (the masks are not read yet: empty here)
    check_options(what, p.options(), qs.B, qs.H, ks.T, qs.T);
  } catch (const std::invalid_argument& e) {  // ShapeError, ValueError
    throw ProtocolError(e.what());
  }
  read_masks(r, what, flags, p, qs, ks);
  if (flags & call_bias) p.bias = read_bias(r, what, p.dtype, qs, ks);
  if (flags & call_temperature) p.temperature = read_temperature(r, what, qs);
  if (flags & call_rope) p.rope = read_rope(r, what, qs, ks);
  if (flags & call_qk_norm) p.qk_norm = read_qk_norm(r, what, qs);
  if (flags & call_dropout) {  // f64 p, u64 seed, u64 offset; check_call says whether p is allowed
    Dropout d;
    d.p = r.f64();
    d.seed = r.u64();
    d.offset = r.u64();
    p.dropout = d;
  }
  if (flags & call_index_list) {  // u32 space, u32 per, i64 block size, i64 heads, i64 max_k, the entries
    const std::uint32_t space = r.u32(), per = r.u32();
    const std::int64_t block_size = r.i64(), heads = r.i64(), max_k = r.i64();
    const auto fail = [&](const std::string& m) { throw ProtocolError(std::string(what) + ": the index list's " + m); };
    if (space != 1 && space != 2)
      fail("space is " + std::to_string(space) + " (expected 1, key positions, or 2, slots of the pool)");
    if (space == 2 && (!(flags & call_paged) || block_size != 1))
      fail("space is 2 (slots of the pool) but the call is " +
           std::string(!(flags & call_paged) ? "not paged (flag 512)" : "of blocks") +
           " (expected space 1, or key indices of a paged call)");
    if (per != 1 && per != 2)
      fail("per is " + std::to_string(per) + " (expected 1, one list per kv head, or 2, one per query head)");
    const Index list_heads = per == 1 ? ks.H : qs.H;
    if (heads != list_heads)
      fail("heads are " + std::to_string(heads) + " (expected " + (per == 1 ? "H_kv = " : "H = ") +
           std::to_string(list_heads) + ")");
    if (block_size < 1 || block_size > (std::int64_t{1} << 32))
      fail("block size is " + std::to_string(block_size) + " (expected in [1, 2^32])");
    if (max_k < 0 || std::uint64_t(max_k) > r.left() / sizeof(std::int32_t) / std::uint64_t(qs.B * list_heads * qs.T))
      fail("width max_k is " + std::to_string(max_k) + " but " + std::to_string(r.left()) + " bytes are left");
    IndexList l{.block_size = block_size,
                .group = qs.H / list_heads,
                .B = qs.B,
                .H = list_heads,
                .T_q = qs.T,
                .max_k = max_k,
                .indices = std::vector<std::int32_t>(std::size_t(qs.B * list_heads * qs.T * max_k))};
    const std::string_view bytes = r.raw(l.indices.size() * sizeof(std::int32_t));
    std::memcpy(l.indices.data(), bytes.data(), bytes.size());
    l.physical = space == 2;      // slots until the pool is read (to_logical_indices)
    p.index_list = std::move(l);  // the entries' range is check_call's
  }
  if (flags & call_tree) {  // u32 form, u32 bit order, then the parents, or the offsets and the bits
    const std::uint32_t form = r.u32(), order = r.u32();
    const auto fail = [&](const std::string& m) { throw ProtocolError(std::string(what) + ": the tree's " + m); };
    if (form != 1 && form != 2) fail("form is " + std::to_string(form) + " (expected 1 parents or 2 a bitmask)");
    if (form == 1 && order != 0) fail("bit order is " + std::to_string(order) + " with parents (expected 0)");
    if (form == 2 && order != 1 && order != 2)
      fail("bit order is " + std::to_string(order) + " (expected 1 least significant bit first or 2 most)");
    TokenTree t{.form = form == 1 ? TokenTree::Form::parents : TokenTree::Form::bitmask,
                .big_endian = order == 2,
                .B = qs.B,
                .T_q = qs.T};
    if (form == 1) {
      const std::string_view bytes = r.raw(std::size_t(qs.B * qs.T) * sizeof(std::int32_t));
      t.parents.resize(std::size_t(qs.B * qs.T));
      std::memcpy(t.parents.data(), bytes.data(), bytes.size());
    } else {
      for (Index b = 0; b <= qs.B; ++b) t.offsets.push_back(r.i64());
      const std::int64_t n = t.offsets.back();
      if (n < 0 || std::uint64_t(n) > r.left())
        fail("bits are " + std::to_string(n) + " bytes but " + std::to_string(r.left()) + " bytes are left");
      const std::string_view bytes = r.raw(std::size_t(n));
      t.bits.assign(bytes.begin(), bytes.end());
    }
    p.tree = std::move(t);  // the parents and offsets are check_call's
  }
  if ((flags & call_quant_q) && !(flags & call_quant))
    throw ProtocolError(std::string(what) +
                        ": flags have 16777216 (quantised Q) without 8388608 (quantised K and V): "
                        "Q comes quantised only with its cache");
  if (flags & call_quant) {
    if (flags & call_layout)
      throw ProtocolError(std::string(what) +
                          ": flags have 8388608 (quantised K and V) with 65536 (layout): a quantised cache comes as "
                          "contiguous codes (or its pools)");
    if (backward)
      throw ProtocolError(std::string(what) +
                          ": flags have 8388608 (quantised K and V), but quantised "
                          "calls are forward only");
    read_quant(r, what, p, raw_q, ks, vs, flags & call_quant_q, (flags & call_paged) ? &p.key_lengths : nullptr);
    if (flags & call_paged) slots_to_keys(p, what);
    if ((flags & call_paged) &&
        std::all_of(p.key_lengths.begin(), p.key_lengths.end(), [&](Index len) { return len == ks.T; }))
      p.key_lengths.clear();  // as a paged frame's
    return checked(p, what);
  }
  if (flags & call_paged) {
    read_pages(r, what, p, p.key_lengths, raw_q, ks, vs);
    slots_to_keys(p, what);
    // Without padding (every sequence T_k long) the problem has none, as the sender's had.
    if (std::all_of(p.key_lengths.begin(), p.key_lengths.end(), [&](Index len) { return len == ks.T; }))
      p.key_lengths.clear();
    return checked(p, what);
  }
  // Sizes through nbytes: four extents of up to 2^32 each would overflow the element count.
  const std::size_t q_bytes = nbytes(raw_q, p.dtype, what), k_bytes = nbytes(raw_k, p.dtype, what);
  p.q = from_bytes(r.raw(q_bytes), qs, p.dtype);
  p.k = from_bytes(r.raw(k_bytes), ks, p.dtype);
  const std::size_t v_bytes = nbytes({vs.B, vs.H, vs.T, vs.D}, p.dtype, what);
  p.v = from_bytes(r.raw(v_bytes), vs, p.dtype);
  return checked(p, what);
}

void expect_end(const Reader& r, const char* what) {
  if (r.left() != 0) throw ProtocolError(std::string(what) + ": " + std::to_string(r.left()) + " bytes left over");
}

// A tensor as a result frame carries it: its shape, then its bytes.
void put_tensor(Writer& w, const Tensor<double>& t, DType dtype) {
  put_shape(w, t.shape());
  w.bytes() += to_bytes(t, dtype);
}

}  // namespace

std::string encode_forward(const Problem& p) {
  return frame(FrameType::forward, call_payload(p));
}

Problem decode_forward(std::string_view payload) {
  Reader r(payload, "forward frame");
  Problem p = read_call(r, "forward frame", false);
  expect_end(r, "forward frame");
  return p;
}

std::string encode_backward(const Problem& p) {
  if (!p.d_output) throw std::logic_error("encode_backward: the problem has no d_output");
  if (p.paged) throw std::logic_error("encode_backward: a paged problem (paged calls are forward only)");
  Problem call = p;
  call.want_weights = false;
  call.want_lse = false;
  return frame(FrameType::backward, call_payload(call) + to_bytes(*p.d_output, p.dtype));
}

Problem decode_backward(std::string_view payload) {
  Reader r(payload, "backward frame");
  Problem p = read_call(r, "backward frame", true);
  const Shape os = p.output_shape();  // dO [B,H,T_q,D_v]
  // Extents already read and checked once (q's and v's), so the count cannot overflow.
  p.d_output = from_bytes(r.raw(std::size_t(os.numel()) * element_size(p.dtype)), os, p.dtype);
  expect_end(r, "backward frame");
  return p;
}

std::string encode_result(const Outcome& o, DType dtype) {
  Writer w;
  w.i32(ok);
  w.u32((o.weights ? result_weights : 0u) | (o.lse ? result_lse : 0u));
  w.str("");
  put_tensor(w, o.output, dtype);
  if (o.weights) put_tensor(w, *o.weights, dtype);
  if (o.lse) put_tensor(w, *o.lse, DType::f64);  // float64 whatever the call's dtype
  return frame(FrameType::result, w.bytes());
}

std::string encode_failure(std::int32_t status, std::string_view message, FrameType type) {
  Writer w;
  w.i32(status);
  w.u32(0);
  w.str(message);
  return frame(type, w.bytes());
}

namespace {
// A status or flag bit this protocol does not define is no answer: the child speaks another dialect (or sent
// garbage), so nothing after it can be read with confidence.
void check_status_and_flags(const char* frame, std::int32_t status, std::uint32_t flags, std::uint32_t known,
                            const char* known_names) {
  if (status < ok || status > wrong_size)
    throw ProtocolError(std::string(frame) + ": status " + std::to_string(status) +
                        " (expected 0 ok, 1 error, 2 unsupported or 3 wrong size)");
  if (flags & ~known) {
    char hex[32];
    std::snprintf(hex, sizeof hex, "0x%x", flags);
    throw ProtocolError(std::string(frame) + ": flags " + hex + " (expected " + known_names + ")");
  }
}
}  // namespace

Result decode_result(std::string_view payload, DType dtype) {
  Reader r(payload, "result frame");
  Result res;
  res.status = r.i32();
  const std::uint32_t flags = r.u32();
  check_status_and_flags("result frame", res.status, flags, 3u, "a combination of 1 weights and 2 LSE");
  res.has_weights = flags & result_weights;
  res.has_lse = flags & result_lse;
  res.message = r.str();
  if (res.status != ok) return res;
  res.out_shape = get_shape(r);
  res.out_bytes = r.raw(nbytes(res.out_shape, dtype));
  if (res.has_weights) {
    res.w_shape = get_shape(r);
    res.w_bytes = r.raw(nbytes(res.w_shape, dtype));
  }
  if (res.has_lse) {
    res.lse_shape = get_shape(r);
    res.lse_bytes = r.raw(nbytes(res.lse_shape, DType::f64));
  }
  expect_end(r, "result frame");
  return res;
}

std::string encode_gradients(const Gradients& g, DType dtype) {
  Writer w;
  w.i32(ok);
  w.u32((g.dsinks.empty() ? 0u : gradients_d_sinks) | (g.dbias ? gradients_d_bias : 0u));
  w.str("");
  for (const Tensor<double>* t : {&g.dq, &g.dk, &g.dv}) put_tensor(w, *t, dtype);
  if (!g.dsinks.empty()) {
    w.i64(std::int64_t(g.dsinks.size()));
    for (const double x : g.dsinks) w.f64(x);
  }
  if (g.dbias) put_tensor(w, *g.dbias, dtype);  // version 4: the bias's shape, then its values
  return frame(FrameType::gradients, w.bytes());
}

GradientsResult decode_gradients(std::string_view payload, DType dtype) {
  Reader r(payload, "gradients frame");
  GradientsResult res;
  res.status = r.i32();
  const std::uint32_t flags = r.u32();
  check_status_and_flags("gradients frame", res.status, flags, 3u, "a combination of 1 d_sinks and 2 d_bias");
  res.message = r.str();
  if (res.status != ok) return res;
  for (std::size_t i = 0; i < 3; ++i) {
    res.shapes[i] = get_shape(r);
    res.bytes[i] = r.raw(nbytes(res.shapes[i], dtype));
  }
  if (flags & gradients_d_sinks) {
    const std::int64_t n = r.i64();
    // Bounded by what is left, so a count of 2^60 is "runs short", not an allocation.
    if (n < 0 || std::uint64_t(n) > r.left() / 8)
      throw ProtocolError("gradients frame: " + std::to_string(n) + " d_sinks announced but " +
                          std::to_string(r.left()) + " bytes are left");
    std::vector<double> d(static_cast<std::size_t>(n));
    for (double& x : d) x = r.f64();
    res.d_sinks = std::move(d);
  }
  if (flags & gradients_d_bias) {
    res.d_bias_shape = get_shape(r);
    res.d_bias_bytes = r.raw(nbytes(*res.d_bias_shape, dtype));
  }
  expect_end(r, "gradients frame");
  return res;
}

}  // namespace attncheck::wire
