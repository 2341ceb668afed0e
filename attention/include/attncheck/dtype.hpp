// Scalar types the core computes in, their names and the unit roundoff that every tolerance starts from.
#pragma once

#include <Eigen/Core>
#include <optional>
#include <string_view>

namespace attncheck {

/// The element types an attention implementation can be checked at.
enum class DType { f32, f64, f16, bf16 };

/// The name a person types for a dtype (`float32`, `float64`, `float16`, `bfloat16`).
std::string_view dtype_name(DType t);

/// The dtype a person named (`float32`, `float64`, `float16`, `bfloat16`), or nothing.
std::optional<DType> parse_dtype(std::string_view name);

/// Unit roundoff u = 2^-p of the dtype's significand: rounding to it has relative error at most u.
double unit_roundoff(DType t);

/// Largest finite value of the dtype (half overflows at 65504).
double max_finite(DType t);

/// The accumulation type used for a scalar type: low precision accumulates in float (as real kernels do).
template <class S> struct Accumulate { using type = float; };
template <> struct Accumulate<double> { using type = double; };
template <class S> using Acc = typename Accumulate<S>::type;

/// The DType tag of a scalar type.
template <class S> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<Eigen::half>() { return DType::f16; }
template <> constexpr DType dtype_of<Eigen::bfloat16>() { return DType::bf16; }

/// Calls f with a value-initialised scalar of the type that `t` names (double, float, half, bfloat16).
template <class F> decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f64: return f(double{});
    case DType::f16: return f(Eigen::half{});
    case DType::bf16: return f(Eigen::bfloat16{});
    case DType::f32: break;
  }
  return f(float{});
}

}  // namespace attncheck
