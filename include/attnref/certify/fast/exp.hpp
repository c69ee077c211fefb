#pragma once
/// \file certify/fast/exp.hpp
/// The bounded double-word exponential (docs/fast-certify.md (6)): range reduction, the polynomial
/// core (scalar, and four arguments at once with AVX2: the same operations lane by lane), and the
/// bound.

#include <cmath>
#include <cstddef>

#include "attnref/certify/fast/bounded.hpp"
#include "attnref/certify/fast/constants.hpp"
#include "attnref/certify/fast/cpu.hpp"
#include "attnref/core/double_double.hpp"

namespace attnref::fast::detail {

/// (6) e^d for a double-word d with |exact − d| ≤ ed: returns 2^K·E with its bound in scaled
/// units, or tiny = true when e^(exact) < 2^-1150.
struct exp_result {
    bounded x;
    bool tiny = false;
    bool ok = true;
};
/// (6) in three parts so that the polynomial core can run on four arguments at once:
/// exp_prepare (range reduction (6a), the cases decided without the core), exp_core (Horner and
/// the squarings, (6b)–(6c)), exp_finish (the bound). exp_dd = all three.
struct exp_prepared {
    dd rs;             ///< r̃/2⁸
    double er = 0;     ///< (6a)
    double kd = 0;     ///< K
    int status = 0;    ///< 0: run the core; 1: tiny; 2: not handled (the row is left to MPFI)
};
inline exp_prepared exp_prepare(dd d, double ed) {
    exp_prepared p;
    if (!(ed < 1)) {
        p.status = 2;
        return p;
    }
    if (d.hi + std::fabs(d.lo) + ed <= -800) {  // e^(−800) < 2^-1154
        p.status = 1;
        return p;
    }
    if (!(d.hi < 700)) {
        p.status = 2;
        return p;
    }
    const constants& c = consts();
    const double kd = std::nearbyint(d.hi * 1.4426950408889634);
    dd r = dw::sub(d, dw::mul(c.ln2, kd));
    // (6a) |r − r̃| ≤ ed + |K|·ln2·(2^-105 + η) + η|r̃|, all × 1.01.
    double er = dw::up(ed + (std::fabs(kd) * 0.7 * (0x1p-105 + dw::dd_eta) + dw::dd_eta * dw::mag(r)) * 1.01);
    if (!(std::fabs(r.hi) <= 0.36)) {
        p.status = 2;
        return p;
    }
    if (std::fabs(r.hi) < 0x1p-400) {  // keep the Horner products away from underflow
        er = dw::up(er + dw::mag(r));
        r = {0, 0};
    }
    p.rs = {dw::scale2(r.hi, -8), dw::scale2(r.lo, -8)};  // exact
    p.er = er;
    p.kd = kd;
    return p;
}

/// (6b)–(6c) T = Σ_{i≤9} rsⁱ/i! by Horner, then squared eight times.
inline dd exp_core(dd rs) {
    const constants& c = consts();
    dd t = c.inv_fact[9];
    for (int i = 8; i >= 0; --i) t = dw::add(dw::mul(t, rs), c.inv_fact[i]);
    for (int s = 0; s < 8; ++s) t = dw::mul(t, t);
    return t;
}

inline exp_result exp_finish(const exp_prepared& p, dd t) {
    exp_result res;
    if (p.status == 1) {
        res.tiny = true;
        return res;
    }
    if (p.status == 2) {
        res.ok = false;
        return res;
    }
    // (6b) Horner error ≤ 2η, remainder ≤ |r'|^10/10!·e^|r'|; relative to T ≥ e^-0.0015.
    const double ar = std::fabs(p.rs.hi) * (1 + 0x1p-50);
    double rem = ar * ar;
    rem = rem * rem * rem * rem * rem / 3628800.0 * 1.002;
    const double delta_t = dw::up((2 * dw::dd_eta + rem) * 1.002);
    // (6c) eight squarings: δ_E ≤ 1.001·(256·δ_T + 255·η); with er: δ ≤ δ_E + er(1 + er)(1 + δ_E).
    const double delta_e = dw::up(1.001 * (256 * delta_t + 255 * dw::dd_eta));
    const double er = p.er;
    const double delta = dw::up(delta_e + er * (1 + er) * (1 + delta_e));
    if (!(delta < 0.25)) {
        res.ok = false;
        return res;
    }
    res.x.v = t;
    res.x.scale = static_cast<int>(p.kd);
    res.x.bound = dw::up(delta * dw::mag(t) * 1.34);  // relative to the exact value ≤ |t|/(1 − δ)
    return res;
}

inline exp_result exp_dd(dd d, double ed) {
    const exp_prepared p = exp_prepare(d, ed);
    return exp_finish(p, p.status == 0 ? exp_core(p.rs) : dd{});
}

#ifdef ATTNREF_FAST_AVX2
typedef double v4d __attribute__((vector_size(32)));
/// dw::mul (JMP 2017 Algorithm 12) on four lanes: x ← x·y.
__attribute__((target("avx2,fma"), always_inline)) inline void mul_v4(v4d& xh, v4d& xl, const v4d& yh, const v4d& yl) {
    const v4d p = xh * yh;
    const v4d e = __builtin_ia32_vfmaddpd256(xh, yh, -p);
    const v4d tl0 = xl * yl;
    const v4d tl1 = __builtin_ia32_vfmaddpd256(xh, yl, tl0);
    const v4d cl2 = __builtin_ia32_vfmaddpd256(xl, yh, tl1);
    const v4d cl3 = e + cl2;
    const v4d s = p + cl3;
    xl = cl3 - (s - p);
    xh = s;
}

/// exp_core on four arguments: the same operations (dw::add, dw::mul as written in
/// double_double.hpp) lane by lane, so the same bits.
__attribute__((target("avx2,fma"))) inline void exp_core_avx2(const double* rh, const double* rl, double* th, double* tl) {
    typedef v4d v4;
    typedef double v4u __attribute__((vector_size(32), aligned(8), may_alias));
    const constants& c = consts();
    const v4 sh = *reinterpret_cast<const v4u*>(rh), sl = *reinterpret_cast<const v4u*>(rl);
    v4 h = {c.inv_fact[9].hi, c.inv_fact[9].hi, c.inv_fact[9].hi, c.inv_fact[9].hi};
    v4 l = {c.inv_fact[9].lo, c.inv_fact[9].lo, c.inv_fact[9].lo, c.inv_fact[9].lo};
    for (int i = 8; i >= 0; --i) {
        mul_v4(h, l, sh, sl);
        const v4 yh = {c.inv_fact[i].hi, c.inv_fact[i].hi, c.inv_fact[i].hi, c.inv_fact[i].hi};
        const v4 yl = {c.inv_fact[i].lo, c.inv_fact[i].lo, c.inv_fact[i].lo, c.inv_fact[i].lo};
        // dw::add: two_sum(hi), two_sum(lo), fast_two_sum, fast_two_sum
        const v4 s = h + yh;
        const v4 bb = s - h;
        const v4 se = (h - (s - bb)) + (yh - bb);
        const v4 t = l + yl;
        const v4 bt = t - l;
        const v4 te = (l - (t - bt)) + (yl - bt);
        const v4 cc = se + t;
        const v4 v = s + cc;
        const v4 ve = cc - (v - s);
        const v4 w = te + ve;
        h = v + w;
        l = w - (h - v);
    }
    for (int s = 0; s < 8; ++s) {
        const v4 hh = h, ll = l;
        mul_v4(h, l, hh, ll);
    }
    *reinterpret_cast<v4u*>(th) = h;
    *reinterpret_cast<v4u*>(tl) = l;
}
#endif

/// exp_core for n arguments (hi and lo arrays), four at a time where AVX2 and FMA are available.
inline void exp_core_many(std::size_t n, const double* rh, const double* rl, double* th, double* tl) {
    std::size_t i = 0;
#ifdef ATTNREF_FAST_AVX2
    if (has_avx2_fma())
        for (; i + 4 <= n; i += 4) exp_core_avx2(rh + i, rl + i, th + i, tl + i);
#endif
    for (; i < n; ++i) {
        const dd t = exp_core({rh[i], rl[i]});
        th[i] = t.hi;
        tl[i] = t.lo;
    }
}

}  // namespace attnref::fast::detail
