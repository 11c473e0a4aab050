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
