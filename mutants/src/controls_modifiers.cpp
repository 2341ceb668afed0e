// A control for the log-sum-exp and the score modifiers: correct attention written as a flash-decoding kernel
// is, not as the reference. Keys are cut into splits of 32 and tiles of 8; each split runs an online softmax in
// base 2 (exp2 of the score pre-multiplied by log2 e, FlashAttention's trick), ends with its own natural-log
// LSE, and the splits are merged by exp(lse_c - lse) after subtracting the largest; the sink joins at the
// merge, once. Softcap, ALiBi, padding, windows, grouped queries and causal = false all apply. Every rounding
// differs from the reference's: no law may fail on it.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <vector>

#include "parts.hpp"

namespace attncheck::zoo {
namespace {

constexpr Index kFlashSplit = 32, kFlashTile = 8;

template <class S>
Tensor<S> flash_exp2_split(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const Problem& p,
                           Tensor<double>* lse_out) {
  using A = Acc<S>;
  const Shape& qs = q.shape();
  const Index T_k = k.shape().T, H_kv = k.shape().H;
  const A neg_inf = -std::numeric_limits<A>::infinity(), log2e = A(std::numbers::log2e), ln2 = A(std::numbers::ln2);
  const AttentionOptions opts = p.options();
  const double scale = resolve_scale(opts.scale, qs.D, "control:flash-exp2-split");
  Tensor<S> out(qs);
  if (lse_out) *lse_out = Tensor<double>({qs.B, qs.H, qs.T, 1});
  std::vector<A> acc(std::size_t(qs.D)), merged(std::size_t(qs.D));
  for (Index b = 0; b < qs.B; ++b) {
    const Visibility vis = p.visibility(b);
    for (Index h = 0; h < qs.H; ++h) {
      const Index g = kv_head(h, qs.H, H_kv);
      const HeadModifiers mods = head_modifiers(opts, b, h, qs.T, T_k);
      for (Index i = 0; i < qs.T; ++i) {
        const KeyRange r = vis.keys(i);
        // Each split's (lse_c, O_c), merged at the end.
        std::vector<A> lses;
        std::vector<std::vector<A>> outs;
        for (Index s0 = (r.begin / kFlashSplit) * kFlashSplit; s0 < r.end; s0 += kFlashSplit) {
          const Index j0 = std::max(s0, r.begin), j1 = std::min(s0 + kFlashSplit, r.end);
          if (j0 >= j1) continue;
          A m2 = neg_inf, l = 0;  // the running max in base-2 units, and the sum of exp2
          std::fill(acc.begin(), acc.end(), A(0));
          for (Index t0 = j0; t0 < j1; t0 += kFlashTile) {
            const Index t1 = std::min(t0 + kFlashTile, j1);
            std::vector<A> s2;
            A tile_max = neg_inf;
            for (Index j = t0; j < t1; ++j) {
              A dot = 0;
              for (Index c = 0; c < qs.D; ++c) dot += A(q(b, h, i, c)) * A(k(b, g, j, c));
              const A s = modified_score<A>(dot * A(scale), mods, i, j);
              s2.push_back(s * log2e);
              tile_max = std::max(tile_max, s2.back());
            }
            const A m_new = std::max(m2, tile_max);
            const A c = m2 == neg_inf ? A(0) : std::exp2(m2 - m_new);
            l *= c;
            for (A& a : acc) a *= c;
            for (Index j = t0; j < t1; ++j) {
              const A e = std::exp2(s2[std::size_t(j - t0)] - m_new);
              l += e;
              for (Index d = 0; d < qs.D; ++d) acc[std::size_t(d)] += e * A(v(b, g, j, d));
            }
            m2 = m_new;
          }
          lses.push_back((m2 + std::log2(l)) * ln2);
          std::vector<A> o(acc.size());
          for (std::size_t d = 0; d < acc.size(); ++d) o[d] = acc[d] / l;
          outs.push_back(std::move(o));
        }
        // The merge: subtract the largest LSE (the sink's logit included), weigh each split by exp(lse_c - lse).
        A top = mods.sink ? A(*mods.sink) : neg_inf;
        for (const A x : lses) top = std::max(top, x);
        std::fill(merged.begin(), merged.end(), A(0));
        A lse = neg_inf;
        if (top != neg_inf) {
          A sum = mods.sink && *mods.sink != -std::numeric_limits<double>::infinity() ? std::exp(A(*mods.sink) - top) : A(0);
          for (const A x : lses) sum += std::exp(x - top);
          lse = top + std::log(sum);
          for (std::size_t n = 0; n < lses.size(); ++n) {
            const A w = std::exp(lses[n] - lse);
            for (std::size_t d = 0; d < merged.size(); ++d) merged[d] += w * outs[n][d];
          }
        }
        for (Index d = 0; d < qs.D; ++d) out(b, h, i, d) = S(merged[std::size_t(d)]);
        if (lse_out) (*lse_out)(b, h, i, 0) = double(lse);
      }
    }
  }
  return out;
}

}  // namespace

std::vector<Mutant> modifier_controls() {
  Capabilities caps = gqa_capabilities();
  caps.returns_weights = false;  // a flash kernel never materialises them
  caps.features.add({Feature::key_padding, Feature::window});
  caps.features.add({Feature::lse, Feature::sinks, Feature::softcap, Feature::alibi, Feature::bidirectional});
  caps.reentrant = true;
  caps.empty_rows = EmptyRows::zero;
  std::vector<Mutant> z;
  z.push_back(Mutant{
      .impl = make_implementation(
          "control:flash-exp2-split",
          "correct; flash-decoding: splits of 32 keys, tiles of 8, base-2 online softmax, LSE merge, sink at the merge",
          caps,
          [](const Problem& p) {
            Problem no_weights = p;  // it has none to return, whatever a caller asks
            no_weights.want_weights = false;
            return run_typed(no_weights, [](const auto& q, const auto& k, const auto& v, const Problem& pr, auto*,
                                            Tensor<double>* lse) { return flash_exp2_split(q, k, v, pr, lse); });
          }),
      .bug = "control: keys in splits of 32 and tiles of 8, an online softmax in base 2 per split, each split's LSE, "
             "splits merged by exp(lse_c - lse), the sink added once at the merge; softcap, ALiBi, padding, windows, "
             "grouped queries and causal = false",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {},
  });
  return z;
}

}  // namespace attncheck::zoo
