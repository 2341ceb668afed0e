// The pictures of a report: a heatmap of one head's weights with the future cells outlined (a leak shows at
// a glance), and a plot of score variance against D. Integer coordinates keep the output deterministic.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "render_common.hpp"

namespace attncheck::reports {
using namespace detail;
namespace {

std::string hex_color(int r, int g, int b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", r, g, b);
  return buf;
}

// White at 0 to dark blue at 1; pink for NaN/Inf, which no weight may be.
std::string weight_color(double w) {
  if (!std::isfinite(w)) return "#e377c2";
  const double t = std::clamp(w, 0.0, 1.0);
  const auto mix = [&](int a, int b) { return static_cast<int>(std::lround(a + (b - a) * t)); };
  return hex_color(mix(255, 8), mix(255, 48), mix(255, 107));
}

std::string cell_text(double w) {
  if (std::isnan(w)) return "NaN";
  if (std::isinf(w)) return w > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", w);
  std::string s = buf;
  if (w != 0 && s == "0.00") s = w > 0 ? "&gt;0" : "&lt;0";  // a tiny leak must not read as zero
  if (w == 0) s = "0";
  return s;
}

std::string rect(int x, int y, int w, int h, const std::string& attrs) {
  return "<rect x=\"" + std::to_string(x) + "\" y=\"" + std::to_string(y) + "\" width=\"" + std::to_string(w) +
         "\" height=\"" + std::to_string(h) + "\" " + attrs + "/>\n";
}

std::string text(int x, int y, const std::string& s, const std::string& attrs = "") {
  return "<text x=\"" + std::to_string(x) + "\" y=\"" + std::to_string(y) + "\"" + (attrs.empty() ? "" : " " + attrs) +
         ">" + s + "</text>\n";
}

}  // namespace

std::string weights_svg(const Tensor<double>& weights, Index b, Index h, CausalAlignment alignment,
                        const std::vector<Index>& worst_index, const std::string& title) {
  const Index Tq = weights.shape().T, Tk = weights.shape().D;
  const Index longest = std::max(Tq, Tk);
  const int cell = longest <= 8 ? 48 : longest <= 16 ? 32 : std::max(4, static_cast<int>(512 / longest));
  const int left = 56, top = 64, legend = 170;
  const int width = left + static_cast<int>(Tk) * cell + legend,
            height = top + std::max(static_cast<int>(Tq) * cell, 190) + 24;
  const bool has_worst = worst_index.size() == 4 && worst_index[0] == b && worst_index[1] == h;

  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(width) + "\" height=\"" +
                  std::to_string(height) + "\" viewBox=\"0 0 " + std::to_string(width) + " " + std::to_string(height) +
                  "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  const std::string caption = title + ": weights of head b=" + std::to_string(b) + ", h=" + std::to_string(h) + " [" +
                              std::to_string(Tq) + "," + std::to_string(Tk) + "]";
  s += "<title>" + xml_escape(caption) + "</title>\n";
  s += rect(0, 0, width, height, "fill=\"white\"");
  s += text(8, 18, xml_escape(caption), "font-weight=\"bold\"");
  s += text(left, 40, "key j &#8594;");
  s += text(14, top + 12, "query i", "transform=\"rotate(90 14 " + std::to_string(top + 12) + ")\"");
  const bool labels = cell >= 14, values = cell >= 32;
  for (Index j = 0; j < Tk && labels; ++j)
    s += text(left + static_cast<int>(j) * cell + cell / 2, top - 6, std::to_string(j), "text-anchor=\"middle\"");
  for (Index i = 0; i < Tq && labels; ++i)
    s += text(left - 6, top + static_cast<int>(i) * cell + cell / 2 + 4, std::to_string(i), "text-anchor=\"end\"");

  for (Index i = 0; i < Tq; ++i)
    for (Index j = 0; j < Tk; ++j) {
      const double w = weights(b, h, i, j);
      const int x = left + static_cast<int>(j) * cell, y = top + static_cast<int>(i) * cell;
      s += rect(x, y, cell, cell, "fill=\"" + weight_color(w) + "\" stroke=\"#bbbbbb\" stroke-width=\"1\"");
      if (values) {
        const bool dark = std::isfinite(w) && w > 0.5;
        s += text(x + cell / 2, y + cell / 2 + 4, cell_text(w),
                  std::string("text-anchor=\"middle\" font-size=\"11\" fill=\"") + (dark ? "white" : "black") + "\"");
      }
    }
  // Outlines after the fills so neighbouring cells do not paint over them.
  // The red outline sits inside the cell, clear of the black worst-entry outline on its edge.
  const int inset = cell >= 14 ? 3 : 1;
  for (Index i = 0; i < Tq; ++i)
    for (Index j = std::max<Index>(0, last_visible_key(i, Tq, Tk, alignment) + 1); j < Tk; ++j)
      s += rect(left + static_cast<int>(j) * cell + inset, top + static_cast<int>(i) * cell + inset, cell - 2 * inset,
                cell - 2 * inset, "fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\"");
  if (has_worst && worst_index[2] < Tq && worst_index[3] < Tk)
    s += rect(left + static_cast<int>(worst_index[3]) * cell, top + static_cast<int>(worst_index[2]) * cell, cell, cell,
              "fill=\"none\" stroke=\"black\" stroke-width=\"3\"");

  // Legend: the colour scale, then what the outlines mean.
  const int lx = left + static_cast<int>(Tk) * cell + 24;
  for (int step = 0; step <= 10; ++step)
    s += rect(lx, top + (10 - step) * 10, 16, 10, "fill=\"" + weight_color(step / 10.0) + "\"");
  s += rect(lx, top, 16, 110, "fill=\"none\" stroke=\"#bbbbbb\"");
  s += text(lx + 22, top + 8, "1");
  s += text(lx + 22, top + 112, "0");
  s += rect(lx, top + 124, 16, 16, "fill=\"white\" stroke=\"#d62728\" stroke-width=\"2\"");
  s += text(lx + 22, top + 136, "future: must be 0");
  s += rect(lx, top + 148, 16, 16, "fill=\"#e377c2\"");
  s += text(lx + 22, top + 160, "NaN or Inf");
  if (has_worst) {
    s += rect(lx, top + 172, 16, 16, "fill=\"white\" stroke=\"black\" stroke-width=\"3\"");
    s += text(lx + 22, top + 184, "worst entry");
  }
  s += "</svg>\n";
  return s;
}

std::string series_svg(const std::vector<std::pair<double, double>>& series, const std::string& title) {
  const int width = 520, height = 320, left = 70, right = 20, top = 36, bottom = 48;
  const int pw = width - left - right, ph = height - top - bottom;
  std::vector<std::pair<double, double>> pts;
  for (const auto& [d, v] : series)
    if (std::isfinite(d) && d > 0 && std::isfinite(v)) pts.emplace_back(d, v);
  double xmin = 1, xmax = 2, ymax = 1;
  if (!pts.empty()) {
    xmin = xmax = std::log2(pts.front().first);
    ymax = 0;
    for (const auto& [d, v] : pts) {
      xmin = std::min(xmin, std::log2(d));
      xmax = std::max(xmax, std::log2(d));
      ymax = std::max(ymax, std::abs(v));
    }
    if (xmax == xmin) {  // one D: centre it
      xmin -= 1;
      xmax += 1;
    }
  }
  // The law's level: with 1/sqrt(D) scaling the scores' variance is 1 at every D.
  ymax = std::max(ymax, 1.0) * 1.1;
  const auto px = [&](double d) { return left + static_cast<int>(std::lround((std::log2(d) - xmin) / (xmax - xmin) * pw)); };
  const auto py = [&](double v) { return top + ph - static_cast<int>(std::lround(v / ymax * ph)); };

  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(width) + "\" height=\"" +
                  std::to_string(height) + "\" viewBox=\"0 0 " + std::to_string(width) + " " + std::to_string(height) +
                  "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<title>" + xml_escape(title) + "</title>\n";
  s += rect(0, 0, width, height, "fill=\"white\"");
  s += text(8, 20, xml_escape(title), "font-weight=\"bold\"");
  s += "<line x1=\"" + std::to_string(left) + "\" y1=\"" + std::to_string(top + ph) + "\" x2=\"" + std::to_string(left + pw) +
       "\" y2=\"" + std::to_string(top + ph) + "\" stroke=\"black\"/>\n";
  s += "<line x1=\"" + std::to_string(left) + "\" y1=\"" + std::to_string(top) + "\" x2=\"" + std::to_string(left) +
       "\" y2=\"" + std::to_string(top + ph) + "\" stroke=\"black\"/>\n";
  for (int k = 0; k <= 4; ++k) {
    const double v = ymax * k / 4;
    s += text(left - 6, py(v) + 4, num(v), "text-anchor=\"end\"");
  }
  for (const auto& [d, v] : pts) s += text(px(d), top + ph + 16, num(d), "text-anchor=\"middle\"");
  s += text(left + pw / 2, height - 8, "D (log scale)", "text-anchor=\"middle\"");
  s += text(14, top + ph / 2, "score variance", "text-anchor=\"middle\" transform=\"rotate(-90 14 " +
                                                    std::to_string(top + ph / 2) + ")\"");
  s += "<line x1=\"" + std::to_string(left) + "\" y1=\"" + std::to_string(py(1)) + "\" x2=\"" + std::to_string(left + pw) +
       "\" y2=\"" + std::to_string(py(1)) + "\" stroke=\"#2ca02c\" stroke-dasharray=\"6 4\"/>\n";
  s += text(left + pw - 4, py(1) - 6, "variance 1: scores scaled by 1/&#8730;D", "text-anchor=\"end\" fill=\"#2ca02c\"");
  if (!pts.empty()) {
    std::string line;
    for (const auto& [d, v] : pts) line += std::to_string(px(d)) + "," + std::to_string(py(v)) + " ";
    line.pop_back();
    s += "<polyline points=\"" + line + "\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\"/>\n";
    for (const auto& [d, v] : pts)
      s += "<circle cx=\"" + std::to_string(px(d)) + "\" cy=\"" + std::to_string(py(v)) +
           "\" r=\"4\" fill=\"#1f77b4\"><title>D=" + num(d) + ", variance " + num(v) + "</title></circle>\n";
  }
  if (pts.size() != series.size())
    s += text(left + 8, top + 14, std::to_string(series.size() - pts.size()) + " non-finite point(s) not drawn",
              "fill=\"#d62728\"");
  s += "</svg>\n";
  return s;
}

}  // namespace attncheck::reports
