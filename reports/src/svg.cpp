// The pictures of a report: a heatmap of one head's weights with the future cells outlined (a leak shows at
// a glance), and the score variance swept over D against what each scale mistake predicts. Integer
// coordinates keep the output deterministic.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "attncheck/format.hpp"
#include "render_common.hpp"

namespace attncheck::reports {
namespace detail {

std::string hex_color(int r, int g, int b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", r, g, b);
  return buf;
}

std::string mix_color(double t, int r0, int g0, int b0, int r1, int g1, int b1) {
  t = std::clamp(t, 0.0, 1.0);
  const auto mix = [&](int a, int b) { return static_cast<int>(std::lround(a + (b - a) * t)); };
  return hex_color(mix(r0, r1), mix(g0, g1), mix(b0, b1));
}

std::string weight_color(double w) {
  if (!std::isfinite(w)) return "#e377c2";
  return mix_color(w, 255, 255, 255, 8, 48, 107);
}

std::string cell_text(double w) {
  if (!std::isfinite(w)) return format_number(w, 2);  // "nan", "inf", "-inf" as everywhere else
  char buf[32];  // fixed two decimals, not format_number's significant digits: cells line up
  std::snprintf(buf, sizeof buf, "%.2f", w);
  std::string s = buf;
  if (w != 0 && (s == "0.00" || s == "-0.00")) s = w > 0 ? "&gt;0" : "&lt;0";  // a tiny leak must not read as zero
  if (w == 0) s = "0";
  return s;
}

std::string svg_rect(int x, int y, int w, int h, const std::string& attrs) {
  return "<rect x=\"" + std::to_string(x) + "\" y=\"" + std::to_string(y) + "\" width=\"" + std::to_string(w) +
         "\" height=\"" + std::to_string(h) + "\" " + attrs + "/>\n";
}

std::string svg_text(int x, int y, const std::string& s, const std::string& attrs) {
  return "<text x=\"" + std::to_string(x) + "\" y=\"" + std::to_string(y) + "\"" + (attrs.empty() ? "" : " " + attrs) +
         ">" + s + "</text>\n";
}

std::string svg_line(int x1, int y1, int x2, int y2, const std::string& attrs) {
  return "<line x1=\"" + std::to_string(x1) + "\" y1=\"" + std::to_string(y1) + "\" x2=\"" + std::to_string(x2) +
         "\" y2=\"" + std::to_string(y2) + "\" " + attrs + "/>\n";
}

std::string svg_open(int width, int height, const std::string& title) {
  const std::string w = std::to_string(width), h = std::to_string(height);
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + w + "\" height=\"" + h + "\" viewBox=\"0 0 " + w + " " +
         h + "\" font-family=\"sans-serif\" font-size=\"12\">\n<title>" + xml_escape(title) + "</title>\n" +
         svg_rect(0, 0, width, height, "fill=\"white\"");
}

}  // namespace detail

using namespace detail;
std::string weights_svg(const Tensor<double>& weights, Index b, Index h, const Visibility& vis,
                        const std::vector<Index>& worst_index, const std::string& title) {
  const Index Tq = weights.shape().T, Tk = weights.shape().D;
  const Index longest = std::max(Tq, Tk);
  const int cell = longest <= 8 ? 48 : longest <= 16 ? 32 : std::max(4, static_cast<int>(512 / longest));
  const int left = 56, top = 64, legend = 170;
  int width = left + static_cast<int>(Tk) * cell + legend;
  const int height = top + std::max(static_cast<int>(Tq) * cell, 190) + 24;
  const bool has_worst = worst_index.size() == 4 && worst_index[0] == b && worst_index[1] == h;

  const std::string caption = title + ": weights of head b=" + std::to_string(b) + ", h=" + std::to_string(h) + " [" +
                              std::to_string(Tq) + "," + std::to_string(Tk) + "]";
  // Wide enough for the heading (bold 12px sans-serif: about 7.5 px a character).
  width = std::max(width, 16 + static_cast<int>(caption.size()) * 15 / 2);
  std::string s = svg_open(width, height, caption);
  s += svg_text(8, 18, xml_escape(caption), "font-weight=\"bold\"");
  s += svg_text(left, 40, "key j &#8594;");
  s += svg_text(14, top + 12, "query i", "transform=\"rotate(90 14 " + std::to_string(top + 12) + ")\"");
  const bool labels = cell >= 14, values = cell >= 32;
  for (Index j = 0; j < Tk && labels; ++j)
    s += svg_text(left + static_cast<int>(j) * cell + cell / 2, top - 6, std::to_string(j), "text-anchor=\"middle\"");
  for (Index i = 0; i < Tq && labels; ++i)
    s += svg_text(left - 6, top + static_cast<int>(i) * cell + cell / 2 + 4, std::to_string(i), "text-anchor=\"end\"");

  for (Index i = 0; i < Tq; ++i)
    for (Index j = 0; j < Tk; ++j) {
      const double w = weights(b, h, i, j);
      const int x = left + static_cast<int>(j) * cell, y = top + static_cast<int>(i) * cell;
      s += svg_rect(x, y, cell, cell, "fill=\"" + weight_color(w) + "\" stroke=\"#bbbbbb\" stroke-width=\"1\"");
      if (values) {
        const bool dark = std::isfinite(w) && w > 0.5;
        s += svg_text(x + cell / 2, y + cell / 2 + 4, cell_text(w),
                  std::string("text-anchor=\"middle\" font-size=\"11\" fill=\"") + (dark ? "white" : "black") + "\"");
      }
    }
  // Outlines after the fills so neighbouring cells do not paint over them.
  // The red outline sits inside the cell, clear of the black worst-entry outline on its edge.
  const int inset = cell >= 14 ? 3 : 1;
  for (Index i = 0; i < Tq; ++i)
    for (Index j = 0; j < Tk; ++j)
      if (!vis.visible(i, j))
        s += svg_rect(left + static_cast<int>(j) * cell + inset, top + static_cast<int>(i) * cell + inset, cell - 2 * inset,
                cell - 2 * inset, "fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\"");
  if (has_worst && worst_index[2] < Tq && worst_index[3] < Tk)
    s += svg_rect(left + static_cast<int>(worst_index[3]) * cell, top + static_cast<int>(worst_index[2]) * cell, cell, cell,
              "fill=\"none\" stroke=\"black\" stroke-width=\"3\"");

  // Legend: the colour scale, then what the outlines mean.
  const int lx = left + static_cast<int>(Tk) * cell + 24;
  for (int step = 0; step <= 10; ++step)
    s += svg_rect(lx, top + (10 - step) * 10, 16, 10, "fill=\"" + weight_color(step / 10.0) + "\"");
  s += svg_rect(lx, top, 16, 110, "fill=\"none\" stroke=\"#bbbbbb\"");
  s += svg_text(lx + 22, top + 8, "1");
  s += svg_text(lx + 22, top + 112, "0");
  s += svg_rect(lx, top + 124, 16, 16, "fill=\"white\" stroke=\"#d62728\" stroke-width=\"2\"");
  s += svg_text(lx + 22, top + 136, hidden_key_label(vis) + ": must be 0");
  s += svg_rect(lx, top + 148, 16, 16, "fill=\"#e377c2\"");
  s += svg_text(lx + 22, top + 160, "NaN or Inf");
  if (has_worst) {
    s += svg_rect(lx, top + 172, 16, 16, "fill=\"white\" stroke=\"black\" stroke-width=\"3\"");
    s += svg_text(lx + 22, top + 184, "worst entry");
  }
  s += "</svg>\n";
  return s;
}

std::string variance_svg(const std::vector<VariancePoint>& series, const std::string& title) {
  const int width = 860, height = 400, left = 64, right = 300, top = 40, bottom = 52;  // the legend on the right
  const int pw = width - left - right, ph = height - top - bottom;
  // Points a log axis can place; others are counted in a note.
  std::vector<VariancePoint> pts;
  for (const auto& p : series)
    if (std::isfinite(p.D) && p.D > 0 && std::isfinite(p.variance) && p.variance > 0) pts.push_back(p);
  // Both axes in log2, so the bug lines (variance D and 1/D) are straight, at ±45° when the decades match.
  double x0 = 0, x1 = 7;  // D = 1 .. 128 when there is nothing to plot
  if (!pts.empty()) {
    x0 = x1 = std::log2(pts.front().D);
    for (const auto& p : pts) x0 = std::min(x0, std::log2(p.D)), x1 = std::max(x1, std::log2(p.D));
    if (x1 - x0 < 1) x0 -= 1, x1 += 1;
  }
  // The y range holds the lines 1, D and 1/D over the swept D, and every point and band.
  double y0 = -x1, y1 = x1;
  for (const auto& p : pts) {
    y0 = std::min(y0, std::log2(p.variance));
    y1 = std::max(y1, std::log2(p.variance));
    if (std::isfinite(p.low) && p.low > 0) y0 = std::min(y0, std::log2(p.low));
    if (std::isfinite(p.high) && p.high > 0) y1 = std::max(y1, std::log2(p.high));
  }
  y0 = std::floor(y0) - 0.5, y1 = std::ceil(y1) + 0.5;
  const auto px = [&](double log2_d) { return left + static_cast<int>(std::lround((log2_d - x0) / (x1 - x0) * pw)); };
  const auto py = [&](double log2_v) {
    return top + ph - static_cast<int>(std::lround((std::clamp(log2_v, y0, y1) - y0) / (y1 - y0) * ph));
  };
  const auto pow2_label = [](int e) {
    return e >= 0 ? std::to_string(1L << std::min(e, 62)) : "1/" + std::to_string(1L << std::min(-e, 62));
  };

  std::string s = svg_open(width, height, title);
  s += svg_text(8, 20, xml_escape(title), "font-weight=\"bold\"");
  // Grid and axes: a line per power of 2 (every other one when the range is wide).
  const int ystep = (y1 - y0) > 16 ? 2 : 1;
  for (int e = static_cast<int>(std::ceil(y0)); e <= y1; ++e) {
    if (e % ystep) continue;
    s += svg_line(left, py(e), left + pw, py(e), "stroke=\"#e5e5e5\"");
    s += svg_text(left - 6, py(e) + 4, pow2_label(e), "text-anchor=\"end\"");
  }
  for (int e = static_cast<int>(std::ceil(x0)); e <= x1; ++e) {
    s += svg_line(px(e), top, px(e), top + ph, "stroke=\"#e5e5e5\"");
    s += svg_text(px(e), top + ph + 16, pow2_label(e), "text-anchor=\"middle\"");
  }
  s += svg_rect(left, top, pw, ph, "fill=\"none\" stroke=\"black\"");
  s += svg_text(left + pw / 2, height - 14, "head dimension D (log scale)", "text-anchor=\"middle\"");
  s += svg_text(16, top + ph / 2, "score variance (log scale)",
                "text-anchor=\"middle\" transform=\"rotate(-90 16 " + std::to_string(top + ph / 2) + ")\"");

  // The measurement under the guide lines, so a point on a line shows the line through it.
  if (!pts.empty()) {
    // The 95% band: lows left to right, then highs back.
    std::string band, line;
    for (const auto& p : pts) {
      const double lo = std::isfinite(p.low) && p.low > 0 ? std::log2(p.low) : y0;
      band += std::to_string(px(std::log2(p.D))) + "," + std::to_string(py(lo)) + " ";
    }
    for (auto it = pts.rbegin(); it != pts.rend(); ++it) {
      const double hi = std::isfinite(it->high) && it->high > 0 ? std::log2(it->high) : y1;
      band += std::to_string(px(std::log2(it->D))) + "," + std::to_string(py(hi)) + " ";
    }
    band.pop_back();
    s += "<polygon points=\"" + band + "\" fill=\"#1f77b4\" fill-opacity=\"0.2\" stroke=\"none\"/>\n";
    for (const auto& p : pts)
      line += std::to_string(px(std::log2(p.D))) + "," + std::to_string(py(std::log2(p.variance))) + " ";
    line.pop_back();
    s += "<polyline points=\"" + line + "\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\"/>\n";
  }
  // What each mistake predicts: variance 1 (correct), D (scale forgotten), 1/D (scale applied twice).
  struct Guide {
    double slope;
    const char* colour;
    const char* dash;
    const char* label;
  };
  const Guide guides[] = {{0, "#2ca02c", "6 4", "1: scaled by 1/&#8730;D (correct)"},
                          {1, "#d62728", "2 4", "D: scale forgotten"},
                          {-1, "#ff7f0e", "2 4", "1/D: scale applied twice"}};
  int legend_y = top + 18;
  const int lx = left + pw + 20;
  std::string legend;  // beside the plot, where no data can hide it
  for (const auto& g : guides) {
    s += "<line x1=\"" + std::to_string(px(x0)) + "\" y1=\"" + std::to_string(py(g.slope * x0)) + "\" x2=\"" +
         std::to_string(px(x1)) + "\" y2=\"" + std::to_string(py(g.slope * x1)) + "\" stroke=\"" + g.colour +
         "\" stroke-width=\"2\" stroke-dasharray=\"" + g.dash + "\"/>\n";
    legend += svg_line(lx, legend_y - 4, lx + 30, legend_y - 4,
                       std::string("stroke=\"") + g.colour + "\" stroke-width=\"2\" stroke-dasharray=\"" + g.dash + "\"");
    legend += svg_text(lx + 36, legend_y, g.label);
    legend_y += 18;
  }

  if (!pts.empty()) {
    for (const auto& p : pts)
      s += "<circle cx=\"" + std::to_string(px(std::log2(p.D))) + "\" cy=\"" + std::to_string(py(std::log2(p.variance))) +
           "\" r=\"4\" fill=\"#1f77b4\"><title>D=" + num(p.D) + ": variance " + num(p.variance) + ", 95% band [" +
           num(p.low) + ", " + num(p.high) + "]</title></circle>\n";
    legend += svg_rect(lx, legend_y - 10, 30, 10, "fill=\"#1f77b4\" fill-opacity=\"0.2\"");
    legend += svg_line(lx, legend_y - 5, lx + 30, legend_y - 5, "stroke=\"#1f77b4\" stroke-width=\"2\"");
    legend += svg_text(lx + 36, legend_y, "measured: median of group means");
    legend += svg_text(lx + 36, legend_y + 16, "and its 95% band (order statistics)");
    legend_y += 18;
  }
  s += legend;
  if (pts.size() != series.size())
    s += svg_text(left + pw - 8, top + ph - 8,
                  std::to_string(series.size() - pts.size()) + " point(s) not drawn (non-finite or not positive)",
                  "text-anchor=\"end\" fill=\"#d62728\"");
  s += "</svg>\n";
  return s;
}

}  // namespace attncheck::reports
