// Deterministic test inputs for the core's tests: a sine wave of a given magnitude, already representable in S
// (so the oracle sees the same values the kernel does).
#pragma once

#include <cmath>

#include "attncheck/tensor.hpp"

namespace attncheck::test {

template <class S> Tensor<S> wave(const Shape& s, double phase, double magnitude) {
  Tensor<S> t(s);
  for (Index n = 0; n < t.size(); ++n) t.values()[n] = S(magnitude * std::sin(1.37 * double(n) + phase));
  return t;
}

}  // namespace attncheck::test
