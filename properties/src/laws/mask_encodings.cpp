// Law 44, mask-encodings: logically equal masks give equal results, whichever way they are encoded:
// a block mask and the dense mask it stands for, full and empty blocks and the same blocks marked partial with
// all-visible or all-hidden cells, and the contiguous families (the causal rule, documents, chunks, a prefix,
// windows) and a block or dense mask that encodes them. The generators draw block and dense masks for every
// other law whose derived calls keep every position (ProblemOptions::no_cell_masks); hidden-keys checks them
// exactly.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace mask_encodings_law {

const char* kWhy =
    "A block mask (FlexAttention's BlockMask: empty, partial and full tiles, partial ones with dense cells) and a "
    "dense boolean mask are encodings: the keys a query sees are what they say, not how they say it. So a dense "
    "mask and its block encoding, a full (empty) block and the same block marked partial with every cell visible "
    "(hidden), and the contiguous families (the causal rule, documents, chunks, a prefix, windows) and a block or "
    "dense mask that encodes the same cells (replacing them when the kernel takes no causal rule, added to them "
    "otherwise) must give the same result. Each pair of calls sees the same keys, so both are within the derived "
    "oracle bound tol of the same float64 oracle and agree within 2 tol. A kernel that takes another path for "
    "one encoding and gets it wrong (the tracker's 'logically equal masks give different results', a partial "
    "block read as full, a full one filtered by cells, a ragged last block dropped) breaks it.";

enum class Encoding { dense_as_blocks, blocks_as_dense, full_as_partial, empty_as_partial, families_as_blocks,
                      families_as_dense };
constexpr int kEncodings = 6;

std::string encoding_name(Encoding e) {
  switch (e) {
    case Encoding::dense_as_blocks: return "the dense mask as its block encoding";
    case Encoding::blocks_as_dense: return "the block mask as the dense mask it stands for";
    case Encoding::full_as_partial: return "every full block marked partial with all cells visible";
    case Encoding::empty_as_partial: return "every empty block marked partial with all cells hidden";
    case Encoding::families_as_blocks: return "every visible cell as a block mask";
    case Encoding::families_as_dense: return "every visible cell as a dense mask";
  }
  return "?";
}

bool has_kind(const BlockMask& m, BlockKind k) {
  return std::find(m.kinds.begin(), m.kinds.end(), std::uint8_t(k)) != m.kinds.end();
}

std::vector<Encoding> encodings(const Problem& p, const Capabilities& caps) {
  std::vector<Encoding> out;
  if (p.dense_mask && !p.block_mask && caps.declares(Feature::block_mask)) out.push_back(Encoding::dense_as_blocks);
  if (p.block_mask && !p.dense_mask && caps.declares(Feature::dense_mask)) out.push_back(Encoding::blocks_as_dense);
  if (p.block_mask && has_kind(*p.block_mask, BlockKind::Full)) out.push_back(Encoding::full_as_partial);
  if (p.block_mask && has_kind(*p.block_mask, BlockKind::Empty)) out.push_back(Encoding::empty_as_partial);
  if (caps.declares(Feature::block_mask)) out.push_back(Encoding::families_as_blocks);
  if (caps.declares(Feature::dense_mask)) out.push_back(Encoding::families_as_dense);
  return out;
}

// Every cell the problem's rule shows, [B, H or 1, T_q, T_k] (per head only where a mask differs by head).
DenseMask visible_cells(const Problem& p) {
  const Shape& s = p.q.shape();
  DenseMask d;
  d.B = s.B;
  d.H = visibility_per_head(p.options()) ? s.H : 1;
  d.T_q = s.T;
  d.T_k = p.k.shape().T;
  for (Index b = 0; b < d.B; ++b)
    for (Index h = 0; h < d.H; ++h) {
      const Visibility vis = p.visibility(b, h);
      for (Index i = 0; i < d.T_q; ++i)
        for (Index j = 0; j < d.T_k; ++j) d.cells.push_back(vis.visible(i, j));
    }
  return d;
}

// The block mask with every block of kind `from` marked partial, the cells there set to what the kind said.
BlockMask as_partial(const BlockMask& m, BlockKind from, Index T_q, Index T_k) {
  BlockMask r = m;
  // The cells of every block (the partial ones' own, full ones' 1, empty ones' 0), at the widest B and H.
  r.partial = dense_of(m, T_q, T_k);
  if (r.partial.B != m.B || r.partial.H != m.H) {  // the partial cells vary where the kinds broadcast: widen them
    BlockMask wide = m;
    wide.B = r.partial.B;
    wide.H = r.partial.H;
    wide.kinds.clear();
    for (Index b = 0; b < wide.B; ++b)
      for (Index h = 0; h < wide.H; ++h)
        for (Index x = 0; x < m.q_blocks; ++x)
          for (Index y = 0; y < m.k_blocks; ++y) wide.kinds.push_back(std::uint8_t(m.kind(b, h, x, y)));
    wide.partial = r.partial;
    r = wide;
  }
  for (std::uint8_t& k : r.kinds)
    if (k == std::uint8_t(from)) k = std::uint8_t(BlockKind::Partial);
  return r;
}

Problem with_encoding(const Problem& p, Encoding e, Index pick, const Capabilities& caps) {
  Problem v = p;
  const Index T_q = p.q.shape().T, T_k = p.k.shape().T;
  const Index sizes[] = {1, 2, 3, 4, 16, 64, 128};
  const Index bq = sizes[pick % 7], bk = sizes[(pick / 7) % 7];
  switch (e) {
    case Encoding::dense_as_blocks:
      v.dense_mask.reset();
      v.block_mask = block_encoding(*p.dense_mask, bq, bk);
      break;
    case Encoding::blocks_as_dense:
      v.block_mask.reset();
      v.dense_mask = dense_of(*p.block_mask, T_q, T_k);
      break;
    case Encoding::full_as_partial: v.block_mask = as_partial(*p.block_mask, BlockKind::Full, T_q, T_k); break;
    case Encoding::empty_as_partial: v.block_mask = as_partial(*p.block_mask, BlockKind::Empty, T_q, T_k); break;
    case Encoding::families_as_blocks:
    case Encoding::families_as_dense: {
      const DenseMask cells = visible_cells(p);
      // Without the causal rule available, the cells are added to the case as it is (they hide nothing more);
      // with it, they replace every family but the padding (which the cells already honour).
      // Documents with query bounds of their own also move ALiBi's positions (a row's constant, but not the
      // sink's): with ALiBi they stay, and the cells are added to them.
      if (caps.declares(Feature::bidirectional) && (p.q_doc_bounds.empty() || p.alibi_slopes.empty())) {
        v.causal = false;
        v.prefix_length = 0;
        v.window.reset();
        v.window_right.reset();
        v.chunk_size = 0;
        v.doc_bounds.clear();
        v.q_doc_bounds.clear();
        v.block_mask.reset();
        v.dense_mask.reset();
      }
      if (e == Encoding::families_as_blocks) {
        v.block_mask = block_encoding(cells, bq, bk);
      } else {
        v.dense_mask = cells;
      }
      break;
    }
  }
  return v;
}

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    LawCase c = *gen_problem(cfg, outputs_only());
    // Which encoding (shrinking toward the first that applies) and a number for its block sizes.
    c.params["encoding"] = double(*rc::gen::inRange<Index>(0, kEncodings));
    c.params["pick"] = double(*rc::gen::inRange<Index>(0, 1 << 20));
    return c;
  });
}

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const char* law = "mask-encodings";
  const Problem& p = c.problem;
  const Capabilities& caps = impl.capabilities();
  const std::vector<Encoding> all = encodings(p, caps);
  if (all.empty()) return std::nullopt;
  const Index k = int_param(c, law, "encoding", 0, 1 << 20), pick = int_param(c, law, "pick", 0, Index{1} << 40);
  // The encoding drawn, or the next that applies (cyclically), as neutral-masks chooses.
  Encoding e = all.front();
  for (int step = 0; step < kEncodings; ++step) {
    const auto want = Encoding((k + step) % kEncodings);
    if (std::find(all.begin(), all.end(), want) != all.end()) {
      e = want;
      break;
    }
  }
  const Problem v = with_encoding(p, e, pick, caps);
  const Outcome a = call(impl, p), b = call(impl, v);
  Tensor<double> tol = run_oracle(p).tol_out;
  tol.values() *= 2;
  auto viol = compare(law, "output", a.output, b.output, &tol, [](Index, Index, Index, Index) { return true; });
  if (viol) {
    std::string what = "the same case with " + encoding_name(e);
    if (e == Encoding::families_as_blocks || e == Encoding::families_as_dense)
      what += !v.causal ? " and no other family (causal = false)" : " added";
    if (v.block_mask && (e == Encoding::dense_as_blocks || e == Encoding::families_as_blocks))
      what += " (blocks of " + std::to_string(v.block_mask->block_q) + " x " + std::to_string(v.block_mask->block_k) + ")";
    viol->message += " (the case as drawn vs. " + what + ", which shows exactly the same keys)";
    viol->weights = b.weights;
    const auto& w = viol->worst_index;
    blame_derived_call(*viol, p, a, v, b, {w[0], w[1], w[2], w[3]}, what);
  }
  return viol;
}

std::string not_applicable(const GenConfig& g) {
  if (!g.caps.declares(Feature::block_mask) && !g.caps.declares(Feature::dense_mask))
    return "the implementation declares neither block masks nor dense masks (Feature::block_mask, dense_mask)";
  return "";
}

}  // namespace mask_encodings_law
}  // namespace

Law mask_encodings() {
  using namespace mask_encodings_law;
  return {"mask-encodings", "a block mask, a dense mask and the families they encode give the same result", kWhy,
          LawDoc{"44",
                 "a block mask, the dense mask it stands for, full and empty blocks marked partial, and the families encoded as cells all give the same result",
                 "twice the derived bound"},
          not_applicable, gen, check, 0};
}

}  // namespace attncheck::law_kit
