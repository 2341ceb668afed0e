// Law 7, shift-invariance: adding the same vector to every key leaves the weights unchanged.
#include <cmath>

#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace shift_invariance_law {

const char* kWhy =
    "Adding the same vector c to every key adds q_i.c to every score of row i, a constant per row, and softmax "
    "is invariant to a constant added to a row: the weights must not change. A mask filled with 0 or a finite "
    "constant (the masked entries do not move with the row), or a softmax over the query axis, breaks it. A "
    "quarter of the cases (in float32 and float64, whose accumulators hold such scores) shift the scores by "
    "1e4 to 1e6 (c scaled so that the largest |scale q_i.c| is that), up or down: a running max started at a "
    "finite floor, a mask detected by a threshold or a softmax without its max subtraction breaks there. "
    "Tolerance: both results' derived oracle bounds (they grow with the scores' magnitude), plus the oracles' own "
    "difference (rounding k + c to the dtype makes the shift inexact); a hidden key's weight stays exactly 0.";

// The score shifts of the large regime: the largest |scale q_i.c| of a case.
constexpr double kLargeShifts[] = {1e4, 1e5, 1e6};

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    // A softcap bends the row's scores and a sink stays where it is: neither moves with the row. ALiBi does. A rope
    // rotates the added vector by each key's own position, so the row's scores move by different amounts; QK-norm
    // normalises each key with the vector in it.
    ProblemOptions po;
    po.allow.remove({Feature::softcap, Feature::sinks, Feature::rope, Feature::rope_interleaved, Feature::qk_norm,
                     Feature::qk_norm_eps_outside});
    LawCase c = *gen_problem(cfg, po);
    const Shape& ks = c.problem.k.shape();
    const double m = *gen_magnitude();
    // Large shifts (shrinking toward ordinary ones): which, and whether the largest score moves up or down.
    const bool wide = cfg.dtype == DType::f32 || cfg.dtype == DType::f64;
    const bool large = *weighted_choice<bool>({{3, false}, {1, true}}) && wide;
    const double L = kLargeShifts[*rc::gen::inRange<std::size_t>(0, 3)] * (*rc::gen::arbitrary<bool>() ? -1 : 1);
    auto shift = *gen_tensor({ks.B, ks.H, 1, ks.D}, Regime::normal, large ? 1.0 : m, cfg.dtype);
    if (large) {
      // Per kv head g: c = d·t with t = L / (scale · the largest q_i.d over the query heads reading g), so the
      // scores of the row that moves most move by |L|, in L's direction for the largest.
      const Problem& p = c.problem;
      const Shape& qs = p.q.shape();
      const double scale = scale_of(p);
      for (Index b = 0; b < ks.B; ++b)
        for (Index g = 0; g < ks.H; ++g) {
          double top = 0;
          for (Index h = 0; h < qs.H; ++h) {
            if (kv_of(p, h) != g) continue;
            for (Index i = 0; i < qs.T; ++i) {
              double dot = 0;
              for (Index d = 0; d < ks.D; ++d) dot += p.q(b, h, i, d) * shift(b, g, 0, d);
              if (std::abs(dot) > std::abs(top)) top = dot;
            }
          }
          const double t = top == 0 ? 0.0 : L / (scale * top);
          for (Index d = 0; d < ks.D; ++d) shift(b, g, 0, d) = round_to(cfg.dtype, shift(b, g, 0, d) * t);
        }
    }
    c.tags.push_back(large ? "shift=" + format_number(L, 1) : "shift=ordinary");
    Problem v = c.problem;
    for (Index b = 0; b < ks.B; ++b)
      for (Index h = 0; h < ks.H; ++h)
        for (Index j = 0; j < ks.T; ++j)
          for (Index d = 0; d < ks.D; ++d) v.k(b, h, j, d) = round_to(cfg.dtype, v.k(b, h, j, d) + shift(b, h, 0, d));
    c.variant = v;
    return c;
  });
}

// Long context, or probed weights: both problems' weights at the sampled keys, for every query row.
Verdict check_sampled(const Implementation& impl, const LawCase& c) {
  const Problem &p = c.problem, &q = variant_of(c, "shift-invariance");
  const std::vector<Index> keys = sampled_keys(impl, p);
  const WeightSample a = sample_weights(impl, p, keys), b = sample_weights(impl, q, keys);
  const OracleRun oa = run_oracle(p), ob = run_oracle(q);
  const Shape& s = a.w.shape();
  Tensor<double> tol(s);
  for (Index bb = 0; bb < s.B; ++bb)
    for (Index h = 0; h < s.H; ++h)
      for (Index i = 0; i < s.T; ++i)
        for (Index n = 0; n < s.D; ++n) {
          const Index j = keys[std::size_t(n)];
          tol(bb, h, i, n) = oa.weight_tol(p, bb, h, i, j) + ob.weight_tol(q, bb, h, i, j) +
                             std::abs(oa.weight(p, bb, h, i, j) - ob.weight(q, bb, h, i, j));
        }
  auto v = compare("shift-invariance", "weights", a.w, b.w, &tol, {});
  if (v) v->message += " after adding the same vector to every key";
  return on_sample(std::move(v), a, p);
}

Verdict check(const Implementation& impl, const LawCase& c) {
  if (samples_weights(impl, c.problem)) return check_sampled(impl, c);
  const Problem& shifted = variant_of(c, "shift-invariance");
  const Outcome a = call(impl, c.problem), b = call(impl, shifted);
  const OracleRun oa = run_oracle(c.problem), ob = run_oracle(shifted);
  Tensor<double> tol = oa.tol_w;
  tol.values() += ob.tol_w.values() + (oa.w.values() - ob.w.values()).cwiseAbs();
  auto v = compare("shift-invariance", "weights", *a.weights, *b.weights, &tol, {});
  if (v) {
    v->message += " after adding the same vector to every key";
    v->weights = b.weights;
  }
  return v;
}

}  // namespace shift_invariance_law
}  // namespace

Law shift_invariance() {
  using namespace shift_invariance_law;
  return {"shift-invariance", "adding the same vector to every key leaves the weights unchanged", kWhy,
          LawDoc{"7", "adding one vector to every key leaves the weights unchanged",
                 "both derived bounds + the oracle's own difference"},
          needs_weights, gen, check, 0};
}

}  // namespace attncheck::law_kit
