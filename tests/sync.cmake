# Decoupled DiLoCo runtime tests (tests/test_sync_*.c are registered by the
# test_*.c glob in CMakeLists.txt). Here: the learner process they start,
# and its path for test_sync_cluster. Without libzmq the suites skip.
if(DISTRO_WITH_SYNC)
  add_executable(sync_test_learner ${CMAKE_CURRENT_SOURCE_DIR}/support/sync_learner.c)
  target_link_libraries(sync_test_learner PRIVATE distro m)
  target_compile_options(sync_test_learner PRIVATE ${DISTRO_WARN})
  foreach(t test_sync_cluster test_sync_liveness test_sync_attack)
    if(TARGET ${t})
      add_dependencies(${t} sync_test_learner distro-syncer)
      target_sources(${t} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/support/sync_proc.c
                                  ${CMAKE_CURRENT_SOURCE_DIR}/support/sync_rogue.c)
      target_compile_definitions(${t} PRIVATE SYNC_LEARNER_BIN="$<TARGET_FILE:sync_test_learner>"
                                             SYNC_SYNCER_BIN="$<TARGET_FILE:distro-syncer>")
      set_tests_properties(${t} PROPERTIES TIMEOUT 240)
    endif()
  endforeach()
endif()
# Suites that use the shared harness (syncer on a thread, learners on threads).
if(DISTRO_WITH_SYNC)
  foreach(t test_sync_hostile test_sync_badinput test_sync_cluster test_sync_curve test_sync_dp test_sync_liveness
            test_sync_attack test_sync_files test_sync_fuzz test_sync_claims)
    if(TARGET ${t})
      target_sources(${t} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/support/sync_harness.c)
      if(t STREQUAL "test_sync_curve")
        target_sources(${t} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/support/sync_rogue.c)
      endif()
      set_tests_properties(${t} PROPERTIES TIMEOUT 240)
    endif()
  endforeach()
endif()
# test_sync_hostile's hostile learner uses the attacks of gpt-train-hostile.
if(DISTRO_WITH_SYNC AND TARGET test_sync_hostile)
  set(_dec ${PROJECT_SOURCE_DIR}/python-free-examples/decoupled)
  target_sources(test_sync_hostile PRIVATE ${_dec}/attacks.c)
  target_include_directories(test_sync_hostile PRIVATE ${_dec})
endif()
# The GPT trainer's decoupled mode runs against a distro-syncer process.
if(DISTRO_WITH_SYNC AND TARGET test_gpt_train AND GPT_TESTS_ENABLED) # set by tests/gpt.cmake (included first)
  add_dependencies(test_gpt_train distro-syncer)
  target_compile_definitions(test_gpt_train PRIVATE SYNC_SYNCER_BIN="$<TARGET_FILE:distro-syncer>")
endif()
# test_sync_layout compiles the layout, message parsers and fragmenting
# into itself with UBSan (signed overflow, shifts, bounds; any report aborts
# the test), so hostile sizes are checked for undefined behaviour, not only
# for the status they return.
if(DISTRO_WITH_SYNC AND TARGET test_sync_layout)
  set(_src ${PROJECT_SOURCE_DIR}/src)
  target_sources(test_sync_layout PRIVATE ${_src}/sync/layout.c ${_src}/sync/protocol.c ${_src}/optim/fragment.c
                                          ${_src}/compress/outer_codec.c ${_src}/common/sha256.c)
  target_include_directories(test_sync_layout PRIVATE ${ZMQ_INCLUDE_DIRS})
  target_compile_definitions(test_sync_layout PRIVATE DISTRO_BUILDING=1)
  target_compile_options(test_sync_layout PRIVATE -fsanitize=undefined -fno-sanitize-recover=undefined)
  target_link_options(test_sync_layout PRIVATE -fsanitize=undefined)
endif()
# test_sync_fuzz compiles the whole Decoupled DiLoCo runtime (syncer and
# learner, the code they use from common/, compress/, optim/ and comm/) into
# itself with ASan and UBSan: a memory error, undefined behaviour or a leak
# at shutdown under hostile clients fails it.
if(DISTRO_WITH_SYNC AND TARGET test_sync_fuzz)
  set(_src ${PROJECT_SOURCE_DIR}/src)
  file(GLOB _fuzz_sources ${_src}/sync/*.c ${_src}/common/*.c)
  target_sources(test_sync_fuzz PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/support/sync_rogue.c ${_fuzz_sources} ${_src}/optim/fragment.c ${_src}/optim/outer_merge.c
                                        ${_src}/compress/outer_codec.c ${_src}/comm/comm.c ${_src}/comm/comm_local.c)
  target_include_directories(test_sync_fuzz PRIVATE ${ZMQ_INCLUDE_DIRS})
  target_compile_definitions(test_sync_fuzz PRIVATE DISTRO_BUILDING=1 DISTRO_VERSION="${PROJECT_VERSION}")
  target_compile_options(test_sync_fuzz PRIVATE -fsanitize=address,undefined -fno-sanitize-recover=undefined
                                                -fno-omit-frame-pointer)
  target_link_options(test_sync_fuzz PRIVATE -fsanitize=address,undefined)
  # Each fuzz run is bounded (DISTRO_SYNC_FUZZ_SECONDS, 12 s by default, 60 at most).
  set_tests_properties(test_sync_fuzz PROPERTIES TIMEOUT 200 ENVIRONMENT "OMP_NUM_THREADS=2;ASAN_OPTIONS=detect_leaks=1")
endif()
# test_sync_tools runs every tool's --help.
if(TARGET test_sync_tools)
  add_dependencies(test_sync_tools distro-demo distro-bench)
  target_compile_definitions(test_sync_tools PRIVATE TOOL_DEMO_BIN="$<TARGET_FILE:distro-demo>"
                                                     TOOL_BENCH_BIN="$<TARGET_FILE:distro-bench>")
  if(DISTRO_WITH_SYNC)
    add_dependencies(test_sync_tools distro-syncer)
    target_compile_definitions(test_sync_tools PRIVATE SYNC_SYNCER_BIN="$<TARGET_FILE:distro-syncer>")
  endif()
endif()
