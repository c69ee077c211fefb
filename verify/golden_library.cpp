/// The compiled checker (CMake target attnref::golden_compiled): check(), run_check() and the
/// reports defined once, here, as external functions (include/attnref/check/api.hpp). Files that
/// link the target include golden/check.hpp as usual and see only the declarations.
#define ATTNREF_GOLDEN_DEFINE
#include "attnref/check/check.hpp"
#include "attnref/check/report.hpp"
