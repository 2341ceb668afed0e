// Selected keys (an index list per batch entry, kv head and query), drawn for the laws that require them: each unit
// (a key, or a block of keys) listed by a hash of its coordinates, so a shrunk shape keeps the other rows' lists.
#include <algorithm>
#include <numeric>

#include "parts.hpp"

namespace attncheck {
using namespace generation;

namespace {
Index id_of(const std::vector<Index>& ids, Index n) { return ids.empty() ? n : ids[std::size_t(n)]; }

}  // namespace

namespace generation {
rc::Gen<int> choice_shrinking_to_each_earlier(std::vector<std::size_t> w) {
  return [w](const rc::Random& random, int) {
    std::size_t sum = 0;
    for (const std::size_t x : w) sum += x;
    std::size_t pick = std::size_t(rc::Random(random).next() % sum), idx = 0;
    while (pick >= w[idx]) pick -= w[idx++];
    return rc::shrinkable::map(
        rc::shrinkable::shrinkRecur(idx, [](std::size_t x) { return rc::seq::range<std::size_t>(0, x); }),
        [](std::size_t i) { return int(i); });
  };
}
}  // namespace generation

rc::Gen<IndexDraw> gen_index_list(const GenConfig& cfg, const ProblemOptions& opts) {
  const FeatureSet declared = declared_features(cfg.caps);
  if (!opts.must_use(Feature::index_list, declared)) return rc::gen::just(IndexDraw{});
  const bool blocks = opts.may_use(Feature::index_list_blocks, declared),
             per_query = opts.may_use(Feature::index_list_per_query_head, declared),
             physical = opts.may_use(Feature::index_list_physical, declared);
  return rc::gen::exec([=] {
    IndexDraw d;
    d.on = true;
    d.counted = declared.has(Feature::index_list_counted);
    d.current_block =
        declared.has(Feature::index_list_current_block);          // a meaning: every list of such an implementation
    d.pattern = *choice_shrinking_to_each_earlier({1, 1, 1, 4});  // every, none, alternate, hashed
    d.density = *weighted_choice<int>({{2, 2}, {1, 1}, {1, 3}});
    d.shuffled = *weighted_choice<bool>({{1, false}, {2, true}});
    d.padding = *weighted_choice<bool>({{1, false}, {1, true}});
    d.duplicates = *weighted_choice<bool>({{2, false}, {1, true}});
    if (per_query) d.per_query_head = *weighted_choice<bool>({{1, false}, {1, true}});
    if (blocks) d.block_size = *weighted_choice<Index>({{2, 1}, {1, 2}, {1, 3}, {1, 16}});
    if (physical)
      d.physical = opts.require.has(Feature::index_list_physical) || *weighted_choice<bool>({{1, false}, {1, true}});
    // Not shrunk: which units are listed follows from it and each unit's coordinates.
    d.seed = *rc::gen::noShrink(rc::gen::inRange<std::uint64_t>(0, std::uint64_t(1) << 32));
    return d;
  });
}

void IndexDraw::apply(Problem& p, const CaseShape& s) const {
  p.index_list.reset();
  const Shape qs = p.q.shape(), ks = p.k.shape();
  // Up to 2^18 weights, as the laws' bounds are materialised (a longer case has none: its laws say so).
  if (!on || double(qs.B) * double(qs.H) * double(qs.T) * double(ks.T) > double(1 << 18)) return;
  const Index units = (ks.T + block_size - 1) / block_size;
  // Lists per query head only where they differ from per kv head (H_kv < H); keyed by the head's coordinates.
  const bool per_query = per_query_head && ks.H < qs.H;
  const Index heads = per_query ? qs.H : ks.H;
  const std::uint64_t salt = per_query ? 0x9E37 : 0;
  std::vector<std::vector<std::int32_t>> rows;
  std::size_t width = 0;
  for (Index b = 0; b < qs.B; ++b)
    for (Index g = 0; g < heads; ++g)
      for (Index i = 0; i < qs.T; ++i) {
        const std::uint64_t row_key = coordinate_hash(
            seed + salt, {id_of(s.b_ids, b), per_query ? id_of(s.h_ids, g) : id_of(s.kv_ids, g), id_of(s.q_ids, i)});
        std::vector<std::pair<std::uint64_t, std::int32_t>> listed;
        for (Index u = 0; u < units; ++u) {
          const std::uint64_t h = coordinate_hash(row_key, {id_of(s.k_ids, u * block_size)});
          const bool in = pattern == every || (pattern == alternate && id_of(s.k_ids, u * block_size) % 2 == 0) ||
                          (pattern == hashed && Index(h % 4) < density);
          const std::uint64_t order = !shuffled ? std::uint64_t(u) : pattern == hashed ? h >> 8 : ~std::uint64_t(u);
          if (in) listed.push_back({order, std::int32_t(u)});
        }
        std::sort(listed.begin(), listed.end());
        std::vector<std::int32_t> row;
        if (padding) row.push_back(-1);
        for (std::size_t n = 0; n < listed.size(); ++n) {
          if (padding && pattern == hashed && n > 0 && (row_key >> (n % 48)) % 3 == 0) row.push_back(-1);
          row.push_back(listed[n].second);
        }
        if (duplicates && !listed.empty()) row.push_back(listed[0].second);
        rows.push_back(std::move(row));
        width = std::max(width, rows.back().size());
      }
  if (padding) ++width;       // every row ends with padding too
  if (width == 0) width = 1;  // rows of padding alone rather than none
  IndexList l{.block_size = block_size,
              .group = qs.H / heads,
              .B = qs.B,
              .H = heads,
              .T_q = qs.T,
              .max_k = Index(width),
              .indices = {}};
  for (std::vector<std::int32_t>& row : rows) {
    row.resize(width, -1);
    l.indices.insert(l.indices.end(), row.begin(), row.end());
  }
  l.physical = physical && p.paged && block_size == 1;  // crossing as the pool's slots
  l.counted = counted;
  l.current_block = current_block;
  p.index_list = std::move(l);
}

}  // namespace attncheck
