// Backward mutants of the score modifiers: the reference core's forward with a FlashAttention-style backward
// written from scratch that honours softcap and sinks (P recomputed from the log-sum-exp, which holds the sink;
// Δ_i = dO_i·O_i; dS = P ∘ (dP - Δ), times softcap's 1 - tanh² before dQ and dK; d_sinks[h] = -Σ P_sink·Δ_i),
// each with one mistake.
#include <cmath>
#include <limits>
#include <vector>

#include "parts.hpp"

namespace attncheck::zoo {
namespace {

enum class GradBug {
  softcap_no_dtanh,  ///< dS passed to dQ and dK without softcap's derivative 1 - tanh²(s / cap)
  dsink_sign,        ///< d_sinks = +Σ P_sink Δ: the sign of the sink column's dS lost
  dsink_missing,     ///< d_sinks left at 0 (the kernel never writes it)
  lse_without_sink,  ///< P recomputed from an LSE without the sink: the rows' weights sum to 1 in the backward
};

//   q, dO [B,H,T_q,D]; k, v [B,H_kv,T_k,D]; per row i: r_ij = scale q_i·k_j, t = tanh(r/cap), s = cap t (+ALiBi),
//   L_i = log(Σ_visible exp s_ij + exp σ_h), P_ij = exp(s_ij - L_i), O_i = Σ P_ij v_j (the forward's, saved);
//   dV_j += P_ij dO_i, dS_ij = P_ij (dO_i·v_j - Δ_i), dR = dS (1 - t²), dQ_i += scale dR_ij k_j,
//   dK_j += scale dR_ij q_i, d_sinks[h] -= exp(σ_h - L_i) Δ_i.
template <class S>
AttentionGradients<S> modified_backward(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v,
                                        const Tensor<S>& d_output, const Problem& p, GradBug bug) {
  using A = Acc<S>;
  const Shape qs = q.shape(), ks = k.shape();
  const Index T_q = qs.T, T_k = ks.T, D = qs.D, group = qs.H / ks.H;
  const A scale = A(resolve_scale(p.scale, D, "modified_backward"));
  const A neg_inf = -std::numeric_limits<A>::infinity();
  AttentionGradients<S> g{Tensor<S>(qs), Tensor<S>(ks), Tensor<S>(ks)};
  if (!p.sinks.empty()) g.dsinks.assign(p.sinks.size(), 0.0);
  const Index offset = p.alignment == CausalAlignment::BottomRight ? T_k - T_q : 0;
  for (Index b = 0; b < qs.B; ++b) {
    const Visibility vis = p.visibility(b);
    for (Index kv = 0; kv < ks.H; ++kv) {
      const Matrix<A> K = k.head(b, kv).template cast<A>(), V = v.head(b, kv).template cast<A>();
      Matrix<A> dK = Matrix<A>::Zero(T_k, D), dV = Matrix<A>::Zero(T_k, D);
      for (Index h = kv * group; h < (kv + 1) * group; ++h) {
        const Matrix<A> Q = q.head(b, h).template cast<A>(), dO = d_output.head(b, h).template cast<A>();
        const double slope = p.alibi_slopes.empty() ? 0.0 : p.alibi_slopes[std::size_t(h)];
        const A sink = p.sinks.empty() ? neg_inf : A(p.sinks[std::size_t(h)]);
        Matrix<A> s(T_q, T_k), dt(T_q, T_k);  // modified scores, and d s / d r (softcap's 1 - tanh²)
        for (Index i = 0; i < T_q; ++i)
          for (Index j = 0; j < T_k; ++j) {
            A x = scale * Q.row(i).dot(K.row(j));
            dt(i, j) = 1;
            if (p.softcap) {
              const A t = std::tanh(x / A(*p.softcap));
              x = A(*p.softcap) * t;
              dt(i, j) = 1 - t * t;
            }
            s(i, j) = x + A(slope) * A(j - (i + offset));
          }
        A dsink = 0;
        std::vector<A> dQ(static_cast<std::size_t>(D));
        for (Index i = 0; i < T_q; ++i) {
          const KeyRange r = vis.keys(i);
          if (r.empty() && sink == neg_inf) continue;  // no term at all
          A m = sink;
          for (Index j = r.begin; j < r.end; ++j) m = std::max(m, s(i, j));
          A l = 0, l_visible = 0;
          for (Index j = r.begin; j < r.end; ++j) l_visible += std::exp(s(i, j) - m);
          l = l_visible + (sink == neg_inf ? A(0) : std::exp(sink - m));
          const A L = m + std::log(l);
          const A L_bwd = bug == GradBug::lse_without_sink && l_visible > 0 ? m + std::log(l_visible) : L;
          Matrix<A> O = Matrix<A>::Zero(1, D);  // the forward's output, saved in the dtype
          for (Index j = r.begin; j < r.end; ++j) O += std::exp(s(i, j) - L) * V.row(j);
          for (Index c = 0; c < D; ++c) O(0, c) = A(S(O(0, c)));
          const A delta = dO.row(i).dot(O.row(0));
          if (sink != neg_inf) dsink -= std::exp(sink - L) * delta;
          std::fill(dQ.begin(), dQ.end(), A(0));
          for (Index j = r.begin; j < r.end; ++j) {
            const A P = std::exp(s(i, j) - L_bwd);
            const A dS = P * (dO.row(i).dot(V.row(j)) - delta);
            const A dR = bug == GradBug::softcap_no_dtanh ? dS : dS * dt(i, j);
            for (Index c = 0; c < D; ++c) {
              dV(j, c) += P * dO(i, c);
              dQ[std::size_t(c)] += dR * K(j, c);
              dK(j, c) += scale * dR * Q(i, c);
            }
          }
          for (Index c = 0; c < D; ++c) g.dq(b, h, i, c) = S(scale * dQ[std::size_t(c)]);
        }
        if (!g.dsinks.empty()) {
          if (bug == GradBug::dsink_sign) dsink = -dsink;
          if (bug != GradBug::dsink_missing) g.dsinks[std::size_t(h)] += double(dsink);
        }
      }
      for (Index j = 0; j < T_k; ++j)
        for (Index c = 0; c < D; ++c) {
          g.dk(b, kv, j, c) = S(dK(j, c));
          g.dv(b, kv, j, c) = S(dV(j, c));
        }
    }
  }
  return g;
}

Mutant grad_mutant(const char* name, const char* bug_line, GradBug bug, Abi3 mods, Shape minimal, const char* why,
                   std::vector<std::string> killed_by) {
  Capabilities caps = abi3_capabilities(mods);
  caps.features.add(Feature::backward);
  return Mutant{.impl = make_implementation(
                    std::string("mutant:") + name, bug_line, caps,
                    [](const Problem& p) { return reference_implementation()->forward(p); },
                    [bug](const Problem& p) {
                      return run_backward_typed(p, [bug](const auto& q, const auto& k, const auto& v,
                                                         const auto& d_output, const Problem& pr) {
                        return modified_backward(q, k, v, d_output, pr, bug);
                      });
                    }),
                .bug = bug_line,
                .minimal_shape = minimal,
                .why_minimal = why,
                .killed_by = std::move(killed_by)};
}

}  // namespace

std::vector<Mutant> modifier_backward_mutants() {
  std::vector<Mutant> z;
  z.push_back(grad_mutant("grad-softcap-no-dtanh",
                          "backward with softcap: dS passed to dQ and dK without the factor 1 - tanh^2(s / cap)",
                          GradBug::softcap_no_dtanh, {.softcap = true}, {1, 1, 1, 1},
                          "dQ needs two visible keys (with one, dS = 0) and a score away from 0 (tanh' = 1 there): one "
                          "query over two keys, bottom-right, with a softcap",
                          {"grad-oracle"}));
  z.push_back(grad_mutant("grad-sink-sign", "backward with sinks: d_sinks = +sum P_sink Delta, the sign lost",
                          GradBug::dsink_sign, {.sinks = true}, {1, 1, 1, 1},
                          "one query, one key, a sink, v and dO not 0: d_sinks = -p_sink dO.O is not 0",
                          {"grad-oracle"}));
  z.push_back(grad_mutant("grad-sink-missing", "backward with sinks: d_sinks never written (left 0)",
                          GradBug::dsink_missing, {.sinks = true}, {1, 1, 1, 1},
                          "one query, one key, a sink, v and dO not 0: d_sinks = -p_sink dO.O is not 0",
                          {"grad-oracle"}));
  z.push_back(grad_mutant("grad-lse-without-sink",
                          "backward with sinks: P recomputed from an LSE without the sink, so it sums to 1",
                          GradBug::lse_without_sink, {.sinks = true}, {1, 1, 1, 1},
                          "one query, one key, a sink, dO not 0: dV = P dO with P = 1 where it must be 1 - p_sink",
                          {"grad-oracle", "grad-dv-weights"}));
  return z;
}

}  // namespace attncheck::zoo
