// Shared by the harness tests: where the example plug-ins and helper programs are, and deterministic
// problems (closed-form values, no randomness) for calls outside RapidCheck.
#pragma once

#include <cmath>
#include <string>

#include "attncheck/implementation.hpp"

namespace attncheck::test {

inline std::string example_plugin(const std::string& name) {
  return std::string(ATTNCHECK_EXAMPLES_DIR) + "/lib" + name + ".so";
}

/// Values sin(1.3·n + seed) rounded to `dtype` (exact there), n the flat index: distinct, mixed signs.
inline Tensor<double> wave(const Shape& s, DType dtype, double seed) {
  Tensor<double> t(s);
  for (Index n = 0; n < t.size(); ++n)
    t.values()[n] = visit_dtype(
        dtype, [&](auto tag) { return double(static_cast<decltype(tag)>(std::sin(1.3 * double(n) + seed))); });
  return t;
}

inline Problem wave_problem(DType dtype, Index B, Index H, Index T_q, Index T_k, Index D) {
  Problem p;
  p.dtype = dtype;
  p.q = wave({B, H, T_q, D}, dtype, 0.1);
  p.k = wave({B, H, T_k, D}, dtype, 0.2);
  p.v = wave({B, H, T_k, D}, dtype, 0.3);
  return p;
}

}  // namespace attncheck::test
