// Backward-pass mutants: a correct forward (the reference core) with a FlashAttention-style backward written
// from scratch (weights recomputed from the saved log-sum-exp, Δ = rowsum(dO ∘ O), dS = P ∘ (dP - Δ)), each
// with one realistic mistake; and two controls, the same kernel with plain and with Kahan (compensated) sums.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "parts.hpp"

namespace attncheck::zoo {
namespace {

enum class Bug {
  none,
  ds_unmasked,      ///< the mask is applied to P for dV but not to dS: hidden keys get dK, and feed dQ
  delta_rowsum_do,  ///< Δ_i = rowsum(dO_i) instead of rowsum(dO_i ∘ O_i)
  dq_unscaled,      ///< dQ = dS K, the scale forgotten
  dk_unscaled,      ///< dK = dSᵀ Q, the scale forgotten
  dv_unnormalised,  ///< dV from exp(s - m): the softmax's numerator, never divided by the row sum
  dk_from_p,        ///< dK accumulated from P instead of dS
  lse_wrong_row,    ///< the weights recomputed with the log-sum-exp of the next row (an off-by-one)
  kv_one_head,      ///< a shared kv head's dK, dV written by each query head in turn: the last one wins
  dk_race,          ///< the rows reach dK and dV in an order that changes from call to call (atomics, no fixed order)
  dp_over_dk,       ///< dP = dO·v and Δ = dO·O summed over Q's and K's head dimension, not V's (one head_dim for both)
};

/// A running sum: plain, or Kahan-compensated (the float-Kahan control).
template <class A> struct PlainSum {
  A s = 0;
  void add(A x) { s += x; }
  A value() const { return s; }
};
template <class A> struct KahanSum {
  A s = 0, c = 0;
  void add(A x) {
    const A y = x - c;
    const A t = s + y;
    c = (t - s) - y;
    s = t;
  }
  A value() const { return s; }
};

// The backward of one problem at dtype S, accumulating in A = Acc<S> through Sum<A>.
//   q [B,H,T_q,D], dO [B,H,T_q,D_v]; k [B,H_kv,T_k,D], v [B,H_kv,T_k,D_v]; per row i: scores s_i·, max m_i,
//   log-sum-exp L_i, output O_i
//   (recomputed and rounded to S, as a forward would have saved it); then per visible key j:
//   P_ij = exp(s_ij - L_i), dV_j += P_ij dO_i, dS_ij = P_ij (dO_i·v_j - Δ_i), dQ_i += scale dS_ij k_j,
//   dK_j += scale dS_ij q_i. A shared kv head's dK and dV sum over its group.
template <template <class> class Sum, class S>
AttentionGradients<S> flash_backward(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v,
                                     const Tensor<S>& d_output, const Problem& p, Bug bug) {
  using A = Acc<S>;
  const Shape qs = q.shape(), ks = k.shape();
  const Index T_q = qs.T, T_k = ks.T, D = qs.D, D_v = v.shape().D, group = qs.H / ks.H;
  const A scale = static_cast<A>(p.scale ? *p.scale : 1.0 / std::sqrt(double(D)));
  const A neg_inf = -std::numeric_limits<A>::infinity();
  const auto dot_n = [&](const auto& x, const auto& y, Index n) {
    Sum<A> acc;
    for (Index c = 0; c < n; ++c) acc.add(x(c) * y(c));
    return acc.value();
  };
  const auto dot = [&](const auto& x, const auto& y) { return dot_n(x, y, D); };  // over Q's and K's D
  // Over V's D_v (dP, Δ); the bug: over D, as far as both have columns.
  const auto dot_v = [&](const auto& x, const auto& y) { return dot_n(x, y, bug == Bug::dp_over_dk ? std::min(D, D_v) : D_v); };
  AttentionGradients<S> g{Tensor<S>(qs), Tensor<S>(ks), Tensor<S>(v.shape())};
  // The race: which row adds into dK and dV first depends on the call (a counter standing for thread timing):
  // every other call takes the rows last to first.
  static std::atomic<Index> calls{0};
  const bool reversed = bug == Bug::dk_race && calls++ % 2 == 1;
  for (Index b = 0; b < qs.B; ++b) {
    const Visibility vis = p.visibility(b);
    for (Index kv = 0; kv < ks.H; ++kv) {
      const Matrix<A> K = k.head(b, kv).template cast<A>(), V = v.head(b, kv).template cast<A>();
      std::vector<Sum<A>> dK(std::size_t(T_k * D)), dV(std::size_t(T_k * D_v));
      for (Index h = kv * group; h < (kv + 1) * group; ++h) {
        if (bug == Bug::kv_one_head) {  // each head overwrites the group's sums instead of adding to them
          std::fill(dK.begin(), dK.end(), Sum<A>{});
          std::fill(dV.begin(), dV.end(), Sum<A>{});
        }
        const Matrix<A> Q = q.head(b, h).template cast<A>(), dO = d_output.head(b, h).template cast<A>();
        // The forward's statistics, per row.
        Matrix<A> s(T_q, T_k), O = Matrix<A>::Zero(T_q, D_v);
        std::vector<A> m(std::size_t(T_q), neg_inf), lse(std::size_t(T_q), neg_inf);
        for (Index i = 0; i < T_q; ++i) {
          for (Index j = 0; j < T_k; ++j) s(i, j) = scale * dot(Q.row(i), K.row(j));
          const KeyRange r = vis.keys(i);
          if (r.empty()) continue;
          for (Index j = r.begin; j < r.end; ++j) m[i] = std::max(m[i], s(i, j));
          Sum<A> l;
          for (Index j = r.begin; j < r.end; ++j) l.add(std::exp(s(i, j) - m[i]));
          lse[i] = m[i] + std::log(l.value());
          for (Index c = 0; c < D_v; ++c) {
            Sum<A> o;
            for (Index j = r.begin; j < r.end; ++j) o.add(std::exp(s(i, j) - lse[i]) * V(j, c));
            O(i, c) = static_cast<A>(static_cast<S>(o.value()));  // saved in the dtype
          }
        }
        // The backward.
        for (Index n = 0; n < T_q; ++n) {
          const Index i = reversed ? T_q - 1 - n : n;
          const KeyRange r = vis.keys(i);
          if (r.empty()) continue;  // sees no key: no gradient
          const A L = lse[std::size_t(bug == Bug::lse_wrong_row ? std::min(i + 1, T_q - 1) : i)];
          A delta;
          if (bug == Bug::delta_rowsum_do) {
            Sum<A> d;
            for (Index c = 0; c < D_v; ++c) d.add(dO(i, c));
            delta = d.value();
          } else {
            delta = dot_v(dO.row(i), O.row(i));
          }
          std::vector<Sum<A>> dQ(static_cast<std::size_t>(D));
          const Index from = bug == Bug::ds_unmasked ? 0 : r.begin, to = bug == Bug::ds_unmasked ? T_k : r.end;
          for (Index j = from; j < to; ++j) {
            const A P = std::exp(s(i, j) - L);
            const A P_dv = bug == Bug::dv_unnormalised ? std::exp(s(i, j) - m[std::size_t(i)]) : P;
            const A dS = P * (dot_v(dO.row(i), V.row(j)) - delta);
            const A to_dk = bug == Bug::dk_from_p ? P : dS;
            if (r.contains(j))
              for (Index c = 0; c < D_v; ++c) dV[std::size_t(j * D_v + c)].add(P_dv * dO(i, c));
            for (Index c = 0; c < D; ++c) {
              dQ[std::size_t(c)].add(dS * K(j, c));
              dK[std::size_t(j * D + c)].add((bug == Bug::dk_unscaled ? to_dk : scale * to_dk) * Q(i, c));
            }
          }
          for (Index c = 0; c < D; ++c)
            g.dq(b, h, i, c) = static_cast<S>(bug == Bug::dq_unscaled ? dQ[std::size_t(c)].value()
                                                                       : scale * dQ[std::size_t(c)].value());
        }
      }
      for (Index j = 0; j < T_k; ++j) {
        for (Index c = 0; c < D; ++c) g.dk(b, kv, j, c) = static_cast<S>(dK[std::size_t(j * D + c)].value());
        for (Index c = 0; c < D_v; ++c) g.dv(b, kv, j, c) = static_cast<S>(dV[std::size_t(j * D_v + c)].value());
      }
    }
  }
  return g;
}

// What every backward entry declares: the zoo's contract, plus grouped heads, padding and windows (its
// forward is the reference core, and its backward follows the problem's visibility rule); with `v_dims`, V's own
// head dimension too (Feature::v_head_dim).
Capabilities backward_capabilities(bool v_dims) {
  Capabilities c = zoo_capabilities();
  c.features.add({Feature::gqa, Feature::key_padding, Feature::window});
  c.features.set(Feature::v_head_dim, v_dims);
  return c;
}

template <template <class> class Sum>
ImplementationPtr backward_impl(std::string name, std::string description, Bug bug, bool v_dims = false) {
  return make_implementation(
      std::move(name), std::move(description), backward_capabilities(v_dims),
      [](const Problem& p) { return reference_implementation()->forward(p); },
      [bug](const Problem& p) {
        return run_backward_typed(p, [bug](const auto& q, const auto& k, const auto& v, const auto& d_output,
                                           const Problem& pr) { return flash_backward<Sum>(q, k, v, d_output, pr, bug); });
      });
}

Mutant mutant(const char* name, const char* bug_line, Bug bug, Shape minimal, const char* why,
              std::vector<std::string> killed_by, bool v_dims = false) {
  return Mutant{.impl = backward_impl<PlainSum>(std::string("mutant:") + name, bug_line, bug, v_dims),
                .bug = bug_line,
                .control = false,
                .minimal_shape = minimal,
                .why_minimal = why,
                .killed_by = std::move(killed_by)};
}

}  // namespace

std::vector<Mutant> backward_mutants() {
  std::vector<Mutant> z;
  z.push_back(mutant("grad-ds-unmasked", "backward: the mask applied to P for dV but not to dS (FlashAttention's recompute)",
                     Bug::ds_unmasked, {1, 1, 1, 1},
                     "one query and a key in its future (T_k = 2): the future key gets dK",
                     {"grad-oracle", "grad-causality", "grad-key-sum-zero"}));
  z.push_back(mutant("grad-delta-rowsum-do", "backward: Delta = rowsum(dO) instead of rowsum(dO * O)",
                     Bug::delta_rowsum_do, {1, 1, 1, 1},
                     "one query, one key: dS = dO.v - sum(dO) is not 0 as it must be for a single key",
                     {"grad-oracle", "grad-key-sum-zero"}));
  z.push_back(mutant("grad-dq-unscaled", "backward: dQ = dS K, the scale forgotten", Bug::dq_unscaled, {1, 1, 1, 1},
                     "dQ needs two visible keys (with one, dS = 0) and a scale other than 1: at D = 1 the default "
                     "1/sqrt(D) is 1, so an explicit scale (shrinking keeps the one D = 2 had, then makes it 0.5)",
                     {"grad-oracle"}));
  z.push_back(mutant("grad-dk-unscaled", "backward: dK = dS^T Q, the scale forgotten", Bug::dk_unscaled, {1, 1, 1, 1},
                     "dK needs two visible keys (with one, dS = 0) and a scale other than 1: at D = 1 the default "
                     "1/sqrt(D) is 1, so an explicit scale (shrinking keeps the one D = 2 had, then makes it 0.5)",
                     {"grad-oracle"}));
  z.push_back(mutant("grad-dv-unnormalised", "backward: dV from exp(s - max), never divided by the row sum",
                     Bug::dv_unnormalised, {1, 1, 1, 1},
                     "with one visible key exp(s - max) = 1 is the weight: one query seeing two keys",
                     {"grad-oracle", "grad-dv-weights"}));
  z.push_back(mutant("grad-dk-from-p", "backward: dK accumulated from P instead of dS", Bug::dk_from_p, {1, 1, 1, 1},
                     "one query, one key: dK = scale P q is not the 0 a single key's softmax gives",
                     {"grad-oracle", "grad-key-sum-zero"}));
  z.push_back(mutant("grad-lse-wrong-row", "backward: weights recomputed with the log-sum-exp of the next row",
                     Bug::lse_wrong_row, {1, 1, 2, 1},
                     "the last row uses its own log-sum-exp: two queries, and one key they both see",
                     {"grad-oracle", "grad-dv-weights"}));
  z.push_back(mutant("grad-kv-one-head", "backward: a shared kv head's dK, dV from its last query head, not the group sum",
                     Bug::kv_one_head, {1, 2, 1, 1}, "two query heads sharing one kv head (H = 2, H_kv = 1), one key",
                     {"grad-oracle", "grad-dv-weights"}));
  z.push_back(mutant("grad-dk-race",
                     "backward: rows added into dK and dV in an order that changes from call to call (a race)",
                     Bug::dk_race, {1, 1, 3, 1},
                     "a key's dV (or dK) must sum three rows' terms for a reordering to round differently (a + b = b + "
                     "a): three queries over one key (T_q = 3 > T_k = 1, top-left, all seeing it); some cases end on "
                     "two or three keys, dropping any of which leaves the sums rounding alike",
                     {"grad-determinism"}));
  z.push_back(mutant("grad-dp-over-dk",
                     "backward: dP = dO.v and Delta summed over K's head dimension, not V's (one head_dim for both)",
                     Bug::dp_over_dk, {1, 1, 1, 1},
                     "dP and Delta lose V's columns past D: D = 1 with D_v = 2 (D_v < D drops none), and dS needs two "
                     "visible keys (with one it is 0 whatever dP is): one query over two keys, bottom-right",
                     {"grad-oracle"}, true));
  const auto control = [](ImplementationPtr impl, const char* what) {
    return Mutant{.impl = std::move(impl),
                  .bug = what,
                  .control = true,
                  .minimal_shape = {},
                  .why_minimal = "a control: no case should fail",
                  .killed_by = {}};
  };
  z.push_back(control(backward_impl<PlainSum>("control:grad-lse-recompute",
                                              "correct; backward recomputes the weights from the saved log-sum-exp",
                                              Bug::none, true),
                      "control: FlashAttention-style backward, weights recomputed as exp(s - L) from the log-sum-exp, "
                      "Delta from the output saved in the dtype; V with a head dimension of its own"));
  z.push_back(control(backward_impl<KahanSum>("control:grad-kahan", "correct; backward with Kahan-compensated float sums",
                                              Bug::none),
                      "control: the same backward with every sum Kahan-compensated (in float for low precision)"));
  return z;
}

}  // namespace attncheck::zoo
