# Installs attnref into the build tree, then configures and builds two find_package(attnref)
# consumers against it and runs them: examples/consumer (header-only library) and examples/gate
# (component golden: Boost.Test and GoogleTest gates of the installed golden/mha_seed_example).
# Unoptimised builds: what is tested is that a consumer compiles, links and gates, and -O0 compiles
# the two gate programs in a fraction of the optimised time (CI budget).
set(prefix ${BINARY_DIR}/consumer-prefix)
set(build ${BINARY_DIR}/consumer-build)
set(gate ${BINARY_DIR}/gate-build)
file(REMOVE_RECURSE ${prefix} ${build} ${gate})
foreach(step
    "${CMAKE_COMMAND};--install;${BINARY_DIR};--prefix;${prefix}"
    "${CMAKE_COMMAND};-S;${SOURCE_DIR}/examples/consumer;-B;${build};-G;Ninja;-DCMAKE_CXX_COMPILER=${CXX};-DCMAKE_PREFIX_PATH=${prefix}"
    "${CMAKE_COMMAND};--build;${build}"
    "${build}/consumer"
    "${CMAKE_COMMAND};-S;${SOURCE_DIR}/examples/gate;-B;${gate};-G;Ninja;-DCMAKE_CXX_COMPILER=${CXX};-DCMAKE_PREFIX_PATH=${prefix}"
    "${CMAKE_COMMAND};--build;${gate}"
    "${gate}/boost_test_gate;--log_level=message"
    "${gate}/gtest_gate")
  execute_process(COMMAND ${step} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer project step failed (${rc}): ${step}")
  endif()
endforeach()
