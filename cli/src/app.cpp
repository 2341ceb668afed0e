// The command line: CLI11 parses `attncheck demo | list | check`, and every error becomes one exit code
// with a message that says what was expected.
#include <CLI/CLI.hpp>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <ostream>
#include <string_view>

#include "attncheck/cancel.hpp"
#include "attncheck/cli.hpp"
#include "attncheck/isa.hpp"
#include "attncheck/reports.hpp"
#include "check.hpp"
#include "demo.hpp"

namespace attncheck::cli {
namespace {

// --seed: an unsigned 64-bit integer, written in decimal. CLI11 would read "-1" and 2^64 as 2^64 - 1.
CLI::Validator seed_check() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        std::uint64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (text.empty() || ec != std::errc() || ptr != end)
          return "expected an integer from 0 to 18446744073709551615 but got " + text;
        return "";
      },
      "UINT64");
}

// --timeout: seconds, positive and finite. CLI::PositiveNumber lets NaN through, and CLI::Range on a double
// prints its bound with 309 digits.
constexpr double kMaxTimeout = 1e6;
CLI::Validator timeout_check() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const auto bad = [&] {
          return "expected a number of seconds above 0 and at most 1000000 but got " + text;
        };
        if (text.empty() || std::isspace(static_cast<unsigned char>(text.front()))) return bad();
        char* end = nullptr;
        errno = 0;
        const double s = std::strtod(text.c_str(), &end);
        if (*end != '\0' || errno == ERANGE || !std::isfinite(s) || !(s > 0) || s > kMaxTimeout) return bad();
        return "";
      },
      "SECONDS");
}

}  // namespace

int run(int argc, const char* const* argv, const Registry& registry, std::ostream& out, std::ostream& err,
        bool err_is_terminal) {
  CLI::App app{"attncheck: checks the laws of scaled causal attention against an implementation", "attncheck"};
  app.require_subcommand(1);
  // The version and which instruction set the core's hot loops run on here (attncheck/isa.hpp): timings are
  // only comparable between runs on the same one.
  app.set_version_flag("--version", [] {
    return "attncheck " ATTNCHECK_VERSION "\ncore: " + isa_summary() + "\nEigen " +
           std::to_string(EIGEN_WORLD_VERSION) + "." + std::to_string(EIGEN_MAJOR_VERSION) + "." +
           std::to_string(EIGEN_MINOR_VERSION);
  });
  app.footer(
      "Exit codes: 0 every law held; 1 at least one law was falsified (reports written); 2 usage or configuration "
      "error; 3 internal error; 4 incomplete: nothing falsified, but an applicable law was not checked in full "
      "(a call budget ran out, a campaign run or a shard is missing; --accept-incomplete makes it 0); 130 interrupted by SIGINT or SIGTERM (the reports of the laws that finished "
      "written).");
  auto* demo = app.add_subcommand("demo", "walk through the source card's T=3, d=2 example and its invariants");
  auto* list = app.add_subcommand("list", "print the laws and the built-in implementations, one per line, name first");
  bool list_markdown = false;
  list->add_flag("--markdown", list_markdown, "print the laws table of docs/laws.md instead (Markdown)");
  auto* check = app.add_subcommand("check", "run the laws against an implementation and write counterexample reports");
  auto* merge = app.add_subcommand("merge", "combine the report folders of a sharded run (check --shard I/N) into one, "
                                            "as the single run writes it");
  auto* campaign = app.add_subcommand("campaign", "run implementations x dtypes x seeds from a campaign file (JSON) and "
                                                  "write one overview page of laws x runs");
  CampaignOptions co;
  campaign->add_option("file", co.file, "the campaign file: {\"implementations\": [...], \"dtypes\": [...], "
                                        "\"seeds\": [...], \"options\": {\"cases\": 20, ...}}")->required();
  campaign->add_option("--report-dir", co.report_dir, "where the runs and the overview go (default: "
                                                      "attncheck-reports/campaign-<name>)");
  campaign->add_option("--shard", co.shard, "run only shard I (from 0) of N of the runs (every N-th); no overview");
  campaign->add_flag("--overview-only", co.overview_only, "run nothing; write the overview from the runs on disk");
  campaign->add_flag("--no-corpus", co.no_corpus, "neither replay nor extend the campaign's corpus");
  campaign->add_flag("--force", co.force, "replace reports another implementation left in a run's folder");
  campaign->add_flag("--accept-incomplete", co.accept_incomplete,
                     "exit 0, not 4, when nothing was falsified but a run is missing or left a law not checked");
  campaign->add_flag("--allow-programs", co.allow_programs,
                     "run the plugin: and exec: implementations the campaign file names (without it such a file is "
                     "refused before anything runs: pass it only for a file you trust, as you would run a Makefile)");
  MergeOptions mo;
  merge->add_option("--out", mo.out, "the report folder to write")->required();
  merge->add_option("shards", mo.shards, "the shards' report folders (each holds a shard.json)")->required();
  merge->add_flag("--force", mo.force, "replace a report another implementation left in --out");
  merge->add_flag("--accept-incomplete", mo.accept_incomplete,
                  "exit 0, not 4, when nothing was falsified but a shard left a law not checked");

  CheckOptions o;
  check->add_option("--impl", o.impl,
                    "what to check: reference, mutant:NAME, control:NAME (see `attncheck list`), plugin:PATH.so or "
                    "exec:COMMAND");
  check->add_option("--cases", o.cases, "the most cases a law checks (see --law-calls)")
      ->check(CLI::Range(1, kMaxCases))
      ->capture_default_str();
  check
      ->add_option("--law-calls", o.law_calls,
                   "the calls a law's cases may make, about (default: --cases; 0: every law checks --cases cases): "
                   "a law checks 20 cases, then as many more as the calls those made allow, so one whose cases "
                   "make two calls each checks half as many")
      ->check(CLI::Range(0L, 1'000'000'000'000L));
  check->add_option("--seed", o.seed, "RapidCheck seed; the same seed checks the same cases")
      ->check(seed_check())
      ->capture_default_str();
  check->add_option("--max-B", o.max_B, "largest batch")->check(CLI::Range(Index{1}, kMaxExtent))->capture_default_str();
  check->add_option("--max-H", o.max_H, "largest number of heads")
      ->check(CLI::Range(Index{1}, kMaxExtent))
      ->capture_default_str();
  check->add_option("--max-Hkv", o.max_H_kv,
                    "most kv heads K and V may have, for implementations that declare grouped-query attention "
                    "(1: multi-query throughout; default: up to H)")
      ->check(CLI::Range(Index{1}, kMaxExtent));
  check->add_option("--max-T", o.max_T, "largest sequence length (most cases stay at T <= 64)")
      ->check(CLI::Range(Index{1}, kMaxSeqLen))
      ->capture_default_str();
  check->add_option("--min-T", o.min_T, "smallest sequence length (queries and keys)")
      ->check(CLI::Range(Index{1}, kMaxSeqLen))
      ->capture_default_str();
  check->add_option("--shape", o.shape,
                    "pin every case to one shape B,H,T_q,T_k,D (e.g. 1,8,4096,4096,64); values still vary and shrink");
  check->add_option("--max-D", o.max_D, "largest head dimension")
      ->check(CLI::Range(Index{1}, kMaxExtent))
      ->capture_default_str();
  check->add_option("--dtype", o.dtypes,
                    "element type the implementation is called with (default float32); several (a list, or the flag "
                    "repeated): one run each, one after the other, with one implementation (one plug-in load, one "
                    "exec: process), each into <report-dir>/<dtype>/")
      ->delimiter(',')
      ->check(CLI::IsMember({"float32", "float64", "float16", "bfloat16"}));
  check->add_option("--property", o.properties, "check only this law (repeatable; `attncheck list` shows them)")
      ->delimiter(',');
  check->add_option("--report-dir", o.report_dir,
                    "where reports go (default: attncheck-reports/<impl>, e.g. attncheck-reports/mutant-mask-zero)");
  check->add_option("--format", o.format, "which reports to write: any of md,json,junit,html")->capture_default_str();
  check->add_option("--replay", o.replay,
                    "re-check exactly the case stored in a LAW.json report or a corpus entry, under its recorded bounds "
                    "(--impl defaults to the one recorded when it is built in; a recorded plugin: or exec: must be "
                    "named with --impl)");
  check->add_option("--reproduce", o.reproduce,
                    "a RapidCheck reproduce string from a report: regenerates that case (needs one --property and the "
                    "report's --dtype/--max-*)");
  check->add_option("--corpus", o.corpus,
                    "root of the counterexample corpus (default: <report-dir>/corpus, or attncheck-reports/corpus); "
                    "entries of <root>/<impl> are replayed before new cases");
  check->add_flag("--no-corpus", o.no_corpus, "neither replay nor extend the corpus");
  check->add_flag("--force", o.force,
                  "replace a report another implementation left in --report-dir, or files attncheck did not write "
                  "(a report of the same implementation is replaced without it)");
  check->add_option("--jobs", o.jobs,
                    "cases of different laws checked at once (default: one per core); the reports are the same as "
                    "with --jobs 1. Only for an implementation that declares itself reentrant (the reference); "
                    "others run one law after the other. At most the machine's cores (more are capped, and the "
                    "header says so)")
      ->check(CLI::Range(1, 1024));
  check->add_option("--timeout", o.timeout,
                    "seconds a plugin: or exec: call may take before it counts as a hang (default: "
                    "$ATTNCHECK_CALL_TIMEOUT, else 10); after the first hang, later calls get 4 x the slowest "
                    "answer so far, at least 1 s")
      ->check(timeout_check());
  check->add_option("--shrink-time", o.shrink_time,
                    "seconds each law may spend shrinking a failure (0: no limit); then it reports the smallest "
                    "failing case found so far and says so")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            char* end = nullptr;
            const double s = std::strtod(text.c_str(), &end);
            if (text.empty() || *end != '\0' || !std::isfinite(s) || s < 0 || s > kMaxTimeout)
              return "expected a number of seconds from 0 (no limit) to 1000000 but got " + text;
            return "";
          },
          "SECONDS"))
      ->capture_default_str();
  check->add_option("--max-calls", o.max_calls,
                    "calls to the implementation allowed in the whole run (0: no limit), shared out among the laws "
                    "(what one leaves passes on); a law whose share runs out is not checked, and the run exits 4 "
                    "unless --accept-incomplete")
      ->check(CLI::Range(0L, 1'000'000'000'000L));
  check->add_option("--stress", o.stress,
                    "the determinism laws (determinism, grad-determinism) make each call N times instead of twice, "
                    "at once on several threads for a reentrant implementation, and every result must be "
                    "bit-identical")
      ->check(CLI::Range(2, 100000));
  check->add_flag("--long", o.long_mode,
                  "long contexts: every case's keys are 2^15 - 1, 2^15 + 1, 2^16 - 1 or 2^16 + 1 long (decode steps, "
                  "prefill chunks and square calls; laws sample rows and keys there), 4 cases per law at B = 1, "
                  "H <= 2, D <= 64 unless given; opt-in, minutes per law");
  check->add_flag("--progress", o.progress, "show progress on stderr even when it is not a terminal");
  check->add_flag("--accept-incomplete", o.accept_incomplete,
                  "exit 0, not 4, when nothing was falsified but a law was not checked in full (--max-calls)");
  check->add_option("--shard", o.shard,
                    "check only shard I (from 0) of N: the run's laws at positions k with k % N == I, each with the "
                    "run's seed, and write shard.json beside the reports for `attncheck merge` (default: "
                    "$GTEST_SHARD_INDEX/$GTEST_TOTAL_SHARDS when both are set; $GTEST_SHARD_STATUS_FILE is touched)");

  try {  // an ATTNCHECK_ISA this build or CPU lacks is a configuration error, refused before anything runs
    (void)isa_summary();
  } catch (const ValueError& e) {
    err << "attncheck: " << e.what() << "\n";
    return kUsage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e, out, err);
    return code == 0 ? kAllHeld : kUsage;
  }

  if (o.dtypes.size() == 1) o.dtype = o.dtypes.front();
  o.given = {.cases = check->count("--cases") > 0,
             .max_B = check->count("--max-B") > 0,
             .max_H = check->count("--max-H") > 0,
             .max_D = check->count("--max-D") > 0,
             .max_T = check->count("--max-T") > 0,
             .min_T = check->count("--min-T") > 0,
             .max_H_kv = check->count("--max-Hkv") > 0};
  try {
    if (*check && check->count("--replay") > 0) {
      // --replay re-checks the stored case under the bounds recorded with it: every flag that picks laws,
      // cases or bounds, or writes reports, would be ignored, so it is refused rather than dropped silently.
      std::string ignored;
      for (const char* flag : {"--property",  "--reproduce", "--shard",       "--shape",      "--cases",  "--law-calls",
                               "--seed",      "--max-B",     "--max-H",       "--max-Hkv",    "--max-T",  "--min-T",
                               "--max-D",     "--dtype",     "--jobs",        "--report-dir", "--format", "--corpus",
                               "--no-corpus", "--force",     "--shrink-time", "--max-calls",  "--stress", "--long"})
        if (check->count(flag) > 0) ignored += (ignored.empty() ? "" : ", ") + std::string(flag);
      if (!ignored.empty())
        throw UsageError("--replay re-checks exactly the case stored in " + o.replay +
                         " with the dtype and bounds recorded there and writes no report; it takes only --impl, "
                         "--timeout and --progress, but got " + ignored + " as well (drop them, or run without --replay)");
    }
    if (*demo) return run_demo(out);
    if (*list) return run_list(registry, out, list_markdown);
    if (*merge) return run_merge(mo, registry, out);
    if (*campaign) return run_campaign(co, registry, out, err);
    if (argc > 0 && argv[0] && std::string_view(argv[0]).find('/') != std::string_view::npos) o.program = argv[0];
    if (*check) return run_check(o, registry, out, err, err_is_terminal);
  } catch (const UsageError& e) {
    err << "attncheck: " << e.what() << "\n";
    return kUsage;
  } catch (const reports::ReportExists& e) {
    err << "attncheck: " << e.what() << "\n";
    return kUsage;
  } catch (const reports::FileError& e) {
    err << "attncheck: " << e.what() << "\n";
    return kUsage;
  } catch (const Cancelled& e) {  // SIGINT or SIGTERM before a law began (starting an exec: client, say)
    err << "attncheck: " << e.what() << "\n";
    return kInterrupted;
  } catch (const std::exception& e) {
    err << "attncheck: internal error: " << e.what() << "\n";
    return kInternal;
  }
  return kInternal;
}

}  // namespace attncheck::cli
