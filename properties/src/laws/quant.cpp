// Quantised K and V caches' laws. A quantised call means attention over the dequantised values (code - z)·σ, exact
// doubles: kv-quant-oracle (the call is the float64 oracle's on them, within the bound of the kernel's own
// dequantisation), kv-quant-k-scale (K's scales times 2 with the softmax scale over 2 change nothing), kv-quant-v-scale
// (V's scales times 2 double the output and change nothing else), kv-quant-requantise (the same values written another
// way, halved codes under doubled scales, shifted int8 zero points, another declared format or granularity, give the
// same call) and kv-quant-dense (the quantised call and the dense call on the dequantised values agree).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <tuple>

#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace quant_law {

std::string needs_quant(const GenConfig& g) {
  if (std::none_of(std::begin(kQuantFormatFeatures), std::end(kQuantFormatFeatures),
                   [&](Feature f) { return g.caps.declares(f); }))
    return "needs a quantised K and V cache in some format (ATTNCHECK_CAP4_KV_E4M3FN, _KV_E5M2, _KV_INT8, "
           "_KV_GGML_Q8_0, _KV_GGML_Q4_0, _KV_GGML_Q4_1, _KV_GGML_Q5_0, _KV_GGML_Q5_1), which this implementation does "
           "not declare";
  if (std::string why = pinned_past_materialised(g, "a quantised cache"); !why.empty()) return why;
  return "";
}

std::string needs_quant_and_scale(const GenConfig& g) {
  if (std::string why = needs_quant(g); !why.empty()) return why;
  if (!g.caps.custom_scale) return "needs an explicit softmax scale, which this implementation does not accept";
  return "";
}

// Every case quantised, in a declared format. The bound of step 12 is taken on k and v as they are, so nothing may
// transform them first (a rope, a QK-norm, a temperature folded into q is fine but kept out for plain counterexamples),
// and a quantised cache is paged only where the implementation declares paged quantised pools (half the cases then:
// the quantised call in its pools, kv-quant-dense's dense call in float pools of the same pages).
ProblemOptions options(const GenConfig& cfg, bool weights) {
  ProblemOptions po = weights ? ProblemOptions{} : outputs_only();
  for (const Feature f : kQuantFormatFeatures) po.require.add(f);
  po.allow.remove({Feature::rope, Feature::rope_interleaved, Feature::qk_norm, Feature::qk_norm_eps_outside,
                   Feature::temperature, Feature::strided});
  if (!cfg.caps.declares(Feature::paged_quant)) po.allow.remove(Feature::paged);
  po.want_lse = cfg.caps.declares(Feature::lse);
  return po;
}

// The cases: with ggml's blocks declared, half of them (all, when no other format is) with D a multiple of 32, which
// the blocks need.
rc::Gen<LawCase> gen_with(const GenConfig& config, const ProblemOptions& po) {
  const GenConfig cfg = within_materialised(config);
  const auto declared = [&](std::initializer_list<Feature> fs) {
    return std::any_of(fs.begin(), fs.end(), [&](Feature f) { return cfg.caps.declares(f); });
  };
  GenConfig blocks = cfg;
  blocks.caps.head_dim_multiple = std::lcm(cfg.caps.head_dim_multiple, kQuantBlock);
  const bool ggml = declared({Feature::kv_ggml_q8_0, Feature::kv_ggml_q4_0, Feature::kv_ggml_q4_1,
                              Feature::kv_ggml_q5_0, Feature::kv_ggml_q5_1}) &&
                    !blocks.caps.head_dims_up_to(cfg.max_D).empty(),
             other = declared({Feature::kv_e4m3fn, Feature::kv_e5m2, Feature::kv_int8});
  if (!ggml) return gen_problem(cfg, po);
  if (!other) return gen_problem(blocks, po);
  return rc::gen::exec([=] {
    return *weighted_choice<bool>({{1, false}, {1, true}}) ? *gen_problem(blocks, po) : *gen_problem(cfg, po);
  });
}
rc::Gen<LawCase> gen(const GenConfig& cfg) { return gen_with(cfg, options(cfg, true)); }
rc::Gen<LawCase> gen_outputs(const GenConfig& cfg) { return gen_with(cfg, options(cfg, false)); }

// Whether scaling one input of p by a power of two scales every value a correct kernel forms from it exactly: every
// type it may hold them in keeps them normal. float16's smallest normal, 2^-14, is within the drawn values' reach, so
// float16 never is. At float32, float64 and bfloat16 (float32's exponent range or more) the values that may fall out
// of the normal range are the products q_c·k_c (times the scale) and w_ij·v_jc, whose inputs a case may draw tiny
// (magnitudes down to 2^-40, and weights down to exp of the most negative score): exact where every nonzero such
// product is at least 2^-100 (the oracle's weights standing for the kernel's, 2^26 from float32's smallest normal).
// Every weight of a visible key counts, the oracle's zeros too: a weight that underflows in double (exp(-1024)) is
// one a kernel may hold as a subnormal float (its exp rounds differently), and that weight times a value is then a
// subnormal product, which doubling does not round alike. Only a hidden key's weight is 0 in every correct kernel.
bool power_of_two_exact(const Problem& p) {
  if (p.dtype == DType::f16) return false;
  const auto min_nonzero = [](const Tensor<double>& t) {
    double m = std::numeric_limits<double>::infinity();
    for (const double x : t.values())
      if (x != 0) m = std::min(m, std::abs(x));
    return m;
  };
  constexpr double kFloor = 0x1p-100;
  const double qk = min_nonzero(p.q) * min_nonzero(p.k) * std::min(1.0, scale_of(p));
  if (std::isfinite(qk) && qk < kFloor) return false;
  const OracleRun r = run_oracle(p);
  const Include hidden = hidden_keys(p);
  double w = std::numeric_limits<double>::infinity();
  const Shape ws = r.w.shape();
  for (Index b = 0; b < ws.B; ++b)
    for (Index h = 0; h < ws.H; ++h)
      for (Index i = 0; i < ws.T; ++i)
        for (Index j = 0; j < ws.D; ++j)
          if (!hidden(b, h, i, j)) w = std::min(w, r.w(b, h, i, j));
  const double v = min_nonzero(p.v);
  return !(std::isfinite(w) && std::isfinite(v) && w * v < kFloor);
}

// Compares the calls a and b of p exactly (output, weights and LSE where returned), or, where exactness is not
// guaranteed, within both calls' bounds (calls_agree). `expect` maps a's output to what b's must be.
std::optional<Violation> exactly(const char* law, const Implementation& impl, const Problem& p, const Problem& q,
                                 double output_factor, const std::string& what, const std::string& why) {
  const Outcome a = call(impl, p), b = call(impl, q);
  const auto seen = seen_rows(p);
  Tensor<double> want = a.output;
  want.values() *= output_factor;
  std::optional<Violation> v = compare(law, "output", want, b.output, nullptr, seen);
  if (!v && a.weights && b.weights) v = compare(law, "weights", *a.weights, *b.weights, nullptr, seen);
  if (!v && p.want_lse && a.lse && b.lse) v = compare(law, "lse", *a.lse, *b.lse, nullptr, seen);
  if (v) {
    v->message += "; " + why + " (" + what + " vs. the case as drawn), exactly: every value a kernel forms from the " +
                  "scaled input is scaled by the same power of two";
    v->call = q;
    v->call_what = what;
  }
  return v;
}

// --- kv-quant-oracle --------------------------------------------------------------------------------------------

const char* kOracleWhy =
    "A quantised cache stores each element of K and V as a code of its format (FP8 e4m3fn or e5m2, int8) with a scale "
    "per tensor, kv head or token (and an int8 zero point): it means (value(code) - zero point) x scale, an exact "
    "double. The call is attention over those values: its output, weights and LSE agree with the float64 oracle on "
    "them within the bound derived for a kernel that dequantises in its own arithmetic (attention/src/tolerance.cpp "
    "step 12: at most four roundings of each element, 4u_s relative, and the dtype's smallest normal where a value "
    "falls below it), or FlashAttention's rule, whichever is larger. A kernel that ignores a scale, applies it twice, "
    "takes a kv head's scale from the query head or another token, decodes e4m3fn as e5m2 or with infinities, "
    "flushes the format's subnormals or ignores a zero point breaks it.";

std::optional<Violation> check_oracle(const Implementation& impl, const LawCase& c) {
  if (!c.problem.quant) return std::nullopt;  // a stored case the law does not draw
  return agrees_with_oracle("kv-quant-oracle", impl, c,
                            "the oracle ran on the dequantised K and V, (code - zero point)·scale");
}

// --- kv-quant-k-scale and kv-quant-v-scale ----------------------------------------------------------------------

// p with one side's scales times f (its values with them: the codes stay); with k_side, a quantised Q's too.
Problem scaled_side(const Problem& p, bool k_side, double f) {
  Problem q = p;
  const auto scale = [f](QuantScales& s, Tensor<double>& x) {
    for (double& y : s.scales) y *= f;
    for (double& y : s.mins) y *= f;  // ggml's Q4_1 and Q5_1: the whole value scales
    x.values() *= f;
  };
  if (!k_side) {
    scale(q.quant->v, q.v);
    return q;
  }
  scale(q.quant->k, q.k);
  if (q.quant->q) scale(*q.quant->q, q.q);
  return q;
}

const char* kKScaleWhy =
    "K's scales multiply every score through k: (code - z) x (c sigma) with the softmax scale divided by c gives "
    "every score as it was, so the call is the same attention. With c = 2 every value a correct kernel forms from "
    "the scaled K (the dequantised element, its products with q, a scale it folds into the softmax scale) is the old "
    "one times 2 exactly, and the score times 1/2 again, wherever those values stay normal: the output, weights and "
    "LSE are bit-identical at float32, float64 and bfloat16. At float16, whose subnormals the values reach, both calls "
    "are compared within their derived bounds. A kernel that applies K's scale twice, squares it, applies it to V, "
    "drops it on one path or folds it into the softmax scale the wrong way round (dividing) breaks it. A quantised Q's "
    "scales (FlashAttention 3's q descale) multiply every score the same way: where Q is quantised too, both sides' "
    "scales are doubled and the softmax scale divided by 4.";

std::optional<Violation> check_k_scale(const Implementation& impl, const LawCase& c) {
  const char* law = "kv-quant-k-scale";
  Problem p = c.problem;
  if (!p.quant) return std::nullopt;
  p.scale = scale_of(p);  // explicit in both calls
  Problem q = scaled_side(p, true, 2.0);
  const bool with_q = p.quant->q.has_value();  // Q's scales too (its descale): the softmax scale over 4
  q.scale = *p.scale / (with_q ? 4 : 2);
  const std::string what = with_q ? "the case with K's and Q's scales times 2 and the softmax scale over 4"
                                  : "the case with K's scales times 2 and the softmax scale over 2";
  const std::string why = "K's scale times c with the softmax scale over c is the same attention";
  if (power_of_two_exact(p)) return exactly(law, impl, p, q, 1.0, what, why);
  p.want_weights = q.want_weights = false;
  return calls_agree(law, impl, p, q, what, why);
}

const char* kVScaleWhy =
    "V's scales multiply every value: the output is a weighted sum of V's rows, so V's scales times c give the "
    "output times c, and the weights and LSE as they were. With c = 2 a correct kernel's every value formed from V "
    "(the dequantised element, its products with the weights, a scale it applies to the output instead) is the old "
    "one times 2 exactly where it stays normal: bit-identical at float32, float64 and bfloat16 (the weights and LSE "
    "unchanged, the output doubled). At float16 both calls are compared within their derived bounds. A kernel that "
    "drops V's scale, applies K's to V, applies V's to the weights (or the LSE) as well, or takes it from another head "
    "or token breaks it.";

std::optional<Violation> check_v_scale(const Implementation& impl, const LawCase& c) {
  const char* law = "kv-quant-v-scale";
  Problem p = c.problem;
  if (!p.quant) return std::nullopt;
  // Weights recovered by probing (a black box) are read with one-hot values at scale 1 in place of V
  // (probe_layout), so the two calls' probes are the same call: comparing them would check nothing V's scales do, at
  // ceil(T_k / D_v) calls each. Such a kernel's outputs and LSE carry the law.
  if (impl.capabilities().weights_probed) p.want_weights = false;
  const Problem q = scaled_side(p, false, 2.0);
  const std::string what = "the case with V's scales times 2";
  const std::string why = "V's scale times c multiplies the output by c and changes nothing else";
  if (power_of_two_exact(p)) return exactly(law, impl, p, q, 2.0, what, why);
  // Bounded: the doubled call's output halved is the case's (exact: dividing by 2 rounds nothing in double), so the
  // two compare as calls_agree's do, on V halved back in the oracle's terms.
  const Outcome a = call(impl, p), b = call(impl, q);
  const OracleRun ra = run_oracle(p), rb = run_oracle(q);
  Tensor<double> half = b.output, tol = ra.tol_out;
  half.values() /= 2;
  tol.values() += rb.tol_out.values() / 2;
  std::optional<Violation> v = compare(law, "output", a.output, half, &tol, seen_rows(p));
  if (v) {
    v->message += "; " + why + " (" + what + ", its output halved, vs. the case as drawn)";
    v->call = q;
    v->call_what = what;
  }
  return v;
}

// --- kv-quant-requantise ----------------------------------------------------------------------------------------

// The same dequantised values written another way, where the case allows it: halved codes under doubled scales (exact
// where every code halves exactly), int8 codes and zero points shifted by one, another declared format whose codes
// hold every value, or another declared granularity with the same scales. Empty where none applies; `exact` says
// whether a correct kernel gives the same bits (the first two, where power_of_two_exact).
struct Rewrite {
  Problem q;
  std::string what;
  bool exact = false;
};

bool holds_values(QuantFormat f, const QuantScales& s, const Tensor<double>& x) {
  try {
    quant_codes("requantise", "k", f, s, x);
    return true;
  } catch (const ValueError&) {
    return false;
  }
}

bool valid_scales(QuantFormat f, const QuantScales& s, const Shape& cache) {
  try {
    check_quant_scales("requantise", "k", f, s, cache);
    return true;
  } catch (const std::invalid_argument&) {
    return false;
  }
}

std::vector<Rewrite> rewrites(const Problem& p, const GenConfig& cfg) {
  std::vector<Rewrite> out;
  const QuantizedKV& qk = *p.quant;
  // Halved codes, doubled scales: every code's half a code of the format (for int8 an integer, with zero points
  // halved too: then even).
  {
    Problem q = p;
    bool ok = true;
    std::vector<std::pair<QuantScales*, Tensor<double>*>> sides{{&q.quant->k, &q.k}, {&q.quant->v, &q.v}};
    if (q.quant->q) sides.push_back({&*q.quant->q, &q.q});
    for (auto& [s, x] : sides) {
      QuantScales h = *s;
      for (double& z : h.zero_points) z /= 2;
      for (double& x2 : h.scales) x2 *= 2;
      ok = ok && std::all_of(h.zero_points.begin(), h.zero_points.end(), [](double z) { return z == std::trunc(z); }) &&
           valid_scales(qk.format, h, x->shape()) && holds_values(qk.format, h, *x);
      *s = h;
    }
    if (ok) out.push_back({q, "the same values as codes halved under scales doubled", power_of_two_exact(p)});
  }
  // int8: codes and zero points one up (where every code is below 127), or one down.
  if (qk.format == QuantFormat::int8 && cfg.caps.declares(Feature::kv_zero_points)) {
    for (const double d : {1.0, -1.0}) {
      Problem q = p;
      bool ok = true;
      for (auto& [s, x] : {std::pair{&q.quant->k, &q.k}, {&q.quant->v, &q.v}}) {
        QuantScales h = *s;
        if (h.zero_points.empty()) h.zero_points.assign(h.scales.size(), 0.0);
        for (double& z : h.zero_points) z += d;
        ok = ok && valid_scales(qk.format, h, x->shape()) && holds_values(qk.format, h, *x);
        *s = h;
      }
      if (ok) {
        out.push_back({q,
                       std::string("the same values as int8 codes and zero points ") + (d > 0 ? "one up" : "one down"),
                       false});  // a kernel may form code·σ and z·σ apart: other products, other roundings
        break;
      }
    }
  }
  // Another declared format that holds every value (zero points only in int8).
  for (const auto& [f, feat] : {std::pair{QuantFormat::int8, Feature::kv_int8},
                                {QuantFormat::e4m3fn, Feature::kv_e4m3fn},
                                {QuantFormat::e5m2, Feature::kv_e5m2}}) {
    if (f == qk.format || !cfg.caps.declares(feat) || quant_blocked(qk.format)) continue;  // blocks keep their own
    if (f != QuantFormat::int8 && !(qk.k.zero_points.empty() && qk.v.zero_points.empty())) continue;
    if (!holds_values(f, qk.k, p.k) || !holds_values(f, qk.v, p.v) || (qk.q && !holds_values(f, *qk.q, p.q))) continue;
    Problem q = p;
    q.quant->format = f;
    out.push_back({q, "the same values in " + std::string(quant_format_name(f)), false});
  }
  // A finer declared granularity, each group's scale (and zero point) the coarser one's.
  const auto finer = [&](const QuantScales& s, const Shape& shape, QuantGranularity g) {
    QuantScales f = quant_extents(g, shape);
    for (Index b = 0; b < f.B; ++b)
      for (Index h = 0; h < f.H; ++h)
        for (Index t = 0; t < f.T; ++t) {
          f.scales.push_back(s.scale(b, h, t));
          if (!s.zero_points.empty()) f.zero_points.push_back(s.zero_point(b, h, t));
        }
    return f;
  };
  for (const auto& [g, feat] : {std::pair{QuantGranularity::kv_head, Feature::kv_scale_per_head},
                                {QuantGranularity::token_head, Feature::kv_scale_per_token}}) {
    if (!cfg.caps.declares(feat) || (qk.k.granularity >= g && qk.v.granularity >= g)) continue;
    Problem q = p;
    if (qk.k.granularity < g) q.quant->k = finer(qk.k, p.k.shape(), g);
    if (qk.v.granularity < g) q.quant->v = finer(qk.v, p.v.shape(), g);
    out.push_back({q, "the same values with scales per " + std::string(quant_granularity_name(g)), false});
  }
  return out;
}

// The case with every code halvable (so that the halved rewrite always applies, and every case is checked): an int8
// code or zero point made even (toward zero), an FP8 code whose half is not one (an odd subnormal mantissa, or an odd
// mantissa at the smallest normal exponent) stepped toward zero until it is.
LawCase halvable(LawCase c) {
  Problem& p = c.problem;
  if (!p.quant) return c;
  QuantizedKV& qk = *p.quant;
  std::vector<std::tuple<QuantScales*, Tensor<double>*, const char*>> sides{{&qk.k, &p.k, "k"}, {&qk.v, &p.v, "v"}};
  if (qk.q) sides.push_back({&*qk.q, &p.q, "q"});
  for (auto& [s, x, side] : sides) {
    for (double& z : s->zero_points) z -= std::fmod(z, 2.0);
    std::vector<std::uint8_t> codes(std::size_t(x->size()));
    std::size_t n = 0;
    const Shape& sh = x->shape();
    for (Index b = 0; b < sh.B; ++b)
      for (Index h = 0; h < sh.H; ++h)
        for (Index t = 0; t < sh.T; ++t)
          for (Index d = 0; d < sh.D; ++d, ++n) {
            // The nearest code of the value under the (possibly changed) zero point, then made halvable.
            double v = std::nearbyint((*x)(b, h, t, d) / s->scale(b, h, t)) + s->zero_point(b, h, t);
            std::uint8_t code;
            if (quant_blocked(qk.format)) {  // q made even, toward zero (its minimum and d as they are)
              const double scale = s->scale(b, h, t, d), min = s->min(b, h, t, d);
              double q = scale == 0 ? 0.0 : std::nearbyint(((*x)(b, h, t, d) - min) / scale);
              q -= std::fmod(q, 2.0);
              code = *quant_exact(qk.format, q);
            } else if (qk.format == QuantFormat::int8) {
              v = std::clamp(v, -128.0, 127.0);
              code = std::uint8_t(std::int8_t(v - std::fmod(v, 2.0)));
            } else {
              code = quant_nearest(qk.format, (*x)(b, h, t, d) / s->scale(b, h, t));
              // Toward zero (the magnitude bits down by one) until half its value is a code too: an odd subnormal
              // or an odd mantissa at the smallest normal exponent is not.
              while (!quant_exact(qk.format, quant_value(qk.format, code) / 2)) code = std::uint8_t(code - 1);
            }
            codes[n] = code;
          }
    *x = dequantize(qk.format, *s, sh, codes.data());
    (void)side;
  }
  return c;
}

rc::Gen<LawCase> gen_requantise(const GenConfig& cfg) { return rc::gen::map(gen_outputs(cfg), halvable); }

const char* kRequantiseWhy =
    "A cache's meaning is its dequantised values, not how they are written: the same values as codes halved under "
    "scales doubled, as int8 codes and zero points shifted by one, in another declared format whose codes hold them "
    "all, or with a finer declared granularity carrying the same scales, are the same attention. The law draws one of "
    "those the case allows (by its seed) and compares the two calls: bit-identical for the halved codes at float32, "
    "float64 and bfloat16 (a correct kernel forms the same products: (c/2)(2 sigma) = c sigma, also where it forms "
    "c sigma and z sigma apart), within both calls' derived bounds otherwise (shifted zero points change those "
    "products). A kernel that decodes one format as another, reads a "
    "zero point with the wrong sign or not at all, applies a scale twice, or reads per-head or per-token scales from "
    "the wrong group breaks it.";

Verdict check_requantise(const Implementation& impl, const LawCase& c, const GenConfig& cfg) {
  const char* law = "kv-quant-requantise";
  Problem p = c.problem;
  if (!p.quant) return std::nullopt;
  p.want_weights = false;
  const std::vector<Rewrite> all = rewrites(p, cfg);
  if (all.empty())  // the law's cases are halvable (halvable()): only a stored case may have no rewrite
    return Verdict(std::nullopt, "a stored case whose codes no rewrite applies to was not checked");
  // One rewrite per case, chosen by the case's values (so a replay chooses the same): their codes' sum.
  std::uint64_t h = 0;
  for (const std::uint8_t b : quant_codes(law, "k", p.quant->format, p.quant->k, p.k)) h = h * 31 + b;
  Rewrite r = all[h % all.size()];
  r.q.want_weights = false;
  const std::string why = "the same dequantised values written another way are the same attention";
  if (r.exact) return exactly(law, impl, p, r.q, 1.0, r.what, why);
  return calls_agree(law, impl, p, r.q, r.what, why);
}

// --- kv-quant-dense ---------------------------------------------------------------------------------------------

const char* kDenseWhy =
    "A quantised call and the dense call on its dequantised values rounded to the dtype are the same attention but "
    "for that rounding: their outputs (and LSEs) agree within both calls' derived bounds plus what their float64 "
    "oracles differ by. The implementation's own dense path is the reference here, so a quantised path that drifts "
    "from it (a scale applied on one path only, a decode path that flushes subnormals, a ragged path that assumes "
    "identity scales) breaks it.";

std::optional<Violation> check_dense(const Implementation& impl, const LawCase& c) {
  const char* law = "kv-quant-dense";
  Problem p = c.problem;
  if (!p.quant) return std::nullopt;
  p.want_weights = false;
  Problem q = p;
  const bool with_q = p.quant->q.has_value();
  q.quant.reset();
  for (Tensor<double>* t : {&q.q, &q.k, &q.v})
    for (double& x : t->values()) x = round_to(p.dtype, x);
  return calls_agree(law, impl, p, q,
                     with_q ? "the dense call on the dequantised Q, K and V, rounded to the dtype"
                            : "the dense call on the dequantised K and V, rounded to the dtype",
                     "a quantised cache is the dense call on its dequantised values");
}

// --- kv-quant-head-rotation ------------------------------------------------------------------------------------

// The cases: quantised, with at least two (batch entry, kv head) slices (a case with one is drawn again), and a
// rotation r of them in [1, B·H_kv): batch entries by r / H_kv, kv heads by r % H_kv (shrinking toward moving one kv
// head, or one entry). No mask or modifier that belongs to a head or an entry other than key lengths (it would have to
// rotate too).
rc::Gen<LawCase> gen_rotation(const GenConfig& cfg) {
  ProblemOptions po = options(cfg, false);
  po.allow.remove({Feature::block_mask, Feature::dense_mask, Feature::documents, Feature::query_documents,
                   Feature::bias, Feature::alibi, Feature::sinks});
  const auto slices = [](const LawCase& c) { return c.problem.k.shape().B * c.problem.k.shape().H; };
  return rc::gen::exec([=] {
    LawCase c = *rc::gen::suchThat(gen_with(cfg, po), [=](const LawCase& x) { return slices(x) >= 2; });
    const Index H_kv = c.problem.k.shape().H, r = *rc::gen::inRange<Index>(1, slices(c));
    c.params["rotate_b"] = double(r / H_kv);
    c.params["rotate_g"] = double(r % H_kv);
    return c;
  });
}

// A side's scales (zero points, minimums) moved with their groups: along the batch by rb and the heads by rh where the
// granularity has those extents (per tensor nothing moves; per kv head the heads; per token and ggml's blocks both).
QuantScales rotated(const QuantScales& s, Index rb, Index rh) {
  QuantScales r = s;
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index t = 0; t < s.T; ++t)
        for (Index n = 0; n < s.C; ++n) {
          const std::size_t from = s.at(b, h, t, n * kQuantBlock),
                            to = s.at((b + rb) % s.B, (h + rh) % s.H, t, n * kQuantBlock);
          r.scales[to] = s.scales[from];
          if (!s.zero_points.empty())
            r.zero_points[s.at((b + rb) % s.B, (h + rh) % s.H, t)] = s.zero_points[s.at(b, h, t)];
          if (!s.mins.empty()) r.mins[to] = s.mins[from];
        }
  return r;
}

const char* kRotationWhy =
    "A scale belongs to its group: per kv head, or per batch entry, kv head and key. Rotating the batch entries and "
    "the "
    "kv heads of a quantised call together with their scales (and the query heads of each group with them, and a "
    "quantised Q's scales with its heads) is the same attention on moved slices, so the outputs move the same way, "
    "within twice the derived bound (a kernel may split its work by position). A kernel that reads a head's scale at "
    "a fixed index (head 0's for every head, the first entry's for every batch entry), from a table in another order, "
    "or by the query head's index where the kv head's is meant, gives the moved heads other scales, and breaks it.";

std::optional<Violation> check_rotation(const Implementation& impl, const LawCase& c) {
  const char* law = "kv-quant-head-rotation";
  Problem p = c.problem;
  if (!p.quant) return std::nullopt;
  p.want_weights = false;
  const Index B = p.q.shape().B, H = p.q.shape().H, H_kv = p.k.shape().H, group = H / H_kv;
  const Index rb = int_param(c, law, "rotate_b", 0, B - 1), rg = int_param(c, law, "rotate_g", 0, H_kv - 1);
  if (rb == 0 && rg == 0) return std::nullopt;
  if (p.bias || p.block_mask || p.dense_mask || !p.doc_bounds.empty() || !p.alibi_slopes.empty() || !p.sinks.empty())
    return std::nullopt;  // a stored case the law does not draw
  Problem r = p;
  r.q = rotated_slices(p.q, rb, rg * group);
  r.k = rotated_slices(p.k, rb, rg);
  r.v = rotated_slices(p.v, rb, rg);
  r.quant->k = rotated(p.quant->k, rb, rg);
  r.quant->v = rotated(p.quant->v, rb, rg);
  if (p.quant->q) r.quant->q = rotated(*p.quant->q, rb, rg * group);
  if (!p.key_lengths.empty())
    for (Index b = 0; b < B; ++b) r.key_lengths[std::size_t((b + rb) % B)] = p.key_lengths[std::size_t(b)];
  const Outcome a = call(impl, p), rot = call(impl, r);
  const OracleRun o = run_oracle(p);
  Tensor<double> tol = rotated_slices(o.tol_out, rb, rg * group);
  tol.values() *= 2;
  std::optional<Violation> v = compare(law, "output", rotated_slices(a.output, rb, rg * group), rot.output, &tol, {});
  if (v) {
    v->message += " after rotating batch entries by " + std::to_string(rb) + " and kv heads by " + std::to_string(rg) +
                  " with their scales (the outputs must rotate the same way)";
    v->call = r;
    v->call_what = "the case with batch entries and kv heads rotated, their scales with them";
  }
  return v;
}

std::string needs_rotation(const GenConfig& g) {
  if (std::string why = needs_quant(g); !why.empty()) return why;
  return g.max_B * g.max_H < 2 ? "needs two (batch, head) slices, but --max-B and --max-H are both 1" : "";
}

}  // namespace quant_law
}  // namespace

Law kv_quant_head_rotation() {
  using namespace quant_law;
  return {
      "kv-quant-head-rotation",
      "rotating batch entries and kv heads with their scales rotates the outputs",
      kRotationWhy,
      LawDoc{"67", "batch entries and kv heads rotated with their per-head and per-token scales: the outputs rotate",
             "twice the derived bound (`attention/src/tolerance.cpp` step 12)"},
      needs_rotation,
      gen_rotation,
      check_rotation,
      0};
}

Law kv_quant_oracle() {
  using namespace quant_law;
  return {"kv-quant-oracle",
          "a call over a quantised cache agrees with the oracle on its dequantised values",
          kOracleWhy,
          LawDoc{"62", "outputs, weights and LSE of a quantised call agree with the float64 oracle on (code − z)·σ",
                 "derived (`attention/src/tolerance.cpp` step 12), or FlashAttention's rule"},
          needs_quant,
          gen,
          check_oracle,
          0};
}

Law kv_quant_k_scale() {
  using namespace quant_law;
  return {"kv-quant-k-scale",
          "K's scales times 2 with the softmax scale over 2 change nothing (a quantised Q's too, over 4)",
          kKScaleWhy,
          LawDoc{"63",
                 "K's scales × 2 with the softmax scale ÷ 2 (a quantised Q's scales × 2 too, ÷ 4): the same output, "
                 "weights and LSE",
                 "exact (float16: both calls' derived bounds)"},
          needs_quant_and_scale,
          gen,
          check_k_scale,
          0};
}

Law kv_quant_v_scale() {
  using namespace quant_law;
  return {"kv-quant-v-scale",
          "V's scales times 2 double the output and change nothing else",
          kVScaleWhy,
          LawDoc{"64", "V's scales × 2: the output × 2, the weights and LSE the same",
                 "exact (float16: both calls' derived bounds)"},
          needs_quant,
          gen,
          check_v_scale,
          0};
}

Law kv_quant_requantise() {
  using namespace quant_law;
  return {"kv-quant-requantise",
          "the same dequantised values written another way give the same call",
          kRequantiseWhy,
          LawDoc{"65",
                 "codes halved under scales doubled, int8 zero points shifted, another format or granularity: the "
                 "same call",
                 "exact for halved codes (float16: derived), both calls' derived bounds for the others"},
          needs_quant,
          gen_requantise,
          [](const Implementation& impl, const LawCase& c) {
            GenConfig cfg;
            cfg.caps = impl.capabilities();
            return check_requantise(impl, c, cfg);
          },
          0};
}

Law kv_quant_dense() {
  using namespace quant_law;
  return {"kv-quant-dense",
          "a quantised call agrees with the dense call on its dequantised values",
          kDenseWhy,
          LawDoc{"66", "the quantised call and the dense call on its dequantised values rounded to the dtype agree",
                 "both calls' derived bounds plus the oracles' difference"},
          needs_quant,
          gen_outputs,
          check_dense,
          0};
}

}  // namespace attncheck::law_kit
