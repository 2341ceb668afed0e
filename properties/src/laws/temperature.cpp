// The per-query temperature's law: temperature-as-query-scale (a temperature τ_i divides query i's scaled scores,
// which is attention on the query q_i/τ_i: the call with the temperature and the call on the divided queries
// without one agree).
#include <cmath>
#include <string>

#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace temperature_law {

const char* kWhy =
    "A temperature tau_i divides the scaled scores of query i before the softcap: s_ij = scale (q_i . k_j) / tau_i "
    "= scale ((q_i / tau_i) . k_j). So the call with the temperature and the same call without one, on the queries "
    "q_i / tau_i (rounded to the dtype, as a call carries them: exact where tau_i is a power of two), are the same "
    "attention. The law compares the two calls' outputs (and LSEs, where returned) within both calls' derived bounds "
    "(attention/src/tolerance.cpp, step 8 for the temperature's own roundings) plus what their float64 oracles differ "
    "by (the rounding of q_i / tau_i, nothing for a power of two). A kernel that multiplies by the temperature "
    "(Llama 4's factor 1/tau taken for tau), applies it after the softcap, to the keys, or from another head or "
    "query, or leaves it out of its LSE breaks it against its own plain path.";

std::string needs_temperature(const GenConfig& g) {
  if (!g.caps.declares(Feature::temperature))
    return "needs a per-query temperature (ATTNCHECK_CAP4_TEMPERATURE), which this implementation does not declare";
  return "";
}

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  ProblemOptions po = outputs_only();
  po.require.add(Feature::temperature);
  // QK-norm would normalise the divided query back: the law's second call would lose its τ.
  po.allow.remove({Feature::qk_norm, Feature::qk_norm_eps_outside});
  po.want_lse = cfg.caps.declares(Feature::lse);
  return gen_problem(cfg, po);
}

// p without its temperature, each query row divided by it (rounded to the dtype).
Problem divided_queries(const Problem& p) {
  Problem r = p;
  r.q = fold_temperature(p.q, p.options());
  for (double& x : r.q.values()) x = round_to(p.dtype, x);
  r.temperature.reset();
  return r;
}

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const char* law = "temperature-as-query-scale";
  Problem p = outputs_first(impl, c.problem);
  p.want_weights = false;
  if (!p.temperature) return std::nullopt;  // a stored case the law does not draw
  const Problem q = divided_queries(p);
  return calls_agree(law, impl, p, q, "the case without its temperature, each query q_i divided by tau_i instead",
                     "a temperature tau_i is the query q_i divided by it");
}

}  // namespace temperature_law
}  // namespace

Law temperature_as_query_scale() {
  using namespace temperature_law;
  return {"temperature-as-query-scale",
          "a query's temperature gives what the query divided by it gives",
          kWhy,
          LawDoc{"53", "the call with temperatures τ_i and the same call on the queries q_i/τ_i without them agree",
                 "both calls' derived bounds (lse-oracle's for the LSE)"},
          needs_temperature,
          gen,
          check,
          0};
}

}  // namespace attncheck::law_kit
