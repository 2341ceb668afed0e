// The laws, one factory per file; laws() in ../laws.cpp lists them in the order they are documented. A law file
// keeps its own names (kWhy, gen, check, helpers) in `namespace { namespace <file>_law { ... } }` and its factories
// begin with `using namespace <file>_law;`: the library compiles as unity sources of several law files
// (properties/CMakeLists.txt), in which two files' names must not meet.
#pragma once

#include "attncheck/law.hpp"

namespace attncheck::law_kit {

Law row_stochastic();
Law zero_future_weight();
Law causal_perturbation();
Law prefix_consistency();
Law scale_variance();
Law first_position();
Law convex_hull();
Law shift_invariance();
Law batch_head_independence();
Law oracle_agreement();
Law paths_agree();
Law determinism();
Law strict_causality_nonfinite();
Law decode_consistency();
Law chunked_prefill();
Law gqa_head_sharing();
Law gqa_equivalence();
Law key_padding_invariance();
Law varlen_equivalence();
Law window_zero_weight();
Law window_perturbation();
Law empty_row_convention();
// The log-sum-exp and the score modifiers (ABI 3).
Law lse_oracle();
Law output_lse_consistency();
Law split_kv_merge();
Law sink_mass();
Law softcap_bound();
Law neutral_modifiers();
// Paged K and V (ABI 3).
Law paged_dense();
Law page_permutation();
Law page_size();
Law poisoned_slots();
Law paged_capacity();
Law shared_pages();
// Gradient laws (Law::needs_backward).
Law grad_oracle();
Law grad_causality();
Law grad_key_sum_zero();
Law grad_dv_weights();
Law grad_finite_difference();
// Masks beyond causal (ABI 3).
Law hidden_keys();
Law packed_equals_separate();
Law chunked_equals_separate();
Law neutral_masks();
Law bidirectional_permutation();
Law mask_encodings();
// Value regimes.
Law extreme_scores();
Law batch_invariance();
Law grad_determinism();  // (bwd)
Law layout_invariance();
// The additive bias (ABI 4).
Law bias_row_shift();
Law bias_minus_inf();
Law grad_bias();  // (bwd)
Law alibi_as_bias();
// The per-query temperature (ABI 4).
Law temperature_as_query_scale();
// Rotary position embeddings (ABI 4).
Law rope_as_rotated_inputs();
Law rope_relative_positions();
// QK-norm (ABI 4).
Law qk_norm_as_normalised_inputs();
Law qk_norm_scale_invariance();
// Dropout (ABI 4).
Law dropout_as_its_mask();
Law dropout_mask_determinism();
Law dropout_keep_rate();
Law grad_dropout_mask();  // (bwd)
// Quantised K and V caches (ABI 4).
Law kv_quant_oracle();
Law kv_quant_k_scale();
Law kv_quant_v_scale();
Law kv_quant_requantise();
Law kv_quant_dense();
Law kv_quant_head_rotation();
Law index_list_oracle();
Law index_list_order();
Law index_list_full();
Law index_list_pages();
Law tree_oracle();
Law tree_bitmask();
Law tree_path();
Law tree_siblings();
Law tree_chain();
Law tree_fresh();

}  // namespace attncheck::law_kit
