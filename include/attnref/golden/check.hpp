#pragma once
/// \file golden/check.hpp
/// The checker: a candidate's outputs (spans in memory, or .npy files) against a loaded golden
/// case under one tolerance model (tolerance.hpp), plus invariants on its weights and lse
/// (invariants.hpp). Owns the verdict (PASS / FAIL / INCONCLUSIVE) and its rules — vacuous bounds,
/// decoy outputs (decoy_outputs, passing_decoy), zero-trust — the bound drivers that feed a case
/// to tolerance.hpp (data_aware_scales_for, worst_case_scales_for, reference_weights), reading a
/// candidate .npy (read_candidate: npy.hpp's header checks, then the data straight into doubles),
/// and the reports (table, JSON, JUnit). `attnref check` is argument parsing around run_check.
/// Gradients (backward cases): gradient_roles, compute_case_gradients (attnref's own backward of a
/// case under a precision policy), gradient_bounds_for (backward_bounds.hpp fed with a case) and
/// check_gradients (verdict rows and the gradient invariants).
/// Needs fmt besides golden/case.hpp's dependencies (the CMake target attnref::golden).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>
#include <sys/mman.h>

#include <fmt/color.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "attnref/backward.hpp"
#include "attnref/backward_bounds.hpp"
#include "attnref/formats.hpp"
#include "attnref/invariants.hpp"
#include "attnref/npy.hpp"
#include "attnref/tolerance.hpp"
#include "attnref/golden/case.hpp"

namespace attnref::golden {

/// How to judge: the tolerance model (tolerance.hpp) and the candidate's empty-row lse convention.
struct check_options {
    tolerance::tolerance_model model = tolerance::tolerance_model::data_aware;
    /// The lse the candidate writes for rows whose keys are all masked (FlashAttention 2/3: +inf).
    empty_row_lse empty_lse = empty_row_lse::minus_inf;
    /// The candidate's backward algorithm, when it declares one. textbook (dS from the forward's own
    /// normalised P) lets dQ's bound centre the keys ((B5t), docs/backward.md); flash or unknown keep
    /// (B5), valid for any algorithm. A false declaration can only make a correct kernel FAIL.
    std::optional<backward_algorithm> declared_backward;
    /// A declared precision policy (attnref check --policy NAME): the data-aware bounds follow its
    /// roundoffs instead of the candidate format's defaults. nullopt: the format's bound, valid for any kernel of it.
    std::optional<tolerance::policy_roundoffs> policy;
};

/// A candidate in memory: its outputs as doubles in C order with the case's shapes (output_shape,
/// weights_shape, lse_shape), holding values of `format` (a float32 kernel's outputs widened to
/// double). weights and lse are optional (empty: not given); their formats default to `format`.
struct gradient_tensor {
    std::string role;  ///< grad_query, grad_key, grad_value (sdpa and mha); mha also grad_w_q … grad_w_o, grad_b_q … grad_b_o
    std::span<const double> values;
};
struct candidate {
    std::span<const double> output, weights, lse;  ///< output may be empty when gradients are given
    tolerance::candidate_format format = tolerance::candidate_format::float64;
    std::optional<tolerance::candidate_format> weights_format, lse_format;
    std::vector<gradient_tensor> gradients;  ///< optional, by role, computed in `format`
};

/// A candidate given as .npy files (`attnref check`): paths, and the dtype when the files' descr
/// does not say it (bfloat16 stored as '<f4').
struct check_request {
    std::string golden, output, weights, lse;  ///< empty output/weights/lse: not given
    std::vector<std::pair<std::string, std::string>> gradients;  ///< (role, .npy file); role as in gradient_roles
    std::optional<tolerance::candidate_format> dtype;  ///< nullopt: from the output's descr
    tolerance::tolerance_model model = tolerance::tolerance_model::data_aware;
    /// The lse the candidate writes for rows whose keys are all masked (FlashAttention 2/3: +inf).
    empty_row_lse empty_lse = empty_row_lse::minus_inf;
    std::optional<backward_algorithm> declared_backward;  ///< as check_options::declared_backward
    std::optional<tolerance::policy_roundoffs> policy;    ///< as check_options::policy
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
    std::optional<backward_algorithm> declared_backward;  ///< the backward algorithm the candidate declared (gradients)
    std::vector<tensor_report> tensors;
    std::vector<invariant_report> invariants;
    verdict overall = verdict::fail;
    std::string reason;  ///< for FAIL and INCONCLUSIVE: the first tensor or invariant that decided it
    bool passed = false;  ///< overall == verdict::pass
};

/// Reads a candidate .npy as doubles ('<u2' = bfloat16 bit patterns). The shape must be `shape`;
/// an unset `format` is set from the file's descr. Throws data_error (one line) for a bad file.
inline std::vector<double> read_candidate(const std::string& file, const std::vector<std::size_t>& shape,
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
inline std::vector<decoy> decoy_outputs(const case_spec& spec, const case_data& data);

/// The decoy rule: a decoy whose every element lies within its bound of the reference (so it would
/// pass the check) while it is off by at least decoy_significance of its row's scale (the row's
/// largest |reference|) somewhere — visibly wrong — makes the bounds vacuous.
inline constexpr double decoy_significance = 0x1p-7;
/// The first decoy that passes under `bounds` while visibly wrong, or nullptr.
inline const decoy* passing_decoy(std::span<const decoy> decoys, std::span<const double> expected, tolerance::candidate_format f,
                           std::span<const double> bounds, std::size_t row_length);

/// Judges a candidate output against the reference with per-element absolute bounds: "FAIL" when
/// an element exceeds its bound, else "INCONCLUSIVE" when a bound is vacuous (tolerance::
/// find_vacuous, rows of length row_length) or a decoy would pass (passing_decoy), else
/// "untrustworthy" (zero-trust), else "pass". Sizes must agree (data_error otherwise).
inline tensor_report judge_output(std::span<const double> candidate, std::span<const double> expected, tolerance::candidate_format f,
                           std::span<const double> bounds, std::size_t row_length, std::span<const decoy> decoys = {});

/// The overall verdict of a result's tensors and invariants (FAIL before INCONCLUSIVE before PASS),
/// with the reason; sets r.overall, r.reason and r.passed.
inline void decide(check_result& r);

/// Checks a candidate in memory against a loaded case: the output against the reference under
/// opt.model (with the vacuity, decoy and zero-trust rules), the weights and lse when given
/// (invariants and element-wise bounds). Throws data_error for unusable input (a size that is not
/// the case's). In a test:
///
///     const auto lc = attnref::golden::load_case("golden/mha_seed_example");
///     const auto r = attnref::golden::check(lc, my_output, attnref::tolerance::candidate_format::float32);
///     BOOST_TEST(r.passed, attnref::golden::report_table(r, false));
inline check_result check(const loaded_case& lc, const candidate& c, const check_options& opt = {});
/// The same for an output alone.
inline check_result check(const loaded_case& lc, std::span<const double> output, tolerance::candidate_format format,
                          const check_options& opt = {});

/// `attnref check`: loads the case and the candidate's .npy files (read_candidate), then check().
/// Throws data_error (exit 2) for unusable inputs.
inline check_result run_check(const check_request& rq);

/// Per-element data-aware magnitudes of a loaded case from its weights P (B, H, Sq, Sk).
inline tolerance::data_aware_scales data_aware_scales_for(const case_spec& spec, const case_data& data, const std::vector<double>& weights,
                                                          bool inputs_exact = false);
/// Per-element worst-case magnitudes (the worst-case model) of a loaded case.
inline tolerance::worst_case_scales worst_case_scales_for(const case_spec& spec, const case_data& data, const std::vector<double>& weights);
/// The golden weights of the case (computed in double when the case does not store them).
inline std::vector<double> reference_weights(const loaded_case& lc);

/// The verdict as a table (the text `attnref check` prints; `colour`: ANSI colours on the verdict
/// column), as JSON (`--json`) and as JUnit XML (`--junit`: every tensor or invariant that is not a
/// pass is a <failure> whose type is FAIL or INCONCLUSIVE).
inline std::string report_table(const check_result& r, bool colour);
inline std::string report_json(const check_result& r);
inline std::string report_junit(const check_result& r);


/// The gradient roles of a case and their shapes, in report order: sdpa grad_query (B, H, Sq, dk),
/// grad_key (B, Hkv, Sk, dk), grad_value (B, Hkv, Sk, dv); mha grad_query/key/value w.r.t. x_q, x_k,
/// x_v ((B, Sq, E), (B, Sk, E), (B, Sk, E)), grad_w_q … grad_w_o and, with biases, grad_b_q … grad_b_o.
inline std::vector<std::pair<std::string, std::vector<std::size_t>>> gradient_roles(const case_spec& spec);
/// attnref's own gradients of a case under Policy (inputs and grad_output rounded to Input first), by role.
template <PrecisionPolicy Policy, class Input = typename Policy::storage_type>
std::vector<std::pair<std::string, std::vector<double>>> compute_case_gradients(const case_spec& spec, const case_data& data,
                                                                                std::span<const double> grad_output,
                                                                                backward_algorithm algorithm = backward_algorithm::textbook,
                                                                                std::size_t threads = 0);
/// What judging gradients takes from a case: grad_output, the exact forward's weights and lse, and
/// the certified float64 gradients by role.
struct gradient_reference {
    std::vector<double> grad_output, weights, lse;
    std::vector<std::pair<std::string, std::vector<double>>> certified;
    const std::vector<double>* find(const std::string& role) const {
        for (const auto& [r, v] : certified)
            if (r == role) return &v;
        return nullptr;
    }
};
/// The data-aware bounds (backward_bounds.hpp) of every gradient role for a candidate in format f,
/// plus the certified reference's own rounding (2^-53 relative).
inline std::vector<std::pair<std::string, std::vector<double>>> gradient_bounds_for(const case_spec& spec, const case_data& data,
                                                                                    const gradient_reference& ref, tolerance::candidate_format f,
                                                                                    std::optional<backward_algorithm> declared = std::nullopt,
                                                                                    const std::optional<tolerance::policy_roundoffs>& policy = std::nullopt);
/// Judges the candidate's gradients (tensor rows, one per role given) and the gradient invariants
/// into `res` under the data-aware model (default) or FlashAttention's baseline rule.
inline void check_gradients(const case_spec& spec, const case_data& data, const gradient_reference& ref,
                            std::span<const gradient_tensor> got, tolerance::candidate_format f, tolerance::tolerance_model model,
                            check_result& res, std::optional<backward_algorithm> declared = std::nullopt,
                            const std::optional<tolerance::policy_roundoffs>& declared_policy = std::nullopt);
/// A loaded case's gradient_reference (grad_output, certified gradients, weights, lse); data_error
/// when the case has no certified gradients.
inline gradient_reference gradient_reference_of(const loaded_case& lc);


// ---------------------------------------------------------------------------------------------
// Definitions.


namespace tol = attnref::tolerance;

namespace check_detail {
/// The `attnref check` flag of a gradient role: grad_w_q → grad-w-q.
inline std::string flag_of(std::string role) {
    std::replace(role.begin(), role.end(), '_', '-');
    return role;
}
inline std::string shape_text(const std::vector<std::size_t>& s) {
    std::string r = "(";
    for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + (s.size() == 1 ? ",)" : ")");
}

inline void advise_huge_pages([[maybe_unused]] void* p, [[maybe_unused]] std::size_t bytes) {
#ifdef MADV_HUGEPAGE
    const std::uintptr_t page = 4096, begin = (reinterpret_cast<std::uintptr_t>(p) + page - 1) & ~(page - 1),
                         end = (reinterpret_cast<std::uintptr_t>(p) + bytes) & ~(page - 1);
    if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);  // a hint: failure is harmless
#endif
}

/// The hot path for '<f8' and '<f4' candidates: the preamble and header are checked by npy.hpp's
/// own npy::detail::parse_header (the rules npy::read applies, including the file's size against
/// the header), then the data block is fread straight into the result — a '<f4' block into the
/// upper half of the doubles' storage and widened in place, front to back (double n ends at byte
/// 8n + 8 ≤ 4N + 4n + 4, where float n ends). One buffer, touched once. Returns nullopt whenever
/// anything is not plainly valid: the caller then takes the strict npy::read path, which accepts
/// or rejects it with its one-line message.
inline std::optional<std::vector<double>> read_in_place(const std::string& file, const std::vector<std::size_t>& shape,
                                                        std::string& descr) {
    if constexpr (std::endian::native != std::endian::little) return std::nullopt;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(file, ec)) return std::nullopt;
    const std::uintmax_t size = std::filesystem::file_size(file, ec);
    if (ec) return std::nullopt;
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(file.c_str(), "rb"), &std::fclose);
    if (!f) return std::nullopt;
    std::vector<std::byte> prefix(static_cast<std::size_t>(std::min<std::uintmax_t>(size, 12 + npy::detail::max_header_length)));
    if (std::fread(prefix.data(), 1, prefix.size(), f.get()) != prefix.size()) return std::nullopt;
    npy::detail::header_info h;
    try {
        h = npy::detail::parse_header(prefix, size, file);
        npy::detail::check_expectation(h, npy::expectation{{"<f8", "<f4"}, shape}, file);
    } catch (const npy::error&) {
        return std::nullopt;
    }
    const std::size_t item = h.meta.descr == "<f8" ? 8 : 4;
    const std::size_t n = h.data_bytes / item;
    if (n > std::numeric_limits<std::size_t>::max() / 8 || std::fseek(f.get(), static_cast<long>(h.data_offset), SEEK_SET) != 0)
        return std::nullopt;
    const std::optional<std::size_t> count = n;
    npy::array a = std::move(h.meta);
    std::vector<double> r;
    r.reserve(*count);  // allocated, not yet touched: ask for transparent huge pages (first-touch
    advise_huge_pages(r.data(), *count * 8);  // page faults dominate reading into fresh memory)
    r.resize(*count);
    std::byte* bytes = reinterpret_cast<std::byte*>(r.data());
    std::byte* block = item == 8 ? bytes : bytes + 4 * *count;
    if (std::fread(block, 1, *count * item, f.get()) != *count * item || std::fgetc(f.get()) != EOF) return std::nullopt;
    if (item == 4) {
        for (std::size_t n = 0; n < *count; ++n) {
            float v;
            std::memcpy(&v, block + 4 * n, 4);
            r[n] = static_cast<double>(v);
        }
    }
    descr = a.descr;
    return r;
}

}  // namespace check_detail
/// Reads a candidate .npy as doubles; '<u2' is decoded as bfloat16 bit patterns.
inline std::vector<double> read_candidate(const std::string& file, const std::vector<std::size_t>& shape,
                                   std::optional<tol::candidate_format>& format) {
    // Regular files only (a FIFO or device would block or stream forever), and nothing is allocated
    // before the header has been checked against `shape` and the file's size.
    require_regular_file(file, "candidate file");
    std::string fast_descr;
    if (std::optional<std::vector<double>> r = check_detail::read_in_place(file, shape, fast_descr)) {
        const auto from_descr = fast_descr == "<f8" ? tol::candidate_format::float64 : tol::candidate_format::float32;
        if (!format) format = from_descr;
        return std::move(*r);
    }
    npy::array a;
    try {
        a = npy::read(file, npy::expectation{{"<f8", "<f4", "<f2", "<u2"}, shape});
    } catch (const npy::error& e) {
        throw data_error(e.what());
    }
    std::optional<tol::candidate_format> from_descr;
    if (a.descr == "<f8") from_descr = tol::candidate_format::float64;
    else if (a.descr == "<f4") from_descr = tol::candidate_format::float32;
    else if (a.descr == "<f2") from_descr = tol::candidate_format::float16;
    else if (a.descr == "<u2") from_descr = tol::candidate_format::bfloat16;
    else throw data_error(file + ": header field 'descr': expected '<f8', '<f4', '<f2' or '<u2' (bfloat16 bits), got '" + a.descr + "'");
    if (!format) format = from_descr;
    if (a.descr == "<u2") {
        if (*format != tol::candidate_format::bfloat16)
            throw data_error(file + ": header field 'descr': '<u2' holds bfloat16 bit patterns, but --dtype is " +
                             std::string(tol::format_name(*format)));
        std::vector<double> r;
        for (std::uint16_t b : npy::to_vector<std::uint16_t>(a)) r.push_back(static_cast<double>(formats::bfloat16::from_bits(b)));
        return r;
    }
    return npy::to_double(a);
}

namespace check_detail {
/// attnref's own straightforward implementation in the candidate's precision (baseline model).
inline std::vector<double> naive_output(const case_spec& spec, const case_data& data, tol::candidate_format f) {
    auto flat = [](const auto& t) {
        std::vector<double> r(t.size());
        for (std::size_t n = 0; n < t.size(); ++n) r[n] = static_cast<double>(t[n]);
        return r;
    };
    case_spec s = spec;
    s.outputs.weights = s.outputs.lse = false;
    switch (f) {
        case tol::candidate_format::float64: return flat(compute_case<uniform_precision<double>>(s, data, 0).output);
        case tol::candidate_format::float32: return flat(compute_case<uniform_precision<float>>(s, data, 0).output);
        case tol::candidate_format::bfloat16:
            return flat(compute_case<precision_policy<formats::bfloat16, float, formats::bfloat16, formats::bfloat16>>(s, data, 0).output);
        case tol::candidate_format::float16:
            return flat(compute_case<precision_policy<formats::float16, float, formats::float16, formats::float16>>(s, data, 0).output);
    }
    return {};
}

}  // namespace check_detail
namespace check_detail {
inline std::string vacuity_note(const tol::vacuity& v, std::size_t elements, const char* scale_name) {
    return fmt::format("bound vacuous on {} of {} elements (first at {}: bound {:.3g} {} {} {:.3g}); a pass would prove nothing",
                       v.elements, elements, v.index, v.bound, std::isfinite(v.bound) && v.bound >= 0 ? ">=" : "is not a finite bound;",
                       scale_name, v.scale);
}

/// A tensor's report for a finished comparison and its bounds' vacuity (see judge_output).
inline tensor_report judged(std::string name, const tol::comparison& cmp, const tol::vacuity& vac, const char* scale_name) {
    tensor_report out{std::move(name), cmp, "pass", {}, vac};
    if (!cmp.ok()) {
        out.verdict = "FAIL";
        out.note = fmt::format("{} of {} elements outside the bound", cmp.violations, cmp.elements);
    } else if (vac.any()) {
        out.verdict = "INCONCLUSIVE";
        out.note = vacuity_note(vac, cmp.elements, scale_name);
    }
    return out;
}
inline tensor_report judged_output(const tol::comparison& cmp, const tol::vacuity& vac, std::span<const double> candidate,
                            std::span<const double> expected, std::size_t row_length, const decoy* passing = nullptr) {
    tensor_report out = judged("output", cmp, vac, "row scale max|expected|");
    if (out.verdict == "pass" && passing) {
        out.verdict = "INCONCLUSIVE";
        out.note = "the bound admits a trivially wrong output (" + passing->name + "); a pass would prove nothing";
    }
    if (out.verdict == "pass")
        if (auto why = tol::untrustworthy(candidate, row_length, expected)) {
            out.verdict = "untrustworthy";
            out.note = std::string(*why);
        }
    return out;
}
}  // namespace check_detail
inline const decoy* passing_decoy(std::span<const decoy> decoys, std::span<const double> expected, tol::candidate_format f,
                           std::span<const double> bounds, std::size_t row_length) {
    const std::size_t n = expected.size(), row = row_length > 0 && n % row_length == 0 ? row_length : std::max<std::size_t>(n, 1);
    for (const decoy& d : decoys) {
        if (d.output.size() != n) continue;
        if (!tol::compare(d.output, expected, f, [&](std::size_t e) { return bounds[e]; }, std::nullopt, 1).ok()) continue;
        bool visible = false;  // off by ≥ decoy_significance of the row's scale somewhere
        for (std::size_t begin = 0; begin < n && !visible; begin += row) {
            double scale = 0;
            for (std::size_t e = begin; e < begin + row; ++e)
                if (std::isfinite(expected[e])) scale = std::max(scale, std::fabs(expected[e]));
            for (std::size_t e = begin; e < begin + row && !visible; ++e)
                visible = std::isfinite(expected[e]) && std::fabs(d.output[e] - expected[e]) >= decoy_significance * scale && scale > 0;
        }
        if (visible) return &d;
    }
    return nullptr;
}

inline tensor_report judge_output(std::span<const double> candidate, std::span<const double> expected, tol::candidate_format f,
                           std::span<const double> bounds, std::size_t row_length, std::span<const decoy> decoys) {
    if (candidate.size() != expected.size() || bounds.size() != expected.size())
        throw data_error(fmt::format("output: {} candidate values, {} reference values, {} bounds", candidate.size(),
                                     expected.size(), bounds.size()));
    return check_detail::judged_output(tol::compare(candidate, expected, f, [&](std::size_t n) { return bounds[n]; }),
                         tol::find_vacuous(expected, row_length, bounds), candidate, expected, row_length,
                         passing_decoy(decoys, expected, f, bounds, row_length));
}

inline void decide(check_result& r) {
    r.overall = verdict::pass;
    r.reason.clear();
    auto note = [&](verdict v, const std::string& why) {
        if (v == verdict::fail && r.overall != verdict::fail) r.overall = verdict::fail, r.reason = why;
        else if (v == verdict::inconclusive && r.overall == verdict::pass) r.overall = verdict::inconclusive, r.reason = why;
    };
    for (const tensor_report& t : r.tensors) {
        if (t.verdict == "FAIL") note(verdict::fail, t.name + ": " + t.note);
        else if (t.verdict == "untrustworthy") note(verdict::inconclusive, t.name + " untrustworthy: " + t.note);
        else if (t.verdict != "pass") note(verdict::inconclusive, t.name + ": " + t.note);
    }
    for (const invariant_report& i : r.invariants) {
        if (!i.ok)
            note(verdict::fail, fmt::format("invariant '{}': {} of {} violated (worst {:.3g}, bound {:.3g})", i.name, i.violations,
                                            i.checked, i.worst, i.bound));
        else if (i.vacuous)
            note(verdict::inconclusive, fmt::format("invariant '{}': its bound is vacuous (as large as the quantity it bounds, or not "
                                                    "finite); a pass would prove nothing",
                                                    i.name));
    }
    r.passed = r.overall == verdict::pass;
}

inline tol::data_aware_scales data_aware_scales_for(const case_spec& spec, const case_data& data, const std::vector<double>& weights,
                                                   bool inputs_exact) {
    const case_views c = views_of(spec, data);
    return c.sdpa() ? tol::sdpa_scales(c.q, c.k, c.v, c.weights(weights), c.o, inputs_exact)
                    : tol::mha_scales(c.x_q, c.x_k, c.x_v, c.w, c.weights(weights), c.mo, inputs_exact);
}

inline tol::worst_case_scales worst_case_scales_for(const case_spec& spec, const case_data& data, const std::vector<double>& weights) {
    const case_views c = views_of(spec, data);
    return c.sdpa() ? tol::sdpa_worst_case_scales(c.q, c.k, c.v, c.weights(weights), c.o)
                    : tol::mha_worst_case_scales(c.x_q, c.x_k, c.x_v, c.w, c.weights(weights), c.mo);
}

inline std::vector<double> reference_weights(const loaded_case& lc) {
    if (const tensor_entry* t = lc.entry("weights")) return lc.reference(*t);
    case_spec s = lc.m.spec;  // not stored: attnref in double (σ only needs a few correct digits)
    s.outputs.weights = true;
    s.outputs.lse = false;
    const auto r = compute_case<uniform_precision<double>>(s, lc.data, 0);
    return std::vector<double>(r.weights.data(), r.weights.data() + r.weights.size());
}

inline std::vector<decoy> decoy_outputs(const case_spec& spec, const case_data& data) {
    auto run = [&](const case_spec& s, const case_data& d) {
        case_spec t = s;
        t.outputs.weights = t.outputs.lse = false;
        const auto r = compute_case<uniform_precision<double>>(t, d, 0);
        return std::vector<double>(r.output.data(), r.output.data() + r.output.size());
    };
    std::vector<decoy> r;
    {
        case_spec s = spec;
        case_data d = data;
        if (s.kind == case_kind::sdpa) std::fill(d.query.begin(), d.query.end(), 0.0);
        else std::fill(d.w_q.begin(), d.w_q.end(), 0.0), std::fill(d.b_q.begin(), d.b_q.end(), 0.0);
        s.conventions.alibi_slopes.clear();
        for (double& x : d.additive_mask)
            if (std::isfinite(x)) x = 0;
        r.push_back({"uniform weights: the mean of V", run(s, d)});
    }
    const double scale = spec.conventions.scale ? *spec.conventions.scale : 1 / std::sqrt(static_cast<double>(spec.shapes.head_dim_qk));
    for (const double c : {2.0, 0.5}) {
        case_spec s = spec;
        s.conventions.scale = scale * c;
        r.push_back({fmt::format("the softmax with the scale x{}", c), run(s, data)});
    }
    return r;
}

namespace check_detail {
/// judge_output, computing the case's decoys only where they can change the verdict (a pass or an
/// untrustworthy output: FAIL and INCONCLUSIVE stand whatever the decoys do).
inline tensor_report judge_with_decoys(std::span<const double> candidate, std::span<const double> expected, tol::candidate_format f,
                                std::span<const double> bounds, std::size_t row, const case_spec& spec, const case_data& data) {
    tensor_report t = judge_output(candidate, expected, f, bounds, row);
    if (t.verdict != "pass" && t.verdict != "untrustworthy") return t;
    return judge_output(candidate, expected, f, bounds, row, decoy_outputs(spec, data));
}
}  // namespace check_detail
inline std::vector<std::pair<std::string, std::vector<std::size_t>>> gradient_roles(const case_spec& spec) {
    const case_shapes& d = spec.shapes;
    if (spec.kind == case_kind::sdpa)
        return {{"grad_query", {d.batch, d.heads, d.query_length, d.head_dim_qk}},
                {"grad_key", {d.batch, d.kv_heads, d.key_length, d.head_dim_qk}},
                {"grad_value", {d.batch, d.kv_heads, d.key_length, d.head_dim_v}}};
    std::vector<std::pair<std::string, std::vector<std::size_t>>> r{
        {"grad_query", {d.batch, d.query_length, d.model_dim}},       {"grad_key", {d.batch, d.key_length, d.model_dim}},
        {"grad_value", {d.batch, d.key_length, d.model_dim}},         {"grad_w_q", {d.model_dim, d.heads * d.head_dim_qk}},
        {"grad_w_k", {d.model_dim, d.kv_heads * d.head_dim_qk}},      {"grad_w_v", {d.model_dim, d.kv_heads * d.head_dim_v}},
        {"grad_w_o", {d.heads * d.head_dim_v, d.output_dim}}};
    if (spec.conventions.projection_bias)
        for (auto [role, n] : {std::pair<const char*, std::size_t>{"grad_b_q", d.heads * d.head_dim_qk}, {"grad_b_k", d.kv_heads * d.head_dim_qk},
                               {"grad_b_v", d.kv_heads * d.head_dim_v}, {"grad_b_o", d.output_dim}})
            r.push_back({role, {n}});
    return r;
}

template <PrecisionPolicy Policy, class Input>
std::vector<std::pair<std::string, std::vector<double>>> compute_case_gradients(const case_spec& spec, const case_data& data,
                                                                                std::span<const double> grad_output,
                                                                                backward_algorithm algorithm, std::size_t threads) {
    const case_shapes& d = spec.shapes;
    const attention_options o = options_for(spec, data, threads, softmax_algorithm::shifted_division, 64);
    auto flat = [](const auto& t) {
        std::vector<double> r(t.size());
        for (std::size_t n = 0; n < t.size(); ++n) r[n] = static_cast<double>(t[n]);
        return r;
    };
    const converted_inputs<Input> in(spec, data);
    const std::vector<Input> g = converted_inputs<Input>::convert_all(grad_output);
    if (spec.kind == case_kind::sdpa) {
        const auto r = scaled_dot_product_attention_backward<Policy, Input, Input, Input, Input>(
            in.sdpa_q(), in.sdpa_k(), in.sdpa_v(), {g.data(), {d.batch, d.heads, d.query_length, d.head_dim_v}}, o, {algorithm});
        return {{"grad_query", flat(r.grad_query)}, {"grad_key", flat(r.grad_key)}, {"grad_value", flat(r.grad_value)}};
    }
    const mha_options mo{d.heads, d.kv_heads, o};
    const auto r = multi_head_attention_backward<Policy, Input, Input, Input>(in.x_q(), in.x_k(), in.x_v(), in.params(), mo,
                                                                              {g.data(), {d.batch, d.query_length, d.output_dim}}, {algorithm});
    std::vector<std::pair<std::string, std::vector<double>>> out{
        {"grad_query", flat(r.grad_x_q)}, {"grad_key", flat(r.grad_x_k)}, {"grad_value", flat(r.grad_x_v)}, {"grad_w_q", flat(r.grad_w_q)},
        {"grad_w_k", flat(r.grad_w_k)},   {"grad_w_v", flat(r.grad_w_v)}, {"grad_w_o", flat(r.grad_w_o)}};
    if (spec.conventions.projection_bias) {
        out.push_back({"grad_b_q", flat(r.grad_b_q)});
        out.push_back({"grad_b_k", flat(r.grad_b_k)});
        out.push_back({"grad_b_v", flat(r.grad_b_v)});
        out.push_back({"grad_b_o", flat(r.grad_b_o)});
    }
    return out;
}

namespace check_detail {
/// attnref's own gradients in the candidate's format (the baseline rule's "naive" implementation):
/// float64, float32, and bf16/fp16 storage with float32 accumulation.
inline std::vector<std::pair<std::string, std::vector<double>>> naive_gradients(const case_spec& spec, const case_data& data,
                                                                               std::span<const double> g, tol::candidate_format f) {
    switch (f) {
        case tol::candidate_format::float64: return compute_case_gradients<uniform_precision<double>>(spec, data, g);
        case tol::candidate_format::float32: return compute_case_gradients<uniform_precision<float>>(spec, data, g);
        case tol::candidate_format::bfloat16:
            return compute_case_gradients<precision_policy<formats::bfloat16, float, formats::bfloat16, formats::bfloat16>>(spec, data, g);
        case tol::candidate_format::float16:
            return compute_case_gradients<precision_policy<formats::float16, float, formats::float16, formats::float16>>(spec, data, g);
    }
    return {};
}
/// Whether every input (and grad_output) of the case is a value of format f (else the candidate
/// rounds them first, and the bound carries that rounding: u_inputs).
inline bool inputs_representable(const case_data& data, std::span<const double> g, tol::candidate_format f) {
    for (const std::vector<double>* v : {&data.query, &data.key, &data.value, &data.w_q, &data.w_k, &data.w_v, &data.w_o, &data.b_q,
                                         &data.b_k, &data.b_v, &data.b_o})
        for (double x : *v)
            if (std::isfinite(x) && tol::round_to(f, x) != x) return false;
    for (double x : g)
        if (std::isfinite(x) && tol::round_to(f, x) != x) return false;
    return true;
}
inline std::vector<double> flat_of(const auto& t) { return std::vector<double>(t.data(), t.data() + t.size()); }
}  // namespace check_detail

inline std::vector<std::pair<std::string, std::vector<double>>> gradient_bounds_for(const case_spec& spec, const case_data& data,
                                                                                    const gradient_reference& ref, tol::candidate_format f,
                                                                                    std::optional<backward_algorithm> declared,
                                                                                    const std::optional<tol::policy_roundoffs>& policy) {
    namespace cd = check_detail;
    const case_shapes& d = spec.shapes;
    const double u = policy ? policy->accumulate : tol::accumulate_roundoff(f), u_fmt = policy ? std::max(policy->storage, policy->output) : tol::unit_roundoff(f);
    const double us = u_fmt > u ? u_fmt : 0;  // bf16/fp16 storage with float32 accumulation: (B7)
    const double uw = policy ? (policy->weights > u ? policy->weights : 0) : us;  // P stored before dV = Pᵀ·dO
    const double u_in = cd::inputs_representable(data, ref.grad_output, f) ? 0 : u_fmt;
    const case_views c = views_of(spec, data);
    const tensor_view<const double, 4> w = c.weights(ref.weights);
    const tensor_view<const double, 3> lse{ref.lse.data(), {d.batch, d.heads, d.query_length}};
    std::vector<std::pair<std::string, std::vector<double>>> r;
    if (c.sdpa()) {
        const tensor_view<const double, 4> g{ref.grad_output.data(), {d.batch, d.heads, d.query_length, d.head_dim_v}};
        const sdpa_gradient_bounds b = sdpa_gradient_first_order_bounds_rounded_inputs(c.q, c.k, c.v, g, w, lse, c.o, u, us, uw, u_in, declared);
        r = {{"grad_query", cd::flat_of(b.grad_query)}, {"grad_key", cd::flat_of(b.grad_key)}, {"grad_value", cd::flat_of(b.grad_value)}};
    } else {
        const tensor_view<const double, 3> g{ref.grad_output.data(), {d.batch, d.query_length, d.output_dim}};
        const mha_gradient_bounds b = mha_gradient_first_order_bounds(c.x_q, c.x_k, c.x_v, c.w, c.mo, g, w, lse, u, us, uw, u_in, declared);
        r = {{"grad_query", cd::flat_of(b.grad_x_q)}, {"grad_key", cd::flat_of(b.grad_x_k)}, {"grad_value", cd::flat_of(b.grad_x_v)},
             {"grad_w_q", cd::flat_of(b.grad_w_q)},   {"grad_w_k", cd::flat_of(b.grad_w_k)}, {"grad_w_v", cd::flat_of(b.grad_w_v)},
             {"grad_w_o", cd::flat_of(b.grad_w_o)},   {"grad_b_q", cd::flat_of(b.grad_b_q)}, {"grad_b_k", cd::flat_of(b.grad_b_k)},
             {"grad_b_v", cd::flat_of(b.grad_b_v)},   {"grad_b_o", cd::flat_of(b.grad_b_o)}};
    }
    for (auto& [role, bounds] : r)
        if (const std::vector<double>* e = ref.find(role))
            for (std::size_t n = 0; n < bounds.size() && n < e->size(); ++n) bounds[n] += 0x1p-53 * std::fabs((*e)[n]);  // the reference's rounding
    return r;
}

inline void check_gradients(const case_spec& spec, const case_data& data, const gradient_reference& ref, std::span<const gradient_tensor> got,
                            tol::candidate_format f, tol::tolerance_model model, check_result& res,
                            std::optional<backward_algorithm> declared, const std::optional<tol::policy_roundoffs>& declared_policy) {
    namespace cd = check_detail;
    if (model != tol::tolerance_model::data_aware && model != tol::tolerance_model::baseline)
        throw data_error(std::string("command line: --tolerance: ") + std::string(tol::model_name(model)) +
                         " is not available for gradients (data-aware or baseline)");
    const auto roles = gradient_roles(spec);
    auto shape_of = [&](const std::string& role) -> const std::vector<std::size_t>* {
        for (const auto& [r, s] : roles)
            if (r == role) return &s;
        return nullptr;
    };
    std::optional<std::vector<std::pair<std::string, std::vector<double>>>> bounds, naive;
    auto find = [](const auto& list, const std::string& role) -> const std::vector<double>* {
        for (const auto& [r, v] : list)
            if (r == role) return &v;
        return nullptr;
    };
    const double scale = spec.conventions.scale ? std::fabs(*spec.conventions.scale)
                                                : 1 / std::sqrt(static_cast<double>(spec.shapes.head_dim_qk));
    std::map<std::string, std::span<const double>> given;
    for (const gradient_tensor& t : got) {
        const std::vector<std::size_t>* shape = shape_of(t.role);
        if (!shape) throw data_error("command line: --" + cd::flag_of(t.role) + ": not a gradient of the " + std::string(spec.kind == case_kind::sdpa ? "sdpa" : "mha") + " case " + spec.name);
        const std::vector<double>* expected = ref.find(t.role);
        if (!expected) throw data_error("case " + spec.name + ": no certified gradient '" + t.role + "' in its manifest");
        std::size_t n = 1;
        for (std::size_t e : *shape) n *= e;
        if (t.values.size() != n || expected->size() != n)
            throw data_error("candidate " + t.role + ": " + std::to_string(t.values.size()) + " values, the case " + spec.name + " needs " +
                             std::to_string(n) + " (shape " + cd::shape_text(*shape) + ")");
        given[t.role] = t.values;
        std::vector<double> b;
        if (model == tol::tolerance_model::data_aware) {
            if (!bounds) bounds = gradient_bounds_for(spec, data, ref, f, declared, declared_policy);
            b = *find(*bounds, t.role);
        } else {  // FlashAttention's rule, one number per tensor (tol::baseline_bound)
            if (!naive) naive = cd::naive_gradients(spec, data, ref.grad_output, f);
            b.assign(n, tol::baseline_bound(*expected, *find(*naive, t.role), f));
        }
        const std::size_t row = shape->back();
        // grad_b_k is exactly 0 (a key bias shifts a row's logits alike): its scale is grad_w_k's.
        double fixed_scale = 0;
        if (t.role == "grad_b_k")
            if (const std::vector<double>* wk = ref.find("grad_w_k"))
                for (double x : *wk) fixed_scale = std::max(fixed_scale, std::isfinite(x) ? std::fabs(x) : 0.0);
        const tol::comparison cmp = tol::compare(t.values, *expected, f, [&](std::size_t e) { return b[e]; });
        const tol::vacuity vac = tol::find_vacuous(*expected, shape->size() == 1 ? n : row, [&](std::size_t e) { return b[e]; }, fixed_scale);
        tensor_report tr = cd::judged(t.role, cmp, vac, fixed_scale > 0 ? "max |grad_w_k|" : "row scale max|expected|");
        if (tr.verdict == "pass") {
            // Decoys: a grossly wrong gradient (0, twice the gradient, the gradient with the scale dropped).
            std::vector<decoy> decoys;
            decoys.push_back({"zero gradient", std::vector<double>(n, 0.0)});
            std::vector<double> twice(*expected), unscaled(*expected);
            for (double& x : twice) x *= 2;
            for (double& x : unscaled) x /= scale;
            decoys.push_back({"twice the gradient", twice});
            if (scale != 1) decoys.push_back({"the gradient with the scale dropped", unscaled});
            if (const decoy* p = passing_decoy(decoys, *expected, f, b, shape->size() == 1 ? n : row)) {
                tr.verdict = "INCONCLUSIVE";
                tr.note = "the bound admits a trivially wrong gradient (" + p->name + "); a pass would prove nothing";
            }
        }
        if (model == tol::tolerance_model::data_aware && t.role == "grad_query" && attnref::detail::textbook_bound_applies(declared, views_of(spec, data).o))
            tr.note += std::string(tr.note.empty() ? "" : "; ") + "bound (B5t) of the declared textbook backward";
        if (spec.shapes.heads != spec.shapes.kv_heads && (t.role == "grad_key" || t.role == "grad_value"))
            tr.note += std::string(tr.note.empty() ? "" : "; ") + "GQA: the sum over the group is checked by this comparison with the certified values";
        res.tensors.push_back(std::move(tr));
    }
    if (spec.kind != case_kind::sdpa) return;  // the invariants below are on SDPA's dK, dV
    const case_shapes& d = spec.shapes;
    const std::size_t group = d.heads / d.kv_heads, sq = d.query_length, sk = d.key_length, dk = d.head_dim_qk, dv = d.head_dim_v;
    const case_views c = views_of(spec, data);
    const empty_row_policy policy = spec.conventions.empty_rows;
    auto masked_for_group = [&](std::size_t b, std::size_t hk, std::size_t j) {
        for (std::size_t h = hk * group; h < (hk + 1) * group; ++h)
            for (std::size_t i = 0; i < sq; ++i)
                if (!structurally_masked(c.o.mask, b, h, i, j, sq, sk)) return false;
        return true;
    };
    const auto dK = given.find("grad_key"), dV = given.find("grad_value");
    if (policy == empty_row_policy::zero && (dK != given.end() || dV != given.end())) {
        invariant_report r;
        r.name = "dK, dV of fully masked keys exactly 0";
        for (std::size_t b = 0; b < d.batch; ++b)
            for (std::size_t hk = 0; hk < d.kv_heads; ++hk)
                for (std::size_t j = 0; j < sk; ++j) {
                    if (!masked_for_group(b, hk, j)) continue;
                    double worst = 0;
                    if (dK != given.end())
                        for (std::size_t x = 0; x < dk; ++x) {
                            const double y = dK->second[((b * d.kv_heads + hk) * sk + j) * dk + x];
                            worst = std::isnan(y) ? std::numeric_limits<double>::infinity() : std::max(worst, std::fabs(y));
                        }
                    if (dV != given.end())
                        for (std::size_t x = 0; x < dv; ++x) {
                            const double y = dV->second[((b * d.kv_heads + hk) * sk + j) * dv + x];
                            worst = std::isnan(y) ? std::numeric_limits<double>::infinity() : std::max(worst, std::fabs(y));
                        }
                    r.record(worst == 0, worst, 0, {b, hk, j, 0});
                }
        res.invariants.push_back(r);
    }
    const bool nan_rows = policy == empty_row_policy::nan && std::any_of(ref.weights.begin(), ref.weights.end(), [](double x) { return std::isnan(x); });
    if (dK != given.end() && !spec.conventions.softcap && !nan_rows) {
        // Σ_j dK_jc = s Σ_i (Σ_j dS_ij) q_ic = 0: within the sum of the elements' bounds (data-aware).
        if (!bounds) bounds = gradient_bounds_for(spec, data, ref, f, declared, declared_policy);
        const std::vector<double>& bk = *find(*bounds, "grad_key");
        const std::vector<double>& ek = *ref.find("grad_key");  // the certified dK: the invariant's scale
        invariant_report r;
        r.name = "sum over keys of dK = 0";
        for (std::size_t b = 0; b < d.batch; ++b)
            for (std::size_t hk = 0; hk < d.kv_heads; ++hk)
                for (std::size_t x = 0; x < dk; ++x) {
                    double sum = 0, magnitude = 0, bound = 0, terms = 0;
                    for (std::size_t j = 0; j < sk; ++j) {
                        const std::size_t e = ((b * d.kv_heads + hk) * sk + j) * dk + x;
                        sum += dK->second[e];
                        magnitude += std::fabs(dK->second[e]);
                        bound += bk[e];
                        terms += std::fabs(ek[e]);
                    }
                    bound += static_cast<double>(sk + 1) * 0x1p-53 * magnitude;  // this double sum's own rounding
                    // Vacuous when the bound reaches Σ_j |dK_jc| (the size of the terms summed): then any dK
                    // column of that size would satisfy it.
                    if (!(bound < terms) && terms > 0) r.vacuous = true;
                    r.record(std::fabs(sum) <= bound, std::fabs(sum), bound, {b, hk, x, 0});
                }
        res.invariants.push_back(r);
    }
    if (dV != given.end() && !nan_rows) {
        // dV_j = Σ_{h in group} Σ_i P_ij dO_i with the certified P, within dV's bound (plus this sum's rounding).
        if (!bounds) bounds = gradient_bounds_for(spec, data, ref, f, std::nullopt, declared_policy);
        const std::vector<double>& bv = *find(*bounds, "grad_value");
        const std::vector<double>& ev = *ref.find("grad_value");
        invariant_report r;
        r.name = "dV = P^T dO (certified P)";
        for (std::size_t b = 0; b < d.batch; ++b)
            for (std::size_t hk = 0; hk < d.kv_heads; ++hk)
                for (std::size_t j = 0; j < sk; ++j)
                    for (std::size_t x = 0; x < dv; ++x) {
                        double acc = 0, magnitude = 0;
                        for (std::size_t h = hk * group; h < (hk + 1) * group; ++h)
                            for (std::size_t i = 0; i < sq; ++i) {
                                const double p = ref.weights[((b * d.heads + h) * sq + i) * sk + j];
                                const double g = ref.grad_output[((b * d.heads + h) * sq + i) * dv + x];
                                acc += p * g;
                                magnitude += std::fabs(p * g);
                            }
                        const std::size_t e = ((b * d.kv_heads + hk) * sk + j) * dv + x;
                        const double bound = bv[e] + static_cast<double>(group * sq + 3) * 0x1p-53 * magnitude;
                        const double dev = std::isnan(dV->second[e]) ? std::numeric_limits<double>::infinity() : std::fabs(dV->second[e] - acc);
                        // Vacuous where the bound reaches the row's scale max_c |dV_jc| (find_vacuous's rule).
                        double row_scale = 0;
                        for (std::size_t y = 0; y < dv; ++y)
                            row_scale = std::max(row_scale, std::fabs(ev[((b * d.kv_heads + hk) * sk + j) * dv + y]));
                        if (!(bound < row_scale) && row_scale > 0) r.vacuous = true;
                        r.record(dev <= bound, dev, bound, {b, hk, j, x});
                    }
        res.invariants.push_back(r);
    }
}

inline gradient_reference gradient_reference_of(const loaded_case& lc) {
    const case_spec& spec = lc.m.spec;
    gradient_reference r;
    const tensor_entry* g = lc.entry("grad_output");
    if (!g) throw data_error((lc.dir / "manifest.json").string() + ": field 'tensors': no tensor with role 'grad_output' (the case " + spec.name + " has no certified gradients)");
    r.grad_output = lc.reference(*g);
    for (const auto& [role, shape] : gradient_roles(spec))
        if (const tensor_entry* t = lc.entry(role)) r.certified.push_back({role, lc.reference(*t)});
    r.weights = reference_weights(lc);
    if (const tensor_entry* t = lc.entry("lse")) r.lse = lc.reference(*t);
    else {
        case_spec s = spec;
        s.outputs.weights = false;
        s.outputs.lse = true;
        const auto o = compute_case<uniform_precision<double>>(s, lc.data, 0);
        r.lse.assign(o.lse.data(), o.lse.data() + o.lse.size());
    }
    return r;
}

inline check_result check(const loaded_case& lc, const candidate& c, const check_options& opt) {
    namespace cd = check_detail;
    const case_spec& spec = lc.m.spec;
    const case_shapes& d = spec.shapes;
    const tol::candidate_format format = c.format;
    const tol::candidate_format wf = c.weights_format.value_or(format);  // the format the candidate's weights come in
    const tol::candidate_format lf = c.lse_format.value_or(format);
    auto require_size = [&](const char* what, std::span<const double> v, const std::vector<std::size_t>& shape) {
        std::size_t n = 1;
        for (std::size_t e : shape) n *= e;
        if (v.size() != n)
            throw data_error(std::string("candidate ") + what + ": " + std::to_string(v.size()) + " values, the case " + spec.name +
                             " needs " + std::to_string(n) + " (shape " + cd::shape_text(shape) + ")");
    };
    if (c.output.empty() && c.gradients.empty())
        throw data_error("candidate: nothing to check (give the output, or at least one gradient)");
    // A declared policy is about the candidate's own results: they must be in its output format, and
    // only the data-aware bounds follow it.
    if (opt.policy && tol::unit_roundoff(format) != opt.policy->output)
        throw data_error(fmt::format("command line: --policy: the policy writes results with unit roundoff {:g}, the candidate's are {} (unit roundoff {:g})",
                                     opt.policy->output, tol::format_name(format), tol::unit_roundoff(format)));
    if (opt.policy && opt.model != tol::tolerance_model::data_aware)
        throw data_error("command line: --policy: only with --tolerance data-aware");
    if (!c.output.empty()) require_size("output", c.output, output_shape(spec));
    if (!c.weights.empty()) require_size("weights", c.weights, weights_shape(spec));
    if (!c.lse.empty()) require_size("lse", c.lse, lse_shape(spec));
    check_result res;
    res.case_name = spec.name;
    res.format = format;
    res.model = opt.model;
    res.declared_backward = opt.declared_backward;
    const double u = tol::unit_roundoff(format), u_acc = tol::accumulate_roundoff(format);
    const case_views views = views_of(spec, lc.data);
    std::optional<std::vector<double>> golden_p;  // the golden weights, read (or computed) once when needed
    auto golden_weights = [&]() -> const std::vector<double>& {
        if (!golden_p) golden_p = reference_weights(lc);
        return *golden_p;
    };
    // The data-aware terms (for the default model and the weights and lse bounds), computed once
    // when needed. Nothing is cached between runs: every bound that decides a verdict is computed
    // here from the golden case (whose files load_case checked against the manifest's sha256).
    std::optional<tol::data_aware_scales> scales;
    auto case_scales = [&]() -> const tol::data_aware_scales& {
        // Inputs exact in the candidate's format (e.g. a reference certified for the rounded inputs,
        // golden/rounded_inputs.hpp): reading them rounds nothing, and the bound drops that term.
        if (!scales) scales = data_aware_scales_for(spec, lc.data, golden_weights(), cd::inputs_representable(lc.data, {}, format));
        return *scales;
    };

    if (!c.output.empty()) {
    const tensor_entry* out_entry = lc.entry("output");
    if (!out_entry) throw data_error((lc.dir / "manifest.json").string() + ": field 'tensors': no tensor with role 'output'");
    const std::vector<double> expected = lc.reference(*out_entry);
    const std::span<const double> candidate = c.output;
    const std::vector<std::size_t> oshape = output_shape(spec);
    const std::size_t row = oshape.back();
    if (opt.model == tol::tolerance_model::data_aware || opt.model == tol::tolerance_model::worst_case) {
        const std::vector<double> bounds = opt.model == tol::tolerance_model::data_aware
                                               ? (opt.policy ? tol::element_bounds(case_scales(), opt.policy->widest_storage(), opt.policy->accumulate)
                                                             : tol::element_bounds(case_scales(), format))
                                               : tol::element_bounds(worst_case_scales_for(spec, lc.data, golden_weights()), format);
        res.tensors.push_back(cd::judge_with_decoys(candidate, expected, format, bounds, row, spec, lc.data));
    } else if (opt.model == tol::tolerance_model::ulp) {
        // A bound in ULPs of the candidate's format: the values' own resolution, never vacuous.
        res.tensors.push_back(cd::judged_output(tol::compare_ulp(candidate, expected, format), {}, candidate, expected, row));
    } else {
        std::vector<double> bounds(expected.size());
        if (opt.model == tol::tolerance_model::assert_close) {
            const tol::rtol_atol t = tol::assert_close_defaults(format);
            for (std::size_t n = 0; n < bounds.size(); ++n) bounds[n] = t.atol + t.rtol * std::fabs(expected[n]);
        } else {
            std::fill(bounds.begin(), bounds.end(), tol::baseline_bound(expected, cd::naive_output(spec, lc.data, format), format));
        }
        res.tensors.push_back(cd::judge_with_decoys(candidate, expected, format, bounds, row, spec, lc.data));
    }

    }
    if (!c.gradients.empty())
        check_gradients(spec, lc.data, gradient_reference_of(lc), c.gradients, format, opt.model, res, opt.declared_backward, opt.policy);

    // Invariants on the weights and lse the candidate returned.
    invariant_context ctx{views.o.mask, spec.conventions.empty_rows, opt.empty_lse};
    const extents_t<4> wext{d.batch, d.heads, d.query_length, d.key_length};
    if (!c.weights.empty()) {
        tensor_view<const double, 4> p{c.weights.data(), wext};
        // Computed with the candidate's accumulation, stored in the weights' format; a weight in the
        // subnormal range of either is rounded with an absolute error of half its subnormal spacing.
        const double u_w = tol::unit_roundoff(wf);
        const double eta = half_subnormal_spacing(u_acc, tol::weights_floor(format)) + half_subnormal_spacing(u_w, tol::weights_floor(wf));
        res.invariants.push_back(rows_sum_to_one(p, ctx, u_acc, u_w, eta));
        res.invariants.push_back(masked_weights_are_zero(p, ctx));
        res.invariants.push_back(weights_in_unit_interval(p, ctx));
        // Against the golden weights, element by element (tolerance::weights_bound; any model).
        if (lc.entry("weights")) {
            const std::vector<double>& pe = golden_weights();
            const auto bound_at = tol::weights_bound_at(pe, format, wf, case_scales());
            res.tensors.push_back(cd::judged("weights", tol::compare(c.weights, pe, wf, bound_at), tol::find_vacuous(pe, d.key_length, bound_at),
                                             "row scale max p"));
        }
    }
    if (!c.lse.empty()) {
        if (!c.weights.empty()) {
            // P = exp(S − lse) with the exact S: the candidate's own logits are within the row's
            // data-aware logit bound ε of it (tolerance::data_aware_scales::logit_epsilon), and its
            // weights may be stored in a narrower format than its output. The softmax runs in the
            // candidate's accumulation (u_acc); P and lse are rounded once more to their storage
            // formats. Weights below the smallest normal of the formats P is computed and stored in
            // may be flushed or rounded to it.
            const std::vector<double> eps = case_scales().logit_bounds(u, u_acc);
            const tensor<double, 4> logits = exact_logits(views);
            res.invariants.push_back(weights_match_lse(tensor_view<const double, 4>{c.weights.data(), wext}, logits.view(),
                                                       tensor_view<const double, 3>{c.lse.data(), {d.batch, d.heads, d.query_length}},
                                                       ctx, u_acc, eps, std::max(tol::weights_floor(format), tol::weights_floor(wf)),
                                                       tol::unit_roundoff(wf), tol::unit_roundoff(lf)));
        }
        // lse against the reference (tolerance::lse_bound). Empty rows are pinned by the candidate's
        // declared convention (--empty-row-lse), not by the golden −inf.
        if (const tensor_entry* t = lc.entry("lse")) {
            const std::vector<double> le = lc.reference(*t);
            std::vector<double> lc_cmp(c.lse.begin(), c.lse.end());
            std::size_t wrong_empty = 0;
            for (std::size_t b = 0; b < d.batch; ++b)
                for (std::size_t h = 0; h < d.heads; ++h)
                    for (std::size_t i = 0; i < d.query_length; ++i) {
                        if (!attnref::detail::row_is_empty(ctx.mask, b, h, i, d.query_length, d.key_length)) continue;
                        const std::size_t at = (b * d.heads + h) * d.query_length + i;
                        if (empty_row_lse_ok(opt.empty_lse, c.lse[at])) lc_cmp[at] = le[at];
                        else ++wrong_empty;
                    }
            const auto bound_at = tol::lse_bound_at(le, format, lf, case_scales());
            tensor_report lr = cd::judged("lse", tol::compare(lc_cmp, le, lf, bound_at), tol::find_vacuous(le, 1, bound_at, tol::lse_vacuity_scale),
                                          "ln 2 (the normaliser e^lse off by 2x)");
            if (wrong_empty) lr.note += (lr.note.empty() ? "" : "; ") + fmt::format("{} empty rows without the declared lse", wrong_empty);
            res.tensors.push_back(lr);
        }
    }
    decide(res);
    return res;
}

inline check_result check(const loaded_case& lc, std::span<const double> output, tolerance::candidate_format format,
                          const check_options& opt) {
    candidate c;
    c.output = output;
    c.format = format;
    return check(lc, c, opt);
}

inline check_result run_check(const check_request& rq) {
    const loaded_case lc = load_case(rq.golden);
    const case_spec& spec = lc.m.spec;
    std::optional<tol::candidate_format> format = rq.dtype, wf = rq.dtype, lf = rq.dtype;
    if (rq.output.empty() && rq.gradients.empty())
        throw data_error("command line: give --output or at least one gradient (--grad-query, --grad-key, --grad-value, …)");
    const auto roles = gradient_roles(spec);
    std::vector<std::vector<double>> gradient_values;
    std::vector<gradient_tensor> gradients;
    for (const auto& [role, file] : rq.gradients) {
        const auto it = std::find_if(roles.begin(), roles.end(), [&](const auto& r) { return r.first == role; });
        if (it == roles.end())
            throw data_error("command line: --" + check_detail::flag_of(role) + ": not a gradient of the " +
                             std::string(spec.kind == case_kind::sdpa ? "sdpa" : "mha") + " case " + spec.name +
                             (spec.kind == case_kind::mha && !spec.conventions.projection_bias && role.rfind("grad_b_", 0) == 0 ? " (it has no biases)" : ""));
        if (!lc.entry(role))
            throw data_error((lc.dir / "manifest.json").string() + ": field 'tensors': no tensor with role '" + role + "' (the case " +
                             spec.name + " has no certified gradients)");
        gradient_values.push_back(read_candidate(file, it->second, format));
    }
    for (std::size_t n = 0; n < rq.gradients.size(); ++n) gradients.push_back({rq.gradients[n].first, gradient_values[n]});
    std::vector<double> output;
    if (!rq.output.empty()) output = read_candidate(rq.output, output_shape(spec), format);
    std::vector<double> weights, lse;
    if (!rq.weights.empty()) weights = read_candidate(rq.weights, weights_shape(spec), wf);
    if (!rq.lse.empty()) lse = read_candidate(rq.lse, lse_shape(spec), lf);
    candidate c;
    c.output = output;
    c.weights = weights;
    c.lse = lse;
    c.format = *format;
    c.weights_format = wf;
    c.lse_format = lf;
    c.gradients = gradients;
    return check(lc, c, check_options{rq.model, rq.empty_lse, rq.declared_backward, rq.policy});
}


inline std::string report_table(const check_result& r, bool colour) {
    std::string s = fmt::format("case {}  candidate {}  model {}{}\n", r.case_name, tol::format_name(r.format), tol::model_name(r.model),
                                r.declared_backward ? fmt::format("  backward {} (declared)", backward_algorithm_name(*r.declared_backward)) : "");
    s += fmt::format("{:<10} {:>11} {:>11} {:>9} {:>11} {:>11} {:>10} {:>24} {:>14}  {}\n", "tensor", "max abs", "max rel", "max ULP",
                     "RMS", "worst/bound", "worst idx", "candidate vs expected", "violations", "verdict");
    for (const tensor_report& t : r.tensors) {
        const tol::comparison& c = t.cmp;
        const double pct = c.elements ? 100.0 * static_cast<double>(c.violations) / static_cast<double>(c.elements) : 0;
        std::string verdict = t.verdict;
        if (colour)
            verdict = fmt::format(fmt::fg(t.verdict == "pass" ? fmt::color::green : t.verdict == "FAIL" ? fmt::color::red : fmt::color::orange),
                                  "{}", t.verdict);
        s += fmt::format("{:<10} {:>11.3e} {:>11.3e} {:>9.3g} {:>11.3e} {:>11.3g} {:>10} {:>11.4g} vs {:<9.4g} {:>6} ({:>5.1f}%)  {}{}\n",
                         t.name, c.max_abs, c.max_rel, c.max_ulp, c.rms, c.worst_ratio, c.worst_index, c.worst_candidate,
                         c.worst_expected, c.violations, pct, verdict, t.note.empty() ? "" : " (" + t.note + ")");
    }
    for (const invariant_report& i : r.invariants)
        s += fmt::format("invariant {:<36} checked {:>8}  violations {:>6}  worst {:.3e} (bound {:.3e})  {}\n", i.name, i.checked,
                         i.violations, i.worst, i.bound, !i.ok ? "FAIL" : i.vacuous ? "INCONCLUSIVE (vacuous bound)" : "pass");
    s += r.overall == verdict::pass ? std::string("PASS\n") : fmt::format("{}: {}\n", verdict_name(r.overall), r.reason);
    return s;
}

inline std::string report_json(const check_result& r) {
    nlohmann::ordered_json j;
    j["case"] = r.case_name;
    j["candidate_dtype"] = tol::format_name(r.format);
    j["tolerance"] = tol::model_name(r.model);
    if (r.declared_backward) j["backward_algorithm"] = backward_algorithm_name(*r.declared_backward);  // as declared
    j["verdict"] = verdict_name(r.overall);  // PASS, FAIL or INCONCLUSIVE (exit 0, 1, 1)
    j["reason"] = r.reason;
    j["passed"] = r.passed;
    auto num = [](double x) -> nlohmann::ordered_json { return std::isfinite(x) ? nlohmann::ordered_json(x) : nlohmann::ordered_json(fmt::format("{}", x)); };
    for (const tensor_report& t : r.tensors) {
        const tol::comparison& c = t.cmp;
        j["tensors"].push_back({{"name", t.name}, {"elements", c.elements}, {"max_abs_error", num(c.max_abs)},
                                {"max_rel_error", num(c.max_rel)}, {"max_ulp", num(c.max_ulp)}, {"rms", num(c.rms)},
                                {"worst_in_bound_units", num(c.worst_ratio)}, {"worst_index", c.worst_index},
                                {"worst_candidate", num(c.worst_candidate)}, {"worst_expected", num(c.worst_expected)},
                                {"worst_bound", num(c.worst_bound)}, {"violations", c.violations},
                                {"nonfinite_mismatches", c.nonfinite_mismatches}, {"vacuous_bounds", t.vacuous.elements},
                                {"verdict", t.verdict}, {"note", t.note}});
    }
    j["invariants"] = nlohmann::ordered_json::array();
    for (const invariant_report& i : r.invariants)
        j["invariants"].push_back({{"name", i.name}, {"ok", i.ok}, {"vacuous_bound", i.vacuous}, {"checked", i.checked},
                                   {"violations", i.violations}, {"worst", num(i.worst)}, {"bound", num(i.bound)}});
    return j.dump(2) + "\n";
}

namespace check_detail {
inline std::string xml_escape(const std::string& s) {
    std::string r;
    for (char c : s) {
        switch (c) {
            case '<': r += "&lt;"; break;
            case '>': r += "&gt;"; break;
            case '&': r += "&amp;"; break;
            case '"': r += "&quot;"; break;
            default: r += c;
        }
    }
    return r;
}
}  // namespace check_detail
inline std::string report_junit(const check_result& r) {
    std::size_t failures = 0;
    std::string cases;
    // A test case that is not a pass is a <failure>; its type says which verdict: FAIL, or
    // INCONCLUSIVE (a vacuous bound, an untrustworthy output) — neither may let CI go green.
    auto add = [&](const std::string& name, const std::string& type, const std::string& detail) {
        cases += fmt::format("    <testcase classname=\"attnref.check.{}\" name=\"{}\">\n", check_detail::xml_escape(r.case_name), check_detail::xml_escape(name));
        if (!type.empty()) {
            ++failures;
            cases += fmt::format("      <failure type=\"{}\" message=\"{}\">{}</failure>\n", type, check_detail::xml_escape(detail), check_detail::xml_escape(detail));
        }
        cases += fmt::format("      <system-out>{}</system-out>\n    </testcase>\n", check_detail::xml_escape(detail));
    };
    for (const tensor_report& t : r.tensors) {
        const tol::comparison& c = t.cmp;
        add(t.name + " (" + std::string(tol::model_name(r.model)) + ")",
            t.verdict == "pass" ? "" : t.verdict == "FAIL" ? "FAIL" : "INCONCLUSIVE",
            fmt::format("{}: max abs {:.3e}, max rel {:.3e}, max ULP {:.3g}, RMS {:.3e}, worst {:.3g} bounds at {} ({:.6g} vs {:.6g}), "
                        "{} violations of {}{}",
                        t.verdict, c.max_abs, c.max_rel, c.max_ulp, c.rms, c.worst_ratio, c.worst_index, c.worst_candidate,
                        c.worst_expected, c.violations, c.elements, t.note.empty() ? "" : "; " + t.note));
    }
    for (const invariant_report& i : r.invariants)
        add(i.name, !i.ok ? "FAIL" : i.vacuous ? "INCONCLUSIVE" : "",
            fmt::format("{} checked, {} violations, worst {:.3e} (bound {:.3e}){}", i.checked, i.violations, i.worst, i.bound,
                        i.ok && i.vacuous ? "; the bound is vacuous: a pass proves nothing" : ""));
    const std::size_t tests = r.tensors.size() + r.invariants.size();
    return fmt::format("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites tests=\"{0}\" failures=\"{1}\">\n"
                       "  <testsuite name=\"attnref check {2}\" tests=\"{0}\" failures=\"{1}\">\n"
                       "    <properties><property name=\"verdict\" value=\"{4}\"/><property name=\"reason\" value=\"{5}\"/></properties>\n"
                       "{3}  </testsuite>\n</testsuites>\n",
                       tests, failures, check_detail::xml_escape(r.case_name), cases, verdict_name(r.overall), check_detail::xml_escape(r.reason));
}

}  // namespace attnref::golden
