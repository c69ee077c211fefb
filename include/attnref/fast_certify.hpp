#pragma once
/// \file fast_certify.hpp
/// Fast certified reference values (issue 13): owns the double-word forward pass with rigorous
/// error bounds (SDPA and multi-head attention), the fast rounding check, and the hand-off of the
/// undecided rows to the MPFI ladder of certify.hpp.
///
/// Ziv's strategy with a cheap first rung. Every element v (output, weight, lse) is computed as a
/// double-word ṽ with a bound b ≥ |v − ṽ| on the distance to the exact value of the exact inputs
/// (docs/fast-certify.md, whose numbered equations the comments below cite). If every real number
/// in [ṽ − b, ṽ + b] rounds to the same value of a target format (checked by `round_check`, (9)),
/// that value is the correctly rounded exact result — the same unique value the MPFI path certifies,
/// so the bytes are the same. Elements that do not pass for some target are "escalated": their
/// query rows are recomputed through certify::certify (the MPFI ladder) exactly as generation does
/// today, and their MPFI values are stored. The result has certify::certify's shape, with
/// tensor_report::escalated counting the elements the fast rung left to MPFI.
///
/// Conventions: every scale placement (equal in exact arithmetic: s·(q·k)), causal/window/padding,
/// boolean, additive and seed masks, empty rows (zero, NaN, uniform), ALiBi, GQA/MQA, projection
/// biases. Sent whole to the MPFI path (`fast_stats::whole_case_reason` says why): soft-capping
/// (no double-word tanh bound yet), and inputs outside the ranges the error analysis assumes (a
/// nonzero |input| outside [2^-400, 2^40], a non-finite additive mask entry other than −inf,
/// projected values outside that range; docs/fast-certify.md (1)).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <mpfr.h>

#include "attnref/attention.hpp"
#include "attnref/certify.hpp"
#include "attnref/double_double.hpp"
#include "attnref/multi_head_attention.hpp"
#include "attnref/multiprecision.hpp"
#include "attnref/parallel.hpp"
#include "attnref/precision.hpp"
#include "attnref/tensor.hpp"

namespace attnref::fast {

using dw::dd;

/// One element before rounding: value 2^scale·(v.hi + v.lo) with |exact − value| ≤ 2^scale·bound.
struct bounded {
    dd v;
    double bound = std::numeric_limits<double>::infinity();
    int scale = 0;
};

/// Knobs for tests and benchmarks.
struct fast_options {
    std::size_t threads = 0;  ///< 0 = all hardware threads; results do not depend on it
    /// Multiplies every final bound before the rounding check. 1 in production. Tests set it below
    /// 1 to show that a weakened bound is caught by the comparison with MPFR.
    double bound_scale = 1.0;
    bool fallback = true;  ///< false: leave undecided elements undecided (tests of the fast rung)
    /// Tests: called with (tensor, element, value and bound after bound_scale) for every element the
    /// fast rung bounds (not for exact-by-construction ones). Called from worker threads.
    std::function<void(std::size_t, std::size_t, const bounded&)> observe;
};

struct fast_stats {
    std::string whole_case_reason;  ///< non-empty: the case went to MPFI as a whole, and why
    std::size_t escalated_rows = 0; ///< (b, h, i) rows recomputed through the MPFI ladder
    // Where the time went (benchmarks): wall seconds of each phase, and thread-seconds (summed over
    // the worker threads) of the three stages of the per-row attention core.
    double projection_seconds = 0;         ///< Q, K, V projections (multi-head)
    double attention_seconds = 0;          ///< the per-(b, h) attention core, wall
    double logits_thread_seconds = 0;      ///< q·kᵀ, scale, biases, masks (8)
    double softmax_thread_seconds = 0;     ///< exp, sum, reciprocal, weights and lse with their checks (8a)–(8e)
    double pv_thread_seconds = 0;          ///< P·V and its bounds (8f)
    double output_projection_seconds = 0;  ///< merged heads · W_o and the output checks (multi-head)
    double escalation_seconds = 0;         ///< the MPFI ladder for the undecided rows
};


/// (9) Rounding check: writes the target value (an exact double) when every real number within
/// the bound rounds (nearest, ties to even) to it; false when undecided (or beyond the format's
/// largest finite value, or an exact zero of unknown sign: left to MPFI).
inline bool round_check(const bounded& x, const certify::binary_format& f, double& out) {
    const double b = x.bound;
    if (!(b >= 0) || std::isinf(b)) return false;
    if (x.v.hi == 0) {
        if (x.v.lo == 0 && b == 0) {  // exact 0 is +0 (certify.hpp)
            out = 0.0;
            return true;
        }
        return false;
    }
    const dd n = dw::two_sum(x.v.hi, x.v.lo);
    const double h = n.hi, l = n.lo;
    const long e = static_cast<long>(dw::exponent_of(h)) + x.scale;  // floor(log2|h|) in real terms
    const long q = std::max<long>(e, f.min_exponent) - (f.precision - 1);  // quantum exponent
    const long g = q - x.scale;                                            // in scaled units
    if (e - q < -60) {
        // |h| far below the quantum: rounds to ±0 when |v| < 2^q/4 and its sign is known.
        const double spread = std::fabs(l) + b;
        if (!(spread <= 0.5 * std::fabs(h)) || !(dw::scale2(std::fabs(h) + spread, static_cast<int>(-g)) < 0.25)) return false;
        out = h > 0 ? 0.0 : -0.0;
        return true;
    }
    const double m = dw::scale2(h, static_cast<int>(-g));  // exact: |m| < 2^53, no underflow (e − q ≥ −60)
    const double y0 = std::nearbyint(m);                    // ties to even (reference environment)
    const double rr = m - y0;                               // exact (|rr| ≤ 1/2, same binade)
    const double ts = rr + dw::scale2(l, static_cast<int>(-g));
    const double bs = dw::scale2(b, static_cast<int>(-g));
    // (9) y = y0·2^q is a value of the format; every v with |v − y| < half the smaller gap to its
    // neighbours rounds to y. Gaps in units of 2^q: 1, except ½ below y = 2^(p−1)·2^q when q is
    // above the subnormal quantum. |v − y| ≤ |ts| + bs, each computed with ≤ 2^-53 absolute error.
    const long qmin = static_cast<long>(f.min_exponent) - (f.precision - 1);
    const double half_gap = (std::fabs(y0) == dw::scale2(1.0, f.precision - 1) && q > qmin) ? 0.25 : 0.5;
    if (!(std::fabs(ts) + bs <= half_gap - 0x1p-50)) return false;
    if (y0 == 0) {
        if (!(std::fabs(l) + b <= 0.5 * std::fabs(h))) return false;
        out = h > 0 ? 0.0 : -0.0;
        return true;
    }
    const double y = dw::scale2(y0, static_cast<int>(q));  // exact: y0 has ≤ p bits, q ≥ min − p + 1
    if (std::fabs(y) > f.max_finite) return false;
    out = y;
    return true;
}

namespace detail {

/// A double-word from a 256-bit MPFR value: hi = RN(x), lo = RN(x − hi); |x − (hi + lo)| ≤
/// 2^-105·|x| (4).
inline dd dd_of(mpfr_srcptr x) {
    mpfr_t r;
    mpfr_init2(r, 256);
    const double hi = mpfr_get_d(x, MPFR_RNDN);
    mpfr_sub_d(r, x, hi, MPFR_RNDN);
    const double lo = mpfr_get_d(r, MPFR_RNDN);
    mpfr_clear(r);
    return dw::fast_two_sum(hi, lo);
}

struct constants {
    dd ln2;
    dd inv_fact[10];  ///< 1/i!, i = 0 … 9
};

inline const constants& consts() {
    static const constants c = [] {
        constants k{};
        mpfr_t x;
        mpfr_init2(x, 256);
        mpfr_const_log2(x, MPFR_RNDN);
        k.ln2 = dd_of(x);
        mpfr_set_ui(x, 1, MPFR_RNDN);
        for (int i = 0; i < 10; ++i) {
            if (i > 0) mpfr_div_ui(x, x, static_cast<unsigned long>(i), MPFR_RNDN);
            k.inv_fact[i] = dd_of(x);
        }
        mpfr_clear(x);
        mpfr_free_cache2(MPFR_FREE_LOCAL_CACHE);  // ln 2's cache, in whichever thread got here first
        return k;
    }();
    return c;
}

/// 1/√n as a double-word, relative error ≤ 2^-105 (4).
inline dd inv_sqrt(std::size_t n) {
    mpfr_t x;
    mpfr_init2(x, 256);
    mpfr_set_ui(x, static_cast<unsigned long>(n), MPFR_RNDN);
    mpfr_rec_sqrt(x, x, MPFR_RNDN);
    const dd r = dd_of(x);
    mpfr_clear(x);
    return r;
}

/// One column j of (5), the reference order of operations (the AVX2 kernel below performs the
/// same operations on four columns at once, so both give identical bits). `run` accumulates
/// Σ(|c_i| + |S_i|) for the a-posteriori bound (5b): c_i the compensation term added in step i,
/// S_i the low-order sum after it.
inline void dot_step(double x, double xl, double b, double bl, double& hi, double& lo, double& run) {
    const double p = x * b;
    const double r = std::fma(x, b, -p);
    const double s = hi + p;
    const double bb = s - hi;
    const double e = (hi - (s - bb)) + (p - bb);
    hi = s;
    const double cross = x * bl + xl * b;
    const double c = (e + r) + cross;
    lo = lo + c;
    run = run + (std::fabs(c) + std::fabs(lo));
}

/// One column j of (5) in scalar code: the AVX2 kernel's tail and the fallback without AVX2.
inline void dot_column(const double* ah, const double* al, std::size_t n, const double* bh, const double* bl, std::size_t ldb,
                       std::size_t j, double& out_hi, double& out_lo, double& out_run) {
    double hi = 0, lo = 0, run = 0;
    for (std::size_t c = 0; c < n; ++c) dot_step(ah[c], al ? al[c] : 0.0, bh[c * ldb + j], bl ? bl[c * ldb + j] : 0.0, hi, lo, run);
    out_hi = hi, out_lo = lo, out_run = run;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(ATTNREF_SANITIZE_BUILD)
#define ATTNREF_FAST_AVX2 1
/// Steps c … c + U − 1 of dot_rows_avx2 on columns j0 … j0 + w − 1 (w a multiple of 4), the
/// accumulators held in registers across the U steps.
template <int U>
__attribute__((target("avx2,fma"), always_inline)) inline void dot_steps_avx2(const double* ah, const double* al, const double* bh,
                                                                              const double* bl, std::size_t ldb, std::size_t c,
                                                                              std::size_t j0, std::size_t w, double* out_hi,
                                                                              double* out_lo, double* out_run) {
    typedef double v4 __attribute__((vector_size(32)));
    typedef long long v4i __attribute__((vector_size(32)));
    typedef double v4u __attribute__((vector_size(32), aligned(8), may_alias));  // unaligned access
    const v4i nosign = {0x7fffffffffffffffLL, 0x7fffffffffffffffLL, 0x7fffffffffffffffLL, 0x7fffffffffffffffLL};
    v4 x[U], xl[U];
    const double* brow[U];
    const double* lrow[U];
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) {
        const double xs = ah[c + u], xls = al ? al[c + u] : 0.0;
        x[u] = v4{xs, xs, xs, xs};
        xl[u] = v4{xls, xls, xls, xls};
        brow[u] = bh + (c + u) * ldb + j0;
        lrow[u] = bl ? bl + (c + u) * ldb + j0 : nullptr;
    }
    for (std::size_t j = 0; j < w; j += 4) {
        v4u* hp = reinterpret_cast<v4u*>(out_hi + j0 + j);
        v4u* lp = reinterpret_cast<v4u*>(out_lo + j0 + j);
        v4u* rp = reinterpret_cast<v4u*>(out_run + j0 + j);
        v4 hi = *hp, lo = *lp, run = *rp;
#pragma GCC unroll 4
        for (int u = 0; u < U; ++u) {
            const v4 b = *reinterpret_cast<const v4u*>(brow[u] + j);
            const v4 blv = lrow[u] ? v4(*reinterpret_cast<const v4u*>(lrow[u] + j)) : v4{0, 0, 0, 0};
            const v4 p = x[u] * b;
            const v4 r = __builtin_ia32_vfmaddpd256(x[u], b, -p);  // fma(x, b, −p), exact
            const v4 s = hi + p;
            const v4 bb = s - hi;
            const v4 e = (hi - (s - bb)) + (p - bb);
            hi = s;
            const v4 cross = x[u] * blv + xl[u] * b;
            const v4 cc = (e + r) + cross;
            lo = lo + cc;
            const v4 acc = reinterpret_cast<v4>(reinterpret_cast<v4i>(cc) & nosign);  // |c|, exact
            const v4 alo = reinterpret_cast<v4>(reinterpret_cast<v4i>(lo) & nosign);  // |S|, exact
            run = run + (acc + alo);
        }
        *hp = hi, *lp = lo, *rp = run;
    }
}

/// (5) on blocks of up to 1024 columns: for each four values of c the block's accumulators (hi,
/// lo, run; 24 KiB, in L1) take four steps, four columns per instruction, so B is read row by row
/// (contiguous) instead of down its columns. Columns past the last multiple of 4 by dot_step. The operations
/// on each column are dot_step's, in the same order over c.
__attribute__((target("avx2,fma"))) inline void dot_rows_avx2(const double* ah, const double* al, std::size_t n,
                                                               const double* bh, const double* bl, std::size_t ldb,
                                                               std::size_t m, double* out_hi, double* out_lo, double* out_run) {
    constexpr std::size_t block = 1024;
    const std::size_t m4 = m - m % 4;
    for (std::size_t j = 0; j < m4; ++j) out_hi[j] = 0, out_lo[j] = 0, out_run[j] = 0;
    for (std::size_t j0 = 0; j0 < m4; j0 += block) {
        const std::size_t w = std::min(block, m4 - j0);
        std::size_t c = 0;
        for (; c + 4 <= n; c += 4) dot_steps_avx2<4>(ah, al, bh, bl, ldb, c, j0, w, out_hi, out_lo, out_run);
        for (; c < n; ++c) dot_steps_avx2<1>(ah, al, bh, bl, ldb, c, j0, w, out_hi, out_lo, out_run);
    }
    for (std::size_t j = m4; j < m; ++j) dot_column(ah, al, n, bh, bl, ldb, j, out_hi[j], out_lo[j], out_run[j]);
}
#endif

/// (5) Double-word dot products of one row a (n double-words; al may be null) with the m columns
/// of B (n × m, row stride ldb; bl may be null): out[j] = Σ_c a_c·B_cj, and out_err[j] a bound on
/// |out_j − Σ (ah+al)(bh+bl)| without its last term: the a-posteriori part of (5b),
///   2^-52(1 + 2^-52)·Σ(|c_i| + |S_i|)   (computed, made safe upward by sum_up),
/// to which the caller adds 7.01u²·Σ|ah_c||bh_cj| (≤ 7.01u²‖ah‖‖bh_j‖ or a Hölder bound); the
/// a-priori bound (5a), (n + 3)²u²·Σ|ah_c||bh_cj|, holds as well and callers take the smaller.
/// Ogita, Rump & Oishi 2005 (Dot2) with the low-order cross terms folded into the compensation,
/// and Higham's running error bound (Accuracy and Stability of Numerical Algorithms, 2nd ed.,
/// §3.3) for the compensation sum. The order over c is fixed; columns are independent, so
/// vectorising over them changes nothing.
inline void dot_rows(const double* ah, const double* al, std::size_t n, const double* bh, const double* bl, std::size_t ldb,
                     std::size_t m, double* out_hi, double* out_lo, double* out_err) {
#ifdef ATTNREF_FAST_AVX2
    static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (avx2) {
        dot_rows_avx2(ah, al, n, bh, bl, ldb, m, out_hi, out_lo, out_err);
    } else
#endif
    {
        for (std::size_t j = 0; j < m; ++j) dot_column(ah, al, n, bh, bl, ldb, j, out_hi[j], out_lo[j], out_err[j]);
    }
    for (std::size_t j = 0; j < m; ++j) {
        const dd t = dw::two_sum(out_hi[j], out_lo[j]);  // exact renormalisation
        out_hi[j] = t.hi;
        out_lo[j] = t.lo;
        out_err[j] = dw::up(dw::sum_up(out_err[j], 2 * n) * 0x1.0000000000001p-52);  // (5b)
    }
}

/// (5a) constant: (n + 3)²u².
inline double dot_constant(std::size_t n) {
    const double k = static_cast<double>(n) + 3;
    return dw::up(k * k * 0x1p-106);
}

/// (5b) constant of the a-priori remainder, 7.01u² rounded up to an exact double: 7.25u².
inline constexpr double dot_remainder_constant = 7.25 * 0x1p-106;

/// Euclidean norm, rounded upward ((3): the 2n operations of the sum by sum_up; sqrt is monotonic
/// and correctly rounded, covered by the outer up).
inline double norm_up(const double* x, std::size_t n, std::size_t stride = 1) {
    double s = 0;
    for (std::size_t c = 0; c < n; ++c) s += x[c * stride] * x[c * stride];
    return dw::up(std::sqrt(dw::sum_up(s, 2 * n)) * (1 + 0x1p-52));  // × (1 + 2^-52): |hi + lo| ≤ |hi|(1 + u)
}

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
    static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (avx2)
        for (; i + 4 <= n; i += 4) exp_core_avx2(rh + i, rl + i, th + i, tl + i);
#endif
    for (; i < n; ++i) {
        const dd t = exp_core({rh[i], rl[i]});
        th[i] = t.hi;
        tl[i] = t.lo;
    }
}

/// Every nonzero |x| in [2^-400, 2^40] (the ranges of (1)).
inline bool in_range(const double* x, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
        const double a = std::fabs(x[i]);
        if (a != 0 && !(a >= 0x1p-400 && a <= 0x1p40)) return false;
    }
    return true;
}

/// A projected or input matrix as double-words with per-element bounds, rows × cols.
struct dd_matrix {
    std::size_t rows = 0, cols = 0;
    std::vector<double> hi, lo, err;
};

/// (7) Y = X·W + bias for X rows × k (double-words with bounds, or plain doubles when X.lo is
/// empty), W k × n doubles (exact), bias n doubles or empty.
inline dd_matrix project(const dd_matrix& x, const double* w, std::size_t n, const double* bias, std::size_t threads) {
    const std::size_t k = x.cols;
    dd_matrix y{x.rows, n, std::vector<double>(x.rows * n), std::vector<double>(x.rows * n), std::vector<double>(x.rows * n)};
    std::vector<double> wnorm(n);
    for (std::size_t j = 0; j < n; ++j) wnorm[j] = norm_up(w + j, k, n);
    const double cdot = dot_constant(k);
    ::attnref::detail::parallel_for(x.rows, threads, [&](std::size_t r) {
        const double* xh = x.hi.data() + r * k;
        const double* xl = x.lo.empty() ? nullptr : x.lo.data() + r * k;
        double* oh = y.hi.data() + r * n;
        double* ol = y.lo.data() + r * n;
        double* oe = y.err.data() + r * n;
        dot_rows(xh, xl, k, w, nullptr, n, n, oh, ol, oe);
        const double xn = norm_up(xh, k);
        const double xe = x.err.empty() ? 0.0 : norm_up(x.err.data() + r * k, k);
        for (std::size_t j = 0; j < n; ++j) {
            // (7): the smaller of (5a) (n+3)²u²‖x‖‖w_j‖ and (5b), plus ‖e_x‖‖w_j‖ (Cauchy–Schwarz),
            // then the bias addition (η).
            const double cs = xn * wnorm[j];
            double e = dw::up(std::min(cdot * cs, oe[j] + dot_remainder_constant * cs) + xe * wnorm[j]);
            if (bias) {
                const dd s = dw::add({oh[j], ol[j]}, {bias[j], 0.0});
                oh[j] = s.hi;
                ol[j] = s.lo;
                e = dw::up(e + dw::dd_eta * 1.01 * dw::mag(s));
            }
            y.err[r * n + j] = e;
        }
    });
    return y;
}

/// Per query row: what the rounding checks decided.
struct element_sink {
    std::vector<std::vector<double>>* values;  ///< [target][n]
    std::vector<std::uint8_t>* undecided;      ///< [n]
    const std::vector<certify::binary_format>* targets;
    double bound_scale;
    std::size_t tensor;
    const std::function<void(std::size_t, std::size_t, const bounded&)>* observe;
    void put(std::size_t n, bounded x) const {
        x.bound = x.bound * bound_scale;
        if (*observe) (*observe)(tensor, n, x);
        bool all = true;
        for (std::size_t t = 0; t < targets->size(); ++t) all = round_check(x, (*targets)[t], (*values)[t][n]) && all;
        if (!all) (*undecided)[n] = 1;
    }
    void put_exact(std::size_t n, double v) const {
        for (std::size_t t = 0; t < targets->size(); ++t) (*values)[t][n] = v;
    }
};

/// The attention core for one (b, h) head: inputs as double-words with per-element bounds.
/// q: Sq × dk, kt: dk × Sk (transposed), v: Sk × dv. Writes head outputs (Sq × dv) with bounds
/// into ho (if not null), and certifies output (sdpa), weights and lse through the sinks.
struct head_inputs {
    std::size_t sq, sk, dk, dv;
    const double *qh, *ql, *qe;      // Sq × dk (ql, qe may be null)
    const double *kth, *ktl, *kte;   // dk × Sk
    const double *vh, *vl, *ve;      // Sk × dv
};

/// Per-thread buffers of attention_row (reused across rows; every element used is rewritten).
struct row_workspace {
    std::vector<double> sh, sl, se, ex, ph, pl, pe;
    std::vector<std::uint8_t> allowed;
    std::vector<dd> x;
    std::vector<exp_result> ej;
    std::vector<exp_prepared> ep;
    std::vector<std::size_t> core_j;
    std::vector<double> core_h, core_l, core_th, core_tl;
    double t_logits = 0, t_softmax = 0, t_pv = 0;  ///< thread-seconds per stage (fast_stats)
};

struct row_outputs {
    // per element of the row
    std::vector<double> oh, ol, oe, orun;  // dv
    bool nan = false;                // the row is NaN by construction (empty, nan policy)
};

}  // namespace detail

/// The fast certified forward pass; see the file comment. `kind_mha` selects multi-head attention.
struct fast_problem {
    bool mha = false;
    // SDPA
    tensor_view<const double, 4> q{}, k{}, v{};
    // MHA
    tensor_view<const double, 3> x_q{}, x_k{}, x_v{};
    mha_parameters<double> params{};
    std::size_t heads = 0, kv_heads = 0;
    attention_options options{};
};

namespace detail {

/// Runs the MPFI ladder for the undecided elements only (by rows), writing their values.
template <class RunMPFI>
void escalate(const std::vector<std::string>& names, const std::vector<certify::binary_format>& targets,
              std::vector<std::vector<std::vector<double>>>& values, const std::vector<std::vector<std::uint8_t>>& undecided,
              const std::vector<std::uint8_t>& nan_rows, RunMPFI&& run, std::size_t rows_total, fast_stats& stats,
              std::vector<int>& precisions, const std::vector<std::vector<std::size_t>>& shapes) {
    const std::size_t nt = names.size();
    std::vector<std::vector<std::size_t>> idx(nt);
    for (std::size_t t = 0; t < nt; ++t)
        for (std::size_t n = 0; n < undecided[t].size(); ++n)
            if (undecided[t][n]) idx[t].push_back(n);
    std::size_t total = 0;
    for (auto& i : idx) total += i.size();
    if (total == 0) return;
    // row of element n of tensor t: run.row_of(t, n) → set of (b,h,i) rows (flags)
    auto compute = [&]<unsigned D>(std::integral_constant<unsigned, D> tag, const certify::request& req) {
        std::vector<std::uint8_t> rows(rows_total, 0);
        for (std::size_t t = 0; t < nt; ++t)
            for (std::size_t m = 0; m < idx[t].size(); ++m)
                if (req.pending.empty() || req.pending[t].empty() || req.pending[t][m]) run.mark_rows(t, idx[t][m], rows);
        std::size_t count = 0;
        for (std::uint8_t r : rows) count += r;
        stats.escalated_rows = std::max(stats.escalated_rows, count);
        std::vector<std::vector<mpfr_interval<D>>> full = run(tag, rows);
        std::vector<std::vector<mpfr_interval<D>>> out(nt);
        for (std::size_t t = 0; t < nt; ++t)
            for (std::size_t n : idx[t]) out[t].push_back(full[t][n]);
        return out;
    };
    // NaN is exact only in the rows that the mask alone leaves empty under empty_row_policy::nan
    // (and what they feed), as in generation.
    certify::options opts;
    opts.nan_allowed.resize(nt);
    for (std::size_t t = 0; t < nt; ++t)
        for (std::size_t n : idx[t]) opts.nan_allowed[t].push_back(run.nan_by_construction(t, n, nan_rows) ? 1 : 0);
    opts.shapes = shapes;  // messages name an uncertified element by its index in the full tensor
    opts.full_index = idx;
    certify::result r = certify::certify(names, targets, compute, opts);
    precisions = r.precisions_bits;
    for (std::size_t t = 0; t < nt; ++t)
        for (std::size_t k = 0; k < targets.size(); ++k)
            for (std::size_t m = 0; m < idx[t].size(); ++m) values[t][k][idx[t][m]] = r.values[t][k][m];
}

}  // namespace detail

namespace detail {

/// The MPFI path for selected (b, h, i) rows, through the same templates as generation.
struct mpfi_runner {
    const fast_problem* p;
    std::size_t B, H, Sq, Sk, dv, dout;
    bool want_weights, want_lse;
    std::vector<std::uint8_t> need;  ///< per tensor: some element of it is undecided
    std::size_t threads;

    bool nan_by_construction(std::size_t t, std::size_t n, const std::vector<std::uint8_t>& nan_rows) const {
        if (want_lse && t == (want_weights ? 2u : 1u)) return false;  // lse of an empty row is −inf
        if (t == 0 && p->mha) {
            const std::size_t row = n / dout, b = row / Sq, i = row % Sq;
            for (std::size_t h = 0; h < H; ++h)
                if (nan_rows[(b * H + h) * Sq + i]) return true;
            return false;
        }
        return nan_rows[n / (t == 0 ? dv : Sk)] != 0;
    }
    void mark_rows(std::size_t t, std::size_t n, std::vector<std::uint8_t>& rows) const {
        if (t == 0 && p->mha) {
            const std::size_t row = n / dout, b = row / Sq, i = row % Sq;
            for (std::size_t h = 0; h < H; ++h) rows[(b * H + h) * Sq + i] = 1;
            return;
        }
        const std::size_t width = t == 0 ? dv : (want_weights && t == 1) ? Sk : 1;
        rows[n / width] = 1;
    }

    template <unsigned D>
    std::vector<std::vector<mpfr_interval<D>>> operator()(std::integral_constant<unsigned, D>, const std::vector<std::uint8_t>& rows) const {
        using T = mpfr_interval<D>;
        using P = uniform_precision<T>;
        attention_options o = p->options;
        o.rows = rows;
        o.threads = threads;
        std::vector<std::vector<T>> r;
        const std::size_t out_size = p->mha ? B * Sq * dout : B * H * Sq * dv;
        r.emplace_back(out_size);
        const bool w = want_weights && need[1], l = want_lse && need[want_weights ? 2 : 1];
        std::vector<T> wv(w ? B * H * Sq * Sk : 0), lv(l ? B * H * Sq : 0);
        tensor_view<T, 4> wview{};
        tensor_view<T, 3> lview{};
        if (w) wview = {wv.data(), {B, H, Sq, Sk}};
        if (l) lview = {lv.data(), {B, H, Sq}};
        if (!p->mha) {
            tensor_view<T, 4> out{r[0].data(), {B, H, Sq, dv}};
            scaled_dot_product_attention_into<P>(p->q, p->k, p->v, o, out, wview, lview);
        } else {
            mha_options mo;
            mo.heads = p->heads;
            mo.kv_heads = p->kv_heads;
            mo.attention = o;
            tensor_view<T, 3> out{r[0].data(), {B, Sq, dout}};
            multi_head_attention_into<P>(p->x_q, p->x_k, p->x_v, p->params, mo, out, wview, lview, tensor_view<T, 4>{});
        }
        if (want_weights) r.push_back(std::move(wv));
        if (want_lse) r.push_back(std::move(lv));
        return r;
    }
};

/// Everything one (b, h) head needs, and its row computation (equations (8)–(8e)).
struct head_context {
    const attention_options* o;
    std::size_t B, H, Sq, Sk, dk, dv;
    dd scale;
    double scale_err;  ///< |s − s̃|
    const element_sink* out_sink;   ///< sdpa output (null for mha)
    const element_sink* w_sink;     ///< weights (null when not asked)
    const element_sink* l_sink;     ///< lse (null when not asked)
};

/// Computes row i of head (b, h). Head outputs (dd + bound) are returned in ro.
inline void attention_row(const head_context& hc, const head_inputs& in, const std::vector<double>& kn,
                          const std::vector<double>& ken, const std::vector<double>& vn, const std::vector<double>& ven,
                          const std::vector<double>& vmax, const std::vector<double>& evmax, std::size_t b, std::size_t h, std::size_t i, row_workspace& ws,
                          row_outputs& ro) {
    const attention_options& o = *hc.o;
    const std::size_t Sq = hc.Sq, Sk = hc.Sk, dk = hc.dk, dv = hc.dv;
    const double eta = dw::dd_eta * 1.01;
    const std::size_t row = (b * hc.H + h) * Sq + i;
    ro.nan = false;
    ro.oh.assign(dv, 0);
    ro.ol.assign(dv, 0);
    ro.oe.assign(dv, 0);
    ro.orun.assign(dv, 0);
    std::vector<double>&sh = ws.sh, &sl = ws.sl, &se = ws.se;
    sh.resize(Sk), sl.resize(Sk), se.resize(Sk);
    std::vector<std::uint8_t>& allowed = ws.allowed;
    allowed.resize(Sk);
    std::size_t count = 0;
    for (std::size_t j = 0; j < Sk; ++j) count += allowed[j] = !structurally_masked(o.mask, b, h, i, j, Sq, Sk);
    const double inf = std::numeric_limits<double>::infinity();
    auto fail_row = [&] {
        for (std::size_t c = 0; c < dv; ++c) ro.oe[c] = inf;
        if (hc.out_sink)
            for (std::size_t c = 0; c < dv; ++c) hc.out_sink->put(row * dv + c, bounded{});
        if (hc.w_sink)
            for (std::size_t j = 0; j < Sk; ++j) hc.w_sink->put(row * Sk + j, bounded{});
        if (hc.l_sink) hc.l_sink->put(row, bounded{});
    };
    const bool empty = count == 0;
    if (empty) {
        if (hc.l_sink) hc.l_sink->put_exact(row, -inf);
        if (o.softmax.empty_rows != empty_row_policy::uniform) {
            const double fill = o.softmax.empty_rows == empty_row_policy::nan ? std::numeric_limits<double>::quiet_NaN() : 0.0;
            ro.nan = o.softmax.empty_rows == empty_row_policy::nan;
            if (hc.out_sink)
                for (std::size_t c = 0; c < dv; ++c) hc.out_sink->put_exact(row * dv + c, fill);
            if (hc.w_sink)
                for (std::size_t j = 0; j < Sk; ++j) hc.w_sink->put_exact(row * Sk + j, fill);
            return;
        }
        std::fill(allowed.begin(), allowed.end(), std::uint8_t{1});  // uniform: softmax of Sk zero logits
    }
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    // (8) logits x_j = s·(q_i·k_j) − ALiBi + additive + seed·(−1e9), each with a bound.
    std::vector<dd>& x = ws.x;
    std::vector<double>& ex = ws.ex;
    x.assign(Sk, dd{});
    ex.assign(Sk, 0.0);
    if (!empty) {
        dot_rows(in.qh + i * dk, in.ql ? in.ql + i * dk : nullptr, dk, in.kth, in.ktl, Sk, Sk, sh.data(), sl.data(), se.data());
        const double qn = norm_up(in.qh + i * dk, dk);
        const double qen = in.qe ? norm_up(in.qe + i * dk, dk) : 0.0;
        const double cdot = dot_constant(dk);
        const double as = dw::mag(hc.scale);
        const double alibi = o.alibi_slopes.empty() ? 0.0 : o.alibi_slopes[h];
        for (std::size_t j = 0; j < Sk; ++j) {
            if (!allowed[j]) continue;
            const dd sdot{sh[j], sl[j]};
            const double cs = qn * kn[j];  // ≥ Σ|q||k| (Cauchy–Schwarz); (5a) or (5b), the smaller
            const double edot = dw::up(std::min(cdot * cs, se[j] + dot_remainder_constant * cs) + qen * kn[j] + qn * ken[j] + qen * ken[j]);
            dd xj = dw::mul(sdot, hc.scale);
            double e = dw::up(as * edot + dw::mag(sdot) * hc.scale_err + edot * hc.scale_err + eta * dw::mag(xj));
            if (alibi != 0) {
                const std::ptrdiff_t dist = diagonal(o.mask, i, Sq, Sk) - static_cast<std::ptrdiff_t>(j);
                const dd bias = dw::two_prod(alibi, static_cast<double>(dist < 0 ? -dist : dist));
                xj = dw::sub(xj, bias);
                e = dw::up(e + eta * dw::mag(xj));
            }
            if (o.mask.additive.present()) {
                xj = dw::add(xj, {o.mask.additive.at(b, h, i, j), 0.0});
                e = dw::up(e + eta * dw::mag(xj));
            }
            if (o.mask.seed.present()) {
                xj = dw::add(xj, dw::two_prod(o.mask.seed.at(b, h, i, j), -1e9));
                e = dw::up(e + eta * dw::mag(xj));
            }
            x[j] = xj;
            ex[j] = e;
        }
    }
    const auto t1 = clock::now();
    ws.t_logits += std::chrono::duration<double>(t1 - t0).count();
    // (8a) shift m = x̃_{j*} (an exact double-word; any shift is exact in exact arithmetic).
    std::size_t js = Sk;
    for (std::size_t j = 0; j < Sk; ++j)
        if (allowed[j] && (js == Sk || x[j].hi > x[js].hi)) js = j;
    const dd m = x[js];
    std::vector<exp_result>& ej = ws.ej;
    ej.resize(Sk);
    dd y{0, 0};
    double ey = 0;
    std::size_t terms = 0;
    // (6) for every attendable key: reduction, then the cores four at a time, then the bounds.
    std::vector<exp_prepared>& ep = ws.ep;
    ep.resize(Sk);
    ws.core_j.clear(), ws.core_h.clear(), ws.core_l.clear();
    for (std::size_t j = 0; j < Sk; ++j) {
        if (!allowed[j]) continue;
        const dd d = dw::sub(x[j], m);
        const double ed = dw::up(ex[j] + eta * dw::mag(d));
        ep[j] = exp_prepare(d, ed);
        if (ep[j].status == 2) return fail_row();
        if (ep[j].status == 0) ws.core_j.push_back(j), ws.core_h.push_back(ep[j].rs.hi), ws.core_l.push_back(ep[j].rs.lo);
    }
    const std::size_t ncore = ws.core_j.size();
    ws.core_th.resize(ncore), ws.core_tl.resize(ncore);
    exp_core_many(ncore, ws.core_h.data(), ws.core_l.data(), ws.core_th.data(), ws.core_tl.data());
    for (std::size_t n = 0; n < ncore; ++n) {
        const std::size_t j = ws.core_j[n];
        ej[j] = exp_finish(ep[j], {ws.core_th[n], ws.core_tl[n]});
        if (!ej[j].ok) return fail_row();
    }
    for (std::size_t j = 0; j < Sk; ++j) {
        if (!allowed[j]) continue;
        if (ep[j].status == 1) ej[j] = exp_finish(ep[j], dd{});
        if (ej[j].tiny) {
            ey += 0x1p-1000;
            continue;
        }
        const int K = ej[j].x.scale;
        if (K < -700) {
            ey += dw::scale2(1.0, std::max(K + 1, -1000));
            continue;
        }
        y = dw::add(y, {dw::scale2(ej[j].x.v.hi, K), dw::scale2(ej[j].x.v.lo, K)});
        ey += dw::scale2(ej[j].x.bound, K);
        ++terms;
    }
    // (8b) the sum: n additions of positive terms, each relative η.
    ey = dw::up(dw::sum_up(ey, Sk) + 1.01 * static_cast<double>(terms) * dw::dd_eta * dw::mag(y));
    const double lowy = (y.hi - std::fabs(y.lo) - ey) * (1 - 0x1p-49);
    if (!(lowy >= 0.5)) return fail_row();
    // (8c) reciprocal z ≈ 1/ŷ, bounded a posteriori from ρ = 1 − ŷ·z0.
    const double z0 = 1 / y.hi;
    const dd t = dw::mul(y, z0);
    const dd rho = dw::sub({1, 0}, t);
    const double erho = dw::up(eta * dw::mag(t) + eta * dw::mag(rho));
    const double rmax = dw::up(dw::mag(rho) + erho);
    if (!(rmax < 0x1p-40)) return fail_row();
    const dd z = dw::add({z0, 0}, dw::mul(rho, z0));
    const double az0 = std::fabs(z0);
    const double ez = dw::up(az0 * erho + az0 * rmax * rmax * 1.01 + eta * (az0 * dw::mag(rho) * 1.01 + dw::mag(z)));
    const double inv_low = dw::up(1 / lowy);
    // (8d) weights p_j = e_j / y in scaled form 2^K·P̃.
    std::vector<double>&ph = ws.ph, &pl = ws.pl, &pe = ws.pe;
    ph.assign(Sk, 0.0), pl.assign(Sk, 0.0), pe.assign(Sk, 0.0);
    for (std::size_t j = 0; j < Sk; ++j) {
        if (!allowed[j]) {
            if (hc.w_sink) hc.w_sink->put_exact(row * Sk + j, 0.0);
            continue;
        }
        if (ej[j].tiny) {
            pe[j] = 0x1p-1000;
            if (hc.w_sink) hc.w_sink->put_exact(row * Sk + j, 0.0);  // < 2^-1148: +0 in every format
            continue;
        }
        const bounded& E = ej[j].x;
        const dd P = dw::mul(E.v, z);
        const double aE = dw::mag(E.v);
        const double ep = dw::up(E.bound * inv_low + aE * ey * inv_low * inv_low + aE * ez + eta * dw::mag(P));
        if (hc.w_sink) hc.w_sink->put(row * Sk + j, bounded{P, ep, E.scale});
        if (E.scale < -480) {
            pe[j] = dw::scale2(1.0, std::max(E.scale + 2, -1000));
        } else {
            ph[j] = dw::scale2(P.hi, E.scale);
            pl[j] = dw::scale2(P.lo, E.scale);
            pe[j] = dw::up(dw::scale2(ep, E.scale));
        }
    }
    // (8e) lse = m + log ŷ: λ0 = log(ŷ.hi) (any double), τ = ŷ·e^-λ0 − 1, log ŷ = λ0 + log1p(τ).
    if (hc.l_sink && !empty) {
        const double lambda0 = std::log(y.hi);
        const exp_result w = exp_dd({-lambda0, 0}, 0);
        if (!w.ok || w.tiny) {
            hc.l_sink->put(row, bounded{});
        } else {
            const dd wv{dw::scale2(w.x.v.hi, w.x.scale), dw::scale2(w.x.v.lo, w.x.scale)};
            const double we = dw::up(dw::scale2(w.x.bound, w.x.scale));
            const dd yw = dw::mul(y, wv);
            const dd tau = dw::sub(yw, {1, 0});
            const double etau = dw::up(dw::mag(y) * we + eta * dw::mag(yw) + eta * dw::mag(tau));
            const double tmax = dw::up(dw::mag(tau) + etau);
            if (!(tmax < 0x1p-30)) {
                hc.l_sink->put(row, bounded{});
            } else {
                const dd L = dw::add({lambda0, 0}, tau);
                const double eL = dw::up(etau + 0.51 * tmax * tmax + eta * dw::mag(L));
                const dd lse = dw::add(m, L);
                const double el = dw::up(eL + ey * inv_low + eta * dw::mag(lse));
                hc.l_sink->put(row, bounded{lse, el, 0});
            }
        }
    }
    const auto t2 = clock::now();
    ws.t_softmax += std::chrono::duration<double>(t2 - t1).count();
    // (8f) o_c = Σ_j p_j v_jc: (5) and the propagated errors, each bounded both by Cauchy–Schwarz
    // (‖p‖₂‖v_c‖₂) and by Hölder (‖p‖₁·max_j|v_jc|; Σ p_j ≈ 1), whichever is smaller.
    dot_rows(ph.data(), pl.data(), Sk, in.vh, in.vl, dv, dv, ro.oh.data(), ro.ol.data(), ro.orun.data());
    const double pn = norm_up(ph.data(), Sk), pen = norm_up(pe.data(), Sk);
    double p1 = 0, ep1 = 0;
    for (std::size_t j = 0; j < Sk; ++j) p1 += std::fabs(ph[j]), ep1 += pe[j];
    p1 = dw::sum_up(p1 * (1 + 0x1p-52), Sk + 1);
    ep1 = dw::sum_up(ep1, Sk);
    const double cdot = dot_constant(Sk);
    for (std::size_t c = 0; c < dv; ++c) {
        const double pv = std::min(pn * vn[c], p1 * vmax[c]);  // ≥ Σ_j|p_j||v_jc|
        const double dot = std::min(cdot * pv, ro.orun[c] + dot_remainder_constant * pv);  // (5a) or (5b)
        const double cs = pen * vn[c] + pn * ven[c] + pen * ven[c];
        const double ho = ep1 * vmax[c] + p1 * evmax[c] + ep1 * evmax[c];
        ro.oe[c] = dw::up(dot + std::min(cs, ho));
        if (hc.out_sink) hc.out_sink->put(row * dv + c, bounded{{ro.oh[c], ro.ol[c]}, ro.oe[c], 0});
    }
    ws.t_pv += std::chrono::duration<double>(clock::now() - t2).count();
}

#ifdef ATTNREF_FAST_AVX2
/// attention_row compiled with FMA available, everything inlined (flatten): std::fma becomes one
/// instruction instead of a library call. Same operations in the same order, each correctly
/// rounded as before (FMA is exact-then-rounded either way; contraction stays off), so the same
/// bits; chosen at run time as dot_rows chooses its AVX2 kernel.
__attribute__((target("avx2,fma"), flatten)) inline void attention_row_fma(
    const head_context& hc, const head_inputs& in, const std::vector<double>& kn, const std::vector<double>& ken,
    const std::vector<double>& vn, const std::vector<double>& ven, const std::vector<double>& vmax, const std::vector<double>& evmax,
    std::size_t b, std::size_t h, std::size_t i, row_workspace& ws, row_outputs& ro) {
    attention_row(hc, in, kn, ken, vn, ven, vmax, evmax, b, h, i, ws, ro);
}
#endif

/// attention_row, through attention_row_fma where the processor has AVX2 and FMA.
inline void attention_row_dispatch(const head_context& hc, const head_inputs& in, const std::vector<double>& kn,
                                   const std::vector<double>& ken, const std::vector<double>& vn, const std::vector<double>& ven,
                                   const std::vector<double>& vmax, const std::vector<double>& evmax, std::size_t b, std::size_t h,
                                   std::size_t i, row_workspace& ws, row_outputs& ro) {
#ifdef ATTNREF_FAST_AVX2
    static const bool fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (fma) return attention_row_fma(hc, in, kn, ken, vn, ven, vmax, evmax, b, h, i, ws, ro);
#endif
    attention_row(hc, in, kn, ken, vn, ven, vmax, evmax, b, h, i, ws, ro);
}

}  // namespace detail

/// Certifies output (and weights, lse when asked) of `p` for every target (the first should be
/// float64_target). Returns certify::result: values[tensor][target][n], reports with `escalated`
/// = elements the fast rung left to the MPFI ladder, precisions_bits = {106} plus every MPFI rung
/// computed. Throws certify::uncertified_error as certify::certify does.
inline certify::result certify_fast(const fast_problem& p, bool want_weights, bool want_lse,
                                    const std::vector<certify::binary_format>& targets, const fast_options& fo = {},
                                    fast_stats* stats_out = nullptr) {
    require_reference_fp_environment();
    (void)detail::consts();  // MPFR constants once, on the calling thread
    fast_stats stats;
    const attention_options& o = p.options;
    std::size_t B, H, Hkv, Sq, Sk, dk, dv, dout = 0;
    if (!p.mha) {
        const attention_dims d = ::attnref::detail::attention_dims_of(p.q, p.k, p.v);
        B = d.batch, H = d.heads, Hkv = d.kv_heads, Sq = d.query_length, Sk = d.key_length, dk = d.head_dim_qk, dv = d.head_dim_v;
    } else {
        mha_options mo;
        mo.heads = p.heads;
        mo.kv_heads = p.kv_heads;
        const mha_dims d = mha_dims_of(p.x_q, p.x_k, p.x_v, p.params, mo);
        B = d.batch, H = d.heads, Hkv = d.kv_heads, Sq = d.query_length, Sk = d.key_length, dk = d.head_dim_qk, dv = d.head_dim_v;
        dout = d.output_dim;
    }
    ::attnref::detail::validate_masks(o.mask, B, H, Sq, Sk);
    if (!o.alibi_slopes.empty()) require_extent("alibi_slopes size (heads)", o.alibi_slopes.size(), H);
    const std::size_t group = H / Hkv;
    std::vector<std::string> names{"output"};
    std::vector<std::size_t> sizes{p.mha ? B * Sq * dout : B * H * Sq * dv};
    if (want_weights) names.push_back("weights"), sizes.push_back(B * H * Sq * Sk);
    if (want_lse) names.push_back("lse"), sizes.push_back(B * H * Sq);
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

    // Whole-case conditions of (1).
    auto whole = [&](const std::string& why) {
        stats.whole_case_reason = why;
        for (auto& u : undecided) std::fill(u.begin(), u.end(), std::uint8_t{1});
    };
    bool run_fast = true;
    auto check = [&](const double* x, std::size_t n, const char* what) {
        if (run_fast && !detail::in_range(x, n)) {
            whole(std::string("a nonzero |") + what + "| outside [2^-400, 2^40]");
            run_fast = false;
        }
    };
    if (o.softcap) {
        whole("soft-capping (no double-word tanh bound)");
        run_fast = false;
    }
    if (o.scale) check(&*o.scale, 1, "scale");
    if (!o.alibi_slopes.empty()) check(o.alibi_slopes.data(), o.alibi_slopes.size(), "ALiBi slope");
    if (o.mask.seed.present()) check(o.mask.seed.values.data, o.mask.seed.values.size(), "seed mask");
    if (run_fast && o.mask.additive.present())
        for (std::size_t n = 0; n < o.mask.additive.values.size(); ++n) {
            const double a = o.mask.additive.values.data[n];
            if (!std::isfinite(a) && a != -std::numeric_limits<double>::infinity()) {
                whole("a non-finite additive mask entry other than -inf");
                run_fast = false;
                break;
            }
            if (run_fast && std::isfinite(a)) check(&a, 1, "additive mask entry");
        }
    const std::size_t threads = fo.threads;
    dd scale{1, 0};
    double scale_err = 0;
    if (o.scale) {
        scale = {*o.scale, 0};
    } else {
        scale = detail::inv_sqrt(dk);
        scale_err = dw::up(0x1p-105 * dw::mag(scale));
    }

    if (run_fast) {
        const bool mha = p.mha;
        detail::dd_matrix Q, Kp, Vp;
        if (mha) {
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
        if (run_fast && mha) {
            const std::size_t dm = p.x_q.extents[2];
            auto input = [](tensor_view<const double, 3> x) {
                detail::dd_matrix m{x.extents[0] * x.extents[1], x.extents[2], std::vector<double>(x.data, x.data + x.size()), {}, {}};
                return m;
            };
            (void)dm;
            auto bias = [](const tensor_view<const double, 1>& b) { return b.empty() ? nullptr : b.data; };
            const auto tp = std::chrono::steady_clock::now();
            Q = detail::project(input(p.x_q), p.params.w_q.data, H * dk, bias(p.params.b_q), threads);
            Kp = detail::project(input(p.x_k), p.params.w_k.data, Hkv * dk, bias(p.params.b_k), threads);
            Vp = detail::project(input(p.x_v), p.params.w_v.data, Hkv * dv, bias(p.params.b_v), threads);
            stats.projection_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - tp).count();
            check(Q.hi.data(), Q.hi.size(), "projected query");
            check(Kp.hi.data(), Kp.hi.size(), "projected key");
            check(Vp.hi.data(), Vp.hi.size(), "projected value");
        }
        if (run_fast) {
            detail::head_context hc{&o, B, H, Sq, Sk, dk, dv, scale, scale_err,
                                    mha ? nullptr : &sinks[0], want_weights ? &sinks[1] : nullptr,
                                    want_lse ? &sinks[want_weights ? 2 : 1] : nullptr};
            // merged head outputs (mha): (B·Sq) × (H·dv)
            detail::dd_matrix merged;
            std::vector<std::uint8_t> nan_rows;
            if (mha) {
                merged = {B * Sq, H * dv, std::vector<double>(B * Sq * H * dv), std::vector<double>(B * Sq * H * dv),
                          std::vector<double>(B * Sq * H * dv)};
                nan_rows.assign(B * Sq * H, 0);
            }
            std::mutex stats_lock;
            const auto ta = std::chrono::steady_clock::now();
            ::attnref::detail::parallel_for(B * H, threads, [&](std::size_t task) {
                const std::size_t b = task / H, h = task % H, hk = h / group;
                std::vector<double> qh(Sq * dk), ql, qe, kth(dk * Sk), ktl, kte, vh(Sk * dv), vl, ve;
                if (!mha) {
                    for (std::size_t i = 0; i < Sq; ++i)
                        for (std::size_t c = 0; c < dk; ++c) qh[i * dk + c] = p.q(b, h, i, c);
                    for (std::size_t j = 0; j < Sk; ++j)
                        for (std::size_t c = 0; c < dk; ++c) kth[c * Sk + j] = p.k(b, hk, j, c);
                    for (std::size_t j = 0; j < Sk; ++j)
                        for (std::size_t c = 0; c < dv; ++c) vh[j * dv + c] = p.v(b, hk, j, c);
                } else {
                    ql.resize(Sq * dk), qe.resize(Sq * dk), ktl.resize(dk * Sk), kte.resize(dk * Sk), vl.resize(Sk * dv), ve.resize(Sk * dv);
                    for (std::size_t i = 0; i < Sq; ++i)
                        for (std::size_t c = 0; c < dk; ++c) {
                            const std::size_t n = (b * Sq + i) * (H * dk) + h * dk + c;
                            qh[i * dk + c] = Q.hi[n], ql[i * dk + c] = Q.lo[n], qe[i * dk + c] = Q.err[n];
                        }
                    for (std::size_t j = 0; j < Sk; ++j)
                        for (std::size_t c = 0; c < dk; ++c) {
                            const std::size_t n = (b * Sk + j) * (Hkv * dk) + hk * dk + c;
                            kth[c * Sk + j] = Kp.hi[n], ktl[c * Sk + j] = Kp.lo[n], kte[c * Sk + j] = Kp.err[n];
                        }
                    for (std::size_t j = 0; j < Sk; ++j)
                        for (std::size_t c = 0; c < dv; ++c) {
                            const std::size_t n = (b * Sk + j) * (Hkv * dv) + hk * dv + c;
                            vh[j * dv + c] = Vp.hi[n], vl[j * dv + c] = Vp.lo[n], ve[j * dv + c] = Vp.err[n];
                        }
                }
                std::vector<double> kn(Sk), ken(Sk, 0.0), vn(dv), ven(dv, 0.0);
                for (std::size_t j = 0; j < Sk; ++j) {
                    kn[j] = detail::norm_up(kth.data() + j, dk, Sk);
                    if (mha) ken[j] = detail::norm_up(kte.data() + j, dk, Sk);
                }
                std::vector<double> vmax(dv, 0.0), evmax(dv, 0.0);
                for (std::size_t c = 0; c < dv; ++c) {
                    vn[c] = detail::norm_up(vh.data() + c, Sk, dv);
                    if (mha) ven[c] = detail::norm_up(ve.data() + c, Sk, dv);
                    for (std::size_t j = 0; j < Sk; ++j) {
                        vmax[c] = std::max(vmax[c], std::fabs(vh[j * dv + c]) * (1 + 0x1p-52));
                        if (mha) evmax[c] = std::max(evmax[c], ve[j * dv + c]);
                    }
                }
                const detail::head_inputs in{Sq, Sk, dk, dv, qh.data(), mha ? ql.data() : nullptr, mha ? qe.data() : nullptr,
                                             kth.data(), mha ? ktl.data() : nullptr, mha ? kte.data() : nullptr,
                                             vh.data(), mha ? vl.data() : nullptr, mha ? ve.data() : nullptr};
                detail::row_workspace ws;
                detail::row_outputs ro;
                for (std::size_t i = 0; i < Sq; ++i) {
                    detail::attention_row_dispatch(hc, in, kn, ken, vn, ven, vmax, evmax, b, h, i, ws, ro);
                    if (mha) {
                        const std::size_t base = (b * Sq + i) * (H * dv) + h * dv;
                        for (std::size_t c = 0; c < dv; ++c)
                            merged.hi[base + c] = ro.oh[c], merged.lo[base + c] = ro.ol[c], merged.err[base + c] = ro.oe[c];
                        nan_rows[(b * Sq + i) * H + h] = ro.nan ? 1 : 0;
                    }
                }
                const std::lock_guard<std::mutex> g(stats_lock);
                stats.logits_thread_seconds += ws.t_logits;
                stats.softmax_thread_seconds += ws.t_softmax;
                stats.pv_thread_seconds += ws.t_pv;
            });
            stats.attention_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - ta).count();
            if (mha) {
                // (7) again: output = merged·W_o + b_o.
                const auto to = std::chrono::steady_clock::now();
                const detail::dd_matrix out = detail::project(merged, p.params.w_o.data, dout,
                                                              p.params.b_o.empty() ? nullptr : p.params.b_o.data, threads);
                for (std::size_t row = 0; row < B * Sq; ++row) {
                    bool nan = false;
                    for (std::size_t h = 0; h < H; ++h) nan = nan || nan_rows[row * H + h];
                    for (std::size_t c = 0; c < dout; ++c) {
                        const std::size_t n = row * dout + c;
                        if (nan) sinks[0].put_exact(n, std::numeric_limits<double>::quiet_NaN());
                        else sinks[0].put(n, bounded{{out.hi[n], out.lo[n]}, out.err[n], 0});
                    }
                }
                stats.output_projection_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - to).count();
            }
        }
    }
    // Reports before escalation: escalated = undecided by the fast rung.
    for (std::size_t t = 0; t < nt; ++t) {
        std::size_t u = 0;
        for (std::uint8_t f : undecided[t]) u += f;
        for (std::size_t k = 0; k < nk; ++k)
            r.reports.push_back(certify::tensor_report{names[t], targets[k].name, sizes[t], sizes[t], u, {106}});
    }
    r.precisions_bits = {106};
    bool any = false;
    for (auto& u : undecided) any = any || std::find(u.begin(), u.end(), std::uint8_t{1}) != u.end();
    if (any && fo.fallback) {
        const auto te = std::chrono::steady_clock::now();
        detail::mpfi_runner run{&p, B, H, Sq, Sk, dv, dout, want_weights, want_lse, std::vector<std::uint8_t>(nt, 0), threads};
        for (std::size_t t = 0; t < nt; ++t)
            run.need[t] = std::find(undecided[t].begin(), undecided[t].end(), std::uint8_t{1}) != undecided[t].end();
        std::vector<int> precisions;
        std::vector<std::uint8_t> nan_rows(B * H * Sq, 0);
        if (o.softmax.empty_rows == empty_row_policy::nan)
            for (std::size_t b = 0; b < B; ++b)
                for (std::size_t h = 0; h < H; ++h)
                    for (std::size_t i = 0; i < Sq; ++i) {
                        bool any = false;
                        for (std::size_t j = 0; j < Sk && !any; ++j) any = !structurally_masked(o.mask, b, h, i, j, Sq, Sk);
                        nan_rows[(b * H + h) * Sq + i] = any ? 0 : 1;
                    }
        std::vector<std::vector<std::size_t>> shapes{p.mha ? std::vector<std::size_t>{B, Sq, dout} : std::vector<std::size_t>{B, H, Sq, dv}};
        if (want_weights) shapes.push_back({B, H, Sq, Sk});
        if (want_lse) shapes.push_back({B, H, Sq});
        detail::escalate(names, targets, r.values, undecided, nan_rows, run, B * H * Sq, stats, precisions, shapes);
        stats.escalation_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - te).count();
        for (int bits : precisions) r.precisions_bits.push_back(bits);
        for (auto& rep : r.reports)
            if (rep.escalated) rep.precisions_bits.insert(rep.precisions_bits.end(), precisions.begin(), precisions.end());
    } else if (any) {
        for (std::size_t t = 0; t < nt; ++t)
            for (std::size_t k = 0; k < nk; ++k) {
                std::size_t u = 0;
                for (std::uint8_t f : undecided[t]) u += f;
                r.reports[t * nk + k].certified = sizes[t] - u;
            }
    }
    if (stats_out) *stats_out = stats;
    return r;
}
}  // namespace attnref::fast
