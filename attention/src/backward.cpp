// The reference backward of scaled causal attention, its float64 oracle, and the derived bound on a correct
// kernel's gradients.
//
// The bound. Notation as in tolerance.cpp: u_a the accumulation type's unit roundoff, u_s the dtype's,
// γ_n = n·u_a/(1 - n·u_a); one head, query row i, visible keys j; P the oracle's weights; ρ_i the relative
// weight error of tolerance.cpp steps 1-2 (score rounding turned into weights by the softmax). Everything is
// first order in u and multiplied by `safety`; the subnormal floors are added after.
//  0. dO and the inputs are the same (rounded) values for the kernel and the oracle.
//  1. Weights. A kernel's weights (forward's, or recomputed in the backward from the scores and the
//     log-sum-exp) are off by ε_ij = P_ij·(ρ_i + u_s) + min(P_ij·(1 + ρ_i), N_s) + 2^-126 (u_s: stored in the
//     dtype; 2^-126: Eigen's vectorised exp floor); capped at 1 (both lie in [0,1]), and 1 where ρ_i overflows
//     (the dtype cannot resolve the softmax: the bound is then the trivial one). N_s, the dtype's smallest normal:
//     a weight below it, stored in the dtype, is rounded to a subnormal or flushed to 0 (step 9), so it may lose
//     all of itself, at most the kernel's weight before it is stored, P_ij·(1 + ρ_i). Only float16's N_s (2^-14)
//     exceeds 2^-126 + ν, so only float16 adds it: a float16 backward that keeps its forward's weights stores
//     one of 2.4e-8 as 0, and dS_ij = P_ij·G_ij = 7.1e-5 goes with it.
//  2. dP_ij = dO_i·v_j over D_v terms (V's head dimension, which may differ from Q's and K's D: MLA):
//     |dP_ij| ≤ A_ij := Σ_c |dO_ic||v_jc|, error γ_D·A_ij with D = D_v (+ u_s·A_ij when a kernel stores dP in the
//     dtype).
//  3. Δ_i = Σ_j P_ij dP_ij (or dO_i·O_i, O rounded to the dtype: the same terms, Σ_c |dO_ic|·|δO_ic| ≤
//     Σ_j ε_ij A_ij + u_s·Ā_i). With Ā_i := Σ_j P_ij A_ij ≥ |Δ_i|:
//     |δΔ_i| ≤ Σ_j ε_ij A_ij + (γ_D + γ_T + 2u_s)·Ā_i.
//  4. G_ij = dP_ij - Δ_i: |G̃_ij| ≤ Ĝ_ij := A_ij + Ā_i + |δΔ_i|; |δG_ij| ≤ (γ_D + u_s)·A_ij + |δΔ_i| + u_a·Ĝ_ij.
//  5. dS_ij = P_ij·G_ij: |δdS_ij| ≤ e_ij := ε_ij·Ĝ_ij + P_ij·|δG_ij| + (u_a + u_s)·P_ij·Ĝ_ij (the product, and dS
//     stored in the dtype), and |dS̃_ij| ≤ m_ij := (P_ij + ε_ij)·Ĝ_ij.
//  6. dQ_ic = scale·Σ_j dS_ij k_jc: |δdQ_ic| ≤ scale·Σ_j (e_ij + (γ_T + 2u_s + u_a)·m_ij)·|k_jc| + u_s·|dQ_ic|
//     (the T-term sum, the scale applied to q or k in the dtype first, the scale's product, the final rounding).
//  7. dK_jc = scale·Σ_{h in group, i} dS_ij q_ic over n = group·T_q terms:
//     |δdK_jc| ≤ scale·Σ (e_ij + (γ_n + 2u_s + u_a)·m_ij)·|q_ic| + u_s·|dK_jc|.
//  8. dV_jc = Σ_{h in group, i} P_ij dO_ic: |δdV_jc| ≤ Σ (ε_ij + γ_n·P_ij)·|dO_ic| + u_s·|dV_jc|.
//  9. Floors, for flush-to-zero (NUMERICS.md: -Ofast and -ffast-math set FTZ/DAZ for the whole process, GPU
//     kernels compile with ftz). Such a kernel returns 0 for any result below the smallest normal of its type,
//     and reads any input or intermediate below it as 0. Storing a gradient in the dtype is then off by up to
//     the dtype's smallest normal N_s absolutely (storage_floor: 2^-14 float16, 2^-126 bfloat16 and float32,
//     2^-1022 float64); every product or sum in the accumulation type whose result lies below its smallest normal
//     ν = N_a (2^-126 in float, 2^-1022 in double) is off by up to ν absolutely (float64 gradients of 1e-315
//     happen: tiny weights times tiny dS; float ones of 6e-38, which FTZ returns as 0), so ν is added to each
//     weight (step 1), to dP and Δ (D_v + T_vis of them, step 4) and to each dS (step 5), and these flushed
//     intermediates propagate through steps 5-8 as every other error does (ν on dS_ij becomes scale·ν·|k_jc| on
//     dQ_ic), with n·ν more for the final sums' own partial sums. With gradual underflow ν would be the smallest
//     subnormal and N_s half the subnormal spacing: smaller, and a correct FTZ kernel would fail them.
// 9b. A flushed intermediate times what it multiplies (tolerance.cpp step 4b). The propagation above puts ν on P,
//     G and dS and multiplies it by the factors that follow in one order (P, G, then scale, then k_jc), but a
//     kernel may form any partial product of a term first: a term of dQ_ic is scale·P_ij·G_ij·k_jc (times the
//     softcap's f_ij ∈ {0} ∪ [2^-24, 1], never subnormal itself), and scale·dS_ij, dS_ij·k_jc, scale·P_ij or
//     scale·k_jc may be the one that lies below ν. Flushing it zeroes the whole term, an error below ν times the
//     product of the factors not in it; a term dies at its first flush, so the largest such product bounds it.
//     With P_ij + ε_ij ≤ 2 and |G| ≤ Ĝ_ij, every such product is at most max(1, scale)·(2 + Ĝ_ij)·max(1, |k_jc|):
//     ν·|k_jc| for a flushed scale·dS (1/scale times the ν·scale·|k_jc| above: a correct -Ofast backward returned
//     dK = 0 where the oracle said -2.4e-37, 1.09 times that older bound, at D = 6), ν·scale·Ĝ_ij for a flushed
//     P_ij·k_jc, ν·m_ij for a flushed scale·k_jc, and so on. So each (i, j) adds
//     ν·max(1, scale)·(2 + Ĝ_ij)·max(1, |k_jc|) to dQ_ic (and the same with |q_ic| to dK_jc), and a partial sum of
//     scale·dS·k that flushes before or after the scale is applied errs by ν·max(1, scale): the final sums' n·ν
//     becomes n·ν·max(1, scale) for dQ and dK. dV_jc = Σ P_ij dO_ic has no factor but P and dO (ε_ij holds a
//     flushed P, times |dO_ic|), and Δ_i, dP and d_sinks none beyond what steps 1-4 and 11 already multiply.
// 10. DAZ on inputs: an input (q, k, v, dO) below N_a is read as 0, so such a kernel computes the gradients of
//     the flushed problem, within that problem's bound of its oracle: where any input is flushed the bound is
//     the larger of this one and that one plus the two oracles' difference.
// 11. Modifiers. Softcap multiplies dS_ij by f_ij = 1 - tanh²(s_raw/cap) ∈ [0, 1]: every bound above stays one
//     (|f| ≤ 1), and f's own evaluation (tanh to a few ulp, the square, the subtraction) adds 5u_a·m_ij to dS.
//     ALiBi and an additive bias only shift scores (their rounding is in ρ, tolerance.cpp). A sink adds one softmax
//     term (in ρ) and its gradient d_sink_h = -Σ_{b,i} P_s,i·Δ_i, P_s,i = exp(σ_h - lse_i): with ε_s,i = min(1,
//     P_s,i·ρ_i) + 2ν the error in P_s,i, |δ(P_s,i·Δ_i)| ≤ ε_s,i·(Ā_i + |δΔ_i|) + P_s,i·|δΔ_i| + u_a·P_s,i·Ā_i, and the
//     sum over n = B·T_q rows adds γ_n·Σ P_s,i·Ā_i.
// 12. dBias. An additive bias is added to the modified score, so dBias_ij = dS_ij before softcap's f_ij: step 5's
//     e_ij without f's 5u_a·m_ij. A bias broadcast over n = (B/B_b)·(H/H_b) heads sums n such terms in the
//     accumulation type: Σ e_ij + γ_n·Σ m_ij, then rounded to the dtype (u_s·|dBias|) with the floor and n·ν of
//     step 9. A hidden cell's dBias is exactly 0.
// 13. Temperature. The call with τ is the call on q' = q/τ (fold_temperature), whose gradients dK, dV, dBias and the
//     sinks' are those of the call with τ, and dQ_i = dQ'_i/τ_i: the bound is taken on q' with two more terms. dK_jc's
//     terms scale·dS_ij·q'_ic read q'_ic as the kernel rounded it, 3u_s relative at most (tolerance.cpp step 8), so
//     step 7's coefficient grows by 3u_s; dQ_ic is dQ'_ic's bound over τ_i, plus 3u_s·|dQ_ic| for τ (or 1/τ)
//     rounded to the dtype, the division or product, and the quotient rounded again to the dtype, and step 9's
//     storage floor again (dQ'_ic's, divided by τ_i > 1, is smaller than the quotient's own).
// 14. Rotary position embeddings. The call with a rope is the call on q' = R_q q and k' = R_k k (fold_queries,
//     fold_keys), so dQ = R_qᵀ dQ' and dK = R_kᵀ dK' (R_k the same for every query head of a kv group: positions are
//     per token). The kernel's own rotation errs on each element of a pair by ε(pos)·(|x_a| + |x_b|)
//     (tolerance.cpp step 9) ≤ √2·ε·(|x'_a| + |x'_b|): dK_jc's terms scale·dS_ij·q'_ic then add scale·m_ij times
//     that bound of q'_ic, and dQ_ic's the same with k'_jc. Turning a gradient pair back (unfold_prologue) sums the
//     two elements' bounds (|cos|, |sin| ≤ 1), adds the rotation's own ε·(|g_a| + |g_b|), and stores again: u_s·|g|
//     and the floor. ε's 5u_f·|θ| grows with the position: a rotation computed in float at position 10^5 is off by
//     about 10^-2.
// 15. QK-norm. The call with it is the call on y = w ⊙ x / r for q and k (fold_queries, fold_keys, before the rope), so
//     dx = Jᵀ dy: dx_c = w_c dy_c / r - x_c (Σ_d w_d dy_d x_d) / (D s r²), s = sqrt(mean x² + eps) = r with eps inside
//     the root, or sqrt(mean x²) with it outside (r = s + eps). A kernel's own normalisation errs on each y_c by
//     ε_n·|y_c| relative (tolerance.cpp step 10), which dK's terms (reading q') and dQ's (reading k') add as
//     ε_n·m_ij·|y|, like step 13's. Turning a gradient back sums Jᵀ's absolute entries times the bounds
//     (|w_c|/r·t_c + |x_c|/(D s r²)·Σ_d|w_d x_d| t_d), adds the kernel's own evaluation of Jᵀ in float (γ_D + 6u_f
//     relative on each of its two terms, u_f = 2^-24, as step 10's forward) and stores again (u_s·|dx|, the floor).
// 16. Dropout. The forward multiplies V by P' = μ∘P, μ_ij = M_ij/(1 - p) (M the keep mask: the kernel's own, read off
// its
//     weights, so exact), so dV = P'ᵀ dO, dP_ij = μ_ij·(dO_i·v_j), Δ_i = Σ_j P_ij dP_ij (= dO_i·O_i with O the dropped
//     output), dS = P∘(dP - Δ): steps 2-7 with A_ij replaced by μ_ij·A_ij ≥ |dP_ij| and dP's error by
//     (γ_D + 2u_a)·μ_ij·A_ij (1/(1 - p) rounded and its product); step 8 with P'_ij = μ_ij·P_ij for P_ij, whose error
//     is μ_ij·(ε_ij + 2u_a·P_ij). P itself (steps 1 and 5) is the softmax's, undropped.
// A row that sees no key has P = 0 in every correct kernel: it adds no tolerance, and its dQ must be 0.
#include "attncheck/backward.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <string>

namespace attncheck {
namespace {

void check_shapes(const char* who, const Shape& q, const Shape& k, const Shape& v, const Shape& d_output,
                  const AttentionOptions& opts) {
  const auto fail = [&](const std::string& what) { throw ShapeError(std::string(who) + ": " + what); };
  if (k.B != q.B || k.D != q.D || k.H < 1 || q.H % k.H != 0)
    fail("k is " + to_string(k) + " but q is " + to_string(q) + " (B and D must agree and H_kv divide H)");
  if (v.B != k.B || v.H != k.H || v.T != k.T)
    fail("v is " + to_string(v) + " but k is " + to_string(k) + " (V has K's B, H_kv and T; its D_v may differ)");
  const Shape out{q.B, q.H, q.T, v.D};
  if (d_output != out)
    fail("d_output is " + to_string(d_output) + " but the output is " + to_string(out) +
         " (dO has the output's shape [B,H,T_q,D_v])");
  check_options(who, opts, q.B, q.H, k.T, q.T);  // padding, windows, documents, modifiers
}

}  // namespace

template <class S>
AttentionGradients<S> attention_backward(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v,
                                         const Tensor<S>& d_output, const AttentionOptions& opts) {
  using A = Acc<S>;
  constexpr const char* who = "attention_backward";
  const Shape qs = q.shape(), ks = k.shape();
  check_shapes(who, qs, ks, v.shape(), d_output.shape(), opts);
  if (has_prologue(opts)) {  // steps 13-14: the call on the folded q and k, then dQ = R_qᵀ (dQ'/τ), dK = R_kᵀ dK'
    // dQ' and dK' stay in the accumulation type until they are turned back, as a fused kernel keeps them: rounded to
    // S first they may overflow where dQ and dK fit (QK-norm's Jacobian divides by the row's rms, a temperature's
    // dQ' is τ·dQ). q' and k' are the ones a kernel folding in S computes.
    if constexpr (!std::is_same_v<S, A>) {
      AttentionGradients<A> ga = attention_backward<A>(fold_queries(q, opts, who).template cast<A>(),
                                                       fold_keys(k, opts, who).template cast<A>(), v.template cast<A>(),
                                                       d_output.template cast<A>(), folded_options(opts));
      detail::unfold_prologue(ga, opts, q.template cast<A>(), k.template cast<A>());
      AttentionGradients<S> g{ga.dq.template cast<S>(), ga.dk.template cast<S>(), ga.dv.template cast<S>(), ga.dsinks,
                              std::nullopt};
      if (ga.dbias) g.dbias = ga.dbias->template cast<S>();
      return g;
    } else {
      AttentionGradients<S> g =
          attention_backward<S>(fold_queries(q, opts, who), fold_keys(k, opts, who), v, d_output, folded_options(opts));
      detail::unfold_prologue(g, opts, q, k);
      return g;
    }
  }
  if (opts.dropout && opts.dropout->keep.empty())  // the forward's mask, drawn the same way
    return attention_backward<S>(q, k, v, d_output, with_dropout_mask(opts, qs.B, qs.H, qs.T, ks.T));
  if (!opts.dropout && double(qs.B) * double(qs.H) * double(qs.T) * double(ks.T) > kStreamedBackwardWeights)
    return detail::streamed_backward<S>(q, k, v, d_output, opts);  // backward_streamed.cpp
  const double scale = resolve_scale(opts.scale, qs.D, who);
  const A scale_a = static_cast<A>(scale);
  AttentionGradients<S> g{Tensor<S>(qs), Tensor<S>(ks), Tensor<S>(v.shape())};
  std::vector<A> d_sinks(opts.sinks.size(), A(0));
  // dBias: each (b', h') entry of the bias sums, in A, the dS (before softcap's derivative) of the heads it is read
  // for, in (b, h) order; rounded to S once.
  std::vector<Matrix<A>> d_bias;
  if (opts.bias) d_bias.assign(std::size_t(opts.bias->B * opts.bias->H), Matrix<A>::Zero(qs.T, ks.T));
  const auto bias_entry = [&](Index b, Index h) -> Matrix<A>* {
    if (d_bias.empty()) return nullptr;
    const ScoreBias& sb = *opts.bias;
    return &d_bias[std::size_t((sb.B == 1 ? 0 : b) * sb.H + (sb.H == 1 ? 0 : h))];
  };
  const bool per_head = visibility_per_head(opts);
  for (Index b = 0; b < qs.B; ++b) {
    Visibility vis = visibility(opts, b, qs.T, ks.T);
    BoolMask mask = BoolMask::of(vis);
    std::vector<Index> seen;
    for (Index kv = 0; kv < ks.H; ++kv) {
      // dK, dV [T_k,D] of kv head kv, summed in A over its group of query heads, rounded once.
      const Matrix<S> K = k.head(b, kv), V = v.head(b, kv);
      const Matrix<A> Ka = K.template cast<A>(), Va = V.template cast<A>();
      Matrix<A> dK = Matrix<A>::Zero(ks.T, qs.D), dV = Matrix<A>::Zero(ks.T, v.shape().D);
      for (Index h = 0; h < qs.H; ++h) {
        if (kv_head(h, qs.H, ks.H) != kv) continue;
        if (per_head) {
          vis = visibility(opts, b, qs.T, ks.T, h);
          mask = BoolMask::of(vis);
        }
        const Matrix<S> Q = q.head(b, h);
        // P [T_q,T_k] in A: the core's own forward, so the backward differentiates exactly what it computes.
        const HeadModifiers mods = head_modifiers(opts, b, h, qs.T, ks.T);
        const HeadTrace<S> trace = attend<S>(Q, K, V, mask, scale, mods);
        const Matrix<A>& P = trace.weights;
        // Step 16: with dropout, dP = μ∘(dO Vᵀ), μ_ij = M_ij/(1 - p) (in A, as the forward's); dV from P' = μ∘P.
        Matrix<A> mu;
        if (mods.keep) {
          mu = Matrix<A>::Zero(qs.T, ks.T);
          for (Index i = 0; i < qs.T; ++i)
            for (Index j = 0; j < ks.T; ++j)
              if (mods.keep[i * ks.T + j]) mu(i, j) = static_cast<A>(mods.keep_scale);
        }
        const Matrix<A> Qa = Q.template cast<A>(), dO = Matrix<S>(d_output.head(b, h)).template cast<A>();
        Matrix<A> dS = Matrix<A>::Zero(qs.T, ks.T), dQ = Matrix<A>::Zero(qs.T, qs.D);
        Matrix<A>* const dB = bias_entry(b, h);
        for (Index i = 0; i < qs.T; ++i) {
          const KeyRange r = vis.keys(i);
          if (r.empty()) continue;  // sees no key: no gradient to or from this row
          if (vis.has_cells()) {  // a block or dense mask: the visible keys may have gaps; read only those
            seen.clear();
            vis.for_each_run(i, 0, ks.T, [&](Index a, Index e) {
              for (Index j = a; j < e; ++j) seen.push_back(j);
            });
            const Eigen::Matrix<A, 1, Eigen::Dynamic> Pi = P(i, seen);
            Eigen::Matrix<A, 1, Eigen::Dynamic> dP = dO.row(i) * Va(seen, Eigen::all).transpose();
            if (mods.keep) dP = dP.cwiseProduct(mu(i, seen));  // step 16
            const A delta = Pi.cwiseProduct(dP).sum();
            const Eigen::Matrix<A, 1, Eigen::Dynamic> dSi = Pi.cwiseProduct((dP.array() - delta).matrix());
            for (std::size_t n = 0; n < seen.size(); ++n) dS(i, seen[n]) = dSi(Index(n));
            if (dB)
              for (std::size_t n = 0; n < seen.size(); ++n) (*dB)(i, seen[n]) += dSi(Index(n));
            if (mods.sink && *mods.sink != -std::numeric_limits<double>::infinity())
              d_sinks[std::size_t(h)] -= std::exp(static_cast<A>(*mods.sink) - trace.lse(i, 0)) * delta;
            if (mods.softcap) {
              const A cap = static_cast<A>(*mods.softcap);
              for (const Index j : seen) {
                const A t = std::tanh(Qa.row(i).dot(Ka.row(j)) * scale_a / cap);
                dS(i, j) *= A(1) - t * t;
              }
            }
            dQ.row(i).noalias() = scale_a * (dS(i, seen) * Ka(seen, Eigen::all));
            continue;
          }
          // Only the visible run is read, so nothing from a hidden key (not even a -0 or a huge k) reaches dQ_i.
          const auto Pi = P.row(i).segment(r.begin, r.size());
          Eigen::Matrix<A, 1, Eigen::Dynamic> dP = dO.row(i) * Va.middleRows(r.begin, r.size()).transpose();
          if (mods.keep) dP = dP.cwiseProduct(mu.row(i).segment(r.begin, r.size()));  // step 16
          const A delta = Pi.cwiseProduct(dP).sum();
          dS.row(i).segment(r.begin, r.size()) = Pi.cwiseProduct((dP.array() - delta).matrix());
          if (dB) dB->row(i).segment(r.begin, r.size()) += dS.row(i).segment(r.begin, r.size());
          if (mods.sink && *mods.sink != -std::numeric_limits<double>::infinity())  // the sink's column: dP = 0
            d_sinks[std::size_t(h)] -= std::exp(static_cast<A>(*mods.sink) - trace.lse(i, 0)) * delta;
          if (mods.softcap) {  // through s = cap·tanh(s_raw/cap): dS_raw = dS·(1 - tanh²(s_raw/cap))
            const A cap = static_cast<A>(*mods.softcap);
            for (Index j = r.begin; j < r.end; ++j) {
              const A t = std::tanh(Qa.row(i).dot(Ka.row(j)) * scale_a / cap);
              dS(i, j) *= A(1) - t * t;
            }
          }
          dQ.row(i).noalias() = scale_a * (dS.row(i).segment(r.begin, r.size()) * Ka.middleRows(r.begin, r.size()));
        }
        g.dq.head(b, h) = dQ.template cast<S>();
        dV.noalias() += trace.returned_weights().transpose() * dO;  // P' = μ∘P with dropout (step 16)
        dK.noalias() += scale_a * (dS.transpose() * Qa);
      }
      g.dk.head(b, kv) = dK.template cast<S>();
      g.dv.head(b, kv) = dV.template cast<S>();
    }
  }
  for (const A d : d_sinks) g.dsinks.push_back(double(d));
  if (opts.bias) {
    const ScoreBias& sb = *opts.bias;
    g.dbias = Tensor<S>(Shape{sb.B, sb.H, qs.T, ks.T});
    for (Index e = 0; e < sb.B * sb.H; ++e)
      g.dbias->head(e / sb.H, e % sb.H) = d_bias[std::size_t(e)].template cast<S>();
  }
  return g;
}

template <class S>
AttentionGradients<double> oracle_backward(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v,
                                           const Tensor<S>& d_output, const AttentionOptions& opts) {
  return attention_backward<double>(q.template cast<double>(), k.template cast<double>(), v.template cast<double>(),
                                    d_output.template cast<double>(), opts);
}

namespace {

GradientCheck gradient_check_at(DType dtype, const Tensor<double>& q, const Tensor<double>& k,
                                const Tensor<double>& v, const Tensor<double>& d_output,
                                const AttentionOptions& opts, double safety) {
  GradientCheck r;
  r.oracle = attention_backward<double>(q, k, v, d_output, opts);
  const Shape qs = q.shape(), ks = k.shape();
  const double scale = resolve_scale(opts.scale, qs.D, "gradient_check");
  const double u_s = unit_roundoff(dtype), u_a = accumulation_roundoff(dtype);
  const double tiny = dtype == DType::f64 ? 0.0 : std::ldexp(1.0, -126);
  const double floor = storage_floor(dtype);
  // ν: the accumulation type's smallest normal, below which an FTZ kernel flushes (step 9).
  const double nu = dtype == DType::f64 ? smallest_normal(DType::f64) : smallest_normal(DType::f32);
  const double p_floor = floor > tiny + nu ? floor : 0.0;  // step 1: a weight below N_s stored in the dtype
  const Index D_v = v.shape().D;  // dP_ij = dO_i·v_j sums over V's head dimension (step 2)
  const double g_D = gamma(D_v, u_a), g_n = gamma(qs.T * (qs.H / ks.H), u_a);
  // Steps 13 and 15: q'_ic's own rounding in dK's terms (a folded temperature, a normalisation), k'_jc's in dQ's.
  const double q_fold = (opts.temperature_folded ? 3 * u_s : 0.0) +
                        (opts.qk_norm_folded && !opts.qk_norm_folded->q_weight.empty() ? qk_norm_error(dtype, qs.D) : 0.0);
  const double k_fold =
      opts.qk_norm_folded && !opts.qk_norm_folded->k_weight.empty() ? qk_norm_error(dtype, qs.D) : 0.0;
  r.tolerance = {Tensor<double>(qs), Tensor<double>(ks), Tensor<double>(v.shape())};
  r.tolerance.dsinks.assign(opts.sinks.size(), 0.0);
  std::vector<double> sink_terms(opts.sinks.size(), 0.0);  // Σ P_s,i·Ā_i per head (step 11)
  // dBias (step 12): Σ e_ij per entry now, and Σ m_ij for the sum's own rounding.
  Tensor<double> bias_m{Shape{}};
  Index bias_terms = 0;  // how many (b, h) one entry sums
  if (opts.bias) {
    const Shape bs{opts.bias->B, opts.bias->H, qs.T, ks.T};
    r.tolerance.dbias = Tensor<double>(bs);
    bias_m = Tensor<double>(bs);
    bias_terms = (qs.B / opts.bias->B) * (qs.H / opts.bias->H);
  }
  const bool per_head = visibility_per_head(opts);
  for (Index b = 0; b < qs.B; ++b) {
    Visibility vis = visibility(opts, b, qs.T, ks.T);
    BoolMask mask = BoolMask::of(vis);
    for (Index h = 0; h < qs.H; ++h) {
      if (per_head) {
        vis = visibility(opts, b, qs.T, ks.T, h);
        mask = BoolMask::of(vis);
      }
      const Index kv = kv_head(h, qs.H, ks.H);
      const Matrix<double> Q = q.head(b, h), K = k.head(b, kv), V = v.head(b, kv), dO = d_output.head(b, h);
      const HeadModifiers mods = head_modifiers(opts, b, h, qs.T, ks.T);
      const HeadTrace<double> trace = attend<double>(Q, K, V, mask, scale, mods);
      const Matrix<double>& P = trace.weights;
      const Eigen::VectorXd rho = weight_relative_error(dtype, Q, K, mask, scale, mods);
      const double f_err = mods.softcap ? 5 * u_a : 0.0;  // step 11
      Matrix<double> A = dO.cwiseAbs() * V.cwiseAbs().transpose();  // A_ij = Σ_c |dO_ic||v_jc|
      // Step 16: with dropout, μ_ij = M_ij/(1 - p) multiplies A_ij, and dP's error gains 2u_a.
      Matrix<double> mu;
      if (mods.keep) {
        mu = Matrix<double>::Zero(qs.T, ks.T);
        for (Index i = 0; i < qs.T; ++i)
          for (Index j = 0; j < ks.T; ++j)
            if (mods.keep[i * ks.T + j]) mu(i, j) = mods.keep_scale;
        A = A.cwiseProduct(mu);
      }
      const double g_Dk = g_D + (mods.keep ? 2 * u_a : 0.0);
      // Step 14: the kernel's own rotation of q and k errs by √2·ε·(|x'_a| + |x'_b|) on each element of a pair
      // (tolerance.cpp step 9 with |x_a| + |x_b| ≤ √2‖x_p‖ ≤ √2(|x'_a| + |x'_b|)): those bounds per element, to
      // multiply m_ij (dK's terms read q', dQ's read k').
      Matrix<double> q_rot, k_rot;
      if (mods.rope) {
        const auto rotation_bound = [&](const Matrix<double>& x, const std::vector<Index>& pos, Index T) {
          Matrix<double> e = Matrix<double>::Zero(x.rows(), x.cols());
          for (Index t = 0; t < x.rows(); ++t) {
            const double eps = std::sqrt(2.0) * rope_rotation_error(dtype, *mods.rope, pos[std::size_t(b * T + t)]);
            for (Index m = 0; m < mods.rope->rotary_dim / 2; ++m) {
              const auto [a, c] = mods.rope->pair(m);
              e(t, a) = e(t, c) = eps * (std::abs(x(t, a)) + std::abs(x(t, c)));
            }
          }
          return e;
        };
        q_rot = rotation_bound(Q, mods.rope->q_positions, qs.T);
        k_rot = rotation_bound(K, mods.rope->k_positions, ks.T);
      }
      auto tq = r.tolerance.dq.head(b, h);
      auto tk = r.tolerance.dk.head(b, kv);
      auto tv = r.tolerance.dv.head(b, kv);
      const Index bb = opts.bias && opts.bias->B > 1 ? b : 0, bh = opts.bias && opts.bias->H > 1 ? h : 0;
      for (Index i = 0; i < qs.T; ++i) {
        // The span of the visible keys; with a block or dense mask, the hidden keys inside it are skipped.
        const KeyRange keys = vis.keys(i);
        if (keys.empty()) continue;
        const Index n_vis = vis.count(i);
        const bool gaps = n_vis < keys.size();
        const double g_T = gamma(n_vis, u_a);
        Eigen::RowVectorXd eps(ks.T);  // step 1
        eps.setZero();
        double A_bar = 0, d_delta = 0;
        for (Index j = keys.begin; j < keys.end; ++j) {
          if (gaps && !vis.visible(i, j)) continue;
          eps(j) = (std::isinf(rho(i))
                        ? 1.0
                        : std::min(1.0, P(i, j) * (rho(i) + u_s) + std::min(P(i, j) * (1 + rho(i)), p_floor))) +
                   tiny + nu;
          A_bar += P(i, j) * A(i, j);
          d_delta += eps(j) * A(i, j);
        }
        d_delta += (g_Dk + g_T + 2 * u_s) * A_bar;  // step 3 (16)
        if (mods.sink && std::isfinite(*mods.sink) && std::isfinite(trace.lse(i, 0))) {  // step 11
          const double p_s = std::exp(*mods.sink - trace.lse(i, 0));
          const double eps_s = (std::isinf(rho(i)) ? 1.0 : std::min(1.0, p_s * rho(i))) + tiny + nu;
          r.tolerance.dsinks[std::size_t(h)] +=
              safety * (eps_s * (A_bar + d_delta) + p_s * d_delta + u_a * p_s * A_bar);
          sink_terms[std::size_t(h)] += p_s * A_bar;
        }
        for (Index j = keys.begin; j < keys.end; ++j) {
          if (gaps && !vis.visible(i, j)) continue;
          const double G = A(i, j) + A_bar + d_delta;                                 // step 4
          const double dG = (g_Dk + u_s) * A(i, j) + d_delta + u_a * G + double(D_v + n_vis) * nu;
          const double m = (P(i, j) + eps(j)) * G;
          const double e = eps(j) * G + P(i, j) * dG + (u_a + u_s) * P(i, j) * G + nu + f_err * m;  // steps 5, 11
          const double flushed = safety * nu * std::max(1.0, scale) * (2 + G);                      // step 9b
          tq.row(i) += safety * scale * (e + (g_T + 2 * u_s + u_a + k_fold) * m) * K.row(j).cwiseAbs() +  // 6, 15
                       flushed * K.row(j).cwiseAbs().cwiseMax(1.0);
          tk.row(j) += safety * scale * (e + (g_n + 2 * u_s + u_a + q_fold) * m) * Q.row(i).cwiseAbs() +  // 7, 13
                       flushed * Q.row(i).cwiseAbs().cwiseMax(1.0);
          if (mods.rope) {  // step 14
            tq.row(i) += safety * scale * m * k_rot.row(j);
            tk.row(j) += safety * scale * m * q_rot.row(i);
          }
          if (mods.keep)  // step 16: P'_ij = μ_ij·P_ij, off by μ_ij·(ε_ij + 2u_a·P_ij)
            tv.row(j) += safety * mu(i, j) * (eps(j) + (g_n + 2 * u_a) * P(i, j)) * dO.row(i).cwiseAbs();
          else
            tv.row(j) += safety * (eps(j) + g_n * P(i, j)) * dO.row(i).cwiseAbs();            // step 8
          if (opts.bias) {                                                                    // step 12
            (*r.tolerance.dbias)(bb, bh, i, j) += safety * (e - f_err * m);
            bias_m(bb, bh, i, j) += m;
          }
        }
      }
    }
  }
  // The final rounding of every gradient into the dtype, and the subnormal floor (step 9).
  const auto finish = [&](Tensor<double>& tol, const Tensor<double>& grad, Index terms, double after) {
    tol.values() += safety * u_s * grad.values().cwiseAbs();
    tol.values().array() += floor + safety * double(terms) * nu * after;  // after: what multiplies a partial sum (9b)
  };
  for (std::size_t h = 0; h < sink_terms.size(); ++h)  // step 11: the sum over n = B·T_q rows
    r.tolerance.dsinks[h] += safety * (gamma(qs.B * qs.T, u_a) * sink_terms[h] + u_a * std::abs(r.oracle.dsinks[h])) +
                             double(qs.B * qs.T) * nu;
  finish(r.tolerance.dq, r.oracle.dq, ks.T, std::max(1.0, scale));
  finish(r.tolerance.dk, r.oracle.dk, qs.T * (qs.H / ks.H), std::max(1.0, scale));
  finish(r.tolerance.dv, r.oracle.dv, qs.T * (qs.H / ks.H), 1.0);
  if (opts.bias) {  // step 12: the sum over bias_terms heads, then the final rounding and floor
    r.tolerance.dbias->values() += safety * gamma(bias_terms, u_a) * bias_m.values();
    finish(*r.tolerance.dbias, *r.oracle.dbias, bias_terms, 1.0);
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

}  // namespace

GradientCheck gradient_check(DType dtype, const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                             const Tensor<double>& d_output, const AttentionOptions& opts, double safety) {
  const Shape qs = q.shape();
  if (has_prologue(opts)) {  // steps 13-14
    constexpr const char* who = "gradient_check";
    check_shapes(who, qs, k.shape(), v.shape(), d_output.shape(), opts);
    GradientCheck r = gradient_check(dtype, fold_queries(q, opts, who), fold_keys(k, opts, who), v, d_output,
                                     folded_options(opts), safety);
    detail::unfold_prologue(r, opts, q, k, dtype, safety);
    return r;
  }
  if (opts.dropout && opts.dropout->keep.empty())  // step 16: the core's own mask, as its backward draws it
    return gradient_check(dtype, q, k, v, d_output, with_dropout_mask(opts, qs.B, qs.H, qs.T, k.shape().T), safety);
  if (!opts.dropout && double(qs.B) * double(qs.H) * double(qs.T) * double(k.shape().T) > kStreamedBackwardWeights)
    return streamed_gradient_check(dtype, q, k, v, d_output, opts, safety);  // the same bound, O(T·D) memory
  GradientCheck r = gradient_check_at(dtype, q, k, v, d_output, opts, safety);
  Tensor<double> q0 = q, k0 = k, v0 = v, d0 = d_output;
  const bool flushed[] = {daz(dtype, q0), daz(dtype, k0), daz(dtype, v0), daz(dtype, d0)};
  if (std::none_of(std::begin(flushed), std::end(flushed), [](bool f) { return f; })) return r;
  const GradientCheck f = gradient_check_at(dtype, q0, k0, v0, d0, opts, safety);  // step 10
  const auto widen = [](Tensor<double>& tol, const Tensor<double>& tol0, const Tensor<double>& g,
                        const Tensor<double>& g0) {
    tol.values() = tol.values().cwiseMax(tol0.values() + (g.values() - g0.values()).cwiseAbs());
  };
  widen(r.tolerance.dq, f.tolerance.dq, r.oracle.dq, f.oracle.dq);
  widen(r.tolerance.dk, f.tolerance.dk, r.oracle.dk, f.oracle.dk);
  widen(r.tolerance.dv, f.tolerance.dv, r.oracle.dv, f.oracle.dv);
  if (opts.bias) widen(*r.tolerance.dbias, *f.tolerance.dbias, *r.oracle.dbias, *f.oracle.dbias);
  for (std::size_t h = 0; h < r.tolerance.dsinks.size(); ++h)
    r.tolerance.dsinks[h] = std::max(r.tolerance.dsinks[h],
                                     f.tolerance.dsinks[h] + std::abs(r.oracle.dsinks[h] - f.oracle.dsinks[h]));
  return r;
}

namespace detail {

namespace {
// x [B,H,T,D] (a gradient) with each token's rotated pairs turned back, x_a <- c·x_a + s·x_b, x_b <- c·x_b - s·x_a
// (Rᵀ), in the accumulation type A and rounded to S.
template <class A, class S> void unrotate(Tensor<S>& x, const Rope& rope, const std::vector<Index>& positions) {
  const Shape& s = x.shape();
  for (Index b = 0; b < s.B; ++b)
    for (Index t = 0; t < s.T; ++t)
      for (Index m = 0; m < rope.rotary_dim / 2; ++m) {
        const double theta = rope.angle(positions[std::size_t(b * s.T + t)], m);
        const A c = static_cast<A>(std::cos(theta)), sn = static_cast<A>(std::sin(theta));
        const auto [a, e] = rope.pair(m);
        for (Index h = 0; h < s.H; ++h) {
          const A xa = static_cast<A>(x(b, h, t, a)), xe = static_cast<A>(x(b, h, t, e));
          x(b, h, t, a) = static_cast<S>(c * xa + sn * xe);
          x(b, h, t, e) = static_cast<S>(c * xe - sn * xa);
        }
      }
}

// Step 14 on a bound: the gradient's pairs turned back (as unrotate) with their bounds, tol_a + tol_b (|cos|, |sin|
// <= 1), the rotation's own error ε(pos)·(|g_a| + |g_b|) and the result stored again (u_s·|g| and the floor).
void unrotate_bound(Tensor<double>& g, Tensor<double>& tol, const Rope& rope, const std::vector<Index>& positions,
                    DType dtype, double safety) {
  const Tensor<double> g0 = g, t0 = tol;
  unrotate<double>(g, rope, positions);
  const double u_s = unit_roundoff(dtype), floor = storage_floor(dtype);
  const Shape& s = g.shape();
  for (Index b = 0; b < s.B; ++b)
    for (Index t = 0; t < s.T; ++t) {
      const double eps = rope_rotation_error(dtype, rope, positions[std::size_t(b * s.T + t)]);
      for (Index m = 0; m < rope.rotary_dim / 2; ++m) {
        const auto [a, e] = rope.pair(m);
        for (Index h = 0; h < s.H; ++h) {
          const double both = t0(b, h, t, a) + t0(b, h, t, e),
                       rot = safety * eps * (std::abs(g0(b, h, t, a)) + std::abs(g0(b, h, t, e)));
          tol(b, h, t, a) = both + rot + safety * u_s * std::abs(g(b, h, t, a)) + floor;
          tol(b, h, t, e) = both + rot + safety * u_s * std::abs(g(b, h, t, e)) + floor;
        }
      }
    }
}
}  // namespace

namespace {
// Step 15: a gradient g of the normalised rows y = w ⊙ x / r of x turned into the gradient of x, in A and rounded to
// S: dx_c = w_c g_c / r - x_c (Σ_d w_d g_d x_d) / (D s r²), s = sqrt(mean x² + eps) = r (eps inside) or
// sqrt(mean x²) (outside, r = s + eps).
template <class A, class S>
void unnormalise(Tensor<S>& g, const Tensor<S>& x, const QkNorm& norm, const std::vector<double>& w) {
  const Shape& sh = g.shape();
  for (Index b = 0; b < sh.B; ++b)
    for (Index h = 0; h < sh.H; ++h)
      for (Index t = 0; t < sh.T; ++t) {
        A ms = 0, dot = 0;
        for (Index c = 0; c < sh.D; ++c) {
          const A xc = static_cast<A>(x(b, h, t, c));
          ms += xc * xc;
          dot += static_cast<A>(w[std::size_t(c)]) * static_cast<A>(g(b, h, t, c)) * xc;
        }
        ms /= A(sh.D);
        const A sq = std::sqrt(norm.eps_outside ? ms : ms + static_cast<A>(norm.eps));
        const A r = norm.eps_outside ? sq + static_cast<A>(norm.eps) : sq;
        // A zero row with eps outside the root (sq = 0): x_c/sq stays within ±1 and dot is 0, so the term is 0.
        const A second = sq > 0 ? dot / (A(sh.D) * sq * r * r) : A(0);
        for (Index c = 0; c < sh.D; ++c)
          g(b, h, t, c) = static_cast<S>(static_cast<A>(w[std::size_t(c)]) * static_cast<A>(g(b, h, t, c)) / r -
                                         static_cast<A>(x(b, h, t, c)) * second);
      }
}

// Step 15 on a bound: the oracle's g turned back as unnormalise does, and its bound with it: |w_c|/r·t_c +
// |x_c|/(D s r²)·Σ_d|w_d x_d| t_d for the bounds t of g, the kernel's own evaluation in float (γ_D + 6u_f relative on
// each of the two terms: its r and its sum), and the result stored again (u_s·|dx| and the floor).
void unnormalise_bound(Tensor<double>& g, Tensor<double>& tol, const Tensor<double>& x, const QkNorm& norm,
                       const std::vector<double>& w, DType dtype, double safety) {
  const Shape& sh = g.shape();
  const double u_s = unit_roundoff(dtype), u_f = unit_roundoff(DType::f32), floor = storage_floor(dtype);
  const double eval = gamma(sh.D, u_f) + 6 * u_f;
  const Tensor<double> g0 = g, t0 = tol;
  unnormalise<double>(g, x, norm, w);
  for (Index b = 0; b < sh.B; ++b)
    for (Index h = 0; h < sh.H; ++h)
      for (Index t = 0; t < sh.T; ++t) {
        double ms = 0, wxt = 0, wxg = 0;
        for (Index c = 0; c < sh.D; ++c) {
          ms += x(b, h, t, c) * x(b, h, t, c);
          wxt += std::abs(w[std::size_t(c)] * x(b, h, t, c)) * t0(b, h, t, c);
          wxg += std::abs(w[std::size_t(c)] * x(b, h, t, c) * g0(b, h, t, c));
        }
        ms /= double(sh.D);
        const double sq = std::sqrt(norm.eps_outside ? ms : ms + norm.eps), r = norm.eps_outside ? sq + norm.eps : sq;
        const double k = sq > 0 ? 1 / (double(sh.D) * sq * r * r) : 0.0;  // a zero row: the term is 0
        for (Index c = 0; c < sh.D; ++c) {
          const double wc = std::abs(w[std::size_t(c)]), xc = std::abs(x(b, h, t, c));
          tol(b, h, t, c) = wc / r * t0(b, h, t, c) + xc * k * wxt +
                            safety * eval * (wc * std::abs(g0(b, h, t, c)) / r + xc * k * wxg) +
                            safety * u_s * std::abs(g(b, h, t, c)) + floor;
        }
      }
}
}  // namespace

template <class S>
void unfold_prologue(AttentionGradients<S>& g, const AttentionOptions& opts, const Tensor<S>& q, const Tensor<S>& k) {
  using A = Acc<S>;
  if (opts.temperature) {  // step 13: dQ'/τ
    const QueryTemperature& t = *opts.temperature;
    const Shape& s = g.dq.shape();
    for (Index b = 0; b < s.B; ++b)
      for (Index h = 0; h < s.H; ++h)
        for (Index i = 0; i < s.T; ++i) {
          const A tau = static_cast<A>(t(b, h, i));
          for (Index c = 0; c < s.D; ++c) g.dq(b, h, i, c) = static_cast<S>(static_cast<A>(g.dq(b, h, i, c)) / tau);
        }
  }
  if (opts.rope) {  // step 14: R_qᵀ dQ, R_kᵀ dK
    unrotate<A>(g.dq, *opts.rope, opts.rope->q_positions);
    unrotate<A>(g.dk, *opts.rope, opts.rope->k_positions);
  }
  if (opts.qk_norm) {  // step 15: through the normalisation
    if (!opts.qk_norm->q_weight.empty()) unnormalise<A>(g.dq, q, *opts.qk_norm, opts.qk_norm->q_weight);
    if (!opts.qk_norm->k_weight.empty()) unnormalise<A>(g.dk, k, *opts.qk_norm, opts.qk_norm->k_weight);
  }
}

void unfold_prologue(GradientCheck& r, const AttentionOptions& opts, const Tensor<double>& q, const Tensor<double>& k,
                     DType dtype, double safety) {
  const double u_s = unit_roundoff(dtype);
  const double floor = storage_floor(dtype);  // the quotient stored again (step 9): dQ'/τ's floor shrank by τ
  if (opts.temperature) {
    const QueryTemperature& t = *opts.temperature;
    const Shape& s = r.oracle.dq.shape();
    for (Index b = 0; b < s.B; ++b)
      for (Index h = 0; h < s.H; ++h)
        for (Index i = 0; i < s.T; ++i)
          for (Index c = 0; c < s.D; ++c) {  // step 13
            double& g = r.oracle.dq(b, h, i, c);
            g /= t(b, h, i);
            double& tol = r.tolerance.dq(b, h, i, c);
            tol = tol / t(b, h, i) + safety * 3 * u_s * std::abs(g) + floor;
          }
  }
  if (opts.rope) {  // step 14
    unrotate_bound(r.oracle.dq, r.tolerance.dq, *opts.rope, opts.rope->q_positions, dtype, safety);
    unrotate_bound(r.oracle.dk, r.tolerance.dk, *opts.rope, opts.rope->k_positions, dtype, safety);
  }
  if (opts.qk_norm) {  // step 15
    const QkNorm& n = *opts.qk_norm;
    if (!n.q_weight.empty()) unnormalise_bound(r.oracle.dq, r.tolerance.dq, q, n, n.q_weight, dtype, safety);
    if (!n.k_weight.empty()) unnormalise_bound(r.oracle.dk, r.tolerance.dk, k, n, n.k_weight, dtype, safety);
  }
}

#define ATTNCHECK_INSTANTIATE_UNFOLD(S) \
  template void unfold_prologue(AttentionGradients<S>&, const AttentionOptions&, const Tensor<S>&, const Tensor<S>&);
ATTNCHECK_INSTANTIATE_UNFOLD(float)
ATTNCHECK_INSTANTIATE_UNFOLD(double)
ATTNCHECK_INSTANTIATE_UNFOLD(Eigen::half)
ATTNCHECK_INSTANTIATE_UNFOLD(Eigen::bfloat16)
#undef ATTNCHECK_INSTANTIATE_UNFOLD

}  // namespace detail

#define ATTNCHECK_INSTANTIATE_BACKWARD(S)                                                                        \
  template AttentionGradients<S> attention_backward(const Tensor<S>&, const Tensor<S>&, const Tensor<S>&,         \
                                                    const Tensor<S>&, const AttentionOptions&);                   \
  template AttentionGradients<double> oracle_backward(const Tensor<S>&, const Tensor<S>&, const Tensor<S>&,       \
                                                      const Tensor<S>&, const AttentionOptions&);

ATTNCHECK_INSTANTIATE_BACKWARD(float)
ATTNCHECK_INSTANTIATE_BACKWARD(double)
ATTNCHECK_INSTANTIATE_BACKWARD(Eigen::half)
ATTNCHECK_INSTANTIATE_BACKWARD(Eigen::bfloat16)

}  // namespace attncheck
