// Law 14, decode-consistency: decoding query t alone against the cached keys 0..t (bottom-right) reproduces
// row t of the full causal forward, for every t.
#include <algorithm>

#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace decode_consistency_law {

const char* kWhy =
    "KV-cache decoding calls attention once per new token: one query (position t) over the cached keys "
    "0..t, with bottom-right alignment so that the query sits at the last position. For every t, t = 0 "
    "included, that call must reproduce row t of the full causal forward over all T positions: the same keys "
    "are visible with the same scores. A decode path that aligns top-left (the query sees only key 0), drops "
    "the newest key, or reads the cache one slot off breaks it. The two calls differ in shape, so a kernel may "
    "block and sum differently: the tolerance is the sum of both results' derived oracle bounds (see "
    "oracle-agreement) plus the oracle's own difference between the two calls. Key lengths are cut to the "
    "keys cached so far (min(len, t+1)); a window stays as it is. Needs calls with T_q < T_k under "
    "bottom-right alignment. Checked at every t of a case with T <= 4, else at t = 0, 1, T/2, T-2, T-1 and "
    "where the cache holds 2^k or 2^k + 1 keys (k >= 4).";

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  // A later token must never reach an earlier row; the decode calls cut the queries and keys (no block or dense
  // mask: their cells are positional).
  ProblemOptions po = outputs_only().causal_rule().no_cell_masks();
  po.allow_cross_lengths = false;  // the full forward is square; its decode calls are the cross-length ones
  return gen_problem(cfg, po);
}

// The decode steps checked: every t of a short case (T <= 4); of a longer one the first two and the last two,
// the middle, and each t whose cache t + 1 is 2^k or 2^k + 1 keys (k >= 4), where tiled and split-KV decode
// kernels change tile or split: at most 2 log2(T) + 1 calls instead of T, and the cache lengths where decode
// paths break are all among them. (Every t of a long case costs T calls, 2,500 of a default run's.)
std::vector<Index> decode_steps(Index T) {
  std::vector<Index> t;
  if (T <= 4) {
    for (Index i = 0; i < T; ++i) t.push_back(i);
    return t;
  }
  t = {0, 1, T / 2, T - 2, T - 1};
  for (Index n = 16; n <= T; n *= 2)
    for (Index len : {n, n + 1})
      if (len <= T) t.push_back(len - 1);
  std::sort(t.begin(), t.end());
  t.erase(std::unique(t.begin(), t.end()), t.end());
  return t;
}

Verdict check(const Implementation& impl, const LawCase& c) {
  std::vector<Index> every_t(std::size_t(c.problem.q.shape().T));
  for (std::size_t t = 0; t < every_t.size(); ++t) every_t[t] = Index(t);
  return check_cached_chunks("decode-consistency", impl, c.problem, every_t, decode_steps(c.problem.q.shape().T));
}

}  // namespace decode_consistency_law
}  // namespace

Law decode_consistency() {
  using namespace decode_consistency_law;
  return {"decode-consistency",
          "decoding query t alone over cached keys 0..t (bottom-right) equals row t of the full forward, every t",
          kWhy,
          LawDoc{"13",
                 "query t called alone over cached keys 0..t (bottom-right) = row t of the full forward, every t (t = 0 included)",
                 "both results' derived bounds + the oracle's own difference"},
          needs_cached_calls,
          gen,
          check,
          0};
}

}  // namespace attncheck::law_kit
