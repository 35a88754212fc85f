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
