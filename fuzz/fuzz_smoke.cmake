# Builds one libFuzzer target with clang++ and runs it over a copy of its seed corpus.
# Invoked by add_test (fuzz/CMakeLists.txt) as
#   cmake -DCLANGXX=... -DSOURCE=x.fuzz.cpp -DCORPUS=dir -DWORK_DIR=dir -DINCLUDE_DIR=dir
#         -DSECONDS=20 [-DEXTRA_FLAGS=a|b] [-DDICT=x.dict] [-DMAX_LEN=bytes] -P fuzz_smoke.cmake
# Fails on a compile error, a crash, a sanitizer report or a timeout. Prints ATTNREF_FUZZ_SKIPPED
# (which the test treats as "skipped") when clang++ or libFuzzer is unavailable.

if(NOT SECONDS)
  set(SECONDS 20)
endif()
string(REPLACE "|" ";" extra_flags "${EXTRA_FLAGS}")
set(flags -std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
          -fno-sanitize-recover=all -Wall -Wextra -Wpedantic -I ${INCLUDE_DIR} ${extra_flags})

if(NOT CLANGXX OR NOT EXISTS "${CLANGXX}")
  message("ATTNREF_FUZZ_SKIPPED: clang++ not found")
  return()
endif()

file(MAKE_DIRECTORY ${WORK_DIR})
# Probe: can this clang++ link a trivial fuzzer? (libclang-rt-dev provides libFuzzer.)
file(WRITE ${WORK_DIR}/probe.cpp
  "#include <cstddef>\n#include <cstdint>\n"
  "extern \"C\" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }\n")
execute_process(COMMAND ${CLANGXX} -fsanitize=fuzzer,address,undefined ${WORK_DIR}/probe.cpp -o ${WORK_DIR}/probe
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message("ATTNREF_FUZZ_SKIPPED: ${CLANGXX} cannot link with -fsanitize=fuzzer:\n${out}")
  return()
endif()

get_filename_component(name ${SOURCE} NAME_WE)
set(fuzzer ${WORK_DIR}/${name}.fuzzer)
execute_process(COMMAND ${CLANGXX} ${flags} ${SOURCE} -o ${fuzzer} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building ${SOURCE} with ${CLANGXX} failed (${rc})")
endif()

# libFuzzer adds what it finds to the corpus directory: give it a copy, never the committed one.
set(corpus ${WORK_DIR}/corpus)
file(REMOVE_RECURSE ${corpus} ${WORK_DIR}/artifacts)
file(MAKE_DIRECTORY ${WORK_DIR}/artifacts)
file(COPY ${CORPUS}/ DESTINATION ${corpus})
file(GLOB seeds ${corpus}/*)
list(LENGTH seeds seed_count)
if(seed_count EQUAL 0)
  message(FATAL_ERROR "empty seed corpus ${CORPUS}")
endif()
set(options)
if(DICT)
  list(APPEND options -dict=${DICT})
endif()
if(MAX_LEN)
  list(APPEND options -max_len=${MAX_LEN})
endif()
message("fuzzing ${name} for ${SECONDS} s from ${seed_count} seeds")
execute_process(COMMAND ${fuzzer} -max_total_time=${SECONDS} -timeout=10 -rss_limit_mb=2048 ${options}
                        -print_final_stats=1 -artifact_prefix=${WORK_DIR}/artifacts/ ${corpus}
  WORKING_DIRECTORY ${WORK_DIR} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "fuzzer ${name} failed (${rc}); reproducer in ${WORK_DIR}/artifacts/")
endif()
