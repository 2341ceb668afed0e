// The attncheck command as a library function, so tests run it in-process with their own laws, their own
// implementations and their own streams, exactly as main() runs it with the real ones.
#pragma once

#include <functional>
#include <iosfwd>
#include <stdexcept>
#include <string>
#include <vector>

#include "attncheck/law.hpp"

namespace attncheck::cli {

/// Exit codes, one meaning each.
enum ExitCode : int {
  kAllHeld = 0,     ///< every law held (or the replayed case holds now)
  kFalsified = 1,   ///< at least one law was falsified; reports were written
  kUsage = 2,       ///< bad flag, value, law, implementation or file; the message says what was expected
  kInternal = 3,    ///< a bug in attncheck itself
  /// Nothing was falsified, but an applicable law was not checked in full (a call budget ran out, a campaign
  /// cell or a shard is missing): a run never passes what it did not check. `--accept-incomplete` makes it 0.
  kIncomplete = 4,
  kInterrupted = 130,  ///< stopped by SIGINT or SIGTERM; the reports of the laws that finished were written
};

/// A bad command line or configuration (exit code 2); the message says what was expected and what came.
class UsageError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// How plugin: and exec: implementations are run.
struct LoadOptions {
  double call_timeout_s = 0;  ///< seconds a call may take (--timeout); 0: $ATTNCHECK_CALL_TIMEOUT, else 10
};

/// What the command can check: the laws, the built-in implementations, and the loader for plug-ins.
struct Registry {
  std::vector<Law> laws;                     ///< in the order `list` and `check` show them
  std::vector<ImplementationPtr> builtins;   ///< reference, mutant:NAME, control:NAME; found by name()
  /// Loads "plugin:PATH" and "exec:COMMAND" specs; throws UsageError for a bad one. Empty: not in this build.
  std::function<ImplementationPtr(const std::string& spec, const LoadOptions& opts)> load_external;
};

/// For main(): nothing a plug-in or exec: client starts outlives the program (attncheck::guard_process_tree,
/// when this build has the harness), and a first SIGINT or SIGTERM ends the run with the reports of what it
/// finished (exit kInterrupted).
void guard_processes();

/// This build's registry: laws(), the reference, the mutant zoo, and the plug-in harness.
Registry default_registry();

/// The one place `--impl SPEC` becomes an implementation: built-ins by name, plugin:/exec: through
/// registry.load_external. Throws UsageError naming what specs are accepted.
ImplementationPtr resolve_implementation(const std::string& spec, const Registry& registry,
                                         const LoadOptions& opts = {});

/// The laws table of docs/laws.md for `laws`, in Markdown (`attncheck list --markdown`): each law's number, name
/// (marked (bwd) for a gradient law), what must hold and its tolerance (Law::doc).
std::string laws_markdown_table(const std::vector<Law>& laws);

/// Runs `attncheck ARGS...`: results and tables to `out`, progress and errors to `err`. `err_is_terminal`
/// turns on the progress line (as --progress does). Returns an ExitCode.
int run(int argc, const char* const* argv, const Registry& registry, std::ostream& out, std::ostream& err,
        bool err_is_terminal);

}  // namespace attncheck::cli
