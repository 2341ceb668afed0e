// `attncheck check` and `attncheck list`: the options as parsed, and the functions that run them.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include "attncheck/cli.hpp"

namespace attncheck::cli {

/// The default seed: fixed, so two runs of the same command check the same cases and write the same report.
inline constexpr std::uint64_t kDefaultSeed = 1;
/// Shrinking one law stops after this many seconds unless --shrink-time says otherwise: a mutant of the zoo
/// shrinks in well under a second, while a black box probed for its weights, or a failure near the tolerance
/// in bfloat16, was seen shrinking for over 15 minutes. 20 s per law keeps a run with every law falsified to
/// minutes, and the report says when a case was cut short.
inline constexpr double kDefaultShrinkSeconds = 20;
/// The default root of report folders: each implementation's reports go to ROOT/<slug of its spec>.
inline constexpr const char* kDefaultReportRoot = "attncheck-reports";

/// `attncheck check`'s options, as CLI11 fills them in.
struct CheckOptions {
  /// How the program was invoked (argv[0]): the replay commands printed on the terminal start with it when it
  /// is a path (build/default/cli/attncheck is not on PATH after a build); the reports keep "attncheck".
  std::string program = "attncheck";
  std::string impl;
  int cases = 100;
  /// The calls a law's cases may make, about (RunOptions::law_calls): a law whose cases make several calls each
  /// checks fewer cases. Negative: --cases; 0: no limit (every law checks --cases cases).
  long law_calls = -1;
  std::uint64_t seed = kDefaultSeed;
  Index max_B = 4, max_H = 4, max_T = 256, max_D = 128;
  Index max_H_kv = 0;  ///< 0: kv heads up to H
  Index min_T = 1;
  std::string shape;  ///< "B,H,T_q,T_k,D": every case has this shape; empty: drawn
  std::string dtype = "float32";
  /// --dtype given more than once (or as a list): one run per dtype, one after the other, with one implementation
  /// (one plug-in load, one exec: process) for all of them, each into <report-dir>/<dtype>/. Empty or one: `dtype`.
  std::vector<std::string> dtypes;
  std::vector<std::string> properties;
  std::string report_dir;  ///< empty: attncheck-reports/<slug>
  std::string format = "md,json,junit,html";
  std::string replay;
  std::string reproduce;
  std::string corpus;      ///< empty: <report root>/corpus
  bool no_corpus = false;
  bool force = false;
  bool progress = false;
  double timeout = 0;      ///< seconds per plug-in call; 0: $ATTNCHECK_CALL_TIMEOUT, else 10
  double shrink_time = kDefaultShrinkSeconds;  ///< seconds of shrinking per law; 0: no limit
  long max_calls = 0;      ///< calls to the implementation in the whole run; 0: no limit
  int stress = 1;          ///< the determinism laws' calls per case (at least 2 are made)
  bool long_mode = false;  ///< --long: keys of 2^15 ± 1 and 2^16 ± 1 (kLongLengths), decode steps, chunks, square
  int jobs = 0;            ///< laws checked at once; 0: one per core
  std::string shard;       ///< "I/N": check only shard I (from 0) of N; empty: $GTEST_SHARD_INDEX/$GTEST_TOTAL_SHARDS or all
  /// Whether an empty `shard` reads GoogleTest's variables (the command line's check does; a campaign's cells,
  /// which the campaign shards itself, do not).
  bool shard_from_environment = true;
  /// Exit 0 instead of kIncomplete when nothing was falsified but an applicable law was not checked in full.
  bool accept_incomplete = false;
  /// Which bounds were given on the command line; a long-context run picks its own defaults for the others.
  struct Given {
    bool cases = false, max_B = false, max_H = false, max_D = false, max_T = false, min_T = false, max_H_kv = false;
  } given;
};

/// Which shard of a run this process checks (`--shard I/N`, or GoogleTest's GTEST_SHARD_INDEX and
/// GTEST_TOTAL_SHARDS): the laws at positions k of the run with k % count == index.
struct Shard {
  bool given = false;
  int index = 0, count = 1;
};
/// Parses --shard (or, when it is empty and `environment`, the GoogleTest variables, touching
/// $GTEST_SHARD_STATUS_FILE when it is set, as GoogleTest does); throws UsageError naming what was expected.
Shard shard_option(const std::string& flag, bool environment = true);

/// The law of this build named `name`, or nullptr.
const Law* find_law(const Registry& registry, std::string_view name);
/// A law name read from a file (`where` names the file and its field): it becomes a file name (LAW.json) and
/// a link, so it must name a law of this build. Throws UsageError naming the file, the field, what was
/// expected and what came.
const Law& law_named_in_file(const Registry& registry, const std::string& name, const std::string& where);
/// Any other name read from a file (an implementation): one line of printable text, at most 4096 bytes, as it
/// goes into reports, manifests and messages. Throws UsageError naming `where`, what was expected and what came.
void check_name_in_file(const std::string& name, const std::string& where);

/// `attncheck merge --out DIR SHARD_DIR...`.
struct MergeOptions {
  std::string out;
  std::vector<std::string> shards;
  bool force = false;
  bool accept_incomplete = false;  ///< exit 0 instead of kIncomplete when a shard left a law not checked
};
/// Combines the shard folders of one sharded run into `out`, whose reports equal the single run's; returns an
/// ExitCode (0 every law held, 1 one was falsified). Throws UsageError for a folder that is no shard, shards of
/// different runs, a shard missing or given twice.
int run_merge(const MergeOptions& m, const Registry& registry, std::ostream& out);

/// `attncheck campaign FILE`.
struct CampaignOptions {
  std::string file;
  std::string report_dir;  ///< empty: attncheck-reports/campaign-<name>
  std::string shard;       ///< "I/N": only every N-th run; empty: the GoogleTest variables, or all
  bool overview_only = false;
  bool no_corpus = false, force = false;
  bool accept_incomplete = false;  ///< exit 0 instead of kIncomplete when a cell is missing or incomplete
  bool allow_programs = false;  ///< --allow-programs: run the plugin: and exec: implementations the file names
};
/// Runs a campaign's cells (each a `check` into its own folder, one shared corpus) and writes the overview page
/// (overview.md, index.html); a shard writes no overview, `overview_only` writes it from the cells on disk.
/// Every cell is validated before the first runs; a file naming plugin: or exec: implementations runs them only
/// with `allow_programs`. Returns kFalsified when any cell falsified a law. Throws UsageError for a bad campaign
/// file.
int run_campaign(const CampaignOptions& co, const Registry& reg, std::ostream& out, std::ostream& err);

/// Above this T every case is a long context even at B = H = 1 (T² > 2^22 weights, see kMaterialisedWeights):
/// `check` then defaults to kLongContextDefaults instead of 100 cases at B, H <= 4, D <= 128.
inline constexpr Index kLongContextT = 2048;
/// A long-context case costs about B·H·T²·D (seconds each at T = 16384), so a long run checks two cases per law
/// at B = 1, H <= 2, D <= 64 unless told otherwise: every law still sees several heads and a full-size D.
inline constexpr int kLongContextCases = 2;
inline constexpr Index kLongContextMaxB = 1, kLongContextMaxH = 2, kLongContextMaxD = 64;
/// `--long`: the key lengths (where an int16 position or index wraps, 2^15, and a 64K context's last tile ends
/// ragged), and the cases per law unless --cases (half of them decode steps, O(T·D) each; a square one costs
/// minutes at 2^16).
inline const std::vector<Index> kLongLengths{32767, 32769, 65535, 65537};
inline constexpr int kLongCases = 4;

/// Runs the laws against --impl (or replays --replay); returns an ExitCode. Throws UsageError and the
/// reports' FileError / FormatError / ReportExists for exit code 2.
int run_check(const CheckOptions& o, const Registry& registry, std::ostream& out, std::ostream& err,
              bool err_is_terminal);

/// Prints every law and built-in implementation, one per line, name first.
/// `attncheck list`: the laws and the built-in implementations, one per line; `markdown`: the laws table of
/// docs/laws.md instead.
int run_list(const Registry& registry, std::ostream& out, bool markdown = false);


}  // namespace attncheck::cli
