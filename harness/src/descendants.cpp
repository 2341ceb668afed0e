// The tree of this process's descendants from /proc, read with raw system calls into static buffers so that
// a signal handler may end it (see descendants.hpp).
#include "descendants.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

namespace attncheck::detail {
namespace {

std::atomic<bool> g_subreaper{false};

// One scan of /proc: every process's pid and parent. A machine with more processes than this has its extra
// ones missed by one scan; the next scan (end_descendants repeats) sees the rest once the first are gone.
constexpr int kMaxProcesses = 1 << 15;
pid_t g_pid[kMaxProcesses], g_ppid[kMaxProcesses];
bool g_mark[kMaxProcesses], g_zombie[kMaxProcesses];
std::atomic_flag g_busy = ATOMIC_FLAG_INIT;

struct linux_dirent64 {
  unsigned long long d_ino;
  long long d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[1];  // the name runs on past the struct, to d_reclen
};

long parse_long(const char* s, const char** end) {
  long v = 0;
  while (*s >= '0' && *s <= '9') v = v * 10 + (*s++ - '0');
  *end = s;
  return v;
}

// The parent of `pid` from /proc/PID/stat ("pid (comm) state ppid ..."; comm may hold spaces and parentheses,
// so the fields are read after the last ')'). -1 when it is gone; `zombie` says it has exited unreaped.
pid_t parent_of(const char* pid_text, bool& zombie) {
  char path[64] = "/proc/";
  int n = 6;
  for (const char* c = pid_text; *c && n < 50; ++c) path[n++] = *c;
  const char tail[] = "/stat";
  for (const char* c = tail; *c; ++c) path[n++] = *c;
  path[n] = 0;
  const int fd = static_cast<int>(::syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC));
  if (fd < 0) return -1;
  char buf[1024];
  const ssize_t got = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (got <= 0) return -1;
  buf[got] = 0;
  const char* close_paren = nullptr;
  for (const char* c = buf; *c; ++c)
    if (*c == ')') close_paren = c;
  if (!close_paren || close_paren[1] != ' ' || !close_paren[2]) return -1;
  if (close_paren[2] == 'X') return -1;
  zombie = close_paren[2] == 'Z';
  const char* end = nullptr;
  const long ppid = parse_long(close_paren + 4, &end);
  return end == close_paren + 4 ? -1 : static_cast<pid_t>(ppid);
}

// Fills g_pid/g_ppid; returns the count.
int scan() {
  const int dir = static_cast<int>(::syscall(SYS_openat, AT_FDCWD, "/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir < 0) return 0;
  int count = 0;
  alignas(8) char buf[8192];
  for (;;) {
    const long n = ::syscall(SYS_getdents64, dir, buf, sizeof buf);
    if (n <= 0) break;
    for (long off = 0; off < n;) {
      const auto* d = reinterpret_cast<const linux_dirent64*>(buf + off);
      off += d->d_reclen;
      if (d->d_name[0] < '1' || d->d_name[0] > '9' || count >= kMaxProcesses) continue;
      const char* end = nullptr;
      const long pid = parse_long(d->d_name, &end);
      if (*end) continue;
      bool zombie = false;
      const pid_t ppid = parent_of(d->d_name, zombie);
      if (ppid < 0) continue;
      g_zombie[count] = zombie;
      g_pid[count] = static_cast<pid_t>(pid);
      g_ppid[count] = ppid;
      ++count;
    }
  }
  ::close(dir);
  return count;
}

void sleep_ms(long ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

}  // namespace

bool become_subreaper() {
  const bool ok = ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0;
  if (ok) g_subreaper = true;
  return ok;
}

bool is_subreaper() { return g_subreaper; }

int end_descendants(const pid_t* spare, int n_spare, int max_ms) {
  if (g_busy.test_and_set()) return 0;  // a signal handler interrupted a call in progress: that one finishes
  const pid_t self = ::getpid();
  int killed = 0;
  timespec start{};
  ::clock_gettime(CLOCK_MONOTONIC, &start);  // async-signal-safe
  const auto elapsed_ms = [&] {
    timespec now{};
    ::clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - start.tv_sec) * 1000L + (now.tv_nsec - start.tv_nsec) / 1000000L;
  };
  while (elapsed_ms() <= max_ms) {
    const int n = scan();
    // Mark the descendants: passes over the table until no process joins (a parent may be listed after its
    // child), never through a spared process.
    for (int i = 0; i < n; ++i) g_mark[i] = false;
    const auto spared = [&](pid_t p) {
      for (int s = 0; s < n_spare; ++s)
        if (spare[s] == p) return true;
      return false;
    };
    for (bool grew = true; grew;) {
      grew = false;
      for (int i = 0; i < n; ++i) {
        if (g_mark[i] || spared(g_pid[i])) continue;
        bool parent_marked = g_ppid[i] == self;
        for (int j = 0; j < n && !parent_marked; ++j) parent_marked = g_mark[j] && g_pid[j] == g_ppid[i];
        if (parent_marked) g_mark[i] = grew = true;
      }
    }
    // Kill the live ones; reap our own children among them, the exited ones too (the others are reaped by
    // their parents, or re-parented to us when those die and reaped by the next pass).
    int found = 0, reaped = 0;
    for (int i = 0; i < n; ++i) {
      if (!g_mark[i]) continue;
      if (!g_zombie[i]) {
        ::kill(g_pid[i], SIGKILL);
        ++found;
      }
      // Never a blocking wait: a child stuck in uninterruptible sleep (a wedged driver) must not hang a
      // signal handler; it is reaped by a later pass once the kill lands.
      if (g_ppid[i] == self) reaped += ::waitpid(g_pid[i], nullptr, WNOHANG) > 0;
    }
    killed += found;
    if (found == 0 && reaped == 0) break;
    sleep_ms(10);
  }
  g_busy.clear();
  return killed;
}

}  // namespace attncheck::detail
