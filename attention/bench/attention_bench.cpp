// The core's streamed forward against a plain materialised Eigen forward ([T,T] scores, softmax, ·V), in
// the same run: B=1, H=8, D=64, float32, T in {128, 512, 2048, 8192}. GFLOP/s counts 4·B·H·T²·D per call
// (QKᵀ and P·V, the whole square, as FlashAttention's benchmarks do), whatever the causal mask skips.
#include <benchmark/benchmark.h>

#include <cmath>
#include <limits>
#include <string>

#include "attncheck/attention.hpp"
#include "attncheck/isa.hpp"
#include "kernels.hpp"

extern "C" const attncheck::detail::ForwardKernels ATTNCHECK_FORWARD_KERNELS(native);

namespace {

using attncheck::Index;
using attncheck::Matrix;
using attncheck::Shape;
using attncheck::Tensor;

constexpr Index kB = 1, kH = 8, kD = 64;

Tensor<float> inputs(Index T, double phase) {
  Tensor<float> t(Shape{kB, kH, T, kD});
  for (Index n = 0; n < t.size(); ++n) t.values()[n] = float(std::sin(1.37 * double(n) + phase));
  return t;
}

// The plain way: one head at a time, the [T,T] scores materialised, masked with -inf, softmax, then ·V.
Tensor<float> materialised(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v) {
  const Index T = q.shape().T;
  const float scale = 1.0f / std::sqrt(float(kD));
  Tensor<float> out(q.shape());
  Matrix<float> s(T, T);
  for (Index b = 0; b < kB; ++b)
    for (Index h = 0; h < kH; ++h) {
      s.noalias() = q.head(b, h) * k.head(b, h).transpose();
      s *= scale;
      s.triangularView<Eigen::StrictlyUpper>().setConstant(-std::numeric_limits<float>::infinity());
      const Eigen::ArrayXf m = s.rowwise().maxCoeff();
      s = (s.array().colwise() - m).exp().matrix();
      const Eigen::ArrayXf l = s.rowwise().sum();
      out.head(b, h).noalias() = s * v.head(b, h);
      out.head(b, h).array().colwise() /= l;
    }
  return out;
}

void set_counters(benchmark::State& state, Index T) {
  state.counters["GFLOP/s"] = benchmark::Counter(4.0 * double(kB * kH * T * T * kD) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

void BM_materialised(benchmark::State& state) {
  const Index T = state.range(0);
  const auto q = inputs(T, 0.3), k = inputs(T, 1.1), v = inputs(T, 2.0);
  for (auto _ : state) benchmark::DoNotOptimize(materialised(q, k, v).data());
  set_counters(state, T);
}

// threads = 0: every core (the default); 1: one thread, for the per-core figure. The label names the
// instruction set the default build chose for this CPU (attncheck/isa.hpp).
void BM_core(benchmark::State& state) {
  const Index T = state.range(0);
  const auto q = inputs(T, 0.3), k = inputs(T, 1.1), v = inputs(T, 2.0);
  attncheck::AttentionOptions opts;
  opts.threads = int(state.range(1));
  for (auto _ : state) benchmark::DoNotOptimize(attncheck::attention(q, k, v, opts).data());
  set_counters(state, T);
  state.SetLabel(attncheck::active_isa());
}

// The same call on one thread, on another copy of the hot loops: `native` is streamed.cpp built into this
// benchmark alone with -O3 -march=native (attention/CMakeLists.txt), the build the default must match; `generic`
// is the portable copy, what the default build ran before it chose by CPU.
template <class Use>
void on_copy(benchmark::State& state, Use use, const char* label, bool oracle) {
  const Index T = state.range(0);
  const auto q = inputs(T, 0.3), k = inputs(T, 1.1), v = inputs(T, 2.0);
  attncheck::AttentionOptions opts;
  opts.threads = 1;
  use(true);
  if (oracle) {
    attncheck::RowStats stats;
    for (auto _ : state) benchmark::DoNotOptimize(attncheck::streaming_oracle(q, k, v, opts, &stats).data());
  } else {
    for (auto _ : state) benchmark::DoNotOptimize(attncheck::attention(q, k, v, opts).data());
  }
  use(false);
  set_counters(state, T);
  state.SetLabel(label);
}

void use_native(bool on) { attncheck::detail::use_forward_kernels(on ? &ATTNCHECK_FORWARD_KERNELS(native) : nullptr); }
void use_generic(bool on) {
  static const std::string chosen = attncheck::active_isa();
  attncheck::select_isa(on ? "generic" : chosen);
}
void use_default(bool) {}

void BM_core_native(benchmark::State& state) { on_copy(state, use_native, "-O3 -march=native", false); }
void BM_core_generic(benchmark::State& state) { on_copy(state, use_generic, "generic", false); }
// The float64 oracle's rows with their bound statistics (streaming_oracle), default and native.
void BM_oracle(benchmark::State& state) { on_copy(state, use_default, attncheck::active_isa().c_str(), true); }
void BM_oracle_native(benchmark::State& state) { on_copy(state, use_native, "-O3 -march=native", true); }

BENCHMARK(BM_materialised)->ArgName("T")->Arg(128)->Arg(512)->Arg(2048)->Arg(8192)->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_core)->ArgNames({"T", "threads"})->ArgsProduct({{128, 512, 2048, 8192}, {1, 0}})->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_core_native)
    ->ArgName("T")
    ->Arg(128)
    ->Arg(512)
    ->Arg(2048)
    ->Arg(8192)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_core_generic)
    ->ArgName("T")
    ->Arg(128)
    ->Arg(512)
    ->Arg(2048)
    ->Arg(8192)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_oracle)->ArgName("T")->Arg(128)->Arg(512)->Arg(2048)->Arg(8192)->UseRealTime()->Unit(
    benchmark::kMillisecond);
BENCHMARK(BM_oracle_native)
    ->ArgName("T")
    ->Arg(128)
    ->Arg(512)
    ->Arg(2048)
    ->Arg(8192)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
