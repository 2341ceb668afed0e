// Law 2, zero-future-weight (exact): every weight on a key a query may not see is exactly 0.
#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace zero_future_weight_law {

const char* kWhy =
    "A query must give no weight at all to a key in its future (nor to a padded key, nor to one outside its "
    "window): exp(-inf) is exactly 0 in every dtype, so a correct kernel's hidden weights are exactly 0, not "
    "small. A mask filled with 0 or a finite constant, a reversed or off-by-one mask, or a mask broadcast over "
    "the wrong axis leaves weight there. In a row that sees no key at all a weight may also be NaN, when the "
    "implementation follows (or does not declare otherwise than) the nan empty-row convention; a finite non-zero "
    "weight there is still a leak. Exact: no tolerance.";

Verdict check(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  return hidden_weights_are_zero("zero-future-weight", impl, p, hidden_keys(p));
}

}  // namespace zero_future_weight_law
}  // namespace

Law zero_future_weight() {
  using namespace zero_future_weight_law;
  return {"zero-future-weight", "every weight on a future key is exactly 0", kWhy,
          LawDoc{"2", "every weight on a future key is 0", "exact"},
          needs_weights, gen_plain, check,
          0};
}

}  // namespace attncheck::law_kit
