// Law 4, scale-variance: scores are scaled by 1/sqrt(D), so their variance stays 1 for every D; a two-key
// probe and a statistical test with a derived false-alarm rate.
#include <algorithm>
#include <cmath>
#include <random>

#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace scale_variance_law {

// The statistical test. The sample's entries are Rademacher (±1 with probability 1/2 each): unit variance, exact in
// every dtype, and the lightest tails there are. x = q·k/√D is then a sum of D independent ±1 over √D, so
// E x² = 1 and E x⁴ = (D + 3D(D - 1))/D² = 3 - 2/D, hence Var(x²) = 2 - 2/D ≤ 2. The estimate of Var(x) is the
// median of G group means of x², each over n samples. Chebyshev: a group mean strays more than ε from 1 with
// probability p ≤ 2/(n ε²). The median strays only if at least G/2 groups do, which by Hoeffding has probability
// ≤ exp(-2G(1/2 - p)²). With n = 64, ε = 0.5: p ≤ 0.125, and G = 60 gives ≤ exp(-2·60·0.375²) = exp(-16.875) =
// 4.7e-8 per case; the law runs at most 20 cases, so a correct kernel is falsely flagged with probability
// ≤ 9.4e-7 < 1e-6 per run. (Gaussian entries have E x⁴ = 3 + 6/D ≤ 9 and Var(x²) ≤ 8: the same bound needed
// groups of 256, four times the calls and the draws.)
constexpr int kGroups = 60, kGroupSize = 64, kScaleCases = 20;
constexpr double kEps = 0.5;
constexpr Index kStatisticalFromD = 8;
// What a stored case may ask of a sample. Its numbers (sample_T, sweep_max_D) are a few bytes of a corpus entry
// that could each ask for minutes of work, so they are capped at what a sample can use:
//  - kSampleMaxT: a head of T positions holds T - 1 samples at a cost of T·D each (its T x T scores), so heads
//    longer than this only cost more; the CLI never records more (its generators keep T <= 64).
//  - the sweep is the report's plot, not the verdict: it stops at kSweepMaxD (the default --max-D; 8 points,
//    1 to 128, enough to tell the lines 1, D and 1/D apart), so it costs at most 3,840 x 64 x 255 operations
//    whatever the entry says.
constexpr Index kSampleMaxT = 64, kSweepMaxD = 128;
// What a new case asks for: heads of 16 positions (15 samples each). A sample costs its 2D normal draws
// whatever T is, plus T·D in the kernel (its row of scores); the calls a case makes are 3,840 / (B·H·(T - 1)).
// At T = 64 the kernel's share made this law a quarter to two fifths of every all-laws run of the zoo's kernels
// (2.0 of 4.9 s CPU for control:ftz); at 16 it is a quarter of that, for 64 calls a case at B = H = 4 instead of
// 16 (a call's overhead is what a subprocess pays; a case once took 961 calls).
constexpr Index kSampleT = 16;

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

// The sample: x = q_i·k_i/√D for independent q_i, k_i, read back from the implementation's own weights. Each
// head is a square call of T positions with key 0 = 0 (score 0), and query i paired with key i alone: the
// weights of query i give s_ii = log(w_ii / w_i0) whatever its other keys (1..i-1) score, so one head holds
// T - 1 samples, each from its own query and its own key (independent, as the derivation above needs).
//  - An implementation that returns its weights: T up to the run's --max-T (64 by default), so at the default
//    4 x 4 heads a call one call holds 1,008 samples and the 3,840 take 4 calls (240 with one sample a head).
//  - A black box (weights probed, or none): V's rows are the one-hot e_0..e_{T-1} with T <= D, so output[i,j]
//    = w_ij exactly (one product by 1, the rest by exact zeros), and one call holds T - 1 samples a head with
//    no probing. At D = 1 (T = 2 needs two columns) the weights are asked for, as before: only the report's
//    sweep samples D = 1 (the statistical form does not, see check()).
struct ScoreSamples {
  std::vector<double> scaled_sq, raw_sq;
};

// The sample is taken in calls of at most B x H heads of T positions (the run's --max-B, --max-H and --max-T:
// an implementation may accept no more), as many calls as it takes.
ScoreSamples sample_scores(const Implementation& impl, DType dtype, Index D, std::uint64_t seed, Index B, Index H,
                           Index T_max) {
  ScoreSamples out;
  std::mt19937_64 rng(seed);
  // ±1 from the generator's bits, 64 entries a draw (the statistic's derivation above needs Rademacher entries).
  std::uint64_t bits = 0;
  int left = 0;
  const auto sign = [&] {
    if (left == 0) {
      bits = rng();
      left = 64;
    }
    --left;
    const bool one = bits & 1;
    bits >>= 1;
    return one ? 1.0 : -1.0;
  };
  const double tiny = std::numeric_limits<double>::min();  // a weight that underflowed to 0: clip, see below
  const Capabilities& caps = impl.capabilities();
  bool from_outputs = !caps.returns_weights || caps.weights_probed;
  Index T = std::max<Index>(2, std::min(T_max, caps.max_T > 0 ? caps.max_T : T_max));
  if (from_outputs) T = std::min(T, D);
  if (T < 2) {  // D = 1 of a black box: one two-key head, weights probed
    T = 2;
    from_outputs = false;
  }
  const Index total = Index(kGroups) * kGroupSize, per_head = T - 1;
  // No call larger than the samples it can contribute (--max-B 1000 --max-H 1000 would otherwise ask for a
  // million heads a call).
  B = std::min(B, (total + per_head - 1) / per_head);
  H = std::min(H, (total + B * per_head - 1) / (B * per_head));
  while (Index(out.scaled_sq.size()) < total) {
    Problem p;
    p.dtype = dtype;
    p.alignment = square_alignment(caps);
    p.q = Tensor<double>({B, H, T, D});
    p.k = Tensor<double>({B, H, T, D});
    p.v = Tensor<double>({B, H, T, D});
    p.want_weights = !from_outputs;
    for (Index b = 0; b < B; ++b)
      for (Index h = 0; h < H; ++h)
        for (Index i = 1; i < T; ++i)
          for (Index c = 0; c < D; ++c) {
            p.q(b, h, i, c) = sign();  // exact in every dtype
            p.k(b, h, i, c) = sign();
          }
    if (from_outputs)
      for (Index b = 0; b < B; ++b)
        for (Index h = 0; h < H; ++h)
          for (Index j = 0; j < T; ++j) p.v(b, h, j, j) = 1;
    const Outcome o = call(impl, p);
    const auto weight = [&](Index b, Index h, Index i, Index j) {
      return from_outputs ? o.output(b, h, i, j) : (*o.weights)(b, h, i, j);
    };
    for (Index b = 0; b < B; ++b)
      for (Index h = 0; h < H; ++h)
        for (Index i = 1; i < T && Index(out.scaled_sq.size()) < total; ++i) {
          // A weight that underflows to 0 (|s| beyond ~16 at float16; probability < 1e-6 at D = 1) is clipped:
          // that only shrinks s², which errs toward passing and cannot raise a false alarm.
          const double s = std::log(std::max(weight(b, h, i, i), tiny) / std::max(weight(b, h, i, 0), tiny));
          out.scaled_sq.push_back(s * s);
          const double raw = p.q.head(b, h).row(i).dot(p.k.head(b, h).row(i));
          out.raw_sq.push_back(raw * raw);
        }
  }
  return out;
}

const char* kWhy =
    "Scores are divided by sqrt(D) so that, for queries and keys with unit-variance entries, their variance "
    "stays 1 whatever the head dimension; without it softmax saturates as D grows. Deterministic form: a "
    "two-key probe with key 0 = 0 recovers the effective scale as log(w11/w10)/c and must equal 1/sqrt(D) within twice "
    "the weights' derived relative error over c. Statistical form: for q and k with independent +-1 entries, the "
    "median of 60 means of 64 squared scaled scores must lie within 0.5 of 1 (false alarm <= 9.4e-7 per run, "
    "derived from Var(x^2) <= 2, "
    "Chebyshev per group and Hoeffding over groups), while the same statistic on unscaled scores grows with D. "
    "Each sample pairs its own query with its own key (query i with key i of a head whose key 0 is 0), so a call "
    "of T positions holds T - 1 samples a head; a black box is sampled from its outputs (one-hot values). The "
    "statistical form runs from D = 8 (below it the probe alone: at D = 1, 1/sqrt(D) = 1/D = 1).";

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    const Index D = *gen_head_dim(cfg);
    LawCase c;
    Problem& p = c.problem;
    p.dtype = cfg.dtype;
    // Probe: one query that sees two keys, k₀ = 0 and k₁ = e₀, with q = c·e₀, c ≈ √D: its scaled scores are 0
    // and c/√D ≈ 1. The smallest such case is one query over two keys, bottom-right aligned; an
    // implementation without cross lengths gets T = 2 and the probe is query 1.
    const bool one_query =
        cfg.caps.cross_lengths && cfg.caps.q_shorter && cfg.caps.supports(CausalAlignment::BottomRight);
    const Index T_q = one_query ? 1 : 2;
    p.alignment = one_query ? CausalAlignment::BottomRight : square_alignment(cfg.caps);
    p.q = Tensor<double>({1, 1, T_q, D});
    p.k = Tensor<double>({1, 1, 2, D});
    p.v = Tensor<double>({1, 1, 2, D});
    p.q(0, 0, T_q - 1, 0) = round_to(cfg.dtype, std::sqrt(double(D)));
    p.k(0, 0, 1, 0) = 1;
    p.v(0, 0, 1, 0) = 1;
    c.params["D"] = double(D);
    c.params["sample_B"] = double(std::max<Index>(cfg.max_B, 1));
    c.params["sample_H"] = double(std::max<Index>(cfg.max_H, 1));
    c.params["sample_T"] = double(std::clamp<Index>(cfg.max_T, 2, kSampleT));
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

constexpr const char* kLaw = "scale-variance";

std::uint64_t sample_seed(const LawCase& c) {
  const Index words = (Index{1} << 32) - 1;
  return (std::uint64_t(int_param(c, kLaw, "sample_seed_hi", 0, words)) << 32) |
         std::uint64_t(int_param(c, kLaw, "sample_seed_lo", 0, words));
}

// Cases stored before the sample respected the run's bounds carry no sample_B/H: 16 heads a call; those stored
// before a head held more than one sample carry no sample_T: two positions, one sample a head, as then.
Index sample_param(const LawCase& c, const char* key) {
  return c.params.count(key) ? int_param(c, kLaw, key, 1, kMaxExtent) : Index{4};
}
Index sample_T(const LawCase& c) {
  return c.params.count("sample_T") ? std::min(int_param(c, kLaw, "sample_T", 2, kMaxSeqLen), kSampleMaxT) : Index{2};
}
ScoreSamples sample_of(const Implementation& impl, DType dtype, Index D, std::uint64_t seed, const LawCase& c) {
  return sample_scores(impl, dtype, D, seed, sample_param(c, "sample_B"), sample_param(c, "sample_H"), sample_T(c));
}

// For the report's plot: the same statistic over D = 1, 2, 4, ... up to the run's --max-D (cases stored
// before the bound was recorded sweep to 128), so the trend names the mistake: ∝ D when the scale is
// forgotten, ∝ 1/D when it is applied twice.
std::vector<VariancePoint> variance_sweep(const Implementation& impl, DType dtype, const LawCase& c) {
  const Index max_D = std::min(
      c.params.count("sweep_max_D") ? int_param(c, kLaw, "sweep_max_D", 1, kMaxExtent) : Index{128}, kSweepMaxD);
  std::vector<VariancePoint> out;
  for (Index d = 1; d <= max_D; d *= 2)
    if (impl.capabilities().supports_head_dim(d))  // only the head dimensions it declares
      out.push_back(variance_point(
          double(d),
          sample_of(impl, dtype, d, sample_seed(c) + std::uint64_t(d), c).scaled_sq));
  return out;
}

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
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
    return v;
  }

  // Statistical form, from D = kStatisticalFromD: it asks whether the scale keeps the score variance at 1
  // as D grows, and the deterministic form above has already checked the scale itself at this D exactly (at
  // D = 1, 1/sqrt(D) = 1/D = 1 and no such mistake could show at all). A black box's sample costs a call per
  // B·H·(D - 1) samples, 240 calls at D = 2, so below kStatisticalFromD it would cost most of a run's calls
  // for no evidence the probe has not given.
  if (D < kStatisticalFromD) return std::nullopt;
  const ScoreSamples s = sample_of(impl, p.dtype, D, sample_seed(c), c);
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
    return v;
  }
  return std::nullopt;
}

// The report's plot, once for the case reported: during shrinking each failing try computed it too (eight samples
// of 3,840 scores a try, 15,360 before the entries were ±1; 2,570 calls for one shrink step of mutant:scale-forgotten, most of its kill test's time).
void explain(const Implementation& impl, const LawCase& c, Violation& v) {
  v.series = variance_sweep(impl, c.problem.dtype, c);
}

}  // namespace scale_variance_law
}  // namespace

Law scale_variance() {
  using namespace scale_variance_law;
  Law l{"scale-variance", "scores are scaled by 1/sqrt(D): their variance stays 1 for every D", kWhy,
        LawDoc{"4",
               "the effective scale from a two-key probe is 1/√D; the scaled scores' variance stays 1 for every D while the unscaled one grows ∝ D",
               "derived; statistical test with false alarm ≤ 9.4e-7 per run"},
        needs_weights, gen, check, kScaleCases};
  l.explain = explain;
  return l;
}

}  // namespace attncheck::law_kit
