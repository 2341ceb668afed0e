// Law 15, chunked-prefill: the queries split into random contiguous chunks, each called over keys 0..(chunk
// end) with bottom-right alignment, reproduce the rows of the full causal forward.
#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {

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
// of (seed, i) alone, so that when shrinking shortens T the remaining cuts stay where they were.
std::vector<Index> chunk_starts(Index T, std::uint64_t seed, Index spread) {
  std::vector<Index> starts{0};
  for (Index i = 1; i < T; ++i)
    if (rc::Random((seed ^ std::uint64_t(i)) * 0x9e3779b97f4a7c15ull + 1).next() % std::uint64_t(spread) == 0)
      starts.push_back(i);
  return starts;
}

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    ProblemOptions po = outputs_only();
    po.allow_cross_lengths = false;  // the full forward is square; its chunk calls are the cross-length ones
    LawCase c = *gen_problem(cfg, po);
    // Spread 2 cuts at half the positions (chunks of one query, decoding, among them), larger spreads give
    // longer chunks. Spread 1 (every chunk one query) is decode-consistency's case, and would cost T calls.
    c.params["spread"] = double(*rc::gen::inRange<Index>(2, 17));
    c.params["chunk_seed"] = double(*rc::gen::inRange<Index>(0, 1 << 20));
    return c;
  });
}

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const char* law = "chunked-prefill";
  const std::uint64_t seed = std::uint64_t(int_param(c, law, "chunk_seed", 0, kMaxSeed));
  const std::vector<Index> starts = chunk_starts(c.problem.q.shape().T, seed, int_param(c, law, "spread", 1, kMaxSeed));
  return check_cached_chunks(law, impl, c.problem, starts);
}

}  // namespace

Law chunked_prefill() {
  return {"chunked-prefill",
          "the queries called in random contiguous chunks over keys 0..(chunk end), bottom-right, give the full rows",
          kWhy,
          needs_cached_calls,
          gen,
          check,
          0};
}

}  // namespace attncheck::law_kit
