/// A candidate against a reference under tolerance.hpp's models: the per-element bounds, the
/// comparison, the vacuity of the bounds, zero-trust and invariants.hpp's invariants come from the
/// library; the decoy rule (decoy_outputs, passing_decoy) and the empty-row lse convention
/// (check_empty_row_lse) are the checker's own (include/attnref/check/judgment.hpp), called on the
/// call's problem (problem_of).
#include <cmath>
#include <functional>
#include <limits>

#include "attnref/check/judgment.hpp"
#include "core.hpp"
#include "run.hpp"

namespace attnref::python {

namespace tol = attnref::tolerance;

namespace {

auto e4(const array_ref& a) { return tensor_view<const double, 4>{a.data, {a.shape[0], a.shape[1], a.shape[2], a.shape[3]}}; }
auto e3(const array_ref& a) { return tensor_view<const double, 3>{a.data, {a.shape[0], a.shape[1], a.shape[2]}}; }
auto e2(const array_ref& a) { return tensor_view<const double, 2>{a.data, {a.shape[0], a.shape[1]}}; }
auto e1(const array_ref& a) { return a.given() ? tensor_view<const double, 1>{a.data, {a.shape[0]}} : tensor_view<const double, 1>{}; }

mha_parameters<double> params_of(const call& c) {
    mha_parameters<double> w;
    w.w_q = e2(c.w_q), w.w_k = e2(c.w_k), w.w_v = e2(c.w_v), w.w_o = e2(c.w_o);
    w.b_q = e1(c.b_q), w.b_k = e1(c.b_k), w.b_v = e1(c.b_v), w.b_o = e1(c.b_o);
    return w;
}
mha_options mha_options_of(const call& c, const attention_options& o) {
    mha_options mo;
    mo.heads = c.heads;
    mo.kv_heads = c.kv_heads;
    mo.attention = o;
    return mo;
}

tol::data_aware_scales scales_of(const call& c, const std::vector<double>& p) {
    const attention_options o = c.conv.options();
    const std::vector<std::size_t> ws = c.weights_shape();
    const tensor_view<const double, 4> pv{p.data(), {ws[0], ws[1], ws[2], ws[3]}};
    if (c.kind == call_kind::sdpa) return tol::sdpa_scales(e4(c.q), e4(c.k), e4(c.v), pv, o);
    return tol::mha_scales(e3(c.q), e3(c.k), e3(c.v), params_of(c), pv, mha_options_of(c, o));
}

/// The logits S (B, H, Sq, Sk) in double, as the checker's invariant P = exp(S − lse) takes them.
tensor<double, 4> logits_of(const call& c) {
    using pol = uniform_precision<double>;
    const attention_options o = c.conv.options();
    if (c.kind == call_kind::sdpa) return attention_logits<pol>(e4(c.q), e4(c.k), o);
    return mha_logits<pol>(e3(c.q), e3(c.k), params_of(c), mha_options_of(c, o));
}

/// The call as the checker's forward_problem (views into the call's arrays and conventions, which
/// must outlive it): what the decoys are computed from.
golden::forward_problem problem_of(const call& c) {
    golden::forward_problem p;
    p.sdpa = c.kind == call_kind::sdpa;
    const attention_options o = c.conv.options();
    if (p.sdpa) {
        p.q = e4(c.q), p.k = e4(c.k), p.v = e4(c.v);
        p.o = o;
    } else {
        p.x_q = e3(c.q), p.x_k = e3(c.k), p.x_v = e3(c.v);
        p.w = params_of(c);
        p.mo = mha_options_of(c, o);
    }
    return p;
}

tensor_judgement judged(std::string name, std::span<const double> a, std::span<const double> e, tol::candidate_format f,
                        const std::vector<double>& bounds, std::size_t row, double fixed_scale) {
    tensor_judgement t;
    t.name = std::move(name);
    t.cmp = tol::compare(a, e, f, [&](std::size_t n) { return bounds[n]; });
    t.vacuous = tol::find_vacuous(e, row, [&](std::size_t n) { return bounds[n]; }, fixed_scale);
    for (double b : bounds)
        if (std::isfinite(b) && b > t.bound_max) t.bound_max = b;
    return t;
}

void require_size(const char* what, std::size_t got, std::size_t expected) {
    if (got != expected)
        throw shape_error(std::string(what) + ": " + std::to_string(got) + " elements, the reference has " + std::to_string(expected));
}

std::size_t count(const std::vector<std::size_t>& s) {
    std::size_t n = 1;
    for (std::size_t e : s) n *= e;
    return n;
}

}  // namespace

judgement judge(const call* c, const judge_request& rq) {
    require_size("actual", rq.actual_output.size(), rq.expected_output.size());
    const bool weights = !rq.actual_weights.empty(), lse = !rq.actual_lse.empty();
    if ((weights || lse) && !c) throw std::invalid_argument("weights, lse: comparing them needs the reference's call");
    if (c) {
        c->validate();
        require_size("the reference's weights", rq.expected_weights.size(), count(c->weights_shape()));
        require_size("the reference's lse", rq.expected_lse.size(), count(c->lse_shape()));
        if (weights) require_size("weights", rq.actual_weights.size(), rq.expected_weights.size());
        if (lse) require_size("lse", rq.actual_lse.size(), rq.expected_lse.size());
    }
    const tol::candidate_format f = rq.format;
    const double u = tol::unit_roundoff(f), ua = tol::accumulate_roundoff(f), ur = rq.reference_u;
    const bool bounded = rq.model == "data-aware" || rq.model == "worst-case";
    if (bounded && !c) throw std::invalid_argument("tolerance '" + rq.model + "' needs the reference's inputs");
    judgement out;

    // Output bounds.
    std::optional<tol::data_aware_scales> scales;
    if (c && (bounded || weights || lse)) scales = scales_of(*c, rq.expected_weights);
    const std::vector<double>& e = rq.expected_output;
    std::vector<double> b(e.size());
    if (rq.model == "ulp") {
        tensor_judgement t;
        t.name = "output";
        t.cmp = tol::compare_ulp(rq.actual_output, e, f, rq.ulp_limit);  // the values' own resolution: never vacuous
        t.bound_max = rq.ulp_limit;
        out.tensors.push_back(t);
    } else {
        if (rq.model == "assert-close") {
            const tol::rtol_atol ra = tol::assert_close_defaults(f);
            for (std::size_t n = 0; n < e.size(); ++n) b[n] = ra.atol + ra.rtol * std::fabs(e[n]);
        } else {
            const bool worst = rq.model == "worst-case";
            for (std::size_t n = 0; n < b.size(); ++n) {
                b[n] = worst ? scales->worst_case.bound(n, u, ua) : scales->bound(n, u, ua);
                // A reference that is not correctly rounded has its own error, bounded by the same model.
                if (ur > 0) b[n] += worst ? scales->worst_case.bound(n, ur, ur) : scales->bound(n, ur, ur);
            }
        }
        out.tensors.push_back(judged("output", rq.actual_output, e, f, b, rq.output_row, 0));
        tensor_judgement& t = out.tensors.back();
        // The decoys only matter where the verdict would otherwise be a pass.
        if (c && t.cmp.ok() && !t.vacuous.any()) {
            const std::vector<golden::decoy> decoys = golden::decoy_outputs(problem_of(*c));
            if (const golden::decoy* d = golden::passing_decoy(decoys, e, f, b, rq.output_row)) t.decoy = d->name;
        }
    }
    if (auto why = tol::untrustworthy(rq.actual_output, rq.output_row, e)) out.tensors.front().untrustworthy = *why;

    if (!weights && !lse) return out;
    const std::vector<std::size_t> ws = c->weights_shape();
    const std::size_t sk = ws[3];
    const invariant_context ctx{c->conv.options().mask, c->conv.empty_rows, rq.empty_lse};
    if (weights) {
        const extents_t<4> wext{ws[0], ws[1], ws[2], ws[3]};
        const tensor_view<const double, 4> p{rq.actual_weights.data(), wext};
        const double eta = half_subnormal_spacing(ua, tol::weights_floor(f)) + half_subnormal_spacing(u, tol::weights_floor(f));
        out.invariants.push_back(rows_sum_to_one(p, ctx, ua, u, eta));
        out.invariants.push_back(masked_weights_are_zero(p, ctx));
        out.invariants.push_back(weights_in_unit_interval(p, ctx));
        auto at = tol::weights_bound_at(rq.expected_weights, f, f, *scales);
        std::vector<double> wb(rq.expected_weights.size());
        for (std::size_t n = 0; n < wb.size(); ++n) {
            wb[n] = at(n);
            if (ur > 0) wb[n] += tol::weights_bound(*scales, n / sk, rq.expected_weights[n], ur, ur, ur, tol::weights_floor(tol::candidate_format::float64));
        }
        out.tensors.push_back(judged("weights", rq.actual_weights, rq.expected_weights, f, wb, sk, 0));
    }
    if (lse) {
        const std::size_t B = ws[0], H = ws[1], sq = ws[2];
        if (weights) {
            const std::vector<double> eps = scales->logit_bounds(u, ua);
            const tensor<double, 4> logits = logits_of(*c);
            out.invariants.push_back(weights_match_lse(tensor_view<const double, 4>{rq.actual_weights.data(), {B, H, sq, sk}}, logits.view(),
                                                       tensor_view<const double, 3>{rq.actual_lse.data(), {B, H, sq}}, ctx, ua, eps,
                                                       tol::weights_floor(f), u, u));
        }
        // Empty rows are pinned by the declared convention (empty_row_lse), not by the reference's −inf.
        const golden::empty_row_lse_check er = golden::check_empty_row_lse(rq.actual_lse, rq.expected_lse, ctx.mask, B, H, sq, sk, rq.empty_lse);
        auto at = tol::lse_bound_at(rq.expected_lse, f, f, *scales);
        std::vector<double> lb(rq.expected_lse.size());
        for (std::size_t n = 0; n < lb.size(); ++n) {
            lb[n] = at(n);
            if (ur > 0) lb[n] += tol::lse_bound(*scales, n, rq.expected_lse[n], ur, ur, ur);
        }
        out.tensors.push_back(judged("lse", er.compared, rq.expected_lse, f, lb, 1, tol::lse_vacuity_scale));
        out.tensors.back().wrong_empty_lse = er.wrong;  // each a violation (testing.py fails the lse)
    }
    return out;
}

}  // namespace attnref::python
