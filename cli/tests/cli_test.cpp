// The attncheck command end to end, in-process: exit codes and their messages, reports on disk, replay, the
// corpus, and no silent overwrite. A toy law (rarely failing, instantly shrunk) keeps the mechanics tests
// independent of the real laws; the real registry checks the reference and a mutant.
#include <gtest/gtest.h>

#include <sstream>

#include "temp_dir.hpp"
#include "attncheck/cli.hpp"
#include "attncheck/reports.hpp"

namespace attncheck::cli {
namespace {

namespace fs = std::filesystem;
using attncheck::testing::slurp;
using attncheck::testing::TempDir;

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
           {"check", "--impl", "reference", "--format", "md,html"},
           {"check", "--impl", "mutant:no-such-mutant"},
           {"check", "--impl", "reference", "--reproduce", "ABC"},
           {"check"},
           {}}) {
    const Result r = attncheck(toy_registry(), args);
    std::string shown;
    for (const auto& a : args) shown += a + " ";
    EXPECT_EQ(r.code, kUsage) << shown;
    EXPECT_FALSE(r.err.empty()) << shown << ": no message on stderr";
  }
  EXPECT_TRUE(contains(attncheck(toy_registry(), {"check", "--impl", "mutant:nope"}).err, "reference, mutant:NAME"));
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
  for (const char* f : {"toy-below-90.json", "toy-below-90.md", "summary.json", "summary.md", "junit.xml"})
    EXPECT_TRUE(fs::exists(fs::path(dir) / f)) << f;
  ASSERT_EQ(reports::Corpus(fs::path(dir) / "corpus" / "reference").entries("toy-below-90").size(), 1u);

  const auto stored = reports::read_counterexample(fs::path(dir) / "toy-below-90.json");
  EXPECT_EQ(stored.lcase.problem.q(0, 0, 0, 0), 90) << "shrinking ends at the boundary";
  const Result replay = attncheck(toy_registry(), {"check", "--replay", dir + "/toy-below-90.json"});
  EXPECT_EQ(replay.code, kFalsified) << replay.out << replay.err;
  EXPECT_TRUE(contains(replay.out, "the same violation as recorded")) << replay.out;
  EXPECT_TRUE(contains(replay.out, "regenerates the same case")) << replay.out;
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

TEST(Check, anEarlierDifferentReportIsNotOverwrittenWithoutForce) {
  TempDir tmp;
  const std::string dir = (tmp.path() / "r").string();
  const std::vector<std::string> base = {"check", "--impl", "reference", "--no-corpus", "--report-dir", dir};
  auto with = [&](std::vector<std::string> extra) {
    auto args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return attncheck(toy_registry(), args);
  };
  ASSERT_EQ(with({"--cases", "1000"}).code, kFalsified);
  const std::string before = slurp(fs::path(dir) / "summary.json");
  EXPECT_EQ(with({"--cases", "1000"}).code, kFalsified) << "an identical rerun is fine";
  const Result refused = with({"--cases", "1500"});
  EXPECT_EQ(refused.code, kUsage);
  EXPECT_TRUE(contains(refused.err, "--force")) << refused.err;
  EXPECT_EQ(slurp(fs::path(dir) / "summary.json"), before);
  EXPECT_EQ(with({"--cases", "1500", "--force"}).code, kFalsified);
  EXPECT_NE(slurp(fs::path(dir) / "summary.json"), before);
}

TEST(RealLaws, referenceHoldsEveryLaw) {
  TempDir tmp;
  const Result r = attncheck(real_registry(), {"check", "--impl", "reference", "--report-dir", tmp.path().string()});
  EXPECT_EQ(r.code, kAllHeld) << r.out << r.err;
  EXPECT_TRUE(fs::exists(tmp.path() / "junit.xml"));
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
}

}  // namespace
}  // namespace attncheck::cli
