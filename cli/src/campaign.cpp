// `attncheck campaign FILE`: implementations × dtypes × seeds under one set of options, one `check` run per
// cell into its own report folder (the cells share one corpus), then one overview page: a matrix of laws ×
// cells, each cell linking to its report and showing the minimal case, as the kill matrix does for the zoo.
// `--shard I/N` runs every N-th cell; `--overview-only` then writes the overview from the cells on disk.
#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
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
  std::vector<std::string> implementations;  ///< as the file lists them
  std::vector<Cell> cells;
  CheckOptions options;  ///< what every cell shares
};

// A list of the campaign file that names each thing once: a second listing would run the same cell twice.
template <class T>
void once(const std::string& file, const char* key, const std::vector<T>& items) {
  for (std::size_t n = 0; n < items.size(); ++n)
    if (std::find(items.begin(), items.begin() + long(n), items[n]) != items.begin() + long(n))
      throw UsageError("campaign " + file + ": " + key + ": " + Json(items[n]).dump() +
                       " is listed twice; expected each once (a second listing would run the same runs again)");
}

Campaign read_campaign(const std::string& file) {
  std::string text;
  try {
    text = reports::read_data_file(file, reports::kMaxSmallFileBytes, "a campaign file (JSON)");
  } catch (const reports::FileError& e) {
    throw UsageError(std::string("campaign: ") + e.what());
  }
  Json j;
  try {
    j = Json::parse(text);
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
  check_name_in_file(c.name, "campaign " + file + ": \"name\"");
  const std::vector<std::string> impls = strings(file, j, "implementations", true);
  for (std::size_t n = 0; n < impls.size(); ++n)
    check_name_in_file(impls[n], "campaign " + file + ": \"implementations[" + std::to_string(n) + "]\"");
  once(file, "implementations", impls);
  c.implementations = impls;
  std::vector<std::string> dtypes = strings(file, j, "dtypes", false);
  if (dtypes.empty()) dtypes = {"float32"};
  for (const std::string& d : dtypes)
    if (d != "float32" && d != "float64" && d != "float16" && d != "bfloat16")
      bad(file, "dtypes", "float32, float64, float16 or bfloat16", Json(d));
  once(file, "dtypes", dtypes);
  std::vector<std::uint64_t> seeds{kDefaultSeed};
  if (const auto it = j.find("seeds"); it != j.end()) {
    if (!it->is_array() || it->empty()) bad(file, "seeds", "a non-empty array of seeds", *it);
    seeds.clear();
    for (const Json& s : *it) {
      if (!s.is_number_unsigned()) bad(file, "seeds", "unsigned integers", s);
      seeds.push_back(s.get<std::uint64_t>());
    }
    once(file, "seeds", seeds);
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
      else if (key == "law_calls")
        extent(n, 0, Index{1} << 40), o.law_calls = long(n);
      else if (key == "timeout") {
        seconds(o.timeout);
        if (o.timeout <= 0) bad(file, "options.timeout", "seconds above 0", v);
      } else if (key == "shrink_time") seconds(o.shrink_time);
      else if (key == "properties") o.properties = strings(file, *it, "properties", true);
      else
        throw UsageError("campaign " + file + ": unknown option \"" + key +
                         "\" (expected cases, max_B, max_H, max_Hkv, max_T, min_T, max_D, max_calls, law_calls, "
                         "timeout, "
                         "shrink_time, properties)");
    }
  }
  for (const std::string& impl : impls)
    for (const std::string& d : dtypes)
      for (const std::uint64_t s : seeds)
        c.cells.push_back({impl, d, s, reports::slug(impl) + "-" + d + "-seed" + std::to_string(s)});
  return c;
}

bool is_program(const std::string& impl) { return impl.starts_with("plugin:") || impl.starts_with("exec:"); }

// Every cell is checked before the first one runs, so a mistake anywhere in the file stops the campaign before
// it starts, not midway without an overview: a file that would start programs without --allow-programs, an
// implementation that cannot be resolved or does not take a dtype, two cells that would share a folder, a law
// that does not exist, a folder that cannot be one.
void validate_cells(const Campaign& c, const CampaignOptions& co, const Registry& reg, const fs::path& root) {
  const std::string f = "campaign " + co.file + ": ";
  if (!co.overview_only) {
    // A campaign file is data, often someone else's: like a Makefile, it starts programs only when the person
    // running it says so.
    std::string programs;
    for (const std::string& impl : c.implementations)
      if (is_program(impl)) programs += (programs.empty() ? "" : ", ") + Json(impl).dump();
    if (!programs.empty() && !co.allow_programs)
      throw UsageError(f + "it names implementations that run programs (" + programs +
                       "); a campaign file starts the programs it names only with --allow-programs (pass it for a "
                       "file you trust, as you would run its Makefile); nothing was run");
  }
  for (const std::string& impl : c.implementations) {
    const std::string where = f + "\"implementations\" holds " + Json(impl).dump();
    if (is_program(impl)) {
      if (impl.substr(impl.find(':') + 1).empty())
        throw UsageError(where + "; expected plugin:PATH.so or exec:COMMAND with a path or command after the colon");
      if (!reg.load_external)
        throw UsageError(where + ": plugin: and exec: implementations are not available in this build");
      continue;
    }
    const auto it = std::find_if(reg.builtins.begin(), reg.builtins.end(),
                                 [&](const ImplementationPtr& p) { return p->name() == impl; });
    if (it == reg.builtins.end())
      throw UsageError(where + "; expected reference, mutant:NAME or control:NAME (`attncheck list` shows them), "
                       "plugin:PATH.so or exec:COMMAND");
    for (const Cell& cell : c.cells) {
      const std::optional<DType> dtype = parse_dtype(cell.dtype);
      if (cell.impl == impl && dtype && !(*it)->capabilities().supports(*dtype))
        throw UsageError(f + impl + " does not accept " + cell.dtype + " (it declares " +
                         describe_capabilities((*it)->capabilities()) + "); expected dtypes every listed built-in accepts");
    }
  }
  std::map<std::string, const Cell*> folders;
  for (const Cell& cell : c.cells)
    if (const auto [at, fresh] = folders.emplace(cell.dir, &cell); !fresh)
      throw UsageError(f + "the implementations " + Json(at->second->impl).dump() + " and " + Json(cell.impl).dump() +
                       " would share the report folder " + cell.dir +
                       " (a folder name keeps letters, digits, '.' and '_'); expected implementations whose folder "
                       "names differ");
  for (std::size_t n = 0; n < c.options.properties.size(); ++n)
    law_named_in_file(reg, c.options.properties[n], f + "\"options.properties[" + std::to_string(n) + "]\"");
  const auto folder = [&](const fs::path& dir, const std::string& what) {
    std::error_code ec;
    const fs::file_status st = fs::status(dir, ec);
    if (st.type() != fs::file_type::directory && st.type() != fs::file_type::not_found)
      throw UsageError("campaign: " + what + " " + dir.string() + " " +
                       (ec ? "cannot be used (" + ec.message() + ")" : std::string("exists and is not a folder")) +
                       "; expected a folder (created if missing) for the runs and the overview");
  };
  folder(root, co.report_dir.empty() ? "the report folder" : "--report-dir");
  for (const Cell& cell : c.cells) folder(root / cell.dir, "the run's folder");
}

// A cell's summary.json, or nothing when the cell has not run (no file there, or not JSON). What is there must
// be a regular file of a summary's size (a FIFO or /dev/zero is refused, not waited on or read forever), and
// the law names in it, which become links and file names, laws of this build.
std::optional<Json> cell_summary(const fs::path& file, const Registry& reg) {
  std::error_code ec;
  if (fs::symlink_status(file, ec).type() == fs::file_type::not_found) return std::nullopt;
  const std::string text =
      reports::read_data_file(file, reports::kMaxSmallFileBytes, "the summary.json that `attncheck check` writes");
  std::optional<Json> j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception&) {
    return std::nullopt;
  }
  if (const auto laws = j->find("laws"); j->is_object() && laws != j->end() && laws->is_array())
    for (std::size_t n = 0; n < laws->size(); ++n)
      if (const Json& e = (*laws)[n]; e.is_object())
        if (const auto law = e.find("law"); law != e.end() && law->is_string())
          law_named_in_file(reg, law->get<std::string>(),
                            "campaign: " + file.string() + ": \"laws[" + std::to_string(n) + "].law\"");
  return j;
}

// "[B,H,T,D]" of a cell's minimal case, from its LAW.json ("" when there is none).
std::string minimal_shape(const fs::path& law_json) {
  std::error_code ec;
  if (fs::symlink_status(law_json, ec).type() == fs::file_type::not_found) return "";
  const std::string text = reports::read_data_file(law_json, reports::kMaxCounterexampleBytes,
                                                   "the LAW.json report that `attncheck check` writes");
  try {
    const Json j = Json::parse(text);
    const Json& s = j.at("shape");
    std::string out = "B=" + std::to_string(s.at("B").get<Index>()) + " H=" + std::to_string(s.at("H").get<Index>()) +
                      " T=" + std::to_string(s.at("T").get<Index>()) + " D=" + std::to_string(s.at("D").get<Index>());
    if (s.contains("T_k")) out += " T_k=" + std::to_string(s["T_k"].get<Index>());
    if (s.contains("H_kv")) out += " H_kv=" + std::to_string(s["H_kv"].get<Index>());
    return out;
  } catch (const Json::exception&) {
    return "";
  }
}

// The overview: laws × cells, from each cell's summary.json.
std::string overview_markdown(const Campaign& c, const fs::path& root, const Registry& reg, int* missing) {
  std::vector<std::string> laws;
  std::set<std::string> known;
  std::vector<std::map<std::string, std::pair<std::string, std::string>>> cells;  // law -> (status, note)
  *missing = 0;
  for (const Cell& cell : c.cells) {
    std::map<std::string, std::pair<std::string, std::string>> by_law;
    if (const std::optional<Json> summary = cell_summary(root / cell.dir / "summary.json", reg)) {
      try {
        for (const Json& e : summary->at("laws")) {  // summary kept: a range-for over a temporary's member dangles
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
  std::vector<std::string> nowhere;  // laws not applicable in any run: listed under the table, not rows of n/a
  for (const std::string& law : laws) {
    const bool applies = std::any_of(cells.begin(), cells.end(), [&](const auto& by_law) {
      const auto it = by_law.find(law);
      return it == by_law.end() || it->second.first != "n/a";
    });
    if (!applies) {
      nowhere.push_back(law);
      continue;
    }
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
  if (!nowhere.empty()) {
    md += "\nNot applicable in any run (" + std::to_string(nowhere.size()) + " laws): ";
    for (std::size_t n = 0; n < nowhere.size(); ++n) md += (n ? ", `" : "`") + nowhere[n] + "`";
    md += ".\n";
  }
  return md;
}

}  // namespace

int run_campaign(const CampaignOptions& co, const Registry& reg, std::ostream& out, std::ostream& err) {
  const Campaign c = read_campaign(co.file);
  const Shard shard = shard_option(co.shard);
  const fs::path root = co.report_dir.empty() ? fs::path("attncheck-reports") / ("campaign-" + reports::slug(c.name))
                                              : fs::path(co.report_dir);
  validate_cells(c, co, reg, root);
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
    const std::string md = overview_markdown(c, root, reg, &missing);
    if (std::error_code ec; !fs::create_directories(root, ec) && ec)
      throw reports::FileError("campaign: cannot create the report folder " + root.string() + ": " + ec.message());
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
        try {
          if (const std::optional<Json> summary = cell_summary(root / cell.dir / "summary.json", reg))
            for (const Json& e : summary->at("laws")) {
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
