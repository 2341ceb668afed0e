// QK-norm's laws: qk-norm-as-normalised-inputs (the call with a QK-norm and the call without it on q and k normalised
// in float64 agree) and qk-norm-scale-invariance (a query or key row scaled by c > 0 changes nothing but through
// eps: the normalisation divides the scale out).
#include <cmath>
#include <string>

#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace qk_norm_law {

std::string needs_qk_norm(const GenConfig& g) {
  if (!g.caps.declares(Feature::qk_norm) && !g.caps.declares(Feature::qk_norm_eps_outside))
    return "needs QK-norm with eps inside or outside the root (ATTNCHECK_CAP4_QK_NORM, _QK_NORM_EPS_OUTSIDE), which "
           "this implementation does not declare";
  return "";
}

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  ProblemOptions po = outputs_only();
  // Every case has a QK-norm (gen_modifiers draws one when either placement is required), in a declared placement.
  po.require.add(cfg.caps.declares(Feature::qk_norm) ? Feature::qk_norm : Feature::qk_norm_eps_outside);
  po.want_lse = cfg.caps.declares(Feature::lse);
  return gen_problem(cfg, po);
}

const char* kNormalisedWhy =
    "A fused QK-norm is the call on normalised inputs: each row x of q (and of k) becomes w * x / r, r = sqrt(mean "
    "x^2 + eps) (or sqrt(mean x^2) + eps), before the rope and the scores. So the call with it and the same call "
    "without it, on q and k normalised in float64 and rounded to the dtype, are the same attention: the law compares "
    "their outputs (and LSEs) within both calls' derived bounds (attention/src/tolerance.cpp, step 10 for the "
    "normalisation's own rounding) plus their oracles' difference. A kernel that places eps on the other side of the "
    "root, drops the weights, forgets the mean (the sum of squares), normalises over every head at once, or applies "
    "q's weights to k breaks it against its own plain path.";

std::optional<Violation> check_normalised(const Implementation& impl, const LawCase& c) {
  Problem p = outputs_first(impl, c.problem);
  p.want_weights = false;
  if (!p.qk_norm) return std::nullopt;  // a stored case the law does not draw
  Problem q = p;
  const QkNorm& n = *p.qk_norm;
  if (!n.q_weight.empty()) q.q = fold_qk_norm(p.q, n, n.q_weight, "qk-norm-as-normalised-inputs");
  if (!n.k_weight.empty()) q.k = fold_qk_norm(p.k, n, n.k_weight, "qk-norm-as-normalised-inputs");
  for (Tensor<double>* t : {&q.q, &q.k})
    for (double& x : t->values()) x = round_to(p.dtype, x);
  q.qk_norm.reset();
  return calls_agree("qk-norm-as-normalised-inputs", impl, p, q,
                     "the case without its QK-norm, on q and k normalised in "
                     "float64",
                     "a fused QK-norm is the call on the normalised q and k");
}

const char* kScaleWhy =
    "QK-norm divides each row by its own root mean square, so a row scaled by c > 0 is normalised back: w * cx / "
    "r(cx) = w * x / r(x) up to eps's share (r(cx) = sqrt(c^2 mean x^2 + eps), not c r(x)). The law scales every "
    "normalised side's rows by 2^3 and then 2^-3 (exact in the dtype while nothing overflows or underflows), and "
    "compares the outputs (and LSEs) with the case as drawn within both calls' bounds plus their float64 oracles' "
    "difference, which is eps's share exactly. A kernel that does not normalise, or normalises by the sum of "
    "squares, sees its scores move by c^2.";

std::optional<Violation> check_scale(const Implementation& impl, const LawCase& c) {
  Problem p = outputs_first(impl, c.problem);
  p.want_weights = false;
  if (!p.qk_norm) return std::nullopt;
  for (const int e : {3, -3}) {
    Problem q = p;
    const auto scale = [&](Tensor<double>& t) {
      for (double& x : t.values()) x = round_to(p.dtype, std::ldexp(x, e));
    };
    if (!p.qk_norm->q_weight.empty()) scale(q.q);
    if (!p.qk_norm->k_weight.empty()) scale(q.k);
    if (auto v = calls_agree("qk-norm-scale-invariance", impl, p, q,
                             "the case with every normalised row scaled by 2^" + std::to_string(e),
                             "QK-norm divides a row's scale out"))
      return v;
  }
  return std::nullopt;
}

}  // namespace qk_norm_law
}  // namespace

Law qk_norm_as_normalised_inputs() {
  using namespace qk_norm_law;
  return {"qk-norm-as-normalised-inputs",
          "a fused QK-norm gives what the call on q and k normalised in float64 gives",
          kNormalisedWhy,
          LawDoc{"56", "the call with a QK-norm and the same call without it on q, k normalised in float64 agree",
                 "both calls' derived bounds (step 10: the normalisation's rounding)"},
          needs_qk_norm,
          gen,
          check_normalised,
          0};
}

Law qk_norm_scale_invariance() {
  using namespace qk_norm_law;
  return {"qk-norm-scale-invariance",
          "a normalised row scaled by c > 0 changes nothing but through eps",
          kScaleWhy,
          LawDoc{"57", "every normalised row of q and k scaled by 2³ and 2⁻³ gives the same outputs and LSE",
                 "both calls' derived bounds plus the oracles' difference (eps's share)"},
          needs_qk_norm,
          gen,
          check_scale,
          0};
}

}  // namespace attncheck::law_kit
