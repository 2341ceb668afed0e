// Paged-KV kernels: K and V come as a page pool and a block table (vLLM's PagedAttention, FlashInfer,
// FlashAttention's paged KV), and each mutant gets one step of the address arithmetic wrong: which table entry,
// which page, which slot, which stride, how many keys, or what it writes back. Each reads the pools that
// paged_pools() lays out at the native scalar, element by element at the flat offset its author computed, so a
// wrong offset reads whatever sits there (another key, a free slot, another head) and an offset outside the pool
// or a table index outside the table is a crash (ImplementationError::Kind::crash, as a segfault would be), never
// undefined behaviour here. On a dense problem (p.paged empty) every kernel is right: the bugs live in the paged
// path only. Two controls: control:paged-tiled reads K and V page by page with an online softmax, and
// control:paged-physical-order does so in the pool's physical page order.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "parts.hpp"

namespace attncheck::zoo {
namespace {

/// The one mistake a paged kernel makes, and where such a mistake comes from.
enum class PageBug {
  /// The last page loaded whole (a page is the unit of a load) and the slots past the length masked like padding,
  /// by adding -inf: free slots hold NaN in vLLM, so NaN - inf and 0·NaN reach the output.
  tail_additive,
  /// The key count taken as pages·page_size, the tokens the pages hold, as if every page were full.
  length_from_pages,
  /// The block table's row stride taken from the batch (max_num_blocks_per_seq computed from the lengths)
  /// instead of the width of the table the engine allocated.
  stride_pages_used,
  /// The table's two strides swapped (a Triton kernel called with stride(1), stride(0)).
  table_transposed,
  /// A long path (more than 16 keys walked) instantiated for vLLM's default block size 16 alone, reached by
  /// every page size (a dispatch switch whose default case falls back to it).
  assumes_page_16,
  /// The layout flag dropped on the way to the kernel: a head-major (FlashInfer HND) pool read as token-major.
  layout_ignored,
  /// Positions taken as 1-based in the page lookup only: page (t - 1) / page_size, slot t % page_size.
  boundary_prev_page,
  /// The block table never read: page b·max_pages + i, the layout of the contiguous cache paging replaced.
  ignores_table,
  /// Pages walked counted as len / page_size + 1 instead of ceil(len / page_size): one entry too many.
  entry_past_last,
  /// The KV length taken as the table's capacity max_pages·page_size (the max_seq_len the engine allocated).
  capacity_as_length,
  /// After attending, the free tail of the last page zeroed "from slot len % page_size" so the next step may read
  /// pages whole: a full last page (len % page_size = 0) is zeroed whole, under any sequence that shares it.
  wipes_full_page,
  /// A head-major pool's kv-head stride taken as D (the token-major one) instead of page_size·D.
  head_stride_d,
  /// The paged path, written for multi-head attention, indexes the pool with the query head, not its kv head.
  gqa_head_unmapped,
};

[[noreturn]] void segfault(const std::string& what) {
  throw ImplementationError(ImplementationError::Kind::crash, "paged kernel: " + what + " (a segfault on a device)");
}

/// What one paged kernel reads: the table (an index outside it is a crash) and its own copies of the pools (a
/// kernel may write to them; an offset outside them is a crash).
template <class S>
struct PoolView {
  const PagedKV& pk;
  Tensor<S> k, v;
  Index H_kv, D;

  Index entry(Index e) const {
    if (e < 0 || e >= Index(pk.block_table.size()))
      segfault("block-table index " + std::to_string(e) + " outside the table of " +
               std::to_string(pk.block_table.size()) + " entries");
    return pk.block_table[std::size_t(e)];
  }
  Index page(Index n) const {
    if (n < 0 || n >= pk.num_pages)
      segfault("page " + std::to_string(n) + " outside the pool of " + std::to_string(pk.num_pages) + " pages");
    return n;
  }
  /// D values from flat offset `at` of a pool, widened to A.
  template <class A>
  Eigen::Matrix<A, 1, Eigen::Dynamic> row(const Tensor<S>& pool, Index at) const {
    if (at < 0 || at + D > pool.size())
      segfault("offset " + std::to_string(at) + " outside the pool of " + std::to_string(pool.size()) + " elements");
    Eigen::Matrix<A, 1, Eigen::Dynamic> r(D);
    for (Index d = 0; d < D; ++d) r(d) = static_cast<A>(pool.data()[at + d]);
    return r;
  }
};

/// The flat offset of key t of sequence b, kv head g, as the buggy kernel computes it (the table entry, the page,
/// the slot and the strides). Every other bug reads the right address.
template <class S>
Index key_offset(const PoolView<S>& pv, PageBug bug, Index b, Index g, Index t, Index B, bool long_path,
                 Index row_stride) {
  const PagedKV& pk = pv.pk;
  // BUG assumes_page_16: the long path, instantiated for pages of 16 only, uses 16 whatever the page size for
  // the page, the slot and the page stride.
  const Index ps = bug == PageBug::assumes_page_16 && long_path ? 16 : pk.page_size;
  // BUG boundary_prev_page: positions treated as 1-based in the page lookup only: (t - 1) / ps is the page of t
  // except at a page boundary, where it is the previous one; C++ division makes t = 0 page 0, except for pages
  // of 1, where it is page -1 (the entry before the row).
  const Index i = bug == PageBug::boundary_prev_page ? (t - 1) / ps : t / ps, slot = t % ps;
  Index page;
  if (bug == PageBug::ignores_table)
    page = pv.page(b * pk.max_pages + i);  // BUG: the cache assumed contiguous, one max_pages run per sequence
  else if (bug == PageBug::table_transposed)
    page = pv.page(pv.entry(i * B + b));  // BUG: the table's strides swapped (read as [max_pages, B])
  else
    page = pv.page(pv.entry(b * row_stride + i));  // row_stride: max_pages, or the pages in use (BUG stride_pages_used)
  const Index H_kv = pv.H_kv, D = pv.D;
  if (bug == PageBug::head_stride_d && pk.layout == PageLayout::head_major)
    return (page * H_kv * ps + g + slot) * D;  // BUG: a kv head's stride D, not ps·D (right for pages of 1)
  if (pk.layout == PageLayout::token_major || bug == PageBug::layout_ignored)
    return ((page * ps + slot) * H_kv + g) * D;  // BUG layout_ignored: token-major whatever the layout
  return ((page * H_kv + g) * ps + slot) * D;
}

// The whole paged call, as the buggy kernel runs it: per sequence b and query head h, the keys it reads from
// the pools (through key_offset), the scores of the keys it takes as visible, a softmax with the row max, and
// the values mixed. Sequences run in order (a kernel's writes to the pool reach the sequences after it).
template <class S>
Tensor<S> paged_kernel(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const Problem& p, Tensor<S>* w,
                       PageBug bug) {
  using A = Acc<S>;
  const A neg_inf = -std::numeric_limits<A>::infinity();
  const PagedPools<S> pools = paged_pools(p, k, v);
  PoolView<S> pv{pools.layout, pools.k, pools.v, k.shape().H, k.shape().D};
  const PagedKV& pk = pools.layout;
  const Shape& s = q.shape();
  const Index B = s.B, H = s.H, T_q = s.T, T_k = k.shape().T, D = s.D, ps = pk.page_size;
  const std::vector<Index> lengths = p.sequence_lengths();
  Index most_pages = 0;
  for (const Index len : lengths) most_pages = std::max(most_pages, pk.pages_used(len));
  // BUG stride_pages_used: the row stride from the pages in use (right whenever the table has no spare column).
  const Index row_stride = bug == PageBug::stride_pages_used ? most_pages : pk.max_pages;
  const A scale = static_cast<A>(p.scale ? *p.scale : 1.0 / std::sqrt(double(D)));
  Tensor<S> out(s);
  if (w) *w = Tensor<S>(Shape{B, H, T_q, T_k});
  for (Index b = 0; b < B; ++b) {
    const Index len = lengths[std::size_t(b)];
    // The keys read: the sequence's, its last page in full (BUG tail_additive, length_from_pages), or as many as
    // the table can hold (BUG capacity_as_length: entries past the last page are read too).
    const bool full_last_page = bug == PageBug::tail_additive || bug == PageBug::length_from_pages;
    const Index n = full_last_page                          ? pk.pages_used(len) * ps
                    : bug == PageBug::capacity_as_length ? pk.max_pages * ps
                                                            : len;
    if (bug == PageBug::entry_past_last && len % ps == 0)  // BUG: len / ps + 1 pages: the one past is dereferenced
      pv.page(pv.entry(b * row_stride + len / ps));
    // Which keys the kernel lets query i see: the right rule, except where the bug changes it.
    const Visibility right{.T_q = T_q, .T_k = T_k, .alignment = p.alignment,
                           .key_length = p.key_lengths.empty() ? -1 : len};
    Visibility unpadded = right;  // BUG length_from_pages: the causal rule alone over the n keys read
    unpadded.key_length = -1;
    Visibility capacity = unpadded;  // BUG capacity_as_length: every key up to the capacity live, aligned to it
    capacity.T_k = pk.max_pages * ps;
    const auto visible = [&](Index i, Index t) {
      if (bug == PageBug::length_from_pages) return t < T_k && unpadded.visible(i, t);
      if (bug == PageBug::capacity_as_length) return capacity.visible(i, t);
      return t < T_k && right.visible(i, t);
    };
    // BUG assumes_page_16: the long path is taken when the query block walks more than 16 keys (its last
    // visible key + 1).
    Index walked = 0;
    for (Index i = 0; i < T_q; ++i)
      for (Index t = n - 1; t >= walked; --t)
        if (visible(i, t)) {
          walked = t + 1;
          break;
        }
    const bool long_path = walked > 16;
    for (Index h = 0; h < H; ++h) {
      // BUG gqa_head_unmapped: the query head indexes the pool (right without grouped queries).
      const Index g = bug == PageBug::gqa_head_unmapped ? h : kv_head(h, H, pv.H_kv);
      const Matrix<A> Q = q.head(b, h).template cast<A>();
      Matrix<A> K(n, D), V(n, D);
      for (Index t = 0; t < n; ++t) {
        const Index at = key_offset(pv, bug, b, g, t, B, long_path, row_stride);
        K.row(t) = pv.template row<A>(pv.k, at);
        V.row(t) = pv.template row<A>(pv.v, at);
      }
      Matrix<A> wt = Matrix<A>::Zero(T_q, std::max(n, T_k));
      Matrix<A> o = Matrix<A>::Zero(T_q, D);
      for (Index i = 0; i < T_q; ++i) {
        // BUG tail_additive: the slots past the length get -inf added to their scores (0·NaN and NaN - inf
        // survive it) and their values are mixed in with weight exp(-inf) = 0 (0·NaN = NaN).
        const auto taken = [&](Index t) { return visible(i, t) || (bug == PageBug::tail_additive && t >= len); };
        A m = neg_inf;
        for (Index t = 0; t < n; ++t)
          if (taken(t)) {
            wt(i, t) = scale * Q.row(i).dot(K.row(t));
            if (!visible(i, t)) wt(i, t) += neg_inf;
            m = std::max(m, wt(i, t));
          }
        if (m == neg_inf) {
          wt.row(i).setZero();
          continue;  // nothing visible: a zero row
        }
        A l = 0;
        for (Index t = 0; t < n; ++t)
          if (taken(t)) l += (wt(i, t) = std::exp(wt(i, t) - m));
        for (Index t = 0; t < n; ++t)
          if (taken(t)) o.row(i) += (wt(i, t) /= l) * V.row(t);
      }
      out.head(b, h) = o.template cast<S>();
      if (w) w->head(b, h) = wt.leftCols(T_k).template cast<S>();
    }
    // BUG wipes_full_page: after attending, the kernel zeroes the free tail of its last page, from slot len % ps,
    // so the next step may read the page whole: a full last page (len % ps == 0) is zeroed from slot 0, and a
    // sequence sharing that page (a cached prefix) reads zeros after it.
    if (bug == PageBug::wipes_full_page && len > 0) {
      const Index page = pv.page(pv.entry(b * row_stride + pk.pages_used(len) - 1));
      for (Index slot = len % ps; slot < ps; ++slot)
        for (Index g = 0; g < pv.H_kv; ++g)
          for (Index d = 0; d < D; ++d) {
            const Index at = pk.pool_offset(page, slot, g, d, pv.H_kv, D);
            pv.k.data()[at] = S(0);
            pv.v.data()[at] = S(0);
          }
    }
  }
  return out;
}

/// Zoo capabilities with paged K and V in the given page sizes and layouts (bits 1 token-major, 2 head-major),
/// key padding (ragged sequences, as a paged cache always holds) and grouped queries.
Capabilities paged_capabilities(std::vector<Index> page_sizes = {1, 8, 16, 64, 256}, std::uint32_t layouts = 3) {
  Capabilities c = gqa_capabilities();
  c.features.add(Feature::key_padding);
  c.features.add(Feature::paged);
  c.page_sizes = std::move(page_sizes);
  c.page_layouts = layouts;
  return c;
}

ImplementationPtr paged_impl(const char* name, const char* description, PageBug bug, Capabilities caps) {
  return make_implementation(std::string("mutant:") + name, description, std::move(caps), [bug](const Problem& p) {
    return run_typed(p, [&](const auto& q, const auto& k, const auto& v, const Problem& pr, auto* w) {
      if (!pr.paged)  // the dense path is right
        return per_head(q, k, v, pr, w, [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
          return attend_modified(Q, K, V, c);
        });
      return paged_kernel(q, k, v, pr, w, bug);
    });
  });
}

Mutant paged_mutant(const char* name, const char* description, PageBug bug, const char* bug_line, Shape minimal,
                    const char* why, std::vector<std::string> killed_by, Capabilities caps = paged_capabilities()) {
  return Mutant{.impl = paged_impl(name, description, bug, std::move(caps)),
                .bug = bug_line,
                .minimal_shape = minimal,
                .why_minimal = why,
                .killed_by = std::move(killed_by)};
}

// ---- the control -------------------------------------------------------------------------------------------

// control:paged-tiled: K and V read tile by tile straight from the pages, never gathered into a dense copy: for
// each query row, the sequence's pages in table order (one tile per page; a dense call takes tiles of 16 keys),
// each visible key's score from the pool, an online softmax (running max m, sum l and accumulator rescaled by
// exp(m_old - m_new)) in the accumulation type, and the weights recomputed from the final m and l. Keys a row may
// not see are never read, and neither is any slot past a sequence's length or any table entry past its last page.
// With `physical_order` (control:paged-physical-order), a sequence's pages are walked in the order they sit in the
// pool, as a kernel that sweeps a unified cache does, not in the table's: the same terms summed in another order
// once the pages move (page-permutation, shared-pages).
template <class S>
Tensor<S> paged_tiled(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const Problem& p, Tensor<S>* w,
                      bool physical_order = false) {
  using A = Acc<S>;
  const Shape& s = q.shape();
  const Index B = s.B, H = s.H, T_q = s.T, T_k = k.shape().T, D = s.D, H_kv = k.shape().H;
  const std::vector<Index> lengths = p.sequence_lengths();
  std::optional<PagedPools<S>> pools;
  if (p.paged) pools = paged_pools(p, k, v);
  const Index tile = p.paged ? pools->layout.page_size : 16;
  const A scale = static_cast<A>(p.scale ? *p.scale : 1.0 / std::sqrt(double(D)));
  Tensor<S> out(s);
  if (w) *w = Tensor<S>(Shape{B, H, T_q, T_k});
  Eigen::Matrix<A, 1, Eigen::Dynamic> acc(D), kt(D), vt(D);
  for (Index b = 0; b < B; ++b) {
    const Index len = std::min(lengths[std::size_t(b)], T_k);
    const Visibility vis{.T_q = T_q, .T_k = T_k, .alignment = p.alignment,
                         .key_length = p.key_lengths.empty() ? -1 : len};
    for (Index h = 0; h < H; ++h) {
      const Index g = kv_head(h, H, H_kv);
      // Key t's K and V rows: from its page and slot through the table, or from the dense tensors.
      const auto load = [&](Index t) {
        if (pools) {
          const PagedKV& pk = pools->layout;
          const Index page = pk.block_table[std::size_t(b * pk.max_pages + t / tile)],
                      at = pk.pool_offset(page, t % tile, g, 0, H_kv, D);
          for (Index d = 0; d < D; ++d) {
            kt(d) = static_cast<A>(pools->k.data()[at + d]);
            vt(d) = static_cast<A>(pools->v.data()[at + d]);
          }
        } else {
          for (Index d = 0; d < D; ++d) kt(d) = static_cast<A>(k(b, g, t, d)), vt(d) = static_cast<A>(v(b, g, t, d));
        }
      };
      // The first key of each page (tile), in the order the kernel walks them.
      std::vector<Index> starts;
      for (Index t0 = 0; t0 < len; t0 += tile) starts.push_back(t0);
      if (physical_order && pools) {
        const PagedKV& pk = pools->layout;
        std::stable_sort(starts.begin(), starts.end(), [&](Index x, Index y) {
          return pk.block_table[std::size_t(b * pk.max_pages + x / tile)] <
                 pk.block_table[std::size_t(b * pk.max_pages + y / tile)];
        });
      }
      Matrix<A> wt = Matrix<A>::Zero(T_q, T_k);
      for (Index i = 0; i < T_q; ++i) {
        const Eigen::Matrix<A, 1, Eigen::Dynamic> qi = q.head(b, h).row(i).template cast<A>();
        A m = -std::numeric_limits<A>::infinity(), l = 0;
        acc.setZero();
        for (const Index t0 : starts) {  // one page (tile) at a time
          const Index t1 = std::min(t0 + tile, len);
          A tile_max = -std::numeric_limits<A>::infinity();
          bool any = false;
          for (Index t = t0; t < t1; ++t)
            if (vis.visible(i, t)) {
              load(t);
              tile_max = std::max(tile_max, wt(i, t) = scale * qi.dot(kt));
              any = true;
            }
          if (!any) continue;  // nothing visible in this page: it is not read
          const A m_new = std::max(m, tile_max), alpha = std::exp(m - m_new);  // 0 on the first page
          l *= alpha;
          acc *= alpha;
          for (Index t = t0; t < t1; ++t)
            if (vis.visible(i, t)) {
              load(t);
              const A e = std::exp(wt(i, t) - m_new);
              l += e;
              acc += e * vt;
            }
          m = m_new;
        }
        if (l == A(0)) continue;  // a row that sees no key: zero output and weights
        for (Index d = 0; d < D; ++d) out(b, h, i, d) = static_cast<S>(acc(d) / l);
        for (Index t = 0; t < len; ++t)
          if (vis.visible(i, t)) wt(i, t) = std::exp(wt(i, t) - m) / l;
      }
      if (w) w->head(b, h) = wt.template cast<S>();
    }
  }
  return out;
}

}  // namespace

std::vector<Mutant> paged_mutants() {
  std::vector<Mutant> z;
  z.push_back(paged_mutant(
      "paged-tail-additive", "the last page read in full, the slots past the length masked additively",
      PageBug::tail_additive,
      "the last page loaded in full and the slots past the sequence's length masked by adding -inf to their scores "
      "(an additive mask, as for padding) and mixed with weight 0: a NaN or Inf there (vLLM fills free slots with "
      "NaN) becomes NaN - inf = NaN or 0 * NaN = NaN in the output",
      {1, 1, 1, 1},
      "one query, one key, and a free slot after it in the same page (page size 8, the smallest declared above 1) "
      "holding NaN or Inf",
      {"poisoned-slots", "paged-dense"}));
  z.push_back(paged_mutant(
      "paged-length-from-pages", "the key count taken as pages * page_size: the last page's free slots are keys",
      PageBug::length_from_pages,
      "the number of keys taken as pages_used * page_size (the tokens the pages could hold) with the causal rule "
      "alone: the padding slots of a partial last page, which the causal rule does not hide, are read as keys",
      {1, 1, 1, 1},
      "a padded key the causal rule lets through: one query bottom-right over T_k = 2 with key length 1 (slots past "
      "T_k are in every query's future), in a page of 8",
      {"paged-dense", "poisoned-slots"}));
  z.push_back(paged_mutant(
      "paged-table-stride-pages-used",
      "the block table's row stride taken as the most pages any sequence uses, not the table's width",
      PageBug::stride_pages_used,
      "the block table's row stride taken as max over sequences of ceil(len / page_size) instead of its width "
      "(max_pages): right while the table has no spare column, otherwise sequence b >= 1 reads sequence 0's row "
      "(its unused entries: -1 is a crash)",
      {2, 1, 1, 1},
      "a second sequence (B = 2, one key each) and a table wider than the pages in use (a spare column): sequence 1 "
      "reads entry 1, row 0's unused column",
      {"paged-capacity", "paged-dense"}));
  z.push_back(paged_mutant(
      "paged-table-transposed", "the block table's strides swapped: entry (b, i) read at i * B + b",
      PageBug::table_transposed,
      "the block table's two strides swapped (a Triton kernel passed stride(1), stride(0)): entry (b, i) read at "
      "i * B + b, right for one sequence or a one-column table",
      {2, 1, 1, 1},
      "two sequences (B = 2, one key each) and a table of two columns (a spare one): sequence 1 reads entry 1, row "
      "0's unused column",
      {"paged-capacity", "paged-dense"}));
  z.push_back(paged_mutant(
      "paged-assumes-page-16", "the long path (more than 16 keys walked) addresses pages of 16 whatever the page size",
      PageBug::assumes_page_16,
      "a query block that walks more than 16 keys takes the kernel's long path, compiled for pages of 16 only: page "
      "t / 16, slot t % 16 and a page stride of 16 slots whatever the page size (the pool read as if it held pages "
      "of 16)",
      {1, 1, 1, 1},
      "the long path needs a query that sees 17 keys: one query, T_k = 17, bottom-right; and pages out of order (or "
      "a second sequence): one sequence in contiguous token-major pages is the dense sequence whatever the page "
      "size, so pages of 16 read the right rows there",
      {"paged-dense", "page-size"}));
  z.back().also_minimal = {{2, 1, 1, 1}};  // the second sequence, where the pages were drawn in order
  z.push_back(paged_mutant(
      "paged-layout-ignored", "a head-major pool read as token-major", PageBug::layout_ignored,
      "the pool always addressed as token-major [pages, page_size, H_kv, D], a head-major [pages, H_kv, page_size, D] "
      "pool included: with one kv head or pages of 1 the two are the same",
      {1, 2, 1, 1},
      "two kv heads (H = H_kv = 2) and pages of more than one slot (head-major, page 8): kv head 1's one key is read "
      "from head 0's slot 1, a free slot (one key: the output is its value)",
      {"paged-dense", "page-size"}));
  z.push_back(paged_mutant(
      "paged-boundary-previous-page", "page (t - 1) / page_size, slot t % page_size: the previous page at a boundary",
      PageBug::boundary_prev_page,
      "the page of key t looked up as (t - 1) / page_size (positions taken as 1-based in the page lookup only) while "
      "the slot is t % page_size: the first key of every page after the first is read from slot 0 of the previous "
      "page, and with pages of 1 key 0 from the entry before the row (-1 / 1 = -1, where -1 / 8 = 0)",
      {1, 1, 1, 1},
      "one key in a page of 1: its page is entry -1, before the table (sequence 0), a crash; with pages of 8 it "
      "takes key 8 (T_k = 9) to read key 0 in its place",
      {"paged-dense", "page-size"}));
  z.push_back(paged_mutant(
      "paged-ignores-table", "page b * max_pages + i: the block table never read (a contiguous cache assumed)",
      PageBug::ignores_table,
      "the block table never read: page i of sequence b taken as b * max_pages + i, as in a contiguous "
      "preallocated cache; right only when the pages happen to lie that way",
      {1, 1, 1, 1},
      "one query, one key whose page is not page 0: a pool of two pages (a spare one) in reversed order, so the "
      "kernel reads the spare (its one key: the output is its value)",
      {"page-permutation", "paged-dense"}));
  z.push_back(paged_mutant(
      "paged-entry-past-last", "floor(len / page_size) + 1 pages walked: one table entry past the last page read",
      PageBug::entry_past_last,
      "the pages walked counted as len / page_size + 1 instead of ceil(len / page_size): when the length is a "
      "multiple of the page size the entry past the last page is dereferenced (masked keys, but -1, an "
      "out-of-range number or an index past the table is a crash)",
      {1, 1, 1, 1},
      "one query, one key in a page of 1 (a full last page): the entry after it is past the end of a one-entry "
      "table",
      {"paged-dense", "paged-capacity"}));
  z.push_back(paged_mutant(
      "paged-capacity-as-length",
      "the table's capacity max_pages * page_size taken as the sequence's length (bottom-right)",
      PageBug::capacity_as_length,
      "the KV length taken as the block table's capacity, max_pages * page_size (the max_seq_len the engine "
      "allocated), with bottom-right alignment to it: the last query reads every slot of every column, the free "
      "slots of the last page and the entries past it (-1: a crash) included",
      {1, 1, 1, 1},
      "one query, one key, bottom-right (top-left, query 0 sees key 0 alone), and a capacity above 1: a page of 8 "
      "(7 free slots read as keys: NaN there is NaN out) or a spare table column (its -1 entry read)",
      {"poisoned-slots", "paged-capacity", "paged-dense"}));
  z.push_back(paged_mutant(
      "paged-wipes-full-page",
      "after attending, the kernel zeroes its last page from slot len % page_size: a full last page whole",
      PageBug::wipes_full_page,
      "after attending, each sequence zeroes the free tail of its last page in place (so the next step may read "
      "pages whole), from slot len % page_size: a full last page is zeroed from slot 0, and a later sequence "
      "sharing that page (prefix caching) reads zeros",
      {2, 1, 1, 1},
      "sequence 0 with one key in a page of 1 and the sequence shared-pages adds after it, sharing that page "
      "(B = 2, T_k = 1): the second reads a zeroed key and value",
      {"shared-pages"}));
  z.push_back(paged_mutant(
      "paged-head-stride-d", "a head-major pool's kv-head stride taken as D, not page_size * D",
      PageBug::head_stride_d,
      "a head-major pool [pages, H_kv, page_size, D] addressed with a kv-head stride of D instead of page_size * D "
      "(the page and slot strides right): right for one kv head or pages of 1, otherwise key t of head g is read "
      "from row t + g of the page, another slot of head 0 (a free one, or another key) or of the next head",
      {1, 2, 1, 1},
      "two kv heads (H = H_kv = 2) and pages of more than one slot (8): head 1's one key is read from head 0's "
      "slot 1, a free slot (one key: the output is its value)",
      {"paged-dense", "poisoned-slots", "page-size"}, paged_capabilities({1, 8, 16, 64, 256}, 2)));
  z.push_back(paged_mutant(
      "paged-gqa-head-unmapped", "the paged path indexes the pool with the query head, not its kv head",
      PageBug::gqa_head_unmapped,
      "the paged path indexes the pool's kv heads with the query head h instead of h / (H / H_kv) (the dense path "
      "maps it): right without grouped queries, otherwise a head past H_kv reads the next slot or page",
      {1, 2, 1, 1},
      "grouped queries (H = 2 over H_kv = 1): query head 1 reads kv head 1, which is the next slot (a free one) or "
      "the next page; one key",
      {"paged-dense", "poisoned-slots"}));
  z.push_back(Mutant{
      .impl = make_implementation("control:paged-tiled",
                                  "correct; paged K and V read page by page with an online softmax (no dense copy)",
                                  paged_capabilities(),
                                  [](const Problem& p) {
                                    return run_typed(p, [](const auto& q, const auto& k, const auto& v,
                                                           const Problem& pr, auto* w) {
                                      return paged_tiled(q, k, v, pr, w);
                                    });
                                  }),
      .bug = "control: paged K and V read page by page through the block table (every page size, both layouts, key "
             "padding, grouped queries), an online softmax over pages in float accumulation, never a dense copy",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {},
  });
  z.push_back(Mutant{
      .impl = make_implementation("control:paged-physical-order",
                                  "correct; paged K and V walked in the pool's physical page order (a unified cache)",
                                  paged_capabilities(),
                                  [](const Problem& p) {
                                    return run_typed(p, [](const auto& q, const auto& k, const auto& v,
                                                           const Problem& pr, auto* w) {
                                      return paged_tiled(q, k, v, pr, w, true);
                                    });
                                  }),
      .bug = "control: a sequence's pages walked in the order they sit in the pool, not the table's (a kernel sweeping "
             "a unified cache), with an online softmax: moving or sharing pages reorders the sum (1 ulp)",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {},
  });
  return z;
}

}  // namespace attncheck::zoo
