#pragma once
/// \file check.hpp
/// `attnref check` as a library (tests call it without a process): compare a candidate's .npy
/// outputs with a golden case under one tolerance model, plus invariants on weights and lse.

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "attnref/invariants.hpp"
#include "attnref/tolerance.hpp"
#include "golden_case.hpp"

namespace attnref::verify {

struct check_request {
    std::string golden, output, weights, lse;  ///< empty weights/lse: not given
    std::optional<tolerance::candidate_format> dtype;  ///< nullopt: from the output's descr
    tolerance::tolerance_model model = tolerance::tolerance_model::data_aware;
};

struct tensor_report {
    std::string name;
    tolerance::comparison cmp;
    std::string verdict;  ///< "pass", "FAIL" or "untrustworthy"
    std::string note;
};

struct check_result {
    std::string case_name;
    tolerance::candidate_format format = tolerance::candidate_format::float64;
    tolerance::tolerance_model model = tolerance::tolerance_model::data_aware;
    std::vector<tensor_report> tensors;
    std::vector<invariant_report> invariants;
    bool passed = false;
};

/// Throws data_error (exit 2) for unusable inputs.
check_result run_check(const check_request& rq);

/// Per-element data-aware magnitudes of a loaded case from its weights P (B, H, Sq, Sk).
tolerance::data_aware_scales data_aware_scales_for(const case_spec& spec, const case_data& data, const std::vector<double>& weights);
/// The golden weights of the case (computed in double when the case does not store them).
std::vector<double> reference_weights(const std::filesystem::path& dir, const loaded_case& lc);

std::string report_table(const check_result& r, bool colour);
std::string report_json(const check_result& r);
std::string report_junit(const check_result& r);

}  // namespace attnref::verify
