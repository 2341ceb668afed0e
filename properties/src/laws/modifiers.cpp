// The score-modifier laws: sink-mass (with sinks, the visible weights of a row sum to 1 - p_sink),
// softcap-bound (a softcap of c keeps a row's visible weights within a factor e^(2c) of each other) and
// neutral-modifiers (a zero ALiBi slope, a sink of -inf and a softcap of 2^40 are plain attention).
#include <cmath>
#include <limits>

#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace modifiers_law {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// p with V's every column all ones: output[i,c] = Σ_visible w_ij, the row's visible weight as the kernel sums it.
Problem with_ones(const Problem& p) {
  Problem ones = p;
  ones.want_weights = false;
  ones.want_lse = false;
  ones.v = Tensor<double>(p.k.shape());
  ones.v.values().setOnes();
  return ones;
}

// Sinks of -inf against the same call without sinks. The float64 oracle gives both the same values (exp(-inf)
// adds an exact 0 to the row's sum and never raises its max), but not every correct kernel does the same
// arithmetic on both: one that appends the sink as one more softmax column (gpt-oss, Hugging Face) sums T_k + 1
// terms where the plain call sums T_k, and a vectorised or pairwise sum groups them differently (1 ulp apart).
// So the two calls agree within the sum of their derived bounds, each within its own of its oracle, plus what the
// two oracles differ by (nothing, in practice). No declaration says a kernel takes one code path for both.
std::optional<Violation> sinks_of_minus_inf(const char* law, const Implementation& impl, const Problem& plain,
                                            const Problem& minus_inf, const Outcome& plain_out) {
  const Outcome o = call(impl, minus_inf);
  const OracleRun rp = run_oracle(plain), rm = run_oracle(minus_inf);
  Tensor<double> tol = rp.tol_out;
  tol.values() += rm.tol_out.values() + (rp.out.values() - rm.out.values()).cwiseAbs();
  if (auto v = compare(law, "output", plain_out.output, o.output, &tol, {})) {
    v->message += "; sinks of -inf must give the call without sinks, within both calls' derived bounds";
    v->call = minus_inf;
    v->call_what = "the case with every sink -inf";
    return v;
  }
  return std::nullopt;
}

// ---- sink-mass ------------------------------------------------------------------------------------------------

const char* kSinkWhy =
    "A sink (gpt-oss) is one more logit sigma_h in every row's softmax, with no value: the row's visible weights "
    "sum to 1 - p_sink, p_sink = exp(sigma_h - lse_i), not to 1, and a row that sees no key puts all its weight "
    "on the sink (output 0). The law calls the case with V all ones, where every output is the row's visible "
    "weight as the kernel sums it, and compares it with the float64 oracle's 1 - p_sink within the derived "
    "output bound (oracle-agreement's, for those values); then checks that sinks of -inf give the plain call "
    "(exp(-inf) adds an exact 0 and never raises the row max) within both calls' derived bounds, not bit for "
    "bit: a correct kernel that appends the sink as one more softmax column (gpt-oss, Hugging Face) sums T_k + 1 "
    "terms, grouped otherwise than T_k (1 ulp apart). A sink added to every numerator, "
    "left out of the denominator, or applied once per tile breaks it. (Outputs in the hull of the visible values "
    "and 0: convex-hull, which draws sinks.)";

std::string needs_sinks(const GenConfig& g) {
  return g.caps.declares(Feature::sinks)
             ? ""
             : "needs attention sinks (ATTNCHECK_CAP3_SINKS), which this implementation does not declare";
}

rc::Gen<LawCase> gen_sinks(const GenConfig& cfg) {
  ProblemOptions po = outputs_only();
  po.require.add(Feature::sinks);
  return gen_problem(cfg, po);
}

std::optional<Violation> check_sinks(const Implementation& impl, const LawCase& c) {
  const char* law = "sink-mass";
  const Problem& p = c.problem;
  if (p.sinks.empty()) return std::nullopt;  // a stored case without sinks: nothing to check
  const Problem ones = with_ones(p);
  const Outcome o = call(impl, ones);
  const OracleRun r = run_oracle(ones);
  const auto seen = [&](Index, Index, Index, Index) { return true; };
  if (auto v = compare(law, "output", r.out, o.output, &r.tol_out, seen)) {
    const auto& w = v->worst_index;
    v->message = "sink-mass: with V all ones, output" + idx({w[0], w[1], w[2], w[3]}) + " = " +
                 num(o.output(w[0], w[1], w[2], w[3])) + " is row " + std::to_string(w[2]) +
                 "'s visible weight, which must be 1 - p_sink = " + num(r.out(w[0], w[1], w[2], w[3])) +
                 " (sink " + num(p.sinks[std::size_t(w[1])]) + ", tolerance " + num(v->tolerance) + ")";
    v->call = ones;
    v->call_what = "the case with every value 1";
    return v;
  }
  Problem none = p, minus_inf = p;
  none.sinks.clear();
  minus_inf.sinks.assign(p.sinks.size(), kNegInf);
  return sinks_of_minus_inf(law, impl, none, minus_inf, call(impl, none));
}

// ---- softcap-bound --------------------------------------------------------------------------------------------

const char* kSoftcapWhy =
    "Logit softcapping (Gemma 2) maps each scaled score to c tanh(s/c), inside (-c, c), before the mask: two "
    "visible weights of a row then differ by a factor below e^(2c) (times e^(|slope| (span)) with ALiBi, and "
    "e^(max - min) of the row's additive bias, both added after), a hidden weight stays exactly 0 (zero-future-weight draws softcaps), and a cap of 2^40 is "
    "plain attention (c tanh(s/c) = s (1 - (s/c)^2/3 ...)). The law checks the ratio of the largest to the "
    "smallest visible weight of every row (from the weights, or from one-hot probes of sampled keys) against "
    "e^(2c + ALiBi span + bias spread) (1 + rho)^2, rho the row's derived relative weight error; then the call with a cap of "
    "2^40 against the plain call's oracle within both calls' derived bounds. tanh(s) c instead of c tanh(s/c), "
    "a softcap applied after the mask, or on the unscaled scores, breaks it.";

std::string needs_softcap(const GenConfig& g) {
  return g.caps.declares(Feature::softcap)
             ? ""
             : "needs logit softcapping (ATTNCHECK_CAP3_SOFTCAP), which this implementation does not declare";
}

rc::Gen<LawCase> gen_softcap(const GenConfig& cfg) {
  ProblemOptions po;
  po.require.add(Feature::softcap);
  return gen_problem(cfg, po);
}

std::optional<Violation> check_softcap(const Implementation& impl, const LawCase& c) {
  const char* law = "softcap-bound";
  const Problem& p = c.problem;
  if (!p.softcap) return std::nullopt;
  const double cap = *p.softcap;
  const OracleRun r = run_oracle(p);
  // The weights: in full, or at sampled keys for an implementation that has none or whose weights are probed.
  Tensor<double> w{Shape{}};
  std::vector<Index> keys;
  const bool sampled = samples_weights(impl, p) || !impl.capabilities().returns_weights;
  if (sampled) {
    keys = sampled_keys(impl, p);
    w = sample_weights(impl, p, keys).w;
  } else {
    Problem with_w = p;
    with_w.want_weights = true;
    w = *call(impl, with_w).weights;
    for (Index j = 0; j < p.k.shape().T; ++j) keys.push_back(j);
  }
  const Shape& s = p.q.shape();
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) {
      const double slope = p.alibi_slopes.empty() ? 0.0 : std::abs(p.alibi_slopes[std::size_t(h)]);
      const Visibility vis = p.visibility(b, h);
      for (Index i = 0; i < s.T; ++i) {
        double lo = std::numeric_limits<double>::infinity(), hi = 0, rho = 0;
        Index j_lo = -1, j_hi = -1;
        for (std::size_t n = 0; n < keys.size(); ++n) {
          const Index j = keys[n];
          if (!vis.visible(i, j)) continue;
          const double x = w(b, h, i, Index(n));
          // ρ from the oracle's weight bound: tol = 2(w ρ + u_s w) + floors, so ρ <= tol / (2 w).
          const double wo = r.weight(p, b, h, i, j);
          if (wo > 0) rho = std::max(rho, r.weight_tol(p, b, h, i, j) / wo);
          if (x < lo) lo = x, j_lo = j;
          if (x > hi) hi = x, j_hi = j;
        }
        if (j_lo < 0 || hi == 0) continue;
        const KeyRange kr = vis.keys(i);  // the ALiBi span: between the farthest visible keys
        // And the additive bias's spread over the row's visible keys, added after the cap as ALiBi is.
        double bias_lo = 0, bias_hi = 0;
        if (p.bias) {
          bias_lo = std::numeric_limits<double>::infinity(), bias_hi = -bias_lo;
          for (Index j = kr.begin; j < kr.end; ++j)
            if (vis.visible(i, j)) {
              bias_lo = std::min(bias_lo, (*p.bias)(b, h, i, j));
              bias_hi = std::max(bias_hi, (*p.bias)(b, h, i, j));
            }
        }
        const double alibi_span = slope * double(kr.size() - 1), bias_span = std::max(0.0, bias_hi - bias_lo);
        const double span = alibi_span + bias_span;
        // A weight too small for the dtype (flushed or subnormal) has no ratio to speak of: skip the row. From 64
        // times the smallest normal up, a weight rounded to the dtype is off by at most u_s of itself, which ρ holds.
        // (The bound was 64·N/u: 8 in float16, above every weight, so no float16 row was ever checked.)
        if (lo < 64 * smallest_normal(p.dtype)) continue;
        const double limit = std::exp(2 * cap + span) * (1 + rho) * (1 + rho);
        if (!(hi / lo <= limit)) {
          Violation v;
          v.quantity = "weights";
          v.worst_index = {b, h, i, j_hi};
          v.magnitude = hi / lo;
          v.tolerance = limit;
          v.message = "softcap-bound: in row " + idx({b, h, i}) + " the weight of key " + std::to_string(j_hi) + " (" +
                      num(hi) + ") is " + num(hi / lo) + " times that of key " + std::to_string(j_lo) + " (" + num(lo) +
                      "), more than e^(2 x " + num(cap) +
                      (alibi_span > 0 ? " + ALiBi span " + num(alibi_span) : std::string()) +
                      (bias_span > 0 ? " + bias spread " + num(bias_span) : std::string()) +
                      ") allows (" + num(limit) + ", rounding included)";
          if (!sampled) v.weights = w;
          return v;
        }
      }
    }
  // A cap of 2^40: plain attention within both calls' bounds (the oracles differ by ~|s|^3/c^2, nothing).
  Problem huge = outputs_first(impl, p), plain = outputs_first(impl, p);
  huge.softcap = std::ldexp(1.0, 40);
  huge.want_weights = plain.want_weights = false;
  plain.softcap.reset();
  const Outcome a = call(impl, huge);
  const OracleRun rp = run_oracle(plain), rh = run_oracle(huge);
  Tensor<double> tol = rp.tol_out;
  tol.values() += rh.tol_out.values() + (rp.out.values() - rh.out.values()).cwiseAbs();
  const auto seen = seen_rows(p);
  if (auto v = compare(law, "output", rp.out, a.output, &tol, seen)) {
    v->message += "; a softcap of 2^40 must be plain attention";
    v->call = huge;
    v->call_what = "the case with a softcap of 2^40";
    return v;
  }
  return std::nullopt;
}

// ---- neutral-modifiers ----------------------------------------------------------------------------------------

const char* kNeutralWhy =
    "Each modifier has a value that is no modifier: ALiBi slopes of 0 add 0 * (j - p) = 0 to every score, sinks "
    "of -inf add exp(-inf) = 0 to every row's sum, and neither raises a row max, so each must give the plain call "
    "(the laws that draw modifiers then say the plain call is right). ALiBi slopes of 0: bit for bit, since adding "
    "an exact 0 to a score leaves every later operation the same. Sinks of -inf: within both calls' derived "
    "bounds, since a correct kernel that appends the sink as one more softmax column (gpt-oss, Hugging Face) sums "
    "T_k + 1 terms where the plain call sums T_k, grouped otherwise (1 ulp apart). A kernel that turns slope 0 "
    "into a default slope, or reads sinks of -inf as 0, breaks it. Checked for each modifier the implementation "
    "declares, on the case's other modifiers as drawn.";

std::string needs_a_modifier(const GenConfig& g) {
  return g.caps.features.intersects({Feature::alibi, Feature::sinks})
             ? ""
             : "needs ALiBi or sinks (ATTNCHECK_CAP3_ALIBI, _SINKS), which this implementation does not declare";
}

std::optional<Violation> check_neutral(const Implementation& impl, const LawCase& c) {
  const char* law = "neutral-modifiers";
  const Problem p = outputs_first(impl, c.problem);
  const Capabilities& caps = impl.capabilities();
  Problem plain = p;
  plain.alibi_slopes.clear();
  plain.sinks.clear();
  plain.want_weights = false;
  const Outcome base = call(impl, plain);
  const Index H = p.q.shape().H;
  const auto one = [&](Problem q, const char* what) -> std::optional<Violation> {
    const Outcome o = call(impl, q);
    if (auto v = compare(law, "output", base.output, o.output, nullptr, {})) {
      v->message += std::string("; ") + what + " must give the plain call, bit for bit";
      v->call = q;
      v->call_what = std::string("the case with ") + what;
      return v;
    }
    return std::nullopt;
  };
  if (caps.declares(Feature::alibi)) {
    Problem q = plain;
    q.alibi_slopes.assign(std::size_t(H), 0.0);
    if (auto v = one(q, "ALiBi slopes of 0")) return v;
  }
  if (caps.declares(Feature::sinks)) {
    Problem q = plain;
    q.sinks.assign(std::size_t(H), kNegInf);
    if (auto v = sinks_of_minus_inf(law, impl, plain, q, base)) return v;
  }
  return std::nullopt;
}

rc::Gen<LawCase> gen_neutral(const GenConfig& cfg) {
  ProblemOptions po = outputs_only();
  po.allow.remove({Feature::alibi, Feature::sinks});  // the law sets them itself
  return gen_problem(cfg, po);
}

}  // namespace modifiers_law
}  // namespace

Law sink_mass() {
  using namespace modifiers_law;
  return {"sink-mass", "with sinks, each row's visible weights sum to 1 - p_sink; sinks of -inf are no sinks",
          kSinkWhy,
          LawDoc{"25",
                 "with sinks, each row's visible weights (read with V = 1) sum to 1 − p_sink; sinks of −∞ give the call without sinks",
                 "derived output bound; both calls' bounds for sinks of −∞"},
          needs_sinks, gen_sinks, check_sinks, 0};
}

Law softcap_bound() {
  using namespace modifiers_law;
  return {"softcap-bound", "a softcap c keeps a row's visible weights within e^(2c) of each other; c = 2^40 is none",
          kSoftcapWhy,
          LawDoc{"26",
                 "with a softcap c, a row's visible weights stay within e^(2c) (× e^(ALiBi span + bias spread)) of each other; c = 2⁴⁰ is plain attention",
                 "(1 + ρ)² / both derived bounds"},
          needs_softcap, gen_softcap, check_softcap, 0};
}

Law neutral_modifiers() {
  using namespace modifiers_law;
  return {"neutral-modifiers",
          "ALiBi slopes of 0 give the plain call bit for bit, and sinks of -inf within the derived bound", kNeutralWhy,
          LawDoc{"27", "ALiBi slopes of 0 and sinks of −∞ give the plain call",
                 "exact (bit-identical) for slopes of 0; both calls' bounds for sinks of −∞"},
          needs_a_modifier, gen_neutral, check_neutral, 0};
}

}  // namespace attncheck::law_kit
