/// The compiled certification (the build's internal CMake target attnref_certify_compiled):
/// generate_case(), certify_case_fast() and the gradient certifications (golden/generate.hpp)
/// defined once, here, as external functions. The tools and tests that link the target include
/// golden/generate.hpp as usual and see only the declarations.
#define ATTNREF_GENERATE_DEFINE
#include "attnref/golden/generate.hpp"
