# cmake -DA=trainer -DB=trainer -DOPT=optimizer -P compare_checksum.cmake
# Runs both trainers for 12 steps with the same flags and fails unless they
# print the same parameter checksum.
set(flags --optim ${OPT} --steps 12 --eval-every 0 --eval-batches 2 --print-every 100 --checksum)
foreach(which A B)
  execute_process(COMMAND ${${which}} ${flags} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${${which}} failed (${rc}):\n${out}\n${err}")
  endif()
  string(REGEX MATCH "checksum[^\n]*" line_${which} "${out}")
  if(line_${which} STREQUAL "")
    message(FATAL_ERROR "${${which}} printed no checksum:\n${out}")
  endif()
endforeach()
message(STATUS "default:  ${line_A}")
message(STATUS "portable: ${line_B}")
if(NOT line_A STREQUAL line_B)
  message(FATAL_ERROR "${OPT}: the default library and the portable one differ after 12 steps")
endif()
