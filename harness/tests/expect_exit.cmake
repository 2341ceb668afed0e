# Runs a command and checks its exit code and output, for tests of whole programs:
#   cmake -DCOMMAND="prog|arg|arg" -DEXPECT_RC=1 -DEXPECT_OUTPUT=<regex> [-DEXPECT_OUTPUT2=<regex>] -P expect_exit.cmake
# ("|" separates the arguments). Prints the output, so a failure shows what the program said.
string(REPLACE "|" ";" command "${COMMAND}")
execute_process(COMMAND ${command} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT "${rc}" STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "exit code ${rc}, expected ${EXPECT_RC}")
endif()
foreach(var EXPECT_OUTPUT EXPECT_OUTPUT2)
  if(DEFINED ${var} AND NOT "${out}${err}" MATCHES "${${var}}")
    message(FATAL_ERROR "the output does not match ${${var}}")
  endif()
endforeach()
