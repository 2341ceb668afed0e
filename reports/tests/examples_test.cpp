// The example reports in reports/examples/ are what the documented command writes today: regenerate them into
// a scratch folder and compare every file byte for byte (reports hold no dates or timings, and runs are
// deterministic at a fixed seed).
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>

#include "temp_dir.hpp"

namespace {

namespace fs = std::filesystem;
using attncheck::testing::slurp;
using attncheck::testing::TempDir;

std::set<std::string> files_under(const fs::path& root) {
  std::set<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file() && e.path().filename() != ".attncheck-lock")  // the run's lock, not a report
      out.insert(fs::relative(e.path(), root).generic_string());
  out.erase("README.md");  // the folder's own note, not generated
  return out;
}

TEST(Examples, regeneratedReportsAreByteIdentical) {
#ifdef ATTNCHECK_SANITIZED
  // Ten full `attncheck check` runs are minutes under ASan + UBSan, and byte identity is the default build's
  // question; the report writers run under the sanitizers in the cli and reports tests.
  GTEST_SKIP() << "byte identity of the examples is checked in the default build (scripts/test.sh)";
#endif
  const fs::path source = fs::path(ATTNCHECK_SOURCE_DIR) / "reports" / "examples";
  const std::string hint = "; if the change is intended, regenerate them from the repository root with "
                           "reports/make-examples.sh build/default/cli/attncheck";
  TempDir tmp;
  // The same relative folder as the documented command, so the replay commands inside the files match.
  const std::string cmd = "cd '" + tmp.path().string() + "' && bash '" + ATTNCHECK_SOURCE_DIR +
                          "/reports/make-examples.sh' '" + ATTNCHECK_BIN + "' reports/examples > log.txt 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(tmp.path() / "log.txt");
  const fs::path fresh = tmp.path() / "reports" / "examples";

  const auto want = files_under(source), got = files_under(fresh);
  ASSERT_FALSE(want.empty()) << "no example reports in " << source;
  for (const auto& f : want)
    if (!got.count(f)) ADD_FAILURE() << "reports/examples/" << f << " is no longer written" << hint;
  for (const auto& f : got)
    if (!want.count(f)) ADD_FAILURE() << "reports/examples/" << f << " is new" << hint;
  for (const auto& f : want)
    if (got.count(f)) {
      EXPECT_EQ(slurp(source / f), slurp(fresh / f)) << "reports/examples/" << f << " differs" << hint;
    }
}

}  // namespace
