// RapidCheck generators for attention problems: the shape first, then data of that shape, so shrinking
// reduces B, H, T, D before values; values span a wide dynamic range in several regimes and shrink toward 0.
#pragma once

#include <rapidcheck.h>

#include <optional>
#include <string>
#include <vector>

#include "attncheck/law.hpp"

namespace attncheck {

/// The geometry of one case. T_k differs from T_q, H_kv from H, and key lengths and a window appear, only when
/// the law and the implementation allow it.
struct CaseShape {
  Index B = 1, H = 1, T_q = 1, T_k = 1, D = 1;
  Index H_kv = 1;                                 ///< kv heads, dividing H (== H without grouped queries)
  CausalAlignment alignment = kDefaultAlignment;  ///< matters only when T_q != T_k
  std::vector<Index> key_lengths{};               ///< per batch entry, in [0, T_k]; empty: no padding
  std::optional<Index> window{};                  ///< sliding window; empty: none
};

/// How the values of a case are drawn. Small integers come first: that is where shrinking ends.
enum class Regime { small_int, normal, uniform, ties, one_hot, sparse };

/// "small-int", "normal", ...
std::string regime_name(Regime r);

/// Like rc::gen::weightedElement, but shrinking toward the first choice (RapidCheck's own does not shrink).
template <class T> rc::Gen<T> weighted_choice(std::vector<std::pair<std::size_t, T>> pairs) {
  return [pairs](const rc::Random& random, int) {
    std::size_t sum = 0;
    for (const auto& pr : pairs) sum += pr.first;
    std::size_t pick = std::size_t(rc::Random(random).next() % sum), idx = 0;
    while (pick >= pairs[idx].first) pick -= pairs[idx++].first;
    return rc::shrinkable::map(
        rc::shrinkable::shrinkRecur(idx, [](std::size_t x) { return rc::shrink::towards<std::size_t>(x, 0); }),
        [pairs](std::size_t i) { return pairs[i].second; });
  };
}



/// Head dimension D in [1, max_D]: small, uniform and power-of-two draws, shrinking toward 1.
rc::Gen<Index> gen_head_dim(const GenConfig& cfg);

/// A [B,H,T,D] tensor of values at `magnitude` in `regime`, each rounded to `dtype`, shrinking toward 0.
rc::Gen<Tensor<double>> gen_tensor(const Shape& s, Regime regime, double magnitude, DType dtype);

/// A log-uniform magnitude over [1e-3, 1e4] (10 steps a decade), shrinking toward 1.
rc::Gen<double> gen_magnitude();

/// Rounds x to the nearest value of `dtype` (saturating at half the dtype's largest finite value).
double round_to(DType dtype, double x);

/// Options for gen_problem (and gen_shape). Each `allow_` is further gated by the implementation's
/// capabilities.
struct ProblemOptions {
  bool allow_cross_lengths = true;  ///< T_q != T_k when the implementation accepts it
  bool allow_gqa = true;            ///< H_kv < H (Capabilities::gqa)
  bool allow_padding = true;        ///< per-sequence key lengths (Capabilities::key_padding)
  bool allow_window = true;         ///< a sliding window (Capabilities::window)
  bool allow_custom_scale = true;   ///< sometimes pass an explicit scale
  /// Ask for the weights (when the implementation returns them). Laws that never read them say false: for a
  /// kernel whose weights are recovered by probing, each one costs extra calls.
  bool want_weights = true;
};

/// Shape generator: B, H in [1, max], T in [1, max_T] with a tail up to max_T_tail as RapidCheck's size
/// grows, D in [1, max_D] (small, uniform and power-of-two draws), the causal alignment, and, where allowed,
/// H_kv among the divisors of H, per-sequence key lengths and a window. The whole geometry is one
/// shrinkable: every extent shrinks toward 1 (H and H_kv together, keeping H_kv | H), padding and the window
/// toward none, and a square case may become a cross-length one.
rc::Gen<CaseShape> gen_shape(const GenConfig& cfg, const ProblemOptions& opts = {});

/// A whole problem with coverage tags: shape, then regime and magnitudes, then the tensors.
rc::Gen<LawCase> gen_problem(const GenConfig& cfg, const ProblemOptions& opts = {});

/// Coverage tags of a problem (T bucket, D bucket, largest |score| bucket); gen_problem adds the regime.
std::vector<std::string> shape_tags(const Problem& p);

}  // namespace attncheck
