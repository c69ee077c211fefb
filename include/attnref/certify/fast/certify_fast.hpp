#pragma once
/// \file certify/fast/certify_fast.hpp
/// The fast certified forward pass, end to end: the ranges of (1) (else the whole case goes to
/// MPFI), the projections (7), every (b, h) head's rows (8) on parallel.hpp's threads, the output
/// projection, the rounding checks, and the undecided elements through escalation.hpp.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attnref/core/attention.hpp"
#include "attnref/certify/certify.hpp"
#include "attnref/certify/fast/attention_row.hpp"
#include "attnref/certify/fast/bounded.hpp"
#include "attnref/certify/fast/constants.hpp"
#include "attnref/certify/fast/escalation.hpp"
#include "attnref/certify/fast/problem.hpp"
#include "attnref/certify/fast/projection.hpp"
#include "attnref/core/double_double.hpp"
#include "attnref/core/fp_environment.hpp"
#include "attnref/core/multi_head_attention.hpp"
#include "attnref/core/parallel.hpp"
#include "attnref/core/tensor.hpp"

namespace attnref::fast {
namespace detail {

/// The sizes of a call (dout: the multi-head output width, 0 for SDPA).
struct call_dims {
    std::size_t B, H, Hkv, Sq, Sk, dk, dv, dout = 0;
};

inline call_dims dims_of(const fast_problem& p) {
    if (!p.mha) {
        const attention_dims d = ::attnref::logit_stage::attention_dims_of(p.q, p.k, p.v);
        return {d.batch, d.heads, d.kv_heads, d.query_length, d.key_length, d.head_dim_qk, d.head_dim_v, 0};
    }
    mha_options mo;
    mo.heads = p.heads;
    mo.kv_heads = p.kv_heads;
    const mha_dims d = mha_dims_of(p.x_q, p.x_k, p.x_v, p.params, mo);
    return {d.batch, d.heads, d.kv_heads, d.query_length, d.key_length, d.head_dim_qk, d.head_dim_v, d.output_dim};
}

/// The whole-case conditions of (1) on the options and the given inputs: empty when the fast rung
/// may run, else why not.
inline std::string outside_ranges(const fast_problem& p) {
    const attention_options& o = p.options;
    if (o.softcap) return "soft-capping (no double-word tanh bound)";
    std::string why;
    auto check = [&](const double* x, std::size_t n, const char* what) {
        if (why.empty() && !in_range(x, n)) why = std::string("a nonzero |") + what + "| outside [2^-400, 2^40]";
    };
    if (o.scale) check(&*o.scale, 1, "scale");
    if (!o.alibi_slopes.empty()) check(o.alibi_slopes.data(), o.alibi_slopes.size(), "ALiBi slope");
    if (o.mask.seed.present()) check(o.mask.seed.values.data, o.mask.seed.values.size(), "seed mask");
    if (why.empty() && o.mask.additive.present())
        for (std::size_t n = 0; n < o.mask.additive.values.size(); ++n) {
            const double a = o.mask.additive.values.data[n];
            if (!std::isfinite(a) && a != -std::numeric_limits<double>::infinity()) return "a non-finite additive mask entry other than -inf";
            if (std::isfinite(a)) check(&a, 1, "additive mask entry");
            if (!why.empty()) return why;
        }
    if (p.mha) {
        check(p.x_q.data, p.x_q.size(), "query input");
        check(p.x_k.data, p.x_k.size(), "key input");
        check(p.x_v.data, p.x_v.size(), "value input");
        for (auto* w : {&p.params.w_q, &p.params.w_k, &p.params.w_v, &p.params.w_o}) check(w->data, w->size(), "weight");
        for (auto* bb : {&p.params.b_q, &p.params.b_k, &p.params.b_v, &p.params.b_o}) check(bb->data, bb->size(), "bias");
    } else {
        check(p.q.data, p.q.size(), "query");
        check(p.k.data, p.k.size(), "key");
        check(p.v.data, p.v.size(), "value");
    }
    return why;
}

/// The logit scale of attention.hpp's logit_scale as a double-word with its error: the given scale
/// (exact), or 1/√dk from (4).
inline void logit_scale_dd(const attention_options& o, std::size_t dk, dd& scale, double& scale_err) {
    if (o.scale) {
        scale = {*o.scale, 0};
        scale_err = 0;
    } else {
        scale = inv_sqrt(dk);
        scale_err = dw::up(0x1p-105 * dw::mag(scale));
    }
}

/// Multi-head: Q, K, V projected (7), with bounds.
struct projections {
    dd_matrix q, k, v;
};

inline projections project_inputs(const fast_problem& p, const call_dims& d, std::size_t threads) {
    auto input = [](tensor_view<const double, 3> x) {
        return dd_matrix{x.extents[0] * x.extents[1], x.extents[2], std::vector<double>(x.data, x.data + x.size()), {}, {}};
    };
    auto bias = [](const tensor_view<const double, 1>& b) { return b.empty() ? nullptr : b.data; };
    return {project(input(p.x_q), p.params.w_q.data, d.H * d.dk, bias(p.params.b_q), threads),
            project(input(p.x_k), p.params.w_k.data, d.Hkv * d.dk, bias(p.params.b_k), threads),
            project(input(p.x_v), p.params.w_v.data, d.Hkv * d.dv, bias(p.params.b_v), threads)};
}

/// One head's inputs gathered into head_inputs' layouts, and their norms.
struct head_buffers {
    std::vector<double> qh, ql, qe, kth, ktl, kte, vh, vl, ve;
    head_norms norms;
};

inline void gather_head(const fast_problem& p, const projections* pr, const call_dims& d, std::size_t b, std::size_t h,
                        head_buffers& hb) {
    const std::size_t Sq = d.Sq, Sk = d.Sk, dk = d.dk, dv = d.dv, hk = h / (d.H / d.Hkv);
    const bool mha = pr != nullptr;
    hb.qh.assign(Sq * dk, 0), hb.kth.assign(dk * Sk, 0), hb.vh.assign(Sk * dv, 0);
    if (!mha) {
        for (std::size_t i = 0; i < Sq; ++i)
            for (std::size_t c = 0; c < dk; ++c) hb.qh[i * dk + c] = p.q(b, h, i, c);
        for (std::size_t j = 0; j < Sk; ++j)
            for (std::size_t c = 0; c < dk; ++c) hb.kth[c * Sk + j] = p.k(b, hk, j, c);
        for (std::size_t j = 0; j < Sk; ++j)
            for (std::size_t c = 0; c < dv; ++c) hb.vh[j * dv + c] = p.v(b, hk, j, c);
    } else {
        hb.ql.resize(Sq * dk), hb.qe.resize(Sq * dk), hb.ktl.resize(dk * Sk), hb.kte.resize(dk * Sk), hb.vl.resize(Sk * dv),
            hb.ve.resize(Sk * dv);
        for (std::size_t i = 0; i < Sq; ++i)
            for (std::size_t c = 0; c < dk; ++c) {
                const std::size_t n = (b * Sq + i) * (d.H * dk) + h * dk + c;
                hb.qh[i * dk + c] = pr->q.hi[n], hb.ql[i * dk + c] = pr->q.lo[n], hb.qe[i * dk + c] = pr->q.err[n];
            }
        for (std::size_t j = 0; j < Sk; ++j)
            for (std::size_t c = 0; c < dk; ++c) {
                const std::size_t n = (b * Sk + j) * (d.Hkv * dk) + hk * dk + c;
                hb.kth[c * Sk + j] = pr->k.hi[n], hb.ktl[c * Sk + j] = pr->k.lo[n], hb.kte[c * Sk + j] = pr->k.err[n];
            }
        for (std::size_t j = 0; j < Sk; ++j)
            for (std::size_t c = 0; c < dv; ++c) {
                const std::size_t n = (b * Sk + j) * (d.Hkv * dv) + hk * dv + c;
                hb.vh[j * dv + c] = pr->v.hi[n], hb.vl[j * dv + c] = pr->v.lo[n], hb.ve[j * dv + c] = pr->v.err[n];
            }
    }
    head_norms& nr = hb.norms;
    nr.kn.assign(Sk, 0.0), nr.ken.assign(Sk, 0.0), nr.vn.assign(dv, 0.0), nr.ven.assign(dv, 0.0);
    nr.vmax.assign(dv, 0.0), nr.evmax.assign(dv, 0.0);
    for (std::size_t j = 0; j < Sk; ++j) {
        nr.kn[j] = norm_up(hb.kth.data() + j, dk, Sk);
        if (mha) nr.ken[j] = norm_up(hb.kte.data() + j, dk, Sk);
    }
    for (std::size_t c = 0; c < dv; ++c) {
        nr.vn[c] = norm_up(hb.vh.data() + c, Sk, dv);
        if (mha) nr.ven[c] = norm_up(hb.ve.data() + c, Sk, dv);
        for (std::size_t j = 0; j < Sk; ++j) {
            nr.vmax[c] = std::max(nr.vmax[c], std::fabs(hb.vh[j * dv + c]) * (1 + 0x1p-52));
            if (mha) nr.evmax[c] = std::max(nr.evmax[c], hb.ve[j * dv + c]);
        }
    }
}

/// Every (b, h) head's rows through attention_row; multi-head: the head outputs merged,
/// (B·Sq) × (H·dv), and per (b, i, h) whether the row is NaN by construction.
struct merged_heads {
    dd_matrix m;
    std::vector<std::uint8_t> nan_rows;
};

inline void run_heads(const fast_problem& p, const projections* pr, const call_dims& d, const head_context& hc,
                      const fast_options& fo, merged_heads* merged) {
    const stage_scope s(fo.observer, fast_stage::attention);
    ::attnref::parallel_for(d.B * d.H, fo.threads, [&](std::size_t task) {
        const std::size_t b = task / d.H, h = task % d.H;
        head_buffers hb;
        gather_head(p, pr, d, b, h, hb);
        const bool dwi = pr != nullptr;
        const head_inputs in{d.Sq, d.Sk, d.dk, d.dv, hb.qh.data(), dwi ? hb.ql.data() : nullptr, dwi ? hb.qe.data() : nullptr,
                             hb.kth.data(), dwi ? hb.ktl.data() : nullptr, dwi ? hb.kte.data() : nullptr,
                             hb.vh.data(), dwi ? hb.vl.data() : nullptr, dwi ? hb.ve.data() : nullptr};
        const head_task t{&hc, &in, &hb.norms, b, h, fo.observer};
        row_workspace ws;
        row_outputs ro;
        for (std::size_t i = 0; i < d.Sq; ++i) {
            attention_row_dispatch(t, i, ws, ro);
            if (merged) {
                const std::size_t base = (b * d.Sq + i) * (d.H * d.dv) + h * d.dv;
                for (std::size_t c = 0; c < d.dv; ++c)
                    merged->m.hi[base + c] = ro.oh[c], merged->m.lo[base + c] = ro.ol[c], merged->m.err[base + c] = ro.oe[c];
                merged->nan_rows[(b * d.Sq + i) * d.H + h] = ro.nan ? 1 : 0;
            }
        }
    });
}

/// (7) again for multi-head attention: output = merged·W_o + b_o, into the output sink.
inline void output_projection(const fast_problem& p, const call_dims& d, const merged_heads& mh, const element_sink& sink,
                              std::size_t threads) {
    const dd_matrix out = project(mh.m, p.params.w_o.data, d.dout, p.params.b_o.empty() ? nullptr : p.params.b_o.data, threads);
    for (std::size_t row = 0; row < d.B * d.Sq; ++row) {
        bool nan = false;
        for (std::size_t h = 0; h < d.H; ++h) nan = nan || mh.nan_rows[row * d.H + h];
        for (std::size_t c = 0; c < d.dout; ++c) {
            const std::size_t n = row * d.dout + c;
            if (nan) sink.put_exact(n, std::numeric_limits<double>::quiet_NaN());
            else sink.put(n, bounded{{out.hi[n], out.lo[n]}, out.err[n], 0});
        }
    }
}

/// The fast rung over the whole call: every element bounded and checked through the sinks.
inline void fast_rung(const fast_problem& p, const call_dims& d, const tensor_layout& layout, const std::vector<element_sink>& sinks,
                      const fast_options& fo, fast_stats& stats) {
    projections pr;
    if (p.mha) {
        {
            const stage_scope s(fo.observer, fast_stage::projections);
            pr = project_inputs(p, d, fo.threads);
        }
        std::string why;
        if (!in_range(pr.q.hi.data(), pr.q.hi.size())) why = "a nonzero |projected query| outside [2^-400, 2^40]";
        else if (!in_range(pr.k.hi.data(), pr.k.hi.size())) why = "a nonzero |projected key| outside [2^-400, 2^40]";
        else if (!in_range(pr.v.hi.data(), pr.v.hi.size())) why = "a nonzero |projected value| outside [2^-400, 2^40]";
        if (!why.empty()) {
            stats.whole_case_reason = why;
            for (const element_sink& s : sinks) std::fill(s.undecided->begin(), s.undecided->end(), std::uint8_t{1});
            return;
        }
    }
    head_context hc{&p.options, d.B, d.H, d.Sq, d.Sk, d.dk, d.dv, {}, 0,
                    p.mha ? nullptr : &sinks[tensor_layout::output], layout.weights ? &sinks[layout.weights_index()] : nullptr,
                    layout.lse ? &sinks[layout.lse_index()] : nullptr};
    logit_scale_dd(p.options, d.dk, hc.scale, hc.scale_err);
    merged_heads mh;
    if (p.mha) {
        const std::size_t n = d.B * d.Sq * d.H * d.dv;
        mh.m = {d.B * d.Sq, d.H * d.dv, std::vector<double>(n), std::vector<double>(n), std::vector<double>(n)};
        mh.nan_rows.assign(d.B * d.Sq * d.H, 0);
    }
    run_heads(p, p.mha ? &pr : nullptr, d, hc, fo, p.mha ? &mh : nullptr);
    if (p.mha) {
        pr = {};  // the projections are no longer needed
        const stage_scope s(fo.observer, fast_stage::output_projection);
        output_projection(p, d, mh, sinks[tensor_layout::output], fo.threads);
    }
}

/// Per (b, h, i) row: empty from the mask alone under empty_row_policy::nan (NaN by construction).
inline std::vector<std::uint8_t> nan_rows_of(const attention_options& o, const call_dims& d) {
    std::vector<std::uint8_t> nan_rows(d.B * d.H * d.Sq, 0);
    if (o.softmax.empty_rows != empty_row_policy::nan) return nan_rows;
    for (std::size_t b = 0; b < d.B; ++b)
        for (std::size_t h = 0; h < d.H; ++h)
            for (std::size_t i = 0; i < d.Sq; ++i) {
                bool any = false;
                for (std::size_t j = 0; j < d.Sk && !any; ++j) any = !structurally_masked(o.mask, b, h, i, j, d.Sq, d.Sk);
                nan_rows[(b * d.H + h) * d.Sq + i] = any ? 0 : 1;
            }
    return nan_rows;
}

}  // namespace detail

/// Certifies output (and weights, lse when asked) of `p` for every target (the first should be
/// float64_target). Returns certify::result: values[tensor][target][n], reports with `escalated`
/// = elements the fast rung left to the MPFI ladder, precisions_bits = {106} plus every MPFI rung
/// computed. Throws certify::uncertified_error as certify::certify does.
inline certify::result certify_fast(const fast_problem& p, bool want_weights, bool want_lse,
                                    const std::vector<format_description>& targets, const fast_options& fo = {},
                                    fast_stats* stats_out = nullptr) {
    require_reference_fp_environment();
    (void)detail::consts();  // MPFR constants once, on the calling thread
    fast_stats stats;
    const attention_options& o = p.options;
    const detail::call_dims d = detail::dims_of(p);
    ::attnref::validate_masks(o.mask, d.B, d.H, d.Sq, d.Sk);
    if (!o.alibi_slopes.empty()) require_extent("alibi_slopes size (heads)", o.alibi_slopes.size(), d.H);
    const detail::tensor_layout layout{want_weights, want_lse};
    std::vector<std::string> names{"output"};
    std::vector<std::size_t> sizes{p.mha ? d.B * d.Sq * d.dout : d.B * d.H * d.Sq * d.dv};
    if (want_weights) names.push_back("weights"), sizes.push_back(d.B * d.H * d.Sq * d.Sk);
    if (want_lse) names.push_back("lse"), sizes.push_back(d.B * d.H * d.Sq);
    const std::size_t nt = names.size(), nk = targets.size();
    certify::result r;
    r.values.assign(nt, std::vector<std::vector<double>>(nk));
    std::vector<std::vector<std::uint8_t>> undecided(nt);
    for (std::size_t t = 0; t < nt; ++t) {
        for (std::size_t k = 0; k < nk; ++k) r.values[t][k].assign(sizes[t], 0.0);
        undecided[t].assign(sizes[t], 0);
    }
    std::vector<detail::element_sink> sinks;
    for (std::size_t t = 0; t < nt; ++t) sinks.push_back({&r.values[t], &undecided[t], &targets, fo.bound_scale, t, &fo.observe});

    stats.whole_case_reason = detail::outside_ranges(p);
    if (stats.whole_case_reason.empty()) detail::fast_rung(p, d, layout, sinks, fo, stats);
    else
        for (auto& u : undecided) std::fill(u.begin(), u.end(), std::uint8_t{1});

    // Reports before escalation: escalated = undecided by the fast rung.
    std::vector<std::size_t> left(nt, 0);
    for (std::size_t t = 0; t < nt; ++t) {
        for (std::uint8_t f : undecided[t]) left[t] += f;
        stats.escalated_elements += left[t];
        for (std::size_t k = 0; k < nk; ++k)
            r.reports.push_back(certify::tensor_report{names[t], targets[k].name, sizes[t], sizes[t], left[t], {106}});
    }
    r.precisions_bits = {106};
    if (stats.escalated_elements && fo.fallback) {
        const detail::stage_scope s(fo.observer, fast_stage::escalation);
        detail::row_rung first{&p, fo.threads};
        detail::mpfi_runner run{&p, d.B, d.H, d.Sq, d.Sk, d.dv, d.dout, want_weights, want_lse, std::vector<std::uint8_t>(nt, 0),
                                fo.threads, p.mha && fo.row_rung ? &first : nullptr, &stats};
        for (std::size_t t = 0; t < nt; ++t) run.need[t] = left[t] != 0;
        std::vector<int> precisions;
        std::vector<std::vector<std::size_t>> shapes{p.mha ? std::vector<std::size_t>{d.B, d.Sq, d.dout}
                                                           : std::vector<std::size_t>{d.B, d.H, d.Sq, d.dv}};
        if (want_weights) shapes.push_back({d.B, d.H, d.Sq, d.Sk});
        if (want_lse) shapes.push_back({d.B, d.H, d.Sq});
        detail::escalate(names, targets, r.values, undecided, detail::nan_rows_of(o, d), run, d.B * d.H * d.Sq, stats, precisions, shapes);
        for (int bits : precisions) r.precisions_bits.push_back(bits);
        for (auto& rep : r.reports)
            if (rep.escalated) rep.precisions_bits.insert(rep.precisions_bits.end(), precisions.begin(), precisions.end());
    } else if (stats.escalated_elements) {
        for (std::size_t t = 0; t < nt; ++t)
            for (std::size_t k = 0; k < nk; ++k) r.reports[t * nk + k].certified = sizes[t] - left[t];
    }
    if (stats_out) *stats_out = stats;
    return r;
}

}  // namespace attnref::fast
