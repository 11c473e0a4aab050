# fuzz_wire, fuzz_wire2 and fuzz_outer_sparse: the libFuzzer targets
# tests/fuzz/fuzz_wire.c (the wire v1 validator), tests/fuzz/fuzz_wire2.c (the
# wire v2 decoder) and tests/fuzz/fuzz_outer_sparse.c (the sparse DiLoCo
# outer payload decoder, 2-bit values included), each run for a bounded time
# by ctest (tests/fuzz/run_fuzz.cmake). They need clang
# with libFuzzer (Debian: clang, libclang-rt-14-dev) and are built with clang
# whatever the project's compiler, from the few library sources the payload
# code uses.
#
# Registered whenever clang with libFuzzer works; DISTRO_FUZZ=ON makes that
# a requirement (configure fails without it). DISTRO_FUZZ_SECONDS=0 skips
# the targets; otherwise it bounds each run (default 20 s).
set(DISTRO_FUZZ_SECONDS 20 CACHE STRING "Seconds of libFuzzer per fuzz test (0 = no fuzz tests)")
set(DISTRO_FUZZ_RUNS 2000000 CACHE STRING "Maximum libFuzzer executions per fuzz test")

# distro_fuzz_target(NAME SEED_DEFINE LIB_SOURCES...): builds tests/fuzz/NAME.c
# as a libFuzzer target (ASan + UBSan) and, with -DSEED_DEFINE, as its seed
# corpus writer, and registers the ctest NAME that runs it for
# DISTRO_FUZZ_SECONDS. Called from distro_fuzz_setup (needs clang, flags,
# headers from there).
macro(distro_fuzz_target name seed_define)
  set(lib_sources ${ARGN})
  set(target_src ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/${name}.c)
  set(fuzzer ${CMAKE_CURRENT_BINARY_DIR}/${name})
  set(seeds ${CMAKE_CURRENT_BINARY_DIR}/${name}_seeds)
  add_custom_command(
    OUTPUT ${fuzzer}
    COMMAND ${clang} ${flags} -fsanitize=fuzzer,address,undefined ${target_src} ${lib_sources} -lm -o ${fuzzer}
    DEPENDS ${target_src} ${lib_sources} ${headers}
    COMMENT "Building libFuzzer target ${name} with ${clang}"
    VERBATIM)
  add_custom_command(
    OUTPUT ${seeds}
    COMMAND ${clang} ${flags} -fsanitize=address,undefined -D${seed_define} ${target_src} ${lib_sources} -lm
            -o ${seeds}
    DEPENDS ${target_src} ${lib_sources} ${headers}
    COMMENT "Building ${name} seed writer with ${clang}"
    VERBATIM)
  add_custom_target(${name}_build ALL DEPENDS ${fuzzer} ${seeds})

  add_test(NAME ${name}
           COMMAND ${CMAKE_COMMAND} -DFUZZER=${fuzzer} -DSEEDS=${seeds}
                   -DWORK=${CMAKE_CURRENT_BINARY_DIR}/${name}_work -DSECONDS=${DISTRO_FUZZ_SECONDS}
                   -DRUNS=${DISTRO_FUZZ_RUNS} -P ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/run_fuzz.cmake)
  math(EXPR limit "${DISTRO_FUZZ_SECONDS} + 60")
  set_tests_properties(${name} PROPERTIES TIMEOUT ${limit} LABELS fuzz)
  message(STATUS "${name}: libFuzzer target with ${clang}, ${DISTRO_FUZZ_SECONDS} s per run")
endmacro()

function(distro_fuzz_setup)
  if(DISTRO_FUZZ_SECONDS EQUAL 0)
    message(STATUS "fuzz_wire, fuzz_wire2, fuzz_outer_sparse: skipped (DISTRO_FUZZ_SECONDS=0)")
    return()
  endif()

  if(CMAKE_C_COMPILER_ID MATCHES "Clang")
    set(clang ${CMAKE_C_COMPILER})
  else()
    find_program(DISTRO_CLANG NAMES clang clang-19 clang-18 clang-17 clang-16 clang-15 clang-14)
    set(clang ${DISTRO_CLANG})
  endif()

  set(why "")
  if(NOT clang)
    set(why "clang not found")
  else()
    # Can this clang link a libFuzzer target with ASan and UBSan?
    set(probe_dir ${CMAKE_CURRENT_BINARY_DIR}/fuzz_probe)
    file(MAKE_DIRECTORY ${probe_dir})
    file(WRITE ${probe_dir}/probe.c
         "#include <stddef.h>\n#include <stdint.h>\n"
         "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return n && d[0] == 1; }\n")
    execute_process(COMMAND ${clang} -fsanitize=fuzzer,address,undefined ${probe_dir}/probe.c -o ${probe_dir}/probe
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
    if(NOT rc EQUAL 0)
      set(why "${clang} cannot build -fsanitize=fuzzer,address,undefined (install libclang-rt-dev): ${out}")
    endif()
  endif()
  if(why)
    if(DISTRO_FUZZ)
      message(FATAL_ERROR "DISTRO_FUZZ=ON but ${why}")
    endif()
    message(STATUS "fuzz_wire, fuzz_wire2, fuzz_outer_sparse: skipped: ${why}")
    return()
  endif()

  set(src ${PROJECT_SOURCE_DIR}/src)
  file(GLOB headers ${src}/common/*.h ${src}/compress/*.h ${PROJECT_SOURCE_DIR}/include/distro/*.h
       ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/*.h)
  set(flags -std=c11 -g -O1 -fno-omit-frame-pointer -fno-sanitize-recover=all
            -D_POSIX_C_SOURCE=200809L -DDISTRO_BUILDING=1 "-DDISTRO_VERSION=\"${PROJECT_VERSION}\""
            -I${PROJECT_SOURCE_DIR}/include -I${src} ${DISTRO_WARN})
  set(common ${src}/compress/wire.c ${src}/compress/frame.c ${src}/compress/value_codec.c ${src}/compress/chunk.c
             ${src}/compress/codec_fault.c ${src}/common/crc32c.c ${src}/common/error.c)
  distro_fuzz_target(fuzz_wire FUZZ_WIRE_SEED_MAIN ${common})
  distro_fuzz_target(fuzz_wire2 FUZZ_WIRE2_SEED_MAIN ${common} ${src}/compress/wire2.c
                     ${src}/compress/index_codec.c)
  distro_fuzz_target(fuzz_outer_sparse FUZZ_OUTER_SPARSE_SEED_MAIN ${common} ${src}/compress/outer_sparse.c
                     ${src}/compress/outer_codec.c ${src}/compress/index_codec.c)
endfunction()

distro_fuzz_setup()
