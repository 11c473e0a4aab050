# Decoupled DiLoCo runtime tests (tests/test_sync_*.c are registered by the
# test_*.c glob in CMakeLists.txt). Here: the learner process they start,
# and its path for test_sync_cluster. Without libzmq the suites skip.
if(DISTRO_WITH_SYNC)
  add_executable(sync_test_learner ${CMAKE_CURRENT_SOURCE_DIR}/support/sync_learner.c)
  target_link_libraries(sync_test_learner PRIVATE distro m)
  target_compile_options(sync_test_learner PRIVATE ${DISTRO_WARN})
  foreach(t test_sync_cluster)
    if(TARGET ${t})
      add_dependencies(${t} sync_test_learner distro-syncer)
      target_compile_definitions(${t} PRIVATE SYNC_LEARNER_BIN="$<TARGET_FILE:sync_test_learner>"
                                             SYNC_SYNCER_BIN="$<TARGET_FILE:distro-syncer>")
      set_tests_properties(${t} PROPERTIES TIMEOUT 240)
    endif()
  endforeach()
endif()
# Suites that use the shared harness (syncer on a thread, learners on threads).
if(DISTRO_WITH_SYNC)
  foreach(t test_sync_tokens test_sync_badinput test_sync_cluster test_sync_curve test_sync_dp)
    if(TARGET ${t})
      target_sources(${t} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/support/sync_harness.c)
      set_tests_properties(${t} PROPERTIES TIMEOUT 240)
    endif()
  endforeach()
endif()
# The GPT trainer's decoupled mode runs against a distro-syncer process.
if(DISTRO_WITH_SYNC AND TARGET test_gpt_train AND GPT_TESTS_ENABLED) # set by tests/gpt.cmake (included first)
  add_dependencies(test_gpt_train distro-syncer)
  target_compile_definitions(test_gpt_train PRIVATE SYNC_SYNCER_BIN="$<TARGET_FILE:distro-syncer>")
endif()
