// Ending a process's whole tree of descendants, double forks and setsid() included: the process becomes a
// subreaper (PR_SET_CHILD_SUBREAPER), so whatever its descendants orphan is re-parented to it, and the tree
// is read from /proc. Shared by attncheck (its own process) and the plug-in host's guard.
#pragma once

#include <sys/types.h>

namespace attncheck::detail {

/// Makes the calling process a subreaper (Linux PR_SET_CHILD_SUBREAPER). Returns false where the kernel refused.
bool become_subreaper();

/// True once become_subreaper() succeeded in this process.
bool is_subreaper();

/// SIGKILLs every descendant of this process except the subtrees of `spare` (count `n_spare`), reaps the
/// killed children, and repeats until none is left (a descendant may fork while it is being killed), for at
/// most about `max_ms` milliseconds. Async-signal-safe: raw system calls and static buffers only, so a signal
/// handler may call it. Returns how many processes it killed.
int end_descendants(const pid_t* spare = nullptr, int n_spare = 0, int max_ms = 2000);

}  // namespace attncheck::detail
