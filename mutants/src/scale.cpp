// Mutants whose mistake is the scale or the head dimension: forgotten, 1/D, or √ of the wrong extent (each honours an explicit scale
// and gets only the default wrong); and two that get only an explicit scale wrong (ignored, or taken as a
// temperature), whose minimal case is D = 1 with a scale other than 1 there.
#include "parts.hpp"

namespace attncheck::zoo {
namespace {

// Correct causal attention at the scale `pick(c, K)` chooses when the problem gives none.
template <class Pick>
auto with_default_scale(Pick pick) {
  return [pick](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
    using A = typename std::decay_t<decltype(Q)>::Scalar;
    const double scale = c.scale ? *c.scale : pick(c, K);
    HeadOut<A> r;
    r.weights = softmax_rows<A>(causal_select<A>(scores(Q, K, scale), c));
    r.output = mix_visible(r.weights, V, c);
    return r;
  };
}

// Correct causal attention at the scale `pick(explicit_scale)` makes of an explicit scale; the default is right.
template <class Pick>
auto with_explicit_scale(Pick pick) {
  return [pick](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
    using A = typename std::decay_t<decltype(Q)>::Scalar;
    const double scale = c.scale ? pick(*c.scale, c) : 1.0 / std::sqrt(static_cast<double>(c.D));
    HeadOut<A> r;
    r.weights = softmax_rows<A>(causal_select<A>(scores(Q, K, scale), c));
    r.output = mix_visible(r.weights, V, c);
    return r;
  };
}

}  // namespace

std::vector<Mutant> scale_mutants() {
  std::vector<Mutant> z;
  z.push_back(Mutant{
      .impl = head_impl("mutant:scale-forgotten", "default scale 1: QKᵀ is never divided by √D",
                        with_default_scale([](const HeadCtx&, const auto&) { return 1.0; })),
      .bug = "scale forgotten: scores are QKᵀ, not QKᵀ/√D",
      .minimal_shape = {1, 1, 1, 2},
      .why_minimal = "1/sqrt(D) = 1 at D = 1, so D = 2; the scale matters only when one query weighs two keys: T_q = "
                     "1, T_k = 2 under bottom-right",
      .killed_by = {"scale-variance", "oracle-agreement"},
  });
  z.push_back(Mutant{
      .impl = head_impl("mutant:scale-one-over-d", "default scale 1/D instead of 1/√D",
                        with_default_scale([](const HeadCtx& c, const auto&) { return 1.0 / double(c.D); })),
      .bug = "scale 1/D instead of 1/√D",
      .minimal_shape = {1, 1, 1, 2},
      .why_minimal = "1/D = 1/sqrt(D) at D = 1, so D = 2; the scale matters only when one query weighs two keys: T_q = "
                     "1, T_k = 2 under bottom-right",
      .killed_by = {"scale-variance", "oracle-agreement"},
  });
  // K is [T_k,D] row-major here: K.rows() is T_k, the head dimension is K.cols().
  z.push_back(Mutant{
      .impl = head_impl("mutant:scale-rows-for-cols", "default scale 1/√T_k: K.rows() read as the head dim",
                        with_default_scale([](const HeadCtx&, const auto& K) {
                          return 1.0 / std::sqrt(static_cast<double>(K.rows()));
                        })),
      .bug = "scale 1/√T_k instead of 1/√D: rows and columns of K confused",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "1/sqrt(T_k) must differ from 1/sqrt(D) = 1 and one query must weigh two keys: T_q = 1, T_k = 2 "
                     "under bottom-right, D = 1",
      .killed_by = {"oracle-agreement", "scale-variance"},
  });
  // An explicit scale matters only where it is not the default: at D = 1 a scale of 1 is the default, so the
  // minimal case is D = 1 with a scale other than 1 (shrinking must move the scale into q as D drops).
  z.push_back(Mutant{
      .impl = head_impl("mutant:scale-explicit-ignored", "an explicit scale is ignored: the kernel always uses 1/√D",
                        with_explicit_scale([](double, const HeadCtx& c) { return 1.0 / std::sqrt(double(c.D)); })),
      .bug = "explicit scale ignored: the softmax_scale argument is accepted but never passed to the kernel",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "the scale matters only when one query weighs two keys (T_q = 1, T_k = 2 under bottom-right) and "
                     "only when it is not the default: D = 1 with an explicit scale other than 1",
      .killed_by = {"oracle-agreement"},
  });
  z.push_back(Mutant{
      .impl = head_impl("mutant:scale-explicit-inverted",
                        "an explicit scale is taken as a temperature: scores are divided by it",
                        with_explicit_scale([](double s, const HeadCtx&) { return 1.0 / s; })),
      .bug = "explicit scale inverted: QKᵀ / scale instead of QKᵀ · scale (the option read as a softmax temperature)",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "1/scale = scale only at scale 1, and one query must weigh two keys: T_q = 1, T_k = 2 under "
                     "bottom-right, D = 1 with an explicit scale other than 1",
      .killed_by = {"oracle-agreement"},
  });
  // Tiled kernels pad the head dimension to their tile (FlashAttention: 32, 64, ...) and some take the scale from
  // the padded extent: right at every D that is a multiple of 8, wrong at every other.
  z.push_back(Mutant{
      .impl = head_impl("mutant:scale-padded-head-dim", "default scale 1/√(D rounded up to a multiple of 8)",
                        with_default_scale([](const HeadCtx& c, const auto&) {
                          return 1.0 / std::sqrt(static_cast<double>((c.D + 7) / 8 * 8));
                        })),
      .bug = "scale from the padded head dimension: 1/√(⌈D/8⌉·8) instead of 1/√D (wrong unless 8 divides D)",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "D = 1 is padded to 8, so the scale is 1/√8 instead of 1; the scale matters only when one query "
                     "weighs two keys: T_q = 1, T_k = 2 under bottom-right",
      .killed_by = {"scale-variance", "oracle-agreement"},
  });
  // A dot product vectorised 8 channels at a time whose remainder loop was never written: heads of at most 8
  // channels take a scalar path and are right; beyond, the last D mod 8 channels never reach the score.
  z.push_back(Mutant{
      .impl = head_impl("mutant:head-dim-tail-dropped",
                        "q·k over whole groups of 8 channels only once D > 8: the last D mod 8 are dropped",
                        [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
                          using A = Scalar<decltype(Q)>;
                          const Index n = c.D > 8 ? c.D / 8 * 8 : c.D;
                          const Matrix<A> Qn = Q.leftCols(n), Kn = K.leftCols(n);
                          HeadOut<A> r;
                          r.weights = softmax_rows<A>(causal_select<A>(scores(Qn, Kn, c.resolved_scale()), c));
                          r.output = mix_visible(r.weights, V, c);
                          return r;
                        }),
      .bug = "head-dimension tail loop missing: with D > 8 and D mod 8 != 0, the scores leave out the last D mod 8 "
             "channels",
      .minimal_shape = {1, 1, 1, 9},
      .why_minimal = "the first D with a tail past the scalar path is 9; the scores matter only when one query weighs "
                     "two keys: T_q = 1, T_k = 2 under bottom-right",
      .killed_by = {"oracle-agreement"},
  });
  // The same missing remainder loop on the other side: weights·V written 8 channels at a time, so past D = 8 the
  // last D mod 8 output channels keep the buffer's zeros.
  z.push_back(Mutant{
      .impl = head_impl("mutant:head-dim-tail-unwritten",
                        "the output written in whole groups of 8 channels once D > 8: the last D mod 8 stay 0",
                        [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
                          using A = Scalar<decltype(Q)>;
                          HeadOut<A> r;
                          r.weights = softmax_rows<A>(causal_select<A>(scores(Q, K, c.resolved_scale()), c));
                          r.output = mix_visible(r.weights, V, c);
                          if (c.D > 8) r.output.rightCols(c.D % 8).setZero();
                          return r;
                        }),
      .bug = "head-dimension tail loop missing in the output: with D > 8 and D mod 8 != 0, the last D mod 8 output "
             "channels are never written (left 0)",
      .minimal_shape = {1, 1, 1, 9},
      .why_minimal = "the first D with a tail past the scalar path is 9; one query, one key, whose value's last channel "
                     "is not 0",
      .killed_by = {"oracle-agreement", "first-position"},
  });
  return z;
}

}  // namespace attncheck::zoo
