#pragma once
/// \file certify/fast/attention_row.hpp
/// One query row of one (b, h) head in double-word with bounds (docs/fast-certify.md (8)–(8f)):
/// the logits of the forward pass (attention.hpp's logits_row: scale, ALiBi, additive mask, seed
/// mask · seed_mask_value), each term with its bound; the shifted exponentials and their sum; the
/// reciprocal; the weights; lse; P·V. Each step is a function of the row's workspace; the weights,
/// lse and (SDPA) outputs go to their sinks (the rounding check), the head outputs of multi-head
/// attention back to the caller.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "attnref/attention.hpp"
#include "attnref/certify/fast/bounded.hpp"
#include "attnref/certify/fast/cpu.hpp"
#include "attnref/certify/fast/dot.hpp"
#include "attnref/certify/fast/exp.hpp"
#include "attnref/certify/fast/problem.hpp"
#include "attnref/double_double.hpp"
#include "attnref/mask.hpp"

namespace attnref::fast::detail {

/// Call-wide: options, sizes, the scale and the sinks.
struct head_context {
    const attention_options* o;
    std::size_t B, H, Sq, Sk, dk, dv;
    dd scale;
    double scale_err;              ///< |s − s̃|
    const element_sink* out_sink;  ///< sdpa output (null for mha)
    const element_sink* w_sink;    ///< weights (null when not asked)
    const element_sink* l_sink;    ///< lse (null when not asked)
};

/// One (b, h) head's inputs as double-words with per-element bounds. q: Sq × dk, kt: dk × Sk
/// (transposed), v: Sk × dv; the lo and err arrays may be null (exact inputs, SDPA).
struct head_inputs {
    std::size_t sq, sk, dk, dv;
    const double *qh, *ql, *qe;     // Sq × dk
    const double *kth, *ktl, *kte;  // dk × Sk
    const double *vh, *vl, *ve;     // Sk × dv
};

/// Per-head norms the row bounds use: ‖k_j‖, ‖e_kj‖ (Sk), ‖v_c‖, ‖e_vc‖, max_j|v_jc|, max_j e_vjc (dv).
struct head_norms {
    std::vector<double> kn, ken, vn, ven, vmax, evmax;
};

/// Everything a row of head (b, h) reads.
struct head_task {
    const head_context* hc;
    const head_inputs* in;
    const head_norms* norms;
    std::size_t b, h;
    fast_observer* observer;
};

/// Per-thread buffers and the state of the row in progress (reused across rows; every element used
/// is rewritten).
struct row_workspace {
    std::vector<double> sh, sl, se, ex, ph, pl, pe;
    std::vector<std::uint8_t> allowed;
    std::vector<dd> x;
    std::vector<exp_result> ej;
    std::vector<exp_prepared> ep;
    std::vector<std::size_t> core_j;
    std::vector<double> core_h, core_l, core_th, core_tl;
    // The row in progress.
    std::size_t row = 0;  ///< (b·H + h)·Sq + i
    bool empty = false;   ///< no attendable key
    dd m;                 ///< (8a) the shift
    dd y;                 ///< (8b) Σ e^(x_j − m)
    double ey = 0, lowy = 0;
    dd z;                 ///< (8c) ≈ 1/y
    double ez = 0, inv_low = 0;
};

/// The head outputs of one row (multi-head: the caller merges them) with bounds.
struct row_outputs {
    std::vector<double> oh, ol, oe, orun;  // dv
    bool nan = false;                      ///< the row is NaN by construction (empty, nan policy)
};

inline constexpr double eta_up = dw::dd_eta * 1.01;  ///< η|r| ≤ eta_up·|r̃| (docs/fast-certify.md (2))

/// Every element of the row undecided (left to MPFI); the head outputs unbounded.
inline void fail_row(const head_task& t, row_workspace& ws, row_outputs& ro) {
    const head_context& hc = *t.hc;
    const double inf = std::numeric_limits<double>::infinity();
    for (std::size_t c = 0; c < hc.dv; ++c) ro.oe[c] = inf;
    if (hc.out_sink)
        for (std::size_t c = 0; c < hc.dv; ++c) hc.out_sink->put(ws.row * hc.dv + c, bounded{});
    if (hc.w_sink)
        for (std::size_t j = 0; j < hc.Sk; ++j) hc.w_sink->put(ws.row * hc.Sk + j, bounded{});
    if (hc.l_sink) hc.l_sink->put(ws.row, bounded{});
}

/// The structural masks of row i (exact). Returns false when the row is finished here (empty under
/// the zero or NaN policy: exact values); an empty row under the uniform policy continues as the
/// softmax of Sk zero logits.
inline bool row_mask(const head_task& t, std::size_t i, row_workspace& ws, row_outputs& ro) {
    const head_context& hc = *t.hc;
    const attention_options& o = *hc.o;
    ws.allowed.resize(hc.Sk);
    std::size_t count = 0;
    for (std::size_t j = 0; j < hc.Sk; ++j) count += ws.allowed[j] = !structurally_masked(o.mask, t.b, t.h, i, j, hc.Sq, hc.Sk);
    ws.empty = count == 0;
    if (!ws.empty) return true;
    if (hc.l_sink) hc.l_sink->put_exact(ws.row, -std::numeric_limits<double>::infinity());
    if (o.softmax.empty_rows != empty_row_policy::uniform) {
        const double fill = o.softmax.empty_rows == empty_row_policy::nan ? std::numeric_limits<double>::quiet_NaN() : 0.0;
        ro.nan = o.softmax.empty_rows == empty_row_policy::nan;
        if (hc.out_sink)
            for (std::size_t c = 0; c < hc.dv; ++c) hc.out_sink->put_exact(ws.row * hc.dv + c, fill);
        if (hc.w_sink)
            for (std::size_t j = 0; j < hc.Sk; ++j) hc.w_sink->put_exact(ws.row * hc.Sk + j, fill);
        return false;
    }
    std::fill(ws.allowed.begin(), ws.allowed.end(), std::uint8_t{1});  // uniform: softmax of Sk zero logits
    return true;
}

/// (8) The logits of attention.hpp's logits_row, x_j = s·(q_i·k_j) − slope·alibi_distance +
/// additive + seed·seed_mask_value, each with a bound (into ws.x, ws.ex). Zero logits for an
/// empty (uniform) row.
inline void row_logits(const head_task& t, std::size_t i, row_workspace& ws) {
    const head_context& hc = *t.hc;
    const head_inputs& in = *t.in;
    const head_norms& nr = *t.norms;
    const attention_options& o = *hc.o;
    const std::size_t Sk = hc.Sk, dk = hc.dk;
    ws.x.assign(Sk, dd{});
    ws.ex.assign(Sk, 0.0);
    if (ws.empty) return;
    ws.sh.resize(Sk), ws.sl.resize(Sk), ws.se.resize(Sk);
    dot_rows(in.qh + i * dk, in.ql ? in.ql + i * dk : nullptr, dk, in.kth, in.ktl, Sk, Sk, ws.sh.data(), ws.sl.data(), ws.se.data());
    const double qn = norm_up(in.qh + i * dk, dk);
    const double qen = in.qe ? norm_up(in.qe + i * dk, dk) : 0.0;
    const double cdot = dot_constant(dk);
    const double as = dw::mag(hc.scale);
    const double alibi = o.alibi_slopes.empty() ? 0.0 : o.alibi_slopes[t.h];
    for (std::size_t j = 0; j < Sk; ++j) {
        if (!ws.allowed[j]) continue;
        const dd sdot{ws.sh[j], ws.sl[j]};
        const double cs = qn * nr.kn[j];  // ≥ Σ|q||k| (Cauchy–Schwarz); (5a) or (5b), the smaller
        const double edot =
            dw::up(std::min(cdot * cs, ws.se[j] + dot_remainder_constant * cs) + qen * nr.kn[j] + qn * nr.ken[j] + qen * nr.ken[j]);
        dd xj = dw::mul(sdot, hc.scale);
        double e = dw::up(as * edot + dw::mag(sdot) * hc.scale_err + edot * hc.scale_err + eta_up * dw::mag(xj));
        if (alibi != 0) {
            xj = dw::sub(xj, dw::two_prod(alibi, alibi_distance(o.mask, i, j, hc.Sq, Sk)));
            e = dw::up(e + eta_up * dw::mag(xj));
        }
        if (o.mask.additive.present()) {
            xj = dw::add(xj, {o.mask.additive.at(t.b, t.h, i, j), 0.0});
            e = dw::up(e + eta_up * dw::mag(xj));
        }
        if (o.mask.seed.present()) {
            xj = dw::add(xj, dw::two_prod(o.mask.seed.at(t.b, t.h, i, j), seed_mask_value));
            e = dw::up(e + eta_up * dw::mag(xj));
        }
        ws.x[j] = xj;
        ws.ex[j] = e;
    }
}

/// (8a)–(8b) The shift m = x̃_{j*}, e^(x_j − m) for every attendable key by (6) (the polynomial
/// cores four at a time), and their sum y with its bound and lower bound. False: left to MPFI.
inline bool row_exponentials(const head_context& hc, row_workspace& ws) {
    const std::size_t Sk = hc.Sk;
    std::size_t js = Sk;
    for (std::size_t j = 0; j < Sk; ++j)
        if (ws.allowed[j] && (js == Sk || ws.x[j].hi > ws.x[js].hi)) js = j;
    ws.m = ws.x[js];
    ws.ej.resize(Sk);
    ws.ep.resize(Sk);
    ws.core_j.clear(), ws.core_h.clear(), ws.core_l.clear();
    for (std::size_t j = 0; j < Sk; ++j) {
        if (!ws.allowed[j]) continue;
        const dd d = dw::sub(ws.x[j], ws.m);
        const double ed = dw::up(ws.ex[j] + eta_up * dw::mag(d));
        ws.ep[j] = exp_prepare(d, ed);
        if (ws.ep[j].status == 2) return false;
        if (ws.ep[j].status == 0) ws.core_j.push_back(j), ws.core_h.push_back(ws.ep[j].rs.hi), ws.core_l.push_back(ws.ep[j].rs.lo);
    }
    const std::size_t ncore = ws.core_j.size();
    ws.core_th.resize(ncore), ws.core_tl.resize(ncore);
    exp_core_many(ncore, ws.core_h.data(), ws.core_l.data(), ws.core_th.data(), ws.core_tl.data());
    for (std::size_t n = 0; n < ncore; ++n) {
        const std::size_t j = ws.core_j[n];
        ws.ej[j] = exp_finish(ws.ep[j], {ws.core_th[n], ws.core_tl[n]});
        if (!ws.ej[j].ok) return false;
    }
    dd y{0, 0};
    double ey = 0;
    std::size_t terms = 0;
    for (std::size_t j = 0; j < Sk; ++j) {
        if (!ws.allowed[j]) continue;
        if (ws.ep[j].status == 1) ws.ej[j] = exp_finish(ws.ep[j], dd{});
        if (ws.ej[j].tiny) {
            ey += 0x1p-1000;
            continue;
        }
        const int K = ws.ej[j].x.scale;
        if (K < -700) {
            ey += dw::scale2(1.0, std::max(K + 1, -1000));
            continue;
        }
        y = dw::add(y, {dw::scale2(ws.ej[j].x.v.hi, K), dw::scale2(ws.ej[j].x.v.lo, K)});
        ey += dw::scale2(ws.ej[j].x.bound, K);
        ++terms;
    }
    // (8b) the sum: n additions of positive terms, each relative η.
    ws.y = y;
    ws.ey = dw::up(dw::sum_up(ey, Sk) + 1.01 * static_cast<double>(terms) * dw::dd_eta * dw::mag(y));
    ws.lowy = (y.hi - std::fabs(y.lo) - ws.ey) * (1 - 0x1p-49);
    return ws.lowy >= 0.5;
}

/// (8c) The reciprocal z ≈ 1/ŷ, bounded a posteriori from ρ = 1 − ŷ·z0. False: left to MPFI.
inline bool row_reciprocal(row_workspace& ws) {
    const dd y = ws.y;
    const double z0 = 1 / y.hi;
    const dd t = dw::mul(y, z0);
    const dd rho = dw::sub({1, 0}, t);
    const double erho = dw::up(eta_up * dw::mag(t) + eta_up * dw::mag(rho));
    const double rmax = dw::up(dw::mag(rho) + erho);
    if (!(rmax < 0x1p-40)) return false;
    ws.z = dw::add({z0, 0}, dw::mul(rho, z0));
    const double az0 = std::fabs(z0);
    ws.ez = dw::up(az0 * erho + az0 * rmax * rmax * 1.01 + eta_up * (az0 * dw::mag(rho) * 1.01 + dw::mag(ws.z)));
    ws.inv_low = dw::up(1 / ws.lowy);
    return true;
}

/// (8d) The weights p_j = e_j/y in scaled form 2^K·P̃ to the weights sink, and as plain
/// double-words with bounds (ws.ph, pl, pe) for P·V.
inline void row_weights(const head_context& hc, row_workspace& ws) {
    const std::size_t Sk = hc.Sk, row = ws.row;
    ws.ph.assign(Sk, 0.0), ws.pl.assign(Sk, 0.0), ws.pe.assign(Sk, 0.0);
    for (std::size_t j = 0; j < Sk; ++j) {
        if (!ws.allowed[j]) {
            if (hc.w_sink) hc.w_sink->put_exact(row * Sk + j, 0.0);
            continue;
        }
        if (ws.ej[j].tiny) {
            ws.pe[j] = 0x1p-1000;
            if (hc.w_sink) hc.w_sink->put_exact(row * Sk + j, 0.0);  // < 2^-1148: +0 in every format
            continue;
        }
        const bounded& E = ws.ej[j].x;
        const dd P = dw::mul(E.v, ws.z);
        const double aE = dw::mag(E.v);
        const double ep = dw::up(E.bound * ws.inv_low + aE * ws.ey * ws.inv_low * ws.inv_low + aE * ws.ez + eta_up * dw::mag(P));
        if (hc.w_sink) hc.w_sink->put(row * Sk + j, bounded{P, ep, E.scale});
        if (E.scale < -480) {
            ws.pe[j] = dw::scale2(1.0, std::max(E.scale + 2, -1000));
        } else {
            ws.ph[j] = dw::scale2(P.hi, E.scale);
            ws.pl[j] = dw::scale2(P.lo, E.scale);
            ws.pe[j] = dw::up(dw::scale2(ep, E.scale));
        }
    }
}

/// (8e) lse = m + log ŷ: λ0 = log(ŷ.hi) (any double), τ = ŷ·e^-λ0 − 1, log ŷ = λ0 + log1p(τ).
inline void row_lse(const head_context& hc, const row_workspace& ws) {
    if (!hc.l_sink || ws.empty) return;
    const dd y = ws.y;
    const double lambda0 = std::log(y.hi);
    const exp_result w = exp_dd({-lambda0, 0}, 0);
    if (!w.ok || w.tiny) return hc.l_sink->put(ws.row, bounded{});
    const dd wv{dw::scale2(w.x.v.hi, w.x.scale), dw::scale2(w.x.v.lo, w.x.scale)};
    const double we = dw::up(dw::scale2(w.x.bound, w.x.scale));
    const dd yw = dw::mul(y, wv);
    const dd tau = dw::sub(yw, {1, 0});
    const double etau = dw::up(dw::mag(y) * we + eta_up * dw::mag(yw) + eta_up * dw::mag(tau));
    const double tmax = dw::up(dw::mag(tau) + etau);
    if (!(tmax < 0x1p-30)) return hc.l_sink->put(ws.row, bounded{});
    const dd L = dw::add({lambda0, 0}, tau);
    const double eL = dw::up(etau + 0.51 * tmax * tmax + eta_up * dw::mag(L));
    const dd lse = dw::add(ws.m, L);
    const double el = dw::up(eL + ws.ey * ws.inv_low + eta_up * dw::mag(lse));
    hc.l_sink->put(ws.row, bounded{lse, el, 0});
}

/// (8f) o_c = Σ_j p_j v_jc: (5) and the propagated errors, each bounded both by Cauchy–Schwarz
/// (‖p‖₂‖v_c‖₂) and by Hölder (‖p‖₁·max_j|v_jc|; Σ p_j ≈ 1), whichever is smaller.
inline void row_values(const head_task& t, row_workspace& ws, row_outputs& ro) {
    const head_context& hc = *t.hc;
    const head_inputs& in = *t.in;
    const head_norms& nr = *t.norms;
    const std::size_t Sk = hc.Sk, dv = hc.dv;
    dot_rows(ws.ph.data(), ws.pl.data(), Sk, in.vh, in.vl, dv, dv, ro.oh.data(), ro.ol.data(), ro.orun.data());
    const double pn = norm_up(ws.ph.data(), Sk), pen = norm_up(ws.pe.data(), Sk);
    double p1 = 0, ep1 = 0;
    for (std::size_t j = 0; j < Sk; ++j) p1 += std::fabs(ws.ph[j]), ep1 += ws.pe[j];
    p1 = dw::sum_up(p1 * (1 + 0x1p-52), Sk + 1);
    ep1 = dw::sum_up(ep1, Sk);
    const double cdot = dot_constant(Sk);
    for (std::size_t c = 0; c < dv; ++c) {
        const double pv = std::min(pn * nr.vn[c], p1 * nr.vmax[c]);                       // ≥ Σ_j|p_j||v_jc|
        const double dot = std::min(cdot * pv, ro.orun[c] + dot_remainder_constant * pv);  // (5a) or (5b)
        const double cs = pen * nr.vn[c] + pn * nr.ven[c] + pen * nr.ven[c];
        const double ho = ep1 * nr.vmax[c] + p1 * nr.evmax[c] + ep1 * nr.evmax[c];
        ro.oe[c] = dw::up(dot + std::min(cs, ho));
        if (hc.out_sink) hc.out_sink->put(ws.row * dv + c, bounded{{ro.oh[c], ro.ol[c]}, ro.oe[c], 0});
    }
}

/// Row i of head (t.b, t.h): the steps above in order. Head outputs (dd + bound) in ro.
inline void attention_row(const head_task& t, std::size_t i, row_workspace& ws, row_outputs& ro) {
    const head_context& hc = *t.hc;
    ws.row = (t.b * hc.H + t.h) * hc.Sq + i;
    ro.nan = false;
    ro.oh.assign(hc.dv, 0);
    ro.ol.assign(hc.dv, 0);
    ro.oe.assign(hc.dv, 0);
    ro.orun.assign(hc.dv, 0);
    if (!row_mask(t, i, ws, ro)) return;
    {
        const stage_scope s(t.observer, fast_stage::logits);
        row_logits(t, i, ws);
    }
    {
        const stage_scope s(t.observer, fast_stage::softmax);
        if (!row_exponentials(hc, ws) || !row_reciprocal(ws)) return fail_row(t, ws, ro);
        row_weights(hc, ws);
        row_lse(hc, ws);
    }
    const stage_scope s(t.observer, fast_stage::values);
    row_values(t, ws, ro);
}

#ifdef ATTNREF_FAST_AVX2
/// attention_row compiled with FMA available, everything inlined (flatten): std::fma becomes one
/// instruction instead of a library call. Same operations in the same order, each correctly
/// rounded as before (FMA is exact-then-rounded either way; contraction stays off), so the same
/// bits; chosen at run time as dot_rows chooses its AVX2 kernel.
__attribute__((target("avx2,fma"), flatten)) inline void attention_row_fma(const head_task& t, std::size_t i, row_workspace& ws,
                                                                           row_outputs& ro) {
    attention_row(t, i, ws, ro);
}
#endif

/// attention_row, through attention_row_fma where the processor has AVX2 and FMA.
inline void attention_row_dispatch(const head_task& t, std::size_t i, row_workspace& ws, row_outputs& ro) {
#ifdef ATTNREF_FAST_AVX2
    if (has_avx2_fma()) return attention_row_fma(t, i, ws, ro);
#endif
    attention_row(t, i, ws, ro);
}

}  // namespace attnref::fast::detail
