// Law 15, chunked-prefill: the queries split into random contiguous chunks, each called over keys 0..(chunk
// end) with bottom-right alignment, reproduce the rows of the full causal forward.
#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace chunked_prefill_law {

const char* kWhy =
    "Inference engines prefill a long prompt in chunks: the queries of positions s..e-1 are called over the "
    "cached keys 0..e-1 with bottom-right alignment, so each query keeps its position. Whatever the split, the "
    "chunks together must reproduce the rows of the full causal forward. A chunk masked as if it started at "
    "position 0 (top-left inside the chunk) sees too few keys and breaks it. The split is random (each "
    "position starts a new chunk with probability 1/spread), so chunks of one query, of several, and the "
    "whole sequence all occur. Tolerance as in decode-consistency: both results' derived oracle bounds plus "
    "the oracle's own difference between the two calls. Needs calls with T_q < T_k under bottom-right "
    "alignment.";

// Where the chunks start: position 0, then each position i >= 1 with probability 1/spread, decided by a hash
// of (seed, the id position i was drawn at) alone (LawCase::positions; 0, 1, 2, ... when empty), so that when
// shrinking shortens T or deletes a position the remaining cuts stay where they were.
std::vector<Index> chunk_starts(Index T, const std::vector<Index>& ids, std::uint64_t seed, Index spread) {
  std::vector<Index> starts{0};
  for (Index i = 1; i < T; ++i) {
    const Index id = Index(ids.size()) == T ? ids[std::size_t(i)] : i;
    if (rc::Random((seed ^ std::uint64_t(id)) * 0x9e3779b97f4a7c15ull + 1).next() % std::uint64_t(spread) == 0)
      starts.push_back(i);
  }
  return starts;
}

// A case while it is shrunk: the problem's own shrinkable, and the split.
struct Split {
  rc::Shrinkable<LawCase> base;
  Index spread = 1, seed = 0;
};

// The problem's shrinks keep the split (its cuts stay at the positions they were at); a shape step that breaks
// the failure so may keep it under another split, so each is tried again with every position its own chunk
// (spread 1: decode steps, where most chunk and padding bugs still show) before the split itself shrinks.
rc::Seq<Split> split_shrinks(const Split& s) {
  auto same = rc::seq::map(s.base.shrinks(), [spread = s.spread, seed = s.seed](rc::Shrinkable<LawCase> b) {
    return Split{std::move(b), spread, seed};
  });
  auto every = s.spread > 1 ? rc::seq::map(s.base.shrinks(), [seed = s.seed](rc::Shrinkable<LawCase> b) {
    return Split{std::move(b), 1, seed};
  })
                            : rc::Seq<Split>();
  auto spread = rc::seq::map(rc::shrink::towards<Index>(s.spread, 1), [base = s.base, seed = s.seed](Index x) {
    return Split{base, x, seed};
  });
  auto seed = rc::seq::map(rc::shrink::towards<Index>(s.seed, 0), [base = s.base, spread = s.spread](Index x) {
    return Split{base, spread, x};
  });
  return rc::seq::concat(std::move(same), std::move(every), std::move(spread), std::move(seed));
}

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  // A later token must never reach an earlier row; the chunk calls cut the queries and keys (no block or dense
  // mask: their cells are positional).
  ProblemOptions po = outputs_only().causal_rule().no_cell_masks();
  po.allow_cross_lengths = false;  // the full forward is square; its chunk calls are the cross-length ones
  const rc::Gen<LawCase> problems = gen_problem(cfg, po);
  return [problems](const rc::Random& random, int size) {
    rc::Random r = random;
    rc::Random for_problem = r.split();
    // Spread 2 cuts at half the positions (chunks of one query, decoding, among them), larger spreads give
    // longer chunks. Spread 1 (every chunk one query) is decode-consistency's case and costs T calls, so cases
    // start from 2..16 and reach 1 only while shrinking.
    const Index spread = 2 + Index(r.next() % 15), seed = Index(r.next() % (1 << 20));
    return rc::shrinkable::map(rc::shrinkable::shrinkRecur(Split{problems(for_problem, size), spread, seed},
                                                           [](const Split& s) { return split_shrinks(s); }),
                               [](const Split& s) {
                                 LawCase c = s.base.value();
                                 c.params["spread"] = double(s.spread);
                                 c.params["chunk_seed"] = double(s.seed);
                                 return c;
                               });
  };
}

Verdict check(const Implementation& impl, const LawCase& c) {
  const char* law = "chunked-prefill";
  const std::uint64_t seed = std::uint64_t(int_param(c, law, "chunk_seed", 0, kMaxSeed));
  const std::vector<Index> starts =
      chunk_starts(c.problem.q.shape().T, c.positions, seed, int_param(c, law, "spread", 1, kMaxSeed));
  return check_cached_chunks(law, impl, c.problem, starts);
}

}  // namespace chunked_prefill_law
}  // namespace

Law chunked_prefill() {
  using namespace chunked_prefill_law;
  return {"chunked-prefill",
          "the queries called in random contiguous chunks over keys 0..(chunk end), bottom-right, give the full rows",
          kWhy,
          LawDoc{"14",
                 "the queries called in random contiguous chunks, each over keys 0..(chunk end), bottom-right, reproduce the full rows",
                 "as decode-consistency"},
          needs_cached_calls,
          gen,
          check,
          0};
}

}  // namespace attncheck::law_kit
