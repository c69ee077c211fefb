#pragma once
/// \file bounds/tolerance/parallel_bounds.hpp
/// Owns: the vectorised inner loops of the data-aware and worst-case bound drivers
/// (tolerance/data_aware.hpp, tolerance/worst_case.hpp). Every kernel here runs over independent
/// outputs (lanes are different output elements): each output is computed by exactly the
/// operations, in exactly the order, of the scalar loop it replaces, so vectorising changes no
/// value — and the drivers split their rows over threads (parallel.hpp), each row computed alone,
/// so no value depends on the thread count either.
///
/// With GCC or Clang a lane pack is a vector-extension type (packed SSE2/AVX instructions, IEEE
/// arithmetic per lane, no contraction under -ffp-contract=off); elsewhere a plain array with the
/// same per-lane operations (also chosen by defining ATTNREF_SCALAR_KERNELS).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attnref/bounds/tolerance/names.hpp"

namespace attnref::tolerance::simd {

#if (defined(__GNUC__) || defined(__clang__)) && defined(__AVX__)
inline constexpr std::size_t lanes = 4;  // one AVX register
#else
inline constexpr std::size_t lanes = 2;  // one SSE2 register (no ABI change for inline helpers)
#endif

#if (defined(__GNUC__) || defined(__clang__)) && !defined(ATTNREF_SCALAR_KERNELS)
typedef double pack __attribute__((vector_size(lanes * sizeof(double))));
typedef std::int64_t mask __attribute__((vector_size(lanes * sizeof(double))));
inline pack load(const double* p) {
    pack r;
    std::memcpy(&r, p, sizeof r);
    return r;
}
inline void store(double* p, pack v) { std::memcpy(p, &v, sizeof v); }
inline pack splat(double x) {
    pack r{};
    for (std::size_t k = 0; k < lanes; ++k) r[k] = x;
    return r;
}
/// |t| (the sign bit cleared; for −0 this is +0 where abs_d gives −0: equal in every sum below,
/// whose accumulators start at +0).
inline pack abs(pack t) { return (pack)((mask)t & ~(mask)splat(-0.0)); }
/// t > 0 ? t : 0 per lane.
inline pack positive_part(pack t) { return (pack)((mask)t & (mask)(t > splat(0))); }
/// t > 0 ? 0 : |t| per lane (NaN lanes give NaN, as abs_d does).
inline pack nonpositive_abs(pack t) { return (pack)(((mask)t & ~(mask)splat(-0.0)) & ~(mask)(t > splat(0))); }
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
#endif

}  // namespace attnref::tolerance::simd

/// The kernels below: each loop over an output index k (a feature f, a column c, an output l) runs
/// packs of `lanes` consecutive k, then the remaining k one at a time; every output k receives the
/// same operations in the same order either way.
namespace attnref::tolerance::kernels {

using detail::abs_d;

/// One input feature's contribution to a row of the projection y = x·W (projection_terms):
/// t = x_e·W[e, f]; sum += t, sq += t², and |t| added to pos (t > 0) or to neg (otherwise).
inline void projection_products(double xe, const double* w, std::size_t n, double* sum, double* sq, double* pos, double* neg) {
    std::size_t f = 0;
    const simd::pack x = simd::splat(xe);
    for (; f + simd::lanes <= n; f += simd::lanes) {
        const simd::pack t = x * simd::load(w + f);
        simd::store(sum + f, simd::load(sum + f) + t);
        simd::store(sq + f, simd::load(sq + f) + t * t);
        simd::store(pos + f, simd::load(pos + f) + simd::positive_part(t));
        simd::store(neg + f, simd::load(neg + f) + simd::nonpositive_abs(t));
    }
    for (; f < n; ++f) {
        const double t = xe * w[f];
        sum[f] += t, sq[f] += t * t;
        (t > 0 ? pos[f] : neg[f]) += abs_d(t);
    }
}

/// o += p·v, sigma += p·|v| over a value row (attention_terms, first pass).
inline void weighted_value(double p, const double* v, std::size_t n, double* o, double* sigma) {
    std::size_t c = 0;
    const simd::pack pp = simd::splat(p);
    for (; c + simd::lanes <= n; c += simd::lanes) {
        const simd::pack x = simd::load(v + c);
        simd::store(o + c, simd::load(o + c) + pp * x);
        simd::store(sigma + c, simd::load(sigma + c) + pp * simd::abs(x));
    }
    for (; c < n; ++c) o[c] += p * v[c], sigma[c] += p * abs_d(v[c]);
}
/// acc += p·k·k, evaluated (p·k)·k (attention_terms: Σ_j p_j k_jc²).
inline void weighted_square(double p, const double* k, std::size_t n, double* acc) {
    std::size_t c = 0;
    const simd::pack pp = simd::splat(p);
    for (; c + simd::lanes <= n; c += simd::lanes) {
        const simd::pack x = simd::load(k + c);
        simd::store(acc + c, simd::load(acc + c) + pp * x * x);
    }
    for (; c < n; ++c) acc[c] += p * k[c] * k[c];
}
/// acc += p·d·d with d = v − o, evaluated (p·d)·d (attention_terms: Σ_j p_j (v_jc − o_c)²).
inline void weighted_deviation_square(double p, const double* v, const double* o, std::size_t n, double* acc) {
    std::size_t c = 0;
    const simd::pack pp = simd::splat(p);
    for (; c + simd::lanes <= n; c += simd::lanes) {
        const simd::pack d = simd::load(v + c) - simd::load(o + c);
        simd::store(acc + c, simd::load(acc + c) + pp * d * d);
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
    const simd::pack P = simd::splat(k.p), PKA = simd::splat(k.per_key_a), PKS = simd::splat(k.per_key_s), SH4 = simd::splat(k.sh4),
                     P3M = simd::splat(p3m), PP = simd::splat(pp);
    for (; c + simd::lanes <= n; c += simd::lanes) {
        const simd::pack vj = simd::load(v + c), d = vj - simd::load(o + c), dd = d * d, ad = simd::abs(d), pv = P * simd::abs(vj);
        simd::store(cpl_a + c, simd::load(cpl_a + c) + dd * PKA);
        simd::store(cpl_s + c, simd::load(cpl_s + c) + dd * PKS);
        simd::store(lin_a + c, simd::load(lin_a + c) + (P * ad * SH4 + pv));
        simd::store(lin_s + c, simd::load(lin_s + c) + (pv + P3M * ad));
        const simd::pack ia = simd::load(ind_a + c) + PP * simd::load(vv_a + c);
        simd::store(ind_a + c, ia + PP * vj * vj);
        simd::store(ind_s + c, simd::load(ind_s + c) + PP * simd::load(vv_s + c));
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

/// One head-output element's contribution (value hm, terms ti, tl) to a row of W_o's outputs
/// (mha_scales): with w = W_o[m, l] and x = hm·w,
///   ind += ((G·w)·w)·ti;  lin += |w|·tl;  y += x;  y2 += x·x;  |x| to ypos (x > 0) or yneg.
struct head_element {
    double hm, G, ti_a, ti_s, tl_a, tl_s;
};
inline void output_projection(const head_element& h, const double* w, std::size_t n, double* ind_a, double* ind_s, double* lin_a,
                              double* lin_s, double* y, double* y2, double* ypos, double* yneg) {
    std::size_t l = 0;
    const simd::pack HM = simd::splat(h.hm), G = simd::splat(h.G), TIA = simd::splat(h.ti_a), TIS = simd::splat(h.ti_s),
                     TLA = simd::splat(h.tl_a), TLS = simd::splat(h.tl_s);
    for (; l + simd::lanes <= n; l += simd::lanes) {
        const simd::pack wl = simd::load(w + l), x = HM * wl, gww = G * wl * wl, aw = simd::abs(wl);
        simd::store(ind_a + l, simd::load(ind_a + l) + gww * TIA);
        simd::store(ind_s + l, simd::load(ind_s + l) + gww * TIS);
        simd::store(lin_a + l, simd::load(lin_a + l) + aw * TLA);
        simd::store(lin_s + l, simd::load(lin_s + l) + aw * TLS);
        simd::store(y + l, simd::load(y + l) + x);
        simd::store(y2 + l, simd::load(y2 + l) + x * x);
        simd::store(ypos + l, simd::load(ypos + l) + simd::positive_part(x));
        simd::store(yneg + l, simd::load(yneg + l) + simd::nonpositive_abs(x));
    }
    for (; l < n; ++l) {
        const double wml = w[l], x = h.hm * wml, gww = h.G * wml * wml;
        ind_a[l] += gww * h.ti_a, ind_s[l] += gww * h.ti_s;
        lin_a[l] += abs_d(wml) * h.tl_a, lin_s[l] += abs_d(wml) * h.tl_s;
        y[l] += x, y2[l] += x * x;
        (x > 0 ? ypos[l] : yneg[l]) += abs_d(x);
    }
}

/// acc += a·x and acc2 += b·x over a row (a, b scalars; worst_case's t0 += σ·|W_o|, t1 += (L·σ)·|W_o|,
/// and a single acc += a·x when acc2 is null).
inline void scaled_add2(double a, double b, const double* x, std::size_t n, double* acc, double* acc2) {
    std::size_t l = 0;
    const simd::pack A = simd::splat(a), B = simd::splat(b);
    if (acc2) {
        for (; l + simd::lanes <= n; l += simd::lanes) {
            const simd::pack xl = simd::load(x + l);
            simd::store(acc + l, simd::load(acc + l) + A * xl);
            simd::store(acc2 + l, simd::load(acc2 + l) + B * xl);
        }
        for (; l < n; ++l) acc[l] += a * x[l], acc2[l] += b * x[l];
    } else {
        for (; l + simd::lanes <= n; l += simd::lanes) simd::store(acc + l, simd::load(acc + l) + A * simd::load(x + l));
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
    simd::pack qk2 = simd::splat(0), qka = qk2, qkp = qk2, qkn = qk2, ka = qk2, ks = qk2, qa = qk2, qs = qk2;
    for (std::size_t c = 0; c < dk; ++c) {
        const simd::pack k = simd::load(kT + c * stride), x = k * simd::splat(q[c]);
        qk2 += x * x, qka += simd::abs(x);
        qkp += simd::positive_part(x), qkn += simd::nonpositive_abs(x);
        const simd::pack q2 = simd::splat(q[c] * q[c]);
        ka += q2 * simd::load(vk_a + c * stride), ks += q2 * simd::load(vk_s + c * stride);
        const simd::pack k2 = k * k;
        qa += k2 * simd::splat(vq_a[c]), qs += k2 * simd::splat(vq_s[c]);
    }
    simd::store(r.qk2, qk2), simd::store(r.qka, qka), simd::store(r.qkp, qkp), simd::store(r.qkn, qkn);
    simd::store(r.vk_a, ka), simd::store(r.vk_s, ks), simd::store(r.vq_a, qa), simd::store(r.vq_s, qs);
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
    simd::pack dot = simd::splat(0);
    if (!ek_a) {
        for (std::size_t c = 0; c < dk; ++c) dot += simd::splat(q[c]) * simd::load(kT + c * stride);
        simd::store(r.dot, dot);
        return;
    }
    simd::pack la = simd::splat(la0), ls = simd::splat(0);
    const simd::pack S = simd::splat(s);
    for (std::size_t c = 0; c < dk; ++c) {
        const simd::pack k = simd::load(kT + c * stride), qc = simd::splat(q[c]);
        dot += qc * k;
        la += S * (simd::splat(eq_a[c]) * k + qc * simd::load(ek_a + c * stride));
        ls += S * (simd::splat(eq_s[c]) * k + qc * simd::load(ek_s + c * stride));
    }
    simd::store(r.dot, dot), simd::store(r.la, la), simd::store(r.ls, ls);
}

/// One key's contribution to a head-output row's underflow coefficients (detail::head_scales,
/// eq. 26), lanes over the features c: with a = |p_j|, v = |v_jc|, w = a·(v + σ_c),
///   ta += (w·la + a·ev_a,c) + 4·v;  ts += w·ls + a·ev_s,c;  tw += v (P_j stored).
inline void worst_underflow_key(double a, double la, double ls, const double* v, const double* ev_a, const double* ev_s, const double* sigma,
                                std::size_t n, double* ta, double* ts, double* tw) {
    std::size_t c = 0;
    const simd::pack A = simd::splat(a), LA = simd::splat(la), LS = simd::splat(ls), FOUR = simd::splat(4);
    for (; c + simd::lanes <= n; c += simd::lanes) {
        const simd::pack va = simd::load(v + c), w = A * (va + simd::load(sigma + c));
        simd::store(ta + c, simd::load(ta + c) + ((w * LA + A * simd::load(ev_a + c)) + FOUR * va));
        simd::store(ts + c, simd::load(ts + c) + (w * LS + A * simd::load(ev_s + c)));
        simd::store(tw + c, simd::load(tw + c) + va);
    }
    for (; c < n; ++c) {
        const double va = v[c], w = a * (va + sigma[c]);
        ta[c] += w * la + a * ev_a[c] + 4 * va;
        ts[c] += w * ls + a * ev_s[c];
        tw[c] += va;
    }
}

/// One head-output element (σ = s, L·σ = ls, underflow hu_a, hu_s, hu_w) through a row of |W_o|
/// (mha_worst_case_scales), lanes over the outputs l with w = |W_o[m, l]|:
///   ua += w·hu_a;  us += w·hu_s + s;  uw += w·hu_w;  and, when s ≠ 0, t0 += s·w, t1 += ls·w.
inline void worst_output_projection(double s, double ls, double hu_a, double hu_s, double hu_w, const double* w, std::size_t n, double* ua,
                                    double* us, double* uw, double* t0, double* t1) {
    std::size_t l = 0;
    const simd::pack S = simd::splat(s), LS = simd::splat(ls), HA = simd::splat(hu_a), HS = simd::splat(hu_s), HW = simd::splat(hu_w);
    for (; l + simd::lanes <= n; l += simd::lanes) {
        const simd::pack wl = simd::load(w + l);
        simd::store(ua + l, simd::load(ua + l) + wl * HA);
        simd::store(us + l, simd::load(us + l) + (wl * HS + S));
        simd::store(uw + l, simd::load(uw + l) + wl * HW);
    }
    for (; l < n; ++l) ua[l] += w[l] * hu_a, us[l] += w[l] * hu_s + s, uw[l] += w[l] * hu_w;
    if (s == 0) return;
    for (l = 0; l + simd::lanes <= n; l += simd::lanes) {
        const simd::pack wl = simd::load(w + l);
        simd::store(t0 + l, simd::load(t0 + l) + S * wl);
        simd::store(t1 + l, simd::load(t1 + l) + LS * wl);
    }
    for (; l < n; ++l) t0[l] += s * w[l], t1[l] += ls * w[l];
}

}  // namespace attnref::tolerance::kernels
