// A mutant of the split-KV decode path alone (flash-decoding): a decode step (one query over a long cache) is
// split into blocks of keys whose partial results are combined wrongly. Square calls and short caches take the
// plain path and are right, so only a decode call over more than one block, T_q = 1 and T_k >= 33, shows it.
#include "parts.hpp"

namespace attncheck::zoo {
namespace {

constexpr Index kDecodeSplit = 32;  // keys per split of the decode kernel

// A decode step over more than one split: one query, bottom-right, more keys than a split holds.
bool split_decode(const HeadCtx& c) {
  return c.T_q == 1 && c.T_k > kDecodeSplit && c.alignment == CausalAlignment::BottomRight;
}

// Each split's softmax over its own keys, its partial output; the partials averaged over the splits that see a
// key, where the right combine weighs each by exp(lse_s - lse) (its share of the row's total weight).
template <class A>
HeadOut<A> split_kv_decode(const Matrix<A>& Q, const Matrix<A>& K, const Matrix<A>& V, const HeadCtx& c) {
  VisibleCells vis(c);
  HeadOut<A> r = attend_where(scores(Q, K, c.resolved_scale()), V, vis);  // the weights, as a caller reads them
  if (!split_decode(c)) return r;
  Matrix<A> sum = Matrix<A>::Zero(1, V.cols());
  int parts = 0;
  for (Index s0 = 0; s0 < c.T_k; s0 += kDecodeSplit) {
    const Index n = std::min(kDecodeSplit, c.T_k - s0);
    bool any = false;
    for (Index j = s0; j < s0 + n; ++j) any = any || vis(0, j);
    if (!any) continue;
    const Matrix<A> Ks = K.middleRows(s0, n), Vs = V.middleRows(s0, n);
    sum += attend_where(scores(Q, Ks, c.resolved_scale()), Vs, [&](Index i, Index j) { return vis(i, s0 + j); })
               .output;
    ++parts;
  }
  if (parts > 0) r.output = sum / A(parts);
  return r;
}

}  // namespace

std::vector<Mutant> decode_mutants() {
  std::vector<Mutant> z;
  z.push_back(Mutant{
      .impl = head_impl("mutant:split-kv-decode-averaged",
                        "a decode step over more than 32 keys is split in blocks of 32 whose partial outputs are "
                        "averaged instead of weighed by exp(lse_s - lse)",
                        [](const auto& Q, const auto& K, const auto& V, const HeadCtx& c) {
                          return split_kv_decode(Q, K, V, c);
                        },
                        gqa_capabilities()),
      .bug = "split-KV decode: the partial outputs of the key blocks are averaged, not weighed by their share of the "
             "row's softmax mass (exp(lse_s - lse))",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "only the decode path splits, and only past 32 keys: one query over 33 keys, bottom-right, D = 1 "
                     "(a block of 32 keys and one of 1; any other values make the two partials differ)",
      .killed_by = {"oracle-agreement", "decode-consistency"},
  });
  return z;
}

}  // namespace attncheck::zoo
