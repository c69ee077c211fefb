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
