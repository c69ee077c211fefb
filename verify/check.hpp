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
    /// The lse the candidate writes for rows whose keys are all masked (FlashAttention 2/3: +inf).
    empty_row_lse empty_lse = empty_row_lse::minus_inf;
};

/// The three verdicts. PASS: no element exceeds its bound, every bound is meaningful and the
/// output is not suspicious. FAIL: some element exceeds its bound (or an invariant is violated).
/// INCONCLUSIVE: nothing was violated, but a pass would prove nothing — a bound is vacuous
/// (tolerance::find_vacuous) or the output is untrustworthy (tolerance::untrustworthy). Exit codes
/// 0, 1, 1.
enum class verdict { pass, fail, inconclusive };
constexpr const char* verdict_name(verdict v) {
    return v == verdict::pass ? "PASS" : v == verdict::fail ? "FAIL" : "INCONCLUSIVE";
}

struct tensor_report {
    std::string name;
    tolerance::comparison cmp;
    std::string verdict;  ///< "pass", "FAIL", "INCONCLUSIVE" (vacuous bound) or "untrustworthy" (zero-trust)
    std::string note;     ///< why, for the last three
    tolerance::vacuity vacuous;  ///< the elements whose bound is vacuous
};

struct check_result {
    std::string case_name;
    tolerance::candidate_format format = tolerance::candidate_format::float64;
    tolerance::tolerance_model model = tolerance::tolerance_model::data_aware;
    std::vector<tensor_report> tensors;
    std::vector<invariant_report> invariants;
    verdict overall = verdict::fail;
    std::string reason;  ///< for FAIL and INCONCLUSIVE: the first tensor or invariant that decided it
    bool passed = false;  ///< overall == verdict::pass
};

/// Reads a candidate .npy as doubles ('<u2' = bfloat16 bit patterns). The shape must be `shape`;
/// an unset `format` is set from the file's descr. Throws data_error (one line) for a bad file.
std::vector<double> read_candidate(const std::string& file, const std::vector<std::size_t>& shape,
                                   std::optional<tolerance::candidate_format>& format);

/// A trivially wrong output of a case (computed exactly enough, in double): a bound that lets one
/// pass cannot tell a correct implementation from a broken one.
struct decoy {
    std::string name;
    std::vector<double> output;
};
/// The case's decoys: uniform weights (the mean of V over the attendable keys: every logit 0, ALiBi
/// and finite additive masks dropped), and the softmax at twice and at half the temperature (the
/// scale ×1/2 and ×2). Three forward passes in double.
std::vector<decoy> decoy_outputs(const case_spec& spec, const case_data& data);

/// The decoy rule: a decoy whose every element lies within its bound of the reference (so it would
/// pass the check) while it is off by at least decoy_significance of its row's scale (the row's
/// largest |reference|) somewhere — visibly wrong — makes the bounds vacuous.
inline constexpr double decoy_significance = 0x1p-7;
/// The first decoy that passes under `bounds` while visibly wrong, or nullptr.
const decoy* passing_decoy(std::span<const decoy> decoys, std::span<const double> expected, tolerance::candidate_format f,
                           std::span<const double> bounds, std::size_t row_length);

/// Judges a candidate output against the reference with per-element absolute bounds: "FAIL" when
/// an element exceeds its bound, else "INCONCLUSIVE" when a bound is vacuous (tolerance::
/// find_vacuous, rows of length row_length) or a decoy would pass (passing_decoy), else
/// "untrustworthy" (zero-trust), else "pass". Sizes must agree (data_error otherwise).
tensor_report judge_output(std::span<const double> candidate, std::span<const double> expected, tolerance::candidate_format f,
                           std::span<const double> bounds, std::size_t row_length, std::span<const decoy> decoys = {});

/// The overall verdict of a result's tensors and invariants (FAIL before INCONCLUSIVE before PASS),
/// with the reason; sets r.overall, r.reason and r.passed.
void decide(check_result& r);

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
