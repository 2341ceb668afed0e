// Loads a C ABI plug-in (attncheck/plugin.h) into this process and calls it. The plug-in host runs this in
// a worker process; `HarnessOptions::isolate = false` runs it in the caller's.
#pragma once

#include <string>

#include "attncheck/implementation.hpp"
#include "attncheck/plugin.h"

namespace attncheck::detail {

/// The plug-in at `path` as an implementation called `name`. Throws SpecError when the file is missing or
/// cannot be loaded, the entry point is missing, its ABI version is neither 1 nor 2, or its table is malformed
/// (flags its version cannot carry, a bad empty_rows).
ImplementationPtr load_c_plugin(const std::string& path, const std::string& name);

/// What a plug-in's table declares: `v2` is the table when its version is 2 or more (else null), `v3` from 3 on,
/// `v4` from 4 on. The table must have passed the loader's checks (load_c_plugin).
Capabilities declared_capabilities(const attncheck_plugin_v1* table, const attncheck_plugin_v2* v2,
                                   const attncheck_plugin_v3* v3, const attncheck_plugin_v4* v4 = nullptr);

/// Throws std::logic_error (an internal error: a law's bug, not the implementation's) when `p` needs what `caps`
/// does not declare (call_needs: a limit or a feature, but the LSE, which a call may ask of anyone), or when its
/// fields do not fit its shape (key lengths or document bounds for another batch size, sinks or slopes not one per
/// query head, masks of another shape, a paged call with an input layout). A C plug-in or exec client that did
/// not declare a feature cannot be sent it faithfully.
/// `backward_call`: `p` is sent as a backward call (with its dO); otherwise as a forward call (any dO unsent).
void check_within_capabilities(const Problem& p, const Capabilities& caps, const std::string& name,
                               bool backward_call);

/// Prefixes "./" to a path without a slash, so dlopen reads that file instead of searching the library path.
std::string as_file_path(const std::string& path);

}  // namespace attncheck::detail
