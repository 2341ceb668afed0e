// Quantised K and V caches: the formats' decoding (one table of 256 values per format), the nearest and exact
// codes of a value, and a cache's codes and dequantised values under its scales.
#include "attncheck/quant.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
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
    case QuantFormat::ggml_q8_0:
      return "q8_0";
    case QuantFormat::ggml_q4_0:
      return "q4_0";
    case QuantFormat::ggml_q4_1:
      return "q4_1";
    case QuantFormat::ggml_q5_0:
      return "q5_0";
    case QuantFormat::ggml_q5_1:
      return "q5_1";
  }
  return "?";
}

std::optional<QuantFormat> parse_quant_format(std::string_view name) {
  for (const QuantFormat f : kQuantFormats)
    if (name == quant_format_name(f)) return f;
  return std::nullopt;
}

std::size_t quant_block_bytes(QuantFormat f) {
  switch (f) {
    case QuantFormat::ggml_q8_0:
      return 2 + 32;
    case QuantFormat::ggml_q4_0:
      return 2 + 16;
    case QuantFormat::ggml_q4_1:
      return 2 + 2 + 16;
    case QuantFormat::ggml_q5_0:
      return 2 + 4 + 16;
    case QuantFormat::ggml_q5_1:
      return 2 + 2 + 4 + 16;
    default:
      return 1;
  }
}

std::string_view quant_granularity_name(QuantGranularity g) {
  switch (g) {
    case QuantGranularity::tensor:
      return "tensor";
    case QuantGranularity::kv_head:
      return "kv_head";
    case QuantGranularity::token_head:
      return "token_head";
    case QuantGranularity::block32:
      return "block32";
  }
  return "?";
}

std::optional<QuantGranularity> parse_quant_granularity(std::string_view name) {
  for (const QuantGranularity g :
       {QuantGranularity::tensor, QuantGranularity::kv_head, QuantGranularity::token_head, QuantGranularity::block32})
    if (name == quant_granularity_name(g)) return g;
  return std::nullopt;
}

namespace {

// A byte's value, from the format's fields (the formats' definitions, as quant.hpp states them).
double decode(QuantFormat f, std::uint8_t b) {
  if (f == QuantFormat::int8 || f == QuantFormat::ggml_q8_0) return double(std::int8_t(b));
  if (quant_blocked(f)) {  // the element's q from its nibble or five bits
    const int bits = f == QuantFormat::ggml_q4_0 || f == QuantFormat::ggml_q4_1 ? 4 : 5;
    if (b >= (1 << bits)) return std::numeric_limits<double>::quiet_NaN();
    return double(b) - (f == QuantFormat::ggml_q4_0 ? 8 : f == QuantFormat::ggml_q5_0 ? 16 : 0);
  }
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
  static const std::array<Table, std::size(kQuantFormats)> tables = [] {
    std::array<Table, std::size(kQuantFormats)> t;
    for (int i = 0; i < int(t.size()); ++i) {
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
  if (g == QuantGranularity::token_head || g == QuantGranularity::block32) {
    s.B = cache.B;
    s.T = cache.T;
  }
  if (g == QuantGranularity::block32) s.C = std::max<Index>(1, cache.D / kQuantBlock);
  return s;
}

namespace {
bool is_half(double x) { return std::isfinite(x) && double(Eigen::half(float(x))) == x; }
// The code whose q is 0 (a ggml block whose d is 0 holds only its minimum).
std::uint8_t zero_code(QuantFormat f) { return *quant_exact(f, 0.0); }
}  // namespace

void check_quant_scales(const char* who, const char* side, QuantFormat f, const QuantScales& s, const Shape& cache) {
  const std::string w = std::string(who) + ": the quantised " + side + "'s ";
  const bool blocked = quant_blocked(f);
  if (blocked != (s.granularity == QuantGranularity::block32))
    throw ValueError(
        w + std::string(quant_format_name(f)) + " cache has " + std::string(quant_granularity_name(s.granularity)) +
        " scales: " +
        (blocked ? "ggml's blocks hold theirs (block32)" : "block32 scales come with ggml's formats only"));
  if (blocked && cache.D % kQuantBlock != 0)
    throw ShapeError(w + std::string(quant_format_name(f)) + " cache has rows of D = " + std::to_string(cache.D) +
                     ": ggml's blocks need D a multiple of 32");
  const QuantScales want = quant_extents(s.granularity, cache);
  if (s.B != want.B || s.H != want.H || s.T != want.T || s.C != want.C)
    throw ShapeError(w + std::string(quant_granularity_name(s.granularity)) + " scales are [" + std::to_string(s.B) +
                     "," + std::to_string(s.H) + "," + std::to_string(s.T) +
                     (blocked ? "," + std::to_string(s.C) : "") + "], expected [" + std::to_string(want.B) + "," +
                     std::to_string(want.H) + "," + std::to_string(want.T) +
                     (blocked ? "," + std::to_string(want.C) : "") + "] for a cache of shape " + to_string(cache));
  const std::size_t n = std::size_t(s.B * s.H * s.T * s.C);
  if (s.scales.size() != n)
    throw ShapeError(w + "scales hold " + std::to_string(s.scales.size()) + " values, expected " + std::to_string(n));
  for (std::size_t i = 0; i < n; ++i) {
    const double x = s.scales[i];
    if (blocked ? !is_half(x) : !(std::isfinite(x) && x > 0 && double(float(x)) == x))
      throw ValueError(
          w + "scale " + std::to_string(i) + " is " + format_number(x) +
          (blocked ? ": a ggml block's scale is a finite float16" : ": a scale is a finite float32 greater than 0"));
  }
  if (quant_has_min(f) ? s.mins.size() != n : !s.mins.empty())
    throw ShapeError(w + "minimums hold " + std::to_string(s.mins.size()) + " values, expected " +
                     std::to_string(quant_has_min(f) ? n : 0) + " (" + std::string(quant_format_name(f)) +
                     (quant_has_min(f) ? " has one per block)" : " has none)"));
  for (std::size_t i = 0; i < s.mins.size(); ++i)
    if (!is_half(s.mins[i]))
      throw ValueError(w + "minimum " + std::to_string(i) + " is " + format_number(s.mins[i]) +
                       ": a ggml block's minimum is a finite float16");
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
        const double zp = s.zero_point(b, h, t);
        for (Index c = 0; c < sh.D; ++c, ++n) {
          const double v = x(b, h, t, c), scale = s.scale(b, h, t, c), min = s.min(b, h, t, c);
          // (v - min) / scale is exact where v is q·scale + min (doubles of at most 40 significant bits' span).
          const std::optional<std::uint8_t> code =
              scale == 0 ? (v == min ? std::optional<std::uint8_t>(zero_code(f)) : std::nullopt)
                         : quant_exact(f, (v - min) / scale + zp);
          if (!code || (quant_value(f, *code) - zp) * scale + min != v)
            throw ValueError(std::string(who) + ": the quantised " + side + "'s element [" + std::to_string(b) + "," +
                             std::to_string(h) + "," + std::to_string(t) + "," + std::to_string(c) + "] is " +
                             format_number(v, 17) + ", not an " + std::string(quant_format_name(f)) + " value times " +
                             format_number(scale, 9) +
                             (s.zero_points.empty() ? "" : " (zero point " + format_number(zp) + ")") +
                             (s.mins.empty() ? "" : " plus " + format_number(min, 9)));
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
        const double zp = s.zero_point(b, h, t);
        for (Index c = 0; c < sh.D; ++c, ++n)
          out(b, h, t, c) = (quant_value(f, codes[n]) - zp) * s.scale(b, h, t, c) + s.min(b, h, t, c);
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
        const double zp = s.zero_point(b, h, t);
        // int8: the nearest integer (ties to even) plus the zero point, clamped to the byte's range.
        for (Index c = 0; c < sh.D; ++c, ++n) {
          const double scale = s.scale(b, h, t, c), y = x(b, h, t, c) - s.min(b, h, t, c);
          codes[n] = f == QuantFormat::int8
                         ? std::uint8_t(std::int8_t(std::clamp(std::nearbyint(y / scale) + zp, -128.0, 127.0)))
                     : scale == 0 ? zero_code(f)
                                  : quant_nearest(f, y / scale);
        }
      }
  return dequantize(f, s, sh, codes.data());
}

namespace {
std::uint16_t half_bits(double x) { return Eigen::numext::bit_cast<std::uint16_t>(Eigen::half(float(x))); }
double half_value(const std::uint8_t* p) {
  return double(Eigen::numext::bit_cast<Eigen::half>(std::uint16_t(p[0] | (p[1] << 8))));
}
}  // namespace

std::vector<std::uint8_t> pack_blocks(QuantFormat f, const QuantScales& s, const Shape& sh,
                                      const std::vector<std::uint8_t>& codes) {
  const std::size_t bytes = quant_block_bytes(f);
  const Index nb = sh.D / kQuantBlock;
  std::vector<std::uint8_t> out(std::size_t(sh.B * sh.H * sh.T * nb) * bytes, 0);
  std::size_t at = 0, n = 0;
  for (Index b = 0; b < sh.B; ++b)
    for (Index h = 0; h < sh.H; ++h)
      for (Index t = 0; t < sh.T; ++t)
        for (Index k = 0; k < nb; ++k, at += bytes, n += kQuantBlock) {
          std::uint8_t* blk = out.data() + at;
          const auto put_half = [&](std::size_t off, double x) {
            const std::uint16_t v = half_bits(x);
            blk[off] = std::uint8_t(v & 0xFF);
            blk[off + 1] = std::uint8_t(v >> 8);
          };
          put_half(0, s.scale(b, h, t, k * kQuantBlock));
          std::size_t off = 2;
          if (quant_has_min(f)) {
            put_half(off, s.min(b, h, t, k * kQuantBlock));
            off += 2;
          }
          const std::uint8_t* q = codes.data() + n;
          if (f == QuantFormat::ggml_q8_0) {
            std::copy(q, q + kQuantBlock, blk + off);
            continue;
          }
          if (f == QuantFormat::ggml_q5_0 || f == QuantFormat::ggml_q5_1) {
            std::uint32_t qh = 0;
            for (int j = 0; j < 32; ++j) qh |= std::uint32_t((q[j] >> 4) & 1) << j;
            for (int i = 0; i < 4; ++i) blk[off + std::size_t(i)] = std::uint8_t(qh >> (8 * i));
            off += 4;
          }
          for (int j = 0; j < 16; ++j)
            blk[off + std::size_t(j)] = std::uint8_t((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
        }
  return out;
}

std::vector<std::uint8_t> unpack_blocks(QuantFormat f, const Shape& sh, const std::uint8_t* blocks, QuantScales& s) {
  const std::size_t bytes = quant_block_bytes(f);
  const Index nb = sh.D / kQuantBlock;
  s = quant_extents(QuantGranularity::block32, sh);
  std::vector<std::uint8_t> codes(std::size_t(sh.numel()));
  std::size_t at = 0, n = 0;
  for (Index r = 0; r < sh.B * sh.H * sh.T * nb; ++r, at += bytes, n += kQuantBlock) {
    const std::uint8_t* blk = blocks + at;
    s.scales.push_back(half_value(blk));
    std::size_t off = 2;
    if (quant_has_min(f)) {
      s.mins.push_back(half_value(blk + off));
      off += 2;
    }
    std::uint8_t* q = codes.data() + n;
    if (f == QuantFormat::ggml_q8_0) {
      std::copy(blk + off, blk + off + kQuantBlock, q);
      continue;
    }
    std::uint32_t qh = 0;
    if (f == QuantFormat::ggml_q5_0 || f == QuantFormat::ggml_q5_1) {
      for (int i = 0; i < 4; ++i) qh |= std::uint32_t(blk[off + std::size_t(i)]) << (8 * i);
      off += 4;
    }
    for (int j = 0; j < 16; ++j) {
      q[j] = std::uint8_t((blk[off + std::size_t(j)] & 0x0F) | (((qh >> j) & 1) << 4));
      q[j + 16] = std::uint8_t((blk[off + std::size_t(j)] >> 4) | (((qh >> (j + 16)) & 1) << 4));
    }
  }
  return codes;
}

std::size_t QuantPool::row(const PagedKV& pk, Index page, Index slot, Index g) const {
  const Index H = pk.layout == PageLayout::token_major ? shape.T : shape.H;
  return std::size_t(pk.pool_offset(page, slot, g, 0, H, 1)) * std::size_t(row_bytes);
}

std::size_t QuantPool::scale_at(const PagedKV& pk, Index page, Index slot, Index g) const {
  return pk.layout == PageLayout::token_major ? scales.at(page, slot, g) : scales.at(page, g, slot);
}

QuantScales quant_pool_extents(QuantGranularity g, const PagedKV& pk, Index H) {
  QuantScales ps;
  ps.granularity = g;
  const bool tm = pk.layout == PageLayout::token_major;
  if (g == QuantGranularity::kv_head) (tm ? ps.T : ps.H) = H;
  if (g == QuantGranularity::token_head) {
    ps.B = pk.num_pages;
    ps.H = tm ? pk.page_size : H;
    ps.T = tm ? H : pk.page_size;
  }
  return ps;
}

namespace {
double fill_scale(PageFill f) {
  switch (f) {
    case PageFill::zero:
      return 0.0;
    case PageFill::nan:
      return std::numeric_limits<double>::quiet_NaN();
    case PageFill::pos_inf:
      return std::numeric_limits<double>::infinity();
    case PageFill::neg_inf:
      return -std::numeric_limits<double>::infinity();
    case PageFill::huge:
      return 1e30;
  }
  return 0.0;
}
}  // namespace

QuantPool page_quant(QuantFormat f, const QuantScales& s, const Tensor<double>& x, const std::vector<Index>& lengths,
                     const PagedKV& pk) {
  const Shape& sh = x.shape();
  check_paged(pk, sh.B, lengths);
  const bool blocked = quant_blocked(f), per_token = s.granularity == QuantGranularity::token_head;
  std::vector<std::uint8_t> rows = quant_codes("page_quant", "cache", f, s, x);
  if (blocked) rows = pack_blocks(f, s, sh, rows);
  QuantPool pool;
  pool.shape = pk.pool_shape(sh.H, sh.D);
  pool.row_bytes = blocked ? sh.D / kQuantBlock * Index(quant_block_bytes(f)) : sh.D;
  pool.bytes.assign(std::size_t(pk.num_pages * pk.page_size * sh.H * pool.row_bytes),
                    pk.fill == PageFill::zero ? 0x00 : 0xFF);
  pool.scales = quant_pool_extents(s.granularity, pk, sh.H);
  if (!blocked) {
    if (per_token) {
      const std::size_t n = std::size_t(pool.scales.B * pool.scales.H * pool.scales.T);
      pool.scales.scales.assign(n, fill_scale(pk.fill));
      if (!s.zero_points.empty()) pool.scales.zero_points.assign(n, 0.0);
    } else {  // per tensor or kv head: the same values, along the pool's head axis
      pool.scales.scales = s.scales;
      pool.scales.zero_points = s.zero_points;
    }
  }
  std::vector<char> written(std::size_t(pk.num_pages * pk.page_size), 0);
  const std::size_t rb = std::size_t(pool.row_bytes);
  for (Index b = 0; b < sh.B; ++b) {
    const Index len = lengths[std::size_t(b)];
    if (len < 0 || len > sh.T)
      throw std::invalid_argument("paged quantised K and V: sequence " + std::to_string(b) + " has length " +
                                  std::to_string(len) + ", expected 0.." + std::to_string(sh.T));
    for (Index t = 0; t < len; ++t) {
      const Index page = pk.block_table[std::size_t(b * pk.max_pages + t / pk.page_size)], slot = t % pk.page_size;
      char& w = written[std::size_t(page * pk.page_size + slot)];
      for (Index g = 0; g < sh.H; ++g) {
        const std::uint8_t* src = rows.data() + std::size_t((b * sh.H + g) * sh.T + t) * rb;
        std::uint8_t* dst = pool.bytes.data() + pool.row(pk, page, slot, g);
        const std::size_t at = pool.scale_at(pk, page, slot, g);
        const bool differs =
            w && (std::memcmp(dst, src, rb) != 0 ||
                  (per_token && !blocked &&
                   (pool.scales.scales[at] != s.scale(b, g, t) ||
                    (!s.zero_points.empty() && pool.scales.zero_points[at] != s.zero_point(b, g, t)))));
        if (differs)
          throw std::invalid_argument("paged quantised K and V: page " + std::to_string(page) + " is shared, but key " +
                                      std::to_string(t) + " of sequence " + std::to_string(b) +
                                      " differs from the key another sequence wrote there");
        std::memcpy(dst, src, rb);
        if (per_token && !blocked) {
          pool.scales.scales[at] = s.scale(b, g, t);
          if (!s.zero_points.empty()) pool.scales.zero_points[at] = s.zero_point(b, g, t);
        }
      }
      w = 1;
    }
  }
  return pool;
}

Tensor<double> unpage_quant(QuantFormat f, const QuantPool& pool, const PagedKV& pk, Index B, Index T,
                            const std::vector<Index>& lengths, QuantScales& s) {
  const bool tm = pk.layout == PageLayout::token_major, blocked = quant_blocked(f);
  const Index H = tm ? pool.shape.T : pool.shape.H, D = pool.shape.D;
  check_paged(pk, B, lengths);
  const Shape cache{B, H, T, D};
  const Index rb = blocked ? D / kQuantBlock * Index(quant_block_bytes(f)) : D;
  if (!(pool.shape == pk.pool_shape(H, D)) || pool.row_bytes != rb ||
      pool.bytes.size() != std::size_t(pk.num_pages * pk.page_size * H * rb))
    throw std::invalid_argument("paged quantised K and V: expected a pool " + to_string(pk.pool_shape(H, D)) + " of " +
                                std::to_string(pk.num_pages * pk.page_size * H * rb) + " bytes, got " +
                                to_string(pool.shape) + " of " + std::to_string(pool.bytes.size()));
  const QuantGranularity g = pool.scales.granularity;
  const bool per_token = g == QuantGranularity::token_head;
  s = quant_extents(g, cache);
  if (!blocked) {
    const std::size_t n = std::size_t(s.B * s.H * s.T);
    if (per_token) {
      s.scales.assign(n, 1.0);
      if (!pool.scales.zero_points.empty()) s.zero_points.assign(n, 0.0);
    } else {
      s.scales = pool.scales.scales;
      s.zero_points = pool.scales.zero_points;
    }
  }
  std::vector<std::uint8_t> rows(std::size_t(B * H * T * rb), 0);
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index t = 0; t < T; ++t) {
        std::uint8_t* dst = rows.data() + std::size_t((b * H + h) * T + t) * std::size_t(rb);
        if (t >= lengths[std::size_t(b)]) {  // not stored: the code of 0 (ggml's: a zero block)
          if (!blocked) std::memset(dst, *quant_exact(f, s.zero_point(b, h, t)), std::size_t(rb));
          continue;
        }
        const Index page = pk.block_table[std::size_t(b * pk.max_pages + t / pk.page_size)], slot = t % pk.page_size;
        std::memcpy(dst, pool.bytes.data() + pool.row(pk, page, slot, h), std::size_t(rb));
        if (per_token && !blocked) {
          const std::size_t at = pool.scale_at(pk, page, slot, h);
          s.scales[s.at(b, h, t)] = pool.scales.scales[at];
          if (!s.zero_points.empty()) s.zero_points[s.at(b, h, t)] = pool.scales.zero_points[at];
        }
      }
  if (blocked) {
    const std::vector<std::uint8_t> codes = unpack_blocks(f, cache, rows.data(), s);
    return dequantize(f, s, cache, codes.data());
  }
  return dequantize(f, s, cache, rows.data());
}

}  // namespace attncheck
