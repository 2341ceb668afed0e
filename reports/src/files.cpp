// Files of a report: atomic writes, publishing a run without silently overwriting an earlier one, the
// counterexample corpus, and reading a stored counterexample back.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
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

std::string errno_text(int e) { return std::strerror(e); }

// What a path that is not a regular file is, for a message.
std::string kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Why `file` could not be opened or stat'ed, in words.
std::string open_failure(int e) {
  if (e == ENOENT) return "no such file";
  if (e == ELOOP) return "a loop of symbolic links";
  return errno_text(e);
}

std::string mib(std::uintmax_t bytes) {
  return bytes % (std::uintmax_t{1} << 20) == 0 ? std::to_string(bytes >> 20) + " MiB"
                                                 : std::to_string(bytes) + " bytes";
}

// A report folder's own files, compared before they are replaced: anything that is not a regular file of at
// most a counterexample's size reads as absent (the caller then treats what is there as a different file).
std::optional<std::string> read_file(const fs::path& p) {
  try {
    return read_data_file(p, kMaxCounterexampleBytes, "a file attncheck wrote");
  } catch (const FileError&) {
    return std::nullopt;
  }
}

bool is_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

const Json* find(const Json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  const auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

}  // namespace

std::string read_data_file(const fs::path& file, std::uintmax_t max_bytes, std::string_view expected) {
  const std::string hint = "; expected " + std::string(expected);
  const auto refuse = [&](const std::string& why) -> FileError {
    return FileError("cannot read " + file.string() + ": " + why + hint);
  };
  // stat first, so a device is never opened; then the file opened without blocking (a FIFO put in its place
  // meanwhile would otherwise wait for a writer forever) and checked again, as opened.
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) throw refuse(open_failure(errno));
  if (!S_ISREG(st.st_mode)) throw refuse("it is " + kind_of(st.st_mode) + ", not a regular file");
  const auto too_big = [&](std::uintmax_t size) {
    return refuse("it is " + std::to_string(size) + " bytes, above the limit of " + std::to_string(max_bytes) +
                  " bytes (" + mib(max_bytes) + ")");
  };
  if (std::uintmax_t(st.st_size) > max_bytes) throw too_big(std::uintmax_t(st.st_size));
  const int fd = ::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) throw refuse(open_failure(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (::fstat(fd, &st) != 0) throw refuse(errno_text(errno));
  if (!S_ISREG(st.st_mode)) throw refuse("it is " + kind_of(st.st_mode) + ", not a regular file");
  if (std::uintmax_t(st.st_size) > max_bytes) throw too_big(std::uintmax_t(st.st_size));
  // Read to the end, but never past the limit: the file may grow while it is read.
  std::string text;
  text.reserve(std::size_t(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw refuse(errno_text(errno));
    }
    if (n == 0) break;
    if (text.size() + std::size_t(n) > max_bytes) throw too_big(text.size() + std::size_t(n));
    text.append(buf, std::size_t(n));
  }
  return text;
}

void touch_file(const fs::path& file, std::string_view expected) {
  const auto refuse = [&](const std::string& why) {
    return FileError("cannot use " + file.string() + ": " + why + "; expected " + std::string(expected));
  };
  struct stat st {};
  if (::stat(file.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw refuse("it is " + kind_of(st.st_mode) + ", not a regular file");
  // Not truncated (the runner only asks that it exist); O_NONBLOCK: opening a FIFO for writing would wait for
  // a reader forever.
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int e = errno;
    if (::stat(file.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      throw refuse("it is " + kind_of(st.st_mode) + ", not a regular file");
    throw refuse(open_failure(e));
  }
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  ::close(fd);
  if (!regular) throw refuse("it is " + kind_of(st.st_mode) + ", not a regular file");
}

void write_atomic(const fs::path& path, std::string_view content) {
  // A name no other writer uses: this host, process and call (a shared corpus may be written by several
  // machines at once, and a pid is unique only on one of them).
  static std::atomic<unsigned long> calls{0};
  char host[64] = "host";
  if (::gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "host");
  host[sizeof host - 1] = '\0';
  for (char* c = host; *c; ++c)
    if (!std::isalnum(static_cast<unsigned char>(*c)) && *c != '-') *c = '_';
  const fs::path tmp = path.parent_path() / ("." + path.filename().string() + ".tmp-" + host + "-" +
                                             std::to_string(::getpid()) + "-" + std::to_string(calls++));
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

namespace {

// The lock every run takes on its report folder; it names the holder for the message a second run gets.
constexpr const char* kLock = ".attncheck-lock";
// The first line of a manifest names the implementation whose report the folder holds.
constexpr std::string_view kImplementationLine = "#implementation ";
// The corpus' default place is inside the report folder (<report-dir>/corpus): carried over by a swap.
constexpr const char* kCorpusFolder = "corpus";

struct Manifest {
  bool present = false;
  std::optional<std::string> implementation;  ///< absent in manifests of older attncheck versions
  std::set<std::string> files;
};

Manifest read_manifest(const fs::path& dir) {
  Manifest m;
  const auto text = read_file(dir / kManifest);
  if (!text) return m;
  m.present = true;
  std::istringstream lines(*text);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with(kImplementationLine)) m.implementation = line.substr(kImplementationLine.size());
    else if (!line.empty() && line[0] != '#' && line.find('/') == std::string::npos) m.files.insert(line);
  }
  return m;
}

// ".name.tmp-HOST-PID-N" (or, from older versions, ".name.tmp-PID") left by write_atomic when a run was killed
// mid-write.
bool is_temporary(const std::string& name) {
  const auto at = name.rfind(".tmp-");
  return !name.empty() && name[0] == '.' && at != std::string::npos && at + 5 < name.size() &&
         std::all_of(name.begin() + long(at) + 5, name.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; });
}

// The sibling folder a swap builds the new report in: "<parent>/.<name>.staging-<pid>".
std::string staging_prefix(const fs::path& dir) { return "." + dir.filename().string() + ".staging-"; }

std::string lock_holder(int fd) {
  char buf[512];
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string s = n > 0 ? std::string(buf, std::size_t(n)) : std::string();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s.empty() ? "another attncheck run" : s;
}

// Opens and locks DIR/.attncheck-lock, writes who holds it. Throws FileError / ReportBusy.
int take_lock(const fs::path& dir, const std::string& implementation) {
  const fs::path path = dir / kLock;
  for (int attempt = 0;; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
      throw FileError("cannot use " + dir.string() + " as the report folder: cannot write into it (" +
                      errno_text(errno) + ")");
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      const std::string holder = lock_holder(fd);
      ::close(fd);
      if (e == EWOULDBLOCK)
        throw ReportBusy("the report folder " + dir.string() + " is in use by " + holder +
                         "; wait for that run to end, or choose another --report-dir");
      throw FileError("cannot lock the report folder " + dir.string() + ": " + errno_text(e));
    }
    // The lock file we hold must still be the folder's: a run that swapped a new report in meanwhile left the
    // one we opened in the old folder, and the new folder has a lock of its own. Then again, on that one.
    struct stat held {}, now {};
    if (::fstat(fd, &held) != 0 || ::stat(path.c_str(), &now) != 0 || held.st_ino != now.st_ino ||
        held.st_dev != now.st_dev) {
      ::close(fd);
      if (attempt < 8) continue;
      throw ReportBusy("the report folder " + dir.string() + " keeps being replaced by another run");
    }
    const std::string who = "attncheck (pid " + std::to_string(::getpid()) + ", checking " + implementation + ")\n";
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, who.data(), who.size(), 0) != ssize_t(who.size())) {
      const int e = errno;
      ::close(fd);
      throw FileError("cannot write into the report folder " + dir.string() + ": " + errno_text(e));
    }
    return fd;
  }
}

// Under the lock, what an interrupted run left: temporary files in the folder, and staging folders beside it
// (a swap that did not finish). A staging folder may hold the only copy of the corpus, caught between the
// exchange and its move back: that is moved into the folder first if the folder has none.
void clean_leftovers(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (is_temporary(e.path().filename().string())) fs::remove(e.path(), ec);
  const std::string prefix = staging_prefix(dir);
  for (const auto& e : fs::directory_iterator(dir.parent_path(), ec)) {
    const std::string name = e.path().filename().string();
    // ".<name>.staging-<pid>" exactly: not the staging folder of a sibling folder whose name extends ours.
    if (!name.starts_with(prefix) || name.size() == prefix.size() || !e.is_directory() ||
        !std::all_of(name.begin() + long(prefix.size()), name.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    const fs::path corpus = e.path() / kCorpusFolder;
    if (fs::is_directory(corpus, ec) && !fs::exists(dir / kCorpusFolder, ec)) fs::rename(corpus, dir / kCorpusFolder, ec);
    // A corpus that could not be moved back is never deleted: the folder stays for a person to look at.
    if (fs::exists(corpus, ec)) continue;
    fs::remove_all(e.path(), ec);
  }
}

std::string manifest_text(const std::string& implementation, const std::vector<ReportFile>& files) {
  std::string listing = std::string(kImplementationLine) + implementation + "\n";
  for (const auto& f : files) listing += f.name + "\n";
  return listing;
}

}  // namespace

ReportFolder::ReportFolder(fs::path dir, std::string implementation, bool force)
    : implementation_(std::move(implementation)) {
  std::error_code ec;
  dir_ = fs::weakly_canonical(fs::absolute(dir), ec);
  if (ec || dir_.filename().empty()) dir_ = fs::absolute(dir).lexically_normal();
  if (dir_.filename().empty()) dir_ = dir_.parent_path();  // "reports/" -> "reports"
  if (fs::exists(dir_, ec) && !fs::is_directory(dir_, ec))
    throw FileError("cannot use " + dir.string() + " as the report folder: it exists and is not a folder");
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_))
    throw FileError("cannot use " + dir.string() + " as the report folder: " +
                    (ec ? ec.message() : std::string("it is not a folder")));
  lock_fd_ = take_lock(dir_, implementation_);
  try {
    // Writable, not only lockable: the lock file may be an old one in a folder made read-only since.
    const fs::path probe = dir_ / (".attncheck-probe.tmp-" + std::to_string(::getpid()));
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
      throw FileError("cannot use " + dir.string() + " as the report folder: cannot write into it (" +
                      errno_text(errno) + ")");
    ::close(fd);
    ::unlink(probe.c_str());
    clean_leftovers(dir_);
    // Another implementation's report is refused now, before any law runs (publish decides file by file).
    const Manifest m = read_manifest(dir_);
    if (!force && m.present && m.implementation != implementation_) {
      bool any = false;
      for (const auto& f : m.files) any = any || fs::exists(dir_ / f, ec);
      if (any)
        throw ReportExists(dir.string() + " already holds the report of " +
                           (m.implementation ? *m.implementation : std::string("an earlier run")) +
                           "; pass --force to replace it, or choose another --report-dir");
    }
  } catch (...) {
    ::close(lock_fd_);
    throw;
  }
}

ReportFolder::~ReportFolder() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

PublishResult ReportFolder::publish(const std::vector<ReportFile>& files, bool force) {
  const fs::path& dir = dir_;
  std::error_code ec;
  const Manifest previous = read_manifest(dir);
  const bool same_implementation =
      !implementation_.empty() && previous.present && previous.implementation == implementation_;

  std::set<std::string> names;
  for (const auto& f : files) names.insert(f.name);
  std::vector<ReportFile> all = files;
  all.push_back({kManifest, manifest_text(implementation_, files)});

  PublishResult r;
  std::vector<std::string> changed;
  std::vector<const ReportFile*> to_write;
  for (const auto& f : all) {
    const auto existing = read_file(dir / f.name);
    if (existing && *existing == f.content) {
      if (f.name != kManifest) r.unchanged.push_back(f.name);
      continue;
    }
    // Something that cannot be read as a file (a FIFO, a folder) is there all the same, and differs.
    const bool there = existing || fs::symlink_status(dir / f.name, ec).type() != fs::file_type::not_found;
    if (there && f.name != kManifest) changed.push_back(f.name);
    to_write.push_back(&f);
  }
  std::vector<std::string> stale;
  for (const auto& name : previous.files)
    if (!names.count(name) && fs::exists(dir / name)) stale.push_back(name);

  // This implementation's own earlier report is simply replaced; anything else needs --force: a file of
  // another implementation's report, or one attncheck did not write (not in the manifest), that would change.
  std::vector<std::string> conflicts;
  for (const auto& c : changed)
    if (!same_implementation || !previous.files.count(c)) conflicts.push_back(c);
  if (!same_implementation)
    for (const auto& s : stale) conflicts.push_back(s + " (stale)");
  if (!conflicts.empty() && !force) {
    std::string shown;
    for (std::size_t n = 0; n < conflicts.size() && n < 4; ++n) shown += (n ? ", " : "") + conflicts[n];
    if (conflicts.size() > 4) shown += ", and " + std::to_string(conflicts.size() - 4) + " more";
    throw ReportExists(dir.string() + " already holds a different report from an earlier run (" + shown +
                       " would change); pass --force to replace it, or choose another --report-dir");
  }
  if (to_write.empty() && stale.empty()) return r;

  // The whole folder at once, when it holds nothing but attncheck's own files.
  bool swappable = true;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n == kManifest || n == kLock || previous.files.count(n) || names.count(n) || is_temporary(n)) continue;
    if (n == kCorpusFolder && e.is_directory()) continue;
    swappable = false;
  }
  // Not when the folder is (or holds) the working directory: a swap would leave the process, and a user's
  // shell there, in a deleted folder. Not when the corpus inside is on another file system (a mount).
  {
    std::error_code cwd_ec;
    const fs::path cwd = fs::weakly_canonical(fs::current_path(cwd_ec), cwd_ec);
    const auto [d, c] = std::mismatch(dir.begin(), dir.end(), cwd.begin(), cwd.end());
    if (cwd_ec || d == dir.end()) swappable = false;
    struct stat ds {}, cs {};
    if (::stat((dir / kCorpusFolder).c_str(), &cs) == 0 && (::stat(dir.c_str(), &ds) != 0 || ds.st_dev != cs.st_dev))
      swappable = false;
    if (dir.parent_path() == dir) swappable = false;  // the root has no parent to build beside it in
  }
  if (swappable && !ec) {
    const fs::path staging = dir.parent_path() / (staging_prefix(dir) + std::to_string(::getpid()));
    fs::remove_all(staging, ec);
    if (fs::create_directory(staging, ec) && !ec) {
      int new_lock = -1;
      try {
        for (const auto& f : all) write_atomic(staging / f.name, f.content);
        new_lock = take_lock(staging, implementation_);  // the folder's lock after the exchange
      } catch (const FileError&) {
        if (new_lock >= 0) ::close(new_lock);
        new_lock = -1;
      }
      // The new folder gets the old one's permissions (a folder shared by a team stays shared).
      fs::permissions(staging, fs::status(dir, ec).permissions(), ec);
      if (new_lock >= 0 &&
          ::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
        // `staging` now holds the old report: keep its corpus, drop the rest. A corpus that cannot be moved
        // back is never deleted: the old folder stays beside the new one, and the next run tries again.
        if (fs::is_directory(staging / kCorpusFolder, ec)) fs::rename(staging / kCorpusFolder, dir / kCorpusFolder, ec);
        ::close(lock_fd_);
        lock_fd_ = new_lock;
        if (!fs::exists(staging / kCorpusFolder, ec)) fs::remove_all(staging, ec);
        for (const ReportFile* f : to_write)
          if (f->name != kManifest) r.written.push_back(f->name);
        r.removed = stale;
        r.swapped = true;
        return r;
      }
      if (new_lock >= 0) ::close(new_lock);
      fs::remove_all(staging, ec);  // no exchange here (an old kernel, a file system without it): file by file
    }
  }

  // File by file: summary.json last, so a reader who sees it sees the files it lists; the manifest after all.
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

std::vector<ReportFile> law_files_in(const fs::path& dir, std::string_view law) {
  // Only what an earlier run listed as its own, under the names a law's report takes.
  const Manifest m = read_manifest(dir);
  std::vector<ReportFile> kept;
  for (const std::string_view suffix : {".json", ".md", ".html", "-error.svg", "-weights.svg", "-variance.svg"}) {
    const std::string name = law_file(law, suffix);
    if (!m.files.contains(name)) continue;
    if (auto text = read_file(dir / name)) kept.push_back({name, std::move(*text)});  // a regular file, bounded
  }
  return kept;
}

PublishResult publish(const fs::path& dir, const std::vector<ReportFile>& files, bool force) {
  ReportFolder folder(dir, "", true);
  return folder.publish(files, force);
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
  std::error_code ec;
  // Anything already under the entry's name (even a dangling link) keeps it; a path that cannot be looked at
  // (a loop of links, no permission) is a FileError like any other failure to save.
  const fs::file_status there = fs::symlink_status(path, ec);
  if (ec && there.type() != fs::file_type::not_found)
    throw FileError("cannot save the corpus entry " + path.string() + ": " + ec.message());
  if (fs::exists(there)) return false;
  ec.clear();
  fs::create_directories(path.parent_path(), ec);
  if (ec) throw FileError("cannot create the corpus folder " + path.parent_path().string() + ": " + ec.message());
  write_atomic(path, dump_pretty(doc));
  return true;
}

StoredCounterexample read_counterexample(const fs::path& file) {
  const std::string hint = " (expected a LAW.json report or a corpus entry written by `attncheck check`)";
  // Refused before it is read when too big: parsing holds about 40 bytes per number (a 100 MB file took 2.1 GB).
  const std::string text =
      read_data_file(file, kMaxCounterexampleBytes, "a LAW.json report or a corpus entry written by `attncheck check`");
  Json doc;
  try {
    doc = Json::parse(text);
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
  s.calls = int_field(doc, "", "calls", 0L, 0, std::numeric_limits<std::int64_t>::max(), "");
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
    if (const Json* ll = find(*g, "long_lengths")) {  // --long
      if (!ll->is_array() || ll->empty() || ll->size() > 16)
        throw FormatError(what + ": \"generator.long_lengths\" is not an array of 1 to 16 lengths (--long)");
      for (const Json& x : *ll) {
        if (!x.is_number_integer() || x.get<std::int64_t>() < 1 || x.get<std::int64_t>() > kMaxSeqLen ||
            (!s.gen.long_lengths.empty() && x.get<std::int64_t>() <= s.gen.long_lengths.back()))
          throw FormatError(what + ": \"generator.long_lengths\" holds " + x.dump() +
                            "; expected ascending lengths in [1, " + std::to_string(kMaxSeqLen) + "]");
        s.gen.long_lengths.push_back(Index(x.get<std::int64_t>()));
      }
    }
    if (const Json* lq = find(*g, "long_max_T_q")) {  // --long on a zoo kernel: the queries of a call bounded
      if (!lq->is_number_integer() || lq->get<std::int64_t>() < 1 || lq->get<std::int64_t>() > kMaxSeqLen ||
          s.gen.long_lengths.empty())
        throw FormatError(what + ": \"generator.long_max_T_q\" is " + lq->dump() + "; expected a length in [1, " +
                          std::to_string(kMaxSeqLen) + "] beside \"generator.long_lengths\" (--long)");
      s.gen.long_max_T_q = Index(lq->get<std::int64_t>());
    }
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
