// The error map of a law with a tolerance: per cell |actual - expected| / tolerance on a log colour scale, so
// the shape of a bug (rows past a tile boundary, one head, the last rows) shows at a glance, beside the
// values themselves. Large heads are max-pooled so that one bad cell still shows.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "attncheck/format.hpp"
#include "render_common.hpp"

namespace attncheck::reports {
using namespace detail;
namespace {

// Cells per axis before max-pooling: 48 keeps a head legible and the file small.
constexpr Index kMaxCells = 48;
// The log colour scale: ratios from 1e-3 (light) through 1 (the tolerance) to 1e6 (strongest).
constexpr int kLowDecades = 3, kHighDecades = 6;

// How far one entry is past its tolerance: 0 for identical bits or an uncompared cell (infinite tolerance),
// +inf for any difference where the tolerance is 0. NaN/Inf where the other side differs is `nonfinite`.
struct Cell {
  double ratio = 0;
  bool nonfinite = false;
  Index i = 0, c = 0;  // the entry shown (the block's worst when pooled)
};

Cell measure(double e, double a, double t, Index i, Index c) {
  Cell cell{0, false, i, c};
  if (std::memcmp(&e, &a, sizeof e) == 0 || (std::isnan(e) && std::isnan(a))) return cell;
  if (!std::isfinite(e) || !std::isfinite(a)) {
    cell.nonfinite = true;
    cell.ratio = std::numeric_limits<double>::infinity();
    return cell;
  }
  if (std::isinf(t)) return cell;
  const double diff = std::abs(a - e);
  cell.ratio = t > 0 ? diff / t : (diff > 0 ? std::numeric_limits<double>::infinity() : 0);
  return cell;
}

bool worse(const Cell& a, const Cell& b) {
  if (a.nonfinite != b.nonfinite) return a.nonfinite;
  return a.ratio > b.ratio;
}

// Light (white to pale blue) within the tolerance, orange to dark red past it; one step per decade.
std::string error_color(double ratio) {
  if (ratio <= 1) {
    const double u = ratio > 0 ? (std::log10(ratio) + kLowDecades) / kLowDecades : 0;
    return mix_color(u, 255, 255, 255, 189, 215, 238);
  }
  const double u = std::min(std::log10(ratio) / kHighDecades, 1.0);
  return u < 0.5 ? mix_color(u * 2, 253, 174, 107, 215, 48, 31) : mix_color(u * 2 - 1, 215, 48, 31, 103, 0, 13);
}

// Diverging blue - white - red for outputs, scaled by the head's largest |value|.
std::string value_color(double x, double scale, bool weights) {
  if (weights || !std::isfinite(x)) return weight_color(x);
  const double t = scale > 0 ? x / scale : 0;
  return t < 0 ? mix_color(-t, 255, 255, 255, 33, 102, 172) : mix_color(t, 255, 255, 255, 178, 24, 43);
}

}  // namespace

std::string error_map_svg(const Violation& v, Index b, Index h, const Visibility& vis, const std::string& title) {
  if (!v.expected || !v.actual || !v.tolerances || v.expected->shape() != v.actual->shape() ||
      v.expected->shape() != v.tolerances->shape())
    throw std::invalid_argument("error_map_svg: needs expected, actual and tolerances of one shape");
  const Tensor<double>&e = *v.expected, &a = *v.actual, &tol = *v.tolerances;
  const Index R = e.shape().T, C = e.shape().D;
  const bool weights = v.quantity == "weights";  // columns are keys: the future cells are outlined
  const char* col_name = weights ? "j" : "c";

  // Max-pooling: each picture cell is a pr x pc block, coloured by its worst entry.
  const Index pr = (R + kMaxCells - 1) / kMaxCells, pc = (C + kMaxCells - 1) / kMaxCells;
  const Index rows = (R + pr - 1) / pr, cols = (C + pc - 1) / pc;
  const bool pooled = pr > 1 || pc > 1;
  std::vector<Cell> cells(static_cast<std::size_t>(rows * cols));
  std::vector<char> future(cells.size(), 1);  // every entry of the block is a future key
  double scale = 0;
  for (Index i = 0; i < R; ++i)
    for (Index c = 0; c < C; ++c) {
      const std::size_t n = static_cast<std::size_t>((i / pr) * cols + c / pc);
      const Cell cell = measure(e(b, h, i, c), a(b, h, i, c), tol(b, h, i, c), i, c);
      if ((i % pr == 0 && c % pc == 0) || worse(cell, cells[n])) cells[n] = cell;
      future[n] &= weights && !vis.visible(i, c);
      for (const double x : {e(b, h, i, c), a(b, h, i, c)})
        if (std::isfinite(x)) scale = std::max(scale, std::abs(x));
    }

  const Index longest = std::max(rows, cols);
  const int cell = longest <= 8 ? 40 : longest <= 16 ? 28 : std::max(6, static_cast<int>(448 / longest));
  const int grid_w = static_cast<int>(cols) * cell, grid_h = static_cast<int>(rows) * cell;
  const int panel_w = std::max(grid_w, 300), gap = 56, left = 52, top = pooled ? 100 : 84;
  const int legend_top = top + grid_h + 18;
  const int height = legend_top + 104;
  const int panel_x[2] = {left, left + panel_w + gap};
  const bool has_worst = v.worst_index.size() == 4 && v.worst_index[0] == b && v.worst_index[1] == h &&
                         v.worst_index[2] < R && v.worst_index[3] < C;

  const std::string what = title + ": " + v.quantity + " of head b=" + std::to_string(b) + ", h=" + std::to_string(h) +
                           " [" + std::to_string(R) + "," + std::to_string(C) + "]";
  // Wide enough for both panels and the heading (bold 12px sans-serif: about 7.5 px a character).
  const int width = std::max(left + panel_w + gap + panel_w + 16, 16 + static_cast<int>(what.size()) * 15 / 2);
  std::string s = svg_open(width, height, what + ", error against tolerance");
  s += svg_text(8, 18, xml_escape(what), "font-weight=\"bold\"");
  s += svg_text(8, 38, "|actual &#8722; expected| / tolerance per entry, log scale: light is within the tolerance, "
                       "strong is past it.");
  if (pooled)
    s += svg_text(8, 58,
                  "Downsampled by max-pooling: each cell is the worst of a block of " + std::to_string(pr) + "&#215;" +
                      std::to_string(pc) + " entries, so one bad entry stays visible.",
                  "fill=\"#b35806\" font-weight=\"bold\"");
  s += svg_text(panel_x[0], top - 26, "error / tolerance", "font-weight=\"bold\"");
  s += svg_text(panel_x[1], top - 26, std::string("actual ") + v.quantity, "font-weight=\"bold\"");

  const bool labels = cell >= 14;
  for (const int x0 : panel_x) {
    s += svg_text(x0 + grid_w, top - 8, std::string(weights ? "key j" : "channel c") + " &#8594;", "text-anchor=\"end\" fill=\"#555555\"");
    for (Index r = 0; r < rows; ++r)
      if (labels || r == 0 || r == rows - 1)
        s += svg_text(x0 - 6, top + static_cast<int>(r) * cell + cell / 2 + 4, std::to_string(r * pr), "text-anchor=\"end\"");
    for (Index k = 0; k < cols && labels; ++k)
      s += svg_text(x0 + static_cast<int>(k) * cell + cell / 2, top + grid_h + 12, std::to_string(k * pc),
                    "text-anchor=\"middle\" font-size=\"10\"");
  }
  // Centred on the rows, but never higher than its own length allows: it would run into the column label.
  const int label_y = top + std::max(grid_h, 80) / 2;
  s += svg_text(14, label_y, "query i &#8594;",
                "text-anchor=\"middle\" transform=\"rotate(90 14 " + std::to_string(label_y) + ")\"");

  const bool show_values = cell >= 40;
  for (Index r = 0; r < rows; ++r)
    for (Index k = 0; k < cols; ++k) {
      const Cell& m = cells[static_cast<std::size_t>(r * cols + k)];
      const int x = static_cast<int>(k) * cell, y = top + static_cast<int>(r) * cell;
      const double actual = a(b, h, m.i, m.c), expected = e(b, h, m.i, m.c);
      // Past the tolerance or non-finite: a class and a tooltip naming the entry, for a reader and for tests.
      std::string attrs = "fill=\"" + (m.nonfinite ? std::string("#e377c2") : error_color(m.ratio)) +
                          "\" stroke=\"#dddddd\" stroke-width=\"1\"";
      if (m.nonfinite || m.ratio > 1) {
        std::string where = "i=" + std::to_string(m.i) + ", " + col_name + "=" + std::to_string(m.c);
        if (pooled)
          where = "rows " + std::to_string(r * pr) + "-" + std::to_string(std::min(R, (r + 1) * pr) - 1) + " x " +
                  col_name + " " + std::to_string(k * pc) + "-" + std::to_string(std::min(C, (k + 1) * pc) - 1) +
                  ", worst " + where;
        attrs += std::string(" class=\"") + (m.nonfinite ? "nonfinite" : "over") + "\"><title>" + where +
                 ": error/tolerance " + format_number(m.ratio, 3) + " (actual " + num(actual, true) + ", expected " + num(expected, true) +
                 ")</title></rect";
        s += "<rect x=\"" + std::to_string(panel_x[0] + x) + "\" y=\"" + std::to_string(y) + "\" width=\"" +
             std::to_string(cell) + "\" height=\"" + std::to_string(cell) + "\" " + attrs + ">\n";
      } else {
        s += svg_rect(panel_x[0] + x, y, cell, cell, attrs);
      }
      if (m.nonfinite && show_values)
        s += svg_text(panel_x[0] + x + cell / 2, y + cell / 2 + 4, cell_text(std::isfinite(actual) ? expected : actual),
                      "text-anchor=\"middle\" font-size=\"11\"");
      s += svg_rect(panel_x[1] + x, y, cell, cell,
                    "fill=\"" + value_color(actual, scale, weights) + "\" stroke=\"#dddddd\" stroke-width=\"1\"");
      if (show_values) {
        const double t = weights ? actual : (scale > 0 ? std::abs(actual) / scale : 0);
        const std::string text = weights ? cell_text(actual) : format_number(actual, 2);
        // A 40-px cell fits five characters at 11 px; "-4.2e+04" needs the smaller size.
        s += svg_text(panel_x[1] + x + cell / 2, y + cell / 2 + 4, text,
                      std::string("text-anchor=\"middle\" font-size=\"") + (text.size() > 5 ? "8" : "11") + "\" fill=\"" +
                          (std::isfinite(actual) && t > 0.5 ? "white" : "black") + "\"");
      }
    }
  // Outlines after the fills: future blocks in red (inside the cell), the worst entry in black.
  const int inset = cell >= 14 ? 3 : 1;
  for (Index r = 0; r < rows; ++r)
    for (Index k = 0; k < cols; ++k)
      if (future[static_cast<std::size_t>(r * cols + k)])
        for (const int x0 : panel_x)
          s += svg_rect(x0 + static_cast<int>(k) * cell + inset, top + static_cast<int>(r) * cell + inset,
                        cell - 2 * inset, cell - 2 * inset, "fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\"");
  if (has_worst)
    for (const int x0 : panel_x)
      s += svg_rect(x0 + static_cast<int>(v.worst_index[3] / pc) * cell, top + static_cast<int>(v.worst_index[2] / pr) * cell,
                    cell, cell, "fill=\"none\" stroke=\"black\" stroke-width=\"3\"");

  // Legends under the panels: the log error scale (a tick at the tolerance), then the value scale.
  const int decades = kLowDecades + kHighDecades, seg = (panel_w - 20) / decades;
  for (int d = 0; d < decades; ++d)
    s += svg_rect(panel_x[0] + d * seg, legend_top, seg, 14, "fill=\"" + error_color(std::pow(10.0, d - kLowDecades + 0.5)) + "\"");
  s += svg_rect(panel_x[0], legend_top, decades * seg, 14, "fill=\"none\" stroke=\"#bbbbbb\"");
  s += svg_line(panel_x[0] + kLowDecades * seg, legend_top - 4, panel_x[0] + kLowDecades * seg, legend_top + 18,
                "stroke=\"black\" stroke-width=\"2\"");
  s += svg_text(panel_x[0], legend_top + 30, "&#8804;0.001");
  s += svg_text(panel_x[0] + kLowDecades * seg, legend_top + 30, "1", "text-anchor=\"middle\" font-weight=\"bold\"");
  s += svg_text(panel_x[0] + decades * seg, legend_top + 30, "&#8805;1e6", "text-anchor=\"end\"");
  int ly = legend_top + 44;
  s += svg_rect(panel_x[0], ly, 14, 14, "fill=\"#e377c2\"");
  s += svg_text(panel_x[0] + 20, ly + 11, "NaN or Inf where the other side differs");
  ly += 20;
  if (weights) {
    s += svg_rect(panel_x[0], ly, 14, 14, "fill=\"white\" stroke=\"#d62728\" stroke-width=\"2\"");
    s += svg_text(panel_x[0] + 20, ly + 11, hidden_key_label(vis) + ": weight must be 0");
    ly += 20;
  }
  if (has_worst) {
    s += svg_rect(panel_x[0], ly, 14, 14, "fill=\"white\" stroke=\"black\" stroke-width=\"3\"");
    s += svg_text(panel_x[0] + 20, ly + 11, "worst entry");
  }
  const int steps = 10, vseg = (panel_w - 20) / steps;
  for (int k = 0; k < steps; ++k) {
    const double t = (k + 0.5) / steps;
    s += svg_rect(panel_x[1] + k * vseg, legend_top, vseg, 14,
                  "fill=\"" + (weights ? weight_color(t) : value_color((2 * t - 1) * scale, scale, false)) + "\"");
  }
  s += svg_rect(panel_x[1], legend_top, steps * vseg, 14, "fill=\"none\" stroke=\"#bbbbbb\"");
  s += svg_text(panel_x[1], legend_top + 30, weights ? "0" : num(-scale));
  s += svg_text(panel_x[1] + steps * vseg, legend_top + 30, weights ? "1" : num(scale), "text-anchor=\"end\"");
  if (!weights) s += svg_text(panel_x[1] + steps * vseg / 2, legend_top + 30, "0", "text-anchor=\"middle\"");
  s += "</svg>\n";
  return s;
}

}  // namespace attncheck::reports
