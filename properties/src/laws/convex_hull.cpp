// Law 6, convex-hull: every output lies within the range of the value rows its query can see.
#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {

const char* kWhy =
    "Each output row is a convex combination of the value rows its query can see, so every coordinate lies "
    "between the smallest and the largest of those values. A mask filled with 0 (values from the future), "
    "weights that do not sum to 1, or a wrong scale on the output breaks it. Slack: weights summing to "
    "1 +- (gamma_T + u_a), or 1 +- u_s when stored in the dtype before the product, and the T-term accumulation "
    "add (2 gamma_T + u_a + u_s) max|v|, rounding to the dtype u_s |o| plus the dtype's smallest normal (a "
    "flush-to-zero store); a log-sum-exp rounded in the accumulation type (split-KV, tiled kernels) scales every "
    "weight of the row by up to exp(+-lambda), lambda = 10 u_a (max|s| + ln T) (attention/src/tolerance.cpp, "
    "step 2b; max|s| by Cauchy-Schwarz), adding expm1(lambda) max|v|; an FTZ kernel's flushed weights, products "
    "and partial sums (each below the accumulation type's smallest normal N_a) add T N_a (max|v| + 2); doubled. "
    "With a sink the visible weights sum to 1 - p_sink, so the output lies in the hull of the visible values and "
    "0; ALiBi biases and the sink enter max|s|.";

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Outcome o = call(impl, p);
  const Shape& s = p.q.shape();
  const double u_a = accumulation_roundoff(p.dtype), u_s = unit_roundoff(p.dtype);
  const double n_a = smallest_normal(p.dtype == DType::f64 ? DType::f64 : DType::f32);
  Tensor<double> hi(s), tol(s);
  const Include include = [&](Index b, Index h, Index i, Index) { return !sees_none(p, b, h, i); };
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) {
      // O(T·D) whatever T: the visible runs only move right as i grows.
      const Visibility vis = p.visibility(b, h);
      const VisibleRange range = visible_value_range(p.v.head(b, kv_of(p, h)), vis);
      const Eigen::VectorXd s_max = row_abs_score_bound(p, b, h);
      const bool sink = !p.sinks.empty();
      for (Index i = 0; i < s.T; ++i) {
        const Index n_vis = vis.count(i);
        if (n_vis == 0) continue;
        const double lse = std::expm1(lse_exponent_error(p.dtype, s_max(i), n_vis + (sink ? 1 : 0)));
        for (Index d = 0; d < s.D; ++d) {
          // With a sink the weights sum to 1 - p_sink: the hull of the visible values and 0.
          const double vmin = sink ? std::min(range.min(i, d), 0.0) : range.min(i, d);
          const double vmax = sink ? std::max(range.max(i, d), 0.0) : range.max(i, d);
          const double x = o.output(b, h, i, d), v_abs = std::max(std::abs(vmin), std::abs(vmax));
          // All-zero values keep the output 0 however unresolved the weights are (no 0·inf).
          const double lse_v = v_abs > 0 ? lse * v_abs : 0.0;
          const double slack = kSafety * ((2 * gamma(n_vis, u_a) + u_a + u_s) * v_abs + lse_v +
                                          u_s * std::abs(x) + double(n_vis) * n_a * (v_abs + 2)) +
                               storage_floor(p.dtype);
          // Expected: the nearest point of [vmin, vmax]; tolerance: the slack.
          hi(b, h, i, d) = std::clamp(x, vmin, vmax);
          tol(b, h, i, d) = slack;
          if (std::isnan(x)) hi(b, h, i, d) = vmin;
        }
      }
    }
  auto v = compare("convex-hull", "output", hi, o.output, &tol, include);
  if (v) {
    const auto& ix = v->worst_index;
    const Visibility vis = p.visibility(ix[0], ix[1]);
    const VisibleRange range = visible_value_range(p.v.head(ix[0], kv_of(p, ix[1])), vis);
    const double lo = range.min(ix[2], ix[3]), hi_v = range.max(ix[2], ix[3]);
    const bool sink = !p.sinks.empty();
    v->message = "convex-hull: output" + idx({ix[0], ix[1], ix[2], ix[3]}) + " = " +
                 num(o.output(ix[0], ix[1], ix[2], ix[3])) + " lies outside [" +
                 num(sink ? std::min(lo, 0.0) : lo) + ", " + num(sink ? std::max(hi_v, 0.0) : hi_v) +
                 "], the range of the " + std::to_string(vis.count(ix[2])) + " value rows query " + std::to_string(ix[2]) + " can see" +
                 (sink ? " and 0 (the sink takes the rest of the weight)" : "");
    v->weights = o.weights;
  }
  return v;
}

}  // namespace

Law convex_hull() {
  return {"convex-hull", "every output lies within the range of the value rows its query can see", kWhy,
          always_applies, gen_outputs_only, check, 0};
}

}  // namespace attncheck::law_kit
