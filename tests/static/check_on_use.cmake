# CTest compiled.instantiated_on_use: the rule the compile model rests on
# (docs/building.md, "Compile model"), checked on the symbols of two objects.
#
#   1. Including is free: a translation unit that includes every public header
#      of the core pipeline and uses nothing defines no symbol of qkgeom. A
#      non-inline function, a non-template variable with external linkage or a
#      `template <class = void>` that is instantiated eagerly shows up here (and
#      would be a duplicate definition, or dead code, in every program).
#   2. The compiled part is used, not rebuilt: with QKGEOM_COMPILED, a call of
#      analyze_head on a head_capture of row-major doubles (one of the types
#      src/qkgeom_compiled.cpp instantiates) leaves analyze_head and the
#      plasticity engine undefined in the caller's object.
#
# Inputs (-D): CXX, NM, INCLUDE_ROOT (include/), EIGEN_INCLUDE, WORK_DIR,
# HEADERS (;-list of qkgeom/... paths for step 1). The controls, which must
# fail: PLANT=1 puts a non-inline function in step 1's translation unit;
# PLANT=2 skips step 1 and adds to step 2 an explicit instantiation of
# detail::closed_forms<void> (part of the engine the compiled part owns, and
# cheaper to compile than the plasticity engine).
cmake_minimum_required(VERSION 3.25)
foreach(_v CXX NM INCLUDE_ROOT EIGEN_INCLUDE WORK_DIR HEADERS)
  if(NOT DEFINED ${_v} OR "${${_v}}" STREQUAL "")
    message(FATAL_ERROR "check_on_use.cmake: -D${_v}=... is required")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

# defined_qkgeom_symbols(<object> <out>): demangled names of the symbols the
# object defines (text, data, weak, read-only, bss) that belong to qkgeom.
function(defined_qkgeom_symbols object out)
  execute_process(COMMAND "${NM}" -C --defined-only "${object}"
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _nm ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "check_on_use: ${NM} failed on ${object}: ${_err}")
  endif()
  string(REPLACE ";" "\\;" _nm "${_nm}")
  string(REPLACE "\n" ";" _lines "${_nm}")
  set(_found "")
  foreach(_l IN LISTS _lines)
    if(_l MATCHES "^[0-9a-f]+ [TtWwVvDdBbRruU] (.*qkgeom::.*)$")
      list(APPEND _found "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  set(${out} "${_found}" PARENT_SCOPE)
endfunction()

function(compile src object)
  execute_process(COMMAND "${CXX}" -std=c++20 -O0 -c -I "${INCLUDE_ROOT}" -isystem "${EIGEN_INCLUDE}" ${ARGN}
                          "${src}" -o "${object}"
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "check_on_use: compiling ${src} failed:\n${_out}${_err}")
  endif()
endfunction()

# --- 1. every header, nothing used --------------------------------------------
if(NOT PLANT EQUAL 2)
set(_tu "")
foreach(_h IN LISTS HEADERS)
  string(APPEND _tu "#include <${_h}>\n")
endforeach()
if(PLANT)
  string(APPEND _tu "namespace qkgeom { int planted_non_inline(int x) { return x + 1; } }\n")
endif()
file(WRITE "${WORK_DIR}/include_only.cpp" "${_tu}")
compile("${WORK_DIR}/include_only.cpp" "${WORK_DIR}/include_only.o")
defined_qkgeom_symbols("${WORK_DIR}/include_only.o" _syms)
list(LENGTH HEADERS _nh)
if(_syms)
  list(JOIN _syms "\n  " _shown)
  message(FATAL_ERROR "check_on_use: including ${_nh} headers and using nothing defines qkgeom symbols "
                      "(each would be compiled into, or duplicated in, every program):\n  ${_shown}")
endif()
message(STATUS "check_on_use: ${_nh} headers included, nothing used: no qkgeom symbol defined")
endif()

# --- 2. compiled mode: analyze_head comes from the compiled part ---------------
file(WRITE "${WORK_DIR}/compiled_call.cpp" [=[
#include <qkgeom/plasticity.hpp>
using rows = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
qkgeom::head_analysis call(qkgeom::head_capture<rows> const& head) { return qkgeom::analyze_head(head, {}); }
]=])
if(PLANT EQUAL 2)
  file(APPEND "${WORK_DIR}/compiled_call.cpp" [=[
template qkgeom::head_analysis qkgeom::detail::closed_forms<void>(qkgeom::head_moments const&,
                                                                  qkgeom::analysis_options const&);
]=])
endif()
compile("${WORK_DIR}/compiled_call.cpp" "${WORK_DIR}/compiled_call.o" -DQKGEOM_COMPILED=1)
defined_qkgeom_symbols("${WORK_DIR}/compiled_call.o" _syms)
set(_engine "")
foreach(_s IN LISTS _syms)
  if(_s MATCHES "analyze_head|evaluate_plasticity|closed_forms")
    list(APPEND _engine "${_s}")
  endif()
endforeach()
if(_engine)
  list(JOIN _engine "\n  " _shown)
  message(FATAL_ERROR "check_on_use: with QKGEOM_COMPILED, a call of analyze_head on row-major doubles "
                      "compiles the engine again instead of using the compiled part:\n  ${_shown}")
endif()
message(STATUS "check_on_use: with QKGEOM_COMPILED, analyze_head(head_capture<row-major double>) is the compiled part's")
