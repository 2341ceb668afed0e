// Shape formatting and checks shared by every error message of the core.
#include "attncheck/tensor.hpp"

#include <cmath>
#include <limits>

#include "attncheck/dtype.hpp"

namespace attncheck {

std::string to_string(const Shape& s) {
  return "[" + std::to_string(s.B) + "," + std::to_string(s.H) + "," + std::to_string(s.T) + "," +
         std::to_string(s.D) + "]";
}

std::string shape_string(Index rows, Index cols) {
  return "[" + std::to_string(rows) + "," + std::to_string(cols) + "]";
}

void check_extents(const Shape& s, const char* who) {
  const std::pair<const char*, Index> extents[] = {{"B", s.B}, {"H", s.H}, {"T", s.T}, {"D", s.D}};
  for (const auto& [name, n] : extents)
    if (n < 1)
      throw ShapeError(std::string(who) + ": shape " + to_string(s) + " has a non-positive extent (" + name +
                       " = " + std::to_string(n) + ")");
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f64: return "float64";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::f32: break;
  }
  return "float32";
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (const DType t : {DType::f32, DType::f64, DType::f16, DType::bf16})
    if (dtype_name(t) == name) return t;
  return std::nullopt;
}

double unit_roundoff(DType t) {
  switch (t) {
    case DType::f64: return std::ldexp(1.0, -53);
    case DType::f16: return std::ldexp(1.0, -11);
    case DType::bf16: return std::ldexp(1.0, -8);
    case DType::f32: break;
  }
  return std::ldexp(1.0, -24);
}

double max_finite(DType t) {
  switch (t) {
    case DType::f64: return std::numeric_limits<double>::max();
    case DType::f16: return 65504.0;
    case DType::bf16: return static_cast<double>(std::numeric_limits<Eigen::bfloat16>::max());
    case DType::f32: break;
  }
  return std::numeric_limits<float>::max();
}

}  // namespace attncheck
