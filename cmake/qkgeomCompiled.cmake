# qkgeom::compiled — the optional compiled part of qkgeom, for consumers of an
# installed package (qkgeomConfig.cmake includes this file; the Conan recipe
# hands it to CMakeDeps as a build module).
#
# Linking qkgeom::compiled instead of qkgeom::qkgeom defines QKGEOM_COMPILED in
# every translation unit of the target: the headers then declare the SIMD
# kernels and the plasticity engine instead of defining them (no <immintrin.h>,
# no closed-form or empirical pass to parse), and one static library, built
# here in the consumer's project with its compiler and flags from the installed
# src/qkgeom_compiled.cpp, defines them. docs/architecture.md, "Compile cost".
# Every target of a program that uses qkgeom must link the same one of the two.
if(NOT TARGET qkgeom::compiled)
  set(_qkgeom_compiled_src "${CMAKE_CURRENT_LIST_DIR}/src/qkgeom_compiled.cpp")
  if(NOT EXISTS "${_qkgeom_compiled_src}")
    message(FATAL_ERROR "qkgeom::compiled: ${_qkgeom_compiled_src} is missing from the qkgeom package")
  endif()
  add_library(qkgeom_compiled STATIC EXCLUDE_FROM_ALL "${_qkgeom_compiled_src}")
  add_library(qkgeom::compiled ALIAS qkgeom_compiled)
  target_link_libraries(qkgeom_compiled PUBLIC qkgeom::qkgeom)
  target_compile_definitions(qkgeom_compiled PUBLIC QKGEOM_COMPILED=1)
  target_compile_features(qkgeom_compiled PUBLIC cxx_std_20)
  unset(_qkgeom_compiled_src)
endif()
