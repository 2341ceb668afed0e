// The consumer's own attention, with an API that knows nothing about attncheck: one head, float, top-left
// causal, scale 1/sqrt(D).
#pragma once

#include <vector>

namespace my {

/// q [T_q,D], k and v [T_k,D], row-major -> output [T_q,D].
std::vector<float> causal_attention(const float* q, const float* k, const float* v, int T_q, int T_k, int D);

}  // namespace my
