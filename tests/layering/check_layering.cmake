# lint.layering: every header under include/qkgeom/ includes only headers of
# its own folder and of the folders below it (docs/architecture.md, "Header
# layout"). A CMake script (no Python needed):
#
#   cmake [-DQKGEOM_INCLUDE_ROOT=<dir>] [-DQKGEOM_LAYERS=<file>] -P check_layering.cmake
#
#   QKGEOM_INCLUDE_ROOT  the qkgeom folder to scan (default: this repository's include/qkgeom)
#   QKGEOM_LAYERS        the allowed-dependency table (default: layers.txt next to this script)
#
# Rules:
#   * the table (folder: folders directly below) must name known folders only
#     and be acyclic; a folder may include itself and the transitive closure
#     of its entries;
#   * every header in a subfolder is checked, except forwarding headers (a
#     deprecated path: a header whose first lines say "forwarding header");
#     top-level headers (the umbrella plasticity.hpp and forwarders) are not
#     checked as sources;
#   * no checked header may include a top-level header, a forwarding header or
#     a header that does not exist, and every #include <qkgeom/F/...> must
#     name a folder F that the including folder may include.
# Every violation is printed on one line, "file: includes <qkgeom/X> (folder A
# may include only ...)", and the script ends with FATAL_ERROR.
cmake_minimum_required(VERSION 3.20)

if(NOT DEFINED QKGEOM_INCLUDE_ROOT)
  get_filename_component(QKGEOM_INCLUDE_ROOT "${CMAKE_CURRENT_LIST_DIR}/../../include/qkgeom" ABSOLUTE)
endif()
if(NOT DEFINED QKGEOM_LAYERS)
  set(QKGEOM_LAYERS "${CMAKE_CURRENT_LIST_DIR}/layers.txt")
endif()
if(NOT IS_DIRECTORY "${QKGEOM_INCLUDE_ROOT}")
  message(FATAL_ERROR "lint.layering: no include root ${QKGEOM_INCLUDE_ROOT}")
endif()
if(NOT EXISTS "${QKGEOM_LAYERS}")
  message(FATAL_ERROR "lint.layering: no layer table ${QKGEOM_LAYERS}")
endif()

# --- the table --------------------------------------------------------------
set(_layers "")
file(STRINGS "${QKGEOM_LAYERS}" _table_lines)
foreach(_line IN LISTS _table_lines)
  string(STRIP "${_line}" _line)
  if(_line STREQUAL "" OR _line MATCHES "^#")
    continue()
  endif()
  if(NOT _line MATCHES "^([A-Za-z0-9_]+)[ \t]*:(.*)$")
    message(FATAL_ERROR "lint.layering: ${QKGEOM_LAYERS}: not \"folder: folders below\": ${_line}")
  endif()
  set(_f "${CMAKE_MATCH_1}")
  string(STRIP "${CMAKE_MATCH_2}" _deps)
  string(REGEX REPLACE "[ \t,]+" ";" _deps "${_deps}")
  if(_f IN_LIST _layers)
    message(FATAL_ERROR "lint.layering: ${QKGEOM_LAYERS}: folder ${_f} listed twice")
  endif()
  list(APPEND _layers "${_f}")
  set(_direct_${_f} "${_deps}")
endforeach()

set(_table_errors "")
foreach(_f IN LISTS _layers)
  foreach(_d IN LISTS _direct_${_f})
    if(NOT _d IN_LIST _layers)
      list(APPEND _table_errors "${_f}: ${_d} is not a folder of the table")
    endif()
  endforeach()
endforeach()
if(_table_errors)
  list(JOIN _table_errors "\n  " _msg)
  message(FATAL_ERROR "lint.layering: ${QKGEOM_LAYERS}:\n  ${_msg}")
endif()

# Acyclic: peel off folders whose entries are all peeled (Kahn); whatever is
# left lies on or above a cycle.
set(_left "${_layers}")
set(_done "")
while(_left)
  set(_peeled "")
  foreach(_f IN LISTS _left)
    set(_ready TRUE)
    foreach(_d IN LISTS _direct_${_f})
      if(NOT _d IN_LIST _done)
        set(_ready FALSE)
      endif()
    endforeach()
    if(_ready)
      list(APPEND _peeled "${_f}")
    endif()
  endforeach()
  if(NOT _peeled)
    list(JOIN _left ", " _cyc)
    message(FATAL_ERROR "lint.layering: ${QKGEOM_LAYERS}: the table has a cycle through (or above one) ${_cyc}")
  endif()
  list(APPEND _done ${_peeled})
  list(REMOVE_ITEM _left ${_peeled})
endwhile()

# The allowed set of every folder: itself and the transitive closure, listed
# from the top of the table down.
foreach(_f IN LISTS _layers)
  set(_reach "${_f}")
  set(_todo ${_direct_${_f}})
  while(_todo)
    list(POP_FRONT _todo _d)
    if(NOT _d IN_LIST _reach)
      list(APPEND _reach "${_d}")
      list(APPEND _todo ${_direct_${_d}})
    endif()
  endwhile()
  set(_allowed_${_f} "")
  foreach(_g IN LISTS _layers)
    if(_g IN_LIST _reach)
      list(APPEND _allowed_${_f} "${_g}")
    endif()
  endforeach()
endforeach()

# --- the headers ------------------------------------------------------------
function(_qkgeom_is_forwarder path out)
  file(READ "${path}" _head LIMIT 400)
  string(FIND "${_head}" "forwarding header" _at)
  if(_at GREATER -1)
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

file(GLOB_RECURSE _headers RELATIVE "${QKGEOM_INCLUDE_ROOT}" "${QKGEOM_INCLUDE_ROOT}/*.hpp")
list(SORT _headers)
set(_errors "")
set(_checked 0)
set(_forwarders 0)
foreach(_h IN LISTS _headers)
  if(NOT _h MATCHES "/")
    continue()  # top level: the umbrella and forwarders
  endif()
  _qkgeom_is_forwarder("${QKGEOM_INCLUDE_ROOT}/${_h}" _fwd)
  if(_fwd)
    math(EXPR _forwarders "${_forwarders} + 1")
    continue()
  endif()
  math(EXPR _checked "${_checked} + 1")
  string(REGEX MATCH "^[^/]+" _folder "${_h}")
  if(NOT _folder IN_LIST _layers)
    list(APPEND _errors "qkgeom/${_h}: folder ${_folder} is not in the layer table ${QKGEOM_LAYERS}")
    continue()
  endif()
  list(JOIN _allowed_${_folder} ", " _allowed_text)
  file(STRINGS "${QKGEOM_INCLUDE_ROOT}/${_h}" _incs REGEX "^[ \t]*#[ \t]*include[ \t]*<qkgeom/")
  foreach(_inc IN LISTS _incs)
    if(NOT _inc MATCHES "<qkgeom/([^>]+)>")
      continue()
    endif()
    set(_target "${CMAKE_MATCH_1}")
    set(_where "qkgeom/${_h}: includes <qkgeom/${_target}>")
    if(NOT EXISTS "${QKGEOM_INCLUDE_ROOT}/${_target}")
      list(APPEND _errors "${_where} (no such header)")
      continue()
    endif()
    if(NOT _target MATCHES "/")
      list(APPEND _errors "${_where} (a top-level header: the umbrella or a forwarding header; include the header it names)")
      continue()
    endif()
    _qkgeom_is_forwarder("${QKGEOM_INCLUDE_ROOT}/${_target}" _tfwd)
    if(_tfwd)
      list(APPEND _errors "${_where} (a forwarding header; include the header it names)")
      continue()
    endif()
    string(REGEX MATCH "^[^/]+" _tfolder "${_target}")
    if(NOT _tfolder IN_LIST _allowed_${_folder})
      list(APPEND _errors "${_where} (folder ${_folder} may include only ${_allowed_text})")
    endif()
  endforeach()
endforeach()

if(_errors)
  list(LENGTH _errors _n)
  foreach(_e IN LISTS _errors)
    message("${_e}")
  endforeach()
  message(FATAL_ERROR "lint.layering: ${_n} wrong-way include(s) under ${QKGEOM_INCLUDE_ROOT}, listed above "
                      "(the table: ${QKGEOM_LAYERS})")
endif()
list(LENGTH _layers _nl)
message(STATUS "lint.layering: ${_checked} headers in ${_nl} layers follow ${QKGEOM_LAYERS} "
               "(${_forwarders} forwarding headers in subfolders skipped)")
