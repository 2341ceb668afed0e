// attncheck-plugin-host PATH.so | --exec COMMAND: the guard attncheck starts for plugin:PATH.so and
// exec:COMMAND. It runs no user code itself: it forks one worker (which loads the plug-in and serves it over
// the exec: protocol on stdin/stdout, or runs `/bin/sh -c COMMAND`), and ends the worker's whole tree of
// descendants, setsid() and double forks included, when the worker exits, when attncheck stops it (SIGTERM)
// and when attncheck dies (its parent-death signal). A plug-in that ignores SIGTERM, hangs or crashes
// cannot keep the guard from doing so, because none of its code runs here.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <csignal>
#include <cstring>
#include <iostream>
#include <string>

#include "../src/c_plugin.hpp"
#include "../src/descendants.hpp"
#include "attncheck/allocator.hpp"
#include "attncheck/harness.hpp"

namespace {

volatile std::sig_atomic_t g_stop = 0;

void reset_signals() {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (const int sig : {SIGTERM, SIGINT, SIGHUP, SIGPIPE}) ::sigaction(sig, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
}

// The worker: dies with the guard, whatever kills the guard; then serves the plug-in or runs the command.
[[noreturn]] void run_worker(pid_t guard, bool exec_mode, const char* target) {
  reset_signals();
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != guard) ::_exit(127);  // the guard died before prctl took effect
  if (exec_mode) {
    ::execl("/bin/sh", "sh", "-c", target, static_cast<char*>(nullptr));
    std::cerr << "attncheck-plugin-host: cannot run /bin/sh: " << std::strerror(errno) << "\n";
    ::_exit(127);
  }
  // The protocol keeps the original stdout; whatever the plug-in prints goes to stderr instead.
  const int protocol_out = ::dup(1);
  ::dup2(2, 1);
  const std::string path = target;
  ::_exit(attncheck::serve([&] { return attncheck::detail::load_c_plugin(path, "plugin:" + path); }, 0, protocol_out));
}

// Exits as the worker did, so attncheck's messages ("exited with status 3", "killed by signal 11") describe
// the plug-in or the command, not this guard.
[[noreturn]] void exit_like(int status) {
  if (WIFEXITED(status)) ::_exit(WEXITSTATUS(status));
  const int sig = WIFSIGNALED(status) ? WTERMSIG(status) : SIGKILL;
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(sig, &dfl, nullptr);
  ::prctl(PR_SET_DUMPABLE, 0);  // no core file of the guard for a signal the worker died of
  ::raise(sig);
  ::_exit(128 + sig);
}

}  // namespace

int main(int argc, char** argv) {
  attncheck::keep_freed_memory();  // the worker forked below keeps it, the plug-in's own allocations too
  const bool exec_mode = argc == 3 && std::string(argv[1]) == "--exec";
  if (argc != 2 && !exec_mode) {
    std::cerr << "usage: attncheck-plugin-host PATH.so | --exec COMMAND (started by attncheck for plugin:PATH.so "
                 "and exec:COMMAND; speaks the exec protocol on stdin/stdout)\n";
    return 2;
  }
  // Whatever the worker's descendants orphan comes to this process, so the tree stays whole.
  attncheck::detail::become_subreaper();
  // SIGTERM, SIGINT, SIGHUP: end the tree and exit; SIGCHLD: the worker ended. All four stay blocked except
  // inside sigsuspend below, so none can slip in between a check and the wait.
  sigset_t watched, during_wait;
  sigemptyset(&watched);
  for (const int sig : {SIGTERM, SIGINT, SIGHUP, SIGCHLD}) sigaddset(&watched, sig);
  ::sigprocmask(SIG_BLOCK, &watched, &during_wait);
  for (const int sig : {SIGTERM, SIGINT, SIGHUP, SIGCHLD}) sigdelset(&during_wait, sig);
  struct sigaction stop {};
  stop.sa_handler = [](int) { g_stop = 1; };
  for (const int sig : {SIGTERM, SIGINT, SIGHUP}) ::sigaction(sig, &stop, nullptr);
  struct sigaction child {};
  child.sa_handler = [](int) {};
  ::sigaction(SIGCHLD, &child, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  // attncheck names itself (the parent may already be gone, and then our parent is init or a subreaper,
  // whatever its pid: attncheck itself may be pid 1 in a container).
  pid_t parent = ::getppid();
  if (const char* named = std::getenv("ATTNCHECK_PARENT_PID"); named && *named) parent = static_cast<pid_t>(std::atol(named));
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  // The parent may have died before the line above: then no signal comes, and an orphan's parent changes.
  if (::getppid() != parent) return 128 + SIGTERM;

  const pid_t guard = ::getpid();
  const pid_t worker = ::fork();
  if (worker < 0) {
    std::cerr << "attncheck-plugin-host: fork failed: " << std::strerror(errno) << "\n";
    return 127;
  }
  if (worker == 0) run_worker(guard, exec_mode, argv[exec_mode ? 2 : 1]);
  // The protocol socket belongs to the worker alone: when it exits, attncheck must see the end of the
  // stream at once, not when this guard exits.
  const int null = ::open("/dev/null", O_RDWR);
  ::dup2(null, 0);
  ::dup2(null, 1);
  ::close(null);
  int status = 0;
  for (;;) {
    if (g_stop) {
      attncheck::detail::end_descendants();
      return 128 + SIGTERM;
    }
    const pid_t r = ::waitpid(worker, &status, WNOHANG);
    if (r == worker) break;
    if (r < 0 && errno != EINTR) {
      status = 127 << 8;
      break;
    }
    ::sigsuspend(&during_wait);  // returns after a handler ran: a stop signal, or a child's end
  }
  attncheck::detail::end_descendants();  // what the worker left behind: setsid() children, daemons
  exit_like(status);
}
