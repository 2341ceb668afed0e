// The attncheck command end to end, in-process: exit codes and their messages, reports on disk, replay, the
// corpus, and no silent overwrite. A toy law (rarely failing, instantly shrunk) keeps the mechanics tests
// independent of the real laws; the real registry checks the reference and a mutant.
#include "attncheck/cli.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "attncheck/isa.hpp"
#include "attncheck/mutants.hpp"
#include "attncheck/reports.hpp"
#include "progress.hpp"
#include "temp_dir.hpp"

namespace attncheck::cli {
namespace {

namespace fs = std::filesystem;
using attncheck::testing::slurp;
using attncheck::testing::TempDir;

// Cases per law for the tests that run whole checks to test the command's plumbing (every law through it, parallel
// jobs): the given count, or 5 under the sanitizers (the asan preset), where a law runs several times slower and the
// plumbing is the same at any count.
std::string run_cases(const char* count) {
#ifdef ATTNCHECK_SANITIZED
  (void)count;
  return "5";
#else
  return count;
#endif
}

struct Result {
  int code;
  std::string out, err;
};

Result attncheck(const Registry& registry, std::vector<std::string> args) {
  args.insert(args.begin(), "attncheck");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  const int code = run(static_cast<int>(argv.size()), argv.data(), registry, out, err, false);
  return {code, out.str(), err.str()};
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Fails when q[0,0,0,0] >= 90 for q drawn from 0..99. RapidCheck scales the range with its size, which
// grows from 0 case by case, so early cases pass and later ones fail; shrinking always ends at exactly 90.
Law toy_law() {
  Law l;
  l.name = "toy-below-90";
  l.summary = "q[0,0,0,0] stays below 90";
  l.why = "a toy law for the command's tests";
  l.gen = [](const GenConfig& g) {
    return rc::gen::map(rc::gen::inRange(0, 100), [dtype = g.dtype](int x) {
      LawCase c;
      c.problem.dtype = dtype;
      c.problem.q = Tensor<double>({1, 1, 1, 1});
      c.problem.q(0, 0, 0, 0) = x;
      c.problem.k = c.problem.v = Tensor<double>({1, 1, 1, 1});
      return c;
    });
  };
  l.check = [](const Implementation&, const LawCase& c) -> std::optional<Violation> {
    const double x = c.problem.q(0, 0, 0, 0);
    if (x < 90) return std::nullopt;
    Violation v;
    v.message = "q[0,0,0,0] = " + std::to_string(x) + " is not below 90";
    v.quantity = "input";
    v.worst_index = {0, 0, 0, 0};
    v.magnitude = x - 90;
    return v;
  };
  return l;
}

const Registry& toy_registry() {
  static const Registry r = [] {
    Registry reg;
    reg.laws = {toy_law()};
    reg.builtins = {reference_implementation()};
    return reg;
  }();
  return r;
}

const Registry& real_registry() {
  static const Registry r = default_registry();
  return r;
}

TEST(ExitCodes, badFlagIsAUsageErrorNamingTheFlag) {
  const Result r = attncheck(toy_registry(), {"check", "--impl", "reference", "--bogus"});
  EXPECT_EQ(r.code, kUsage);
  EXPECT_TRUE(contains(r.err, "--bogus")) << r.err;
}

// --version names the instruction set the core runs on, so a timing can say what it timed.
TEST(ExitCodes, versionNamesTheCoresInstructionSet) {
  const Result r = attncheck(toy_registry(), {"--version"});
  EXPECT_EQ(r.code, kAllHeld);
  EXPECT_TRUE(contains(r.out, "attncheck 0.")) << r.out;
  EXPECT_TRUE(contains(r.out, "core: " + active_isa() + " (of generic")) << r.out;
}

TEST(ExitCodes, unknownLawIsAUsageErrorListingTheLaws) {
  const Result r = attncheck(toy_registry(), {"check", "--impl", "reference", "--property", "no-such-law"});
  EXPECT_EQ(r.code, kUsage);
  EXPECT_TRUE(contains(r.err, "unknown law \"no-such-law\"")) << r.err;
  EXPECT_TRUE(contains(r.err, "toy-below-90")) << r.err;
}

TEST(ExitCodes, missingReplayFileIsAUsageError) {
  const Result r = attncheck(toy_registry(), {"check", "--replay", "/nonexistent/toy.json"});
  EXPECT_EQ(r.code, kUsage);
  EXPECT_TRUE(contains(r.err, "/nonexistent/toy.json")) << r.err;
  EXPECT_TRUE(contains(r.err, "no such file")) << r.err;
}

TEST(ExitCodes, badValuesAndMissingImplAreUsageErrors) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"check", "--impl", "reference", "--dtype", "float8"},
           {"check", "--impl", "reference", "--cases", "0"},
           {"check", "--impl", "reference", "--format", "md,pdf"},
           {"check", "--impl", "reference", "--max-Hkv", "0"},
           {"check", "--impl", "mutant:no-such-mutant"},
           {"check", "--impl", "reference", "--reproduce", "ABC"},
           {"check", "--impl", "reference", "--shape", "1,2,3"},
           {"check", "--impl", "reference", "--shape", "1,2,0,4,8"},
           {"check", "--impl", "reference", "--min-T", "300", "--max-T", "256"},
           {"check"},
           {}}) {
    const Result r = attncheck(toy_registry(), args);
    std::string shown;
    for (const auto& a : args) shown += a + " ";
    EXPECT_EQ(r.code, kUsage) << shown;
    EXPECT_FALSE(r.err.empty()) << shown << ": no message on stderr";
  }
  EXPECT_TRUE(contains(attncheck(toy_registry(), {"check", "--impl", "mutant:nope"}).err, "reference, mutant:NAME"));
  EXPECT_TRUE(contains(attncheck(toy_registry(), {"check", "--impl", "reference", "--shape", "1,2,3"}).err,
                       "expected five positive integers B,H,T_q,T_k,D"));
}

TEST(ExitCodes, aBugInAttncheckItselfIsAnInternalError) {
  Law broken = toy_law();
  broken.not_applicable = [](const GenConfig&) -> std::string { throw std::logic_error("law table corrupted"); };
  Registry reg = toy_registry();
  reg.laws = {broken};
  TempDir tmp;
  const Result r = attncheck(reg, {"check", "--impl", "reference", "--no-corpus", "--report-dir", tmp.path().string()});
  EXPECT_EQ(r.code, kInternal);
  EXPECT_TRUE(contains(r.err, "internal error: law table corrupted")) << r.err;
}

TEST(ExitCodes, helpIsNotAnError) {
  const Result r = attncheck(toy_registry(), {"check", "--help"});
  EXPECT_EQ(r.code, kAllHeld);
  EXPECT_TRUE(contains(r.out, "--report-dir")) << r.out;
}

TEST(List, everyLineStartsWithANameTheOtherOptionsTake) {
  const Registry& reg = real_registry();
  const Result r = attncheck(reg, {"list"});
  ASSERT_EQ(r.code, kAllHeld);
  std::istringstream lines(r.out);
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) {
    const std::string name = line.substr(0, line.find(' '));
    const bool is_law = std::any_of(reg.laws.begin(), reg.laws.end(), [&](const Law& l) { return l.name == name; });
    if (!is_law) {
      EXPECT_NO_THROW(resolve_implementation(name, reg)) << line;
    }
    EXPECT_GT(line.size(), name.size() + 3) << "no description: " << line;
  }
  EXPECT_EQ(n, static_cast<int>(reg.laws.size() + reg.builtins.size()));
}

TEST(Check, toyLawFalsifiedWritesReportsAndCorpusAndReplaysTheSameFailure) {
  TempDir tmp;
  const std::string dir = (tmp.path() / "r").string();
  const Result r = attncheck(toy_registry(), {"check", "--impl", "reference", "--cases", "1000", "--report-dir", dir});
  ASSERT_EQ(r.code, kFalsified) << r.out << r.err;
  for (const char* f : {"toy-below-90.json", "toy-below-90.md", "toy-below-90.html", "summary.json", "summary.md",
                        "index.html", "junit.xml"})
    EXPECT_TRUE(fs::exists(fs::path(dir) / f)) << f;
  EXPECT_NE(r.out.find("browse: " + dir + "/index.html"), std::string::npos) << r.out;
  ASSERT_EQ(reports::Corpus(fs::path(dir) / "corpus" / "reference").entries("toy-below-90").size(), 1u);

  const auto stored = reports::read_counterexample(fs::path(dir) / "toy-below-90.json");
  EXPECT_EQ(stored.lcase.problem.q(0, 0, 0, 0), 90) << "shrinking ends at the boundary";
  const Result replay = attncheck(toy_registry(), {"check", "--replay", dir + "/toy-below-90.json"});
  EXPECT_EQ(replay.code, kFalsified) << replay.out << replay.err;
  EXPECT_TRUE(contains(replay.out, "the same violation as recorded")) << replay.out;
  EXPECT_TRUE(contains(replay.out, "regenerates the same case")) << replay.out;
}

// --dtype with several dtypes: one run each into <dir>/<dtype>/, the implementation loaded once for all of them (a
// Python client imports torch once), the worst exit code; a dtype the implementation does not declare, or one given
// twice, is refused before any run.
TEST(Check, severalDtypesAreOneRunEachWithOneImplementationLoadedOnce) {
  TempDir tmp;
  int loads = 0;
  Registry reg = toy_registry();
  reg.load_external = [&loads](const std::string&, const LoadOptions&) {
    ++loads;
    return reference_implementation();
  };
  const std::string dir = (tmp.path() / "r").string();
  const Result r = attncheck(reg, {"check", "--impl", "exec:counted", "--dtype", "float32,bfloat16", "--cases", "1000",
                                   "--report-dir", dir});
  ASSERT_EQ(r.code, kFalsified) << r.out << r.err;
  EXPECT_EQ(loads, 1) << "one load for both dtypes";
  for (const char* dtype : {"float32", "bfloat16"}) {
    const auto summary = reports::Json::parse(slurp(fs::path(dir) / dtype / "summary.json"));
    EXPECT_EQ(summary["dtype"], dtype);
    EXPECT_TRUE(fs::exists(fs::path(dir) / dtype / "toy-below-90.json")) << dtype;
  }
  EXPECT_TRUE(contains(r.out, "at 2 dtypes: float32 falsified, bfloat16 falsified")) << r.out;

  const Result held = attncheck(reg, {"check", "--impl", "exec:counted", "--dtype", "float64", "--dtype", "float16",
                                      "--cases", "1", "--no-corpus", "--report-dir", dir + "-held"});
  EXPECT_EQ(held.code, kAllHeld) << held.out << held.err;
  EXPECT_TRUE(contains(held.out, "float64 held, float16 held")) << held.out;

  const Result twice = attncheck(reg, {"check", "--impl", "exec:counted", "--dtype", "float32,float32",
                                       "--report-dir", dir + "-twice"});
  EXPECT_EQ(twice.code, kUsage);
  EXPECT_TRUE(contains(twice.err, "expected each dtype once but got float32 twice")) << twice.err;

  Registry f32_only = reg;
  f32_only.load_external = [](const std::string&, const LoadOptions&) {
    Capabilities caps;
    caps.dtypes = {DType::f32};
    return make_implementation("f32-only", "declares float32 alone", caps,
                               [](const Problem& p) { return reference_implementation()->forward(p); });
  };
  const Result undeclared = attncheck(f32_only, {"check", "--impl", "exec:x", "--dtype", "float32,bfloat16",
                                                 "--report-dir", dir + "-undeclared"});
  EXPECT_EQ(undeclared.code, kUsage);
  EXPECT_TRUE(contains(undeclared.err, "but got bfloat16; no law was checked at any dtype")) << undeclared.err;
  EXPECT_FALSE(fs::exists(dir + "-undeclared")) << "nothing written before the refusal";
}

// The replay command printed on the terminal starts the way this run was typed when that was a path (a build's
// binary is not on PATH), shell-quoted; the report files keep the portable "attncheck".
TEST(Check, printedReplayCommandStartsAsTheProgramWasTyped) {
  TempDir tmp;
  const std::string dir = (tmp.path() / "r").string();
  const std::vector<std::string> args = {"/opt/my build/attncheck", "check", "--impl", "reference", "--cases", "1000",
                                         "--report-dir", dir};
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  ASSERT_EQ(run(int(argv.size()), argv.data(), toy_registry(), out, err, false), kFalsified) << out.str() << err.str();
  EXPECT_TRUE(contains(out.str(), "replay: '/opt/my build/attncheck' check --impl reference --replay ")) << out.str();
  EXPECT_FALSE(contains(slurp(fs::path(dir) / "toy-below-90.md"), "/opt/my build"));
}

TEST(Check, storedCounterexamplesAreReplayedBeforeNewCases) {
  TempDir tmp;
  const std::string dir = (tmp.path() / "r").string(), corpus = (tmp.path() / "corpus").string();
  // One case (size 0) does not reach 90 ...
  const Result fresh = attncheck(toy_registry(), {"check", "--impl", "reference", "--cases", "1", "--no-corpus",
                                                  "--report-dir", dir + "-fresh"});
  ASSERT_EQ(fresh.code, kAllHeld) << fresh.out;
  // ... but once a run has stored the counterexample, the same one-case run replays it and fails.
  ASSERT_EQ(attncheck(toy_registry(), {"check", "--impl", "reference", "--cases", "1000", "--corpus", corpus,
                                       "--report-dir", dir + "-found"}).code, kFalsified);
  const Result again = attncheck(toy_registry(), {"check", "--impl", "reference", "--cases", "1", "--corpus", corpus,
                                                  "--report-dir", dir + "-again"});
  EXPECT_EQ(again.code, kFalsified) << again.out;
  EXPECT_TRUE(contains(again.out, "(corpus)")) << again.out;
}

// A rerun of the same implementation replaces its own report (a user re-checking after a fix); a report
// another implementation wrote, or files attncheck did not write, are only replaced with --force.
TEST(Check, anEarlierReportOfTheSameImplementationIsReplacedOthersNeedForce) {
  TempDir tmp;
  const std::string dir = (tmp.path() / "r").string();
  const std::vector<std::string> base = {"check", "--impl", "reference", "--no-corpus", "--report-dir", dir};
  auto with = [&](std::vector<std::string> extra, const std::string& into) {
    auto args = base;
    args[5] = into;
    args.insert(args.end(), extra.begin(), extra.end());
    return attncheck(toy_registry(), args);
  };
  ASSERT_EQ(with({"--cases", "1000"}, dir).code, kFalsified);
  const std::string before = slurp(fs::path(dir) / "summary.json");
  EXPECT_EQ(with({"--cases", "1000"}, dir).code, kFalsified) << "an identical rerun is fine";
  const Result replaced = with({"--cases", "1500"}, dir);
  EXPECT_EQ(replaced.code, kFalsified) << replaced.err;
  EXPECT_NE(slurp(fs::path(dir) / "summary.json"), before);

  // A summary.json nobody listed: not attncheck's to overwrite without --force.
  const fs::path foreign = tmp.path() / "foreign";
  fs::create_directories(foreign);
  { std::ofstream(foreign / "summary.json") << "mine\n"; }
  const Result refused = with({"--cases", "1000"}, foreign.string());
  EXPECT_EQ(refused.code, kUsage);
  EXPECT_TRUE(contains(refused.err, "--force")) << refused.err;
  EXPECT_EQ(slurp(foreign / "summary.json"), "mine\n");
  EXPECT_EQ(with({"--cases", "1000", "--force"}, foreign.string()).code, kFalsified);
  EXPECT_NE(slurp(foreign / "summary.json"), "mine\n");
}

// A law whose cases are square (position 0 sees key 0 alone; a prefix or a decode step of a square call) does
// not apply to a pinned cross-length shape, and says why; the laws that take any shape still run on it.
TEST(RealLaws, squareOnlyLawsAreNotApplicableToAPinnedCrossLengthShape) {
  TempDir tmp;
  const Result r = attncheck(real_registry(), {"check", "--impl", "reference", "--shape", "1,1,1,2,1", "--cases", "20",
                                               "--property", "first-position,prefix-consistency,decode-consistency,"
                                                             "chunked-prefill,oracle-agreement",
                                               "--report-dir", tmp.path().string()});
  EXPECT_EQ(r.code, kAllHeld) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "draws square cases (T_q = T_k) only, but --shape pins T_q = 1 and T_k = 2")) << r.out;
  EXPECT_TRUE(contains(r.out, "all 1 laws held (4 not applicable)")) << r.out;
}

TEST(RealLaws, referenceHoldsEveryLaw) {
  TempDir tmp;
  const Result r = attncheck(real_registry(), {"check", "--impl", "reference", "--cases", run_cases("100"),
                                               "--report-dir", tmp.path().string()});
  EXPECT_EQ(r.code, kAllHeld) << r.out << r.err;
  EXPECT_TRUE(fs::exists(tmp.path() / "junit.xml"));
}

// --max-Hkv bounds the kv heads: at 1 (multi-query attention) h % H_kv and h / (H / H_kv) are both 0, so the
// modulo mutant cannot show its bug; at 2 it can, and the report's shape table and regenerate command carry it.
TEST(RealLaws, maxHkvBoundsTheKvHeadsAndReportsCarryThem) {
  TempDir tmp;
  const auto check = [&](const char* max_H_kv) {
    return attncheck(real_registry(), {"check", "--impl", "mutant:gqa-kv-modulo", "--property", "gqa-equivalence",
                                       "--max-Hkv", max_H_kv, "--report-dir", (tmp.path() / max_H_kv).string()});
  };
  const Result mqa = check("1");
  EXPECT_EQ(mqa.code, kAllHeld) << mqa.out << mqa.err;
  EXPECT_TRUE(contains(mqa.out, "H <= 4, H_kv <= 1,")) << mqa.out;
  const Result gqa = check("2");
  ASSERT_EQ(gqa.code, kFalsified) << gqa.out << gqa.err;
  const std::string md = slurp(tmp.path() / "2" / "gqa-equivalence.md");
  EXPECT_TRUE(contains(md, "| B | H | H_kv | T_q |")) << md;
  EXPECT_TRUE(contains(md, "| 1 | 4 | 2 | 1 |")) << md;  // the minimal case: H = 4 over H_kv = 2
  EXPECT_TRUE(contains(md, "--max-Hkv 2")) << md;
}

TEST(RealLaws, mutantIsFalsifiedAndItsReportReplays) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "mask-zero";
  const Result r = attncheck(real_registry(), {"check", "--impl", "mutant:mask-zero", "--report-dir", dir.string()});
  ASSERT_EQ(r.code, kFalsified) << r.out << r.err;
  const auto summary = reports::Json::parse(slurp(dir / "summary.json"));
  int falsified = 0;
  std::string first_falsified;
  for (const auto& law : summary["laws"]) {
    if (law["status"] != "falsified") continue;
    ++falsified;
    const std::string name = law["law"].get<std::string>();
    if (first_falsified.empty()) first_falsified = name;
    EXPECT_TRUE(fs::exists(dir / (name + ".json"))) << name;
    EXPECT_TRUE(fs::exists(dir / (name + ".md"))) << name;
    const Result replay = attncheck(real_registry(), {"check", "--replay", (dir / (name + ".json")).string()});
    EXPECT_EQ(replay.code, kFalsified) << name << ": " << replay.out << replay.err;
    EXPECT_TRUE(contains(replay.out, "the same violation as recorded")) << name << ": " << replay.out;
  }
  EXPECT_GT(falsified, 0);
  // The stored case of a mutant holds on the reference: the failure is the mutant's, not the case's.
  ASSERT_FALSE(first_falsified.empty());
  ASSERT_TRUE(fs::exists(dir / (first_falsified + ".json")));
  const Result on_reference = attncheck(
      real_registry(), {"check", "--replay", (dir / (first_falsified + ".json")).string(), "--impl", "reference"});
  EXPECT_EQ(on_reference.code, kAllHeld) << on_reference.out << on_reference.err;

  // A stored case whose law parameter is out of range (hand-edited: the changed position t far past T) is
  // refused as bad input naming the parameter, not an internal error or an out-of-range read.
  ASSERT_TRUE(fs::exists(dir / "causal-perturbation.json"));
  auto doc = reports::Json::parse(slurp(dir / "causal-perturbation.json"));
  ASSERT_TRUE(doc["case"]["params"].contains("t"));
  doc["case"]["params"]["t"] = 1e300;
  {
    std::ofstream(tmp.path() / "edited.json") << doc.dump();
  }
  const Result edited = attncheck(real_registry(), {"check", "--replay", (tmp.path() / "edited.json").string()});
  EXPECT_EQ(edited.code, kUsage) << edited.out << edited.err;
  EXPECT_TRUE(contains(edited.err, "parameter \"t\" is 1e+300, expected an integer in [0, ")) << edited.err;
}

// --long on a zoo kernel (it holds each head's [T_q,T_k] weights): no square call of 2^16 keys (32 GiB), at most
// kZooLongMaxQueries queries a call, said in the header; the report carries the bound and its case replays.
TEST(RealLaws, longOnAZooKernelMakesNoSquareCallsAndItsReportReplays) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "int16";
  // --shrink-time 0: the minimal case asserted below must not depend on how fast this build shrinks (under the
  // sanitizers 20 s ran out before the step from 65,537 keys to 32,769).
  const Result r = attncheck(real_registry(), {"check", "--impl", "mutant:position-int16", "--long", "--property",
                                               "convex-hull", "--report-dir", dir.string(), "--no-corpus",
                                               "--shrink-time", "0"});
  ASSERT_EQ(r.code, kFalsified) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "at most " + std::to_string(kZooLongMaxQueries) + " queries a call")) << r.out;
  const auto doc = reports::Json::parse(slurp(dir / "convex-hull.json"));
  EXPECT_EQ(doc["generator"]["long_max_T_q"], kZooLongMaxQueries);
  const auto& q = doc["case"]["problem"]["q"]["shape"];
  EXPECT_LE(q[2].get<Index>(), kZooLongMaxQueries) << q.dump();
  EXPECT_EQ(doc["case"]["problem"]["k"]["shape"][2], 32769) << "a wrap at 2^15 needs 2^15 + 1 keys";
  const Result replay = attncheck(real_registry(), {"check", "--replay", (dir / "convex-hull.json").string()});
  EXPECT_EQ(replay.code, kFalsified) << replay.out << replay.err;
}

// Every file of a report folder, by name.
std::map<std::string, std::string> files_of(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) files[fs::relative(e.path(), dir).string()] = slurp(e.path());
  return files;
}

// --jobs checks cases of several laws at once; the reports must be those of a serial run byte for byte, for a
// kernel whose laws all hold and for one whose falsified laws are re-run and shrunk. Both are reentrant, so
// the concurrent path is the one taken.
TEST(Jobs, reportsAreIdenticalToASerialRun) {
  Registry reg = real_registry();
  reg.builtins.push_back(make_implementation(
      "test:reentrant-off", "the reference, with every output from position 2 on scaled by 1.01",
      reference_implementation()->capabilities(), [](const Problem& p) {
        Outcome o = reference_implementation()->forward(p);
        const Shape& s = o.output.shape();
        for (Index b = 0; b < s.B; ++b)
          for (Index h = 0; h < s.H; ++h)
            for (Index i = 2; i < s.T; ++i) o.output.head(b, h).row(i) *= 1.01;
        return o;
      }));
  for (const std::string impl : {"reference", "test:reentrant-off"}) {
    TempDir tmp;
    // The same folder for both runs: the reports name it in their replay commands.
    const fs::path dir = tmp.path() / "reports";
    const auto run_with = [&](const std::string& jobs) {
      fs::remove_all(dir);
      const Result r = attncheck(reg, {"check", "--impl", impl, "--cases", run_cases("25"), "--no-corpus", "--jobs",
                                       jobs, "--report-dir", dir.string()});
      return std::make_pair(r, files_of(dir));
    };
    const auto [serial, serial_files] = run_with("1");
    const auto [parallel, parallel_files] = run_with("2");
    EXPECT_EQ(serial.code, impl == "reference" ? kAllHeld : kFalsified) << serial.out << serial.err;
    EXPECT_EQ(parallel.code, serial.code) << parallel.out << parallel.err;
    ASSERT_TRUE(serial_files.count("summary.json")) << impl;
    ASSERT_EQ(serial_files.size(), parallel_files.size()) << impl;
    for (const auto& [name, text] : serial_files) {
      ASSERT_TRUE(parallel_files.count(name)) << impl << ": " << name;
      EXPECT_EQ(parallel_files.at(name), text) << impl << ": " << name << " differs between --jobs 1 and --jobs 2";
    }
  }
}

// N shards (--shard I/N) check together exactly the laws one run would, each with the run's seed, and
// `attncheck merge` combines their folders into the single run's reports byte for byte: for the reference (every
// law holds) and a mutant (falsified laws with their minimal cases), at N = 1, 2, 3 and 7 (7 leaves some shards
// a law or two).
TEST(Shards, mergedShardsEqualTheSingleRunByteForByte) {
  const Registry reg = real_registry();
  for (const std::string impl : {"reference", "mutant:mask-zero"}) {
    TempDir tmp;
    const fs::path dir = tmp.path() / "reports";  // the merged folder takes the single run's place
    const std::vector<std::string> common{"check", "--impl", impl, "--cases", "10", "--no-corpus"};
    const auto run = [&](std::vector<std::string> extra, const fs::path& to) {
      std::vector<std::string> args = common;
      args.insert(args.end(), extra.begin(), extra.end());
      args.insert(args.end(), {"--report-dir", to.string()});
      return attncheck(reg, args);
    };
    const auto without_lock = [](std::map<std::string, std::string> f) {
      f.erase(".attncheck-lock");
      return f;
    };
    const Result single = run({}, dir);
    ASSERT_EQ(single.code, impl == "reference" ? kAllHeld : kFalsified) << single.out << single.err;
    const auto expected = without_lock(files_of(dir));
    ASSERT_FALSE(expected.count("shard.json"));
    for (const int n : {1, 2, 3, 7}) {
      fs::remove_all(dir);
      std::vector<std::string> merge{"merge", "--out", dir.string()};
      for (int i = n - 1; i >= 0; --i) {  // any order
        const fs::path shard = tmp.path() / ("shard-" + std::to_string(i) + "-of-" + std::to_string(n));
        const Result r = run({"--shard", std::to_string(i) + "/" + std::to_string(n)}, shard);
        ASSERT_TRUE(r.code == kAllHeld || r.code == kFalsified) << r.out << r.err;
        EXPECT_TRUE(contains(r.out, "shard " + std::to_string(i) + "/" + std::to_string(n) + ": ")) << r.out;
        merge.push_back(shard.string());
      }
      const Result merged = attncheck(reg, merge);
      EXPECT_EQ(merged.code, single.code) << merged.out << merged.err;
      const auto got = without_lock(files_of(dir));
      ASSERT_EQ(got.size(), expected.size()) << impl << " at N = " << n;
      for (const auto& [name, text] : expected) {
        ASSERT_TRUE(got.count(name)) << impl << " at N = " << n << ": " << name;
        EXPECT_EQ(got.at(name), text) << impl << " at N = " << n << ": " << name << " differs from the single run";
      }
    }
  }
}

// GoogleTest's sharding variables, set for this scope (Bazel sets them for a sharded test target).
struct GoogleTestShard {
  GoogleTestShard(const char* index, const char* total) {
    ::setenv("GTEST_SHARD_INDEX", index, 1);
    ::setenv("GTEST_TOTAL_SHARDS", total, 1);
  }
  ~GoogleTestShard() {
    ::unsetenv("GTEST_SHARD_INDEX");
    ::unsetenv("GTEST_TOTAL_SHARDS");
  }
};

// The variables shard the command line's check, which then says so in its header, its summary and its verdict;
// a campaign's cells (the campaign shards its cells) and --reproduce (one law's case) are never sharded by them.
TEST(Shards, googleTestVariablesShardOnlyTheCommandLinesCheckAndItSaysSo) {
  const Registry reg = real_registry();
  TempDir tmp;
  const GoogleTestShard env("1", "2");
  const Result r = attncheck(reg, {"check", "--impl", "reference", "--cases", "3", "--no-corpus", "--property",
                                   "row-stochastic,first-position", "--report-dir", (tmp.path() / "r").string()});
  ASSERT_EQ(r.code, kAllHeld) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "shard 1/2: 1 of the run's 2 laws")) << r.out;
  EXPECT_TRUE(contains(r.out, "reference: shard 1/2: all 1 laws held")) << r.out;
  const reports::Json summary = reports::Json::parse(slurp(tmp.path() / "r" / "summary.json"));
  EXPECT_EQ(summary.at("shard"), (reports::Json{{"index", 1}, {"count", 2}})) << summary.dump();
  EXPECT_TRUE(contains(slurp(tmp.path() / "r" / "summary.md"), "**Shard 1 of 2**"));

  // A campaign of one cell: the campaign is shard 0 of 2 (it runs cell 0), and the cell checks both its laws.
  const fs::path file = tmp.path() / "one.json";
  std::ofstream(file) << R"({"name": "one", "implementations": ["reference"], "dtypes": ["float32"], "seeds": [1],
                             "options": {"cases": 3, "properties": ["row-stochastic", "first-position"]}})";
  {
    const GoogleTestShard first("0", "2");
    const Result c = attncheck(reg, {"campaign", file.string(), "--report-dir", (tmp.path() / "c").string()});
    ASSERT_EQ(c.code, kAllHeld) << c.out << c.err;
    const reports::Json cell = reports::Json::parse(slurp(tmp.path() / "c" / "reference-float32-seed1" / "summary.json"));
    EXPECT_EQ(cell.at("laws").size(), 2u) << "the cell was sharded a second time: " << cell.dump();
    EXPECT_FALSE(cell.contains("shard"));
  }

  // --reproduce re-checks one law's case: the variables do not refuse it.
  const Registry& toy = toy_registry();
  const fs::path first = tmp.path() / "toy";
  ::unsetenv("GTEST_SHARD_INDEX");
  const Result found = attncheck(toy, {"check", "--impl", "reference", "--cases", "1000", "--no-corpus", "--report-dir",
                                       first.string()});
  ASSERT_EQ(found.code, kFalsified) << found.out << found.err;
  const std::string reproduce =
      reports::Json::parse(slurp(first / "toy-below-90.json")).at("reproduce").get<std::string>();
  ::setenv("GTEST_SHARD_INDEX", "1", 1);
  const Result again = attncheck(toy, {"check", "--impl", "reference", "--cases", "1000", "--no-corpus", "--property",
                                       "toy-below-90", "--reproduce", reproduce, "--report-dir", (tmp.path() / "again").string()});
  EXPECT_EQ(again.code, kFalsified) << again.out << again.err;
}

// A run never passes what it did not check: a call budget too small for every law leaves laws not checked, and the
// run exits 4 (kIncomplete) listing each of them, in every report, unless --accept-incomplete.
TEST(Incomplete, aCallBudgetTooSmallForEveryLawExitsIncompleteListingEachLawNotChecked) {
  const Registry reg = real_registry();
  TempDir tmp;
  const fs::path dir = tmp.path() / "r";
  const Result r = attncheck(reg, {"check", "--impl", "reference", "--max-calls", "100", "--no-corpus",
                                   "--report-dir", dir.string()});
  ASSERT_EQ(r.code, kIncomplete) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "reference: INCOMPLETE: ")) << r.out;
  const reports::Json summary = reports::Json::parse(slurp(dir / "summary.json"));
  EXPECT_EQ(summary.at("status"), "incomplete");
  std::vector<std::string> unchecked;
  long calls = 0;
  for (const reports::Json& law : summary.at("laws")) {
    const std::string status = law.at("status").get<std::string>();
    EXPECT_TRUE(status == "held" || status == "n/a" || status == "not checked") << law.dump();
    if (status == "not checked") unchecked.push_back(law.at("law").get<std::string>());
    calls += law.at("calls").get<long>();
  }
  ASSERT_FALSE(unchecked.empty());
  EXPECT_LE(calls, 100 + 30) << "the budget, and at most a case more per law";
  std::string line = "  not checked: ";
  for (std::size_t n = 0; n < unchecked.size(); ++n) line += (n ? ", " : "") + unchecked[n];
  EXPECT_TRUE(contains(r.out, line + "\n")) << r.out;
  EXPECT_EQ(summary.at("counts").at("not_checked").get<std::size_t>(), unchecked.size());
  const std::string junit = slurp(dir / "junit.xml");
  EXPECT_TRUE(contains(junit, "errors=\"" + std::to_string(unchecked.size()) + "\"")) << junit;
  EXPECT_TRUE(contains(junit, "<error type=\"not checked\"")) << junit;
  EXPECT_TRUE(contains(slurp(dir / "summary.md"), "incomplete: " + std::to_string(unchecked.size()) + " of "));
  // Accepted on request, with the same reports.
  const Result accepted = attncheck(reg, {"check", "--impl", "reference", "--max-calls", "100", "--no-corpus",
                                          "--accept-incomplete", "--report-dir", dir.string()});
  EXPECT_EQ(accepted.code, kAllHeld) << accepted.out << accepted.err;
  EXPECT_TRUE(contains(accepted.out, "INCOMPLETE")) << accepted.out;
}

// A campaign's overview written before every shard is done is incomplete (exit 4), not a pass; so is a cell that
// left a law not checked, which the overview marks "?".
TEST(Incomplete, aCampaignWithARunMissingOrIncompleteExitsIncomplete) {
  const Registry reg = real_registry();
  TempDir tmp;
  const fs::path file = tmp.path() / "two.json";
  std::ofstream(file) << R"({"name": "two", "implementations": ["reference"], "dtypes": ["float32", "float64"],
                             "seeds": [1], "options": {"cases": 3, "properties": ["row-stochastic", "first-position"]}})";
  const std::string root = (tmp.path() / "c").string();
  ASSERT_EQ(attncheck(reg, {"campaign", file.string(), "--report-dir", root, "--shard", "0/2"}).code, kAllHeld);
  const Result early = attncheck(reg, {"campaign", file.string(), "--report-dir", root, "--overview-only"});
  EXPECT_EQ(early.code, kIncomplete) << early.out << early.err;
  EXPECT_TRUE(contains(early.out, "1 of 2 runs not there yet")) << early.out;
  const Result accepted =
      attncheck(reg, {"campaign", file.string(), "--report-dir", root, "--overview-only", "--accept-incomplete"});
  EXPECT_EQ(accepted.code, kAllHeld) << accepted.out << accepted.err;
  ASSERT_EQ(attncheck(reg, {"campaign", file.string(), "--report-dir", root, "--shard", "1/2"}).code, kAllHeld);
  EXPECT_EQ(attncheck(reg, {"campaign", file.string(), "--report-dir", root, "--overview-only"}).code, kAllHeld);
  // A budget too small for the cells' laws: every cell is incomplete, and so is the campaign.
  std::ofstream(file) << R"({"name": "two", "implementations": ["reference"], "dtypes": ["float32"], "seeds": [1],
                             "options": {"cases": 3, "max_calls": 1, "properties": ["row-stochastic", "first-position"]}})";
  const Result starved = attncheck(reg, {"campaign", file.string(), "--report-dir", (tmp.path() / "s").string()});
  EXPECT_EQ(starved.code, kIncomplete) << starved.out << starved.err;
  EXPECT_TRUE(contains(slurp(tmp.path() / "s" / "overview.md"), " ? |"));
}

// --law-calls (default: --cases): a law checks 20 cases, then as many more as the calls allow at its calls per case.
// The reference's row-stochastic calls once a case, causal-perturbation twice (the call and its perturbed variant).
// The header and summary.json say what was asked; --law-calls 0 checks --cases cases a law.
TEST(Check, lawCallsSetTheCasesOfALawWhoseCasesCallSeveralTimes) {
  TempDir tmp;
  const std::string dir = (tmp.path() / "r").string();
  const auto check = [&](std::vector<std::string> extra) {
    std::vector<std::string> args{
        "check",       "--impl",  "reference",    "--property", "row-stochastic,causal-perturbation",
        "--no-corpus", "--force", "--report-dir", dir};
    args.insert(args.end(), extra.begin(), extra.end());
    const Result r = attncheck(real_registry(), args);
    EXPECT_EQ(r.code, kAllHeld) << r.out << r.err;
    return std::pair{r.out, reports::Json::parse(slurp(fs::path(dir) / "summary.json"))};
  };
  const auto cases = [](const reports::Json& summary) {
    std::vector<int> n;
    for (const auto& law : summary["laws"]) n.push_back(law["cases_run"].get<int>());
    return n;
  };
  const auto [out, summary] = check({});
  EXPECT_TRUE(contains(out, "up to 100 cases per law (about 100 calls each, at least 20 cases)")) << out;
  EXPECT_EQ(cases(summary), (std::vector<int>{100, 50}));
  EXPECT_EQ(summary["generator"]["law_calls"], 100);
  EXPECT_EQ(summary["generator"]["first_cases"], 20);
  const auto [all_out, all] = check({"--law-calls", "0"});
  EXPECT_TRUE(contains(all_out, ", 100 cases per law, ")) << all_out;
  EXPECT_EQ(cases(all), (std::vector<int>{100, 100}));
  EXPECT_FALSE(all["generator"].contains("law_calls"));
  const auto [few_out, few] = check({"--law-calls", "40"});
  EXPECT_EQ(cases(few), (std::vector<int>{40, 20})) << few_out;
  const Result bad = attncheck(real_registry(), {"check", "--impl", "reference", "--law-calls", "-1"});
  EXPECT_EQ(bad.code, kUsage) << bad.out << bad.err;
  EXPECT_TRUE(contains(bad.err, "--law-calls")) << bad.err;
}

// Declared means drawn: a kernel that declares head dimensions 64, 128 and the MLA pairs 192/128 and 576/512 is
// called at 192 and 576 under the default --max-D (128), so a bug of its MLA path is found; the header lists what
// is drawn, and an explicit --max-D that cuts the pairs says which.
TEST(DeclaredDrawn, declaredHeadDimensionsAboveTheDefaultMaxDAreDrawn) {
  Capabilities caps = reference_implementation()->capabilities();
  caps.head_dims = {64, 128};
  caps.features.add(Feature::v_head_dim);
  caps.head_dim_pairs = {{192, 128}, {576, 512}};
  const ImplementationPtr ref = reference_implementation();
  Registry reg;
  reg.laws = real_registry().laws;
  reg.builtins = {make_implementation("mla-path-bug", "doubles its output on the MLA path (D > 128)", caps,
                                      [ref](const Problem& p) {
                                        Outcome o = ref->forward(p);
                                        if (p.q.shape().D > 128)
                                          for (Index n = 0; n < o.output.size(); ++n) o.output.data()[n] *= 2;
                                        return o;
                                      })};
  TempDir tmp;
  const std::vector<std::string> args{"check",   "--impl", "mla-path-bug", "--property",   "oracle-agreement",
                                      "--cases", "100",    "--no-corpus",  "--report-dir", (tmp.path() / "r").string()};
  const Result found = attncheck(reg, args);
  EXPECT_EQ(found.code, kFalsified) << found.out << found.err;
  EXPECT_TRUE(contains(found.out, "head dimensions drawn: 64, 128, 192/128, 576/512 (declared)\n")) << found.out;
  std::vector<std::string> cut = args;
  cut.insert(cut.end(), {"--max-D", "128", "--force"});
  const Result missed = attncheck(reg, cut);
  EXPECT_EQ(missed.code, kAllHeld) << missed.out << missed.err;
  EXPECT_TRUE(contains(missed.out, "head dimensions drawn: 64, 128 (declared); not drawn, above --max-D 128: 192/128, "
                                   "576/512\n"))
      << missed.out;
}

// A rerun that leaves a law unchecked (a budget, an interrupt) keeps the report an earlier run wrote for it.
TEST(Incomplete, aRerunThatDoesNotCheckALawKeepsItsEarlierReport) {
  const Registry reg = real_registry();
  TempDir tmp;
  const fs::path dir = tmp.path() / "r";
  const std::vector<std::string> common{"check", "--impl", "mutant:mask-zero", "--property",
                                        "zero-future-weight,first-position", "--cases", "20", "--no-corpus",
                                        "--report-dir", dir.string()};
  const Result first = attncheck(reg, common);
  ASSERT_EQ(first.code, kFalsified) << first.out << first.err;
  const std::string report = slurp(dir / "zero-future-weight.json");
  ASSERT_FALSE(report.empty());
  std::vector<std::string> rerun = common;
  rerun.insert(rerun.end(), {"--max-calls", "1"});  // a share of 0 calls for the first law, 1 for the second
  const Result second = attncheck(reg, rerun);
  ASSERT_NE(second.code, kUsage) << second.out << second.err;
  const reports::Json summary = reports::Json::parse(slurp(dir / "summary.json"));
  const reports::Json& law = summary.at("laws").at(0);
  EXPECT_EQ(law.at("status"), "not checked") << law.dump();
  EXPECT_TRUE(contains(law.at("note").get<std::string>(), "is kept (zero-future-weight.json)")) << law.dump();
  EXPECT_EQ(slurp(dir / "zero-future-weight.json"), report) << "the earlier report was lost";
  EXPECT_TRUE(fs::exists(dir / "zero-future-weight.md"));
}

// What merge refuses, naming it: a folder that is no shard, a shard missing or given twice, shards of two runs,
// and a --shard that is not I/N with 0 <= I < N.
TEST(Shards, badShardsAndMergesAreUsageErrorsNamingWhatCame) {
  const Registry reg = real_registry();
  TempDir tmp;
  const auto shard = [&](const std::string& spec, const std::string& seed) {
    const fs::path d = tmp.path() / ("s" + std::to_string(std::hash<std::string>{}(spec + seed)));
    const Result r = attncheck(reg, {"check", "--impl", "reference", "--cases", "3", "--no-corpus", "--property",
                                     "row-stochastic,first-position,determinism", "--seed", seed, "--shard", spec,
                                     "--report-dir", d.string()});
    EXPECT_EQ(r.code, kAllHeld) << r.out << r.err;
    return d.string();
  };
  const std::string a = shard("0/2", "1"), b = shard("1/2", "1"), other = shard("1/2", "2");
  const std::string out = (tmp.path() / "merged").string();
  const auto refused = [&](std::vector<std::string> args, const std::string& says) {
    const Result r = attncheck(reg, args);
    EXPECT_EQ(r.code, kUsage) << r.out << r.err;
    EXPECT_TRUE(contains(r.err, says)) << r.err;
  };
  refused({"merge", "--out", out, a}, "missing: 1/2");
  refused({"merge", "--out", out, a, a, b}, "shard 0/2 is given twice");
  refused({"merge", "--out", out, a, other}, "is a shard of another run than " + a + " (seed 1 vs. 2)");
  refused({"merge", "--out", out, tmp.path().string()}, "holds no readable shard.json");
  for (const std::string bad : {"2/2", "1", "-1/2", "a/b", "0/0"})
    refused({"check", "--impl", "reference", "--shard", bad, "--report-dir", out},
            "--shard: expected I/N, shard I (from 0) of N shards with 0 <= I < N (e.g. 0/4), but got \"" + bad + "\"");
  const Result ok = attncheck(reg, {"merge", "--out", out, b, a});
  EXPECT_EQ(ok.code, kAllHeld) << ok.out << ok.err;
  EXPECT_TRUE(contains(ok.out, "all 3 laws held")) << ok.out;
  // GoogleTest's variables (as Bazel, lit or a CI matrix set them) shard a run without --shard, and the status
  // file is touched.
  const fs::path status = tmp.path() / "shard-status";
  ::setenv("GTEST_TOTAL_SHARDS", "3", 1);
  ::setenv("GTEST_SHARD_INDEX", "2", 1);
  ::setenv("GTEST_SHARD_STATUS_FILE", status.c_str(), 1);
  const Result env = attncheck(reg, {"check", "--impl", "reference", "--cases", "3", "--no-corpus", "--property",
                                     "row-stochastic,first-position,determinism", "--report-dir",
                                     (tmp.path() / "env").string()});
  ::unsetenv("GTEST_TOTAL_SHARDS");
  ::unsetenv("GTEST_SHARD_INDEX");
  ::unsetenv("GTEST_SHARD_STATUS_FILE");
  EXPECT_EQ(env.code, kAllHeld) << env.out << env.err;
  EXPECT_TRUE(contains(env.out, "shard 2/3: 1 of the run's 3 laws")) << env.out;
  EXPECT_TRUE(contains(env.out, "determinism")) << env.out;
  EXPECT_FALSE(contains(env.out, "row-stochastic")) << env.out;
  EXPECT_TRUE(fs::exists(status));
  EXPECT_TRUE(fs::exists(tmp.path() / "env" / "shard.json"));
}

// A campaign runs implementations x dtypes x seeds into one folder each and writes the overview: laws x runs,
// each falsified cell linking to its law's report with the minimal case. Run in two shards and then
// --overview-only, it writes the same overview and the same reports as in one go.
TEST(Campaign, runsEveryCellWritesTheOverviewAndShardsToTheSameResult) {
  const Registry reg = real_registry();
  TempDir tmp;
  const fs::path file = tmp.path() / "zoo.json";
  std::ofstream(file) << R"({"name": "two", "implementations": ["reference", "mutant:mask-zero"],
                             "dtypes": ["float32", "float16"], "seeds": [3],
                             "options": {"cases": 10, "properties": ["zero-future-weight", "first-position",
                                                                     "batch-invariance"]}})";
  const fs::path whole = tmp.path() / "whole", sharded = tmp.path() / "sharded";
  const Result r = attncheck(reg, {"campaign", file.string(), "--report-dir", whole.string()});
  EXPECT_EQ(r.code, kFalsified) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "[4/4] mutant:mask-zero float16 seed 3: 2 of 2 laws falsified")) << r.out;
  const std::string overview = slurp(whole / "overview.md");
  EXPECT_TRUE(contains(overview, "| `zero-future-weight` | ✓ | ✓ | [✗](mutant-mask-zero-float32-seed3/zero-future-weight.html) B=1 H=1 T=1 D=1 T_k=2 |"))
      << overview;
  EXPECT_TRUE(contains(overview, "| **falsified** | **0** | **0** | **2** | **2** |")) << overview;
  // A law that applies to no run is no row of n/a: it is named once under the table.
  EXPECT_FALSE(contains(overview, "| `batch-invariance` |")) << overview;
  EXPECT_TRUE(contains(overview, "Not applicable in any run (1 laws): `batch-invariance`.")) << overview;
  EXPECT_TRUE(contains(slurp(whole / "index.html"), "<td class=\"falsified\"><a href=")) << "each verdict its colour";
  EXPECT_TRUE(fs::exists(whole / "index.html"));
  for (const char* shard : {"1/2", "0/2"}) {
    const Result s = attncheck(reg, {"campaign", file.string(), "--report-dir", sharded.string(), "--shard", shard});
    EXPECT_TRUE(s.code == kAllHeld || s.code == kFalsified) << s.out << s.err;
    EXPECT_FALSE(fs::exists(sharded / "overview.md")) << "a shard writes no overview";
  }
  const Result o = attncheck(reg, {"campaign", file.string(), "--report-dir", sharded.string(), "--overview-only"});
  EXPECT_EQ(o.code, kFalsified) << o.out << o.err;
  EXPECT_EQ(slurp(sharded / "overview.md"), overview);
  for (const char* cell : {"reference-float16-seed3", "mutant-mask-zero-float32-seed3"}) {
    std::string got = slurp(sharded / cell / "summary.json");  // its replay commands name its own folder
    for (std::size_t at; (at = got.find(sharded.string())) != std::string::npos;)
      got.replace(at, sharded.string().size(), whole.string());
    EXPECT_EQ(got, slurp(whole / cell / "summary.json")) << cell;
  }
  // A bad campaign file is a usage error naming what came.
  const auto refused = [&](const std::string& text, const std::string& says) {
    std::ofstream(file) << text;
    const Result b = attncheck(reg, {"campaign", file.string(), "--report-dir", (tmp.path() / "bad").string()});
    EXPECT_EQ(b.code, kUsage) << b.out << b.err;
    EXPECT_TRUE(contains(b.err, says)) << b.err;
  };
  refused("{", "is not valid JSON");
  refused(R"({"dtypes": ["float32"]})", "the field \"implementations\" is missing");
  refused(R"({"implementations": ["reference"], "dtypes": ["float8"]})", "dtypes: expected float32, float64, float16 or bfloat16 but got \"float8\"");
  refused(R"({"implementations": ["reference"], "options": {"cases": 0}})", "options.cases: expected an integer in [1, ");
  refused(R"({"implementations": ["reference"], "options": {"casse": 3}})", "unknown option \"casse\"");
  refused(R"({"implementations": ["reference"], "seed": [1]})", "unknown field \"seed\"");
}

// A tiled mutant: the CLI line gives the margin, the minimal case and the calls made; the Markdown report the
// margin too.
TEST(RealLaws, tiledMutantShowsItsMarginMinimalCaseAndCalls) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "tiled";
  const Result r = attncheck(real_registry(), {"check", "--impl", "mutant:tiled-key-step", "--property",
                                               "oracle-agreement", "--report-dir", dir.string(), "--no-corpus"});
  ASSERT_EQ(r.code, kFalsified) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "margin: ")) << r.out;
  EXPECT_TRUE(contains(r.out, "minimal case B=1 H=1 T_q=1 T_k=17 D=1 (bottom-right)")) << r.out;
  EXPECT_TRUE(contains(r.out, "calls")) << r.out;
  EXPECT_TRUE(contains(slurp(dir / "oracle-agreement.md"), "margin (magnitude / tolerance): ")) << r.out;
}

}  // namespace

// --- Bad data and bad flags are exit 2, attncheck's own failures exit 3 ---

Result expect_usage(const Registry& reg, const std::vector<std::string>& args, const std::vector<std::string>& says) {
  const Result r = attncheck(reg, args);
  std::string shown;
  for (const auto& a : args) shown += a + " ";
  EXPECT_EQ(r.code, kUsage) << shown << "\n" << r.out << r.err;
  for (const auto& part : says) EXPECT_TRUE(contains(r.err, part)) << shown << ": expected \"" << part << "\" in " << r.err;
  EXPECT_FALSE(contains(r.err, "internal error")) << shown << ": " << r.err;
  return r;
}

TEST(BadFlags, nanInfZeroAndNegativeTimeoutsAreRefusedBriefly) {
  for (const char* t : {"nan", "inf", "0", "-1", "1e400", "", "5s"}) {
    const Result r = expect_usage(toy_registry(), {"check", "--impl", "reference", "--timeout", t}, {"--timeout"});
    EXPECT_LT(r.err.size(), 200u) << "no 309-digit bound: " << r.err;
  }
  TempDir tmp;
  EXPECT_EQ(attncheck(toy_registry(), {"check", "--impl", "reference", "--timeout", "2.5", "--cases", "1", "--no-corpus",
                                       "--report-dir", tmp.path().string()}).code, kAllHeld);
}

TEST(BadFlags, seedsThatDoNotFitInUint64AreRefusedNotWrapped) {
  for (const char* seed : {"-1", "18446744073709551616", "99999999999999999999999", "1.5", "0x10"})
    expect_usage(toy_registry(), {"check", "--impl", "reference", "--seed", seed}, {"--seed", seed, "18446744073709551615"});
  TempDir tmp;
  const Result r = attncheck(toy_registry(), {"check", "--impl", "reference", "--seed", "18446744073709551615", "--cases",
                                              "1", "--no-corpus", "--report-dir", tmp.path().string()});
  EXPECT_EQ(r.code, kAllHeld) << r.err;
  EXPECT_TRUE(contains(r.out, "seed 18446744073709551615")) << r.out;
}

TEST(BadFlags, aStressBelowTwoRepeatsIsRefused) {
  // One call is compared with nothing: --stress 1 would make both determinism laws hold vacuously.
  for (const char* n : {"1", "0", "-2", "1.5", "many", "100001"})
    expect_usage(toy_registry(), {"check", "--impl", "reference", "--stress", n}, {"--stress"});
}

TEST(BadFlags, contradictoryFlagsAreRefusedNamingBoth) {
  const Registry& reg = toy_registry();
  expect_usage(reg, {"check", "--impl", "reference", "--shape", "1,1,100,100,8", "--max-T", "10"}, {"--shape", "--max-T 10", "T_q = 100"});
  expect_usage(reg, {"check", "--impl", "reference", "--shape", "1,1,4,4,64", "--max-D", "8"}, {"--shape", "--max-D 8"});
  expect_usage(reg, {"check", "--impl", "reference", "--shape", "8,1,4,4,8", "--max-B", "2"}, {"--shape", "--max-B 2"});
  expect_usage(reg, {"check", "--impl", "reference", "--shape", "1,8,4,4,8", "--max-H", "2"}, {"--shape", "--max-H 2"});
  expect_usage(reg, {"check", "--impl", "reference", "--shape", "1,1,4,4,8", "--min-T", "16"}, {"--shape", "--min-T 16"});
  expect_usage(reg, {"check", "--impl", "reference", "--max-Hkv", "3", "--max-H", "2"}, {"--max-Hkv 3", "--max-H 2"});
  // --long draws its own lengths: a pinned shape or T bounds contradict it.
  expect_usage(reg, {"check", "--impl", "reference", "--long", "--shape", "1,1,4,4,8"}, {"--long", "--shape"});
  expect_usage(reg, {"check", "--impl", "reference", "--long", "--max-T", "100"}, {"--long", "--max-T"});
  expect_usage(reg, {"check", "--impl", "reference", "--long", "--min-T", "100"}, {"--long", "--min-T"});
  for (const std::vector<std::string>& extra : {std::vector<std::string>{"--property", "toy-below-90"}, {"--reproduce", "ABC"},
                                               {"--shape", "1,1,1,1,1"}, {"--cases", "5"}, {"--max-T", "9"}, {"--seed", "3"},
                                               {"--stress", "8"}, {"--long"}}) {
    std::vector<std::string> args = {"check", "--replay", "/nonexistent/toy.json"};
    args.insert(args.end(), extra.begin(), extra.end());
    expect_usage(reg, args, {"--replay", extra.front()});
  }
  // Agreeing flags stay accepted.
  TempDir tmp;
  EXPECT_EQ(attncheck(reg, {"check", "--impl", "reference", "--shape", "1,1,8,8,4", "--max-T", "8", "--max-D", "4",
                            "--cases", "1", "--no-corpus", "--report-dir", tmp.path().string()}).code, kAllHeld);
}

TEST(BadFlags, shapesOutOfRangeOrTooLargeForMemoryAreRefusedAtOnce) {
  const auto start = std::chrono::steady_clock::now();
  expect_usage(toy_registry(), {"check", "--impl", "reference", "--shape", "999999999,999999999,999999999,999999999,999999999"},
               {"--shape", "B = 999999999", "65536"});
  expect_usage(toy_registry(), {"check", "--impl", "reference", "--shape", "65536,65536,1,1,16", "--cases", "1"},
               {"--shape 65536,65536,1,1,16", "GiB", "this machine has"});
  expect_usage(toy_registry(), {"check", "--impl", "reference", "--max-B", "65536", "--max-H", "65536", "--max-T", "1048576"},
               {"the largest case these bounds allow", "GiB"});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
}

TEST(BadFlags, garbageReproduceStringsAreUsageErrors) {
  expect_usage(toy_registry(), {"check", "--impl", "reference", "--property", "toy-below-90", "--reproduce", "!!!"},
               {"--reproduce", "\"!!!\"", "not a RapidCheck reproduce string"});
}

// An exception while a case is generated (std::bad_alloc for a shape that cannot be held) is attncheck's
// failure: exit 3 with the message, never "1 of 1 laws falsified".
TEST(ExitCodes, anExceptionWhileGeneratingIsAnInternalErrorNotAFalsifiedLaw) {
  for (const bool bad_alloc : {true, false})
  for (const char* jobs : {"1", "2"}) {  // serial, and drawn on one thread for two workers
    Law broken = toy_law();
    broken.gen = [bad_alloc](const GenConfig&) {
      return rc::gen::map(rc::gen::inRange(0, 100), [bad_alloc](int) -> LawCase {
        if (bad_alloc) throw std::bad_alloc();
        throw std::length_error("vector::_M_default_append");
      });
    };
    Registry reg = toy_registry();
    reg.laws = {broken};
    TempDir tmp;
    const Result r = attncheck(reg, {"check", "--impl", "reference", "--cases", "3", "--jobs", jobs, "--no-corpus",
                                     "--report-dir", (tmp.path() / "r").string()});
    EXPECT_EQ(r.code, kInternal) << r.out << r.err;
    EXPECT_TRUE(contains(r.err, "internal error: generating a case of toy-below-90")) << r.err;
    EXPECT_TRUE(contains(r.err, bad_alloc ? "out of memory" : "vector::_M_default_append")) << r.err;
    EXPECT_FALSE(contains(r.out, "falsified")) << r.out;
    // The folder was taken (and locked) before the first law; no report is written into it.
    EXPECT_FALSE(fs::exists(tmp.path() / "r" / "summary.json")) << "no report for a run attncheck itself broke";
    EXPECT_FALSE(fs::exists(tmp.path() / "r" / "toy-below-90.json")) << "no report for a run attncheck itself broke";
  }
}

// A toy counterexample document, as `check` writes one, for the file tests to spoil.
reports::Json toy_document(const std::string& impl) {
  LawCase c;
  c.problem.q = Tensor<double>({1, 1, 1, 1});
  c.problem.q(0, 0, 0, 0) = 95;
  c.problem.k = c.problem.v = Tensor<double>({1, 1, 1, 1});
  return reports::Json{{"format", "attncheck-counterexample/1"},
                       {"law", "toy-below-90"},
                       {"implementation", impl},
                       {"dtype", "float32"},
                       {"seed", 1},
                       {"reproduce", ""},
                       {"generator", {{"cases", 100}, {"max_size", 100}, {"max_B", 4}, {"max_H", 4}, {"min_T", 1},
                                      {"max_T", 64}, {"max_T_tail", 256}, {"max_D", 128}}},
                       {"case", reports::to_json(c)}};
}

std::string write_doc(const TempDir& tmp, const std::string& name, const reports::Json& doc) {
  const fs::path p = tmp.path() / name;
  reports::write_atomic(p, doc.dump());
  return p.string();
}

TEST(BadData, aReplayFileNeverStartsTheProgramItNames) {
  TempDir tmp;
  const std::string marker = (tmp.path() / "pwned").string();
  bool loaded = false;
  Registry reg = toy_registry();
  reg.load_external = [&](const std::string&, const LoadOptions&) -> ImplementationPtr {
    loaded = true;
    return reference_implementation();
  };
  for (const std::string& impl : {"exec:touch " + marker + "; true", std::string("plugin:/tmp/evil.so")}) {
    const std::string file = write_doc(tmp, "evil.json", toy_document(impl));
    const Result r = expect_usage(reg, {"check", "--replay", file}, {impl, "--impl", "--replay " + file});
    if (impl.starts_with("exec:")) {
      EXPECT_TRUE(contains(r.err, "attncheck check --impl 'exec:touch " + marker + "; true' --replay " + file)) << r.err;
    }
    EXPECT_FALSE(loaded) << impl;
  }
  EXPECT_FALSE(fs::exists(marker));
  // Built-ins may still come from the file, and an --impl named on the command line is run.
  EXPECT_EQ(attncheck(reg, {"check", "--replay", write_doc(tmp, "ref.json", toy_document("reference"))}).code, kFalsified);
  EXPECT_EQ(attncheck(reg, {"check", "--replay", write_doc(tmp, "evil2.json", toy_document("exec:true")), "--impl",
                            "exec:true"}).code, kFalsified);
  EXPECT_TRUE(loaded);
}

TEST(BadData, everyValueOfAReplayFileIsRangeChecked) {
  TempDir tmp;
  const auto spoil = [&](const std::string& what, const std::function<void(reports::Json&)>& f,
                         const std::vector<std::string>& says) {
    reports::Json doc = toy_document("reference");
    f(doc);
    SCOPED_TRACE(what);
    expect_usage(toy_registry(), {"check", "--replay", write_doc(tmp, "bad.json", doc)}, says);
  };
  using J = reports::Json;
  spoil("tail", [](J& d) { d["generator"]["max_T_tail"] = std::int64_t{1} << 40; }, {"generator.max_T_tail", "1099511627776", "1048576"});
  spoil("max_B", [](J& d) { d["generator"]["max_B"] = 2147483647; }, {"generator.max_B", "2147483647", "65536"});
  spoil("max_H", [](J& d) { d["generator"]["max_H"] = -1; }, {"generator.max_H", "-1"});
  spoil("max_D", [](J& d) { d["generator"]["max_D"] = 0; }, {"generator.max_D", "expected an integer from 1"});
  spoil("max_H_kv", [](J& d) { d["generator"]["max_H_kv"] = -3; }, {"generator.max_H_kv"});
  spoil("min_T", [](J& d) { d["generator"]["min_T"] = 300; }, {"generator.min_T", "max_T_tail"});
  spoil("cases", [](J& d) { d["generator"]["cases"] = 0; }, {"generator.cases"});
  spoil("max_size", [](J& d) { d["generator"]["max_size"] = std::uint64_t(-1); }, {"generator.max_size"});
  spoil("shape", [](J& d) { d["generator"]["shape"] = {1, 1, std::int64_t{1} << 30, 1, 1}; }, {"generator.shape", "T_q", "1048576"});
  spoil("shape neg", [](J& d) { d["generator"]["shape"] = {1, -2, 1, 1, 1}; }, {"generator.shape", "H"});
  spoil("seed", [](J& d) { d["seed"] = -1; }, {"seed", "-1"});
  spoil("cases_run", [](J& d) { d["cases_run"] = -5; }, {"cases_run"});
  for (const J& scale : {J("nan"), J("inf"), J("-inf"), J(0), J(-1.0)})
    spoil("scale " + scale.dump(), [&](J& d) { d["case"]["problem"]["scale"] = scale; }, {"case.problem: scale must be finite and positive"});
  // Every field of the call through the one check of a call's fields (check_call), as the wire and the C loader.
  spoil("key length", [](J& d) { d["case"]["problem"]["key_lengths"] = J::array({99}); }, {"case.problem: key_lengths[0] = 99 is outside [0, T_k = "});
  spoil("key lengths", [](J& d) { d["case"]["problem"]["key_lengths"] = J::array({1, 1, 1, 1, 1, 1, 1, 1, 1}); }, {"case.problem: key_lengths has 9 entries but B = "});
  spoil("window", [](J& d) { d["case"]["problem"]["window"] = -1; }, {"case.problem: window must be >= 0"});
  spoil("sinks", [](J& d) { d["case"]["problem"]["sinks"] = J::array({0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5}); }, {"case.problem: sinks has 9 entries but H = "});
  spoil("softcap", [](J& d) { d["case"]["problem"]["softcap"] = -2.0; }, {"case.problem: softcap must be finite and positive, got -2"});
  spoil("documents", [](J& d) { d["case"]["problem"]["doc_bounds"] = J::array({J::array({2, 1})}); }, {"case.problem: doc_bounds[0][1] = 1 is below the bound before it"});
  spoil("reproduce", [](J& d) { d["reproduce"] = "!!!"; }, {"\"reproduce\"", "not a RapidCheck reproduce string"});
  spoil("reproduce other law", [](J& d) { d["reproduce"] = "BIhelJ3btYWd0Vncl1ydll2ZoRXAAAAAAAAAAEAAAAAAAAAABAAAAAAAAAQAAAAAAAAAAIAACEAAAAACAAAACIgACIA"; },
        {"\"reproduce\"", "not toy-below-90"});
}

TEST(BadData, filesOverTheSizeLimitAreRefusedBeforeTheyAreRead) {
  TempDir tmp;
  const fs::path big = tmp.path() / "big.json";
  { std::ofstream f(big); }
  fs::resize_file(big, reports::kMaxCounterexampleBytes + 1);  // sparse: nothing is written
  expect_usage(toy_registry(), {"check", "--replay", big.string()},
               {big.string(), std::to_string(reports::kMaxCounterexampleBytes), "256 MiB"});
}

TEST(BadData, aStoredCaseOutsideTheImplementationsCapabilitiesIsRefusedNotCalled) {
  Capabilities plain;  // no grouped queries, key padding or window
  long calls = 0;
  Registry reg = toy_registry();
  reg.builtins.push_back(make_implementation("control:plain", "no GQA, padding or window", plain, [&](const Problem& p) {
    ++calls;
    return reference_implementation()->forward(p);
  }));
  TempDir tmp;
  reports::Json doc = toy_document("control:plain");
  LawCase c;
  c.problem.q = Tensor<double>({1, 2, 3, 1});
  c.problem.k = c.problem.v = Tensor<double>({1, 1, 3, 1});
  c.problem.key_lengths = {2};
  c.problem.window = 1;
  doc["case"] = reports::to_json(c);
  const std::string file = write_doc(tmp, "gqa.json", doc);
  expect_usage(reg, {"check", "--replay", file},
               {file, "grouped-query attention (1 kv head for 2 query heads)", "key padding", "a window (1)",
                "control:plain does not declare", "no grouped-query attention"});
  EXPECT_EQ(calls, 0);

  // In the corpus such an entry is skipped with a warning; the run goes on.
  const fs::path corpus = tmp.path() / "corpus";
  fs::create_directories(corpus / "control-plain");
  fs::copy_file(file, corpus / "control-plain" / "toy-below-90-0123456789ab.json");
  reports::Json repro = toy_document("control:plain");
  repro["reproduce"] = "!!!";
  fs::create_directories(corpus / "reference");
  reports::write_atomic(corpus / "reference" / "toy-below-90-0123456789ac.json", repro.dump());
  for (const std::string impl : {"control:plain", "reference"}) {
    const Result r = attncheck(reg, {"check", "--impl", impl, "--cases", "1", "--corpus", corpus.string(), "--report-dir",
                                     (tmp.path() / ("r-" + reports::slug(impl))).string()});
    EXPECT_EQ(r.code, kAllHeld) << r.out << r.err;
    EXPECT_TRUE(contains(r.err, "warning: skipping corpus entry")) << r.err;
    EXPECT_FALSE(contains(r.err, "internal error")) << r.err;
  }
  EXPECT_EQ(calls, 0);
}

// docs/laws.md's laws table is the registry's (`attncheck list --markdown`, from each law's Law::doc): a law added,
// renamed or documented anew without the table regenerated fails here.
TEST(Docs, theLawsTableIsTheRegistrys) {
  std::ifstream in(ATTNCHECK_SOURCE_DIR "/docs/laws.md");
  ASSERT_TRUE(in) << ATTNCHECK_SOURCE_DIR "/docs/laws.md";
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  const std::string begin = "<!-- the laws table: `attncheck list --markdown` writes it -->\n",
                    end = "<!-- end of the laws table -->";
  const auto a = doc.find(begin), b = doc.find(end);
  ASSERT_NE(a, std::string::npos) << "docs/laws.md has no line " << begin;
  ASSERT_NE(b, std::string::npos) << "docs/laws.md has no line " << end;
  EXPECT_EQ(doc.substr(a + begin.size(), b - a - begin.size()), laws_markdown_table(laws()))
      << "regenerate it: attncheck list --markdown";
  const Result r = attncheck(default_registry(), {"list", "--markdown"});
  EXPECT_EQ(r.code, kAllHeld) << r.err;
  EXPECT_EQ(r.out, laws_markdown_table(laws()));
}

// The README counts the laws where a reader first meets them (its opening and its laws section): the registry's
// count, so what is written agrees with what `attncheck list` lists and a run checks.
TEST(Docs, theReadmeCountsTheRegistrysLaws) {
  std::ifstream in(ATTNCHECK_SOURCE_DIR "/README.md");
  ASSERT_TRUE(in) << ATTNCHECK_SOURCE_DIR "/README.md";
  std::stringstream text;
  text << in.rdbuf();
  const std::string readme = text.str(), n = std::to_string(laws().size());
  for (const std::string& said : {"attncheck checks " + n + " laws", "\n" + n + " laws, each a ctest test"})
    EXPECT_TRUE(contains(readme, said)) << "README.md should say \"" << said << "\" (the registry has " << n << " laws)";
}

// The progress line counts the applicable laws only and estimates the time left from the run so far (on a clock
// the test moves): a quarter of the run done in 10 s leaves about 30 s; a law shrinking counts as done.
TEST(Progress, countsTheApplicableLawsAndEstimatesTheTimeLeft) {
  auto t = ProgressLine::Clock::time_point{};
  std::ostringstream err;
  ProgressLine line(err, true, false, [&] { return t; });
  line.set_applicable(2);
  line.begin("row-stochastic");
  t += std::chrono::seconds(1);
  EXPECT_EQ(line.time_left(0.5), "") << "nothing said before 2 s";
  t += std::chrono::seconds(9);  // 10 s in, half of the first of two laws: a quarter of the run
  line.update(Progress{.law = "row-stochastic", .cases_done = 50, .cases_total = 100});
  EXPECT_EQ(err.str(), "[1/2] row-stochastic: 50/100 cases; about 30 s left\n");
  line.end();
  line.begin("oracle-agreement");
  t += std::chrono::seconds(30);  // 40 s in, the second law shrinking: the run's cases are done
  err.str("");
  line.update(Progress{.law = "oracle-agreement", .cases_done = 3, .cases_total = 100, .shrink_steps = 7,
                       .shrinking = true});
  EXPECT_EQ(err.str(), "[2/2] oracle-agreement: falsified after 4 cases; shrinking, 7 steps\n");
  EXPECT_EQ(line.time_left(1.0), "") << "every law's cases done: nothing to estimate";
  // Longer runs in minutes, then hours: 1 minute in, half of the first law of 10 (19 min left), of 100 (3.3 h).
  for (const auto& [laws, says] : {std::pair{10, "about 19 min left"}, std::pair{100, "about 3.3 h left"}}) {
    auto u = ProgressLine::Clock::time_point{};
    std::ostringstream quiet;
    ProgressLine longer(quiet, true, false, [&] { return u; });
    longer.set_applicable(laws);
    longer.begin("row-stochastic");
    u += std::chrono::seconds(60);
    EXPECT_EQ(longer.time_left(0.5), says) << laws << " laws";
  }
}

}  // namespace attncheck::cli
