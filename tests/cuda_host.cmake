# tests/test_cuda_host.c compiles the CUDA step's shared arithmetic
# (src/cuda/step_math.h) as C; like the library it must not contract a*b+c
# into an FMA, or its bits would differ from the CPU path's.
if(TARGET test_cuda_host)
  target_compile_options(test_cuda_host PRIVATE -ffp-contract=off)
  target_link_libraries(test_cuda_host PRIVATE pthread)
endif()
