// The streamed causal forward: query blocks against key tiles with an online softmax (FlashAttention's
// recurrence), fully hidden tiles skipped, Eigen products per tile, (b, h, query block) items on threads.
// Extra memory is O(T·D) per head plus one [block, tile] score matrix per thread; no [T_q,T_k] matrix.
// Compiled once per instruction set (cmake/attncheckIsa.cmake): kernels.hpp's table is all it exports.
//
//   q [B,H,T_q,D], k,v [B,H_kv,T_k,D]     per item: Q_blk [Bq,D], K_t,V_t [Bk,D]
//   S = Q_blk K_tᵀ·scale [Bq,Bk]          m_new = max(m, rowmax S), c = exp(m - m_new)
//   P = exp(S - m_new)                    l = c·l + rowsum P,  acc = c·acc + P V_t
//   output = acc / l  (0 where l = 0: a row that sees no key)
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "attncheck/attention.hpp"
#include "attncheck/cancel.hpp"
#include "kernels.hpp"
#include "tile_modifiers.hpp"

namespace attncheck::detail {
namespace {

// Query rows per block and keys per tile. A [64,128] score tile of float fits in L1 with its exp.
constexpr Index kBlockQ = 64, kTileK = 128;
// Below this many multiply-adds (visible scores times D) threads cost more than they save.
constexpr double kThreadWork = double(1 << 22);

template <class A> using ArrayA = Eigen::Array<A, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class A> using Column = Eigen::Array<A, Eigen::Dynamic, 1>;
template <class A> using HeadRef = Eigen::Map<const Matrix<A>, Eigen::Unaligned>;

// exp(m_old - m_new), the factor that rescales what was accumulated under the old max; exactly 0 when
// nothing was accumulated yet (m_old = -inf), where Eigen's vectorised exp would give ~2.9e-39, not 0.
template <class A> A rescale(A m_old, A m_new) {
  return m_old == -std::numeric_limits<A>::infinity() ? A(0) : std::exp(m_old - m_new);
}

// Per-block state of the recurrence and its scratch, reused across tiles.
template <class A> struct BlockState {
  Matrix<A> acc;               // [n,D] Σ_j exp(s_ij - m_i) v_j
  Column<A> m, l;              // running max and denominator
  Column<double> abs_s, abs_dot;  // bound statistics (oracle only)
  ArrayA<A> s, p, sabs;           // [n,w] scores, their exps, scale·|Q||K|ᵀ
};

template <class A, bool kBounds>
void update_row(BlockState<A>& st, Index r, Index c0, Index w, const HeadRef<A>& v, Index key0) {
  auto seg = st.s.row(r).segment(c0, w);
  const A m_new = std::max(st.m(r), seg.maxCoeff());
  const A c = rescale(st.m(r), m_new);
  auto p = st.p.row(r).segment(c0, w);
  p = (seg - m_new).exp();
  st.l(r) = st.l(r) * c + p.sum();
  st.acc.row(r) = st.acc.row(r) * c + p.matrix() * v.middleRows(key0, w);
  st.m(r) = m_new;
  if constexpr (kBounds) {
    st.abs_s(r) = std::max<double>(st.abs_s(r), seg.abs().maxCoeff());
    st.abs_dot(r) = std::max<double>(st.abs_dot(r), st.sabs.row(r).segment(c0, w).maxCoeff());
  }
}

// Rows [i0, i1) of one head: every key tile the block can see, in order.
template <class S, class A, bool kBounds>
void stream_block(const HeadRef<A>& q, const HeadRef<A>& k, const HeadRef<A>& v, const Visibility& vis, A scale,
                  const HeadModifiers& mods, Index i0, Index i1, S* out, double* stats, BlockState<A>& st) {
  const Index n = i1 - i0, D = v.cols();  // the output's head dimension D_v (q and k have D_k)
  st.acc.setZero(n, D);
  st.m.setConstant(n, -std::numeric_limits<A>::infinity());
  st.l.setZero(n);
  if constexpr (kBounds) {
    st.abs_s.setZero(n);
    st.abs_dot.setZero(n);
  }
  // Visible runs only move right as i grows (causal position, window start and padding are all monotone), and
  // rows that see no key come only first (bottom-right, T_q > T_k) or last (a window that left every key
  // behind, past T_k or the padding): the block sees keys [begin(r0), end(r1-1)) of its rows [r0, r1) that
  // see one, and no tile outside it. (An empty row's range may start past T_k: never read from it.)
  // (The runs, not the visible keys: a block or dense mask hides keys inside them, which the tiles skip.)
  Index r0 = i0, r1 = i1;
  while (r0 < r1 && vis.run(r0).empty()) ++r0;
  while (r1 > r0 && vis.run(r1 - 1).empty()) --r1;
  const Index kb = r0 < r1 ? vis.run(r0).begin : 0, ke = r0 < r1 ? vis.run(r1 - 1).end : 0;
  const KeyRange first = vis.run(i0), last = vis.run(i1 - 1);  // every row sees a tile only if both ends do
  for (Index t0 = kb / kTileK * kTileK; kb < ke && t0 < ke; t0 += kTileK) {  // kb >= ke: no row sees a key
    const Index j0 = std::max(t0, kb), j1 = std::min(t0 + kTileK, ke), w = j1 - j0;
    const auto qb = q.middleRows(i0, n);
    const auto kt = k.middleRows(j0, w);
    st.s.resize(n, w);
    st.s.matrix().noalias() = qb * kt.transpose();
    st.s *= scale;
    if (mods.modifies_scores())  // softcap, then ALiBi and the bias (a hidden entry is modified but never read)
      modify_tile<A>(st.s, mods, i0, j0);
    if constexpr (kBounds) {
      st.sabs.resize(n, w);
      st.sabs.matrix().noalias() = qb.cwiseAbs() * kt.cwiseAbs().transpose();
      st.sabs *= scale;
    }
    st.p.resize(n, w);
    // Every row sees the whole tile: one product for the block. (A block or dense mask may hide cells inside
    // the rows' runs: then only a tile whose every cell it allows.)
    const auto whole_tile = [&] {
      if (!vis.has_cells()) return true;
      for (Index i = i0; i < i1; ++i)
        for (Index j = j0; j < j1; ++j)
          if (!vis.cells_allow(i, j)) return false;
      return true;
    };
    if (first.end >= j1 && last.begin <= j0 && whole_tile()) {
      const Column<A> m_new = st.m.max(st.s.rowwise().maxCoeff());
      Column<A> c(n);
      for (Index r = 0; r < n; ++r) c(r) = rescale(st.m(r), m_new(r));
      // Row by row: a row of the row-major tile is contiguous, so exp runs on SIMD packets; the broadcast
      // `colwise() - m_new` would fall back to scalar expf (40% of the time at T = 2048).
      for (Index r = 0; r < n; ++r) st.p.row(r) = (st.s.row(r) - m_new(r)).exp();
      st.l = st.l * c + st.p.rowwise().sum();
      st.acc.array().colwise() *= c;
      st.acc.noalias() += st.p.matrix() * v.middleRows(j0, w);
      st.m = m_new;
      if constexpr (kBounds) {
        st.abs_s = st.abs_s.max(st.s.abs().rowwise().maxCoeff().template cast<double>());
        st.abs_dot = st.abs_dot.max(st.sabs.rowwise().maxCoeff().template cast<double>());
      }
      continue;
    }
    // A tile on the diagonal or a window's edge: each row reads only its visible keys, so a hidden score
    // (NaN or Inf included) is never read and a hidden value row is never multiplied.
    for (Index r = 0; r < n; ++r)
      vis.for_each_run(i0 + r, j0, j1, [&](Index a, Index e) { update_row<A, kBounds>(st, r, a - j0, e - a, v, a); });
  }
  // The sink: one more term of every row's softmax, with no value (it only adds to m and l).
  if (mods.sink && *mods.sink != -std::numeric_limits<double>::infinity()) {
    const A sg = static_cast<A>(*mods.sink);
    for (Index r = 0; r < n; ++r) {
      const A m_new = std::max(st.m(r), sg), c = rescale(st.m(r), m_new);
      st.l(r) = st.l(r) * c + std::exp(sg - m_new);
      st.acc.row(r) *= c;
      st.m(r) = m_new;
      if constexpr (kBounds) st.abs_s(r) = std::max<double>(st.abs_s(r), std::abs(sg));
    }
  }
  for (Index r = 0; r < n; ++r) {
    S* o = out + (i0 + r) * D;
    if (st.l(r) == A(0)) {
      std::fill(o, o + D, S(0));
    } else {
      const A inv = st.l(r);
      for (Index c = 0; c < D; ++c) o[c] = S(st.acc(r, c) / inv);
    }
    if (stats) {
      double* row = stats + 4 * (i0 + r);
      row[0] = double(st.m(r));
      row[1] = double(st.l(r));
      if constexpr (kBounds) {
        row[2] = st.abs_s(r);
        row[3] = st.abs_dot(r);
      }
    }
  }
}

// The inputs in the accumulation type: the tensor itself when S is A, a widened copy otherwise (O(T·D)).
template <class S, class A> struct Widened {
  explicit Widened(const Tensor<S>& t) {
    if constexpr (std::is_same_v<S, A>)
      ptr = &t;
    else
      ptr = &copy.emplace(t.template cast<A>());
  }
  HeadRef<A> head(Index b, Index h) const {
    const Shape& s = ptr->shape();
    return HeadRef<A>(ptr->data() + (b * s.H + h) * s.T * s.D, s.T, s.D);
  }
  const Tensor<A>* ptr = nullptr;
  std::optional<Tensor<A>> copy;
};

template <class S, class A, bool kBounds>
Tensor<S> run(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const AttentionOptions& opts, double scale,
              Tensor<double>* stats) {
  const Shape& qs = q.shape();
  const Index T_k = k.shape().T, H_kv = k.shape().H;
  const Widened<S, A> qa(q), ka(k), va(v);
  Tensor<S> out(Shape{qs.B, qs.H, qs.T, v.shape().D});  // [B,H,T_q,D_v]
  if (stats) *stats = Tensor<double>(Shape{qs.B, qs.H, qs.T, 4});
  // One visibility per batch entry, or per (batch entry, head) where a block or dense mask differs by head.
  const Index vis_heads = visibility_per_head(opts) ? qs.H : 1;
  std::vector<Visibility> vis;
  for (Index b = 0; b < qs.B; ++b)
    for (Index h = 0; h < vis_heads; ++h) vis.push_back(visibility(opts, b, qs.T, T_k, h));
  const auto vis_of = [&](Index b, Index h) -> const Visibility& {
    return vis[std::size_t(b * vis_heads + (vis_heads == 1 ? 0 : h))];
  };
  std::vector<HeadModifiers> mods;  // per (batch entry, head): a query's position may depend on its document
  for (Index b = 0; b < qs.B; ++b)
    for (Index h = 0; h < qs.H; ++h) mods.push_back(head_modifiers(opts, b, h, qs.T, T_k));

  // Items (b, h, block), heaviest first under the causal rule (later blocks see more keys), so the last
  // items left are short ones. Each item writes only its own rows: the bits do not depend on the threads.
  const Index blocks = (qs.T + kBlockQ - 1) / kBlockQ, items = qs.B * qs.H * blocks;
  double work = 0;
  for (Index b = 0; b < qs.B; ++b)
    for (Index i = 0; i < qs.T; i += kBlockQ) work += double(vis_of(b, 0).run(i).size()) * kBlockQ;
  work *= double(qs.H * (qs.D + v.shape().D));
  const auto item = [&](Index n, BlockState<A>& st) {
    const Index blk = blocks - 1 - n % blocks, bh = n / blocks, b = bh / qs.H, h = bh % qs.H;
    const Index g = kv_head(h, qs.H, H_kv);
    const Index i0 = blk * kBlockQ, i1 = std::min(qs.T, i0 + kBlockQ);
    S* o = out.data() + (b * qs.H + h) * qs.T * v.shape().D;
    double* sp = stats ? stats->data() + (b * qs.H + h) * qs.T * 4 : nullptr;
    stream_block<S, A, kBounds>(qa.head(b, h), ka.head(b, g), va.head(b, g), vis_of(b, h), A(scale),
                                mods[std::size_t(b * qs.H + h)], i0, i1, o, sp, st);
  };
  const unsigned hw = opts.threads > 0 ? unsigned(opts.threads) : std::max(1u, std::thread::hardware_concurrency());
  const unsigned threads = work < kThreadWork ? 1u : unsigned(std::min<Index>(hw, items));
  std::atomic<Index> next{0};
  // A cancelled run stops each worker at its next item (a block of rows: milliseconds even at long T).
  const auto worker = [&] {
    BlockState<A> st;
    for (Index n = next++; n < items && !cancellation_requested(); n = next++) item(n, st);
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  throw_if_cancelled("streamed attention");
  return out;
}

template <class S>
Tensor<S> forward(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const AttentionOptions& opts,
                  double scale, Tensor<double>* stats, bool bounds) {
  using A = Acc<S>;
  if constexpr (!std::is_same_v<S, A>) {
    // float16 and bfloat16 are read only widened to float and written only as each output's one rounding, S(o):
    // the float kernel on the widened inputs, then that rounding, is the same bits. One kernel per accumulation
    // type, not per storage type: an eighth of this file's compile (GCC 12, -O3), in each instruction-set copy.
    const Tensor<A> wide =
        forward<A>(q.template cast<A>(), k.template cast<A>(), v.template cast<A>(), opts, scale, stats, bounds);
    Tensor<S> out(wide.shape());
    for (Index i = 0; i < wide.values().size(); ++i) out.data()[i] = S(wide.data()[i]);
    return out;
  } else {
    if (bounds) return run<S, A, true>(q, k, v, opts, scale, stats);
    return run<S, A, false>(q, k, v, opts, scale, stats);
  }
}

}  // namespace
}  // namespace attncheck::detail

// This copy's table (kernels.hpp), constant data: isa_prefix.cmake renames it for the instruction set it is for.
extern "C" const attncheck::detail::ForwardKernels attncheck_forward_kernels;
extern "C" const attncheck::detail::ForwardKernels attncheck_forward_kernels = {
    &attncheck::detail::forward<float>, &attncheck::detail::forward<double>, &attncheck::detail::forward<Eigen::half>,
    &attncheck::detail::forward<Eigen::bfloat16>};
