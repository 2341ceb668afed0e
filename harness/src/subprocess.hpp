// An implementation served by a persistent child process over the exec: protocol (harness/PROTOCOL.md):
// exec:COMMAND, and plugin:PATH.so through the plug-in host.
#pragma once

#include <string>
#include <vector>

#include "attncheck/harness.hpp"

namespace attncheck::detail {

/// Starts `argv` and completes the handshake; returns it as an implementation named `name`. Throws SpecError
/// when it cannot be started, refuses, dies before the handshake or speaks another protocol version.
ImplementationPtr start_subprocess(std::string name, std::vector<std::string> argv, const HarnessOptions& opts);

}  // namespace attncheck::detail
