# python_package: the Python package (python/) installed with pip into a
# venv against this build tree's `cmake --install`, tested against the C
# library (python/tests/run.sh). Skipped (exit 77) where PyTorch is absent.
find_program(DISTRO_BASH_PY bash)
find_program(DISTRO_PKG_CONFIG_PY NAMES pkg-config pkgconf)
if(DISTRO_BASH_PY AND DISTRO_PKG_CONFIG_PY)
  add_test(NAME python_package
           COMMAND ${DISTRO_BASH_PY} ${CMAKE_SOURCE_DIR}/python/tests/run.sh
                   ${CMAKE_BINARY_DIR} ${CMAKE_C_COMPILER} ${CMAKE_COMMAND})
  set_tests_properties(python_package PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77 ENVIRONMENT "OMP_NUM_THREADS=1")
else()
  message(STATUS "python_package test skipped: needs bash and pkg-config")
endif()
