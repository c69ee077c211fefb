#pragma once
/// \file bounds/tolerance/parallel_bounds.hpp
/// Owns: the vectorised inner loops of the data-aware and worst-case bound drivers
/// (tolerance/data_aware.hpp, tolerance/worst_case.hpp). Every kernel here runs over independent
/// outputs (lanes are different output elements): each output is computed by exactly the
/// operations, in exactly the order, of the scalar loop it replaces, so vectorising changes no
/// value — and the drivers split their rows over threads (parallel.hpp), each row computed alone,
/// so no value depends on the thread count either.
///
/// With GCC or Clang a lane pack is a vector-extension type of four doubles (IEEE arithmetic per
/// lane, no contraction under -ffp-contract=off); elsewhere a plain array with the same per-lane
/// operations (also chosen by defining ATTNREF_SCALAR_KERNELS). On x86-64 every kernel is compiled
/// twice, for the build's target (SSE2 by default: a pack is two SSE2 registers) and for AVX2 (one
/// register), and the AVX2 copy runs when the processor has AVX2 (asked once, as
/// certify/fast/cpu.hpp asks for the fast certified path). Both copies perform the same per-lane
/// operations in the same order and neither uses FMA, so the choice changes no bit
/// (tests/runtime/compare.test.cpp compares them).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <atomic>
#include <cstring>
#include <vector>

#include "attnref/bounds/tolerance/names.hpp"

namespace attnref::tolerance::simd {

/// Doubles per pack: one AVX register, two SSE2 registers. A fixed count whatever the build
/// targets, so the AVX2 and the default copies of a kernel block their loops alike.
inline constexpr std::size_t lanes = 4;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(ATTNREF_SANITIZE_BUILD) && \
    !defined(ATTNREF_SCALAR_KERNELS)
#define ATTNREF_TOLERANCE_AVX2 1
#endif

/// The row stride (in doubles) of a transposed (c, j) array of n keys read a pack of keys per row c
/// (kernels::key_dot_block, worst_key_block): n rounded up to whole 64-byte lines, then to an odd
/// number of them, so that consecutive rows start in different cache sets (with n = 2048, rows
/// 16 KiB apart all fall in one set of a 4 KiB-periodic L1 and a few of L2, and evict each other).
inline constexpr std::size_t transposed_stride(std::size_t n) {
    const std::size_t lines = (n + 7) / 8;
    return 8 * (lines % 2 ? lines : lines + 1);
}

/// The whole packs of `lanes` columns of a row-major (rows × cols) matrix as panels, element
/// (r, c) of the columns c0 … c0 + lanes − 1 at c0·rows + lanes·r + (c − c0): a tile kernel reads
/// its columns' rows in order (in place they are a row apart, which missed the cache at every row
/// at LLM size). The columns past the last whole pack are left out.
inline std::vector<double> column_panels(const double* m, std::size_t rows, std::size_t cols) {
    const std::size_t whole = cols - cols % lanes;
    std::vector<double> panels(whole * rows);
    for (std::size_t c0 = 0; c0 < whole; c0 += lanes)
        for (std::size_t r = 0; r < rows; ++r)
            for (std::size_t k = 0; k < lanes; ++k) panels[c0 * rows + r * lanes + k] = m[r * cols + c0 + k];
    return panels;
}

/// Whether the kernels may take their AVX2 copy (tests turn it off to compare the two copies).
inline std::atomic<bool>& avx2_allowed() {
    static std::atomic<bool> allowed{true};
    return allowed;
}
/// True when the AVX2 copies are compiled in, the processor has AVX2 (asked once) and they are allowed.
inline bool use_avx2() {
#ifdef ATTNREF_TOLERANCE_AVX2
    static const bool has = [] {
        __builtin_cpu_init();  // idempotent; needed when first asked from a static initialiser
        return __builtin_cpu_supports("avx2") != 0;
    }();
    return has && avx2_allowed().load(std::memory_order_relaxed);
#else
    return false;
#endif
}

#if (defined(__GNUC__) || defined(__clang__)) && !defined(ATTNREF_SCALAR_KERNELS)
typedef double pack __attribute__((vector_size(lanes * sizeof(double))));
typedef std::int64_t mask __attribute__((vector_size(lanes * sizeof(double))));
/// The pack operations are macros (below), not functions: a 32-byte vector passed or returned
/// by value has one ABI with AVX and another without (GCC warns of it), and a pack never crosses a call.
typedef double unaligned_pack __attribute__((vector_size(lanes * sizeof(double)), aligned(alignof(double)), may_alias));
#define ATTNREF_SIMD_LOAD(p) (*reinterpret_cast<const ::attnref::tolerance::simd::unaligned_pack*>(p))
#define ATTNREF_SIMD_STORE(p, v) (*reinterpret_cast<::attnref::tolerance::simd::unaligned_pack*>(p) = (v))
static_assert(lanes == 4, "ATTNREF_SIMD_SPLAT writes four lanes");
#define ATTNREF_SIMD_SPLAT(x) (::attnref::tolerance::simd::pack{(x), (x), (x), (x)})
#define ATTNREF_SIMD_MASK(t) ((::attnref::tolerance::simd::mask)(t))
/// |t| (the sign bit cleared; for −0 this is +0 where abs_d gives −0: equal in every sum below,
/// whose accumulators start at +0).
#define ATTNREF_SIMD_ABS(t) ((::attnref::tolerance::simd::pack)(ATTNREF_SIMD_MASK(t) & ~ATTNREF_SIMD_MASK(ATTNREF_SIMD_SPLAT(-0.0))))
/// t > 0 ? t : 0 per lane.
#define ATTNREF_SIMD_POSITIVE_PART(t) \
    ((::attnref::tolerance::simd::pack)(ATTNREF_SIMD_MASK(t) & ATTNREF_SIMD_MASK((t) > ATTNREF_SIMD_SPLAT(0))))
/// t > 0 ? 0 : |t| per lane (NaN lanes give NaN, as abs_d does).
#define ATTNREF_SIMD_NONPOSITIVE_ABS(t) \
    ((::attnref::tolerance::simd::pack)(ATTNREF_SIMD_MASK(ATTNREF_SIMD_ABS(t)) & ~ATTNREF_SIMD_MASK((t) > ATTNREF_SIMD_SPLAT(0))))
/// t where x ≠ 0 (NaN included), +0 where x is ±0, per lane.
#define ATTNREF_SIMD_WHERE_NONZERO(t, x) \
    ((::attnref::tolerance::simd::pack)(ATTNREF_SIMD_MASK(t) & ATTNREF_SIMD_MASK((x) != ATTNREF_SIMD_SPLAT(0))))
#else
struct pack {
    double v[lanes];
    friend pack operator+(pack a, const pack& b) {
        for (std::size_t k = 0; k < lanes; ++k) a.v[k] += b.v[k];
        return a;
    }
    friend pack operator-(pack a, const pack& b) {
        for (std::size_t k = 0; k < lanes; ++k) a.v[k] -= b.v[k];
        return a;
    }
    friend pack operator*(pack a, const pack& b) {
        for (std::size_t k = 0; k < lanes; ++k) a.v[k] *= b.v[k];
        return a;
    }
    pack& operator+=(const pack& b) { return *this = *this + b; }
};
inline pack load(const double* p) {
    pack r;
    std::memcpy(r.v, p, sizeof r.v);
    return r;
}
inline void store(double* p, pack v) { std::memcpy(p, v.v, sizeof v.v); }
inline pack splat(double x) {
    pack r;
    for (double& v : r.v) v = x;
    return r;
}
inline pack abs(pack t) {
    for (double& x : t.v) x = std::fabs(x);
    return t;
}
inline pack positive_part(pack t) {
    for (double& x : t.v) x = x > 0 ? x : 0.0;
    return t;
}
inline pack nonpositive_abs(pack t) {
    for (double& x : t.v) x = x > 0 ? 0.0 : std::fabs(x);
    return t;
}
inline pack where_nonzero(pack t, const pack& x) {
    for (std::size_t k = 0; k < lanes; ++k) t.v[k] = x.v[k] != 0 ? t.v[k] : 0.0;
    return t;
}
#define ATTNREF_SIMD_LOAD(p) ::attnref::tolerance::simd::load(p)
#define ATTNREF_SIMD_STORE(p, v) ::attnref::tolerance::simd::store(p, v)
#define ATTNREF_SIMD_SPLAT(x) ::attnref::tolerance::simd::splat(x)
#define ATTNREF_SIMD_ABS(t) ::attnref::tolerance::simd::abs(t)
#define ATTNREF_SIMD_POSITIVE_PART(t) ::attnref::tolerance::simd::positive_part(t)
#define ATTNREF_SIMD_NONPOSITIVE_ABS(t) ::attnref::tolerance::simd::nonpositive_abs(t)
#define ATTNREF_SIMD_WHERE_NONZERO(t, x) ::attnref::tolerance::simd::where_nonzero(t, x)
#endif

}  // namespace attnref::tolerance::simd

/// The kernels below: each loop over an output index k (a feature f, a column c, an output l) runs
/// packs of `lanes` consecutive k, then the remaining k one at a time; every output k receives the
/// same operations in the same order either way.
namespace attnref::tolerance::kernels {
/// The kernels' bodies, compiled for the build's target; the dispatching wrappers at the end of
/// this file run them as they are or inlined into an AVX2 function.
namespace generic {

using detail::abs_d;

/// The sums of the projection y = x·W (projection_terms) for two rows x0, x1 and four consecutive
/// features f, over the input features e = 0 … n − 1 in order: with t = x_e·W[e, f], sum += t,
/// sq += t², and |t| added to pos (t > 0) or to neg (otherwise). A product with x_e = 0 is taken
/// as +0, which changes no sum (each starts at +0 and is never −0): the same values as skipping
/// it, and no NaN from 0·∞. The eight sums stay in registers for the whole pass (the rows' terms
/// were once summed e by e into arrays in memory: one load and one store per sum and product).
/// w: W[0, f], rows `stride` apart; out0, out1: rows 0 and 1's sum at [0, 4), sq, pos and neg
/// `out_stride` apart (x1 = x0 and out1 = out0: one row).
inline void projection_tile(const double* x0, const double* x1, const double* w, std::size_t stride, std::size_t n, double* out0, double* out1,
                            std::size_t out_stride) {
    const simd::pack zero = ATTNREF_SIMD_SPLAT(0);
    simd::pack s0 = zero, q0 = zero, p0 = zero, m0 = zero, s1 = zero, q1 = zero, p1 = zero, m1 = zero;
    for (std::size_t e = 0; e < n; ++e) {
        const simd::pack W = ATTNREF_SIMD_LOAD(w + e * stride), X0 = ATTNREF_SIMD_SPLAT(x0[e]), X1 = ATTNREF_SIMD_SPLAT(x1[e]);
        const simd::pack t0 = ATTNREF_SIMD_WHERE_NONZERO(X0 * W, X0), t1 = ATTNREF_SIMD_WHERE_NONZERO(X1 * W, X1);
        s0 += t0, q0 += t0 * t0, p0 += ATTNREF_SIMD_POSITIVE_PART(t0), m0 += ATTNREF_SIMD_NONPOSITIVE_ABS(t0);
        s1 += t1, q1 += t1 * t1, p1 += ATTNREF_SIMD_POSITIVE_PART(t1), m1 += ATTNREF_SIMD_NONPOSITIVE_ABS(t1);
    }
    ATTNREF_SIMD_STORE(out1, s1), ATTNREF_SIMD_STORE(out1 + out_stride, q1), ATTNREF_SIMD_STORE(out1 + 2 * out_stride, p1);
    ATTNREF_SIMD_STORE(out1 + 3 * out_stride, m1);
    ATTNREF_SIMD_STORE(out0, s0), ATTNREF_SIMD_STORE(out0 + out_stride, q0), ATTNREF_SIMD_STORE(out0 + 2 * out_stride, p0);
    ATTNREF_SIMD_STORE(out0 + 3 * out_stride, m0);
}

/// o += p·v, sigma += p·|v| over a value row (attention_terms, first pass).
inline void weighted_value(double p, const double* v, std::size_t n, double* o, double* sigma) {
    std::size_t c = 0;
    const simd::pack pp = ATTNREF_SIMD_SPLAT(p);
    for (; c + simd::lanes <= n; c += simd::lanes) {
        const simd::pack x = ATTNREF_SIMD_LOAD(v + c);
        ATTNREF_SIMD_STORE(o + c, ATTNREF_SIMD_LOAD(o + c) + pp * x);
        ATTNREF_SIMD_STORE(sigma + c, ATTNREF_SIMD_LOAD(sigma + c) + pp * ATTNREF_SIMD_ABS(x));
    }
    for (; c < n; ++c) o[c] += p * v[c], sigma[c] += p * abs_d(v[c]);
}
/// acc += p·k·k, evaluated (p·k)·k (attention_terms: Σ_j p_j k_jc²).
inline void weighted_square(double p, const double* k, std::size_t n, double* acc) {
    std::size_t c = 0;
    const simd::pack pp = ATTNREF_SIMD_SPLAT(p);
    for (; c + simd::lanes <= n; c += simd::lanes) {
        const simd::pack x = ATTNREF_SIMD_LOAD(k + c);
        ATTNREF_SIMD_STORE(acc + c, ATTNREF_SIMD_LOAD(acc + c) + pp * x * x);
    }
    for (; c < n; ++c) acc[c] += p * k[c] * k[c];
}
/// acc += p·d·d with d = v − o, evaluated (p·d)·d (attention_terms: Σ_j p_j (v_jc − o_c)²).
inline void weighted_deviation_square(double p, const double* v, const double* o, std::size_t n, double* acc) {
    std::size_t c = 0;
    const simd::pack pp = ATTNREF_SIMD_SPLAT(p);
    for (; c + simd::lanes <= n; c += simd::lanes) {
        const simd::pack d = ATTNREF_SIMD_LOAD(v + c) - ATTNREF_SIMD_LOAD(o + c);
        ATTNREF_SIMD_STORE(acc + c, ATTNREF_SIMD_LOAD(acc + c) + pp * d * d);
    }
    for (; c < n; ++c) {
        const double d = v[c] - o[c];
        acc[c] += p * d * d;
    }
}

/// One key's contribution to a head-output row's coupled, linear and independent terms
/// (attention_terms, the per-key loop over c), the two_part halves held apart (…_a: the u_acc
/// part, …_s: the storage part). With d = v_c − o_c:
///   cpl += (d·d)·per_key;  lin.acc += (p·|d|)·sh4 + p·|v_c|;  lin.store += p·|v_c| + ((3p)·mag)·|d|;
///   ind += (p·p)·var_v[c];  ind.acc += ((p·p)·v_c)·v_c.
struct key_terms {
    double p, per_key_a, per_key_s, sh4, mag;
};
inline void key_contribution(const key_terms& k, const double* v, const double* o, const double* vv_a, const double* vv_s, std::size_t n,
                             double* cpl_a, double* cpl_s, double* lin_a, double* lin_s, double* ind_a, double* ind_s) {
    const double pp = k.p * k.p, p3m = 3 * k.p * k.mag;
    std::size_t c = 0;
    const simd::pack P = ATTNREF_SIMD_SPLAT(k.p), PKA = ATTNREF_SIMD_SPLAT(k.per_key_a), PKS = ATTNREF_SIMD_SPLAT(k.per_key_s), SH4 = ATTNREF_SIMD_SPLAT(k.sh4),
                     P3M = ATTNREF_SIMD_SPLAT(p3m), PP = ATTNREF_SIMD_SPLAT(pp);
    for (; c + simd::lanes <= n; c += simd::lanes) {
        const simd::pack vj = ATTNREF_SIMD_LOAD(v + c), d = vj - ATTNREF_SIMD_LOAD(o + c), dd = d * d, ad = ATTNREF_SIMD_ABS(d), pv = P * ATTNREF_SIMD_ABS(vj);
        ATTNREF_SIMD_STORE(cpl_a + c, ATTNREF_SIMD_LOAD(cpl_a + c) + dd * PKA);
        ATTNREF_SIMD_STORE(cpl_s + c, ATTNREF_SIMD_LOAD(cpl_s + c) + dd * PKS);
        ATTNREF_SIMD_STORE(lin_a + c, ATTNREF_SIMD_LOAD(lin_a + c) + (P * ad * SH4 + pv));
        ATTNREF_SIMD_STORE(lin_s + c, ATTNREF_SIMD_LOAD(lin_s + c) + (pv + P3M * ad));
        const simd::pack ia = ATTNREF_SIMD_LOAD(ind_a + c) + PP * ATTNREF_SIMD_LOAD(vv_a + c);
        ATTNREF_SIMD_STORE(ind_a + c, ia + PP * vj * vj);
        ATTNREF_SIMD_STORE(ind_s + c, ATTNREF_SIMD_LOAD(ind_s + c) + PP * ATTNREF_SIMD_LOAD(vv_s + c));
    }
    for (; c < n; ++c) {
        const double vjc = v[c], d = vjc - o[c];
        cpl_a[c] += (d * d) * k.per_key_a, cpl_s[c] += (d * d) * k.per_key_s;
        lin_a[c] += k.p * abs_d(d) * k.sh4 + k.p * abs_d(vjc);
        lin_s[c] += k.p * abs_d(vjc) + 3 * k.p * k.mag * abs_d(d);
        ind_a[c] += pp * vv_a[c], ind_s[c] += pp * vv_s[c];
        ind_a[c] += pp * vjc * vjc;
    }
}

/// The terms of one output row through W_o (mha_scales) for four consecutive outputs l, over the
/// head-output elements m = 0 … n − 1 in order: with w = W_o[m, l] and x = hm_m·w,
/// ind += ((G·w)·w)·ti_m; lin += |w|·tl_m; y += x; y2 += x·x; |x| to ypos (x > 0) or yneg;
/// sig += σ_m·|w|. The nine sums stay in registers for the whole pass (they were once summed m by m
/// into arrays in memory: a load and a store per sum and element). w: the four columns as a panel
/// (simd::column_panels); the row's per-m terms in arrays; out: ind_a at [0, 4), then ind_s, lin_a,
/// lin_s, y, y2, ypos, yneg and sig, each `out_stride` further.
struct output_row_terms {
    const double *hm, *ti_a, *ti_s, *tl_a, *tl_s, *sigma;
};
inline void output_tile(const output_row_terms& t, double g, const double* w, std::size_t n, double* out, std::size_t out_stride) {
    const simd::pack zero = ATTNREF_SIMD_SPLAT(0), G = ATTNREF_SIMD_SPLAT(g);
    simd::pack ia = zero, is = zero, la = zero, ls = zero, y = zero, y2 = zero, yp = zero, yn = zero, sg = zero;
    for (std::size_t m = 0; m < n; ++m) {
        const simd::pack wl = ATTNREF_SIMD_LOAD(w + simd::lanes * m), x = ATTNREF_SIMD_SPLAT(t.hm[m]) * wl, gww = G * wl * wl, aw = ATTNREF_SIMD_ABS(wl);
        ia += gww * ATTNREF_SIMD_SPLAT(t.ti_a[m]);
        is += gww * ATTNREF_SIMD_SPLAT(t.ti_s[m]);
        la += aw * ATTNREF_SIMD_SPLAT(t.tl_a[m]);
        ls += aw * ATTNREF_SIMD_SPLAT(t.tl_s[m]);
        y += x;
        y2 += x * x;
        yp += ATTNREF_SIMD_POSITIVE_PART(x);
        yn += ATTNREF_SIMD_NONPOSITIVE_ABS(x);
        sg += ATTNREF_SIMD_SPLAT(t.sigma[m]) * aw;
    }
    ATTNREF_SIMD_STORE(out, ia), ATTNREF_SIMD_STORE(out + out_stride, is), ATTNREF_SIMD_STORE(out + 2 * out_stride, la);
    ATTNREF_SIMD_STORE(out + 3 * out_stride, ls), ATTNREF_SIMD_STORE(out + 4 * out_stride, y), ATTNREF_SIMD_STORE(out + 5 * out_stride, y2);
    ATTNREF_SIMD_STORE(out + 6 * out_stride, yp), ATTNREF_SIMD_STORE(out + 7 * out_stride, yn), ATTNREF_SIMD_STORE(out + 8 * out_stride, sg);
}

/// acc += a·x and acc2 += b·x over a row (a, b scalars; worst_case's t0 += σ·|W_o|, t1 += (L·σ)·|W_o|,
/// and a single acc += a·x when acc2 is null).
inline void scaled_add2(double a, double b, const double* x, std::size_t n, double* acc, double* acc2) {
    std::size_t l = 0;
    const simd::pack A = ATTNREF_SIMD_SPLAT(a), B = ATTNREF_SIMD_SPLAT(b);
    if (acc2) {
        for (; l + simd::lanes <= n; l += simd::lanes) {
            const simd::pack xl = ATTNREF_SIMD_LOAD(x + l);
            ATTNREF_SIMD_STORE(acc + l, ATTNREF_SIMD_LOAD(acc + l) + A * xl);
            ATTNREF_SIMD_STORE(acc2 + l, ATTNREF_SIMD_LOAD(acc2 + l) + B * xl);
        }
        for (; l < n; ++l) acc[l] += a * x[l], acc2[l] += b * x[l];
    } else {
        for (; l + simd::lanes <= n; l += simd::lanes) ATTNREF_SIMD_STORE(acc + l, ATTNREF_SIMD_LOAD(acc + l) + A * ATTNREF_SIMD_LOAD(x + l));
        for (; l < n; ++l) acc[l] += a * x[l];
    }
}


/// The per-key dot-product terms of attention_terms for `lanes` consecutive keys at once (lane =
/// key; each lane sums over c = 0 … dk − 1 in order, as the scalar loop does for its key). kT,
/// vk_a, vk_s: K and Var(K)'s halves transposed, element (c, j) at c·stride + j, offset to the
/// block's first key. With x = q_c·k_jc:
///   qk2 += x²; qka += |x|; |x| to qkp (x > 0) or qkn; var_k += (q_c·q_c)·Var(k_jc); var_q += (k_jc·k_jc)·Var(q_c).
struct key_dots {
    double qk2[simd::lanes], qka[simd::lanes], qkp[simd::lanes], qkn[simd::lanes], vk_a[simd::lanes], vk_s[simd::lanes], vq_a[simd::lanes],
        vq_s[simd::lanes];
};
inline void key_dot_block(const double* q, const double* vq_a, const double* vq_s, const double* kT, const double* vk_a, const double* vk_s,
                          std::size_t stride, std::size_t dk, key_dots& r) {
    simd::pack qk2 = ATTNREF_SIMD_SPLAT(0), qka = qk2, qkp = qk2, qkn = qk2, ka = qk2, ks = qk2, qa = qk2, qs = qk2;
    for (std::size_t c = 0; c < dk; ++c) {
        const simd::pack k = ATTNREF_SIMD_LOAD(kT + c * stride), x = k * ATTNREF_SIMD_SPLAT(q[c]);
        qk2 += x * x, qka += ATTNREF_SIMD_ABS(x);
        qkp += ATTNREF_SIMD_POSITIVE_PART(x), qkn += ATTNREF_SIMD_NONPOSITIVE_ABS(x);
        const simd::pack q2 = ATTNREF_SIMD_SPLAT(q[c] * q[c]);
        ka += q2 * ATTNREF_SIMD_LOAD(vk_a + c * stride), ks += q2 * ATTNREF_SIMD_LOAD(vk_s + c * stride);
        const simd::pack k2 = k * k;
        qa += k2 * ATTNREF_SIMD_SPLAT(vq_a[c]), qs += k2 * ATTNREF_SIMD_SPLAT(vq_s[c]);
    }
    ATTNREF_SIMD_STORE(r.qk2, qk2), ATTNREF_SIMD_STORE(r.qka, qka), ATTNREF_SIMD_STORE(r.qkp, qkp), ATTNREF_SIMD_STORE(r.qkn, qkn);
    ATTNREF_SIMD_STORE(r.vk_a, ka), ATTNREF_SIMD_STORE(r.vk_s, ks), ATTNREF_SIMD_STORE(r.vq_a, qa), ATTNREF_SIMD_STORE(r.vq_s, qs);
}

/// The worst-case bound's per-key sums (detail::head_scales) for `lanes` consecutive keys at once
/// (lane = key; each lane sums over c = 0 … dk − 1 in order, as the scalar loop does for its key).
/// kT, ek_a, ek_s: |K| and its underflow coefficients' halves transposed, element (c, j) at
/// c·stride + j, offset to the block's first key; q, eq_a, eq_s: the query row and its halves.
///   dot += q_c·k_jc;  la += s·(eq_a,c·k_jc + q_c·ek_a,jc);  ls += s·(eq_s,c·k_jc + q_c·ek_s,jc)
/// (la starts at la0, ls at 0; ek_a null: no underflow sums).
struct worst_key_dots {
    double dot[simd::lanes], la[simd::lanes], ls[simd::lanes];
};
inline void worst_key_block(const double* q, const double* eq_a, const double* eq_s, const double* kT, const double* ek_a, const double* ek_s,
                            std::size_t stride, std::size_t dk, double s, double la0, worst_key_dots& r) {
    simd::pack dot = ATTNREF_SIMD_SPLAT(0);
    if (!ek_a) {
        for (std::size_t c = 0; c < dk; ++c) dot += ATTNREF_SIMD_SPLAT(q[c]) * ATTNREF_SIMD_LOAD(kT + c * stride);
        ATTNREF_SIMD_STORE(r.dot, dot);
        return;
    }
    simd::pack la = ATTNREF_SIMD_SPLAT(la0), ls = ATTNREF_SIMD_SPLAT(0);
    const simd::pack S = ATTNREF_SIMD_SPLAT(s);
    for (std::size_t c = 0; c < dk; ++c) {
        const simd::pack k = ATTNREF_SIMD_LOAD(kT + c * stride), qc = ATTNREF_SIMD_SPLAT(q[c]);
        dot += qc * k;
        la += S * (ATTNREF_SIMD_SPLAT(eq_a[c]) * k + qc * ATTNREF_SIMD_LOAD(ek_a + c * stride));
        ls += S * (ATTNREF_SIMD_SPLAT(eq_s[c]) * k + qc * ATTNREF_SIMD_LOAD(ek_s + c * stride));
    }
    ATTNREF_SIMD_STORE(r.dot, dot), ATTNREF_SIMD_STORE(r.la, la), ATTNREF_SIMD_STORE(r.ls, ls);
}

/// One key's contribution to a head-output row's underflow coefficients (detail::head_scales,
/// eq. 26), lanes over the features c: with a = |p_j|, v = |v_jc|, w = a·(v + σ_c),
///   ta += (w·la + a·ev_a,c) + 4·v;  ts += w·ls + a·ev_s,c;  tw += v (P_j stored).
inline void worst_underflow_key(double a, double la, double ls, const double* v, const double* ev_a, const double* ev_s, const double* sigma,
                                std::size_t n, double* ta, double* ts, double* tw) {
    std::size_t c = 0;
    const simd::pack A = ATTNREF_SIMD_SPLAT(a), LA = ATTNREF_SIMD_SPLAT(la), LS = ATTNREF_SIMD_SPLAT(ls), FOUR = ATTNREF_SIMD_SPLAT(4);
    for (; c + simd::lanes <= n; c += simd::lanes) {
        const simd::pack va = ATTNREF_SIMD_LOAD(v + c), w = A * (va + ATTNREF_SIMD_LOAD(sigma + c));
        ATTNREF_SIMD_STORE(ta + c, ATTNREF_SIMD_LOAD(ta + c) + ((w * LA + A * ATTNREF_SIMD_LOAD(ev_a + c)) + FOUR * va));
        ATTNREF_SIMD_STORE(ts + c, ATTNREF_SIMD_LOAD(ts + c) + (w * LS + A * ATTNREF_SIMD_LOAD(ev_s + c)));
        ATTNREF_SIMD_STORE(tw + c, ATTNREF_SIMD_LOAD(tw + c) + va);
    }
    for (; c < n; ++c) {
        const double va = v[c], w = a * (va + sigma[c]);
        ta[c] += w * la + a * ev_a[c] + 4 * va;
        ts[c] += w * ls + a * ev_s[c];
        tw[c] += va;
    }
}

/// worst_output_projection for one output row and four consecutive outputs l, over the head-output
/// elements m = 0 … n − 1 in order (mha_worst_case_scales): per output exactly the operations, in
/// the order, of worst_output_projection applied for m = 0, 1, … (its t0, t1 terms of an m with
/// s_m = 0 taken as +0, which changes no sum: they start at +0), with the five sums in registers
/// for the whole pass. w: the four columns of |W_o| as a panel (simd::column_panels); ua starts at
/// ua0, us at us0, the others at +0; out: ua at [0, 4), then us, uw, t0 and t1, each `out_stride`
/// further.
struct worst_output_row_terms {
    const double *s, *ls, *hu_a, *hu_s, *hu_w;
};
inline void worst_output_tile(const worst_output_row_terms& t, double ua0, double us0, const double* w, std::size_t n, double* out,
                              std::size_t out_stride) {
    const simd::pack zero = ATTNREF_SIMD_SPLAT(0);
    simd::pack ua = ATTNREF_SIMD_SPLAT(ua0), us = ATTNREF_SIMD_SPLAT(us0), uw = zero, t0 = zero, t1 = zero;
    for (std::size_t m = 0; m < n; ++m) {
        const simd::pack wl = ATTNREF_SIMD_LOAD(w + simd::lanes * m), S = ATTNREF_SIMD_SPLAT(t.s[m]);
        ua += wl * ATTNREF_SIMD_SPLAT(t.hu_a[m]);
        us += (wl * ATTNREF_SIMD_SPLAT(t.hu_s[m]) + S);
        uw += wl * ATTNREF_SIMD_SPLAT(t.hu_w[m]);
        t0 += ATTNREF_SIMD_WHERE_NONZERO(S * wl, S);
        t1 += ATTNREF_SIMD_WHERE_NONZERO(ATTNREF_SIMD_SPLAT(t.ls[m]) * wl, S);
    }
    ATTNREF_SIMD_STORE(out, ua), ATTNREF_SIMD_STORE(out + out_stride, us), ATTNREF_SIMD_STORE(out + 2 * out_stride, uw);
    ATTNREF_SIMD_STORE(out + 3 * out_stride, t0), ATTNREF_SIMD_STORE(out + 4 * out_stride, t1);
}

/// One head-output element (σ = s, L·σ = ls, underflow hu_a, hu_s, hu_w) through a row of |W_o|
/// (mha_worst_case_scales), lanes over the outputs l with w = |W_o[m, l]|:
///   ua += w·hu_a;  us += w·hu_s + s;  uw += w·hu_w;  and, when s ≠ 0, t0 += s·w, t1 += ls·w.
inline void worst_output_projection(double s, double ls, double hu_a, double hu_s, double hu_w, const double* w, std::size_t n, double* ua,
                                    double* us, double* uw, double* t0, double* t1) {
    std::size_t l = 0;
    const simd::pack S = ATTNREF_SIMD_SPLAT(s), LS = ATTNREF_SIMD_SPLAT(ls), HA = ATTNREF_SIMD_SPLAT(hu_a), HS = ATTNREF_SIMD_SPLAT(hu_s), HW = ATTNREF_SIMD_SPLAT(hu_w);
    for (; l + simd::lanes <= n; l += simd::lanes) {
        const simd::pack wl = ATTNREF_SIMD_LOAD(w + l);
        ATTNREF_SIMD_STORE(ua + l, ATTNREF_SIMD_LOAD(ua + l) + wl * HA);
        ATTNREF_SIMD_STORE(us + l, ATTNREF_SIMD_LOAD(us + l) + (wl * HS + S));
        ATTNREF_SIMD_STORE(uw + l, ATTNREF_SIMD_LOAD(uw + l) + wl * HW);
    }
    for (; l < n; ++l) ua[l] += w[l] * hu_a, us[l] += w[l] * hu_s + s, uw[l] += w[l] * hu_w;
    if (s == 0) return;
    for (l = 0; l + simd::lanes <= n; l += simd::lanes) {
        const simd::pack wl = ATTNREF_SIMD_LOAD(w + l);
        ATTNREF_SIMD_STORE(t0 + l, ATTNREF_SIMD_LOAD(t0 + l) + S * wl);
        ATTNREF_SIMD_STORE(t1 + l, ATTNREF_SIMD_LOAD(t1 + l) + LS * wl);
    }
    for (; l < n; ++l) t0[l] += s * w[l], t1[l] += ls * w[l];
}

/// (B18)'s per-key sums of a query row (backward_probabilistic.hpp, phase A) for `lanes` consecutive
/// keys at once (lane = key l; each lane sums over c = 0 … n − 1 in order, as a scalar loop would for
/// its key). vT, aT, sT, swT: a head input's value, magnitude |value| + ρ·mag, sd and sdw transposed,
/// element (c, l) at c·stride + l, offset to the block's first key; x, xa, sx, sxw: the row's value,
/// magnitude, sd and sdw. With k = vT, ka = aT, ks = sT, ksw = swT:
///   dot += x_c·k;  mag += xa_c·ka;  mag2 += ((xa_c·ka)·xa_c)·ka;  a += ((ka·ka)·sx_c)·sx_c;
///   b += ((xa_c·xa_c)·ks)·ks;  aw += ((ka·ka)·sxw_c)·sxw_c;  bw += ((xa_c·xa_c)·ksw)·ksw.
struct gradient_key_dots {
    double dot[simd::lanes], mag[simd::lanes], mag2[simd::lanes], a[simd::lanes], b[simd::lanes], aw[simd::lanes], bw[simd::lanes];
};
inline void gradient_key_block(const double* x, const double* xa, const double* sx, const double* sxw, const double* vT, const double* aT,
                               const double* sT, const double* swT, std::size_t stride, std::size_t n, gradient_key_dots& r) {
    simd::pack dot = ATTNREF_SIMD_SPLAT(0), mag = dot, mag2 = dot, a = dot, b = dot, aw = dot, bw = dot;
    for (std::size_t c = 0; c < n; ++c) {
        const simd::pack k = ATTNREF_SIMD_LOAD(vT + c * stride), ka = ATTNREF_SIMD_LOAD(aT + c * stride), ks = ATTNREF_SIMD_LOAD(sT + c * stride),
                         ksw = ATTNREF_SIMD_LOAD(swT + c * stride);
        const simd::pack X = ATTNREF_SIMD_SPLAT(x[c]), XA = ATTNREF_SIMD_SPLAT(xa[c]), SX = ATTNREF_SIMD_SPLAT(sx[c]), SXW = ATTNREF_SIMD_SPLAT(sxw[c]);
        dot += X * k;
        mag += XA * ka;
        mag2 += XA * ka * XA * ka;
        a += ka * ka * SX * SX;
        b += XA * XA * ks * ks;
        aw += ka * ka * SXW * SXW;
        bw += XA * XA * ksw * ksw;
    }
    ATTNREF_SIMD_STORE(r.dot, dot), ATTNREF_SIMD_STORE(r.mag, mag), ATTNREF_SIMD_STORE(r.mag2, mag2), ATTNREF_SIMD_STORE(r.a, a);
    ATTNREF_SIMD_STORE(r.b, b), ATTNREF_SIMD_STORE(r.aw, aw), ATTNREF_SIMD_STORE(r.bw, bw);
}

}  // namespace generic

using generic::gradient_key_dots;
using generic::key_dots;
using generic::key_terms;
using generic::output_row_terms;
using generic::worst_key_dots;
using generic::worst_output_row_terms;

/// kernels::name(params) runs generic::name, inlined whole (flatten) into an AVX2 function when
/// simd::use_avx2(): the same operations, each lane's in the same order, in wider registers.
#ifdef ATTNREF_TOLERANCE_AVX2
#define ATTNREF_TOLERANCE_KERNEL(name, params, args)                               \
    namespace avx2 {                                                               \
    __attribute__((target("avx2"), flatten)) inline void name params { generic::name args; } \
    }                                                                              \
    inline void name params {                                                      \
        if (simd::use_avx2()) return avx2::name args;                              \
        generic::name args;                                                        \
    }
#else
#define ATTNREF_TOLERANCE_KERNEL(name, params, args) \
    inline void name params { generic::name args; }
#endif

ATTNREF_TOLERANCE_KERNEL(projection_tile,
                         (const double* x0, const double* x1, const double* w, std::size_t stride, std::size_t n, double* out0, double* out1,
                          std::size_t out_stride),
                         (x0, x1, w, stride, n, out0, out1, out_stride))
ATTNREF_TOLERANCE_KERNEL(weighted_value, (double p, const double* v, std::size_t n, double* o, double* sigma), (p, v, n, o, sigma))
ATTNREF_TOLERANCE_KERNEL(weighted_square, (double p, const double* k, std::size_t n, double* acc), (p, k, n, acc))
ATTNREF_TOLERANCE_KERNEL(weighted_deviation_square, (double p, const double* v, const double* o, std::size_t n, double* acc),
                         (p, v, o, n, acc))
ATTNREF_TOLERANCE_KERNEL(key_contribution,
                         (const key_terms& k, const double* v, const double* o, const double* vv_a, const double* vv_s, std::size_t n,
                          double* cpl_a, double* cpl_s, double* lin_a, double* lin_s, double* ind_a, double* ind_s),
                         (k, v, o, vv_a, vv_s, n, cpl_a, cpl_s, lin_a, lin_s, ind_a, ind_s))
ATTNREF_TOLERANCE_KERNEL(output_tile,
                         (const output_row_terms& t, double g, const double* w, std::size_t n, double* out, std::size_t out_stride),
                         (t, g, w, n, out, out_stride))
ATTNREF_TOLERANCE_KERNEL(scaled_add2, (double a, double b, const double* x, std::size_t n, double* acc, double* acc2),
                         (a, b, x, n, acc, acc2))
ATTNREF_TOLERANCE_KERNEL(key_dot_block,
                         (const double* q, const double* vq_a, const double* vq_s, const double* kT, const double* vk_a,
                          const double* vk_s, std::size_t stride, std::size_t dk, key_dots& r),
                         (q, vq_a, vq_s, kT, vk_a, vk_s, stride, dk, r))
ATTNREF_TOLERANCE_KERNEL(worst_key_block,
                         (const double* q, const double* eq_a, const double* eq_s, const double* kT, const double* ek_a,
                          const double* ek_s, std::size_t stride, std::size_t dk, double s, double la0, worst_key_dots& r),
                         (q, eq_a, eq_s, kT, ek_a, ek_s, stride, dk, s, la0, r))
ATTNREF_TOLERANCE_KERNEL(worst_underflow_key,
                         (double a, double la, double ls, const double* v, const double* ev_a, const double* ev_s, const double* sigma,
                          std::size_t n, double* ta, double* ts, double* tw),
                         (a, la, ls, v, ev_a, ev_s, sigma, n, ta, ts, tw))
ATTNREF_TOLERANCE_KERNEL(worst_output_tile,
                         (const worst_output_row_terms& t, double ua0, double us0, const double* w, std::size_t n, double* out,
                          std::size_t out_stride),
                         (t, ua0, us0, w, n, out, out_stride))
ATTNREF_TOLERANCE_KERNEL(worst_output_projection,
                         (double s, double ls, double hu_a, double hu_s, double hu_w, const double* w, std::size_t n, double* ua,
                          double* us, double* uw, double* t0, double* t1),
                         (s, ls, hu_a, hu_s, hu_w, w, n, ua, us, uw, t0, t1))
ATTNREF_TOLERANCE_KERNEL(gradient_key_block,
                         (const double* x, const double* xa, const double* sx, const double* sxw, const double* vT, const double* aT,
                          const double* sT, const double* swT, std::size_t stride, std::size_t n, gradient_key_dots& r),
                         (x, xa, sx, sxw, vT, aT, sT, swT, stride, n, r))
#undef ATTNREF_TOLERANCE_KERNEL

}  // namespace attnref::tolerance::kernels

#undef ATTNREF_SIMD_LOAD
#undef ATTNREF_SIMD_STORE
#undef ATTNREF_SIMD_SPLAT
#undef ATTNREF_SIMD_MASK
#undef ATTNREF_SIMD_ABS
#undef ATTNREF_SIMD_POSITIVE_PART
#undef ATTNREF_SIMD_NONPOSITIVE_ABS
#undef ATTNREF_SIMD_WHERE_NONZERO
