// Law 10, paths-agree: the batched call agrees with one call per (b,h) slice.
#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {

const char* kWhy =
    "The batched call and one call per (batch, head) slice through the same implementation compute the same "
    "attention, so they agree within the sum of both results' derived oracle bounds. A kernel whose batched "
    "path indexes the wrong slice, strides over the wrong axis, or shares state across heads breaks it. (The "
    "reference core's own single-head and projection paths are checked against its batched path by the "
    "property tests in properties/tests.)";

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Outcome all = call(impl, p);
  const OracleRun r = run_oracle(p);
  const Shape& s = p.q.shape();
  Tensor<double> single(all.output.shape());
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) {
      single.head(b, h) = call(impl, slice_problem(p, b, h)).output.head(0, 0);
    }
  Tensor<double> tol = r.tol_out;
  tol.values() *= 2;
  auto v = compare("paths-agree", "output", single, all.output, &tol, {});
  if (v) {
    v->message += " (batched call vs. one call per (b,h) slice)";
    v->weights = all.weights;
  }
  return v;
}

}  // namespace

Law paths_agree() {
  return {"paths-agree", "the batched call agrees with one call per (b,h) slice", kWhy, always_applies,
          gen_outputs_only, check, 0};
}

}  // namespace attncheck::law_kit
