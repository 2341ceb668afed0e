// Fuzzes the report writers with bytes a plug-in controls: its description (its table's or handshake's name)
// and the message of a failed call (an error message, or the stderr it printed before dying), as they reach
// a report: through printable_text and ImplementationError, as the harness keeps them. Every format must be
// written without an exception, and the JSON ones must parse back.
#include <cstddef>
#include <cstdint>
#include <string>

#include "attncheck/law.hpp"
#include "attncheck/reports.hpp"

using namespace attncheck;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const std::size_t cut = bytes.find('\0');
  const std::string description = bytes.substr(0, cut), message = cut == std::string::npos ? "" : bytes.substr(cut + 1);

  reports::RunInfo run;
  run.implementation = "plugin:./libfuzzed.so";
  run.implementation_description = printable_text(description);
  reports::LawReport law;
  law.result.law = "row-stochastic";
  law.result.implementation = run.implementation;
  law.result.status = LawStatus::falsified;
  law.result.note = printable_text(message);
  Violation v;
  v.quantity = "call";
  v.message = std::string("crash: ") + ImplementationError(ImplementationError::Kind::crash, message).what();
  law.result.violation = v;
  law.summary = "every row of weights sums to 1";
  law.why = "softmax";
  for (const reports::ReportFile& f : reports::render_run(run, {law}, reports::Formats{})) {
    if (f.name.ends_with(".json")) {
      const reports::Json back = reports::Json::parse(f.content);  // throws, and so fails, if it does not parse
      if (!back.is_object()) __builtin_trap();
    }
  }
  return 0;
}
