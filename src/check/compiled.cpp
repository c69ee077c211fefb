/// The compiled checker (CMake target attnref::golden_compiled): check(), run_check() and the
/// reports (include/attnref/check/api.hpp), and the case reader and writer (parse_manifest,
/// parse_suite, complete_and_validate, to_json, manifest_text, load_case, write_case, compare_case:
/// golden/manifest.hpp, golden/case.hpp) defined once, here, as external functions. Files that
/// link the target include the headers as usual and see only the declarations.
#define ATTNREF_GOLDEN_DEFINE
#include "attnref/check/check.hpp"
#include "attnref/check/report.hpp"
