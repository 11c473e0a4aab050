# ctest example_replace_adamw_readme: README.md must quote the current
# `diff -u train_adamw.c train_distro.c` (without its two header lines).
# Usage: cmake -DDIR=<this directory> -P check_readme.cmake
execute_process(COMMAND diff -u train_adamw.c train_distro.c WORKING_DIRECTORY ${DIR}
                OUTPUT_VARIABLE d RESULT_VARIABLE rc)
if(NOT rc EQUAL 1)
  message(FATAL_ERROR "diff failed (exit ${rc})")
endif()
string(REGEX REPLACE "^---[^\n]*\n\\+\\+\\+[^\n]*\n" "" d "${d}")
file(READ ${DIR}/README.md readme)
string(FIND "${readme}" "```diff\n${d}```" pos)
if(pos EQUAL -1)
  message(FATAL_ERROR "README.md does not quote the current diff of train_adamw.c and train_distro.c; "
                      "replace the diff block with the output of `diff -u train_adamw.c train_distro.c | tail -n +3`")
endif()
