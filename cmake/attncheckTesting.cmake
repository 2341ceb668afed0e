# attncheck_add_test(NAME name SOURCES ... LIBS ... LABELS ...): one GoogleTest executable, registered with
# ctest test by test (gtest_discover_tests) so `ctest -L LABEL` selects it.
include(GoogleTest)

function(attncheck_add_test)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT ATTNCHECK_TEST)
    return()
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  # cmake/test_main.cpp, not gtest_main: it pins RapidCheck's seed unless RC_PARAMS sets one.
  add_executable(${ARG_NAME} ${ARG_SOURCES} ${PROJECT_SOURCE_DIR}/cmake/test_main.cpp)
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_LIBS} GTest::gtest attncheck_options)
  if(ATTNCHECK_SANITIZE)
    # Tests whose seed sweeps are cut under the sanitizers see this (mutants/tests/kill_test.cpp).
    target_compile_definitions(${ARG_NAME} PRIVATE ATTNCHECK_SANITIZED=1)
  endif()
  gtest_discover_tests(${ARG_NAME} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
                       DISCOVERY_TIMEOUT 60)
endfunction()

# attncheck_test_cases(<var> <n>): cases per law for this project's own attncheck_add_laws() tests: n, or 5
# under the sanitizers (the asan preset, CI's second pass over the whole suite, several times slower; every
# law still runs on every implementation there, and the default build runs the full count).
function(attncheck_test_cases var n)
  if(ATTNCHECK_SANITIZE)
    set(n 5)
  endif()
  set(${var} ${n} PARENT_SCOPE)
endfunction()
