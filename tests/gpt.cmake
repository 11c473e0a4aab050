# Tests of the GPT example (python-free-examples/gpt): the test_gpt*.c suites
# built by tests/CMakeLists.txt get the model library or the trainer's path.
set(GPT_TESTS_ENABLED OFF)
if(DISTRO_EXAMPLES AND EXISTS ${PROJECT_SOURCE_DIR}/python-free-examples/CMakeLists.txt)
  set(GPT_TESTS_ENABLED ON)
endif()

if(TARGET test_gpt_gradcheck)
  if(GPT_TESTS_ENABLED)
    target_link_libraries(test_gpt_gradcheck PRIVATE gpt_model_f64)
  else()
    set_target_properties(test_gpt_gradcheck PROPERTIES EXCLUDE_FROM_ALL TRUE)
    set_tests_properties(test_gpt_gradcheck PROPERTIES DISABLED TRUE)
  endif()
endif()

# The trainer's global clip (clip.c) against a float64 reference.
if(TARGET test_gpt_clip)
  if(GPT_TESTS_ENABLED)
    target_sources(test_gpt_clip PRIVATE ${PROJECT_SOURCE_DIR}/python-free-examples/gpt/clip.c)
    target_link_libraries(test_gpt_clip PRIVATE gpt_model)
  else()
    set_target_properties(test_gpt_clip PROPERTIES EXCLUDE_FROM_ALL TRUE)
    set_tests_properties(test_gpt_clip PROPERTIES DISABLED TRUE)
  endif()
endif()

# End-to-end runs of the trainer binary: what it does, and what it refuses.
foreach(suite test_gpt_train test_gpt_errors)
  if(TARGET ${suite})
    if(GPT_TESTS_ENABLED)
      target_compile_definitions(${suite} PRIVATE GPT_TRAIN="$<TARGET_FILE:gpt-train>")
      add_dependencies(${suite} gpt-train)
    else()
      set_target_properties(${suite} PROPERTIES EXCLUDE_FROM_ALL TRUE)
      set_tests_properties(${suite} PROPERTIES DISABLED TRUE)
    endif()
  endif()
endforeach()

# The trainer under mpirun against in-process ranks (MPI builds only; without
# MPI the suite compiles to one skipped test).
if(TARGET test_gpt_mpi)
  if(GPT_TESTS_ENABLED AND DISTRO_WITH_MPI AND MPIEXEC_EXECUTABLE)
    target_compile_definitions(test_gpt_mpi PRIVATE GPT_TRAIN="$<TARGET_FILE:gpt-train>"
                                                    MPIEXEC="${MPIEXEC_EXECUTABLE}")
    add_dependencies(test_gpt_mpi gpt-train)
  endif()
endif()
