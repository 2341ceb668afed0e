// `attncheck campaign FILE`: implementations × dtypes × seeds under one set of options, one `check` run per
// cell into its own report folder (the cells share one corpus), then one overview page: a matrix of laws ×
// cells, each cell linking to its report and showing the minimal case, as the kill matrix does for the zoo.
// `--shard I/N` runs every N-th cell; `--overview-only` then writes the overview from the cells on disk.
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <set>
#include <sstream>

#include "attncheck/reports.hpp"
#include "check.hpp"

namespace attncheck::cli {
namespace fs = std::filesystem;

namespace {

using reports::Json;

[[noreturn]] void bad(const std::string& file, const std::string& where, const std::string& expected, const Json& got) {
  std::string shown = got.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
  throw UsageError("campaign " + file + ": " + where + ": expected " + expected + " but got " + shown);
}

std::vector<std::string> strings(const std::string& file, const Json& j, const char* key, bool required) {
  std::vector<std::string> out;
  const auto it = j.find(key);
  if (it == j.end()) {
    if (required) throw UsageError("campaign " + file + ": the field \"" + std::string(key) + "\" is missing");
    return out;
  }
  if (!it->is_array() || it->empty()) bad(file, key, "a non-empty array of strings", *it);
  for (const Json& s : *it) {
    if (!s.is_string()) bad(file, key, "strings", s);
    out.push_back(s.get<std::string>());
  }
  return out;
}

struct Cell {
  std::string impl, dtype;
  std::uint64_t seed = 1;
  std::string dir;  ///< its report folder, relative to the campaign's
};

struct Campaign {
  std::string name;
  std::vector<Cell> cells;
  CheckOptions options;  ///< what every cell shares
};

Campaign read_campaign(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw UsageError("campaign: cannot read " + file + " (expected a campaign file, JSON)");
  std::stringstream text;
  text << in.rdbuf();
  Json j;
  try {
    j = Json::parse(text.str());
  } catch (const Json::exception& e) {
    throw UsageError("campaign " + file + " is not valid JSON: " + e.what());
  }
  if (!j.is_object()) bad(file, "the file", "an object with implementations, dtypes, seeds and options", j);
  for (const auto& [key, value] : j.items())
    if (key != "name" && key != "implementations" && key != "dtypes" && key != "seeds" && key != "options")
      throw UsageError("campaign " + file + ": unknown field \"" + key +
                       "\" (expected name, implementations, dtypes, seeds, options)");
  Campaign c;
  c.name = j.contains("name") && j["name"].is_string() ? j["name"].get<std::string>() : fs::path(file).stem().string();
  const std::vector<std::string> impls = strings(file, j, "implementations", true);
  std::vector<std::string> dtypes = strings(file, j, "dtypes", false);
  if (dtypes.empty()) dtypes = {"float32"};
  for (const std::string& d : dtypes)
    if (d != "float32" && d != "float64" && d != "float16" && d != "bfloat16")
      bad(file, "dtypes", "float32, float64, float16 or bfloat16", Json(d));
  std::vector<std::uint64_t> seeds{kDefaultSeed};
  if (const auto it = j.find("seeds"); it != j.end()) {
    if (!it->is_array() || it->empty()) bad(file, "seeds", "a non-empty array of seeds", *it);
    seeds.clear();
    for (const Json& s : *it) {
      if (!s.is_number_unsigned()) bad(file, "seeds", "unsigned integers", s);
      seeds.push_back(s.get<std::uint64_t>());
    }
  }
  CheckOptions& o = c.options;
  if (const auto it = j.find("options"); it != j.end()) {
    if (!it->is_object()) bad(file, "options", "an object", *it);
    for (const auto& item : it->items()) {
      // Named, not a structured binding: clang 14 (the sanitizer tree's compiler) cannot capture those.
      const std::string& key = item.key();
      const nlohmann::json& v = item.value();
      const auto extent = [&](Index& x, Index lo, Index hi) {
        if (!v.is_number_integer() || v.get<std::int64_t>() < lo || v.get<std::int64_t>() > hi)
          bad(file, "options." + key, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", v);
        x = Index(v.get<std::int64_t>());
      };
      const auto seconds = [&](double& x) {
        if (!v.is_number() || !(v.get<double>() >= 0) || v.get<double>() > 1e6)
          bad(file, "options." + key, "seconds from 0 to 1000000", v);
        x = v.get<double>();
      };
      Index n = 0;
      if (key == "cases") extent(n, 1, kMaxCases), o.cases = int(n), o.given.cases = true;
      else if (key == "max_B") extent(o.max_B, 1, kMaxExtent), o.given.max_B = true;
      else if (key == "max_H") extent(o.max_H, 1, kMaxExtent), o.given.max_H = true;
      else if (key == "max_Hkv") extent(o.max_H_kv, 1, kMaxExtent), o.given.max_H_kv = true;
      else if (key == "max_T") extent(o.max_T, 1, kMaxSeqLen), o.given.max_T = true;
      else if (key == "min_T") extent(o.min_T, 1, kMaxSeqLen), o.given.min_T = true;
      else if (key == "max_D") extent(o.max_D, 1, kMaxExtent), o.given.max_D = true;
      else if (key == "max_calls") extent(n, 0, Index{1} << 40), o.max_calls = long(n);
      else if (key == "timeout") {
        seconds(o.timeout);
        if (o.timeout <= 0) bad(file, "options.timeout", "seconds above 0", v);
      } else if (key == "shrink_time") seconds(o.shrink_time);
      else if (key == "properties") o.properties = strings(file, *it, "properties", true);
      else
        throw UsageError("campaign " + file + ": unknown option \"" + key +
                         "\" (expected cases, max_B, max_H, max_Hkv, max_T, min_T, max_D, max_calls, timeout, "
                         "shrink_time, properties)");
    }
  }
  for (const std::string& impl : impls)
    for (const std::string& d : dtypes)
      for (const std::uint64_t s : seeds)
        c.cells.push_back({impl, d, s, reports::slug(impl) + "-" + d + "-seed" + std::to_string(s)});
  return c;
}

// "[B,H,T,D]" of a cell's minimal case, from its LAW.json ("" when there is none).
std::string minimal_shape(const fs::path& law_json) {
  std::ifstream in(law_json, std::ios::binary);
  if (!in) return "";
  std::stringstream text;
  text << in.rdbuf();
  try {
    const Json j = Json::parse(text.str());
    const Json& s = j.at("shape");
    std::string out = "[" + std::to_string(s.at("B").get<Index>()) + "," + std::to_string(s.at("H").get<Index>()) +
                      "," + std::to_string(s.at("T").get<Index>()) + "," + std::to_string(s.at("D").get<Index>()) + "]";
    if (s.contains("T_k")) out += " T_k=" + std::to_string(s["T_k"].get<Index>());
    if (s.contains("H_kv")) out += " H_kv=" + std::to_string(s["H_kv"].get<Index>());
    return out;
  } catch (const Json::exception&) {
    return "";
  }
}

// The overview: laws × cells, from each cell's summary.json.
std::string overview_markdown(const Campaign& c, const fs::path& root, int* missing) {
  std::vector<std::string> laws;
  std::set<std::string> known;
  std::vector<std::map<std::string, std::pair<std::string, std::string>>> cells;  // law -> (status, note)
  *missing = 0;
  for (const Cell& cell : c.cells) {
    std::map<std::string, std::pair<std::string, std::string>> by_law;
    std::ifstream in(root / cell.dir / "summary.json", std::ios::binary);
    if (in) {
      std::stringstream text;
      text << in.rdbuf();
      try {
        const Json summary = Json::parse(text.str());  // kept: a range-for over a temporary's member dangles
        for (const Json& e : summary.at("laws")) {
          const std::string law = e.at("law").get<std::string>();
          if (known.insert(law).second) laws.push_back(law);
          by_law[law] = {e.at("status").get<std::string>(), ""};
        }
      } catch (const Json::exception&) {
        by_law.clear();
      }
    }
    if (by_law.empty()) ++*missing;
    cells.push_back(std::move(by_law));
  }
  std::string md = "# Campaign `" + c.name + "`\n\n";
  md += std::to_string(c.cells.size()) + " runs (implementation, dtype, seed); each column links to its report, each "
        "falsified cell to the law's report and shows the minimal case. ✗ falsified, ✓ held, n/a not applicable, "
        "? not checked (the run left it unchecked), · not run yet.\n\n";
  md += "| law |";
  for (const Cell& cell : c.cells)
    md += " [`" + cell.impl + "` " + cell.dtype + (c.cells.size() > 1 ? " s" + std::to_string(cell.seed) : "") +
          "](" + cell.dir + "/index.html) |";
  md += "\n|---|";
  for (std::size_t n = 0; n < c.cells.size(); ++n) md += "---|";
  md += "\n";
  std::vector<int> falsified(c.cells.size(), 0);
  for (const std::string& law : laws) {
    md += "| `" + law + "` |";
    for (std::size_t n = 0; n < c.cells.size(); ++n) {
      const auto it = cells[n].find(law);
      if (it == cells[n].end()) {
        md += " · |";
      } else if (it->second.first == "falsified") {
        ++falsified[n];
        const std::string shape = minimal_shape(root / c.cells[n].dir / reports::law_file(law, ".json"));
        md += " [✗](" + c.cells[n].dir + "/" + reports::law_file(law, ".html") + ")" +
              (shape.empty() ? "" : " " + shape) + " |";
      } else {
        md += it->second.first == "held" ? " ✓ |" : it->second.first == "not checked" ? " ? |" : " n/a |";
      }
    }
    md += "\n";
  }
  md += "| **falsified** |";
  for (std::size_t n = 0; n < c.cells.size(); ++n)
    md += cells[n].empty() ? " · |" : " **" + std::to_string(falsified[n]) + "** |";
  md += "\n";
  return md;
}

}  // namespace

int run_campaign(const CampaignOptions& co, const Registry& reg, std::ostream& out, std::ostream& err) {
  const Campaign c = read_campaign(co.file);
  const Shard shard = shard_option(co.shard);
  const fs::path root = co.report_dir.empty() ? fs::path("attncheck-reports") / ("campaign-" + reports::slug(c.name))
                                              : fs::path(co.report_dir);
  int worst = kAllHeld, ran = 0;
  bool incomplete = false;  // a cell left a law not checked, or is not there at all
  if (!co.overview_only) {
    out << "attncheck campaign " << c.name << ": " << c.cells.size() << " runs"
        << (shard.given ? ", shard " + std::to_string(shard.index) + "/" + std::to_string(shard.count) : std::string())
        << "; reports in " << root.string() << "/\n"
        << std::flush;
    for (std::size_t k = 0; k < c.cells.size(); ++k) {
      if (shard.given && int(k % std::size_t(shard.count)) != shard.index) continue;
      const Cell& cell = c.cells[k];
      CheckOptions o = c.options;
      o.impl = cell.impl;
      o.dtype = cell.dtype;
      o.seed = cell.seed;
      o.report_dir = (root / cell.dir).string();
      o.corpus = (root / "corpus").string();  // one corpus for the campaign: a case found in one cell replays in all
      o.no_corpus = co.no_corpus;
      o.force = co.force;
      o.shard.clear();
      o.shard_from_environment = false;  // the campaign shards its cells; a cell checks all its laws
      std::ostringstream run_out;
      const int code = run_check(o, reg, run_out, err, false);
      // The run's verdict line: "<impl>: all N laws held ..." or "<impl>: X of Y laws falsified ...".
      std::string verdict;
      std::istringstream lines(run_out.str());
      for (std::string line; std::getline(lines, line);)
        if (line.rfind(cell.impl + ": ", 0) == 0) verdict = line.substr(cell.impl.size() + 2, line.find("; seed") - cell.impl.size() - 2);
      out << "  [" << (k + 1) << "/" << c.cells.size() << "] " << cell.impl << " " << cell.dtype << " seed "
          << cell.seed << ": " << verdict << "\n"
          << std::flush;
      ++ran;
      if (code == kInterrupted) return kInterrupted;
      if (code == kFalsified) worst = kFalsified;
      if (code == kIncomplete) incomplete = true;
    }
  }
  if (!shard.given || co.overview_only) {
    int missing = 0;
    const std::string md = overview_markdown(c, root, &missing);
    fs::create_directories(root);
    reports::write_atomic(root / "overview.md", md);
    reports::write_atomic(root / "index.html",
                          reports::html_page("attncheck campaign: " + c.name, reports::markdown_to_html(md, {})));
    out << "overview: " << (root / "index.html").string()
        << (missing ? " (" + std::to_string(missing) + " of " + std::to_string(c.cells.size()) + " runs not there yet)"
                    : std::string())
        << "\n";
    incomplete = incomplete || missing > 0;
    if (co.overview_only) {
      // The verdict of the whole campaign, from the cells on disk.
      for (const Cell& cell : c.cells) {
        std::ifstream in(root / cell.dir / "summary.json", std::ios::binary);
        std::stringstream text;
        text << in.rdbuf();
        try {
          const Json summary = Json::parse(text.str());
          for (const Json& e : summary.at("laws")) {
            if (e.at("status") == "falsified") worst = kFalsified;
            if (e.at("status") == "not checked") incomplete = true;
          }
        } catch (const Json::exception&) {
        }
      }
    }
  }
  (void)ran;
  if (worst == kAllHeld && incomplete) {
    out << "incomplete: a run is missing or left a law not checked; a campaign passes only what it checked"
        << (co.accept_incomplete ? " (--accept-incomplete: exit 0)" : " (--accept-incomplete to exit 0)") << "\n";
    if (!co.accept_incomplete) return kIncomplete;
  }
  return worst;
}

}  // namespace attncheck::cli
