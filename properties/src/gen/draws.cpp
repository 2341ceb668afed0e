// The first draw of a case's shape: extents, heads, padding, windows, documents, chunks, masks, D_v and the
// combination of features, each a draw_* function in a fixed order (ShapeDraws says the rule).
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

}  // namespace

std::pair<rc::Gen<CaseShape>, ShrinkRules> generation::first_shape(const GenConfig& cfg, const ProblemOptions& opts) {
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

}  // namespace attncheck
