// Helpers shared by the report renderers: number formatting, escaping and shell quoting.
#pragma once

#include <string>
#include <utility>
#include <string_view>

#include "attncheck/reports.hpp"

namespace attncheck::reports::detail {

/// A number for people: 6 significant digits, or every digit needed to round-trip when `full`;
/// "nan", "inf", "-inf" for non-finite values (format_number).
std::string num(double x, bool full = false);
/// Quotes `s` for a POSIX shell when it holds anything beyond plain word characters (public: reports.hpp).
using reports::shell_quote;
/// Escapes &, <, >, " and ' for XML and SVG text and attributes; drops other control characters.
std::string xml_escape(std::string_view s);
/// Escapes | and newlines so a text fits in one Markdown table cell.
std::string md_cell(std::string_view s);
/// The violation's message without a leading "LAW: " (the law is named beside it already).
std::string plain_message(std::string_view law, std::string_view message);
/// "[0,0,1,2]".
std::string index_string(const std::vector<Index>& idx);

/// Which pictures a falsified law's report has: the error map when the violation has a tolerance per entry,
/// else the weights heatmap when weights are known; the variance plot when there is a sweep.
struct PictureSet {
  bool error_map = false, weights = false, variance = false;
};
PictureSet pictures_of(const LawResult& res);
/// Which keys batch entry b of `p` sees, for a picture of a [T_q,T_k] weights head: the problem's own rule when
/// the shapes match, else (a law's derived problem, such as a prefix) plain causality under its alignment.
Visibility picture_visibility(const Problem& p, Index b, Index h, Index T_q, Index T_k);
/// The legend of the red outline: "future key" for plain causality, "key it may not see" with padding or a window.
std::string hidden_key_label(const Visibility& vis);
/// The head (b,h) of the worst entry, or (0,0) when the worst index does not lie in shape `s`.
std::pair<Index, Index> worst_head(const Violation& v, const Shape& s);

// SVG pieces shared by the pictures (svg.cpp, error_map.cpp). Integer coordinates keep the output deterministic.
/// "#rrggbb".
std::string hex_color(int r, int g, int b);
/// The colour a fraction t in [0,1] of the way from (r0,g0,b0) to (r1,g1,b1).
std::string mix_color(double t, int r0, int g0, int b0, int r1, int g1, int b1);
/// White at 0 to dark blue at 1; pink for NaN/Inf, which no weight may be.
std::string weight_color(double w);
/// A weight in two decimals, "&gt;0" for a tiny non-zero one (a leak must not read as 0), "nan", "inf".
std::string cell_text(double w);
/// <rect .../> with extra attributes.
std::string svg_rect(int x, int y, int w, int h, const std::string& attrs);
/// <text ...>s</text>; `s` is already escaped.
std::string svg_text(int x, int y, const std::string& s, const std::string& attrs = "");
/// <line .../> with extra attributes.
std::string svg_line(int x1, int y1, int x2, int y2, const std::string& attrs);
/// The opening <svg> tag, a white background and the <title> (escaped here).
std::string svg_open(int width, int height, const std::string& title);

}  // namespace attncheck::reports::detail
