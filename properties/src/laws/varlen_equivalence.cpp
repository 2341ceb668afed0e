// varlen-equivalence: a padded batch agrees with each sequence called alone at its true length, within the
// derived bound.
#include <optional>
#include <vector>

#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace varlen_equivalence_law {

const char* kWhy =
    "A padded batch entry b is the same attention problem as its sequence alone with only its key_lengths[b] "
    "real keys (FlashAttention's varlen API packs sequences exactly so): under top-left alignment query i sits "
    "at position i either way and sees the same keys with the same values. Both calls are within the derived "
    "oracle bound tol (k(gamma_D sum|q.k| scale + gamma_T) max|v| per row, over the visible keys, which are "
    "the same in both problems) of the float64 oracle, so they agree within 2 tol; rows that see no key follow "
    "the empty-row convention and are left to empty-row-convention. A length read from another batch entry, "
    "padding applied to the queries, or padded keys that keep a little weight break it. Needs key lengths, "
    "T_q != T_k calls and top-left alignment (under bottom-right the aligned position moves with T_k).";

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  ProblemOptions po = outputs_only().no_cell_masks();  // each sequence alone is cut to its length
  po.require.add(Feature::key_padding);
  return rc::gen::map(gen_problem(cfg, po), [](LawCase c) {
    c.problem.alignment = CausalAlignment::TopLeft;  // the aligned position must not depend on T_k
    return c;
  });
}

// Batch entry b alone, its keys and values cut to their first `len` rows, without padding.
Problem sequence_alone(const Problem& p, Index b, Index len) {
  Problem one = p;
  const Shape qs = p.q.shape(), ks = p.k.shape();
  one.q = Tensor<double>({1, qs.H, qs.T, qs.D});
  one.k = Tensor<double>({1, ks.H, len, ks.D});
  one.v = Tensor<double>({1, ks.H, len, p.v_dim()});
  for (Index h = 0; h < qs.H; ++h) one.q.head(0, h) = p.q.head(b, h);
  for (Index g = 0; g < ks.H; ++g) {
    one.k.head(0, g) = p.k.head(b, g).topRows(len);
    one.v.head(0, g) = p.v.head(b, g).topRows(len);
  }
  one.key_lengths.clear();
  if (!p.doc_bounds.empty()) one.doc_bounds = {p.doc_bounds[std::size_t(b)]};
  if (!p.q_doc_bounds.empty()) one.q_doc_bounds = {p.q_doc_bounds[std::size_t(b)]};
  one.want_weights = false;
  return one;
}

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Outcome batched = call(impl, p);
  const Shape& s = p.q.shape();
  Tensor<double> alone = batched.output;
  std::vector<std::optional<Outcome>> each(std::size_t(s.B));
  const auto length = [&](Index b) { return p.key_lengths.empty() ? p.k.shape().T : p.key_lengths[std::size_t(b)]; };
  for (Index b = 0; b < s.B; ++b) {
    const Index len = length(b);
    if (len == 0) continue;  // every row sees nothing: the empty-row convention's business
    each[std::size_t(b)] = call(impl, sequence_alone(p, b, len));
    for (Index h = 0; h < s.H; ++h) alone.head(b, h) = each[std::size_t(b)]->output.head(0, h);
  }
  Tensor<double> tol = run_oracle(p).tol_out;
  tol.values() *= 2;
  auto v = compare("varlen-equivalence", "output", alone, batched.output, &tol,
                   seen_rows(p));
  if (v) {
    const Index b = v->worst_index[0];
    v->message += " (the padded batch vs. batch entry " + std::to_string(b) + " alone with its " +
                  std::to_string(p.key_lengths.empty() ? p.k.shape().T : p.key_lengths[std::size_t(b)]) +
                  " real keys)";
    v->weights = batched.weights;
    if (each[std::size_t(b)])
      blame_derived_call(*v, p, batched, sequence_alone(p, b, length(b)), *each[std::size_t(b)],
                         {0, v->worst_index[1], v->worst_index[2], v->worst_index[3]},
                         "batch entry " + std::to_string(b) + " alone, its keys cut to its " +
                             std::to_string(length(b)) + " real ones, no padding");
  }
  return v;
}

std::string not_applicable(const GenConfig& g) {
  if (!g.caps.declares(Feature::key_padding))
    return "the implementation does not honour key lengths (Feature::key_padding)";
  if (!g.caps.cross_lengths || !g.caps.q_longer)
    return "needs calls with T_q > T_k (a sequence alone has fewer keys than queries)";
  if (!g.caps.supports(CausalAlignment::TopLeft)) return "needs top-left alignment";
  return "";
}

}  // namespace varlen_equivalence_law
}  // namespace

Law varlen_equivalence() {
  using namespace varlen_equivalence_law;
  return {"varlen-equivalence", "a padded batch agrees with each sequence called alone at its true length", kWhy,
          LawDoc{"18", "a padded batch agrees with each sequence called alone with only its real keys (top-left)",
                 "both results' derived bounds"},
          not_applicable, gen, check, 0};
}

}  // namespace attncheck::law_kit
