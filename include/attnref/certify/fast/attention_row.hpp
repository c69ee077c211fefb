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
#include <type_traits>
#include <vector>

#include "attnref/core/attention.hpp"
#include "attnref/certify/fast/bounded.hpp"
#include "attnref/certify/fast/cpu.hpp"
#include "attnref/certify/fast/dot.hpp"
#include "attnref/certify/fast/exp.hpp"
#include "attnref/certify/fast/lanes.hpp"
#include "attnref/certify/fast/problem.hpp"
#include "attnref/core/double_double.hpp"
#include "attnref/core/mask.hpp"

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
    /// Keys whose exponential took the regular path (key_exp): E = 2^K·(eh + el), bound eb·2^K.
    std::vector<double> eh, el, eb, ek;
    std::vector<std::uint8_t> reg;
    /// (8b) the sum in four lanes (key j in lane j mod 4) as yh + yl + yt, yh and yl carried exactly
    /// (TwoSum) and yt the rounded sum of their carries, ry Σ|rounded results| (yt's rounding errors
    /// ≤ u·ry), eyl the terms' bounds.
    double yh[4], yl[4], yt[4], ry[4], eyl[4];
    std::size_t terms = 0;
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

// The lane templates below: see lanes.hpp on -Wpsabi.
template <class V>
using lane_mask = decltype(V{} < V{});

template <class V>
inline V splat(double c) {
    if constexpr (std::is_same_v<V, double>) return c;
    else return V{c, c, c, c};
}

/// j where the lane's mask is set, else +0 (a safe table index for lanes whose j may be anything).
template <class V>
inline V good_index(lane_mask<V> g, V j) {
    if constexpr (std::is_same_v<V, double>) return g ? j : 0.0;
    else return V(decltype(g)(j) & g);
}

/// True when every lane of m is set.
template <class M>
inline bool all_lanes(M m) {
    if constexpr (std::is_same_v<M, bool>) return m;
    else return (m[0] & m[1] & m[2] & m[3]) != 0;
}

/// (6) for the regular keys of (8a), on any lane type: d = x − m, its bound, the reduction (6a),
/// the polynomial core, and the bound (6b)–(6c) — exp_prepare, exp_core and exp_finish's
/// operations in their order. Returns, per lane, whether the key is regular: e^d is neither tiny
/// nor outside the handled range, r̃ is not below 2^-400, δ < ¼, K ≥ −480 and the bound finite;
/// other keys take exp_dd's scalar path (row_key_scalar), which gives the same value where both apply.
/// N groups of lanes at once: each group's operations are those above in their order; the groups'
/// statements alternate, so that their independent dependency chains (the polynomial's above all)
/// overlap in the processor.
template <class V, int N>
inline void key_exp_groups(const V* xh, const V* xl, const V* ex, dd m, V* eh, V* el, V* eb, V* kd, lane_mask<V>* good) {
    using namespace lanes;
    const constants& c = consts();
    V th[N], tl[N], rh[N], rl[N], er[N], jj[N];  // t and r̃ of each group (double-word parts), table entries
#pragma GCC unroll 4
    for (int g = 0; g < N; ++g) {
        const dwv<V> d = sub(dwv<V>{xh[g], xl[g]}, dwv<V>{splat<V>(m.hi), splat<V>(m.lo)});
        const V ed = up(ex[g] + eta_up * mag(d));
        const V k = round_l(d.hi * inv_ln2_64);
        dwv<V> r = sub(d, dwv<V>{splat<V>(c.ln2_64_c1) * k, splat<V>(0)});
        r = sub(r, dwv<V>{splat<V>(c.ln2_64_c2) * k, splat<V>(0)});
        r = sub(r, mul(dwv<V>{splat<V>(c.ln2_64_c3.hi), splat<V>(c.ln2_64_c3.lo)}, k));
        er[g] = up(ed + (3 * dw::dd_eta * (mag(r) + abs_l(k) * 0x1p-40) + abs_l(k) * 0x1p-70 * (0x1p-105 + dw::dd_eta)) * 1.01);
        kd[g] = floor_l(k * 0.015625);       // exact
        jj[g] = k - splat<V>(64) * kd[g];    // exact, 0 … 63
        const V arh = abs_l(r.hi);
        good[g] = (ed < splat<V>(1)) & (d.hi + abs_l(d.lo) + ed > splat<V>(-800)) & (d.hi < splat<V>(700)) & (arh <= splat<V>(0.0055)) &
                  (arh >= splat<V>(0x1p-400)) & (kd[g] >= splat<V>(-480));
        rh[g] = r.hi, rl[g] = r.lo;
        th[g] = splat<V>(c.inv_fact[10].hi), tl[g] = splat<V>(c.inv_fact[10].lo);
    }
    // The polynomial: the groups' independent dependency chains side by side; then the table factor.
    for (int i = 9; i >= 0; --i) {
        const dwv<V> ci{splat<V>(c.inv_fact[i].hi), splat<V>(c.inv_fact[i].lo)};
#pragma GCC unroll 4
        for (int g = 0; g < N; ++g) {
            const dwv<V> t = add(mul(dwv<V>{th[g], tl[g]}, dwv<V>{rh[g], rl[g]}), ci);
            th[g] = t.hi, tl[g] = t.lo;
        }
    }
#pragma GCC unroll 4
    for (int g = 0; g < N; ++g) {
        // lanes that are not regular may hold any j: read entry 0 for them (their values are not used)
        const dwv<V> t = mul(dwv<V>{th[g], tl[g]}, table_l(c.exp2_table, good_index(good[g], jj[g])));
        const V ar = abs_l(rh[g]) * (1 + 0x1p-50);
        const V a2 = ar * ar, a4 = a2 * a2;
        const V rem = a4 * a4 * a2 * ar / 39916800.0 * 1.006;
        const V delta_t = up(1.006 * (2 * dw::dd_eta + rem));
        const V delta_e = up(1.001 * (delta_t + 0x1p-105 + dw::dd_eta));
        const V delta = up(delta_e + er[g] * (1 + er[g]) * (1 + delta_e));
        eh[g] = t.hi, el[g] = t.lo;
        eb[g] = up(delta * mag(t) * 1.34);
        good[g] = good[g] & (delta < splat<V>(0.25)) & (eb[g] < splat<V>(std::numeric_limits<double>::infinity()));
    }
}

/// key_exp for one group of lanes.
template <class V>
inline lane_mask<V> key_exp(V xh, V xl, V ex, dd m, V& eh, V& el, V& eb, V& kd) {
    lane_mask<V> good;
    key_exp_groups<V, 1>(&xh, &xl, &ex, m, &eh, &el, &eb, &kd, &good);
    return good;
}

/// (8b) Adds a + b (exact doubles) to the triple-word lane accumulator yh + yl + yt: the high words
/// exactly (TwoSum), their carries rounded into yt with ry += |each rounded result|.
template <class V>
inline void add_term3(V a, V b, V& yh, V& yl, V& yt, V& ry) {
    const lanes::dwv<V> s1 = lanes::two_sum(yh, a);
    const lanes::dwv<V> s2 = lanes::two_sum(yl, s1.lo);
    const lanes::dwv<V> s3 = lanes::two_sum(s2.hi, b);
    yh = s1.hi, yl = s3.hi;
    const V w = s2.lo + s3.lo;
    yt = yt + w;
    ry = ry + (lanes::abs_l(w) + lanes::abs_l(yt));
}

/// Adds a regular key's term 2^K·E (bound 2^K·eb; exact scalings, K ≥ −480) to the lane accumulators.
template <class V>
inline void key_accumulate(V eh, V el, V eb, V kd, V& yh, V& yl, V& yt, V& ry, V& ey) {
    const V pk = lanes::pow2_l(kd);
    add_term3(eh * pk, el * pk, yh, yl, yt, ry);
    ey = ey + eb * pk;
}

/// Key j of (8a)–(8b) on the scalar path; false: the row is left to MPFI.
inline bool row_key_scalar(row_workspace& ws, std::size_t j) {
    ws.reg[j] = 0;
    if (!ws.allowed[j]) return true;
    const std::size_t l = j % 4;
    double eh, el, eb, kd;
    if (key_exp<double>(ws.x[j].hi, ws.x[j].lo, ws.ex[j], ws.m, eh, el, eb, kd)) {
        ws.reg[j] = 1, ws.eh[j] = eh, ws.el[j] = el, ws.eb[j] = eb, ws.ek[j] = kd;
        key_accumulate<double>(eh, el, eb, kd, ws.yh[l], ws.yl[l], ws.yt[l], ws.ry[l], ws.eyl[l]);
        ++ws.terms;
        return true;
    }
    // Not regular: exp_dd and the cases of (8b) as written there.
    const dd d = dw::sub(ws.x[j], ws.m);
    const double ed = dw::up(ws.ex[j] + eta_up * dw::mag(d));
    ws.ej[j] = exp_dd(d, ed);
    const exp_result& e = ws.ej[j];
    if (!e.ok) return false;
    if (e.tiny) {
        ws.eyl[l] += 0x1p-1000;
        return true;
    }
    const int K = e.x.scale;
    if (K < -700) {
        ws.eyl[l] += dw::scale2(1.0, std::max(K + 1, -1000));
        return true;
    }
    add_term3<double>(dw::scale2(e.x.v.hi, K), dw::scale2(e.x.v.lo, K), ws.yh[l], ws.yl[l], ws.yt[l], ws.ry[l]);  // exact scalings: K ≥ −700
    ws.eyl[l] += dw::scale2(e.x.bound, K);
    ++ws.terms;
    return true;
}

#ifdef ATTNREF_FAST_AVX2
/// Keys 0 … 4⌊Sk/4⌋ − 1 of (8a)–(8b), four at a time: a block whose four keys are attendable and
/// regular is computed on the four lanes of key_exp / key_accumulate (key j0 + l in lane l, the
/// lane of row_key_scalar); any other block key by key through row_key_scalar. Same bits as the
/// scalar path. The exponentials of two blocks are computed together (key_exp_groups, N = 2), then
/// each block is added in order as above. False: the row is left to MPFI.
__attribute__((target("avx2,fma"), flatten)) inline bool row_exp_blocks_avx2(row_workspace& ws, std::size_t Sk) {
    using lanes::v4d;
    using lanes::v4u;
    v4d yh = *reinterpret_cast<const v4u*>(ws.yh), yl = *reinterpret_cast<const v4u*>(ws.yl), yt = *reinterpret_cast<const v4u*>(ws.yt),
        ry = *reinterpret_cast<const v4u*>(ws.ry), ey = *reinterpret_cast<const v4u*>(ws.eyl);
    auto store = [&] {
        *reinterpret_cast<v4u*>(ws.yh) = yh, *reinterpret_cast<v4u*>(ws.yl) = yl, *reinterpret_cast<v4u*>(ws.yt) = yt;
        *reinterpret_cast<v4u*>(ws.ry) = ry, *reinterpret_cast<v4u*>(ws.eyl) = ey;
    };
    bool ok = true;
    // Block j0 (four keys) from the lanes of a key_exp result when regular, else key by key.
    auto take = [&](std::size_t j0, bool regular, v4d eh, v4d el, v4d eb, v4d kd) {
        if (regular) {
            *reinterpret_cast<v4u*>(ws.eh.data() + j0) = eh, *reinterpret_cast<v4u*>(ws.el.data() + j0) = el;
            *reinterpret_cast<v4u*>(ws.eb.data() + j0) = eb, *reinterpret_cast<v4u*>(ws.ek.data() + j0) = kd;
            for (int l = 0; l < 4; ++l) ws.reg[j0 + l] = 1;
            key_accumulate<v4d>(eh, el, eb, kd, yh, yl, yt, ry, ey);
            ws.terms += 4;
            return;
        }
        store();
        for (std::size_t j = j0; j < j0 + 4 && ok; ++j) ok = row_key_scalar(ws, j);
        yh = *reinterpret_cast<const v4u*>(ws.yh), yl = *reinterpret_cast<const v4u*>(ws.yl), yt = *reinterpret_cast<const v4u*>(ws.yt);
        ry = *reinterpret_cast<const v4u*>(ws.ry), ey = *reinterpret_cast<const v4u*>(ws.eyl);
    };
    auto attendable = [&](std::size_t j0) { return (ws.allowed[j0] & ws.allowed[j0 + 1] & ws.allowed[j0 + 2] & ws.allowed[j0 + 3]) != 0; };
    auto load = [&](std::size_t j0, v4d& xh, v4d& xl, v4d& ex) {
        xh = v4d{ws.x[j0].hi, ws.x[j0 + 1].hi, ws.x[j0 + 2].hi, ws.x[j0 + 3].hi};
        xl = v4d{ws.x[j0].lo, ws.x[j0 + 1].lo, ws.x[j0 + 2].lo, ws.x[j0 + 3].lo};
        ex = *reinterpret_cast<const v4u*>(ws.ex.data() + j0);
    };
    std::size_t j0 = 0;
    for (; j0 + 8 <= Sk && ok; j0 += 8) {
        const bool a0 = attendable(j0), a1 = attendable(j0 + 4);
        v4d xh[2], xl[2], ex[2], eh[2], el[2], eb[2], kd[2];
        lane_mask<v4d> good[2];
        if (a0 && a1) {
            load(j0, xh[0], xl[0], ex[0]), load(j0 + 4, xh[1], xl[1], ex[1]);
            key_exp_groups<v4d, 2>(xh, xl, ex, ws.m, eh, el, eb, kd, good);
        } else {
            for (int g = 0; g < 2; ++g)
                if (g == 0 ? a0 : a1) {
                    load(j0 + 4 * g, xh[g], xl[g], ex[g]);
                    key_exp_groups<v4d, 1>(xh + g, xl + g, ex + g, ws.m, eh + g, el + g, eb + g, kd + g, good + g);
                }
        }
        take(j0, a0 && all_lanes(good[0]), eh[0], el[0], eb[0], kd[0]);
        if (ok) take(j0 + 4, a1 && all_lanes(good[1]), eh[1], el[1], eb[1], kd[1]);
    }
    for (; j0 + 4 <= Sk && ok; j0 += 4) {
        v4d xh, xl, ex, eh{}, el{}, eb{}, kd{};
        const bool a = attendable(j0);
        bool regular = false;
        if (a) {
            load(j0, xh, xl, ex);
            regular = all_lanes(key_exp<v4d>(xh, xl, ex, ws.m, eh, el, eb, kd));
        }
        take(j0, regular, eh, el, eb, kd);
    }
    store();
    return ok;
}
#endif

/// (8a)–(8b) The shift m = x̃_{j*}, e^(x_j − m) for every attendable key by (6), and their sum y
/// with its bound and lower bound. The sum runs in four triple-word lanes (key j added to lane j mod
/// 4, keys in order; add_term3), the lanes added to lane 0 in order the same way, then rounded to a
/// double-word: its error is the carries' rounding (≤ u·Σry) and the dropped third word (8b).
/// False: left to MPFI.
inline bool row_exponentials(const head_context& hc, row_workspace& ws) {
    const std::size_t Sk = hc.Sk;
    std::size_t js = Sk;
    for (std::size_t j = 0; j < Sk; ++j)
        if (ws.allowed[j] && (js == Sk || ws.x[j].hi > ws.x[js].hi)) js = j;
    ws.m = ws.x[js];
    ws.ej.resize(Sk), ws.eh.resize(Sk), ws.el.resize(Sk), ws.eb.resize(Sk), ws.ek.resize(Sk), ws.reg.resize(Sk);
    for (int l = 0; l < 4; ++l) ws.yh[l] = ws.yl[l] = ws.yt[l] = ws.ry[l] = ws.eyl[l] = 0;
    ws.terms = 0;
    std::size_t j = 0;
#ifdef ATTNREF_FAST_AVX2
    if (has_avx2_fma()) {
        if (!row_exp_blocks_avx2(ws, Sk)) return false;
        j = Sk - Sk % 4;
    }
#endif
    for (; j < Sk; ++j)
        if (!row_key_scalar(ws, j)) return false;
    double yh = ws.yh[0], yl = ws.yl[0], yt = ws.yt[0], ry = ws.ry[0];
    for (int l = 1; l < 4; ++l) {
        add_term3<double>(ws.yh[l], ws.yl[l], yh, yl, yt, ry);
        yt = yt + ws.yt[l];
        ry = ry + (ws.ry[l] + std::fabs(yt));
    }
    // y = yh + yl + yt as a double-word: exact TwoSums but for the dropped t.lo.
    const dd a = dw::two_sum(yh, yl), t = dw::two_sum(a.lo, yt), y = dw::two_sum(a.hi, t.hi);
    const double ey = (ws.eyl[0] + ws.eyl[1]) + (ws.eyl[2] + ws.eyl[3]);
    ws.y = y;
    ws.ey = dw::up(dw::sum_up(ey, Sk) + std::fabs(t.lo) + dw::sum_up(ry, 6 * ws.terms + 12) * 0x1.0000000000001p-53);
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

/// (8d) for regular keys on any lane type: P = E·z in units of 2^K with its bound ep (the bound of
/// row_weights' scalar path), the plain double-words 2^K·P with bound 2^K·ep for P·V, and the
/// float64 decision (9) in its simplest case: with (s, t) = TwoSum(P̃), y = 2^K·s a normal double
/// and (|t| + ep)(1 + 2^-50) < ulp(s)/4, every real within the bound is within a quarter ulp of y,
/// so rounds to y (f64ok; other elements go to round_check).
template <class V>
inline lane_mask<V> key_weight(V eh, V el, V eb, V kd, const row_workspace& ws, double bound_scale, V& Ph, V& Pl, V& ep, V& ph, V& pl,
                               V& pe, V& y) {
    using namespace lanes;
    const dwv<V> E{eh, el};
    const dwv<V> P = mul(E, dwv<V>{splat<V>(ws.z.hi), splat<V>(ws.z.lo)});
    const V aE = mag(E);
    ep = up(eb * ws.inv_low + aE * ws.ey * ws.inv_low * ws.inv_low + aE * ws.ez + eta_up * mag(P));
    const V pk = pow2_l(kd);
    Ph = P.hi, Pl = P.lo;
    ph = P.hi * pk, pl = P.lo * pk, pe = up(ep * pk);
    const dwv<V> st = two_sum(P.hi, P.lo);
    y = st.hi * pk;
    const V ay = abs_l(y);
    return ((abs_l(st.lo) + ep * bound_scale) * (1 + 0x1p-50) < binade_l(st.hi) * 0x1p-54) & (abs_l(st.hi) >= splat<V>(0x1p-1021)) &
           (ay >= splat<V>(0x1p-1021)) & (ay <= splat<V>(0x1p1000));
}

/// Key j of (8d) on the scalar path (the weights sink when asked; ws.ph, pl, pe).
inline void row_weight_scalar(const head_context& hc, row_workspace& ws, std::size_t j, bool f64) {
    const std::size_t Sk = hc.Sk, row = ws.row;
    if (!ws.allowed[j]) {
        if (hc.w_sink) hc.w_sink->put_exact(row * Sk + j, 0.0);
        return;
    }
    if (ws.reg[j]) {
        double Ph, Pl, ep, y;
        const bool ok = key_weight<double>(ws.eh[j], ws.el[j], ws.eb[j], ws.ek[j], ws, hc.w_sink ? hc.w_sink->bound_scale : 1.0, Ph, Pl,
                                           ep, ws.ph[j], ws.pl[j], ws.pe[j], y);
        if (!hc.w_sink) return;
        if (f64 && ok) (*hc.w_sink->values)[0][row * Sk + j] = y;
        else hc.w_sink->put(row * Sk + j, bounded{{Ph, Pl}, ep, static_cast<int>(ws.ek[j])});
        return;
    }
    if (ws.ej[j].tiny) {
        ws.pe[j] = 0x1p-1000;
        if (hc.w_sink) hc.w_sink->put_exact(row * Sk + j, 0.0);  // < 2^-1148: +0 in every format
        return;
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

#ifdef ATTNREF_FAST_AVX2
/// Keys 0 … 4⌊Sk/4⌋ − 1 of (8d), four at a time where all four are regular (key_weight on four
/// lanes), otherwise key by key: the bits of the scalar path.
__attribute__((target("avx2,fma"), flatten)) inline void row_weight_blocks_avx2(const head_context& hc, row_workspace& ws, bool f64) {
    using lanes::v4d;
    using lanes::v4u;
    const std::size_t Sk = hc.Sk;
    const double bs = hc.w_sink ? hc.w_sink->bound_scale : 1.0;
    for (std::size_t j0 = 0; j0 + 4 <= Sk; j0 += 4) {
        if (!(ws.reg[j0] & ws.reg[j0 + 1] & ws.reg[j0 + 2] & ws.reg[j0 + 3])) {
            for (std::size_t j = j0; j < j0 + 4; ++j) row_weight_scalar(hc, ws, j, f64);
            continue;
        }
        v4d Ph, Pl, ep, ph, pl, pe, y;
        const v4d kd = *reinterpret_cast<const v4u*>(ws.ek.data() + j0);
        const auto ok = key_weight<v4d>(*reinterpret_cast<const v4u*>(ws.eh.data() + j0), *reinterpret_cast<const v4u*>(ws.el.data() + j0),
                                        *reinterpret_cast<const v4u*>(ws.eb.data() + j0), kd, ws, bs, Ph, Pl, ep, ph, pl, pe, y);
        *reinterpret_cast<v4u*>(ws.ph.data() + j0) = ph, *reinterpret_cast<v4u*>(ws.pl.data() + j0) = pl;
        *reinterpret_cast<v4u*>(ws.pe.data() + j0) = pe;
        if (!hc.w_sink) continue;
        const std::size_t n = ws.row * Sk + j0;
        if (f64 && all_lanes(ok)) {
            *reinterpret_cast<v4u*>((*hc.w_sink->values)[0].data() + n) = y;
            continue;
        }
        for (int l = 0; l < 4; ++l) {
            if (f64 && ok[l]) (*hc.w_sink->values)[0][n + l] = y[l];
            else hc.w_sink->put(n + l, bounded{{Ph[l], Pl[l]}, ep[l], static_cast<int>(kd[l])});
        }
    }
}
#endif

/// (8d) The weights p_j = e_j/y in scaled form 2^K·P̃ to the weights sink, and as plain
/// double-words with bounds (ws.ph, pl, pe) for P·V.
inline void row_weights(const head_context& hc, row_workspace& ws) {
    const std::size_t Sk = hc.Sk;
    ws.ph.assign(Sk, 0.0), ws.pl.assign(Sk, 0.0), ws.pe.assign(Sk, 0.0);
    const bool f64 = hc.w_sink && hc.w_sink->plain_float64();
    std::size_t j = 0;
#ifdef ATTNREF_FAST_AVX2
    if (has_avx2_fma()) {
        row_weight_blocks_avx2(hc, ws, f64);
        j = Sk - Sk % 4;
    }
#endif
    for (; j < Sk; ++j) row_weight_scalar(hc, ws, j, f64);
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
