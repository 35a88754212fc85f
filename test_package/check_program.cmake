# Runs the installed program once (cmake -P): `qkgeom demo --layers 1 -o OUT
# --no-pictures` must succeed and write OUT/summary.txt (the model table).
# Inputs (-D): QKGEOM (the program), OUT (a scratch directory).
cmake_minimum_required(VERSION 3.25)
foreach(_var QKGEOM OUT)
  if(NOT DEFINED ${_var} OR "${${_var}}" STREQUAL "")
    message(FATAL_ERROR "check_program.cmake: -D${_var}=... is required")
  endif()
endforeach()
file(REMOVE_RECURSE "${OUT}")
execute_process(COMMAND "${QKGEOM}" demo --layers 1 -o "${OUT}" --no-pictures
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _stdout ERROR_VARIABLE _stderr)
if(NOT _rc STREQUAL "0")
  message(FATAL_ERROR "check_program: '${QKGEOM} demo' failed (${_rc})\n--- stdout ---\n${_stdout}\n--- stderr ---\n${_stderr}")
endif()
if(NOT EXISTS "${OUT}/summary.txt")
  message(FATAL_ERROR "check_program: '${QKGEOM} demo' wrote no ${OUT}/summary.txt\n--- stdout ---\n${_stdout}")
endif()
file(SIZE "${OUT}/summary.txt" _size)
if(_size EQUAL 0)
  message(FATAL_ERROR "check_program: ${OUT}/summary.txt is empty")
endif()
message(STATUS "check_program: ${QKGEOM} demo wrote ${OUT}/summary.txt (${_size} bytes)")
