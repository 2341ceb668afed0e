// Mutants of the log-sum-exp a kernel returns (FlashAttention's softmax_lse, what split-KV and cascade merges
// read), of a split-KV decode's merge of its partial results, and of the row max's starting value. Each
// kernel declares the LSE (Feature::lse), so lse-oracle, output-lse-consistency and split-kv-merge apply.
#include <cmath>
#include <limits>
#include <vector>

#include "parts.hpp"

namespace attncheck::zoo {
namespace {

// ---- the LSE returned --------------------------------------------------------------------------------------

enum class LseBug {
  base2,          ///< the row's log2-sum-exp (a kernel computing in base 2 with exp2) returned unconverted
  unscaled_max,   ///< lse = m_raw + log l with m_raw the max of the unscaled q·k (the scale left off the max)
  without_max,    ///< lse = log l, the running max m never added back
  empty_row_zero, ///< rows that see no key skip the epilogue: their LSE keeps the buffer's initial 0
};

// A correct softmax and output; only the LSE written out is wrong, as `bug` says.
template <class A>
HeadOut<A> lse_head(const Matrix<A>& Q, const Matrix<A>& K, const Matrix<A>& V, const HeadCtx& c, LseBug bug) {
  HeadOut<A> r = attend_modified(Q, K, V, c);
  const Matrix<A> z = causal_select(modified_scores(Q, K, c), c);
  const Matrix<A> raw = causal_select(scores(Q, K, 1.0), c);
  for (Index i = 0; i < z.rows(); ++i) {
    const RowSoftmax<A> st = row_softmax<A>(z.row(i), c.sink);
    if (st.l == 0) {
      if (bug == LseBug::empty_row_zero) r.lse(i, 0) = 0;
      continue;  // otherwise -inf, as attend_modified wrote it
    }
    switch (bug) {
      case LseBug::base2: r.lse(i, 0) = st.lse() / A(std::log(2.0)); break;
      case LseBug::unscaled_max: r.lse(i, 0) = raw.row(i).maxCoeff() + std::log(st.l); break;
      case LseBug::without_max: r.lse(i, 0) = std::log(st.l); break;
      case LseBug::empty_row_zero: break;
    }
  }
  return r;
}

// ---- split-KV decode merges --------------------------------------------------------------------------------

constexpr Index kMergeSplit = 16;  // keys per split of the decode kernel

enum class MergeBug {
  no_max,         ///< O = Σ exp(lse_p) O_p / Σ exp(lse_p): no max subtracted, exp overflows past ~88.7 in float
  by_l,           ///< parts weighted by their sums l_p, forgetting each part's own max: Σ l_p O_p / Σ l_p
  sink_per_split, ///< each split's softmax takes the sink in as its own extra column: the sink counts once per split
};

// One query over more than one split of keys, bottom-right (a decode step): each split's (m_p, l_p, O_p) with
// every modifier, merged as `bug` says; the sink joins the merge once (except for sink_per_split). Other calls
// take the plain path (attend_modified) and are right.
template <class A>
HeadOut<A> split_decode(const Matrix<A>& Q, const Matrix<A>& K, const Matrix<A>& V, const HeadCtx& c, MergeBug bug) {
  HeadOut<A> r = attend_modified(Q, K, V, c);  // the weights, as a caller reads them
  if (!(c.T_q == 1 && c.T_k > kMergeSplit && c.alignment == CausalAlignment::BottomRight)) return r;
  const A neg_inf = -std::numeric_limits<A>::infinity();
  const Matrix<A> z = causal_select(modified_scores(Q, K, c), c);
  std::vector<A> m, l;
  std::vector<Matrix<A>> O;
  for (Index s0 = 0; s0 < c.T_k; s0 += kMergeSplit) {
    const Index n = std::min(kMergeSplit, c.T_k - s0);
    const RowSoftmax<A> st =
        row_softmax<A>(z.row(0).segment(s0, n), bug == MergeBug::sink_per_split ? c.sink : std::nullopt);
    Matrix<A> o = Matrix<A>::Zero(1, V.cols());
    if (st.l > 0)
      for (Index j = s0; j < s0 + n; ++j)
        if (c.visible(0, j)) o += (std::exp(z(0, j) - st.m) / st.l) * V.row(j);
    m.push_back(st.m), l.push_back(st.l), O.push_back(o);
  }
  const A sink = c.sink && bug != MergeBug::sink_per_split ? A(*c.sink) : neg_inf;
  Matrix<A> out = Matrix<A>::Zero(1, V.cols());
  A total = 0, lse = neg_inf;
  switch (bug) {
    case MergeBug::no_max: {
      for (std::size_t p = 0; p < m.size(); ++p) {
        const A e = std::exp(m[p] + std::log(l[p]));  // exp(lse_p), overflowing where lse_p > ~88.7
        out += e * O[p], total += e;
      }
      total += std::exp(sink);
      lse = std::log(total);
      break;
    }
    case MergeBug::by_l: {
      A top = neg_inf;
      for (std::size_t p = 0; p < m.size(); ++p) {
        out += l[p] * O[p], total += l[p];
        top = std::max(top, m[p]);
      }
      if (sink != neg_inf) total += std::exp(sink - top);
      lse = top + std::log(total);
      break;
    }
    case MergeBug::sink_per_split: {  // the right merge, of wrong parts
      A top = sink;
      for (const A x : m) top = std::max(top, x);
      for (std::size_t p = 0; p < m.size(); ++p) {
        const A e = l[p] * std::exp(m[p] - top);
        out += e * O[p], total += e;
      }
      if (sink != neg_inf) total += std::exp(sink - top);
      lse = top + std::log(total);
      break;
    }
  }
  r.output = total > 0 ? Matrix<A>(out / total) : Matrix<A>(Matrix<A>::Zero(1, V.cols()));
  r.lse(0, 0) = lse;
  return r;
}

// ---- the row max's start -----------------------------------------------------------------------------------

// The running max starts at a finite "-inf", -5e4 (fits float16): a row whose visible scores all lie more than
// ~88.7 (float exp's range) below it has every exp(s - m) flushed to 0, and the l == 0 guard meant for rows that
// see no key makes it a silent zero row (LSE -inf).
template <class A>
HeadOut<A> sentinel_max(const Matrix<A>& Q, const Matrix<A>& K, const Matrix<A>& V, const HeadCtx& c) {
  const Matrix<A> z = causal_select(modified_scores(Q, K, c), c);
  HeadOut<A> r;
  r.weights = Matrix<A>::Zero(z.rows(), z.cols());
  r.lse = Matrix<A>(z.rows(), 1);
  for (Index i = 0; i < z.rows(); ++i) {
    A m = A(-5e4), l = 0;
    for (Index j = 0; j < z.cols(); ++j) m = std::max(m, z(i, j));
    for (Index j = 0; j < z.cols(); ++j) l += std::exp(z(i, j) - m);
    r.lse(i, 0) = l > 0 ? m + std::log(l) : -std::numeric_limits<A>::infinity();
    if (l == 0) continue;  // "nothing visible"
    for (Index j = 0; j < z.cols(); ++j) r.weights(i, j) = std::exp(z(i, j) - m) / l;
  }
  r.output = mix_visible(r.weights, V, c);
  return r;
}

Mutant lse_mutant(const char* name, const char* description, LseBug bug, Shape minimal, const char* why,
                  std::vector<std::string> killed_by) {
  return Mutant{.impl = head_impl(std::string("mutant:") + name, description,
                                  [bug](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
                                    return lse_head(Q, K, V, c, bug);
                                  },
                                  abi3_capabilities({.lse = true})),
                .bug = description,
                .minimal_shape = minimal,
                .why_minimal = why,
                .killed_by = std::move(killed_by)};
}

Mutant merge_mutant(const char* name, const char* description, MergeBug bug, Abi3 caps, const char* why,
                    std::vector<std::string> killed_by) {
  return Mutant{.impl = head_impl(std::string("mutant:") + name, description,
                                  [bug](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
                                    return split_decode(Q, K, V, c, bug);
                                  },
                                  abi3_capabilities(caps)),
                .bug = description,
                .minimal_shape = {1, 1, 1, 1},
                .why_minimal = why,
                .killed_by = std::move(killed_by)};
}

}  // namespace

std::vector<Mutant> lse_mutants() {
  std::vector<Mutant> z;
  z.push_back(lse_mutant("lse-base2",
                         "the LSE returned in base 2: log2 sum exp(s), as a kernel computing with exp2 holds it, never "
                         "multiplied back by ln 2",
                         LseBug::base2, {1, 1, 1, 1},
                         "one query, one key with a score other than 0: its LSE is the score s, returned as s / ln 2",
                         {"lse-oracle", "output-lse-consistency", "split-kv-merge"}));
  z.push_back(lse_mutant("lse-unscaled-max",
                         "the LSE from the max of the unscaled scores: m_raw + log l where scale m_raw + log l is "
                         "right (the output is right)",
                         LseBug::unscaled_max, {1, 1, 1, 1},
                         "one query, one key, a score other than 0 and a scale other than 1: at D = 1 the default "
                         "scale is 1, so an explicit one",
                         {"lse-oracle", "output-lse-consistency"}));
  z.push_back(lse_mutant("lse-without-max", "the LSE returned as log l: the running max m is never added back",
                         LseBug::without_max, {1, 1, 1, 1},
                         "one query, one key with a score other than 0: log l = 0 where the LSE is the score",
                         {"lse-oracle", "output-lse-consistency", "split-kv-merge"}));
  z.push_back(lse_mutant("lse-empty-row-zero",
                         "a row that sees no key skips the epilogue, and its LSE keeps the buffer's initial 0 instead "
                         "of -inf (a merge then gives that part weight)",
                         LseBug::empty_row_zero, {1, 1, 2, 1},
                         "a row that sees no key, without padding (not declared): bottom-right with T_q = 2 > T_k = 1, "
                         "where query 0 sees nothing",
                         {"lse-oracle"}));
  z.push_back(merge_mutant("split-kv-merge-no-max",
                           "split-KV decode (splits of 16 keys): the partials merged as sum exp(lse_p) O_p / sum "
                           "exp(lse_p), without subtracting the largest lse_p: exp overflows (inf/inf = NaN) once a "
                           "split's LSE passes ~88.7 in float",
                           MergeBug::no_max, {.lse = true},
                           "only a decode step over more than one split merges: one query over 17 keys, bottom-right, "
                           "D = 1, with a score above ~88.7",
                           {"oracle-agreement", "lse-oracle", "decode-consistency"}));
  z.push_back(merge_mutant("split-kv-merge-by-l",
                           "split-KV decode (splits of 16 keys): the partials weighted by their sums l_p (relative to "
                           "each split's own max) instead of exp(lse_p): splits with different maxes get the wrong share",
                           MergeBug::by_l, {.lse = true},
                           "one query over 17 keys (two splits), bottom-right, D = 1, whose two splits' maxes differ",
                           {"oracle-agreement", "lse-oracle", "decode-consistency"}));
  z.push_back(merge_mutant("sink-per-split",
                           "split-KV decode with sinks (splits of 16 keys): every split's softmax takes the sink in as "
                           "its own column before the merge, so the sink is counted once per split",
                           MergeBug::sink_per_split, {.lse = true, .sinks = true},
                           "one query over 17 keys (two splits), bottom-right, D = 1, with a sink",
                           {"sink-mass", "decode-consistency"}));
  z.push_back(Mutant{
      .impl = head_impl("mutant:row-max-sentinel",
                        "the row max starts at -5e4 instead of -inf: rows whose scores all lie below it come out "
                        "as zero rows",
                        [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
                          return sentinel_max(Q, K, V, c);
                        },
                        abi3_capabilities({.lse = true})),
      .bug = "the running max starts at a finite -5e4 instead of -inf: a row whose visible scores all lie ~88.7 "
             "below it underflows to l = 0 and comes out as a silent zero row (LSE -inf)",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query, one key with a score below -5e4 - 104 (float's exp underflow)",
      .killed_by = {"row-stochastic", "convex-hull", "lse-oracle"},
  });
  return z;
}

}  // namespace attncheck::zoo
