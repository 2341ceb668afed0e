// Selected-key kernels (ABI 4's index lists: DeepSeek's DSA top-k, NSA's selected blocks, MoBA's): each reads the
// list wrong the way sparse-attention trackers report it: the list ignored (routed to the dense path), read only up
// to its first -1, -1 taken as the last key (a Python index), a repeated entry counted twice, the query head's list
// taken instead of its kv head's (or per-query-head lists read as shared), the last selected block dropped, the causal
// rule skipped for listed keys, block indices read as key indices. Most rewrite the call as they read it and run the
// reference on that; the repeated entry's kernel gathers the listed keys itself, as does the control, which gathers
// each row's keys once and attends over them alone.
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "parts.hpp"

namespace attncheck::zoo {
namespace {

Capabilities index_capabilities() {
  Capabilities c = gqa_capabilities();
  c.features.add({Feature::index_list, Feature::index_list_blocks, Feature::key_padding, Feature::lse});
  c.empty_rows = EmptyRows::zero;  // an empty list's row is checked: 0, as FlashAttention's
  return c;
}

// A kernel that counts duplicates (a key listed n times weighs n times, as a gather over every entry computes).
Capabilities counted_capabilities() {
  Capabilities c = index_capabilities();
  c.features.add(Feature::index_list_counted);
  return c;
}

// MoBA's kernel: block indices, each query's own block selected besides its row.
Capabilities moba_capabilities() {
  Capabilities c = index_capabilities();
  c.features.add(Feature::index_list_current_block);
  return c;
}

// Selected keys as slots of a paged pool (FlashMLA's sparse indices), in pages of 1 and 4 (the size is not the bug).
Capabilities physical_capabilities() {
  Capabilities c = index_capabilities();
  c.features.add({Feature::paged, Feature::index_list_physical});
  c.features.remove(Feature::index_list_blocks);
  c.page_sizes = {1, 4};
  c.page_layouts = 3;
  c.cross_lengths = false;  // square calls: the keys a query lists shrink with it
  return c;
}

// A paged physical call's entries as the kernel's slots, `shift` slots on, read back as the keys they hold (-1 where a
// slot holds none of the sequence's keys: a read of a free slot, which the bent call then skips).
void slots_shifted(Problem& p, Index shift) {
  IndexList& l = *p.index_list;
  if (!l.physical || !p.paged) return;
  const PagedKV pk = p.paged_kv();
  const std::vector<Index> lengths = p.sequence_lengths();
  const std::vector<std::int32_t> slots = physical_indices(l, pk, lengths);
  for (std::size_t n = 0; n < slots.size(); ++n) {
    const Index b = Index(n) / (l.H * l.T_q * l.max_k), s = slots[n] < 0 ? -1 : slots[n] + shift;
    l.indices[n] = -1;
    for (Index m = 0; s >= 0 && m < pk.pages_used(lengths[std::size_t(b)]); ++m)
      if (pk.block_table[std::size_t(b * pk.max_pages + m)] == s / pk.page_size &&
          m * pk.page_size + s % pk.page_size < lengths[std::size_t(b)])
        l.indices[n] = std::int32_t(m * pk.page_size + s % pk.page_size);
  }
}

// A kernel that runs the reference on the call as `bend` rewrites it (the list read wrong, or a rule forgotten).
using Bend = void (*)(Problem& p);
ImplementationPtr bent(const char* name, const char* description, Bend bend, Capabilities caps = index_capabilities()) {
  return make_implementation(name, description, std::move(caps), [=](const Problem& p) {
    if (!p.index_list) return reference_implementation()->forward(p);
    Problem r = p;
    bend(r);
    return reference_implementation()->forward(r);
  });
}

// Each row of the list, rewritten by f(row) in place.
template <class F>
void each_row(IndexList& l, F f) {
  for (Index r = 0; r < l.B * l.H * l.T_q; ++r) f(l.indices.data() + r * l.max_k, l.max_k);
}

// The gather kernel: for each query, the keys its row lists (each once, or each time it is listed), and with
// `current` the block of its own position unless the row lists it, those every other rule allows, attended to alone
// in double (attend_gathered).
Outcome gather_forward(const Problem& p, bool once, bool current = false) {
  if (!p.index_list) return reference_implementation()->forward(p);
  const IndexList& l = *p.index_list;
  Problem rules = p;  // every other rule
  rules.index_list.reset();
  const Index T_k = p.k.shape().T;
  return attend_gathered(p, rules, [&](Index b, Index h, Index i) {
    std::vector<Index> keys;
    std::set<Index> seen;
    const std::int32_t* row = l.row(b, h, i);
    const auto gather = [&](Index unit) {
      for (Index j = unit * l.block_size; j < std::min(T_k, (unit + 1) * l.block_size); ++j)
        if (!once || seen.insert(j).second) keys.push_back(j);
    };
    bool own_listed = false;
    const Index pos = rules.visibility(b, h).position(i);
    const Index own = pos >= 0 ? pos / l.block_size : -1;  // no block holds a position before the first key
    for (Index n = 0; n < l.max_k; ++n) {
      if (row[n] < 0) continue;
      gather(row[n]);
      own_listed = own_listed || row[n] == own;
    }
    if (current && !own_listed && own >= 0) gather(own);
    return keys;
  });
}

}  // namespace

Outcome attend_gathered(const Problem& p, const Problem& rules,
                        const std::function<std::vector<Index>(Index b, Index h, Index i)>& keys_of,
                        const std::function<double(Index b, Index h, Index i, Index j)>& score_offset) {
  const Shape qs = p.q.shape(), ks = p.k.shape();
  const Index Dv = p.v.shape().D, group = qs.H / ks.H;
  const double scale = p.scale ? *p.scale : 1 / std::sqrt(double(qs.D));
  Outcome o;
  o.output = Tensor<double>(p.output_shape());
  Tensor<double> w(Shape{qs.B, qs.H, qs.T, ks.T}), lse(Shape{qs.B, qs.H, qs.T, 1});
  w.values().setZero();
  for (Index b = 0; b < qs.B; ++b)
    for (Index h = 0; h < qs.H; ++h) {
      const Visibility vis = rules.visibility(b, h);
      const Index g = h / group;
      for (Index i = 0; i < qs.T; ++i) {
        std::vector<Index> keys;
        for (const Index j : keys_of(b, h, i))
          if (vis.visible(i, j)) keys.push_back(j);
        std::vector<double> s;
        double m = -std::numeric_limits<double>::infinity();
        for (const Index j : keys) {
          double dot = 0;
          for (Index c = 0; c < qs.D; ++c) dot += p.q(b, h, i, c) * p.k(b, g, j, c);
          s.push_back(dot * scale + (score_offset ? score_offset(b, h, i, j) : 0.0));
          m = std::max(m, s.back());
        }
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - m));
        lse(b, h, i, 0) = keys.empty() ? -std::numeric_limits<double>::infinity() : m + std::log(sum);
        for (Index c = 0; c < Dv; ++c) {
          double acc = 0;
          for (std::size_t n = 0; n < keys.size(); ++n) acc += s[n] / sum * p.v(b, g, keys[n], c);
          o.output(b, h, i, c) = round_to(p.dtype, acc);
        }
        for (std::size_t n = 0; n < keys.size(); ++n) w(b, h, i, keys[n]) += s[n] / sum;
      }
    }
  for (double& x : w.values()) x = round_to(p.dtype, x);
  if (p.want_weights) o.weights = std::move(w);
  if (p.want_lse) o.lse = std::move(lse);
  return o;
}

std::vector<Mutant> index_list_mutants() {
  std::vector<Mutant> z;
  z.push_back(zoo_entry(bent("mutant:index-list-ignored", "the index list ignored: every key the other rules allow",
                             [](Problem& p) { p.index_list.reset(); }),
                        "the selected keys never reach the kernel (a top-k routed to the dense path), so every key "
                        "the other rules allow is attended",
                        {1, 1, 1, 1}, "one query over one key its row does not list: it should see nothing",
                        {"index-list-oracle"}));
  z.push_back(
      zoo_entry(bent("mutant:index-list-first-pad-stops", "a row read up to its first -1 only",
                     [](Problem& p) {
                       each_row(*p.index_list, [](std::int32_t* row, Index n) {
                         const auto stop = std::find(row, row + n, -1);
                         std::fill(stop, row + n, -1);
                       });
                     }),
                "a row read as a -1-terminated list (padding assumed to trail): entries after a -1 in the middle "
                "are never read",
                {1, 1, 1, 1}, "one query over one key listed after a -1", {"index-list-oracle"}));
  z.push_back(zoo_entry(bent("mutant:index-list-minus-one-last-key", "a -1 read as the last key (k[indices] in Python)",
                             [](Problem& p) {
                               IndexList& l = *p.index_list;
                               const std::int32_t last =
                                   std::int32_t((p.k.shape().T + l.block_size - 1) / l.block_size - 1);
                               for (std::int32_t& x : l.indices)
                                 if (x < 0) x = last;
                             }),
                        "padding gathered as an index: -1 selects the last key (block), as k[idx] does in numpy and "
                        "torch, so the last key joins every padded row",
                        {1, 1, 1, 1}, "one query over one key, its row padding only: it should see nothing",
                        {"index-list-oracle"}, {Shape{1, 1, 2, 1}}));
  z.push_back(zoo_entry(
      make_implementation("mutant:index-list-duplicates-counted",
                          "the listed keys gathered as listed: a repeated key weighs twice", index_capabilities(),
                          [](const Problem& p) { return gather_forward(p, false); }),
      "keys gathered entry by entry with no deduplication: a key listed twice takes two terms of the "
      "softmax (set semantics broken)",
      {1, 1, 1, 1}, "one query over two keys, key 0 listed twice", {"index-list-oracle"}, {Shape{1, 1, 2, 1}}));
  z.push_back(
      zoo_entry(bent("mutant:index-list-query-head", "the list of the query head read, not its kv head's",
                     [](Problem& p) {
                       IndexList& l = *p.index_list;
                       if (l.group == 1) return;
                       IndexList per_query{.block_size = l.block_size,
                                           .group = 1,
                                           .B = l.B,
                                           .H = l.H * l.group,
                                           .T_q = l.T_q,
                                           .max_k = l.max_k,
                                           .indices = {}};
                       for (Index b = 0; b < l.B; ++b)
                         for (Index h = 0; h < per_query.H; ++h) {
                           if (h >= l.H)
                             throw ImplementationError(ImplementationError::Kind::crash,
                                                       "index kernel: list head " + std::to_string(h) + " of " +
                                                           std::to_string(l.H) + " read (a segfault on a device)");
                           for (Index i = 0; i < l.T_q; ++i) {
                             const std::int32_t* row = l.indices.data() + ((b * l.H + h) * l.T_q + i) * l.max_k;
                             per_query.indices.insert(per_query.indices.end(), row, row + l.max_k);
                           }
                         }
                       p.index_list = std::move(per_query);
                     }),
                "per-kv-head lists indexed with the query head (a kernel written for one list per query head): "
                "right without grouped queries",
                {1, 2, 1, 1}, "two query heads over one kv head: head 1 reads past the lists", {"index-list-oracle"}));
  z.push_back(
      zoo_entry(bent("mutant:index-list-block-last-dropped", "a row's last selected block dropped",
                     [](Problem& p) {
                       if (p.index_list->block_size == 1) return;
                       each_row(*p.index_list, [](std::int32_t* row, Index n) {
                         std::int32_t* top = std::max_element(row, row + n);
                         if (top != row + n && *top >= 0) *top = -1;
                       });
                     }),
                "the highest selected block of each row dropped (a loop over blocks that stops one short of the "
                "current block MoBA always selects): right for key indices",
                {1, 1, 1, 1}, "one query over one key in a listed block of 2 or more", {"index-list-oracle"}));
  z.push_back(zoo_entry(bent("mutant:index-list-no-causal", "listed keys seen whatever the causal rule says",
                             [](Problem& p) { p.causal = false; }),
                        "the selected keys attended without the causal rule (a sparse path trusting its indexer to "
                        "return only past keys)",
                        {1, 1, 1, 1}, "one query over two keys, the future one listed", {"index-list-oracle"},
                        {Shape{1, 1, 2, 1}}));
  z.push_back(zoo_entry(bent("mutant:index-list-block-as-key", "block indices read as key indices",
                             [](Problem& p) { p.index_list->block_size = 1; }),
                        "a block list read as a key list (the block size never applied): block n selects key n alone",
                        {1, 1, 1, 1}, "one query over one block of keys", {"index-list-oracle"}));
  Capabilities per_query = index_capabilities();
  per_query.features.add(Feature::index_list_per_query_head);
  z.push_back(zoo_entry(bent(
                            "mutant:index-list-per-head-as-shared",
                            "per-query-head lists read as one per kv head (the group's first head's)",
                            [](Problem& p) {
                              IndexList& l = *p.index_list;
                              const Index H_kv = p.k.shape().H;
                              if (l.H == H_kv) return;
                              const Index g = l.H / H_kv;  // query heads per kv head
                              IndexList shared{.block_size = l.block_size,
                                               .group = g,
                                               .B = l.B,
                                               .H = H_kv,
                                               .T_q = l.T_q,
                                               .max_k = l.max_k,
                                               .indices = {}};
                              for (Index b = 0; b < l.B; ++b)
                                for (Index kv = 0; kv < H_kv; ++kv) {
                                  const std::int32_t* rows = l.indices.data() + (b * l.H + kv * g) * l.T_q * l.max_k;
                                  shared.indices.insert(shared.indices.end(), rows, rows + l.T_q * l.max_k);
                                }
                              p.index_list = std::move(shared);
                            },
                            per_query),
                        "lists given per query head read as shared by the kv head's group (the indexer's per-head "
                        "selection collapsed to its group's first head): right for the first head of each group",
                        {1, 2, 1, 1}, "two query heads over one kv head: head 1 takes head 0's list",
                        {"index-list-oracle"}));
  z.push_back(zoo_entry(bent(
                            "mutant:index-list-physical-as-logical", "a paged call's slots read as key positions",
                            [](Problem& p) {
                              IndexList& l = *p.index_list;
                              if (!l.physical || !p.paged) return;
                              l.indices = physical_indices(l, p.paged_kv(), p.sequence_lengths());
                              for (std::int32_t& x : l.indices)
                                if (x >= p.k.shape().T) x = -1;  // past the keys: nothing read
                            },
                            physical_capabilities()),
                        "the indexer's slots (page·page_size + slot) taken as positions in the sequence (the "
                        "logical space assumed): right where each sequence's pages lie first and in order",
                        {1, 1, 1, 1},
                        "a pool of two pages: one query over one key in the pool's second page (or two keys in "
                        "reversed pages, or two sequences of one key)",
                        {"index-list-oracle", "index-list-pages"}, {Shape{1, 1, 2, 1}, Shape{2, 1, 1, 1}}));
  z.push_back(
      zoo_entry(bent(
                    "mutant:index-list-physical-page-off", "a listed slot read one page on",
                    [](Problem& p) { slots_shifted(p, p.paged ? p.paged->page_size : 0); }, physical_capabilities()),
                "the slot's page offset added twice (an indexer offset off by a page): slot s read at s + "
                "page_size, a key of another page or a free slot",
                {1, 1, 1, 1},
                "one query over one listed key: its slot read a page on, where no key lies (or two keys, the "
                "first read at the second's slot)",
                {"index-list-oracle"}, {Shape{1, 1, 2, 1}}));
  z.push_back(zoo_entry(
      make_implementation("mutant:index-list-counted-deduplicated",
                          "duplicates declared counted, but each listed key gathered once", counted_capabilities(),
                          [](const Problem& p) { return gather_forward(p, true); }),
      "a kernel that declares duplicates counted (a key listed n times weighs n times) deduplicates its rows "
      "anyway (a set built from the list, a sort-and-unique before the gather): a repeated key weighs once",
      {1, 1, 1, 1}, "one query over two keys, key 0 listed twice", {"index-list-oracle"}, {Shape{1, 1, 2, 1}}));
  z.push_back(zoo_entry(bent(
                            "mutant:index-list-current-block-dropped",
                            "MoBA's current block declared, but only the row's blocks selected",
                            [](Problem& p) { p.index_list->current_block = false; }, moba_capabilities()),
                        "MoBA's current block never forced: a query sees only the blocks its row selects, not its "
                        "own, so a query whose gate picked no block sees nothing (and none sees its own recent keys)",
                        {1, 1, 1, 1}, "one query over one key, its row empty: its own block holds that key",
                        {"index-list-oracle"}));
  z.push_back(zoo_entry(bent("mutant:index-list-current-block-undeclared",
                             "each query's own block selected besides its row, though not declared",
                             [](Problem& p) { p.index_list->current_block = true; }),
                        "a MoBA kernel behind a DSA-style top-k call: the current block added to every query's "
                        "selection though the caller's list is the whole selection",
                        {1, 1, 1, 1}, "one query over one key, its row empty: it should see nothing",
                        {"index-list-oracle"}));
  z.push_back(Mutant{
      .impl = make_implementation("control:index-list-gather-moba",
                                  "correct for MoBA; each row's blocks and the query's own block gathered once",
                                  moba_capabilities(), [](const Problem& p) { return gather_forward(p, true, true); }),
      .bug = "control: MoBA's current block declared, and each query's keys gathered from its row's blocks and its "
             "own block (added unless listed), those every other rule allows kept, and attended to alone in "
             "double: MoBA's way, which the oracle's selection must match",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {}});
  z.push_back(Mutant{
      .impl = make_implementation("control:index-list-gather-counted",
                                  "correct where duplicates count; each row's entries gathered as listed, in double",
                                  counted_capabilities(), [](const Problem& p) { return gather_forward(p, false); }),
      .bug = "control: duplicates declared counted, and each row's entries gathered one by one (a repeated key as "
             "often as it is listed, padding skipped, blocks expanded), those every other rule allows kept, and "
             "attended to alone in double: FlashMLA's sparse kernels' way, which the oracle's counts must match",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {}});
  z.push_back(Mutant{
      .impl = make_implementation("control:index-list-gather",
                                  "correct; each row's listed keys gathered once and attended to alone, in double",
                                  index_capabilities(), [](const Problem& p) { return gather_forward(p, true); }),
      .bug = "control: the listed keys of each row gathered once (padding skipped, a repeated key once, blocks "
             "expanded), those every other rule allows kept, and attended to alone in double: the sparse kernel's "
             "way, which the oracle's mask must match",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {}});
  return z;
}

}  // namespace attncheck::zoo
