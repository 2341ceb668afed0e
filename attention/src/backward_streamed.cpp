// The streamed backward (FlashAttention-2's): attention_backward's path above kStreamedBackwardWeights, the
// streamed float64 oracle backward, and gradient_check's bound (backward.cpp derives it) without any [T_q,T_k]
// matrix: O(T·D) extra memory per head plus a few [block, tile] matrices per thread. Compiled once per
// instruction set (cmake/attncheckIsa.cmake): kernels.hpp's table is all it exports.
//
//   q [B,H,T_q,D], k [B,H_kv,T_k,D], v [B,H_kv,T_k,D_v], dO [B,H,T_q,D_v] (D_v read from v, never assumed D)
//   per (b, h), query block Q_b [Bq,D] and key tile K_t [Bk,D], V_t [Bk,D_v]:
//   S = Q_b K_tᵀ·scale, modified (softcap, then ALiBi); every hidden entry selected away (never read: a NaN or
//   Inf in a hidden score, key or value reaches nothing), a tile no row of the block sees is skipped
//   pass 1 (query blocks): m_i, l_i by the online softmax (a sink one more term); with the bound, each row's
//                          RowScoreStats and so ρ_i (tolerance.cpp's weight_relative_error, the same formula)
//   pass 2 (query blocks): P = exp(S - m)/l, dP = dO_b V_tᵀ, Δ_i = Σ_j P_ij dP_ij, a sink's d_sink term; with
//                          the bound, Ā_i = Σ_j P_ij A_ij, A = |dO||V|ᵀ, and |δΔ_i| (backward.cpp steps 1-3)
//   pass 3 (key tiles):    dS = P∘(dP - Δ) (times 1 - tanh²(s_raw/cap) with softcap), dV_t += Pᵀ dO_b,
//                          dK_t += dSᵀ Q_b over the group's query heads; with the bound, steps 4-5, 7, 8
//   pass 4 (query blocks): dQ_b += dS K_t; with the bound, step 6
//   pass 5 (bias blocks):  with an additive bias, dBias rows of one bias entry: dS (before softcap's derivative)
//                          summed over the (b, h) it is read for, in (b, h) order; with the bound, step 12
// Each item of a pass writes only its own rows (a block's row statistics and dQ, a key tile's dK and dV) and
// sums in a fixed order (tiles ascending, the group's heads ascending, d_sinks over (b, i) after the pass), so
// the bits do not depend on the threads. The materialised path (backward.cpp) computes the same sums in
// another order: the float64 results agree within float64 reassociation (backward_test checks it).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "attncheck/backward.hpp"
#include "attncheck/cancel.hpp"
#include "kernels.hpp"
#include "tile_modifiers.hpp"

namespace attncheck {
namespace {

// Query rows per block and keys per tile, as the streamed forward (streamed.cpp).
constexpr Index kBlockQ = 64, kTileK = 128;
// Below this many multiply-adds threads cost more than they save.
constexpr double kThreadWork = double(1 << 22);

template <class A> using ArrayA = Eigen::Array<A, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class A> using Column = Eigen::Array<A, Eigen::Dynamic, 1>;
using Cells = Eigen::Array<bool, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <class A, class S> const Tensor<A>& widen(const Tensor<S>& t, std::optional<Tensor<A>>& store) {
  if constexpr (std::is_same_v<A, S>)
    return t;
  else
    return store.emplace(t.template cast<A>());
}

template <class A> A rescale(A m_old, A m_new) {
  return m_old == -std::numeric_limits<A>::infinity() ? A(0) : std::exp(m_old - m_new);
}

// gradient_check's constants (backward.cpp's derivation), for the bound.
struct BoundTerms {
  DType dtype = DType::f64;
  double safety = 2, u_s = 0, u_a = 0, tiny = 0, floor = 0, nu = 0, g_D = 0, g_n = 0;
  double p_floor = 0;             // step 1: what a weight below the dtype's smallest normal may lose when stored
  double q_fold = 0, k_fold = 0;  // backward.cpp steps 13, 15: q'_ic's (k'_jc's) own rounding in dK's (dQ's) terms
};

// Scratch of one thread, reused across tiles.
template <class A> struct Scratch {
  Cells vis;                            // [n,w] visible
  ArrayA<A> s_raw, s, p, dp, ds;        // scores before and after the modifiers, P, dP, dS
  ArrayA<A> tanh;                       // with a softcap, tanh(s_raw/cap) (tile_modifiers.hpp)
  ArrayA<double> sabs, a, eps, mm, e, t, fl;  // the bound's terms (double only)
  Matrix<A> acc_k, acc_v, acc_q;
  Matrix<double> tol_k, tol_v, tol_q;
};

template <class S, bool kBound> class Streamed {
 public:
  using A = Acc<S>;
  static_assert(!kBound || std::is_same_v<A, double>, "the bound is the float64 oracle's");

  Streamed(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const Tensor<S>& d_output,
           const AttentionOptions& opts, double scale, const BoundTerms& bound)
      : q_(widen<A>(q, q_store_)),
        k_(widen<A>(k, k_store_)),
        v_(widen<A>(v, v_store_)),
        do_(widen<A>(d_output, do_store_)),
        opts_(opts),
        qs_(q.shape()),
        ks_(k.shape()),
        Dv_(v.shape().D),
        group_(qs_.H / ks_.H),
        scale_(static_cast<A>(scale)),
        scale_d_(scale),
        bt_(bound) {
    const Index B = qs_.B, H = qs_.H, T_q = qs_.T, T_k = ks_.T;
    blocks_ = (T_q + kBlockQ - 1) / kBlockQ;
    tiles_ = (T_k + kTileK - 1) / kTileK;
    vis_heads_ = visibility_per_head(opts) ? H : 1;
    for (Index b = 0; b < B; ++b)
      for (Index h = 0; h < vis_heads_; ++h) {
        vis_.push_back(visibility(opts, b, T_q, T_k, h));
        const Visibility& vs = vis_.back();
        std::vector<KeyRange> runs(static_cast<std::size_t>(T_q));
        std::vector<KeyRange> spans(static_cast<std::size_t>(blocks_));
        for (Index i = 0; i < T_q; ++i) {
          runs[std::size_t(i)] = vs.run(i);
          KeyRange& sp = spans[std::size_t(i / kBlockQ)];
          const KeyRange r = runs[std::size_t(i)];
          if (r.empty()) continue;
          sp = sp.empty() ? r : KeyRange{std::min(sp.begin, r.begin), std::max(sp.end, r.end)};
        }
        runs_.push_back(std::move(runs));
        spans_.push_back(std::move(spans));
      }
    for (Index b = 0; b < B; ++b)
      for (Index h = 0; h < H; ++h) mods_.push_back(head_modifiers(opts, b, h, T_q, T_k));
    const std::size_t rows = std::size_t(B * H * T_q);
    m_.assign(rows, -std::numeric_limits<A>::infinity());
    l_.assign(rows, A(0));
    delta_.assign(rows, A(0));
    n_vis_.assign(rows, 0);
    sink_row_.assign(rows, A(0));
    if constexpr (kBound) {
      rho_.assign(rows, 0.0);
      a_bar_.assign(rows, 0.0);
      d_delta_.assign(rows, 0.0);
      sink_tol_row_.assign(rows, 0.0);
      sink_term_row_.assign(rows, 0.0);
    }
    // Visible scores times D: the work of one product over the visible pairs.
    double work = 0;
    for (Index b = 0; b < B; ++b)
      for (Index i = 0; i < T_q; ++i) work += double(runs_[std::size_t(b * vis_heads_)][std::size_t(i)].size());
    work *= double(H) * double(std::max(qs_.D, Dv_));
    const unsigned hw =
        opts.threads > 0 ? unsigned(opts.threads) : std::max(1u, std::thread::hardware_concurrency());
    threads_ = work < kThreadWork ? 1u : hw;
  }

  // Runs the four passes; the gradients rounded to S, and (kBound) the tolerance before its final terms.
  AttentionGradients<S> run(AttentionGradients<double>* tol) {
    const Index B = qs_.B, H = qs_.H, T_q = qs_.T;
    AttentionGradients<S> g{Tensor<S>(qs_), Tensor<S>(ks_), Tensor<S>(Shape{ks_.B, ks_.H, ks_.T, Dv_})};
    if constexpr (kBound) *tol = {Tensor<double>(qs_), Tensor<double>(ks_), Tensor<double>(Shape{ks_.B, ks_.H, ks_.T, Dv_})};
    const Index q_items = B * H * blocks_, k_items = B * ks_.H * tiles_;
    parallel(q_items, [&](Index n, Scratch<A>& sc) { row_stats(n, sc); });
    parallel(q_items, [&](Index n, Scratch<A>& sc) { row_sums(n, sc); });
    // Passes 3 and 4 over the tiles and blocks asked for (restrict_to), every one by default.
    const std::vector<Index> tiles = chosen(k_items, [&](Index n) { return tile_on(n % tiles_); });
    parallel(Index(tiles.size()), [&](Index n, Scratch<A>& sc) { key_tile(tiles[std::size_t(n)], sc, g, tol); });
    const std::vector<Index> blocks = chosen(q_items, [&](Index n) {
      Index b, h, blk, i0, rows;
      decode_block(n, b, h, blk, i0, rows);
      return block_on(blk);
    });
    parallel(Index(blocks.size()), [&](Index n, Scratch<A>& sc) { query_block(blocks[std::size_t(n)], sc, g, tol); });
    if (opts_.bias) {
      const Shape bs{opts_.bias->B, opts_.bias->H, T_q, ks_.T};
      g.dbias = Tensor<S>(bs);
      if constexpr (kBound) {
        tol->dbias = Tensor<double>(bs);
        bias_m_ = Tensor<double>(bs);
      }
      parallel(bs.B * bs.H * blocks_, [&](Index n, Scratch<A>& sc) { bias_block(n, sc, g, tol); });
    }
    // d_sinks[h] = -Σ_{b,i} P_sink,i·Δ_i, summed in (b, i) order as backward.cpp does.
    if (!opts_.sinks.empty()) {
      std::vector<A> d_sinks(std::size_t(H), A(0));
      std::vector<double> tol_s(std::size_t(H), 0.0), terms(std::size_t(H), 0.0);
      for (Index b = 0; b < B; ++b)
        for (Index h = 0; h < H; ++h)
          for (Index i = 0; i < T_q; ++i) {
            const std::size_t r = row(b, h, i);
            d_sinks[std::size_t(h)] -= sink_row_[r];
            if constexpr (kBound) {
              tol_s[std::size_t(h)] += sink_tol_row_[r];
              terms[std::size_t(h)] += sink_term_row_[r];
            }
          }
      for (const A d : d_sinks) g.dsinks.push_back(double(d));
      if constexpr (kBound) {
        tol->dsinks = tol_s;
        sink_terms_ = terms;
      }
    }
    return g;
  }

  /// Passes 3 and 4 only for the key tiles and query blocks that hold `only`'s rows (before run()).
  void restrict_to(const GradientRows& only) {
    tile_on_.assign(std::size_t(tiles_), 0);
    block_on_.assign(std::size_t(blocks_), 0);
    for (const Index j : only.keys)
      if (j >= 0 && j < ks_.T) tile_on_[std::size_t(j / kTileK)] = 1;
    for (const Index i : only.queries)
      if (i >= 0 && i < qs_.T) block_on_[std::size_t(i / kBlockQ)] = 1;
  }
  /// Whether run() computed dK and dV of key j, dQ of query i.
  bool key_row_on(Index j) const { return tile_on(j / kTileK); }
  bool query_row_on(Index i) const { return block_on(i / kBlockQ); }

  const std::vector<double>& sink_terms() const { return sink_terms_; }
  /// The bound's Σ m_ij per dBias entry (step 12), after run().
  const Tensor<double>& bias_m() const { return bias_m_; }

  // Pass 1 alone: each row's ρ_i, [B,H,T_q,1].
  Tensor<double> weight_errors() {
    parallel(qs_.B * qs_.H * blocks_, [&](Index n, Scratch<A>& sc) { row_stats(n, sc); });
    Tensor<double> rho(Shape{qs_.B, qs_.H, qs_.T, 1});
    for (Index n = 0; n < rho.size(); ++n) rho.values()[n] = rho_[std::size_t(n)];
    return rho;
  }

 private:
  std::size_t row(Index b, Index h, Index i) const { return std::size_t((b * qs_.H + h) * qs_.T + i); }
  bool tile_on(Index t) const { return tile_on_.empty() || tile_on_[std::size_t(t)]; }
  bool block_on(Index blk) const { return block_on_.empty() || block_on_[std::size_t(blk)]; }
  template <class F>
  static std::vector<Index> chosen(Index items, F&& on) {
    std::vector<Index> out;
    for (Index n = 0; n < items; ++n)
      if (on(n)) out.push_back(n);
    return out;
  }
  std::size_t vis_index(Index b, Index h) const { return std::size_t(b * vis_heads_ + (vis_heads_ == 1 ? 0 : h)); }
  const HeadModifiers& mods(Index b, Index h) const { return mods_[std::size_t(b * qs_.H + h)]; }
  bool has_sink(Index b, Index h) const {
    const HeadModifiers& md = mods(b, h);
    return md.sink && *md.sink != -std::numeric_limits<double>::infinity();
  }

  template <class F> void parallel(Index items, F&& f) const {
    const unsigned threads = unsigned(std::min<Index>(Index(threads_), std::max<Index>(items, 1)));
    std::atomic<Index> next{0};
    // A cancelled run stops each worker at its next item (a block of rows against the keys).
    const auto worker = [&] {
      Scratch<A> sc;
      for (Index n = next++; n < items && !cancellation_requested(); n = next++) f(n, sc);
    };
    std::vector<std::thread> pool;
    for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
    worker();
    for (auto& t : pool) t.join();
    throw_if_cancelled("streamed attention backward");
  }

  // sc.vis for rows [i0, i0+n) and keys [j0, j0+w) of head (b, h); false when no cell is visible.
  bool cells(Scratch<A>& sc, Index b, Index h, Index i0, Index n, Index j0, Index w) const {
    const Visibility& vs = vis_[vis_index(b, h)];
    const std::vector<KeyRange>& runs = runs_[vis_index(b, h)];
    sc.vis.setConstant(n, w, false);
    bool any = false;
    for (Index r = 0; r < n; ++r) {
      const KeyRange run = runs[std::size_t(i0 + r)];
      const Index a = std::max(run.begin, j0), e = std::min(run.end, j0 + w);
      if (a >= e) continue;
      if (!vs.has_cells()) {
        sc.vis.row(r).segment(a - j0, e - a).setConstant(true);
        any = true;
        continue;
      }
      for (Index j = a; j < e; ++j)
        if (vs.cells_allow(i0 + r, j)) sc.vis(r, j - j0) = any = true;
    }
    return any;
  }

  // sc.s_raw = Q_b K_tᵀ·scale and sc.s its modified scores.
  void scores(Scratch<A>& sc, Index b, Index h, Index i0, Index n, Index j0, Index w) const {
    const auto Q = q_.head(b, h).middleRows(i0, n);
    const auto K = k_.head(b, kv_head(h, qs_.H, ks_.H)).middleRows(j0, w);
    sc.s_raw.resize(n, w);
    sc.s_raw.matrix().noalias() = Q * K.transpose();
    sc.s_raw *= scale_;
    const HeadModifiers& md = mods(b, h);
    if (md.modifies_scores()) {
      sc.s = sc.s_raw;
      detail::modify_tile<A>(sc.s, md, i0, j0, &sc.tanh);  // softcap's tanh kept for its derivative
    } else {
      sc.s = sc.s_raw;
    }
  }

  // sc.p = exp(s - m)/l on visible cells, 0 elsewhere; sc.dp = dO_b V_tᵀ on visible cells, 0 elsewhere.
  void probabilities(Scratch<A>& sc, Index b, Index h, Index i0, Index n, Index j0, Index w) const {
    sc.p.resize(n, w);
    for (Index r = 0; r < n; ++r) {
      const std::size_t at = row(b, h, i0 + r);
      if (n_vis_[at] == 0) {
        sc.p.row(r).setZero();
        continue;
      }
      sc.p.row(r) = (sc.s.row(r) - m_[at]).exp() / l_[at];  // row by row: contiguous, so exp runs on SIMD packets
    }
    sc.p = sc.vis.select(sc.p, A(0));
    const auto dO = do_.head(b, h).middleRows(i0, n);
    const auto V = v_.head(b, kv_head(h, qs_.H, ks_.H)).middleRows(j0, w);
    sc.dp.resize(n, w);
    sc.dp.matrix().noalias() = dO * V.transpose();
    sc.dp = sc.vis.select(sc.dp, A(0));
  }

  // sc.ds = P∘(dP - Δ), times softcap's derivative.
  void score_gradient(Scratch<A>& sc, Index b, Index h, Index i0, Index n) const {
    sc.ds.resize(sc.p.rows(), sc.p.cols());
    for (Index r = 0; r < n; ++r) sc.ds.row(r) = sc.p.row(r) * (sc.dp.row(r) - delta_[row(b, h, i0 + r)]);
    const HeadModifiers& md = mods(b, h);
    if (md.softcap) {  // through s = cap·tanh(s_raw/cap): dS_raw = dS·(1 - tanh²(s_raw/cap))
      sc.ds *= sc.vis.select(A(1) - sc.tanh * sc.tanh, A(0));  // tanh from scores() on this tile
    }
  }

  // The bound's A = |dO_b||V_t|ᵀ and ε (step 1) on visible cells.
  void bound_a_eps(Scratch<A>& sc, Index b, Index h, Index i0, Index n, Index j0, Index w) const {
    if constexpr (kBound) {
      const auto dO = do_.head(b, h).middleRows(i0, n);
      const auto V = v_.head(b, kv_head(h, qs_.H, ks_.H)).middleRows(j0, w);
      sc.a.resize(n, w);
      sc.a.matrix().noalias() = dO.cwiseAbs() * V.cwiseAbs().transpose();
      sc.a = sc.vis.select(sc.a, 0.0);
      sc.eps.resize(n, w);
      for (Index r = 0; r < n; ++r) {
        const double rho = rho_[row(b, h, i0 + r)];
        if (std::isinf(rho))
          sc.eps.row(r).setConstant(1.0 + bt_.tiny + bt_.nu);
        else
          sc.eps.row(r) = (sc.p.row(r) * (rho + bt_.u_s) + (sc.p.row(r) * (1 + rho)).min(bt_.p_floor)).min(1.0) +
                          bt_.tiny + bt_.nu;  // step 1
      }
      sc.eps = sc.vis.select(sc.eps, 0.0);
    }
  }

  // Steps 4-5 and 11 of backward.cpp on visible cells: sc.mm = m_ij, sc.e = e_ij.
  void bound_errors(Scratch<A>& sc, Index b, Index h, Index i0, Index n) const {
    if constexpr (kBound) {
      const double f_err = mods(b, h).softcap ? 5 * bt_.u_a : 0.0;
      sc.mm.resize(sc.p.rows(), sc.p.cols());
      sc.e.resize(sc.p.rows(), sc.p.cols());
      sc.fl.resize(sc.p.rows(), sc.p.cols());
      for (Index r = 0; r < n; ++r) {
        const std::size_t at = row(b, h, i0 + r);
        const auto a = sc.a.row(r), p = sc.p.row(r), eps = sc.eps.row(r);
        const Eigen::Array<double, 1, Eigen::Dynamic> G = a + a_bar_[at] + d_delta_[at];
        const Eigen::Array<double, 1, Eigen::Dynamic> dG =
            (bt_.g_D + bt_.u_s) * a + d_delta_[at] + bt_.u_a * G + double(Dv_ + n_vis_[at]) * bt_.nu;
        sc.mm.row(r) = (p + eps) * G;
        sc.e.row(r) = eps * G + p * dG + (bt_.u_a + bt_.u_s) * p * G + bt_.nu + f_err * sc.mm.row(r);
        sc.fl.row(r) = bt_.safety * bt_.nu * std::max(1.0, scale_d_) * (2 + G);  // step 9b
      }
      sc.mm = sc.vis.select(sc.mm, 0.0);
      sc.e = sc.vis.select(sc.e, 0.0);
      sc.fl = sc.vis.select(sc.fl, 0.0);
    }
  }

  // The tiles of a query block: keys [j0, j1) of the block's span, tile by tile.
  template <class F> void block_tiles(Index b, Index h, Index blk, F&& f) const {
    const KeyRange span = spans_[vis_index(b, h)][std::size_t(blk)];
    for (Index t0 = span.begin / kTileK * kTileK; !span.empty() && t0 < span.end; t0 += kTileK) {
      const Index j0 = std::max(t0, span.begin), j1 = std::min(t0 + kTileK, span.end);
      f(j0, j1 - j0);
    }
  }

  void decode_block(Index n, Index& b, Index& h, Index& blk, Index& i0, Index& rows) const {
    blk = blocks_ - 1 - n % blocks_;  // heaviest first under the causal rule
    const Index bh = n / blocks_;
    b = bh / qs_.H;
    h = bh % qs_.H;
    i0 = blk * kBlockQ;
    rows = std::min(qs_.T, i0 + kBlockQ) - i0;
  }

  // Pass 1: m, l (and the row statistics of the bound) of a query block.
  void row_stats(Index item, Scratch<A>& sc) {
    Index b, h, blk, i0, n;
    decode_block(item, b, h, blk, i0, n);
    Column<A> m = Column<A>::Constant(n, -std::numeric_limits<A>::infinity()), l = Column<A>::Zero(n);
    std::vector<Index> n_vis(std::size_t(n), 0);
    std::vector<RowScoreStats> st(static_cast<std::size_t>(n));
    block_tiles(b, h, blk, [&](Index j0, Index w) {
      if (!cells(sc, b, h, i0, n, j0, w)) return;
      scores(sc, b, h, i0, n, j0, w);
      if constexpr (kBound) {
        const auto Q = q_.head(b, h).middleRows(i0, n);
        const auto K = k_.head(b, kv_head(h, qs_.H, ks_.H)).middleRows(j0, w);
        sc.sabs.resize(n, w);
        sc.sabs.matrix().noalias() = Q.cwiseAbs() * K.cwiseAbs().transpose();
        sc.sabs *= scale_d_;
      }
      for (Index r = 0; r < n; ++r) {
        const Index cnt = sc.vis.row(r).count();
        if (cnt == 0) continue;
        n_vis[std::size_t(r)] += cnt;
        const A mx = sc.vis.row(r).select(sc.s.row(r), -std::numeric_limits<A>::infinity()).maxCoeff();
        const A m_new = std::max(m(r), mx), c = rescale(m(r), m_new);
        l(r) = l(r) * c + sc.vis.row(r).select((sc.s.row(r) - m_new).exp(), A(0)).sum();
        m(r) = m_new;
        if constexpr (kBound) {
          RowScoreStats& s = st[std::size_t(r)];
          s.abs_dot = std::max(s.abs_dot, sc.vis.row(r).select(sc.sabs.row(r), 0.0).maxCoeff());
          const double raw = sc.vis.row(r).select(sc.s_raw.row(r).abs(), 0.0).maxCoeff();
          s.raw_max = std::max(s.raw_max, raw);
          s.s_max = std::max({s.s_max, raw, sc.vis.row(r).select(sc.s.row(r).abs(), 0.0).maxCoeff()});
        }
      }
    });
    const HeadModifiers& md = mods(b, h);
    const Visibility& vs = vis_[vis_index(b, h)];
    for (Index r = 0; r < n; ++r) {
      if (has_sink(b, h)) {  // one more term of the softmax, with no value
        const A sg = static_cast<A>(*md.sink), m_new = std::max(m(r), sg), c = rescale(m(r), m_new);
        l(r) = l(r) * c + std::exp(sg - m_new);
        m(r) = m_new;
      }
      const std::size_t at = row(b, h, i0 + r);
      m_[at] = m(r);
      l_[at] = l(r);
      n_vis_[at] = n_vis[std::size_t(r)];
      if constexpr (kBound) {
        RowScoreStats& s = st[std::size_t(r)];
        s.n_vis = n_vis[std::size_t(r)];
        s.tempered = md.tempered;
        if (md.qk_norm) s.qk_norm = qk_norm_score_error(bt_.dtype, qs_.D, *md.qk_norm, s.abs_dot);
        const bool sink = md.sink && std::isfinite(*md.sink);
        if (sink) s.s_max = std::max(s.s_max, std::abs(*md.sink));
        if (s.n_vis > 0 && md.alibi_slope != 0) {  // |j - p| is largest at the first or the last visible key
          const KeyRange keys = vs.keys(i0 + r);
          const Index p = md.position(i0 + r);
          s.bias_max = std::max(std::abs(md.alibi_slope * double(keys.begin - p)),
                                std::abs(md.alibi_slope * double(keys.end - 1 - p)));
        }
        rho_[at] = row_weight_relative_error(bt_.dtype, qs_.D, s, sink, md.softcap.has_value());
      }
    }
  }

  // Pass 2: Δ_i = Σ_j P_ij dP_ij (and the bound's Ā_i, |δΔ_i|, the sink's terms) of a query block.
  void row_sums(Index item, Scratch<A>& sc) {
    Index b, h, blk, i0, n;
    decode_block(item, b, h, blk, i0, n);
    Column<A> delta = Column<A>::Zero(n);
    Column<double> a_bar = Column<double>::Zero(n), d_delta = Column<double>::Zero(n);
    block_tiles(b, h, blk, [&](Index j0, Index w) {
      if (!cells(sc, b, h, i0, n, j0, w)) return;
      scores(sc, b, h, i0, n, j0, w);
      probabilities(sc, b, h, i0, n, j0, w);
      delta += (sc.p * sc.dp).rowwise().sum();
      if constexpr (kBound) {
        bound_a_eps(sc, b, h, i0, n, j0, w);
        a_bar += (sc.p * sc.a).rowwise().sum();
        d_delta += (sc.eps * sc.a).rowwise().sum();
      }
    });
    const HeadModifiers& md = mods(b, h);
    for (Index r = 0; r < n; ++r) {
      const std::size_t at = row(b, h, i0 + r);
      if (n_vis_[at] == 0) continue;  // sees no key: no gradient to or from this row
      delta_[at] = delta(r);
      const A lse = m_[at] + std::log(l_[at]);
      if (has_sink(b, h)) sink_row_[at] = std::exp(static_cast<A>(*md.sink) - lse) * delta(r);
      if constexpr (kBound) {
        const double g_T = gamma(n_vis_[at], bt_.u_a);
        d_delta(r) += (bt_.g_D + g_T + 2 * bt_.u_s) * a_bar(r);  // step 3
        a_bar_[at] = a_bar(r);
        d_delta_[at] = d_delta(r);
        if (md.sink && std::isfinite(*md.sink) && std::isfinite(lse)) {  // step 11
          const double rho = rho_[at], p_s = std::exp(*md.sink - lse);
          const double eps_s = (std::isinf(rho) ? 1.0 : std::min(1.0, p_s * rho)) + bt_.tiny + bt_.nu;
          sink_tol_row_[at] =
              bt_.safety * (eps_s * (a_bar(r) + d_delta(r)) + p_s * d_delta(r) + bt_.u_a * p_s * a_bar(r));
          sink_term_row_[at] = p_s * a_bar(r);
        }
      }
    }
  }

  // Pass 3: dK and dV of one key tile of one kv head, over its group's query heads and every block that sees it.
  void key_tile(Index item, Scratch<A>& sc, AttentionGradients<S>& g, AttentionGradients<double>* tol) const {
    const Index t = item % tiles_, bg = item / tiles_, b = bg / ks_.H, kv = bg % ks_.H;
    const Index j0 = t * kTileK, w = std::min(ks_.T, j0 + kTileK) - j0;
    sc.acc_k.setZero(w, qs_.D);
    sc.acc_v.setZero(w, Dv_);
    if constexpr (kBound) {
      sc.tol_k.setZero(w, qs_.D);
      sc.tol_v.setZero(w, Dv_);
    }
    for (Index h = kv * group_; h < (kv + 1) * group_; ++h) {
      for (Index blk = 0; blk < blocks_; ++blk) {
        const KeyRange span = spans_[vis_index(b, h)][std::size_t(blk)];
        if (span.empty() || span.end <= j0 || span.begin >= j0 + w) continue;
        const Index i0 = blk * kBlockQ, n = std::min(qs_.T, i0 + kBlockQ) - i0;
        if (!cells(sc, b, h, i0, n, j0, w)) continue;
        scores(sc, b, h, i0, n, j0, w);
        probabilities(sc, b, h, i0, n, j0, w);
        score_gradient(sc, b, h, i0, n);
        const auto Q = q_.head(b, h).middleRows(i0, n);
        const auto dO = do_.head(b, h).middleRows(i0, n);
        sc.acc_v.noalias() += sc.p.matrix().transpose() * dO;
        sc.acc_k.noalias() += sc.ds.matrix().transpose() * Q;
        if constexpr (kBound) {
          bound_a_eps(sc, b, h, i0, n, j0, w);
          bound_errors(sc, b, h, i0, n);
          sc.t =
              bt_.safety * scale_d_ * (sc.e + (bt_.g_n + 2 * bt_.u_s + bt_.u_a + bt_.q_fold) * sc.mm);  // steps 7, 13
          sc.tol_k.noalias() += sc.t.matrix().transpose() * Q.cwiseAbs();
          sc.tol_k.noalias() += sc.fl.matrix().transpose() * Q.cwiseAbs().cwiseMax(1.0);  // step 9b
          sc.t = bt_.safety * (sc.eps + bt_.g_n * sc.p);  // step 8
          sc.tol_v.noalias() += sc.t.matrix().transpose() * dO.cwiseAbs();
        }
      }
    }
    g.dk.head(b, kv).middleRows(j0, w) = (scale_ * sc.acc_k).template cast<S>();
    g.dv.head(b, kv).middleRows(j0, w) = sc.acc_v.template cast<S>();
    if constexpr (kBound) {
      tol->dk.head(b, kv).middleRows(j0, w) = sc.tol_k;
      tol->dv.head(b, kv).middleRows(j0, w) = sc.tol_v;
    }
  }

  // Pass 4: dQ of one query block, over the key tiles it sees.
  void query_block(Index item, Scratch<A>& sc, AttentionGradients<S>& g, AttentionGradients<double>* tol) const {
    Index b, h, blk, i0, n;
    decode_block(item, b, h, blk, i0, n);
    const Visibility& vs = vis_[vis_index(b, h)];
    const auto K = k_.head(b, kv_head(h, qs_.H, ks_.H));
    sc.acc_q.setZero(n, qs_.D);
    if constexpr (kBound) sc.tol_q.setZero(n, qs_.D);
    block_tiles(b, h, blk, [&](Index j0, Index w) {
      if (!cells(sc, b, h, i0, n, j0, w)) return;
      scores(sc, b, h, i0, n, j0, w);
      probabilities(sc, b, h, i0, n, j0, w);
      score_gradient(sc, b, h, i0, n);
      if constexpr (kBound) {
        bound_a_eps(sc, b, h, i0, n, j0, w);
        bound_errors(sc, b, h, i0, n);
        sc.t.resize(n, w);
        for (Index r = 0; r < n; ++r) {  // step 6
          const double g_T = gamma(n_vis_[row(b, h, i0 + r)], bt_.u_a);
          sc.t.row(r) =
              bt_.safety * scale_d_ * (sc.e.row(r) + (g_T + 2 * bt_.u_s + bt_.u_a + bt_.k_fold) * sc.mm.row(r));
        }
      }
      if (sc.vis.all()) {  // every row sees the whole tile: one product
        sc.acc_q.noalias() += sc.ds.matrix() * K.middleRows(j0, w);
        if constexpr (kBound) {
          sc.tol_q.noalias() += sc.t.matrix() * K.middleRows(j0, w).cwiseAbs();
          sc.tol_q.noalias() += sc.fl.matrix() * K.middleRows(j0, w).cwiseAbs().cwiseMax(1.0);  // step 9b
        }
        return;
      }
      // A tile on the diagonal or a mask's edge: each row reads only its visible keys, so a hidden key row
      // (NaN or Inf included) is never multiplied.
      for (Index r = 0; r < n; ++r)
        vs.for_each_run(i0 + r, j0, j0 + w, [&](Index a, Index e) {
          sc.acc_q.row(r).noalias() += sc.ds.row(r).segment(a - j0, e - a).matrix() * K.middleRows(a, e - a);
          if constexpr (kBound) {
            sc.tol_q.row(r).noalias() += sc.t.row(r).segment(a - j0, e - a).matrix() * K.middleRows(a, e - a).cwiseAbs();
            sc.tol_q.row(r).noalias() +=
                sc.fl.row(r).segment(a - j0, e - a).matrix() * K.middleRows(a, e - a).cwiseAbs().cwiseMax(1.0);
          }
        });
    });
    g.dq.head(b, h).middleRows(i0, n) = (scale_ * sc.acc_q).template cast<S>();
    if constexpr (kBound) tol->dq.head(b, h).middleRows(i0, n) = sc.tol_q;
  }

  // Pass 5: the dBias rows of one query block of one bias entry, over the (b, h) it is read for.
  void bias_block(Index item, Scratch<A>& sc, AttentionGradients<S>& g, AttentionGradients<double>* tol) {
    const ScoreBias& sb = *opts_.bias;
    const Index blk = item % blocks_, entry = item / blocks_, bb = entry / sb.H, bh = entry % sb.H;
    const Index i0 = blk * kBlockQ, n = std::min(qs_.T, i0 + kBlockQ) - i0;
    sc.acc_q.setZero(n, ks_.T);  // this block's rows of the entry, in A
    if constexpr (kBound) {
      sc.tol_q.setZero(n, ks_.T);
      sc.tol_k.setZero(n, ks_.T);  // Σ m_ij
    }
    for (Index b = sb.B == 1 ? 0 : bb; b < (sb.B == 1 ? qs_.B : bb + 1); ++b)
      for (Index h = sb.H == 1 ? 0 : bh; h < (sb.H == 1 ? qs_.H : bh + 1); ++h)
        block_tiles(b, h, blk, [&](Index j0, Index w) {
          if (!cells(sc, b, h, i0, n, j0, w)) return;
          scores(sc, b, h, i0, n, j0, w);
          probabilities(sc, b, h, i0, n, j0, w);
          sc.ds.resize(n, w);  // dS = P∘(dP - Δ), before softcap's derivative
          for (Index r = 0; r < n; ++r) sc.ds.row(r) = sc.p.row(r) * (sc.dp.row(r) - delta_[row(b, h, i0 + r)]);
          sc.acc_q.middleCols(j0, w) += sc.ds.matrix();
          if constexpr (kBound) {
            bound_a_eps(sc, b, h, i0, n, j0, w);
            bound_errors(sc, b, h, i0, n);
            const double f_err = mods(b, h).softcap ? 5 * bt_.u_a : 0.0;
            sc.tol_q.middleCols(j0, w) += (bt_.safety * (sc.e - f_err * sc.mm)).matrix();
            sc.tol_k.middleCols(j0, w) += sc.mm.matrix();
          }
        });
    g.dbias->head(bb, bh).middleRows(i0, n) = sc.acc_q.template cast<S>();
    if constexpr (kBound) {
      tol->dbias->head(bb, bh).middleRows(i0, n) = sc.tol_q;
      bias_m_.head(bb, bh).middleRows(i0, n) = sc.tol_k;
    }
  }

  std::optional<Tensor<A>> q_store_, k_store_, v_store_, do_store_;
  const Tensor<A>&q_, &k_, &v_, &do_;
  const AttentionOptions& opts_;
  const Shape qs_, ks_;
  const Index Dv_, group_;
  const A scale_;
  const double scale_d_;
  const BoundTerms bt_;
  Index blocks_ = 0, tiles_ = 0, vis_heads_ = 1;
  std::vector<char> tile_on_, block_on_;  // restrict_to's; empty: every one
  unsigned threads_ = 1;
  std::vector<Visibility> vis_;
  std::vector<std::vector<KeyRange>> runs_, spans_;  // per visibility: each row's run, each block's key span
  std::vector<HeadModifiers> mods_;
  // Per row (b, h, i): the forward's m, l, Δ, the visible count, the sink's d_sink term; the bound's ρ, Ā, |δΔ|
  // and the sink's tolerance terms.
  std::vector<A> m_, l_, delta_, sink_row_;
  std::vector<Index> n_vis_;
  std::vector<double> rho_, a_bar_, d_delta_, sink_tol_row_, sink_term_row_, sink_terms_;
  Tensor<double> bias_m_{Shape{}};
};

// D_v is v's own: dO [B,H,T_q,D_v], v [B,H_kv,T_k,D_v].
void check_streamed_shapes(const char* who, const Shape& q, const Shape& k, const Shape& v, const Shape& d_output,
                           const AttentionOptions& opts) {
  const auto fail = [&](const std::string& what) { throw ShapeError(std::string(who) + ": " + what); };
  check_extents(q, who);
  check_extents(k, who);
  check_extents(v, who);
  if (k.B != q.B || k.D != q.D || k.H < 1 || q.H % k.H != 0)
    fail("k is " + to_string(k) + " but q is " + to_string(q) + " (B and D must agree and H_kv divide H)");
  if (v.B != k.B || v.H != k.H || v.T != k.T)
    fail("v is " + to_string(v) + " but k is " + to_string(k) + " (V has K's B, H_kv and T)");
  if (d_output != Shape{q.B, q.H, q.T, v.D})
    fail("d_output is " + to_string(d_output) + " but the output is " + to_string(Shape{q.B, q.H, q.T, v.D}) +
         " (dO has the output's shape)");
  if (opts.dropout)  // backward.cpp step 16 reads each head's keep mask: materialised only
    throw ValueError(std::string(who) + ": dropout is checked on the materialised path only (its cases stay below "
                     "2^22 weights)");
  check_options(who, opts, q.B, q.H, k.T, q.T);
}

GradientCheck streamed_check_at(DType dtype, const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                                const Tensor<double>& d_output, const AttentionOptions& opts, double safety,
                                const GradientRows* only) {
  const Shape qs = q.shape(), ks = k.shape();
  const double scale = resolve_scale(opts.scale, qs.D, "streamed_gradient_check");
  BoundTerms bt;
  bt.dtype = dtype;
  bt.safety = safety;
  bt.u_s = unit_roundoff(dtype);
  bt.u_a = accumulation_roundoff(dtype);
  bt.tiny = dtype == DType::f64 ? 0.0 : std::ldexp(1.0, -126);
  bt.floor = storage_floor(dtype);
  bt.nu = dtype == DType::f64 ? smallest_normal(DType::f64) : smallest_normal(DType::f32);
  bt.p_floor = bt.floor > bt.tiny + bt.nu ? bt.floor : 0.0;
  bt.g_D = gamma(v.shape().D, bt.u_a);  // dP_ij = dO_i·v_j over D_v terms
  bt.g_n = gamma(qs.T * (qs.H / ks.H), bt.u_a);
  // backward.cpp steps 13 and 15: q'_ic's own rounding in dK's terms, k'_jc's in dQ's.
  bt.q_fold = (opts.temperature_folded ? 3 * bt.u_s : 0.0) +
              (opts.qk_norm_folded && !opts.qk_norm_folded->q_weight.empty() ? qk_norm_error(dtype, qs.D) : 0.0);
  bt.k_fold = opts.qk_norm_folded && !opts.qk_norm_folded->k_weight.empty() ? qk_norm_error(dtype, qs.D) : 0.0;
  GradientCheck r;
  Streamed<double, true> engine(q, k, v, d_output, opts, scale, bt);
  if (only) engine.restrict_to(*only);
  r.oracle = engine.run(&r.tolerance);
  if (only) {  // the rows not computed: NaN in the oracle and its bound, never a value a law could pass on
    const double nan = std::numeric_limits<double>::quiet_NaN();
    for (Index b = 0; b < qs.B; ++b) {
      for (Index h = 0; h < qs.H; ++h)
        for (Index i = 0; i < qs.T; ++i)
          if (!engine.query_row_on(i)) {
            r.oracle.dq.head(b, h).row(i).setConstant(nan);
            r.tolerance.dq.head(b, h).row(i).setConstant(nan);
          }
      for (Index g = 0; g < ks.H; ++g)
        for (Index j = 0; j < ks.T; ++j)
          if (!engine.key_row_on(j))
            for (Tensor<double>* t : {&r.oracle.dk, &r.oracle.dv, &r.tolerance.dk, &r.tolerance.dv})
              t->head(b, g).row(j).setConstant(nan);
    }
  }
  if (r.tolerance.dsinks.empty()) r.tolerance.dsinks.assign(opts.sinks.size(), 0.0);
  // The final rounding of every gradient into the dtype, and the subnormal floor (step 9), as backward.cpp.
  const auto finish = [&](Tensor<double>& tol, const Tensor<double>& grad, Index terms, double after) {
    tol.values() += safety * bt.u_s * grad.values().cwiseAbs();
    tol.values().array() += bt.floor + safety * double(terms) * bt.nu * after;  // after: step 9b
  };
  const std::vector<double>& sink_terms = engine.sink_terms();
  for (std::size_t h = 0; h < sink_terms.size(); ++h)  // step 11: the sum over n = B·T_q rows
    r.tolerance.dsinks[h] += safety * (gamma(qs.B * qs.T, bt.u_a) * sink_terms[h] + bt.u_a * std::abs(r.oracle.dsinks[h])) +
                             double(qs.B * qs.T) * bt.nu;
  finish(r.tolerance.dq, r.oracle.dq, ks.T, std::max(1.0, scale));
  finish(r.tolerance.dk, r.oracle.dk, qs.T * (qs.H / ks.H), std::max(1.0, scale));
  finish(r.tolerance.dv, r.oracle.dv, qs.T * (qs.H / ks.H), 1.0);
  if (opts.bias) {  // step 12: the sum over the heads one entry is read for, then the final rounding and floor
    const Index terms = (qs.B / opts.bias->B) * (qs.H / opts.bias->H);
    r.tolerance.dbias->values() += safety * gamma(terms, bt.u_a) * engine.bias_m().values();
    finish(*r.tolerance.dbias, *r.oracle.dbias, terms, 1.0);
  }
  return r;
}

// Every input entry below the accumulation type's smallest normal set to 0 (step 10); true when one was.
bool daz(DType dtype, Tensor<double>& t) {
  Matrix<double> m = Eigen::Map<const Matrix<double>>(t.values().data(), t.values().size(), 1);
  if (!daz_inputs(dtype, m)) return false;
  t.values() = Eigen::Map<const Eigen::VectorXd>(m.data(), m.size());
  return true;
}

template <class S>
AttentionGradients<S> backward_of(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const Tensor<S>& d_output,
                                  const AttentionOptions& opts) {
  using A = Acc<S>;
  if constexpr (!std::is_same_v<S, A>) {
    // As the forward (streamed.cpp): S is read only widened to float and written only as each gradient's one
    // rounding, so the float engine on the widened inputs, then that rounding, is the same bits, with two engines
    // fewer in every instruction-set copy (a sixth of this file's compile, GCC 12 at -O3).
    const AttentionGradients<A> wide = backward_of<A>(q.template cast<A>(), k.template cast<A>(), v.template cast<A>(),
                                                      d_output.template cast<A>(), opts);
    AttentionGradients<S> g{
        wide.dq.template cast<S>(), wide.dk.template cast<S>(), wide.dv.template cast<S>(), wide.dsinks, {}};
    if (wide.dbias) g.dbias = wide.dbias->template cast<S>();
    return g;
  } else {
    const double scale = resolve_scale(opts.scale, q.shape().D, "attention_backward");
    return Streamed<S, false>(q, k, v, d_output, opts, scale, {}).run(nullptr);
  }
}

template <class S>
AttentionGradients<double> oracle_backward_of(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v,
                                              const Tensor<S>& d_output, const AttentionOptions& opts) {
  constexpr const char* who = "streaming_oracle_backward";
  check_streamed_shapes(who, q.shape(), k.shape(), v.shape(), d_output.shape(), opts);
  if (has_prologue(opts)) {  // backward.cpp steps 13-15: the call on the folded q and k, then dQ and dK turned back
    const Tensor<double> qd = q.template cast<double>(), kd = k.template cast<double>();
    AttentionGradients<double> g =
        backward_of<double>(fold_queries(qd, opts, who), fold_keys(kd, opts, who), v.template cast<double>(),
                            d_output.template cast<double>(), folded_options(opts));
    detail::unfold_prologue(g, opts, qd, kd);
    return g;
  }
  return backward_of<double>(q.template cast<double>(), k.template cast<double>(), v.template cast<double>(),
                             d_output.template cast<double>(), opts);
}

GradientCheck gradient_check_of(DType dtype, const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                                const Tensor<double>& d_output, const AttentionOptions& opts, double safety,
                                const GradientRows* only) {
  constexpr const char* who = "streamed_gradient_check";
  check_streamed_shapes(who, q.shape(), k.shape(), v.shape(), d_output.shape(), opts);
  // RoPE's bound (backward.cpp step 14 on the terms of dQ and dK) is derived on the materialised path only.
  if (opts.rope || opts.rope_folded)
    throw std::logic_error(std::string(who) + ": no streamed bound for RoPE yet (its cases stay below 2^22 weights)");
  if (has_prologue(opts)) {  // backward.cpp step 13
    GradientCheck r = gradient_check_of(dtype, fold_queries(q, opts, who), fold_keys(k, opts, who), v, d_output,
                                        folded_options(opts), safety, only);
    detail::unfold_prologue(r, opts, q, k, dtype, safety);
    return r;
  }
  GradientCheck r = streamed_check_at(dtype, q, k, v, d_output, opts, safety, only);
  Tensor<double> q0 = q, k0 = k, v0 = v, d0 = d_output;
  const bool flushed[] = {daz(dtype, q0), daz(dtype, k0), daz(dtype, v0), daz(dtype, d0)};
  if (std::none_of(std::begin(flushed), std::end(flushed), [](bool f) { return f; })) return r;
  const GradientCheck f = streamed_check_at(dtype, q0, k0, v0, d0, opts, safety, only);  // step 10
  const auto widen_tol = [](Tensor<double>& tol, const Tensor<double>& tol0, const Tensor<double>& g,
                            const Tensor<double>& g0) {
    tol.values() = tol.values().cwiseMax(tol0.values() + (g.values() - g0.values()).cwiseAbs());
  };
  widen_tol(r.tolerance.dq, f.tolerance.dq, r.oracle.dq, f.oracle.dq);
  widen_tol(r.tolerance.dk, f.tolerance.dk, r.oracle.dk, f.oracle.dk);
  widen_tol(r.tolerance.dv, f.tolerance.dv, r.oracle.dv, f.oracle.dv);
  if (opts.bias) widen_tol(*r.tolerance.dbias, *f.tolerance.dbias, *r.oracle.dbias, *f.oracle.dbias);
  for (std::size_t h = 0; h < r.tolerance.dsinks.size(); ++h)
    r.tolerance.dsinks[h] = std::max(r.tolerance.dsinks[h],
                                     f.tolerance.dsinks[h] + std::abs(r.oracle.dsinks[h] - f.oracle.dsinks[h]));
  return r;
}

Tensor<double> weight_error_of(DType dtype, const Tensor<double>& q, const Tensor<double>& k,
                               const AttentionOptions& opts) {
  constexpr const char* who = "streamed_weight_relative_error";
  check_streamed_shapes(who, q.shape(), k.shape(), k.shape(), q.shape(), opts);
  BoundTerms bt;
  bt.dtype = dtype;
  if (opts.rope || opts.rope_folded)
    throw std::logic_error(std::string(who) + ": no streamed bound for RoPE yet (its cases stay below 2^22 weights)");
  // Pass 1 reads neither V nor dO: k and q stand in for them.
  const Tensor<double> q_folded = fold_queries(q, opts, who);
  return Streamed<double, true>(q_folded, k, k, q_folded, folded_options(opts),
                                resolve_scale(opts.scale, q.shape().D, who), bt)
      .weight_errors();
}

}  // namespace
}  // namespace attncheck

// This copy's table (kernels.hpp), constant data: isa_prefix.cmake renames it for the instruction set it is for.
extern "C" const attncheck::detail::BackwardKernels attncheck_backward_kernels;
extern "C" const attncheck::detail::BackwardKernels attncheck_backward_kernels = {
    &attncheck::backward_of<float>,
    &attncheck::backward_of<double>,
    &attncheck::backward_of<Eigen::half>,
    &attncheck::backward_of<Eigen::bfloat16>,
    &attncheck::oracle_backward_of<float>,
    &attncheck::oracle_backward_of<double>,
    &attncheck::oracle_backward_of<Eigen::half>,
    &attncheck::oracle_backward_of<Eigen::bfloat16>,
    &attncheck::gradient_check_of,
    &attncheck::weight_error_of};
