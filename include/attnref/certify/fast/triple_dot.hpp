#pragma once
/// \file certify/fast/triple_dot.hpp
/// Dot products of exact doubles as triple-words with a bound (docs/fast-certify.md (10)): for a
/// row x (n doubles) and the m columns of B (n × m doubles, row stride ldb),
///
///   p + r = x_c·b_c (TwoProd, exact), (hi, e1) = TwoSum(hi, p), (mid, e2) = TwoSum(mid, e1),
///   (mid, e3) = TwoSum(mid, r) (all exact), t = RN(e2 + e3), low = RN(low + t),
///   run = RN(run + (|t| + |low|)),
///
/// so that Σ_c x_c b_c = hi + mid + Σ_c(e2 + e3) exactly, and |Σ_c(e2 + e3) − low| ≤
/// u/(1 − u)·Σ_c(|t_c| + |low_c|) (plus 2n·2^-1074 for underflow, covered by `up`'s 2^-999):
///   err = up(sum_up(run, 2n)·2^-53(1 + 2^-52)) ≥ |Σ x·b − (hi + mid + low)|.
/// The bound is about n²u³·Σ|x_c b_c|, far below a 134-bit enclosure of the same sum. The escalation
/// rung uses it for the multi-head key and value projections. The AVX2 kernel performs the same
/// operations on four columns at once (same bits).

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "attnref/certify/fast/cpu.hpp"
#include "attnref/core/double_double.hpp"

namespace attnref::fast::detail {

/// One step of the triple-word dot product on one column (the reference operations).
inline void dot3_step(double x, double b, double& hi, double& mid, double& low, double& run) {
    const double p = x * b;
    const double r = std::fma(x, b, -p);
    const dw::dd s1 = dw::two_sum(hi, p);
    const dw::dd s2 = dw::two_sum(mid, s1.lo);
    const dw::dd s3 = dw::two_sum(s2.hi, r);
    hi = s1.hi;
    mid = s3.hi;
    const double t = s2.lo + s3.lo;
    low = low + t;
    run = run + (std::fabs(t) + std::fabs(low));
}

#ifdef ATTNREF_FAST_AVX2
/// dot3_step for c … c + U − 1 on columns 0 … w − 1 of the block (w a multiple of 4), the
/// accumulators held in registers across the U steps.
template <int U>
__attribute__((target("avx2,fma"), always_inline)) inline void dot3_steps_avx2(const double* x, const double* b, std::size_t ldb,
                                                                               std::size_t w, double* hi, double* mid, double* low,
                                                                               double* run) {
    typedef double v4 __attribute__((vector_size(32)));
    typedef long long v4i __attribute__((vector_size(32)));
    typedef double v4u __attribute__((vector_size(32), aligned(8), may_alias));
    const v4i nosign = {0x7fffffffffffffffLL, 0x7fffffffffffffffLL, 0x7fffffffffffffffLL, 0x7fffffffffffffffLL};
    v4 xv[U];
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) xv[u] = v4{x[u], x[u], x[u], x[u]};
    for (std::size_t j = 0; j < w; j += 4) {
        v4u* hp = reinterpret_cast<v4u*>(hi + j);
        v4u* mp = reinterpret_cast<v4u*>(mid + j);
        v4u* lp = reinterpret_cast<v4u*>(low + j);
        v4u* rp = reinterpret_cast<v4u*>(run + j);
        v4 h = *hp, m = *mp, l = *lp, rn = *rp;
#pragma GCC unroll 4
        for (int u = 0; u < U; ++u) {
            const v4 bv = *reinterpret_cast<const v4u*>(b + static_cast<std::size_t>(u) * ldb + j);
            const v4 p = xv[u] * bv;
            const v4 r = __builtin_ia32_vfmaddpd256(xv[u], bv, -p);
            const v4 s1 = h + p, b1 = s1 - h, e1 = (h - (s1 - b1)) + (p - b1);
            const v4 s2 = m + e1, b2 = s2 - m, e2 = (m - (s2 - b2)) + (e1 - b2);
            const v4 s3 = s2 + r, b3 = s3 - s2, e3 = (s2 - (s3 - b3)) + (r - b3);
            h = s1;
            m = s3;
            const v4 t = e2 + e3;
            l = l + t;
            const v4 at = reinterpret_cast<v4>(reinterpret_cast<v4i>(t) & nosign);
            const v4 al = reinterpret_cast<v4>(reinterpret_cast<v4i>(l) & nosign);
            rn = rn + (at + al);
        }
        *hp = h, *mp = m, *lp = l, *rp = rn;
    }
}

__attribute__((target("avx2,fma"))) inline void dot3_block_avx2(const double* x, std::size_t n, const double* b, std::size_t ldb,
                                                                 std::size_t w, double* hi, double* mid, double* low, double* run) {
    std::size_t c = 0;
    for (; c + 4 <= n; c += 4) dot3_steps_avx2<4>(x + c, b + c * ldb, ldb, w, hi, mid, low, run);
    for (; c < n; ++c) dot3_steps_avx2<1>(x + c, b + c * ldb, ldb, w, hi, mid, low, run);
}
#endif

/// Triple-word dot products of x (n doubles) with the m columns of B (row stride ldb), into
/// hi, mid, low (the value hi + mid + low) and err (the bound above). Columns in blocks of 512
/// (their accumulators stay in L1); each column's operations over c are dot3_step's, in order.
inline void dot3_rows(const double* x, std::size_t n, const double* b, std::size_t ldb, std::size_t m, double* hi, double* mid,
                      double* low, double* err) {
    std::fill(hi, hi + m, 0.0), std::fill(mid, mid + m, 0.0), std::fill(low, low + m, 0.0), std::fill(err, err + m, 0.0);
    std::size_t m4 = 0;
#ifdef ATTNREF_FAST_AVX2
    if (has_avx2_fma()) {
        m4 = m - m % 4;
        constexpr std::size_t block = 512;
        for (std::size_t j0 = 0; j0 < m4; j0 += block) {
            const std::size_t w = std::min(block, m4 - j0);
            dot3_block_avx2(x, n, b + j0, ldb, w, hi + j0, mid + j0, low + j0, err + j0);
        }
    }
#endif
    for (std::size_t j = m4; j < m; ++j)
        for (std::size_t c = 0; c < n; ++c) dot3_step(x[c], b[c * ldb + j], hi[j], mid[j], low[j], err[j]);
    for (std::size_t j = 0; j < m; ++j) err[j] = dw::up(dw::sum_up(err[j], 2 * n) * 0x1.0000000000001p-53);
}

}  // namespace attnref::fast::detail
