// Which instruction set the core's hot loops run on. The default build compiles them (the streamed forward and
// the float64 oracle's rows) once per instruction set and chooses, the first time they run, the best this CPU
// supports: one portable binary that runs AVX-512 code where the CPU has it (cmake/attncheckIsa.cmake).
//
// The environment variable ATTNCHECK_ISA names another (one of compiled_isas()), to check or time a path the CPU
// would not choose; an unknown name, or one this CPU cannot run, is an error at the first call of the core.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace attncheck {

/// The instruction sets this build compiled the hot loops for, portable first: "generic" always, then
/// "x86-64-v3" (AVX2, FMA, F16C) and "x86-64-v4" (AVX-512) where the compiler targets x86-64.
std::vector<std::string> compiled_isas();

/// Whether this CPU (and its operating system) can run `name`'s code.
bool isa_supported(std::string_view name);

/// The instruction set the core runs: ATTNCHECK_ISA's, else the last of compiled_isas() this CPU supports.
/// Throws ValueError naming the choices when ATTNCHECK_ISA names one it cannot run.
std::string active_isa();

/// Runs the core on `name` from now on (tests and benchmarks; not thread-safe against running calls). Throws
/// ValueError, naming what this build and CPU offer, if `name` is not compiled or not supported here.
void select_isa(std::string_view name);

/// One line for --version: "x86-64-v4 (of generic, x86-64-v3, x86-64-v4)".
std::string isa_summary();

}  // namespace attncheck
