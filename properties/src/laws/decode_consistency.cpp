// Law 14, decode-consistency: decoding query t alone against the cached keys 0..t (bottom-right) reproduces
// row t of the full causal forward, for every t.
#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {

const char* kWhy =
    "KV-cache decoding calls attention once per new token: one query (position t) over the cached keys "
    "0..t, with bottom-right alignment so that the query sits at the last position. For every t, t = 0 "
    "included, that call must reproduce row t of the full causal forward over all T positions: the same keys "
    "are visible with the same scores. A decode path that aligns top-left (the query sees only key 0), drops "
    "the newest key, or reads the cache one slot off breaks it. The two calls differ in shape, so a kernel may "
    "block and sum differently: the tolerance is the sum of both results' derived oracle bounds (see "
    "oracle-agreement) plus the oracle's own difference between the two calls. Key lengths are cut to the "
    "keys cached so far (min(len, t+1)); a window stays as it is. Needs calls with T_q < T_k under "
    "bottom-right alignment.";

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  ProblemOptions po = outputs_only();
  po.allow_cross_lengths = false;  // the full forward is square; its decode calls are the cross-length ones
  return gen_problem(cfg, po);
}

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  std::vector<Index> every_t(std::size_t(c.problem.q.shape().T));
  for (std::size_t t = 0; t < every_t.size(); ++t) every_t[t] = Index(t);
  return check_cached_chunks("decode-consistency", impl, c.problem, every_t);
}

}  // namespace

Law decode_consistency() {
  return {"decode-consistency",
          "decoding query t alone over cached keys 0..t (bottom-right) equals row t of the full forward, every t",
          kWhy,
          needs_cached_calls,
          gen,
          check,
          0};
}

}  // namespace attncheck::law_kit
