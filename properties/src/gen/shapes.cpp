// Shapes and their shrinking: every shape one step simpler, axis by axis (ShapeShrinks), the key lengths fitted
// to each step, and the tile-edge lengths the draws aim at.
#include "parts.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <numeric>

namespace attncheck {
using namespace generation;

namespace {

std::vector<Index> towards_one(Index x) {
  std::vector<Index> out;
  auto seq = rc::shrink::towards<Index>(x, 1);
  while (auto v = seq.next()) out.push_back(*v);
  return out;
}

}  // namespace

// The divisors of n, ascending.
// O(sqrt n): each divisor k <= sqrt(n) brings its partner n / k (a linear scan took 45 s at n = 999999999).
std::vector<Index> generation::divisors(Index n) {
  std::vector<Index> low, high;
  for (Index k = 1; k <= n / k; ++k)
    if (n % k == 0) {
      low.push_back(k);
      if (k != n / k) high.push_back(n / k);
    }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

// The divisors of n strictly between 1 and n.
std::vector<Index> generation::inner_divisors(Index n) {
  std::vector<Index> d = divisors(n);
  return d.size() > 2 ? std::vector<Index>(d.begin() + 1, d.end() - 1) : std::vector<Index>{};
}

// 0, 1, ..., n-1: the coordinates of an axis nothing was deleted from.
std::vector<Index> generation::iota(Index n) {
  std::vector<Index> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), Index{0});
  return v;
}

namespace {

// ids without its entry `at`.
std::vector<Index> erased(std::vector<Index> ids, Index at) {
  ids.erase(ids.begin() + at);
  return ids;
}

// ids[0, n).
std::vector<Index> prefix(std::vector<Index> ids, Index n) {
  ids.resize(std::size_t(n));
  return ids;
}

}  // namespace

// A shape whose T_k changed from old_T_k keeps its key lengths inside [0, T_k], in one of two ways: each batch
// entry keeps its padding (the number of padded keys at its end, as far as T_k allows), or its length (clamped
// to T_k). A bug that needs a padded key after the real ones shows under the first; one that needs a real
// key before the padded ones (a length of 1, say) under the second. Offering only one stops shrinking early.
CaseShape generation::fit_key_lengths(CaseShape c, Index old_T_k, bool keep_padding) {
  if (c.key_lengths.empty()) return c;
  c.key_lengths.resize(std::size_t(c.B), c.T_k);
  for (Index& len : c.key_lengths)
    len = keep_padding ? std::clamp<Index>(c.T_k - (old_T_k - len), 0, c.T_k) : std::min(len, c.T_k);
  return c;
}

namespace {

// The aligned blocks [start, start + n) of positions 0..T-1 that a shrinking step deletes whole: every n = 16·2^m
// below T (the tile and split-K chunk sizes kernels use: 16 .. 128 keys per tile, 32 .. 2048 per split), largest
// first, each at every multiple of n, so that the positions after the block keep their place within any tile of n
// or less. 2·T/16 candidates at most.
std::vector<std::pair<Index, Index>> aligned_blocks(Index T) {
  std::vector<Index> sizes;
  for (Index n = 16; n < T; n *= 2) sizes.push_back(n);
  std::vector<std::pair<Index, Index>> out;
  for (auto n = sizes.rbegin(); n != sizes.rend(); ++n)
    for (Index start = 0; start + *n < T; start += *n) out.emplace_back(start, *n);
  return out;
}

// Key j deleted: every sequence that held it is one key shorter (its padding stays where it was).
void delete_key(CaseShape& c, Index j) {
  c.k_ids = erased(c.k_ids, j);
  --c.T_k;
  for (Index& len : c.key_lengths) len -= j < len ? 1 : 0;
}

// The heads kept: kv heads `kvs` (indices into s's kv heads) and, in each of their groups, the query heads at
// offsets `offs`. Query head g·group + r reads kv head g, so the kept ones keep reading the kv heads they read.
CaseShape keep_heads(const CaseShape& s, const std::vector<Index>& kvs, const std::vector<Index>& offs) {
  const Index group = s.H / s.H_kv;
  CaseShape c = s;
  c.kv_ids.clear();
  c.h_ids.clear();
  for (const Index g : kvs) {
    c.kv_ids.push_back(s.kv_ids[std::size_t(g)]);
    for (const Index r : offs) c.h_ids.push_back(s.h_ids[std::size_t(g * group + r)]);
  }
  c.H_kv = Index(kvs.size());
  c.H = c.H_kv * Index(offs.size());
  return c;
}

// The shrink steps of one shape, in order (shape_shrinks): each axis's steps append to `out`, through add (the key
// lengths fitted to the step, padded and clamped) or add_fitted (a step whose lengths are already right).
struct ShapeShrinks {
  ShapeShrinks(const CaseShape& shape, const ShrinkRules& r)
      : s(shape),
        rules(r),
        cross(r.cross),
        gqa(r.gqa),
        caps(r.caps),
        min_T(r.min_T),
        opts(r.opts),
        bottom_right(r.caps.supports(CausalAlignment::BottomRight)) {}
  const CaseShape& s;
  const ShrinkRules& rules;
  const bool cross, gqa;
  const Capabilities& caps;
  const Index min_T;
  const ProblemOptions& opts;
  const bool bottom_right;
  std::vector<CaseShape> out;

  void add_fitted(CaseShape c) {
    if (c.T_q < min_T || c.T_k < min_T) return;
    // Never a shape the implementation does not declare (a cross-length regime, a head dimension).
    if (!caps.supports_lengths(c.T_q, c.T_k) || !caps.supports_head_dims(c.D, c.value_dim())) return;
    if (c.T_q == c.T_k && caps.supports(kDefaultAlignment)) c.alignment = kDefaultAlignment;
    out.push_back(c);
    if (c.T_q != c.T_k && bottom_right && c.alignment == CausalAlignment::TopLeft) {  // same step, other alignment
      c.alignment = CausalAlignment::BottomRight;
      out.push_back(c);
    }
  }
  void add(const CaseShape& c) {
    const CaseShape padded = fit_key_lengths(c, s.T_k, true), clamped = fit_key_lengths(c, s.T_k, false);
    add_fitted(padded);
    if (clamped.key_lengths != padded.key_lengths) add_fitted(clamped);
  }

  // Fewer batch entries: cut from the end, then any single one.
  void batch() {
    for (const Index b : towards_one(s.B)) {
      CaseShape c = s;
      c.B = b;
      c.b_ids = prefix(s.b_ids, b);
      add(c);
    }
    for (Index b = 0; b + 1 < s.B; ++b) {  // (the last one went with the cuts from the end)
      CaseShape c = s;
      --c.B;
      c.b_ids = erased(s.b_ids, b);
      if (!c.key_lengths.empty()) c.key_lengths.erase(c.key_lengths.begin() + b);
      add(c);
    }
  }

  void heads() {
    // Fewer query heads per kv head, fewer kv heads with the same group size, then fewer heads of either kind.
    const Index group = s.H / s.H_kv;
    for (const Index g : towards_one(group)) add(keep_heads(s, iota(s.H_kv), iota(g)));
    for (const Index kv : towards_one(s.H_kv)) add(keep_heads(s, iota(kv), iota(group)));
    for (Index g = 0; g + 1 < s.H_kv; ++g) add(keep_heads(s, erased(iota(s.H_kv), g), iota(group)));
    for (Index r = 0; r + 1 < group; ++r) add(keep_heads(s, iota(s.H_kv), erased(iota(group), r)));
    for (const Index h : towards_one(group > 1 ? s.H : 1)) {  // (without groups, the kv cuts above did this)
      CaseShape c = s;
      c.H = h;
      c.H_kv = std::gcd(h, s.H_kv);
      c.h_ids = prefix(s.h_ids, h);
      c.kv_ids = prefix(s.kv_ids, c.H_kv);
      add(c);
    }
    for (const Index kv : divisors(s.H))  // grouping heads is a step only for kernels that accept it
      if (gqa && kv < s.H_kv) {
        CaseShape c = s;
        c.H_kv = kv;
        c.kv_ids = prefix(s.kv_ids, kv);
        add(c);
      }
  }

  // --long: the keys only to a shorter long length (a wrap at 2^15 shows at 2^15 + 1 and never below), the queries
  // of a square case to as many or to one (a decode step), those of a chunk toward one.
  void long_lengths() {
    for (const Index len : rules.long_lengths) {
      if (len >= s.T_k) continue;
      CaseShape c = s;
      c.T_k = len;
      c.k_ids = prefix(s.k_ids, len);
      if (s.T_q == s.T_k) {
        c.T_q = len;
        c.q_ids = prefix(s.q_ids, len);
      } else if (c.T_q > len) {
        c.T_q = len;
        c.q_ids = prefix(s.q_ids, len);
      }
      add(c);
    }
    if (cross && bottom_right)
      for (const Index t : towards_one(s.T_q)) {
        if (t >= s.T_q) continue;
        CaseShape c = s;
        c.T_q = t;
        c.q_ids = prefix(s.q_ids, t);
        c.alignment = CausalAlignment::BottomRight;
        add_fitted(fit_key_lengths(c, s.T_k, false));
      }
  }

  // A square case: q, k and v lose positions together.
  void square_lengths() {
    for (const Index t : towards_one(s.T_q)) {
      CaseShape c = s;
      c.T_q = c.T_k = t;
      c.q_ids = prefix(s.q_ids, t);
      c.k_ids = prefix(s.k_ids, t);
      add(c);
    }
    for (Index i = 0; i + 1 < s.T_q; ++i) {
      CaseShape c = s;
      c.q_ids = erased(s.q_ids, i);
      --c.T_q;
      delete_key(c, i);
      add_fitted(c);  // delete_key kept every length right
    }
    for (const auto& [i, n] : aligned_blocks(s.T_q)) {  // a whole tile (see below)
      CaseShape c = s;
      for (Index r = 0; r < n; ++r) {
        c.q_ids = erased(c.q_ids, i);
        --c.T_q;
        delete_key(c, i);
      }
      add_fitted(c);
    }
  }

  // T_q != T_k allowed: queries or keys alone, and a query traded for a key.
  void cross_lengths() {
    for (const Index t : towards_one(s.T_q)) {
      CaseShape c = s;
      c.T_q = t;
      c.q_ids = prefix(s.q_ids, t);
      add(c);
    }
    for (const Index t : towards_one(s.T_k)) {
      CaseShape c = s;
      c.T_k = t;
      c.k_ids = prefix(s.k_ids, t);
      add(c);
    }
    for (Index i = 0; i + 1 < s.T_q; ++i) {
      CaseShape c = s;
      c.q_ids = erased(s.q_ids, i);
      --c.T_q;
      add(c);
    }
    for (Index j = 0; j + 1 < s.T_k; ++j) {
      CaseShape c = s;
      delete_key(c, j);
      add_fitted(c);  // delete_key kept every length right
    }
    // A whole tile of keys at once: a tiled kernel's bug may need keys to stay in their tiles (or split-K
    // chunks), and deleting one key moves every later key into another tile, so a failure in the third tile or
    // chunk may never shrink to the second one key at a time.
    for (const auto& [j, n] : aligned_blocks(s.T_k)) {
      CaseShape c = s;
      for (Index r = 0; r < n; ++r) delete_key(c, j);
      add_fitted(c);
    }
    for (const Index i : {Index{0}, s.T_q - 1}) {
      if (s.T_q < 2) break;
      CaseShape c = s;
      c.q_ids = erased(s.q_ids, i);
      --c.T_q;
      c.k_ids.push_back(*std::max_element(s.k_ids.begin(), s.k_ids.end()) + 1);  // a key not seen before
      ++c.T_k;
      for (Index& len : c.key_lengths) len += len == s.T_k ? 1 : 0;  // unpadded stays unpadded
      if (caps.supports(kDefaultAlignment)) c.alignment = kDefaultAlignment;  // add_fitted() tries the other one next
      add_fitted(c);  // the lengths were moved along above
    }
  }

  void head_dims() {
    for (const Index d : towards_one(s.D)) {
      CaseShape c = s;
      c.D = d;
      c.d_ids = prefix(s.d_ids, d);
      add(c);
    }
    for (Index d = 0; d + 1 < s.D; ++d) {
      CaseShape c = s;
      --c.D;
      c.d_ids = erased(s.d_ids, d);
      add(c);
    }
    if (s.D_v > 0) {  // V's own head dimension: toward D (V keyed by d_ids again), then fewer V coordinates
      CaseShape c = s;
      c.D_v = 0;
      c.dv_ids.clear();
      add(c);
      for (const Index d : towards_one(s.D_v)) {
        CaseShape l = s;
        l.D_v = d;
        l.dv_ids = prefix(s.dv_ids, d);
        add(l);
      }
      for (Index d = 0; d + 1 < s.D_v; ++d) {
        CaseShape l = s;
        --l.D_v;
        l.dv_ids = erased(s.dv_ids, d);
        add(l);
      }
    }
  }

  void padding_and_window() {
    if (!s.key_lengths.empty()) {
      CaseShape c = s;
      c.key_lengths.clear();
      if (!opts.require.has(Feature::key_padding)) add(c);
      for (std::size_t b = 0; b < s.key_lengths.size(); ++b) {
        auto seq = rc::shrink::towards<Index>(s.key_lengths[b], s.T_k);
        while (auto len = seq.next()) {
          CaseShape l = s;
          l.key_lengths[b] = *len;
          add(l);
        }
      }
    }
    if (s.window) {
      CaseShape c = s;
      c.window.reset();
      if (!opts.require.has(Feature::window)) add(c);
      for (const Index w : towards_one(*s.window + 1)) {  // toward window 0
        CaseShape l = s;
        l.window = w - 1;
        add(l);
      }
    }
  }

  void documents() {
    // Masks beyond causal: each toward none (unless the law requires it), then toward its simplest value; the
    // documents lose one bound at a time (two documents merge), for batch entries still in the case.
    if (!s.doc_coords.empty()) {
      CaseShape c = s;
      c.doc_coords.clear();
      c.q_doc_coords.clear();
      if (!opts.require.has(Feature::documents)) add(c);
      if (!s.q_doc_coords.empty()) {  // the queries' documents derived from their positions
        CaseShape m = s;
        m.q_doc_coords.clear();
        add(m);
      }
      for (const Index b : s.b_ids)
        for (std::size_t d = 0; d < s.doc_coords[std::size_t(b)].size(); ++d) {
          CaseShape m = s;
          auto& bounds = m.doc_coords[std::size_t(b)];
          bounds.erase(bounds.begin() + std::ptrdiff_t(d));
          if (!m.q_doc_coords.empty()) {  // the same document merges for the queries
            auto& q_bounds = m.q_doc_coords[std::size_t(b)];
            q_bounds.erase(q_bounds.begin() + std::ptrdiff_t(d));
          }
          add(m);
        }
    }
  }

  void other_masks() {
    if (s.chunk > 0) {
      CaseShape c = s;
      c.chunk = 0;
      if (!opts.require.has(Feature::chunked_local)) add(c);
      for (const Index w : towards_one(s.chunk)) {
        CaseShape l = s;
        l.chunk = w;
        add(l);
      }
      // A chunk one shorter over one key fewer at the front: a query in the second chunk keeps its offset in it
      // (neither step alone does: both move the chunk boundaries relative to the query).
      if (s.chunk > 1 && s.T_k > 1) {
        CaseShape l = s;
        --l.chunk;
        delete_key(l, 0);
        if (s.T_q == s.T_k) {
          l.q_ids = erased(s.q_ids, 0);
          --l.T_q;
        }
        add_fitted(l);
      }
    }
    if (s.prefix > 0) {
      CaseShape c = s;
      c.prefix = 0;
      if (!opts.require.has(Feature::prefix)) add(c);
      for (const Index w : towards_one(s.prefix)) {
        CaseShape l = s;
        l.prefix = w;
        add(l);
      }
    }
    if (s.window_right) {
      CaseShape c = s;
      c.window_right.reset();
      if (!opts.require.has(Feature::right_window)) add(c);
      for (const Index w : towards_one(*s.window_right + 1)) {  // toward 0
        CaseShape l = s;
        l.window_right = w - 1;
        add(l);
      }
    }
    if (s.bidirectional && !opts.require.has(Feature::bidirectional)) {
      CaseShape c = s;
      c.bidirectional = false;
      add(c);
    }
  }

  // A block or dense mask: toward none, broadcast, every cell visible, blocks of 1; one block made full or one
  // cell made visible at a time once the case is small (each is one thing fewer for a reader to take in).
  void cell_masks() {
    if (s.cells.kind == 0) return;
    const bool required = (s.cells.kind == 2 && opts.require.has(Feature::block_mask)) ||
                          (s.cells.kind == 1 && opts.require.has(Feature::dense_mask));
    CaseShape c = s;
    c.cells = {};
    if (!required) add(c);
    for (const auto field : {&CaseShape::Cells::per_batch, &CaseShape::Cells::per_head})
      if (s.cells.*field) {
        CaseShape l = s;
        l.cells.*field = false;
        add(l);
      }
    if (s.cells.pattern != 2) {
      CaseShape l = s;
      l.cells.pattern = 2;
      add(l);
      if (s.cells.pattern == 0 && s.cells.density < 90) {
        l = s;
        l.cells.density = 90;
        add(l);
      }
    }
  }

  // One block made full or one cell made visible at a time, once the case is small; smaller blocks.
  void cell_mask_blocks_and_cells() {
    if (s.cells.kind == 0) return;
    if (s.cells.kind == 2) {
      if (s.cells.kinds == 0) {  // random kinds: every block partial (the cells alone say), or their encoding
        for (const int k : {1, 2}) {
          CaseShape l = s;
          l.cells.kinds = k;
          add(l);
        }
      }
      for (const Index w : towards_one(s.cells.block_q)) {
        CaseShape l = s;
        l.cells.block_q = w;
        add(l);
      }
      for (const Index w : towards_one(s.cells.block_k)) {
        CaseShape l = s;
        l.cells.block_k = w;
        add(l);
      }
      const BlockMask bm = block_mask_of(s);
      if (bm.kinds.size() <= 64)
        for (Index b = 0; b < bm.B; ++b)
          for (Index h = 0; h < bm.H; ++h)
            for (Index x = 0; x < bm.q_blocks; ++x)
              for (Index y = 0; y < bm.k_blocks; ++y)
                if (bm.kind(b, h, x, y) != BlockKind::Full) {
                  CaseShape l = s;
                  const auto [qc, kc] = block_coords(s, x, y);
                  l.cells.full_blocks.push_back({cell_b(s, b), cell_h(s, h), qc, kc});
                  add(l);
                }
    }
    if (s.cells.pattern != 2 && (s.cells.per_batch ? s.B : 1) * (s.cells.per_head ? s.H : 1) * s.T_q * s.T_k <= 64) {
      const DenseMask d = cells_of(s);
      for (Index b = 0; b < d.B; ++b)
        for (Index h = 0; h < d.H; ++h)
          for (Index i = 0; i < d.T_q; ++i)
            for (Index j = 0; j < d.T_k; ++j)
              if (!d.visible(b, h, i, j)) {
                CaseShape l = s;
                l.cells.shown_cells.push_back(
                    {cell_b(s, b), cell_h(s, h), s.q_ids[std::size_t(i)], s.k_ids[std::size_t(j)]});
                add(l);
              }
    }
  }

  void alignment() {
    if (s.alignment != kDefaultAlignment && caps.supports(kDefaultAlignment)) {
      CaseShape c = s;
      c.alignment = kDefaultAlignment;
      out.push_back(c);
    }
  }
};

}  // namespace

// Every shape one step simpler than s, bigger steps first. The whole geometry is one shrinkable, so after any
// accepted step all extents are tried again: gen::exec never returns to an earlier draw, so a T_q that could
// not shrink while T_k was still large stayed large after T_k shrank. Each axis is cut from its end (by halves,
// then by one) and then loses any single index: the query that fails need not be the last, nor the batch
// entry, head or D coordinate. A square case loses a position from q, k and v at once; a kernel that accepts
// T_q != T_k may also lose a query alone or a key alone, and may become cross-length under either alignment
// (T_q = 1, T_k = 17 is reachable from T_q = T_k = 17), and, as a last resort, trade its first or last query for a
// key more (fewer queries is simpler: T_q = 2, T_k = 1 bottom-right and T_q = 1, T_k = 2 have as many rows, and
// the second is where the kill matrix's minimal cases are). H and H_kv shrink together (H_kv always divides H): a
// whole kv group, or the same query head of every group. Padding and the window shrink toward none. No T goes
// below min_T.
std::vector<CaseShape> generation::shape_shrinks(const CaseShape& s, const ShrinkRules& rules) {
  if (rules.pinned) return {};
  ShapeShrinks steps(s, rules);
  steps.batch();
  steps.heads();
  if (!rules.long_lengths.empty())
    steps.long_lengths();
  else if (s.T_q == s.T_k)
    steps.square_lengths();
  if (rules.cross && rules.long_lengths.empty()) steps.cross_lengths();
  steps.head_dims();
  steps.padding_and_window();
  steps.documents();
  steps.other_masks();
  steps.cell_masks();
  steps.cell_mask_blocks_and_cells();
  steps.alignment();
  return std::move(steps.out);
}

bool ProblemOptions::may_use(Feature f, FeatureSet declared) const {
  const std::optional<Feature>& needs = feature(f).requires_feature;
  return (allow.has(f) || require.has(f)) && declared.has(f) && (!needs || may_use(*needs, declared));
}

std::vector<Index> tile_edge_lengths(Index min_T, Index max_T) {
  std::vector<Index> t;
  for (Index p = 1; p <= max_T + 1; p *= 2)
    for (const Index x : {p - 1, p, p + 1}) t.push_back(x);
  for (Index m = 16; m <= max_T + 1; m += 16)
    for (const Index x : {m - 1, m, m + 1}) t.push_back(x);
  std::sort(t.begin(), t.end());
  t.erase(std::unique(t.begin(), t.end()), t.end());
  std::erase_if(t, [&](Index x) { return x < std::max<Index>(min_T, 1) || x > max_T; });
  return t;
}

}  // namespace attncheck
