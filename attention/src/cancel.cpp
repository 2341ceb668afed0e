// The core's cancellation flag (attncheck/cancel.hpp).
#include "attncheck/cancel.hpp"

#include <atomic>
#include <string>

namespace attncheck {
namespace {
std::atomic<bool> g_cancelled{false};
static_assert(std::atomic<bool>::is_always_lock_free, "request_cancellation must be async-signal-safe");
}  // namespace

void request_cancellation() noexcept { g_cancelled.store(true, std::memory_order_relaxed); }

bool cancellation_requested() noexcept { return g_cancelled.load(std::memory_order_relaxed); }

void throw_if_cancelled(const char* who) {
  if (cancellation_requested()) throw Cancelled(std::string(who) + ": cancelled (the run was asked to stop)");
}

}  // namespace attncheck
