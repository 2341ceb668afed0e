// The Markdown report of one falsified law, for a person: the law and why it matters, the shape, the worst
// entry, the picture, expected against actual with offending entries in bold, then the inputs in full.
#include <cmath>

#include "render_common.hpp"

namespace attncheck::reports {
using namespace detail;
namespace {

constexpr Index kMaxRows = 32, kMaxCols = 16, kMaxHeads = 4, kMaxDiffs = 20;

bool offending(double expected, double actual, double tol) {
  if (std::isnan(expected) || std::isnan(actual)) return std::isnan(expected) != std::isnan(actual);
  if (std::isinf(expected) || std::isinf(actual)) return expected != actual;
  return tol > 0 ? std::abs(actual - expected) > tol : actual != expected;
}

struct Marking {
  const Tensor<double>* expected = nullptr;  ///< mark entries of the table that differ from this
  double tolerance = 0;
  std::vector<Index> worst;
};

// One head of a [B,H,R,C] tensor as a Markdown table, rows i and columns c (or j for weights).
std::string head_table(const Tensor<double>& t, Index b, Index h, const std::string& corner, const Marking& mark = {}) {
  const Shape& s = t.shape();
  const Index rows = std::min(s.T, kMaxRows), cols = std::min(s.D, kMaxCols);
  std::string md = "| " + corner + " |";
  for (Index c = 0; c < cols; ++c) md += " " + std::to_string(c) + " |";
  if (cols < s.D) md += " … |";
  md += "\n|---|";
  for (Index c = 0; c < cols; ++c) md += "---:|";
  if (cols < s.D) md += "---|";
  md += "\n";
  for (Index i = 0; i < rows; ++i) {
    md += "| **" + std::to_string(i) + "** |";
    for (Index c = 0; c < cols; ++c) {
      const double x = t(b, h, i, c);
      const bool worst = mark.worst.size() == 4 && mark.worst[0] == b && mark.worst[1] == h && mark.worst[2] == i &&
                         mark.worst[3] == c;
      const bool bad = mark.expected && offending((*mark.expected)(b, h, i, c), x, mark.tolerance);
      md += " " + (bad ? "**" + num(x, true) + "**" : num(x)) + (worst ? " ◀ worst" : "") + " |";
    }
    if (cols < s.D) md += " … |";
    md += "\n";
  }
  if (rows < s.T || cols < s.D)
    md += "\n(" + std::to_string(s.T) + "×" + std::to_string(s.D) + "; the first " + std::to_string(rows) + "×" +
          std::to_string(cols) + " shown, all of it is in the JSON report)\n";
  return md;
}

std::string tensor_tables(const Tensor<double>& t, const std::string& corner, const std::vector<Index>& worst = {}) {
  const Shape& s = t.shape();
  std::string md;
  Index shown = 0;
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) {
      if (shown++ >= kMaxHeads) continue;
      if (s.B * s.H > 1) md += "b=" + std::to_string(b) + ", h=" + std::to_string(h) + ":\n\n";
      md += head_table(t, b, h, corner, Marking{nullptr, 0, worst}) + "\n";
    }
  if (shown > kMaxHeads)
    md += "(" + std::to_string(shown - kMaxHeads) + " more heads are in the JSON report)\n\n";
  return md;
}

std::string shape_table(const Problem& p) {
  const Shape& q = p.q.shape();
  std::string md = "| B | H | T_q | T_k | D | scale | causal alignment | dtype |\n|---:|---:|---:|---:|---:|---|---|---|\n";
  md += "| " + std::to_string(q.B) + " | " + std::to_string(q.H) + " | " + std::to_string(q.T) + " | " +
        std::to_string(p.k.shape().T) + " | " + std::to_string(q.D) + " | " +
        (p.scale ? num(*p.scale, true) : std::string("1/√D (default)")) + " | " + std::string(alignment_name(p.alignment)) +
        " | " + std::string(dtype_name(p.dtype)) + " |\n";
  return md;
}

std::string variant_section(const Problem& p, const Problem& v) {
  std::string md = "## The variant problem (what the law changed)\n\n";
  const bool same_shapes = p.q.shape() == v.q.shape() && p.k.shape() == v.k.shape() && p.v.shape() == v.v.shape();
  if (!same_shapes) {
    md += "Its shapes differ from the problem's:\n\n" + shape_table(v) + "\n";
    for (const auto& [name, t] : {std::pair<const char*, const Tensor<double>*>{"q", &v.q}, {"k", &v.k}, {"v", &v.v}})
      md += "### " + std::string(name) + " " + to_string(t->shape()) + "\n\n" + tensor_tables(*t, "i \\ c");
    return md;
  }
  if (p.scale != v.scale)
    md += "- scale: " + (p.scale ? num(*p.scale, true) : "default") + " → " + (v.scale ? num(*v.scale, true) : "default") + "\n";
  if (p.alignment != v.alignment)
    md += "- alignment: " + std::string(alignment_name(p.alignment)) + " → " + std::string(alignment_name(v.alignment)) + "\n";
  if (p.dtype != v.dtype)
    md += "- dtype: " + std::string(dtype_name(p.dtype)) + " → " + std::string(dtype_name(v.dtype)) + "\n";
  Index diffs = 0, listed = 0;
  for (const auto& [name, a, b] : {std::tuple<const char*, const Tensor<double>*, const Tensor<double>*>{"q", &p.q, &v.q},
                                   {"k", &p.k, &v.k},
                                   {"v", &p.v, &v.v}}) {
    const Shape& s = a->shape();
    for (Index bb = 0; bb < s.B; ++bb)
      for (Index h = 0; h < s.H; ++h)
        for (Index i = 0; i < s.T; ++i)
          for (Index c = 0; c < s.D; ++c) {
            const double x = (*a)(bb, h, i, c), y = (*b)(bb, h, i, c);
            if (x == y || (std::isnan(x) && std::isnan(y))) continue;
            ++diffs;
            if (listed++ < kMaxDiffs)
              md += "- `" + std::string(name) + index_string({bb, h, i, c}) + "`: " + num(x, true) + " → " + num(y, true) + "\n";
          }
  }
  if (diffs > kMaxDiffs) md += "- … " + std::to_string(diffs - kMaxDiffs) + " more (all in the JSON report)\n";
  if (diffs == 0 && p.scale == v.scale && p.alignment == v.alignment && p.dtype == v.dtype)
    md += "The variant has the same inputs (the law calls the implementation on it again).\n";
  return md + "\n";
}

}  // namespace

std::string law_markdown(const RunInfo& run, const LawReport& r) {
  const LawResult& res = r.result;
  std::string md = "# `" + res.law + "` falsified by `" + run.implementation + "`\n\n";
  if (res.violation) md += "> " + md_cell(plain_message(res.law, res.violation->message)) + "\n\n";
  md += "**The law.** " + r.summary + "\n\n";
  if (!r.why.empty()) md += "**Why it matters.** " + r.why + "\n\n";

  md += "| | |\n|---|---|\n";
  md += "| implementation | `" + md_cell(run.implementation) + "`: " + md_cell(run.implementation_description) + " |\n";
  md += "| dtype, seed | " + std::string(dtype_name(run.dtype)) + ", " + std::to_string(res.seed) + " |\n";
  md += "| found by | case " + std::to_string(res.cases_run) + ", then " + std::to_string(res.shrink_steps) +
        " shrink steps" + (res.note.empty() ? "" : " (" + md_cell(res.note) + ")") + " |\n";
  if (const auto cmd = replay_command(run, r); !cmd.empty())
    md += "| replay this case | `" + md_cell(cmd) + "` |\n";
  if (const auto cmd = reproduce_command(run, r); !cmd.empty())
    md += "| regenerate it with RapidCheck | `" + md_cell(cmd) + "` |\n";
  md += "\n";

  if (!res.minimal_case) return md + "(no case was recorded: " + (res.violation ? res.violation->message : "") + ")\n";
  const LawCase& c = *res.minimal_case;
  md += "## Shape\n\n" + shape_table(c.problem) + "\n";
  if (!c.params.empty()) {
    md += "Law parameters:";
    for (const auto& [key, value] : c.params) md += " " + key + " = " + num(value, true) + ";";
    md.pop_back();
    md += "\n\n";
  }

  if (res.violation) {
    const Violation& v = *res.violation;
    // Weight-like tensors end in T_k (keys j); outputs end in D (channels c).
    const auto corner_of = [&](const Tensor<double>& t) {
      const bool keys = v.quantity != "output" && t.shape().D == c.problem.k.shape().T;
      return std::string(keys ? "i \\ j" : "i \\ c");
    };
    md += "## What went wrong\n\n";
    md += "The worst entry";
    if (!v.worst_index.empty()) md += ", `" + v.quantity + index_string(v.worst_index) + "`";
    if (v.expected && v.actual && v.worst_index.size() == 4 && v.expected->shape() == v.actual->shape()) {
      const auto& w = v.worst_index;
      const Shape& s = v.expected->shape();
      if (w[0] < s.B && w[1] < s.H && w[2] < s.T && w[3] < s.D)
        md += ": expected " + num((*v.expected)(w[0], w[1], w[2], w[3]), true) + ", actual " +
              num((*v.actual)(w[0], w[1], w[2], w[3]), true);
    }
    md += "; magnitude " + num(v.magnitude, true) + ", tolerance " +
          (v.tolerance > 0 ? num(v.tolerance, true) : std::string("0 (an exact law)")) + ".\n\n";

    const bool has_picture = v.weights || (v.quantity == "weights" && v.actual);
    if (has_picture)
      md += "![weights of the counterexample](" + law_file(res.law, "-weights.svg") +
            ")\n\n*The weights the implementation returned for the head of the worst entry. Cells outlined in red are "
            "future keys, whose weight must be exactly 0" +
            (v.quantity == "weights" ? "; the worst entry is outlined in black.*\n\n" : ".*\n\n");
    if (!v.series.empty()) {
      md += "![score variance against D](" + law_file(res.law, "-variance.svg") + ")\n\n| D | score variance |\n|---:|---:|\n";
      for (const auto& [d, var] : v.series) md += "| " + num(d) + " | " + num(var, true) + " |\n";
      md += "\n";
    }

    if (v.expected && v.actual && v.expected->shape() == v.actual->shape()) {
      const Shape& s = v.expected->shape();
      Index bad = 0;
      for (Index b = 0; b < s.B; ++b)
        for (Index h = 0; h < s.H; ++h)
          for (Index i = 0; i < s.T; ++i)
            for (Index d = 0; d < s.D; ++d) bad += offending((*v.expected)(b, h, i, d), (*v.actual)(b, h, i, d), v.tolerance);
      const bool worst_ok = v.worst_index.size() == 4 && v.worst_index[0] < s.B && v.worst_index[1] < s.H;
      const Index b = worst_ok ? v.worst_index[0] : 0, h = worst_ok ? v.worst_index[1] : 0;
      md += "### Expected against actual (" + v.quantity + ", head b=" + std::to_string(b) + ", h=" + std::to_string(h) +
            ")\n\n";
      md += std::to_string(bad) + " of " + std::to_string(s.numel()) +
            " entries (all heads) are off by more than the tolerance; they are in bold, with every digit.\n\n";
      md += "Expected:\n\n" + head_table(*v.expected, b, h, corner_of(*v.expected)) + "\nActual:\n\n" +
            head_table(*v.actual, b, h, corner_of(*v.actual), Marking{&*v.expected, v.tolerance, v.worst_index}) + "\n";
    } else {
      if (v.expected)
        md += "### Expected " + to_string(v.expected->shape()) + "\n\n" + tensor_tables(*v.expected, corner_of(*v.expected));
      if (v.actual)
        md += "### Actual " + to_string(v.actual->shape()) + "\n\n" +
              tensor_tables(*v.actual, corner_of(*v.actual), v.worst_index);
    }
  }

  md += "## Inputs\n\n";
  for (const auto& [name, t] : {std::pair<const char*, const Tensor<double>*>{"Q", &c.problem.q}, {"K", &c.problem.k},
                                {"V", &c.problem.v}})
    md += "### " + std::string(name) + " " + to_string(t->shape()) + "\n\n" + tensor_tables(*t, "i \\ c");
  if (c.variant) md += variant_section(c.problem, *c.variant);
  if (!c.tags.empty()) {
    md += "Coverage tags of this case:";
    for (const auto& t : c.tags) md += " `" + t + "`";
    md += "\n";
  }
  return md;
}

}  // namespace attncheck::reports
