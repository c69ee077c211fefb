# CTest registrations of the hostile-input probes; included from tests/CMakeLists.txt.
# tests/hostile/hostile.py drives the built `attnref` with FIFOs,
# devices, symlinks, deep JSON, huge shapes, duplicate keys, shell metacharacters, concurrent runs
# and closed pipes, one CTest per category; each probe has a timeout and (except under the
# sanitizers, which reserve terabytes of address space) a 1 GiB address-space limit.
if(TARGET attnref_cli)
  set(_hostile_rlimit)
  # `estimates` compares each memory estimate with the measured peak RSS: meaningless under the
  # sanitizers, whose shadow memory and allocator quarantine add hundreds of MB to every process.
  set(_hostile_categories memory deep sizes lost shell hang strict flags concurrent exits cli estimates promises)
  if(ATTNREF_SANITIZE)
    set(_hostile_rlimit --no-rlimit)
    list(REMOVE_ITEM _hostile_categories estimates)
  endif()
  foreach(_category ${_hostile_categories})
    add_test(NAME hostile_${_category}
      COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/hostile/hostile.py $<TARGET_FILE:attnref_cli>
              ${PROJECT_SOURCE_DIR}/golden ${CMAKE_CURRENT_BINARY_DIR}/hostile ${_category} ${_hostile_rlimit})
    set_tests_properties(hostile_${_category} PROPERTIES TIMEOUT 300 ENVIRONMENT XDG_CACHE_HOME=${CMAKE_CURRENT_BINARY_DIR}/hostile/cache)
  endforeach()
endif()
# tests/runtime/hostile.test.cpp calls golden/safe_io.hpp and the manifest parser directly.
if(TARGET attnref_verify)
  target_link_libraries(hostile.test PRIVATE attnref::golden_compiled)
else()
  set_target_properties(hostile.test PROPERTIES EXCLUDE_FROM_ALL ON)
  set_tests_properties(hostile PROPERTIES DISABLED ON)
endif()
