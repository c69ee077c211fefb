#pragma once
/// \file check/checker.hpp
/// The checker, whole: a candidate's outputs (spans in memory, or .npy files) against a loaded
/// golden case under one tolerance model (tolerance.hpp), plus invariants on its weights and lse
/// (invariants.hpp) and its gradients. One header per concern, in include/attnref/check/:
///
///   check/verdict.hpp    verdict (PASS / FAIL / INCONCLUSIVE), tensor_report, check_result, decide
///   check/candidate.hpp  candidate, check_options, check_request, read_candidate (.npy → doubles)
///   check/forward.hpp    the output's judgment (vacuity, decoys, zero-trust), weights and lse
///   check/gradients.hpp  gradient roles, bounds and judgment, gradient invariants
///   check/check.hpp      check() and run_check(): the entry points
///   check/report.hpp     report_table, report_json, report_junit
///   check/api.hpp        the entry points and reports, declared (for the compiled library)
///
/// `attnref check` is argument parsing around run_check. Needs fmt and nlohmann_json besides
/// golden/case.hpp's dependencies (the CMake target attnref::golden). docs/checker-internals.md
/// describes the layout.

#include "attnref/check/api.hpp"
#include "attnref/check/candidate.hpp"
#include "attnref/check/verdict.hpp"
// Compiled use (attnref::golden_compiled, check/api.hpp): the entry points come from the library,
// and a file that only gates a kernel parses none of the definitions below. Header-only: all of them.
#if !defined(ATTNREF_GOLDEN_COMPILED)
#include "attnref/check/check.hpp"
#include "attnref/check/forward.hpp"
#include "attnref/check/gradients.hpp"
#include "attnref/check/report.hpp"
#endif
