# Every citation of the method document resolves to one of its headings.
#
#   cmake -DSOURCE_DIR=<repository root> -P tests/docs/check_citations.cmake
#
# Scans the *.hpp, *.cpp, *.md, *.py, *.cmake and CMakeLists.txt files under
# include/, app/, adapters/, examples/, tests/, benchmarks/, scripts/, docs/
# and fuzz/, and README.md, for citations of the form "method" + section sign
# + number, e.g. section 5, 0.1 or 9.14, including ranges (5 to 6 written with
# an en dash, an open range "1" + dash) and lists that continue the citation
# (", 9.13", " and 9.3", "/9.14", each with its section sign). Every number
# named, range endpoints included, must be the number of a heading of
# docs/method.md ("## <section sign>5 ...", "### <section sign>9.14 ...");
# a trailing full stop is punctuation (9.1. means 9.1). The script also fails
# when a file still cites the old external contract ("SPEC" + section sign).
# Offenders are printed as path:line.
#
# The section sign and the en dash are kept in variables so that this file
# itself contains no citation.

cmake_minimum_required(VERSION 3.16)

if(NOT DEFINED SOURCE_DIR)
  message(FATAL_ERROR "check_citations.cmake: pass -DSOURCE_DIR=<repository root>")
endif()
get_filename_component(SOURCE_DIR "${SOURCE_DIR}" ABSOLUTE)

set(S "§")   # section sign, U+00A7 (two bytes in UTF-8)
set(D "–")   # en dash, U+2013 (three bytes in UTF-8)
# CMake's regex quantifiers bind to the last byte of a multi-byte literal and
# a regex has at most 9 groups, so a number is "[0-9][0-9.]*" (trailing full
# stops are stripped afterwards) and the range forms are spelled out.
set(_num "[0-9][0-9.]*")
set(_one "${S}${_num}((${D}${S}|${D}|-${S}|-)[0-9.]*)?")
set(_sep "(, and |, | and |/)")
set(_cite "method ${_one}(${_sep}${_one})*")
set(_old "SPEC ?(${S})")

# --- heading numbers of docs/method.md ----------------------------------------
set(_method "${SOURCE_DIR}/docs/method.md")
if(NOT EXISTS "${_method}")
  message(FATAL_ERROR "check_citations.cmake: ${_method} does not exist")
endif()
file(READ "${_method}" _text)
string(REGEX MATCHALL "\n#+ (${S})${_num}" _heads "\n${_text}")
set(_sections "")
foreach(_h IN LISTS _heads)
  string(REGEX MATCH "${_num}$" _n "${_h}")
  string(REGEX REPLACE "\\.+$" "" _n "${_n}")
  list(APPEND _sections "${_n}")
endforeach()
list(LENGTH _sections _n_sections)
if(_n_sections EQUAL 0)
  message(FATAL_ERROR "check_citations.cmake: no numbered headings in ${_method}")
endif()

# --- files to scan ------------------------------------------------------------
set(_globs "")
foreach(_dir include app adapters examples tests benchmarks scripts docs fuzz)
  foreach(_pat *.hpp *.cpp *.md *.py *.cmake CMakeLists.txt)
    list(APPEND _globs "${SOURCE_DIR}/${_dir}/${_pat}")
  endforeach()
endforeach()
file(GLOB_RECURSE _files LIST_DIRECTORIES false ${_globs})
if(EXISTS "${SOURCE_DIR}/README.md")
  list(APPEND _files "${SOURCE_DIR}/README.md")
endif()
list(REMOVE_DUPLICATES _files)
list(SORT _files)

set(_bad 0)
set(_n_citations 0)
set(_n_scanned 0)
foreach(_f IN LISTS _files)
  math(EXPR _n_scanned "${_n_scanned} + 1")
  file(READ "${_f}" _text)
  if(NOT _text MATCHES "method ${S}|${_old}")
    continue()
  endif()
  file(RELATIVE_PATH _rel "${SOURCE_DIR}" "${_f}")
  # One list element per line. Characters that CMake's list splitting treats
  # specially are replaced first; every element starts with "x" so that empty
  # lines stay elements and the line numbers stay right.
  string(REPLACE ";" "<semicolon>" _text "${_text}")
  string(REPLACE "[" "<lbracket>" _text "${_text}")
  string(REPLACE "]" "<rbracket>" _text "${_text}")
  string(REPLACE "\\" "<backslash>" _text "${_text}")
  string(REPLACE "\n" ";x" _lines "x${_text}")
  set(_ln 0)
  foreach(_line IN LISTS _lines)
    math(EXPR _ln "${_ln} + 1")
    if(_line MATCHES "${_old}")
      message("${_rel}:${_ln}: cites the removed SPEC; cite the method document (docs/method.md) instead")
      math(EXPR _bad "${_bad} + 1")
    endif()
    if(NOT _line MATCHES "method ${S}")
      continue()
    endif()
    string(REGEX MATCHALL "${_cite}" _cites "${_line}")
    foreach(_c IN LISTS _cites)
      math(EXPR _n_citations "${_n_citations} + 1")
      string(REGEX MATCHALL "${_num}" _numbers "${_c}")
      foreach(_n IN LISTS _numbers)
        string(REGEX REPLACE "\\.+$" "" _n "${_n}")
        if(NOT _n IN_LIST _sections)
          message("${_rel}:${_ln}: '${_c}' cites ${S}${_n}, which is not a heading of docs/method.md")
          math(EXPR _bad "${_bad} + 1")
        endif()
      endforeach()
    endforeach()
  endforeach()
endforeach()

if(_bad GREATER 0)
  message(FATAL_ERROR "check_citations.cmake: ${_bad} unresolved citation(s) (headings of docs/method.md: ${_sections})")
endif()
message(STATUS "method citations: ${_n_citations} citations in ${_n_scanned} files resolve to the ${_n_sections} numbered headings of docs/method.md")
