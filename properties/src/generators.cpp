// Generators for attention problems. RapidCheck's built-in floating-point generator stays in a narrow range,
// so values are drawn from integers mapped through a regime and a magnitude, keyed by each entry's
// coordinates, and shrink with the shape (shape_shrinks, gen_case_values).
#include "attncheck/generators.hpp"

#include "attncheck/backward.hpp"
#include "attncheck/cancel.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <numeric>

namespace attncheck {
namespace {

constexpr int kSteps = 1024;  // resolution of a unit-interval draw

// A unit-variance bell-shaped value from a symmetric integer: the logistic quantile ln((1+u)/(1-u)) scaled by
// √3/π, whose variance is 1. The integer 0 maps to 0.
double logistic(int n) {
  // Tabulated: every entry of a normal-regime tensor takes one (a log each was a tenth of a run's time).
  static const std::array<double, 2 * kSteps + 1> table = [] {
    std::array<double, 2 * kSteps + 1> t{};
    for (int m = -kSteps; m <= kSteps; ++m) {
      const double u = double(m) / (kSteps + 1);
      t[std::size_t(m + kSteps)] = std::log((1 + u) / (1 - u)) * std::sqrt(3.0) / M_PI;
    }
    return t;
  }();
  return table[std::size_t(n + kSteps)];
}

}  // namespace

std::string regime_name(Regime r) {
  switch (r) {
    case Regime::small_int: return "small-int";
    case Regime::normal: return "normal";
    case Regime::uniform: return "uniform";
    case Regime::ties: return "ties";
    case Regime::one_hot: return "one-hot";
    case Regime::sparse: return "sparse";
  }
  return "?";
}

double round_to(DType dtype, double x) {
  const double lim = max_finite(dtype) / 2;
  x = std::clamp(x, -lim, lim);
  return visit_dtype(dtype, [x](auto tag) { return double(static_cast<decltype(tag)>(x)); });
}

namespace {

std::vector<Index> towards_one(Index x) {
  std::vector<Index> out;
  auto seq = rc::shrink::towards<Index>(x, 1);
  while (auto v = seq.next()) out.push_back(*v);
  return out;
}

// The divisors of n, ascending.
// O(sqrt n): each divisor k <= sqrt(n) brings its partner n / k (a linear scan took 45 s at n = 999999999).
std::vector<Index> divisors(Index n) {
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
std::vector<Index> inner_divisors(Index n) {
  std::vector<Index> d = divisors(n);
  return d.size() > 2 ? std::vector<Index>(d.begin() + 1, d.end() - 1) : std::vector<Index>{};
}

// 0, 1, ..., n-1: the coordinates of an axis nothing was deleted from.
std::vector<Index> iota(Index n) {
  std::vector<Index> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), Index{0});
  return v;
}

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

// A shape whose T_k changed from old_T_k keeps its key lengths inside [0, T_k], in one of two ways: each batch
// entry keeps its padding (the number of padded keys at its end, as far as T_k allows), or its length (clamped
// to T_k). A bug that needs a padded key after the real ones shows under the first; one that needs a real
// key before the padded ones (a length of 1, say) under the second. Offering only one stops shrinking early.
CaseShape fit_key_lengths(CaseShape c, Index old_T_k, bool keep_padding) {
  if (c.key_lengths.empty()) return c;
  c.key_lengths.resize(std::size_t(c.B), c.T_k);
  for (Index& len : c.key_lengths)
    len = keep_padding ? std::clamp<Index>(c.T_k - (old_T_k - len), 0, c.T_k) : std::min(len, c.T_k);
  return c;
}

// ---- block and dense masks (CaseShape::Cells) ----

std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
std::uint64_t cell_hash(std::uint64_t seed, Index a, Index b, Index c, Index d) {
  std::uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ull);
  for (const Index x : {a, b, c, d}) h = mix64(h ^ (std::uint64_t(x) + 0x9e3779b97f4a7c15ull));
  return h;
}
// The coordinates of the mask entry that (b, h) reads: 0 on a broadcast axis.
Index cell_b(const CaseShape& s, Index b) { return s.cells.per_batch ? s.b_ids[std::size_t(b)] : 0; }
Index cell_h(const CaseShape& s, Index h) { return s.cells.per_head ? s.h_ids[std::size_t(h)] : 0; }

// Whether the cell of query i, key j (positions) of mask entry (b, h) is visible (before the blocks' kinds).
bool cell_visible(const CaseShape& s, Index b, Index h, Index i, Index j) {
  const CaseShape::Cells& m = s.cells;
  const Index bc = cell_b(s, b), hc = cell_h(s, h), qc = s.q_ids[std::size_t(i)], kc = s.k_ids[std::size_t(j)];
  const std::array<Index, 4> at{bc, hc, qc, kc};
  if (std::find(m.shown_cells.begin(), m.shown_cells.end(), at) != m.shown_cells.end()) return true;
  switch (m.pattern) {
    case 0: return int(cell_hash(m.seed, bc, hc, qc, kc) % 100) < m.density;
    case 1: return kc <= qc;
    default: return true;
  }
}

// The dense cells of s's mask, [B or 1, H or 1, T_q, T_k].
DenseMask cells_of(const CaseShape& s) {
  DenseMask d;
  d.B = s.cells.per_batch ? s.B : 1;
  d.H = s.cells.per_head ? s.H : 1;
  d.T_q = s.T_q;
  d.T_k = s.T_k;
  d.cells.resize(std::size_t(d.B * d.H * d.T_q * d.T_k));
  std::size_t n = 0;
  for (Index b = 0; b < d.B; ++b)
    for (Index h = 0; h < d.H; ++h)
      for (Index i = 0; i < d.T_q; ++i)
        for (Index j = 0; j < d.T_k; ++j) d.cells[n++] = cell_visible(s, b, h, i, j);
  return d;
}

// What block (x, y)'s kind is keyed by: the tile of the drawn block grid (grid_q x grid_k, the block sizes as
// first drawn) that holds the coordinates of its first query and first key. So deleting a position keeps every
// block's kind that does not start elsewhere, and smaller blocks inherit the kind of the drawn block they lie in.
std::array<Index, 2> block_coords(const CaseShape& s, Index x, Index y) {
  return {s.q_ids[std::size_t(x * s.cells.block_q)] / s.cells.grid_q,
          s.k_ids[std::size_t(y * s.cells.block_k)] / s.cells.grid_k};
}

// s's block mask: kinds at random (keyed by block_coords), all partial, or the cells' block encoding; then the
// blocks shrinking made full.
BlockMask block_mask_of(const CaseShape& s) {
  const CaseShape::Cells& m = s.cells;
  const DenseMask d = cells_of(s);
  BlockMask bm = block_encoding(d, m.block_q, m.block_k);
  bool partial = false;
  for (Index b = 0; b < bm.B; ++b)
    for (Index h = 0; h < bm.H; ++h)
      for (Index x = 0; x < bm.q_blocks; ++x)
        for (Index y = 0; y < bm.k_blocks; ++y) {
          std::uint8_t& k = bm.kinds[std::size_t(((b * bm.H + h) * bm.q_blocks + x) * bm.k_blocks + y)];
          const auto [qc, kc] = block_coords(s, x, y);
          if (m.kinds == 0) k = std::uint8_t(cell_hash(m.seed ^ 0x5bd1e995u, cell_b(s, b), cell_h(s, h), qc, kc) % 3);
          if (m.kinds == 1) k = std::uint8_t(BlockKind::Partial);
          const std::array<Index, 4> at{cell_b(s, b), cell_h(s, h), qc, kc};
          if (std::find(m.full_blocks.begin(), m.full_blocks.end(), at) != m.full_blocks.end())
            k = std::uint8_t(BlockKind::Full);
          partial |= k == std::uint8_t(BlockKind::Partial);
        }
  bm.partial = partial ? d : DenseMask{};
  return bm;
}

// Key j deleted: every sequence that held it is one key shorter (its padding stays where it was).
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

// What the shrinking of a run's shapes may do: T_q != T_k and grouped heads only where the law and the
// implementation allow them, nothing below min_T, nothing at all to a pinned shape.
struct ShrinkRules {
  bool cross = false, gqa = false;
  Capabilities caps;
  Index min_T = 1;
  bool pinned = false;
  ProblemOptions opts;  ///< what `require` holds is never shrunk away
  std::vector<Index> long_lengths{};  ///< GenConfig::long_lengths: T moves only between these
};

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
std::vector<CaseShape> shape_shrinks(const CaseShape& s, const ShrinkRules& rules) {
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

}  // namespace

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

namespace {

// The shape a case starts from (shrinking is shape_shrinks', under these rules).
// What each feature of a case drew, whether it was turned on or not (Drawn), and which features a law and the
// implementation allow (Allowed): a combination turns features on with the values they drew.
struct Drawn {
  std::vector<Index> key_lengths{};
  std::optional<Index> window{}, window_right{};
  std::vector<std::vector<Index>> doc_coords{}, q_doc_coords{};
  Index chunk = 0, prefix = 0, D_v = 0;
  int cells_kind = 0;  // 2 a block mask, 1 a dense mask
};
struct Allowed {
  bool cross = false;     // T_q != T_k
  FeatureSet features{};  // each feature the law and the implementation allow
};

// Turns on, in `s`, each allowed feature whose bit is set (one bit each, in a fixed order: which bit is which never
// depends on what else is allowed), with the value it drew; the regime bits make T_q < T_k, T_q > T_k or T_q == T_k
// (where declared) and the alignment bit bottom-right. Draws nothing: the lengths are reordered, not redrawn.
void apply_combination(CaseShape& s, const Drawn& d, std::uint64_t bits, const Allowed& a, const Capabilities& caps,
                       Index min_T, Index max_H_kv) {
  const auto bit = [bits](int n) { return (bits >> n) & 1u; };
  const auto on = [&](Feature f, int n) { return a.features.has(f) && bit(n); };
  if (a.cross && bit(0)) {  // the cross-length regime: fewer queries than keys (bit 1) or more
    const Index lo = std::min(s.T_q, s.T_k), hi = std::max(s.T_q, s.T_k);
    const Index shorter = lo < hi ? lo : std::max(min_T, lo - 1), longer = lo < hi ? hi : lo + 1;
    const bool fewer = bit(1);
    const Index T_q = fewer ? shorter : longer, T_k = fewer ? longer : shorter;
    if (T_q != T_k && T_q >= min_T && T_k >= min_T && caps.supports_lengths(T_q, T_k)) {
      s.T_q = T_q;
      s.T_k = T_k;
    }
  }
  if (bit(2) && s.T_q != s.T_k && caps.supports(CausalAlignment::BottomRight)) s.alignment = CausalAlignment::BottomRight;
  if (on(Feature::gqa, 3) && s.H_kv == s.H && s.H > 1) {  // grouped: the largest kv-head count below H it allows
    const std::vector<Index> ds = divisors(s.H);
    for (auto it = ds.rbegin(); it != ds.rend(); ++it)
      if (*it < s.H && (max_H_kv <= 0 || *it <= max_H_kv)) {
        s.H_kv = *it;
        break;
      }
  }
  if (on(Feature::key_padding, 4) && s.key_lengths.empty() && !d.key_lengths.empty())
    s.key_lengths.assign(d.key_lengths.begin(), d.key_lengths.begin() + std::min<Index>(s.B, Index(d.key_lengths.size())));
  if (on(Feature::window, 5) && !s.window) s.window = d.window;
  if (on(Feature::documents, 6) && s.doc_coords.empty()) s.doc_coords = d.doc_coords;
  if (on(Feature::query_documents, 7) && !s.doc_coords.empty() && s.q_doc_coords.empty())
    s.q_doc_coords = d.q_doc_coords;
  if (on(Feature::chunked_local, 8) && s.chunk == 0) s.chunk = d.chunk;
  if (on(Feature::bidirectional, 9)) {
    s.bidirectional = true;
    s.prefix = 0;  // meaningless without the causal rule
  }
  if (on(Feature::prefix, 10) && !s.bidirectional && s.prefix == 0) s.prefix = d.prefix;
  if (on(Feature::right_window, 11) && !s.window_right) s.window_right = d.window_right;
  const bool small = double(s.B) * double(s.H) * double(s.T_q) * double(s.T_k) <= double(1 << 18);
  const bool cells = a.features.has(Feature::block_mask) || a.features.has(Feature::dense_mask);
  if (cells && bit(12) && s.cells.kind == 0 && small) s.cells.kind = d.cells_kind;
  if (!small) s.cells.kind = 0;
  if (on(Feature::v_head_dim, 13) && s.D_v == 0 && d.D_v > 0) {
    s.D_v = d.D_v;
    s.dv_ids = iota(s.D_v);
  }
  // The lengths may have changed: every bound within them (fit_key_lengths clamps the key lengths later).
  for (auto& bounds : s.doc_coords)
    for (Index& b : bounds) b = std::min(b, s.T_k);
  for (auto& bounds : s.q_doc_coords)
    for (Index& b : bounds) b = std::min(b, s.T_q);
}

// What the first draw of a run's shapes needs, fixed for the run: its bounds, the features the law and the
// implementation allow, and the generators of T and D. first_shape makes the draws in the order of the draw_*
// functions below, each feature after everything it may change, so that a feature adds draws without moving an
// earlier one. The rule that makes a case's draws independent of what shrinks later: every draw is
// unconditional, made whatever the values drawn before it (a draw made only for some values of an earlier one
// would shift every later draw when shrinking changes that value, and the case would change entirely instead of
// shrinking). Conditions on the run (its capabilities and options) are fine: they never change within a run.
struct ShapeDraws {
  GenConfig cfg;
  ProblemOptions opts;
  Index min_T = 1, max_T = 1, max_tail = 1;
  std::vector<Index> edges{}, tail_edges{};  // tile edges up to max_T and up to max_tail
  FeatureSet allowed{};                  // the features a case may use (ProblemOptions::may_use)
  bool cross = false;                    // T_q != T_k allowed
  // --long's key lengths (empty: an ordinary run); with the queries bounded (long_max_T_q), only where a case may be
  // a cache call (a law that draws square cases only then gets the ordinary lengths).
  std::vector<Index> long_lengths{};
  bool cache_shapes = false;  // a cross-length case may become a decode step or a prefill chunk
  bool empty_rows = false;    // every case has a row that sees no key (T_q > T_k, bottom-right)
  rc::Gen<Index> gen_D = rc::gen::just(Index{1});

  const Capabilities& caps() const { return cfg.caps; }
  bool has(Feature f) const { return allowed.has(f); }
  // T: usually in [min_T, max_T], one case in three at a tile edge (2^k, 2^k ± 1, 16m, 16m ± 1: where tiled
  // kernels change loop trip counts and leave ragged ends), one in ten in the tail up to max_tail (an edge or
  // anywhere). inRange scales with size, so long sequences come only as RapidCheck's size grows.
  rc::Gen<Index> gen_T() const {
    const auto pick = [](std::vector<Index> from) {
      return rc::gen::map(rc::gen::inRange<std::size_t>(0, from.size()), [from](std::size_t k) { return from[k]; });
    };
    std::vector<std::pair<std::size_t, rc::Gen<Index>>> choices{{12, rc::gen::inRange<Index>(min_T, max_T + 1)}};
    if (!edges.empty()) choices.push_back({6, pick(edges)});
    if (max_tail > max_T) {
      choices.push_back({1, rc::gen::inRange<Index>(min_T, max_tail + 1)});
      choices.push_back({1, pick(tail_edges)});
    }
    return rc::gen::join(weighted_choice(choices));
  }
};

ShapeDraws shape_draws(const GenConfig& cfg, const ProblemOptions& opts) {
  ShapeDraws d{.cfg = cfg, .opts = opts};
  const Capabilities& caps = cfg.caps;
  d.min_T = std::max<Index>(cfg.min_T, 1);
  d.max_T = std::max(d.min_T, std::min<Index>(cfg.max_T, caps.max_T));
  d.max_tail = std::max<Index>(d.max_T, std::min<Index>(cfg.max_T_tail, caps.max_T));
  d.edges = tile_edge_lengths(d.min_T, d.max_T);
  d.tail_edges = tile_edge_lengths(d.min_T, d.max_tail);
  d.gen_D = gen_head_dim(cfg);
  d.cross = opts.allow_cross_lengths && caps.cross_lengths;
  const FeatureSet declared = declared_features(caps);
  for (const FeatureRow& f : kFeatures)
    if (opts.may_use(f.id, declared)) d.allowed.add(f.id);
  // KV-cache shapes (a decode step, a prefill chunk) are bottom-right cross-length calls, of any length: not
  // under --min-T above 1 or a pinned shape.
  const bool cache_possible = d.cross && caps.q_shorter && caps.supports(CausalAlignment::BottomRight);
  if (!cfg.shape && (cfg.long_max_T_q <= 0 || cache_possible)) d.long_lengths = cfg.long_lengths;
  d.cache_shapes = cache_possible && d.max_tail >= 2 && d.min_T <= 1 && !cfg.shape && d.long_lengths.empty();
  d.empty_rows = opts.require_empty_row && d.cross && caps.q_longer && caps.supports(CausalAlignment::BottomRight);
  return d;
}

// B, H, T_q, T_k (as many cases cross-length as not, where allowed) and D; a pinned shape's instead. Whether T_k
// differs from T_q.
bool draw_extents(const ShapeDraws& d, CaseShape& s) {
  s.B = *rc::gen::inRange<Index>(1, d.cfg.max_B + 1);
  s.H = *rc::gen::inRange<Index>(1, d.cfg.max_H + 1);
  s.T_q = *d.gen_T();
  const bool differ = d.cross && *weighted_choice<bool>({{2, false}, {1, true}});
  const Index T_k = *d.gen_T();
  s.T_k = differ ? T_k : s.T_q;
  s.D = *d.gen_D;
  if (const auto& pinned = d.cfg.shape) {
    s.B = (*pinned)[0];
    s.H = (*pinned)[1];
    s.T_q = (*pinned)[2];
    s.T_k = (*pinned)[3];
    s.D = (*pinned)[4];
  }
  return differ;
}

// --long: keys of a long length; a decode step (half the cases), a prefill chunk of up to 64 queries (or
// long_max_T_q), or square (unless long_max_T_q bounds the queries), both cross ones bottom-right where declared
// (square otherwise).
void draw_long_lengths(const ShapeDraws& d, CaseShape& s) {
  if (d.long_lengths.empty()) return;
  const Index len_pick = *rc::gen::inRange<Index>(0, 1 << 20);
  const int kind = *weighted_choice<int>({{2, 0}, {1, 1}, {1, 2}});
  const Index q_pick = *rc::gen::inRange<Index>(0, 1 << 20);
  const Index long_max_T_q = d.cfg.long_max_T_q;
  s.T_k = d.long_lengths[std::size_t(len_pick) % d.long_lengths.size()];
  const bool cache = d.cross && d.caps().q_shorter && d.caps().supports(CausalAlignment::BottomRight);
  const Index chunk_max = std::min<Index>(long_max_T_q > 0 ? long_max_T_q : 64, s.T_k - 1);
  if (!cache || (kind == 2 && long_max_T_q == 0)) {
    s.T_q = s.T_k;
  } else {
    s.T_q = kind == 1 && chunk_max >= 2 ? 2 + q_pick % (chunk_max - 1) : 1;
    s.alignment = CausalAlignment::BottomRight;
  }
}

void draw_alignment(const ShapeDraws& d, CaseShape& s) {
  const Capabilities& caps = d.caps();
  if (!caps.alignments.empty()) {
    std::vector<std::pair<std::size_t, CausalAlignment>> choices;
    for (const auto a : caps.alignments) choices.emplace_back(1, a);
    const CausalAlignment drawn = *weighted_choice(choices);
    // With T_q == T_k both alignments are the same mask; keep the default unless it is not supported.
    s.alignment = s.T_q != s.T_k || !caps.supports(s.alignment) ? drawn : s.alignment;
  }
  if (!d.long_lengths.empty() && s.T_q != s.T_k) s.alignment = CausalAlignment::BottomRight;  // a cache
}

// H_kv among the divisors of H: all of them (no grouping), one (multi-query), or, a third each, a divisor strictly
// between 1 and H (true grouping: several kv heads, several query heads each). That needs an H such as 4 or 6,
// rare among small draws, so such a case takes the largest one within --max-H (never with a pinned shape: its H is
// the user's).
void draw_kv_heads(const ShapeDraws& d, CaseShape& s) {
  s.H_kv = s.H;
  if (!d.has(Feature::gqa)) return;
  const int kind = *rc::gen::inRange(0, 3);
  const Index pick = *rc::gen::inRange<Index>(0, 1 << 20);
  if (kind == 2 && inner_divisors(s.H).empty() && !d.cfg.shape)
    for (Index h = d.cfg.max_H; h > s.H; --h)
      if (!inner_divisors(h).empty()) {
        s.H = h;
        break;
      }
  const std::vector<Index> ds = divisors(s.H), inner = inner_divisors(s.H);
  s.H_kv = kind == 0 ? s.H : kind == 1 || inner.empty() ? 1 : inner[std::size_t(pick) % inner.size()];
  if (d.cfg.max_H_kv > 0 && s.H_kv > d.cfg.max_H_kv)  // the largest divisor within --max-Hkv
    s.H_kv = *std::prev(std::upper_bound(ds.begin(), ds.end(), d.cfg.max_H_kv));
}

// Half the cases padded; each entry's length is then T_k (unpadded), 0 (all padding) or anywhere between.
void draw_key_lengths(const ShapeDraws& d, CaseShape& s, Drawn& drawn) {
  if (!d.has(Feature::key_padding)) return;
  const bool padded = *rc::gen::arbitrary<bool>();
  std::vector<Index> lengths;
  for (Index b = 0; b < d.cfg.max_B; ++b) {
    const int kind = *weighted_choice<int>({{2, 2}, {1, 0}, {1, 1}});
    const Index pick = *rc::gen::inRange<Index>(0, 1 << 20);
    lengths.push_back(kind == 0 ? s.T_k : kind == 1 ? 0 : pick % (s.T_k + 1));
  }
  drawn.key_lengths = lengths;
  if (padded || d.opts.require.has(Feature::key_padding))
    s.key_lengths.assign(lengths.begin(), lengths.begin() + std::min<Index>(s.B, d.cfg.max_B));
}

// Half the cases windowed: 0 (a query sees only its own key), 1, at or beyond T (no key is ever old enough to
// leave it, which must equal no window), or anything up to there, a quarter each.
void draw_window(const ShapeDraws& d, CaseShape& s, Drawn& drawn) {
  if (!d.has(Feature::window)) return;
  const bool windowed = *rc::gen::arbitrary<bool>();
  const int kind = *weighted_choice<int>({{1, 0}, {1, 1}, {1, 2}, {1, 3}});  // whatever the size
  const Index pick = *rc::gen::inRange<Index>(0, 1 << 20);
  const Index T = std::max(s.T_q, s.T_k);
  drawn.window = kind == 0 ? 0 : kind == 1 ? 1 : kind == 2 ? T + pick % 3 : pick % (T + 2);
  if (windowed || d.opts.require.has(Feature::window)) s.window = drawn.window;
}

// KV-cache inference: one cross-length case in four becomes a decode step (one query, T_k keys up to max-T), one
// in four a prefill chunk (T_q < T_k queries, the last ones), both bottom-right; the other half stay as drawn
// (T_q > T_k among them: the rows that see no key). Square cases are left alone. Half the decode steps run over a
// long cache, T_k in (max_T / 2, max_T] whatever RapidCheck's size (the other lengths grow with it, so early cases
// are short): split-KV decode kernels change path past their first block of keys (32, 64), and a decode-only bug
// there must be met in every run.
void draw_cache_shape(const ShapeDraws& d, CaseShape& s, bool differ) {
  if (!d.cache_shapes) return;
  const int kind = *weighted_choice<int>({{2, 0}, {1, 1}, {1, 2}});
  const Index pick = *rc::gen::inRange<Index>(0, 1 << 20);
  const std::uint64_t long_pick = *rc::Gen<std::uint64_t>([](const rc::Random& random, int) {
    return rc::shrinkable::just(rc::Random(random).next());  // not scaled by the size
  });
  if (!differ || kind == 0) return;
  const Index old_T_k = s.T_k;
  s.T_k = std::max<Index>({s.T_q, s.T_k, 2});
  const Index long_from = std::max<Index>(2, d.max_T / 2 + 1);
  if (kind == 1 && long_pick % 2 == 0 && d.max_T >= long_from)
    s.T_k = long_from + Index((long_pick / 2) % std::uint64_t(d.max_T - long_from + 1));
  s.T_q = kind == 1 ? 1 : 1 + pick % (s.T_k - 1);
  s.alignment = CausalAlignment::BottomRight;
  s = fit_key_lengths(s, old_T_k, false);
}

// The lengths reordered (no draw, so no later draw shifts): more queries than keys, bottom-right, where every case
// must have a row that sees no key (the first T_q - T_k queries see nothing); and a regime the implementation does
// not declare (T_q < T_k, or T_q > T_k) turned the other way round when that one is declared, else square.
void reorder_lengths(const ShapeDraws& d, CaseShape& s) {
  if (d.cfg.shape) return;
  if (d.empty_rows) {
    if (s.T_q < s.T_k)
      std::swap(s.T_q, s.T_k);
    else if (s.T_q == s.T_k && s.T_k > d.min_T)
      --s.T_k;
    else if (s.T_q == s.T_k)
      ++s.T_q;
    s.alignment = CausalAlignment::BottomRight;
  }
  if (s.T_q != s.T_k && !d.caps().supports_lengths(s.T_q, s.T_k)) {
    if (d.caps().supports_lengths(s.T_k, s.T_q))
      std::swap(s.T_q, s.T_k);
    else
      s.T_k = s.T_q;
  }
}

// Masks beyond causal, drawn after the lengths (so every earlier draw stays as it was) and only for an
// implementation that declares them.

// Half the cases packed: each batch entry 0-4 bounds, each anywhere in [0, T_k], at a tile edge (16m, 16m ± 1,
// 2^k ± 1: where a kernel's tile meets a document boundary) or one of 0, 1, T_k - 1, T_k, or the bound before it
// again (an empty document). Draws are unconditional (a fixed count per entry).
std::vector<std::vector<Index>> draw_doc_bounds(const ShapeDraws& d, const CaseShape& s) {
  const std::vector<Index> edges_k = tile_edge_lengths(1, std::max<Index>(s.T_k, 1));
  std::vector<std::vector<Index>> coords;
  for (Index b = 0; b < std::max(d.cfg.max_B, s.B); ++b) {
    const Index n = *rc::gen::inRange<Index>(0, 5);
    std::vector<Index> bounds;
    for (Index k = 0; k < 4; ++k) {
      const int kind = *weighted_choice<int>({{2, 0}, {2, 1}, {1, 2}, {1, 3}});
      const Index pick = *rc::gen::inRange<Index>(0, 1 << 20);
      if (k >= n) continue;
      const Index ends[] = {0, 1, s.T_k - 1, s.T_k};
      bounds.push_back(kind == 0   ? pick % (s.T_k + 1)
                       : kind == 1 ? edges_k[std::size_t(pick) % edges_k.size()]
                       : kind == 2 ? (bounds.empty() ? 0 : bounds.back())
                                   : std::max<Index>(0, ends[pick % 4]));
    }
    std::sort(bounds.begin(), bounds.end());
    coords.push_back(std::move(bounds));
  }
  return coords;
}

// Query bounds of their own (cu_seqlens_q beside cu_seqlens_k) for key bounds `coords`: each bound where the
// derived one would be (the query at the key bound's aligned position) moved by -2 .. 2, or anywhere in [0, T_q],
// or at 0 or T_q (a document without queries); as many as the entry's key bounds. Draws are unconditional (four per
// entry).
std::vector<std::vector<Index>> draw_query_doc_bounds(const CaseShape& s, const std::vector<std::vector<Index>>& coords) {
  const Index offset = s.alignment == CausalAlignment::BottomRight ? s.T_k - s.T_q : 0;
  std::vector<std::vector<Index>> q_coords;
  for (std::size_t b = 0; b < coords.size(); ++b) {
    std::vector<Index> bounds;
    for (std::size_t k = 0; k < 4; ++k) {
      const int kind = *weighted_choice<int>({{3, 0}, {1, 1}, {1, 2}});
      const Index pick = *rc::gen::inRange<Index>(0, 1 << 20);
      if (k >= coords[b].size()) continue;
      const Index at = coords[b][k] - offset + pick % 5 - 2;
      bounds.push_back(
          std::clamp<Index>(kind == 0 ? at : kind == 1 ? pick % (s.T_q + 1) : (pick % 2 ? s.T_q : 0), 0, s.T_q));
    }
    std::sort(bounds.begin(), bounds.end());
    q_coords.push_back(std::move(bounds));
  }
  return q_coords;
}

// Half the cases packed, and half of those (where declared) with query bounds of their own.
void draw_documents(const ShapeDraws& d, CaseShape& s, Drawn& drawn) {
  if (!d.has(Feature::documents)) return;
  const bool packed = *rc::gen::arbitrary<bool>();
  std::vector<std::vector<Index>> coords = draw_doc_bounds(d, s);
  const bool with = packed || d.opts.require.has(Feature::documents);
  if (d.has(Feature::query_documents)) {
    const bool own = *rc::gen::arbitrary<bool>();
    std::vector<std::vector<Index>> q_coords = draw_query_doc_bounds(s, coords);
    drawn.q_doc_coords = q_coords;
    if (own && with) s.q_doc_coords = std::move(q_coords);
  }
  drawn.doc_coords = coords;
  if (with) s.doc_coords = std::move(coords);
}

// A quarter of the cases chunked: 1 (a query sees only itself), 2, a tile (16, 32, 64), a tile ± 1, at or past T
// (one chunk: must equal no chunking), or anything in [1, T].
void draw_chunks(const ShapeDraws& d, CaseShape& s, Drawn& drawn) {
  if (!d.has(Feature::chunked_local)) return;
  const Index T = std::max(s.T_q, s.T_k);
  const bool chunked = *weighted_choice<bool>({{3, false}, {1, true}});
  const int kind = *rc::gen::inRange(0, 6);
  const Index pick = *rc::gen::inRange<Index>(0, 1 << 20);
  const Index tiles[] = {16, 32, 64};
  const Index size = kind == 0   ? 1
                     : kind == 1 ? 2
                     : kind == 2 ? tiles[pick % 3]
                     : kind == 3 ? tiles[pick % 3] + (pick / 3 % 2 ? 1 : -1)
                     : kind == 4 ? T + Index(pick % 3)
                                 : 1 + Index(pick % std::max<Index>(T, 1));
  drawn.chunk = size;
  if (chunked || d.opts.require.has(Feature::chunked_local)) s.chunk = size;
}

// A quarter of the cases without the causal rule (an encoder).
void draw_bidirectional(const ShapeDraws& d, CaseShape& s) {
  if (!d.has(Feature::bidirectional)) return;
  const bool none = *weighted_choice<bool>({{3, false}, {1, true}});
  if (none || d.opts.require.has(Feature::bidirectional)) s.bidirectional = true;
}

// A quarter of the cases with a bidirectional prefix: 1, a tile edge, T (everything bidirectional), or anything in
// [1, T]. Meaningless without the causal rule, so not drawn then.
void draw_prefix(const ShapeDraws& d, CaseShape& s, Drawn& drawn) {
  if (!d.has(Feature::prefix)) return;
  const Index T = std::max(s.T_q, s.T_k);
  const bool with = *weighted_choice<bool>({{3, false}, {1, true}});
  const int kind = *rc::gen::inRange(0, 4);
  const Index pick = *rc::gen::inRange<Index>(0, 1 << 20);
  const std::vector<Index> edges_t = tile_edge_lengths(1, std::max<Index>(T, 1));
  const Index size = kind == 0   ? 1
                     : kind == 1 ? edges_t[std::size_t(pick) % edges_t.size()]
                     : kind == 2 ? T
                                 : 1 + Index(pick % std::max<Index>(T, 1));
  drawn.prefix = size;
  if ((with || d.opts.require.has(Feature::prefix)) && !s.bidirectional) s.prefix = size;
}

// A quarter of the cases with a right window (with the causal rule it changes nothing but the prefix's reach): 0,
// 1, at or past T, or anything up to there.
void draw_right_window(const ShapeDraws& d, CaseShape& s, Drawn& drawn) {
  if (!d.has(Feature::right_window)) return;
  const Index T = std::max(s.T_q, s.T_k);
  const bool with = *weighted_choice<bool>({{3, false}, {1, true}});
  const int kind = *rc::gen::inRange(0, 4);
  const Index pick = *rc::gen::inRange<Index>(0, 1 << 20);
  drawn.window_right = kind == 0 ? 0 : kind == 1 ? 1 : kind == 2 ? T + Index(pick % 3) : Index(pick % (T + 2));
  if (with || d.opts.require.has(Feature::right_window)) s.window_right = drawn.window_right;
}

// A third of the cases with a block mask and a third with a dense mask (where declared): blocks of 1, 2, 3, 4, 16,
// 64, 128 (FlexAttention's default) or at or past T (one block), each axis on its own half the time; one mask for
// every batch entry and head, or one per entry, per head or both (a kernel that broadcasts over the wrong axis
// reads another's); cells at random (density 10-90%), k <= q (a causal block mask) or all visible; blocks at
// random, all partial, or the cells' block encoding.
void draw_cell_masks(const ShapeDraws& d, CaseShape& s, Drawn& drawn) {
  const bool block_masks = d.has(Feature::block_mask), dense_masks = d.has(Feature::dense_mask);
  if (!block_masks && !dense_masks) return;
  const Index T = std::max(s.T_q, s.T_k);
  CaseShape::Cells& m = s.cells;
  const int kind = *weighted_choice<int>({{1, 0}, {1, 1}, {1, 2}});
  const Index sizes[] = {1, 2, 3, 4, 16, 64, 128, T, T + 1};
  const Index bq = sizes[*rc::gen::inRange<std::size_t>(0, 9)], bk_pick = sizes[*rc::gen::inRange<std::size_t>(0, 9)];
  const bool same = *rc::gen::arbitrary<bool>();
  m.block_q = m.grid_q = std::max<Index>(bq, 1);
  m.block_k = m.grid_k = std::max<Index>(same ? bq : bk_pick, 1);
  m.per_batch = *weighted_choice<bool>({{1, false}, {1, true}});
  m.per_head = *weighted_choice<bool>({{1, false}, {1, true}});
  m.pattern = *weighted_choice<int>({{4, 0}, {2, 1}, {1, 2}});
  m.density = 10 * *rc::gen::inRange(1, 10);
  m.kinds = *weighted_choice<int>({{2, 0}, {1, 1}, {2, 2}});
  m.seed = *rc::gen::arbitrary<std::uint64_t>();
  const ProblemOptions& o = d.opts;
  const bool want_block =
      block_masks && (kind == 2 || o.require.has(Feature::block_mask) || (kind == 1 && !dense_masks));
  const bool want_dense =
      dense_masks && (kind == 1 || o.require.has(Feature::dense_mask) || (kind == 2 && !block_masks));
  // Only where [B,H,T_q,T_k] is small enough to hold per cell (2^18 cells, 256 KiB): a long context's mask would be
  // gigabytes, and FlexAttention's long calls are block-sparse, which the small ones cover.
  const bool small = double(s.B) * double(s.H) * double(s.T_q) * double(s.T_k) <= double(1 << 18);
  m.kind = !small ? 0 : want_block ? 2 : want_dense ? 1 : 0;
  drawn.cells_kind = block_masks ? 2 : 1;
}

// A quarter of the cases (every one whose D the implementation accepts only with a D_v of its own) give V a head
// dimension of its own: any other it accepts with D, up to --max-D (MLA's 576 and 512 where declared); paged too
// (V's pool then has rows D_v wide: FlashMLA's paged latent cache). Smaller than D (MLA's V inside its latent K) or
// larger, half each where both are accepted. A pinned shape (--shape B,H,T_q,T_k,D) keeps D_v = D, unless D is
// accepted only with a D_v of its own (the draw is still made, so that pinning changes no other draw).
void draw_v_head_dim(const ShapeDraws& d, CaseShape& s, Drawn& drawn) {
  if (!d.has(Feature::v_head_dim)) return;
  const Capabilities& caps = d.caps();
  const bool own = *weighted_choice<bool>({{3, false}, {1, true}}) && !d.cfg.shape;
  const bool smaller = *rc::gen::arbitrary<bool>();
  const Index pick = *rc::gen::inRange<Index>(0, 1 << 20);
  const std::vector<Index> with = caps.v_head_dims_with(s.D, std::max(d.cfg.max_D, s.D));
  std::vector<Index> side;
  for (const Index x : with)
    if ((x < s.D) == smaller) side.push_back(x);
  const std::vector<Index>& from = side.empty() ? with : side;
  if (from.empty()) return;
  drawn.D_v = from[std::size_t(pick) % from.size()];
  if (own || !caps.supports_head_dim(s.D)) {
    s.D_v = drawn.D_v;
    s.dv_ids = iota(s.D_v);
  }
}

// Combinations: with two or more features allowed (each on its own share of the cases above), half the cases turn
// on each allowed feature with probability 1/2 (bits of one draw), with the values the feature drew above, and pick
// a cross-length regime and an alignment. Every pair of features then comes in at least 1/8 of the cases, every
// triple in 1/16, two features with one regime bottom-right (a chunk and no causal rule, more queries than keys) in
// 1/64, where on their own shares such a combination came in well under one case in 100.
void draw_combination(const ShapeDraws& d, CaseShape& s, const Drawn& drawn) {
  int combinable = int(d.cross) + int(d.has(Feature::block_mask) || d.has(Feature::dense_mask));
  for (const Feature f : {Feature::gqa, Feature::key_padding, Feature::window, Feature::documents,
                          Feature::chunked_local, Feature::prefix, Feature::right_window, Feature::bidirectional,
                          Feature::v_head_dim})
    combinable += int(d.has(f));
  if (combinable < 2) return;
  const bool combine = *rc::gen::arbitrary<bool>();
  const std::uint64_t bits = *rc::Gen<std::uint64_t>([](const rc::Random& random, int) {
    return rc::shrinkable::just(rc::Random(random).next());  // not scaled by the size
  });
  if (combine && !d.cfg.shape && d.long_lengths.empty())
    apply_combination(s, drawn, bits, Allowed{.cross = d.cross && !d.empty_rows, .features = d.allowed}, d.caps(),
                      d.min_T, d.cfg.max_H_kv);
}

std::pair<rc::Gen<CaseShape>, ShrinkRules> first_shape(const GenConfig& cfg, const ProblemOptions& opts) {
  const ShapeDraws d = shape_draws(cfg, opts);
  // The first value is drawn with ordinary generators, in this order; shrinking is shape_shrinks' alone.
  const auto initial = rc::gen::exec([d] {
    CaseShape s;
    Drawn drawn;  // what each feature drew, used or not: a combination turns it on
    const bool differ = draw_extents(d, s);
    draw_long_lengths(d, s);
    draw_alignment(d, s);
    draw_kv_heads(d, s);
    draw_key_lengths(d, s, drawn);
    draw_window(d, s, drawn);
    draw_cache_shape(d, s, differ);
    reorder_lengths(d, s);
    draw_documents(d, s, drawn);
    draw_chunks(d, s, drawn);
    draw_bidirectional(d, s);
    draw_prefix(d, s, drawn);
    draw_right_window(d, s, drawn);
    draw_cell_masks(d, s, drawn);
    draw_v_head_dim(d, s, drawn);
    draw_combination(d, s, drawn);
    s.b_ids = iota(s.B);
    s.h_ids = iota(s.H);
    s.kv_ids = iota(s.H_kv);
    s.q_ids = iota(s.T_q);
    s.k_ids = iota(s.T_k);
    s.d_ids = iota(s.D);
    return fit_key_lengths(s, s.T_k, false);  // one length per batch entry, each within [0, T_k]
  });
  return {initial, ShrinkRules{.cross = d.cross, .gqa = d.has(Feature::gqa), .caps = cfg.caps, .min_T = d.min_T,
                               .pinned = bool(cfg.shape), .opts = opts, .long_lengths = d.long_lengths}};
}

}  // namespace

rc::Gen<CaseShape> gen_shape(const GenConfig& cfg, const ProblemOptions& opts) {
  const auto [first, shrink_rules] = first_shape(cfg, opts);
  // Init-captures, not captured structured bindings: clang 14 (the fuzz and asan presets) has no P1091.
  return [initial = first, rules = shrink_rules](const rc::Random& random, int size) {
    return rc::shrinkable::shrinkRecur(initial(random, size).value(), [rules](const CaseShape& s) {
      return rc::seq::fromContainer(shape_shrinks(s, rules));
    });
  };
}

rc::Gen<Index> gen_head_dim(const GenConfig& cfg) {
  const Index max_D = cfg.max_D;
  const Capabilities& caps = cfg.caps;
  if (caps.head_dim_multiple > 1 || caps.max_head_dim > 0 || caps.lists_head_dims()) {
    // Only the head dimensions it declares (the CLI refuses a run where none is within --max-D): as below,
    // small ones, any, and powers of two, each as an index into the declared list, so shrinking goes to the
    // smallest declared D.
    const std::vector<Index> allowed = caps.head_dims_up_to(max_D);
    if (allowed.empty()) return rc::gen::just(std::max<Index>(caps.smallest_head_dim(), 1));
    std::vector<std::size_t> pow2;
    for (std::size_t n = 0; n < allowed.size(); ++n)
      if ((allowed[n] & (allowed[n] - 1)) == 0) pow2.push_back(n);
    const auto at = [allowed](std::size_t n) { return allowed[n]; };
    std::vector<std::pair<std::size_t, rc::Gen<Index>>> choices{
        {3, rc::gen::map(rc::gen::inRange<std::size_t>(0, std::min<std::size_t>(allowed.size(), 4)), at)},
        {3, rc::gen::map(rc::gen::inRange<std::size_t>(0, allowed.size()), at)}};
    if (!pow2.empty())
      choices.push_back({2, rc::gen::map(rc::gen::inRange<std::size_t>(0, pow2.size()),
                                         [allowed, pow2](std::size_t n) { return allowed[pow2[n]]; })});
    return rc::gen::join(weighted_choice(choices));
  }
  Index n_pow2 = 0;
  while ((Index{1} << n_pow2) <= max_D) ++n_pow2;
  std::vector<std::pair<std::size_t, rc::Gen<Index>>> choices{
      {3, rc::gen::inRange<Index>(1, std::min<Index>(max_D, 16) + 1)},
      {3, rc::gen::inRange<Index>(1, max_D + 1)},
      {2, rc::gen::map(rc::gen::inRange<Index>(0, n_pow2), [](Index e) { return Index{1} << e; })}};
  // The head dimensions real models use and kernels get wrong: tile-padding granularity (72, 104;
  // 129 padded to 144), non-multiples of 8, 16 and 32 (59, 111 from FlashAttention's tests), MLA's 576, and the
  // common 80 to 256; those within --max-D.
  std::vector<Index> real;
  for (const Index d : {40, 59, 72, 80, 96, 104, 111, 129, 136, 192, 256, 576})
    if (d <= max_D) real.push_back(d);
  if (!real.empty())
    choices.push_back({1, rc::gen::map(rc::gen::inRange<std::size_t>(0, real.size()),
                                       [real](std::size_t n) { return real[n]; })});
  return rc::gen::join(weighted_choice(choices));
}

rc::Gen<double> gen_magnitude() {
  // 10^(n/10) for n uniform in [-30, 40] whatever the size (log-uniform over [1e-3, 1e4]); shrinks toward
  // n = 0, magnitude 1.
  return [](const rc::Random& random, int) {
    const int n = int(rc::Random(random).next() % 71) - 30;
    return rc::shrinkable::map(rc::shrinkable::shrinkRecur(n, [](int x) { return rc::shrink::towards(x, 0); }),
                               [](int x) { return std::pow(10.0, x / 10.0); });
  };
}

namespace {

// A per-coordinate random integer in [-lim, lim]: the value at (b,h,i,d) depends only on the case's base seed
// and those four numbers, never on the shape. So when shrinking makes T or D smaller, the entries that remain
// keep their values and the case usually still fails, and shrinking can go on down to the smallest shape.
// The key is mixed by splitmix64's finalizer (Steele, Lea and Flood, "Fast splittable pseudorandom number
// generators", OOPSLA 2014): a bijection of 64-bit words in which every output bit depends on every input bit, and
// whose outputs pass BigCrush. It was rc::Random(key).next(), a Threefish block per entry: a quarter of the CPU
// time of a run of every law, for one integer an entry. The randomness still comes from RapidCheck alone (`base`
// is drawn from the case's rc::Random); this only spreads it over the coordinates.
int coord_int(std::uint64_t base, Index b, Index h, Index i, Index d, int lim) {
  std::uint64_t key = base;
  for (const Index c : {b, h, i, d}) key = (key ^ std::uint64_t(c)) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull;
  key = (key ^ (key >> 30)) * 0xbf58476d1ce4e5b9ull;
  key = (key ^ (key >> 27)) * 0x94d049bb133111ebull;
  key ^= key >> 31;
  return int(key % std::uint64_t(2 * lim + 1)) - lim;
}

}  // namespace

namespace {

// A small integer (|n| <= 64) or a power of two (2^e, e of any sign): what values shrink toward.
bool is_simple(double x) {
  if (x == 0 || (x == std::trunc(x) && std::abs(x) <= 64)) return true;
  int e = 0;
  return std::isfinite(x) && std::abs(std::frexp(x, &e)) == 0.5;
}

}  // namespace

std::vector<double> simple_values(double x, DType dtype) {
  std::vector<double> out;
  if (x == 0 || !std::isfinite(x)) return out;
  const double sign = x < 0 ? -1 : 1;
  const auto add = [&](double c) {
    c = round_to(dtype, c);
    if (c != x && is_simple(c) && std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  };
  add(0);
  add(sign);
  if (x == std::trunc(x) && std::abs(x) <= 64) {  // a small integer: smaller ones only
    auto seq = rc::shrink::towards<int>(int(x), 0);
    while (auto n = seq.next()) add(*n);
    return out;
  }
  int e = 0;
  if (is_simple(x)) {  // a power of two: exponents toward 0 only
    std::frexp(x, &e);
    auto seq = rc::shrink::towards<int>(e - 1, 0);
    while (auto n = seq.next()) add(sign * std::ldexp(1.0, *n));
    return out;
  }
  add(sign * std::exp2(std::round(std::log2(std::abs(x)))));
  if (std::abs(std::round(x)) <= 64) add(std::round(x));
  return out;
}

rc::Gen<Tensor<double>> gen_tensor(const Shape& s, Regime regime, double magnitude, DType dtype) {
  return gen_tensor(s, Coords{}, regime, magnitude, dtype);
}

namespace {

// The drawn value of every entry of a tensor of shape s whose entries sit at coordinates `at`: a function of the
// regime, the magnitude, `base` and each entry's coordinates only (coord_int), rounded to the dtype.
std::vector<double> draw_values(const Shape& s, const Coords& at, Regime regime, double magnitude, DType dtype,
                                std::uint64_t base, int size) {
  const auto coord = [](const std::vector<Index>& ids, Index x) { return ids.empty() ? x : ids[std::size_t(x)]; };
  // Like rc::gen::inRange, the range grows with RapidCheck's size, so the first cases are the simplest.
  const auto lim = [size](int max_abs) { return std::max(1, int(std::int64_t(max_abs) * std::min(size, 100) / 100)); };
  // Each entry's integer maps to its value in the regime.
  const auto value = [=](int r) -> double {
    switch (regime) {
      case Regime::small_int: return r;
      case Regime::normal: return magnitude * logistic(r);
      case Regime::uniform:
      case Regime::ties: return magnitude * r / kSteps;
      case Regime::one_hot: return magnitude * r;
      case Regime::sparse: return r % 4 ? 0.0 : magnitude * logistic(r / 4);  // three entries in four are 0
    }
    return 0;
  };
  std::vector<double> values(std::size_t(s.numel()));
  std::size_t n = 0;
  for (Index bx = 0; bx < s.B; ++bx)
    for (Index hx = 0; hx < s.H; ++hx)
      for (Index ix = 0; ix < s.T; ++ix)
        for (Index d = 0; d < s.D; ++d, ++n) {
          const Index b = coord(at.b, bx), h = coord(at.h, hx), i = coord(at.i, ix), c = coord(at.d, d);
          int r = 0;
          switch (regime) {
            case Regime::small_int: r = coord_int(base, b, h, i, c, 3); break;
            case Regime::ties: r = coord_int(base, 0, 0, 0, 0, lim(kSteps)); break;
            case Regime::one_hot:  // the row's hot column, drawn per row and folded into [0, D)
              r = (d == std::abs(coord_int(base, b, h, i, 0, 1 << 20)) % s.D) ? 1 : 0;
              break;
            case Regime::sparse: r = coord_int(base, b, h, i, c, 4 * lim(kSteps)); break;
            default: r = coord_int(base, b, h, i, c, lim(kSteps)); break;
          }
          values[n] = round_to(dtype, value(r));
        }
  return values;
}

// Every vector with one value replaced by a simpler one (simple_values), lazily.
rc::Seq<std::vector<double>> value_shrinks(const std::vector<double>& v, DType dtype) {
  return rc::shrink::eachElement(v, [dtype](double x) { return rc::seq::fromContainer(simple_values(x, dtype)); });
}

Tensor<double> as_tensor(const Shape& s, const double* v) {
  Tensor<double> t(s);
  std::copy(v, v + s.numel(), t.data());
  return t;
}

}  // namespace

rc::Gen<Tensor<double>> gen_tensor(const Shape& s, const Coords& at, Regime regime, double magnitude, DType dtype) {
  return [=](const rc::Random& random, int size) {
    const std::uint64_t base = rc::Random(random).next();
    return rc::shrinkable::map(
        rc::shrinkable::shrinkRecur(draw_values(s, at, regime, magnitude, dtype, base, size),
                                    [dtype](const std::vector<double>& v) { return value_shrinks(v, dtype); }),
        [s](const std::vector<double>& v) { return as_tensor(s, v.data()); });
  };
}

namespace {

// The tags of a case's lengths, head dimensions, heads, key lengths and window.
void tag_extents(const Problem& p, std::vector<std::string>& tags) {
  const Shape& q = p.q.shape();
  const Index T = q.T;
  tags.push_back(T == 1 ? "T=1" : T < 16 ? "T=2..15" : T <= 64 ? "T=16..64" : "T>64");
  // Key lengths at a tile edge, where tiled kernels change trip counts or leave a ragged last tile.
  const Index T_k = p.k.shape().T;
  const auto pow2 = [](Index x) { return x > 0 && (x & (x - 1)) == 0; };
  if (T_k >= 2 && pow2(T_k)) tags.push_back("T_k=2^k");
  if (T_k >= 3 && (pow2(T_k - 1) || pow2(T_k + 1))) tags.push_back("T_k=2^k+-1");
  if (T_k >= 15 && (T_k % 16 <= 1 || T_k % 16 == 15)) tags.push_back("T_k=16m,16m+-1");
  if (T_k > 16) tags.push_back("T_k>16 (two key tiles of 16)");
  const Index D = q.D;
  const Index r = Index(std::lround(std::sqrt(double(D))));
  tags.push_back(pow2(D) ? "D=pow2" : "D=non-pow2");
  if (D % 2) tags.push_back("D=odd");
  if (r * r != D) tags.push_back("D=non-square");
  if (p.v_dim() != D) tags.push_back(p.v_dim() < D ? "D_v<D" : "D_v>D");  // V's own head dimension (MLA)
  if (p.k.shape().T != T) tags.push_back("T_q!=T_k");
  if (p.kv_heads() != q.H) tags.push_back(p.kv_heads() == 1 ? "H_kv=1<H (MQA)" : "1<H_kv<H (GQA)");
  if (!p.key_lengths.empty()) {
    // Each kind of length once per case: all padding, none, and some.
    const Index T_k = p.k.shape().T;
    bool zero = false, full = false, partial = false;
    for (const Index len : p.key_lengths) (len == 0 ? zero : len == T_k ? full : partial) = true;
    tags.push_back("padded");
    if (zero) tags.push_back("length=0");
    if (full) tags.push_back("length=T_k");
    if (partial) tags.push_back("length=partial");
  }
  if (p.window) {
    const Index w = *p.window, T_max = std::max(T, p.k.shape().T);
    tags.push_back(w == 0 ? "window=0" : w == 1 ? "window=1" : w >= T_max ? "window>=T" : "window=2..T-1");
  }
}

// The tags of the masks beyond causal.
void tag_masks(const Problem& p, std::vector<std::string>& tags) {
  const Index T = p.q.shape().T;
  if (!p.causal) tags.push_back("bidirectional");
  if (p.prefix_length > 0) tags.push_back(p.prefix_length >= T ? "prefix>=T" : "prefix");
  if (p.window_right) tags.push_back("window-right");
  if (p.chunk_size > 0) tags.push_back(p.chunk_size >= std::max(T, p.k.shape().T) ? "chunk>=T" : "chunked");
  if (p.block_mask) {
    const BlockMask& m = *p.block_mask;
    bool kinds[3] = {false, false, false};
    for (const std::uint8_t k : m.kinds) kinds[std::min<std::uint8_t>(k, 2)] = true;
    tags.push_back(std::string("block-mask:") + (kinds[0] ? "E" : "") + (kinds[1] ? "P" : "") + (kinds[2] ? "F" : ""));
    if (m.B > 1 || m.H > 1) tags.push_back("block-mask:per-" + std::string(m.B > 1 && m.H > 1 ? "batch-and-head" : m.B > 1 ? "batch" : "head"));
    if (m.block_q != m.block_k) tags.push_back("block-mask:block_q!=block_k");
  }
  if (p.dense_mask) tags.push_back(p.dense_mask->B > 1 || p.dense_mask->H > 1 ? "dense-mask:per-entry" : "dense-mask");
  if (!p.doc_bounds.empty()) {
    tags.push_back("documents");
    for (const auto& bounds : p.doc_bounds)
      if (std::adjacent_find(bounds.begin(), bounds.end()) != bounds.end() ||
          (!bounds.empty() && (bounds.front() == 0 || bounds.back() >= p.k.shape().T))) {
        tags.push_back("empty-document");
        break;
      }
    if (!p.q_doc_bounds.empty()) tags.push_back("query-documents");
  }
}

// Which features of the call came together: each pair of those on (a bug that needs two, or three, shows only
// where they meet), so a run's coverage says which combinations it reached.
void tag_combinations(const Problem& p, std::vector<std::string>& tags) {
  const Shape& q = p.q.shape();
  const Index T = q.T, T_k = p.k.shape().T, D = q.D;
  std::vector<std::string> on;
  if (T < T_k) on.push_back(p.alignment == CausalAlignment::BottomRight ? "T_q<T_k,bottom-right" : "T_q<T_k,top-left");
  if (T > T_k) on.push_back(p.alignment == CausalAlignment::BottomRight ? "T_q>T_k,bottom-right" : "T_q>T_k,top-left");
  if (p.kv_heads() != q.H) on.push_back("grouped");
  if (!p.key_lengths.empty()) on.push_back("padded");
  if (p.window) on.push_back("window");
  if (!p.doc_bounds.empty()) on.push_back(p.q_doc_bounds.empty() ? "documents" : "query-documents");
  if (p.chunk_size > 0) on.push_back("chunked");
  if (!p.causal) on.push_back("no-causal");
  if (p.prefix_length > 0) on.push_back("prefix");
  if (p.window_right) on.push_back("window-right");
  if (p.block_mask) on.push_back("block-mask");
  if (p.dense_mask) on.push_back("dense-mask");
  if (p.v_dim() != D) on.push_back("D_v");
  if (on.size() >= 2) tags.push_back("features-at-once=" + std::string(on.size() >= 3 ? "3+" : "2"));
  for (std::size_t a = 0; a < on.size(); ++a)
    for (std::size_t b = a + 1; b < on.size(); ++b) tags.push_back("with:" + on[a] + "+" + on[b]);
}

// The tags of the score modifiers, the paging, and a KV-cache call.
void tag_modifiers_and_paging(const Problem& p, std::vector<std::string>& tags) {
  const Index T = p.q.shape().T;
  if (p.softcap) tags.push_back("softcap");
  if (!p.alibi_slopes.empty()) tags.push_back("alibi");
  if (!p.sinks.empty()) tags.push_back("sinks");
  if (p.paged) {
    tags.push_back("paged=" + std::to_string(p.paged->page_size) + "," + page_layout_name(p.paged->layout));
    // Lengths ragged across pages: a partial last page (k·page ± 1 among them).
    bool ragged = false;
    for (const Index len : p.sequence_lengths()) ragged = ragged || len % p.paged->page_size != 0;
    if (ragged) tags.push_back("paged:partial-last-page");
    if (p.paged->fill != PageFill::zero) tags.push_back("paged:free-slots=" + page_fill_name(p.paged->fill));
  }
  // KV-cache calls: the new token(s) at the end of the cache.
  if (p.alignment == CausalAlignment::BottomRight && T < p.k.shape().T)
    tags.push_back(T == 1 ? "decode (T_q=1<T_k, bottom-right)" : "chunk (1<T_q<T_k, bottom-right)");
}

// A query that sees no key (bottom-right with T_q > T_k, all padding, ...): its weights must be 0, not uniform.
bool a_query_sees_nothing(const Problem& p) {
  const Shape& q = p.q.shape();
  const Index T = q.T;
  bool empty_row = false;
  for (Index b = 0; b < q.B && !empty_row; ++b)
    for (Index h = 0; h < (p.has_cell_masks() ? q.H : 1) && !empty_row; ++h)
      for (Index i = 0; i < T && !empty_row; ++i) empty_row = p.visibility(b, h).keys(i).empty();
  return empty_row;
}

// The bucket of the case's largest |score|.
std::string score_tag(const Problem& p) {
  const Shape& q = p.q.shape();
  const Index T = q.T, D = q.D;
  // Largest |score| = scale·max|q|·max|k|·D is an upper bound; use the real maximum per head instead.
  const double scale = p.scale ? *p.scale : 1 / std::sqrt(double(D));
  // 64 query rows at a time into one buffer: a long context's [T_q,T_k] scores would not fit in memory, and a
  // fresh block per step would cost a page fault per 4 KiB written.
  double smax = 0;
  if (double(q.B) * double(q.H) * double(T) * double(p.k.shape().T) > kMaterialisedWeights) {
    // A long context: the exact maximum would cost as much as a forward in double; the Cauchy-Schwarz bound
    // scale·max|q_i|·max|k_j| (row norms) buckets the case instead.
    for (Index b = 0; b < q.B; ++b)
      for (Index h = 0; h < q.H; ++h)
        smax = std::max(smax, p.q.head(b, h).rowwise().norm().maxCoeff() *
                                  p.k.head(b, kv_head(h, q.H, p.kv_heads())).rowwise().norm().maxCoeff() * scale);
    return smax > 1e4 ? "|score|>1e4" : smax > 10 ? "|score|=10..1e4" : "|score|<=10";
  }
  constexpr Index kRows = 64;
  Matrix<double> block(std::min(kRows, T), p.k.shape().T);
  for (Index b = 0; b < q.B; ++b)
    for (Index h = 0; h < q.H; ++h) {
      const auto k = p.k.head(b, kv_head(h, q.H, p.kv_heads()));
      for (Index i = 0; i < T; i += kRows) {
        const Index n = std::min(kRows, T - i);
        block.topRows(n).noalias() = p.q.head(b, h).middleRows(i, n) * k.transpose();
        smax = std::max(smax, block.topRows(n).cwiseAbs().maxCoeff() * scale);
      }
    }
  return smax > 1e4 ? "|score|>1e4" : smax > 10 ? "|score|=10..1e4" : "|score|<=10";
}

}  // namespace

std::vector<std::string> shape_tags(const Problem& p) {
  std::vector<std::string> tags;
  tag_extents(p, tags);
  tag_masks(p, tags);
  tag_combinations(p, tags);
  tag_modifiers_and_paging(p, tags);
  if (a_query_sees_nothing(p)) tags.push_back("a-query-sees-nothing");
  tags.push_back(score_tag(p));
  return tags;
}

namespace {

// A case while it is shrunk: its geometry, the current value of every entry of q, k, v and, for a gradient law,
// dO (flattened, in that order), and its scale. Shape steps and value steps interleave, so a shape that could not
// shrink while the values were still as drawn is tried again after they simplified (a score that needed two D
// coordinates may need one once its values are powers of two).
struct CaseValues {
  CaseShape s;
  std::vector<double> values;
  double scale = 0;  ///< an explicit scale; 0: the default 1/√D
};

Shape q_shape(const CaseShape& s) { return {s.B, s.H, s.T_q, s.D}; }
Shape kv_shape(const CaseShape& s) { return {s.B, s.H_kv, s.T_k, s.D}; }
Shape v_shape(const CaseShape& s) { return {s.B, s.H_kv, s.T_k, s.value_dim()}; }
Shape o_shape(const CaseShape& s) { return {s.B, s.H, s.T_q, s.value_dim()}; }  // the output's, and dO's

// id -> index along one axis.
std::map<Index, Index> positions(const std::vector<Index>& ids) {
  std::map<Index, Index> at;
  for (std::size_t n = 0; n < ids.size(); ++n) at[ids[n]] = Index(n);
  return at;
}

// Copies into `to` (entries of shape `ts` at coordinates `tc`) the value of every entry that `from` (shape fs,
// coordinates fc) also has.
void carry_values(const double* from, const Shape& fs, const std::array<std::vector<Index>, 4>& fc, double* to,
                  const Shape& ts, const std::array<std::vector<Index>, 4>& tc) {
  const auto pb = positions(fc[0]), ph = positions(fc[1]), pi = positions(fc[2]), pd = positions(fc[3]);
  const auto find = [](const std::map<Index, Index>& m, Index id) {
    const auto it = m.find(id);
    return it == m.end() ? Index{-1} : it->second;
  };
  Index n = 0;
  for (Index b = 0; b < ts.B; ++b)
    for (Index h = 0; h < ts.H; ++h)
      for (Index i = 0; i < ts.T; ++i)
        for (Index d = 0; d < ts.D; ++d, ++n) {
          const Index ob = find(pb, tc[0][std::size_t(b)]), oh = find(ph, tc[1][std::size_t(h)]),
                      oi = find(pi, tc[2][std::size_t(i)]), od = find(pd, tc[3][std::size_t(d)]);
          if (ob >= 0 && oh >= 0 && oi >= 0 && od >= 0) to[n] = from[((ob * fs.H + oh) * fs.T + oi) * fs.D + od];
        }
}

// Generic values for a small case: each tensor's entries 1, 2, 3, ... in order, so no entry is 0 and no two rows,
// heads or batch entries of a tensor are equal (what values that shrank to 0 lose). Only for cases of at most
// kGenericEntries entries in all, the end of shrinking: every value is then a small integer (<= 64), exact in
// every dtype.
constexpr std::size_t kGenericEntries = 64;
// Other draws tried for each step that makes a case smaller, where nothing else shrinks it (fallback_tries).
constexpr std::uint64_t kRedraws = 2;
std::vector<double> generic_values(const CaseShape& s, DType dtype, bool d_output) {
  std::vector<double> v;
  for (const Index n : {q_shape(s).numel(), kv_shape(s).numel(), v_shape(s).numel(),
                        d_output ? o_shape(s).numel() : Index{0}})
    for (Index x = 1; x <= n; ++x) v.push_back(round_to(dtype, double(x)));
  return v;
}

// How a case's values are drawn: q, k and v in one regime (q and k at one magnitude, v at another), and, for a
// gradient law, dO of the output's shape in its own regime and magnitude.
struct ValueDraw {
  Regime regime = Regime::small_int;
  double m_qk = 1, m_v = 1;
  std::optional<std::pair<Regime, double>> d_output{};  ///< dO's regime and magnitude; empty: no dO
  bool custom_scale = false;                            ///< may the case carry an explicit scale
};

// The scales a case's scale may shrink to, simplest first: the default, then simple_values (0 is not a scale).
std::vector<double> scale_shrinks(double scale, DType dtype) {
  if (scale == 0) return {};
  std::vector<double> out{0};
  for (const double x : simple_values(scale, dtype))
    if (x > 0) out.push_back(x);
  return out;
}

// The values of a case of shape s, drawn (ValueDraw, one base per tensor) and shrunk together with it and its
// scale (0: the default).
// How the values of a case are drawn and shrunk (gen_case_values): the case's own draws (bq, bk, bv, bd: one base
// each for q, k, v and dO, from RapidCheck's random at the case's size), and the candidates each shrink step tries.
// Fewer D coordinates change every score in two ways: fewer terms, and (at the default scale) a larger
// 1/√D. A bug that needs a large score (an overflow, a finite mask constant) may then vanish, although one
// coordinate with larger values would show it: so each step that drops D coordinates is also tried with q
// doubled (a power of two stays one). The shape is smaller either way, so shrinking still ends.
//
// Where nothing else shrinks the case any more, each shape step is tried once more in three other ways,
// last (fallback_tries), so that they cost calls only where shrinking would otherwise stop:
//  - A bug that needs a scale other than 1 (a forgotten scale in the backward) vanishes at D = 1 under the
//    default scale, although any explicit scale other than 1 shows it: where the law lets a case carry an
//    explicit scale, a step that drops D coordinates keeps the scale the case had (1/√D of the old D), which
//    then shrinks toward the default and simple values like any scale.
//  - A step that keeps every entry but simplifies the geometry (no window or a narrower one, less padding,
//    the default alignment) may need other values than the shrunk ones: two queries whose values shrank to
//    the same row tell a window bug apart but not, once the window is gone, a bug that needs their rows to
//    differ. In a large case such a step takes the values as first drawn for that shape.
//  - A step that makes a case smaller is also tried with another draw of the values for the smaller
//    shape (kRedraws of them): a bug that only some values show (two summation orders that round apart, a
//    tie) can need a smaller case other values than the ones each step kept, and shrinking would stop at a
//    size where they happened to show it.
//  - In a small case (the end of shrinking) every step takes generic values (generic_values, at the scale
//    each try has): the draw itself may have had those rows equal, or a bug's ingredients may sit in two D
//    coordinates of which each step keeps one.
// The values then shrink again. Every accepted step makes the geometry simpler or, at the same geometry, the
// scale or one value simpler, so shrinking still ends.
struct ValueSteps {
  ShrinkRules rules;
  ValueDraw how;
  DType dtype;
  int size;
  std::uint64_t bq, bk, bv, bd;

  // The values of shape s: the case's own draw (`salt` 0), or a different draw of the same shape (fallback_tries).
  CaseValues draw(const CaseShape& s, std::uint64_t salt = 0) const {
    const auto salted = [salt](std::uint64_t base) { return salt ? (base ^ salt) * 0x9e3779b97f4a7c15ull : base; };
    const Coords q_at{s.b_ids, s.h_ids, s.q_ids, s.d_ids}, kv_at{s.b_ids, s.kv_ids, s.k_ids, s.d_ids},
        v_at{s.b_ids, s.kv_ids, s.k_ids, s.value_ids()}, o_at{s.b_ids, s.h_ids, s.q_ids, s.value_ids()};
    CaseValues c{s, draw_values(q_shape(s), q_at, how.regime, how.m_qk, dtype, salted(bq), size)};
    for (const auto& [base, m, shape, at] :
         {std::tuple{bk, how.m_qk, kv_shape(s), kv_at}, std::tuple{bv, how.m_v, v_shape(s), v_at}}) {
      const auto t = draw_values(shape, at, how.regime, m, dtype, salted(base), size);
      c.values.insert(c.values.end(), t.begin(), t.end());
    }
    if (how.d_output) {  // at the output's coordinates: dO's entry (i, d) belongs to O's entry (i, d)
      const auto t = draw_values(o_shape(s), o_at, how.d_output->first, how.d_output->second, dtype, salted(bd), size);
      c.values.insert(c.values.end(), t.begin(), t.end());
    }
    return c;
  }

  // A simpler shape keeps the current values of the entries it keeps (q, k, v and dO each at its own coordinates)
  // and the scale; entries it adds are drawn.
  CaseValues reshape(const CaseValues& c, const CaseShape& to) const {
    CaseValues n = draw(to);
    n.scale = c.scale;
    const Shape fq = q_shape(c.s), fk = kv_shape(c.s), fv = v_shape(c.s), fo = o_shape(c.s);
    const Shape tq = q_shape(to), tk = kv_shape(to), tv = v_shape(to), to_ = o_shape(to);
    carry_values(c.values.data(), fq, {c.s.b_ids, c.s.h_ids, c.s.q_ids, c.s.d_ids}, n.values.data(), tq,
                 {to.b_ids, to.h_ids, to.q_ids, to.d_ids});
    carry_values(c.values.data() + fq.numel(), fk, {c.s.b_ids, c.s.kv_ids, c.s.k_ids, c.s.d_ids},
                 n.values.data() + tq.numel(), tk, {to.b_ids, to.kv_ids, to.k_ids, to.d_ids});
    // V (and dO) at V's coordinates: d_ids or dv_ids. A step between the two (D_v to none) keeps the entries whose
    // coordinates both have.
    carry_values(c.values.data() + fq.numel() + fk.numel(), fv, {c.s.b_ids, c.s.kv_ids, c.s.k_ids, c.s.value_ids()},
                 n.values.data() + tq.numel() + tk.numel(), tv, {to.b_ids, to.kv_ids, to.k_ids, to.value_ids()});
    if (how.d_output)
      carry_values(c.values.data() + fq.numel() + fk.numel() + fv.numel(), fo,
                   {c.s.b_ids, c.s.h_ids, c.s.q_ids, c.s.value_ids()},
                   n.values.data() + tq.numel() + tk.numel() + tv.numel(), to_,
                   {to.b_ids, to.h_ids, to.q_ids, to.value_ids()});
    return n;
  }

  CaseValues with_q_doubled(CaseValues c) const {
    const Index n = q_shape(c.s).numel();
    for (Index k = 0; k < n; ++k) c.values[std::size_t(k)] = round_to(dtype, 2 * c.values[std::size_t(k)]);
    return c;
  }

  // The candidates for one shape step from c to `to`, in the order they are tried: the values carried, and q
  // doubled when D coordinates go.
  // An explicit scale that a step to fewer D coordinates would make the new default (scale 1 at D = 1, 1/2 at
  // D = 4) stops being a scale other than the default: a bug that needs one (a kernel that ignores the
  // explicit scale) then vanishes, and D could never drop. Such a step is also tried with the scale doubled and
  // q halved, and halved with q doubled: the scale moves by a power of two and q the other way, so every score
  // is kept (up to underflow), and the scale is still not the default.
  CaseValues with_scale_times(CaseValues c, double f) const {
    c.scale *= f;
    const Index n = q_shape(c.s).numel();
    for (Index k = 0; k < n; ++k) c.values[std::size_t(k)] = round_to(dtype, c.values[std::size_t(k)] / f);
    return c;
  }

  std::vector<CaseValues> step_tries(const CaseValues& c, const CaseShape& to) const {
    CaseValues n = reshape(c, to);
    std::vector<CaseValues> tries{n};
    const bool becomes_default = to.D != c.s.D && c.scale > 0 && c.scale == 1 / std::sqrt(double(to.D));
    if (becomes_default)
      for (const double f : {2.0, 0.5}) tries.push_back(with_scale_times(n, f));
    if (to.D != c.s.D) tries.push_back(with_q_doubled(std::move(n)));
    return tries;
  }

  // The candidates tried for the same step once nothing else shrinks c (so they cost calls only where shrinking
  // would stop): the old scale kept when D coordinates go, fresh values for a same-size step of a large case,
  // kRedraws other draws for a step to a smaller case, generic values for any step of a small one.
  std::vector<CaseValues> fallback_tries(const CaseValues& c, const CaseShape& to) const {
    std::vector<CaseValues> tries;
    const bool small = c.values.size() <= kGenericEntries;
    const bool keep_scale = to.D != c.s.D && how.custom_scale && c.scale == 0;
    const bool same_size = to.D == c.s.D && q_shape(to).numel() == q_shape(c.s).numel() &&
                           kv_shape(to).numel() == kv_shape(c.s).numel() && v_shape(to).numel() == v_shape(c.s).numel();
    const bool smaller = !same_size && q_shape(to).numel() <= q_shape(c.s).numel() &&
                         kv_shape(to).numel() <= kv_shape(c.s).numel() && v_shape(to).numel() <= v_shape(c.s).numel();
    if (!small && !keep_scale && !same_size && !smaller) return tries;  // (no reshape for a step with nothing to try)
    const CaseValues n = reshape(c, to);
    std::optional<double> kept_scale;
    if (keep_scale) {
      kept_scale = 1 / std::sqrt(double(c.s.D));
      CaseValues kept = n;
      kept.scale = *kept_scale;
      tries.push_back(std::move(kept));
    }
    if (!small && same_size) {
      CaseValues fresh = draw(to);
      fresh.scale = c.scale;
      if (fresh.values != n.values) tries.push_back(std::move(fresh));
    }
    if (smaller)
      for (std::uint64_t salt = 1; salt <= kRedraws; ++salt) {
        CaseValues fresh = draw(to, salt);
        fresh.scale = c.scale;
        tries.push_back(std::move(fresh));
      }
    if (small) {
      CaseValues generic = n;
      generic.values = generic_values(to, dtype, bool(how.d_output));
      if (generic.values != n.values) {
        tries.push_back(generic);
        if (kept_scale) {
          generic.scale = *kept_scale;
          tries.push_back(std::move(generic));
        }
      }
    }
    return tries;
  }

  // The candidates for c with scale x instead (0: the default): as they are, and with the scale moved into q (q
  // times the old scale over the new, rounded to the dtype), which keeps every score up to that rounding.
  std::vector<CaseValues> scale_tries(const CaseValues& c, double x) const {
    CaseValues n = c;
    n.scale = x;
    std::vector<CaseValues> tries{n};
    const double to = x > 0 ? x : 1 / std::sqrt(double(c.s.D));
    const double from = c.scale > 0 ? c.scale : 1 / std::sqrt(double(c.s.D));
    for (Index k = 0; k < q_shape(c.s).numel(); ++k)
      n.values[std::size_t(k)] = round_to(dtype, n.values[std::size_t(k)] * from / to);
    if (n.values != c.values) tries.push_back(std::move(n));
    return tries;
  }
};

// Every case one step simpler than c, in the order tried: the shape steps, the scale, each value, then the shape
// steps' fallbacks.
rc::Seq<CaseValues> case_value_shrinks(const std::shared_ptr<const ValueSteps>& steps, const CaseValues& c) {
  const std::vector<CaseShape> shapes = shape_shrinks(c.s, steps->rules);
  return rc::seq::concat(
      rc::seq::mapcat(rc::seq::fromContainer(shapes),
                      [steps, c](const CaseShape& to) { return rc::seq::fromContainer(steps->step_tries(c, to)); }),
      rc::seq::mapcat(rc::seq::fromContainer(scale_shrinks(c.scale, steps->dtype)),
                      [steps, c](double x) { return rc::seq::fromContainer(steps->scale_tries(c, x)); }),
      // (--long: no value steps. A case of 2^15 keys has millions of values, each step a call over them all; the
      // shape steps still shrink its geometry.)
      rc::seq::map(steps->rules.long_lengths.empty() ? value_shrinks(c.values, steps->dtype) : rc::Seq<std::vector<double>>(),
                   [s = c.s, scale = c.scale](std::vector<double> v) { return CaseValues{s, std::move(v), scale}; }),
      rc::seq::mapcat(rc::seq::fromContainer(shapes),
                      [steps, c](const CaseShape& to) { return rc::seq::fromContainer(steps->fallback_tries(c, to)); }));
}

rc::Gen<CaseValues> gen_case_values(CaseShape s0, double scale0, ShrinkRules rules, ValueDraw how, DType dtype) {
  return [=](const rc::Random& random, int size) {
    rc::Random r = random;
    const std::uint64_t bq = r.next(), bk = r.next(), bv = r.next(), bd = r.next();
    const auto steps = std::make_shared<const ValueSteps>(ValueSteps{rules, how, dtype, size, bq, bk, bv, bd});
    CaseValues c0 = steps->draw(s0);
    c0.scale = scale0;
    return rc::shrinkable::shrinkRecur(std::move(c0),
                                       [steps](const CaseValues& c) { return case_value_shrinks(steps, c); });
  };
}

// The largest spread (largest minus smallest) of one row's visible scaled scores q_i . k_j, over the rows of every
// head (query head h reads kv head h / (H / H_kv)) that spread no further than 30, before any modifier: what a
// softcap is measured against. (A row that spreads further has weights below e^-30 of its largest: an uncapped
// kernel's would then underflow where softcap-bound cannot measure a ratio.)
double max_row_spread(const Problem& p) {
  const Shape& s = p.q.shape();
  const Index group = s.H / p.k.shape().H;
  const double scale = p.scale ? *p.scale : 1 / std::sqrt(double(s.D));
  double top = 0;
  if (double(s.B) * double(s.H) * double(s.T) * double(p.k.shape().T) > kMaterialisedWeights) {
    // A long context: the same spread, 64 query rows at a time (a [T_q,T_k] matrix is 2 GiB at T = 16384), each
    // row's visible runs scanned whole.
    constexpr Index kRows = 64;
    Matrix<double> scores;
    for (Index b = 0; b < s.B; ++b)
      for (Index h = 0; h < s.H; ++h) {
        const Visibility vis = p.visibility(b, h);
        const auto k = p.k.head(b, h / group);
        for (Index i0 = 0; i0 < s.T; i0 += kRows) {
          throw_if_cancelled("drawing a long case");  // seconds at long T: an interrupt must not wait for it
          const Index n = std::min(kRows, s.T - i0);
          scores.noalias() = p.q.head(b, h).middleRows(i0, n) * k.transpose();
          scores *= scale;
          for (Index i = i0; i < i0 + n; ++i) {
            double lo = std::numeric_limits<double>::infinity(), hi = -lo;
            vis.for_each_run(i, 0, k.rows(), [&](Index a, Index e) {
              const auto run = scores.row(i - i0).segment(a, e - a);
              lo = std::min(lo, run.minCoeff());
              hi = std::max(hi, run.maxCoeff());
            });
            if (hi > lo && hi - lo <= 30) top = std::max(top, hi - lo);
          }
        }
      }
    return top;
  }
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) {
      const Visibility vis = p.visibility(b, h);
      const Eigen::MatrixXd scores = p.q.head(b, h) * p.k.head(b, h / group).transpose() * scale;
      for (Index i = 0; i < scores.rows(); ++i) {
        double lo = std::numeric_limits<double>::infinity(), hi = -lo;
        for (Index j = 0; j < scores.cols(); ++j)
          if (vis.visible(i, j)) lo = std::min(lo, scores(i, j)), hi = std::max(hi, scores(i, j));
        if (hi > lo && hi - lo <= 30) top = std::max(top, hi - lo);
      }
    }
  return top;
}

// gen_problem, with an upstream gradient dO drawn and shrunk with the case when `d_output`.
rc::Gen<LawCase> gen_case(const GenConfig& cfg, const ProblemOptions& opts, bool d_output) {
  const auto [first, rules] = first_shape(cfg, opts);
  return rc::gen::exec([=, first = first, rules = rules] {
    const CaseShape s0 = *rc::gen::noShrink(first);
    ValueDraw how;
    how.regime = *weighted_choice<Regime>({{2, Regime::small_int},
                                           {4, Regime::normal},
                                           {2, Regime::uniform},
                                           {1, Regime::ties},
                                           {1, Regime::one_hot},
                                           {1, Regime::sparse}});
    const double m_qk_drawn = *gen_magnitude(), m_v_drawn = *gen_magnitude();  // unconditional, see gen_shape
    how.m_qk = how.regime == Regime::small_int ? 1.0 : m_qk_drawn;
    how.m_v = how.regime == Regime::small_int ? 1.0 : m_v_drawn;
    const double custom = *weighted_choice<double>({{6, 0.0}, {1, 1.0}, {1, 0.125}, {1, 2.0}});
    how.custom_scale = opts.allow_custom_scale && cfg.caps.custom_scale;
    if (d_output) {
      const Regime r = *weighted_choice<Regime>({{2, Regime::small_int}, {4, Regime::normal}, {1, Regime::sparse}});
      const double m_drawn = *gen_magnitude();  // unconditional, see gen_shape
      how.d_output = {r, r == Regime::small_int ? 1.0 : m_drawn};
    }
    const CaseValues cv = *gen_case_values(s0, how.custom_scale ? custom : 0.0, rules, how, cfg.dtype);
    const CaseShape& s = cv.s;
    LawCase c;
    Problem& p = c.problem;
    p.dtype = cfg.dtype;
    const Shape qs = q_shape(s), ks = kv_shape(s), vs = v_shape(s);
    p.q = as_tensor(qs, cv.values.data());
    p.k = as_tensor(ks, cv.values.data() + qs.numel());
    p.v = as_tensor(vs, cv.values.data() + qs.numel() + ks.numel());
    if (d_output) p.d_output = as_tensor(o_shape(s), cv.values.data() + qs.numel() + ks.numel() + vs.numel());
    p.alignment = s.alignment;  // drawn and shrunk with the shape
    p.key_lengths = s.key_lengths;
    p.window = s.window;
    p.causal = !s.bidirectional;
    p.prefix_length = s.prefix;
    p.window_right = s.window_right;
    p.chunk_size = s.chunk;
    if (!s.doc_coords.empty())
      for (const Index b : s.b_ids) {  // each bound at the position of the first key at or past its coordinate
        std::vector<Index> bounds;
        for (const Index c : s.doc_coords[std::size_t(b)])
          bounds.push_back(Index(std::lower_bound(s.k_ids.begin(), s.k_ids.end(), c) - s.k_ids.begin()));
        p.doc_bounds.push_back(std::move(bounds));
      }
    if (!s.q_doc_coords.empty())
      for (const Index b : s.b_ids) {  // each at the first query at or past its coordinate
        std::vector<Index> bounds;
        for (const Index c : s.q_doc_coords[std::size_t(b)])
          bounds.push_back(Index(std::lower_bound(s.q_ids.begin(), s.q_ids.end(), c) - s.q_ids.begin()));
        p.q_doc_bounds.push_back(std::move(bounds));
      }
    if (s.cells.kind == 1) p.dense_mask = cells_of(s);
    if (s.cells.kind == 2) p.block_mask = block_mask_of(s);
    if (cv.scale > 0) p.scale = cv.scale;
    if (s.q_ids != iota(s.T_q)) c.positions = s.q_ids;  // a position was deleted: the others keep their ids
    p.want_weights = opts.want_weights && cfg.caps.returns_weights;
    p.want_lse = opts.want_lse && cfg.caps.lse;
    // Last: shrinking a modifier re-draws nothing else, and an implementation without any draws nothing more.
    const FeatureSet declared = declared_features(cfg.caps);
    const bool any_modifier = opts.may_use(Feature::softcap, declared) || opts.may_use(Feature::alibi, declared) ||
                              opts.may_use(Feature::sinks, declared);
    if (any_modifier) (*gen_modifiers(cfg, opts, cfg.caps.softcap ? max_row_spread(p) : 0.0)).apply(p, s.h_ids);
    // (V's pool has rows D_v wide where V has a head dimension of its own.)
    if (!d_output && opts.may_use(Feature::paged, declared)) p.paged = *gen_paged_plan(cfg, opts);
    c.tags = shape_tags(p);
    c.tags.push_back("regime=" + regime_name(how.regime));
    if (how.d_output) c.tags.push_back("dO=" + regime_name(how.d_output->first));
    return c;
  });
}

}  // namespace

rc::Gen<LawCase> gen_problem(const GenConfig& cfg, const ProblemOptions& opts) { return gen_case(cfg, opts, false); }

rc::Gen<Modifiers> gen_modifiers(const GenConfig& cfg, const ProblemOptions& opts, double max_spread) {
  const FeatureSet declared = declared_features(cfg.caps);
  const bool softcap = opts.may_use(Feature::softcap, declared), alibi = opts.may_use(Feature::alibi, declared),
             sinks = opts.may_use(Feature::sinks, declared);
  return rc::gen::exec([=] {
    Modifiers m;
    // Each in about a third of the cases (every one when required: then "none" is not a choice at all, so
    // shrinking keeps one), none first when shrinking.
    const auto choose = [](bool required, auto none, auto rest) {
      using T = decltype(none);
      std::vector<std::pair<std::size_t, T>> c;
      if (!required) c.push_back({4, none});
      for (const auto& r : rest) c.push_back(r);
      return *weighted_choice<T>(c);
    };
    if (softcap) {
      std::vector<std::pair<std::size_t, double>> caps{{1, 5.0}, {1, 1.0}, {1, 50.0}};
      // A cap that bites: with 2c <= spread / 2, the row of the largest spread of visible scores spreads further
      // than the cap allows unless the kernel applies it (softcap-bound). A power of two, none below 2^-4; 1 for a
      // case without a spread. Always a choice, so that a shrinking step keeps the same choice.
      const double bite = max_spread > 0 ? std::max(0.0625, std::exp2(std::floor(std::log2(max_spread / 4)))) : 1.0;
      caps.push_back({6, bite});
      const double cap = choose(opts.require.has(Feature::softcap), 0.0, caps);
      if (cap > 0) m.softcap = cap;
    }
    if (alibi) m.alibi = choose(opts.require.has(Feature::alibi), 0, std::vector<std::pair<std::size_t, int>>{{1, 1}, {1, 2}});
    if (sinks) m.sinks = choose(opts.require.has(Feature::sinks), -1, std::vector<std::pair<std::size_t, int>>{{2, 0}, {1, 3}});
    return m;
  });
}

rc::Gen<std::optional<PagedPlan>> gen_paged_plan(const GenConfig& cfg, const ProblemOptions& opts) {
  std::vector<std::pair<std::size_t, Index>> sizes;
  for (const Index ps : cfg.caps.page_sizes)
    if (ps > 0) sizes.push_back({1, ps});
  std::vector<std::pair<std::size_t, PageLayout>> layouts;
  if (cfg.caps.page_layouts & 1u) layouts.push_back({1, PageLayout::token_major});
  if (cfg.caps.page_layouts & 2u) layouts.push_back({1, PageLayout::head_major});
  const bool possible =
      !sizes.empty() && !layouts.empty() && opts.may_use(Feature::paged, declared_features(cfg.caps));
  return rc::gen::exec([=]() -> std::optional<PagedPlan> {
    if (!possible) return std::nullopt;
    const bool on = opts.require.has(Feature::paged) || *weighted_choice<bool>({{1, false}, {1, true}});
    PagedPlan plan;
    plan.page_size = *weighted_choice<Index>(sizes);
    plan.layout = *weighted_choice<PageLayout>(layouts);
    plan.order = *weighted_choice<PagedPlan::Order>(
        {{2, PagedPlan::Order::contiguous}, {1, PagedPlan::Order::reversed}, {3, PagedPlan::Order::shuffled}});
    plan.shuffle_seed = *rc::gen::noShrink(rc::gen::inRange<std::uint64_t>(0, std::uint64_t(1) << 32));
    plan.spare_pages = *weighted_choice<Index>({{3, 0}, {1, 1}, {1, 3}});
    plan.spare_columns = *weighted_choice<Index>({{3, 0}, {1, 1}, {1, 2}});
    plan.junk_entries = *weighted_choice<bool>({{2, false}, {1, true}});
    plan.fill = *weighted_choice<PageFill>(
        {{3, PageFill::zero}, {2, PageFill::nan}, {1, PageFill::pos_inf}, {1, PageFill::neg_inf}, {1, PageFill::huge}});
    if (plan.order != PagedPlan::Order::shuffled) plan.shuffle_seed = 0;
    if (!on) return std::nullopt;
    return plan;
  });
}

void Modifiers::apply(Problem& p, const std::vector<Index>& h_ids) const {
  static constexpr double kSinks[] = {0.0, 1.0, -1.0, 2.5, -3.0, 6.0};
  const Index H = p.q.shape().H;
  const auto id = [&](Index h) { return h_ids.empty() ? h : h_ids[std::size_t(h)]; };
  p.softcap = softcap;
  p.alibi_slopes.clear();
  p.sinks.clear();
  for (Index h = 0; h < H; ++h) {
    if (alibi == 1) p.alibi_slopes.push_back(std::ldexp(1.0, -int(std::min<Index>(id(h), 60)) - 1));
    if (alibi == 2) p.alibi_slopes.push_back(1.0);
    if (sinks >= 0) p.sinks.push_back(kSinks[std::size_t(id(h) + sinks) % 6]);
  }
}

Index gradient_max_T(const GenConfig& cfg) {
  const double heads = double(std::max<Index>(cfg.max_B, 1)) * double(std::max<Index>(cfg.max_H, 1));
  return std::max<Index>(1, Index(std::sqrt(kMaterialisedWeights / heads)));
}

rc::Gen<LawCase> gen_gradient_case(const GenConfig& config, const ProblemOptions& opts) {
  GenConfig cfg = config;
  cfg.max_T = std::min(cfg.max_T, gradient_max_T(config));
  cfg.max_T_tail = std::min(cfg.max_T_tail, gradient_max_T(config));
  return rc::gen::map(gen_case(cfg, opts, true), [dtype = cfg.dtype](LawCase c) {
    Problem& p = c.problem;
    // Room: an eighth of the dtype's largest value, so the kernel's own rounding cannot push a gradient over it.
    const double room = max_finite(dtype) / 8;
    // A bound on every gradient first, in O(T·D): with c = D_v·max|dO|·max|v| ≥ |dP_ij| ≥ |Δ_i|, |dS_ij| ≤
    // 2c·P_ij (softcap's derivative is at most 1) and each row's weights sum to at most 1, so |dQ| ≤ 2c·scale·
    // max|k|, |dK| ≤ 2c·scale·max|q|·n and |dV| ≤ n·max|dO| over n = group·T_q rows. Where it fits (every case
    // but float16's large ones) the oracle's exact maximum would not scale dO either, and is not computed: the
    // case is the same, and a long context is spared a float64 backward per case.
    const auto max_abs = [](const Tensor<double>& t) { return t.values().cwiseAbs().maxCoeff(); };
    const double n_rows = double(p.q.shape().T) * double(p.q.shape().H / p.kv_heads());
    const double scale = p.scale ? *p.scale : 1 / std::sqrt(double(p.q.shape().D));
    const double c_dp = double(p.v.shape().D) * max_abs(*p.d_output) * max_abs(p.v);
    const double bound = std::max({2 * c_dp * scale * max_abs(p.k), 2 * c_dp * scale * max_abs(p.q) * n_rows,
                                   n_rows * max_abs(*p.d_output)}) *
                         (1 + 1e-9);  // the bound's own rounding, a few ulp
    if (std::isfinite(bound) && bound <= room) return c;
    const AttentionGradients<double> g = oracle_backward<double>(p.q, p.k, p.v, *p.d_output, p.options());
    const double g_max = std::max({g.dq.values().cwiseAbs().maxCoeff(), g.dk.values().cwiseAbs().maxCoeff(),
                                   g.dv.values().cwiseAbs().maxCoeff()});
    if (g_max > room) {
      const int e = int(std::ceil(std::log2(g_max / room)));
      for (double& x : p.d_output->values()) x = round_to(dtype, std::ldexp(x, -e));
      c.tags.push_back("dO-scaled-to-fit");
    }
    return c;
  });
}

}  // namespace attncheck
