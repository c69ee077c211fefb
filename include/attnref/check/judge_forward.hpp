#pragma once
/// \file check/judge_forward.hpp
/// Judging a candidate's forward outputs against a reference held in memory (an in-memory
/// certified call, e.g. the Python package's Reference; a golden case goes through check/check.hpp):
/// the output under one tolerance model with check/judgment.hpp's rules (vacuity, decoys,
/// zero-trust), the weights and lse against the reference's under tolerance::weights_bound and
/// lse_bound, invariants.hpp's invariants on them and the declared empty-row lse convention; the
/// overall verdict by decide (check/verdict.hpp). The problem (problem.hpp forward_problem) gives
/// the bounds' inputs and the decoys.
///
///     forward_problem ─ data-aware scales (reference weights) ─┐
///     candidate output, weights, lse ─────────────────────────┴─ judged rows + invariants ─ decide ─→ forward_judgment

#include <cmath>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "attnref/bounds/invariants.hpp"
#include "attnref/core/multi_head_attention.hpp"
#include "attnref/core/precision.hpp"
#include "attnref/core/problem.hpp"
#include "attnref/bounds/tolerance.hpp"
#include "attnref/check/judgment.hpp"
#include "attnref/check/verdict.hpp"

namespace attnref::golden {

/// The weights' extents (B, H, Sq, Sk) of a problem.
inline extents_t<4> weights_extents_of(const forward_problem& p) {
    if (p.sdpa) return {p.q.extents[0], p.q.extents[1], p.q.extents[2], p.k.extents[2]};
    return {p.x_q.extents[0], p.mo.heads, p.x_q.extents[1], p.x_k.extents[1]};
}

/// The data-aware magnitudes of a problem from its reference weights P (B, H, Sq, Sk); terms as
/// for golden::data_aware_scales_for.
inline tolerance::data_aware_scales data_aware_scales_of(const forward_problem& p, std::span<const double> weights,
                                                         bool inputs_exact = false,
                                                         tolerance::underflow_terms terms = tolerance::underflow_terms::per_feature) {
    const tensor_view<const double, 4> w{weights.data(), weights_extents_of(p)};
    if (p.sdpa) return tolerance::sdpa_scales(p.q, p.k, p.v, w, p.o, inputs_exact, terms);
    return tolerance::mha_scales(p.x_q, p.x_k, p.x_v, p.w, w, p.mo, inputs_exact, terms);
}

/// The problem's logits S (B, H, Sq, Sk) in double, as the invariant P = exp(S − lse) takes them.
inline tensor<double, 4> logits_of(const forward_problem& p) {
    using pol = uniform_precision<double>;
    return p.sdpa ? attention_logits<pol>(p.q, p.k, p.o) : mha_logits<pol>(p.x_q, p.x_k, p.w, p.mo);
}

/// What judge_forward compares: the reference's output (and, with a problem, its weights and
/// lse), the candidate's output and optionally its weights and lse, in C order.
struct forward_request {
    tolerance::tolerance_model model = tolerance::tolerance_model::data_aware;  ///< data-aware, worst-case, assert-close or ulp
    tolerance::candidate_format format = tolerance::candidate_format::float32;
    /// Unit roundoff of the reference's own error (0: certified, correctly rounded): its own bound
    /// under the same model is added to the candidate's.
    double reference_u = 0;
    std::span<const double> expected_output, expected_weights, expected_lse;
    std::span<const double> actual_output, actual_weights, actual_lse;  ///< weights, lse optional
    std::size_t output_row = 1;
    double ulp_limit = 4;
    empty_row_lse empty_lse = empty_row_lse::minus_inf;  ///< the lse the candidate writes for empty rows
};

/// One judged tensor with what a caller's messages need besides the report.
struct judged_tensor {
    tensor_report report;
    std::string untrustworthy;        ///< output: zero-trust's reason (tolerance::untrustworthy), empty when trustworthy
    std::size_t wrong_empty_lse = 0;  ///< lse: empty rows without the declared convention (counted in report.cmp.violations)
    double bound_max = 0;             ///< the largest finite bound
};

struct forward_judgment {
    std::vector<judged_tensor> tensors;        ///< output, then weights and lse when given
    std::vector<invariant_report> invariants;  ///< on the candidate's weights (and lse)
    check_result result;                       ///< the rows and invariants, decided (decide)
};

namespace check_detail {
inline double largest_finite(std::span<const double> b) {
    double m = 0;
    for (double x : b)
        if (std::isfinite(x) && x > m) m = x;
    return m;
}
}  // namespace check_detail

/// Judges a candidate's forward outputs against an in-memory reference. `p` (may be null for
/// assert-close and ulp, which then judge the output alone, without decoys) views the reference's
/// inputs; data-aware and worst-case derive their bounds from it and the reference's weights.
/// Sizes must agree (the caller checks them); throws std::invalid_argument for a request that
/// needs `p` without one.
inline forward_judgment judge_forward(const forward_problem* p, const forward_request& rq) {
    namespace tol = attnref::tolerance;
    using M = tol::tolerance_model;
    const bool weights = !rq.actual_weights.empty(), lse = !rq.actual_lse.empty();
    if ((weights || lse) && !p) throw std::invalid_argument("weights, lse: comparing them needs the reference's call");
    const bool bounded = rq.model == M::data_aware || rq.model == M::worst_case;
    if (bounded && !p) throw std::invalid_argument("tolerance '" + std::string(tol::model_name(rq.model)) + "' needs the reference's inputs");
    const tol::candidate_format f = rq.format;
    const double u = tol::unit_roundoff(f), ua = tol::accumulate_roundoff(f), ur = rq.reference_u;
    forward_judgment out;

    std::optional<tol::data_aware_scales> scales;
    if (p && (bounded || weights || lse)) scales = data_aware_scales_of(*p, rq.expected_weights, false, tol::underflow_terms_for(f, false));
    const std::span<const double> e = rq.expected_output;
    if (rq.model == M::ulp) {  // a bound in ULPs of the candidate's format: the values' own resolution, never vacuous
        judged_tensor t;
        t.report = judged_output(tol::compare_ulp(rq.actual_output, e, f, rq.ulp_limit), {}, f, rq.actual_output, e, rq.output_row);
        t.bound_max = rq.ulp_limit;
        out.tensors.push_back(std::move(t));
    } else {
        std::vector<double> b(e.size());
        if (rq.model == M::assert_close) {
            const tol::rtol_atol ra = tol::assert_close_defaults(f);
            for (std::size_t n = 0; n < e.size(); ++n) b[n] = ra.atol + ra.rtol * std::fabs(e[n]);
        } else if (bounded) {
            const bool worst = rq.model == M::worst_case;
            for (std::size_t n = 0; n < b.size(); ++n) {
                b[n] = worst ? scales->worst_case.bound(n, u, ua) : scales->bound(n, u, ua);
                // A reference that is not correctly rounded has its own error, bounded by the same model.
                if (ur > 0) b[n] += worst ? scales->worst_case.bound(n, ur, ur) : scales->bound(n, ur, ur);
            }
        } else {
            throw std::invalid_argument("tolerance '" + std::string(tol::model_name(rq.model)) + "' is not available here");
        }
        judged_tensor t;
        t.report = p ? judge_with_decoys(rq.actual_output, e, f, b, rq.output_row, *p) : judge_output(rq.actual_output, e, f, b, rq.output_row);
        t.bound_max = check_detail::largest_finite(b);
        out.tensors.push_back(std::move(t));
    }
    if (auto why = tol::untrustworthy(rq.actual_output, rq.output_row, e)) out.tensors.front().untrustworthy = *why;

    if (weights || lse) {
        const extents_t<4> wext = weights_extents_of(*p);
        const std::size_t B = wext[0], H = wext[1], sq = wext[2], sk = wext[3];
        const invariant_context ctx{p->options().mask, p->options().softmax.empty_rows, rq.empty_lse};
        if (weights) {
            const tensor_view<const double, 4> pw{rq.actual_weights.data(), wext};
            const double eta = half_subnormal_spacing(ua, tol::weights_floor(f)) + half_subnormal_spacing(u, tol::weights_floor(f));
            out.invariants.push_back(rows_sum_to_one(pw, ctx, ua, u, eta));
            out.invariants.push_back(masked_weights_are_zero(pw, ctx));
            out.invariants.push_back(weights_in_unit_interval(pw, ctx));
            auto at = tol::weights_bound_at(rq.expected_weights, f, f, *scales);
            std::vector<double> wb(rq.expected_weights.size());
            for (std::size_t n = 0; n < wb.size(); ++n) {
                wb[n] = at(n);
                if (ur > 0) wb[n] += tol::weights_bound(*scales, n / sk, rq.expected_weights[n], ur, ur, ur, tol::weights_floor(tol::candidate_format::float64));
            }
            auto bound = [&](std::size_t n) { return wb[n]; };
            judged_tensor t;
            t.report = judged("weights", tol::compare(rq.actual_weights, rq.expected_weights, f, bound),
                              tol::find_vacuous(rq.expected_weights, sk, bound), "row scale max p", f);
            t.bound_max = check_detail::largest_finite(wb);
            out.tensors.push_back(std::move(t));
        }
        if (lse) {
            if (weights) {
                const std::vector<double> eps = scales->logit_bounds(u, ua);
                const tensor<double, 4> logits = logits_of(*p);
                out.invariants.push_back(weights_match_lse(tensor_view<const double, 4>{rq.actual_weights.data(), wext}, logits.view(),
                                                           tensor_view<const double, 3>{rq.actual_lse.data(), {B, H, sq}}, ctx, ua, eps,
                                                           tol::weights_floor(f), u, u));
            }
            // Empty rows are pinned by the declared convention (empty_row_lse), not by the reference's −inf.
            const empty_row_lse_check er = check_empty_row_lse(rq.actual_lse, rq.expected_lse, ctx.mask, B, H, sq, sk, rq.empty_lse);
            auto at = tol::lse_bound_at(rq.expected_lse, f, f, *scales);
            std::vector<double> lb(rq.expected_lse.size());
            for (std::size_t n = 0; n < lb.size(); ++n) {
                lb[n] = at(n);
                if (ur > 0) lb[n] += tol::lse_bound(*scales, n, rq.expected_lse[n], ur, ur, ur);
            }
            auto bound = [&](std::size_t n) { return lb[n]; };
            judged_tensor t;
            t.report = judged("lse", tol::compare(er.compared, rq.expected_lse, f, bound),
                              tol::find_vacuous(rq.expected_lse, 1, bound, tol::lse_vacuity_scale), "ln 2 (the normaliser e^lse off by 2x)", f);
            fail_wrong_empty_rows(t.report, er.wrong, rq.empty_lse);
            t.wrong_empty_lse = er.wrong;
            t.bound_max = check_detail::largest_finite(lb);
            out.tensors.push_back(std::move(t));
        }
    }
    out.result.format = f;
    out.result.model = rq.model;
    for (const judged_tensor& t : out.tensors) out.result.tensors.push_back(t.report);
    out.result.invariants = out.invariants;
    decide(out.result);
    return out;
}

}  // namespace attnref::golden
