# `attnref generate --inputs-from DIR` end to end (tests/inputs_from/inputs_from.py): NumPy writes the
# inputs, mpmath at 256 bits (and attnref.sdpa when the Python module is built) gives an independent
# reference, a float32 NumPy implementation is checked, hostile inputs exit 2 naming the file.
# (python/ is added after tests/, hence TARGET_EXISTS at generate time; its package dir is python/'s build dir.)
if(TARGET attnref_cli)
  add_test(NAME inputs_from
    COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/inputs_from/inputs_from.py $<TARGET_FILE:attnref_cli>
            ${CMAKE_CURRENT_BINARY_DIR}/inputs_from $<$<TARGET_EXISTS:attnref_python>:${PROJECT_BINARY_DIR}/python>)
  set_tests_properties(inputs_from PROPERTIES TIMEOUT 120 ENVIRONMENT PYTHONDONTWRITEBYTECODE=1)
endif()

# `attnref generate --name N ... --gradients` (tests/inputs_from/generate_gradients.py): an ad-hoc SDPA and
# MHA backward case; attnref's float64 textbook gradients PASS `check --grad-*`, a perturbed one FAILs,
# --inputs-from with the stored inputs and grad_output gives the same bytes, bad flags exit 2.
if(TARGET attnref_cli)
  add_test(NAME generate_gradients
    COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/inputs_from/generate_gradients.py $<TARGET_FILE:attnref_cli>
            ${CMAKE_CURRENT_BINARY_DIR}/generate_gradients)
  set_tests_properties(generate_gradients PROPERTIES TIMEOUT 60 ENVIRONMENT PYTHONDONTWRITEBYTECODE=1)
endif()
