// The plug-in harness: turns "plugin:PATH.so" (a C ABI shared library, run in a worker process by default)
// and "exec:COMMAND" (a persistent child speaking harness/PROTOCOL.md) into an attncheck::Implementation.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

#include "attncheck/implementation.hpp"
#include "attncheck/spec_error.hpp"

namespace attncheck {

/// The default per-call timeout: $ATTNCHECK_CALL_TIMEOUT (seconds) when set to a positive number, else 10.
double default_call_timeout();
/// Seconds a process may take to start (its handshake): $ATTNCHECK_CALL_TIMEOUT when set, as for any call;
/// else 60, since importing a framework such as torch takes seconds, more than the default call timeout.
double default_startup_timeout();

/// How plug-ins are run.
struct HarnessOptions {
  double call_timeout_s = default_call_timeout();  ///< per call; a hang becomes ImplementationError(timeout)
  /// How long a (re)started process may take to finish its handshake: default_startup_timeout(), or the
  /// call timeout when one is given (--timeout): start-up is a call like any other.
  double startup_timeout_s = default_startup_timeout();
  bool isolate = true;                             ///< run shared-library plug-ins in a separate process (default)
  bool probe_weights = true;  ///< recover the weights of a plug-in that returns none by one-hot probing
};

/// For a program that starts plug-ins (attncheck, attncheck-law, a runner of attncheck_add_laws): makes the
/// process a subreaper, so that whatever a plug-in's processes orphan (setsid() or not) is re-parented to it,
/// and ends every descendant when the process exits or is stopped by SIGINT, SIGTERM or SIGHUP (then dies of
/// that signal as it would have). Call once, first thing in main. A SIGKILL cannot be caught: then each plug-in
/// host ends its own tree on its parent-death signal.
/// With `interruptible` (the attncheck command), the first SIGINT or SIGTERM instead asks the run to stop
/// (request_stop()) and ends the implementations' processes, so a call in flight returns at once; the run then
/// writes the reports of what it finished. A second one ends the program as above.
void guard_process_tree(bool interruptible = false);

/// Resolves "plugin:PATH.so" or "exec:COMMAND" to an Implementation. Throws SpecError.
ImplementationPtr load_implementation(const std::string& spec, const HarnessOptions& opts = {});

/// Wraps a plug-in's raw implementation with the checks every plug-in call gets: outcome shapes, and no NaN
/// or Inf where none may be (finite inputs whose scores cannot overflow). Both throw ImplementationError.
ImplementationPtr checked_implementation(ImplementationPtr impl);

/// Throws ImplementationError(nonfinite) when `o` holds a NaN or Inf although every input of `p` is finite
/// and no score can overflow the accumulation type (then every output is a convex combination of V).
void check_finite_outcome(const Problem& p, const Outcome& o, const std::string& impl_name);

/// Serves an implementation over the exec: protocol (harness/PROTOCOL.md) on in_fd/out_fd until bye or EOF,
/// so C++ code can be checked in a separate process too: forward calls, and from protocol version 2 its
/// capabilities (GQA, key padding, window, empty rows) and backward calls (Implementation::backward). It
/// answers in the lower of attncheck's newest version and its own. `make` runs after the hello; a SpecError
/// it throws is sent as a refusal. Returns 0 after bye or EOF, 2 after a refusal or a protocol error.
int serve(const std::function<ImplementationPtr()>& make, int in_fd = 0, int out_fd = 1);

/// The path of the attncheck-plugin-host executable: $ATTNCHECK_PLUGIN_HOST, else beside the running
/// program, else the build tree's, else the installed one. Throws SpecError when none exists.
std::string plugin_host_path();

/// The folder holding attncheck's Python client (attncheck_plugin.py): the installed one beside this program,
/// else the build tree's, else the configured install location; empty when none exists. Children started
/// for exec: find it on their PYTHONPATH.
std::string python_client_dir();

}  // namespace attncheck
