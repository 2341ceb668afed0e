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
  gtest_discover_tests(${ARG_NAME} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
                       DISCOVERY_TIMEOUT 60)
endfunction()
