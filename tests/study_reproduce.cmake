# `attnref study --reproduce pcast-fp8|flash-bf16 --reduced` (docs/studies-reproduced.md), checked by
# tests/study_reproduce/check_reproduce.py against independent computations: the FP8 underflow
# fraction against the sinks' order-statistics model and the paper's closed form, with tolerances from
# the number of rows; reverse-order and sinks-last underflow; the forward/reverse MSE ratio; and the
# bf16 flash and baseline deviations recomputed in numpy. Numerics only: not run under the sanitizers.
if(TARGET attnref_cli AND NOT ATTNREF_SANITIZE)
  foreach(_what pcast flash)
    set(_name pcast-fp8)
    set(_csv pcast_fp8.csv)
    if(_what STREQUAL "flash")
      set(_name flash-bf16)
      set(_csv flash_bf16.csv)
    endif()
    set(_dir ${CMAKE_CURRENT_BINARY_DIR}/study_reproduce_${_what})
    add_test(NAME study_reproduce_${_what}
      COMMAND sh -c "rm -rf '${_dir}' && '$<TARGET_FILE:attnref_cli>' study --reproduce ${_name} --reduced --no-plot --threads 2 --out '${_dir}' >/dev/null && /usr/bin/python3 '${CMAKE_CURRENT_SOURCE_DIR}/study_reproduce/check_reproduce.py' ${_what} '${_dir}/${_csv}'")
    set_tests_properties(study_reproduce_${_what} PROPERTIES TIMEOUT 120)
  endforeach()
  add_test(NAME study_reproduce_refuses_unknown
    COMMAND sh -c "'$<TARGET_FILE:attnref_cli>' study --reproduce nonsense --out '${CMAKE_CURRENT_BINARY_DIR}/study_reproduce_bad' 2>&1; test $? -eq 2")
endif()
