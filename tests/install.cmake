# cmake -P script (tests/CMakeLists.txt registers it as install_relocated): the installed `attnref`
# runs from its prefix alone. Installs the build into a staging prefix, moves the prefix to a new
# directory under the system's temporary directory (so neither the install path nor the build tree
# is where the program looks), and there:
#   1. checks that the installed program holds no path of the source or build tree;
#   2. runs `attnref list`, `attnref generate --case sdpa_basic --verify` and a small `attnref study`
#      with the source and build trees hidden (tmpfs mounted over them in a private user and mount
#      namespace, unshare -r -m; where unshare is not allowed the step says so and runs them plainly,
#      the other checks still prove the lookup);
#   3. appends a byte to the moved prefix's golden/sdpa_basic/output.npy: `generate --verify` must
#      now fail (exit 1) naming the moved prefix — the suite it verified is the installed one.
# Arguments: -DSOURCE_DIR -DBINARY_DIR.
string(RANDOM LENGTH 10 _r)
set(root /tmp/attnref-install-test-${_r})
set(stage ${root}/stage)
set(prefix ${root}/moved/prefix)
file(REMOVE_RECURSE ${root})
file(MAKE_DIRECTORY ${root})

function(run)
  cmake_parse_arguments(PARSE_ARGV 0 _a "" "EXPECT;OUTPUT" "COMMAND")
  execute_process(COMMAND ${_a_COMMAND} WORKING_DIRECTORY ${root} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT DEFINED _a_EXPECT)
    set(_a_EXPECT 0)
  endif()
  if(NOT rc EQUAL _a_EXPECT)
    message(FATAL_ERROR "expected exit ${_a_EXPECT}, got ${rc}: ${_a_COMMAND}\nstdout:\n${out}\nstderr:\n${err}")
  endif()
  if(_a_OUTPUT)
    set(${_a_OUTPUT} "${out}${err}" PARENT_SCOPE)
  endif()
endfunction()

run(COMMAND ${CMAKE_COMMAND} --install ${BINARY_DIR} --prefix ${stage})
file(MAKE_DIRECTORY ${root}/moved)
file(RENAME ${stage} ${prefix})
set(exe ${prefix}/bin/attnref)
foreach(f ${exe} ${prefix}/share/attnref/golden/suite.json ${prefix}/share/attnref/golden/sdpa_basic/manifest.json
          ${prefix}/share/attnref/tools/plot_study.py ${prefix}/include/attnref/golden/check.hpp)
  if(NOT EXISTS ${f})
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()

# 1. No compiled-in path of the build machine's trees.
foreach(tree ${SOURCE_DIR} ${BINARY_DIR})
  file(STRINGS ${exe} hits REGEX "${tree}")
  if(hits)
    message(FATAL_ERROR "the installed attnref holds a path of ${tree}: ${hits}")
  endif()
endforeach()

# 2. The three commands from the moved prefix, the trees out of reach.
set(hide "")
execute_process(COMMAND unshare -r -m true RESULT_VARIABLE unshare_rc OUTPUT_QUIET ERROR_QUIET)
if(unshare_rc EQUAL 0)
  # Paths travel as positional arguments ($1, $2), never inside the script text.
  set(hide unshare -r -m sh -c "mount -t tmpfs none \"$1\" && mount -t tmpfs none \"$2\" && shift 2 && test ! -e \"$0\" && exec \"$@\""
      ${SOURCE_DIR}/CMakeLists.txt ${BINARY_DIR} ${SOURCE_DIR})
  message(STATUS "source tree ${SOURCE_DIR} and build tree ${BINARY_DIR} hidden under tmpfs (unshare -r -m)")
else()
  message(STATUS "unshare -r -m not permitted here: the commands run with the trees in place (checks 1 and 3 still apply)")
endif()
run(COMMAND ${hide} ${exe} list OUTPUT out)
if(NOT out MATCHES "sdpa_basic" OR NOT out MATCHES "mha_seed_example")
  message(FATAL_ERROR "attnref list from ${prefix} did not list the suite:\n${out}")
endif()
run(COMMAND ${hide} ${exe} generate --case sdpa_basic --verify --quiet OUTPUT out)
if(NOT out MATCHES "identical")
  message(FATAL_ERROR "generate --verify did not report the case identical:\n${out}")
endif()
run(COMMAND ${hide} ${exe} study --out ${root}/study --policy float32 --seq 16 --head-dim 8 --seeds 1 --queries 2 --threads 1 OUTPUT out)
if(NOT EXISTS ${root}/study/study.csv OR NOT out MATCHES "${prefix}/share/attnref/tools/plot_study.py|plots: ")
  message(FATAL_ERROR "study from ${prefix} wrote no study.csv or did not use the installed plot script:\n${out}")
endif()

# 3. The suite it verifies is the moved prefix's: one byte appended there makes --verify fail.
file(APPEND ${prefix}/share/attnref/golden/sdpa_basic/output.npy "x")
run(COMMAND ${hide} ${exe} generate --case sdpa_basic --verify --quiet EXPECT 1 OUTPUT out)
if(NOT out MATCHES "${prefix}/share/attnref/golden/sdpa_basic")
  message(FATAL_ERROR "generate --verify failed without naming the moved prefix's case:\n${out}")
endif()
file(REMOVE_RECURSE ${root})
message(STATUS "the relocated install found its suite and plot script in ${prefix}")
