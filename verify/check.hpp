#pragma once
/// \file check.hpp
/// `attnref check` as a library (tests call it without a process): compare a candidate's .npy
/// outputs with a golden case under one tolerance model, plus invariants on weights and lse.

#include <filesystem>
#include <optional>
#include <span>
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
    /// Where the data-aware model's per-element bounds are cached (nullopt: no cache). Entries are
    /// keyed by the sha256 of the case's manifest.json, the candidate format and the model; see
    /// check.cpp ("bound cache") for the layout and how entries are verified.
    std::optional<std::filesystem::path> cache_dir;
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
    /// Bound cache outcome: "" (no cache used), "hit", "miss" (computed, stored), "rejected: <why>"
    /// (an unusable entry, recomputed and rewritten) or "unwritable: <why>" (computed, not stored).
    std::string cache_status;
    std::filesystem::path cache_file;
};

/// The default cache directory: $XDG_CACHE_HOME/attnref (when absolute), else ~/.cache/attnref;
/// nullopt when neither variable is usable.
std::optional<std::filesystem::path> default_cache_dir();

/// Reads a candidate .npy as doubles ('<u2' = bfloat16 bit patterns). The shape must be `shape`;
/// an unset `format` is set from the file's descr. Throws data_error (one line) for a bad file.
std::vector<double> read_candidate(const std::string& file, const std::vector<std::size_t>& shape,
                                   std::optional<tolerance::candidate_format>& format);

/// Judges a candidate output against the reference with per-element absolute bounds (verdict
/// "pass" or "FAIL"), then zero-trust ("untrustworthy", rows of length row_length). Sizes must agree
/// (data_error otherwise).
tensor_report judge_output(std::span<const double> candidate, std::span<const double> expected, tolerance::candidate_format f,
                           std::span<const double> bounds, std::size_t row_length);

/// Throws data_error (exit 2) for unusable inputs.
check_result run_check(const check_request& rq);

/// Per-element data-aware magnitudes of a loaded case from its weights P (B, H, Sq, Sk).
tolerance::data_aware_scales data_aware_scales_for(const case_spec& spec, const case_data& data, const std::vector<double>& weights);
/// Per-element worst-case magnitudes (the worst-case model) of a loaded case.
tolerance::worst_case_scales worst_case_scales_for(const case_spec& spec, const case_data& data, const std::vector<double>& weights);
/// The golden weights of the case (computed in double when the case does not store them).
std::vector<double> reference_weights(const std::filesystem::path& dir, const loaded_case& lc);

std::string report_table(const check_result& r, bool colour);
std::string report_json(const check_result& r);
std::string report_junit(const check_result& r);

}  // namespace attnref::verify
