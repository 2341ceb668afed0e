// Law 10, paths-agree: the batched call agrees with one call per (b,h) slice.
#include <algorithm>
#include <utility>
#include <vector>

#include <optional>
#include <vector>

#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace paths_agree_law {

const char* kWhy =
    "The batched call and one call per (batch, head) slice through the same implementation compute the same "
    "attention, so they agree within the sum of both results' derived oracle bounds. A kernel whose batched "
    "path indexes the wrong slice, strides over the wrong axis, or shares state across heads breaks it. (The "
    "reference core's own single-head and projection paths are checked against its batched path by the "
    "property tests in properties/tests.) The slices called alone are the corners (B-1,H-1), (B-1,0) and "
    "(0,H-1): every slice but (0,0) has a non-zero batch or head offset, and these have the largest.";

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Outcome all = call(impl, p);
  const OracleRun r = run_oracle(p);
  const Shape& s = p.q.shape();
  // At most three slices alone, not B·H (16 calls at the default bounds): the far corners, where a batch or
  // head stride taken from the wrong axis lands furthest from the right slice; (0,0) has no offset to get
  // wrong. A 1 x 1 problem is its own slice, called alone once.
  std::vector<std::pair<Index, Index>> slices;
  for (const auto& bh : {std::pair{s.B - 1, s.H - 1}, std::pair{s.B - 1, Index{0}}, std::pair{Index{0}, s.H - 1}})
    if (std::find(slices.begin(), slices.end(), bh) == slices.end()) slices.push_back(bh);
  Tensor<double> single(all.output.shape());
  std::vector<char> called(std::size_t(s.B * s.H), 0);
  std::vector<std::optional<Outcome>> alone(std::size_t(s.B * s.H));
  for (const auto& [b, h] : slices) {
    alone[std::size_t(b * s.H + h)] = call(impl, slice_problem(p, b, h));
    single.head(b, h) = alone[std::size_t(b * s.H + h)]->output.head(0, 0);
    called[std::size_t(b * s.H + h)] = 1;
  }
  Tensor<double> tol = r.tol_out;
  tol.values() *= 2;
  auto v = compare("paths-agree", "output", single, all.output, &tol,
                   [&](Index b, Index h, Index, Index) { return called[std::size_t(b * s.H + h)] != 0; });
  if (v) {
    v->message += " (batched call vs. one call per (b,h) slice)";
    v->weights = all.weights;
    const Index b = v->worst_index[0], h = v->worst_index[1];
    if (const auto& o = alone[std::size_t(b * s.H + h)])
      blame_derived_call(*v, p, all, slice_problem(p, b, h), *o, {0, 0, v->worst_index[2], v->worst_index[3]},
                         "slice (b,h) = (" + std::to_string(b) + "," + std::to_string(h) + ") called alone");
  }
  return v;
}

}  // namespace paths_agree_law
}  // namespace

Law paths_agree() {
  using namespace paths_agree_law;
  return {"paths-agree", "the batched call agrees with one call per (b,h) slice", kWhy,
          LawDoc{"10", "the batched call agrees with one call per (b,h) slice", "both derived bounds"},
          always_applies,
          gen_outputs_only, check, 0};
}

}  // namespace attncheck::law_kit
