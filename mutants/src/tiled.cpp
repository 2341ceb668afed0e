// Block-tiled online-softmax kernels, written the way FlashAttention-style CPU/GPU kernels are: query tiles of
// 32 rows, key tiles of 16, split-K chunks of 32 keys merged at the end. One correct control and one mutant per
// classic tiling mistake; each mistake shows only across tiles or at a ragged end.
#include <limits>
#include <type_traits>

#include "parts.hpp"

namespace attncheck::zoo {
namespace {

constexpr Index kQueryTile = 32;  // rows of q one block handles
constexpr Index kKeyTile = 16;    // keys loaded per inner step (≠ the query tile, as in real kernels)
constexpr Index kSplitK = 32;      // keys per split-K chunk (two key tiles)

/// The one mistake a tiled kernel makes (none: the control).
enum class TileBug { none, inverted_rescale, key_step_by_query_tile, tile_local_max, spill_last_query_tile, split_drops_tail };

template <class A>
using Row = Eigen::Matrix<A, 1, Eigen::Dynamic>;

// One query row's online-softmax state over the keys seen so far: running max m, running sum l and the
// unnormalised output acc.
template <class A>
struct RowState {
  A m = -std::numeric_limits<A>::infinity(), l = 0;
  Row<A> acc;
  bool seen = false;  // some key was visible
};

// Query row i (its values qi) over keys [k0, k1), one key tile at a time. Keys i may not see are never read:
// a tile with none of them visible leaves the state alone, so future NaN/Inf cannot reach the row.
template <class A>
RowState<A> online_softmax(const Row<A>& qi, const Matrix<A>& K, const Matrix<A>& V, Index i, Index k0, Index k1,
                           A scale, const HeadCtx& c, TileBug bug) {
  RowState<A> st;
  st.acc = Row<A>::Zero(V.cols());
  // BUG key_step_by_query_tile: the loop steps by the query tile, so keys [16, 32) of every chunk are skipped.
  const Index step = bug == TileBug::key_step_by_query_tile ? kQueryTile : kKeyTile;
  Row<A> s(kKeyTile);
  for (Index kt = k0; kt < k1; kt += step) {
    const Index end = std::min(kt + kKeyTile, k1);
    A m_tile = -std::numeric_limits<A>::infinity();
    bool any = false;
    for (Index j = kt; j < end; ++j)
      if (c.visible(i, j)) {
        s(j - kt) = scale * qi.dot(K.row(j));
        m_tile = std::max(m_tile, s(j - kt));
        any = true;
      }
    if (!any) continue;
    // BUG tile_local_max: the running max forgets earlier tiles, so exp(m_old - m_new) overflows when an
    // earlier tile's max is far above this one's.
    const A m_new = bug == TileBug::tile_local_max ? m_tile : std::max(st.m, m_tile);
    if (st.seen) {
      // BUG inverted_rescale: exp(m_new - m_old) scales the old sums up instead of down when the max rises.
      const A alpha = bug == TileBug::inverted_rescale ? std::exp(m_new - st.m) : std::exp(st.m - m_new);
      st.acc *= alpha;
      st.l *= alpha;
    }
    for (Index j = kt; j < end; ++j)
      if (c.visible(i, j)) {
        const A pj = std::exp(s(j - kt) - m_new);
        st.l += pj;
        st.acc += pj * V.row(j);
      }
    st.m = m_new;
    st.seen = true;
  }
  return st;
}

// Merges one split-K chunk's state into the total (the usual log-sum-exp combine).
template <class A>
void merge(RowState<A>& total, const RowState<A>& part) {
  if (!part.seen) return;
  if (!total.seen) {
    total = part;
    return;
  }
  const A m = std::max(total.m, part.m), a = std::exp(total.m - m), b = std::exp(part.m - m);
  total.acc = a * total.acc + b * part.acc;
  total.l = a * total.l + b * part.l;
  total.m = m;
}

// The whole call. Output (and weights) are [B,H,T_q,·]; per batch entry the kernel writes into that entry's
// [H·T_q, D] block of memory, which here has one query tile of slack past its end, so a mutant that writes
// out-of-range rows clobbers the next head's rows (or the slack) and nothing outside the buffer. The weights are
// the kernel's own: V is augmented with the identity [T_k,T_k], whose output columns are exactly the weights the
// kernel applied (one product by 1, the rest by exact zeros).
template <class S>
Tensor<S> tiled(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const Problem& p, Tensor<S>* w,
                TileBug bug) {
  using A = Acc<S>;
  const Shape& s = q.shape();
  const Index H = s.H, T_q = s.T, T_k = k.shape().T, D = s.D, W = w ? T_k : 0;
  const HeadCtx c{.B = s.B, .H = H, .T_q = T_q, .T_k = T_k, .D = D, .dtype = p.dtype, .scale = p.scale,
                  .alignment = p.alignment};
  const A scale = static_cast<A>(c.resolved_scale());
  // BUG split_drops_tail: the chunk count is T_k / kSplitK rounded down, so when T_k > kSplitK is not a
  // multiple of it the last chunk ends early and the T_k mod kSplitK keys after it are never read.
  const Index chunks = bug == TileBug::split_drops_tail ? std::max<Index>(1, T_k / kSplitK) : (T_k + kSplitK - 1) / kSplitK;
  Tensor<S> out(s);
  if (w) *w = Tensor<S>(Shape{s.B, H, T_q, T_k});
  for (Index b = 0; b < s.B; ++b) {
    Matrix<A> o = Matrix<A>::Zero(H * T_q + kQueryTile, D + W);
    const S* qb = q.data() + b * H * T_q * D;  // this batch entry's [H·T_q, D] queries
    // Thread blocks may retire in any order; here the last head's blocks run first.
    for (Index h = H - 1; h >= 0; --h) {
      const Matrix<A> K = k.head(b, h).template cast<A>();
      Matrix<A> V(T_k, D + W);
      V.leftCols(D) = v.head(b, h).template cast<A>();
      if (W) V.rightCols(W).setIdentity();
      for (Index i0 = 0; i0 < T_q; i0 += kQueryTile) {
        // BUG spill_last_query_tile: the last tile's rows are not clipped to T_q; its rows past the end read the
        // next head's queries (or zeros past the buffer) and are stored over the next head's first rows.
        const Index rows = bug == TileBug::spill_last_query_tile ? kQueryTile : std::min(kQueryTile, T_q - i0);
        for (Index r = 0; r < rows; ++r) {
          const Index i = i0 + r, flat = h * T_q + i;
          Row<A> qi = Row<A>::Zero(D);
          if (flat < H * T_q)
            for (Index d = 0; d < D; ++d) qi(d) = static_cast<A>(qb[flat * D + d]);
          RowState<A> total;
          for (Index ch = 0; ch < chunks; ++ch)
            merge(total, online_softmax(qi, K, V, i, ch * kSplitK, std::min(T_k, (ch + 1) * kSplitK), scale, c, bug));
          // A row that sees no key is a zero row, not 0/0.
          o.row(flat) = total.seen && total.l != A(0) ? Row<A>(total.acc / total.l) : Row<A>::Zero(D + W);
        }
      }
    }
    for (Index h = 0; h < H; ++h)
      for (Index i = 0; i < T_q; ++i) {
        for (Index d = 0; d < D; ++d) out(b, h, i, d) = static_cast<S>(o(h * T_q + i, d));
        for (Index j = 0; j < W; ++j) (*w)(b, h, i, j) = static_cast<S>(o(h * T_q + i, D + j));
      }
  }
  return out;
}

ImplementationPtr tiled_impl(std::string name, std::string description, TileBug bug) {
  return make_implementation(std::move(name), std::move(description), zoo_capabilities(), [bug](const Problem& p) {
    return run_typed(p, [&](const auto& q, const auto& k, const auto& v, const Problem& pr, auto* w) {
      return tiled(q, k, v, pr, w, bug);
    });
  });
}

}  // namespace

std::vector<Mutant> tiled_mutants() {
  std::vector<Mutant> z;
  z.push_back(Mutant{
      .impl = tiled_impl("mutant:tiled-inverted-rescale",
                         "tiled online softmax whose rescale is exp(m_new - m_old) when the running max rises",
                         TileBug::inverted_rescale),
      .bug = "online-softmax rescale inverted: when a later key tile raises the running max, the earlier sums are "
             "multiplied by exp(m_new - m_old) instead of exp(m_old - m_new)",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query must see two key tiles of 16, the second with the higher max: T_q = 1, T_k = 17 "
                     "(bottom-right); the weights still sum to 1, but every key of the first tile is overweighted",
      .killed_by = {"oracle-agreement"},
  });
  z.push_back(Mutant{
      .impl = tiled_impl("mutant:tiled-key-step", "tiled online softmax whose key loop steps by the query tile (32)",
                         TileBug::key_step_by_query_tile),
      .bug = "key tiles stepped by the query-tile size: keys 16..31 of every 32 are never read once T_k > 16",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "key 16 (the first of the second key tile) must be visible: T_q = 1, T_k = 17 (bottom-right)",
      .killed_by = {"oracle-agreement"},
  });
  z.push_back(Mutant{
      .impl = tiled_impl("mutant:tiled-local-max", "tiled online softmax whose running max is the current tile's alone",
                         TileBug::tile_local_max),
      .bug = "running max taken from the current key tile alone: the rescale exp(m_old - m_tile) overflows to Inf "
             "(Inf/Inf = NaN) when an earlier tile's max is ~88.7 (float) above a later one's",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "two key tiles, the first scoring far above the second: T_q = 1, T_k = 17 (bottom-right), "
                     "score(key 0) - score(key 16) > 88.7 in float accumulation",
      .killed_by = {"oracle-agreement", "row-stochastic"},
  });
  z.push_back(Mutant{
      .impl = tiled_impl("mutant:tiled-spill-rows",
                         "tiled kernel whose last query tile writes its out-of-range rows over the next head",
                         TileBug::spill_last_query_tile),
      .bug = "the last query tile is not clipped to T_q: its rows past the end are computed from the next head's "
             "queries and stored over the next head's first output rows",
      .minimal_shape = {1, 2, 1, 1},
      .why_minimal = "a next head to clobber (H = 2) and a ragged last tile (any T_q < 32): T = 1 already writes head "
                     "0's row 1 over head 1's row 0",
      .killed_by = {"oracle-agreement", "batch-head-independence"},
  });
  z.push_back(Mutant{
      .impl = tiled_impl("mutant:tiled-split-tail", "split-K kernel whose last chunk stops at a multiple of 32 keys",
                         TileBug::split_drops_tail),
      .bug = "split-K with T_k / 32 chunks rounded down: when T_k > 32 is not a multiple of 32, the last chunk ends "
             "early and the remaining keys are dropped",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "a visible key past the last full chunk: T_q = 1, T_k = 33 (bottom-right) drops key 32",
      .killed_by = {"oracle-agreement"},
  });
  z.push_back(Mutant{
      .impl = tiled_impl("control:tiled-split-k", "correct; block-tiled online softmax (query tiles 32, key tiles 16, split-K 32)",
                         TileBug::none),
      .bug = "control: block-tiled online softmax, query tiles of 32, key tiles of 16, split-K chunks of 32 merged "
             "by log-sum-exp",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {},
  });
  return z;
}

}  // namespace attncheck::zoo
