// Fuzzes the counterexample reader behind `attncheck check --replay FILE`: any text must become a
// StoredCounterexample or a FormatError naming what is wrong; a crash, a sanitizer report or any other
// exception (which the command would report as an internal error, exit 3) is a bug.
#include <cstddef>
#include <cstdint>

#include "attncheck/reports.hpp"

using namespace attncheck;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const reports::Json doc = reports::Json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;  // not JSON: read_counterexample says so before this reader runs
  try {
    reports::counterexample_from_json(doc, "fuzz input");
  } catch (const reports::FormatError&) {
  }
  return 0;
}
