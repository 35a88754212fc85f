# Runs the header-only test_package program, then the one linked with
# qkgeom::compiled with the first's "ap_overall n_pairs gaussian_gap" as its
# arguments: it fails unless it computes the same head (cmake -P).
# Inputs (-D): HEADER_ONLY, COMPILED (the two programs).
cmake_minimum_required(VERSION 3.25)
execute_process(COMMAND "${HEADER_ONLY}" RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
if(NOT _rc STREQUAL "0")
  message(FATAL_ERROR "compare_modes: ${HEADER_ONLY} failed (${_rc})\n${_out}\n${_err}")
endif()
string(REGEX MATCH "([-+0-9.eE]+) ([0-9]+) ([-+0-9.eE]+)\n?$" _line "${_out}")
if(NOT _line)
  message(FATAL_ERROR "compare_modes: no 'ap_overall n_pairs gaussian_gap' line from ${HEADER_ONLY}:\n${_out}")
endif()
execute_process(COMMAND "${COMPILED}" "${CMAKE_MATCH_1}" "${CMAKE_MATCH_2}" "${CMAKE_MATCH_3}"
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _cout ERROR_VARIABLE _cerr)
if(NOT _rc STREQUAL "0")
  message(FATAL_ERROR "compare_modes: ${COMPILED} failed (${_rc})\nheader-only: ${_out}\ncompiled: ${_cout}\n${_cerr}")
endif()
message(STATUS "compare_modes: header-only ${_line}; compiled: ${_cout}")
