// Fuzzes the counterexample reader behind `attncheck check --replay FILE`: any text must become a
// StoredCounterexample or a FormatError naming what is wrong; a crash, a sanitizer report or any other
// exception (which the command would report as an internal error, exit 3) is a bug. A decoded file then goes
// on through what `check` does with it before any implementation is called: the reproduce string is decoded
// (std::invalid_argument, exit 2, when it is not one), the case is held against an implementation's
// capabilities (needs_outside) and the law's applicability under the recorded bounds.
#include <cstddef>
#include <cstdint>

#include <stdexcept>

#include "attncheck/law.hpp"
#include "attncheck/reports.hpp"

using namespace attncheck;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const reports::Json doc = reports::Json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;  // not JSON: read_counterexample says so before this reader runs
  reports::StoredCounterexample s;
  try {
    s = reports::counterexample_from_json(doc, "fuzz input");
  } catch (const reports::FormatError&) {
    return 0;
  }
  if (!s.reproduce.empty()) {
    try {
      check_reproduce_string(s.reproduce, s.law);
    } catch (const std::invalid_argument&) {
    }
  }
  // The capabilities of a plain plug-in (none of the optional ones) and of the reference (all of them).
  static const Capabilities plain{};
  static const Capabilities all = reference_implementation()->capabilities();
  for (const Capabilities* caps : {&plain, &all}) {
    (void)needs_outside(s.lcase.problem, *caps);
    if (s.lcase.variant) (void)needs_outside(*s.lcase.variant, *caps);
    describe_capabilities(*caps);
    if (const Law* law = find_law(s.law); law && law->not_applicable) {
      GenConfig g = s.gen;
      g.dtype = s.dtype;
      g.caps = *caps;
      (void)law->not_applicable(g);
    }
  }
  return 0;
}
