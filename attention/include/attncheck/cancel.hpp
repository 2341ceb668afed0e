// Cancellation of the core's long computations: a caller that must stop soon (an interrupted run) asks once,
// and every long loop of the core gives up within a block of rows instead of finishing a case that may take
// minutes. The core owns this flag so that it depends on nothing above it.
#pragma once

#include <stdexcept>

namespace attncheck {

/// Thrown by a long computation of the core that gave up because cancellation was requested: it computed
/// nothing usable, and the caller should report only what finished before.
class Cancelled : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Asks every long computation in this process to give up (they throw Cancelled); async-signal-safe, and
/// never undone: it is for a process that is stopping.
void request_cancellation() noexcept;
/// True once request_cancellation() was called: a relaxed atomic load, cheap enough for every block of rows.
bool cancellation_requested() noexcept;
/// Throws Cancelled naming `who` once request_cancellation() was called.
void throw_if_cancelled(const char* who);

}  // namespace attncheck
