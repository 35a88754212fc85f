# Install-consumer test (CTest: consumer.find_package), run as `cmake -P`.
#
# Proves what Conan and vcpkg both end in, with neither installed: qkgeom
# installed to a fresh prefix is usable
#   1. through find_package(qkgeom CONFIG) -- test_package/ is configured,
#      built and run against the prefix, and must have found the *installed*
#      qkgeomConfig.cmake (not the build tree, not a system copy); its
#      qkgeom::compiled (the optional compiled part, built from the installed
#      source) must give the same head as the header-only program;
#   2. through pkg-config -- pkgconfig_consumer.cpp (the moments and a deflated
#      .npz round trip: Eigen and zlib through the .pc) compiled and linked with
#      nothing but `pkg-config --cflags --libs qkgeom`, and run;
#   3. with the program (EXPECT_PROGRAM, i.e. the build has QKGEOM_BUILD_PROGRAM):
#      <prefix>/bin/qkgeom exists and runs, find_package(qkgeom) gives the
#      imported executable qkgeom::program located under the prefix, and
#      test_package's program tests (`qkgeom --help`, a one-layer demo that
#      writes summary.txt) pass under CTest. Without it, no bin/qkgeom and no
#      qkgeom::program.
#
# Inputs (-D): QKGEOM_BUILD_DIR, QKGEOM_SOURCE_DIR, WORK_DIR, CXX;
# EXPECT_PROGRAM (0 or 1, default 0).
cmake_minimum_required(VERSION 3.25)

foreach(_var QKGEOM_BUILD_DIR QKGEOM_SOURCE_DIR WORK_DIR CXX)
  if(NOT DEFINED ${_var} OR "${${_var}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer.cmake: -D${_var}=... is required")
  endif()
endforeach()
if(NOT DEFINED EXPECT_PROGRAM OR "${EXPECT_PROGRAM}" STREQUAL "")
  set(EXPECT_PROGRAM 0)
endif()

set(_prefix "${WORK_DIR}/prefix")
set(_build "${WORK_DIR}/build")
set(_pc_build "${WORK_DIR}/pkgconfig")
set(_tp "${QKGEOM_SOURCE_DIR}/test_package")

# run(<step> <command>...): execute_process in WORK_DIR; FATAL_ERROR with the
# step's output when it fails. The output is kept in _out for later checks.
function(run step)
  execute_process(COMMAND ${ARGN}
    WORKING_DIRECTORY "${WORK_DIR}"
    RESULT_VARIABLE _rc OUTPUT_VARIABLE _stdout ERROR_VARIABLE _stderr)
  if(NOT _rc STREQUAL "0")
    list(JOIN ARGN " " _cmd)
    message(FATAL_ERROR "consumer: step '${step}' failed (${_rc})\n"
                        "command: ${_cmd}\n--- stdout ---\n${_stdout}\n--- stderr ---\n${_stderr}")
  endif()
  message(STATUS "consumer: ${step}: ok")
  string(STRIP "${_stdout}" _stdout)
  set(_out "${_stdout}" PARENT_SCOPE)
endfunction()

# Nothing from the caller's environment may point find_package or pkg-config
# anywhere but the fresh prefix.
foreach(_env qkgeom_DIR qkgeom_ROOT QKGEOM_ROOT PKG_CONFIG_LIBDIR)
  unset(ENV{${_env}})
endforeach()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

# --- install --------------------------------------------------------------------
run("install" "${CMAKE_COMMAND}" --install "${QKGEOM_BUILD_DIR}" --prefix "${_prefix}")
foreach(_f include/qkgeom/plasticity.hpp share/qkgeom/qkgeomConfig.cmake
           share/qkgeom/qkgeomConfigVersion.cmake share/qkgeom/qkgeomTargets.cmake
           share/pkgconfig/qkgeom.pc)
  if(NOT EXISTS "${_prefix}/${_f}")
    message(FATAL_ERROR "consumer: install step did not produce ${_prefix}/${_f}")
  endif()
endforeach()

# --- the program: installed as bin/qkgeom with the package ----------------------
set(_program "${_prefix}/bin/qkgeom${CMAKE_EXECUTABLE_SUFFIX}")
if(CMAKE_HOST_WIN32)
  set(_program "${_prefix}/bin/qkgeom.exe")
endif()
if(EXPECT_PROGRAM)
  foreach(_f "${_program}" "${_prefix}/share/qkgeom/qkgeomProgramTargets.cmake")
    if(NOT EXISTS "${_f}")
      message(FATAL_ERROR "consumer: the build has the program (QKGEOM_BUILD_PROGRAM) but the install step "
                          "did not produce ${_f}")
    endif()
  endforeach()
  run("run installed qkgeom --help" "${_program}" --help)
  if(NOT _out MATCHES "Usage:")
    message(FATAL_ERROR "consumer: '${_program} --help' printed no usage:\n${_out}")
  endif()
elseif(EXISTS "${_program}")
  message(FATAL_ERROR "consumer: ${_program} was installed although the build has no program")
endif()

# --- find_package(qkgeom CONFIG) ------------------------------------------------
run("configure test_package" "${CMAKE_COMMAND}" -S "${_tp}" -B "${_build}"
    "-DCMAKE_PREFIX_PATH=${_prefix}"
    "-DQKGEOM_REQUIRE_PROGRAM=${EXPECT_PROGRAM}"
    "-DCMAKE_CXX_COMPILER=${CXX}"
    -DCMAKE_BUILD_TYPE=Release
    "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG"  # both modes alike; -O3 would double the test's time
    -DCMAKE_EXPORT_COMPILE_COMMANDS=ON
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
    -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)

# The consumer must have used the installed config, under the prefix.
file(STRINGS "${_build}/CMakeCache.txt" _dir_line REGEX "^qkgeom_DIR:[A-Z]+=")
string(REGEX REPLACE "^qkgeom_DIR:[A-Z]+=" "" _qkgeom_dir "${_dir_line}")
file(REAL_PATH "${_prefix}" _real_prefix)
if(_qkgeom_dir STREQUAL "")
  message(FATAL_ERROR "consumer: no qkgeom_DIR in ${_build}/CMakeCache.txt")
endif()
file(REAL_PATH "${_qkgeom_dir}" _real_qkgeom_dir)
cmake_path(IS_PREFIX _real_prefix "${_real_qkgeom_dir}" NORMALIZE _under_prefix)
if(NOT _under_prefix)
  message(FATAL_ERROR "consumer: find_package(qkgeom) used ${_qkgeom_dir}, not the installed config under ${_prefix}")
endif()
message(STATUS "consumer: qkgeom_DIR = ${_qkgeom_dir} (installed prefix)")
if(EXPECT_PROGRAM AND NOT _out MATCHES "qkgeom::program found")
  message(FATAL_ERROR "consumer: find_package(qkgeom) gave no qkgeom::program:\n${_out}")
elseif(NOT EXPECT_PROGRAM AND _out MATCHES "qkgeom::program found")
  message(FATAL_ERROR "consumer: find_package(qkgeom) gave qkgeom::program although the build has no program")
endif()

# ... and must compile against the installed headers, not the source tree.
if(EXISTS "${_build}/compile_commands.json")
  file(READ "${_build}/compile_commands.json" _cc)
  string(FIND "${_cc}" "${QKGEOM_SOURCE_DIR}/include" _pos)
  if(NOT _pos EQUAL -1)
    message(FATAL_ERROR "consumer: test_package compiles against ${QKGEOM_SOURCE_DIR}/include:\n${_cc}")
  endif()
endif()

# --parallel 2: the three programs (header-only, the compiled part, compiled
# mode) compile side by side; this is the longest single test.
run("build test_package" "${CMAKE_COMMAND}" --build "${_build}" --config Release --parallel 2)
set(_exe "")
foreach(_cand "${_build}/test_package" "${_build}/test_package.exe"
              "${_build}/Release/test_package" "${_build}/Release/test_package.exe")
  if(EXISTS "${_cand}")
    set(_exe "${_cand}")
    break()
  endif()
endforeach()
if(_exe STREQUAL "")
  message(FATAL_ERROR "consumer: built test_package executable not found under ${_build}")
endif()
run("run test_package (find_package)" "${_exe}")
message(STATUS "consumer: ${_out}")

# test_package's CTest tests: test_package itself and, with the program, the
# runs of qkgeom::program. The program they ran must be the installed one.
if(DEFINED CMAKE_CTEST_COMMAND)
  set(_ctest "${CMAKE_CTEST_COMMAND}")
else()
  get_filename_component(_cmake_bin "${CMAKE_COMMAND}" DIRECTORY)
  set(_ctest "${_cmake_bin}/ctest")
endif()
run("ctest test_package" "${_ctest}" --test-dir "${_build}" -C Release -V --output-on-failure)
set(_expected_tests test_package test_package_compiled compare_modes)
if(EXPECT_PROGRAM)
  list(APPEND _expected_tests program.help program.demo)
endif()
foreach(_t IN LISTS _expected_tests)
  if(NOT _out MATCHES "Test +#[0-9]+: ${_t} [.]+ +Passed")
    message(FATAL_ERROR "consumer: test_package's test '${_t}' did not pass:\n${_out}")
  endif()
endforeach()
if(EXPECT_PROGRAM)
  if(NOT _out MATCHES "check_program: ([^\n]+) demo wrote")
    message(FATAL_ERROR "consumer: program.demo did not report the program it ran:\n${_out}")
  endif()
  file(REAL_PATH "${CMAKE_MATCH_1}" _ran)
  file(REAL_PATH "${_program}" _real_program)
  if(NOT _ran STREQUAL _real_program)
    message(FATAL_ERROR "consumer: qkgeom::program is ${CMAKE_MATCH_1}, not the installed ${_program}")
  endif()
  message(STATUS "consumer: qkgeom::program = ${_ran} (installed prefix)")
endif()

# --- pkg-config -----------------------------------------------------------------
find_program(_pkg_config NAMES pkg-config pkgconf)
if(NOT _pkg_config)
  message(FATAL_ERROR "consumer: pkg-config not found (apt-get install pkg-config)")
endif()
set(ENV{PKG_CONFIG_PATH} "${_prefix}/share/pkgconfig")
run("pkg-config --cflags qkgeom" "${_pkg_config}" --cflags qkgeom)
set(_cflags_str "${_out}")
message(STATUS "consumer: pkg-config --cflags qkgeom = ${_cflags_str}")
separate_arguments(_cflags UNIX_COMMAND "${_cflags_str}")

# The .pc must point into the prefix it was installed to (a .pc that names the
# configure-time CMAKE_INSTALL_PREFIX breaks `cmake --install --prefix`).
set(_has_prefix_include FALSE)
foreach(_flag IN LISTS _cflags)
  if(_flag MATCHES "^-I(.+)$")
    file(REAL_PATH "${CMAKE_MATCH_1}" _inc)
    if(_inc STREQUAL "${_real_prefix}/include")
      set(_has_prefix_include TRUE)
    endif()
  endif()
endforeach()
if(NOT _has_prefix_include)
  file(READ "${_prefix}/share/pkgconfig/qkgeom.pc" _pc)
  message(FATAL_ERROR "consumer: pkg-config --cflags qkgeom gives '${_cflags_str}', "
                      "without -I${_prefix}/include; the installed qkgeom.pc is not relocatable:\n${_pc}")
endif()

run("pkg-config --libs qkgeom" "${_pkg_config}" --libs qkgeom)
separate_arguments(_libs UNIX_COMMAND "${_out}")
message(STATUS "consumer: pkg-config --libs qkgeom = ${_out}")
file(MAKE_DIRECTORY "${_pc_build}")
run("compile pkgconfig_consumer.cpp (pkg-config)" "${CXX}" ${_cflags} "${CMAKE_CURRENT_LIST_DIR}/pkgconfig_consumer.cpp"
    -o "${_pc_build}/pkgconfig_consumer" ${_libs})
run("run pkgconfig_consumer (pkg-config)" "${_pc_build}/pkgconfig_consumer")
message(STATUS "consumer: ${_out}")
message(STATUS "consumer: all steps passed")
