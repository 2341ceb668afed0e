// Selected keys' laws (an index list per batch entry, kv head and query: DeepSeek's DSA, NSA's selection, MoBA's
// blocks): index-list-oracle (the call is attention over exactly the listed keys that every other rule allows),
// index-list-order (a row is a set: its order, its padding and a repeated entry change nothing) and index-list-full
// (listing every key is the call without a list).
#include <algorithm>
#include <cmath>

#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace index_list_law {

std::string needs_index_list(const GenConfig& g) {
  if (!g.caps.declares(Feature::index_list))
    return "needs selected keys (ATTNCHECK_CAP4_INDEX_LIST), which this implementation does not declare";
  if (std::string why = pinned_past_materialised(g, "an index list"); !why.empty()) return why;
  // Every case at least min_T long (a long-context run): past 2^18 weights whatever B and H, so no case could hold
  // a list; said so rather than held on cases without one.
  if (!g.shape && double(g.min_T) * double(g.min_T) > double(1 << 18))
    return "an index list is checked up to 2^18 weights (B·H·T_q·T_k: its bound is materialised); every case here has "
           "T >= " +
           std::to_string(g.min_T);
  return "";
}

// Every case has an index list (block indices too where declared); forward calls only.
ProblemOptions options(bool weights) {
  ProblemOptions po = weights ? ProblemOptions{} : outputs_only();
  po.require.add(Feature::index_list);
  po.allow.add(Feature::index_list_blocks);
  return po;
}
rc::Gen<LawCase> gen(const GenConfig& cfg) { return gen_problem(within_materialised(cfg), options(true)); }
rc::Gen<LawCase> gen_outputs(const GenConfig& cfg) { return gen_problem(within_materialised(cfg), options(false)); }

// --- index-list-oracle --------------------------------------------------------------------------------------------

const char* kOracleWhy =
    "An index list says which keys each query may see: query i of batch entry b and query head h sees key j only if "
    "row (b, h's kv head, i) lists j (or its block), and only if every other rule (causal, padding, window, masks) "
    "allows it too; a key listed twice is listed once (where the implementation declares duplicates counted, a key "
    "listed n times weighs n times, and the oracle counts them too). So the call is attention over exactly those keys: "
    "its output, "
    "weights and LSE agree with the float64 oracle, which applies the list as one more mask, within the derived bound "
    "(attention/src/tolerance.cpp), a key the list hides weighing exactly 0. Its cases list keys the causal rule "
    "hides, pad rows with -1 between entries and at their end, repeat an entry, and leave rows empty: such a row "
    "returns what the implementation declares for a row that sees no key (0, or NaN). A kernel that ignores the list, "
    "stops at its first -1, reads -1 as the last key, counts a "
    "repeated entry twice, takes the list of the query head instead of its kv head, drops a block or forgets the "
    "causal rule for listed keys breaks it.";

// A row its list leaves without a key (an empty list, padding alone, or keys every other rule hides) returns what
// the implementation declares for a row that sees no key: 0 (zero) or NaN (nan) in its output and weights; nothing
// is asked under `any` or without a declaration (empty-row-convention finds the convention out).
std::optional<Violation> empty_rows_as_declared(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const std::optional<EmptyRows> e = impl.capabilities().empty_rows;
  if (!e || *e == EmptyRows::any) return std::nullopt;
  const Shape& s = p.q.shape();
  bool any_empty = false;
  for (Index b = 0; b < s.B && !any_empty; ++b)
    for (Index h = 0; h < s.H && !any_empty; ++h)
      for (Index i = 0; i < s.T && !any_empty; ++i) any_empty = sees_none(p, b, h, i);
  if (!any_empty) return std::nullopt;
  Outcome o = call(impl, p);
  if (!c.outputs_only) o.weights = weights_of(impl, c, o);
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index i = 0; i < s.T; ++i) {
        if (!sees_none(p, b, h, i)) continue;
        for (const auto& [name, t] : {std::pair{"output", &o.output}, {"weights", o.weights ? &*o.weights : nullptr}}) {
          if (!t) continue;
          for (Index x = 0; x < t->shape().D; ++x) {
            const double y = (*t)(b, h, i, x);
            if (*e == EmptyRows::zero ? y == 0 : std::isnan(y)) continue;
            Violation v;
            v.quantity = name;
            v.worst_index = {b, h, i, x};
            v.magnitude = std::isnan(y) ? y : std::abs(y);
            v.message = "index-list-oracle: " + std::string(name) + idx({b, h, i, x}) + " is " + num(y) +
                        " in a row that sees no key (its list names none the other rules allow), but the "
                        "implementation declares " +
                        std::string(*e == EmptyRows::zero ? "0" : "NaN") + " for such a row";
            v.actual = *t;
            v.weights = o.weights;
            return v;
          }
        }
      }
  return std::nullopt;
}

// Whether a row of l names a unit more than once.
bool has_duplicates(const IndexList& l) {
  for (Index r = 0; r < l.B * l.H * l.T_q; ++r) {
    std::vector<std::int32_t> row(l.indices.begin() + r * l.max_k, l.indices.begin() + (r + 1) * l.max_k);
    std::erase(row, -1);
    std::sort(row.begin(), row.end());
    if (std::adjacent_find(row.begin(), row.end()) != row.end()) return true;
  }
  return false;
}

Verdict check_oracle(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  if (!p.index_list) return std::nullopt;
  std::string note = "the oracle saw only the listed keys the other rules allow";
  if (has_duplicates(*p.index_list))
    note += p.index_list->counted ? ", a key listed n times weighing n times as declared"
                                  : in_declaration_words(
                                        ", a key listed twice weighing once (a kernel that gathers "
                                        "every entry counts it twice: if that is its meaning, "
                                        "declare it (Feature::index_list_counted))",
                                        declared_by(impl.name()));
  if (auto v = agrees_with_oracle("index-list-oracle", impl, c, note)) return v;
  return empty_rows_as_declared(impl, c);
}

// --- index-list-order ---------------------------------------------------------------------------------------------

const char* kOrderWhy =
    "A row of an index list is a set of keys: the order of its entries, where its padding sits and whether an entry "
    "comes twice change which keys it lists not at all. So the call with every row reversed, its padding moved to the "
    "front and its last entry repeated computes the same attention; a kernel may sum in the order it reads, so the two "
    "calls agree within both calls' derived bounds (plus what their float64 oracles differ by: nothing). A kernel "
    "that stops at the first -1, counts a repeated key twice, or needs its rows sorted breaks it. Where the "
    "implementation counts duplicates (a key listed n times weighs n times) a row is a multiset: no entry is "
    "repeated, the rest is the same.";

// p with each row reversed, a -1 first and its last entry repeated (rows two entries wider; not repeated where
// duplicates count).
Problem reordered(const Problem& p) {
  Problem q = p;
  IndexList& l = *q.index_list;
  const IndexList& o = *p.index_list;
  l.max_k = o.max_k + 2;
  l.indices.clear();
  for (Index r = 0; r < o.B * o.H * o.T_q; ++r) {
    std::vector<std::int32_t> row{-1};
    for (Index n = o.max_k - 1; n >= 0; --n)
      if (const std::int32_t x = o.indices[std::size_t(r * o.max_k + n)]; x >= 0) row.push_back(x);
    if (row.size() > 1 && !o.counted) row.push_back(row[1]);
    row.resize(std::size_t(l.max_k), -1);
    l.indices.insert(l.indices.end(), row.begin(), row.end());
  }
  return q;
}

Verdict check_order(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  if (!p.index_list) return std::nullopt;
  return calls_agree("index-list-order", impl, p, reordered(p),
                     "the case with every row reversed, padded first and its first listed entry repeated",
                     "a row of an index list is a set");
}

// --- index-list-full ----------------------------------------------------------------------------------------------

const char* kFullWhy =
    "A list that names every key (every block) hides nothing, so the call with it is the call without a list: the "
    "two agree within both calls' derived bounds. A kernel whose sparse path differs from its dense one (a scale, a "
    "mask or an offset applied on one path only), or that drops a list's last block or entry, breaks it.";

Verdict check_full(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  if (!p.index_list) return std::nullopt;
  Problem full = p;
  IndexList& l = *full.index_list;
  const Index units = (p.k.shape().T + l.block_size - 1) / l.block_size;
  l.max_k = units;
  l.indices.clear();
  for (Index r = 0; r < l.B * l.H * l.T_q; ++r)
    for (Index u = 0; u < units; ++u) l.indices.push_back(std::int32_t(u));
  Problem none = p;
  none.index_list.reset();
  return calls_agree("index-list-full", impl, full, none, "the case without an index list",
                     "a list of every key hides nothing");
}

// --- index-list-pages ---------------------------------------------------------------------------------------------

const char* kPagesWhy =
    "In a paged cache an index list may name its keys by where they sit: the pool's slots, page·page_size + slot "
    "(DeepSeek's FlashMLA sparse indices). Where the pages sit is bookkeeping: moving them to other physical pages, "
    "with the block table and every listed slot moved to match, lists the same keys, so every output is unchanged "
    "within twice the derived bound (both calls are within it of the same float64 oracle; another physical order may "
    "sum in another order). A kernel that reads the slots as key positions, or is off by a page turning a slot into "
    "a key, breaks it (and index-list-oracle).";

std::string needs_physical(const GenConfig& g) {
  if (!g.caps.declares(Feature::index_list_physical))
    return "needs selected keys as slots of a paged pool (ATTNCHECK_CAP4_INDEX_LIST_PHYSICAL), which this "
           "implementation does not declare";
  if (!g.caps.declares(Feature::paged))
    return "needs paged K and V (ATTNCHECK_CAP3_PAGED) for its slots, which this implementation does not declare";
  return needs_index_list(g);
}

// Every case paged, its key-index list crossing as slots; the variant the same pages in another physical order.
rc::Gen<LawCase> gen_pages(const GenConfig& cfg) {
  ProblemOptions po = options(false);
  po.require.add({Feature::paged, Feature::index_list_physical});
  po.allow.remove(Feature::index_list_blocks);
  return rc::gen::exec([cfg, po] {
    LawCase c = *gen_problem(within_materialised(cfg), po);
    if (c.problem.paged) with_pages_moved(c);
    return c;
  });
}

Verdict check_pages(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  if (!p.index_list || !p.paged) return std::nullopt;
  const Problem& q = variant_of(c, "index-list-pages");
  const Outcome a = call(impl, p), b = call(impl, q);
  OracleRun r = run_oracle(p);
  r.tol_out.values() *= 2;
  std::optional<Violation> v = compare("index-list-pages", "output", a.output, b.output, &r.tol_out, seen_rows(p));
  if (!v && a.lse && b.lse) {
    r.tol_lse.values() *= 2;
    v = compare("index-list-pages", "lse", *a.lse, *b.lse, &r.tol_lse, seen_rows(p));
  }
  if (v) {
    v->message += "; only where the pages sit changed (" + page_order_name(p.paged->order) + " vs. " +
                  page_order_name(q.paged->order) +
                  ", the listed slots moved with them): within twice the derived bound";
    v->call = q;
    v->call_what = "the same pages in " + page_order_name(q.paged->order) + " order, the slots moved with them";
  }
  return v;
}

}  // namespace index_list_law
}  // namespace

Law index_list_oracle() {
  using namespace index_list_law;
  return {"index-list-oracle",
          "a call with an index list agrees with the oracle over the listed keys the other rules allow",
          kOracleWhy,
          LawDoc{"68",
                 "outputs, weights and LSE of a call with selected keys agree with the float64 oracle over exactly "
                 "the listed keys that every other rule allows",
                 "derived (`attention/src/tolerance.cpp`), or FlashAttention's rule"},
          needs_index_list,
          gen,
          check_oracle,
          0};
}

Law index_list_order() {
  using namespace index_list_law;
  return {"index-list-order",
          "reordering a row, moving its padding and repeating an entry change nothing",
          kOrderWhy,
          LawDoc{"69", "every row reversed, padded first and an entry repeated: the same outputs and LSE",
                 "both calls' derived bounds"},
          needs_index_list,
          gen_outputs,
          check_order,
          0};
}

Law index_list_full() {
  using namespace index_list_law;
  return {
      "index-list-full",
      "a list of every key equals the call without a list",
      kFullWhy,
      LawDoc{"70", "every key listed: the outputs and LSE of the call without a list", "both calls' derived bounds"},
      needs_index_list,
      gen_outputs,
      check_full,
      0};
}

Law index_list_pages() {
  using namespace index_list_law;
  return {"index-list-pages",
          "moving the pages of a paged call, its listed slots with them, changes no output beyond rounding",
          kPagesWhy,
          LawDoc{"76", "the pages in another physical order, the slot indices moved to match: the same outputs and LSE",
                 "2 tol (another physical page order may sum in another order)"},
          needs_physical,
          gen_pages,
          check_pages,
          0};
}

}  // namespace attncheck::law_kit
