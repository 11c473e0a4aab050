# Decoupled DiLoCo runtime (issue 7): src/sync/ in the library, the
# distro-syncer service, the learner side (include/distro/sync.h).
# Included from the top-level CMakeLists.txt after the library targets.
#
# libzmq is linked by its library path (not an imported target) so that the
# installed package (cmake/install.cmake) needs nothing new to re-create.
pkg_check_modules(ZMQ libzmq)
if(NOT ZMQ_FOUND)
  message(STATUS "libzmq not found (apt-get install libzmq3-dev): the syncer and <distro/sync.h> are not built")
  set(DISTRO_WITH_SYNC OFF)
  return()
endif()
set(DISTRO_WITH_SYNC ON)
message(STATUS "Decoupled DiLoCo syncer: libzmq ${ZMQ_VERSION}")

file(GLOB DISTRO_SYNC_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/sync/*.c)
target_sources(distro_obj PRIVATE ${DISTRO_SYNC_SOURCES})
target_include_directories(distro_obj PRIVATE ${ZMQ_INCLUDE_DIRS})
target_link_libraries(distro PRIVATE ${ZMQ_LINK_LIBRARIES})
target_link_libraries(distro_static INTERFACE ${ZMQ_LINK_LIBRARIES})
foreach(t distro_obj distro distro_static)
  target_compile_definitions(${t} PUBLIC DISTRO_WITH_SYNC=1)
endforeach()

add_executable(distro-syncer ${CMAKE_CURRENT_SOURCE_DIR}/tools/distro-syncer.c)
target_link_libraries(distro-syncer PRIVATE distro m)
target_compile_options(distro-syncer PRIVATE ${DISTRO_WARN})
target_compile_definitions(distro-syncer PRIVATE _POSIX_C_SOURCE=200809L)
install(TARGETS distro-syncer RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT distro_runtime)
