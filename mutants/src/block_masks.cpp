// Mutants whose mistake is in a block mask (FlexAttention's BlockMask) or a dense boolean mask: how a
// kernel reads the kinds of block and the partial cells, broadcasts them over batch and heads, and combines them
// with the other families. Each kernel but one mixes values over the keys its own (wrong) rule lets through
// with attend_where, so the rule is its only bug; one skips empty blocks in the output but not in the row sum.
// And a control that walks the blocks as a tiled kernel does.
#include <functional>
#include <limits>

#include "parts.hpp"

namespace attncheck::zoo {
namespace {

// What these kernels declare: block and dense masks and no causal rule (FlexAttention's masks usually carry
// the causal rule themselves).
// Square calls only (`square`) for the kernels whose bug needs a block away from the origin: FlexAttention's
// tests are mostly square, and a square minimal case (T = 2) is one the shrinker always reaches.
Capabilities cell_mask_capabilities(bool square = false) {
  Capabilities c = zoo_capabilities();
  c.features.add({Feature::block_mask, Feature::dense_mask, Feature::bidirectional});
  if (square) c.cross_lengths = false;
  return c;
}

// The same for kernels written for grouped-query heads (H_kv | H).
Capabilities gqa_cell_mask_capabilities() {
  Capabilities c = cell_mask_capabilities();
  c.features.add(Feature::gqa);
  return c;
}

ImplementationPtr cell_rule_impl(const char* name, const char* description, Rule rule, bool square = false) {
  return rule_impl(name, description, std::move(rule), cell_mask_capabilities(square));
}

// The context's rule without its block and dense masks: the families a kernel applies before them.
Visibility without_cells(const HeadCtx& c) {
  HeadCtx d = c;
  d.block_mask = nullptr;
  d.dense_mask = nullptr;
  return d.visibility();
}

// The dense mask allows (i, j) of this head (true without one).
bool dense_allows(const HeadCtx& c, Index i, Index j) {
  return !c.dense_mask || c.dense_mask->visible(c.b, c.h, i, j);
}

// A block mask's kinds as a kernel reads them from the flat [B,H,q_blocks,k_blocks] buffer at batch bb, head hh,
// block (x, y): past the buffer (or past the blocks), the zoo reads an empty block.
BlockKind kind_at(const BlockMask& m, Index bb, Index hh, Index x, Index y) {
  const Index sb = m.B == 1 ? 0 : m.H * m.q_blocks * m.k_blocks, sh = m.H == 1 ? 0 : m.q_blocks * m.k_blocks;
  if (x < 0 || y < 0 || x >= m.q_blocks || y >= m.k_blocks) return BlockKind::Empty;
  const Index at = bb * sb + hh * sh + x * m.k_blocks + y;
  return at < Index(m.kinds.size()) ? BlockKind(m.kinds[std::size_t(at)]) : BlockKind::Empty;
}

// A block-mask rule from how the kernel reads the kind of block (b, h, i, j) and the partial cell, on top of the
// other families (and the dense mask) applied correctly.
using KindOf = std::function<BlockKind(const HeadCtx&, const BlockMask&, Index, Index)>;
using CellOf = std::function<bool(const HeadCtx&, const BlockMask&, Index, Index)>;
Rule block_rule(KindOf kind_of, CellOf cell_of) {
  return [kind_of, cell_of](const HeadCtx& c, const Visibility& v, Index i, Index j) {
    if (!c.block_mask) return v.visible(i, j);
    if (!without_cells(c).visible(i, j) || !dense_allows(c, i, j)) return false;
    const BlockKind k = kind_of(c, *c.block_mask, i, j);
    return k == BlockKind::Full || (k == BlockKind::Partial && cell_of(c, *c.block_mask, i, j));
  };
}
BlockKind right_kind(const HeadCtx& c, const BlockMask& m, Index i, Index j) {
  return m.kind(c.b, c.h, i / m.block_q, j / m.block_k);
}
bool right_cell(const HeadCtx& c, const BlockMask& m, Index i, Index j) { return m.partial.visible(c.b, c.h, i, j); }

}  // namespace

std::vector<Mutant> block_mask_mutants() {
  std::vector<Mutant> z;

  // FlexAttention's full and partial blocks both on the fast path: `if kind != EMPTY: no mask_mod`.
  z.push_back(Mutant{
      .impl = cell_rule_impl("mutant:partial-block-as-full", "a partial block is taken whole, its cells never read",
                        block_rule(right_kind, [](const HeadCtx&, const BlockMask&, Index, Index) { return true; })),
      .bug = "a partial block is treated as full: the keys its dense cells hide are seen",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query, one partial block whose cell hides key 0 of 2 (or the only key), no causal rule",
      .killed_by = {"hidden-keys", "zero-future-weight", "oracle-agreement", "mask-encodings"},
  });

  // The other way round: `if kind != EMPTY: apply mask_mod`, a full block's keys filtered by cells that are
  // only defined inside partial blocks.
  z.push_back(Mutant{
      .impl = cell_rule_impl("mutant:full-block-reads-cells", "a full block is filtered by the partial cells",
                        [](const HeadCtx& c, const Visibility& v, Index i, Index j) {
                          if (!c.block_mask) return v.visible(i, j);
                          const BlockMask& m = *c.block_mask;
                          if (!without_cells(c).visible(i, j) || !dense_allows(c, i, j)) return false;
                          if (right_kind(c, m, i, j) == BlockKind::Empty) return false;
                          return m.partial.cells.empty() || m.partial.visible(c.b, c.h, i, j);
                        },
                        true),
      .bug = "a full block's keys are filtered by the dense cells, which only partial blocks define: keys a full "
             "block shows are hidden",
      .minimal_shape = {1, 1, 2, 1},
      .why_minimal = "square calls: two positions in blocks of 1, a full block whose cell (undefined there) says "
                     "hidden and a partial block (so that the cells exist)",
      .killed_by = {"oracle-agreement", "mask-encodings"},
  });

  // The tiles of empty blocks skipped in the P·V product but their exponentials left in the row sum l: the
  // weights of the visible keys sum to less than 1.
  z.push_back(Mutant{
      .impl = head_impl(
          "mutant:empty-block-in-row-sum", "an empty block is skipped in the output but counted in the row sum",
          [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
            using A = Scalar<decltype(Q)>;
            const Visibility correct = c.visibility(), families = without_cells(c);
            const Matrix<A> s = scores(Q, K, c.resolved_scale());
            HeadOut<A> r;
            r.weights = Matrix<A>::Zero(s.rows(), s.cols());
            r.output = Matrix<A>::Zero(s.rows(), V.cols());
            for (Index i = 0; i < s.rows(); ++i) {
              A m = -std::numeric_limits<A>::infinity();
              for (Index j = 0; j < s.cols(); ++j)
                if (correct.visible(i, j)) m = std::max(m, s(i, j));
              if (m == -std::numeric_limits<A>::infinity()) continue;
              A sum = 0;
              for (Index j = 0; j < s.cols(); ++j) {
                const bool empty_block = c.block_mask && families.visible(i, j) &&
                                         c.block_mask->kind(c.b, c.h, i / c.block_mask->block_q,
                                                            j / c.block_mask->block_k) == BlockKind::Empty;
                if (correct.visible(i, j) || empty_block) sum += std::exp(s(i, j) - m);
              }
              for (Index j = 0; j < s.cols(); ++j)
                if (correct.visible(i, j)) {
                  r.weights(i, j) = std::exp(s(i, j) - m) / sum;
                  r.output.row(i) += r.weights(i, j) * V.row(j);
                }
            }
            return r;
          },
          cell_mask_capabilities()),
      .bug = "the keys of empty blocks are left out of the output but their exp(s - m) stays in the row sum: the "
             "weights of a row with an empty block sum to less than 1",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over two keys (bottom-right, or no causal rule), key 1 in an empty block of 1: "
                     "its exp(s - m) enters the row sum (a NaN there makes the output NaN)",
      .killed_by = {"row-stochastic", "oracle-agreement", "convex-hull", "mask-encodings"},
  });

  // The kinds' batch and head strides swapped (a [H,B,...] buffer read as [B,H,...]): a mask per head is read
  // per batch entry, one per batch entry per head.
  z.push_back(Mutant{
      .impl = cell_rule_impl("mutant:block-mask-wrong-axis", "the block kinds' batch and head axes swapped",
                        block_rule(
                            [](const HeadCtx& c, const BlockMask& m, Index i, Index j) {
                              return kind_at(m, c.h, c.b, i / m.block_q, j / m.block_k);
                            },
                            right_cell)),
      .bug = "the block mask broadcast over the wrong axis: head h reads batch entry h's blocks and batch entry "
             "b head b's",
      .minimal_shape = {2, 1, 1, 1},
      .why_minimal = "two batch entries with their own block masks (or two heads), one query, one key: entry 1 "
                     "reads entry 0's kinds",
      .killed_by = {"oracle-agreement", "hidden-keys", "zero-future-weight"},
      .also_minimal = {{1, 2, 1, 1}},
  });

  // Grouped-query heads: the kernel loops over kv heads and reads one block mask per group, at the kv head's
  // index (`mask[b, h_kv]`), where the mask is per query head. Without grouping (H_kv = H) it is right.
  z.push_back(Mutant{
      .impl = rule_impl("mutant:block-mask-per-kv-head", "a per-head block mask read at the kv head's index",
                        block_rule(
                            [](const HeadCtx& c, const BlockMask& m, Index i, Index j) {
                              return kind_at(m, c.b, c.h / (c.H / c.H_kv), i / m.block_q, j / m.block_k);
                            },
                            [](const HeadCtx& c, const BlockMask& m, Index i, Index j) {
                              return m.partial.visible(c.b, c.h / (c.H / c.H_kv), i, j);
                            }),
                        gqa_cell_mask_capabilities()),
      .bug = "with grouped-query heads the block mask is read at the kv head's index: query head h of a group "
             "gets head h / group's blocks, not its own",
      .minimal_shape = {1, 2, 1, 1},
      .why_minimal = "two query heads sharing one kv head, each with its own block mask, one query, one key: "
                     "head 1 reads head 0's blocks",
      .killed_by = {"oracle-agreement", "hidden-keys", "zero-future-weight"},
      .also_minimal = {{1, 2, 2, 1}},
  });

  // The query block index from the key block size: `m = i / BLOCK_K` (the two are equal in most configs).
  z.push_back(Mutant{
      .impl = cell_rule_impl("mutant:query-block-from-block-k", "the query's block index computed with block_k",
                        block_rule(
                            [](const HeadCtx& c, const BlockMask& m, Index i, Index j) {
                              return kind_at(m, c.b, c.h, i / m.block_k, j / m.block_k);
                            },
                            right_cell),
                        true),
      .bug = "the query block index is i / block_k: with block_q != block_k a query reads another row of blocks",
      .minimal_shape = {1, 1, 2, 1},
      .why_minimal = "square calls: two positions, block_q < block_k, query 1 reading the first row of blocks (or, "
                     "with blocks drawn the other way, block_q = 2 > block_k = 1, which shrinking never swaps: "
                     "three positions, query 1 reading the second row of blocks)",
      .killed_by = {"oracle-agreement", "hidden-keys"},
      .also_minimal = {{1, 1, 3, 1}},
  });

  // The partial cells indexed inside the block (FlexAttention's mask_mod called with block-local indices).
  z.push_back(Mutant{
      .impl = cell_rule_impl("mutant:partial-cells-block-local", "the partial cells read at block-local coordinates",
                        block_rule(right_kind,
                                   [](const HeadCtx& c, const BlockMask& m, Index i, Index j) {
                                     return m.partial.visible(c.b, c.h, i % m.block_q, j % m.block_k);
                                   }),
                        true),
      .bug = "a partial block's cells are read at (i mod block_q, j mod block_k): every partial block repeats "
             "the first block's cells",
      .minimal_shape = {1, 1, 2, 1},
      .why_minimal = "square calls: two positions, a partial block away from the origin whose hidden cell the "
                     "kernel reads at the first block's coordinates, where it is visible",
      .killed_by = {"oracle-agreement", "hidden-keys", "zero-future-weight"},
  });

  // The key blocks counted as T_k / block_k: a ragged last block of keys is never visited.
  z.push_back(Mutant{
      .impl = cell_rule_impl("mutant:ragged-key-block-dropped", "the short last block of keys is never visited",
                        block_rule(
                            [](const HeadCtx& c, const BlockMask& m, Index i, Index j) {
                              if (j / m.block_k >= c.T_k / m.block_k) return BlockKind::Empty;
                              return m.kind(c.b, c.h, i / m.block_q, j / m.block_k);
                            },
                            right_cell)),
      .bug = "the number of key blocks is floor(T_k / block_k): the keys of a short last block are never seen",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "T_k not a multiple of block_k, a query that sees a key of the short last block",
      .killed_by = {"oracle-agreement", "mask-encodings"},
  });

  // With a block mask the kernel drops the causal rule (the mask is assumed to carry it).
  z.push_back(Mutant{
      .impl = cell_rule_impl("mutant:block-mask-replaces-causal", "a block mask replaces the causal rule",
                        [](const HeadCtx& c, const Visibility& v, Index i, Index j) {
                          if (!c.block_mask) return v.visible(i, j);
                          HeadCtx d = c;
                          d.causal = false;
                          return d.visibility().visible(i, j);
                        }),
      .bug = "with a block mask the causal rule is not applied: a full block above the diagonal shows future keys",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query at position 0 over two keys, a full block holding key 1, the causal rule on",
      .killed_by = {"hidden-keys", "zero-future-weight", "oracle-agreement"},
  });

  // The dense mask read transposed ([T_k, T_q] for [T_q, T_k]); outside the square it reads nothing.
  z.push_back(Mutant{
      .impl = cell_rule_impl("mutant:dense-mask-transposed", "the dense mask read as [T_k,T_q]",
                        [](const HeadCtx& c, const Visibility&, Index i, Index j) {
                          if (!without_cells(c).visible(i, j)) return false;
                          if (c.block_mask && !c.block_mask->visible(c.b, c.h, i, j)) return false;
                          if (!c.dense_mask) return true;
                          return j < c.T_q && i < c.T_k && c.dense_mask->visible(c.b, c.h, j, i);
                        }),
      .bug = "the dense mask is read at (j, i): a query sees the keys whose own row would see it",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over two keys (bottom-right, or no causal rule), the dense mask showing key 1: "
                     "the kernel reads cell (1, 0), outside the [1, 2] mask, and hides it",
      .killed_by = {"oracle-agreement", "hidden-keys", "zero-future-weight"},
  });

  // The dense mask of batch entry 0 for every batch entry (a batch stride of 0 where it is not broadcast).
  z.push_back(Mutant{
      .impl = cell_rule_impl("mutant:dense-mask-batch-ignored", "every batch entry reads entry 0's dense mask",
                        [](const HeadCtx& c, const Visibility&, Index i, Index j) {
                          if (!without_cells(c).visible(i, j)) return false;
                          if (c.block_mask && !c.block_mask->visible(c.b, c.h, i, j)) return false;
                          return !c.dense_mask || c.dense_mask->visible(0, c.h, i, j);
                        }),
      .bug = "the dense mask's batch stride taken as 0: every batch entry gets entry 0's mask",
      .minimal_shape = {2, 1, 1, 1},
      .why_minimal = "two batch entries with their own dense masks, one query",
      .killed_by = {"oracle-agreement", "hidden-keys", "zero-future-weight"},
  });

  // Correct, as a tiled kernel walks a BlockMask: per query block, every key block, skip empty, take full
  // blocks whole (the other families still apply), read the cells of partial ones.
  z.push_back(Mutant{
      .impl = cell_rule_impl("control:block-mask-by-tiles", "walks the blocks: empty skipped, full whole, partial cells",
                        [](const HeadCtx& c, const Visibility&, Index i, Index j) {
                          if (!without_cells(c).visible(i, j) || !dense_allows(c, i, j)) return false;
                          if (!c.block_mask) return true;
                          const BlockMask& m = *c.block_mask;
                          switch (m.kind(c.b, c.h, i / m.block_q, j / m.block_k)) {
                            case BlockKind::Empty: return false;
                            case BlockKind::Full: return true;
                            case BlockKind::Partial: return m.partial.visible(c.b, c.h, i, j);
                          }
                          return false;
                        }),
      .bug = "none: the block mask walked tile by tile, as FlexAttention's kernel does",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {},
  });
  return z;
}

}  // namespace attncheck::zoo
