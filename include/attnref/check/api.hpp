#pragma once
/// \file check/api.hpp
/// The checker's entry points and reports, declared: check(), run_check() (check/check.hpp) and
/// report_table(), report_json(), report_junit() (check/report.hpp).
///
/// Two ways to use them. Header-only (the CMake target attnref::golden): check/checker.hpp includes
/// every definition, inline. Compiled (attnref::golden_compiled, which defines
/// ATTNREF_GOLDEN_COMPILED): they are defined once in that static library, and check/checker.hpp
/// includes only these declarations and the types they take — a test file that gates a kernel
/// then compiles none of the checker's bound drivers, gradients or reports.

#include <span>
#include <string>

#include "attnref/check/candidate.hpp"
#include "attnref/check/verdict.hpp"
#include "attnref/golden/case.hpp"
#include "attnref/golden/compiled.hpp"

namespace attnref::golden {

/// Checks a candidate in memory against a loaded case (check/check.hpp).
ATTNREF_GOLDEN_FN check_result check(const loaded_case& lc, const candidate& c, const check_options& opt = {});
/// The same for an output alone.
ATTNREF_GOLDEN_FN check_result check(const loaded_case& lc, std::span<const double> output, tolerance::candidate_format format,
                                     const check_options& opt = {});
/// `attnref check`: the case and the candidate's .npy files, then check() (check/check.hpp).
ATTNREF_GOLDEN_FN check_result run_check(const check_request& rq);
/// The same against a case already loaded (or made in memory: check/request.hpp's derived case);
/// rq.golden is then not read.
ATTNREF_GOLDEN_FN check_result run_check(const check_request& rq, const loaded_case& lc);

/// The verdict as the table `attnref check` prints (`colour`: ANSI colours on the verdict column).
ATTNREF_GOLDEN_FN std::string report_table(const check_result& r, bool colour);
/// The verdict as JSON (`--json`).
ATTNREF_GOLDEN_FN std::string report_json(const check_result& r);
/// The verdict as JUnit XML (`--junit`).
ATTNREF_GOLDEN_FN std::string report_junit(const check_result& r);

}  // namespace attnref::golden
