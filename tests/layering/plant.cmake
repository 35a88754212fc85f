# lint.layering.planted: copies include/qkgeom into QKGEOM_PLANT_DIR (a folder
# of the build tree), appends one wrong-way include to a header of the copy
# (QKGEOM_PLANT_FILE, default io/json.hpp, gets QKGEOM_PLANT_INCLUDE, default
# <qkgeom/analysis/analyze.hpp>) and runs check_layering.cmake on the copy,
# which must fail naming that file and that include.
#
#   cmake -DQKGEOM_PLANT_DIR=<dir> [-DQKGEOM_SOURCE_ROOT=<include/qkgeom>] -P plant.cmake
cmake_minimum_required(VERSION 3.20)

if(NOT DEFINED QKGEOM_PLANT_DIR)
  message(FATAL_ERROR "plant.cmake: set QKGEOM_PLANT_DIR")
endif()
if(NOT DEFINED QKGEOM_SOURCE_ROOT)
  get_filename_component(QKGEOM_SOURCE_ROOT "${CMAKE_CURRENT_LIST_DIR}/../../include/qkgeom" ABSOLUTE)
endif()
if(NOT DEFINED QKGEOM_PLANT_FILE)
  set(QKGEOM_PLANT_FILE "io/json.hpp")
endif()
if(NOT DEFINED QKGEOM_PLANT_INCLUDE)
  set(QKGEOM_PLANT_INCLUDE "qkgeom/analysis/analyze.hpp")
endif()

file(REMOVE_RECURSE "${QKGEOM_PLANT_DIR}")
file(MAKE_DIRECTORY "${QKGEOM_PLANT_DIR}")
file(COPY "${QKGEOM_SOURCE_ROOT}" DESTINATION "${QKGEOM_PLANT_DIR}")  # -> <dir>/qkgeom
set(_copy "${QKGEOM_PLANT_DIR}/qkgeom")
if(NOT EXISTS "${_copy}/${QKGEOM_PLANT_FILE}")
  message(FATAL_ERROR "plant.cmake: the copy has no ${QKGEOM_PLANT_FILE}")
endif()
file(APPEND "${_copy}/${QKGEOM_PLANT_FILE}" "\n#include <${QKGEOM_PLANT_INCLUDE}>  // planted by tests/layering/plant.cmake\n")
message(STATUS "plant.cmake: planted #include <${QKGEOM_PLANT_INCLUDE}> in ${_copy}/${QKGEOM_PLANT_FILE}")

set(QKGEOM_INCLUDE_ROOT "${_copy}")
include("${CMAKE_CURRENT_LIST_DIR}/check_layering.cmake")
