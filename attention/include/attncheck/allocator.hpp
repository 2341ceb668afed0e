// How a process that runs attncheck's laws asks the C library's allocator to keep what it frees: every call of a
// law allocates tensors of a few hundred kilobytes to tens of megabytes and frees them before the next call.
#pragma once

namespace attncheck {

/// Called first in every attncheck program's main() (attncheck, attncheck-law, the plug-in host, the tests, the
/// benchmarks): memory freed by one case is kept for the next instead of being given back to the kernel and
/// faulted in again, zero-filled, a page at a time. Only process-wide settings of glibc's malloc change
/// (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD), never a result; a no-op with another C library or a sanitizer's
/// allocator. A library must not call it: the process belongs to whoever wrote main().
void keep_freed_memory() noexcept;

/// The same two settings as GLIBC_TUNABLES entries ("glibc.malloc.mmap_threshold=N", then the trim threshold),
/// for the programs attncheck starts but did not write (an exec: client: numpy and torch allocate per call too).
/// attncheck adds each to a child's GLIBC_TUNABLES unless the user's environment already sets that tunable.
const char* const* freed_memory_tunables() noexcept;

}  // namespace attncheck
