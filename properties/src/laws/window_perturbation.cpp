// window-perturbation (exact): keys older than the window never change an output.
#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace window_perturbation_law {

const char* kWhy =
    "A query at aligned position p with left window w never reads a key j < p - w, and later queries sit at "
    "later positions, so replacing the keys and values older than query t's window (extreme magnitudes "
    "included, and NaN or Inf for a kernel that claims select semantics) must leave the outputs of t and every "
    "later query bit-identical: masked terms add exact zeros and never raise the running max. A window that is "
    "too wide, measured from the wrong position, or applied only in some tiles lets an old value in. Exact: "
    "no tolerance. Applies to implementations that honour windows (Feature::window).";

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    ProblemOptions po = outputs_only();
    po.require.add(Feature::window);
    // Every row after t must sit at a position >= t's: positions grow with rows.
    po.allow.remove({Feature::query_documents});
    LawCase c = *gen_problem(cfg, po);
    const Problem& p = c.problem;
    const Index T_q = p.q.shape().T;
    // The query t: shrinks toward the last one, whose window leaves the most keys behind.
    const Index t = T_q - 1 - *rc::gen::inRange<Index>(0, T_q);
    const HiddenValues hv = *gen_hidden_values(cfg, p);
    const Index old_end = p.window ? std::clamp<Index>(p.visibility(0).position(t) - *p.window, 0, p.k.shape().T) : 0;
    Problem v = p;
    const Shape& ks = p.k.shape();
    for (Index b = 0; b < ks.B; ++b)
      for (Index g = 0; g < ks.H; ++g) {
        v.k.head(b, g).topRows(old_end) = hv.k.head(b, g).topRows(old_end);
        v.v.head(b, g).topRows(old_end) = hv.v.head(b, g).topRows(old_end);
      }
    c.variant = v;
    c.params["t"] = double(t);
    c.params["old_keys"] = double(old_end);
    c.tags.push_back(old_end > 0 ? hv.tag : "no-key-older-than-the-window");
    return c;
  });
}

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const Index t = int_param(c, "window-perturbation", "t", 0, c.problem.q.shape().T - 1),
              old_end = int_param(c, "window-perturbation", "old_keys", 0, c.problem.k.shape().T);
  const Outcome a = call(impl, c.problem), b = call(impl, variant_of(c, "window-perturbation"));
  auto v = compare("window-perturbation", "output", a.output, b.output, nullptr,
                   [t](Index, Index, Index i, Index) { return i >= t; });
  if (v) {
    v->message += "; only keys 0.." + std::to_string(old_end - 1) + ", older than query " + std::to_string(t) +
                  "'s window (" + std::to_string(c.problem.window.value_or(-1)) + "), were changed";
    v->weights = b.weights;
  }
  return v;
}

std::string not_applicable(const GenConfig& g) {
  return g.caps.declares(Feature::window)
             ? ""
             : "the implementation does not honour a sliding window (Feature::window)";
}

}  // namespace window_perturbation_law
}  // namespace

Law window_perturbation() {
  using namespace window_perturbation_law;
  return {"window-perturbation", "changing keys older than the window leaves every later output bit-identical", kWhy,
          LawDoc{"20", "replacing keys older than query t's window leaves t's and every later output bit-identical",
                 "exact"},
          not_applicable, gen, check, 0};
}

}  // namespace attncheck::law_kit
