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

// A long context: dQ of 16 blocks of 64 query rows and dK, dV of 16 blocks of 64 keys (the first, the last and
// evenly between), the oracle and its bound computed for those rows alone (GradientRows; each row's softmax
// statistics and Δ still over every row). Every other row of the implementation's gradients is not compared, and
// the result's note says so. The passes over every key tile and every query block were most of the law's time
// (90 of a 5 min check of the reference at T = 16384); what a long context adds (a position, a tile boundary or
// a sum that breaks past some length) shows on the last blocks and at the powers of two the blocks cross.
Verdict check_long(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  GradientRows rows{sample_row_blocks(p.q.shape().T), sample_row_blocks(p.k.shape().T)};
  const Gradients g = accept_nan_empty_rows(impl, p, call_backward(impl, p));
  const GradientCheck r = run_gradient_oracle(p, &rows);
  const auto in = [](const std::vector<Index>& sample, Index T) {
    auto on = std::make_shared<std::vector<char>>(std::size_t(T), 0);
    for (const Index i : sample) (*on)[std::size_t(i)] = 1;
    return Include([on](Index, Index, Index i, Index) { return (*on)[std::size_t(i)] != 0; });
  };
  const std::string note = "long context: dQ compared on " + std::to_string(rows.queries.size()) + " of " +
                           std::to_string(p.q.shape().T) + " query rows, dK and dV on " +
                           std::to_string(rows.keys.size()) + " of " + std::to_string(p.k.shape().T) +
                           " keys (blocks of 64: the first, the last and evenly between)";
  auto v = compare_gradients("grad-oracle", r.oracle, g, &r.tolerance, in(rows.queries, p.q.shape().T),
                             in(rows.keys, p.k.shape().T));
  if (v) v->message += " [" + note + "]";
  return {std::move(v), note};
}

Verdict check(const Implementation& impl, const LawCase& c) {
  if (long_context(c.problem)) return check_long(impl, c);
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
