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
/// And as the MPFI ladder sets it (certify/forced_zeros.hpp): dQ_ic = 0 exactly where the exact keys'
/// feature c is the same over row i's attendable keys (Σ_j dS_ij = 0), without soft-capping.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <mpfr.h>

#include "attnref/certify/fast/attention_row.hpp"
#include "attnref/certify/fast/certify_fast.hpp"
#include "attnref/certify/fast/triple_dot.hpp"
#include "attnref/certify/forced_zeros.hpp"
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
/// (n × m, row stride ldb; low parts bl and errors be, each may be null), with the bound (5b) or
/// (5a), whichever is smaller, plus the propagated input errors Σ_c ae_c|b̃_cj| and
/// Σ_c (|ã_c| + ae_c)·be_cj, each Σ|·||·| bounded by min(Cauchy–Schwarz, Hölder) from the column
/// norms bn (ben) and column maxima bmax (bemax) of B (of its errors), the first also by its sum term
/// by term. Writes hi, lo, err (m each).
inline void dot_bounded(const double* ah, const double* al, const double* ae, std::size_t n, const double* B, const double* bl,
                        const double* be, std::size_t ldb, std::size_t m, const std::vector<double>& bn, const std::vector<double>& bmax,
                        const std::vector<double>& ben, const std::vector<double>& bemax, double* hi, double* lo, double* err) {
    dot_rows(ah, al, n, B, bl, ldb, m, hi, lo, err);
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
    // Σ_c ae_c|B_cj| also term by term (rows of B in order, columns side by side): a's propagated
    // errors dominate the bound (a's bounds are far above (5)'s rounding), and where their sizes vary
    // the norms overestimate that sum.
    thread_local std::vector<double> tea;
    if (ae) {
        tea.assign(m, 0.0);
        double* __restrict t = tea.data();
        for (std::size_t c = 0; c < n; ++c) {
            const double e = ae[c];
            const double* __restrict b = B + c * ldb;
            for (std::size_t j = 0; j < m; ++j) t[j] += e * std::fabs(b[j]);
        }
    }
    const double cdot = dot_constant(n);
    for (std::size_t j = 0; j < m; ++j) {
        const double cs = std::min(an * bn[j], a1 * bmax[j]);
        double prop = ae ? std::min({en * bn[j], e1 * bmax[j], dw::sum_up(tea[j] * (1 + 0x1p-52), 2 * n + 1)}) : 0.0;  // |b̃| ≤ |b_hi|(1 + u)
        if (be) prop += std::min((an + en) * ben[j], (a1 + e1) * bemax[j]);
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

/// s·x for a double-word x with bound ex: the product and its bound ((2), the scale's error of (4)).
inline bounded scaled(dd x, double ex, const dd& s, double es) {
    const dd r = dw::mul(x, s);
    return bounded{r, dw::up(dw::mag(s) * ex + dw::mag(x) * es + ex * es + eta_up * dw::mag(r)), 0};
}

/// Where group_backward puts its results. Tensor t: 0 dQ (index (b, query head, query row, c)),
/// 1 dK and 2 dV (index (b, kv head, key, c)). `head_output` receives every forward row's O_i
/// (double-word and bound) before its gradients.
struct gradient_emitter {
    virtual ~gradient_emitter() = default;
    virtual void put(std::size_t t, std::size_t b, std::size_t head, std::size_t row, std::size_t c, const bounded& x) = 0;
    virtual void put_exact(std::size_t t, std::size_t b, std::size_t head, std::size_t row, std::size_t c, double v) = 0;
    virtual void undecided(std::size_t t, std::size_t b, std::size_t head, std::size_t row, std::size_t c) = 0;
    virtual void head_output(std::size_t, std::size_t, std::size_t, const row_outputs&) {}
};

/// The (11) backward of kv head hk of batch b: every query row of its G heads through the forward
/// row (8)–(8f), then dQ per row and dK, dV per key over the group's stacked rows. The heads' q, k,
/// v come from gather_head (exact for SDPA, pr == nullptr; the projections (7) for multi-head
/// attention) and dO_i from `dO` (SDPA, exact) or from `dho` (multi-head: dO·W_oᵀ as double-words
/// with bounds, (B·Sq) × (H·dv)); every input error is propagated ((11a)–(11d), (14)).
inline void group_backward(const fast_problem& p, const projections* pr, tensor_view<const double, 4> dO, const dd_matrix* dho,
                           const call_dims& d, const head_context& hc, std::size_t b, std::size_t hk, const fast_options& fo,
                           gradient_emitter& out) {
    const attention_options& o = p.options;
    const std::size_t G = d.H / d.Hkv, GS = G * d.Sq, Sq = d.Sq, Sk = d.Sk, dk = d.dk, dv = d.dv;
    const bool dwi = pr != nullptr;  // double-word inputs with bounds
    const double nan = std::numeric_limits<double>::quiet_NaN();
    // The group's rows stacked (g·Sq + i): dO and q (double-words with bounds), and Pᵀ, dSᵀ (Sk × G·Sq) with their bounds.
    std::vector<double> dos(GS * dv), qs(GS * dk), dosl, dose, qsl, qse;
    if (dwi) dosl.assign(GS * dv, 0.0), dose.assign(GS * dv, 0.0), qsl.assign(GS * dk, 0.0), qse.assign(GS * dk, 0.0);
    std::vector<double> pth(Sk * GS, 0.0), ptl(Sk * GS, 0.0), pte(Sk * GS, 0.0), sth(Sk * GS, 0.0), stl(Sk * GS, 0.0), ste(Sk * GS, 0.0);
    // The kv head's k (Sk × dk, natural layout) and vᵀ (dv × Sk), from the first head's buffers.
    std::vector<double> kn(Sk * dk), vt(dv * Sk), knl, kne, vtl, vte, vrow(Sk), vern(Sk, 0.0);
    std::vector<double> kcn, kmx, kecn, kemx;
    bool group_nan = false, group_failed = false;
    head_buffers hb;
    row_workspace ws;
    row_outputs ro;
    std::vector<double> dph(Sk), dpl(Sk), dpe(Sk), dsh(Sk), dsl(Sk), dse(Sk), oh(dk), ol(dk), oe(dk), dn(1), dl(1), de(1);
    std::vector<double> on1, omx1;
    for (std::size_t gi = 0; gi < G; ++gi) {
        const std::size_t h = hk * G + gi;
        gather_head(p, pr, d, b, h, hb);
        if (gi == 0) {
            if (dwi) knl.resize(Sk * dk), kne.resize(Sk * dk), vtl.resize(dv * Sk), vte.resize(dv * Sk);
            for (std::size_t j = 0; j < Sk; ++j)
                for (std::size_t c = 0; c < dk; ++c) {
                    kn[j * dk + c] = hb.kth[c * Sk + j];
                    if (dwi) knl[j * dk + c] = hb.ktl[c * Sk + j], kne[j * dk + c] = hb.kte[c * Sk + j];
                }
            for (std::size_t j = 0; j < Sk; ++j)
                for (std::size_t c = 0; c < dv; ++c) {
                    vt[c * Sk + j] = hb.vh[j * dv + c];
                    if (dwi) vtl[c * Sk + j] = hb.vl[j * dv + c], vte[c * Sk + j] = hb.ve[j * dv + c];
                }
            for (std::size_t j = 0; j < Sk; ++j) {
                vrow[j] = norm_up(vt.data() + j, dv, Sk);  // ‖v_j‖
                if (dwi) vern[j] = norm_up(vte.data() + j, dv, Sk);  // ‖e_vj‖
            }
            column_norms(kn.data(), Sk, dk, dk, kcn, kmx);
            if (dwi) column_norms(kne.data(), Sk, dk, dk, kecn, kemx);
        }
        const head_inputs in{Sq, Sk, dk, dv, hb.qh.data(), dwi ? hb.ql.data() : nullptr, dwi ? hb.qe.data() : nullptr,
                             hb.kth.data(), dwi ? hb.ktl.data() : nullptr, dwi ? hb.kte.data() : nullptr,
                             hb.vh.data(), dwi ? hb.vl.data() : nullptr, dwi ? hb.ve.data() : nullptr};
        const head_task t{&hc, &in, &hb.norms, b, h, fo.observer};
        for (std::size_t i = 0; i < Sq; ++i) {
            const std::size_t r = gi * Sq + i;
            for (std::size_t c = 0; c < dv; ++c) {
                if (!dwi) {
                    dos[r * dv + c] = dO(b, h, i, c);
                } else {
                    const std::size_t n = (b * Sq + i) * (d.H * dv) + h * dv + c;
                    dos[r * dv + c] = dho->hi[n], dosl[r * dv + c] = dho->lo[n], dose[r * dv + c] = dho->err[n];
                }
            }
            for (std::size_t c = 0; c < dk; ++c) {
                qs[r * dk + c] = hb.qh[i * dk + c];
                if (dwi) qsl[r * dk + c] = hb.ql[i * dk + c], qse[r * dk + c] = hb.qe[i * dk + c];
            }
            attention_row_dispatch(t, i, ws, ro);
            out.head_output(b, h, i, ro);
            if (ws.empty && o.softmax.empty_rows != empty_row_policy::uniform) {
                // zero: no gradient from the row (P = dS = 0); nan: dQ_i NaN and the kv head's dK, dV.
                const bool is_nan = o.softmax.empty_rows == empty_row_policy::nan;
                group_nan = group_nan || is_nan;
                for (std::size_t c = 0; c < dk; ++c) out.put_exact(0, b, h, i, c, is_nan ? nan : 0.0);
                continue;
            }
            bool failed = false;
            for (std::size_t c = 0; c < dv; ++c) failed = failed || !std::isfinite(ro.oe[c]);
            if (failed) {  // the forward row is left to MPFI: so are dQ_i and the kv head's dK, dV
                group_failed = true;
                for (std::size_t c = 0; c < dk; ++c) out.undecided(0, b, h, i, c);
                continue;
            }
            std::size_t attendable = 0;
            for (std::size_t j = 0; j < Sk; ++j) attendable += ws.allowed[j];
            // dS = 0 exactly: a uniform (empty) row, or one attendable key (P = 1 whatever the logit).
            const bool ds_zero = ws.empty || attendable == 1;
            for (std::size_t j = 0; j < Sk; ++j)
                pth[j * GS + r] = ws.ph[j], ptl[j * GS + r] = ws.pl[j], pte[j * GS + r] = ws.pe[j];
            if (ds_zero) {
                for (std::size_t c = 0; c < dk; ++c) out.put_exact(0, b, h, i, c, 0.0);
                continue;
            }
            // (11a) dP_ij = dO_i·v_j: (5) with ‖dO_i‖‖v_j‖, plus the inputs' errors (14a).
            const double* doi = dos.data() + r * dv;
            const double* doil = dwi ? dosl.data() + r * dv : nullptr;
            const double* doie = dwi ? dose.data() + r * dv : nullptr;
            dot_rows(doi, doil, dv, vt.data(), dwi ? vtl.data() : nullptr, Sk, Sk, dph.data(), dpl.data(), dpe.data());
            const double don = norm_up(doi, dv), doen = dwi ? norm_up(doie, dv) : 0.0, cdv = dot_constant(dv);
            for (std::size_t j = 0; j < Sk; ++j) {
                const double cs = don * vrow[j];
                dpe[j] = dw::up(std::min(cdv * cs, dpe[j] + dot_remainder_constant * cs) + doen * vrow[j] + don * vern[j] + doen * vern[j]);
            }
            // (11b) D_i = dO_i·O_i with O_i's bound (8f) and dO_i's (14b).
            column_norms(ro.oh.data(), dv, 1, 1, on1, omx1);
            dot_rows(doi, doil, dv, ro.oh.data(), ro.ol.data(), 1, 1, dn.data(), dl.data(), de.data());
            double prop = 0;
            if (!dwi) {
                for (std::size_t c = 0; c < dv; ++c) prop += std::fabs(doi[c]) * ro.oe[c];
            } else {  // |dõ_c| ≤ |hi|(1 + u) and |õ_c| ≤ |oh_c|(1 + u)
                for (std::size_t c = 0; c < dv; ++c)
                    prop += std::fabs(doi[c]) * (1 + 0x1p-52) * ro.oe[c] + doie[c] * (std::fabs(ro.oh[c]) * (1 + 0x1p-52) + ro.oe[c]);
            }
            const double csd = don * on1[0];
            const dd D{dn[0], dl[0]};
            const double eD = dw::up(std::min(cdv * csd, de[0] + dot_remainder_constant * csd) + dw::sum_up(prop, (dwi ? 7 : 2) * dv));
            // (11c) dS_ij = P_ij (dP_ij − D_i).
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
            // (11d) dQ_i = s·Σ_j dS_ij k_j.
            if (is_exact_zero_row(dsh.data(), dsl.data(), dse.data(), Sk)) {
                for (std::size_t c = 0; c < dk; ++c) out.put_exact(0, b, h, i, c, 0.0);
                continue;
            }
            dot_bounded(dsh.data(), dsl.data(), dse.data(), Sk, kn.data(), dwi ? knl.data() : nullptr, dwi ? kne.data() : nullptr, dk, dk,
                        kcn, kmx, kecn, kemx, oh.data(), ol.data(), oe.data());
            for (std::size_t c = 0; c < dk; ++c) {
                // Exact inputs whose feature c is the same over the attendable keys: dQ_ic = 0 exactly
                // (Σ_j dS_ij = 0; certify/forced_zeros.hpp), which no bound around the sum can decide.
                if (!dwi && !o.softcap && ::attnref::certify::constant_over_allowed(kn.data() + c, dk, Sk, ws.allowed.data()))
                    out.put_exact(0, b, h, i, c, 0.0);
                else
                    out.put(0, b, h, i, c, scaled({oh[c], ol[c]}, oe[c], hc.scale, hc.scale_err));
            }
        }
    }
    if (group_nan || group_failed) {
        for (std::size_t j = 0; j < Sk; ++j) {
            for (std::size_t c = 0; c < dk; ++c) group_nan ? out.put_exact(1, b, hk, j, c, nan) : out.undecided(1, b, hk, j, c);
            for (std::size_t c = 0; c < dv; ++c) group_nan ? out.put_exact(2, b, hk, j, c, nan) : out.undecided(2, b, hk, j, c);
        }
        return;
    }
    // dV_j = Σ_rows P_rj dO_r and dK_j = s·Σ_rows dS_rj q_r over the group's stacked rows.
    std::vector<double> docn, domx, doecn, doemx, qcn, qmx, qecn, qemx, vh(dv), vl(dv), ve(dv), khh(dk), khl(dk), khe(dk);
    column_norms(dos.data(), GS, dv, dv, docn, domx);
    column_norms(qs.data(), GS, dk, dk, qcn, qmx);
    if (dwi) column_norms(dose.data(), GS, dv, dv, doecn, doemx), column_norms(qse.data(), GS, dk, dk, qecn, qemx);
    for (std::size_t j = 0; j < Sk; ++j) {
        const std::size_t o0 = j * GS;
        if (is_exact_zero_row(pth.data() + o0, ptl.data() + o0, pte.data() + o0, GS)) {
            for (std::size_t c = 0; c < dv; ++c) out.put_exact(2, b, hk, j, c, 0.0);
        } else {
            dot_bounded(pth.data() + o0, ptl.data() + o0, pte.data() + o0, GS, dos.data(), dwi ? dosl.data() : nullptr,
                        dwi ? dose.data() : nullptr, dv, dv, docn, domx, doecn, doemx, vh.data(), vl.data(), ve.data());
            for (std::size_t c = 0; c < dv; ++c) out.put(2, b, hk, j, c, bounded{{vh[c], vl[c]}, ve[c], 0});
        }
        if (is_exact_zero_row(sth.data() + o0, stl.data() + o0, ste.data() + o0, GS)) {
            for (std::size_t c = 0; c < dk; ++c) out.put_exact(1, b, hk, j, c, 0.0);
        } else {
            dot_bounded(sth.data() + o0, stl.data() + o0, ste.data() + o0, GS, qs.data(), dwi ? qsl.data() : nullptr, dwi ? qse.data() : nullptr,
                        dk, dk, qcn, qmx, qecn, qemx, khh.data(), khl.data(), khe.data());
            for (std::size_t c = 0; c < dk; ++c) out.put(1, b, hk, j, c, scaled({khh[c], khl[c]}, khe[c], hc.scale, hc.scale_err));
        }
    }
}

/// fast_gradients with every element of every tensor undecided, and why.
inline void decline_whole_case(fast_gradients& g, std::string why) {
    g.whole_case_reason = std::move(why);
    g.undecided_elements = 0;
    for (auto& u : g.undecided) std::fill(u.begin(), u.end(), std::uint8_t{1}), g.undecided_elements += u.size();
}

/// fast_gradients sized for tensors of `sizes` elements and nk targets, nothing decided yet.
inline fast_gradients sized_gradients(const std::vector<std::size_t>& sizes, std::size_t nk) {
    fast_gradients g;
    g.values.assign(sizes.size(), std::vector<std::vector<double>>(nk));
    g.undecided.resize(sizes.size());
    for (std::size_t t = 0; t < sizes.size(); ++t) {
        for (auto& v : g.values[t]) v.assign(sizes[t], 0.0);
        g.undecided[t].assign(sizes[t], 0);
    }
    return g;
}

inline void count_undecided(fast_gradients& g) {
    g.undecided_elements = 0;
    for (const auto& u : g.undecided)
        for (std::uint8_t f : u) g.undecided_elements += f;
}

}  // namespace detail

/// The fast rung of the SDPA backward of `p` (not multi-head) at grad_output dO (B, H, Sq, dv),
/// for every target. Deterministic: the work is split by kv head, each computed in a fixed order.
inline fast_gradients sdpa_gradients_fast(const fast_problem& p, tensor_view<const double, 4> dO, const std::vector<format_description>& targets,
                                          const fast_options& fo = {}) {
    using namespace detail;
    require_reference_fp_environment();
    (void)consts();
    if (p.mha) throw std::invalid_argument("sdpa_gradients_fast: a multi-head problem (mha_gradients_fast)");
    const call_dims d = dims_of(p);
    const attention_options& o = p.options;
    ::attnref::validate_masks(o.mask, d.B, d.H, d.Sq, d.Sk);
    require_extent("grad_output axis 0 (batch)", dO.extents[0], d.B);
    require_extent("grad_output axis 1 (heads)", dO.extents[1], d.H);
    require_extent("grad_output axis 2 (query length)", dO.extents[2], d.Sq);
    require_extent("grad_output axis 3 (head dim dv)", dO.extents[3], d.dv);
    fast_gradients g = sized_gradients({d.B * d.H * d.Sq * d.dk, d.B * d.Hkv * d.Sk * d.dk, d.B * d.Hkv * d.Sk * d.dv}, targets.size());
    std::string why = outside_ranges(p);
    if (why.empty() && !in_range(dO.data, dO.size())) why = "a nonzero |grad_output| outside [2^-400, 2^40]";
    if (!why.empty()) {
        decline_whole_case(g, why);
        return g;
    }
    std::vector<element_sink> sinks;
    for (std::size_t t = 0; t < 3; ++t) sinks.push_back({&g.values[t], &g.undecided[t], &targets, fo.bound_scale, t, &fo.observe});
    head_context hc{&o, d.B, d.H, d.Sq, d.Sk, d.dk, d.dv, {}, 0, nullptr, nullptr, nullptr};
    logit_scale_dd(o, d.dk, hc.scale, hc.scale_err);
    // dQ (B, H, Sq, dk), dK (B, Hkv, Sk, dk), dV (B, Hkv, Sk, dv) in C order, through the sinks.
    struct sdpa_emitter final : gradient_emitter {
        const std::vector<element_sink>* sinks;
        std::vector<std::vector<std::uint8_t>>* undecided_flags;
        const call_dims* d;
        std::size_t index(std::size_t t, std::size_t b, std::size_t head, std::size_t row, std::size_t c) const {
            if (t == 0) return ((b * d->H + head) * d->Sq + row) * d->dk + c;
            return ((b * d->Hkv + head) * d->Sk + row) * (t == 1 ? d->dk : d->dv) + c;
        }
        void put(std::size_t t, std::size_t b, std::size_t head, std::size_t row, std::size_t c, const bounded& x) override {
            (*sinks)[t].put(index(t, b, head, row, c), x);
        }
        void put_exact(std::size_t t, std::size_t b, std::size_t head, std::size_t row, std::size_t c, double v) override {
            (*sinks)[t].put_exact(index(t, b, head, row, c), v);
        }
        void undecided(std::size_t t, std::size_t b, std::size_t head, std::size_t row, std::size_t c) override {
            (*undecided_flags)[t][index(t, b, head, row, c)] = 1;
        }
    };
    ::attnref::parallel_for(d.B * d.Hkv, fo.threads, [&](std::size_t task) {
        sdpa_emitter e;
        e.sinks = &sinks, e.undecided_flags = &g.undecided, e.d = &d;
        group_backward(p, nullptr, dO, nullptr, d, hc, task / d.Hkv, task % d.Hkv, fo, e);
    });
    count_undecided(g);
    return g;
}

namespace detail {

/// The transpose (c × r) of an r × c matrix of doubles.
inline std::vector<double> transposed(const double* x, std::size_t r, std::size_t c) {
    std::vector<double> t(r * c);
    for (std::size_t i = 0; i < r; ++i)
        for (std::size_t j = 0; j < c; ++j) t[j * r + i] = x[i * c + j];
    return t;
}

/// The transpose of a double-word matrix with bounds.
inline dd_matrix transposed(const dd_matrix& m) {
    return {m.cols, m.rows, transposed(m.hi.data(), m.rows, m.cols), transposed(m.lo.data(), m.rows, m.cols),
            transposed(m.err.data(), m.rows, m.cols)};
}

/// Element n of a bounded matrix into a sink.
inline void put_element(const element_sink& s, std::size_t to, const dd_matrix& m, std::size_t n) {
    s.put(to, bounded{{m.hi[n], m.lo[n]}, m.err[n], 0});
}

/// (14a) Y = X·W + bias for exact X (rows × k), W (k × n) and bias (n, or null) through the
/// triple-word dot products (10), each rounded to a double-word: with (hi, mid, low) the (10) sum
/// and bias added exactly to hi and mid (low takes the last carry, its rounding ≤ 2^-53|low| added
/// to the bound), (a_h, a_l) = TwoSum(hi, mid), (t_h, t_l) = TwoSum(a_l, low), (y_h, y_l) =
/// TwoSum(a_h, t_h): hi + mid + low = y_h + y_l + t_l exactly, so the bound is (10)'s + |t_l| (about
/// 2^-106|y|, where (7)'s double-word products leave about n·2^-104 of Σ|x||w|). The multi-head
/// backward's inputs Q, K, V and d(heads): their errors feed every later step.
inline dd_matrix project_exact(const double* x, std::size_t rows, std::size_t k, const double* w, std::size_t n, const double* bias,
                               std::size_t threads) {
    dd_matrix y{rows, n, std::vector<double>(rows * n), std::vector<double>(rows * n), std::vector<double>(rows * n)};
    ::attnref::parallel_for(rows, threads, [&](std::size_t r) {
        std::vector<double> hi(n), mid(n), low(n), er(n);
        dot3_rows(x + r * k, k, w, n, n, hi.data(), mid.data(), low.data(), er.data());
        for (std::size_t j = 0; j < n; ++j) {
            double h = hi[j], m = mid[j], l = low[j], e = er[j];
            if (bias) {
                const dd s1 = dw::two_sum(h, bias[j]);
                const dd s2 = dw::two_sum(m, s1.lo);
                h = s1.hi, m = s2.hi, l = l + s2.lo;
                e = dw::up(e + 0x1p-53 * std::fabs(l));
            }
            const dd a = dw::two_sum(h, m), t = dw::two_sum(a.lo, l), v = dw::two_sum(a.hi, t.hi);
            y.hi[r * n + j] = v.hi, y.lo[r * n + j] = v.lo, y.err[r * n + j] = dw::up(e + std::fabs(t.lo));
        }
    });
    return y;
}

/// (14f) A second look at an element of (7) y = a·b that the rounding check left undecided: the same
/// double-word dot product of row a (hi, lo, errors) with column b (exact, stride ldb), recomputed
/// alone, with Σ|a_hi||b| and Σe_a|b| summed term by term instead of bounded by norms
/// (Cauchy–Schwarz overestimates them by about 1/0.64 on random data); put again.
inline void second_look(const element_sink& s, std::size_t to, const double* ah, const double* al, const double* ae, std::size_t n,
                        const double* b, std::size_t ldb) {
    double hi = 0, lo = 0, err = 0;
    dot_rows(ah, al, n, b, nullptr, ldb, 1, &hi, &lo, &err);
    double sab = 0, seb = 0;
    for (std::size_t c = 0; c < n; ++c) {
        const double ab = std::fabs(b[c * ldb]);
        sab += std::fabs(ah[c]) * ab;
        if (ae) seb += ae[c] * ab;
    }
    sab = dw::sum_up(sab, 2 * n), seb = dw::sum_up(seb, 2 * n);
    (*s.undecided)[to] = 0;
    s.put(to, bounded{{hi, lo}, dw::up(std::min(dot_constant(n) * sab, err + dot_remainder_constant * sab) + seb), 0});
}

/// (14d) One projection's weight and bias gradients from its input x (rows × e, exact) and the
/// gradient dY of its output (rows × f, double-words with bounds): dW = xᵀ·dY into w (e × f, C
/// order) and db = 1ᵀ·dY into bias, as (7) on dYᵀ·[x | 1], so each dW_ef and db_f is one (5) sum over
/// the rows with its bound. bias_zero: db is exactly 0 (grad_b_k, core/backward.hpp), put as such.
inline void weight_gradients(const dd_matrix& dy, tensor_view<const double, 3> x, const element_sink& w, const element_sink& bias,
                             bool bias_zero, std::size_t threads) {
    const std::size_t rows = dy.rows, e = x.extents[2], f = dy.cols;
    std::vector<double> x1(rows * (e + 1));
    for (std::size_t r = 0; r < rows; ++r) {
        std::copy(x.data + r * e, x.data + (r + 1) * e, x1.begin() + static_cast<std::ptrdiff_t>(r * (e + 1)));
        x1[r * (e + 1) + e] = 1.0;
    }
    const dd_matrix dyt = transposed(dy);
    const dd_matrix y = project(dyt, x1.data(), e + 1, nullptr, threads);  // f × (e + 1)
    auto look = [&](const element_sink& s, std::size_t to, std::size_t c, std::size_t a) {
        if ((*s.undecided)[to])
            second_look(s, to, dyt.hi.data() + c * rows, dyt.lo.data() + c * rows, dyt.err.data() + c * rows, rows, x1.data() + a, e + 1);
    };
    for (std::size_t c = 0; c < f; ++c) {
        for (std::size_t a = 0; a < e; ++a) put_element(w, a * f + c, y, c * (e + 1) + a), look(w, a * f + c, c, a);
        if (bias_zero) bias.put_exact(c, 0.0);
        else put_element(bias, c, y, c * (e + 1) + e), look(bias, c, c, e);
    }
}

/// (14e) The column sums Σ_r x_rc of exact doubles (rows × cols, C order), exactly: each in MPFR
/// with `exact_sum_bits` bits (every addition checked exact), then put as hi = RN(S), lo = RN(S − hi)
/// with the bound |S − hi − lo| rounded up — 0 when S is a double-word, as every rounding midpoint of
/// a target format is, so a sum on a midpoint ties to even (9) instead of staying undecided. Nonzero
/// |x| lie in [2^-400, 2^40] ((1)), so with fewer than 2^40 rows the sum spans fewer than 540 bits.
inline constexpr mpfr_prec_t exact_sum_bits = 640;
inline void exact_column_sums(const double* x, std::size_t rows, std::size_t cols, const element_sink& sink) {
    mpfr_t s, t;
    mpfr_init2(s, exact_sum_bits);
    mpfr_init2(t, exact_sum_bits);
    for (std::size_t c = 0; c < cols; ++c) {
        mpfr_set_zero(s, 1);
        bool exact = rows < (std::size_t{1} << 40);
        for (std::size_t r = 0; r < rows && exact; ++r) exact = mpfr_add_d(s, s, x[r * cols + c], MPFR_RNDN) == 0;
        if (!exact) {
            sink.put(c, bounded{});  // infinite bound: undecided
            continue;
        }
        const double hi = mpfr_get_d(s, MPFR_RNDN);
        mpfr_sub_d(t, s, hi, MPFR_RNDN);  // exact: s and hi share the 640-bit window
        const double lo = mpfr_get_d(t, MPFR_RNDN);
        mpfr_sub_d(t, t, lo, MPFR_RNDN);
        mpfr_abs(t, t, MPFR_RNDN);
        sink.put(c, bounded{dw::two_sum(hi, lo), mpfr_get_d(t, MPFR_RNDU), 0});
    }
    mpfr_clear(s);
    mpfr_clear(t);
}

}  // namespace detail

/// The fast rung of the multi-head attention backward (docs/fast-certify.md (14)) at grad_output dO
/// (B, Sq, output features), for every target: the gradients of sum(dO ∘ output) at the exact
/// inputs and weights, in core/backward.hpp's mha_gradients order — grad_x_q, grad_x_k, grad_x_v,
/// grad_w_q, grad_w_k, grad_w_v, grad_w_o, grad_b_q, grad_b_k, grad_b_v, grad_b_o (the bias
/// gradients always; a caller without biases drops them). Q, K, V and d(heads) = dO·W_oᵀ by (14a)
/// (project_exact); every (batch, kv head) group's backward by group_backward with their bounds
/// propagated; then dX = dQ·Wᵀ and (dW, db) = ([x | 1]ᵀ·dQ) by (7), dW_o = headsᵀ·dO by (7) and
/// db_o = 1ᵀ·dO exactly (exact_column_sums); an element of the (7) products left undecided gets a
/// second look with term-by-term sums (second_look). grad_b_k is exactly 0 (core/backward.hpp; the
/// fast rung declines soft-capping and, under the nan policy, rows the mask leaves empty). A forward
/// row it cannot bound leaves every element undecided. Deterministic: each sum in a fixed order,
/// whatever the threads.
inline fast_gradients mha_gradients_fast(const fast_problem& p, tensor_view<const double, 3> dO, const std::vector<format_description>& targets,
                                         const fast_options& fo = {}) {
    using namespace detail;
    require_reference_fp_environment();
    (void)consts();
    if (!p.mha) throw std::invalid_argument("mha_gradients_fast: an SDPA problem (sdpa_gradients_fast)");
    const call_dims d = dims_of(p);
    const attention_options& o = p.options;
    ::attnref::validate_masks(o.mask, d.B, d.H, d.Sq, d.Sk);
    require_extent("grad_output axis 0 (batch)", dO.extents[0], d.B);
    require_extent("grad_output axis 1 (query length)", dO.extents[1], d.Sq);
    require_extent("grad_output axis 2 (output features)", dO.extents[2], d.dout);
    const std::size_t Eq = p.x_q.extents[2], Ek = p.x_k.extents[2], Ev = p.x_v.extents[2];
    const std::size_t HK = d.H * d.dk, HV = d.H * d.dv, KK = d.Hkv * d.dk, KV = d.Hkv * d.dv, Rq = d.B * d.Sq, Rk = d.B * d.Sk;
    fast_gradients g = sized_gradients({Rq * Eq, Rk * Ek, Rk * Ev, Eq * HK, Ek * KK, Ev * KV, HV * d.dout, HK, KK, KV, d.dout}, targets.size());
    std::string why = outside_ranges(p);
    if (why.empty() && !in_range(dO.data, dO.size())) why = "a nonzero |grad_output| outside [2^-400, 2^40]";
    if (why.empty() && o.softmax.empty_rows == empty_row_policy::nan)
        for (std::uint8_t r : nan_rows_of(o, d))
            if (r) {
                why = "a row every key of which is masked under the nan policy (multi-head gradients not derived there)";
                break;
            }
    projections pr;
    if (why.empty()) {
        auto bias = [](const tensor_view<const double, 1>& b) { return b.empty() ? nullptr : b.data; };
        pr.q = project_exact(p.x_q.data, Rq, Eq, p.params.w_q.data, HK, bias(p.params.b_q), fo.threads);
        pr.k = project_exact(p.x_k.data, Rk, Ek, p.params.w_k.data, KK, bias(p.params.b_k), fo.threads);
        pr.v = project_exact(p.x_v.data, Rk, Ev, p.params.w_v.data, KV, bias(p.params.b_v), fo.threads);
        if (!in_range(pr.q.hi.data(), pr.q.hi.size())) why = "a nonzero |projected query| outside [2^-400, 2^40]";
        else if (!in_range(pr.k.hi.data(), pr.k.hi.size())) why = "a nonzero |projected key| outside [2^-400, 2^40]";
        else if (!in_range(pr.v.hi.data(), pr.v.hi.size())) why = "a nonzero |projected value| outside [2^-400, 2^40]";
    }
    if (!why.empty()) {
        decline_whole_case(g, why);
        return g;
    }
    std::vector<element_sink> sinks;
    for (std::size_t t = 0; t < g.values.size(); ++t) sinks.push_back({&g.values[t], &g.undecided[t], &targets, fo.bound_scale, t, &fo.observe});
    head_context hc{&o, d.B, d.H, d.Sq, d.Sk, d.dk, d.dv, {}, 0, nullptr, nullptr, nullptr};
    logit_scale_dd(o, d.dk, hc.scale, hc.scale_err);
    // (14) d(heads) = dO·W_oᵀ, (B·Sq) × (H·dv).
    const dd_matrix dho = project_exact(dO.data, Rq, d.dout, transposed(p.params.w_o.data, HV, d.dout).data(), HV, nullptr, fo.threads);
    // The heads' backward into merged dQ (B·Sq) × (H·dk), dK (B·Sk) × (Hkv·dk), dV (B·Sk) × (Hkv·dv),
    // and the merged head outputs (B·Sq) × (H·dv).
    auto zeros = [](std::size_t r, std::size_t c) { return dd_matrix{r, c, std::vector<double>(r * c), std::vector<double>(r * c), std::vector<double>(r * c)}; };
    dd_matrix dq = zeros(Rq, HK), dk = zeros(Rk, KK), dv = zeros(Rk, KV), heads = zeros(Rq, HV);
    std::atomic<bool> failed{false};
    struct mha_emitter final : gradient_emitter {
        dd_matrix* m[3];
        dd_matrix* heads;
        const call_dims* d;
        std::atomic<bool>* failed;
        std::size_t index(std::size_t t, std::size_t b, std::size_t head, std::size_t row, std::size_t c) const {
            if (t == 0) return (b * d->Sq + row) * (d->H * d->dk) + head * d->dk + c;
            const std::size_t w = t == 1 ? d->dk : d->dv;
            return (b * d->Sk + row) * (d->Hkv * w) + head * w + c;
        }
        void put(std::size_t t, std::size_t b, std::size_t head, std::size_t row, std::size_t c, const bounded& x) override {
            const std::size_t n = index(t, b, head, row, c);
            m[t]->hi[n] = x.v.hi, m[t]->lo[n] = x.v.lo, m[t]->err[n] = x.bound;
            if (!(x.bound < std::numeric_limits<double>::infinity())) failed->store(true);
        }
        void put_exact(std::size_t t, std::size_t b, std::size_t head, std::size_t row, std::size_t c, double v) override {
            const std::size_t n = index(t, b, head, row, c);
            m[t]->hi[n] = v, m[t]->lo[n] = 0, m[t]->err[n] = 0;
            if (!std::isfinite(v)) failed->store(true);
        }
        void undecided(std::size_t, std::size_t, std::size_t, std::size_t, std::size_t) override { failed->store(true); }
        void head_output(std::size_t b, std::size_t h, std::size_t i, const row_outputs& ro) override {
            const std::size_t base = (b * d->Sq + i) * (d->H * d->dv) + h * d->dv;
            for (std::size_t c = 0; c < d->dv; ++c) {
                heads->hi[base + c] = ro.oh[c], heads->lo[base + c] = ro.ol[c], heads->err[base + c] = ro.oe[c];
                if (!std::isfinite(ro.oe[c])) failed->store(true);
            }
        }
    };
    ::attnref::parallel_for(d.B * d.Hkv, fo.threads, [&](std::size_t task) {
        mha_emitter e;
        e.m[0] = &dq, e.m[1] = &dk, e.m[2] = &dv, e.heads = &heads, e.d = &d, e.failed = &failed;
        group_backward(p, &pr, {}, &dho, d, hc, task / d.Hkv, task % d.Hkv, fo, e);
    });
    pr = {};
    if (failed.load()) {
        decline_whole_case(g, "a forward row or head gradient the fast rung cannot bound");
        return g;
    }
    // (14c) dX = dY·Wᵀ for each projection.
    auto input_gradient = [&](const dd_matrix& dy, const tensor_view<const double, 2>& w, std::size_t e, const element_sink& s) {
        const std::size_t f = dy.cols;
        const std::vector<double> wt = transposed(w.data, e, f);  // f × e
        const dd_matrix x = project(dy, wt.data(), e, nullptr, fo.threads);
        for (std::size_t n = 0; n < x.hi.size(); ++n) {
            put_element(s, n, x, n);
            if ((*s.undecided)[n]) {
                const std::size_t r = n / e;
                second_look(s, n, dy.hi.data() + r * f, dy.lo.data() + r * f, dy.err.data() + r * f, f, wt.data() + n % e, e);
            }
        }
    };
    input_gradient(dq, p.params.w_q, Eq, sinks[0]);
    input_gradient(dk, p.params.w_k, Ek, sinks[1]);
    input_gradient(dv, p.params.w_v, Ev, sinks[2]);
    // (14d) the weights' and biases' gradients.
    // grad_b_k = Σ_j dK_j = 0 exactly: Σ_j dS_ij = 0 in every row (core/backward.hpp), as the MPFI backward
    // sets it, under every empty-row policy (the nan policy's empty rows are declined above).
    const bool bk_zero = !o.softcap;
    weight_gradients(dq, p.x_q, sinks[3], sinks[7], false, fo.threads);
    weight_gradients(dk, p.x_k, sinks[4], sinks[8], bk_zero, fo.threads);
    weight_gradients(dv, p.x_v, sinks[5], sinks[9], false, fo.threads);
    {
        const dd_matrix ht = transposed(heads);
        const dd_matrix wo = project(ht, dO.data, d.dout, nullptr, fo.threads);  // (H·dv) × dout
        for (std::size_t n = 0; n < wo.hi.size(); ++n) {
            put_element(sinks[6], n, wo, n);
            if (g.undecided[6][n]) {
                const std::size_t m = n / d.dout;
                second_look(sinks[6], n, ht.hi.data() + m * Rq, ht.lo.data() + m * Rq, ht.err.data() + m * Rq, Rq, dO.data + n % d.dout, d.dout);
            }
        }
        exact_column_sums(dO.data, Rq, d.dout, sinks[10]);  // db_o = 1ᵀ·dO, of exact values: exactly
    }
    count_undecided(g);
    return g;
}

}  // namespace attnref::fast
