// RapidCheck generators for attention problems: the shape first, then data of that shape, so shrinking
// reduces B, H, T, D before values; values span a wide dynamic range in several regimes and shrink toward 0,
// small integers and powers of two.
#pragma once

#include <rapidcheck.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "attncheck/features.hpp"
#include "attncheck/law.hpp"

namespace attncheck {

/// The geometry of one case. T_k differs from T_q, H_kv from H, and key lengths and a window appear, only when
/// the law and the implementation allow it.
struct CaseShape {
  Index B = 1, H = 1, T_q = 1, T_k = 1, D = 1;
  /// V's own head dimension (Feature::v_head_dim; MLA), its values keyed by dv_ids; 0: V has D, keyed by d_ids.
  Index D_v = 0;
  Index H_kv = 1;                                 ///< kv heads, dividing H (== H without grouped queries)
  CausalAlignment alignment = kDefaultAlignment;  ///< matters only when T_q != T_k
  std::vector<Index> key_lengths{};               ///< per batch entry, in [0, T_k]; empty: no padding
  std::optional<Index> window{};                  ///< sliding window; empty: none
  /// Masks beyond causal, each drawn only where the law and the implementation allow it.
  bool bidirectional = false;           ///< no causal rule
  Index prefix = 0;                     ///< a bidirectional prefix of this many keys; 0: none
  std::optional<Index> window_right{};  ///< a right window; empty: none
  Index chunk = 0;                      ///< chunked local attention; 0: none
  /// Packed documents: for each batch coordinate (b_ids), the bounds where one document ends and the next
  /// begins, as key coordinates (k_ids): a bound c starts a new document at the first key whose coordinate is
  /// >= c, so deleting a key keeps every other key in its document. Empty: none.
  std::vector<std::vector<Index>> doc_coords{};
  /// The queries' own document bounds (Feature::query_documents), as query coordinates (q_ids), as many per
  /// batch coordinate as doc_coords has: bound d starts document d + 1 at the first query whose coordinate is >=
  /// it. Empty: each query's document follows from its aligned position.
  std::vector<std::vector<Index>> q_doc_coords{};
  /// A block mask or a dense mask. Its cells are drawn at the coordinates of their batch entry, head, query and
  /// key (a hash of the seed and those), so deleting an index keeps every other cell; a block's kind at the tile
  /// of the drawn block grid that holds its first query and key.
  struct Cells {
    int kind = 0;  ///< 0 none, 1 a dense mask, 2 a block mask
    Index block_q = 1, block_k = 1;
    Index grid_q = 1, grid_k = 1;  ///< the block sizes as drawn: kinds are keyed by that grid's tiles
    bool per_batch = false, per_head = false;  ///< false: one mask broadcast over that axis
    int pattern = 0;   ///< cells: 0 each visible with `density` percent, 1 visible where k <= q, 2 all visible
    int density = 50;  ///< percent, for pattern 0
    /// blocks: 0 each empty, partial or full at random; 1 every block partial; 2 the block encoding of the
    /// cells (full where all are visible, empty where none is)
    int kinds = 0;
    std::uint64_t seed = 0;
    /// Blocks made full by shrinking: the b and h coordinates, and the drawn grid's tile of the block's first
    /// query and key.
    std::vector<std::array<Index, 4>> full_blocks{};
    std::vector<std::array<Index, 4>> shown_cells{};  ///< (b, h, q, k coordinates) made visible by shrinking
  } cells{};
  /// The coordinates each index was drawn at, per axis (batch entry, query head, kv head, query position, key
  /// position, D coordinate). Values are keyed by these, so deleting an index in the middle of an axis leaves
  /// every other entry's value as it was, and the case usually still fails. Empty: 0, 1, 2, ...
  std::vector<Index> b_ids{}, h_ids{}, kv_ids{}, q_ids{}, k_ids{}, d_ids{};
  std::vector<Index> dv_ids{};  ///< V's D_v coordinates (and the output's, and dO's); empty without D_v
  Index value_dim() const { return D_v > 0 ? D_v : D; }
  const std::vector<Index>& value_ids() const { return D_v > 0 ? dv_ids : d_ids; }
};

/// How the values of a case are drawn. Small integers come first: that is where shrinking ends.
enum class Regime { small_int, normal, uniform, ties, one_hot, sparse };

/// "small-int", "normal", ...
std::string regime_name(Regime r);

/// Like rc::gen::weightedElement, but shrinking toward the first choice (RapidCheck's own does not shrink).
template <class T> rc::Gen<T> weighted_choice(std::vector<std::pair<std::size_t, T>> pairs) {
  return [pairs](const rc::Random& random, int) {
    std::size_t sum = 0;
    for (const auto& pr : pairs) sum += pr.first;
    std::size_t pick = std::size_t(rc::Random(random).next() % sum), idx = 0;
    while (pick >= pairs[idx].first) pick -= pairs[idx++].first;
    return rc::shrinkable::map(
        rc::shrinkable::shrinkRecur(idx, [](std::size_t x) { return rc::shrink::towards<std::size_t>(x, 0); }),
        [pairs](std::size_t i) { return pairs[i].second; });
  };
}



/// Head dimension D in [1, max_D]: small, uniform and power-of-two draws, and the head dims real models use and
/// kernels get wrong (40, 59, 72, 80, 96, 104, 111, 129, 136, 192, 256, 576, within max_D), shrinking toward 1.
rc::Gen<Index> gen_head_dim(const GenConfig& cfg);

/// A [B,H,T,D] tensor of values at `magnitude` in `regime`, each rounded to `dtype`. Each value shrinks to 0,
/// then to ±1, a small integer or a power of two (simple_values).
rc::Gen<Tensor<double>> gen_tensor(const Shape& s, Regime regime, double magnitude, DType dtype);

/// The coordinates a tensor's entries are drawn at, per axis (empty: 0, 1, 2, ...): entry (b,h,i,d) gets the
/// value drawn for (b_ids[b], h_ids[h], i_ids[i], d_ids[d]).
struct Coords {
  std::vector<Index> b, h, i, d;
};
/// gen_tensor with each entry drawn at its coordinates `at`.
rc::Gen<Tensor<double>> gen_tensor(const Shape& s, const Coords& at, Regime regime, double magnitude, DType dtype);

/// The simpler values x may shrink to, simplest first: 0, ±1, then the nearest power of two or small integer
/// (|n| <= 64); a small integer or power of two shrinks only to smaller ones. All representable in `dtype`.
std::vector<double> simple_values(double x, DType dtype);

/// The sequence lengths where tiled kernels break, up to max_T: 2^k, 2^k ± 1, and multiples of 16 (so of 32, 64
/// and 128 too) and those ± 1, ascending, all >= min_T.
std::vector<Index> tile_edge_lengths(Index min_T, Index max_T);

/// A log-uniform magnitude over [1e-3, 1e4] (10 steps a decade), shrinking toward 1.
rc::Gen<double> gen_magnitude();

/// Rounds x to the nearest value of `dtype` (saturating at half the dtype's largest finite value).
double round_to(DType dtype, double x);
/// A 64-bit hash of `coordinates` under `seed` (splitmix64's finalizer, one coordinate at a time): the same on every
/// platform, so a choice keyed by a cell's coordinates survives shrinking the cells around it.
std::uint64_t coordinate_hash(std::uint64_t seed, std::initializer_list<Index> coordinates);

/// Options for gen_problem (and gen_shape). Each `allow_` is further gated by the implementation's
/// capabilities.
struct ProblemOptions {
  /// The features of a call (attncheck/features.hpp) a case may use, each where the implementation declares it,
  /// in some cases and shrinking toward none: a law whose reasoning a feature breaks removes it (first-position's
  /// output is v_0 only without a sink). What each does to the cases:
  ///  - gqa: H_kv < H; key_padding: per-sequence key lengths; window: a sliding window;
  ///  - softcap, alibi, sinks: the score modifiers (gen_modifiers);
  ///  - paged: half the cases paged, in a declared page size and layout (gen_paged_plan); never in a gradient case
  ///    (attncheck sends no paged backward call);
  ///  - documents, chunked_local, prefix, right_window, bidirectional: the masks beyond causal. A law whose
  ///    reasoning needs the causal rule (a later token never reaches an earlier row) removes the prefix and
  ///    bidirectional; one whose derived calls move keys to other positions removes documents and chunks too;
  ///  - query_documents (with documents): in half the packed cases, documents whose queries have bounds of their
  ///    own. A law whose derived calls cut a document's queries or keys short removes it (under bottom-right
  ///    alignment a document's queries are aligned on its own lengths);
  ///  - v_head_dim: a quarter of the cases, V with a head dimension D_v of its own, shrinking toward D_v = D;
  ///  - block_mask, dense_mask: a third of the cases each way. Their cells are positional: a law whose derived
  ///    calls slice, move or permute keys or queries removes them (no_cell_masks); one that keeps every position
  ///    (and slices only whole batch entries and heads, slice_problem) keeps them;
  ///  - bias: an additive bias in a third of the cases (gen_modifiers), broadcast or not over the batch and the
  ///    heads. Its values are per (query, key) cell, so no_cell_masks removes it with the masks;
  ///  - temperature: a per-query temperature in a third of the cases (gen_modifiers), broadcast or not. Its values
  ///    are per query row, so no_cell_masks removes it too (a law that moves or slices queries would carry it);
  ///  - rope, rope_interleaved: rotary embeddings in a third of the cases up to 2^18 weights, in a declared variant;
  ///    their positions are per token, so no_cell_masks removes them too;
  ///  - qk_norm, qk_norm_eps_outside: a QK-norm in a third of the cases, in a declared placement (each row is
  ///    normalised on its own: every law that keeps rows whole keeps it);
  ///  - dropout: not allowed by default (a law comparing two calls would compare two masks); the dropout laws
  ///    require it, in every case up to 2^18 weights: p from {1/2, 1/10, 1/4, 9/10, 0}, a seed and an offset;
  ///  - kv_e4m3fn, kv_e5m2, kv_int8, kv_ggml_* (with kv_scale_per_head, kv_scale_per_token, kv_zero_points): not
  ///  allowed by
  ///    default (a law that derives K or V values would have to requantise them); the quantised-cache laws require
  ///    them, and a quantised cache is then drawn in every case that is not paged, and in paged ones where paged
  ///    quantised pools are declared (paged_quant; gen_quant).
  ///  - index_list, index_list_blocks: not allowed by default (a law that moves or slices keys would have to move the
  ///    lists); the index-list laws require them (gen_index_list).
  ///  - tree, tree_bitmask: not allowed by default (their nodes are the last keys); the tree laws require them
  ///    (gen_tree).
  /// The claims (layout_invariant, batch_invariant) and the backward and the LSE are not drawn from here.
  FeatureSet allow = FeatureSet::all().remove({Feature::dropout, Feature::kv_e4m3fn, Feature::kv_e5m2, Feature::kv_int8,
                                               Feature::kv_ggml_q8_0, Feature::kv_ggml_q4_0, Feature::kv_ggml_q4_1,
                                               Feature::kv_ggml_q5_0, Feature::kv_ggml_q5_1, Feature::index_list,
                                               Feature::index_list_blocks, Feature::tree, Feature::tree_bitmask});
  /// The features every case has (where declared; those that may be drawn): for the laws about them. Shrinking
  /// then keeps them. A required feature is drawn even when `allow` lacks it.
  FeatureSet require{};
  bool allow_cross_lengths = true;  ///< T_q != T_k when the implementation accepts it
  /// Every case has a query that sees no key, for laws about such rows, when the implementation accepts
  /// T_q != T_k under bottom-right alignment: T_q > T_k, bottom-right (the first T_q - T_k queries see nothing).
  /// (With key padding, requiring key_padding gives such rows instead: lengths of 0.)
  bool require_empty_row = false;
  bool allow_custom_scale = true;   ///< sometimes pass an explicit scale
  /// Ask for the weights (when the implementation returns them). Laws that never read them say false: for a
  /// kernel whose weights are recovered by probing, each one costs extra calls.
  bool want_weights = true;
  /// Ask for the log-sum-exp (when the implementation returns it: Feature::lse).
  bool want_lse = false;
  /// The options of a law whose derived calls slice or move keys or queries: no block or dense mask, no bias, no
  /// temperature.
  ProblemOptions no_cell_masks() const {
    ProblemOptions o = *this;
    o.allow.remove({Feature::block_mask, Feature::dense_mask, Feature::bias, Feature::temperature, Feature::rope,
                    Feature::rope_interleaved});
    return o;
  }
  /// The options of a law that needs the causal rule in row order (a later token never reaches an earlier row):
  /// no bidirectional prefix, no bidirectional case, and no query bounds of their own (a document aligned on its
  /// own lengths may put a later row at an earlier position than the rows of the document before it).
  ProblemOptions causal_rule() const {
    ProblemOptions o = *this;
    o.allow.remove({Feature::prefix, Feature::bidirectional, Feature::query_documents});
    return o;
  }
  /// The options of a law whose derived calls move keys or queries to other positions: no family beyond the
  /// causal rule, padding and the left window.
  ProblemOptions no_masks_beyond_causal() const {
    ProblemOptions o = causal_rule().no_cell_masks();
    o.allow.remove({Feature::documents, Feature::chunked_local, Feature::right_window, Feature::query_documents});
    return o;
  }
  /// Whether a case for an implementation that declares `declared` may use `f` (allowed or required, declared,
  /// and what it requires may be used too).
  bool may_use(Feature f, FeatureSet declared) const;
  /// Whether every case uses `f` (required, and it may be used).
  bool must_use(Feature f, FeatureSet declared) const { return require.has(f) && may_use(f, declared); }
};

/// A paging plan for an implementation that declares paged K and V, or none (half the draws, never when
/// require_paged): a declared page size (shrinking toward the first declared), a declared layout
/// (token-major first), a contiguous, reversed or shuffled physical order, 0-3 spare pages, 0-2 spare table
/// columns, junk table entries or -1, and what the slots no live key occupies hold (zero, NaN, ±Inf, 1e30).
/// Everything shrinks toward the plainest plan: contiguous, no spares, -1 entries, zeros.
rc::Gen<std::optional<PagedPlan>> gen_paged_plan(const GenConfig& cfg, const ProblemOptions& opts);

/// A quantised K and V cache as a case draws it (Feature::kv_e4m3fn, kv_e5m2, kv_int8; paged only where
/// Feature::paged_quant is declared, never in a
/// gradient case, up to 2^18 weights: its bound is materialised). apply() replaces k and v by what the cache holds
/// after they are written into it: each element's nearest code under its scale (saturating), dequantised. A group's
/// scale (one per tensor, kv head or token and kv head) is 2^e·m with 2^e the power of two nearest its largest
/// |value| over the format's largest (so codes reach the format's limits), e moved by a shift keyed by the group's
/// coordinates (-1: values past the largest code saturate; +1: codes use half the range; +16 for e4m3fn: every code
/// subnormal) and m from {1, 1.5, 0.75, 1.25, 0.3f} keyed by the group's
/// coordinates (all 1 at `plain`), within [2^-12, 2^12] and never 1 (2 instead): identity-free, powers of two and
/// not. Zero points (int8, declared) in [-16, 16] keyed by coordinates. Where Q quantised is declared, half the cases
/// quantise q the same way (its groups keyed by query-head and query coordinates; no zero points).
struct QuantDraw {
  int format = -1;  ///< -1 none; else a QuantFormat's value
  QuantGranularity k_granularity = QuantGranularity::tensor, v_granularity = QuantGranularity::tensor;
  /// Q quantised too (Feature::q_quant, FP8 and int8 only), its scales at this granularity over q's shape; -1: not.
  int q_granularity = -1;
  bool zero_points = false;
  bool plain = true;  ///< powers of two only, no shift
  /// Whether a paged case may be quantised too (Feature::paged_quant declared and allowed): its pools then hold codes.
  bool paged = false;
  std::uint64_t seed = 0;
  void apply(Problem& p, const CaseShape& s) const;
};
/// A QuantDraw in a declared format (shrinking toward none, then int8, e4m3fn, e5m2, ggml's blocks where D, the case's
/// head dimension (the gcd of K's and V's), is a multiple of 32), granularity (toward tensor) and zero points (toward
/// none); in every case where a format is required (ProblemOptions::require) and one can be drawn. ggml's blocks take
/// scales as ggml's writers compute them (QuantDraw::apply).
rc::Gen<QuantDraw> gen_quant(const GenConfig& cfg, const ProblemOptions& opts, Index D);
/// The rows of the formats a quantised cache comes in (a law requires them all: each is drawn where declared).
inline constexpr Feature kQuantFormatFeatures[] = {Feature::kv_e4m3fn,    Feature::kv_e5m2,      Feature::kv_int8,
                                                   Feature::kv_ggml_q8_0, Feature::kv_ggml_q4_0, Feature::kv_ggml_q4_1,
                                                   Feature::kv_ggml_q5_0, Feature::kv_ggml_q5_1};
/// Whether a case for `caps` under `opts` may draw a quantised cache (some declared format allowed or required).
bool may_quantise(const GenConfig& cfg, const ProblemOptions& opts);

/// Selected keys as a case draws them (Feature::index_list, index_list_blocks): per batch entry, kv head and query,
/// the units (keys, or blocks of block_size keys) a pattern lists: every unit, none, every other one, or (most cases)
/// each with probability density/4, keyed by the coordinates of the batch entry, kv head, query and the unit's first
/// key so that shrinking the shape keeps the other rows. The keys the causal rule hides are listed too (the
/// intersection is the call's). Entries in order, reversed, or (hashed) in a hashed order; with padding a -1 first,
/// last and (hashed) between entries; with duplicates the first entry again at the end. Shrinking goes toward every
/// unit listed in order, no padding, no duplicates, key indices.
struct IndexDraw {
  bool on = false;
  Index block_size = 1;
  enum Pattern { every, none, alternate, hashed };
  int pattern = every;
  int density = 2;  ///< of 4, for the hashed pattern
  bool shuffled = false, padding = false, duplicates = false;
  bool per_query_head = false;  ///< one list per query head (Feature::index_list_per_query_head) where H_kv < H
  /// In a paged case of key indices, the entries cross as the pool's slots (Feature::index_list_physical).
  bool physical = false;
  /// The implementation counts duplicates (Feature::index_list_counted): the list means it (IndexList::counted).
  bool counted = false;
  /// The implementation selects each query's own block too (Feature::index_list_current_block).
  bool current_block = false;
  std::uint64_t seed = 0;
  void apply(Problem& p, const CaseShape& s) const;
};
/// An IndexDraw in every case where index_list is required (and may be used), none otherwise; block sizes 2, 3 and 16
/// where index_list_blocks may be used.
rc::Gen<IndexDraw> gen_index_list(const GenConfig& cfg, const ProblemOptions& opts);

/// A tree of draft tokens as a case draws it (Feature::tree, tree_bitmask): the last T_q keys of each batch entry
/// are its nodes. Every node a root (each sees the prefix and itself), a chain (node n the child of node n - 1: the
/// tree is chunked prefill), or (most cases) branching: node n's parent the latest earlier node whose query coordinate
/// is at most a hash of n's coordinates and the entry's (below n's own), or none. Given by its parents, or as a packed
/// bitmask in either bit order, as declared. Shrinking goes toward roots and parents. Where T_q < T_k the case is
/// bottom-right (a decode step over the prefix) where the implementation accepts it; key lengths below T_q are raised
/// to T_q (each entry holds its nodes); no tree where T_q > T_k or past 2^18 weights.
struct TreeDraw {
  bool on = false;
  enum Pattern { roots, chain, branching };
  int pattern = roots;
  int form = 0;  ///< 0 parents, 1 a little-endian bitmask, 2 a big-endian one
  std::uint64_t seed = 0;
  void apply(Problem& p, const CaseShape& s, const Capabilities& caps) const;
};
/// A TreeDraw in every case where tree or tree_bitmask is required (and may be used), none otherwise.
rc::Gen<TreeDraw> gen_tree(const GenConfig& cfg, const ProblemOptions& opts);

/// The modifiers a case draws, keyed by query-head coordinate (CaseShape::h_ids) so that deleting a head keeps
/// every other head's slope and sink: softcap 1, 5 or 50, or, given the largest spread of one row's visible scores
/// (`max_spread`, 0: unknown), the power of two in (max_spread / 8, max_spread / 4] (a cap that bites: a fixed one
/// far above the scores changes nothing, and a kernel that ignores it passes softcap-bound); ALiBi slopes 2^-(h+1) (the geometric slopes of 8
/// heads) or 1 for every head; sinks from {0, 1, -1, 2.5, -3, 6}, per head. Shrinks toward none.
struct Modifiers {
  std::optional<double> softcap{};
  int alibi = 0;   ///< 0 none, 1 geometric, 2 a slope of 1 everywhere
  int sinks = -1;  ///< -1 none, else the offset into the sink values
  /// -1 none; else an additive bias whose values follow from this seed and each cell's coordinates
  /// (b_ids, h_ids, q_ids, k_ids), so that deleting a head, a query or a key keeps the others' values.
  int bias = -1;
  /// The bias's extents: 0 [B,H,T_q,T_k], 1 [1,H,..] (one per head), 2 [B,1,..] (one per batch entry), 3 [1,1,..].
  int bias_extent = 0;
  /// -1 none; else a per-query temperature whose values (in [1/2, 3], exact in every dtype) follow from this seed
  /// and each query's coordinates (b_ids, h_ids, q_ids), with extents as the bias's ([B|1, H|1, T_q]).
  int temperature = -1;
  int temperature_extent = 0;
  /// -1 none; else a rope (rotary embeddings of q and k, where B·H·T_q·T_k <= 2^18): its declared variant, its
  /// rotary_dim (0: 2, 1: 4 or D - D % 2 if less, 2: D - D % 2), base, linear factor, and positions (each token's
  /// index plus rope_offset, or free ids keyed by coordinates).
  int rope = -1;
  RopeVariant rope_variant = RopeVariant::half_split;
  int rope_dim = 0;
  double rope_base = 10000, rope_factor = 1;
  Index rope_offset = 0;
  bool rope_free = false;
  /// The rope's scaling where a scaling beyond linear is declared: 0 linear (by rope_factor), 1 NTK-aware (rotary_dim
  /// at least 4), 2 Llama 3's (low and high frequency factors 1 and 4, original context rope_context).
  int rope_scaling = 0;
  double rope_context = 8192;
  /// -1 none; else a QK-norm in a declared placement (qk_outside), of q (qk_sides & 1) and/or k (& 2), eps qk_eps,
  /// with weights in [1/2, 3/2] keyed by the head dimension's coordinate.
  int qk_norm = -1;
  bool qk_outside = false;
  int qk_sides = 3;
  double qk_eps = 1e-6;
  /// -1 none; else dropout with p kDropoutPs[dropout] (where B·H·T_q·T_k <= 2^18: it is materialised), a seed and an
  /// offset, each shrinking toward 0.
  int dropout = -1;
  std::uint64_t dropout_seed = 0, dropout_offset = 0;
  /// Sets p's softcap, alibi_slopes, sinks, bias and temperature for the case's coordinates (empty ids: 0, 1, ...).
  void apply(Problem& p, const CaseShape& s) const;
};
rc::Gen<Modifiers> gen_modifiers(const GenConfig& cfg, const ProblemOptions& opts, double max_spread = 0);

/// Shape generator: B, H in [1, max], T in [min_T, max_T] (a third of the draws at a tile edge, see
/// tile_edge_lengths) with a tail up to max_T_tail as RapidCheck's size grows, D in [1, max_D] (small, uniform
/// and power-of-two draws), the causal alignment, and, where allowed, H_kv among the divisors of H (at most
/// max_H_kv), per-sequence key lengths and a window; or GenConfig::shape, pinned. For implementations that take
/// bottom-right cross-length calls, a quarter of the cross-length cases each become a decode step
/// (T_q = 1 < T_k) or a prefill chunk (T_q < T_k), bottom-right. The whole geometry is one shrinkable:
/// every axis is cut from its end and loses any single index (a batch entry, a whole kv group or the same query
/// head of every group, a position of q, k and v together, or of q or k alone when T_q != T_k is allowed, a D
/// coordinate), padding and the window shrink toward none, and a square case may become a cross-length one.
rc::Gen<CaseShape> gen_shape(const GenConfig& cfg, const ProblemOptions& opts = {});

/// A whole problem with coverage tags: shape, then regime and magnitudes, then the tensors. Shape, scale and
/// values shrink as one: gen_shape's steps (the entries a step keeps keep their current values), then an
/// explicit scale toward the default, then each value's simple_values, so a shape that could not shrink is tried
/// again once the values are simpler; last, where nothing else shrinks, each shape step once more with other
/// values or scale (a step that drops D coordinates keeping the old scale, where the law allows an explicit one;
/// a same-size step of a large case with the values as drawn; any step of a small case with generic values).
rc::Gen<LawCase> gen_problem(const GenConfig& cfg, const ProblemOptions& opts = {});

/// Above this many weights (B·H·T_q·T_k) a case is a long context: no law asks for or materialises
/// [T_q,T_k]. The oracle is streamed (O(T·D)), outputs are still checked in full, and weights are sampled
/// at chosen key columns for every query row by one-hot probing (sample_weights). 2^22 weights are 32 MiB
/// of doubles; every case at the default bounds (B, H <= 4, T <= 256) stays below it.
inline constexpr double kMaterialisedWeights = double(1 << 22);
/// The longest sequence a drawn gradient case has under cfg's bounds, unless --min-T asks for more (then T is
/// min_T) or the shape is pinned: B·H·T_q·T_k <= kMaterialisedWeights at the largest B and H, so that an
/// ordinary run's gradient cases stay cheap. Longer ones are checked too (a pinned --shape, --min-T): their
/// oracle backward and its bound are streamed (streamed_gradient_check). 512 at the default B, H <= 4.
Index gradient_max_T(const GenConfig& cfg);
/// A case for a gradient law: gen_problem's case with an upstream gradient dO (p.d_output, q's shape) in its own
/// regime and magnitude, rounded to the dtype, drawn at q's coordinates and shrunk with the case like q (a shape
/// step keeps the dO of the entries it keeps; each value shrinks toward 0). Gradients are linear
/// in dO, so when the oracle's largest gradient would not fit in the dtype (float16 overflows at 65504) dO is
/// scaled by a power of two until it fits with room to spare (tag "dO-scaled-to-fit").
rc::Gen<LawCase> gen_gradient_case(const GenConfig& cfg, const ProblemOptions& opts = {});

/// Coverage tags of a problem (T bucket, D bucket, largest |score| bucket); gen_problem adds the regime.
std::vector<std::string> shape_tags(const Problem& p);

}  // namespace attncheck
