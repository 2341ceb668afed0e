// Mutants of the score modifiers in the forward: logit softcapping (Gemma 2), attention sinks (gpt-oss) and
// ALiBi. Each kernel declares the modifier it implements (and the LSE where such kernels return one), so the
// generators draw it; each gets one step of scale, softcap, ALiBi, mask, sink wrong.
#include <algorithm>
#include <cmath>
#include <limits>

#include "parts.hpp"

namespace attncheck::zoo {
namespace {

// ---- softcap -----------------------------------------------------------------------------------------------

// The mask first, then the cap: a masked -inf comes out of cap·tanh(-inf/cap) as -cap, a finite score, so every
// hidden key takes weight from the visible ones (its value is never read: the weights just sum to less than 1).
template <class A>
HeadOut<A> softcap_after_mask(const Matrix<A>& Q, const Matrix<A>& K, const Matrix<A>& V, const HeadCtx& c) {
  HeadCtx plain = c;
  plain.softcap.reset();
  Matrix<A> z = causal_select(modified_scores(Q, K, plain), c);  // scale and ALiBi, masked additively
  if (c.softcap)
    for (Index i = 0; i < z.rows(); ++i)
      for (Index j = 0; j < z.cols(); ++j) z(i, j) = A(*c.softcap) * std::tanh(z(i, j) / A(*c.softcap));
  return softmax_with_sink(z, V, c);
}

// A softcap step written by hand in place of the kit's: `cap_of(s, cap)` is the author's formula.
template <class A, class Cap>
HeadOut<A> softcap_as(const Matrix<A>& Q, const Matrix<A>& K, const Matrix<A>& V, const HeadCtx& c, Cap cap_of) {
  HeadCtx plain = c;
  plain.softcap.reset();
  plain.alibi_slope = 0;
  Matrix<A> s = scores(Q, K, 1.0);  // q·k, unscaled: cap_of applies the scale where its author put it
  for (Index i = 0; i < s.rows(); ++i)
    for (Index j = 0; j < s.cols(); ++j) {
      s(i, j) = cap_of(s(i, j), A(c.resolved_scale()), c.softcap);
      if (c.alibi_slope != 0) s(i, j) += A(c.alibi_slope) * A(j - c.position(i));
    }
  const Matrix<A> z = causal_select(s, c);
  return softmax_with_sink(z, V, c);
}

// ---- sinks -------------------------------------------------------------------------------------------------

enum class SinkBug {
  every_numerator,  ///< exp(sink - m) added to every visible key's numerator: the row still sums to 1
  left_out_of_lse,  ///< the softmax right, but the LSE written before the sink joins the sum
};

template <class A>
HeadOut<A> sink_head(const Matrix<A>& Q, const Matrix<A>& K, const Matrix<A>& V, const HeadCtx& c, SinkBug bug) {
  HeadOut<A> r = attend_modified(Q, K, V, c);
  const Matrix<A> z = causal_select(modified_scores(Q, K, c), c);
  for (Index i = 0; i < z.rows(); ++i) {
    if (bug == SinkBug::left_out_of_lse) {
      r.lse(i, 0) = row_softmax<A>(z.row(i), std::nullopt).lse();
      continue;
    }
    const RowSoftmax<A> st = row_softmax<A>(z.row(i), c.sink);
    if (st.l == 0 || !c.sink) continue;
    const A extra = std::exp(A(*c.sink) - st.m);
    A l = 0;
    for (Index j = 0; j < z.cols(); ++j)
      if (c.visible(i, j)) l += (r.weights(i, j) = std::exp(z(i, j) - st.m) + extra);
    for (Index j = 0; j < z.cols(); ++j) r.weights(i, j) /= l;
    r.lse(i, 0) = st.m + std::log(l);
  }
  r.output = mix_visible(r.weights, V, c);
  return r;
}

// ---- ALiBi -------------------------------------------------------------------------------------------------

enum class AlibiBug {
  sign_flipped,  ///< s += slope·(p - j): the newest keys penalised instead of the oldest
  query_index,   ///< s += slope·(j - i): measured from the query index, not its aligned position
};

template <class A>
HeadOut<A> alibi_head(const Matrix<A>& Q, const Matrix<A>& K, const Matrix<A>& V, const HeadCtx& c, AlibiBug bug) {
  HeadCtx plain = c;
  plain.alibi_slope = 0;
  Matrix<A> s = modified_scores(Q, K, plain);  // scale and softcap
  for (Index i = 0; i < s.rows(); ++i)
    for (Index j = 0; j < s.cols(); ++j)
      s(i, j) += A(c.alibi_slope) * (bug == AlibiBug::sign_flipped ? A(c.position(i) - j) : A(j - i));
  const Matrix<A> z = causal_select(s, c);
  return softmax_with_sink(z, V, c);
}

// ggml's way: the ALiBi distances live in the additive mask (j - p where visible, -inf where not) and the kernel
// adds slope·mask to the (already selected) scores, so a slope of 0 turns every hidden key's -inf into
// -inf + 0·(-inf) = NaN, and the row's sum with it. Without slopes the mask is not read.
template <class A>
HeadOut<A> alibi_times_mask(const Matrix<A>& Q, const Matrix<A>& K, const Matrix<A>& V, const HeadCtx& c,
                            bool has_alibi) {
  HeadCtx plain = c;
  plain.alibi_slope = 0;
  Matrix<A> z = causal_select(modified_scores(Q, K, plain), c);
  const A neg_inf = -std::numeric_limits<A>::infinity();
  if (has_alibi)
    for (Index i = 0; i < z.rows(); ++i)
      for (Index j = 0; j < z.cols(); ++j) z(i, j) += A(c.alibi_slope) * (c.visible(i, j) ? A(j - c.position(i)) : neg_inf);
  HeadOut<A> r;
  r.weights = Matrix<A>::Zero(z.rows(), z.cols());
  r.lse = Matrix<A>(z.rows(), 1);
  for (Index i = 0; i < z.rows(); ++i) {
    A m = neg_inf, l = 0;
    for (Index j = 0; j < z.cols(); ++j) m = std::max(m, z(i, j));  // NaN never wins a std::max
    if (m == neg_inf) {
      r.lse(i, 0) = neg_inf;
      continue;
    }
    for (Index j = 0; j < z.cols(); ++j) l += (r.weights(i, j) = std::exp(z(i, j) - m));
    r.weights.row(i) /= l;
    r.lse(i, 0) = m + std::log(l);
  }
  r.output = mix_visible(r.weights, V, c);
  return r;
}

Mutant mutant(ImplementationPtr impl, const char* bug, Shape minimal, const char* why,
              std::vector<std::string> killed_by) {
  return Mutant{.impl = std::move(impl),
                .bug = bug,
                .minimal_shape = minimal,
                .why_minimal = why,
                .killed_by = std::move(killed_by)};
}

}  // namespace

std::vector<Mutant> modifier_mutants() {
  std::vector<Mutant> z;
  const auto head = [](const char* name, const char* description, auto fn, Abi3 caps) {
    return head_impl(std::string("mutant:") + name, description, fn, abi3_capabilities(caps));
  };
  z.push_back(mutant(
      head("softcap-after-mask", "softcap applied after the additive mask: a masked -inf becomes -cap and leaks",
           [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) { return softcap_after_mask(Q, K, V, c); },
           {.lse = true, .softcap = true}),
      "softcap applied after the additive -inf mask (select, then cap): cap tanh(-inf / cap) = -cap, so every hidden "
      "key gets weight e^(-cap - m) / l, taken from the visible ones",
      {1, 1, 1, 1}, "one query, one key in its future (T_k = 2, top-left), any softcap",
      {"zero-future-weight", "oracle-agreement", "lse-oracle"}));
  z.push_back(mutant(
      head("softcap-tanh-times-cap", "softcap computed as tanh(s) cap instead of cap tanh(s / cap)",
           [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
             return softcap_as(Q, K, V, c, [](auto s, auto scale, std::optional<double> cap) {
               s *= scale;
               using A = decltype(s);
               return cap ? A(std::tanh(s) * A(*cap)) : s;
             });
           },
           {.softcap = true}),
      "softcap computed as tanh(s) cap instead of cap tanh(s / cap) (the same at cap 1; at cap 2^40 every score is "
      "+-2^40)",
      {1, 1, 1, 1},
      "one query seeing two keys (T_k = 2, bottom-right) whose scores differ, a softcap other than 1 (the kernel "
      "returns no LSE, so one key's output is its value)",
      {"oracle-agreement", "softcap-bound"}));
  z.push_back(mutant(
      head("softcap-unscaled", "softcap applied to the unscaled q.k, the scale multiplied in after it",
           [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
             return softcap_as(Q, K, V, c, [](auto s, auto scale, std::optional<double> cap) {
               using A = decltype(s);
               return cap ? A(scale * (A(*cap) * std::tanh(s / A(*cap)))) : A(scale * s);
             });
           },
           {.lse = true, .softcap = true}),
      "softcap applied to the unscaled q.k and the scale multiplied in after it: scale cap tanh(q.k / cap) instead of "
      "cap tanh(scale q.k / cap)",
      {1, 1, 1, 1},
      "one query, one key, a score other than 0, a softcap and a scale other than 1 (at D = 1 the default is 1, so "
      "an explicit one): the LSE, which is the one modified score, differs",
      {"lse-oracle", "oracle-agreement"}));
  z.push_back(mutant(
      head("sink-every-numerator", "the sink's exp(sink - m) added to every key's numerator",
           [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
             return sink_head(Q, K, V, c, SinkBug::every_numerator);
           },
           {.lse = true, .sinks = true}),
      "the sink's term exp(sink - m) added to every visible key's numerator instead of once to the denominator: the "
      "visible weights still sum to 1 (the 1.0 where the answer is ~0.3)",
      {1, 1, 1, 1}, "one query, one key, a sink: its weight is 1 where it must be 1 - p_sink",
      {"sink-mass", "oracle-agreement"}));
  z.push_back(mutant(
      head("sink-left-out-of-lse", "the LSE written before the sink joins the row's sum",
           [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
             return sink_head(Q, K, V, c, SinkBug::left_out_of_lse);
           },
           {.lse = true, .sinks = true}),
      "the sink left out of the LSE: the softmax and output are right, the LSE is log sum over the visible keys "
      "only (a merge or a backward from it then drops the sink)",
      {1, 1, 1, 1}, "one query, one key, a sink: the LSE is s where it must be log(e^s + e^sink)",
      {"lse-oracle", "output-lse-consistency", "split-kv-merge"}));
  z.push_back(mutant(
      head("alibi-sign-flipped", "ALiBi bias slope (p - j) instead of slope (j - p)",
           [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
             return alibi_head(Q, K, V, c, AlibiBug::sign_flipped);
           },
           {.lse = true, .alibi = true}),
      "ALiBi's sign flipped: slope (p - j), so older keys are favoured instead of penalised", {1, 1, 1, 1},
      "one query seeing two keys (T_k = 2, bottom-right): with one key the bias is 0", {"oracle-agreement", "lse-oracle"}));
  z.push_back(mutant(
      head("alibi-query-index", "ALiBi measured from the query index i instead of its aligned position p",
           [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
             return alibi_head(Q, K, V, c, AlibiBug::query_index);
           },
           {.lse = true, .alibi = true}),
      "ALiBi measured from the query index i, not the aligned position p = i + T_k - T_q, under bottom-right "
      "alignment: every score of a row shifts by slope (T_k - T_q), so the weights and output are right and only "
      "the LSE (what a merge or a cascade reads) is off",
      {1, 1, 1, 1},
      "index and position differ only bottom-right with T_q != T_k: one query over two keys (T_k = 2), where the "
      "LSE is off by the slope",
      {"lse-oracle", "output-lse-consistency"}));
  z.push_back(mutant(
      make_implementation("mutant:alibi-slopes-reversed", "ALiBi slopes read in reversed head order",
                          abi3_capabilities({.alibi = true}),
                          [](const Problem& p) {
                            // The kernel indexes the slope table from its end: head h reads slope H - 1 - h.
                            Problem mine = p;
                            std::reverse(mine.alibi_slopes.begin(), mine.alibi_slopes.end());
                            return run_typed(mine, [](const auto& q, const auto& k, const auto& v, const Problem& pr,
                                                      auto* w) {
                              return per_head(q, k, v, pr, w, [](const auto& Q, const auto& K, const auto& V,
                                                                 const HeadCtx& c) { return attend_modified(Q, K, V, c); });
                            });
                          }),
      "ALiBi slopes read in reversed head order: head h gets slope H - 1 - h (right for one head, or equal slopes)",
      {1, 2, 1, 1},
      "two query heads with different slopes (H = 2, sharing one kv head), one query seeing two keys (T_k = 2, "
      "bottom-right): with one key the bias is 0",
      {"oracle-agreement"}));
  z.push_back(mutant(
      make_implementation("mutant:alibi-times-mask",
                          "ALiBi as slope times an additive mask holding the distances and -inf: a slope of 0 gives NaN",
                          abi3_capabilities({.alibi = true}),
                          [](const Problem& p) {
                            const bool has_alibi = !p.alibi_slopes.empty();
                            return run_typed(p, [has_alibi](const auto& q, const auto& k, const auto& v,
                                                            const Problem& pr, auto* w) {
                              return per_head(q, k, v, pr, w,
                                              [has_alibi](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
                                                return alibi_times_mask(Q, K, V, c, has_alibi);
                                              });
                            });
                          }),
      "ALiBi applied as slope x mask (ggml's soft_max_ext): the additive mask holds j - p on visible keys and -inf on "
      "hidden ones, so hidden keys get slope x (-inf), which is NaN for a slope of 0",
      {1, 1, 1, 1}, "one query, one key in its future (T_k = 2, top-left), ALiBi slopes of 0",
      {"neutral-modifiers"}));
  return z;
}

}  // namespace attncheck::zoo
