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
