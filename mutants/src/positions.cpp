// Kernels whose bug shows only at long contexts (`--long`): a position held in 16 bits wraps at 2^15
// (xformers' NaN past 32,768 positions). Each is a correct head but for its one mistake; the kill tests and the
// kill matrix check them over keys of 2^15 ± 1 and 2^16 ± 1 (Mutant::long_context, mutant_options).
#include <cstdint>

#include "parts.hpp"

namespace attncheck::zoo {

std::vector<Mutant> position_mutants() {
  Capabilities caps = gqa_capabilities();
  caps.features.add({Feature::key_padding, Feature::window});
  std::vector<Mutant> z;
  z.push_back(Mutant{
      .impl = rule_impl("mutant:position-int16", "the causal comparison on int16 positions",
                        [](const HeadCtx& c, const Visibility& v, Index i, Index j) {
                          // j <= p with both held as int16_t: from p = 32768 on, p wraps to -32768 and every
                          // earlier key (j < 32768 stays positive) looks like the future.
                          return v.visible(i, j) && std::int16_t(j) <= std::int16_t(c.position(i));
                        },
                        caps),
      .bug = "query and key positions held in int16: the causal test j <= p wraps at 2^15, so a query at position "
             "32768 or later sees none of the first 32768 keys",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "a position past 32767: one query (a decode step, bottom-right) over 2^15 + 1 keys; at 2^15 - 1 "
                     "keys every position fits",
      .killed_by = {"oracle-agreement", "convex-hull"},
      .long_context = true,
  });
  return z;
}

}  // namespace attncheck::zoo
