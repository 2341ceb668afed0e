// main() of every benchmark executable (attncheck_add_benchmark in cmake/attncheckTesting.cmake): Google
// Benchmark's BENCHMARK_MAIN(), with the allocator set first as attncheck's programs set it
// (attncheck/allocator.hpp), so a benchmark measures the memory behaviour a check has.
#include <benchmark/benchmark.h>

#include "attncheck/allocator.hpp"

int main(int argc, char** argv) {
  attncheck::keep_freed_memory();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
