// Fuzzes the corpus reader as `attncheck check` uses it before new cases: an entry in the corpus folder is
// listed, read back and replayed against the reference implementation under the law it names. Reading may
// refuse the entry (the command warns and skips it); replaying it must not crash or trip a sanitizer.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>

#include "attncheck/law.hpp"
#include "attncheck/reports.hpp"

using namespace attncheck;
namespace fs = std::filesystem;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const fs::path dir = fs::temp_directory_path() / ("attncheck-fuzz-corpus-" + std::to_string(::getpid()));
  static const ImplementationPtr reference = reference_implementation();
  // Stored under the law it names, as attncheck stores entries (any known law for one that names none).
  const reports::Json doc = reports::Json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  const reports::Json* named = doc.is_object() && doc.contains("law") ? &doc["law"] : nullptr;
  const Law* found = named && named->is_string() ? find_law(named->get<std::string>()) : nullptr;
  const Law& law = found ? *found : laws()[size % laws().size()];
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream f(dir / (law.name + "-0123456789ab.json"), std::ios::binary);
    f.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  const reports::Corpus corpus(dir);
  for (const fs::path& file : corpus.entries(law.name)) {
    reports::StoredCounterexample s;
    try {
      s = reports::read_counterexample(file);
    } catch (const reports::FormatError&) {
      continue;
    }
    if (s.law != law.name || !reference->capabilities().supports(s.dtype)) continue;
    try {
      evaluate_case(law, *reference, s.lcase);
    } catch (const std::exception&) {
      // attncheck's own errors on a strange case (the command warns and skips the entry) are not crashes.
    }
  }
  return 0;
}
