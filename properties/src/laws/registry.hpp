// The laws, one factory per file; laws() in ../laws.cpp lists them in the order they are documented.
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

}  // namespace attncheck::law_kit
