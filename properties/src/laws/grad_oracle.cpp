// Gradient law grad-oracle: dQ, dK and dV agree with the float64 oracle backward within the derived bound.
#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace grad_oracle_law {

const char* kWhy =
    "The backward pass must return the gradient of sum(dO * O): dV = P^T dO, dS = P o (dO V^T - rowsum(dO o O)), "
    "dQ = scale dS K, dK = scale dS^T Q, with a shared kv head's dK and dV summed over its group. attncheck's "
    "float64 oracle backward computes exactly that on the same (already rounded) inputs and dO. Tolerance per "
    "element, derived in attention/src/backward.cpp: the forward's relative weight error rho (score rounding "
    "through the softmax) and the dtype's rounding of weights, dO V^T (gamma_D), the row sum Delta (gamma_T), "
    "dS, the final sums (gamma_T for dQ, gamma over the group's T_q queries for dK and dV) and the stored "
    "gradient (u_s), doubled, plus flush-to-zero floors (each intermediate below the smallest normal may be 0). "
    "Rows that see no key must have dQ = 0; under the nan empty-row convention their dO is 0 and their dQ may "
    "be all NaN, but every other gradient must be finite: a NaN from such a row that reaches dK or dV fails.";

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const Gradients g = accept_nan_empty_rows(impl, c.problem, call_backward(impl, c.problem));
  const GradientCheck r = run_gradient_oracle(c.problem);
  return compare_gradients("grad-oracle", r.oracle, g, &r.tolerance);
}

}  // namespace grad_oracle_law
}  // namespace

Law grad_oracle() {
  using namespace grad_oracle_law;
  return {"grad-oracle", "dQ, dK and dV agree with the float64 oracle backward within the derived bound",
          kWhy,
          LawDoc{"34", "dQ, dK, dV agree with the float64 oracle backward", "derived (`attention/src/backward.cpp`)"},
          needs_backward,
          gen_gradients, check,
          0,             true};
}

}  // namespace attncheck::law_kit
