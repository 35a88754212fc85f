# Tests of the LibTorch adapter: one executable (LibTorch TUs compile slowly),
# run by CTest in groups named torch.*; torch.cuda skips visibly without a GPU.
# Included at the end of the top-level directory (adapters/torch/CMakeLists.txt)
# so that the development flags (qkgeom_dev_target) exist.
find_package(Catch2 2.13 REQUIRED)
add_executable(qkgeom_torch_tests "${CMAKE_CURRENT_LIST_DIR}/main.cpp" "${CMAKE_CURRENT_LIST_DIR}/torch_test.cpp")
qkgeom_dev_target(qkgeom_torch_tests)
qkgeom_torch_pch(qkgeom_torch_tests)
target_link_libraries(qkgeom_torch_tests PRIVATE qkgeom::torch qkgeom::compiled Catch2::Catch2
                                                 qkgeom_catch_runner)  # tests/CMakeLists.txt

foreach(_group adapter capture device_moments plasticity errors manifest)
  add_test(NAME torch.${_group} COMMAND qkgeom_torch_tests "[${_group}]")
endforeach()
# GPU: the same properties on a CUDA device; exit code 77 = skipped (no GPU).
add_test(NAME torch.cuda COMMAND qkgeom_torch_tests --cuda-or-skip "[cuda]")
set_tests_properties(torch.cuda PROPERTIES SKIP_RETURN_CODE 77)
