// Files of a report: atomic writes, publishing a run without silently overwriting an earlier one, the
// counterexample corpus, and reading a stored counterexample back.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "attncheck/reports.hpp"

namespace attncheck::reports {
namespace fs = std::filesystem;
namespace {

// Lists the files a run wrote, so the next run can tell which of them would be left stale.
constexpr const char* kManifest = ".attncheck-report";

std::optional<std::string> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string errno_text(int e) { return std::strerror(e); }

bool is_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

const Json* find(const Json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  const auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

}  // namespace

void write_atomic(const fs::path& path, std::string_view content) {
  const fs::path tmp = path.parent_path() / ("." + path.filename().string() + ".tmp-" + std::to_string(::getpid()));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw FileError("cannot write " + path.string() + ": " + errno_text(errno));
  const auto fail = [&](int e) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw FileError("cannot write " + path.string() + ": " + errno_text(e));
  };
  for (std::size_t done = 0; done < content.size();) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(errno);
    }
    done += static_cast<std::size_t>(n);
  }
  // Flush before the rename: otherwise a crash can leave the new name pointing at an empty file.
  if (::fsync(fd) != 0) fail(errno);
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw FileError("cannot write " + path.string() + ": " + errno_text(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw FileError("cannot write " + path.string() + ": " + errno_text(e));
  }
}

PublishResult publish(const fs::path& dir, const std::vector<ReportFile>& files, bool force) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    throw FileError("cannot use " + dir.string() + " as the report folder: " +
                    (ec ? ec.message() : std::string("it exists and is not a folder")));

  std::set<std::string> previous;
  if (const auto manifest = read_file(dir / kManifest)) {
    std::istringstream lines(*manifest);
    for (std::string name; std::getline(lines, name);)
      if (!name.empty() && name.find('/') == std::string::npos) previous.insert(name);
  }

  std::string listing;
  std::set<std::string> names;
  for (const auto& f : files) {
    names.insert(f.name);
    listing += f.name + "\n";
  }
  std::vector<ReportFile> all = files;
  all.push_back({kManifest, listing});

  PublishResult r;
  std::vector<std::string> changed;
  std::vector<const ReportFile*> to_write;
  for (const auto& f : all) {
    const auto existing = read_file(dir / f.name);
    if (existing && *existing == f.content) {
      if (f.name != kManifest) r.unchanged.push_back(f.name);
      continue;
    }
    if (existing) changed.push_back(f.name);
    to_write.push_back(&f);
  }
  std::vector<std::string> stale;
  for (const auto& name : previous)
    if (!names.count(name) && fs::exists(dir / name)) stale.push_back(name);

  std::vector<std::string> conflicts = changed;
  conflicts.erase(std::remove(conflicts.begin(), conflicts.end(), kManifest), conflicts.end());
  for (const auto& s : stale) conflicts.push_back(s + " (stale)");
  if (!conflicts.empty() && !force) {
    std::string shown;
    for (std::size_t n = 0; n < conflicts.size() && n < 4; ++n) shown += (n ? ", " : "") + conflicts[n];
    if (conflicts.size() > 4) shown += ", and " + std::to_string(conflicts.size() - 4) + " more";
    throw ReportExists(dir.string() + " already holds a different report from an earlier run (" + shown +
                       " would change); pass --force to replace it, or choose another --report-dir");
  }

  // summary.json last, so a reader who sees it sees the files it lists; the manifest after everything.
  std::stable_partition(to_write.begin(), to_write.end(),
                        [](const ReportFile* f) { return f->name != "summary.json" && f->name != kManifest; });
  for (const ReportFile* f : to_write) {
    write_atomic(dir / f->name, f->content);
    if (f->name != kManifest) r.written.push_back(f->name);
  }
  for (const auto& name : stale) {
    fs::remove(dir / name, ec);
    if (ec) throw FileError("cannot remove the stale report file " + (dir / name).string() + ": " + ec.message());
    r.removed.push_back(name);
  }
  return r;
}

std::string slug(std::string_view spec) {
  std::string out;
  for (const char c : spec) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_';
    if (keep) out += c;
    else if (!out.empty() && out.back() != '-') out += '-';  // anything else, '/' included, becomes one '-'

  }
  while (!out.empty() && (out.back() == '-' || out.back() == '.')) out.pop_back();
  const auto first = out.find_first_not_of("-.");
  out = first == std::string::npos ? std::string() : out.substr(first);
  if (out.empty()) out = "implementation";
  if (out.size() > 80) out = out.substr(0, 80);
  return out;
}

fs::path Corpus::path_for(std::string_view law, const LawCase& c) const {
  return dir_ / (std::string(law) + "-" + case_hash(c).substr(0, 12) + ".json");
}

std::vector<fs::path> Corpus::entries(std::string_view law) const {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return out;
  const std::string prefix = std::string(law) + "-";
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    // <law>-<12 hex digits>.json exactly, so a law whose name extends another's is not picked up.
    if (name.size() != prefix.size() + 12 + 5 || name.rfind(prefix, 0) != 0 || !name.ends_with(".json")) continue;
    if (!is_hex(std::string_view(name).substr(prefix.size(), 12))) continue;
    out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool Corpus::save(const fs::path& path, const Json& doc) const {
  if (fs::exists(path)) return false;
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) throw FileError("cannot create the corpus folder " + path.parent_path().string() + ": " + ec.message());
  write_atomic(path, dump_pretty(doc));
  return true;
}

StoredCounterexample read_counterexample(const fs::path& file) {
  const std::string hint = " (expected a LAW.json report or a corpus entry written by `attncheck check`)";
  std::error_code ec;
  if (!fs::is_regular_file(file, ec))
    throw FileError("cannot read " + file.string() + ": " + (fs::exists(file) ? "not a file" : "no such file") + hint);
  // Refused before it is read: parsing holds about 40 bytes per number (a 100 MB file took 2.1 GB).
  if (const std::uintmax_t size = fs::file_size(file, ec); !ec && size > kMaxCounterexampleBytes)
    throw FormatError(file.string() + " is " + std::to_string(size) + " bytes; a counterexample attncheck reads is at most " +
                      std::to_string(kMaxCounterexampleBytes) + " bytes (" +
                      std::to_string(kMaxCounterexampleBytes >> 20) + " MiB)" + hint);
  const auto text = read_file(file);
  if (!text) throw FileError("cannot read " + file.string() + hint);
  Json doc;
  try {
    doc = Json::parse(*text);
  } catch (const Json::exception& e) {
    // Not only parse_error: a number literal beyond double's range (1e+400) is valid JSON syntax that
    // nlohmann refuses with out_of_range (406) while parsing. Every such refusal is a malformed file.
    throw FormatError(file.string() + " is not JSON attncheck can read (" + e.what() + ")" + hint);
  }
  return counterexample_from_json(doc, file.string());
}

StoredCounterexample counterexample_from_json(const Json& doc, const std::string& what) {
  const std::string hint = " (expected a LAW.json report or a corpus entry written by `attncheck check`)";
  const Json* format = find(doc, "format");
  if (!format || *format != "attncheck-counterexample/1")
    throw FormatError(what + ": \"format\" is not \"attncheck-counterexample/1\"" + hint);

  StoredCounterexample s;
  const auto text_field = [&](const char* key) {
    const Json* j = find(doc, key);
    if (!j || !j->is_string()) throw FormatError(what + ": the field \"" + key + "\" is missing or not a string");
    return j->get<std::string>();
  };
  // Every number is range-checked here, before anything uses it: the same ranges the command line accepts.
  const auto int_field = [&](const Json& obj, const char* prefix, const char* key, auto fallback, std::int64_t lo,
                             std::int64_t hi, const char* meaning) {
    using T = decltype(fallback);
    const Json* j = find(obj, key);
    if (!j) return fallback;
    const std::string name = std::string(prefix) + key;
    const std::string range = std::to_string(lo) + " to " + std::to_string(hi) + (*meaning ? std::string(" (") + meaning + ")" : "");
    if (!j->is_number_integer()) throw FormatError(what + ": \"" + name + "\" is " + j->dump().substr(0, 40) + "; expected an integer from " + range);
    const bool too_big = j->is_number_unsigned() && j->get<std::uint64_t>() > std::uint64_t(hi);
    if (too_big || (!j->is_number_unsigned() && (j->get<std::int64_t>() < lo || j->get<std::int64_t>() > hi)) ||
        (j->is_number_unsigned() && std::int64_t(j->get<std::uint64_t>()) < lo))
      throw FormatError(what + ": \"" + name + "\" is " + j->dump() + "; expected an integer from " + range);
    return static_cast<T>(j->get<std::int64_t>());
  };
  s.law = text_field("law");
  s.implementation = text_field("implementation");
  s.dtype = dtype_field(text_field("dtype"));
  if (const Json* j = find(doc, "seed")) {
    if (!j->is_number_unsigned())
      throw FormatError(what + ": \"seed\" is " + j->dump().substr(0, 40) + "; expected an integer from 0 to " +
                        std::to_string(std::numeric_limits<std::uint64_t>::max()));
    s.seed = j->get<std::uint64_t>();
  }
  constexpr std::int64_t kInt = std::numeric_limits<int>::max();
  s.cases_run = int_field(doc, "", "cases_run", 0, 0, kInt, "");
  s.shrink_steps = int_field(doc, "", "shrink_steps", 0, 0, kInt, "");
  if (const Json* r = find(doc, "reproduce"); r && r->is_string()) s.reproduce = r->get<std::string>();
  if (const Json* g = find(doc, "generator")) {
    if (!g->is_object()) throw FormatError(what + ": \"generator\" is not an object");
    const char* G = "generator.";
    s.cases = int_field(*g, G, "cases", s.cases, 1, kMaxCases, "as --cases");
    s.max_size = int_field(*g, G, "max_size", s.max_size, 0, kMaxRcSize, "RapidCheck's size; attncheck runs at 100");
    s.gen.max_B = int_field(*g, G, "max_B", s.gen.max_B, 1, kMaxExtent, "as --max-B");
    s.gen.max_H = int_field(*g, G, "max_H", s.gen.max_H, 1, kMaxExtent, "as --max-H");
    s.gen.max_H_kv = int_field(*g, G, "max_H_kv", s.gen.max_H_kv, 0, kMaxExtent, "as --max-Hkv; 0: up to H");
    s.gen.min_T = int_field(*g, G, "min_T", s.gen.min_T, 1, kMaxSeqLen, "as --min-T");
    s.gen.max_T = int_field(*g, G, "max_T", s.gen.max_T, 1, kMaxSeqLen, "as --max-T");
    s.gen.max_T_tail = int_field(*g, G, "max_T_tail", s.gen.max_T_tail, 1, kMaxSeqLen, "as --max-T");
    s.gen.max_D = int_field(*g, G, "max_D", s.gen.max_D, 1, kMaxExtent, "as --max-D");
    const auto bounds = [&](const std::string& a, Index x, const std::string& b, Index y) {
      if (x > y)
        throw FormatError(what + ": \"generator." + a + "\" is " + std::to_string(x) + " but \"generator." + b +
                          "\" is " + std::to_string(y) + "; expected " + a + " <= " + b);
    };
    bounds("max_T", s.gen.max_T, "max_T_tail", s.gen.max_T_tail);
    bounds("min_T", s.gen.min_T, "max_T_tail", s.gen.max_T_tail);
    if (const Json* sh = find(*g, "shape")) {
      if (!sh->is_array() || sh->size() != 5)
        throw FormatError(what + ": \"generator.shape\" is not [B, H, T_q, T_k, D]");
      static const char* const names[] = {"B", "H", "T_q", "T_k", "D"};
      std::array<Index, 5> shape{};
      for (std::size_t n = 0; n < 5; ++n) {
        const Json& x = (*sh)[n];
        const std::int64_t hi = n == 2 || n == 3 ? kMaxSeqLen : kMaxExtent;
        if (!x.is_number_integer() || (x.is_number_unsigned() && x.get<std::uint64_t>() > std::uint64_t(hi)) ||
            (!x.is_number_unsigned() && (x.get<std::int64_t>() < 1 || x.get<std::int64_t>() > hi)))
          throw FormatError(what + ": \"generator.shape\" " + names[n] + " is " + x.dump().substr(0, 40) +
                            "; expected an integer from 1 to " + std::to_string(hi) + " (as --shape)");
        shape[n] = static_cast<Index>(x.get<std::int64_t>());
      }
      s.gen.shape = shape;
    }
  }
  s.gen.dtype = s.dtype;
  const Json* c = find(doc, "case");
  if (!c) throw FormatError(what + ": the field \"case\" is missing");
  s.lcase = law_case_from_json(*c, what + ": case");
  if (const Json* v = find(doc, "violation"); v && !v->is_null()) s.violation = violation_from_json(*v, what + ": violation");
  return s;
}

}  // namespace attncheck::reports
