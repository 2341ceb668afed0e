// Helpers shared by the report renderers: number formatting, escaping and shell quoting.
#pragma once

#include <string>
#include <string_view>

#include "attncheck/reports.hpp"

namespace attncheck::reports::detail {

/// A number for people: 6 significant digits, or every digit needed to round-trip when `full`;
/// "NaN", "inf", "-inf" for non-finite values.
std::string num(double x, bool full = false);
/// Quotes `s` for a POSIX shell when it holds anything beyond plain word characters.
std::string shell_quote(std::string_view s);
/// Escapes &, <, >, " and ' for XML and SVG text and attributes; drops other control characters.
std::string xml_escape(std::string_view s);
/// Escapes | and newlines so a text fits in one Markdown table cell.
std::string md_cell(std::string_view s);
/// The violation's message without a leading "LAW: " (the law is named beside it already).
std::string plain_message(std::string_view law, std::string_view message);
/// "held", "falsified" or "n/a".
std::string_view status_name(LawStatus s);
/// "[0,0,1,2]".
std::string index_string(const std::vector<Index>& idx);

}  // namespace attncheck::reports::detail
