// The log-sum-exp laws: lse-oracle (the LSE agrees with the float64 oracle, exactly -inf on rows that see no
// key), output-lse-consistency (the output is Σ_j exp(s_j - lse)·v_j of the implementation's own LSE) and
// split-kv-merge (calls over a partition of the keys, merged by their LSEs, equal the call over all keys).
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace lse_law {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

std::string needs_lse(const GenConfig& g) {
  return g.caps.declares(Feature::lse)
             ? ""
             : "needs the log-sum-exp of every row (ATTNCHECK_CAP3_LSE), which this implementation does not return";
}

rc::Gen<LawCase> gen_with_lse(const GenConfig& cfg) {
  ProblemOptions po = outputs_only();
  po.want_lse = true;
  return gen_problem(cfg, po);
}

const Tensor<double>& lse_of(const Implementation& impl, const Outcome& o) {
  if (!o.lse)
    throw ImplementationError(ImplementationError::Kind::protocol,
                              impl.name() + ": returned no log-sum-exp although it declares that it returns it");
  return *o.lse;
}

const char* kOracleWhy =
    "A kernel that returns the log-sum-exp of each row (FlashAttention's softmax_lse, FlashInfer's, the LSE a "
    "split-KV or cascade merge reads) must return lse_i = log(sum over visible keys j of exp(s_ij), plus exp(sink)), "
    "natural log, over the scores after every modifier (scale, softcap, ALiBi), and exactly -inf for a row that "
    "sees no key and has no sink. A base-2 LSE, the LSE of the unscaled scores, log l without the running max, or "
    "the sink left out breaks it. Tolerance (attention/src/tolerance.cpp, step 6): every exponent off by at most "
    "2 Delta_i (the score error of step 1) moves the LSE by at most that, the sum's rounding by gamma_T, exp's by "
    "4u_a, forming m + log l in the accumulation type by the lambda of step 2b: |delta lse| <= log(1 + rho_i), "
    "doubled, plus u_a |lse|; or FlashAttention's rule, 2 x the reference's own error plus u_a max(1, |lse|), "
    "whichever is larger.";

std::optional<Violation> check_oracle(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Outcome o = call(impl, p);
  const OracleRun r = run_oracle(p);
  const Tensor<double> tol = lse_bound(p, r);
  auto v = compare("lse-oracle", "lse", r.lse, lse_of(impl, o), &tol, {});
  if (v && std::isinf(r.lse(v->worst_index[0], v->worst_index[1], v->worst_index[2], 0)))
    v->message += " (query " + std::to_string(v->worst_index[2]) +
                  " sees no key and has no sink: its log-sum-exp is exactly -inf)";
  return v;
}

const char* kConsistencyWhy =
    "The output and the LSE describe the same softmax: output_i = sum_j exp(s_ij - lse_i) v_j for the "
    "implementation's own lse_i (what a split-KV merge or a backward that recomputes the weights from the LSE "
    "relies on). With lse_i = L_i + delta_i (L_i the oracle's), that sum is exp(-delta_i) times the oracle's "
    "output, which the law computes in float64 and compares with the implementation's output. Tolerance: the "
    "output's derived oracle bound (oracle-agreement's) plus |oracle output| (exp(t_i) - 1) for the LSE's own "
    "bound t_i (lse-oracle's): an LSE or an output normalised by a different sum (the sink in one and not in the "
    "other, a base-2 LSE) breaks it. Rows that see no key (and have no sink) must have output 0 and LSE -inf.";

std::optional<Violation> check_consistency(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Outcome o = call(impl, p);
  const Tensor<double>& lse = lse_of(impl, o);
  const OracleRun r = run_oracle(p);
  const Tensor<double> tl = lse_bound(p, r);
  const Shape s = p.output_shape();  // [B,H,T_q,D_v]
  Tensor<double> want(s), tol(s);
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index i = 0; i < s.T; ++i) {
        const double L = r.lse(b, h, i, 0), mine = lse(b, h, i, 0);
        // exp(L - mine): 0 when the row has no term (both -inf: the output must then be 0, exactly as the oracle's).
        const double f = std::isinf(L) && std::isinf(mine) && L < 0 && mine < 0 ? 1.0 : std::exp(L - mine);
        for (Index d = 0; d < s.D; ++d) {
          const double o_abs = std::abs(r.out(b, h, i, d));  // 0 times an unresolved (inf) LSE bound is 0
          // An output of exactly 0 stays 0 whatever the factor (inf·0 is no expectation).
          want(b, h, i, d) = o_abs > 0 ? f * r.out(b, h, i, d) : 0.0;
          tol(b, h, i, d) = r.tol_out(b, h, i, d) + (o_abs > 0 ? o_abs * std::expm1(tl(b, h, i, 0)) * std::max(f, 1.0) : 0.0);
          // An LSE whose own bound lets it differ from the oracle's by more than exp can span (past e^709: bfloat16
          // at |lse| ~ 6e5) predicts nothing of the output. The row is left to oracle-agreement (its output within
          // the hull). Where the bound is smaller, an LSE that far off is a violation (exp(L - mine) = inf expected).
          if (!std::isfinite(tl(b, h, i, 0)) || tl(b, h, i, 0) > 709) {
            want(b, h, i, d) = r.out(b, h, i, d);
            tol(b, h, i, d) = std::numeric_limits<double>::infinity();
          }
        }
      }
  const auto seen = seen_rows(p);
  auto v = compare("output-lse-consistency", "output", want, o.output, &tol, seen);
  if (v) {
    const auto& w = v->worst_index;
    v->message += " (expected: sum_j exp(s_j - lse) v_j for the implementation's lse[" + std::to_string(w[0]) + "," +
                  std::to_string(w[1]) + "," + std::to_string(w[2]) + "] = " + num(lse(w[0], w[1], w[2], 0)) +
                  ", where the oracle's is " + num(r.lse(w[0], w[1], w[2], 0)) + ")";
  }
  return v;
}

// ---- split-kv-merge -------------------------------------------------------------------------------------------

const char* kMergeWhy =
    "Flash-decoding's split-KV, cascade attention over a shared prefix and ring attention call attention over "
    "parts of the keys and merge the partial results by their LSEs: L = log sum_p exp(L_p) (and the sink, "
    "exp(sigma), once), O = sum_p exp(L_p - L) O_p. Every correct kernel's parts merge to its call over all keys. "
    "The law takes the last queries of a square causal case (a decode query, or a prefill chunk when the "
    "implementation declares causal = false), cuts the keys it sees into 2 to 4 contiguous parts at tile-aligned "
    "(multiples of 16) or ragged points, calls each part alone (the parts before the last with every key visible: "
    "a decode query bottom-right, a chunk with causal = false; the last, which holds the diagonal, bottom-right "
    "causal; no sink, which the merge adds once), corrects each part's LSE for ALiBi (a part call's positions sit "
    "T - end later, so its scores are slope (T - end) higher: its LSE, not its output), merges them in float64, "
    "and compares with the full call. Tolerance: the full call's derived output bound, plus for each part "
    "c_p (t_p + (|O_p| + t_p) r_p) with c_p = exp(L_p - L), t_p the part's output bound and r_p = "
    "exp(l_p + max_q l_q) - 1 from the parts' LSE bounds l_p (L is 1-Lipschitz in each L_p), plus the oracle's "
    "own difference between merged and full; the LSE within the largest part bound plus the full call's. An LSE "
    "in base 2, of the unscaled scores, or without its max, or a part that drops or re-counts positions, breaks "
    "it. No window (a window's positions do not survive the cut).";

std::string merge_not_applicable(const GenConfig& g) {
  if (std::string why = needs_lse(g); !why.empty()) return why;
  if (std::string why = needs_cached_calls(g); !why.empty()) return why;
  return "";
}

rc::Gen<LawCase> gen_merge(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    ProblemOptions po = outputs_only().no_masks_beyond_causal();  // the parts sit at other key positions
    po.want_lse = true;
    po.allow_cross_lengths = false;  // the parts are the cross-length calls
    po.allow.remove({Feature::window});
    LawCase c = *gen_problem(cfg, po);
    c.params["parts"] = double(*rc::gen::inRange<Index>(2, 5));
    c.params["split_seed"] = double(*rc::gen::noShrink(rc::gen::inRange<Index>(0, kMaxSeed)));
    // The queries merged: the last one (decode), or, with causal = false declared, a chunk of the last n.
    c.params["chunk"] = cfg.caps.declares(Feature::bidirectional) ? double(*rc::gen::inRange<Index>(1, 9)) : 1.0;
    return c;
  });
}

// Up to parts - 1 split points in [1, limit], ascending: tile-aligned (multiples of 16) first where there are
// any, the rest ragged, all from the seed.
std::vector<Index> split_points(Index limit, Index parts, Index seed) {
  std::vector<Index> cuts;
  if (limit < 1) return cuts;
  std::mt19937_64 rng{std::uint64_t(seed)};
  std::vector<Index> aligned;
  for (Index t = 16; t <= limit; t += 16) aligned.push_back(t);
  for (Index n = 0; n + 1 < parts; ++n) {
    const bool tile = !aligned.empty() && rng() % 2 == 0;
    const Index cut = tile ? aligned[std::size_t(rng() % aligned.size())] : 1 + Index(rng() % std::uint64_t(limit));
    if (std::find(cuts.begin(), cuts.end(), cut) == cuts.end()) cuts.push_back(cut);
  }
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

// Queries [c0, T) of p alone over keys [a, e): every key visible (bottom-right for one query, causal = false for
// more) unless `last`, where the part ends at T and holds the diagonal (bottom-right causal). No sink.
Problem part_call(const Problem& p, Index c0, Index a, Index e, bool last) {
  Problem r = p;
  r.q = rows_of(p.q, c0, p.q.shape().T);
  r.k = rows_of(p.k, a, e);
  r.v = rows_of(p.v, a, e);
  r.alignment = CausalAlignment::BottomRight;
  r.causal = last || r.q.shape().T == 1;
  for (Index& len : r.key_lengths) len = std::clamp<Index>(len - a, 0, e - a);
  r.sinks.clear();
  return r;
}

struct Merged {
  Tensor<double> out{Shape{}}, lse{Shape{}};
};

// The parts' outputs and LSEs merged (and the sink added once), with each part's LSE corrected for ALiBi.
Merged merge(const Problem& p, const std::vector<Problem>& calls, const std::vector<Index>& ends,
             const std::vector<const Tensor<double>*>& outs, const std::vector<const Tensor<double>*>& lses) {
  const Shape s = calls[0].output_shape();  // [B,H,T_q,D_v]
  const Index T = p.q.shape().T;
  Merged m{Tensor<double>(s), Tensor<double>({s.B, s.H, s.T, 1})};
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) {
      const double slope = p.alibi_slopes.empty() ? 0.0 : p.alibi_slopes[std::size_t(h)];
      const double sink = p.sinks.empty() ? kNegInf : p.sinks[std::size_t(h)];
      for (Index i = 0; i < s.T; ++i) {
        std::vector<double> L;
        for (std::size_t n = 0; n < calls.size(); ++n)
          L.push_back((*lses[n])(b, h, i, 0) - slope * double(T - ends[n]));
        double top = sink;
        for (const double x : L) top = std::max(top, x);
        if (top == kNegInf) {
          m.lse(b, h, i, 0) = kNegInf;
          continue;  // no term at all: output 0
        }
        double sum = std::exp(sink - top);
        for (const double x : L) sum += std::exp(x - top);
        const double total = top + std::log(sum);
        m.lse(b, h, i, 0) = total;
        for (std::size_t n = 0; n < calls.size(); ++n) {
          const double w = std::exp(L[n] - total);
          if (w == 0) continue;
          for (Index d = 0; d < s.D; ++d) m.out(b, h, i, d) += w * (*outs[n])(b, h, i, d);
        }
      }
    }
  return m;
}

std::optional<Violation> check_merge(const Implementation& impl, const LawCase& c) {
  const char* law = "split-kv-merge";
  const Problem& p = c.problem;
  const Index T = p.q.shape().T;
  const Index parts = int_param(c, law, "parts", 2, 4), seed = int_param(c, law, "split_seed", 0, kMaxSeed);
  const Index chunk = std::min<Index>(T, int_param(c, law, "chunk", 1, 8));
  const Index c0 = T - chunk;
  // Split points: every key before the chunk's first query is visible to every query of the chunk.
  const std::vector<Index> cuts = split_points(std::min(c0 + 1, T - 1), parts, seed);
  if (cuts.empty()) return std::nullopt;  // T = 1: one key, nothing to split
  std::vector<Index> begins{0}, ends;
  for (const Index x : cuts) {
    ends.push_back(x);
    begins.push_back(x);
  }
  ends.push_back(T);
  std::vector<Problem> calls;
  for (std::size_t n = 0; n < begins.size(); ++n) calls.push_back(part_call(p, c0, begins[n], ends[n], n + 1 == begins.size()));
  // A chunk's parts may have fewer keys than queries (T_q > T_k): only for an implementation that accepts them.
  for (const Problem& q : calls)
    if (!needs_outside(q, impl.capabilities()).empty()) return std::nullopt;

  const Outcome full = call(impl, p);
  const Tensor<double>& full_lse = lse_of(impl, full);
  std::vector<Outcome> got;
  std::vector<OracleRun> oracles;
  std::vector<const Tensor<double>*> outs, lses, o_outs, o_lses;
  for (const Problem& q : calls) {
    got.push_back(call(impl, q));
    oracles.push_back(run_oracle(q));
  }
  for (std::size_t n = 0; n < calls.size(); ++n) {
    outs.push_back(&got[n].output);
    lses.push_back(&lse_of(impl, got[n]));
    o_outs.push_back(&oracles[n].out);
    o_lses.push_back(&oracles[n].lse);
  }
  const Merged mine = merge(p, calls, ends, outs, lses), exact = merge(p, calls, ends, o_outs, o_lses);
  const OracleRun whole = run_oracle(p);
  const Shape s = calls[0].output_shape();
  Tensor<double> want = rows_of(full.output, c0, T), tol(s), want_lse({s.B, s.H, s.T, 1}), tol_lse({s.B, s.H, s.T, 1});
  const Tensor<double> whole_out = rows_of(whole.out, c0, T), whole_tol = rows_of(whole.tol_out, c0, T);
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index i = 0; i < s.T; ++i) {
        const double L = exact.lse(b, h, i, 0);
        double l_max = 0;
        for (const OracleRun& o : oracles) l_max = std::max(l_max, o.tol_lse(b, h, i, 0));
        want_lse(b, h, i, 0) = full_lse(b, h, c0 + i, 0);
        tol_lse(b, h, i, 0) = std::isinf(L) ? 0.0
                                             : l_max + whole.tol_lse(b, h, c0 + i, 0) +
                                                   std::abs(L - whole.lse(b, h, c0 + i, 0));
        for (Index d = 0; d < s.D; ++d) {
          double t = whole_tol(b, h, i, d) + std::abs(exact.out(b, h, i, d) - whole_out(b, h, i, d));
          for (std::size_t n = 0; n < calls.size(); ++n) {
            const double slope = p.alibi_slopes.empty() ? 0.0 : p.alibi_slopes[std::size_t(h)];
            const double Lp = oracles[n].lse(b, h, i, 0) - slope * double(T - ends[n]);
            if (std::isinf(L) || std::isinf(Lp)) continue;
            const double cp = std::exp(Lp - L), tp = oracles[n].tol_out(b, h, i, d);
            if (cp == 0) continue;  // a part with no weight in the merge adds nothing (and no 0·inf)
            const double rp = std::expm1(oracles[n].tol_lse(b, h, i, 0) + l_max);
            t += cp * tp + (rp > 0 ? cp * (std::abs(oracles[n].out(b, h, i, d)) + tp) * rp : 0.0);
          }
          tol(b, h, i, d) = t;
        }
      }
  std::string where = "queries " + std::to_string(c0) + ".." + std::to_string(T - 1) + " over keys split at";
  for (const Index x : cuts) where += " " + std::to_string(x);
  const auto seen = seen_rows(p, c0);
  if (auto v = compare(law, "output", want, mine.out, &tol, seen)) {
    v->message += " (the parts merged by their LSEs against the call over all keys; " + where + ")";
    v->worst_index[2] += c0;
    v->expected.reset();
    v->actual.reset();
    v->tolerances.reset();
    return v;
  }
  if (auto v = compare(law, "lse", want_lse, mine.lse, &tol_lse, {})) {
    v->message += " (the merged LSE against the call over all keys; " + where + ")";
    v->worst_index[2] += c0;
    v->expected.reset();
    v->actual.reset();
    v->tolerances.reset();
    return v;
  }
  return std::nullopt;
}

}  // namespace lse_law
}  // namespace

Law lse_oracle() {
  using namespace lse_law;
  return {"lse-oracle", "the log-sum-exp of every row agrees with the float64 oracle; -inf on rows that see no key",
          kOracleWhy,
          LawDoc{"22",
                 "the log-sum-exp of every row agrees with the float64 oracle; exactly −∞ on a row that sees no key (and has no sink)",
                 "log(1 + ρ), doubled, + u_a|lse| (`tolerance.cpp` step 6)"},
          needs_lse, gen_with_lse, check_oracle, 0};
}

Law output_lse_consistency() {
  using namespace lse_law;
  return {"output-lse-consistency", "the output is sum_j exp(s_j - lse) v_j for the implementation's own LSE",
          kConsistencyWhy,
          LawDoc{"23", "the output equals Σ_j exp(s_j − lse)·v_j for the implementation's own LSE",
                 "output bound + |o|·(e^t − 1), t the LSE bound"},
          needs_lse, gen_with_lse, check_consistency, 0};
}

Law split_kv_merge() {
  using namespace lse_law;
  return {"split-kv-merge", "calls over 2-4 parts of the keys, merged by their LSEs, equal the call over all keys",
          kMergeWhy,
          LawDoc{"24",
                 "calls over 2–4 parts of the keys (tile-aligned or ragged cuts), merged by their LSEs (the sink added once, ALiBi corrected), equal the call over all keys",
                 "full call's bound + Σ_p c_p(t_p + (|O_p| + t_p)r_p) + the oracle's own difference"},
          merge_not_applicable, gen_merge, check_merge, 0};
}

}  // namespace attncheck::law_kit
