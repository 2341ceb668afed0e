// The dispatcher of the core's instruction-set copies (kernels.hpp, cmake/attncheckIsa.cmake): the tables this
// build has, the choice of one at the first call, and the streamed forward and backward routed through it. Compiled
// with the preset's own flags: it runs on every CPU of the architecture, and only then enters the copy it chose.
#include "attncheck/isa.hpp"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "attncheck/error.hpp"
#include "kernels.hpp"

#define ATTNCHECK_DECLARE_COPY(id)                                                  \
  extern "C" const attncheck::detail::ForwardKernels ATTNCHECK_FORWARD_KERNELS(id); \
  extern "C" const attncheck::detail::BackwardKernels ATTNCHECK_BACKWARD_KERNELS(id);
ATTNCHECK_DECLARE_COPY(generic)
#ifdef ATTNCHECK_ISA_X86_64_V3
ATTNCHECK_DECLARE_COPY(x86_64_v3)
#endif
#ifdef ATTNCHECK_ISA_X86_64_V4
ATTNCHECK_DECLARE_COPY(x86_64_v4)
#endif

namespace attncheck {
namespace {

struct Copy {
  const char* name;
  const detail::ForwardKernels* forward;
  const detail::BackwardKernels* backward;
};

// Portable first, so the last one a CPU supports is the best.
constexpr Copy kCopies[] = {
    {"generic", &ATTNCHECK_FORWARD_KERNELS(generic), &ATTNCHECK_BACKWARD_KERNELS(generic)},
#ifdef ATTNCHECK_ISA_X86_64_V3
    {"x86-64-v3", &ATTNCHECK_FORWARD_KERNELS(x86_64_v3), &ATTNCHECK_BACKWARD_KERNELS(x86_64_v3)},
#endif
#ifdef ATTNCHECK_ISA_X86_64_V4
    {"x86-64-v4", &ATTNCHECK_FORWARD_KERNELS(x86_64_v4), &ATTNCHECK_BACKWARD_KERNELS(x86_64_v4)},
#endif
};

// What -march=x86-64-v3 and -v4 let the compiler use. libgcc's CPU model also asks the OS (XGETBV) whether it
// saves the AVX and AVX-512 registers, so a feature the kernel does not enable reads as absent. GCC names the levels
// themselves; clang 14 (the sanitizer build's) knows neither the levels nor F16C and MOVBE, so it asks the rest.
bool cpu_runs(std::string_view name) {
  if (name == "generic") return true;
#if defined(__x86_64__) && !defined(__clang__)
  __builtin_cpu_init();
  if (name == "x86-64-v3") return __builtin_cpu_supports("x86-64-v3");
  if (name == "x86-64-v4") return __builtin_cpu_supports("x86-64-v4");
#elif defined(__x86_64__)
  __builtin_cpu_init();
  const bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
                  __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("popcnt");
  if (name == "x86-64-v3") return v3;
  if (name == "x86-64-v4")
    return v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512cd");
#endif
  return false;
}

const Copy* find(std::string_view name) {
  for (const Copy& c : kCopies)
    if (name == c.name) return &c;
  return nullptr;
}

std::string choices() {
  std::string s;
  for (const Copy& c : kCopies)
    if (cpu_runs(c.name)) s += (s.empty() ? "" : ", ") + std::string(c.name);
  return s;
}

const Copy& checked(std::string_view name, const char* who) {
  const Copy* c = find(name);
  if (!c || !cpu_runs(name))
    throw ValueError(std::string(who) + ": instruction set \"" + std::string(name) + "\" " +
                     (c ? "is compiled in but this CPU cannot run it" : "is not one this build has") +
                     "; expected one of: " + choices());
  return *c;
}

const Copy& best() {
  const Copy* b = &kCopies[0];
  for (const Copy& c : kCopies)
    if (cpu_runs(c.name)) b = &c;
  return *b;
}

std::atomic<const Copy*> g_copy{nullptr};
std::atomic<const detail::ForwardKernels*> g_forward_override{nullptr};

const Copy& chosen() {
  if (const Copy* c = g_copy.load(std::memory_order_acquire)) return *c;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = std::getenv("ATTNCHECK_ISA");
    g_copy.store(env && *env ? &checked(env, "ATTNCHECK_ISA") : &best(), std::memory_order_release);
  });
  return *g_copy.load(std::memory_order_acquire);
}

}  // namespace

std::vector<std::string> compiled_isas() {
  std::vector<std::string> v;
  for (const Copy& c : kCopies) v.emplace_back(c.name);
  return v;
}

bool isa_supported(std::string_view name) { return find(name) && cpu_runs(name); }

std::string active_isa() { return chosen().name; }

void select_isa(std::string_view name) { g_copy.store(&checked(name, "select_isa"), std::memory_order_release); }

std::string isa_summary() {
  std::string all;
  for (const Copy& c : kCopies) all += (all.empty() ? "" : ", ") + std::string(c.name);
  return active_isa() + " (of " + all + ")";
}

namespace detail {

const ForwardKernels& forward_kernels() {
  if (const ForwardKernels* t = g_forward_override.load(std::memory_order_acquire)) return *t;
  return *chosen().forward;
}

void use_forward_kernels(const ForwardKernels* table) { g_forward_override.store(table, std::memory_order_release); }

const BackwardKernels& backward_kernels() { return *chosen().backward; }

template <class S>
AttentionGradients<S> streamed_backward(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v,
                                        const Tensor<S>& d_output, const AttentionOptions& opts) {
  const BackwardKernels& t = backward_kernels();
  if constexpr (std::is_same_v<S, float>) return t.f32(q, k, v, d_output, opts);
  if constexpr (std::is_same_v<S, double>) return t.f64(q, k, v, d_output, opts);
  if constexpr (std::is_same_v<S, Eigen::half>) return t.f16(q, k, v, d_output, opts);
  if constexpr (std::is_same_v<S, Eigen::bfloat16>) return t.bf16(q, k, v, d_output, opts);
}

template <class S>
Tensor<S> streamed_forward(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const AttentionOptions& opts,
                           double scale, Tensor<double>* stats, bool bounds) {
  const ForwardKernels& t = forward_kernels();
  if constexpr (std::is_same_v<S, float>) return t.f32(q, k, v, opts, scale, stats, bounds);
  if constexpr (std::is_same_v<S, double>) return t.f64(q, k, v, opts, scale, stats, bounds);
  if constexpr (std::is_same_v<S, Eigen::half>) return t.f16(q, k, v, opts, scale, stats, bounds);
  if constexpr (std::is_same_v<S, Eigen::bfloat16>) return t.bf16(q, k, v, opts, scale, stats, bounds);
}

template Tensor<float> streamed_forward(const Tensor<float>&, const Tensor<float>&, const Tensor<float>&,
                                        const AttentionOptions&, double, Tensor<double>*, bool);
template Tensor<double> streamed_forward(const Tensor<double>&, const Tensor<double>&, const Tensor<double>&,
                                         const AttentionOptions&, double, Tensor<double>*, bool);
template Tensor<Eigen::half> streamed_forward(const Tensor<Eigen::half>&, const Tensor<Eigen::half>&,
                                              const Tensor<Eigen::half>&, const AttentionOptions&, double,
                                              Tensor<double>*, bool);
template Tensor<Eigen::bfloat16> streamed_forward(const Tensor<Eigen::bfloat16>&, const Tensor<Eigen::bfloat16>&,
                                                  const Tensor<Eigen::bfloat16>&, const AttentionOptions&, double,
                                                  Tensor<double>*, bool);

#define ATTNCHECK_INSTANTIATE_STREAMED_BACKWARD(S)                                                       \
  template AttentionGradients<S> streamed_backward(const Tensor<S>&, const Tensor<S>&, const Tensor<S>&, \
                                                   const Tensor<S>&, const AttentionOptions&);
ATTNCHECK_INSTANTIATE_STREAMED_BACKWARD(float)
ATTNCHECK_INSTANTIATE_STREAMED_BACKWARD(double)
ATTNCHECK_INSTANTIATE_STREAMED_BACKWARD(Eigen::half)
ATTNCHECK_INSTANTIATE_STREAMED_BACKWARD(Eigen::bfloat16)

}  // namespace detail

template <class S>
AttentionGradients<double> streaming_oracle_backward(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v,
                                                     const Tensor<S>& d_output, const AttentionOptions& opts) {
  const detail::BackwardKernels& t = detail::backward_kernels();
  if constexpr (std::is_same_v<S, float>) return t.oracle_f32(q, k, v, d_output, opts);
  if constexpr (std::is_same_v<S, double>) return t.oracle_f64(q, k, v, d_output, opts);
  if constexpr (std::is_same_v<S, Eigen::half>) return t.oracle_f16(q, k, v, d_output, opts);
  if constexpr (std::is_same_v<S, Eigen::bfloat16>) return t.oracle_bf16(q, k, v, d_output, opts);
}

template AttentionGradients<double> streaming_oracle_backward(const Tensor<float>&, const Tensor<float>&,
                                                              const Tensor<float>&, const Tensor<float>&,
                                                              const AttentionOptions&);
template AttentionGradients<double> streaming_oracle_backward(const Tensor<double>&, const Tensor<double>&,
                                                              const Tensor<double>&, const Tensor<double>&,
                                                              const AttentionOptions&);
template AttentionGradients<double> streaming_oracle_backward(const Tensor<Eigen::half>&, const Tensor<Eigen::half>&,
                                                              const Tensor<Eigen::half>&, const Tensor<Eigen::half>&,
                                                              const AttentionOptions&);
template AttentionGradients<double> streaming_oracle_backward(const Tensor<Eigen::bfloat16>&,
                                                              const Tensor<Eigen::bfloat16>&,
                                                              const Tensor<Eigen::bfloat16>&,
                                                              const Tensor<Eigen::bfloat16>&, const AttentionOptions&);

GradientCheck streamed_gradient_check(DType dtype, const Tensor<double>& q, const Tensor<double>& k,
                                      const Tensor<double>& v, const Tensor<double>& d_output,
                                      const AttentionOptions& opts, double safety, const GradientRows* only) {
  return detail::backward_kernels().gradient_check(dtype, q, k, v, d_output, opts, safety, only);
}

Tensor<double> streamed_weight_relative_error(DType dtype, const Tensor<double>& q, const Tensor<double>& k,
                                              const AttentionOptions& opts) {
  return detail::backward_kernels().weight_relative_error(dtype, q, k, opts);
}

}  // namespace attncheck
