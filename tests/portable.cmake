# The per-CPU kernels (target_clones for AVX-512/AVX2, the AVX-512 top-k
# gather) must round exactly like the baseline x86-64 code: 12 trainer steps
# of distro and distro-adamw give the same parameter checksum with the
# default library and with the portable one (DISTRO_PORTABLE), on whatever
# CPU the tests run.
if(TARGET distro_portable_static AND DISTRO_EXAMPLES AND EXISTS ${PROJECT_SOURCE_DIR}/python-free-examples/gpt/CMakeLists.txt)
  foreach(opt distro distro-adamw)
    add_test(NAME portable_${opt}
             COMMAND ${CMAKE_COMMAND} -DA=$<TARGET_FILE:gpt-train> -DB=$<TARGET_FILE:gpt-train-portable>
                     -DOPT=${opt} -P ${CMAKE_CURRENT_SOURCE_DIR}/support/compare_checksum.cmake)
    set_tests_properties(portable_${opt} PROPERTIES TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=2")
  endforeach()
endif()
