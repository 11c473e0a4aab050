# bench_cuda_step: the DeMo step on the GPU (bench/gpu-check.sh runs it).
if(DISTRO_WITH_CUDA)
  add_executable(bench_cuda_step bench_cuda_step.cu)
  target_link_libraries(bench_cuda_step PRIVATE distro distro_bench_shapes ${DISTRO_CUDA_LIBRARIES})
  target_compile_options(bench_cuda_step PRIVATE -Xcompiler=-Wall,-Wextra)
  if(DISTRO_WERROR)
    target_compile_options(bench_cuda_step PRIVATE -Werror=all-warnings -Xcompiler=-Werror)
  endif()
endif()
