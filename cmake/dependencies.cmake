# Third-party dependencies, all from Debian's packages (see scripts/install-deps.sh).
find_package(Threads REQUIRED)
find_package(Boost 1.74 REQUIRED COMPONENTS unit_test_framework)
find_package(fmt REQUIRED)
find_package(OpenSSL REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_library(ATTNREF_MPFR_LIBRARY mpfr REQUIRED)
find_library(ATTNREF_MPFI_LIBRARY mpfi REQUIRED)
find_library(ATTNREF_GMP_LIBRARY gmp REQUIRED)
find_path(ATTNREF_MPFI_INCLUDE mpfi.h REQUIRED)

# attnref::multiprecision: the Boost.Multiprecision glue (multiprecision.hpp) and its libraries.
add_library(attnref_multiprecision INTERFACE)
add_library(attnref::multiprecision ALIAS attnref_multiprecision)
target_link_libraries(attnref_multiprecision INTERFACE attnref::attnref Boost::headers
  ${ATTNREF_MPFI_LIBRARY} ${ATTNREF_MPFR_LIBRARY} ${ATTNREF_GMP_LIBRARY} Threads::Threads)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  target_link_libraries(attnref_multiprecision INTERFACE quadmath)
endif()
