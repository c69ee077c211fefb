# cmake -P script (tests/core.cmake registers it): builds tests/fp_environment/consumer.cpp the way a
# project that includes attnref's headers directly would, without attnref's CMake target:
#   reference: -O2 -ffp-contract=off            (the flags attnref::attnref adds)
#   hostile:   -O2 -march=x86-64-v3 -ffp-contract=fast   (GCC's default contraction, FMA target)
# The hostile build must either refuse at run time with a message naming -ffp-contract=off, or print
# exactly the reference build's bits. The reference build run with FE_UPWARD must refuse, naming
# FE_TONEAREST. Arguments: -DSOURCE_DIR -DBINARY_DIR -DCXX.
set(dir ${BINARY_DIR}/fp_environment)
file(MAKE_DIRECTORY ${dir})
set(src ${SOURCE_DIR}/tests/fp_environment/consumer.cpp)
function(build name)
  execute_process(COMMAND ${CXX} -std=c++20 ${ARGN} -I${SOURCE_DIR}/include ${src} -o ${dir}/${name}
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "building the ${name} consumer failed: ${err}")
  endif()
endfunction()
build(reference -O2 -ffp-contract=off)
build(hostile -O2 -march=x86-64-v3 -ffp-contract=fast)

execute_process(COMMAND ${dir}/reference RESULT_VARIABLE rc OUTPUT_VARIABLE ref)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the reference consumer failed (${rc}): ${ref}")
endif()
execute_process(COMMAND ${dir}/hostile RESULT_VARIABLE rc OUTPUT_VARIABLE out)
if(rc EQUAL 3)
  if(NOT out MATCHES "refused: .*-ffp-contract=off")
    message(FATAL_ERROR "the hostile consumer refused without naming -ffp-contract=off: ${out}")
  endif()
  message(STATUS "hostile build (-march=x86-64-v3 -ffp-contract=fast) refused: ${out}")
elseif(rc EQUAL 0)
  if(NOT out STREQUAL ref)
    message(FATAL_ERROR "the hostile consumer computed different bits without refusing:\n${out}\nreference:\n${ref}")
  endif()
  message(STATUS "hostile build computed the reference bits")
else()
  message(FATAL_ERROR "the hostile consumer failed (${rc}): ${out}")
endif()

execute_process(COMMAND ${dir}/reference upward RESULT_VARIABLE rc OUTPUT_VARIABLE out)
if(NOT rc EQUAL 3 OR NOT out MATCHES "refused: .*FE_TONEAREST")
  message(FATAL_ERROR "the consumer under FE_UPWARD did not refuse naming FE_TONEAREST (${rc}): ${out}")
endif()
message(STATUS "FE_UPWARD refused: ${out}")
