// Score modifiers (softcap, ALiBi, sinks, an additive bias, a temperature) and paged-KV plans, drawn for the laws that
// allow them.
#include "parts.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <numeric>

namespace attncheck {
using namespace generation;

rc::Gen<Modifiers> gen_modifiers(const GenConfig& cfg, const ProblemOptions& opts, double max_spread) {
  const FeatureSet declared = declared_features(cfg.caps);
  const bool softcap = opts.may_use(Feature::softcap, declared), alibi = opts.may_use(Feature::alibi, declared),
             sinks = opts.may_use(Feature::sinks, declared), bias = opts.may_use(Feature::bias, declared),
             temperature = opts.may_use(Feature::temperature, declared);
  const bool half_split = opts.may_use(Feature::rope, declared),
             interleaved = opts.may_use(Feature::rope_interleaved, declared);
  const bool ntk = opts.may_use(Feature::rope_ntk, declared), llama3 = opts.may_use(Feature::rope_llama3, declared);
  const bool norm_inside = opts.may_use(Feature::qk_norm, declared),
             norm_outside = opts.may_use(Feature::qk_norm_eps_outside, declared);
  const bool dropout = opts.may_use(Feature::dropout, declared);
  return rc::gen::exec([=] {
    Modifiers m;
    // Each in about a third of the cases (every one when required: then "none" is not a choice at all, so
    // shrinking keeps one), none first when shrinking.
    const auto choose = [](bool required, auto none, auto rest) {
      using T = decltype(none);
      std::vector<std::pair<std::size_t, T>> c;
      if (!required) c.push_back({4, none});
      for (const auto& r : rest) c.push_back(r);
      return *weighted_choice<T>(c);
    };
    if (softcap) {
      std::vector<std::pair<std::size_t, double>> caps{{1, 5.0}, {1, 1.0}, {1, 50.0}};
      // A cap that bites: with 2c <= spread / 2, the row of the largest spread of visible scores spreads further
      // than the cap allows unless the kernel applies it (softcap-bound). A power of two, none below 2^-4; 1 for a
      // case without a spread. Always a choice, so that a shrinking step keeps the same choice.
      const double bite = max_spread > 0 ? std::max(0.0625, std::exp2(std::floor(std::log2(max_spread / 4)))) : 1.0;
      caps.push_back({6, bite});
      const double cap = choose(opts.require.has(Feature::softcap), 0.0, caps);
      if (cap > 0) m.softcap = cap;
    }
    if (alibi) m.alibi = choose(opts.require.has(Feature::alibi), 0, std::vector<std::pair<std::size_t, int>>{{1, 1}, {1, 2}});
    if (sinks) m.sinks = choose(opts.require.has(Feature::sinks), -1, std::vector<std::pair<std::size_t, int>>{{2, 0}, {1, 3}});
    // Drawn last, and only where it may be used: an implementation without it keeps every earlier draw.
    if (bias) {
      m.bias = choose(opts.require.has(Feature::bias), -1, std::vector<std::pair<std::size_t, int>>{{1, 0}, {1, 1}});
      // Shrinking toward one bias for all (3), then per head, per batch entry, and one per (b, h).
      m.bias_extent = *weighted_choice<int>({{2, 3}, {1, 1}, {1, 2}, {2, 0}});
      if (m.bias < 0) m.bias_extent = 0;
    }
    // Later still, for the same reason.
    if (temperature) {
      m.temperature =
          choose(opts.require.has(Feature::temperature), -1, std::vector<std::pair<std::size_t, int>>{{1, 0}, {1, 1}});
      // Shrinking toward one temperature per query for every batch entry and head (Llama 4's), then per head, per
      // batch entry, and one per (b, h, i).
      m.temperature_extent = *weighted_choice<int>({{2, 3}, {1, 1}, {1, 2}, {1, 0}});
      if (m.temperature < 0) m.temperature_extent = 0;
    }
    // Later still: a rope, in a declared variant, shrinking toward none, then the plainest one.
    if (half_split || interleaved) {
      const bool required = opts.require.has(Feature::rope) || opts.require.has(Feature::rope_interleaved);
      m.rope = choose(required, -1, std::vector<std::pair<std::size_t, int>>{{1, 0}, {1, 1}});
      std::vector<std::pair<std::size_t, RopeVariant>> variants;
      if (half_split) variants.push_back({1, RopeVariant::half_split});
      if (interleaved) variants.push_back({1, RopeVariant::interleaved});
      m.rope_variant = *weighted_choice<RopeVariant>(variants);
      // rotary_dim 2, then up to 4, then every pair: a fixed rotary_dim keeps its pairs while D is cut from its end.
      m.rope_dim = *weighted_choice<int>({{1, 0}, {2, 1}, {1, 2}});
      m.rope_base = *weighted_choice<double>({{3, 10000.0}, {1, 500000.0}, {1, 100.0}});
      m.rope_factor = *weighted_choice<double>({{3, 1.0}, {1, 2.0}, {1, 8.0}});
      m.rope_offset = *weighted_choice<Index>({{3, 0}, {1, 5}, {1, 1000}, {1, 40000}});
      m.rope_free = *weighted_choice<bool>({{3, false}, {1, true}});
      // Then, only where a scaling beyond linear is declared (an implementation without one draws nothing more): a
      // declared scaling, shrinking toward linear, and Llama 3's original context (short ones put a band of it
      // where a few pairs' wavelengths fall).
      if (ntk || llama3) {
        std::vector<std::pair<std::size_t, int>> scalings{{1, 0}};
        if (ntk) scalings.push_back({1, 1});
        if (llama3) scalings.push_back({1, 2});
        m.rope_scaling = *weighted_choice<int>(scalings);
        m.rope_context = *weighted_choice<double>({{2, 16.0}, {1, 64.0}});
      }
      if (m.rope < 0) {  // the plainest fields, as a case without a rope has them
        const Modifiers none{};
        m.rope_scaling = none.rope_scaling;
        m.rope_context = none.rope_context;
        m.rope_variant = none.rope_variant;
        m.rope_dim = none.rope_dim;
        m.rope_base = none.rope_base;
        m.rope_factor = none.rope_factor;
        m.rope_offset = none.rope_offset;
        m.rope_free = none.rope_free;
      }
    }
    // Last: a QK-norm, in a declared placement, shrinking toward none, then both sides and the smallest eps.
    if (norm_inside || norm_outside) {
      const bool required = opts.require.has(Feature::qk_norm) || opts.require.has(Feature::qk_norm_eps_outside);
      m.qk_norm = choose(required, -1, std::vector<std::pair<std::size_t, int>>{{1, 0}, {1, 1}});
      std::vector<std::pair<std::size_t, bool>> placements;
      if (norm_inside) placements.push_back({1, false});
      if (norm_outside) placements.push_back({1, true});
      m.qk_outside = *weighted_choice<bool>(placements);
      m.qk_sides = *weighted_choice<int>({{2, 3}, {1, 1}, {1, 2}});
      m.qk_eps = *weighted_choice<double>({{2, 1e-6}, {1, 1e-3}, {1, 0.1}});
      if (m.qk_norm < 0) {
        const Modifiers none{};
        m.qk_outside = none.qk_outside;
        m.qk_sides = none.qk_sides;
        m.qk_eps = none.qk_eps;
      }
    }
    // After everything else: dropout, shrinking toward none, then p = 1/2.
    if (dropout) {
      m.dropout = choose(opts.require.has(Feature::dropout), -1,
                         std::vector<std::pair<std::size_t, int>>{{3, 0}, {2, 1}, {1, 2}, {2, 3}, {1, 4}});
      // Shrinking toward 0, through many other values: a bug a kept cell shows shrinks to one cell once some seed
      // and offset keep it.
      m.dropout_seed = *rc::gen::arbitrary<std::uint64_t>();
      m.dropout_offset = *rc::gen::inRange<std::uint64_t>(0, std::uint64_t(1) << 40);
    }
    return m;
  });
}

rc::Gen<std::optional<PagedPlan>> gen_paged_plan(const GenConfig& cfg, const ProblemOptions& opts) {
  std::vector<std::pair<std::size_t, Index>> sizes;
  for (const Index ps : cfg.caps.page_sizes)
    if (ps > 0) sizes.push_back({1, ps});
  std::vector<std::pair<std::size_t, PageLayout>> layouts;
  if (cfg.caps.page_layouts & 1u) layouts.push_back({1, PageLayout::token_major});
  if (cfg.caps.page_layouts & 2u) layouts.push_back({1, PageLayout::head_major});
  const bool possible =
      !sizes.empty() && !layouts.empty() && opts.may_use(Feature::paged, declared_features(cfg.caps));
  return rc::gen::exec([=]() -> std::optional<PagedPlan> {
    if (!possible) return std::nullopt;
    const bool on = opts.require.has(Feature::paged) || *weighted_choice<bool>({{1, false}, {1, true}});
    PagedPlan plan;
    plan.page_size = *weighted_choice<Index>(sizes);
    plan.layout = *weighted_choice<PageLayout>(layouts);
    plan.order = *weighted_choice<PagedPlan::Order>(
        {{2, PagedPlan::Order::contiguous}, {1, PagedPlan::Order::reversed}, {3, PagedPlan::Order::shuffled}});
    plan.shuffle_seed = *rc::gen::noShrink(rc::gen::inRange<std::uint64_t>(0, std::uint64_t(1) << 32));
    plan.spare_pages = *weighted_choice<Index>({{3, 0}, {1, 1}, {1, 3}});
    plan.spare_columns = *weighted_choice<Index>({{3, 0}, {1, 1}, {1, 2}});
    plan.junk_entries = *weighted_choice<bool>({{2, false}, {1, true}});
    plan.fill = *weighted_choice<PageFill>(
        {{3, PageFill::zero}, {2, PageFill::nan}, {1, PageFill::pos_inf}, {1, PageFill::neg_inf}, {1, PageFill::huge}});
    if (plan.order != PagedPlan::Order::shuffled) plan.shuffle_seed = 0;
    if (!on) return std::nullopt;
    return plan;
  });
}

std::uint64_t coordinate_hash(std::uint64_t seed, std::initializer_list<Index> coordinates) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull;
  for (const Index c : coordinates) {
    x += std::uint64_t(c) + 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
  }
  return x;
}

namespace {
// A bias value for the cell at coordinates (b, h, i, j) under `seed`: a multiple of 1/4 in [-2, 2), exact in every
// dtype (bfloat16 has 8 significant bits), so the call's bias is the problem's. coordinate_hash: the same on every
// platform, and a cell keeps its value when others are deleted.
double bias_value(int seed, Index b, Index h, Index i, Index j) {
  return double(Index(coordinate_hash(std::uint64_t(seed), {b, h, i, j}) % 16)) / 4 - 2;
}

// A temperature for query (b, h, i) under `seed`: one of nine values in [1/2, 3] with at most 3 significant bits
// (exact in every dtype, so the call's is the problem's), powers of two and not, keyed by coordinates as the bias is.
double temperature_value(int seed, Index b, Index h, Index i) {
  static constexpr double kTemperatures[] = {0.5, 0.625, 0.75, 0.875, 1.0, 1.25, 1.5, 2.0, 3.0};
  return kTemperatures[coordinate_hash(std::uint64_t(seed) + 0x7E3Dull, {b, h, i}) % 9];
}

Index id_of(const std::vector<Index>& ids, Index n) { return ids.empty() ? n : ids[std::size_t(n)]; }
}  // namespace

void Modifiers::apply(Problem& p, const CaseShape& s) const {
  static constexpr double kSinks[] = {0.0, 1.0, -1.0, 2.5, -3.0, 6.0};
  const Index H = p.q.shape().H;
  const auto id = [&](Index h) { return id_of(s.h_ids, h); };
  p.softcap = softcap;
  p.alibi_slopes.clear();
  p.sinks.clear();
  for (Index h = 0; h < H; ++h) {
    if (alibi == 1) p.alibi_slopes.push_back(std::ldexp(1.0, -int(std::min<Index>(id(h), 60)) - 1));
    if (alibi == 2) p.alibi_slopes.push_back(1.0);
    if (sinks >= 0) p.sinks.push_back(kSinks[std::size_t(id(h) + sinks) % 6]);
  }
  p.rope.reset();
  // Only where the bound is materialised (2^18 weights, as the bias): RoPE's bound has no streamed form yet.
  if (const Index D = p.q.shape().D, T_q = p.q.shape().T, T_k = p.k.shape().T, B = p.q.shape().B;
      rope >= 0 && D >= 2 && double(B) * double(H) * double(T_q) * double(T_k) <= double(1 << 18)) {
    const Index full = D - D % 2;
    Rope r{.variant = rope_variant,
           .rotary_dim = rope_dim == 0   ? 2
                         : rope_dim == 1 ? std::min<Index>(4, full)
                                         : full,
           .base = rope_base,
           .factor = rope_factor};
    if (rope_scaling == 1 && full >= 4) {  // NTK-aware: a rotary_dim of at least 4 (its base grows by f^(r/(r-2)))
      r.scaling = RopeScaling::ntk;
      r.rotary_dim = std::max<Index>(r.rotary_dim, 4);
    }
    if (rope_scaling == 2) {
      r.scaling = RopeScaling::llama3;
      r.original_max_position = rope_context;
    }
    // Positions: each token's index (a query's aligned one, 0 for a query before the keys) plus an offset, or free
    // ids (packed sequences, trees) keyed by coordinates; a deleted token takes its position with it.
    const Index shift = p.alignment == CausalAlignment::BottomRight ? T_k - T_q : 0;
    for (Index b = 0; b < B; ++b) {
      const Index bid = id_of(s.b_ids, b);
      for (Index i = 0; i < T_q; ++i)
        r.q_positions.push_back(
            rope_free ? Index(coordinate_hash(std::uint64_t(rope) + 0x90E, {bid, 0, id_of(s.q_ids, i)}) % 65536)
                      : rope_offset + std::max<Index>(0, shift + i));
      for (Index j = 0; j < T_k; ++j)
        r.k_positions.push_back(
            rope_free ? Index(coordinate_hash(std::uint64_t(rope) + 0x90E, {bid, 1, id_of(s.k_ids, j)}) % 65536)
                      : rope_offset + j);
    }
    p.rope = std::move(r);
  }
  p.dropout.reset();
  if (const Index T_q = p.q.shape().T, T_k = p.k.shape().T, B = p.q.shape().B;
      dropout >= 0 && double(B) * double(H) * double(T_q) * double(T_k) <= double(1 << 18)) {
    static constexpr double kDropoutPs[] = {0.5, 0.1, 0.25, 0.9, 0.0};
    p.dropout = Dropout{.p = kDropoutPs[dropout], .seed = dropout_seed, .offset = dropout_offset};
  }
  p.qk_norm.reset();
  if (qk_norm >= 0) {
    // Weights in [1/2, 3/2], multiples of 1/8 (exact in every dtype), keyed by the head dimension's coordinate.
    const auto weights = [&](Index side) {
      std::vector<double> w;
      for (Index c = 0; c < p.q.shape().D; ++c)
        w.push_back(
            1 + double(Index(coordinate_hash(std::uint64_t(qk_norm) + 0x0AB, {side, id_of(s.d_ids, c)}) % 9) - 4) / 8);
      return w;
    };
    p.qk_norm = QkNorm{.q_weight = qk_sides & 1 ? weights(0) : std::vector<double>{},
                       .k_weight = qk_sides & 2 ? weights(1) : std::vector<double>{},
                       .eps = qk_eps,
                       .eps_outside = qk_outside};
  }
  p.temperature.reset();
  if (temperature >= 0) {
    // Keyed by the coordinates of the axes it has (by the extent, not the size: a head a shrink kept alone keeps
    // its own values).
    const bool per_b = temperature_extent == 0 || temperature_extent == 2,
               per_h = temperature_extent == 0 || temperature_extent == 1;
    QueryTemperature t{.B = per_b ? p.q.shape().B : 1, .H = per_h ? H : 1, .T_q = p.q.shape().T, .values = {}};
    t.values.reserve(std::size_t(t.B * t.H * t.T_q));
    for (Index b = 0; b < t.B; ++b)
      for (Index h = 0; h < t.H; ++h)
        for (Index i = 0; i < t.T_q; ++i)
          t.values.push_back(
              temperature_value(temperature, per_b ? id_of(s.b_ids, b) : 0, per_h ? id(h) : 0, id_of(s.q_ids, i)));
    p.temperature = std::move(t);
  }
  p.bias.reset();
  if (bias < 0) return;
  const Index B = p.q.shape().B, T_q = p.q.shape().T, T_k = p.k.shape().T;
  // Only where [B,H,T_q,T_k] is small enough to hold per cell (2^18 values, 2 MiB), as the dense masks: a long
  // context's bias would be gigabytes (a kernel computes such a bias from positions, ALiBi's way).
  if (double(B) * double(H) * double(T_q) * double(T_k) > double(1 << 18)) return;
  // Keyed by the coordinates of the axes it has (by the extent, not the size: a head a shrink kept alone keeps its
  // own values).
  const bool per_b = bias_extent == 0 || bias_extent == 2, per_h = bias_extent == 0 || bias_extent == 1;
  ScoreBias sb{.B = per_b ? B : 1, .H = per_h ? H : 1, .T_q = T_q, .T_k = T_k, .values = {}};
  sb.values.reserve(std::size_t(sb.B * sb.H * T_q * T_k));
  for (Index b = 0; b < sb.B; ++b)
    for (Index h = 0; h < sb.H; ++h)
      for (Index i = 0; i < T_q; ++i)
        for (Index j = 0; j < T_k; ++j)
          sb.values.push_back(
              bias_value(bias, per_b ? id_of(s.b_ids, b) : 0, per_h ? id(h) : 0, id_of(s.q_ids, i), id_of(s.k_ids, j)));
  p.bias = std::move(sb);
}

}  // namespace attncheck
