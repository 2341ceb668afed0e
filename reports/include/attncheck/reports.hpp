// Counterexample reports: what one `attncheck check` run writes (LAW.json, LAW.md with SVG pictures,
// summary.json, summary.md, junit.xml), atomic publishing without silent overwrites, and the corpus of every
// failure that later runs replay first.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "attncheck/law.hpp"
#include "attncheck/report_json.hpp"

namespace attncheck::reports {

/// The settings of one run, as reports print them and as replay commands need them.
struct RunInfo {
  std::string implementation;              ///< the spec as --impl took it
  std::string implementation_description;  ///< one line
  DType dtype = DType::f32;
  std::uint64_t seed = 0;
  int cases = 100;                         ///< per law, at most
  long law_calls = 0;                      ///< the calls a law's cases may make, about (RunOptions::law_calls)
  int max_size = 100;                      ///< RapidCheck's max_size
  GenConfig gen;                           ///< the bounds max_B..max_D (caps are not reported)
  std::string program = "attncheck";       ///< how the commands printed in reports start
  /// {index, count} when this run is one shard of a sharded run (its summaries say so); a merged report, like
  /// the single run, has none.
  std::optional<std::array<int, 2>> shard;
};

/// One law's result, what reports say about the law, and where it can be replayed from.
struct LawReport {
  LawResult result;
  std::string summary;      ///< Law::summary
  std::string why;          ///< Law::why
  /// Empty when generated in this run; else the corpus file that failed again. Only the terminal says so: the
  /// report of a case replayed from the corpus is the report written when it was found (same seed, cases run
  /// and shrink steps), so rerunning a command rewrites identical files.
  std::string found_by;
  std::string replay_file;  ///< the file `--replay` takes (LAW.json or the corpus entry), as printed
};

/// Which kinds of files a run writes (`--format md,json,junit,html`).
struct Formats {
  bool md = true, json = true, junit = true, html = true;
};
/// Parses "md,json,junit,html" (any non-empty subset); throws std::invalid_argument naming the bad item.
Formats parse_formats(std::string_view list);

/// A file of a report, by name inside the report folder.
struct ReportFile {
  std::string name;
  std::string content;
};

/// The file names a falsified law's report uses: LAW.json, LAW.md, LAW.html, LAW-weights.svg, LAW-error.svg,
/// LAW-variance.svg.
std::string law_file(std::string_view law, std::string_view suffix);

/// "100 cases per law"; with a calls allowance (RunInfo::law_calls) that can cut a law's cases, "up to 100 cases per
/// law (about 100 calls each, at least 20 cases)".
std::string cases_per_law(const RunInfo& run);
/// `attncheck check --impl SPEC --replay FILE`: re-checks exactly the stored case.
std::string replay_command(const RunInfo& run, const LawReport& r);
/// `s` quoted for a POSIX shell when it holds anything beyond plain word characters, as the printed commands
/// quote an implementation or a file.
std::string shell_quote(std::string_view s);
/// A pinned shape as `--shape` takes it: "B,H,T_q,T_k,D".
std::string shape_option(const std::array<Index, 5>& shape);
/// `attncheck check ... --property LAW --reproduce STRING`: regenerates the case from RapidCheck's string.
std::string reproduce_command(const RunInfo& run, const LawReport& r);

/// The LAW.json document of a falsified law; a corpus entry is the same document.
Json law_document(const RunInfo& run, const LawReport& r);

/// Every file of a run, rendered deterministically (no dates, no timings): per falsified law its JSON,
/// Markdown, pictures and HTML page; then summary.md, index.html, junit.xml and summary.json, as `formats` asks.
std::vector<ReportFile> render_run(const RunInfo& run, const std::vector<LawReport>& laws, const Formats& formats);

/// One shard of a sharded run (`attncheck check --shard I/N`): what `attncheck merge` needs to render the whole
/// run's reports as a single run would: the run's settings and formats, every law the whole run checks (in
/// order), and this shard's law reports in full. Written as shard.json beside the shard's reports.
struct ShardDocument {
  RunInfo run;
  Formats formats;
  int index = 0, count = 1;         ///< shard `index` of `count` (0-based)
  std::vector<std::string> laws;    ///< every law of the whole run, in its order
  std::vector<LawReport> reports;   ///< this shard's laws: those at positions k with k % count == index
};
Json to_json(const ShardDocument& d);
/// Reads a shard document; throws FormatError naming the field, what was expected and what came.
ShardDocument shard_from_json(const Json& j, const std::string& what);

/// The pictures of one falsified law, by file name (LAW-error.svg, LAW-weights.svg, LAW-variance.svg): the error
/// map when the law has a tolerance per entry, else the weights; the variance sweep when there is one.
std::vector<ReportFile> law_pictures(const RunInfo& run, const LawReport& r);

/// The Markdown report of one falsified law (pictures are referenced by file name).
std::string law_markdown(const RunInfo& run, const LawReport& r);
/// summary.md: the run's settings, one table row per law (margin = worst error / tolerance, for a falsified law
/// with a tolerance), and each falsified law's message, replay command and pictures. `report_ext` is the
/// extension the law links point at (".md" or ".html").
std::string summary_markdown(const RunInfo& run, const std::vector<LawReport>& laws, const Formats& formats,
                             std::string_view report_ext = ".md");

/// The subset of Markdown attncheck writes (headings, paragraphs, block quotes, lists, tables, code spans,
/// bold, italics, links, images) as HTML. An image whose file is in `svgs` is inlined as SVG; links to .md
/// files point at the .html page beside them.
std::string markdown_to_html(std::string_view md, const std::vector<ReportFile>& svgs);
/// A whole self-contained HTML page: inline style, no scripts, a policy that forbids loading anything.
std::string html_page(const std::string& title, const std::string& body);
/// An SVG heatmap of weights [T_q,T_k] of one head: the keys a query may not see under `vis` (future keys,
/// padding, keys outside the window) outlined in red, the worst cell in black.
std::string weights_svg(const Tensor<double>& weights, Index b, Index h, const Visibility& vis,
                        const std::vector<Index>& worst_index, const std::string& title);
/// The error map of head (b,h) of a violation with `tolerances`: |actual - expected| / tolerance per entry on
/// a log colour scale (weights a query may not see under `vis` outlined, NaN/Inf marked, cells past the
/// tolerance carry class "over"),
/// beside the actual values. Heads over 48 entries a side are max-pooled, and the picture says so.
/// Throws std::invalid_argument without expected, actual and tolerances of one shape.
std::string error_map_svg(const Violation& v, Index b, Index h, const Visibility& vis, const std::string& title);
/// The score variance swept over D (log-log), with its 95% band, against the lines 1 (correct), D (scale
/// forgotten) and 1/D (scale applied twice).
std::string variance_svg(const std::vector<VariancePoint>& series, const std::string& title);
/// JUnit XML: one testsuite for the run, one testcase per law.
std::string junit_xml(const RunInfo& run, const std::vector<LawReport>& laws);

/// A report file could not be written or read (permissions, not a directory, disk full).
class FileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A report folder already holds a different report from an earlier run, and --force was not given.
class ReportExists : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The largest small data file attncheck reads: a campaign file, a run's summary.json, a report folder's list
/// of files. Real ones are kilobytes (the summary of every law with its notes and coverage tags is about
/// 30 KB); 16 MiB leaves room for any real one and caps what parsing a hostile one costs.
inline constexpr std::uintmax_t kMaxSmallFileBytes = std::uintmax_t{16} << 20;

/// Reads the whole of a file attncheck takes as data (a shard, a campaign file, a summary, a corpus entry, a
/// replay file): before a byte is read it must be a regular file (symbolic links followed) of at most
/// `max_bytes`, so a FIFO, a device such as /dev/zero, a folder or a huge file is refused at once instead of
/// hanging or exhausting memory; opening it never blocks. `expected` says what the file should have been
/// ("a shard.json written by `attncheck check --shard I/N`"). Throws FileError naming the file, what it is and
/// `expected`.
std::string read_data_file(const std::filesystem::path& file, std::uintmax_t max_bytes, std::string_view expected);

/// Creates `file` if missing, as a runner's status file asks (GTEST_SHARD_STATUS_FILE), without truncating
/// it; never blocks: a FIFO, a folder or a device there is refused. Throws FileError naming the file, what it
/// is and `expected`.
void touch_file(const std::filesystem::path& file, std::string_view expected);

/// Writes `content` to a temporary file beside `path`, flushes it to disk and renames it over `path`, so a
/// reader sees the old file or the new one, never half of one. Throws FileError.
void write_atomic(const std::filesystem::path& path, std::string_view content);

/// What publish() did.
struct PublishResult {
  std::vector<std::string> written, unchanged, removed;
  bool swapped = false;  ///< the folder was replaced as a whole (see ReportFolder::publish)
};

/// Another run holds the report folder (it is checking an implementation into it right now).
class ReportBusy : public FileError {
 public:
  using FileError::FileError;
};

/// One run's hold on its report folder, taken before the first law runs: the folder is created if missing
/// and must be a writable folder; an exclusive lock (flock on DIR/.attncheck-lock, which names the holder)
/// keeps a second run out at once; leftovers of an interrupted run (temporary files, a half-published
/// folder) are cleaned up; and a folder that holds another implementation's report is refused now, not
/// after every law ran. Released when destroyed.
class ReportFolder {
 public:
  /// Throws FileError (not a folder, not writable), ReportBusy, and ReportExists unless `force`.
  ReportFolder(std::filesystem::path dir, std::string implementation, bool force);
  ~ReportFolder();
  ReportFolder(const ReportFolder&) = delete;
  ReportFolder& operator=(const ReportFolder&) = delete;

  const std::filesystem::path& dir() const { return dir_; }

  /// Writes `files` as the folder's report. Nothing changes when every file is already there with the same
  /// bytes. A report this implementation wrote before is replaced; if a file would change that an earlier
  /// run of another implementation wrote (or that attncheck did not write), or one of its files would be left
  /// stale, nothing is written and ReportExists is thrown, unless `force`. The folder is replaced as a whole
  /// (the new files beside it, then one atomic exchange, Linux renameat2), so a reader sees the old report
  /// or the new one, never files of two runs; where that cannot be done (the folder holds files attncheck
  /// did not write, or its parent is not writable) the files are replaced one by one, summary.json last.
  PublishResult publish(const std::vector<ReportFile>& files, bool force);

 private:
  std::filesystem::path dir_;
  std::string implementation_;
  int lock_fd_ = -1;
};

/// publish() through a ReportFolder taken for this call alone, for an unnamed implementation (so any earlier
/// report counts as another's).
PublishResult publish(const std::filesystem::path& dir, const std::vector<ReportFile>& files, bool force);

/// The files of `law`'s report (LAW.json, LAW.md, ...) that an earlier run listed as its own in `dir`, as they
/// are there: a run that did not check the law keeps them.
std::vector<ReportFile> law_files_in(const std::filesystem::path& dir, std::string_view law);

/// "mutant:mask-zero" -> "mutant-mask-zero": a file-name-safe form of an implementation spec.
std::string slug(std::string_view spec);

/// The counterexample corpus of one implementation: a folder of LAW-<hash>.json files, each a law_document.
/// Entries are only ever added, never changed or removed.
class Corpus {
 public:
  /// The corpus folder itself (ROOT/<slug>); created on the first save.
  explicit Corpus(std::filesystem::path dir) : dir_(std::move(dir)) {}
  const std::filesystem::path& dir() const { return dir_; }
  /// Where the case of `law` is kept: DIR/<law>-<case hash>.json.
  std::filesystem::path path_for(std::string_view law, const LawCase& c) const;
  /// The entries of `law`, sorted by file name (so replay order is stable).
  std::vector<std::filesystem::path> entries(std::string_view law) const;
  /// Stores `doc` at `path` unless a file is already there (same case, same hash). True when written; throws
  /// FileError when it cannot be written (a read-only or full corpus, a loop of links).
  bool save(const std::filesystem::path& path, const Json& doc) const;

 private:
  std::filesystem::path dir_;
};

/// A counterexample read back from a LAW.json report or a corpus entry.
struct StoredCounterexample {
  std::string law, implementation;
  DType dtype = DType::f32;
  std::uint64_t seed = 0;
  int cases = 100, max_size = 100;
  GenConfig gen;
  std::string reproduce;  ///< empty when the failure did not come from RapidCheck generation
  int cases_run = 0, shrink_steps = 0;  ///< how it was found
  long calls = 0;                       ///< calls to the implementation it took, as recorded
  LawCase lcase;
  std::optional<Violation> violation;  ///< as recorded
};

/// The largest counterexample file read_counterexample reads. The largest case attncheck writes at its default
/// bounds (B, H <= 4, T <= 256, D <= 128), even unshrunk, holds about 6.2M numbers: q, k, v and the variant's
/// (6 x 2^19), dO (2^19), the violation's expected, actual and tolerances (3 x 2^19) and weights (2^20), at
/// most 24 bytes each as attncheck writes them (17 digits, sign, exponent, ", "): about 150 MB. 256 MiB lies
/// above that; a minimal (shrunk) case is kilobytes. Parsing costs about 40 bytes per number, so the limit also
/// caps what a hostile file costs (about 5 GB). A case pinned by --shape past the default bounds may exceed it.
inline constexpr std::uintmax_t kMaxCounterexampleBytes = std::uintmax_t{256} << 20;

/// Reads a LAW.json report or a corpus entry. Throws FileError when it cannot be read, FormatError when it
/// is not a counterexample attncheck wrote.
StoredCounterexample read_counterexample(const std::filesystem::path& file);
/// The same, from a document already parsed; `what` names it in messages. Throws FormatError.
StoredCounterexample counterexample_from_json(const Json& doc, const std::string& what);

}  // namespace attncheck::reports
