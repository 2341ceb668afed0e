// The laws every correct scaled causal attention obeys. Each law is a generator of cases and a check of one
// case; the check states the law, computes, and compares, with every tolerance derived from the dtype, T, D
// and the inputs (see attention/src/tolerance.cpp for the shared derivation).
#include "attncheck/law.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>

#include "attncheck/generators.hpp"
#include "attncheck/tolerance.hpp"

namespace attncheck {
namespace {

constexpr double kSafety = 2.0;  // multiplies first-order bounds (see tolerance.cpp)

// ---------------------------------------------------------------------------------------------------------
// Helpers shared by the laws.

double scale_of(const Problem& p) { return p.scale ? *p.scale : 1 / std::sqrt(double(p.q.shape().D)); }

Index last_key(const Problem& p, Index i) {
  return last_visible_key(i, p.q.shape().T, p.k.shape().T, p.alignment);
}
bool visible(const Problem& p, Index i, Index j) { return j <= last_key(p, i); }
Index n_visible(const Problem& p, Index i) {
  return std::clamp<Index>(last_key(p, i) + 1, 0, p.k.shape().T);
}

std::string idx(std::initializer_list<Index> v) {
  std::string s = "[";
  for (auto it = v.begin(); it != v.end(); ++it) s += (it == v.begin() ? "" : ",") + std::to_string(*it);
  return s + "]";
}

std::string num(double x) {
  std::ostringstream o;
  o.precision(9);
  o << x;
  return o.str();
}

// Bitwise equality of two values widened from the same dtype; any NaN equals any NaN.
bool same_bits(double a, double b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// Calls the implementation and insists on weights when the law needs them and the implementation says it
// returns them.
Outcome call(const Implementation& impl, const Problem& p) {
  Outcome o = impl.forward(p);
  check_outcome_shape(p, o, impl.name());
  if (p.want_weights && !o.weights)
    throw ImplementationError(ImplementationError::Kind::protocol,
                              impl.name() + ": returned no weights although it declares that it returns them");
  return o;
}

std::string needs_weights(const Capabilities& c) {
  return c.returns_weights ? "" : "needs the attention weights, which this implementation does not return";
}

// The float64 oracle on the problem's (already rounded) inputs, with the derived tolerance per element.
struct OracleRun {
  Tensor<double> out{Shape{}}, w{Shape{}}, tol_out{Shape{}}, tol_w{Shape{}};
};

OracleRun run_oracle(const Problem& p) {
  OracleRun r;
  const double scale = scale_of(p);
  r.out = attention<double>(p.q, p.k, p.v, AttentionOptions{.scale = scale, .alignment = p.alignment}, &r.w);
  r.tol_out = Tensor<double>(r.out.shape());
  r.tol_w = Tensor<double>(r.w.shape());
  const Shape& s = p.q.shape();
  const BoolMask mask = BoolMask::causal(s.T, p.k.shape().T, p.alignment);
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) {
      const HeadTolerance t = head_tolerance(p.dtype, p.q.head(b, h), p.k.head(b, h), p.v.head(b, h), mask, scale,
                                             r.out.head(b, h), r.w.head(b, h), kSafety);
      r.tol_out.head(b, h) = t.output;
      r.tol_w.head(b, h) = t.weights;
    }
  return r;
}

// Compares actual with expected element by element: first any non-finite value where the expected one is
// finite (NaN and Inf come before error metrics), then the largest |actual - expected| / tol. `tol` null
// means exact (bitwise). Only entries for which include(b,h,i,j) holds are compared.
using Include = std::function<bool(Index, Index, Index, Index)>;

std::optional<Violation> compare(const std::string& what, const std::string& quantity, const Tensor<double>& expected,
                                 const Tensor<double>& actual, const Tensor<double>* tol, const Include& include) {
  const Shape& s = expected.shape();
  std::optional<std::array<Index, 4>> worst;
  double worst_ratio = 0, worst_diff = 0, worst_tol = 0;
  bool nonfinite = false;
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index i = 0; i < s.T; ++i)
        for (Index j = 0; j < s.D; ++j) {
          if (include && !include(b, h, i, j)) continue;
          const double e = expected(b, h, i, j), a = actual(b, h, i, j);
          if (!tol) {
            if (same_bits(e, a)) continue;
            const double diff = std::isfinite(a - e) ? std::abs(a - e) : std::numeric_limits<double>::infinity();
            if (!worst || diff > worst_diff || std::isnan(a)) {
              worst = {b, h, i, j};
              worst_diff = std::isnan(a - e) ? std::numeric_limits<double>::quiet_NaN() : diff;
              if (std::isnan(a)) goto done;
            }
            continue;
          }
          if (!std::isfinite(e) && same_bits(e, a)) continue;  // the same Inf or NaN: nothing to measure
          if (!std::isfinite(e) || !std::isfinite(a)) {
            worst = {b, h, i, j};
            worst_diff = std::abs(a - e);
            worst_tol = (*tol)(b, h, i, j);
            nonfinite = true;
            goto done;
          }
          const double t = (*tol)(b, h, i, j), diff = std::abs(a - e);
          if (diff <= t) continue;
          const double ratio = t > 0 ? diff / t : std::numeric_limits<double>::infinity();
          if (!worst || ratio > worst_ratio) {
            worst = {b, h, i, j};
            worst_ratio = ratio;
            worst_diff = diff;
            worst_tol = t;
          }
        }
done:
  if (!worst) return std::nullopt;
  const auto [b, h, i, j] = *worst;
  Violation v;
  v.quantity = quantity;
  v.worst_index = {b, h, i, j};
  v.magnitude = worst_diff;
  v.tolerance = tol ? worst_tol : 0;
  v.expected = expected;
  v.actual = actual;
  if (tol) {
    v.tolerances = *tol;  // for the report's error map; a cell the law does not compare may differ by anything
    for (Index b2 = 0; include && b2 < s.B; ++b2)
      for (Index h2 = 0; h2 < s.H; ++h2)
        for (Index i2 = 0; i2 < s.T; ++i2)
          for (Index j2 = 0; j2 < s.D; ++j2)
            if (!include(b2, h2, i2, j2)) (*v.tolerances)(b2, h2, i2, j2) = std::numeric_limits<double>::infinity();
  }
  const std::string at = quantity + idx({b, h, i, j});
  if (!tol)
    v.message = what + ": " + at + " is " + num(actual(b, h, i, j)) + " but was " + num(expected(b, h, i, j)) +
                " (must be bit-identical)";
  else if (nonfinite)
    v.message = what + ": " + at + " is " + num(actual(b, h, i, j)) + " where " + num(expected(b, h, i, j)) +
                " is expected";
  else
    v.message = what + ": " + at + " is " + num(actual(b, h, i, j)) + " but should be " +
                num(expected(b, h, i, j)) + " (off by " + num(worst_diff) + ", tolerance " + num(worst_tol) + ")";
  return v;
}

// A copy of p with rows [from, T) of a tensor replaced by the same rows of `other`.
void replace_rows(Tensor<double>& t, const Tensor<double>& other, Index from) {
  const Shape& s = t.shape();
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index i = std::max<Index>(from, 0); i < s.T; ++i) t.head(b, h).row(i) = other.head(b, h).row(i);
}

// Rows [0, n) of every head.
Tensor<double> first_rows(const Tensor<double>& t, Index n) {
  const Shape& s = t.shape();
  Tensor<double> r({s.B, s.H, n, s.D});
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) r.head(b, h) = t.head(b, h).topRows(n);
  return r;
}

Tensor<double> slice(const Tensor<double>& t, Index b, Index h) {
  const Shape& s = t.shape();
  Tensor<double> r({1, 1, s.T, s.D});
  r.head(0, 0) = t.head(b, h);
  return r;
}

// Draws a position t to perturb after, and tensors to put at every position after it: ordinary values or
// extreme magnitudes (a quarter of the dtype's largest finite value, so scores overflow to Inf).
struct Perturbation {
  Index t = 0;
  Problem variant;
};

rc::Gen<double> gen_replacement_magnitude(DType dtype) {
  return rc::gen::join(weighted_choice<rc::Gen<double>>({{1, gen_magnitude()}, {1, rc::gen::just(max_finite(dtype) / 4)}}));
}

// The queries after t and the keys after the last one query t can see are "the future of t".
Problem perturb_future(const Problem& p, Index t, const Tensor<double>& q2, const Tensor<double>& k2,
                       const Tensor<double>& v2) {
  Problem v = p;
  replace_rows(v.q, q2, t + 1);
  replace_rows(v.k, k2, last_key(p, t) + 1);
  replace_rows(v.v, v2, last_key(p, t) + 1);
  return v;
}

// Problem options for the laws that read only outputs.
ProblemOptions outputs_only() {
  ProblemOptions po;
  po.want_weights = false;
  return po;
}

rc::Gen<LawCase> gen_outputs_only(const GenConfig& cfg) { return gen_problem(cfg, outputs_only()); }

// ---------------------------------------------------------------------------------------------------------
// 1. Row-stochasticity.

const char* kRowStochasticWhy =
    "Softmax turns each query's scores into a probability distribution over the keys it can see: every weight "
    "is finite and >= 0, and a row with at least one visible key sums to 1. A mask applied after softmax, "
    "softmax over the query axis, or an overflow to NaN breaks it. Tolerance on |sum - 1|: the T_k-term sum "
    "and the division give gamma_{2T_k}(u_a) + 2u_a in the accumulation type (2T_k covers an online softmax's "
    "rescalings), rounding each weight to the dtype adds u_s in all plus the dtype's subnormal floor per weight, "
    "and the check's own double sum adds gamma_{T_k}(2^-53); the whole is doubled.";

std::optional<Violation> check_row_stochastic(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Outcome o = call(impl, p);
  const Tensor<double>& w = *o.weights;
  const Shape& s = w.shape();
  const double u_a = accumulation_roundoff(p.dtype), u_s = unit_roundoff(p.dtype);
  const double tol = kSafety * (gamma(2 * s.D, u_a) + 2 * u_a + u_s + double(s.D) * storage_floor(p.dtype)) +
                     gamma(s.D, std::ldexp(1.0, -53));
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index i = 0; i < s.T; ++i) {
        if (n_visible(p, i) == 0) continue;
        double sum = 0;
        for (Index j = 0; j < s.D; ++j) {
          const double x = w(b, h, i, j);
          if (!std::isfinite(x) || x < 0) {
            Violation v;
            v.quantity = "weights";
            v.worst_index = {b, h, i, j};
            v.magnitude = x;
            v.message = "row-stochastic: weights" + idx({b, h, i, j}) + " is " + num(x) +
                        (std::isfinite(x) ? " (negative)" : " (not finite)");
            v.weights = w;
            v.actual = w;
            return v;
          }
          sum += x;
        }
        if (std::abs(sum - 1) > tol) {
          Violation v;
          v.quantity = "weights";
          v.worst_index = {b, h, i};
          v.magnitude = std::abs(sum - 1);
          v.tolerance = tol;
          v.message = "row-stochastic: row " + idx({b, h, i}) + " of the weights sums to " + num(sum) +
                      ", not 1 (off by " + num(std::abs(sum - 1)) + ", tolerance " + num(tol) + ")";
          v.weights = w;
          v.actual = w;
          return v;
        }
      }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------------------
// 2. Zero future weight (exact).

const char* kZeroFutureWhy =
    "A query must give no weight at all to a key in its future: exp(-inf) is exactly 0 in every dtype, so a "
    "correct kernel's future weights are exactly 0, not small. A mask filled with 0 or a finite constant, a "
    "reversed or off-by-one mask, or a mask broadcast over the wrong axis leaves weight there. Exact: no "
    "tolerance.";

std::optional<Violation> check_zero_future(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Outcome o = call(impl, p);
  const Tensor<double>& w = *o.weights;
  const Tensor<double> zeros(w.shape());
  auto v = compare("zero-future-weight", "weights", zeros, w, nullptr,
                   [&](Index, Index, Index i, Index j) { return !visible(p, i, j); });
  if (!v) return v;
  const auto& ix = v->worst_index;
  v->message = "zero-future-weight: weights" + idx({ix[0], ix[1], ix[2], ix[3]}) + " = " +
               num(w(ix[0], ix[1], ix[2], ix[3])) + ", but key " + std::to_string(ix[3]) +
               " is in the future of query " + std::to_string(ix[2]) + " and its weight must be exactly 0";
  v->weights = w;
  v->expected.reset();
  return v;
}

// ---------------------------------------------------------------------------------------------------------
// 3. Causal perturbation invariance (exact) and prefix consistency (derived bound).

const char* kPerturbationWhy =
    "Changing tokens after position t (their queries, keys and values, extreme magnitudes included) must not "
    "change any output at positions <= t, bit for bit: a correct kernel never lets a future value into an "
    "earlier row's arithmetic (masked terms add exact zeros and never raise the running max). This is the "
    "behavioural check the source card asks for, stronger than inspecting the mask. Exact: no tolerance.";

rc::Gen<LawCase> gen_perturbation(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    LawCase c = *gen_problem(cfg, outputs_only());
    const Problem& p = c.problem;
    const Shape& s = p.q.shape();
    const Index t = *rc::gen::inRange<Index>(0, std::max<Index>(s.T - 1, 1));
    double m = *gen_replacement_magnitude(cfg.dtype);
    if (!cfg.caps.nonfinite_safe) {
      // A kernel that does not claim select semantics may add its -inf mask to a score that overflowed to
      // +inf (NaN): that is the strict-causality-nonfinite law's business, not this one's. Keep every score
      // of a checked row with a future key finite in the accumulation type: |s| ≤ D·max|q|·m·scale, with
      // the replacement's logistic tail below 12·m.
      // float16 kernels may keep QKᵀ in the dtype, where 65504 is the largest score.
      const double acc_max = cfg.dtype == DType::f64   ? max_finite(DType::f64)
                             : cfg.dtype == DType::f16 ? max_finite(DType::f16)
                                                       : max_finite(DType::f32);
      const double qmax = std::max(1.0, p.q.values().cwiseAbs().maxCoeff());
      const double scale = p.scale ? *p.scale : 1 / std::sqrt(double(s.D));
      m = std::min(m, acc_max / (16 * 12 * double(s.D) * qmax * std::max(scale, 1.0)));
    }
    const auto q2 = *gen_tensor(s, Regime::normal, m, cfg.dtype);
    const auto k2 = *gen_tensor(p.k.shape(), Regime::normal, m, cfg.dtype);
    const auto v2 = *gen_tensor(p.v.shape(), Regime::normal, m, cfg.dtype);
    c.variant = perturb_future(p, t, q2, k2, v2);
    c.params["t"] = double(t);
    c.tags.push_back(m >= 1e6 ? "perturbation=extreme" : "perturbation=ordinary");
    return c;
  });
}

// The shared body of causal-perturbation and strict-causality-nonfinite: the variant changed only the future
// of position t ("params.t"), so every output at positions <= t must be bit-identical.
std::optional<Violation> check_earlier_outputs_unchanged(const char* law, const char* what_changed,
                                                          const Implementation& impl, const LawCase& c) {
  const Index t = Index(c.params.at("t"));
  const Outcome a = call(impl, c.problem), b = call(impl, *c.variant);
  auto v = compare(law, "output", a.output, b.output, nullptr, [t](Index, Index, Index i, Index) { return i <= t; });
  if (v) {
    v->message += "; only positions after " + std::to_string(t) + " were " + what_changed;
    v->weights = b.weights;
  }
  return v;
}

std::optional<Violation> check_perturbation(const Implementation& impl, const LawCase& c) {
  return check_earlier_outputs_unchanged("causal-perturbation", "changed", impl, c);
}

const char* kPrefixWhy =
    "Attention over the first t+1 positions equals the first t+1 rows of attention over all T: a causal "
    "model's output at a position cannot depend on how long the sequence is afterwards (what KV-cache "
    "decoding relies on). Changing T may change blocking and summation order, so this compares within the sum "
    "of both results' derived oracle bounds plus the oracle's own difference between the two.";

rc::Gen<LawCase> gen_prefix(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    ProblemOptions po = outputs_only();
    po.allow_cross_lengths = false;
    LawCase c = *gen_problem(cfg, po);
    const Index T = c.problem.q.shape().T;
    const Index t = *rc::gen::inRange<Index>(0, std::max<Index>(T - 1, 1));
    Problem pre = c.problem;
    pre.q = first_rows(c.problem.q, t + 1);
    pre.k = first_rows(c.problem.k, t + 1);
    pre.v = first_rows(c.problem.v, t + 1);
    c.variant = pre;
    c.params["t"] = double(t);
    return c;
  });
}

std::optional<Violation> check_prefix(const Implementation& impl, const LawCase& c) {
  const Index n = c.variant->q.shape().T;
  const Outcome full = call(impl, c.problem), pre = call(impl, *c.variant);
  const OracleRun of = run_oracle(c.problem), op = run_oracle(*c.variant);
  const Tensor<double> full_rows = first_rows(full.output, n);
  Tensor<double> tol = first_rows(of.tol_out, n);
  tol.values() += op.tol_out.values() + (first_rows(of.out, n).values() - op.out.values()).cwiseAbs();
  auto v = compare("prefix-consistency", "output", full_rows, pre.output, &tol, {});
  if (v) v->message += " (attention over the first " + std::to_string(n) + " positions vs. the first rows of all)";
  return v;
}

// ---------------------------------------------------------------------------------------------------------
// 4. Scale-variance stability.

// The statistical test. x = q·k/√D for q, k with i.i.d. N(0,1) entries has E x² = 1 and
// E x⁴ = 3 + 6/D ≤ 9, so Var(x²) ≤ 8. The estimate of Var(x) is the median of G group means of x², each over
// n samples. Chebyshev: a group mean strays more than ε from 1 with probability p ≤ 8/(n ε²). The median
// strays only if at least G/2 groups do, which by Hoeffding has probability ≤ exp(-2G(1/2 - p)²).
// With n = 256, ε = 0.5: p ≤ 0.125, and G = 60 gives ≤ exp(-2·60·0.375²) = exp(-16.875) = 4.7e-8 per case; the
// law runs at most 20 cases, so a correct kernel is falsely flagged with probability ≤ 9.4e-7 < 1e-6 per run.
constexpr int kGroups = 60, kGroupSize = 256, kScaleCases = 20;
constexpr double kEps = 0.5;

// The kGroups group means of x, sorted.
std::vector<double> sorted_group_means(const std::vector<double>& x) {
  std::vector<double> means(kGroups);
  for (int g = 0; g < kGroups; ++g) {
    double s = 0;
    for (int i = 0; i < kGroupSize; ++i) s += x[std::size_t(g * kGroupSize + i)];
    means[std::size_t(g)] = s / kGroupSize;
  }
  std::sort(means.begin(), means.end());
  return means;
}

double median_of_means(const std::vector<double>& x) { return sorted_group_means(x)[kGroups / 2]; }

// The report's band around the median of means: the order statistics m₍k₎ ≤ median ≤ m₍G+1-k₎ of the G group
// means cover the group mean's true median with probability 1 - 2·P(Bin(G, 1/2) < k), whatever the
// distribution. k is the largest with P(Bin(G, 1/2) < k) ≤ 2.5%, so the band is an at least 95% confidence
// interval (G = 60: k = 22, coverage 97.3%).
VariancePoint variance_point(double D, const std::vector<double>& x) {
  const std::vector<double> m = sorted_group_means(x);
  double below = 0, term = std::ldexp(1.0, -kGroups);  // P(Bin = 0), then P(Bin < k) accumulated
  int k = 0;
  while (below + term <= 0.025) {
    below += term;
    term *= double(kGroups - k) / double(k + 1);  // C(G, k+1) / C(G, k)
    ++k;
  }
  return VariancePoint{D, m[kGroups / 2], m[std::size_t(k - 1)], m[std::size_t(kGroups - k)]};
}

// One T=2 head per sample, key 0 = 0 so the weights of query 1 are (1, e^s)/(1 + e^s) and the scaled score is
// s = log(w₁₁ / w₁₀), read back from the implementation's own weights. Returns (scaled s², raw (q·k)²).
struct ScoreSamples {
  std::vector<double> scaled_sq, raw_sq;
};

// With T_q == T_k both alignments give the same mask: ask in one the implementation accepts.
CausalAlignment square_alignment(const Capabilities& caps) {
  return caps.supports(kDefaultAlignment) || caps.alignments.empty() ? kDefaultAlignment : caps.alignments.front();
}

ScoreSamples sample_scores(const Implementation& impl, DType dtype, Index D, std::uint64_t seed) {
  constexpr Index kChunk = 15 * kGroupSize;  // 4 calls of 3840 heads keep memory small at D = 128
  ScoreSamples out;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  const double tiny = std::numeric_limits<double>::min();  // a weight that underflowed to 0: clip, see below
  for (Index done = 0; done < Index(kGroups) * kGroupSize; done += kChunk) {
    Problem p;
    p.dtype = dtype;
    p.alignment = square_alignment(impl.capabilities());
    p.q = Tensor<double>({kChunk, 1, 2, D});
    p.k = Tensor<double>({kChunk, 1, 2, D});
    p.v = Tensor<double>({kChunk, 1, 2, D});
    for (Index b = 0; b < kChunk; ++b)
      for (Index c = 0; c < D; ++c) {
        p.q(b, 0, 1, c) = round_to(dtype, normal(rng));
        p.k(b, 0, 1, c) = round_to(dtype, normal(rng));
      }
    const Outcome o = call(impl, p);
    for (Index b = 0; b < kChunk; ++b) {
      // A weight that underflows to 0 (|s| beyond ~16 at float16; probability < 1e-6 at D = 1) is clipped:
      // that only shrinks s², which errs toward passing and cannot raise a false alarm.
      const double s = std::log(std::max((*o.weights)(b, 0, 1, 1), tiny) / std::max((*o.weights)(b, 0, 1, 0), tiny));
      out.scaled_sq.push_back(s * s);
      const double raw = p.q.head(b, 0).row(1).dot(p.k.head(b, 0).row(1));
      out.raw_sq.push_back(raw * raw);
    }
  }
  return out;
}

const char* kScaleWhy =
    "Scores are divided by sqrt(D) so that, for queries and keys with unit-variance entries, their variance "
    "stays 1 whatever the head dimension; without it softmax saturates as D grows. Deterministic form: a "
    "two-key probe with key 0 = 0 recovers the effective scale as log(w11/w10)/c and must equal 1/sqrt(D) within twice "
    "the weights' derived relative error over c. Statistical form: the median of 60 means of 256 squared "
    "scaled scores must lie within 0.5 of 1 (false alarm <= 9.4e-7 per run, derived from Var(x^2) <= 8, "
    "Chebyshev per group and Hoeffding over groups), while the same statistic on unscaled scores grows with D.";

rc::Gen<LawCase> gen_scale(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    const Index D = *gen_head_dim(cfg);
    LawCase c;
    Problem& p = c.problem;
    p.dtype = cfg.dtype;
    // Probe: one query that sees two keys, k₀ = 0 and k₁ = e₀, with q = c·e₀, c ≈ √D: its scaled scores are 0
    // and c/√D ≈ 1. The smallest such case is one query over two keys, bottom-right aligned; an
    // implementation without cross lengths gets T = 2 and the probe is query 1.
    const bool one_query = cfg.caps.cross_lengths && cfg.caps.supports(CausalAlignment::BottomRight);
    const Index T_q = one_query ? 1 : 2;
    p.alignment = one_query ? CausalAlignment::BottomRight : square_alignment(cfg.caps);
    p.q = Tensor<double>({1, 1, T_q, D});
    p.k = Tensor<double>({1, 1, 2, D});
    p.v = Tensor<double>({1, 1, 2, D});
    p.q(0, 0, T_q - 1, 0) = round_to(cfg.dtype, std::sqrt(double(D)));
    p.k(0, 0, 1, 0) = 1;
    p.v(0, 0, 1, 0) = 1;
    c.params["D"] = double(D);
    // Stored as two exact 32-bit halves: a double cannot hold every 64-bit seed.
    // Not shrunk: another sample is not a simpler case, and each try costs a full sample.
    const auto word = rc::gen::noShrink(rc::gen::inRange<std::uint32_t>(0, std::numeric_limits<std::uint32_t>::max()));
    c.params["sample_seed_hi"] = double(*word);
    c.params["sample_seed_lo"] = double(*word);
    c.params["sweep_max_D"] = double(cfg.max_D);  // how far the report's variance plot sweeps D
    c.tags = shape_tags(p);
    return c;
  });
}

std::uint64_t sample_seed(const LawCase& c) {
  return (std::uint64_t(c.params.at("sample_seed_hi")) << 32) | std::uint64_t(c.params.at("sample_seed_lo"));
}

// For the report's plot: the same statistic over D = 1, 2, 4, ... up to the run's --max-D (cases stored
// before the bound was recorded sweep to 128), so the trend names the mistake: ∝ D when the scale is
// forgotten, ∝ 1/D when it is applied twice.
std::vector<VariancePoint> variance_sweep(const Implementation& impl, DType dtype, const LawCase& c) {
  const auto bound = c.params.find("sweep_max_D");
  const Index max_D = bound != c.params.end() ? Index(bound->second) : 128;
  std::vector<VariancePoint> out;
  for (Index d = 1; d <= max_D; d *= 2)
    out.push_back(variance_point(double(d), sample_scores(impl, dtype, d, sample_seed(c) + std::uint64_t(d)).scaled_sq));
  return out;
}

std::optional<Violation> check_scale(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Index D = p.q.shape().D;
  const double want = 1 / std::sqrt(double(D));
  const Index r = p.q.shape().T - 1;  // the probing query
  const double cq = p.q(0, 0, r, 0);

  // Deterministic form.
  const Outcome o = call(impl, p);
  const Tensor<double>& w = *o.weights;
  const OracleRun orc = run_oracle(p);
  const double w10 = w(0, 0, r, 0), w11 = w(0, 0, r, 1);
  // |log w̃ - log w| ≤ e/(1 - e) for a relative error e, so the ratio's log is off by at most the sum of both.
  const double r10 = orc.tol_w(0, 0, r, 0) / orc.w(0, 0, r, 0), r11 = orc.tol_w(0, 0, r, 1) / orc.w(0, 0, r, 1);
  const double tol = (r10 / (1 - r10) + r11 / (1 - r11)) / cq;
  const double got = std::log(w11 / w10) / cq;
  if (!(std::abs(got - want) <= tol)) {
    Violation v;
    v.quantity = "scale";
    v.worst_index = {0, 0, r, 1};
    v.magnitude = std::abs(got - want);
    v.tolerance = tol;
    v.message = "scale-variance: the effective scale recovered from a two-key probe at D=" + std::to_string(D) +
                " is " + num(got) + ", not 1/sqrt(D) = " + num(want);
    v.weights = w;
    v.expected = orc.w;
    v.actual = w;
    v.series = variance_sweep(impl, p.dtype, c);
    return v;
  }

  // Statistical form.
  const std::uint64_t seed = sample_seed(c);
  const ScoreSamples s = sample_scores(impl, p.dtype, D, seed);
  const double var = median_of_means(s.scaled_sq);
  const double raw = median_of_means(s.raw_sq);
  // Negative control: the unscaled scores' variance is D. If the statistic could not see that, the test
  // would be blind, which is a bug in attncheck, not in the implementation.
  if (std::abs(raw / double(D) - 1) > kEps)
    throw std::logic_error("scale-variance: unscaled score variance " + num(raw) + " at D=" + std::to_string(D) +
                           " is not close to D; the statistic is broken");
  if (std::abs(var - 1) > kEps) {
    Violation v;
    v.quantity = "variance";
    v.magnitude = std::abs(var - 1);
    v.tolerance = kEps;
    v.message = "scale-variance: the scaled scores' variance at D=" + std::to_string(D) + " is " + num(var) +
                ", not 1 (allowed 1 ± " + num(kEps) + "; unscaled it is " + num(raw) + ")";
    v.series = variance_sweep(impl, p.dtype, c);
    return v;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------------------
// 5. First position (exact).

const char* kFirstWhy =
    "The first query sees only key 0, so its weight there is exp(0)/exp(0) = 1 exactly and its output is v0 "
    "exactly, in every dtype (v0 is already representable). A leak from the future, a missing row of the mask "
    "or a first row left empty shows here first. Exact: no tolerance.";

rc::Gen<LawCase> gen_first(const GenConfig& cfg) {
  ProblemOptions po = outputs_only();
  po.allow_cross_lengths = false;
  return gen_problem(cfg, po);
}

std::optional<Violation> check_first(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Outcome o = call(impl, p);
  const Shape& s = p.q.shape();
  Tensor<double> want = o.output;
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) want.head(b, h).row(0) = p.v.head(b, h).row(0);
  auto v = compare("first-position", "output", want, o.output, nullptr,
                   [](Index, Index, Index i, Index) { return i == 0; });
  if (v) {
    const auto& ix = v->worst_index;
    v->message = "first-position: output" + idx({ix[0], ix[1], 0, ix[3]}) + " is " +
                 num(o.output(ix[0], ix[1], 0, ix[3])) + " but position 0 sees only key 0, so it must equal v" +
                 idx({ix[0], ix[1], 0, ix[3]}) + " = " + num(want(ix[0], ix[1], 0, ix[3]));
    v->weights = o.weights;
  }
  return v;
}

// ---------------------------------------------------------------------------------------------------------
// 6. Convex hull.

const char* kHullWhy =
    "Each output row is a convex combination of the value rows its query can see, so every coordinate lies "
    "between the smallest and the largest of those values. A mask filled with 0 (values from the future), "
    "weights that do not sum to 1, or a wrong scale on the output breaks it. Slack: weights summing to "
    "1 +- (gamma_T + u_a), or 1 +- u_s when stored in the dtype before the product, and the T-term accumulation "
    "add (2 gamma_T + u_a + u_s) max|v|, rounding to the dtype u_s |o| plus its subnormal floor; doubled.";

std::optional<Violation> check_hull(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Outcome o = call(impl, p);
  const Shape& s = p.q.shape();
  const double u_a = accumulation_roundoff(p.dtype), u_s = unit_roundoff(p.dtype);
  Tensor<double> hi(s), tol(s);
  const Include include = [&](Index, Index, Index i, Index) { return n_visible(p, i) > 0; };
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index i = 0; i < s.T; ++i) {
        const Index n = n_visible(p, i);
        if (n == 0) continue;
        const auto vis = p.v.head(b, h).topRows(n);
        for (Index d = 0; d < s.D; ++d) {
          const double vmin = vis.col(d).minCoeff(), vmax = vis.col(d).maxCoeff();
          const double x = o.output(b, h, i, d);
          const double slack = kSafety * ((2 * gamma(n, u_a) + u_a + u_s) * vis.col(d).cwiseAbs().maxCoeff() +
                                          u_s * std::abs(x)) +
                               storage_floor(p.dtype);
          // Expected: the nearest point of [vmin, vmax]; tolerance: the slack.
          hi(b, h, i, d) = std::clamp(x, vmin, vmax);
          tol(b, h, i, d) = slack;
          if (std::isnan(x)) hi(b, h, i, d) = vmin;
        }
      }
  auto v = compare("convex-hull", "output", hi, o.output, &tol, include);
  if (v) {
    const auto& ix = v->worst_index;
    const Index n = n_visible(p, ix[2]);
    const auto col = p.v.head(ix[0], ix[1]).topRows(n).col(ix[3]);
    v->message = "convex-hull: output" + idx({ix[0], ix[1], ix[2], ix[3]}) + " = " +
                 num(o.output(ix[0], ix[1], ix[2], ix[3])) + " lies outside [" + num(col.minCoeff()) + ", " +
                 num(col.maxCoeff()) + "], the range of the " + std::to_string(n) +
                 " value rows query " + std::to_string(ix[2]) + " can see";
    v->weights = o.weights;
  }
  return v;
}

// ---------------------------------------------------------------------------------------------------------
// 7. Shift invariance.

const char* kShiftWhy =
    "Adding the same vector c to every key adds q_i.c to every score of row i, a constant per row, and softmax "
    "is invariant to a constant added to a row: the weights must not change. A mask filled with 0 or a finite "
    "constant (the masked entries do not move with the row), or a softmax over the query axis, breaks it. "
    "Tolerance: both results' derived oracle bounds, plus the oracles' own difference (rounding k + c to the "
    "dtype makes the shift inexact).";

rc::Gen<LawCase> gen_shift(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    LawCase c = *gen_problem(cfg);
    const Shape& ks = c.problem.k.shape();
    const double m = *gen_magnitude();
    const auto shift = *gen_tensor({ks.B, ks.H, 1, ks.D}, Regime::normal, m, cfg.dtype);
    Problem v = c.problem;
    for (Index b = 0; b < ks.B; ++b)
      for (Index h = 0; h < ks.H; ++h)
        for (Index j = 0; j < ks.T; ++j)
          for (Index d = 0; d < ks.D; ++d) v.k(b, h, j, d) = round_to(cfg.dtype, v.k(b, h, j, d) + shift(b, h, 0, d));
    c.variant = v;
    return c;
  });
}

std::optional<Violation> check_shift(const Implementation& impl, const LawCase& c) {
  const Outcome a = call(impl, c.problem), b = call(impl, *c.variant);
  const OracleRun oa = run_oracle(c.problem), ob = run_oracle(*c.variant);
  Tensor<double> tol = oa.tol_w;
  tol.values() += ob.tol_w.values() + (oa.w.values() - ob.w.values()).cwiseAbs();
  auto v = compare("shift-invariance", "weights", *a.weights, *b.weights, &tol, {});
  if (v) {
    v->message += " after adding the same vector to every key";
    v->weights = b.weights;
  }
  return v;
}

// ---------------------------------------------------------------------------------------------------------
// 8. Batch and head independence.

const char* kIndependenceWhy =
    "Each (batch, head) slice is its own attention problem: changing one slice must leave every other slice's "
    "output bit-identical (exact: the other slices' arithmetic is the same), and rotating the batches or heads "
    "must rotate the outputs the same way (within both results' derived bounds, since memory alignment may "
    "change a kernel's summation path). A mask or scale broadcast over the wrong axis, or a [B,T,H,D] layout "
    "read as [B,H,T,D], breaks it.";

rc::Gen<LawCase> gen_independence(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    LawCase c = *gen_problem(cfg, outputs_only());
    Problem& p = c.problem;
    Shape s = p.q.shape();
    // Independence needs two slices: a case with one gets a second head. Drawn unconditionally, so that
    // shrinking the shape does not shift the draws after it.
    const Tensor<double> extra_q = *gen_tensor({1, 1, s.T, s.D}, Regime::normal, 1.0, cfg.dtype);
    const Tensor<double> extra_k = *gen_tensor({1, 1, p.k.shape().T, s.D}, Regime::normal, 1.0, cfg.dtype);
    const Tensor<double> extra_v = *gen_tensor({1, 1, p.k.shape().T, s.D}, Regime::normal, 1.0, cfg.dtype);
    if (s.B * s.H < 2) {
      const auto more = [](const Tensor<double>& t, const Tensor<double>& extra) {
        const Shape ts = t.shape();
        Tensor<double> r({ts.B, 2, ts.T, ts.D});
        r.head(0, 0) = t.head(0, 0);
        r.head(0, 1) = extra.head(0, 0);
        return r;
      };
      p.q = more(p.q, extra_q);
      p.k = more(p.k, extra_k);
      p.v = more(p.v, extra_v);
      s = p.q.shape();
    }
    const Index b = *rc::gen::inRange<Index>(0, s.B), h = *rc::gen::inRange<Index>(0, s.H);
    Problem v = p;
    const double m = *gen_magnitude();
    v.q.head(b, h) = (*gen_tensor({1, 1, s.T, s.D}, Regime::normal, m, cfg.dtype)).head(0, 0);
    v.k.head(b, h) = (*gen_tensor({1, 1, p.k.shape().T, s.D}, Regime::normal, m, cfg.dtype)).head(0, 0);
    v.v.head(b, h) = (*gen_tensor({1, 1, p.k.shape().T, s.D}, Regime::normal, m, cfg.dtype)).head(0, 0);
    c.variant = v;
    c.params["b"] = double(b);
    c.params["h"] = double(h);
    c.params["rotate_b"] = double(*rc::gen::inRange<Index>(0, s.B));
    c.params["rotate_h"] = double(*rc::gen::inRange<Index>(0, s.H));
    c.tags = shape_tags(p);
    return c;
  });
}

Tensor<double> rotate(const Tensor<double>& t, Index rb, Index rh) {
  const Shape& s = t.shape();
  Tensor<double> r(s);
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) r.head((b + rb) % s.B, (h + rh) % s.H) = t.head(b, h);
  return r;
}

std::optional<Violation> check_independence(const Implementation& impl, const LawCase& c) {
  const Index cb = Index(c.params.at("b")), ch = Index(c.params.at("h"));
  const Outcome a = call(impl, c.problem), b = call(impl, *c.variant);
  auto v = compare("batch-head-independence", "output", a.output, b.output, nullptr,
                   [&](Index bb, Index hh, Index, Index) { return bb != cb || hh != ch; });
  if (v) {
    v->message += "; only slice (b=" + std::to_string(cb) + ", h=" + std::to_string(ch) + ") was changed";
    v->weights = b.weights;
    return v;
  }
  const Index rb = Index(c.params.at("rotate_b")), rh = Index(c.params.at("rotate_h"));
  if (rb == 0 && rh == 0) return std::nullopt;
  Problem r = c.problem;
  r.q = rotate(r.q, rb, rh);
  r.k = rotate(r.k, rb, rh);
  r.v = rotate(r.v, rb, rh);
  const Outcome rot = call(impl, r);
  const OracleRun o = run_oracle(c.problem);
  Tensor<double> tol = rotate(o.tol_out, rb, rh);
  tol.values() *= 2;
  v = compare("batch-head-independence", "output", rotate(a.output, rb, rh), rot.output, &tol, {});
  if (v) {
    v->message += " after rotating batches by " + std::to_string(rb) + " and heads by " + std::to_string(rh) +
                  " (the outputs must rotate the same way)";
    v->weights = rot.weights;
  }
  return v;
}

// ---------------------------------------------------------------------------------------------------------
// 9. Agreement with the float64 oracle.

const char* kOracleWhy =
    "The implementation's outputs and weights agree with attncheck's float64 oracle run on the same (already "
    "rounded) inputs. Non-finite values are checked first. Tolerance per element: the larger of (a) the bound "
    "derived in attention/src/tolerance.cpp for a kernel that accumulates in float (score error "
    "gamma_D.scale.sum|q.k| + 4u_a|s|, turned by softmax into a relative weight error rho = exp(2 Delta + "
    "gamma_T + 5u_a) - 1, the output error max|v|(rho + gamma_T(1 + rho)), rounding to the dtype, subnormal "
    "floors; doubled) and (b) FlashAttention's rule: 2 x the error of attncheck's own kernel at the same dtype "
    "on the same inputs, plus a floor of u_s.max|v| (a valid kernel summing in another order can be off by "
    "about as much as the plain one in the other direction; the floor covers the plain one being exact by luck).";

std::optional<Violation> check_oracle(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Outcome o = call(impl, p);
  OracleRun r = run_oracle(p);
  // FlashAttention's rule, merged into the derived bound by taking the larger of the two per element.
  Problem with_w = p;
  with_w.want_weights = true;
  const Outcome mine = reference_implementation()->forward(with_w);
  const double floor_out = unit_roundoff(p.dtype) * p.v.values().cwiseAbs().maxCoeff();
  r.tol_out.values() = r.tol_out.values().cwiseMax(2 * (mine.output.values() - r.out.values()).cwiseAbs() +
                                                   Eigen::VectorXd::Constant(r.out.size(), floor_out));
  r.tol_w.values() = r.tol_w.values().cwiseMax(2 * (mine.weights->values() - r.w.values()).cwiseAbs() +
                                               Eigen::VectorXd::Constant(r.w.size(), unit_roundoff(p.dtype)));
  const auto seen = [&](Index, Index, Index i, Index) { return n_visible(p, i) > 0; };
  if (auto v = compare("oracle-agreement", "output", r.out, o.output, &r.tol_out, seen)) {
    v->weights = o.weights;
    return v;
  }
  if (o.weights) {
    // Future weights stay exact (tolerance 0) whatever the rule.
    for (Index b = 0; b < r.tol_w.shape().B; ++b)
      for (Index h = 0; h < r.tol_w.shape().H; ++h)
        for (Index i = 0; i < r.tol_w.shape().T; ++i)
          for (Index j = 0; j < r.tol_w.shape().D; ++j)
            if (!visible(p, i, j)) r.tol_w(b, h, i, j) = 0;
    if (auto v = compare("oracle-agreement", "weights", r.w, *o.weights, &r.tol_w, seen)) {
      v->weights = o.weights;
      return v;
    }
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------------------
// 10. Paths agree.

const char* kPathsWhy =
    "The batched call and one call per (batch, head) slice through the same implementation compute the same "
    "attention, so they agree within the sum of both results' derived oracle bounds. A kernel whose batched "
    "path indexes the wrong slice, strides over the wrong axis, or shares state across heads breaks it. (The "
    "reference core's own single-head and projection paths are checked against its batched path by the "
    "property tests in properties/tests.)";

std::optional<Violation> check_paths(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Outcome all = call(impl, p);
  const OracleRun r = run_oracle(p);
  const Shape& s = p.q.shape();
  Tensor<double> single(all.output.shape());
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) {
      Problem one = p;
      one.q = slice(p.q, b, h);
      one.k = slice(p.k, b, h);
      one.v = slice(p.v, b, h);
      single.head(b, h) = call(impl, one).output.head(0, 0);
    }
  Tensor<double> tol = r.tol_out;
  tol.values() *= 2;
  auto v = compare("paths-agree", "output", single, all.output, &tol, {});
  if (v) {
    v->message += " (batched call vs. one call per (b,h) slice)";
    v->weights = all.weights;
  }
  return v;
}

// ---------------------------------------------------------------------------------------------------------
// 11. Determinism (exact).

const char* kDeterminismWhy =
    "The same call twice gives bit-identical outputs and weights. A kernel that keeps state between calls, "
    "reads uninitialised memory or depends on thread timing breaks it; such bugs also make every other "
    "counterexample impossible to replay. Exact: no tolerance.";

std::optional<Violation> check_determinism(const Implementation& impl, const LawCase& c) {
  const Outcome a = call(impl, c.problem), b = call(impl, c.problem);
  if (auto v = compare("determinism", "output", a.output, b.output, nullptr, {})) {
    v->message += " on the second identical call";
    v->weights = b.weights;
    return v;
  }
  if (a.weights && b.weights)
    if (auto v = compare("determinism", "weights", *a.weights, *b.weights, nullptr, {})) {
      v->message += " on the second identical call";
      v->weights = b.weights;
      return v;
    }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------------------
// 12. Strict causality with non-finite future inputs (exact).

const char* kStrictWhy =
    "Under a boolean (select) mask, NaN or Inf placed in future queries, keys or values never reaches an "
    "earlier output: the masked scores are never read and the future values are never multiplied. An "
    "additive mask turns inf + (-inf) and 0 * Inf into NaN; a weights @ V product over all keys lets a future "
    "NaN through. Applies to implementations that claim select semantics (Capabilities::nonfinite_safe). "
    "Exact: no tolerance.";

rc::Gen<LawCase> gen_strict(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    LawCase c = *gen_problem(cfg, outputs_only());
    const Problem& p = c.problem;
    const Index t = *rc::gen::inRange<Index>(0, std::max<Index>(p.q.shape().T - 1, 1));
    const double inf = std::numeric_limits<double>::infinity();
    const double bad = *rc::gen::element(std::numeric_limits<double>::quiet_NaN(), inf, -inf);
    const auto fill = [&](const Shape& s) {
      Tensor<double> r(s);
      r.values().setConstant(bad);
      return r;
    };
    // Which of q, k, v get the non-finite value (at least one); shrinks toward v only.
    const int which = *rc::gen::inRange(1, 8);
    c.variant = perturb_future(p, t, (which & 4) ? fill(p.q.shape()) : p.q, (which & 2) ? fill(p.k.shape()) : p.k,
                               (which & 1) ? fill(p.v.shape()) : p.v);
    c.params["t"] = double(t);
    c.tags.push_back(std::isnan(bad) ? "future=NaN" : "future=Inf");
    return c;
  });
}

std::optional<Violation> check_strict(const Implementation& impl, const LawCase& c) {
  return check_earlier_outputs_unchanged("strict-causality-nonfinite", "set to NaN/Inf", impl, c);
}

std::string always_applies(const Capabilities&) { return ""; }

}  // namespace

const std::vector<Law>& laws() {
  static const std::vector<Law> all = [] {
    std::vector<Law> l;
    const auto plain = [](const GenConfig& cfg) { return gen_problem(cfg); };
    l.push_back({"row-stochastic", "every row of weights with a visible key is >= 0, finite and sums to 1",
                 kRowStochasticWhy, needs_weights, plain, check_row_stochastic, 0});
    l.push_back({"zero-future-weight", "every weight on a future key is exactly 0", kZeroFutureWhy, needs_weights,
                 plain, check_zero_future, 0});
    l.push_back({"causal-perturbation",
                 "changing tokens after t (extreme values included) leaves outputs at <= t bit-identical",
                 kPerturbationWhy, always_applies, gen_perturbation, check_perturbation, 0});
    l.push_back({"prefix-consistency", "attention over the first t+1 positions equals the first t+1 rows of all",
                 kPrefixWhy, always_applies, gen_prefix, check_prefix, 0});
    l.push_back({"scale-variance", "scores are scaled by 1/sqrt(D): their variance stays 1 for every D",
                 kScaleWhy, needs_weights, gen_scale, check_scale, kScaleCases});
    l.push_back({"first-position", "the first position's output equals v0, its only visible value", kFirstWhy,
                 always_applies, gen_first, check_first, 0});
    l.push_back({"convex-hull", "every output lies within the range of the value rows its query can see", kHullWhy,
                 always_applies, gen_outputs_only, check_hull, 0});
    l.push_back({"shift-invariance", "adding the same vector to every key leaves the weights unchanged", kShiftWhy,
                 needs_weights, gen_shift, check_shift, 0});
    l.push_back({"batch-head-independence",
                 "changing one (b,h) slice changes no other; rotating batches or heads rotates the outputs",
                 kIndependenceWhy, always_applies, gen_independence, check_independence, 0});
    l.push_back({"oracle-agreement", "outputs and weights agree with the float64 oracle within the derived bound",
                 kOracleWhy, always_applies, plain, check_oracle, 0});
    l.push_back({"paths-agree", "the batched call agrees with one call per (b,h) slice", kPathsWhy, always_applies,
                 gen_outputs_only, check_paths, 0});
    l.push_back({"determinism", "the same call twice is bit-identical", kDeterminismWhy, always_applies, plain,
                 check_determinism, 0});
    l.push_back({"strict-causality-nonfinite", "NaN or Inf in future inputs never reaches an earlier output",
                 kStrictWhy,
                 [](const Capabilities& c) {
                   return c.nonfinite_safe ? std::string()
                                           : std::string("the implementation does not claim select-mask semantics "
                                                         "(Capabilities::nonfinite_safe)");
                 },
                 gen_strict, check_strict, 0});
    return l;
  }();
  return all;
}

const Law* find_law(std::string_view name) {
  for (const auto& l : laws())
    if (l.name == name) return &l;
  return nullptr;
}

}  // namespace attncheck
