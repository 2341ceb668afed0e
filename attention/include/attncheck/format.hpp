// The one number formatter of attncheck: every message, table and report that prints a number uses it, so a
// value reads the same everywhere ("0.5", "1e-07", "nan", "inf", "-inf").
#pragma once

#include <string>

namespace attncheck {

/// x with `significant` significant digits (printf's %g), or "nan", "inf", "-inf". 17 digits round-trip.
std::string format_number(double x, int significant = 9);

}  // namespace attncheck
