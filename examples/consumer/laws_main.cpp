// Checks my::causal_attention against every law: adapt it to attncheck's Implementation, then law_main.
#include <attncheck/law_main.hpp>

#include "my_attention.hpp"

int main(int argc, char** argv) {
  using namespace attncheck;
  Capabilities caps;  // what my::causal_attention accepts: float32, T_q == T_k, default scale, no weights
  caps.dtypes = {DType::f32};
  caps.returns_weights = caps.cross_lengths = caps.custom_scale = false;
  auto impl = make_implementation("my-attention", "my::causal_attention", caps, [](const Problem& p) {
    const Tensor<float> q = p.q.cast<float>(), k = p.k.cast<float>(), v = p.v.cast<float>();
    Tensor<float> out(q.shape());
    for (Index b = 0; b < q.shape().B; ++b)
      for (Index h = 0; h < q.shape().H; ++h) {
        const auto o = my::causal_attention(q.head(b, h).data(), k.head(b, h).data(), v.head(b, h).data(),
                                            int(q.shape().T), int(k.shape().T), int(q.shape().D));
        std::copy(o.begin(), o.end(), out.head(b, h).data());
      }
    return Outcome{out.cast<double>(), std::nullopt};
  });
  return law_main(argc, argv, impl);
}
