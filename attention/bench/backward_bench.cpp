// The streamed backward at long contexts (backward_streamed.cpp): the core's float path (attention_backward
// above kStreamedBackwardWeights) and the float64 streamed oracle with its derived bound
// (streamed_gradient_check), B = H = 1, D = 64, causal, T in {4096, 16384}. Measured, never asserted; peak
// memory is the process's (run one benchmark at a time under /usr/bin/time -v to read it).
#include <benchmark/benchmark.h>

#include <cmath>

#include "attncheck/backward.hpp"

namespace {

using attncheck::Index;
using attncheck::Shape;
using attncheck::Tensor;

constexpr Index kD = 64;

Tensor<double> inputs(Index T, double phase) {
  Tensor<double> t(Shape{1, 1, T, kD});
  for (Index n = 0; n < t.size(); ++n) t.values()[n] = double(float(std::sin(1.37 * double(n) + phase)));
  return t;
}

void BM_core_backward(benchmark::State& state) {
  const Index T = state.range(0);
  const Tensor<float> q = inputs(T, 0.3).cast<float>(), k = inputs(T, 1.1).cast<float>(),
                      v = inputs(T, 2.0).cast<float>(), dO = inputs(T, 2.9).cast<float>();
  for (auto _ : state) benchmark::DoNotOptimize(attncheck::attention_backward<float>(q, k, v, dO));
}

void BM_streamed_gradient_check(benchmark::State& state) {
  const Index T = state.range(0);
  const Tensor<double> q = inputs(T, 0.3), k = inputs(T, 1.1), v = inputs(T, 2.0), dO = inputs(T, 2.9);
  for (auto _ : state)
    benchmark::DoNotOptimize(attncheck::streamed_gradient_check(attncheck::DType::f32, q, k, v, dO, {}));
}

}  // namespace

BENCHMARK(BM_core_backward)->ArgName("T")->Arg(128)->Arg(4096)->Arg(16384)->UseRealTime()->Unit(benchmark::kSecond);
BENCHMARK(BM_streamed_gradient_check)->ArgName("T")->Arg(128)->Arg(4096)->Arg(16384)->UseRealTime()->Unit(benchmark::kSecond);
