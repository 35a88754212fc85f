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
