# install_consumer: `cmake --install` this build tree into a temporary prefix
# and build tests/install/consumer.c against it with pkg-config and with
# find_package(distro). See tests/install/run.sh.
find_program(DISTRO_BASH bash)
find_program(DISTRO_PKG_CONFIG NAMES pkg-config pkgconf)
if(DISTRO_BASH AND DISTRO_PKG_CONFIG)
  add_test(NAME install_consumer
           COMMAND ${DISTRO_BASH} ${CMAKE_CURRENT_SOURCE_DIR}/install/run.sh
                   ${CMAKE_BINARY_DIR} ${CMAKE_C_COMPILER} ${CMAKE_COMMAND})
  set_tests_properties(install_consumer PROPERTIES TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=2")
else()
  message(STATUS "install_consumer test skipped: needs bash and pkg-config")
endif()
