# The update every rank applies must not depend on which OpenBLAS kernels its
# CPU gets (OpenBLAS picks them per CPU model; they round differently): a few
# steps of DeMo, DisTrO-AdamW, DiLoCo and SparseLoCo (with and without the
# DCT) give the same parameter checksums under OPENBLAS_CORETYPE=Prescott and
# under every FMA family this CPU runs (support/compare_coretypes.cmake).
add_executable(step_checksum ${CMAKE_CURRENT_SOURCE_DIR}/support/step_checksum.c)
target_link_libraries(step_checksum PRIVATE distro_static Threads::Threads)
target_compile_options(step_checksum PRIVATE ${DISTRO_WARN})
add_test(NAME blas_kernels
         COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:step_checksum>
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/support/compare_coretypes.cmake)
set_tests_properties(blas_kernels PROPERTIES TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=2"
                     SKIP_REGULAR_EXPRESSION "SKIPPED:")
