/// A candidate against a reference under tolerance.hpp's models: the per-element bounds, the
/// comparison, the vacuity of the bounds and zero-trust, all from the library (nothing decided here).
#include <cmath>
#include <functional>
#include <limits>

#include "core.hpp"

namespace attnref::python {

namespace tol = attnref::tolerance;

namespace {

tol::data_aware_scales scales_of(const call& c, const std::vector<double>& p) {
    const attention_options o = c.conv.options();
    auto e4 = [](const array_ref& a) { return tensor_view<const double, 4>{a.data, {a.shape[0], a.shape[1], a.shape[2], a.shape[3]}}; };
    auto e3 = [](const array_ref& a) { return tensor_view<const double, 3>{a.data, {a.shape[0], a.shape[1], a.shape[2]}}; };
    auto e2 = [](const array_ref& a) { return tensor_view<const double, 2>{a.data, {a.shape[0], a.shape[1]}}; };
    auto e1 = [](const array_ref& a) { return a.given() ? tensor_view<const double, 1>{a.data, {a.shape[0]}} : tensor_view<const double, 1>{}; };
    const std::vector<std::size_t> ws = c.weights_shape();
    const tensor_view<const double, 4> pv{p.data(), {ws[0], ws[1], ws[2], ws[3]}};
    if (c.kind == call_kind::sdpa) return tol::sdpa_scales(e4(c.q), e4(c.k), e4(c.v), pv, o);
    mha_parameters<double> w;
    w.w_q = e2(c.w_q), w.w_k = e2(c.w_k), w.w_v = e2(c.w_v), w.w_o = e2(c.w_o);
    w.b_q = e1(c.b_q), w.b_k = e1(c.b_k), w.b_v = e1(c.b_v), w.b_o = e1(c.b_o);
    mha_options mo;
    mo.heads = c.heads;
    mo.kv_heads = c.kv_heads;
    mo.attention = o;
    return tol::mha_scales(e3(c.q), e3(c.k), e3(c.v), w, pv, mo);
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

}  // namespace

std::vector<tensor_judgement> judge(const call* c, const judge_request& rq) {
    require_size("actual", rq.actual_output.size(), rq.expected_output.size());
    const bool weights = !rq.actual_weights.empty();
    const bool lse = !rq.actual_lse.empty();
    if (weights) require_size("weights", rq.actual_weights.size(), rq.expected_weights.size());
    if (lse) require_size("lse", rq.actual_lse.size(), rq.expected_lse.size());
    const tol::candidate_format f = rq.format;
    const double u = tol::unit_roundoff(f), ua = tol::accumulate_roundoff(f), ur = rq.reference_u;
    std::vector<tensor_judgement> out;

    if (rq.model == "assert-close" || rq.model == "ulp") {
        const bool ulp = rq.model == "ulp";
        auto one = [&](const char* name, const std::vector<double>& a, const std::vector<double>& e, std::size_t row) {
            tensor_judgement t;
            t.name = name;
            if (ulp) {
                t.cmp = tol::compare_ulp(a, e, f, rq.ulp_limit);
                t.bound_max = rq.ulp_limit;
            } else {
                const tol::rtol_atol ra = tol::assert_close_defaults(f);
                std::vector<double> b(e.size());
                for (std::size_t n = 0; n < e.size(); ++n) b[n] = ra.atol + ra.rtol * std::fabs(e[n]);
                t = judged(name, a, e, f, b, row, 0);
            }
            return t;
        };
        out.push_back(one("output", rq.actual_output, rq.expected_output, rq.output_row));
        if (!rq.actual_output.empty())
            if (auto why = tol::untrustworthy(rq.actual_output, rq.output_row, rq.expected_output)) out.back().untrustworthy = *why;
        if (weights) out.push_back(one("weights", rq.actual_weights, rq.expected_weights, c ? c->weights_shape().back() : 1));
        if (lse) out.push_back(one("lse", rq.actual_lse, rq.expected_lse, 1));
        return out;
    }
    if (!c) throw std::invalid_argument("tolerance '" + rq.model + "' needs the reference's inputs");
    c->validate();
    require_size("the reference's weights", rq.expected_weights.size(), [&] {
        std::size_t n = 1;
        for (std::size_t e : c->weights_shape()) n *= e;
        return n;
    }());
    const tol::data_aware_scales s = scales_of(*c, rq.expected_weights);
    const bool worst = rq.model == "worst-case";
    std::vector<double> b(rq.expected_output.size());
    for (std::size_t n = 0; n < b.size(); ++n) {
        b[n] = worst ? s.worst_case.bound(n, u, ua) : s.bound(n, u, ua);
        // A reference that is not correctly rounded has its own error, bounded by the same model.
        if (ur > 0) b[n] += worst ? s.worst_case.bound(n, ur, ur) : s.bound(n, ur, ur);
    }
    out.push_back(judged("output", rq.actual_output, rq.expected_output, f, b, rq.output_row, 0));
    if (!rq.actual_output.empty())
        if (auto why = tol::untrustworthy(rq.actual_output, rq.output_row, rq.expected_output)) out.back().untrustworthy = *why;
    if (weights) {
        const std::size_t sk = c->weights_shape().back();
        auto at = tol::weights_bound_at(rq.expected_weights, f, f, s);
        std::vector<double> wb(rq.expected_weights.size());
        for (std::size_t n = 0; n < wb.size(); ++n) {
            wb[n] = at(n);
            if (ur > 0) wb[n] += tol::weights_bound(s, n / sk, rq.expected_weights[n], ur, ur, ur, tol::weights_floor(tol::candidate_format::float64));
        }
        out.push_back(judged("weights", rq.actual_weights, rq.expected_weights, f, wb, sk, 0));
    }
    if (lse) {
        auto at = tol::lse_bound_at(rq.expected_lse, f, f, s);
        std::vector<double> lb(rq.expected_lse.size());
        for (std::size_t n = 0; n < lb.size(); ++n) {
            lb[n] = at(n);
            if (ur > 0) lb[n] += tol::lse_bound(s, n, rq.expected_lse[n], ur, ur, ur);
        }
        out.push_back(judged("lse", rq.actual_lse, rq.expected_lse, f, lb, 1, tol::lse_vacuity_scale));
    }
    return out;
}

}  // namespace attnref::python
