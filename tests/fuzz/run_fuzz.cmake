# Runs one libFuzzer target for a bounded time on a fresh corpus seeded by
# its seed writer. Fails (non-zero exit) if the fuzzer finds a crash, a leak,
# a sanitizer report or an oracle violation; the offending input is kept as
# ${WORK}/crash-* (or leak-*, timeout-*), reproducible with `FUZZER <file>`.
#
#   cmake -DFUZZER=... -DSEEDS=... -DWORK=... -DSECONDS=... -DRUNS=... -P run_fuzz.cmake
foreach(v FUZZER SEEDS WORK SECONDS RUNS)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_fuzz.cmake: -D${v}= is required")
  endif()
endforeach()

file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/corpus ${WORK}/seeds)
execute_process(COMMAND ${SEEDS} ${WORK}/seeds RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "seed writer failed: ${rc}")
endif()
file(GLOB seeds ${WORK}/seeds/*)
list(LENGTH seeds nseeds)
message(STATUS "fuzzing ${FUZZER} for at most ${SECONDS} s / ${RUNS} runs from ${nseeds} seeds")

# New inputs go to corpus/ (the first directory); seeds/ is read only.
execute_process(
  COMMAND ${FUZZER} -max_total_time=${SECONDS} -runs=${RUNS} -timeout=10 -rss_limit_mb=2048
          -max_len=4096 -print_final_stats=1 -artifact_prefix=${WORK}/
          ${WORK}/corpus ${WORK}/seeds
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  file(GLOB artifacts ${WORK}/crash-* ${WORK}/leak-* ${WORK}/timeout-* ${WORK}/oom-*)
  message(FATAL_ERROR "fuzzer failed (exit ${rc}); reproduce with: ${FUZZER} ${artifacts}")
endif()
