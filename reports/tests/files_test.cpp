// Report files: writes are atomic, an earlier report is never overwritten silently, the corpus only grows,
// and a stored counterexample reads back as it was written.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "attncheck/reports.hpp"
#include "temp_dir.hpp"

namespace attncheck::reports {
namespace {

namespace fs = std::filesystem;
using attncheck::testing::slurp;
using attncheck::testing::spit;
using attncheck::testing::TempDir;

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(WriteAtomic, replacesTheFileAndLeavesNoTemporary) {
  TempDir tmp;
  const fs::path file = tmp.path() / "a.json";
  write_atomic(file, "first\n");
  write_atomic(file, "second\n");
  EXPECT_EQ(slurp(file), "second\n");
  EXPECT_EQ(names_in(tmp.path()), std::vector<std::string>{"a.json"});
}

TEST(WriteAtomic, failureNamesThePathAndLeavesTheOldFile) {
  TempDir tmp;
  const fs::path missing_dir = tmp.path() / "no" / "such" / "a.json";
  try {
    write_atomic(missing_dir, "x");
    FAIL() << "wrote into a folder that does not exist";
  } catch (const FileError& e) {
    EXPECT_NE(std::string(e.what()).find(missing_dir.string()), std::string::npos) << e.what();
  }
  // A folder where the file should be: rename fails; the folder and its content stay as they were.
  const fs::path blocked = tmp.path() / "blocked";
  fs::create_directories(blocked / "inside");
  EXPECT_THROW(write_atomic(blocked, "x"), FileError);
  EXPECT_TRUE(fs::is_directory(blocked / "inside"));
  EXPECT_EQ(names_in(tmp.path()), std::vector<std::string>{"blocked"});
}

TEST(Publish, identicalRerunIsLeftAloneAndChangeIsRefusedWithoutForce) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "reports";
  const std::vector<ReportFile> first = {{"law.json", "{}\n"}, {"summary.json", "{\"n\": 1}\n"}};
  const PublishResult r1 = publish(dir, first, false);
  EXPECT_EQ(r1.written.size(), 2u);
  EXPECT_EQ(slurp(dir / "summary.json"), "{\"n\": 1}\n");

  const PublishResult r2 = publish(dir, first, false);
  EXPECT_TRUE(r2.written.empty());
  EXPECT_EQ(r2.unchanged.size(), 2u);

  const std::vector<ReportFile> second = {{"law.json", "{\"changed\": true}\n"}, {"summary.json", "{\"n\": 1}\n"}};
  try {
    publish(dir, second, false);
    FAIL() << "an earlier report was overwritten silently";
  } catch (const ReportExists& e) {
    EXPECT_NE(std::string(e.what()).find("law.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--force"), std::string::npos) << e.what();
  }
  EXPECT_EQ(slurp(dir / "law.json"), "{}\n") << "the refused run must write nothing";

  const PublishResult r3 = publish(dir, second, true);
  EXPECT_EQ(r3.written, std::vector<std::string>{"law.json"});
  EXPECT_EQ(slurp(dir / "law.json"), "{\"changed\": true}\n");
}

TEST(Publish, staleFileOfAnEarlierRunCountsAsAChangeAndForceRemovesIt) {
  TempDir tmp;
  const fs::path dir = tmp.path();
  publish(dir, {{"old-law.md", "# old\n"}, {"summary.md", "s\n"}}, false);
  spit(dir / "notes.txt", "mine\n");  // not attncheck's: never touched
  EXPECT_THROW(publish(dir, {{"summary.md", "s\n"}}, false), ReportExists);
  EXPECT_TRUE(fs::exists(dir / "old-law.md"));
  const PublishResult r = publish(dir, {{"summary.md", "s\n"}}, true);
  EXPECT_EQ(r.removed, std::vector<std::string>{"old-law.md"});
  EXPECT_FALSE(fs::exists(dir / "old-law.md"));
  EXPECT_EQ(slurp(dir / "notes.txt"), "mine\n");
}

TEST(Publish, aFileWhereTheFolderShouldBeIsAFileError) {
  TempDir tmp;
  spit(tmp.path() / "taken", "x");
  EXPECT_THROW(publish(tmp.path() / "taken", {{"a", "b"}}, false), FileError);
}

LawCase tiny_case(double x) {
  LawCase c;
  c.problem.q = Tensor<double>({1, 1, 1, 1});
  c.problem.k = c.problem.v = c.problem.q;
  c.problem.q(0, 0, 0, 0) = x;
  return c;
}

TEST(Corpus, keepsEveryCaseOnceAndListsOnlyItsLaw) {
  TempDir tmp;
  const Corpus corpus(tmp.path() / "mutant-x");
  const fs::path a = corpus.path_for("row", tiny_case(1));
  const fs::path b = corpus.path_for("row", tiny_case(2));
  const fs::path other = corpus.path_for("row-stochastic", tiny_case(1));
  EXPECT_NE(a, b);
  EXPECT_TRUE(corpus.save(a, Json{{"n", 1}}));
  EXPECT_FALSE(corpus.save(a, Json{{"n", 2}})) << "an entry is never replaced";
  EXPECT_EQ(slurp(a), "{\n  \"n\": 1\n}\n");
  EXPECT_TRUE(corpus.save(b, Json{{"n", 3}}));
  EXPECT_TRUE(corpus.save(other, Json{{"n", 4}}));
  spit(corpus.dir() / "row-notahash.json", "{}");
  std::vector<fs::path> want = {a, b};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(corpus.entries("row"), want);
  EXPECT_EQ(corpus.entries("row-stochastic"), std::vector<fs::path>{other});
  EXPECT_TRUE(Corpus(tmp.path() / "none").entries("row").empty());
}

TEST(ReadCounterexample, readsBackWhatLawDocumentWrote) {
  TempDir tmp;
  RunInfo run;
  run.implementation = "mutant:x";
  run.dtype = DType::f16;
  run.seed = 77;
  run.gen.max_D = 8;
  LawReport r;
  r.result.law = "row-stochastic";
  r.result.status = LawStatus::falsified;
  r.result.seed = 77;
  r.result.cases_run = 5;
  r.result.shrink_steps = 9;
  r.result.reproduce = "ABC";
  r.result.minimal_case = tiny_case(std::numeric_limits<double>::infinity());
  r.result.minimal_case->problem.dtype = DType::f16;
  Violation v;
  v.message = "m";
  v.quantity = "weights";
  v.worst_index = {0, 0, 0, 0};
  v.magnitude = 1;
  r.result.violation = v;
  r.replay_file = (tmp.path() / "row-stochastic.json").string();
  write_atomic(r.replay_file, dump_pretty(law_document(run, r)));

  const StoredCounterexample s = read_counterexample(r.replay_file);
  EXPECT_EQ(s.law, "row-stochastic");
  EXPECT_EQ(s.implementation, "mutant:x");
  EXPECT_EQ(s.dtype, DType::f16);
  EXPECT_EQ(s.seed, 77u);
  EXPECT_EQ(s.cases_run, 5);
  EXPECT_EQ(s.shrink_steps, 9);
  EXPECT_EQ(s.gen.max_D, 8);
  EXPECT_EQ(s.reproduce, "ABC");
  EXPECT_EQ(s.lcase.problem.q(0, 0, 0, 0), std::numeric_limits<double>::infinity());
  ASSERT_TRUE(s.violation.has_value());
  EXPECT_EQ(s.violation->message, "m");
}

TEST(ReadCounterexample, missingAndForeignFilesAreRefusedWithWhatWasExpected) {
  TempDir tmp;
  try {
    read_counterexample(tmp.path() / "nope.json");
    FAIL();
  } catch (const FileError& e) {
    EXPECT_NE(std::string(e.what()).find("no such file"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("LAW.json"), std::string::npos) << e.what();
  }
  spit(tmp.path() / "bad.json", "{not json");
  EXPECT_THROW(read_counterexample(tmp.path() / "bad.json"), FormatError);
  // Valid JSON syntax that no double holds: the parser throws out_of_range, not parse_error (found by
  // fuzz_corpus); it must still be a FormatError the command can report and skip, not a crash.
  spit(tmp.path() / "huge.json", "{\"format\": \"attncheck-counterexample/1\", \"seed\": 3.5e+411111}");
  EXPECT_THROW(read_counterexample(tmp.path() / "huge.json"), FormatError);
  spit(tmp.path() / "other.json", "{\"format\": \"something-else\"}");
  EXPECT_THROW(read_counterexample(tmp.path() / "other.json"), FormatError);
}

// The one way attncheck reads a data file: what is not a regular file under the limit is refused before a byte
// is read, naming the file, what it is and what was expected; a FIFO without a writer is refused at once.
TEST(ReadDataFile, refusesWhatIsNotARegularFileUnderItsLimitWithoutBlocking) {
  TempDir tmp;
  const auto refusal = [](const fs::path& p, std::uintmax_t limit) {
    try {
      read_data_file(p, limit, "a test file");
    } catch (const FileError& e) {
      return std::string(e.what());
    }
    return std::string("(read)");
  };
  const auto says = [](const std::string& what, const std::string& part) {
    return what.find(part) != std::string::npos;
  };
  spit(tmp.path() / "ok", "0123456789");
  EXPECT_EQ(read_data_file(tmp.path() / "ok", 10, "a test file"), "0123456789");
  const std::string big = refusal(tmp.path() / "ok", 9);
  EXPECT_TRUE(says(big, (tmp.path() / "ok").string() + ": it is 10 bytes, above the limit of 9 bytes")) << big;
  EXPECT_TRUE(says(big, "; expected a test file")) << big;
  ASSERT_EQ(::mkfifo((tmp.path() / "fifo").c_str(), 0600), 0);
  EXPECT_TRUE(says(refusal(tmp.path() / "fifo", 10), "it is a FIFO (named pipe), not a regular file"));
  EXPECT_TRUE(says(refusal(tmp.path(), 10), "it is a folder, not a regular file"));
  EXPECT_TRUE(says(refusal("/dev/zero", 10), "it is a character device, not a regular file"));
  EXPECT_TRUE(says(refusal(tmp.path() / "nope", 10), "no such file"));
  fs::create_symlink(tmp.path() / "loop", tmp.path() / "loop");
  EXPECT_TRUE(says(refusal(tmp.path() / "loop", 10), "a loop of symbolic links"));
  fs::create_symlink(tmp.path() / "ok", tmp.path() / "link");  // a link to a file is that file
  EXPECT_EQ(read_data_file(tmp.path() / "link", 10, "a test file"), "0123456789");
}

// GTEST_SHARD_STATUS_FILE's touch: created when missing, never truncated, and never a wait on a FIFO.
TEST(TouchFile, createsWithoutTruncatingAndRefusesWhatIsNoFile) {
  TempDir tmp;
  touch_file(tmp.path() / "status", "a status file");
  EXPECT_TRUE(fs::is_regular_file(tmp.path() / "status"));
  spit(tmp.path() / "status", "kept");
  touch_file(tmp.path() / "status", "a status file");
  EXPECT_EQ(slurp(tmp.path() / "status"), "kept");
  ASSERT_EQ(::mkfifo((tmp.path() / "fifo").c_str(), 0600), 0);
  EXPECT_THROW(touch_file(tmp.path() / "fifo", "a status file"), FileError);
  EXPECT_THROW(touch_file(tmp.path(), "a status file"), FileError);
}

TEST(Slug, makesSpecsSafeFileNames) {
  EXPECT_EQ(slug("mutant:mask-zero"), "mutant-mask-zero");
  EXPECT_EQ(slug("reference"), "reference");
  EXPECT_EQ(slug("exec:python3 my kernel.py --fast"), "exec-python3-my-kernel.py-fast");
  EXPECT_EQ(slug("plugin:../x/libk.so"), "plugin-..-x-libk.so");
  EXPECT_EQ(slug(".."), "implementation");
  EXPECT_EQ(slug("plugin:/a/b").find('/'), std::string::npos);
}

}  // namespace
}  // namespace attncheck::reports
