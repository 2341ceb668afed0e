// The machine-readable side of a report: LAW.json (also the corpus entry), summary.json, junit.xml, the
// replay commands, and the list of files a run writes.
#include <charconv>
#include <cmath>

#include "attncheck/format.hpp"
#include "render_common.hpp"

namespace attncheck::reports {
namespace detail {

std::string num(double x, bool full) {
  if (!full || !std::isfinite(x)) return format_number(x, 6);
  char buf[64];  // the shortest text that reads back as exactly x
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

std::string shell_quote(std::string_view s) {
  const bool plain = !s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                       "0123456789_./:=,+-@%") == std::string_view::npos;
  if (plain) return std::string(s);
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string xml_escape(std::string_view s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\n' || c == '\t') out += c;
    }
  }
  return out;
}

std::string md_cell(std::string_view s) {
  std::string out;
  for (const char c : s) {
    if (c == '|') out += "\\|";
    else if (c == '\n') out += ' ';
    else out += c;
  }
  return out;
}

std::string plain_message(std::string_view law, std::string_view message) {
  const std::string prefix = std::string(law) + ": ";
  return std::string(message.starts_with(prefix) ? message.substr(prefix.size()) : message);
}

std::string_view status_name(LawStatus s) {
  switch (s) {
    case LawStatus::held: return "held";
    case LawStatus::falsified: return "falsified";
    case LawStatus::not_applicable: return "n/a";
  }
  return "?";
}

std::string index_string(const std::vector<Index>& idx) {
  std::string out = "[";
  for (std::size_t n = 0; n < idx.size(); ++n) out += (n ? "," : "") + std::to_string(idx[n]);
  return out + "]";
}

}  // namespace detail

using namespace detail;

namespace {

Json generator_json(const RunInfo& run) {
  return Json{{"cases", run.cases},         {"max_size", run.max_size},     {"max_B", run.gen.max_B},
              {"max_H", run.gen.max_H},     {"max_T", run.gen.max_T},       {"max_T_tail", run.gen.max_T_tail},
              {"max_D", run.gen.max_D}};
}

Json shape_json(const Problem& p) {
  const Shape& q = p.q.shape();
  Json s{{"B", q.B}, {"H", q.H}, {"T", q.T}, {"D", q.D}};
  if (p.k.shape().T != q.T) s["T_k"] = p.k.shape().T;
  return s;
}

Json coverage_json(const std::map<std::string, int>& coverage) {
  Json c = Json::object();
  for (const auto& [tag, n] : coverage) c[tag] = n;
  return c;
}

}  // namespace

Formats parse_formats(std::string_view list) {
  Formats f{false, false, false};
  std::size_t start = 0;
  bool any = false;
  while (start <= list.size()) {
    const std::size_t end = std::min(list.find(',', start), list.size());
    const std::string_view item = list.substr(start, end - start);
    if (item == "md") f.md = true;
    else if (item == "json") f.json = true;
    else if (item == "junit") f.junit = true;
    else
      throw std::invalid_argument("--format: expected a comma-separated list of md, json, junit but got \"" +
                                  std::string(item) + "\" in \"" + std::string(list) + "\"");
    any = true;
    start = end + 1;
  }
  if (!any) throw std::invalid_argument("--format: expected at least one of md, json, junit");
  return f;
}

std::string law_file(std::string_view law, std::string_view suffix) { return std::string(law) + std::string(suffix); }

std::string replay_command(const RunInfo& run, const LawReport& r) {
  if (r.replay_file.empty()) return {};
  return run.program + " check --impl " + shell_quote(run.implementation) + " --replay " + shell_quote(r.replay_file);
}

std::string reproduce_command(const RunInfo& run, const LawReport& r) {
  if (r.result.reproduce.empty()) return {};
  // The reproduce string replays RapidCheck's random choices; the generator bounds must match the run's.
  return run.program + " check --impl " + shell_quote(run.implementation) + " --property " +
         shell_quote(r.result.law) + " --dtype " + std::string(dtype_name(run.dtype)) +
         " --max-B " + std::to_string(run.gen.max_B) + " --max-H " + std::to_string(run.gen.max_H) +
         " --max-T " + std::to_string(run.gen.max_T_tail) + " --max-D " + std::to_string(run.gen.max_D) +
         " --reproduce " + shell_quote(r.result.reproduce);
}

Json law_document(const RunInfo& run, const LawReport& r) {
  const LawResult& res = r.result;
  Json doc{{"format", "attncheck-counterexample/1"},
           {"law", res.law},
           {"summary", r.summary},
           {"implementation", run.implementation},
           {"status", status_name(res.status)},
           {"dtype", dtype_name(run.dtype)},
           {"seed", res.seed},
           {"reproduce", res.reproduce},
           {"reproduce_command", reproduce_command(run, r)},
           {"replay_command", replay_command(run, r)},
           {"cases_run", res.cases_run},
           {"shrink_steps", res.shrink_steps},
           {"generator", generator_json(run)},
           {"numbers", kNumberEncoding}};
  if (res.minimal_case) doc["shape"] = shape_json(res.minimal_case->problem);
  doc["violation"] = res.violation ? to_json(*res.violation) : Json(nullptr);
  doc["case"] = res.minimal_case ? to_json(*res.minimal_case) : Json(nullptr);
  return doc;
}

namespace {

Json summary_json(const RunInfo& run, const std::vector<LawReport>& laws, const Formats& formats,
                  const std::vector<std::string>& law_files) {
  int held = 0, falsified = 0, na = 0;
  Json entries = Json::array();
  for (const auto& r : laws) {
    const LawResult& res = r.result;
    (res.status == LawStatus::held ? held : res.status == LawStatus::falsified ? falsified : na) += 1;
    Json e{{"law", res.law}, {"status", status_name(res.status)}, {"cases_run", res.cases_run},
           {"shrink_steps", res.shrink_steps}};
    if (!res.note.empty()) e["note"] = res.note;
    if (res.status == LawStatus::falsified) {
      e["message"] = res.violation ? res.violation->message : std::string();
      if (formats.json) e["report_json"] = law_file(res.law, ".json");
      if (formats.md) e["report_md"] = law_file(res.law, ".md");
      e["replay_command"] = replay_command(run, r);
    }
    e["coverage"] = coverage_json(res.coverage);
    entries.push_back(std::move(e));
  }
  return Json{{"format", "attncheck-summary/1"},
              {"implementation", run.implementation},
              {"description", run.implementation_description},
              {"status", falsified ? "falsified" : "held"},
              {"dtype", dtype_name(run.dtype)},
              {"seed", run.seed},
              {"generator", generator_json(run)},
              {"counts", {{"held", held}, {"falsified", falsified}, {"not_applicable", na}}},
              {"laws", std::move(entries)},
              {"files", law_files}};
}

std::string summary_markdown(const RunInfo& run, const std::vector<LawReport>& laws, const Formats& formats) {
  int falsified = 0, applicable = 0;
  for (const auto& r : laws) {
    falsified += r.result.status == LawStatus::falsified;
    applicable += r.result.status != LawStatus::not_applicable;
  }
  std::string md = "# attncheck: `" + run.implementation + "`: " +
                   (falsified ? std::to_string(falsified) + " of " + std::to_string(applicable) + " laws falsified"
                              : "all " + std::to_string(applicable) + " laws held") +
                   "\n\n";
  md += run.implementation_description + "\n\n";
  md += "dtype " + std::string(dtype_name(run.dtype)) + ", seed " + std::to_string(run.seed) + ", " +
        std::to_string(run.cases) + " cases per law, B ≤ " + std::to_string(run.gen.max_B) + ", H ≤ " +
        std::to_string(run.gen.max_H) + ", T ≤ " + std::to_string(run.gen.max_T) + " (tail to " +
        std::to_string(run.gen.max_T_tail) + "), D ≤ " + std::to_string(run.gen.max_D) + "\n\n";
  md += "| law | result | cases | shrink steps | report |\n|---|---|---:|---:|---|\n";
  for (const auto& r : laws) {
    const LawResult& res = r.result;
    std::string report;
    if (res.status == LawStatus::falsified && formats.md) report = "[" + res.law + ".md](" + res.law + ".md)";
    else if (res.status == LawStatus::falsified && formats.json) report = "[" + res.law + ".json](" + res.law + ".json)";
    else if (!res.note.empty()) report = md_cell(res.note);
    const std::string status = res.status == LawStatus::falsified ? "**falsified**" : std::string(status_name(res.status));
    md += "| `" + res.law + "` | " + status + " | " + std::to_string(res.cases_run) + " | " +
          std::to_string(res.shrink_steps) + " | " + report + " |\n";
  }
  if (falsified) {
    md += "\n## Falsified\n\n";
    for (const auto& r : laws) {
      if (r.result.status != LawStatus::falsified) continue;
      md += "- **" + r.result.law + "**: " +
            md_cell(plain_message(r.result.law, r.result.violation ? r.result.violation->message : "")) + "\n";
      if (const auto cmd = replay_command(run, r); !cmd.empty()) md += "  replay: `" + cmd + "`\n";
    }
  }
  return md;
}

}  // namespace

std::string junit_xml(const RunInfo& run, const std::vector<LawReport>& laws) {
  int failures = 0, skipped = 0;
  for (const auto& r : laws) {
    failures += r.result.status == LawStatus::falsified;
    skipped += r.result.status == LawStatus::not_applicable;
  }
  const std::string suite = "attncheck " + run.implementation + " " + std::string(dtype_name(run.dtype));
  const std::string counts = " tests=\"" + std::to_string(laws.size()) + "\" failures=\"" + std::to_string(failures) +
                             "\" errors=\"0\" skipped=\"" + std::to_string(skipped) + "\"";
  std::string x = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  x += "<testsuites name=\"attncheck\"" + counts + ">\n";
  x += "  <testsuite name=\"" + xml_escape(suite) + "\"" + counts + ">\n";
  x += "    <properties>\n";
  x += "      <property name=\"implementation\" value=\"" + xml_escape(run.implementation) + "\"/>\n";
  x += "      <property name=\"dtype\" value=\"" + std::string(dtype_name(run.dtype)) + "\"/>\n";
  x += "      <property name=\"seed\" value=\"" + std::to_string(run.seed) + "\"/>\n";
  x += "      <property name=\"cases\" value=\"" + std::to_string(run.cases) + "\"/>\n";
  x += "    </properties>\n";
  for (const auto& r : laws) {
    const LawResult& res = r.result;
    x += "    <testcase classname=\"attncheck." + xml_escape(slug(run.implementation)) + "\" name=\"" +
         xml_escape(res.law) + "\"";
    if (res.status == LawStatus::held) {
      x += "/>\n";
      continue;
    }
    x += ">\n";
    if (res.status == LawStatus::not_applicable) {
      x += "      <skipped message=\"" + xml_escape(res.note) + "\"/>\n";
    } else {
      const std::string message = res.violation ? res.violation->message : "falsified";
      std::string body = message + "\n";
      if (res.violation) {
        body += "worst " + res.violation->quantity + " index " + index_string(res.violation->worst_index) +
                ": magnitude " + num(res.violation->magnitude, true) + ", tolerance " +
                num(res.violation->tolerance, true) + "\n";
      }
      if (const auto cmd = replay_command(run, r); !cmd.empty()) body += "replay: " + cmd + "\n";
      if (const auto cmd = reproduce_command(run, r); !cmd.empty()) body += "reproduce: " + cmd + "\n";
      x += "      <failure type=\"falsified\" message=\"" + xml_escape(message) + "\">" + xml_escape(body) +
           "</failure>\n";
    }
    x += "    </testcase>\n";
  }
  x += "  </testsuite>\n</testsuites>\n";
  return x;
}

std::vector<ReportFile> render_run(const RunInfo& run, const std::vector<LawReport>& laws, const Formats& formats) {
  std::vector<ReportFile> files;
  for (const auto& r : laws) {
    const LawResult& res = r.result;
    if (res.status != LawStatus::falsified) continue;
    if (formats.json) files.push_back({law_file(res.law, ".json"), dump_pretty(law_document(run, r))});
    if (!formats.md) continue;
    files.push_back({law_file(res.law, ".md"), law_markdown(run, r)});
    if (!res.violation || !res.minimal_case) continue;
    const Violation& v = *res.violation;
    const Tensor<double>* w = v.weights ? &*v.weights : (v.quantity == "weights" && v.actual ? &*v.actual : nullptr);
    if (w) {
      const Index b = v.worst_index.size() == 4 ? v.worst_index[0] : 0, h = v.worst_index.size() == 4 ? v.worst_index[1] : 0;
      const bool in_range = b < w->shape().B && h < w->shape().H;
      files.push_back({law_file(res.law, "-weights.svg"),
                       weights_svg(*w, in_range ? b : 0, in_range ? h : 0, res.minimal_case->problem.alignment,
                                   v.quantity == "weights" ? v.worst_index : std::vector<Index>{},
                                   run.implementation + " on " + res.law)});
    }
    if (!v.series.empty())
      files.push_back({law_file(res.law, "-variance.svg"),
                       series_svg(v.series, run.implementation + " on " + res.law + ": score variance against D")});
  }
  std::vector<std::string> names;
  for (const auto& f : files) names.push_back(f.name);
  if (formats.md) names.push_back("summary.md");
  if (formats.junit) names.push_back("junit.xml");
  if (formats.md) files.push_back({"summary.md", summary_markdown(run, laws, formats)});
  if (formats.junit) files.push_back({"junit.xml", junit_xml(run, laws)});
  if (formats.json) files.push_back({"summary.json", dump_pretty(summary_json(run, laws, formats, names))});
  return files;
}

}  // namespace attncheck::reports
