// attncheck-plugin-host PATH.so: loads one C ABI plug-in and serves it over the exec: protocol on
// stdin/stdout, so a plug-in that crashes or hangs takes down this worker, never the harness.
// attncheck-plugin-host --exec COMMAND: runs an exec: client under /bin/sh and ends its whole process group
// when attncheck dies, so no client outlives the run.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>

#include "../src/c_plugin.hpp"
#include "attncheck/harness.hpp"

namespace {

// attncheck starts this program in a process group of its own with PR_SET_PDEATHSIG = SIGKILL, which would
// end this process alone. SIGTERM instead, handled by killing the whole group: what the plug-in or the
// command started ends with it.
void end_group_when_parent_dies() {
  if (::getpgrp() != ::getpid()) return;  // started by hand inside someone else's group: not ours to end
  struct sigaction sa {};
  sa.sa_handler = [](int) { ::kill(0, SIGKILL); };
  ::sigaction(SIGTERM, &sa, nullptr);
  const pid_t parent = ::getppid();
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  // The parent may have died before the line above: then no signal comes, and an orphan's parent changes.
  if (::getppid() != parent || parent == 1) ::kill(0, SIGKILL);
}

// Runs `/bin/sh -c command` in this process group and exits as it does, so attncheck's messages ("exited
// with status 3", "killed by signal 11") describe the command, not this guard.
int run_guarded(const char* command) {
  const pid_t child = ::fork();
  if (child < 0) {
    std::cerr << "attncheck-plugin-host: fork failed: " << std::strerror(errno) << "\n";
    return 127;
  }
  if (child == 0) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    ::sigaction(SIGTERM, &dfl, nullptr);
    // If the guard itself is killed outright, the shell goes too.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::execl("/bin/sh", "sh", "-c", command, static_cast<char*>(nullptr));
    std::cerr << "attncheck-plugin-host: cannot run /bin/sh: " << std::strerror(errno) << "\n";
    ::_exit(127);
  }
  // The protocol socket belongs to the command alone: when it exits, attncheck must see the end of the
  // stream at once, not when this guard exits.
  const int null = ::open("/dev/null", O_RDWR);
  ::dup2(null, 0);
  ::dup2(null, 1);
  ::close(null);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  const int sig = WTERMSIG(status);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(sig, &dfl, nullptr);
  ::raise(sig);
  return 128 + sig;
}

}  // namespace

int main(int argc, char** argv) {
  const bool exec_mode = argc == 3 && std::string(argv[1]) == "--exec";
  if (argc != 2 && !exec_mode) {
    std::cerr << "usage: attncheck-plugin-host PATH.so | --exec COMMAND (started by attncheck for plugin:PATH.so "
                 "and exec:COMMAND; speaks the exec protocol on stdin/stdout)\n";
    return 2;
  }
  end_group_when_parent_dies();
  if (exec_mode) return run_guarded(argv[2]);
  // The protocol keeps the original stdout; whatever the plug-in prints goes to stderr instead.
  const int protocol_out = ::dup(1);
  ::dup2(2, 1);
  const std::string path = argv[1];
  return attncheck::serve([&] { return attncheck::detail::load_c_plugin(path, "plugin:" + path); }, 0, protocol_out);
}
