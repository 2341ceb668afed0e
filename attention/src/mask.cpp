// Causal mask builders and the explicit conversions between boolean and additive masks.
#include "attncheck/mask.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "attncheck/attention.hpp"

namespace attncheck {

Index last_visible_key(Index i, Index T_q, Index T_k, CausalAlignment a) {
  return a == CausalAlignment::TopLeft ? i : i + T_k - T_q;
}

Index Visibility::document_position(Index i) const {
  // Query i's document d and the ranges of queries and keys d holds; aligned on d's own lengths.
  const std::vector<Index>&qb = *q_doc_bounds, &kb = *doc_bounds;
  const Index d = document_of(qb, i);
  const auto start = [d](const std::vector<Index>& bounds, Index T) {
    return d == 0 ? Index{0} : std::min(bounds[std::size_t(d - 1)], T);
  };
  const auto end = [d](const std::vector<Index>& bounds, Index T) {
    return d < Index(bounds.size()) ? std::min(bounds[std::size_t(d)], T) : T;
  };
  const Index qs = start(qb, T_q), qe = end(qb, T_q), ks = start(kb, T_k), ke = end(kb, T_k);
  return ks + (i - qs) + (alignment == CausalAlignment::TopLeft ? 0 : (ke - ks) - (qe - qs));
}

Index document_of(const std::vector<Index>& bounds, Index j) {
  return Index(std::upper_bound(bounds.begin(), bounds.end(), j) - bounds.begin());
}

namespace {
Index floor_div(Index a, Index b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0)) ? 1 : 0); }
}  // namespace

Index Visibility::key_document(Index j) const { return doc_bounds ? document_of(*doc_bounds, j) : 0; }

Index Visibility::query_document(Index i) const {
  if (q_doc_bounds && doc_bounds) return document_of(*q_doc_bounds, i);
  return key_document(std::clamp<Index>(position(i), 0, std::max<Index>(T_k - 1, 0)));
}

KeyRange Visibility::run(Index i) const {
  const Index p = position(i);
  Index end = T_k;
  if (causal) end = std::min(end, std::max(p + 1, prefix));
  if (key_length >= 0) end = std::min(end, key_length);
  // p + wr + 1 without overflow: a right window past T_k cuts nothing.
  if (window_right && *window_right < T_k - p) end = std::min(end, p + *window_right + 1);
  // A tree's window reads the node's place (prefix + depth, at most p): the run starts there, and cells_allow cuts
  // the nodes' keys by their own places.
  const Index wp = place(i);
  Index begin = window && *window < T_k + std::max<Index>(wp, 0) ? std::max<Index>(0, wp - *window) : 0;
  if (chunk > 0) {
    const Index c0 = floor_div(p, chunk) * chunk;
    begin = std::max(begin, c0);
    if (c0 < T_k && chunk < T_k - c0) end = std::min(end, c0 + chunk);
  }
  if (doc_bounds) {
    const Index d = query_document(i);
    begin = std::max(begin, d == 0 ? Index{0} : (*doc_bounds)[std::size_t(d - 1)]);
    if (d < Index(doc_bounds->size())) end = std::min(end, (*doc_bounds)[std::size_t(d)]);
  }
  begin = std::clamp<Index>(begin, 0, T_k);
  return {begin, std::max(begin, end)};
}

KeyRange Visibility::keys(Index i) const {
  const KeyRange r = run(i);
  if (!has_cells()) return r;
  Index a = r.begin, e = r.end;
  while (a < e && !cells_allow(i, a)) ++a;
  while (e > a && !cells_allow(i, e - 1)) --e;
  return {a, std::max(a, e)};
}

Index Visibility::count(Index i) const {
  if (!has_cells()) return run(i).size();
  Index n = 0;
  for_each_run(i, 0, T_k, [&](Index a, Index e) { n += e - a; });
  return n;
}

BlockMask block_encoding(const DenseMask& cells, Index block_q, Index block_k) {
  BlockMask m;
  m.block_q = block_q;
  m.block_k = block_k;
  m.B = cells.B;
  m.H = cells.H;
  m.q_blocks = (cells.T_q + block_q - 1) / block_q;
  m.k_blocks = (cells.T_k + block_k - 1) / block_k;
  m.kinds.assign(std::size_t(m.B * m.H * m.q_blocks * m.k_blocks), std::uint8_t(BlockKind::Empty));
  bool any_partial = false;
  for (Index b = 0; b < m.B; ++b)
    for (Index h = 0; h < m.H; ++h)
      for (Index bm = 0; bm < m.q_blocks; ++bm)
        for (Index bn = 0; bn < m.k_blocks; ++bn) {
          Index seen = 0, all = 0;
          for (Index i = bm * block_q; i < std::min(cells.T_q, (bm + 1) * block_q); ++i)
            for (Index j = bn * block_k; j < std::min(cells.T_k, (bn + 1) * block_k); ++j, ++all)
              seen += cells.visible(b, h, i, j);
          const BlockKind k = seen == 0 ? BlockKind::Empty : seen == all ? BlockKind::Full : BlockKind::Partial;
          any_partial |= k == BlockKind::Partial;
          m.kinds[std::size_t(((b * m.H + h) * m.q_blocks + bm) * m.k_blocks + bn)] = std::uint8_t(k);
        }
  if (any_partial) m.partial = cells;
  return m;
}

DenseMask dense_of(const BlockMask& m, Index T_q, Index T_k) {
  const Index B = std::max(m.B, m.partial.cells.empty() ? 1 : m.partial.B),
              H = std::max(m.H, m.partial.cells.empty() ? 1 : m.partial.H);
  DenseMask d;
  d.B = B;
  d.H = H;
  d.T_q = T_q;
  d.T_k = T_k;
  d.cells.resize(std::size_t(B * H * T_q * T_k));
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index i = 0; i < T_q; ++i)
        for (Index j = 0; j < T_k; ++j) d.cells[std::size_t(((b * H + h) * T_q + i) * T_k + j)] = m.visible(b, h, i, j);
  return d;
}

bool Visibility::bias_hides(Index i, Index j) const {
  return (*bias)(batch, head, i, j) == -std::numeric_limits<double>::infinity();
}

bool Visibility::index_selects(Index i, Index j) const {
  return index->lists(batch, head, i, j) ||
         (index->current_block && floor_div(position(i), index->block_size) == j / index->block_size);
}

std::string Visibility::hidden_by(Index i, Index j) const {
  if (visible(i, j)) return {};
  const Index p = position(i);
  if (causal && j > p && j >= prefix) return "causal";
  if (key_length >= 0 && j >= key_length) return "padding";
  if (window && key_place(j) < place(i) - *window) return "window";
  if (window_right && j > p + *window_right) return "right window";
  if (chunk > 0 && floor_div(j, chunk) != floor_div(p, chunk)) return "chunk";
  if (doc_bounds && key_document(j) != query_document(i)) return "document";
  if (j >= 0 && j < T_k && block && !block->visible(batch, head, i, j)) return "block mask";
  if (j >= 0 && j < T_k && dense && !dense->visible(batch, head, i, j)) return "dense mask";
  if (j >= 0 && j < T_k && bias && bias_hides(i, j)) return "bias";
  if (j >= 0 && j < T_k && index && !index_selects(i, j)) return "index list";
  if (j >= 0 && j < T_k && tree && !tree->sees(batch, i, j, key_length < 0 ? T_k : key_length)) return "tree";
  return "out of range";
}

TokenTree bitmask_tree(Index B, Index T_q, const std::vector<Index>& lengths, bool big_endian,
                       const std::function<bool(Index b, Index i, Index j)>& cell) {
  if (Index(lengths.size()) != B) throw std::logic_error("bitmask_tree: one length per batch entry");
  TokenTree m{.form = TokenTree::Form::bitmask, .big_endian = big_endian, .B = B, .T_q = T_q};
  m.offsets.push_back(0);
  for (Index b = 0; b < B; ++b) {
    const Index L = lengths[std::size_t(b)], start = m.offsets.back();
    m.bits.resize(std::size_t(start + (T_q * L + 7) / 8), 0);
    for (Index i = 0; i < T_q; ++i)
      for (Index j = 0; j < L; ++j)
        if (cell(b, i, j)) {
          const Index c = i * L + j;
          m.bits[std::size_t(start + c / 8)] |= std::uint8_t(1u << (big_endian ? 7 - c % 8 : c % 8));
        }
    m.offsets.push_back(Index(m.bits.size()));
  }
  return m;
}

TokenTree packed_tree(const TokenTree& t, const std::vector<Index>& lengths, bool big_endian) {
  if (t.form != TokenTree::Form::parents) throw std::logic_error("packed_tree: a tree given by its parents");
  return bitmask_tree(t.B, t.T_q, lengths, big_endian,
                      [&](Index b, Index i, Index j) { return t.sees(b, i, j, lengths[std::size_t(b)]); });
}

BoolMask::BoolMask(Array visible) : visible_(std::move(visible)) {
  if (visible_.rows() < 1 || visible_.cols() < 1)
    throw ShapeError("BoolMask: mask is " + shape_string(visible_.rows(), visible_.cols()) +
                     "; both extents must be positive");
}

BoolMask BoolMask::causal(Index T_q, Index T_k, CausalAlignment a) {
  if (T_q < 1 || T_k < 1)
    throw ShapeError("BoolMask::causal: T_q and T_k must be positive, got " + shape_string(T_q, T_k));
  Array m(T_q, T_k);
  for (Index i = 0; i < T_q; ++i)
    for (Index j = 0; j < T_k; ++j) m(i, j) = j <= last_visible_key(i, T_q, T_k, a);
  return BoolMask(std::move(m));
}

BoolMask BoolMask::of(const Visibility& v) {
  if (v.T_q < 1 || v.T_k < 1)
    throw ShapeError("BoolMask::of: T_q and T_k must be positive, got " + shape_string(v.T_q, v.T_k));
  Array m = Array::Constant(v.T_q, v.T_k, false);
  for (Index i = 0; i < v.T_q; ++i)
    v.for_each_run(i, 0, v.T_k, [&](Index a, Index e) { m.row(i).segment(a, e - a).setConstant(true); });
  return BoolMask(std::move(m));
}

BoolMask BoolMask::full(Index T_q, Index T_k) {
  if (T_q < 1 || T_k < 1)
    throw ShapeError("BoolMask::full: T_q and T_k must be positive, got " + shape_string(T_q, T_k));
  return BoolMask(Array::Constant(T_q, T_k, true));
}

AdditiveMask BoolMask::to_additive() const {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  return AdditiveMask(visible_.select(AdditiveMask::Array::Zero(rows(), cols()), neg_inf));
}

AdditiveMask::AdditiveMask(Array bias) : bias_(std::move(bias)) {
  if (bias_.rows() < 1 || bias_.cols() < 1)
    throw ShapeError("AdditiveMask: mask is " + shape_string(bias_.rows(), bias_.cols()) +
                     "; both extents must be positive");
}

AdditiveMask AdditiveMask::causal(Index T_q, Index T_k, CausalAlignment a) {
  return BoolMask::causal(T_q, T_k, a).to_additive();
}

BoolMask AdditiveMask::to_bool() const {
  return BoolMask(bias_ != -std::numeric_limits<float>::infinity());
}

}  // namespace attncheck
