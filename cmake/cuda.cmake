# CUDA backend (src/cuda/, include/distro/cuda.h), included from the
# top-level CMakeLists.txt after the library targets exist.
#
#   DISTRO_CUDA=AUTO  build it when nvcc, cuBLAS, cuFFT and NCCL are found;
#                     else skip with a message
#   DISTRO_CUDA=ON    require nvcc, cuBLAS and cuFFT; NCCL is used when found
#   DISTRO_CUDA=OFF   never
#   NCCL_ROOT         where nccl.h / libnccl.so live, when not beside cuBLAS
#   DISTRO_CUDA_TESTS with DISTRO_TESTS=OFF: still build and register the
#                     CUDA tests (they need no Criterion), for GPU machines
#
# The CUDA objects go into libdistro itself (they use the internal wire
# codecs). CUDA libraries are linked by absolute path so the exported
# targets need no CUDA package in the consuming project.
set(DISTRO_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO, ON or OFF")
set_property(CACHE DISTRO_CUDA PROPERTY STRINGS AUTO ON OFF)
option(DISTRO_CUDA_TESTS "Build the CUDA tests even when DISTRO_TESTS is OFF" OFF)
set(DISTRO_WITH_CUDA OFF)
set(DISTRO_WITH_NCCL OFF)

if(NOT DISTRO_CUDA STREQUAL "OFF")
  set(_distro_cuda_required ${DISTRO_CUDA})
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    find_package(CUDAToolkit QUIET)
  endif()
  set(_distro_cuda_why "")
  if(NOT CMAKE_CUDA_COMPILER)
    set(_distro_cuda_why "no CUDA compiler (nvcc) found")
  elseif(NOT CUDAToolkit_FOUND OR NOT TARGET CUDA::cublas OR NOT TARGET CUDA::cufft)
    set(_distro_cuda_why "the CUDA toolkit, cuBLAS or cuFFT was not found")
  endif()
  if(NOT _distro_cuda_why)
    find_path(DISTRO_NCCL_INCLUDE_DIR nccl.h
              HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
    find_library(DISTRO_NCCL_LIBRARY nccl
                 HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
    if(DISTRO_NCCL_INCLUDE_DIR AND DISTRO_NCCL_LIBRARY)
      set(DISTRO_WITH_NCCL ON)
    elseif(_distro_cuda_required STREQUAL "AUTO")
      set(_distro_cuda_why "NCCL (nccl.h, libnccl) was not found; set NCCL_ROOT")
    endif()
  endif()
  if(_distro_cuda_why)
    if(_distro_cuda_required STREQUAL "ON")
      message(FATAL_ERROR "DISTRO_CUDA=ON but ${_distro_cuda_why}")
    endif()
    message(STATUS "CUDA backend skipped: ${_distro_cuda_why}")
  else()
    set(DISTRO_WITH_CUDA ON)
  endif()
endif()

if(DISTRO_WITH_CUDA)
  # One real architecture (Hopper) plus its PTX, which newer GPUs JIT-compile.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "90-real;90-virtual")
  endif()
  # One CUDA runtime per process: the shared libcudart everywhere.
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)

  file(GLOB DISTRO_CUDA_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/cuda/*.cu ${PROJECT_SOURCE_DIR}/src/cuda/*.c)
  if(NOT DISTRO_WITH_NCCL)
    list(FILTER DISTRO_CUDA_SOURCES EXCLUDE REGEX "src/cuda/comm_nccl\\.c$")
  endif()
  add_library(distro_cuda_obj OBJECT ${DISTRO_CUDA_SOURCES})
  set_target_properties(distro_cuda_obj PROPERTIES POSITION_INDEPENDENT_CODE ON C_VISIBILITY_PRESET hidden
                        CUDA_VISIBILITY_PRESET hidden)
  # The CUDA and NCCL headers are system headers (nccl.h trips -Wstrict-prototypes).
  target_include_directories(distro_cuda_obj PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src)
  target_include_directories(distro_cuda_obj SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  target_compile_definitions(distro_cuda_obj PRIVATE DISTRO_BUILDING=1 DISTRO_WITH_CUDA=1 _POSIX_C_SOURCE=200809L)
  # nvcc: keep IEEE division and square root; no FMA contraction, so the
  # element-wise kernels round exactly like the C code.
  target_compile_options(distro_cuda_obj PRIVATE
    $<$<COMPILE_LANGUAGE:C>:${DISTRO_WARN}>
    $<$<COMPILE_LANGUAGE:CUDA>:--fmad=false -Xcompiler=-Wall,-Wextra>)
  if(DISTRO_WERROR)
    target_compile_options(distro_cuda_obj PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Werror>)
  endif()
  if(DISTRO_WITH_NCCL)
    target_include_directories(distro_cuda_obj SYSTEM PRIVATE ${DISTRO_NCCL_INCLUDE_DIR})
    target_compile_definitions(distro_cuda_obj PRIVATE DISTRO_WITH_NCCL=1)
  endif()
  if(DISTRO_WITH_MPI)
    target_link_libraries(distro_cuda_obj PRIVATE MPI::MPI_C)
    target_compile_definitions(distro_cuda_obj PRIVATE DISTRO_WITH_MPI=1)
  endif()

  # Absolute paths of the CUDA libraries (see the note at the top).
  set(_distro_cuda_libs)
  foreach(_t cudart cublas cufft)
    get_target_property(_loc CUDA::${_t} IMPORTED_LOCATION)
    list(APPEND _distro_cuda_libs ${_loc})
  endforeach()
  if(DISTRO_WITH_NCCL)
    list(APPEND _distro_cuda_libs ${DISTRO_NCCL_LIBRARY})
  endif()
  set(DISTRO_CUDA_LIBRARIES ${_distro_cuda_libs})

  foreach(t distro distro_static)
    # Created before CUDA was enabled, so the property was not initialized.
    set_target_properties(${t} PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}" CUDA_RUNTIME_LIBRARY Shared)
    target_sources(${t} PRIVATE $<TARGET_OBJECTS:distro_cuda_obj>)
    target_link_libraries(${t} PRIVATE ${_distro_cuda_libs})
    target_include_directories(${t} SYSTEM PUBLIC "$<BUILD_INTERFACE:${CUDAToolkit_INCLUDE_DIRS}>")
    target_compile_definitions(${t} PUBLIC DISTRO_WITH_CUDA=1)
    if(DISTRO_WITH_NCCL)
      target_include_directories(${t} SYSTEM PUBLIC "$<BUILD_INTERFACE:${DISTRO_NCCL_INCLUDE_DIR}>")
      target_compile_definitions(${t} PUBLIC DISTRO_WITH_NCCL=1)
    endif()
  endforeach()
  # Installed libdistro.so finds the CUDA libraries where it was built.
  set_property(TARGET distro APPEND PROPERTY INSTALL_RPATH ${CUDAToolkit_LIBRARY_DIR})
  if(DISTRO_WITH_NCCL)
    get_filename_component(_distro_nccl_dir ${DISTRO_NCCL_LIBRARY} DIRECTORY)
    set_property(TARGET distro APPEND PROPERTY INSTALL_RPATH ${_distro_nccl_dir})
  endif()
  message(STATUS "CUDA backend: ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, archs ${CMAKE_CUDA_ARCHITECTURES}, NCCL ${DISTRO_WITH_NCCL})")

  # Tests register themselves from tests/cuda.cmake (through tests/CMakeLists.txt);
  # without the Criterion suite they can still be asked for here.
  if(NOT DISTRO_TESTS AND DISTRO_CUDA_TESTS)
    enable_testing()
    include(${PROJECT_SOURCE_DIR}/tests/cuda.cmake)
  endif()
endif()
