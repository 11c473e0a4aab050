# The MPI communicator runs under mpirun as a plain program (not Criterion):
# three ranks, one process each. Only built when the library has MPI.
if(DISTRO_WITH_MPI)
  add_executable(test_comm_mpi ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_comm_mpi.c
                               ${CMAKE_CURRENT_SOURCE_DIR}/support/testutil.c)
  target_include_directories(test_comm_mpi PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/support)
  target_link_libraries(test_comm_mpi PRIVATE distro_internal MPI::MPI_C m)
  target_compile_options(test_comm_mpi PRIVATE ${DISTRO_WARN})
  # --allow-run-as-root: CI containers run as root; --oversubscribe: 3 ranks
  # on machines with fewer cores.
  add_test(NAME test_comm_mpi
           COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe
                   ${MPIEXEC_NUMPROC_FLAG} 3 ${MPIEXEC_PREFLAGS}
                   $<TARGET_FILE:test_comm_mpi> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(test_comm_mpi PROPERTIES TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=1")
  # The same program initialized without MPI_THREAD_MULTIPLE: overlap refuses.
  add_test(NAME test_comm_mpi_serialized
           COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe
                   ${MPIEXEC_NUMPROC_FLAG} 2 ${MPIEXEC_PREFLAGS}
                   $<TARGET_FILE:test_comm_mpi> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(test_comm_mpi_serialized PROPERTIES TIMEOUT 120
                       ENVIRONMENT "OMP_NUM_THREADS=1;DISTRO_TEST_MPI_THREAD=serialized")
endif()
