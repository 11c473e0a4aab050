# tests/test_cuda_host*.c compile the CUDA step's shared arithmetic
# (src/cuda/step_math.h) as C, with the GPU step emulated on the CPU in
# support/cuda_emu.c; like the library they must not contract a*b+c into
# an FMA, or their bits would differ from the CPU path's.
foreach(t test_cuda_host test_cuda_host_overlap)
  if(TARGET ${t})
    target_sources(${t} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/support/cuda_emu.c)
    target_compile_options(${t} PRIVATE -ffp-contract=off)
    target_link_libraries(${t} PRIVATE pthread)
  endif()
endforeach()
