# `attnref study --backward` on a tiny sweep (tests/study_backward/check_csv.py): long double, float64
# and float32, textbook and flash, n = 8 and 32. The command exits 1 if any gradient element exceeds
# backward_bounds.hpp's first-order bound; the script checks the CSV has exactly the expected backward
# rows, every err/bound ratio in (0, 1] with a bound smaller than the gradient (not vacuous: pure bf16's
# is, so it is not in this test), and positive, finite normwise errors ordered by precision.
# Numerics only (MPFR), like study.test: not run under the sanitizers.
if(TARGET attnref_cli AND NOT ATTNREF_SANITIZE)
  set(_sb ${CMAKE_CURRENT_BINARY_DIR}/study_backward)
  add_test(NAME study_backward
    COMMAND sh -c "rm -rf '${_sb}' && '$<TARGET_FILE:attnref_cli>' study --backward --policy longdouble float64 float32 --seq 8 32 --queries 4 --head-dim 8 --seeds 1 2 --no-plot --threads 2 --out '${_sb}' >/dev/null && /usr/bin/python3 '${CMAKE_CURRENT_SOURCE_DIR}/study_backward/check_csv.py' '${_sb}/study.csv'")
  set_tests_properties(study_backward PROPERTIES TIMEOUT 120)
endif()
