// What one part of the generators (properties/src/gen/) uses of another; not installed. The parts: values.cpp
// (values keyed by coordinates), shapes.cpp (shapes and their shrinking), masks.cpp (block and dense masks),
// draws.cpp (the first draw of a shape), tags.cpp, cases.cpp (a case as one shrinkable), modifiers.cpp (score
// modifiers and paged-KV plans). The public generators are attncheck/generators.hpp's.
#pragma once

#include <array>
#include <utility>
#include <vector>

#include "attncheck/generators.hpp"

namespace attncheck::generation {

// ---- shapes.cpp ----

/// The divisors of n, ascending; those strictly between 1 and n.
std::vector<Index> divisors(Index n);
std::vector<Index> inner_divisors(Index n);
/// 0, 1, ..., n-1: the coordinates of an axis nothing was deleted from.
std::vector<Index> iota(Index n);
/// c's key lengths kept inside [0, T_k] after T_k changed from old_T_k: each batch entry keeps its padding (the
/// padded keys at its end, as far as T_k allows) or its length (clamped to T_k).
CaseShape fit_key_lengths(CaseShape c, Index old_T_k, bool keep_padding);

/// What the shrinking of a run's shapes may do: T_q != T_k and grouped heads only where the law and the
/// implementation allow them, nothing below min_T, nothing at all to a pinned shape.
struct ShrinkRules {
  bool cross = false, gqa = false;
  Capabilities caps;
  Index min_T = 1;
  bool pinned = false;
  ProblemOptions opts;                ///< what `require` holds is never shrunk away
  std::vector<Index> long_lengths{};  ///< GenConfig::long_lengths: T moves only between these
};

/// Every shape one step simpler than s, bigger steps first (shapes.cpp says the order).
std::vector<CaseShape> shape_shrinks(const CaseShape& s, const ShrinkRules& rules);

// ---- masks.cpp ----

/// The coordinates of the mask entry that (b, h) reads: 0 on a broadcast axis.
Index cell_b(const CaseShape& s, Index b);
Index cell_h(const CaseShape& s, Index h);
/// What block (x, y)'s kind is keyed by: the tile of the drawn block grid (grid_q x grid_k, the block sizes as
/// first drawn) that holds the coordinates of its first query and first key. So deleting a position keeps every
/// block's kind that does not start elsewhere, and smaller blocks inherit the kind of the drawn block they lie in.
std::array<Index, 2> block_coords(const CaseShape& s, Index x, Index y);
/// The dense cells of s's mask, [B or 1, H or 1, T_q, T_k]; s's block mask.
DenseMask cells_of(const CaseShape& s);
BlockMask block_mask_of(const CaseShape& s);

// ---- draws.cpp ----

/// The shape a case starts from, and the rules its shrinking follows.
std::pair<rc::Gen<CaseShape>, ShrinkRules> first_shape(const GenConfig& cfg, const ProblemOptions& opts);

// ---- index_list.cpp ----

/// A choice among w.size() options (weights w) whose shrinks are every earlier one, first to last: from the last
/// pattern back to each simpler one (weighted_choice halves its way to the first, skipping some).
rc::Gen<int> choice_shrinking_to_each_earlier(std::vector<std::size_t> w);

// ---- values.cpp ----

/// The drawn value of every entry of a tensor of shape s whose entries sit at coordinates `at`: a function of the
/// regime, the magnitude, `base` and each entry's coordinates only, rounded to the dtype.
std::vector<double> draw_values(const Shape& s, const Coords& at, Regime regime, double magnitude, DType dtype,
                                std::uint64_t base, int size);
/// The steps toward simpler values of one tensor's entries.
rc::Seq<std::vector<double>> value_shrinks(const std::vector<double>& v, DType dtype);
/// v's entries as a tensor of shape s.
Tensor<double> as_tensor(const Shape& s, const double* v);

}  // namespace attncheck::generation
