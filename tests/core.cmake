# CTest registrations owned by the core work (issue 9/10); included from tests/CMakeLists.txt.

# Floating-point environment (issue 9 §4): a consumer built with the headers directly and
# -march=x86-64-v3 -ffp-contract=fast must refuse (naming -ffp-contract=off) or compute the
# reference bits; under FE_UPWARD it must refuse.
add_test(NAME fp_environment_consumer
  COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR} -DBINARY_DIR=${CMAKE_CURRENT_BINARY_DIR}
          -DCXX=${CMAKE_CXX_COMPILER} -P ${CMAKE_CURRENT_SOURCE_DIR}/fp_environment_consumer.cmake)

# attnref::math exhaustively over all 2^32 floats, both cores (issue 9 §3); label slow.
add_test(NAME math_exhaustive_float COMMAND math.test --run_test=exhaustive_float --log_level=message)
set_tests_properties(math_exhaustive_float PROPERTIES LABELS slow)
