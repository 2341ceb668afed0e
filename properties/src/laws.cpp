// The registry of laws: every law lives in its own file under laws/, and this list fixes the order in which
// they are documented, listed and run.
#include "attncheck/law.hpp"
#include "laws/registry.hpp"

namespace attncheck {

const std::vector<Law>& laws() {
  static const std::vector<Law> all = [] {
    using namespace law_kit;
    return std::vector<Law>{row_stochastic(),          zero_future_weight(), causal_perturbation(),
                            prefix_consistency(),      scale_variance(),     first_position(),
                            convex_hull(),             shift_invariance(),   batch_head_independence(),
                            oracle_agreement(),        paths_agree(),        determinism(),
                            strict_causality_nonfinite(), decode_consistency(), chunked_prefill(),
                            gqa_head_sharing(),        gqa_equivalence(),  key_padding_invariance(),
                            varlen_equivalence(),         window_zero_weight(),
                            window_perturbation(),        empty_row_convention(),
                            lse_oracle(),              output_lse_consistency(), split_kv_merge(),
                            sink_mass(),               softcap_bound(),      neutral_modifiers(),
                            paged_dense(),             page_permutation(),   page_size(),
                            poisoned_slots(),          paged_capacity(),     shared_pages(),
                            grad_oracle(),             grad_causality(),     grad_key_sum_zero(),
                            grad_dv_weights(),         grad_finite_difference(),
                            hidden_keys(),             packed_equals_separate(), chunked_equals_separate(),
                            neutral_masks(),           bidirectional_permutation(), mask_encodings(),
                            extreme_scores(),          batch_invariance(),   grad_determinism(),
                            layout_invariance(),         bias_row_shift(),
                            bias_minus_inf(),            grad_bias(),
                            alibi_as_bias(),             temperature_as_query_scale(),
                            rope_as_rotated_inputs(),    rope_relative_positions(),
                            qk_norm_as_normalised_inputs(), qk_norm_scale_invariance(),
                            dropout_as_its_mask(),       dropout_mask_determinism(),
                            dropout_keep_rate(),         grad_dropout_mask(),
                            kv_quant_oracle(),           kv_quant_k_scale(),
                            kv_quant_v_scale(),          kv_quant_requantise(),
                            kv_quant_dense(),            kv_quant_head_rotation(),
                            index_list_oracle(),         index_list_order(),
                            index_list_full(),           tree_oracle(),
                            tree_bitmask(),              tree_path(),
                            tree_siblings(),             tree_chain(),
                            index_list_pages(),           tree_fresh()};
  }();
  return all;
}

const Law* find_law(std::string_view name) {
  for (const auto& l : laws())
    if (l.name == name) return &l;
  return nullptr;
}

}  // namespace attncheck
