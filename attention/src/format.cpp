// The one number formatter (attncheck/format.hpp).
#include "attncheck/format.hpp"

#include <cmath>
#include <cstdio>

namespace attncheck {

std::string format_number(double x, int significant) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.*g", significant, x);
  return buf;
}

}  // namespace attncheck
