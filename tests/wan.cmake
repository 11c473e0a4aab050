# wan_link: two MPI ranks of gpt-train in network namespaces on 10 Mbit/s
# tbf links (bench/wan/wan-test.sh): kernel-counted bytes within [1.0, 1.15]x
# the library's count, and a 1 MB exchange at 10 Mbit/s takes >= 0.8 s.
# Skipped (exit 77) where namespaces are not permitted. It installs the build
# tree into BUILD/prefix and builds its probe there with mpicc, as an
# outside program would link the library.
find_program(DISTRO_BASH bash)
find_program(DISTRO_MPICC NAMES mpicc)
if(DISTRO_WITH_MPI AND MPIEXEC_EXECUTABLE AND DISTRO_BASH AND DISTRO_MPICC AND DISTRO_EXAMPLES
   AND EXISTS ${PROJECT_SOURCE_DIR}/python-free-examples/gpt)
  add_test(NAME wan_link COMMAND ${DISTRO_BASH} ${PROJECT_SOURCE_DIR}/bench/wan/wan-test.sh ${CMAKE_BINARY_DIR})
  set_tests_properties(wan_link PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77 LABELS wan)
else()
  message(STATUS "wan_link test not registered: needs MPI, mpicc, bash and the gpt-train example")
endif()
