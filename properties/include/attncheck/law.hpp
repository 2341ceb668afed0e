// Laws of scaled causal attention, and the runner that checks one against an implementation with
// RapidCheck and keeps the shrunk counterexample in a form reports can print and replay.
#pragma once

#include <rapidcheck.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attncheck/implementation.hpp"

namespace attncheck {

/// The ranges the generator bounds may take, on the command line and in a stored counterexample alike:
/// B, H, H_kv and D up to 2^16, sequence lengths up to 2^20 (Capabilities::max_T's default), cases per law up
/// to 10^7, RapidCheck's size up to 10^4 (attncheck runs at 100, RapidCheck's default).
inline constexpr std::int64_t kMaxExtent = std::int64_t{1} << 16;
inline constexpr std::int64_t kMaxSeqLen = std::int64_t{1} << 20;
inline constexpr int kMaxCases = 10'000'000;
inline constexpr int kMaxRcSize = 10'000;

/// Bounds for the generators. The implementation's capabilities narrow them further.
struct GenConfig {
  DType dtype = DType::f32;
  Index max_B = 4, max_H = 4;
  /// At most this many kv heads, for implementations with grouped-query attention (0: up to H). 1 asks for
  /// multi-query attention throughout. K and V of other implementations always have H heads.
  Index max_H_kv = 0;
  Index min_T = 1;         ///< no sequence (query or key) shorter than this
  Index max_T = 64;        ///< usual upper bound on T
  Index max_T_tail = 256;  ///< a tail up to this, reached as RapidCheck's size grows
  Index max_D = 128;
  /// `--stress N`: the determinism laws make each call N times (at least twice), concurrently for a reentrant
  /// implementation, so that races and state between calls show. Recorded in each case (params "repeats").
  int stress = 1;
  Capabilities caps;       ///< what the implementation under test accepts
  /// One pinned shape {B, H, T_q, T_k, D} (a long-context run): every generated problem has it and shrinking
  /// leaves it alone; only values vary and shrink.
  std::optional<std::array<Index, 5>> shape;
  /// `--long`: every case's keys are one of these lengths (2^15 ± 1 and 2^16 ± 1: where an int16 position or
  /// index wraps, and the tiles of a 64K context end ragged), its queries a decode step (T_q = 1), a prefill chunk
  /// (T_q <= long_max_T_q) or, when long_max_T_q is 0, as many as its keys too; shrinking moves only between these
  /// lengths (and toward fewer queries). Empty: off.
  std::vector<Index> long_lengths{};
  /// The most queries of a long case; 0: square long cases too. When set, a law that draws square cases only (no
  /// cache calls) gets the ordinary lengths instead.
  Index long_max_T_q = 0;
};

/// One generated case of one law: the problem the implementation is called with, and whatever else the law
/// needs (a second, perturbed problem; parameters such as the position t that was perturbed).
struct LawCase {
  Problem problem;
  std::optional<Problem> variant;        ///< relational laws: the perturbed / permuted / prefix problem
  std::map<std::string, double> params;  ///< law-specific: "t", "b", "h", "sample_seed", ...
  std::vector<std::string> tags;         ///< coverage tags (T bucket, D bucket, value regime)
  /// Set by the runner while shrinking a failure found on the outputs of an implementation whose weights are
  /// costly (Capabilities::weights_probed): the law checks the outputs only, the cheapest check that still fails.
  bool outputs_only = false;
  /// The coordinate each query position of `problem` was drawn at (empty: 0, 1, 2, ...): a law that keys a
  /// choice by position (chunked-prefill's cuts) reads it, so deleting a position in the middle leaves every
  /// other position's choice as it was. Stored in a replay file only when it is not 0, 1, 2, ...
  std::vector<Index> positions{};
};

/// One point of the scale-variance sweep: the median-of-means score variance at head dimension D, and a
/// distribution-free 95% confidence band for it (two order statistics of the group means).
struct VariancePoint {
  double D = 0, variance = 0, low = 0, high = 0;
};

/// How a case broke a law, for the report: the worst offending entry, its size and the tolerance.
struct Violation {
  std::string message;              ///< one line a person reads first
  std::string quantity;             ///< "weights", "output", "call", "variance"
  std::vector<Index> worst_index;   ///< [b,h,i,j] for weights, [b,h,i,c] for outputs
  double magnitude = 0;             ///< |actual - expected|, or the offending value
  double tolerance = 0;             ///< what was allowed (0 for exact laws)
  std::optional<Tensor<double>> expected, actual;  ///< in full, same shape
  /// Per-element allowed |actual - expected|, same shape as expected, for laws with a tolerance (empty for
  /// exact laws and for violations that are not an element-wise comparison). Entries the law does not compare
  /// are +Inf: anything is allowed there. The report's error map draws |actual - expected| / tolerances.
  std::optional<Tensor<double>> tolerances;
  std::optional<Tensor<double>> weights;  ///< the implementation's weights on `problem`, when known
  std::vector<VariancePoint> series;      ///< scale stability: the variance swept over D = 1, 2, 4, ...
  /// The call that computed wrongly when it is not the case's own problem but one derived from it (a decode
  /// step, a prefill chunk, a (b,h) slice, the repeated-kv or unpadded call): reports show it, shape and
  /// inputs, with the case it came from. Empty: the case's problem (or no single call is to blame).
  std::optional<Problem> call;
  std::string call_what;  ///< what that call is: "decode step: query 32 alone over keys 0..32, bottom-right"
};

/// How clearly a violation exceeds what was allowed: magnitude / tolerance. +inf for exact laws (tolerance 0),
/// non-finite values and failed calls: any difference there is a bug.
double margin(const Violation& v);
/// "12.5x the tolerance", or "exact law" / "non-finite" / "failed call" where margin() is +inf.
std::string margin_text(const Violation& v);
/// Shrinking prefers failures at least this clear: once a case fails by this margin, a shrink that fails by
/// less is not taken, so a bug whose effect is large does not end as a case a reader takes for rounding noise.
inline constexpr double kClearMargin = 8;

/// What a law's check of one case concluded: the violation when the case broke the law, and what the check did
/// beyond the case as drawn (a long context's sampled key columns or chunks), for the result's note.
struct Verdict {
  std::optional<Violation> violation;
  std::string note;
  Verdict() = default;
  Verdict(std::nullopt_t) {}  // NOLINT(google-explicit-constructor): a check returns std::nullopt when it held
  Verdict(Violation v) : violation(std::move(v)) {}  // NOLINT(google-explicit-constructor)
  Verdict(std::optional<Violation> v, std::string note = {})  // NOLINT(google-explicit-constructor)
      : violation(std::move(v)), note(std::move(note)) {}
};

/// A law's row of the laws table in docs/laws.md (`attncheck list --markdown` prints the table; a test fails when
/// the file's copy is stale): its number there, what must hold and its tolerance, in the notation of the docs.
struct LawDoc {
  std::string number;
  std::string holds;
  std::string tolerance;
};

/// A law: a generator of cases and a check of one case.
struct Law {
  std::string name;     ///< as `--property` takes it: "row-stochastic"
  std::string summary;  ///< one line for `attncheck list`
  std::string why;      ///< why every correct causal attention obeys it, and how its tolerance is derived
  LawDoc doc;           ///< its row of the laws table
  /// Empty when the law applies under these bounds to an implementation with these capabilities (cfg.caps);
  /// otherwise why not.
  std::function<std::string(const GenConfig&)> not_applicable;
  std::function<rc::Gen<LawCase>(const GenConfig&)> gen;
  std::function<Verdict(const Implementation&, const LawCase&)> check;
  /// At most this many cases per run, however many are asked for (0: no cap). For laws whose one case is
  /// itself a large sample, such as the scale-variance test.
  int max_cases = 0;
  /// A gradient law: it calls Implementation::backward, and is not applicable without one
  /// (`attncheck list` marks it).
  bool needs_backward = false;
  /// Optional: what a run that held found out about the implementation, for the result's note (the
  /// empty-row convention an implementation follows when it declares none). Called once, after the run.
  std::function<std::string(const Implementation&, const GenConfig&)> finding = {};
  /// Optional: what the report of a counterexample shows beyond the verdict and is too costly to compute on every
  /// failing case shrinking tries (scale-variance's variance swept over D: a sample of scores at each D).
  /// Called once, on the case a run reports (the minimal one, or a replayed one), with its violation to add to;
  /// it never changes the verdict. An error from the implementation during it leaves the violation as it was.
  std::function<void(const Implementation&, const LawCase&, Violation&)> explain = {};
};

/// Every law, in the order they are documented.
const std::vector<Law>& laws();
/// The law of that name, or nullptr.
const Law* find_law(std::string_view name);

/// Progress of one law's run, for a terminal display.
struct Progress {
  std::string law;
  int cases_done = 0, cases_total = 0;
  int shrink_steps = 0;
  bool shrinking = false;
};

struct RunOptions {
  /// The most cases a law checks (RapidCheck's max_success; a law's own max_cases may cap it lower). With
  /// law_calls, a law whose cases make several calls each checks fewer.
  int cases = 100;
  /// The calls a law's cases may make, about (0: no limit; every law checks `cases` cases). A law first checks
  /// first_cases cases; from the calls those made, it checks as many more as law_calls allows at the same calls
  /// per case, up to `cases` in all. So a law that makes one call a case checks law_calls cases, one that makes
  /// two (a call and its metamorphic variant) half as many, and one that probes a black box's weights (one call
  /// per D keys) fewer still, but never fewer than first_cases. Each of the two passes spreads RapidCheck's sizes
  /// from 0 to max_size over its cases, so a law that stops after the first pass still sees large cases; the
  /// second pass draws from a seed derived from `seed`. `attncheck check` sets it to --cases (--law-calls).
  long law_calls = 0;
  /// With law_calls: the cases every law checks first, whatever its calls (at most `cases`).
  int first_cases = 20;
  std::uint64_t seed = 0;  ///< RapidCheck's seed; the same seed replays the same run
  int max_size = 100;      ///< RapidCheck's max_size
  GenConfig gen;
  std::string reproduce;   ///< a RapidCheck reproduce string for this law: replays exactly that case
  std::function<void(const Progress&)> on_progress;
  /// Shrinking stops after this many shrink candidates timed out (0: never): each costs a whole call timeout,
  /// and a hang rarely depends on the values that the later steps would shrink.
  int max_shrink_timeouts = 2;
  /// Shrinking of one law stops after this many seconds (0: no limit): the law reports the smallest failing
  /// case found by then and says shrinking was cut short. Shrinking a costly implementation (a black box
  /// probed for its weights, a slow dtype, a failure near the tolerance) can otherwise run for many minutes.
  double shrink_seconds = 0;
  /// Calls to the implementation allowed for all laws that share `calls_spent` (0: no limit). Once spent, a
  /// law checks no further case (it is reported not checked, with the cases it did check and those it did not)
  /// and shrinking stops at the smallest failing case so far. run_laws shares it out: each law may spend its
  /// share of what is left (`law_share`), and what a law leaves passes on to the laws after it, so a budget
  /// checks every law a little before it checks any law a lot.
  long max_calls = 0;
  /// With max_calls: the calls this law may spend (0: all that is left of max_calls; negative: none). Set by
  /// run_laws.
  long law_share = 0;
  /// The calls spent so far against max_calls, shared by the laws of one run (null: this law's own only).
  std::shared_ptr<std::atomic<long>> calls_spent;
};

/// held: every case asked for was checked and none broke the law. not_checked: the law applies, but a call
/// budget or an interrupt left some or all of its cases unchecked and none of those checked broke it (a run
/// never passes what it did not check). not_applicable: the law says nothing about this implementation.
enum class LawStatus { held, falsified, not_applicable, not_checked };

struct LawResult {
  std::string law, implementation;
  DType dtype = DType::f32;
  std::uint64_t seed = 0;
  LawStatus status = LawStatus::held;
  int cases_run = 0;      ///< cases generated before the first failure (or in all, when it held)
  int shrink_steps = 0;   ///< accepted shrinks
  long calls = 0;         ///< calls to the implementation, shrinking and weight probing included
  int timeouts = 0;       ///< calls that timed out, shrinking included
  double seconds = 0;
  std::string reproduce;  ///< RapidCheck reproduce string: RC_PARAMS="reproduce=<this>"
  std::optional<LawCase> minimal_case;
  std::optional<Violation> violation;
  std::map<std::string, int> coverage;  ///< tag -> cases
  std::string note;                     ///< why not applicable; what was not checked; what a held run found
};

/// "held", "falsified", "n/a" or "not checked": the words of reports and tables.
std::string_view status_name(LawStatus s);

/// Asks every run in this process to stop soon; async-signal-safe, so a SIGINT handler may call it. The law
/// under way checks no further case and stops shrinking, keeping what it found (a held law says how many
/// cases it checked; a falsified one keeps the smallest failing case found by then), and every law after it
/// is reported not checked. A call in flight when it came is not judged: its answer (or its failure, when the
/// handler ended the implementation's processes) is ignored.
void request_stop();
/// True once request_stop() was called.
bool stop_requested();

/// Checks one case of a law (replaying a stored counterexample, for instance): an ImplementationError from
/// the implementation becomes a violation, as in run_law.
std::optional<Violation> evaluate_case(const Law& law, const Implementation& impl, const LawCase& c);

/// Why `law` cannot be checked against `impl` under g (g.caps being impl's): the law's own reason, or a dtype
/// impl does not accept; "" when it can.
std::string why_not_applicable(const Law& law, const Implementation& impl, const GenConfig& g);

/// Runs one law against one implementation; never throws for a misbehaving implementation (that is a
/// falsified law). A `reproduce` string whose case no longer fails counts as held, with a note.
LawResult run_law(const Law& law, const Implementation& impl, const RunOptions& opts);

/// Runs `laws` against one implementation, one result per law in order, each exactly what run_law gives
/// when the laws run one after the other. With jobs > 1 and a reentrant implementation (Capabilities::
/// reentrant), up to `jobs` cases (of any law) are checked at once: RapidCheck, which is not thread-safe,
/// draws every case on the calling thread, and a law any of whose cases failed is then re-run alone (its
/// cases known to hold are not checked again), so its shrinking is RapidCheck's own, in the serial order.
/// `done(k, result)`, when given, is called with each law's final result as soon as it has one: in order, as
/// each law ends, when they run one after the other; all at the end when several run at once.
std::vector<LawResult> run_laws(const std::vector<const Law*>& laws, const Implementation& impl,
                                const RunOptions& opts, int jobs,
                                const std::function<void(std::size_t, const LawResult&)>& done = {});

/// Decodes a RapidCheck reproduce string (as a report's "reproduce" field holds it) and checks that it holds an
/// entry for `law` with a size within [0, kMaxRcSize]. Throws std::invalid_argument saying what is wrong,
/// before any case is generated, so a garbage string is bad input and never an error inside a run.
void check_reproduce_string(const std::string& reproduce, const std::string& law);

/// RunOptions from RC_PARAMS as RapidCheck's own tests read it (seed, max_success, max_size, and the
/// `reproduce` entry for `law`), so `RC_PARAMS="seed=..."` or a printed reproduce string replays a ctest run.
RunOptions options_from_rc_params(const std::string& law);

/// The problem a falsified result's failure was computed on: the violation's derived call when it has one,
/// else the minimal case's problem. Requires r.minimal_case.
const Problem& failing_problem(const LawResult& r);

/// A few lines for a person: the law's verdict, the violation, the minimal shape and the RC_PARAMS line that
/// replays it.
std::string describe(const LawResult& r);

}  // namespace attncheck
