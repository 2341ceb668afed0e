// Block and dense masks (CaseShape::Cells): cells keyed by their coordinates, so deleting a position keeps the
// others' cells, and blocks keyed by the drawn block grid.
#include "parts.hpp"

#include "../mix64.hpp"

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

std::uint64_t cell_hash(std::uint64_t seed, Index a, Index b, Index c, Index d) {
  std::uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ull);
  for (const Index x : {a, b, c, d}) h = mix64(h ^ (std::uint64_t(x) + 0x9e3779b97f4a7c15ull));
  return h;
}

}  // namespace

Index generation::cell_b(const CaseShape& s, Index b) { return s.cells.per_batch ? s.b_ids[std::size_t(b)] : 0; }
Index generation::cell_h(const CaseShape& s, Index h) { return s.cells.per_head ? s.h_ids[std::size_t(h)] : 0; }

namespace {

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

}  // namespace

// The dense cells of s's mask, [B or 1, H or 1, T_q, T_k].
DenseMask generation::cells_of(const CaseShape& s) {
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

std::array<Index, 2> generation::block_coords(const CaseShape& s, Index x, Index y) {
  return {s.q_ids[std::size_t(x * s.cells.block_q)] / s.cells.grid_q,
          s.k_ids[std::size_t(y * s.cells.block_k)] / s.cells.grid_k};
}

// s's block mask: kinds at random (keyed by block_coords), all partial, or the cells' block encoding; then the
// blocks shrinking made full.
BlockMask generation::block_mask_of(const CaseShape& s) {
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

namespace {

}  // namespace

}  // namespace attncheck
