#pragma once
/// \file certify/fast/backward.hpp
/// The fast rung of the certified SDPA backward (docs/fast-certify.md (11)): the gradients dQ, dK,
/// dV of sum(dO ∘ attention(q, k, v)) at the exact (double) inputs and dO, each element a double-word
/// with a rigorous bound, decided by the rounding check (9) per target. What it leaves undecided
/// goes to the MPFI ladder (golden/generate.hpp), which gives the same bytes where both decide (a
/// correctly rounded value is unique).
///
/// Per kv head (b, hk), its G = H/Hkv query heads and their rows i (the forward's row, (8)–(8f)):
///   dP_ij = dO_i·v_j            (5), exact inputs
///   D_i   = dO_i·O_i            (5) with O_i's bound (8f)   (= Σ_j P_ij dP_ij in exact arithmetic)
///   dS_ij = P_ij (dP_ij − D_i)  (2)
///   dQ_i  = s Σ_j dS_ij k_j     (5) over j, then ·s
///   dK_j  = s Σ_{h,i} dS_ij q_i  dV_j = Σ_{h,i} P_ij dO_i     (5) over the group's rows
/// Structural values, as core/backward.hpp produces them: masked keys have dS = 0, a row with one
/// attendable key dS = 0, an empty row dS = 0 (zero and uniform policies; uniform rows still feed dV
/// with P = 1/Sk), and under the nan policy dQ of an empty row and dK, dV of its kv head are NaN.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "attnref/certify/fast/attention_row.hpp"
#include "attnref/certify/fast/certify_fast.hpp"
#include "attnref/core/parallel.hpp"

namespace attnref::fast {

/// The fast rung's gradients: values[tensor][target][n] (tensor 0 dQ (B, H, Sq, dk), 1 dK
/// (B, Hkv, Sk, dk), 2 dV (B, Hkv, Sk, dv)) where decided, undecided[tensor][n] = 1 elsewhere.
struct fast_gradients {
    std::vector<std::vector<std::vector<double>>> values;
    std::vector<std::vector<std::uint8_t>> undecided;
    std::string whole_case_reason;  ///< non-empty: nothing was computed (every element undecided), and why
    std::size_t undecided_elements = 0;
};

namespace detail {

/// Σ_c a_c b_c of a double-word row a (length n, errors ae, may be null) with the m columns of B
/// (n × m, row stride ldb, exact), with the bound (5b) or (5a), whichever is smaller, plus the
/// propagated Σ_c ae_c |b_cj|, each of the two Σ|·||b_cj| bounded by min(Cauchy–Schwarz, Hölder)
/// from the column norms bn and column maxima bmax of B. Writes hi, lo, err (m each).
inline void dot_bounded(const double* ah, const double* al, const double* ae, std::size_t n, const double* B, std::size_t ldb,
                        std::size_t m, const std::vector<double>& bn, const std::vector<double>& bmax, double* hi, double* lo, double* err) {
    dot_rows(ah, al, n, B, nullptr, ldb, m, hi, lo, err);
    const double an = norm_up(ah, n), a1 = [&] {
        double s = 0;
        for (std::size_t c = 0; c < n; ++c) s += std::fabs(ah[c]);
        return dw::sum_up(s * (1 + 0x1p-52), n + 1);
    }();
    double en = 0, e1 = 0;
    if (ae) {
        en = norm_up(ae, n);
        for (std::size_t c = 0; c < n; ++c) e1 += ae[c];
        e1 = dw::sum_up(e1, n);
    }
    const double cdot = dot_constant(n);
    for (std::size_t j = 0; j < m; ++j) {
        const double cs = std::min(an * bn[j], a1 * bmax[j]);
        const double prop = ae ? std::min(en * bn[j], e1 * bmax[j]) : 0.0;
        err[j] = dw::up(std::min(cdot * cs, err[j] + dot_remainder_constant * cs) + prop);
    }
}

/// Column norms (rounded up) and maxima (× (1 + 2^-52)) of an n × m matrix with row stride ld.
inline void column_norms(const double* x, std::size_t n, std::size_t m, std::size_t ld, std::vector<double>& norm, std::vector<double>& mx) {
    norm.assign(m, 0.0), mx.assign(m, 0.0);
    for (std::size_t c = 0; c < m; ++c) {
        norm[c] = norm_up(x + c, n, ld);
        for (std::size_t r = 0; r < n; ++r) mx[c] = std::max(mx[c], std::fabs(x[r * ld + c]) * (1 + 0x1p-52));
    }
}

/// True when every element of (h, l, e) is exactly 0 (a structural zero: the result is exact +0).
inline bool all_zero(const double* h, const double* l, const double* e, std::size_t n) {
    for (std::size_t c = 0; c < n; ++c)
        if (h[c] != 0 || l[c] != 0 || e[c] != 0) return false;
    return true;
}

/// s·x for a double-word x with bound ex: the product and its bound ((2), the scale's error of (4)).
inline bounded scaled(dd x, double ex, const dd& s, double es) {
    const dd r = dw::mul(x, s);
    return bounded{r, dw::up(dw::mag(s) * ex + dw::mag(x) * es + ex * es + eta_up * dw::mag(r)), 0};
}

}  // namespace detail

/// The fast rung of the SDPA backward of `p` (not multi-head) at grad_output dO (B, H, Sq, dv),
/// for every target. Deterministic: the work is split by kv head, each computed in a fixed order.
inline fast_gradients sdpa_gradients_fast(const fast_problem& p, tensor_view<const double, 4> dO, const std::vector<format_description>& targets,
                                          const fast_options& fo = {}) {
    using namespace detail;
    require_reference_fp_environment();
    (void)consts();
    const call_dims d = dims_of(p);
    const attention_options& o = p.options;
    ::attnref::validate_masks(o.mask, d.B, d.H, d.Sq, d.Sk);
    require_extent("grad_output axis 0 (batch)", dO.extents[0], d.B);
    require_extent("grad_output axis 1 (heads)", dO.extents[1], d.H);
    require_extent("grad_output axis 2 (query length)", dO.extents[2], d.Sq);
    require_extent("grad_output axis 3 (head dim dv)", dO.extents[3], d.dv);
    const std::size_t nk = targets.size(), G = d.H / d.Hkv, GS = G * d.Sq;
    const std::size_t sizes[3] = {d.B * d.H * d.Sq * d.dk, d.B * d.Hkv * d.Sk * d.dk, d.B * d.Hkv * d.Sk * d.dv};
    fast_gradients g;
    g.values.assign(3, std::vector<std::vector<double>>(nk));
    g.undecided.resize(3);
    for (std::size_t t = 0; t < 3; ++t) {
        for (auto& v : g.values[t]) v.assign(sizes[t], 0.0);
        g.undecided[t].assign(sizes[t], 0);
    }
    g.whole_case_reason = p.mha ? "multi-head attention (the fast backward is SDPA only)" : outside_ranges(p);
    if (g.whole_case_reason.empty() && !in_range(dO.data, dO.size())) g.whole_case_reason = "a nonzero |grad_output| outside [2^-400, 2^40]";
    if (!g.whole_case_reason.empty()) {
        for (auto& u : g.undecided) std::fill(u.begin(), u.end(), std::uint8_t{1});
        g.undecided_elements = sizes[0] + sizes[1] + sizes[2];
        return g;
    }
    std::vector<element_sink> sinks;
    for (std::size_t t = 0; t < 3; ++t) sinks.push_back({&g.values[t], &g.undecided[t], &targets, fo.bound_scale, t, &fo.observe});
    head_context hc{&o, d.B, d.H, d.Sq, d.Sk, d.dk, d.dv, {}, 0, nullptr, nullptr, nullptr};
    logit_scale_dd(o, d.dk, hc.scale, hc.scale_err);
    const double nan = std::numeric_limits<double>::quiet_NaN();

    ::attnref::parallel_for(d.B * d.Hkv, fo.threads, [&](std::size_t task) {
        const std::size_t b = task / d.Hkv, hk = task % d.Hkv, Sq = d.Sq, Sk = d.Sk, dk = d.dk, dv = d.dv;
        // The kv head's k (Sk × dk, natural layout) and vᵀ (dv × Sk), their norms.
        std::vector<double> kn(Sk * dk), vt(dv * Sk), vrow(Sk);
        for (std::size_t j = 0; j < Sk; ++j)
            for (std::size_t c = 0; c < dk; ++c) kn[j * dk + c] = p.k(b, hk, j, c);
        for (std::size_t j = 0; j < Sk; ++j)
            for (std::size_t c = 0; c < dv; ++c) vt[c * Sk + j] = p.v(b, hk, j, c);
        for (std::size_t j = 0; j < Sk; ++j) vrow[j] = norm_up(vt.data() + j, dv, Sk);  // ‖v_j‖
        std::vector<double> kcn, kmx;
        column_norms(kn.data(), Sk, dk, dk, kcn, kmx);
        // The group's rows stacked (g·Sq + i): dO and q, and Pᵀ, dSᵀ (Sk × G·Sq) with their bounds.
        std::vector<double> dos(GS * dv), qs(GS * dk);
        std::vector<double> pth(Sk * GS, 0.0), ptl(Sk * GS, 0.0), pte(Sk * GS, 0.0), sth(Sk * GS, 0.0), stl(Sk * GS, 0.0), ste(Sk * GS, 0.0);
        bool group_nan = false, group_failed = false;
        head_buffers hb;
        row_workspace ws;
        row_outputs ro;
        std::vector<double> dph(Sk), dpl(Sk), dpe(Sk), dsh(Sk), dsl(Sk), dse(Sk), oh(dk), ol(dk), oe(dk), vone{0.0}, dn(1), dl(1), de(1);
        std::vector<double> on1, omx1;
        for (std::size_t gi = 0; gi < G; ++gi) {
            const std::size_t h = hk * G + gi;
            gather_head(p, nullptr, d, b, h, hb);
            const head_inputs in{Sq, Sk, dk, dv, hb.qh.data(), nullptr, nullptr, hb.kth.data(), nullptr, nullptr, hb.vh.data(), nullptr, nullptr};
            const head_task t{&hc, &in, &hb.norms, b, h, fo.observer};
            for (std::size_t i = 0; i < Sq; ++i) {
                const std::size_t r = gi * Sq + i, qrow = ((b * d.H + h) * Sq + i) * dk;
                for (std::size_t c = 0; c < dv; ++c) dos[r * dv + c] = dO(b, h, i, c);
                for (std::size_t c = 0; c < dk; ++c) qs[r * dk + c] = p.q(b, h, i, c);
                attention_row_dispatch(t, i, ws, ro);
                if (ws.empty && o.softmax.empty_rows != empty_row_policy::uniform) {
                    // zero: no gradient from the row (P = dS = 0); nan: dQ_i NaN and the kv head's dK, dV.
                    const bool is_nan = o.softmax.empty_rows == empty_row_policy::nan;
                    group_nan = group_nan || is_nan;
                    for (std::size_t c = 0; c < dk; ++c) sinks[0].put_exact(qrow + c, is_nan ? nan : 0.0);
                    continue;
                }
                bool failed = false;
                for (std::size_t c = 0; c < dv; ++c) failed = failed || !std::isfinite(ro.oe[c]);
                if (failed) {  // the forward row is left to MPFI: so are dQ_i and the kv head's dK, dV
                    group_failed = true;
                    for (std::size_t c = 0; c < dk; ++c) g.undecided[0][qrow + c] = 1;
                    continue;
                }
                std::size_t attendable = 0;
                for (std::size_t j = 0; j < Sk; ++j) attendable += ws.allowed[j];
                // dS = 0 exactly: a uniform (empty) row, or one attendable key (P = 1 whatever the logit).
                const bool ds_zero = ws.empty || attendable == 1;
                for (std::size_t j = 0; j < Sk; ++j)
                    pth[j * GS + r] = ws.ph[j], ptl[j * GS + r] = ws.pl[j], pte[j * GS + r] = ws.pe[j];
                if (ds_zero) {
                    for (std::size_t c = 0; c < dk; ++c) sinks[0].put_exact(qrow + c, 0.0);
                    continue;
                }
                // dP_ij = dO_i·v_j (exact inputs: (5) with ‖dO_i‖‖v_j‖).
                const double* doi = dos.data() + r * dv;
                dot_rows(doi, nullptr, dv, vt.data(), nullptr, Sk, Sk, dph.data(), dpl.data(), dpe.data());
                const double don = norm_up(doi, dv), cdv = dot_constant(dv);
                for (std::size_t j = 0; j < Sk; ++j) {
                    const double cs = don * vrow[j];
                    dpe[j] = dw::up(std::min(cdv * cs, dpe[j] + dot_remainder_constant * cs));
                }
                // D_i = dO_i·O_i with O_i's bound (8f).
                column_norms(ro.oh.data(), dv, 1, 1, on1, omx1);
                dot_rows(doi, nullptr, dv, ro.oh.data(), ro.ol.data(), 1, 1, dn.data(), dl.data(), de.data());
                double prop = 0;
                for (std::size_t c = 0; c < dv; ++c) prop += std::fabs(doi[c]) * ro.oe[c];
                const double csd = don * on1[0];
                const dd D{dn[0], dl[0]};
                const double eD = dw::up(std::min(cdv * csd, de[0] + dot_remainder_constant * csd) + dw::sum_up(prop, 2 * dv));
                // dS_ij = P_ij (dP_ij − D_i).
                for (std::size_t j = 0; j < Sk; ++j) {
                    if (ws.ph[j] == 0 && ws.pl[j] == 0 && ws.pe[j] == 0) {  // masked key: exact 0
                        dsh[j] = dsl[j] = dse[j] = 0;
                        continue;
                    }
                    const dd tj = dw::sub({dph[j], dpl[j]}, D);
                    const double et = dw::up(dpe[j] + eD + eta_up * dw::mag(tj));
                    const dd P{ws.ph[j], ws.pl[j]};
                    const dd s = dw::mul(P, tj);
                    dsh[j] = s.hi, dsl[j] = s.lo;
                    dse[j] = dw::up(dw::mag(P) * et + ws.pe[j] * (dw::mag(tj) + et) + eta_up * dw::mag(s));
                }
                for (std::size_t j = 0; j < Sk; ++j) sth[j * GS + r] = dsh[j], stl[j * GS + r] = dsl[j], ste[j * GS + r] = dse[j];
                // dQ_i = s·Σ_j dS_ij k_j.
                if (all_zero(dsh.data(), dsl.data(), dse.data(), Sk)) {
                    for (std::size_t c = 0; c < dk; ++c) sinks[0].put_exact(qrow + c, 0.0);
                    continue;
                }
                dot_bounded(dsh.data(), dsl.data(), dse.data(), Sk, kn.data(), dk, dk, kcn, kmx, oh.data(), ol.data(), oe.data());
                for (std::size_t c = 0; c < dk; ++c) sinks[0].put(qrow + c, scaled({oh[c], ol[c]}, oe[c], hc.scale, hc.scale_err));
            }
        }
        const std::size_t kbase = (b * d.Hkv + hk) * Sk;
        if (group_nan || group_failed) {
            for (std::size_t n = kbase * dk; n < (kbase + Sk) * dk; ++n)
                group_nan ? sinks[1].put_exact(n, nan) : void(g.undecided[1][n] = 1);
            for (std::size_t n = kbase * dv; n < (kbase + Sk) * dv; ++n)
                group_nan ? sinks[2].put_exact(n, nan) : void(g.undecided[2][n] = 1);
            return;
        }
        // dV_j = Σ_rows P_rj dO_r and dK_j = s·Σ_rows dS_rj q_r over the group's stacked rows.
        std::vector<double> docn, domx, qcn, qmx, vh(dv), vl(dv), ve(dv), khh(dk), khl(dk), khe(dk);
        column_norms(dos.data(), GS, dv, dv, docn, domx);
        column_norms(qs.data(), GS, dk, dk, qcn, qmx);
        for (std::size_t j = 0; j < Sk; ++j) {
            const std::size_t o0 = j * GS;
            if (all_zero(pth.data() + o0, ptl.data() + o0, pte.data() + o0, GS)) {
                for (std::size_t c = 0; c < dv; ++c) sinks[2].put_exact((kbase + j) * dv + c, 0.0);
            } else {
                dot_bounded(pth.data() + o0, ptl.data() + o0, pte.data() + o0, GS, dos.data(), dv, dv, docn, domx, vh.data(), vl.data(), ve.data());
                for (std::size_t c = 0; c < dv; ++c) sinks[2].put((kbase + j) * dv + c, bounded{{vh[c], vl[c]}, ve[c], 0});
            }
            if (all_zero(sth.data() + o0, stl.data() + o0, ste.data() + o0, GS)) {
                for (std::size_t c = 0; c < dk; ++c) sinks[1].put_exact((kbase + j) * dk + c, 0.0);
            } else {
                dot_bounded(sth.data() + o0, stl.data() + o0, ste.data() + o0, GS, qs.data(), dk, dk, qcn, qmx, khh.data(), khl.data(), khe.data());
                for (std::size_t c = 0; c < dk; ++c) sinks[1].put((kbase + j) * dk + c, scaled({khh[c], khl[c]}, khe[c], hc.scale, hc.scale_err));
            }
        }
    });
    for (const auto& u : g.undecided)
        for (std::uint8_t f : u) g.undecided_elements += f;
    return g;
}

}  // namespace attnref::fast
