// Law 5, first-position (exact): the first query's output is v0, its only visible value.
#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace first_position_law {

const char* kWhy =
    "The first query sees only key 0, so its weight there is exp(0)/exp(0) = 1 exactly and its output is v0 "
    "exactly, in every dtype (v0 is already representable). A leak from the future, a missing row of the mask "
    "or a first row left empty shows here first. (A batch entry whose key 0 is padding has no such row.) "
    "Exact: no tolerance.";

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  ProblemOptions po = outputs_only().causal_rule();  // a later token must never reach an earlier row
  po.allow.remove({Feature::sinks});  // with a sink, position 0's output is (1 - p_sink)·v_0
  po.allow_cross_lengths = false;
  return gen_problem(cfg, po);
}

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Outcome o = call(impl, p);
  const Shape& s = p.q.shape();
  Tensor<double> want = o.output;
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) want.head(b, h).row(0) = p.v.head(b, kv_of(p, h)).row(0);
  auto v = compare("first-position", "output", want, o.output, nullptr,
                   [&](Index b, Index h, Index i, Index) { return i == 0 && !sees_none(p, b, h, 0); });
  if (v) {
    const auto& ix = v->worst_index;
    v->message = "first-position: output" + idx({ix[0], ix[1], 0, ix[3]}) + " is " +
                 num(o.output(ix[0], ix[1], 0, ix[3])) + " but position 0 sees only key 0, so it must equal v" +
                 idx({ix[0], kv_of(p, ix[1]), 0, ix[3]}) + " = " + num(want(ix[0], ix[1], 0, ix[3]));
    v->weights = o.weights;
  }
  return v;
}

}  // namespace first_position_law
}  // namespace

Law first_position() {
  using namespace first_position_law;
  return {"first-position", "the first position's output equals v0, its only visible value", kWhy,
          LawDoc{"5", "the first query's output is v₀", "exact"},
          needs_square_shapes,
          gen, check, 0};
}

}  // namespace attncheck::law_kit
