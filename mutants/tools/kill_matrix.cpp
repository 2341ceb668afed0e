// attncheck-kill-matrix: runs every law against every zoo entry (mutants and controls) at a fixed seed and
// writes the kill matrix with each mutant's minimal counterexample, from that real run, to a markdown report
// and into docs/zoo.md (the zoo page linked from the README) between <!-- kill-matrix:begin --> and
// <!-- kill-matrix:end -->.
//
// Exit codes: 0 every mutant killed and no control flagged; 1 bad arguments; 2 the README markers are
// missing (nothing written to the README); 3 a file could not be read or written; 4 a mutant survived or a
// control was flagged (the report is still written, so the failure can be read).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>

#include "attncheck/allocator.hpp"
#include "attncheck/format.hpp"
#include "attncheck/law.hpp"
#include "attncheck/mutants.hpp"

namespace attncheck {
namespace {

constexpr const char* kBegin = "<!-- kill-matrix:begin -->";
constexpr const char* kEnd = "<!-- kill-matrix:end -->";

struct Options {
  std::uint64_t seed = 1;
  int cases = 100;
  std::string dtype = "float32";
  std::string out = "reports/kill-matrix.md";
  std::string readme = "docs/zoo.md";
  bool no_readme = false;
  std::vector<std::string> only;  ///< restrict to these implementations
  bool readme_given = false;      ///< --readme was passed: a partial (--only) table may go there
};

std::string fmt(double x) { return format_number(x, 6); }

std::string shape_str(const Shape& s) { return to_string(s); }

// All values when there are at most 8, else the shape and the largest magnitude.
std::string values(const Tensor<double>& t) {
  if (t.size() > 8) {
    double m = 0;
    bool nonfinite = false;
    for (Index n = 0; n < t.size(); ++n) {
      nonfinite |= !std::isfinite(t.values()[n]);
      if (std::isfinite(t.values()[n])) m = std::max(m, std::abs(t.values()[n]));
    }
    return std::to_string(t.size()) + " values, max|x| = " + fmt(m) + (nonfinite ? ", some non-finite" : "");
  }
  std::string s = "(";
  for (Index n = 0; n < t.size(); ++n) s += (n ? ", " : "") + fmt(t.values()[n]);
  return s + ")";
}

std::string index_str(const std::vector<Index>& v) {
  std::string s = "[";
  for (size_t n = 0; n < v.size(); ++n) s += (n ? "," : "") + std::to_string(v[n]);
  return s + "]";
}

std::string problem_line(const Problem& p) {
  std::string s = "q " + shape_str(p.q.shape()) + " = " + values(p.q) + ", k " + shape_str(p.k.shape()) + " = " +
                  values(p.k) + ", v = " + values(p.v);
  if (p.q.shape().T != p.k.shape().T)
    s += ", alignment " + std::string(p.alignment == CausalAlignment::TopLeft ? "top-left" : "bottom-right");
  if (!p.key_lengths.empty()) s += ", key lengths " + index_str(p.key_lengths);
  if (p.window) s += ", window " + std::to_string(*p.window);
  if (p.scale) s += ", scale " + fmt(*p.scale);
  if (p.softcap) s += ", softcap " + fmt(*p.softcap);
  const auto list = [&](const char* what, const std::vector<double>& xs) {
    if (xs.empty()) return;
    s += std::string(", ") + what + " (";
    for (std::size_t h = 0; h < xs.size(); ++h) s += (h ? ", " : "") + fmt(xs[h]);
    s += ")";
  };
  list("ALiBi slopes", p.alibi_slopes);
  list("sinks", p.sinks);
  if (p.bias) {  // its values as a [B_b, H_b, T_q, T_k] tensor
    Tensor<double> t(Shape{p.bias->B, p.bias->H, p.bias->T_q, p.bias->T_k});
    std::copy(p.bias->values.begin(), p.bias->values.end(), t.data());
    s += ", bias " + shape_str(t.shape()) + " = " + values(t);
  }
  if (p.rope) {  // its fields and positions
    const auto ids = [](const std::vector<Index>& xs) {
      std::string out;
      for (const Index x : xs) out += (out.empty() ? "" : ", ") + std::to_string(x);
      return "(" + out + ")";
    };
    s += std::string(", rope ") + (p.rope->variant == RopeVariant::half_split ? "half-split" : "interleaved") +
         " rotary_dim " + std::to_string(p.rope->rotary_dim) + " base " + fmt(p.rope->base) +
         (p.rope->factor != 1 ? " factor " + fmt(p.rope->factor) : std::string()) + " at q " +
         ids(p.rope->q_positions) + ", k " + ids(p.rope->k_positions);
  }
  if (p.qk_norm) {  // its sides, eps and weights
    const auto ws = [](const std::vector<double>& xs) {
      std::string out;
      for (const double x : xs) out += (out.empty() ? "" : ", ") + fmt(x);
      return "(" + out + ")";
    };
    s += ", QK-norm eps " + fmt(p.qk_norm->eps) + (p.qk_norm->eps_outside ? " outside the root" : "") +
         (p.qk_norm->q_weight.empty() ? std::string() : " q weights " + ws(p.qk_norm->q_weight)) +
         (p.qk_norm->k_weight.empty() ? std::string() : " k weights " + ws(p.qk_norm->k_weight));
  }
  if (p.dropout)
    s += ", dropout p " + fmt(p.dropout->p) + " seed " + std::to_string(p.dropout->seed) + " offset " +
         std::to_string(p.dropout->offset);
  if (p.temperature) {  // its values as a [B_t, H_t, T_q, 1] tensor
    Tensor<double> t(Shape{p.temperature->B, p.temperature->H, p.temperature->T_q, 1});
    std::copy(p.temperature->values.begin(), p.temperature->values.end(), t.data());
    s += ", temperature [" + std::to_string(p.temperature->B) + "," + std::to_string(p.temperature->H) + "," +
         std::to_string(p.temperature->T_q) + "] = " + values(t);
  }
  if (p.paged) {  // where K and V sit: a paged kernel's bug is in that arithmetic
    const PagedKV pk = p.paged_kv();
    s += ", pages of " + std::to_string(pk.page_size) + " (" + page_layout_name(pk.layout) + ", " +
         page_order_name(p.paged->order) + ", " + std::to_string(pk.num_pages) + " pages, table width " +
         std::to_string(pk.max_pages) + (p.paged->junk_entries ? ", junk entries" : "") + ", free slots " +
         page_fill_name(pk.fill) + ")";
  }
  if (p.d_output) s += ", dO = " + values(*p.d_output);
  return s;
}

// Markdown table cells must not contain a bare '|'.
std::string cell(std::string s) {
  std::string r;
  for (char ch : s) r += ch == '|' ? std::string("\\|") : std::string(1, ch);
  return r;
}

// The reference core, as a control row above the zoo: a law that flags it has a false alarm, not a catch.
const Mutant& reference_row() {
  static const Mutant r{.impl = reference_implementation(),
                        .bug = "the reference core itself",
                        .control = true,
                        .minimal_shape = {},
                        .why_minimal = "a control: no case should fail",
                        .killed_by = {}};
  return r;
}

struct Row {
  const Mutant* m = nullptr;
  std::vector<LawResult> results;  // one per law, in laws() order
  const LawResult* minimal = nullptr;
  double seconds = 0;
};

std::string render(const std::vector<Row>& rows, const Options& o, bool full_report) {
  std::ostringstream md;
  const auto& ls = laws();
  md << "Generated by `attncheck-kill-matrix --seed " << o.seed << " --cases " << o.cases << " --dtype " << o.dtype
     << "` from a real run; do not edit by hand. A cell reads **K** c/s: killed, the first failing case was "
        "case c, and shrinking took s accepted steps; `·` the law held for all "
     << o.cases
     << " cases; `n/a` the law does not apply. Controls are correct implementations: their rows must "
        "be all `·`.\n\n";
  md << "| implementation |";
  for (size_t n = 0; n < ls.size(); ++n) md << " " << n + 1 << " |";
  md << " minimal shape (expected) |\n|---|";
  for (size_t n = 0; n < ls.size(); ++n) md << "---|";
  md << "---|\n";
  for (const Row& r : rows) {
    md << "| `" << r.m->impl->name() << "` |";
    for (const LawResult& lr : r.results) {
      if (lr.status == LawStatus::falsified)
        md << " **K** " << lr.cases_run << "/" << lr.shrink_steps << " |";
      else if (lr.status == LawStatus::held)
        md << " · |";
      else
        md << " n/a |";
    }
    if (r.m->control)
      md << " control |\n";
    else if (!r.minimal)
      md << " **survived** |\n";
    else {
      const Problem& p = failing_problem(*r.minimal);  // the derived call that computed wrongly, when a law says
      const Shape got = p.q.shape();
      md << " " << shape_str(got);
      if (p.k.shape().T != got.T) md << " T_k=" << p.k.shape().T;
      if (p.kv_heads() != got.H) md << " H_kv=" << p.kv_heads();
      if (p.v_dim() != got.D) md << " D_v=" << p.v_dim();
      md << (r.m->is_minimal(got) ? " ✓" : " ✗ expected " + shape_str(r.m->minimal_shape)) << " |\n";
    }
  }
  md << "\nLaws: ";
  for (size_t n = 0; n < ls.size(); ++n) md << (n ? ", " : "") << n + 1 << " `" << ls[n].name << "`";
  md << ".\n\n### Minimal counterexamples\n\nFor each mutant, the smallest shrunk case over the laws that killed it "
        "(fewest q elements, then k elements, then options such as a window, key lengths or a score modifier, then nonzero inputs, "
        "then the largest margin, then law order); shapes are [B,H,T,D].\n\n";
  for (const Row& r : rows) {
    if (r.m->control) continue;
    md << "- `" << r.m->impl->name() << "` — " << r.m->bug << ".";
    if (!r.minimal) {
      md << " **Not killed.**\n";
      continue;
    }
    const LawResult& lr = *r.minimal;
    const Violation& v = *lr.violation;
    md << " Killed by `" << lr.law << "` on " << problem_line(failing_problem(lr)) << ": " << cell(v.message);
    if (!v.worst_index.empty())
      md << " (" << v.quantity << " " << index_str(v.worst_index) << ", off by " << fmt(v.magnitude) << ", allowed "
         << fmt(v.tolerance) << ")";
    md << ". Expected minimal " << shape_str(r.m->minimal_shape) << ": " << r.m->why_minimal << ".\n";
  }
  if (full_report) {
    md << "\n### Every falsification\n\nEach law that failed on an implementation, with its shrunk case (q and k "
          "shapes), the RapidCheck reproduce string and the violation.\n\n| implementation | law | q | T_k | "
          "alignment | reproduce | violation |\n|---|---|---|---|---|---|---|\n";
    for (const Row& r : rows)
      for (const LawResult& lr : r.results) {
        if (lr.status != LawStatus::falsified) continue;
        md << "| `" << r.m->impl->name() << "` | `" << lr.law << "` | ";
        if (lr.minimal_case) {
          const Problem& p = lr.minimal_case->problem;
          md << shape_str(p.q.shape()) << " | " << p.k.shape().T << " | "
             << (p.alignment == CausalAlignment::TopLeft ? "top-left" : "bottom-right");
        } else {
          md << " | | ";
        }
        md << " | `" << lr.reproduce << "` | " << cell(lr.violation ? lr.violation->message : "") << " |\n";
      }
    md << "\n### Time of this run\n\nWall-clock seconds per implementation over all laws: the only part of this "
          "report that changes from run to run (the README copy leaves it out).\n\n| implementation | seconds |\n"
          "|---|---|\n";
    for (const Row& r : rows)
      md << "| `" << r.m->impl->name() << "` | " << fmt(std::round(r.seconds * 100) / 100) << " |\n";
  }
  return md.str();
}

bool read_file(const std::string& path, std::string& text) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream s;
  s << in.rdbuf();
  text = s.str();
  return true;
}

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  return bool(out);
}

int run(const Options& o) {
  const std::optional<DType> dtype = parse_dtype(o.dtype);
  if (!dtype) {
    std::cerr << "attncheck-kill-matrix: --dtype is '" << o.dtype
              << "', expected float32, float64, float16 or "
                 "bfloat16\n";
    return 1;
  }
  // Check the README first, so a missing marker costs no run.
  std::string readme;
  const bool write_readme = !o.no_readme && (o.only.empty() || o.readme_given);
  if (write_readme) {
    if (!read_file(o.readme, readme)) {
      std::cerr << "attncheck-kill-matrix: cannot read " << o.readme
                << "\n---> HINT: run from the repository root, "
                   "or pass --readme PATH (or --no-readme)\n";
      return 3;
    }
    const auto b = readme.find(kBegin), e = readme.find(kEnd);
    if (b == std::string::npos || e == std::string::npos || e < b) {
      std::cerr << "attncheck-kill-matrix: " << o.readme << " lacks the markers " << kBegin << " and " << kEnd
                << " (in that order)\n---> HINT: add both lines where the table belongs; only the text between "
                   "them is replaced\n";
      return 2;
    }
  }
  if (laws().empty()) {
    std::cerr << "attncheck-kill-matrix: no laws are compiled in\n";
    return 4;
  }

  std::vector<const Mutant*> entries{&reference_row()};
  for (const Mutant& m : mutant_zoo()) entries.push_back(&m);
  if (!o.only.empty()) {
    std::vector<const Mutant*> kept;
    for (const std::string& name : o.only) {
      const auto it =
          std::find_if(entries.begin(), entries.end(), [&](const Mutant* m) { return m->impl->name() == name; });
      if (it == entries.end()) {
        std::cerr << "attncheck-kill-matrix: --only " << name << " is not reference nor a zoo entry\n";
        return 1;
      }
      kept.push_back(*it);
    }
    entries = kept;
  }

  std::vector<Row> rows;
  bool ok = true;
  for (const Mutant* mp : entries) {
    const Mutant& m = *mp;
    Row r;
    r.m = &m;
    for (const Law& law : laws()) {
      RunOptions ro;
      ro.cases = o.cases;
      ro.seed = o.seed;
      ro.gen.dtype = *dtype;
      r.results.push_back(run_law(law, *m.impl, mutant_options(m, ro)));
      r.seconds += r.results.back().seconds;
    }
    r.minimal = smallest_counterexample(r.results);
    const bool flagged = r.minimal != nullptr;
    // A mutant's smallest case over every law must be its minimal shape (the table's ✓; the kill tests check
    // the laws it lists, on 21 seeds, and the k side too).
    const bool short_of = flagged && !m.control && !m.is_minimal(failing_problem(*r.minimal).q.shape());
    if (flagged == m.control || short_of) ok = false;
    std::cerr << (m.control ? (flagged ? "FLAGGED " : "clean   ")
                            : (flagged ? (short_of ? "NOT MINIMAL" : "killed  ") : "SURVIVED")) << " "
              << m.impl->name() << " (" << fmt(r.seconds) << " s)\n";
    rows.push_back(std::move(r));
  }

  const std::string table = render(rows, o, false);
  const std::string report = "# Kill matrix\n\n" + render(rows, o, true);
  if (!write_file(o.out, report)) {
    std::cerr << "attncheck-kill-matrix: cannot write " << o.out << "\n---> HINT: does its folder exist?\n";
    return 3;
  }
  std::cerr << "wrote " << o.out << "\n";
  if (write_readme) {
    const auto b = readme.find(kBegin) + std::string(kBegin).size(), e = readme.find(kEnd);
    readme = readme.substr(0, b) + "\n" + table + readme.substr(e);
    if (!write_file(o.readme, readme)) {
      std::cerr << "attncheck-kill-matrix: cannot write " << o.readme << "\n";
      return 3;
    }
    std::cerr << "updated " << o.readme << " between the kill-matrix markers\n";
  }
  return ok ? 0 : 4;
}

}  // namespace
}  // namespace attncheck

int main(int argc, char** argv) {
  attncheck::keep_freed_memory();
  attncheck::Options o;
  CLI::App app{"Runs every law against every mutant and control of the zoo and writes the kill matrix"};
  app.add_option("--seed", o.seed, "RapidCheck seed of every run (the same seed reproduces the table)")
      ->capture_default_str();
  app.add_option("--cases", o.cases, "cases per law and implementation")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--dtype", o.dtype, "float32, float64, float16 or bfloat16")->capture_default_str();
  app.add_option("--out", o.out, "the markdown report to write")->capture_default_str();
  app.add_option("--readme", o.readme, "the page whose kill-matrix block is replaced")->capture_default_str();
  app.add_flag("--no-readme", o.no_readme, "write only the report");
  app.add_option("--only", o.only,
                 "only these implementations (repeatable); the default README is then left "
                 "alone, an explicit --readme is written");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 1;
  }
  o.readme_given = app.count("--readme") > 0;
  return attncheck::run(o);
}
