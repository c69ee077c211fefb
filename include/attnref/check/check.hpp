#pragma once
/// \file check/check.hpp
/// The checker's entry points: check() judges a candidate in memory against a loaded golden case,
/// run_check() reads the candidate's .npy files first (`attnref check`). Each tensor is judged in
/// its own format (the candidate's `format`, gradient_tensor::format, weights_format, lse_format;
/// from each file's descr in run_check, or --dtype).
///
///     candidate ─┬─ output ────────── judge_case_output   (forward.hpp)  ─┐
///                ├─ gradients ─────── check_gradients     (gradients.hpp) ├─ decide (verdict.hpp) ─→ check_result
///                └─ weights, lse ──── judge_weights_lse   (forward.hpp)  ─┘
///
/// The reports of a result are in check/report.hpp.

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "attnref/check/api.hpp"
#include "attnref/check/candidate.hpp"
#include "attnref/check/forward.hpp"
#include "attnref/check/gradients.hpp"
#include "attnref/check/verdict.hpp"
#include "attnref/golden/case.hpp"

// Defined here in header-only use, and once in the compiled library (check/api.hpp).
#if ATTNREF_GOLDEN_BODIES
namespace attnref::golden {

/// Checks a candidate in memory against a loaded case: the output against the reference under
/// opt.model (with the vacuity, decoy and zero-trust rules), the gradients against the certified
/// ones, the weights and lse when given (invariants and element-wise bounds). Throws data_error for
/// unusable input (a size that is not the case's). In a test:
///
///     const auto lc = attnref::golden::load_case("golden/mha_seed_example");
///     const auto r = attnref::golden::check(lc, my_output, attnref::tolerance::candidate_format::float32);
///     BOOST_TEST(r.passed, attnref::golden::report_table(r, false));
ATTNREF_GOLDEN_FN check_result check(const loaded_case& lc, const candidate& c, const check_options& opt) {
    const case_spec& spec = lc.m.spec;
    auto require_size = [&](const char* what, std::span<const double> v, const std::vector<std::size_t>& shape) {
        std::size_t n = 1;
        for (std::size_t e : shape) n *= e;
        if (v.size() != n)
            throw data_error(std::string("candidate ") + what + ": " + std::to_string(v.size()) + " values, the case " + spec.name +
                             " needs " + std::to_string(n) + " (shape " + shape_text(shape) + ")");
    };
    if (c.output.empty() && c.gradients.empty())
        throw data_error("candidate: nothing to check (give the output, or at least one gradient)");
    // A declared policy is about the candidate's own results: they must be in its output format, and
    // only the data-aware bounds follow it.
    namespace tol = attnref::tolerance;
    if (opt.policy && opt.policy->output < tol::unit_roundoff(tol::candidate_format::float64))
        throw data_error(fmt::format("command line: --policy: the policy writes results with unit roundoff {:g}, finer than float64's: no "
                                     "candidate file (float64, float32, bfloat16 or float16) holds them; judge such a candidate without a policy",
                                     opt.policy->output));
    if (opt.policy && tol::unit_roundoff(c.format) != opt.policy->output)
        throw data_error(fmt::format("command line: --policy: the policy writes results with unit roundoff {:g}, the candidate's are {} (unit roundoff {:g})",
                                     opt.policy->output, tol::format_name(c.format), tol::unit_roundoff(c.format)));
    if (opt.policy && opt.model != tol::tolerance_model::data_aware)
        throw data_error("command line: --policy: only with --tolerance data-aware");
    if (!c.output.empty()) require_size("output", c.output, output_shape(spec));
    if (!c.weights.empty()) require_size("weights", c.weights, weights_shape(spec));
    if (!c.lse.empty()) require_size("lse", c.lse, lse_shape(spec));
    check_result res;
    res.case_name = spec.name;
    res.format = c.format;
    res.model = opt.model;
    res.declared_backward = opt.declared_backward;
    // Inputs exact in the candidate's format (e.g. a reference certified for the rounded inputs,
    // golden/rounded_inputs.hpp): reading them rounds nothing, and the bound drops that term.
    forward_reference ref(lc, check_detail::inputs_representable(lc.data, {}, c.format), tol::underflow_terms_for(c.format, opt.policy.has_value()));
    if (!c.output.empty()) res.tensors.push_back(judge_case_output(ref, c.output, c.format, opt.model, opt.policy));
    if (!c.gradients.empty())
        check_gradients(spec, lc.data, gradient_reference_of(lc), c.gradients, c.format, opt.model, res, opt.declared_backward, opt.policy);
    judge_weights_lse(ref, c, opt, res);
    decide(res);
    return res;
}

/// The same for an output alone.
ATTNREF_GOLDEN_FN check_result check(const loaded_case& lc, std::span<const double> output, tolerance::candidate_format format,
                                     const check_options& opt) {
    candidate c;
    c.output = output;
    c.format = format;
    return check(lc, c, opt);
}

/// `attnref check`: loads the case and the candidate's .npy files (read_candidate: each in its own
/// file's format, or rq.dtype), then check(). Throws data_error (exit 2) for unusable inputs.
ATTNREF_GOLDEN_FN check_result run_check(const check_request& rq) { return run_check(rq, load_case(rq.golden)); }

ATTNREF_GOLDEN_FN check_result run_check(const check_request& rq, const loaded_case& lc) {
    namespace tol = attnref::tolerance;
    const case_spec& spec = lc.m.spec;
    if (rq.output.empty() && rq.gradients.empty())
        throw data_error("command line: give --output or at least one gradient (--grad-query, --grad-key, --grad-value, …)");
    const auto roles = gradient_roles(spec);
    std::vector<std::vector<double>> gradient_values;
    std::vector<tol::candidate_format> gradient_formats;
    for (const auto& [role, file] : rq.gradients) {
        const auto it = std::find_if(roles.begin(), roles.end(), [&](const auto& r) { return r.first == role; });
        if (it == roles.end())
            throw data_error("command line: --" + flag_of(role) + ": not a gradient of the " +
                             std::string(spec.kind == case_kind::sdpa ? "sdpa" : "mha") + " case " + spec.name +
                             (spec.kind == case_kind::mha && !spec.conventions.projection_bias && role.rfind("grad_b_", 0) == 0 ? " (it has no biases)" : ""));
        if (!lc.entry(role))
            throw data_error((lc.dir / "manifest.json").string() + ": field 'tensors': no tensor with role '" + role + "' (the case " +
                             spec.name + " has no certified gradients)");
        std::optional<tol::candidate_format> gf = rq.dtype;
        gradient_values.push_back(read_candidate(file, it->second, gf));
        gradient_formats.push_back(*gf);
    }
    std::optional<tol::candidate_format> format = rq.dtype, wf = rq.dtype, lf = rq.dtype;
    std::vector<double> output, weights, lse;
    if (!rq.output.empty()) output = read_candidate(rq.output, output_shape(spec), format);
    if (!format) format = gradient_formats.front();  // gradients only: the weights' and lse's arithmetic
    if (!rq.weights.empty()) weights = read_candidate(rq.weights, weights_shape(spec), wf);
    if (!rq.lse.empty()) lse = read_candidate(rq.lse, lse_shape(spec), lf);
    candidate c;
    c.output = output;
    c.weights = weights;
    c.lse = lse;
    c.format = *format;
    c.weights_format = wf;
    c.lse_format = lf;
    for (std::size_t n = 0; n < rq.gradients.size(); ++n) c.gradients.push_back({rq.gradients[n].first, gradient_values[n], gradient_formats[n]});
    return check(lc, c, check_options{rq.model, rq.empty_lse, rq.declared_backward, rq.policy});
}

}  // namespace attnref::golden
#endif
