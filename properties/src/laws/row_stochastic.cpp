// Law 1, row-stochastic: every row of weights with a visible key is >= 0, finite and sums to 1.
#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {

const char* kWhy =
    "Softmax turns each query's scores into a probability distribution over the keys it can see: every weight "
    "is finite and >= 0, and a row with at least one visible key sums to 1. A mask applied after softmax, "
    "softmax over the query axis, or an overflow to NaN breaks it. Tolerance on |sum - 1|: the T_k-term sum "
    "and the division give gamma_{2T_k}(u_a) + 2u_a in the accumulation type (2T_k covers an online softmax's "
    "rescalings), rounding each weight to the dtype adds u_s in all plus the dtype's subnormal floor per weight, "
    "and the check's own double sum adds gamma_{T_k}(2^-53); the whole is doubled.";

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Outcome o = call(impl, p);
  const Tensor<double>& w = *o.weights;
  const Shape& s = w.shape();
  const double u_a = accumulation_roundoff(p.dtype), u_s = unit_roundoff(p.dtype);
  const double tol = kSafety * (gamma(2 * s.D, u_a) + 2 * u_a + u_s + double(s.D) * storage_floor(p.dtype)) +
                     gamma(s.D, std::ldexp(1.0, -53));
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index i = 0; i < s.T; ++i) {
        if (keys_of(p, b, i).empty()) continue;  // a row that sees no key: its convention, not this law
        double sum = 0;
        for (Index j = 0; j < s.D; ++j) {
          const double x = w(b, h, i, j);
          if (!std::isfinite(x) || x < 0) {
            Violation v;
            v.quantity = "weights";
            v.worst_index = {b, h, i, j};
            v.magnitude = x;
            v.message = "row-stochastic: weights" + idx({b, h, i, j}) + " is " + num(x) +
                        (std::isfinite(x) ? " (negative)" : " (not finite)");
            v.weights = w;
            v.actual = w;
            return v;
          }
          sum += x;
        }
        if (std::abs(sum - 1) > tol) {
          Violation v;
          v.quantity = "weights";
          v.worst_index = {b, h, i};
          v.magnitude = std::abs(sum - 1);
          v.tolerance = tol;
          v.message = "row-stochastic: row " + idx({b, h, i}) + " of the weights sums to " + num(sum) +
                      ", not 1 (off by " + num(std::abs(sum - 1)) + ", tolerance " + num(tol) + ")";
          v.weights = w;
          v.actual = w;
          return v;
        }
      }
  return std::nullopt;
}

}  // namespace

Law row_stochastic() {
  return {"row-stochastic", "every row of weights with a visible key is >= 0, finite and sums to 1", kWhy,
          needs_weights, gen_plain, check, 0};
}

}  // namespace attncheck::law_kit
