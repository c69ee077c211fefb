# cmake -P script (tests/CMakeLists.txt registers it as install_relocated): the installed `attnref`
# runs from its prefix alone. Installs the build into a staging prefix, moves the prefix to a new
# directory under the system's temporary directory (so neither the install path nor the build tree
# is where the program looks), and there:
#   1. checks that the installed program holds no path of the source or build tree;
#   2. runs `attnref list`, `attnref generate --case sdpa_basic --verify` and a small `attnref study`
#      with the source and build trees hidden (tmpfs mounted over them in a private user and mount
#      namespace, unshare -r -m; where unshare is not allowed the step says so and runs them plainly,
#      the other checks still prove the lookup);
#   3. the suite lookup (docs/cli.md, "Where the suite is"), from directories outside both trees,
#      for `attnref list` and for the installed Python package (attnref.suite_dir, load_case by
#      name, suite_cases): the installed suite from an empty directory; ./golden over the installed
#      suite; $ATTNREF_SUITE over ./golden; --suite over $ATTNREF_SUITE; a $ATTNREF_SUITE without
#      suite.json is an error naming it (exit 2; Python FileNotFoundError), never a fallback;
#   4. appends a byte to the moved prefix's golden/sdpa_basic/output.npy: `generate --verify` must
#      now fail (exit 1) naming the moved prefix — the suite it verified is the installed one.
# Arguments: -DSOURCE_DIR -DBINARY_DIR.
string(RANDOM LENGTH 10 _r)
set(root /tmp/attnref-install-test-${_r})
set(stage ${root}/stage)
set(prefix ${root}/moved/prefix)
file(REMOVE_RECURSE ${root})
file(MAKE_DIRECTORY ${root})

function(run)
  cmake_parse_arguments(PARSE_ARGV 0 _a "" "EXPECT;OUTPUT;WORKDIR" "COMMAND")
  if(NOT _a_WORKDIR)
    set(_a_WORKDIR ${root})
  endif()
  execute_process(COMMAND ${_a_COMMAND} WORKING_DIRECTORY ${_a_WORKDIR} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
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
          ${prefix}/share/attnref/tools/plot_study.py ${prefix}/include/attnref/check/checker.hpp)
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
run(COMMAND ${hide} ${exe} generate --case sdpa_basic --verify OUTPUT out)
if(NOT out MATCHES "identical")
  message(FATAL_ERROR "generate --verify did not report the case identical:\n${out}")
endif()
run(COMMAND ${hide} ${exe} study --out ${root}/study --policy float32 --seq 16 --head-dim 8 --seeds 1 --queries 2 --threads 1 OUTPUT out)
if(NOT EXISTS ${root}/study/study.csv OR NOT out MATCHES "${prefix}/share/attnref/tools/plot_study.py|plots: ")
  message(FATAL_ERROR "study from ${prefix} wrote no study.csv or did not use the installed plot script:\n${out}")
endif()

# 3. The suite lookup. Two one-case suites: ${root}/env_suite (sdpa_basic) for $ATTNREF_SUITE and
# ${root}/cwd/golden (sdpa_gqa) for ./golden; ${root}/empty holds nothing.
set(share ${prefix}/share/attnref/golden)
file(READ ${share}/suite.json suite_text)
function(one_case_suite dir name)
  string(JSON n LENGTH "${suite_text}" cases)
  math(EXPR last "${n} - 1")
  foreach(i RANGE ${last})
    string(JSON case_name GET "${suite_text}" cases ${i} name)
    if(case_name STREQUAL name)
      string(JSON one GET "${suite_text}" cases ${i})
    endif()
  endforeach()
  string(JSON text SET "${suite_text}" cases "[${one}]")
  file(WRITE ${dir}/suite.json "${text}")
  file(COPY ${share}/${name} DESTINATION ${dir})
endfunction()
one_case_suite(${root}/env_suite sdpa_basic)
one_case_suite(${root}/cwd/golden sdpa_gqa)
file(MAKE_DIRECTORY ${root}/empty)
set(env ${CMAKE_COMMAND} -E env --unset=ATTNREF_SUITE)
set(env_set ${CMAKE_COMMAND} -E env ATTNREF_SUITE=${root}/env_suite)
function(expect_list label workdir want)
  cmake_parse_arguments(PARSE_ARGV 3 _l "" "" "NOT;COMMAND")
  run(COMMAND ${hide} ${_l_COMMAND} WORKDIR ${workdir} OUTPUT out)
  if(NOT out MATCHES "${want}")
    message(FATAL_ERROR "${label}: attnref list does not list ${want}:\n${out}")
  endif()
  foreach(n ${_l_NOT})
    if(out MATCHES "${n}")
      message(FATAL_ERROR "${label}: attnref list lists ${n} (another suite's case):\n${out}")
    endif()
  endforeach()
endfunction()
expect_list("installed suite" ${root}/empty "mha_seed_example" COMMAND ${env} ${exe} list)
expect_list("./golden" ${root}/cwd "sdpa_gqa" NOT "sdpa_basic" "mha_seed_example" COMMAND ${env} ${exe} list)
expect_list("$ATTNREF_SUITE" ${root}/cwd "sdpa_basic" NOT "sdpa_gqa" "mha_seed_example" COMMAND ${env_set} ${exe} list)
expect_list("--suite" ${root}/cwd "mha_seed_example" COMMAND ${env_set} ${exe} list --suite ${share}/suite.json)
run(COMMAND ${hide} ${CMAKE_COMMAND} -E env ATTNREF_SUITE=${root}/no_such_suite ${exe} list WORKDIR ${root}/cwd EXPECT 2 OUTPUT out)
if(NOT out MATCHES "${root}/no_such_suite/suite.json")
  message(FATAL_ERROR "a $ATTNREF_SUITE without suite.json: the error does not name it:\n${out}")
endif()

# The installed Python package (when the build has one): the same order. Paths travel as arguments.
file(GLOB py_dirs ${prefix}/lib/python3*/dist-packages)
if(py_dirs AND EXISTS /usr/bin/python3)
  list(GET py_dirs 0 py_dir)
  set(py ${CMAKE_COMMAND} -E env PYTHONPATH=${py_dir} PYTHONDONTWRITEBYTECODE=1)
  # argv: the suite directory expected, a case to load by name, the suite's case count, the package dir.
  set(probe [=[
import os, sys
import attnref
want, case, count = os.path.realpath(sys.argv[1]), sys.argv[2], int(sys.argv[3])
assert attnref.__file__.startswith(sys.argv[4]), attnref.__file__
got = attnref.suite_dir()
assert os.path.realpath(got) == want, (got, want)
c = attnref.load_case(case)
assert c.name == case and os.path.realpath(c.path) == os.path.join(want, case), c.path
names = attnref.suite_cases()
assert len(names) == count and case in names, names
backward, forward = attnref.suite_cases(gradients=True), attnref.suite_cases(gradients=False)
assert sorted(backward + forward) == sorted(names) and not set(backward) & set(forward), (backward, forward)
assert all("_bwd_" in n for n in backward), backward
print("suite", got, len(names), "cases")
]=])
  string(JSON n_installed LENGTH "${suite_text}" cases)
  run(COMMAND ${hide} ${py} --unset=ATTNREF_SUITE /usr/bin/python3 -c "${probe}" ${share} sdpa_gqa ${n_installed} ${py_dir}
      WORKDIR ${root}/empty)
  run(COMMAND ${hide} ${py} --unset=ATTNREF_SUITE /usr/bin/python3 -c "${probe}" ${root}/cwd/golden sdpa_gqa 1 ${py_dir}
      WORKDIR ${root}/cwd)
  run(COMMAND ${hide} ${py} ATTNREF_SUITE=${root}/env_suite /usr/bin/python3 -c "${probe}" ${root}/env_suite sdpa_basic 1 ${py_dir}
      WORKDIR ${root}/cwd)
  run(COMMAND ${hide} ${py} ATTNREF_SUITE=${root}/no_such_suite /usr/bin/python3 -c
      "import attnref, sys\ntry:\n    attnref.suite_dir()\nexcept FileNotFoundError as e:\n    sys.exit(0 if sys.argv[1] in str(e) else 3)\nsys.exit(4)"
      ${root}/no_such_suite WORKDIR ${root}/cwd)
  message(STATUS "the installed Python package found the same suites (${py_dir})")
else()
  message(STATUS "no Python package in the install (pybind11 not found): the Python lookup is not checked")
endif()

# 4. The suite it verifies is the moved prefix's: one byte appended there makes --verify fail.
file(APPEND ${prefix}/share/attnref/golden/sdpa_basic/output.npy "x")
run(COMMAND ${hide} ${exe} generate --case sdpa_basic --verify --quiet EXPECT 1 OUTPUT out)
if(NOT out MATCHES "${prefix}/share/attnref/golden/sdpa_basic")
  message(FATAL_ERROR "generate --verify failed without naming the moved prefix's case:\n${out}")
endif()
file(REMOVE_RECURSE ${root})
message(STATUS "the relocated install found its suite and plot script in ${prefix}")
