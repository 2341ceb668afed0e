// Quantised K and V caches: the formats' decoding (one table of 256 values per format), the nearest and exact
// codes of a value, and a cache's codes and dequantised values under its scales.
#include "attncheck/quant.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "attncheck/error.hpp"
#include "attncheck/format.hpp"

namespace attncheck {

std::string_view quant_format_name(QuantFormat f) {
  switch (f) {
    case QuantFormat::e4m3fn:
      return "e4m3fn";
    case QuantFormat::e5m2:
      return "e5m2";
    case QuantFormat::int8:
      return "int8";
  }
  return "?";
}

std::optional<QuantFormat> parse_quant_format(std::string_view name) {
  for (const QuantFormat f : {QuantFormat::e4m3fn, QuantFormat::e5m2, QuantFormat::int8})
    if (name == quant_format_name(f)) return f;
  return std::nullopt;
}

std::string_view quant_granularity_name(QuantGranularity g) {
  switch (g) {
    case QuantGranularity::tensor:
      return "tensor";
    case QuantGranularity::kv_head:
      return "kv_head";
    case QuantGranularity::token_head:
      return "token_head";
  }
  return "?";
}

std::optional<QuantGranularity> parse_quant_granularity(std::string_view name) {
  for (const QuantGranularity g : {QuantGranularity::tensor, QuantGranularity::kv_head, QuantGranularity::token_head})
    if (name == quant_granularity_name(g)) return g;
  return std::nullopt;
}

namespace {

// A byte's value, from the format's fields (the formats' definitions, as quant.hpp states them).
double decode(QuantFormat f, std::uint8_t b) {
  if (f == QuantFormat::int8) return double(std::int8_t(b));
  const double sign = b & 0x80 ? -1.0 : 1.0;
  const int man_bits = f == QuantFormat::e4m3fn ? 3 : 2, bias = f == QuantFormat::e4m3fn ? 7 : 15;
  const int e = (b & 0x7F) >> man_bits, m = b & ((1 << man_bits) - 1), e_max = f == QuantFormat::e4m3fn ? 15 : 31;
  if (f == QuantFormat::e4m3fn && e == e_max && m == 7) return std::numeric_limits<double>::quiet_NaN();
  if (f == QuantFormat::e5m2 && e == e_max)
    return m == 0 ? sign * std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(double(m), 1 - bias - man_bits);  // subnormal: m·2^(1 - bias - man_bits)
  return sign * std::ldexp(double((1 << man_bits) + m), e - bias - man_bits);
}

struct Table {
  std::array<double, 256> value{};
  // The finite values in increasing order with their codes (+0 for 0: -0 is left out).
  std::vector<std::pair<double, std::uint8_t>> sorted{};
};

const Table& table(QuantFormat f) {
  static const std::array<Table, 3> tables = [] {
    std::array<Table, 3> t;
    for (int i = 0; i < 3; ++i) {
      const auto fmt = QuantFormat(i + 1);
      for (int b = 0; b < 256; ++b) {
        const double x = decode(fmt, std::uint8_t(b));
        t[std::size_t(i)].value[std::size_t(b)] = x;
        if (std::isfinite(x) && !(x == 0 && std::signbit(x))) t[std::size_t(i)].sorted.push_back({x, std::uint8_t(b)});
      }
      std::sort(t[std::size_t(i)].sorted.begin(), t[std::size_t(i)].sorted.end());
    }
    return t;
  }();
  return tables[std::size_t(f) - 1];
}

}  // namespace

double quant_value(QuantFormat f, std::uint8_t code) { return table(f).value[code]; }

double quant_max(QuantFormat f) { return table(f).sorted.back().first; }

std::uint8_t quant_nearest(QuantFormat f, double x) {
  if (std::isnan(x))
    throw ValueError("quant_nearest: NaN has no nearest " + std::string(quant_format_name(f)) + " code");
  const auto& s = table(f).sorted;
  if (x >= s.back().first) return s.back().second;  // saturating
  if (x <= s.front().first) return s.front().second;
  const auto hi = std::lower_bound(s.begin(), s.end(), std::pair<double, std::uint8_t>{x, 0});
  if (hi->first == x) return hi->second;
  const auto lo = hi - 1;
  const double dl = x - lo->first, dh = hi->first - x;
  if (dl != dh) return dl < dh ? lo->second : hi->second;
  // A tie: the code whose last mantissa bit is 0 (for int8, the even integer).
  return (lo->second & 1) == 0 ? lo->second : hi->second;
}

std::optional<std::uint8_t> quant_exact(QuantFormat f, double x) {
  if (!std::isfinite(x)) return std::nullopt;
  const auto& s = table(f).sorted;
  const auto it = std::lower_bound(s.begin(), s.end(), std::pair<double, std::uint8_t>{x, 0});
  if (it == s.end() || it->first != x) return std::nullopt;
  return it->second;
}

QuantScales quant_extents(QuantGranularity g, const Shape& cache) {
  QuantScales s;
  s.granularity = g;
  if (g != QuantGranularity::tensor) s.H = cache.H;
  if (g == QuantGranularity::token_head) {
    s.B = cache.B;
    s.T = cache.T;
  }
  return s;
}

void check_quant_scales(const char* who, const char* side, QuantFormat f, const QuantScales& s, const Shape& cache) {
  const std::string w = std::string(who) + ": the quantised " + side + "'s ";
  const QuantScales want = quant_extents(s.granularity, cache);
  if (s.B != want.B || s.H != want.H || s.T != want.T)
    throw ShapeError(w + std::string(quant_granularity_name(s.granularity)) + " scales are [" + std::to_string(s.B) +
                     "," + std::to_string(s.H) + "," + std::to_string(s.T) + "], expected [" + std::to_string(want.B) +
                     "," + std::to_string(want.H) + "," + std::to_string(want.T) + "] for a cache of shape " +
                     to_string(cache));
  const std::size_t n = std::size_t(s.B * s.H * s.T);
  if (s.scales.size() != n)
    throw ShapeError(w + "scales hold " + std::to_string(s.scales.size()) + " values, expected " + std::to_string(n));
  for (std::size_t i = 0; i < n; ++i)
    if (const double x = s.scales[i]; !(std::isfinite(x) && x > 0 && double(float(x)) == x))
      throw ValueError(w + "scale " + std::to_string(i) + " is " + format_number(x) +
                       ": a scale is a finite float32 greater than 0");
  if (s.zero_points.empty()) return;
  if (f != QuantFormat::int8)
    throw ValueError(w + "zero points come with an " + std::string(quant_format_name(f)) +
                     " cache: only int8 has zero points");
  if (s.zero_points.size() != n)
    throw ShapeError(w + "zero points hold " + std::to_string(s.zero_points.size()) + " values, expected " +
                     std::to_string(n) + " (as many as the scales)");
  for (std::size_t i = 0; i < n; ++i)
    if (const double z = s.zero_points[i]; !(z == std::trunc(z) && z >= -128 && z <= 127))
      throw ValueError(w + "zero point " + std::to_string(i) + " is " + format_number(z) +
                       ": a zero point is an integer in [-128, 127]");
}

std::vector<std::uint8_t> quant_codes(const char* who, const char* side, QuantFormat f, const QuantScales& s,
                                      const Tensor<double>& x) {
  const Shape& sh = x.shape();
  std::vector<std::uint8_t> codes(std::size_t(sh.numel()));
  std::size_t n = 0;
  for (Index b = 0; b < sh.B; ++b)
    for (Index h = 0; h < sh.H; ++h)
      for (Index t = 0; t < sh.T; ++t) {
        const double scale = s.scale(b, h, t), zp = s.zero_point(b, h, t);
        for (Index c = 0; c < sh.D; ++c, ++n) {
          const double v = x(b, h, t, c);
          // v / scale is exact where v is code·scale (both doubles, the quotient an integer-sized significand).
          const std::optional<std::uint8_t> code = quant_exact(f, v / scale + zp);
          if (!code || (quant_value(f, *code) - zp) * scale != v)
            throw ValueError(std::string(who) + ": the quantised " + side + "'s element [" + std::to_string(b) + "," +
                             std::to_string(h) + "," + std::to_string(t) + "," + std::to_string(c) + "] is " +
                             format_number(v, 17) + ", not an " + std::string(quant_format_name(f)) + " value times " +
                             format_number(scale, 9) +
                             (s.zero_points.empty() ? "" : " (zero point " + format_number(zp) + ")"));
          codes[n] = *code;
        }
      }
  return codes;
}

Tensor<double> dequantize(QuantFormat f, const QuantScales& s, const Shape& sh, const std::uint8_t* codes) {
  Tensor<double> out(sh);
  std::size_t n = 0;
  for (Index b = 0; b < sh.B; ++b)
    for (Index h = 0; h < sh.H; ++h)
      for (Index t = 0; t < sh.T; ++t) {
        const double scale = s.scale(b, h, t), zp = s.zero_point(b, h, t);
        for (Index c = 0; c < sh.D; ++c, ++n) out(b, h, t, c) = (quant_value(f, codes[n]) - zp) * scale;
      }
  return out;
}

Tensor<double> quantize_dequantize(QuantFormat f, const QuantScales& s, const Tensor<double>& x) {
  const Shape& sh = x.shape();
  std::vector<std::uint8_t> codes(std::size_t(sh.numel()));
  std::size_t n = 0;
  for (Index b = 0; b < sh.B; ++b)
    for (Index h = 0; h < sh.H; ++h)
      for (Index t = 0; t < sh.T; ++t) {
        const double scale = s.scale(b, h, t), zp = s.zero_point(b, h, t);
        // int8: the nearest integer (ties to even) plus the zero point, clamped to the byte's range.
        for (Index c = 0; c < sh.D; ++c, ++n)
          codes[n] =
              f == QuantFormat::int8
                  ? std::uint8_t(std::int8_t(std::clamp(std::nearbyint(x(b, h, t, c) / scale) + zp, -128.0, 127.0)))
                  : quant_nearest(f, x(b, h, t, c) / scale);
      }
  return dequantize(f, s, sh, codes.data());
}

}  // namespace attncheck
