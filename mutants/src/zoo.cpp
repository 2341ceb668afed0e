// The zoo's registry: every mutant and control in a stable order, looked up by implementation name.
#include <tuple>

#include "attncheck/mutants.hpp"
#include "parts.hpp"

namespace attncheck {

const std::vector<Mutant>& mutant_zoo() {
  static const std::vector<Mutant> all = [] {
    std::vector<Mutant> z;
    for (auto part : {zoo::mask_mutants, zoo::softmax_mutants, zoo::scale_mutants, zoo::layout_mutants,
                      zoo::gqa_mutants, zoo::padding_mutants, zoo::tiled_mutants, zoo::decode_mutants,
                      zoo::backward_mutants, zoo::backward_nan_mutants, zoo::lse_mutants, zoo::modifier_mutants,
                      zoo::modifier_backward_mutants, zoo::paged_mutants, zoo::mask_family_mutants, zoo::block_mask_mutants, zoo::stride_mutants, zoo::head_dim_mutants, zoo::position_mutants, zoo::batch_mutants, zoo::bias_mutants, zoo::temperature_mutants, zoo::rope_mutants, zoo::qk_norm_mutants, zoo::dropout_mutants, zoo::quant_mutants, zoo::index_list_mutants, zoo::tree_mutants, zoo::controls, zoo::modifier_controls, zoo::exactness_controls})
      for (Mutant& m : part()) z.push_back(std::move(m));
    return z;
  }();
  return all;
}

RunOptions mutant_options(const Mutant& m, RunOptions base) {
  if (!m.long_context) return base;
  base.gen.long_lengths = {32767, 32769, 65535, 65537};  // as --long (cli/src/check.hpp, kLongLengths)
  base.gen.long_max_T_q = kZooLongMaxQueries;  // decode steps and chunks (a square call of 2^16: 32 GiB, minutes)
  base.gen.max_B = 1;
  base.gen.max_H = std::min<Index>(base.gen.max_H, 2);
  base.gen.max_D = std::min<Index>(base.gen.max_D, 8);
  return base;
}

const Mutant* find_mutant(std::string_view name) {
  for (const Mutant& m : mutant_zoo())
    if (m.impl->name() == name) return &m;
  return nullptr;
}

const LawResult* smallest_counterexample(const std::vector<LawResult>& results) {
  const auto key = [](const LawResult& r) {
    const Problem& p = failing_problem(r);  // a derived call that computed wrongly, when there is one
    // Options a reader must also take in: a window, key padding, a scale other than the default, and each score
    // modifier (softcap, ALiBi slopes, sinks), and each mask family beyond causal (documents, chunks, a prefix, a
    // right window, no causal rule).
    const int options = int(p.window.has_value()) + int(!p.key_lengths.empty()) + int(p.scale.has_value()) +
                        int(p.softcap.has_value()) + int(!p.alibi_slopes.empty()) + int(!p.sinks.empty()) +
                        int(!p.doc_bounds.empty()) + int(p.chunk_size > 0) + int(p.prefix_length > 0) +
                        int(p.window_right.has_value()) + int(!p.causal) + int(p.block_mask.has_value()) +
                        int(p.dense_mask.has_value()) + int(p.bias.has_value()) + int(p.temperature.has_value()) +
                        int(p.rope.has_value()) + int(p.qk_norm.has_value()) + int(p.dropout.has_value()) +
                        int(p.quant.has_value());
    // Values a reader must also take in: the nonzero inputs (q, k, v and dO).
    Index nonzero = 0;
    const auto count = [&](const Tensor<double>& t) {
      for (const double x : t.values()) nonzero += x != 0;
    };
    count(p.q), count(p.k), count(p.v);
    if (p.d_output) count(*p.d_output);
    return std::tuple{p.q.shape().numel(), p.k.shape().numel(), options, nonzero,
                      r.violation ? -margin(*r.violation) : 0.0};
  };
  const LawResult* best = nullptr;
  for (const LawResult& r : results)
    if (r.status == LawStatus::falsified && r.minimal_case && (!best || key(r) < key(*best))) best = &r;
  return best;
}

}  // namespace attncheck
