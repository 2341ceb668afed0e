// Law 6, convex-hull: every output lies within the range of the value rows its query can see.
#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace convex_hull_law {

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
  return hull_violation("convex-hull", impl, c.problem);
}

}  // namespace convex_hull_law
}  // namespace

Law convex_hull() {
  using namespace convex_hull_law;
  return {"convex-hull", "every output lies within the range of the value rows its query can see", kWhy,
          LawDoc{"6", "every output lies within the range of the value rows its query sees",
                 "(2γ_T + u_a + u_s)·max|v| + u_s|o|, doubled"},
          always_applies, gen_outputs_only, check, 0};
}

}  // namespace attncheck::law_kit
