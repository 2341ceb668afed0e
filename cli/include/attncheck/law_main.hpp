// The small law runner behind the installed `attncheck-law` command and behind attncheck_add_laws() in a
// consumer's ctest: runs named laws against one implementation and exits 0 (held), 1 (falsified) or 2 (bad
// usage or spec).
#pragma once

#include "attncheck/implementation.hpp"

namespace attncheck {

/// Runs `attncheck-law [--impl SPEC] [--law NAME]... [--dtype NAME]... [--cases N] [--seed S] ...` (see
/// --help). With `builtin`, --impl may be omitted and checks `builtin`: a C++ project's main() is one line.
/// It is that main(): it sets the process's allocator as attncheck's own programs do (attncheck/allocator.hpp).
int law_main(int argc, char** argv, ImplementationPtr builtin = nullptr);

}  // namespace attncheck
