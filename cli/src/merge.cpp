// `attncheck merge --out DIR SHARD_DIR...`: the shards of one sharded run (`check --shard I/N`) combined into
// one report folder whose files are those the single run writes (summary.md, index.html, junit.xml,
// summary.json and every falsified law's report), byte for byte: the reports hold no timings, and each law
// ran with the run's seed in whichever shard checked it.
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <sstream>

#include "attncheck/reports.hpp"
#include "check.hpp"

namespace attncheck::cli {
namespace fs = std::filesystem;

namespace {

reports::ShardDocument read_shard(const fs::path& dir) {
  const fs::path file = dir / "shard.json";
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw UsageError("merge: " + dir.string() + " holds no readable shard.json; expected the report folder of one " +
                     "shard of a sharded run (attncheck check --shard I/N --report-dir DIR)");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return reports::shard_from_json(reports::Json::parse(text.str()), file.string());
  } catch (const reports::Json::exception& e) {
    throw UsageError("merge: " + file.string() + " is not valid JSON (" + e.what() + ")");
  } catch (const reports::FormatError& e) {
    throw UsageError(std::string("merge: ") + e.what());
  }
}

// What differs between two shards' runs, or "" when they are shards of the same run.
std::string run_difference(const reports::ShardDocument& a, const reports::ShardDocument& b) {
  const reports::RunInfo &x = a.run, &y = b.run;
  const auto differ = [](const char* what, const std::string& u, const std::string& v) {
    return u == v ? std::string() : std::string(what) + " " + u + " vs. " + v;
  };
  const auto n = [](auto v) { return std::to_string(v); };
  for (const std::string& d :
       {differ("implementation", x.implementation, y.implementation), differ("dtype", std::string(dtype_name(x.dtype)), std::string(dtype_name(y.dtype))),
        differ("seed", n(x.seed), n(y.seed)), differ("cases", n(x.cases), n(y.cases)),
        differ("max_size", n(x.max_size), n(y.max_size)), differ("--max-B", n(x.gen.max_B), n(y.gen.max_B)),
        differ("--max-H", n(x.gen.max_H), n(y.gen.max_H)), differ("--max-Hkv", n(x.gen.max_H_kv), n(y.gen.max_H_kv)),
        differ("--min-T", n(x.gen.min_T), n(y.gen.min_T)), differ("--max-T", n(x.gen.max_T_tail), n(y.gen.max_T_tail)),
        differ("--max-D", n(x.gen.max_D), n(y.gen.max_D)),
        differ("--shape", x.gen.shape ? reports::shape_option(*x.gen.shape) : "none",
               y.gen.shape ? reports::shape_option(*y.gen.shape) : "none"),
        differ("--long", x.gen.long_lengths.empty() ? "off" : "on", y.gen.long_lengths.empty() ? "off" : "on"),
        differ("shards", n(a.count), n(b.count))})
    if (!d.empty()) return d;
  if (a.laws != b.laws) return "the laws of the run (another --property list)";
  if (a.formats.md != b.formats.md || a.formats.json != b.formats.json || a.formats.junit != b.formats.junit ||
      a.formats.html != b.formats.html)
    return "--format";
  return "";
}

}  // namespace

int run_merge(const MergeOptions& m, std::ostream& out) {
  if (m.shards.empty()) throw UsageError("merge: expected the shards' report folders after --out DIR");
  std::vector<reports::ShardDocument> docs;
  for (const std::string& dir : m.shards) docs.push_back(read_shard(dir));
  const reports::ShardDocument& first = docs.front();
  std::map<int, std::string> seen;  // shard index -> its folder
  for (std::size_t n = 0; n < docs.size(); ++n) {
    if (const std::string d = run_difference(first, docs[n]); !d.empty())
      throw UsageError("merge: " + m.shards[n] + " is a shard of another run than " + m.shards[0] + " (" + d + ")");
    if (const auto [it, fresh] = seen.emplace(docs[n].index, m.shards[n]); !fresh)
      throw UsageError("merge: shard " + std::to_string(docs[n].index) + "/" + std::to_string(first.count) +
                       " is given twice (" + it->second + " and " + m.shards[n] + ")");
  }
  std::string missing;
  for (int i = 0; i < first.count; ++i)
    if (!seen.count(i)) missing += (missing.empty() ? "" : ", ") + std::to_string(i) + "/" + std::to_string(first.count);
  if (!missing.empty()) throw UsageError("merge: the run has " + std::to_string(first.count) + " shards; missing: " + missing);

  std::map<std::string, reports::LawReport> by_law;
  for (std::size_t n = 0; n < docs.size(); ++n)
    for (reports::LawReport& r : docs[n].reports) {
      const std::string law = r.result.law;
      if (!by_law.emplace(law, std::move(r)).second)
        throw UsageError("merge: law " + law + " is reported by two shards (one is " + m.shards[n] + ")");
    }
  const fs::path out_dir(m.out);
  std::vector<reports::LawReport> results;
  int falsified = 0, na = 0, not_checked = 0;
  for (const std::string& law : first.laws) {
    const auto it = by_law.find(law);
    if (it == by_law.end())
      throw UsageError("merge: no shard reports law " + law + " (a shard's run stopped before it, or its folder is stale)");
    reports::LawReport r = std::move(it->second);
    // The replay file, as the single run names it: this folder's LAW.json.
    if (r.result.status == LawStatus::falsified && r.result.minimal_case && first.formats.json)
      r.replay_file = (out_dir / reports::law_file(law, ".json")).string();
    falsified += r.result.status == LawStatus::falsified;
    na += r.result.status == LawStatus::not_applicable;
    not_checked += r.result.status == LawStatus::not_checked;
    results.push_back(std::move(r));
  }
  if (by_law.size() != first.laws.size())
    throw UsageError("merge: the shards report laws the run does not list (the shard folders hold stale reports)");

  reports::ReportFolder folder(out_dir, first.run.implementation, m.force);
  const reports::PublishResult published = folder.publish(reports::render_run(first.run, results, first.formats), m.force);
  const int applicable = int(results.size()) - na;
  out << "attncheck merge: " << docs.size() << " shard" << (docs.size() == 1 ? "" : "s") << " of "
      << first.run.implementation << " (" << dtype_name(first.run.dtype) << ", seed " << first.run.seed << ")\n";
  out << first.run.implementation << ": "
      << (falsified     ? std::to_string(falsified) + " of " + std::to_string(applicable) + " laws falsified" +
                              (not_checked ? ", " + std::to_string(not_checked) + " not checked" : std::string())
          : not_checked ? "INCOMPLETE: " + std::to_string(not_checked) + " of " + std::to_string(applicable) +
                              " laws not checked"
                        : "all " + std::to_string(applicable) + " laws held")
      << (na ? " (" + std::to_string(na) + " not applicable)" : std::string()) << "; seed " << first.run.seed
      << ". Reports in " << out_dir.string() << "/" << (published.written.empty() ? " (unchanged)" : "") << "\n";
  for (const auto& r : results) {
    if (r.result.status != LawStatus::falsified) continue;
    std::string message = r.result.violation ? r.result.violation->message : std::string("falsified");
    if (message.starts_with(r.result.law + ": ")) message.erase(0, r.result.law.size() + 2);  // said once is enough
    out << "  " << r.result.law << ": " << message << "\n";
  }
  if (falsified) return kFalsified;
  return not_checked && !m.accept_incomplete ? kIncomplete : kAllHeld;
}

}  // namespace attncheck::cli
