// The paged-KV laws: a paged call is the dense problem laid out in a page pool and a block table, so
// where the pages sit, how large they are, what the slots no key occupies hold, how large the pool and the
// table are, and whether two sequences share their prefix's pages change nothing but, at most, the rounding.
#include <algorithm>
#include <cmath>
#include <limits>

#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace paged_law {

ProblemOptions paged_options() {
  ProblemOptions po = outputs_only();
  po.require.add(Feature::paged);
  return po;
}

std::string needs_paging(const GenConfig& g) {
  if (!g.caps.declares(Feature::paged)) return "the implementation does not take paged K and V (ATTNCHECK_CAP3_PAGED)";
  if (g.caps.page_sizes.empty() || !(g.caps.page_layouts & 3u))
    return "the implementation declares paged K and V but no page size or no layout";
  return "";
}

/// "pages of 16 (token-major, shuffled, 2 spare pages, ...)", for messages.
std::string describe_plan(const Problem& p) {
  const PagedPlan& plan = *p.paged;
  const PagedKV pk = p.paged_kv();
  std::string s = "pages of " + std::to_string(plan.page_size) + " (" + page_layout_name(plan.layout) + ", " +
                  page_order_name(plan.order) + ", " + std::to_string(pk.num_pages) +
                  (pk.num_pages == 1 ? " page" : " pages") + ", table width " +
                  std::to_string(pk.max_pages);
  if (plan.spare_pages) s += ", " + std::to_string(plan.spare_pages) + " spare";
  if (plan.junk_entries) s += ", junk entries";
  if (plan.shared_pages) s += ", " + std::to_string(plan.shared_pages) + " shared";
  return s + ", free slots " + page_fill_name(plan.fill) + ")";
}

/// The exact comparison of two calls whose problems differ only in how K and V are laid out: outputs, and the
/// weights and LSE where both calls returned them, the same values (same_value).
std::optional<Violation> same_outcomes(const char* law, const Implementation& impl, const Problem& a_p,
                                       const Problem& b_p, const std::string& what_changed) {
  const Outcome a = call(impl, a_p), b = call(impl, b_p);
  std::optional<Violation> v = compare(law, "output", a.output, b.output, nullptr, {});
  if (!v && a.weights && b.weights) v = compare(law, "weights", *a.weights, *b.weights, nullptr, {});
  if (!v && a.lse && b.lse) v = compare(law, "lse", *a.lse, *b.lse, nullptr, {});
  if (v) {
    v->message += "; only " + what_changed + " changed: " + describe_plan(a_p) + " vs. " + describe_plan(b_p);
    v->weights = b.weights;
  }
  return v;
}

/// Two calls whose pages sit in other physical places: a kernel that walks a unified cache in physical page order
/// (or tiles it by physical runs) sums the same terms in another order, so the two are equal only within the
/// derived bound: each is within tol of the same float64 oracle (the dense problem's), so within 2 tol of each
/// other (outputs, weights and the LSE alike). Never bit-identical: no declaration says a kernel's results do not
/// depend on where its pages sit (layout invariance, ATTNCHECK_CAP3_LAYOUT_INVARIANT, is about the strides of q, k
/// and v; a kernel may claim it and still walk its cache in physical page order).
std::optional<Violation> same_within_order(const char* law, const Implementation& impl, const Problem& a_p,
                                           const Problem& b_p, const std::string& what_changed) {
  const Outcome a = call(impl, a_p), b = call(impl, b_p);
  OracleRun r = run_oracle(a_p);
  r.tol_out.values() *= 2;
  std::optional<Violation> v = compare(law, "output", a.output, b.output, &r.tol_out, {});
  if (!v && a.weights && b.weights && !r.streamed) {
    r.tol_w.values() *= 2;
    v = compare(law, "weights", *a.weights, *b.weights, &r.tol_w, {});
  }
  if (!v && a.lse && b.lse) {
    r.tol_lse.values() *= 2;
    v = compare(law, "lse", *a.lse, *b.lse, &r.tol_lse, {});
  }
  if (v) {
    v->message += "; only " + what_changed + " changed: " + describe_plan(a_p) + " vs. " + describe_plan(b_p) +
                  " (within twice the derived bound: another physical order may sum in another order)";
    v->weights = b.weights;
  }
  return v;
}

// ---- paged-dense ----------------------------------------------------------------------------------------

const char* kWhyDense =
    "A paged call is the dense problem laid out differently: key t of sequence b sits in page "
    "block_table[b][t / page_size], slot t % page_size (vLLM's PagedAttention, FlashInfer, FlashAttention's "
    "paged KV). So the paged call agrees with the float64 oracle of the dense problem within the derived "
    "bound (oracle-agreement's), and with the implementation's own dense call within twice it (both are within "
    "the bound of the same oracle; a paged kernel may sum in another order). A slot or page index computed "
    "wrongly, the last partial page read in full, a table row stride taken from the pages in use, a page "
    "taken from the neighbouring sequence's row, or layouts confused, breaks it. Applies to implementations "
    "that declare paged K and V, in their page sizes and layouts.";

std::optional<Violation> check_dense(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  Problem dense = p;
  dense.paged.reset();
  const Outcome paged = call(impl, p);
  const OracleRun o = run_oracle(p);
  if (auto v = compare("paged-dense", "output", o.out, paged.output, &o.tol_out, seen_rows(p))) {
    v->message += " (the paged call vs. the float64 oracle; " + describe_plan(p) + ")";
    v->weights = paged.weights;
    return v;
  }
  const Outcome own = call(impl, dense);
  Tensor<double> tol = o.tol_out;
  tol.values() *= 2;
  auto v = compare("paged-dense", "output", own.output, paged.output, &tol, seen_rows(p));
  if (v) {
    v->message += " (the paged call vs. the same implementation's dense call; " + describe_plan(p) + ")";
    v->weights = paged.weights;
  }
  return v;
}

// ---- page-permutation ----------------------------------------------------------------------------------

const char* kWhyPermutation =
    "Where a page sits in the pool is bookkeeping: moving the pages to other physical slots, with the block "
    "table updated to match, must leave every output unchanged (FlexAttention's results that depended on "
    "where the KV pages sat in memory). The variant lays the same pages out in another physical order "
    "(contiguous, reversed, or another shuffle). A kernel that ignores the block table, reads page "
    "b * pages_per_sequence + i, or whose result depends on which pages are adjacent, breaks it. Within twice "
    "the derived bound (both calls are within it of the same float64 oracle): a correct kernel that walks a "
    "unified cache in physical page order sums the same terms in another order (1 ulp apart), whatever it "
    "declares about strides.";

rc::Gen<LawCase> gen_permutation(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    LawCase c = *gen_problem(cfg, paged_options());
    with_pages_moved(c);
    return c;
  });
}

std::optional<Violation> check_permutation(const Implementation& impl, const LawCase& c) {
  return same_within_order("page-permutation", impl, c.problem, variant_of(c, "page-permutation"),
                            "the pages' physical order (the block table updated to match)");
}

// ---- page-size ------------------------------------------------------------------------------------------

const char* kWhyPageSize =
    "The page size only says how the cache is cut: every declared page size (and layout) holds the same keys "
    "in the same logical order, so the outputs agree within twice the derived oracle bound (both are within "
    "the bound of the same oracle; a kernel may pick another tile order for another page size). FlashInfer's "
    "results that changed with the page size, and its kernel wrong for pages larger than 128, break it, as "
    "does any code path that assumes one page size. Applies when the implementation declares more than one "
    "page size or layout.";

std::string needs_two_page_sizes(const GenConfig& g) {
  if (auto why = needs_paging(g); !why.empty()) return why;
  const int layouts = int(bool(g.caps.page_layouts & 1u)) + int(bool(g.caps.page_layouts & 2u));
  return g.caps.page_sizes.size() * std::size_t(layouts) >= 2
             ? ""
             : "the implementation declares one page size and one layout: nothing to compare";
}

rc::Gen<LawCase> gen_page_size(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    LawCase c = *gen_problem(cfg, paged_options());
    std::vector<std::pair<std::size_t, std::pair<Index, PageLayout>>> others;
    for (const Index ps : cfg.caps.page_sizes)
      for (const PageLayout l : {PageLayout::token_major, PageLayout::head_major})
        if (cfg.caps.supports_paging(ps, l) && !(ps == c.problem.paged->page_size && l == c.problem.paged->layout))
          others.push_back({1, {ps, l}});
    Problem v = c.problem;
    if (!others.empty()) {
      const auto [ps, l] = *weighted_choice(others);
      v.paged->page_size = ps;
      v.paged->layout = l;
    }
    c.variant = v;
    c.tags.push_back("page=" + std::to_string(c.problem.paged->page_size) + "->" + std::to_string(v.paged->page_size));
    return c;
  });
}

std::optional<Violation> check_page_size(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Problem& other = variant_of(c, "page-size");
  const Outcome a = call(impl, p), b = call(impl, other);
  Tensor<double> tol = run_oracle(p).tol_out;
  tol.values() *= 2;
  auto v = compare("page-size", "output", a.output, b.output, &tol, seen_rows(p));
  if (v) {
    v->message += " (" + describe_plan(p) + " vs. " + describe_plan(other) + ")";
    v->weights = b.weights;
  }
  return v;
}

// ---- poisoned-slots -------------------------------------------------------------------------------------

const char* kWhyPoison =
    "Slots past a sequence's length in its last page, and pages no sequence references, hold anything: a "
    "correct paged kernel never reads them (vLLM fills every unused slot with NaN, xformers poisons memory past "
    "each length and requires bit-equal results). So filling them with NaN, +Inf, -Inf or 1e30 instead of "
    "what they held leaves every output bit-identical; there is no mask to hide behind, since those values are "
    "not keys at all (a kernel that loads the whole last page and masks it additively gets NaN from 0 * NaN). "
    "FlashInfer's decode kernel that let padding lanes into the softmax when the length was not a multiple of "
    "256 breaks it. Exact: the live pages stay where they are, so every correct kernel does the same arithmetic "
    "in the same order on both calls.";

rc::Gen<LawCase> gen_poison(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    LawCase c = *gen_problem(cfg, paged_options());
    c.problem.paged->spare_pages = std::max<Index>(c.problem.paged->spare_pages, 1);  // an unreferenced page
    Problem v = c.problem;
    std::vector<std::pair<std::size_t, PageFill>> poisons;
    for (const PageFill f : {PageFill::nan, PageFill::pos_inf, PageFill::neg_inf, PageFill::huge})
      if (f != c.problem.paged->fill) poisons.push_back({1, f});
    v.paged->fill = *weighted_choice(poisons);
    c.variant = v;
    c.tags.push_back("poison=" + page_fill_name(v.paged->fill));
    return c;
  });
}

std::optional<Violation> check_poison(const Implementation& impl, const LawCase& c) {
  return same_outcomes("poisoned-slots", impl, c.problem, variant_of(c, "poisoned-slots"),
                            "what the free slots and unreferenced pages hold");
}

// ---- paged-capacity -------------------------------------------------------------------------------------

const char* kWhyCapacity =
    "The pool's size and the table's width are capacity, not content: a larger pool (more pages no sequence "
    "references) and longer block-table rows whose entries past each sequence's last page point anywhere, "
    "out-of-range numbers included (-1, num_pages, INT32_MAX, INT32_MIN, another sequence's page), leave every "
    "output bit-identical (FlashInfer's outputs that depended on max_seq_len; FlashAttention's block-table "
    "bounds test). A kernel that takes the table's row stride from the pages in use, reads one entry too "
    "many, or sizes a loop by the table's width breaks it. Exact: the physical order is contiguous here, so "
    "the live pages keep their numbers and their order and only the capacity changes; every correct kernel "
    "does the same arithmetic on both calls.";

rc::Gen<LawCase> gen_capacity(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    LawCase c = *gen_problem(cfg, paged_options());
    c.problem.paged->order = PagedPlan::Order::contiguous;  // spares appended: the live pages keep their numbers
    c.problem.paged->shuffle_seed = 0;
    Problem v = c.problem;
    v.paged->spare_pages += *weighted_choice<Index>({{1, 1}, {1, 4}, {1, 17}});
    v.paged->spare_columns += *weighted_choice<Index>({{1, 1}, {1, 3}, {1, 16}});
    v.paged->junk_entries = true;
    c.variant = v;
    return c;
  });
}

std::optional<Violation> check_capacity(const Implementation& impl, const LawCase& c) {
  return same_outcomes("paged-capacity", impl, c.problem, variant_of(c, "paged-capacity"),
                            "the pool's size and the table's width (junk entries past each sequence)");
}

// ---- shared-pages ---------------------------------------------------------------------------------------

const char* kWhyShared =
    "Prefix caching (vLLM's automatic prefix caching, SGLang's radix cache) lets sequences whose prompts "
    "share a prefix point their block tables at the same physical pages. Those pages hold the same keys and "
    "values either way, so a call where every other sequence shares sequence 0's full prefix pages gives "
    "the outputs of the call with private copies. The case adds a sequence that copies sequence 0's "
    "full pages and continues with keys of its own. A kernel that writes to the cache it reads, keys a "
    "per-page cache by sequence, or assumes every page belongs to one sequence breaks it. Within twice the "
    "derived bound, as page-permutation (the shared pages lie elsewhere in the pool than the copies, so a kernel "
    "that walks pages in physical order sums in another order).";

rc::Gen<LawCase> gen_shared(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    // No block or dense mask: the sequences that share pages are new batch entries.
    LawCase c = *gen_problem(cfg, paged_options().no_cell_masks());
    Problem& p = c.problem;
    const std::vector<Index> lengths = p.sequence_lengths();
    // A page size sequence 0 fills at least once, where one is declared: the largest such.
    if (lengths[0] < p.paged->page_size)
      for (const Index ps : cfg.caps.page_sizes)
        if (ps <= lengths[0] && cfg.caps.supports_paging(ps, p.paged->layout) &&
            (p.paged->page_size > lengths[0] || ps > p.paged->page_size))
          p.paged->page_size = ps;
    const Index ps = p.paged->page_size, full = lengths[0] / ps;
    // One more sequence, with the last sequence's queries and keys and sequence 0's length; then every sequence
    // b >= 1 starts with sequence 0's keys and values for as many full pages as both have (the pages it shares).
    const auto grow = [&](const Tensor<double>& t, bool keys) {
      const Shape s = t.shape();
      Tensor<double> g(Shape{s.B + 1, s.H, s.T, s.D});
      for (Index b = 0; b <= s.B; ++b)
        for (Index h = 0; h < s.H; ++h) {
          g.head(b, h) = t.head(std::min(b, s.B - 1), h);
          const Index len = b < s.B ? lengths[std::size_t(b)] : lengths[0];
          const Index shared = std::min(full, len / ps) * ps;
          if (keys && b > 0) g.head(b, h).topRows(shared) = t.head(0, h).topRows(shared);
        }
      return g;
    };
    p.q = grow(p.q, false);
    p.k = grow(p.k, true);
    p.v = grow(p.v, true);
    if (!p.key_lengths.empty()) p.key_lengths.push_back(lengths[0]);
    if (!p.doc_bounds.empty()) p.doc_bounds.push_back(p.doc_bounds.back());  // the last sequence's documents
    if (!p.q_doc_bounds.empty()) p.q_doc_bounds.push_back(p.q_doc_bounds.back());
    Problem v = p;
    v.paged->shared_pages = full;
    c.variant = v;
    c.tags.push_back(full > 0 ? "shared-pages=" + std::to_string(full) : "no-full-page");
    return c;
  });
}

std::optional<Violation> check_shared(const Implementation& impl, const LawCase& c) {
  return same_within_order("shared-pages", impl, c.problem, variant_of(c, "shared-pages"),
                            "whether the last sequence shares sequence 0's full prefix pages (or has copies)");
}

}  // namespace paged_law
}  // namespace

Law paged_dense() {
  using namespace paged_law;
  return {"paged-dense",
          "a paged call equals the oracle and the same implementation's dense call, within the bound",
          kWhyDense,
          LawDoc{"28",
                 "K and V in a page pool and a block table: the call agrees with the float64 oracle, and with the same implementation's dense call",
                 "the derived bound / twice it"},
          needs_paging,
          [](const GenConfig& cfg) { return gen_problem(cfg, paged_options()); },
          check_dense,
          0};
}

Law page_permutation() {
  using namespace paged_law;
  return {"page-permutation",
          "moving pages to other physical slots changes no output beyond rounding (none where layout invariance is "
          "declared)",
          kWhyPermutation,
          LawDoc{"29",
                 "moving the pages to other physical slots (the table updated to match) changes no output beyond rounding",
                 "2 tol (another physical page order may sum in another order)"},
          needs_paging, gen_permutation, check_permutation, 0};
}

Law page_size() {
  using namespace paged_law;
  return {"page-size", "every declared page size and layout gives the same outputs, within the bound",
          kWhyPageSize,
          LawDoc{"30", "every declared page size and layout gives the same outputs", "twice the derived bound"},
          needs_two_page_sizes, gen_page_size, check_page_size, 0};
}

Law poisoned_slots() {
  using namespace paged_law;
  return {"poisoned-slots",
          "NaN, Inf or 1e30 in every slot no key occupies leaves every output bit-identical",
          kWhyPoison,
          LawDoc{"31",
                 "NaN, ±Inf or 1e30 in every slot past a sequence's length and in every unreferenced page leaves every output bit-identical",
                 "exact"},
          needs_paging, gen_poison, check_poison, 0};
}

Law paged_capacity() {
  using namespace paged_law;
  return {"paged-capacity",
          "a larger pool and wider block table with junk entries leave every output bit-identical",
          kWhyCapacity,
          LawDoc{"32",
                 "a larger pool and a wider block table whose entries past each sequence point anywhere (−1, num_pages, INT32_MAX, INT32_MIN, another sequence's page) leave every output bit-identical",
                 "exact"},
          needs_paging, gen_capacity, check_capacity, 0};
}

Law shared_pages() {
  using namespace paged_law;
  return {"shared-pages",
          "sequences sharing a prefix's pages get the outputs of private copies, within rounding (bit-identical where "
          "layout invariance is declared)",
          kWhyShared,
          LawDoc{"33",
                 "sequences that share a prefix's pages (prefix caching) get the outputs they get with private copies",
                 "2 tol (shared pages lie elsewhere in the pool)"},
          needs_paging, gen_shared, check_shared, 0};
}

}  // namespace attncheck::law_kit
