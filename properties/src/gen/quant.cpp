// Quantised K and V caches, drawn for the laws that require them: a declared format, granularity and zero points,
// and scales that follow each group's values (as a cache's writer computes them) so that codes reach the format's
// limits, its subnormals and, with a shift, saturation.
#include <algorithm>
#include <cmath>

#include "parts.hpp"

namespace attncheck {
using namespace generation;

namespace {

constexpr Index kMaxWeights = Index(1) << 18;  // its bound is materialised (tolerance.cpp step 12)

std::vector<QuantFormat> usable_formats(const GenConfig& cfg, const ProblemOptions& opts) {
  const FeatureSet declared = declared_features(cfg.caps);
  std::vector<QuantFormat> f;  // the plainest first: integers, then e4m3fn, then e5m2
  if (opts.may_use(Feature::kv_int8, declared)) f.push_back(QuantFormat::int8);
  if (opts.may_use(Feature::kv_e4m3fn, declared)) f.push_back(QuantFormat::e4m3fn);
  if (opts.may_use(Feature::kv_e5m2, declared)) f.push_back(QuantFormat::e5m2);
  for (const auto& [fmt, feat] : {std::pair{QuantFormat::ggml_q8_0, Feature::kv_ggml_q8_0},
                                  {QuantFormat::ggml_q4_0, Feature::kv_ggml_q4_0},
                                  {QuantFormat::ggml_q4_1, Feature::kv_ggml_q4_1},
                                  {QuantFormat::ggml_q5_0, Feature::kv_ggml_q5_0},
                                  {QuantFormat::ggml_q5_1, Feature::kv_ggml_q5_1}})
    if (opts.may_use(feat, declared)) f.push_back(fmt);
  return f;
}

Index id_at(const std::vector<Index>& ids, Index n) { return ids.empty() ? n : ids[std::size_t(n)]; }

}  // namespace

bool may_quantise(const GenConfig& cfg, const ProblemOptions& opts) { return !usable_formats(cfg, opts).empty(); }

rc::Gen<QuantDraw> gen_quant(const GenConfig& cfg, const ProblemOptions& opts, Index D) {
  const FeatureSet declared = declared_features(cfg.caps);
  std::vector<QuantFormat> formats = usable_formats(cfg, opts);
  bool required = false;
  for (const Feature f : kQuantFormatFeatures) required = required || opts.must_use(f, declared);
  // ggml's blocks only where D is a multiple of 32 (a required cache then comes in another format, or none).
  if (D % kQuantBlock != 0) std::erase_if(formats, quant_blocked);
  if (formats.empty()) return rc::gen::just(QuantDraw{});
  const bool per_head = opts.may_use(Feature::kv_scale_per_head, declared),
             per_token = opts.may_use(Feature::kv_scale_per_token, declared),
             zero_points = opts.may_use(Feature::kv_zero_points, declared),
             q_quant = opts.may_use(Feature::q_quant, declared), paged = opts.may_use(Feature::paged_quant, declared);
  return rc::gen::exec([=] {
    QuantDraw d;
    std::vector<std::pair<std::size_t, int>> choices;
    if (!required) choices.push_back({2, -1});
    for (const QuantFormat f : formats) choices.push_back({1, int(f)});
    d.format = *weighted_choice<int>(choices);
    std::vector<std::pair<std::size_t, QuantGranularity>> grains{{1, QuantGranularity::tensor}};
    if (per_head) grains.push_back({1, QuantGranularity::kv_head});
    if (per_token) grains.push_back({1, QuantGranularity::token_head});
    d.k_granularity = *weighted_choice<QuantGranularity>(grains);
    d.v_granularity = *weighted_choice<QuantGranularity>(grains);
    d.zero_points =
        zero_points && d.format == int(QuantFormat::int8) && *weighted_choice<bool>({{1, false}, {1, true}});
    if (q_quant && d.format >= 0 && !quant_blocked(QuantFormat(d.format)) &&
        *weighted_choice<bool>({{1, false}, {1, true}}))
      d.q_granularity = int(*weighted_choice<QuantGranularity>(grains));
    if (d.format >= 0 && quant_blocked(QuantFormat(d.format)))  // the blocks hold their scales
      d.k_granularity = d.v_granularity = QuantGranularity::block32;
    d.plain = *weighted_choice<bool>({{1, true}, {2, false}});
    d.paged = paged;
    // Not shrunk: each group's mantissa and shift follow from it and the group's coordinates, so that a shape shrunk
    // before it keeps the others' (RapidCheck shrinks the picks in order and does not return to the shape).
    d.seed = *rc::gen::noShrink(rc::gen::inRange<std::uint64_t>(0, std::uint64_t(1) << 32));
    if (d.format < 0) d = QuantDraw{};
    return d;
  });
}

namespace {
// ggml's writers (ggml-quants.c, quantize_row_q*_ref): per block of 32, Q8_0 d = amax/127; Q4_0 d = max/-8 and Q5_0
// d = max/-16 with max the value of largest magnitude (so d takes the sign opposite to it); Q4_1 and Q5_1 d = (max -
// min)/15 or /31 and m = min; each rounded to float16. Unless plain, d moved by a power of two keyed by the block's
// coordinates (/2: values past the largest code saturate; ·2: codes use half the range). Then each element's
// nearest code.
void ggml_blocks(QuantFormat f, Tensor<double>& x, QuantScales& sc, bool plain, std::uint64_t seed, const CaseShape& s,
                 bool is_v) {
  const Shape& sh = x.shape();
  for (Index b = 0; b < sh.B; ++b)
    for (Index h = 0; h < sh.H; ++h)
      for (Index t = 0; t < sh.T; ++t)
        for (Index k = 0; k < sh.D / kQuantBlock; ++k) {
          double lo = 0, hi = 0, amax = 0, max = 0;
          for (Index c = k * kQuantBlock; c < (k + 1) * kQuantBlock; ++c) {
            const double v = x(b, h, t, c);
            lo = c == k * kQuantBlock ? v : std::min(lo, v);
            hi = c == k * kQuantBlock ? v : std::max(hi, v);
            if (std::abs(v) > amax) amax = std::abs(v), max = v;
          }
          double d = 0, m = 0;
          switch (f) {
            case QuantFormat::ggml_q8_0:
              d = amax / 127;
              break;
            case QuantFormat::ggml_q4_0:
              d = max / -8;
              break;
            case QuantFormat::ggml_q5_0:
              d = max / -16;
              break;
            case QuantFormat::ggml_q4_1:
              d = (hi - lo) / 15, m = lo;
              break;
            default:
              d = (hi - lo) / 31, m = lo;
              break;
          }
          if (!plain) {
            static constexpr double kMoves[] = {1, 1, 0.5, 2};
            const auto id = [](const std::vector<Index>& ids, Index n) {
              return ids.empty() ? n : ids[std::size_t(n)];
            };
            d *= kMoves[coordinate_hash(seed + (is_v ? 0x76 : 0x6B),
                                        {id(s.b_ids, b), id(s.kv_ids, h), id(s.k_ids, t), k}) %
                        4];
          }
          sc.scales.push_back(double(Eigen::half(float(d))));
          if (quant_has_min(f)) sc.mins.push_back(double(Eigen::half(float(m))));
        }
  x = quantize_dequantize(f, sc, x);
}
}  // namespace

void QuantDraw::apply(Problem& p, const CaseShape& s) const {
  p.quant.reset();
  const Shape qs = p.q.shape();
  if (format < 0 || (p.paged && !paged) || p.d_output ||
      double(qs.B) * double(qs.H) * double(qs.T) * double(p.k.shape().T) > double(kMaxWeights))
    return;
  const auto f = QuantFormat(format);
  static constexpr double kMantissas[] = {1.0, 1.5, 0.75, 1.25, double(0.3f)};
  // +16: an e4m3fn cache's codes all subnormal (the largest at most 448·√2·2^-16 < 2^-6, at least 448·2^-16.5 > 2^-9:
  // not 0), as a cache scaled to a far larger amax holds them.
  static constexpr int kShifts[] = {0, 0, 1, -1, 16};
  // One side's scales (and zero points) from its values x, then x as the cache holds it.
  // q's groups are keyed by query-head and query coordinates, K's and V's by kv-head and key coordinates.
  const auto side = [&](Tensor<double>& x, QuantGranularity g, std::uint64_t salt) {
    const bool is_q = salt == 0x71;
    const std::vector<Index>&h_ids = is_q ? s.h_ids : s.kv_ids, &t_ids = is_q ? s.q_ids : s.k_ids;
    QuantScales sc = quant_extents(g, x.shape());
    const Shape& sh = x.shape();
    if (quant_blocked(f)) {
      ggml_blocks(f, x, sc, plain, seed, s, salt == 0x76);
      return sc;
    }
    std::vector<double> amax(std::size_t(sc.B * sc.H * sc.T), 0.0);
    for (Index b = 0; b < sh.B; ++b)
      for (Index h = 0; h < sh.H; ++h)
        for (Index t = 0; t < sh.T; ++t)
          for (Index c = 0; c < sh.D; ++c) {
            double& a = amax[sc.at(b, h, t)];
            a = std::max(a, std::abs(x(b, h, t, c)));
          }
    for (Index b = 0; b < sc.B; ++b)
      for (Index h = 0; h < sc.H; ++h)
        for (Index t = 0; t < sc.T; ++t) {
          // Keyed by the group's coordinates (its batch entry, kv head and key), so a deleted index keeps the others'.
          // (By the granularity, not the extents: a token's group keeps its key's coordinate when it is the only key.)
          const bool per_token = g == QuantGranularity::token_head, per_head = g != QuantGranularity::tensor;
          const std::uint64_t key = coordinate_hash(
              seed + salt,
              {per_token ? id_at(s.b_ids, b) : 0, per_head ? id_at(h_ids, h) : 0, per_token ? id_at(t_ids, t) : 0});
          const double a = amax[sc.at(b, h, t)];
          int e = a > 0 ? int(std::lround(std::log2(a / quant_max(f)))) : 0;
          const int shift = plain ? 0 : f == QuantFormat::e4m3fn ? kShifts[key % 5] : kShifts[key % 4];
          e = std::clamp(e + shift, -12, 12);
          // (A mantissa below 1 would lift the subnormal shift's largest code past 2^-6: 1 there.)
          const double m = plain ? 1.0 : kMantissas[(key >> 8) % 5];
          double scale = std::ldexp(shift == 16 ? std::max(m, 1.0) : m, e);
          if (scale == 1) scale = 2;
          sc.scales.push_back(scale);
          if (zero_points && !is_q) sc.zero_points.push_back(double(Index((key >> 16) % 33) - 16));
        }
    x = quantize_dequantize(f, sc, x);
    return sc;
  };
  QuantizedKV q{.format = f, .k = {}, .v = {}};
  if (quant_blocked(f) && (p.k.shape().D % kQuantBlock != 0 || p.v.shape().D % kQuantBlock != 0)) return;
  q.k = side(p.k, k_granularity, 0x6B);
  q.v = side(p.v, v_granularity, 0x76);
  if (q_granularity >= 0 && !quant_blocked(f)) q.q = side(p.q, QuantGranularity(q_granularity), 0x71);
  p.quant = std::move(q);
}

}  // namespace attncheck
