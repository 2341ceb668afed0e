// key-padding-invariance (exact): whatever sits at padded key positions, NaN and Inf included, every output is
// bit-identical, and every padded key gets weight exactly 0.
#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace key_padding_invariance_law {

const char* kWhy =
    "Keys j >= key_lengths[b] of batch entry b are padding (FlashAttention's varlen cu_seqlens, PyTorch's "
    "key_padding_mask, llama.cpp's empty KV cells): a correct kernel never reads them into any output, so "
    "replacing the padded keys and values with anything else, extreme magnitudes included (and NaN or Inf for "
    "a kernel that claims select semantics), leaves every output bit-identical, and their weights are exactly "
    "0 (exp(-inf) = 0 in every dtype; a row that sees no key may return NaN under the nan convention). A "
    "padding mask applied to the queries, a length read from another batch entry, or padding masked with a "
    "finite -1e4 breaks it. Exact: no tolerance. Applies to implementations that honour key lengths "
    "(Feature::key_padding).";

ProblemOptions padded() {
  ProblemOptions po;
  po.require.add(Feature::key_padding);
  return po;
}

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    LawCase c = *gen_problem(cfg, padded());
    const Problem& p = c.problem;
    const HiddenValues hv = *gen_hidden_values(cfg, p);
    // The variant: every padded key and value row (of every kv head) replaced.
    Problem v = p;
    const Shape& ks = p.k.shape();
    for (Index b = 0; b < ks.B; ++b) {
      const Index len = p.key_lengths.empty() ? ks.T : p.key_lengths[std::size_t(b)];
      for (Index g = 0; g < ks.H; ++g)
        for (Index j = len; j < ks.T; ++j) {
          v.k.head(b, g).row(j) = hv.k.head(b, g).row(j);
          v.v.head(b, g).row(j) = hv.v.head(b, g).row(j);
        }
    }
    c.variant = v;
    c.tags.push_back(hv.tag);
    return c;
  });
}

bool padded_key(const Problem& p, Index b, Index j) {
  return !p.key_lengths.empty() && j >= p.key_lengths[std::size_t(b)];
}

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Problem& padding_changed = variant_of(c, "key-padding-invariance");
  // Probed weights are not asked for (outputs_first): the outputs are the law, and zero-future-weight samples
  // a probed implementation's padded weights.
  const Outcome a = call(impl, outputs_first(impl, p)), b = call(impl, outputs_first(impl, padding_changed));
  if (b.weights)
    if (auto v = nonzero_hidden_weight("key-padding-invariance", impl, padding_changed, *b.weights,
                                       [&](Index bb, Index, Index, Index j) { return padded_key(p, bb, j); }))
      return v;
  auto v = compare("key-padding-invariance", "output", a.output, b.output, nullptr, {});
  if (v) {
    v->message += "; only padded keys and values (j >= key_lengths[b]) were changed";
    v->weights = b.weights;
  }
  return v;
}

std::string not_applicable(const GenConfig& g) {
  return g.caps.declares(Feature::key_padding)
             ? ""
             : "the implementation does not honour key lengths (Feature::key_padding)";
}

}  // namespace key_padding_invariance_law
}  // namespace

Law key_padding_invariance() {
  using namespace key_padding_invariance_law;
  return {"key-padding-invariance",
          "changing padded keys and values (NaN and Inf included) leaves every output bit-identical; padded "
          "keys get weight exactly 0",
          kWhy,
          LawDoc{"17",
                 "replacing padded keys and values (extreme values; NaN and ±Inf for select-mask kernels) leaves every output bit-identical; padded keys get weight exactly 0",
                 "exact"},
          not_applicable,
          gen,
          check,
          0};
}

}  // namespace attncheck::law_kit
