// The machine-readable side of a report: LAW.json (also the corpus entry), summary.json, junit.xml, the
// replay commands, and the list of files a run writes.
#include <algorithm>
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

std::string index_string(const std::vector<Index>& idx) {
  std::string out = "[";
  for (std::size_t n = 0; n < idx.size(); ++n) out += (n ? "," : "") + std::to_string(idx[n]);
  return out + "]";
}

PictureSet pictures_of(const LawResult& res) {
  PictureSet p;
  if (res.status != LawStatus::falsified || !res.violation || !res.minimal_case) return p;
  const Violation& v = *res.violation;
  p.error_map = v.expected && v.actual && v.tolerances && v.expected->shape() == v.actual->shape() &&
                v.expected->shape() == v.tolerances->shape();
  p.weights = !p.error_map && (v.weights || (v.quantity == "weights" && v.actual));
  p.variance = !v.series.empty();
  return p;
}

Visibility picture_visibility(const Problem& p, Index b, Index h, Index T_q, Index T_k) {
  if (p.q.shape().T == T_q && p.k.shape().T == T_k && b < p.q.shape().B && h < p.q.shape().H) return p.visibility(b, h);
  return Visibility{T_q, T_k, p.alignment};
}

std::string hidden_key_label(const Visibility& vis) {
  const bool plain = vis.key_length < 0 && !vis.window && !vis.window_right && vis.prefix == 0 && vis.chunk == 0 &&
                     !vis.doc_bounds && vis.causal && !vis.has_cells();
  return plain ? "future key" : "key it may not see";
}

std::pair<Index, Index> worst_head(const Violation& v, const Shape& s) {
  const auto& w = v.worst_index;
  if (w.size() == 4 && w[0] < s.B && w[1] < s.H) return {w[0], w[1]};
  return {0, 0};
}

}  // namespace detail

using namespace detail;

std::string cases_per_law(const RunInfo& run) {
  const RunOptions defaults;
  if (run.law_calls <= 0 || run.cases <= defaults.first_cases) return std::to_string(run.cases) + " cases per law";
  return "up to " + std::to_string(run.cases) + " cases per law (about " + std::to_string(run.law_calls) +
         " calls each, at least " + std::to_string(defaults.first_cases) + " cases)";
}

namespace {

Json generator_json(const RunInfo& run) {
  Json g{{"cases", run.cases},         {"max_size", run.max_size},     {"max_B", run.gen.max_B},
         {"max_H", run.gen.max_H},     {"min_T", run.gen.min_T},       {"max_T", run.gen.max_T},
         {"max_T_tail", run.gen.max_T_tail}, {"max_D", run.gen.max_D}};
  if (run.law_calls > 0) {  // fewer cases for a law whose cases make several calls, but at least first_cases
    g["law_calls"] = run.law_calls;
    g["first_cases"] = RunOptions{}.first_cases;
  }
  if (run.gen.shape) g["shape"] = *run.gen.shape;
  if (run.gen.max_H_kv > 0) g["max_H_kv"] = run.gen.max_H_kv;  // only when bounded (--max-Hkv)
  if (!run.gen.long_lengths.empty()) g["long_lengths"] = run.gen.long_lengths;  // --long
  if (run.gen.long_max_T_q > 0) g["long_max_T_q"] = run.gen.long_max_T_q;     // --long on a zoo kernel
  return g;
}

Json shape_json(const Problem& p) {
  const Shape& q = p.q.shape();
  Json s{{"B", q.B}, {"H", q.H}, {"T", q.T}, {"D", q.D}};
  if (p.k.shape().T != q.T) s["T_k"] = p.k.shape().T;
  if (p.kv_heads() != q.H) s["H_kv"] = p.kv_heads();
  if (p.v_dim() != q.D) s["D_v"] = p.v_dim();
  return s;
}

Json coverage_json(const std::map<std::string, int>& coverage) {
  Json c = Json::object();
  for (const auto& [tag, n] : coverage) c[tag] = n;
  return c;
}

}  // namespace

Formats parse_formats(std::string_view list) {
  Formats f{false, false, false, false};
  std::size_t start = 0;
  bool any = false;
  while (start <= list.size()) {
    const std::size_t end = std::min(list.find(',', start), list.size());
    const std::string_view item = list.substr(start, end - start);
    if (item == "md") f.md = true;
    else if (item == "json") f.json = true;
    else if (item == "junit") f.junit = true;
    else if (item == "html") f.html = true;
    else
      throw std::invalid_argument("--format: expected a comma-separated list of md, json, junit, html but got \"" +
                                  std::string(item) + "\" in \"" + std::string(list) + "\"");
    any = true;
    start = end + 1;
  }
  if (!any) throw std::invalid_argument("--format: expected at least one of md, json, junit, html");
  return f;
}

std::string law_file(std::string_view law, std::string_view suffix) { return std::string(law) + std::string(suffix); }

std::string shell_quote(std::string_view s) {
  const bool plain = !s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                       "0123456789_./:=,+-@%") == std::string_view::npos;
  if (plain) return std::string(s);
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string replay_command(const RunInfo& run, const LawReport& r) {
  if (r.replay_file.empty()) return {};
  return run.program + " check --impl " + shell_quote(run.implementation) + " --replay " + shell_quote(r.replay_file);
}

std::string shape_option(const std::array<Index, 5>& shape) {
  std::string s;
  for (const Index x : shape) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

std::string reproduce_command(const RunInfo& run, const LawReport& r) {
  if (r.result.reproduce.empty()) return {};
  // The reproduce string replays RapidCheck's random choices; the generator bounds must match the run's.
  return run.program + " check --impl " + shell_quote(run.implementation) + " --property " +
         shell_quote(r.result.law) + " --dtype " + std::string(dtype_name(run.dtype)) +
         " --max-B " + std::to_string(run.gen.max_B) + " --max-H " + std::to_string(run.gen.max_H) +
         (run.gen.max_H_kv > 0 ? " --max-Hkv " + std::to_string(run.gen.max_H_kv) : std::string()) +
         (run.gen.long_lengths.empty() ? " --max-T " + std::to_string(run.gen.max_T_tail) : std::string(" --long")) +
         " --max-D " + std::to_string(run.gen.max_D) +
         (run.gen.min_T > 1 && run.gen.long_lengths.empty() ? " --min-T " + std::to_string(run.gen.min_T) : std::string()) +
         (run.gen.shape ? " --shape " + shape_option(*run.gen.shape) : std::string()) + " --reproduce " +
         shell_quote(r.result.reproduce);
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
           {"calls", res.calls},
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
  int held = 0, falsified = 0, na = 0, not_checked = 0;
  Json entries = Json::array();
  for (const auto& r : laws) {
    const LawResult& res = r.result;
    (res.status == LawStatus::held        ? held
     : res.status == LawStatus::falsified ? falsified
     : res.status == LawStatus::not_checked ? not_checked
                                            : na) += 1;
    Json e{{"law", res.law}, {"status", status_name(res.status)}, {"cases_run", res.cases_run},
           {"shrink_steps", res.shrink_steps}, {"calls", res.calls}};
    if (res.violation) e["margin"] = number_to_json(margin(*res.violation));
    if (!res.note.empty()) e["note"] = res.note;
    if (res.status == LawStatus::falsified) {
      e["message"] = res.violation ? res.violation->message : std::string();
      if (formats.json) e["report_json"] = law_file(res.law, ".json");
      if (formats.md) e["report_md"] = law_file(res.law, ".md");
      if (formats.html) e["report_html"] = law_file(res.law, ".html");
      if (res.violation && res.violation->tolerance > 0)
        e["margin"] = number_to_json(res.violation->magnitude / res.violation->tolerance);
      e["replay_command"] = replay_command(run, r);
    }
    e["coverage"] = coverage_json(res.coverage);
    entries.push_back(std::move(e));
  }
  Json counts{{"held", held}, {"falsified", falsified}, {"not_applicable", na}};
  if (not_checked) counts["not_checked"] = not_checked;  // absent when 0: complete runs' summaries are as before
  Json doc{{"format", "attncheck-summary/1"},
              {"implementation", run.implementation},
              {"description", run.implementation_description},
              // A run that left an applicable law unchecked did not pass: "incomplete", never "held".
              {"status", falsified ? "falsified" : not_checked ? "incomplete" : "held"},
              {"dtype", dtype_name(run.dtype)},
              {"seed", run.seed},
              {"generator", generator_json(run)},
              {"counts", counts},
              {"laws", std::move(entries)},
              {"files", law_files}};
  if (run.shard) doc["shard"] = {{"index", (*run.shard)[0]}, {"count", (*run.shard)[1]}};
  return doc;
}

}  // namespace

std::string summary_markdown(const RunInfo& run, const std::vector<LawReport>& laws, const Formats& formats,
                             std::string_view report_ext) {
  int falsified = 0, applicable = 0, not_checked = 0;
  for (const auto& r : laws) {
    falsified += r.result.status == LawStatus::falsified;
    applicable += r.result.status != LawStatus::not_applicable;
    not_checked += r.result.status == LawStatus::not_checked;
  }
  const std::string unchecked = not_checked ? std::to_string(not_checked) + " not checked" : std::string();
  std::string md = "# attncheck: `" + run.implementation + "`: " +
                   (falsified     ? std::to_string(falsified) + " of " + std::to_string(applicable) +
                                    " laws falsified" + (not_checked ? ", " + unchecked : std::string())
                    : not_checked ? "incomplete: " + std::to_string(not_checked) + " of " + std::to_string(applicable) +
                                        " laws not checked"
                                  : "all " + std::to_string(applicable) + " laws held") +
                   "\n\n";
  md += run.implementation_description + "\n\n";
  md += "dtype " + std::string(dtype_name(run.dtype)) + ", seed " + std::to_string(run.seed) + ", " +
        cases_per_law(run) + ", B ≤ " + std::to_string(run.gen.max_B) + ", H ≤ " + std::to_string(run.gen.max_H) +
        (run.gen.max_H_kv > 0 ? ", H_kv ≤ " + std::to_string(run.gen.max_H_kv) : std::string()) +
        (run.gen.long_lengths.empty()
             ? ", T ≤ " + std::to_string(run.gen.max_T) + " (tail to " + std::to_string(run.gen.max_T_tail) + ")"
             : ", --long: T_k = " + std::to_string(run.gen.long_lengths.front()) + " to " +
                   std::to_string(run.gen.long_lengths.back())) +
        ", D ≤ " + std::to_string(run.gen.max_D) +
        (run.gen.min_T > 1 ? ", T ≥ " + std::to_string(run.gen.min_T) : std::string()) +
        (run.gen.shape ? ", shape pinned to " + shape_option(*run.gen.shape) : std::string()) + "\n\n";
  if (run.shard)
    md += "**Shard " + std::to_string((*run.shard)[0]) + " of " + std::to_string((*run.shard)[1]) +
          "** (from 0): only the run's laws at positions k with k % " + std::to_string((*run.shard)[1]) + " == " +
          std::to_string((*run.shard)[0]) + "; `attncheck merge` combines the shards into the run's report.\n\n";
  // Margin: how far past its tolerance the worst entry is (margin_text: "non-finite" and the like where no
  // ratio exists). Held laws have none to show.
  md += "| law | result | cases | shrink steps | calls | margin | report |\n|---|---|---:|---:|---:|---:|---|\n";
  const bool linked = report_ext == ".md" ? formats.md : true;
  // The laws that do not apply are not rows (they would bury those that do): a list below, by reason.
  std::vector<std::pair<std::string, std::vector<std::string>>> not_applicable;
  for (const auto& r : laws) {
    const LawResult& res = r.result;
    if (res.status == LawStatus::not_applicable) {
      const std::string why = res.note.empty() ? "(no reason given)" : res.note;
      auto it = std::find_if(not_applicable.begin(), not_applicable.end(), [&](const auto& e) { return e.first == why; });
      if (it == not_applicable.end()) it = not_applicable.insert(not_applicable.end(), {why, {}});
      it->second.push_back(res.law);
      continue;
    }
    std::string report, margin;
    if (res.status == LawStatus::falsified && linked)
      report = "[" + res.law + std::string(report_ext) + "](" + res.law + std::string(report_ext) + ")";
    else if (res.status == LawStatus::falsified && formats.json) report = "[" + res.law + ".json](" + res.law + ".json)";
    else if (!res.note.empty()) report = md_cell(res.note);
    if (res.status == LawStatus::falsified && res.violation) margin = margin_text(*res.violation);
    const std::string status = res.status == LawStatus::falsified     ? "**falsified**"
                               : res.status == LawStatus::not_checked ? "**not checked**"
                                                                      : std::string(status_name(res.status));
    md += "| `" + res.law + "` | " + status + " | " + std::to_string(res.cases_run) + " | " +
          std::to_string(res.shrink_steps) + " | " + std::to_string(res.calls) + " | " + margin + " | " + report +
          " |\n";
  }
  if (!not_applicable.empty()) {
    md += "\nNot applicable to this implementation (" + std::to_string(laws.size() - std::size_t(applicable)) +
          " laws), by reason:\n\n";
    for (const auto& [why, names] : not_applicable) {
      std::string list;
      for (const std::string& n : names) list += (list.empty() ? "`" : ", `") + n + "`";
      md += "- " + list + ": " + md_cell(why) + "\n";
    }
  }
  if (falsified) {
    md += "\n## Falsified\n";
    for (const auto& r : laws) {
      if (r.result.status != LawStatus::falsified) continue;
      const std::string& law = r.result.law;
      md += "\n### " + (linked ? "[`" + law + "`](" + law + std::string(report_ext) + ")" : "`" + law + "`") + "\n\n";
      md += md_cell(plain_message(law, r.result.violation ? r.result.violation->message : "")) +
            (r.result.violation ? " (margin: " + margin_text(*r.result.violation) + ")" : std::string()) + "\n\n";
      if (const auto cmd = replay_command(run, r); !cmd.empty()) md += "Replay: `" + cmd + "`\n\n";
      const PictureSet pics = pictures_of(r.result);
      if (pics.error_map) md += "![error map](" + law_file(law, "-error.svg") + ")\n\n";
      if (pics.weights) md += "![weights](" + law_file(law, "-weights.svg") + ")\n\n";
      if (pics.variance) md += "![score variance against D](" + law_file(law, "-variance.svg") + ")\n\n";
    }
    md.pop_back();
  }
  return md;
}

std::string junit_xml(const RunInfo& run, const std::vector<LawReport>& laws) {
  // A law not checked is an error, not a skipped test: a dashboard must not show it green.
  int failures = 0, skipped = 0, errors = 0;
  for (const auto& r : laws) {
    failures += r.result.status == LawStatus::falsified;
    skipped += r.result.status == LawStatus::not_applicable;
    errors += r.result.status == LawStatus::not_checked;
  }
  const std::string suite = "attncheck " + run.implementation + " " + std::string(dtype_name(run.dtype));
  const std::string counts = " tests=\"" + std::to_string(laws.size()) + "\" failures=\"" + std::to_string(failures) +
                             "\" errors=\"" + std::to_string(errors) + "\" skipped=\"" + std::to_string(skipped) + "\"";
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
    } else if (res.status == LawStatus::not_checked) {
      x += "      <error type=\"not checked\" message=\"" + xml_escape(res.note) + "\"/>\n";
    } else {
      const std::string message = res.violation ? res.violation->message : "falsified";
      std::string body = message + "\n";
      if (res.violation) {
        const Violation& v = *res.violation;
        body += "worst " + v.quantity + " index " + index_string(v.worst_index) + ": magnitude " +
                num(v.magnitude, true) +
                (v.tolerance > 0 ? ", tolerance " + num(v.tolerance, true) + ", margin " + margin_text(v)
                                 : ", " + margin_text(v) + (margin_text(v) == "exact law" ? "" : " (exact law)")) +
                "\n";
        if (v.call) body += "failing call: " + v.call_what + " (q " + to_string(v.call->q.shape()) + ", k " +
                            to_string(v.call->k.shape()) + ")\n";
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

std::vector<ReportFile> law_pictures(const RunInfo& run, const LawReport& r) {
  const LawResult& res = r.result;
  const PictureSet pics = pictures_of(res);
  std::vector<ReportFile> files;
  if (!pics.error_map && !pics.weights && !pics.variance) return files;
  const Violation& v = *res.violation;
  const std::string title = run.implementation + " on " + res.law;
  const Problem& p = res.minimal_case->problem;
  if (pics.error_map) {
    const auto [b, h] = worst_head(v, v.expected->shape());
    const Shape& s = v.expected->shape();
    files.push_back({law_file(res.law, "-error.svg"), error_map_svg(v, b, h, picture_visibility(p, b, h, s.T, s.D), title)});
  }
  if (pics.weights) {
    const Tensor<double>& w = v.weights ? *v.weights : *v.actual;
    const auto [b, h] = worst_head(v, w.shape());
    files.push_back({law_file(res.law, "-weights.svg"),
                     weights_svg(w, b, h, picture_visibility(p, b, h, w.shape().T, w.shape().D), v.quantity == "weights" ? v.worst_index : std::vector<Index>{}, title)});
  }
  if (pics.variance)
    files.push_back({law_file(res.law, "-variance.svg"), variance_svg(v.series, title + ": score variance against D")});
  return files;
}

std::vector<ReportFile> render_run(const RunInfo& run, const std::vector<LawReport>& laws, const Formats& formats) {
  std::vector<ReportFile> files, all_pictures;
  for (const auto& r : laws) {
    const LawResult& res = r.result;
    if (res.status != LawStatus::falsified) continue;
    if (formats.json) files.push_back({law_file(res.law, ".json"), dump_pretty(law_document(run, r))});
    if (!formats.md && !formats.html) continue;
    const std::string md = law_markdown(run, r);
    const std::vector<ReportFile> pictures = law_pictures(run, r);
    if (formats.md) {
      files.push_back({law_file(res.law, ".md"), md});
      files.insert(files.end(), pictures.begin(), pictures.end());
    }
    if (formats.html)
      files.push_back({law_file(res.law, ".html"),
                       html_page(res.law + " falsified by " + run.implementation,
                                 "<nav><a href=\"index.html\">&#8592; the whole run</a></nav>\n" +
                                     markdown_to_html(md, pictures))});
    all_pictures.insert(all_pictures.end(), pictures.begin(), pictures.end());
  }
  std::vector<std::string> names;
  for (const auto& f : files) names.push_back(f.name);
  if (formats.md) names.push_back("summary.md");
  if (formats.html) names.push_back("index.html");
  if (formats.junit) names.push_back("junit.xml");
  if (formats.md) files.push_back({"summary.md", summary_markdown(run, laws, formats)});
  if (formats.html)
    files.push_back({"index.html", html_page("attncheck: " + run.implementation,
                                             markdown_to_html(summary_markdown(run, laws, formats, ".html"), all_pictures))});
  if (formats.junit) files.push_back({"junit.xml", junit_xml(run, laws)});
  if (formats.json) files.push_back({"summary.json", dump_pretty(summary_json(run, laws, formats, names))});
  return files;
}

}  // namespace attncheck::reports
