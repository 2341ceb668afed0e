// Law 45, extreme-scores: rows whose visible scores all sit far from 0 (below -5e4, -1e5, -1e6, above 1e5, or
// one channel 1000 times the others) still get a softmax: outputs agree with the oracle, and stay in the hull.
#include <array>

#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace extreme_scores_law {

const char* kWhy =
    "Softmax is invariant to a constant added to a row, so a row whose visible scores all lie near -1e5 must be "
    "weighted exactly as the same row near 0. Random inputs rarely make such rows (their scores spread as widely "
    "as they lie far out, so one key takes all the weight and most mistakes cancel): here one channel of every "
    "query (or every key) carries the offset L / scale, its partner is 1, and the other channels are at most 1, "
    "so each row's scores lie within about sqrt(D) of L. A running max that starts at a finite sentinel (-5e4, "
    "-1e4), a max or LSE held in half precision, scores clamped from below, a mask filled with a finite value "
    "above the row's scores, or exp(m_old) / exp(m_new) in place of exp(m_old - m_new) each turn such a row into "
    "NaN, a silent zero row, equal weights or weight on hidden keys. Checked three ways: the outputs against the "
    "float64 oracle within oracle-agreement's bound (its score error grows with |s|: (4u_a + u_s)|s|, so it is "
    "loose where the dtype cannot resolve the row, as it must be), and convex-hull's law on the case and on the "
    "case with V = 1, where every row that sees a key must output 1 (weights that sum to 1: its slack includes "
    "exp(10 u_a (max|s| + ln T)) - 1 for a kernel that normalises by a rounded LSE). The channel is limited to a "
    "quarter of the largest finite value of the type a kernel may keep QKᵀ in (float16 for float16, float "
    "otherwise), so no correct kernel overflows.";

/// The regimes drawn, simplest first: a score offset, or a channel's value (the massive-activation regime).
struct Level {
  double value;
  bool channel;  ///< true: `value` is the channel's value; false: the score offset L (channel = L / scale)
};
constexpr std::array<Level, 6> kLevels{{{-5e4, false}, {-1e5, false}, {-1e6, false}, {1e5, false}, {1e3, true},
                                        {-1e3, true}}};

std::string describe(const Level& lv, bool in_keys) {
  return lv.channel ? "channel 0 of every " + std::string(in_keys ? "key" : "query") + " set to " + num(lv.value) +
                          ", the others at most 1 (a massive activation)"
                    : "every visible score near " + num(lv.value) + " (channel 0 of every " +
                          std::string(in_keys ? "key" : "query") + " carries the offset)";
}

// The largest channel value no correct kernel overflows with: a quarter of the largest finite value of the type
// QKᵀ may be kept in (|q·k| <= |channel| + D - 1 with the other channels at most 1).
double channel_limit(const Problem& p) {
  const DType keep = p.dtype == DType::f64 ? DType::f64 : p.dtype == DType::f16 ? DType::f16 : DType::f32;
  return max_finite(keep) / 4 - double(p.q.shape().D);
}

// Channel 0 of q (or k) becomes the offset channel, its partner's channel 0 is 1, and every other channel is
// scaled to at most 1 in magnitude (shrinking still acts on the drawn values underneath).
void make_extreme(Problem& p, const Level& lv, bool in_keys) {
  const double limit = channel_limit(p);
  double ch = lv.channel ? lv.value : lv.value / scale_of(p);
  ch = round_to(p.dtype, std::copysign(std::min(std::abs(ch), limit), ch));
  const auto remake = [&](Tensor<double>& t, double first) {
    const Shape& s = t.shape();
    double m = 0;
    for (Index b = 0; b < s.B; ++b)
      for (Index h = 0; h < s.H; ++h)
        for (Index i = 0; i < s.T; ++i)
          for (Index d = 1; d < s.D; ++d) m = std::max(m, std::abs(t(b, h, i, d)));
    const double f = m > 1 ? 1 / m : 1;
    for (Index b = 0; b < s.B; ++b)
      for (Index h = 0; h < s.H; ++h)
        for (Index i = 0; i < s.T; ++i) {
          t(b, h, i, 0) = first;
          for (Index d = 1; d < s.D; ++d) t(b, h, i, d) = round_to(p.dtype, t(b, h, i, d) * f);
        }
  };
  remake(p.q, in_keys ? 1.0 : ch);
  remake(p.k, in_keys ? ch : 1.0);
}

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    // A softcap squashes the offset away and a sink stays at its own logit (the row's mass goes to it):
    // neither is this law's business (softcap-bound, sink-mass). A rope would rotate the offset's channel into
    // another, and QK-norm normalise it away: the scores would no longer all sit at the offset.
    ProblemOptions po = outputs_only();
    po.allow.remove({Feature::softcap, Feature::sinks, Feature::rope, Feature::rope_interleaved, Feature::qk_norm,
                     Feature::qk_norm_eps_outside});
    LawCase c = *gen_problem(cfg, po);
    std::vector<std::pair<std::size_t, std::size_t>> levels;
    for (std::size_t n = 0; n < kLevels.size(); ++n) levels.emplace_back(1, n);
    const std::size_t level = *weighted_choice(levels);
    const bool in_keys = *weighted_choice<bool>({{1, false}, {1, true}});
    make_extreme(c.problem, kLevels[level], in_keys);
    c.params["level"] = double(level);
    c.params["in_keys"] = in_keys ? 1 : 0;
    return c;
  });
}

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Level lv = kLevels[std::size_t(int_param(c, "extreme-scores", "level", 0, Index(kLevels.size()) - 1))];
  const std::string regime = describe(lv, int_param(c, "extreme-scores", "in_keys", 0, 1) == 1);
  const auto seen = seen_rows(p);
  const Outcome o = call(impl, p);
  OracleRun r = run_oracle(p);
  widen_by_reference_error(p, r);
  if (auto v = compare("extreme-scores", "output", r.out, o.output, &r.tol_out, seen)) {
    v->message += ", with " + regime;
    return v;
  }
  Problem ones = p;
  ones.v.values().setOnes();
  if (auto v = hull_violation("extreme-scores", impl, ones)) {
    v->message += " (V = 1: the row's weights do not sum to 1), with " + regime;
    return v;
  }
  if (auto v = hull_violation("extreme-scores", impl, p)) {
    v->message += ", with " + regime;
    return v;
  }
  return std::nullopt;
}

}  // namespace extreme_scores_law
}  // namespace

Law extreme_scores() {
  using namespace extreme_scores_law;
  return {"extreme-scores",
          "rows whose visible scores all lie far from 0 (-5e4 to -1e6, 1e5, a massive channel) still agree with the "
          "oracle and sum to 1",
          kWhy,
          LawDoc{"45",
                 "rows whose visible scores all lie near −5e4, −1e5, −1e6 or +1e5, or under one channel of ±1000 (a massive activation), agree with the oracle, stay in the hull, and output 1 with V = 1",
                 "oracle-agreement's bound; convex-hull's slack"},
          always_applies, gen, check, 0};
}

}  // namespace attncheck::law_kit
