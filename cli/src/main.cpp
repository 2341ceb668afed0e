// attncheck: property-based verification of scaled causal attention. The command itself lives in the
// attncheck::cli library (app.cpp), so tests run it in-process.
#include <unistd.h>

#include <iostream>

#include "attncheck/allocator.hpp"
#include "attncheck/cli.hpp"

int main(int argc, char** argv) {
  attncheck::keep_freed_memory();
  attncheck::cli::guard_processes();
  try {
    return attncheck::cli::run(argc, argv, attncheck::cli::default_registry(), std::cout, std::cerr,
                               ::isatty(STDERR_FILENO) != 0);
  } catch (const std::exception& e) {
    std::cerr << "attncheck: internal error: " << e.what() << "\n";
    return attncheck::cli::kInternal;
  }
}
