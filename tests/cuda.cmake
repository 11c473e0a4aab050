# CUDA tests (tests/cuda/test_cuda_*.c): plain programs, not Criterion, so a
# GPU machine can build them without it (cmake -DDISTRO_TESTS=OFF
# -DDISTRO_CUDA_TESTS=ON). Without a GPU they print SKIP and exit 77, which
# ctest reports as skipped; test_cuda_api needs no GPU and always runs.
if(DISTRO_WITH_CUDA AND NOT TARGET test_cuda_api)
  file(GLOB _distro_cuda_tests CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/cuda/test_cuda_*.c)
  if(NOT DISTRO_WITH_NCCL)
    list(FILTER _distro_cuda_tests EXCLUDE REGEX "test_cuda_nccl\\.c$")
  endif()
  foreach(src ${_distro_cuda_tests})
    get_filename_component(name ${src} NAME_WE)
    add_executable(${name} ${src} ${CMAKE_CURRENT_LIST_DIR}/support/testutil.c)
    target_include_directories(${name} PRIVATE ${CMAKE_CURRENT_LIST_DIR}/support)
    target_link_libraries(${name} PRIVATE distro_internal ${DISTRO_CUDA_LIBRARIES} m)
    target_compile_options(${name} PRIVATE ${DISTRO_WARN})
    target_compile_definitions(${name} PRIVATE _GNU_SOURCE)
    add_test(NAME ${name} COMMAND ${name})
    set_tests_properties(${name} PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77 ENVIRONMENT "OMP_NUM_THREADS=2")
  endforeach()
endif()

# The exact method's kernels must not contract a*b+c into an FMA, or GPU
# ranks would round differently from CPU ranks: their PTX holds no fma
# (needs nvcc, not a GPU).
if(DISTRO_WITH_CUDA AND CMAKE_CUDA_COMPILER AND NOT TEST cuda_ptx_has_no_fma)
  add_test(NAME cuda_ptx_has_no_fma
           COMMAND ${CMAKE_COMMAND} -DNVCC=${CMAKE_CUDA_COMPILER} -DSRC=${PROJECT_SOURCE_DIR}
                   -DOUT=${CMAKE_CURRENT_BINARY_DIR}/ptx -P ${CMAKE_CURRENT_LIST_DIR}/support/ptx_no_fma.cmake)
  set_tests_properties(cuda_ptx_has_no_fma PROPERTIES TIMEOUT 300)
endif()
