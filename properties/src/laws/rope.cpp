// Rotary position embeddings' laws: rope-as-rotated-inputs (the call with a rope and the call without one on q and
// k rotated in float64 agree) and rope-relative-positions (moving every position by the same amount changes
// nothing: q'_i·k'_j depends on the positions only through their difference).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace rope_law {

// RoPE's bound is materialised only (tolerance.cpp step 9 reads the rotated q and k), and the generators draw a rope
// only up to 2^18 weights: the laws draw T <= 128 and say why they do not apply past that.
constexpr Index kMaxT = 128;  // B, H <= 4 at 128 x 128: 2^18 weights

std::string needs_rope(const GenConfig& g) {
  if (!g.caps.declares(Feature::rope) && !g.caps.declares(Feature::rope_interleaved))
    return "needs rotary embeddings in either pairing (ATTNCHECK_CAP4_ROPE, _ROPE_INTERLEAVED), which this "
           "implementation does not declare";
  if (g.shape &&
      double((*g.shape)[0]) * double((*g.shape)[1]) * double((*g.shape)[2]) * double((*g.shape)[3]) > double(1 << 18))
    return "a rope's bound is derived for up to 2^18 weights (B·H·T_q·T_k), and the pinned shape is past it";
  if (g.shape && (*g.shape)[4] < 2) return "a rope rotates pairs of head dimensions, and the pinned shape has D = 1";
  if (!g.long_lengths.empty()) return "a rope's bound is derived for up to 2^18 weights, and --long is past it";
  if (g.min_T > kMaxT)
    return "draws T <= 128 (a rope's bound is derived for up to 2^18 weights), but the run asks for T >= " +
           std::to_string(g.min_T);
  return "";
}

rc::Gen<LawCase> gen(const GenConfig& config) {
  GenConfig cfg = config;
  cfg.max_T = std::min(cfg.max_T, kMaxT);
  cfg.max_T_tail = std::min(cfg.max_T_tail, kMaxT);
  cfg.max_B = std::min<Index>(cfg.max_B, 4);  // so that every case is within 2^18 weights and gets its rope
  cfg.max_H = std::min<Index>(cfg.max_H, 4);
  // An even D, so that every case has a pair to rotate (a multiple of 2 and of what the implementation declares).
  cfg.caps.head_dim_multiple = std::lcm(std::max<Index>(cfg.caps.head_dim_multiple, 1), Index{2});
  ProblemOptions po = outputs_only();
  // Every case has a rope (gen_modifiers draws one when either variant is required), in either declared variant.
  po.require.add(cfg.caps.declares(Feature::rope) ? Feature::rope : Feature::rope_interleaved);
  // QK-norm comes before the rope, and its weights do not commute with a rotation: the law's rotated inputs would
  // be normalised after it.
  po.allow.remove({Feature::qk_norm, Feature::qk_norm_eps_outside});
  po.want_lse = cfg.caps.declares(Feature::lse);
  return gen_problem(cfg, po);
}

// ---- rope-as-rotated-inputs ------------------------------------------------------------------------------------

const char* kRotatedWhy =
    "A fused rope is the call on rotated inputs: head dimensions below rotary_dim of q and k are rotated in pairs by "
    "their tokens' position angles before the scores. So the call with the rope and the same call without it, on q "
    "and k rotated in float64 and rounded to the dtype as a call carries them, are the same attention. The law "
    "compares their outputs (and LSEs, where returned) within both calls' derived bounds (attention/src/"
    "tolerance.cpp, step 9 for the rotation's own rounding, which grows with the position) plus what their float64 "
    "oracles differ by (the inputs' rounding). A kernel that ignores rotary_dim, pairs the dims the other way "
    "(interleaved for half-split), rotates by the row index instead of the position ids, leaves K unrotated, applies "
    "cos twice, or hard-codes the base breaks it against its own plain path.";

std::optional<Violation> check_rotated(const Implementation& impl, const LawCase& c) {
  Problem p = outputs_first(impl, c.problem);
  p.want_weights = false;
  if (!p.rope) return std::nullopt;  // a stored case the law does not draw
  Problem q = p;
  q.q = fold_rope(p.q, *p.rope, p.rope->q_positions, "rope-as-rotated-inputs");
  q.k = fold_rope(p.k, *p.rope, p.rope->k_positions, "rope-as-rotated-inputs");
  for (Tensor<double>* t : {&q.q, &q.k})
    for (double& x : t->values()) x = round_to(p.dtype, x);
  q.rope.reset();
  return calls_agree("rope-as-rotated-inputs", impl, p, q, "the case without its rope, on q and k rotated in float64",
                     "a fused rope is the call on the rotated q and k");
}

// ---- rope-relative-positions -----------------------------------------------------------------------------------

const char* kRelativeWhy =
    "Rotating q_i by its position's angles and k_j by its own makes q'_i·k'_j a function of q_i, k_j and the "
    "difference of their positions only (R(a)^T R(b) = R(b - a)). So adding the same c to every query's and key's "
    "position changes no score: the law compares the call with every position moved by c (1 and 2^12; a stored "
    "case keeps its positions and the law moves them) with the case as drawn, outputs and LSEs, within both calls' "
    "derived bounds, whose step 9 grows with the larger positions (a kernel's float angle at position 10^5 is off "
    "by about 10^-2). A kernel that rotates only q, rotates q by the keys' positions, or measures from the row "
    "index instead of the position ids breaks it; so does one whose positions wrap (an int16 index).";

std::optional<Violation> check_relative(const Implementation& impl, const LawCase& c) {
  Problem p = outputs_first(impl, c.problem);
  p.want_weights = false;
  if (!p.rope) return std::nullopt;
  for (const Index shift : {Index{1}, Index{1} << 12}) {
    Problem q = p;
    for (Index& x : q.rope->q_positions) x += shift;
    for (Index& x : q.rope->k_positions) x += shift;
    if (auto v = calls_agree("rope-relative-positions", impl, p, q,
                             "the case with every query's and key's position moved by " + std::to_string(shift),
                             "a rope's scores depend on the positions only through their differences"))
      return v;
  }
  return std::nullopt;
}

}  // namespace rope_law
}  // namespace

Law rope_as_rotated_inputs() {
  using namespace rope_law;
  return {"rope-as-rotated-inputs",
          "a fused rope gives what the call on q and k rotated in float64 gives",
          kRotatedWhy,
          LawDoc{"54", "the call with a rope and the same call without it on q, k rotated in float64 agree",
                 "both calls' derived bounds (step 9: the rotation's rounding, growing with the position)"},
          needs_rope,
          gen,
          check_rotated,
          0};
}

Law rope_relative_positions() {
  using namespace rope_law;
  return {"rope-relative-positions",
          "moving every position by the same amount changes no output",
          kRelativeWhy,
          LawDoc{"55", "every query and key position moved by c (1 and 2¹²) gives the same outputs and LSE",
                 "both calls' derived bounds (step 9 at the larger positions)"},
          needs_rope,
          gen,
          check_relative,
          0};
}

}  // namespace attncheck::law_kit
