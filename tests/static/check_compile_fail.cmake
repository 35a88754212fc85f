# CTest compile_fail.<case>: the case's file must fail to compile, and the
# compiler's diagnostic must match REGEX (the concept's name and the rejected
# type; tests/CMakeLists.txt). One compile checks both. Its control, the same
# file with -DQKGEOM_CF_CONTROL, is a separate test that must compile.
#
# Inputs (-D): SRC (the case's file), REGEX; the compile command (without the
# file) follows `--` after the script: cmake -DSRC=.. -DREGEX=.. -P this -- c++ ...
cmake_minimum_required(VERSION 3.25)
set(COMMAND "")
set(_after FALSE)
math(EXPR _last "${CMAKE_ARGC} - 1")
foreach(_i RANGE 0 ${_last})
  if(_after)
    list(APPEND COMMAND "${CMAKE_ARGV${_i}}")
  elseif("${CMAKE_ARGV${_i}}" STREQUAL "--")
    set(_after TRUE)
  endif()
endforeach()
foreach(_v SRC REGEX COMMAND)
  if(NOT DEFINED ${_v} OR "${${_v}}" STREQUAL "")
    message(FATAL_ERROR "check_compile_fail.cmake: -D${_v}=... is required")
  endif()
endforeach()
execute_process(COMMAND ${COMMAND} "${SRC}" RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
if(_rc EQUAL 0)
  message(FATAL_ERROR "compile_fail: ${SRC} compiled; it must be rejected")
endif()
if(NOT "${_out}${_err}" MATCHES "${REGEX}")
  message(FATAL_ERROR "compile_fail: ${SRC} was rejected, but no diagnostic matches '${REGEX}':\n${_out}${_err}")
endif()
message(STATUS "compile_fail: ${SRC} rejected with the expected diagnostic")
