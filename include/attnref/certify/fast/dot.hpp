#pragma once
/// \file certify/fast/dot.hpp
/// Double-word dot products with the a-posteriori bound (5b): the scalar reference step, its AVX2
/// variant (four columns per instruction, the same operations in the same order), the run-time
/// choice between them, the a-priori constant (5a) and upward-safe norms (docs/fast-certify.md (5)).

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "attnref/certify/fast/cpu.hpp"
#include "attnref/core/double_double.hpp"

namespace attnref::fast::detail {

using dw::dd;

/// same operations on four columns at once, so both give identical bits). `run` accumulates
/// Σ(|c_i| + |S_i|) for the a-posteriori bound (5b): c_i the compensation term added in step i,
/// S_i the low-order sum after it. XL, BL: whether x and b have low parts; a cross term of a part
/// that is absent (exactly 0) is not computed (the values are those with it, up to the sign of a zero).
template <bool XL = true, bool BL = true>
inline void dot_step(double x, double xl, double b, double bl, double& hi, double& lo, double& run) {
    const double p = x * b;
    const double r = std::fma(x, b, -p);
    const double s = hi + p;
    const double bb = s - hi;
    const double e = (hi - (s - bb)) + (p - bb);
    hi = s;
    double c = e + r;
    if constexpr (XL && BL) c = c + (x * bl + xl * b);
    else if constexpr (BL) c = c + x * bl;
    else if constexpr (XL) c = c + xl * b;
    lo = lo + c;
    run = run + (std::fabs(c) + std::fabs(lo));
}

/// One column j of (5) in scalar code: the AVX2 kernel's tail and the fallback without AVX2.
template <bool XL, bool BL>
inline void dot_column_parts(const double* ah, const double* al, std::size_t n, const double* bh, const double* bl, std::size_t ldb,
                             std::size_t j, double& out_hi, double& out_lo, double& out_run) {
    double hi = 0, lo = 0, run = 0;
    for (std::size_t c = 0; c < n; ++c) dot_step<XL, BL>(ah[c], XL ? al[c] : 0.0, bh[c * ldb + j], BL ? bl[c * ldb + j] : 0.0, hi, lo, run);
    out_hi = hi, out_lo = lo, out_run = run;
}
inline void dot_column(const double* ah, const double* al, std::size_t n, const double* bh, const double* bl, std::size_t ldb,
                       std::size_t j, double& out_hi, double& out_lo, double& out_run) {
    if (al && bl) dot_column_parts<true, true>(ah, al, n, bh, bl, ldb, j, out_hi, out_lo, out_run);
    else if (bl) dot_column_parts<false, true>(ah, al, n, bh, bl, ldb, j, out_hi, out_lo, out_run);
    else if (al) dot_column_parts<true, false>(ah, al, n, bh, bl, ldb, j, out_hi, out_lo, out_run);
    else dot_column_parts<false, false>(ah, al, n, bh, bl, ldb, j, out_hi, out_lo, out_run);
}


#ifdef ATTNREF_FAST_AVX2
/// Steps c … c + U − 1 of dot_rows_avx2 on columns j0 … j0 + w − 1 (w a multiple of 4), the
/// accumulators held in registers across the U steps; dot_step<XL, BL>'s operations.
template <int U, bool XL, bool BL>
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
        const double xs = ah[c + u], xls = XL ? al[c + u] : 0.0;
        x[u] = v4{xs, xs, xs, xs};
        xl[u] = v4{xls, xls, xls, xls};
        brow[u] = bh + (c + u) * ldb + j0;
        lrow[u] = BL ? bl + (c + u) * ldb + j0 : nullptr;
    }
    for (std::size_t j = 0; j < w; j += 4) {
        v4u* hp = reinterpret_cast<v4u*>(out_hi + j0 + j);
        v4u* lp = reinterpret_cast<v4u*>(out_lo + j0 + j);
        v4u* rp = reinterpret_cast<v4u*>(out_run + j0 + j);
        v4 hi = *hp, lo = *lp, run = *rp;
#pragma GCC unroll 4
        for (int u = 0; u < U; ++u) {
            const v4 b = *reinterpret_cast<const v4u*>(brow[u] + j);
            const v4 p = x[u] * b;
            const v4 r = __builtin_ia32_vfmaddpd256(x[u], b, -p);  // fma(x, b, −p), exact
            const v4 s = hi + p;
            const v4 bb = s - hi;
            const v4 e = (hi - (s - bb)) + (p - bb);
            hi = s;
            v4 cc = e + r;
            if constexpr (XL && BL) cc = cc + (x[u] * v4(*reinterpret_cast<const v4u*>(lrow[u] + j)) + xl[u] * b);
            else if constexpr (BL) cc = cc + x[u] * v4(*reinterpret_cast<const v4u*>(lrow[u] + j));
            else if constexpr (XL) cc = cc + xl[u] * b;
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
template <bool XL, bool BL>
__attribute__((target("avx2,fma"))) inline void dot_rows_avx2_parts(const double* ah, const double* al, std::size_t n,
                                                                     const double* bh, const double* bl, std::size_t ldb,
                                                                     std::size_t m, double* out_hi, double* out_lo, double* out_run) {
    constexpr std::size_t block = 1024;
    const std::size_t m4 = m - m % 4;
    for (std::size_t j = 0; j < m4; ++j) out_hi[j] = 0, out_lo[j] = 0, out_run[j] = 0;
    for (std::size_t j0 = 0; j0 < m4; j0 += block) {
        const std::size_t w = std::min(block, m4 - j0);
        std::size_t c = 0;
        for (; c + 4 <= n; c += 4) dot_steps_avx2<4, XL, BL>(ah, al, bh, bl, ldb, c, j0, w, out_hi, out_lo, out_run);
        for (; c < n; ++c) dot_steps_avx2<1, XL, BL>(ah, al, bh, bl, ldb, c, j0, w, out_hi, out_lo, out_run);
    }
    for (std::size_t j = m4; j < m; ++j) dot_column_parts<XL, BL>(ah, al, n, bh, bl, ldb, j, out_hi[j], out_lo[j], out_run[j]);
}
inline void dot_rows_avx2(const double* ah, const double* al, std::size_t n, const double* bh, const double* bl, std::size_t ldb,
                          std::size_t m, double* out_hi, double* out_lo, double* out_run) {
    if (al && bl) dot_rows_avx2_parts<true, true>(ah, al, n, bh, bl, ldb, m, out_hi, out_lo, out_run);
    else if (bl) dot_rows_avx2_parts<false, true>(ah, al, n, bh, bl, ldb, m, out_hi, out_lo, out_run);
    else if (al) dot_rows_avx2_parts<true, false>(ah, al, n, bh, bl, ldb, m, out_hi, out_lo, out_run);
    else dot_rows_avx2_parts<false, false>(ah, al, n, bh, bl, ldb, m, out_hi, out_lo, out_run);
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
    if (has_avx2_fma()) {
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


}  // namespace attnref::fast::detail
