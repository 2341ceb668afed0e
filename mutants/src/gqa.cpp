// Mutants of grouped-query attention and of KV-cache inference: a query head reading the wrong kv head, and a
// decode step or prefill chunk seeing the wrong keys. Each declares GQA; the decode and chunk kernels are right
// on square (full-prefill) calls and go wrong only on the cached calls their authors special-cased.
#include <bit>

#include "parts.hpp"

namespace attncheck::zoo {
namespace {

// A plain correct head under the author's visibility rule `vis(c) -> (i, j) -> bool`.
template <class MakeVis>
auto plain_head(MakeVis make_vis) {
  return [make_vis](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
    return attend_where(scores(Q, K, c.resolved_scale()), V, make_vis(c));
  };
}

const auto kCausal = [](const HeadCtx& c) { return VisibleCells(c); };

// A single-token decode step against the cache: one query, the newest key last, bottom-right.
bool decode_step(const HeadCtx& c) {
  return c.T_q == 1 && c.T_k > 1 && c.alignment == CausalAlignment::BottomRight;
}

// A prefill chunk against the cache: several queries, fewer than the keys, bottom-right.
bool prefill_chunk(const HeadCtx& c) {
  return 1 < c.T_q && c.T_q < c.T_k && c.alignment == CausalAlignment::BottomRight;
}

Mutant gqa_entry(ImplementationPtr impl, std::string bug, Shape minimal, std::string why,
                 std::vector<std::string> killed_by) {
  return Mutant{.impl = std::move(impl),
                .bug = std::move(bug),
                .control = false,
                .minimal_shape = minimal,
                .why_minimal = std::move(why),
                .killed_by = std::move(killed_by)};
}

}  // namespace

std::vector<Mutant> gqa_mutants() {
  std::vector<Mutant> z;
  z.push_back(gqa_entry(
      head_impl("mutant:gqa-kv-modulo", "query head h reads kv head h % H_kv instead of h / (H / H_kv)",
                plain_head(kCausal), gqa_capabilities(),
                [](Index h, Index, Index H_kv) { return h % H_kv; }),
      "grouped queries: query head h reads kv head h % H_kv (interleaved) instead of h / (H / H_kv) (blocked)",
      {1, 4, 1, 1},
      "the two maps agree unless there are at least two kv heads and two query heads per kv head: H = 4, "
      "H_kv = 2 (query heads 1 and 2 swap kv heads); one query, one key, D = 1",
      {"gqa-head-sharing", "gqa-equivalence", "oracle-agreement"}));
  z.push_back(gqa_entry(
      head_impl("mutant:gqa-group-pow2", "kv head h >> floor(log2(H / H_kv)): right only for power-of-two groups",
                plain_head(kCausal), gqa_capabilities(),
                [](Index h, Index H, Index H_kv) {
                  const int shift = std::bit_width(std::uint64_t(H / H_kv)) - 1;  // log2, rounded down
                  return h >> shift;
                }),
      "grouped queries: the kv head is h >> log2(group) with log2 rounded down, so a group of 3 reads kv head "
      "h >> 1 (past the last kv head for h = 2)",
      {1, 3, 1, 1},
      "the smallest group that is not a power of two is 3: H = 3, H_kv = 1, where query head 2 reads kv head 1, "
      "past the end of K and V; one query, one key, D = 1",
      {"gqa-equivalence", "oracle-agreement"}));
  z.push_back(gqa_entry(
      head_impl("mutant:decode-top-left", "a decode step (one query) aligned top-left: it sees only key 0",
                plain_head([](const HeadCtx& c) {
                  return [c](Index i, Index j) { return decode_step(c) ? j <= i : c.visible(i, j); };
                }),
                gqa_capabilities()),
      "KV-cache decoding: the one-query decode kernel builds its mask top-left, so the new token sees only key 0",
      {1, 1, 1, 1},
      "a decode step needs a cached key besides the new one: one query over two keys, bottom-right, D = 1",
      {"decode-consistency", "oracle-agreement"}));
  z.push_back(gqa_entry(
      head_impl("mutant:decode-drops-newest", "a decode step loops over keys j < T_k - 1: the newest key is dropped",
                plain_head([](const HeadCtx& c) {
                  return [c](Index i, Index j) { return c.visible(i, j) && !(decode_step(c) && j == c.T_k - 1); };
                }),
                gqa_capabilities()),
      "KV-cache decoding: the decode step loops over the cache length before the new token was appended, so the "
      "newest key (the token's own) is missing",
      {1, 1, 1, 1},
      "one query over two keys, bottom-right, D = 1 (with one key a decode step is a full prefill, done right)",
      {"decode-consistency", "oracle-agreement"}));
  z.push_back(gqa_entry(
      head_impl("mutant:chunk-masked-from-zero",
                "a prefill chunk (1 < T_q < T_k) masked as if it started at position 0",
                plain_head([](const HeadCtx& c) {
                  return [c](Index i, Index j) { return prefill_chunk(c) ? j <= i : c.visible(i, j); };
                }),
                gqa_capabilities()),
      "chunked prefill: the chunk kernel builds its causal mask from position 0 (top-left) instead of the "
      "chunk's offset in the cache, so each query misses the keys of the chunks before; decode has its own "
      "(correct) kernel",
      {1, 1, 2, 1},
      "a chunk has at least two queries (one is a decode step) and a key before them: two queries over three "
      "keys, bottom-right, D = 1",
      {"chunked-prefill", "oracle-agreement"}));
  z.push_back(gqa_entry(
      head_impl("mutant:decode-cache-off-by-one",
                "a decode step reads the cache one slot off: key and value t-1 stand in for the new token's t",
                [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
                  auto K_read = K, V_read = V;
                  if (decode_step(c)) {  // the new token was written one slot early: slot t still holds t-1
                    K_read.row(c.T_k - 1) = K.row(c.T_k - 2);
                    V_read.row(c.T_k - 1) = V.row(c.T_k - 2);
                  }
                  return attend_where(scores(Q, K_read, c.resolved_scale()), V_read, VisibleCells(c));
                },
                gqa_capabilities()),
      "KV-cache decoding: the new token's key and value go to the wrong cache slot, so at step t the key and "
      "value of position t-1 stand in for those of t",
      {1, 1, 1, 1},
      "one query over two keys, bottom-right, D = 1: key 1 and value 1 are read as key 0 and value 0",
      {"decode-consistency", "oracle-agreement"}));
  return z;
}

}  // namespace attncheck::zoo
