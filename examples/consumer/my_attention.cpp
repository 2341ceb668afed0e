// Plain two-pass causal attention in float with a float accumulator.
#include "my_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace my {

std::vector<float> causal_attention(const float* q, const float* k, const float* v, int T_q, int T_k, int D) {
  std::vector<float> out(static_cast<std::size_t>(T_q * D), 0.0f), w(static_cast<std::size_t>(T_k));
  const float scale = 1.0f / std::sqrt(float(D));
  for (int i = 0; i < T_q; ++i) {
    const int n = std::min(i + 1, T_k);  // keys 0..i are visible
    float max = -std::numeric_limits<float>::infinity(), sum = 0;
    for (int j = 0; j < n; ++j) {
      float s = 0;
      for (int d = 0; d < D; ++d) s += q[i * D + d] * k[j * D + d];
      w[std::size_t(j)] = s * scale;
      max = std::max(max, w[std::size_t(j)]);
    }
    for (int j = 0; j < n; ++j) sum += (w[std::size_t(j)] = std::exp(w[std::size_t(j)] - max));
    for (int j = 0; j < n; ++j)
      for (int d = 0; d < D; ++d) out[std::size_t(i * D + d)] += w[std::size_t(j)] / sum * v[j * D + d];
  }
  return out;
}

}  // namespace my
