#pragma once
/// \file check/forward.hpp
/// Judging a candidate's forward outputs against a golden case: the bound drivers that feed a case
/// to tolerance.hpp (data_aware_scales_for, worst_case_scales_for, reference_weights, naive_output,
/// held for one check by forward_reference), the output under each tolerance model
/// (judge_case_output, with check/judgment.hpp's rules: vacuity, decoys, zero-trust) and the weights
/// and lse (judge_weights_lse: element-wise bounds, invariants.hpp's invariants, the declared
/// empty-row lse convention). A case's problem for the decoys is problem_of(views_of(spec, data)).

#include <algorithm>
#include <cmath>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "attnref/bounds/invariants.hpp"
#include "attnref/bounds/tolerance.hpp"
#include "attnref/check/candidate.hpp"
#include "attnref/check/decoy_rows.hpp"
#include "attnref/check/judge_forward.hpp"
#include "attnref/check/judgment.hpp"
#include "attnref/check/verdict.hpp"
#include "attnref/golden/case.hpp"

namespace attnref::golden {

/// A golden case's decoys (decoy_outputs of its problem).
inline std::vector<decoy> decoy_outputs(const case_spec& spec, const case_data& data) {
    return decoy_outputs(problem_of(views_of(spec, data)));
}

/// attnref's own straightforward implementation in the candidate's precision (baseline model).
inline std::vector<double> naive_output(const case_spec& spec, const case_data& data, tolerance::candidate_format f) {
    using F = tolerance::candidate_format;
    auto flat = [](const auto& t) {
        std::vector<double> r(t.size());
        for (std::size_t n = 0; n < t.size(); ++n) r[n] = static_cast<double>(t[n]);
        return r;
    };
    case_spec s = spec;
    s.outputs.weights = s.outputs.lse = false;
    switch (f) {
        case F::float64: return flat(compute_case<uniform_precision<double>>(s, data, 0).output);
        case F::float32: return flat(compute_case<uniform_precision<float>>(s, data, 0).output);
        case F::bfloat16: return flat(compute_case<precision_policy<formats::bfloat16, float, formats::bfloat16, formats::bfloat16>>(s, data, 0).output);
        case F::float16: return flat(compute_case<precision_policy<formats::float16, float, formats::float16, formats::float16>>(s, data, 0).output);
    }
    return {};
}

/// Per-element data-aware magnitudes of a loaded case from its weights P (B, H, Sq, Sk).
/// inputs_exact: the candidate's inputs are the case's exactly (no input-rounding term); terms: how
/// the underflow coefficients are summed (tolerance::underflow_terms_for the candidate).
inline tolerance::data_aware_scales data_aware_scales_for(const case_spec& spec, const case_data& data, const std::vector<double>& weights,
                                                          bool inputs_exact = false,
                                                          tolerance::underflow_terms terms = tolerance::underflow_terms::per_feature) {
    return data_aware_scales_of(problem_of(views_of(spec, data)), weights, inputs_exact, terms);
}

/// Per-element worst-case magnitudes (the worst-case model) of a loaded case.
inline tolerance::worst_case_scales worst_case_scales_for(const case_spec& spec, const case_data& data, const std::vector<double>& weights) {
    const case_views c = views_of(spec, data);
    return c.sdpa() ? tolerance::sdpa_worst_case_scales(c.q, c.k, c.v, c.weights(weights), c.o)
                    : tolerance::mha_worst_case_scales(c.x_q, c.x_k, c.x_v, c.w, c.weights(weights), c.mo);
}

/// The golden weights of the case (computed in double when the case does not store them).
inline std::vector<double> reference_weights(const loaded_case& lc) {
    if (const tensor_entry* t = lc.entry("weights")) return lc.reference(*t);
    case_spec s = lc.m.spec;  // not stored: attnref in double (σ only needs a few correct digits)
    s.outputs.weights = true;
    s.outputs.lse = false;
    const auto r = compute_case<uniform_precision<double>>(s, lc.data, 0);
    return std::vector<double>(r.weights.data(), r.weights.data() + r.weights.size());
}

/// A loaded case's forward reference, computed when first needed and kept for one check: the
/// golden weights (reference_weights) and the data-aware scales (data_aware_scales_for). Nothing is
/// cached between checks: every bound that decides a verdict is computed from the golden case
/// (whose files load_case checked against the manifest's sha256).
class forward_reference {
public:
    /// inputs_exact: the case's inputs are exactly representable in the candidate's format (its
    /// reading them rounds nothing), so the data-aware scales drop the input-rounding term. terms:
    /// the underflow coefficients the candidate's format needs (tolerance::underflow_terms_for).
    explicit forward_reference(const loaded_case& lc, bool inputs_exact = false,
                               tolerance::underflow_terms terms = tolerance::underflow_terms::per_feature)
        : lc_(lc), views_(views_of(lc.m.spec, lc.data)), inputs_exact_(inputs_exact), terms_(terms) {}
    const loaded_case& lc() const { return lc_; }
    const case_views& views() const { return views_; }
    const std::vector<double>& weights() {
        if (!weights_) weights_ = reference_weights(lc_);
        return *weights_;
    }
    const tolerance::data_aware_scales& scales() {
        if (!scales_) scales_ = data_aware_scales_for(lc_.m.spec, lc_.data, weights(), inputs_exact_, terms_);
        return *scales_;
    }

private:
    const loaded_case& lc_;
    case_views views_;
    bool inputs_exact_ = false;
    tolerance::underflow_terms terms_ = tolerance::underflow_terms::per_feature;
    std::optional<std::vector<double>> weights_;
    std::optional<tolerance::data_aware_scales> scales_;
};

/// Judges a candidate output (values of `format`, the case's output shape) against the case under
/// `model`, with the vacuity, decoy and zero-trust rules.
inline tensor_report judge_case_output(forward_reference& ref, std::span<const double> candidate, tolerance::candidate_format format,
                                       tolerance::tolerance_model model,
                                       const std::optional<tolerance::policy_roundoffs>& policy = std::nullopt) {
    namespace tol = attnref::tolerance;
    const loaded_case& lc = ref.lc();
    const case_spec& spec = lc.m.spec;
    const tensor_entry* out_entry = lc.entry("output");
    if (!out_entry) throw data_error((lc.dir / "manifest.json").string() + ": field 'tensors': no tensor with role 'output'");
    const std::vector<double> expected = lc.reference(*out_entry);
    const std::size_t row = output_shape(spec).back();
    if (model == tol::tolerance_model::ulp)  // a bound in ULPs of the candidate's format: the values' own resolution, never vacuous
        return judged_output(tol::compare_ulp(candidate, expected, format), {}, format, candidate, expected, row);
    std::vector<double> bounds;
    if (model == tol::tolerance_model::data_aware) {
        bounds = policy ? tol::element_bounds(ref.scales(), *policy)  // a declared policy's roundoffs, each where it rounds
                        : tol::element_bounds(ref.scales(), format);
    } else if (model == tol::tolerance_model::worst_case) {
        bounds = tol::element_bounds(worst_case_scales_for(spec, lc.data, ref.weights()), format);
    } else if (model == tol::tolerance_model::assert_close) {
        const tol::rtol_atol t = tol::assert_close_defaults(format);
        bounds.resize(expected.size());
        for (std::size_t n = 0; n < bounds.size(); ++n) bounds[n] = t.atol + t.rtol * std::fabs(expected[n]);
    } else {  // baseline: FlashAttention's rule, one number for the tensor
        bounds.assign(expected.size(), tol::baseline_bound(expected, naive_output(spec, lc.data, format), format));
    }
    return judge_with_decoy_rows(candidate, expected, format, bounds, row, problem_of(ref.views()));
}

/// Judges the candidate's weights and lse (those given) against the case into `res`: invariants.hpp's
/// invariants on them, the element-wise bounds tolerance::weights_bound and lse_bound (any model),
/// and the empty rows' lse against opt.empty_lse. The weights and lse are judged as computed in
/// c.format and stored in their own formats.
inline void judge_weights_lse(forward_reference& ref, const candidate& c, const check_options& opt, check_result& res) {
    namespace tol = attnref::tolerance;
    const loaded_case& lc = ref.lc();
    const case_spec& spec = lc.m.spec;
    const case_shapes& d = spec.shapes;
    const case_views& views = ref.views();
    const tol::candidate_format format = c.format;
    const tol::candidate_format wf = c.weights_format.value_or(format);  // the format the candidate's weights come in
    const tol::candidate_format lf = c.lse_format.value_or(format);
    // Where the candidate's softmax rounds: its declared policy's formats, or every kernel of its format
    // (tolerance::softmax_roundoffs_of); the logits' own rounding needs each row's largest |S_ij|.
    const tol::softmax_roundoffs sr = tol::softmax_roundoffs_of(format, opt.policy);
    const double u = sr.u, u_acc = sr.u_acc;
    auto golden_weights = [&]() -> const std::vector<double>& { return ref.weights(); };
    auto case_scales = [&]() -> const tol::data_aware_scales& { return ref.scales(); };
    std::vector<double> max_abs_logit;  // per row (b, h, i), when sr.u_logits > 0
    if (sr.u_logits > 0 && (!c.weights.empty() || !c.lse.empty())) {
        const tensor<double, 4> logits = exact_logits(views);
        max_abs_logit.assign(d.batch * d.heads * d.query_length, 0.0);
        const double* all = logits.data();
        for (std::size_t r = 0; r < max_abs_logit.size(); ++r)
            for (std::size_t j = 0; j < d.key_length; ++j)
                if (const double x = all[r * d.key_length + j]; std::isfinite(x)) max_abs_logit[r] = std::max(max_abs_logit[r], std::fabs(x));
    }
    // Invariants on the weights and lse the candidate returned.
    invariant_context ctx{views.o.mask, spec.conventions.empty_rows, opt.empty_lse};
    const extents_t<4> wext{d.batch, d.heads, d.query_length, d.key_length};
    if (!c.weights.empty()) {
        tensor_view<const double, 4> p{c.weights.data(), wext};
        // Computed with the candidate's accumulation, stored in the weights' format; a weight in the
        // subnormal range of either is rounded with an absolute error of half its subnormal spacing.
        // A declared policy rounds P to its own format first (u_p, and η_P/S near underflow).
        const double u_w = sr.u_p > 0 ? (1 + sr.u_p) * (1 + tol::unit_roundoff(wf)) - 1 : tol::unit_roundoff(wf);
        const double eta = half_subnormal_spacing(u_acc, tol::weights_floor(format)) + half_subnormal_spacing(tol::unit_roundoff(wf), tol::weights_floor(wf)) +
                           (1 + tol::unit_roundoff(wf)) * sr.p_floor;
        res.invariants.push_back(rows_sum_to_one(p, ctx, u_acc, u_w, eta));
        res.invariants.push_back(masked_weights_are_zero(p, ctx));
        res.invariants.push_back(weights_in_unit_interval(p, ctx));
        // Against the golden weights, element by element (tolerance::weights_bound; any model).
        if (lc.entry("weights")) {
            const std::vector<double>& pe = golden_weights();
            const auto bound_at = tol::weights_bound_at(pe, sr, format, wf, case_scales(), max_abs_logit);
            res.tensors.push_back(judged("weights", tol::compare(c.weights, pe, wf, bound_at), tol::find_vacuous(pe, d.key_length, bound_at),
                                         "row scale max p", wf));
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
            std::vector<double> eps = case_scales().logit_bounds(u, u_acc);
            if (sr.u_logits > 0)
                for (std::size_t r = 0; r < eps.size(); ++r) eps[r] = tol::softmax_epsilon(case_scales(), r, sr, max_abs_logit[r]);
            const tensor<double, 4> logits = exact_logits(views);
            res.invariants.push_back(weights_match_lse(tensor_view<const double, 4>{c.weights.data(), wext}, logits.view(),
                                                       tensor_view<const double, 3>{c.lse.data(), {d.batch, d.heads, d.query_length}},
                                                       ctx, u_acc, eps,
                                                       std::max(tol::weights_floor(format), tol::weights_floor(wf)) + (1 + tol::unit_roundoff(wf)) * sr.p_floor,
                                                       sr.u_p > 0 ? (1 + sr.u_p) * (1 + tol::unit_roundoff(wf)) - 1 : tol::unit_roundoff(wf),
                                                       tol::unit_roundoff(lf)));
        }
        // lse against the reference (tolerance::lse_bound). Empty rows are pinned by the candidate's
        // declared convention (--empty-row-lse), not by the golden −inf.
        if (const tensor_entry* t = lc.entry("lse")) {
            const std::vector<double> le = lc.reference(*t);
            const empty_row_lse_check er =
                check_empty_row_lse(c.lse, le, ctx.mask, d.batch, d.heads, d.query_length, d.key_length, opt.empty_lse);
            const auto bound_at = tol::lse_bound_at(le, sr, lf, case_scales(), max_abs_logit);
            tensor_report lr = judged("lse", tol::compare(er.compared, le, lf, bound_at), tol::find_vacuous(le, 1, bound_at, tol::lse_vacuity_scale),
                                      "ln 2 (the normaliser e^lse off by 2x)", lf);
            fail_wrong_empty_rows(lr, er.wrong, opt.empty_lse);
            res.tensors.push_back(lr);
        }
    }
}

}  // namespace attnref::golden
