// Loads a C ABI plug-in (attncheck/plugin.h) into this process and calls it. The plug-in host runs this in
// a worker process; `HarnessOptions::isolate = false` runs it in the caller's.
#pragma once

#include <string>

#include "attncheck/implementation.hpp"

namespace attncheck::detail {

/// The plug-in at `path` as an implementation called `name`. Throws SpecError when the file is missing or
/// cannot be loaded, the entry point is missing, its ABI version is neither 1 nor 2, or its table is malformed
/// (flags its version cannot carry, a bad empty_rows).
ImplementationPtr load_c_plugin(const std::string& path, const std::string& name);

/// Throws std::logic_error (an internal error: a law's bug, not the implementation's) when `p` needs a
/// capability `caps` lacks: kv heads fewer than query heads, key lengths, a window, sinks, a softcap, ALiBi slopes,
/// causal = false, packed documents, chunks, a prefix, a right window, a block or dense mask, paged K and V or a page size or layout it
/// does not declare (or has sinks or slopes whose count is not H, or document bounds for another batch size). A C plug-in or exec client
/// that did not declare one cannot be sent it faithfully.
void check_within_capabilities(const Problem& p, const Capabilities& caps, const std::string& name);

/// Prefixes "./" to a path without a slash, so dlopen reads that file instead of searching the library path.
std::string as_file_path(const std::string& path);

}  // namespace attncheck::detail
