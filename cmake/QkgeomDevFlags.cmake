# Flags for qkgeom's own tests, examples and benchmarks (never applied to the
# installed INTERFACE target). qkgeom_dev_target(<target>) applies them.
add_library(qkgeom_dev_flags INTERFACE)
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(qkgeom_dev_flags INTERFACE -Wall -Wextra -Wpedantic)
  if(QKGEOM_WARNINGS_AS_ERRORS)
    target_compile_options(qkgeom_dev_flags INTERFACE -Werror)
  endif()
  if(QKGEOM_SANITIZE)
    target_compile_options(qkgeom_dev_flags INTERFACE -fsanitize=${QKGEOM_SANITIZE} -fno-omit-frame-pointer
                           -fno-sanitize-recover=all)
    target_link_options(qkgeom_dev_flags INTERFACE -fsanitize=${QKGEOM_SANITIZE})
  endif()
endif()

# The compiled part (root CMakeLists.txt) is built with the same flags as the
# targets that link it (warnings, sanitizers).
target_link_libraries(qkgeom_compiled PRIVATE qkgeom_dev_flags)

function(qkgeom_dev_target target)
  target_link_libraries(${target} PRIVATE qkgeom::qkgeom qkgeom_dev_flags)
endfunction()

# qkgeom_torch_pch(<target>): with g++, the LibTorch programs of the build
# (tests, examples) share one precompiled <torch/torch.h> (QKGEOM_TORCH_PCH,
# ON): parsing it is about 20 s of every translation unit that includes it.
# The first target called with it owns the precompiled header; the others
# reuse it (they link the same targets, so their flags agree; a header that
# does not fit is an error, -Winvalid-pch, not a silent slow parse).
option(QKGEOM_TORCH_PCH "g++: the LibTorch test and example programs share a precompiled <torch/torch.h>" ON)
function(qkgeom_torch_pch target)
  if(NOT QKGEOM_TORCH_PCH OR NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    return()
  endif()
  get_property(_owner GLOBAL PROPERTY QKGEOM_TORCH_PCH_OWNER)
  if(_owner)
    target_precompile_headers(${target} REUSE_FROM ${_owner})
  else()
    target_precompile_headers(${target} PRIVATE <torch/torch.h>)
    set_property(GLOBAL PROPERTY QKGEOM_TORCH_PCH_OWNER ${target})
  endif()
endfunction()

# qkgeom_unity_build(<target> <files per unit>): compile the target's sources
# in batches of that many files, one translation unit per batch (docs/building.md,
# "Build budget"): every file of a test or binding program parses the same
# headers and instantiates the same templates, which a batch does once. Files
# that must stay alone carry SKIP_UNITY_BUILD_INCLUSION. QKGEOM_UNITY_BUILD=OFF
# compiles file by file (faster rebuilds while editing one file).
function(qkgeom_unity_build target batch)
  if(QKGEOM_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_MODE BATCH
                                               UNITY_BUILD_BATCH_SIZE ${batch})
  endif()
endfunction()

# qkgeom_test_main(<file>...): a test program's Catch2 main (the test runner
# itself) is compiled without optimisation: it runs for microseconds, and at
# -O2 it is the slowest file of its program to compile.
function(qkgeom_test_main)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    set_source_files_properties(${ARGN} DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}" PROPERTIES COMPILE_OPTIONS "-O0")
  endif()
endfunction()
