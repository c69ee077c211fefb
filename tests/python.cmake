# The Python package's pytest examples (docs/python.md): one pytest process (torch is slow to import),
# Debian's /usr/bin/python3, the package imported from the build tree. ATTNREF_BIN: the command whose
# verdicts examples/python/test_input_formats.py compares attnref.check's with.
add_test(NAME python_examples
  COMMAND /usr/bin/python3 -m pytest -q -p no:cacheprovider ${PROJECT_SOURCE_DIR}/examples/python)
set_tests_properties(python_examples PROPERTIES
  ENVIRONMENT "PYTHONPATH=${ATTNREF_PYTHON_BUILD_DIR};PYTHONDONTWRITEBYTECODE=1;ATTNREF_BIN=$<TARGET_FILE:attnref_cli>")

# `cmake --install` puts an importable package where the Debian interpreter looks under the prefix.
set(_py_prefix ${PROJECT_BINARY_DIR}/python_install_test)
add_test(NAME python_install
  COMMAND sh -c "rm -rf '${_py_prefix}' && '${CMAKE_COMMAND}' --install '${PROJECT_BINARY_DIR}' --component python --prefix '${_py_prefix}' >/dev/null && cd / && PYTHONPATH='${_py_prefix}/${ATTNREF_PYTHON_INSTALL_DIR}' /usr/bin/python3 -c 'import attnref, os, sys; sys.exit(0 if attnref.__file__.startswith(\"${_py_prefix}\") else 1)'")

# The Python API's promises on hostile arguments (formats from the data, validated options, inexact
# inputs refused, head dimension 0, one-line errors, the memory estimate and max_memory=).
add_test(NAME python_api_promises
  COMMAND /usr/bin/python3 -m pytest -q -p no:cacheprovider ${PROJECT_SOURCE_DIR}/tests/python/test_api_promises.py)
set_tests_properties(python_api_promises PROPERTIES
  ENVIRONMENT "PYTHONPATH=${ATTNREF_PYTHON_BUILD_DIR};PYTHONDONTWRITEBYTECODE=1;ATTNREF_BIN=$<TARGET_FILE:attnref_cli>")
