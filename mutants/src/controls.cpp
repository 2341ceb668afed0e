// Controls: correct causal attention written differently from the reference (another summation order, a
// tiled online softmax, wider accumulation). No law may fail on them; a law that does has a false alarm.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "parts.hpp"

namespace attncheck::zoo {
namespace {

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

// FlashAttention-2's split-KV decode: each query's visible keys in splits of kSplit, every split reduced to its
// normalised partial output o_c and its log-sum-exp L_c = m_c + log(l_c), held in the accumulation type (float
// for float32, float16, bfloat16: rounded, by u_a·|L_c|), then merged as o = Σ_c exp(L_c - L) o_c with
// L = log Σ_c exp(L_c). The weights returned are the ones applied, exp(s_j - m_c) / l_c · exp(L_c - L), so a row
// of large scores sums to 1 only within the LSE's rounding (about u_a·|L|: 0.99979 at |s| ≈ 4,174 in float32).
struct SplitKvLse {
  static constexpr Index kSplit = 16;  // T_k = 33 already makes three splits
  template <class A>
  HeadOut<A> operator()(const Matrix<A>& Q, const Matrix<A>& K, const Matrix<A>& V, const HeadCtx& c) const {
    const A scale = static_cast<A>(c.resolved_scale());
    HeadOut<A> r{Matrix<A>::Zero(c.T_q, c.T_k), Matrix<A>::Zero(c.T_q, c.D)};
    for (Index i = 0; i < c.T_q; ++i) {
      const Index last = std::min(last_visible_key(i, c.T_q, c.T_k, c.alignment), c.T_k - 1);
      if (last < 0) continue;
      const Index splits = last / kSplit + 1;
      const auto n = static_cast<std::size_t>(splits);
      std::vector<A> m(n, A(0)), l(n, A(0)), lse(n, A(0));
      Matrix<A> o = Matrix<A>::Zero(splits, c.D);
      for (Index sp = 0; sp < splits; ++sp) {  // one split's partial: its own max, sum and normalised output
        const Index j0 = sp * kSplit, j1 = std::min(j0 + kSplit - 1, last);
        A& ms = m[std::size_t(sp)];
        ms = -std::numeric_limits<A>::infinity();
        for (Index j = j0; j <= j1; ++j) ms = std::max(ms, r.weights(i, j) = Q.row(i).dot(K.row(j)) * scale);
        for (Index j = j0; j <= j1; ++j) {
          const A e = std::exp(r.weights(i, j) - ms);
          l[std::size_t(sp)] += e;
          o.row(sp) += e * V.row(j);
        }
        o.row(sp) /= l[std::size_t(sp)];
        lse[std::size_t(sp)] = ms + std::log(l[std::size_t(sp)]);
      }
      // The merge (FlashAttention-2's combine kernel): L from the partial LSEs, each partial scaled by exp(L_c - L).
      const A lse_max = *std::max_element(lse.begin(), lse.end());
      A sum = 0;
      for (const A x : lse) sum += std::exp(x - lse_max);
      const A L = lse_max + std::log(sum);
      for (Index sp = 0; sp < splits; ++sp) {
        const A w_sp = std::exp(lse[std::size_t(sp)] - L);
        r.output.row(i) += w_sp * o.row(sp);
        const Index j0 = sp * kSplit, j1 = std::min(j0 + kSplit - 1, last);
        for (Index j = j0; j <= j1; ++j)
          r.weights(i, j) = std::exp(r.weights(i, j) - m[std::size_t(sp)]) / l[std::size_t(sp)] * w_sp;
      }
    }
    return r;
  }
};

// Flush-to-zero, as a kernel built with -Ofast or -ffast-math (FTZ and DAZ) computes: every input and every
// intermediate of the accumulation type A below its smallest normal is read as 0, and so is every result below it
// before it is stored in the dtype S (a float16 store of a normal float is exact, subnormal half or not, as
// F16C's and CUDA's conversions are; the bounds allow more, NUMERICS.md's 2^-14). Simulated, so the control
// behaves the same on every machine.
template <class A>
A ftz(A x) {
  return std::abs(x) < std::numeric_limits<A>::min() ? A(0) : x;
}
template <class S, class A>
S ftz_store(A x) {
  return static_cast<S>(ftz(x));
}

// One head's row i of the FTZ forward: scores, max, exps, sum, weights and output, each operation flushed; returns
// the log-sum-exp (m + log l) a FlashAttention forward saves for the backward.
template <class A>
A ftz_row(const Matrix<A>& Q, const Matrix<A>& K, const Matrix<A>& V, Index i, const KeyRange& r, A scale,
          Eigen::Matrix<A, 1, Eigen::Dynamic>* w, Eigen::Matrix<A, 1, Eigen::Dynamic>* out) {
  // Each visible score once (the passes below read it three times).
  Eigen::Matrix<A, 1, Eigen::Dynamic> scores(r.end - r.begin);
  for (Index j = r.begin; j < r.end; ++j) {
    A s = 0;
    for (Index d = 0; d < Q.cols(); ++d) s = ftz(s + ftz(Q(i, d) * K(j, d)));
    scores(j - r.begin) = ftz(s * scale);
  }
  const auto score = [&](Index j) { return scores(j - r.begin); };
  A m = -std::numeric_limits<A>::infinity(), l = 0;
  for (Index j = r.begin; j < r.end; ++j) m = std::max(m, score(j));
  for (Index j = r.begin; j < r.end; ++j) l = ftz(l + ftz(std::exp(ftz(score(j) - m))));
  const A lse = m + std::log(l);
  if (out) out->setZero();
  for (Index j = r.begin; j < r.end; ++j) {
    // The forward normalises by l, as FlashAttention's does; the backward recomputes P from the saved lse.
    const A p = out ? ftz(ftz(std::exp(ftz(score(j) - m))) / l) : ftz(std::exp(ftz(score(j) - lse)));
    if (w) (*w)(j) = p;
    if (out)
      for (Index d = 0; d < V.cols(); ++d) (*out)(d) = ftz((*out)(d) + ftz(p * V(j, d)));
  }
  return lse;
}

// A FlashAttention-style forward and backward, correct, run under flush-to-zero (ftz above) at every step: the
// backward recomputes P = exp(s - L) from the saved log-sum-exp, Δ = rowsum(dO ∘ O) with O as saved in the
// dtype, dS = P ∘ (dP - Δ), dQ = scale dS K, dK = scale dSᵀ Q, dV = Pᵀ dO (a shared kv head's summed over its
// group). Rows that see no key are 0 and add nothing.
template <class S>
Tensor<S> ftz_forward(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const Problem& p, Tensor<S>* w) {
  using A = Acc<S>;
  const Shape qs = q.shape(), ks = k.shape();
  const A scale = static_cast<A>(p.scale ? *p.scale : 1.0 / std::sqrt(double(qs.D)));
  const auto daz = [](const auto& m) { return Matrix<A>(m.template cast<A>().unaryExpr([](A x) { return ftz(x); })); };
  Tensor<S> out(qs);
  if (w) *w = Tensor<S>(Shape{qs.B, qs.H, qs.T, ks.T});
  for (Index b = 0; b < qs.B; ++b) {
    const Visibility vis = p.visibility(b);
    for (Index h = 0; h < qs.H; ++h) {
      const Index kv = kv_head(h, qs.H, ks.H);
      const Matrix<A> Q = daz(q.head(b, h)), K = daz(k.head(b, kv)), V = daz(v.head(b, kv));
      Eigen::Matrix<A, 1, Eigen::Dynamic> wi(ks.T), oi(qs.D);
      for (Index i = 0; i < qs.T; ++i) {
        const KeyRange r = vis.keys(i);
        wi.setZero();
        oi.setZero();
        if (!r.empty()) ftz_row(Q, K, V, i, r, scale, &wi, &oi);
        for (Index d = 0; d < qs.D; ++d) out(b, h, i, d) = ftz_store<S>(oi(d));
        if (w)
          for (Index j = 0; j < ks.T; ++j) (*w)(b, h, i, j) = ftz_store<S>(wi(j));
      }
    }
  }
  return out;
}

template <class S>
AttentionGradients<S> ftz_backward(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v,
                                   const Tensor<S>& d_output, const Problem& p) {
  using A = Acc<S>;
  const Shape qs = q.shape(), ks = k.shape();
  const A scale = static_cast<A>(p.scale ? *p.scale : 1.0 / std::sqrt(double(qs.D)));
  const auto daz = [](const auto& m) { return Matrix<A>(m.template cast<A>().unaryExpr([](A x) { return ftz(x); })); };
  const Tensor<S> O = ftz_forward(q, k, v, p, static_cast<Tensor<S>*>(nullptr));  // the output as the forward saved it
  AttentionGradients<S> g{Tensor<S>(qs), Tensor<S>(ks), Tensor<S>(ks)};
  for (Index b = 0; b < qs.B; ++b) {
    const Visibility vis = p.visibility(b);
    for (Index kv = 0; kv < ks.H; ++kv) {
      const Matrix<A> K = daz(k.head(b, kv)), V = daz(v.head(b, kv));
      Matrix<A> dK = Matrix<A>::Zero(ks.T, qs.D), dV = Matrix<A>::Zero(ks.T, qs.D);
      for (Index h = 0; h < qs.H; ++h) {
        if (kv_head(h, qs.H, ks.H) != kv) continue;
        const Matrix<A> Q = daz(q.head(b, h)), dO = daz(d_output.head(b, h)), Oh = daz(O.head(b, h));
        Eigen::Matrix<A, 1, Eigen::Dynamic> P(ks.T);
        for (Index i = 0; i < qs.T; ++i) {
          const KeyRange r = vis.keys(i);
          if (r.empty()) continue;
          P.setZero();
          ftz_row<A>(Q, K, V, i, r, scale, &P, nullptr);
          A delta = 0;
          for (Index d = 0; d < qs.D; ++d) delta = ftz(delta + ftz(dO(i, d) * Oh(i, d)));
          Eigen::Matrix<A, 1, Eigen::Dynamic> dq = Eigen::Matrix<A, 1, Eigen::Dynamic>::Zero(qs.D);
          for (Index j = r.begin; j < r.end; ++j) {
            A dp = 0;
            for (Index d = 0; d < qs.D; ++d) dp = ftz(dp + ftz(dO(i, d) * V(j, d)));
            const A dS = ftz(P(j) * ftz(dp - delta));
            for (Index d = 0; d < qs.D; ++d) {
              dV(j, d) = ftz(dV(j, d) + ftz(P(j) * dO(i, d)));
              dq(d) = ftz(dq(d) + ftz(dS * K(j, d)));
              dK(j, d) = ftz(dK(j, d) + ftz(ftz(scale * dS) * Q(i, d)));
            }
          }
          for (Index d = 0; d < qs.D; ++d) g.dq(b, h, i, d) = ftz_store<S>(ftz(scale * dq(d)));
        }
      }
      for (Index j = 0; j < ks.T; ++j)
        for (Index d = 0; d < qs.D; ++d) {
          g.dk(b, kv, j, d) = ftz_store<S>(dK(j, d));
          g.dv(b, kv, j, d) = ftz_store<S>(dV(j, d));
        }
    }
  }
  return g;
}

ImplementationPtr flush_to_zero() {
  Capabilities caps = zoo_capabilities();
  caps.features.add({Feature::gqa, Feature::key_padding, Feature::window});
  return make_implementation(
      "control:ftz", "correct; forward and FlashAttention-style backward under flush-to-zero (-Ofast), simulated",
      caps,
      [](const Problem& p) {
        return run_typed(p, [](const auto& q, const auto& k, const auto& v, const Problem& pr, auto* w) {
          return ftz_forward(q, k, v, pr, w);
        });
      },
      [](const Problem& p) {
        return run_backward_typed(p, [](const auto& q, const auto& k, const auto& v, const auto& d_output,
                                        const Problem& pr) { return ftz_backward(q, k, v, d_output, pr); });
      });
}

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

// A kernel that picks one of two correct paths by the call's shape, as real libraries do (split-KV when few
// sequences fill the device, a small-query kernel for short prompts), while declaring batch invariance.
template <class Pick>
ImplementationPtr switching(const char* name, const char* description, ImplementationPtr a, ImplementationPtr b,
                            Pick pick_a) {
  return make_implementation(name, description, batch_invariant(zoo_capabilities()),
                             [a, b, pick_a](const Problem& p) { return (pick_a(p) ? a : b)->forward(p); });
}

ImplementationPtr online_tiled_impl() {
  return head_impl("online-tiled", "", [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
    return OnlineTiled{}(Q, K, V, c);
  });
}

}  // namespace

std::vector<Mutant> batch_mutants() {
  std::vector<Mutant> z;
  z.push_back(Mutant{
      .impl = switching(
          "mutant:batch-size-split-kv",
          "declares batch invariance, but a call with one sequence takes a split-KV path (splits of 16 keys, merged "
          "by their LSEs) and a larger batch the tiled one",
          head_impl("split-kv", "", [](const auto& Q, const auto& K, const auto& V,
                                       const HeadCtx& c) { return SplitKvLse{}(Q, K, V, c); }),
          online_tiled_impl(), [](const Problem& p) { return p.q.shape().B == 1; }),
      .bug = "batch-variant: the kernel is chosen by the batch size (split-KV for one sequence, as flash-decoding's "
             "heuristic does), so a sequence's bits depend on what else is in the batch",
      .minimal_shape = {1, 1, 5, 1},
      .why_minimal = "one sequence (B = 1, where the split path runs) against the same sequence in a batch of two; "
                     "the two paths round apart only once a row sums more keys than the tiled kernel's tile of 3, "
                     "and then only for some values: T = 5, or T = 4 (or D = 2) where the values allow",
      .killed_by = {"batch-invariance"},
      .also_minimal = {{1, 1, 4, 1}, {1, 1, 4, 2}},
  });
  z.push_back(Mutant{
      .impl = switching(
          "mutant:query-count-switch",
          "declares batch invariance, but calls of at most 8 queries take another kernel (keys summed last to first)",
          head_impl("reverse-order", "", [](const auto& Q, const auto& K, const auto& V,
                                            const HeadCtx& c) { return ReverseOrder{}(Q, K, V, c); }),
          online_tiled_impl(), [](const Problem& p) { return p.q.shape().T <= 8; }),
      .bug = "query-count-variant: a kernel switch at T_q > 8 (MLX's small-query path) changes the bits of position "
             "0's row when the prompt grows from 8 queries to 9",
      .minimal_shape = {1, 1, 9, 1},
      .why_minimal = "the call must cross the switch: 9 queries in the full call, at most 8 in a cut; the paths round "
                     "apart once a row sums 3 keys",
      .killed_by = {"batch-invariance"},
  });
  return z;
}

std::vector<Mutant> controls() {
  std::vector<Mutant> z;
  z.push_back(Mutant{
      .impl = head_impl(
          "control:reverse-order", "correct; keys visited last to first, scalar loops",
          [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) { return ReverseOrder{}(Q, K, V, c); },
          batch_invariant(zoo_capabilities())),
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
      .impl = head_impl(
          "control:split-kv-lse", "correct; FlashAttention-2 split-KV decode, partials merged by exp(lse_c - lse)",
          [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) { return SplitKvLse{}(Q, K, V, c); }),
      .bug = "control: split-KV (splits of 16 keys), each split's log-sum-exp in the accumulation type, partials "
             "merged with weights exp(lse_c - lse)",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {},
  });
  z.push_back(Mutant{
      .impl = flush_to_zero(),
      .bug = "control: forward and backward under flush-to-zero: every input, intermediate and result below the "
             "smallest normal is 0 (as -Ofast builds and ftz GPU kernels compute)",
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
