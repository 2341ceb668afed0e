// The main() of every GoogleTest executable: RapidCheck properties run at seed 1 unless RC_PARAMS names a seed
// or a reproduce string, so a ctest run (in CI too) is the same run every time; `RC_PARAMS="seed=N"` explores.
#include <gtest/gtest.h>

#include "attncheck/allocator.hpp"

#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  attncheck::keep_freed_memory();
  // Before anything asks RapidCheck for its configuration, which it reads once, on first use.
  const char* given = std::getenv("RC_PARAMS");
  const std::string params = given ? given : "";
  if (params.find("seed=") == std::string::npos && params.find("reproduce=") == std::string::npos)
    ::setenv("RC_PARAMS", ("seed=1 " + params).c_str(), 1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
