// Law 2, zero-future-weight (exact): every weight on a key a query may not see is exactly 0.
#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {

const char* kWhy =
    "A query must give no weight at all to a key in its future (nor to a padded key, nor to one outside its "
    "window): exp(-inf) is exactly 0 in every dtype, so a correct kernel's hidden weights are exactly 0, not "
    "small. A mask filled with 0 or a finite constant, a reversed or off-by-one mask, or a mask broadcast over "
    "the wrong axis leaves weight there. In a row that sees no key at all a weight may also be NaN, when the "
    "implementation follows (or does not declare otherwise than) the nan empty-row convention; a finite non-zero "
    "weight there is still a leak. Exact: no tolerance.";

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Outcome o = call(impl, p);
  const Tensor<double>& w = *o.weights;
  const Tensor<double> zeros(w.shape());
  const bool nan_allowed = impl.capabilities().empty_rows != EmptyRows::zero;
  auto v = compare("zero-future-weight", "weights", zeros, w, nullptr, [&](Index b, Index h, Index i, Index j) {
    const KeyRange r = keys_of(p, b, i);
    if (r.empty()) return !(nan_allowed && std::isnan(w(b, h, i, j)));
    return !r.contains(j);
  });
  if (!v) return v;
  const auto& ix = v->worst_index;
  v->message = "zero-future-weight: weights" + idx({ix[0], ix[1], ix[2], ix[3]}) + " = " +
               num(w(ix[0], ix[1], ix[2], ix[3])) + ", but key " + std::to_string(ix[3]) + " is " +
               why_hidden(p, ix[0], ix[2], ix[3]) + " and its weight must be exactly 0";
  v->weights = w;
  v->expected.reset();
  return v;
}

}  // namespace

Law zero_future_weight() {
  return {"zero-future-weight", "every weight on a future key is exactly 0", kWhy, needs_weights, gen_plain, check,
          0};
}

}  // namespace attncheck::law_kit
