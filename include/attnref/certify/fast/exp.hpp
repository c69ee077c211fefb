#pragma once
/// \file certify/fast/exp.hpp
/// The bounded double-word exponential (docs/fast-certify.md (6)): range reduction to |r| ≤ ln 2/128
/// with a table of 2^(j/64), the polynomial core, and the bound.

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
/// (6) in three parts: exp_prepare (range reduction (6a), the cases decided without the core),
/// exp_core (Horner (6b) and the table factor), exp_finish (the bound (6c)). exp_dd = all three. The
/// row kernels (attention_row.hpp key_exp_groups) perform the same operations on lanes.
struct exp_prepared {
    dd rs;             ///< r̃ = d̃ − K·(ln 2/64), |r̃| ≤ 0.0055
    double er = 0;     ///< (6a)
    double kd = 0;     ///< the binary exponent ⌊K/64⌋ of the result
    double j = 0;      ///< K − 64⌊K/64⌋: the table entry 2^(j/64)
    int status = 0;    ///< 0: run the core; 1: tiny; 2: not handled (the row is left to MPFI)
};

/// 64/ln 2 rounded to a double (only K's choice depends on it, not the bound).
inline constexpr double inv_ln2_64 = 92.33248261689366;

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
    const double k = std::nearbyint(d.hi * inv_ln2_64);
    // (6a) Cody–Waite: r̃ = ((d̃ − K·c1) − K·c2) − K·c3, K·c1 and K·c2 exact (|K| < 2^17), three
    // double-word subtractions (η each on results ≤ |r̃| + |K|·2^-40) and K·c3 (|c3| < 2^-70, its own
    // 2^-105 and η): |r − r̃| ≤ ed + (3η·(|r̃| + |K|·2^-40) + |K|·2^-70·(2^-105 + η))·1.01.
    dd r = dw::sub(d, {c.ln2_64_c1 * k, 0});
    r = dw::sub(r, {c.ln2_64_c2 * k, 0});
    r = dw::sub(r, dw::mul(c.ln2_64_c3, k));
    double er = dw::up(ed + (3 * dw::dd_eta * (dw::mag(r) + std::fabs(k) * 0x1p-40) + std::fabs(k) * 0x1p-70 * (0x1p-105 + dw::dd_eta)) * 1.01);
    if (!(std::fabs(r.hi) <= 0.0055)) {
        p.status = 2;
        return p;
    }
    if (std::fabs(r.hi) < 0x1p-400) {  // keep the Horner products away from underflow
        er = dw::up(er + dw::mag(r));
        r = {0, 0};
    }
    p.rs = r;
    p.er = er;
    p.kd = std::floor(k * 0.015625);  // exact
    p.j = k - 64 * p.kd;              // exact, 0 … 63
    return p;
}

/// (6b) T = Σ_{i≤10} r̃ⁱ/i! by Horner, then E = T·2^(j/64).
inline dd exp_core(dd rs, double j) {
    const constants& c = consts();
    dd t = c.inv_fact[10];
    for (int i = 9; i >= 0; --i) t = dw::add(dw::mul(t, rs), c.inv_fact[i]);
    return dw::mul(t, c.exp2_table[static_cast<int>(j)]);
}

/// (6b)–(6c): the relative bound δ of E from |r̃| and (6a)'s bound er (the lanes' key_exp_groups
/// evaluates the same expression).
inline double exp_delta(double ars, double er) {
    // (6b) Horner error ≤ 2η, remainder ≤ |r̃|^11/11!·e^|r̃|; relative to T ≥ e^-0.0055.
    const double ar = ars * (1 + 0x1p-50);
    const double a2 = ar * ar, a4 = a2 * a2;
    const double rem = a4 * a4 * a2 * ar / 39916800.0 * 1.006;
    const double delta_t = dw::up(1.006 * (2 * dw::dd_eta + rem));
    // (6c) the table entry (2^-105) and the product (η): δ_E ≤ 1.001·(δ_T + 2^-105 + η);
    // with er: δ ≤ δ_E + er(1 + er)(1 + δ_E).
    const double delta_e = dw::up(1.001 * (delta_t + 0x1p-105 + dw::dd_eta));
    return dw::up(delta_e + er * (1 + er) * (1 + delta_e));
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
    const double delta = exp_delta(std::fabs(p.rs.hi), p.er);
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
    return exp_finish(p, p.status == 0 ? exp_core(p.rs, p.j) : dd{});
}

}  // namespace attnref::fast::detail
