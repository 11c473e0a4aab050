# cmake -DNVCC=... -DSRC=<repo> -DOUT=<dir> -P ptx_no_fma.cmake
# Compiles the exact method's kernels to PTX with the library's flags and
# fails if any fma instruction is in them (tests/cuda.cmake).
file(MAKE_DIRECTORY ${OUT})
foreach(cu tile.cu update.cu)
  execute_process(COMMAND ${NVCC} -ptx -arch=sm_90 --fmad=false -I${SRC}/src -I${SRC}/include
                          ${SRC}/src/cuda/${cu} -o ${OUT}/${cu}.ptx
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "nvcc -ptx ${cu} failed: ${err}")
  endif()
  file(STRINGS ${OUT}/${cu}.ptx fma REGEX "fma\\.")
  file(STRINGS ${OUT}/${cu}.ptx entries REGEX "\\.entry")
  list(LENGTH entries n)
  if(n EQUAL 0)
    message(FATAL_ERROR "${cu}: no kernel in its PTX")
  endif()
  if(fma)
    list(GET fma 0 first)
    message(FATAL_ERROR "${cu}: the PTX contracts into fma (${first})")
  endif()
  message(STATUS "${cu}: ${n} kernels, no fma")
endforeach()
