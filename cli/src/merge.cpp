// `attncheck merge --out DIR SHARD_DIR...`: the shards of one sharded run (`check --shard I/N`) combined into
// one report folder whose files are those the single run writes (summary.md, index.html, junit.xml,
// summary.json and every falsified law's report), byte for byte: the reports hold no timings, and each law
// ran with the run's seed in whichever shard checked it.
#include <algorithm>
#include <filesystem>
#include <map>
#include <ostream>

#include "attncheck/reports.hpp"
#include "check.hpp"

namespace attncheck::cli {
namespace fs = std::filesystem;

namespace {

reports::ShardDocument read_shard(const fs::path& dir) {
  const fs::path file = dir / "shard.json";
  std::error_code ec;
  if (fs::symlink_status(file, ec).type() == fs::file_type::not_found)
    throw UsageError("merge: " + dir.string() + " holds no readable shard.json; expected the report folder of one " +
                     "shard of a sharded run (attncheck check --shard I/N --report-dir DIR)");
  std::string text;
  try {
    text = reports::read_data_file(file, reports::kMaxCounterexampleBytes,
                                   "the shard.json that `attncheck check --shard I/N` writes");
  } catch (const reports::FileError& e) {
    throw UsageError(std::string("merge: ") + e.what());
  }
  try {
    return reports::shard_from_json(reports::Json::parse(text), file.string());
  } catch (const reports::Json::exception& e) {
    throw UsageError("merge: " + file.string() + " is not valid JSON (" + e.what() + ")");
  } catch (const reports::FormatError& e) {
    throw UsageError(std::string("merge: ") + e.what());
  }
}

// What a shard says is checked before any of it is used: a shard is often a downloaded CI artifact, and its
// names become file names (LAW.json) and its verdicts the merged run's. Every name must be one this build
// knows, every report one of this shard's laws, and every verdict consistent with its own figures.
void check_shard(const reports::ShardDocument& d, const fs::path& file, const Registry& reg) {
  const std::string f = "merge: " + file.string() + ": ";
  check_name_in_file(d.run.implementation, f + "\"run.implementation\"");
  if (d.run.program != "attncheck")
    throw UsageError(f + "\"run.program\" is " + reports::Json(d.run.program).dump() +
                     "; expected \"attncheck\" (the program the reports' commands start)");
  std::map<std::string, std::size_t> position;  // law -> its position in the run
  for (std::size_t k = 0; k < d.laws.size(); ++k) {
    const Law& law = law_named_in_file(reg, d.laws[k], f + "\"laws[" + std::to_string(k) + "]\"");
    if (!position.emplace(law.name, k).second)
      throw UsageError(f + "\"laws\" lists " + law.name + " twice; expected each law of the run once");
  }
  for (std::size_t n = 0; n < d.reports.size(); ++n) {
    const LawResult& r = d.reports[n].result;
    const std::string at = f + "\"reports[" + std::to_string(n) + "]";
    const Law& law = law_named_in_file(reg, r.law, at + ".law\"");
    const auto it = position.find(law.name);
    if (it == position.end() || int(it->second % std::size_t(d.count)) != d.index)
      throw UsageError(at + ".law\" is " + law.name + "; expected one of shard " + std::to_string(d.index) + "/" +
                       std::to_string(d.count) + "'s laws (those at positions k of \"laws\" with k % " +
                       std::to_string(d.count) + " == " + std::to_string(d.index) + ")");
    const std::string of = at + "\" (" + law.name + ")";
    if (r.implementation != d.run.implementation)
      throw UsageError(of + ": \"implementation\" is " + reports::Json(r.implementation).dump() + "; expected the run's, " +
                       reports::Json(d.run.implementation).dump());
    if (r.dtype != d.run.dtype)
      throw UsageError(of + ": \"dtype\" is " + std::string(dtype_name(r.dtype)) + "; expected the run's, " +
                       std::string(dtype_name(d.run.dtype)));
    if (r.timeouts > r.calls)
      throw UsageError(of + ": \"timeouts\" is " + std::to_string(r.timeouts) + " but \"calls\" is " +
                       std::to_string(r.calls) + "; expected at most one timeout per call");
    if (r.status == LawStatus::falsified && !r.violation)
      throw UsageError(of + ": \"status\" is \"falsified\" but \"violation\" is null; expected a falsified law to "
                       "come with the violation that falsified it");
    if (r.status == LawStatus::held || r.status == LawStatus::not_applicable) {
      const std::string status = r.status == LawStatus::held ? "held" : "n/a";
      if (r.violation || r.minimal_case)
        throw UsageError(of + ": \"status\" is \"" + status + "\" but it holds " +
                         (r.violation ? "a violation" : "a minimal case") +
                         "; expected \"violation\" and \"minimal_case\" null unless the law was falsified");
    }
    if (r.status == LawStatus::held && r.cases_run > d.run.cases)
      throw UsageError(of + ": \"status\" is \"held\" in \"cases_run\" " + std::to_string(r.cases_run) +
                       " cases; expected at most the run's " + std::to_string(d.run.cases) + " cases per law");
  }
}

// `path` absolute, with every symbolic link of its existing part resolved.
fs::path resolved(const fs::path& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path), ec);
  if (ec) p = fs::absolute(path).lexically_normal();
  while (p.has_relative_path() && p.filename().empty()) p = p.parent_path();  // "out/" -> "out"
  return p;
}

// Refused before anything is read or written: an --out that is one of the shard folders, or a folder that holds
// one (named directly or through a link), would have its report replaced by the merged one, shard.json included.
void check_out_apart_from_shards(const MergeOptions& m) {
  const fs::path out = resolved(m.out);
  for (const std::string& shard : m.shards) {
    std::error_code ec;
    const fs::path in = resolved(shard);
    const auto [o, i] = std::mismatch(out.begin(), out.end(), in.begin(), in.end());
    const bool same = fs::equivalent(m.out, shard, ec) || (o == out.end() && i == in.end());
    if (same || o == out.end())
      throw UsageError("merge: --out " + m.out + (same ? " is the shard folder " : " holds the shard folder ") + shard +
                       ", which the merge reads; expected a folder apart from every shard");
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
       {differ("implementation", x.implementation, y.implementation),
        differ("dtype", std::string(dtype_name(x.dtype)), std::string(dtype_name(y.dtype))),
        differ("seed", n(x.seed), n(y.seed)), differ("cases", n(x.cases), n(y.cases)),
        differ("--law-calls", n(x.law_calls), n(y.law_calls)), differ("max_size", n(x.max_size), n(y.max_size)),
        differ("--max-B", n(x.gen.max_B), n(y.gen.max_B)), differ("--max-H", n(x.gen.max_H), n(y.gen.max_H)),
        differ("--max-Hkv", n(x.gen.max_H_kv), n(y.gen.max_H_kv)), differ("--min-T", n(x.gen.min_T), n(y.gen.min_T)),
        differ("--max-T", n(x.gen.max_T_tail), n(y.gen.max_T_tail)), differ("--max-D", n(x.gen.max_D), n(y.gen.max_D)),
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

int run_merge(const MergeOptions& m, const Registry& registry, std::ostream& out) {
  if (m.shards.empty()) throw UsageError("merge: expected the shards' report folders after --out DIR");
  check_out_apart_from_shards(m);
  std::vector<reports::ShardDocument> docs;
  for (const std::string& dir : m.shards) {
    docs.push_back(read_shard(dir));
    check_shard(docs.back(), fs::path(dir) / "shard.json", registry);
  }
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
