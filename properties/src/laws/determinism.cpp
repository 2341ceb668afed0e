// Law 11, determinism (exact): the same call twice is bit-identical.
#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {

const char* kWhy =
    "The same call twice gives bit-identical outputs and weights. A kernel that keeps state between calls, "
    "reads uninitialised memory or depends on thread timing breaks it; such bugs also make every other "
    "counterexample impossible to replay. Exact: no tolerance.";

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const Outcome a = call(impl, c.problem), b = call(impl, c.problem);
  if (auto v = compare("determinism", "output", a.output, b.output, nullptr, {})) {
    v->message += " on the second identical call";
    v->weights = b.weights;
    return v;
  }
  if (a.weights && b.weights)
    if (auto v = compare("determinism", "weights", *a.weights, *b.weights, nullptr, {})) {
      v->message += " on the second identical call";
      v->weights = b.weights;
      return v;
    }
  return std::nullopt;
}

}  // namespace

Law determinism() {
  return {"determinism", "the same call twice is bit-identical", kWhy, always_applies, gen_plain, check, 0};
}

}  // namespace attncheck::law_kit
