# test_goodput compiles the goodput simulator core (bench/goodput) into itself,
# so it builds whether or not the benchmarks are enabled.
if(TARGET test_goodput)
  target_sources(test_goodput PRIVATE ${PROJECT_SOURCE_DIR}/bench/goodput/goodput_sim.c)
  target_include_directories(test_goodput PRIVATE ${PROJECT_SOURCE_DIR}/bench/goodput)
endif()
