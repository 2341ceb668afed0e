// Controls: correct causal attention written differently from the reference (another summation order, a
// tiled online softmax, wider accumulation). No law may fail on them; a law that does has a false alarm.
#include <algorithm>
#include <limits>

#include "parts.hpp"

namespace attncheck::zoo {
namespace {

template <class M>
using Scalar = typename std::decay_t<M>::Scalar;

// Keys visited from the last visible one down to 0, for the max, the row sum and weights·V alike.
struct ReverseOrder {
  template <class A>
  HeadOut<A> operator()(const Matrix<A>& Q, const Matrix<A>& K, const Matrix<A>& V, const HeadCtx& c) const {
    const A scale = static_cast<A>(c.resolved_scale());
    HeadOut<A> r{Matrix<A>::Zero(c.T_q, c.T_k), Matrix<A>::Zero(c.T_q, c.D)};
    for (Index i = 0; i < c.T_q; ++i) {
      const Index last = std::min(last_visible_key(i, c.T_q, c.T_k, c.alignment), c.T_k - 1);
      if (last < 0) continue;  // nothing visible: zero weights, zero output
      A m = -std::numeric_limits<A>::infinity();
      for (Index j = last; j >= 0; --j) {
        A s = 0;
        for (Index d = c.D - 1; d >= 0; --d) s += Q(i, d) * K(j, d);
        r.weights(i, j) = s * scale;
        m = std::max(m, r.weights(i, j));
      }
      A sum = 0;
      for (Index j = last; j >= 0; --j) sum += (r.weights(i, j) = std::exp(r.weights(i, j) - m));
      for (Index j = last; j >= 0; --j) {
        r.weights(i, j) /= sum;
        r.output.row(i) += r.weights(i, j) * V.row(j);
      }
    }
    return r;
  }
};

// FlashAttention-style: keys in tiles of kTile, a running max m, a running sum l and an unnormalised
// accumulator rescaled by exp(m_old - m_new) whenever the max grows. Tiles past the last visible key are
// skipped, as causal kernels do. Weights (which FlashAttention never stores) are recomputed from the final
// m and l for the laws that read them.
struct OnlineTiled {
  static constexpr Index kTile = 3;  // small, so short sequences already span several tiles
  template <class A>
  HeadOut<A> operator()(const Matrix<A>& Q, const Matrix<A>& K, const Matrix<A>& V, const HeadCtx& c) const {
    const A scale = static_cast<A>(c.resolved_scale());
    HeadOut<A> r{Matrix<A>::Zero(c.T_q, c.T_k), Matrix<A>::Zero(c.T_q, c.D)};
    Eigen::Matrix<A, 1, Eigen::Dynamic> acc(c.D);
    for (Index i = 0; i < c.T_q; ++i) {
      const Index last = std::min(last_visible_key(i, c.T_q, c.T_k, c.alignment), c.T_k - 1);
      if (last < 0) continue;
      A m = -std::numeric_limits<A>::infinity(), l = 0;
      acc.setZero();
      for (Index t0 = 0; t0 <= last; t0 += kTile) {
        const Index t1 = std::min(t0 + kTile - 1, last);
        A tile_max = -std::numeric_limits<A>::infinity();
        for (Index j = t0; j <= t1; ++j)
          tile_max = std::max(tile_max, r.weights(i, j) = Q.row(i).dot(K.row(j)) * scale);
        const A m_new = std::max(m, tile_max);
        const A alpha = std::exp(m - m_new);  // 0 on the first tile (m = -inf)
        l *= alpha;
        acc *= alpha;
        for (Index j = t0; j <= t1; ++j) {
          const A p = std::exp(r.weights(i, j) - m_new);
          l += p;
          acc += p * V.row(j);
        }
        m = m_new;
      }
      r.output.row(i) = acc / l;
      for (Index j = 0; j <= last; ++j) r.weights(i, j) = std::exp(r.weights(i, j) - m) / l;
    }
    return r;
  }
};

// Every dtype computed in double and rounded once at the end: more accurate than the reference, never less.
ImplementationPtr wide_accumulation() {
  return make_implementation(
      "control:double-accumulation", "correct; every dtype accumulates in double, rounded once at the end",
      zoo_capabilities(), [](const Problem& p) {
        return run_typed(p, [&](const auto& q, const auto& k, const auto& v, const Problem& pr, auto* w) {
          return per_head_in<double>(q, k, v, pr, w, [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
            HeadOut<double> r;
            r.weights = softmax_rows<double>(causal_select<double>(scores(Q, K, c.resolved_scale()), c));
            r.output = mix_visible(r.weights, V, c);
            return r;
          });
        });
      });
}

// Grouped-query attention the way a kernel without it is used (PyTorch before enable_gqa): K and V repeated
// to H heads (repeat_interleave), then ordinary attention.
ImplementationPtr repeat_kv() {
  return make_implementation(
      "control:gqa-repeat-kv", "correct; grouped queries by repeating K and V to H heads, then plain attention",
      gqa_capabilities(), [](const Problem& p) {
        return run_typed(p, [&](const auto& q, const auto& k, const auto& v, const Problem& pr, auto* w) {
          const Index H = q.shape().H;
          return per_head(q, repeat_kv_heads(k, H), repeat_kv_heads(v, H), pr, w,
                          [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
                            HeadOut<Scalar<decltype(Q)>> r;
                            r.weights = softmax_rows(causal_select(scores(Q, K, c.resolved_scale()), c));
                            r.output = mix_visible(r.weights, V, c);
                            return r;
                          });
        });
      });
}

}  // namespace

std::vector<Mutant> controls() {
  std::vector<Mutant> z;
  z.push_back(Mutant{
      .impl = head_impl(
          "control:reverse-order", "correct; keys visited last to first, scalar loops",
          [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) { return ReverseOrder{}(Q, K, V, c); }),
      .bug = "control: keys (and the dot product's terms) summed in reverse order",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {},
  });
  z.push_back(Mutant{
      .impl = head_impl(
          "control:online-tiled", "correct; FlashAttention-style tiled online softmax",
          [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) { return OnlineTiled{}(Q, K, V, c); }),
      .bug = "control: tiled online softmax (tiles of 3 keys, running max and rescaling), future tiles skipped",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {},
  });
  z.push_back(Mutant{
      .impl = wide_accumulation(),
      .bug = "control: every dtype accumulates in double (the reference uses float for half/bfloat16/float)",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {},
  });
  z.push_back(Mutant{
      .impl = repeat_kv(),
      .bug = "control: grouped queries by explicit repetition of K and V to H heads (repeat_interleave)",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {},
  });
  return z;
}

}  // namespace attncheck::zoo
