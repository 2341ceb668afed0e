// How `--impl SPEC` becomes an implementation, and this build's registry of laws and implementations.
#include <algorithm>

#include "attncheck/cli.hpp"
#include "attncheck/mutants.hpp"
#ifdef ATTNCHECK_CLI_HAS_HARNESS
#include "attncheck/harness.hpp"
#endif

namespace attncheck::cli {
namespace {

constexpr const char* kAccepted =
    "reference, mutant:NAME or control:NAME (`attncheck list` shows them), plugin:PATH.so or exec:COMMAND";

// plugin: and exec: belong to the harness; this is the only place the command reaches it.
ImplementationPtr load_external(const std::string& spec, const LoadOptions& opts) {
#ifdef ATTNCHECK_CLI_HAS_HARNESS
  try {
    HarnessOptions h;
    if (opts.call_timeout_s > 0) h.call_timeout_s = h.startup_timeout_s = opts.call_timeout_s;
    return load_implementation(spec, h);
  } catch (const SpecError& e) {
    throw UsageError(std::string("--impl: ") + e.what());
  }
#else
  (void)opts;
  throw UsageError("--impl " + spec + ": plugin: and exec: implementations are not available in this build");
#endif
}

}  // namespace

ImplementationPtr resolve_implementation(const std::string& spec, const Registry& registry, const LoadOptions& opts) {
  if (spec.empty()) throw UsageError(std::string("--impl: expected ") + kAccepted + " but got an empty value");
  if (spec.starts_with("plugin:") || spec.starts_with("exec:")) {
    if (!registry.load_external)
      throw UsageError("--impl " + spec + ": plugin: and exec: implementations are not available in this build");
    return registry.load_external(spec, opts);
  }
  const auto it = std::find_if(registry.builtins.begin(), registry.builtins.end(),
                               [&](const ImplementationPtr& p) { return p->name() == spec; });
  if (it == registry.builtins.end())
    throw UsageError("--impl: unknown implementation \"" + spec + "\"; expected " + kAccepted);
  return *it;
}

void guard_processes() {
#ifdef ATTNCHECK_CLI_HAS_HARNESS
  guard_process_tree(/*interruptible=*/true);
#endif
}

Registry default_registry() {
  Registry r;
  r.laws = laws();
  r.builtins.push_back(reference_implementation());
  for (const Mutant& m : mutant_zoo()) r.builtins.push_back(m.impl);
  r.load_external = load_external;
  return r;
}

}  // namespace attncheck::cli
