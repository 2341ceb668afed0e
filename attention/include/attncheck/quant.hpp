// Quantised K and V caches (ABI 4): the storage formats serving stacks keep K and V in (FP8 e4m3fn and e5m2, int8),
// their scales, and the exact double each stored byte means. A quantised call means attention over the dequantised
// values (code - zero point)·scale, each an exact double (a code has at most 9 significant bits and a scale is a
// float32, 24), so the float64 oracle is exact and a bound is the kernel's arithmetic alone (tolerance.cpp step 12).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attncheck/tensor.hpp"

namespace attncheck {

/// How K and V are stored, one byte an element:
///  - e4m3fn: FP8 with 4 exponent bits (bias 7) and 3 mantissa bits, no infinities ("fn"): S.1111.111 is NaN and
///    the largest finite value is 448 (S.1111.110); subnormals m·2^-9 (OCP 8-bit floating point, torch's
///    float8_e4m3fn);
///  - e5m2: FP8 with 5 exponent bits (bias 15) and 2 mantissa bits, IEEE-style: exponent 31 is ±inf (mantissa 0) or
///    NaN, the largest finite value 57344; subnormals m·2^-16 (torch's float8_e5m2);
///  - int8: a two's-complement byte, with a zero point where the call gives one.
enum class QuantFormat : std::uint8_t { e4m3fn = 1, e5m2 = 2, int8 = 3 };

/// "e4m3fn", "e5m2", "int8".
std::string_view quant_format_name(QuantFormat f);
/// The format a name means (quant_format_name's), or nothing.
std::optional<QuantFormat> parse_quant_format(std::string_view name);
/// The value a stored byte means: NaN for e4m3fn's 0x7F and 0xFF and e5m2's NaNs, ±inf for e5m2's infinities.
double quant_value(QuantFormat f, std::uint8_t code);
/// The largest finite value of the format (448, 57344, 127).
double quant_max(QuantFormat f);
/// The byte whose value is nearest x (ties to the even code), saturating to ±quant_max: how a cache is written.
/// x must not be NaN. -0 is stored as +0.
std::uint8_t quant_nearest(QuantFormat f, double x);
/// The byte whose value is exactly x (+0 for 0), or nothing when no finite code has that value.
std::optional<std::uint8_t> quant_exact(QuantFormat f, double x);

/// Which elements share a scale (and a zero point):
///  - tensor: one for all of K (or V), [1,1,1];
///  - kv_head: one per kv head, [1,H_kv,1] (vLLM's and FlashInfer's per-head descales);
///  - token_head: one per (batch entry, kv head, key), [B,H_kv,T_k] (int8 and FP8 caches scaled per token).
enum class QuantGranularity : std::uint8_t { tensor = 0, kv_head = 1, token_head = 2 };

/// "tensor", "kv_head", "token_head".
std::string_view quant_granularity_name(QuantGranularity g);
std::optional<QuantGranularity> parse_quant_granularity(std::string_view name);

/// One side's (K's or V's) scales: element (b, h, t, c) of the cache means (code - zero_point)·scale with the scale and
/// zero point of its (b, h, t) under the granularity.
struct QuantScales {
  QuantGranularity granularity = QuantGranularity::tensor;
  Index B = 1, H = 1, T = 1;  ///< the extents the granularity gives: [1,1,1], [1,H_kv,1] or [B,H_kv,T_k]
  /// B·H·T values, row-major, each a finite float32 > 0.
  std::vector<double> scales{};
  /// int8 only: B·H·T integers in [-128, 127], the code that means 0. Empty: none (symmetric).
  std::vector<double> zero_points{};
  std::size_t at(Index b, Index h, Index t) const {
    return std::size_t(((B == 1 ? 0 : b) * H + (H == 1 ? 0 : h)) * T + (T == 1 ? 0 : t));
  }
  double scale(Index b, Index h, Index t) const { return scales[at(b, h, t)]; }
  double zero_point(Index b, Index h, Index t) const { return zero_points.empty() ? 0.0 : zero_points[at(b, h, t)]; }
  bool operator==(const QuantScales&) const = default;
};

/// The extents a granularity gives a cache of shape [B,H_kv,T_k,·].
QuantScales quant_extents(QuantGranularity g, const Shape& cache);

/// K and V stored in one format, each with scales of its own (a cache quantises both; their granularities may
/// differ). AttentionOptions::quant: the call's k and v hold the dequantised values.
struct QuantizedKV {
  QuantFormat format = QuantFormat::e4m3fn;
  QuantScales k{}, v{};
  bool operator==(const QuantizedKV&) const = default;
};

/// Checks one side's scales against its cache's shape [B,H_kv,T_k,·] and the format: the extents its granularity
/// gives, each scale a finite float32 > 0, zero points only for int8 and each an integer in [-128, 127]. Throws
/// ShapeError or ValueError naming `who` and the side ("k" or "v").
void check_quant_scales(const char* who, const char* side, QuantFormat f, const QuantScales& s, const Shape& cache);

/// The codes of x (a cache [B,H_kv,T_k,·] of dequantised values) under its scales, row-major: element e is the byte
/// whose (value - zero point)·scale is x_e exactly. Throws ValueError naming `who`, the side, the element and its
/// value where none is (x is not a cache of that format and those scales).
std::vector<std::uint8_t> quant_codes(const char* who, const char* side, QuantFormat f, const QuantScales& s,
                                      const Tensor<double>& x);
/// The dequantised cache: (value(code) - zero point)·scale per element, exact in double. codes row-major [shape].
Tensor<double> dequantize(QuantFormat f, const QuantScales& s, const Shape& shape, const std::uint8_t* codes);
/// x written into the format under s: each element's nearest code (quant_nearest of x/scale + zero point),
/// dequantised again. What a cache holds after x is stored in it.
Tensor<double> quantize_dequantize(QuantFormat f, const QuantScales& s, const Tensor<double>& x);

}  // namespace attncheck
