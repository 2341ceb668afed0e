# attncheck_add_test(NAME name SOURCES ... LIBS ... LABELS ... [TIMEOUT s] [COST c]): one GoogleTest executable,
# registered with ctest test by test (gtest_discover_tests) so `ctest -L LABEL` selects it (and labelled asan-ci
# when its name is in ATTNCHECK_ASAN_CI_TESTS, CMakeLists.txt). COST (ctest's test
# property) starts its tests before those of lower cost where ctest has no timings of an earlier run (a clean
# clone, as in CI), so the longest tests do not start last on a 2-core machine.
include(GoogleTest)

# The standard headers nearly every source includes: with Eigen, RapidCheck or GoogleTest, the precompiled
# headers of the libraries with many small sources (attncheck_precompile) and of the test executables. Each
# saves about a second of parsing per source and costs about three to make (GCC 12, measured).
set(ATTNCHECK_PCH_STD <algorithm> <cmath> <functional> <limits> <map> <memory> <optional> <string> <vector>)

# attncheck_precompile(<target> <header>...): the target's sources compile against one precompiled header of
# these and the standard ones above (each source still includes what it uses). Configure with
# -DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON to compile without them.
function(attncheck_precompile target)
  target_precompile_headers(${target} PRIVATE ${ARGN} ${ATTNCHECK_PCH_STD})
endfunction()

function(attncheck_add_test)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT;COST" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT ATTNCHECK_TEST)
    return()
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  if(NOT ARG_COST)
    set(ARG_COST 0)
  endif()
  # cmake/test_main.cpp, not gtest_main: it pins RapidCheck's seed unless RC_PARAMS sets one. Compiled once,
  # for every test executable, with the precompiled header (GoogleTest, RapidCheck, Eigen, the standard
  # headers) the executables then reuse: made once, not once per executable.
  if(NOT TARGET attncheck_test_main)
    add_library(attncheck_test_main OBJECT ${PROJECT_SOURCE_DIR}/cmake/test_main.cpp)
    target_link_libraries(attncheck_test_main PRIVATE GTest::gtest rapidcheck Eigen3::Eigen attncheck::attention attncheck_options)
    if(ATTNCHECK_SANITIZE)
      target_compile_definitions(attncheck_test_main PRIVATE ATTNCHECK_SANITIZED=1)  # as the executables
    endif()
    target_precompile_headers(attncheck_test_main PRIVATE <gtest/gtest.h> <rapidcheck.h> <Eigen/Core>
                                                          ${ATTNCHECK_PCH_STD})
  endif()
  add_executable(${ARG_NAME} ${ARG_SOURCES} $<TARGET_OBJECTS:attncheck_test_main>)
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_LIBS} GTest::gtest attncheck::attention attncheck_options)  # main() needs the core
  if(NOT ARG_LIBS STREQUAL "attncheck::plugin_api")  # that one sees the C header only
    target_precompile_headers(${ARG_NAME} REUSE_FROM attncheck_test_main)
  endif()
  if(ATTNCHECK_SANITIZE)
    # Tests whose seed sweeps are cut under the sanitizers see this (mutants/tests/kill_test.cpp).
    target_compile_definitions(${ARG_NAME} PRIVATE ATTNCHECK_SANITIZED=1)
  endif()
  if(ARG_NAME IN_LIST ATTNCHECK_ASAN_CI_TESTS)
    list(APPEND ARG_LABELS asan-ci)
    if(TARGET asan-ci)
      add_dependencies(asan-ci ${ARG_NAME})
    endif()
  endif()
  # One LABELS pair per label: gtest_discover_tests flattens a list value (CMake 3.25), so a second label spilled
  # into the property names (LABELS unit, then a property "plugin" set to "TIMEOUT", and neither TIMEOUT nor COST
  # set), and ctest adds each LABELS to the ones before.
  set(label_properties "")
  foreach(label IN LISTS ARG_LABELS)
    list(APPEND label_properties LABELS ${label})
  endforeach()
  gtest_discover_tests(${ARG_NAME} PROPERTIES ${label_properties} TIMEOUT ${ARG_TIMEOUT} COST ${ARG_COST}
                       DISCOVERY_TIMEOUT 60)
endfunction()

# attncheck_test_cases(<var> <n>): cases per law for this project's own attncheck_add_laws() tests: n, or 5
# under the sanitizers (the asan preset's whole suite, scripts/test.sh --all-sanitized, several times slower;
# every law still runs on every implementation there, and the default build runs the full count).
function(attncheck_test_cases var n)
  if(ATTNCHECK_SANITIZE)
    set(n 5)
  endif()
  set(${var} ${n} PARENT_SCOPE)
endfunction()

# attncheck_add_benchmark(NAME name SOURCES ... LIBS ...): one Google Benchmark executable, whose main() is
# cmake/bench_main.cpp (BENCHMARK_MAIN() with attncheck's allocator settings), compiled once for all of them.
function(attncheck_add_benchmark)
  cmake_parse_arguments(ARG "" "NAME" "SOURCES;LIBS" ${ARGN})
  if(NOT TARGET attncheck_bench_main)
    add_library(attncheck_bench_main OBJECT ${PROJECT_SOURCE_DIR}/cmake/bench_main.cpp)
    target_link_libraries(attncheck_bench_main PRIVATE benchmark::benchmark attncheck::attention attncheck_options)
  endif()
  add_executable(${ARG_NAME} ${ARG_SOURCES} $<TARGET_OBJECTS:attncheck_bench_main>)
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_LIBS} benchmark::benchmark attncheck::attention attncheck_options)
endfunction()
