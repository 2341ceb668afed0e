// Law 3, causal-perturbation (exact): changing tokens after t leaves every output at positions <= t
// bit-identical.
#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace causal_perturbation_law {

const char* kWhy =
    "Changing tokens after position t (their queries, keys and values, extreme magnitudes included) must not "
    "change any output at positions <= t, bit for bit: a correct kernel never lets a future value into an "
    "earlier row's arithmetic (masked terms add exact zeros and never raise the running max). This is the "
    "behavioural check the source card asks for, stronger than inspecting the mask. Exact: no tolerance, but "
    "+0 and -0 are equal (a row that sees no key returns 0 * v in FlashAttention's reference, whose sign follows "
    "the future values).";

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    LawCase c = *gen_problem(cfg, outputs_only().causal_rule());
    const Problem& p = c.problem;
    const Shape& s = p.q.shape();
    const Index t = *rc::gen::inRange<Index>(0, std::max<Index>(s.T - 1, 1));
    // Capped for kernels without select semantics (see cap_replacement_magnitude).
    const double m = cap_replacement_magnitude(cfg, p, *gen_replacement_magnitude(cfg.dtype));
    const auto q2 = *gen_tensor(s, Regime::normal, m, cfg.dtype);
    const auto k2 = *gen_tensor(p.k.shape(), Regime::normal, m, cfg.dtype);
    const auto v2 = *gen_tensor(p.v.shape(), Regime::normal, m, cfg.dtype);
    c.variant = perturb_future(p, t, q2, k2, v2);
    c.params["t"] = double(t);
    c.tags.push_back(m >= 1e6 ? "perturbation=extreme" : "perturbation=ordinary");
    return c;
  });
}

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  return check_earlier_outputs_unchanged("causal-perturbation", "changed", impl, c);
}

}  // namespace causal_perturbation_law
}  // namespace

Law causal_perturbation() {
  using namespace causal_perturbation_law;
  return {"causal-perturbation",
          "changing tokens after t (extreme values included) leaves outputs at <= t bit-identical",
          kWhy,
          LawDoc{"3", "replacing queries, keys, values after t (extreme magnitudes too) leaves outputs ≤ t unchanged",
                 "exact (bit-identical)"},
          always_applies,
          gen,
          check,
          0};
}

}  // namespace attncheck::law_kit
