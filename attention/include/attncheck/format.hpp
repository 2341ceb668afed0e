// The one number formatter of attncheck: every message, table and report that prints a number uses it, so a
// value reads the same everywhere ("0.5", "1e-07", "nan", "inf", "-inf").
#pragma once

#include <string>
#include <string_view>

namespace attncheck {

/// x with `significant` significant digits (printf's %g), or "nan", "inf", "-inf". 17 digits round-trip.
std::string format_number(double x, int significant = 9);

/// `bytes` as text every report format and terminal can carry: valid UTF-8 is kept as it is, and every byte
/// that is not part of a valid UTF-8 sequence, or is a control character other than newline and tab (ESC
/// included, so a terminal cannot be driven), becomes the four characters \xHH naming it. Text that a plug-in
/// or a child process wrote (names, messages, captured stderr) passes through this before attncheck keeps it.
std::string printable_text(std::string_view bytes);

}  // namespace attncheck
