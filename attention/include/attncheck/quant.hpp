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

#include "attncheck/paged.hpp"
#include "attncheck/tensor.hpp"

namespace attncheck {

/// How K and V are stored, one byte an element:
///  - e4m3fn: FP8 with 4 exponent bits (bias 7) and 3 mantissa bits, no infinities ("fn"): S.1111.111 is NaN and
///    the largest finite value is 448 (S.1111.110); subnormals m·2^-9 (OCP 8-bit floating point, torch's
///    float8_e4m3fn);
///  - e5m2: FP8 with 5 exponent bits (bias 15) and 2 mantissa bits, IEEE-style: exponent 31 is ±inf (mantissa 0) or
///    NaN, the largest finite value 57344; subnormals m·2^-16 (torch's float8_e5m2);
///  - int8: a two's-complement byte, with a zero point where the call gives one;
///  - ggml's blocks of 32 elements along D (llama.cpp's -ctk/-ctv cache types), each with a float16 scale d inside the
///    block (and a float16 minimum m for the _1 kinds): Q8_0 (q an int8, value d·q), Q4_0 (a nibble n, d·(n - 8)), Q4_1
///    (d·n + m), Q5_0 (five bits n, d·(n - 16)), Q5_1 (d·n + m). A code here is the element's q or n as a byte; the
///    blocks as stored (ggml's block_q8_0 ... block_q5_1: d, m, the fifth bits qh, the nibbles qs, element j and
///    j + 16 sharing a byte) are pack_blocks' and unpack_blocks'.
enum class QuantFormat : std::uint8_t {
  e4m3fn = 1,
  e5m2 = 2,
  int8 = 3,
  ggml_q8_0 = 4,
  ggml_q4_0 = 5,
  ggml_q4_1 = 6,
  ggml_q5_0 = 7,
  ggml_q5_1 = 8
};
inline constexpr QuantFormat kQuantFormats[] = {QuantFormat::e4m3fn,    QuantFormat::e5m2,      QuantFormat::int8,
                                                QuantFormat::ggml_q8_0, QuantFormat::ggml_q4_0, QuantFormat::ggml_q4_1,
                                                QuantFormat::ggml_q5_0, QuantFormat::ggml_q5_1};
/// Whether the format stores ggml's blocks (its scales, and minimums, inside them: QuantGranularity::block32).
inline bool quant_blocked(QuantFormat f) { return f >= QuantFormat::ggml_q8_0; }
/// Whether it has a minimum per block (Q4_1, Q5_1).
inline bool quant_has_min(QuantFormat f) { return f == QuantFormat::ggml_q4_1 || f == QuantFormat::ggml_q5_1; }
/// The elements of a ggml block along D.
inline constexpr Index kQuantBlock = 32;
/// The bytes of one stored ggml block: 34, 18, 20, 22, 24.
std::size_t quant_block_bytes(QuantFormat f);

/// "e4m3fn", "e5m2", "int8", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1".
std::string_view quant_format_name(QuantFormat f);
/// The format a name means (quant_format_name's), or nothing.
std::optional<QuantFormat> parse_quant_format(std::string_view name);
/// The value a stored byte means: NaN for e4m3fn's 0x7F and 0xFF and e5m2's NaNs, ±inf for e5m2's infinities; for
/// ggml's blocks the element's q (n - 8, n - 16 or n), NaN for a byte past its bits.
double quant_value(QuantFormat f, std::uint8_t code);
/// The largest finite value of the format (448, 57344, 127; ggml's: 127, 7, 15, 15, 31).
double quant_max(QuantFormat f);
/// The byte whose value is nearest x (ties to the even code), saturating to ±quant_max: how a cache is written.
/// x must not be NaN. -0 is stored as +0.
std::uint8_t quant_nearest(QuantFormat f, double x);
/// The byte whose value is exactly x (+0 for 0), or nothing when no finite code has that value.
std::optional<std::uint8_t> quant_exact(QuantFormat f, double x);

/// Which elements share a scale (and a zero point):
///  - tensor: one for all of K (or V), [1,1,1];
///  - kv_head: one per kv head, [1,H_kv,1] (vLLM's and FlashInfer's per-head descales);
///  - token_head: one per (batch entry, kv head, key), [B,H_kv,T_k] (int8 and FP8 caches scaled per token);
///  - block32: one per 32 elements along D, [B,H_kv,T_k,D/32], inside ggml's blocks (their formats only).
enum class QuantGranularity : std::uint8_t { tensor = 0, kv_head = 1, token_head = 2, block32 = 3 };

/// "tensor", "kv_head", "token_head", "block32".
std::string_view quant_granularity_name(QuantGranularity g);
std::optional<QuantGranularity> parse_quant_granularity(std::string_view name);

/// One side's (K's or V's) scales: element (b, h, t, c) of the cache means (value(code) - zero_point)·scale + min with
/// the scale, zero point and minimum of its (b, h, t) (and block c/32) under the granularity.
struct QuantScales {
  QuantGranularity granularity = QuantGranularity::tensor;
  /// The extents the granularity gives: [1,1,1,1], [1,H_kv,1,1], [B,H_kv,T_k,1] or [B,H_kv,T_k,D/32].
  Index B = 1, H = 1, T = 1, C = 1;
  /// B·H·T·C values, row-major: each a finite float32 > 0; in ggml's blocks a finite float16 of either sign (0 too).
  std::vector<double> scales{};
  /// int8 only: B·H·T integers in [-128, 127], the code that means 0. Empty: none (symmetric).
  std::vector<double> zero_points{};
  /// Q4_1 and Q5_1 only: B·H·T·C float16 minimums. Empty otherwise.
  std::vector<double> mins{};
  std::size_t at(Index b, Index h, Index t, Index c = 0) const {
    return std::size_t((((B == 1 ? 0 : b) * H + (H == 1 ? 0 : h)) * T + (T == 1 ? 0 : t)) * C +
                       (C == 1 ? 0 : c / kQuantBlock));
  }
  double scale(Index b, Index h, Index t, Index c = 0) const { return scales[at(b, h, t, c)]; }
  double zero_point(Index b, Index h, Index t) const { return zero_points.empty() ? 0.0 : zero_points[at(b, h, t)]; }
  double min(Index b, Index h, Index t, Index c = 0) const { return mins.empty() ? 0.0 : mins[at(b, h, t, c)]; }
  bool operator==(const QuantScales&) const = default;
};

/// The extents a granularity gives a cache of shape [B,H_kv,T_k,D] (block32: D/32 blocks, D a multiple of 32).
QuantScales quant_extents(QuantGranularity g, const Shape& cache);

/// K and V stored in one format, each with scales of its own (a cache quantises both; their granularities may
/// differ). AttentionOptions::quant: the call's k and v hold the dequantised values.
struct QuantizedKV {
  QuantFormat format = QuantFormat::e4m3fn;
  QuantScales k{}, v{};
  /// Q quantised too, in the same format (FlashAttention 3's FP8 Q, K and V with their descales): its scales over q's
  /// shape [B,H,T_q,D] (per tensor, per query head as kv_head's [1,H,1], or per query and head as token_head's
  /// [B,H,T_q]), no zero points, never ggml's blocks; the call's q holds its dequantised values. Empty: q as it is.
  std::optional<QuantScales> q{};
  /// Not the call's meaning but how the implementation computes it: in ggml's formats, each row of Q rounded to
  /// ggml's Q8_0 blocks (Q8_1 with a Q4_1 or Q5_1 K) for the dot with K, as ggml's CPU kernel does. The bound widens
  /// by that rounding (tolerance.cpp step 12b). Set from the implementation's declaration (Feature::q_dot_ggml_q8) by
  /// the law runner before a case is checked; no codec sends or stores it.
  bool q_dot_ggml_q8 = false;
  /// A compute precision as q_dot_ggml_q8 is (Feature::p_fp8): P = exp(s - m) cast to FP8 e4m3 for its product with V
  /// (FlashAttention 3's FP8 forward). The output's bound widens by it (tolerance.cpp step 12c).
  bool p_fp8 = false;
  bool operator==(const QuantizedKV&) const = default;
};

/// Checks one side's scales against its cache's shape [B,H_kv,T_k,D] and the format: the granularity block32 for ggml's
/// formats (D a multiple of 32) and no other, the extents it gives, each scale a finite float32 > 0 (a finite float16
/// in ggml's blocks), zero points only for int8 and each an integer in [-128, 127], minimums for Q4_1 and Q5_1 only,
/// each a finite float16. Throws ShapeError or ValueError naming `who` and the side ("k" or "v").
void check_quant_scales(const char* who, const char* side, QuantFormat f, const QuantScales& s, const Shape& cache);

/// The codes of x (a cache [B,H_kv,T_k,D] of dequantised values) under its scales, row-major: element e is the byte
/// whose (value - zero point)·scale + min is x_e exactly (in a ggml block whose d is 0, the code of q = 0). Throws
/// ValueError naming `who`, the side, the element and its value where none is (x is not a cache of that format and
/// those scales).
std::vector<std::uint8_t> quant_codes(const char* who, const char* side, QuantFormat f, const QuantScales& s,
                                      const Tensor<double>& x);
/// The dequantised cache: (value(code) - zero point)·scale per element, exact in double. codes row-major [shape].
Tensor<double> dequantize(QuantFormat f, const QuantScales& s, const Shape& shape, const std::uint8_t* codes);
/// x written into the format under s: each element's nearest code (quant_nearest of (x - min)/scale + zero point),
/// dequantised again. What a cache holds after x is stored in it.
Tensor<double> quantize_dequantize(QuantFormat f, const QuantScales& s, const Tensor<double>& x);

/// ggml's blocks as stored: for each (b, h, t) row of the cache [B,H_kv,T_k,D], D/32 blocks of quant_block_bytes(f),
/// each d (float16, little-endian), m for Q4_1 and Q5_1, the fifth bits qh (a little-endian u32, bit j element j's)
/// for Q5_0 and Q5_1, then qs (Q8_0: 32 int8; the others 16 bytes, element j in the low nibble of byte j and element
/// j + 16 in its high nibble). codes as quant_codes gives them; s block32.
std::vector<std::uint8_t> pack_blocks(QuantFormat f, const QuantScales& s, const Shape& cache,
                                      const std::vector<std::uint8_t>& codes);
/// The inverse: the codes, and the scales and minimums into s (block32 extents for `cache`).
std::vector<std::uint8_t> unpack_blocks(QuantFormat f, const Shape& cache, const std::uint8_t* blocks, QuantScales& s);

/// A quantised cache laid out in pages (Feature::paged_quant): what a serving engine's FP8 or int8 paged cache holds.
/// Each live key's (slot, head) row, its D codes or ggml's D/32 blocks, sits at its page and slot in the layout's
/// order, as paged.hpp lays out a float pool; the scales are over the pool's first three axes in the same order, a
/// scale living with its key: per tensor [1,1,1]; per kv head along the head's axis ([1,1,H_kv] token-major,
/// [1,H_kv,1] head-major); per token and head the pool's own ([pages,page_size,H_kv] or [pages,H_kv,page_size]);
/// ggml's blocks hold theirs. Every free slot (no live key there) holds the fill: bytes 0 for PageFill::zero, else
/// 0xFF (NaN in both FP8 formats and as a ggml block's float16 d), and its per-token scale the fill's value (0, NaN,
/// ±inf or 1e30, none of them a scale) with zero point 0.
struct QuantPool {
  Shape shape{};                      ///< the pool in its layout's order, its last extent D (V's: D_v)
  Index row_bytes = 0;                ///< bytes of one (page, slot, head) row: D, or D/32 of ggml's blocks
  std::vector<std::uint8_t> bytes{};  ///< the first three extents' product times row_bytes, row-major
  QuantScales scales{};               ///< extents over the pool's first three axes (C = 1: ggml's are in the blocks)
  /// Offset of (page, slot, head)'s row in bytes.
  std::size_t row(const PagedKV& pk, Index page, Index slot, Index g) const;
  /// The scale's (and zero point's) index of (page, slot, head) in `scales`.
  std::size_t scale_at(const PagedKV& pk, Index page, Index slot, Index g) const;
};

/// The extents of a pool's scales under a granularity, for H kv heads: the axes it varies along, in the layout's order
/// (block32: none, ggml's are in the blocks).
QuantScales quant_pool_extents(QuantGranularity g, const PagedKV& pk, Index H);

/// A cache [B,H_kv,T,D] of dequantised values x under its scales s, stored in pages for sequences of `lengths`
/// (keys past a sequence's length are not stored). A page two sequences share must get the same rows and scales from
/// both: std::invalid_argument otherwise, as scatter_pages. Throws ValueError where x is not a cache of f under s.
QuantPool page_quant(QuantFormat f, const QuantScales& s, const Tensor<double>& x, const std::vector<Index>& lengths,
                     const PagedKV& pk);
/// The inverse, read only through the table: the dense cache's dequantised values [B,H_kv,T,D] and, into s, its
/// scales in the cache's extents (granularity as `pool.scales`'). A key past its sequence's length reads 0, under a
/// per-token scale of 1 (ggml's: a zero block).
Tensor<double> unpage_quant(QuantFormat f, const QuantPool& pool, const PagedKV& pk, Index B, Index T,
                            const std::vector<Index>& lengths, QuantScales& s);

}  // namespace attncheck
