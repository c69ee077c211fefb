# The Python package's pytest examples (issue 12): one pytest process (torch is slow to import),
# Debian's /usr/bin/python3, the package imported from the build tree.
add_test(NAME python_examples
  COMMAND /usr/bin/python3 -m pytest -q -p no:cacheprovider ${PROJECT_SOURCE_DIR}/examples/python)
set_tests_properties(python_examples PROPERTIES
  ENVIRONMENT "PYTHONPATH=${ATTNREF_PYTHON_BUILD_DIR};ATTNREF_BINARY_DIR=${PROJECT_BINARY_DIR}")
