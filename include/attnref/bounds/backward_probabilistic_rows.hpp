#pragma once
/// \file bounds/backward_probabilistic_rows.hpp
/// Owns the pieces of the data-aware multi-head gradient bound (B18) below the bound itself
/// (backward_probabilistic.hpp): the head-level quantity it carries (value, magnitude, var, sh, lin)
/// and the row updates its loops are written with — the query, key, output and value sides of a
/// head, the projections' backward (dX, dW) and a projection's row — each element's operations and
/// their order as in plain loops (lanes are distinct elements), so the compiler may vectorise them
/// without changing a bit. Derivation: docs/backward.md, "(B18) The data-aware multi-head bound".

#include <array>
#include <cmath>
#include <cstddef>

#include "attnref/core/multi_head_attention.hpp"
#include "attnref/core/tensor.hpp"

namespace attnref {

namespace detail {
/// A head-level quantity under (B18): value (double), magnitude (Σ|terms|, for partial sums and slack),
/// var (sources local to the row), sh (std of sources shared by rows), lin (linear part).
struct b18_quantity {
    tensor<double, 4> value, mag, var, sh, lin;
    explicit b18_quantity(const std::array<std::size_t, 4>& e)
        : value(e, 0.0), mag(e, 0.0), var(e, 0.0), sh(e, 0.0), lin(e, 0.0) {}
};
/// The same merged into (B, S, heads·d).
struct b18_merged {
    tensor<double, 3> value, mag, var, sh, lin;
};
inline b18_merged b18_merge(const b18_quantity& q) {
    return {merge_heads<double>(q.value.view()), merge_heads<double>(q.mag.view()), merge_heads<double>(q.var.view()),
            merge_heads<double>(q.sh.view()), merge_heads<double>(q.lin.view())};
}
/// GCC 12's -O2 vectorises only loops that need no remainder ("very cheap" cost model); these row
/// loops of any length are vectorised with the dynamic model (lanes are distinct elements: every
/// element's operations and their order unchanged, the same values bit for bit).
#if defined(__GNUC__) && !defined(__clang__)
#define ATTNREF_B18_VECTORISE __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic")))
#else
#define ATTNREF_B18_VECTORISE
#endif
/// One key's per-row scalars of (B18) (see mha_gradient_probabilistic_bounds).
struct b18_key_terms {
    double s, rho, pl, dsl, dsa, al, bl, c2l, apl, bpl, cp2l, fl, edsl, awl, bwl, apwl, bpwl, tau, eta_k, eta_q;
    double k_kks, k_kvs, k_var, k_rq, k_ro, k_rd, k_rn, k_shl, k_lin;
};
/// dQ_i's error parts from key l, feature by feature (distinct outputs per lane: the compiler may use
/// vector registers; each element's operations and order as written).
ATTNREF_B18_VECTORISE inline void b18_query_side(const b18_key_terms t, const double* __restrict kr, const double* __restrict km, const double* __restrict ks,
                           const double* __restrict ksw, const double* __restrict kbar, const double* __restrict kba,
                           const double* __restrict kbar_abs, const double* __restrict dqa, double* __restrict qstd, double* __restrict qstdo,
                           double* __restrict qvar, double* __restrict qshv, double* __restrict qshl, double* __restrict qlin, std::size_t n) {
    for (std::size_t c = 0; c < n; ++c) {
        const double kv = kr[c], ka = std::fabs(kv) + t.rho * km[c];
        const double dkk = std::fabs(kv - kbar[c]) + t.rho * (ka + kba[c]);
        const double wS = t.s * t.dsa * dkk + dqa[c] * t.pl, wSabs = t.s * t.dsa * (ka + kbar_abs[c]) + dqa[c] * t.pl;
        const double wP = t.s * t.pl * std::max(dkk, ka), wPs = t.s * t.pl * dkk;
        qstd[c] += wS * t.al;
        qstdo[c] += wPs * t.apl;
        qvar[c] += wSabs * wSabs * t.c2l + wP * wP * t.cp2l + ka * ka * t.fl;
        const double kl = wS * t.bl + t.s * t.dsa * ks[c];
        qshv[c] += kl * kl + wPs * wPs * t.bpl * t.bpl;
        qshl[c] += wS * (t.awl + t.bwl) + t.s * t.dsa * ksw[c] + wPs * (t.apwl + t.bpwl);
        qlin[c] += wSabs * t.tau + t.s * ka * t.edsl + t.s * t.dsa * t.eta_k;
    }
}
/// dK_l's error parts from query row i, feature by feature (as b18_query_side).
ATTNREF_B18_VECTORISE inline void b18_key_side(const b18_key_terms t, const double* __restrict qr, const double* __restrict qa, const double* __restrict sdq,
                         const double* __restrict sdqw, double* __restrict kval, double* __restrict kmag, double* __restrict kKs,
                         double* __restrict kVs, double* __restrict kvar, double* __restrict kshv, double* __restrict kshl,
                         double* __restrict klin, std::size_t n) {
    for (std::size_t c = 0; c < n; ++c) {
        const double qq = qa[c];
        kval[c] += t.s * t.dsl * qr[c];
        kmag[c] += t.s * t.dsa * qq;
        kKs[c] += qq * t.k_kks;
        kVs[c] += qq * t.k_kvs;
        kvar[c] += qq * qq * t.k_var;
        const double rQ = qq * t.k_rq + t.s * t.dsa * sdq[c], rO = qq * t.k_ro, rD = qq * t.k_rd, rN = qq * t.k_rn;
        kshv[c] += rQ * rQ + rO * rO + rD * rD + rN * rN;
        kshl[c] += qq * t.k_shl + t.s * t.dsa * sdqw[c];
        klin[c] += qq * t.k_lin + t.s * t.dsa * t.eta_q;
    }
}
/// O_i's error parts from key l (as b18_query_side).
ATTNREF_B18_VECTORISE inline void b18_output_side(double pl, double rho, double al, double bl, double c2l, double awl, double bwl, double tau, double eta_p,
                            double eta_v, double u2, const double* __restrict vr, const double* __restrict vm, const double* __restrict vs,
                            const double* __restrict vsw, const double* __restrict ov, const double* __restrict om, double* __restrict ostd,
                            double* __restrict ovar, double* __restrict oshv, double* __restrict oshl, double* __restrict olin, std::size_t n) {
    for (std::size_t c = 0; c < n; ++c) {
        const double vv = vr[c], va = std::fabs(vv) + rho * vm[c];
        const double wO = pl * (std::fabs(vv - ov[c]) + rho * (va + om[c]));
        ostd[c] += wO * al;
        ovar[c] += wO * wO * c2l + u2 * pl * va * pl * va;
        oshv[c] += wO * wO * bl * bl + pl * pl * vs[c] * vs[c];
        oshl[c] += wO * (awl + bwl) + pl * vsw[c];
        olin[c] += wO * 2 * tau + eta_p * va + pl * eta_v;
    }
}
/// dV_l's error parts from query row i (as b18_query_side).
ATTNREF_B18_VECTORISE inline void b18_value_side(double pl, double v_ks, double v_var, double v_rq, double v_rn, double v_shl, double v_lin, double eta_do,
                           const double* __restrict gr, const double* __restrict dOa, const double* __restrict sddo,
                           const double* __restrict sddow, double* __restrict vval, double* __restrict vmag, double* __restrict vKs,
                           double* __restrict vvar, double* __restrict vshv, double* __restrict vshl, double* __restrict vlin, std::size_t n) {
    for (std::size_t c = 0; c < n; ++c) {
        const double go = dOa[c];
        vval[c] += pl * gr[c];
        vmag[c] += pl * go;
        vKs[c] += go * v_ks;
        vvar[c] += go * go * v_var;
        const double rQ = go * v_rq, rO = pl * sddo[c], rN = go * v_rn;
        vshv[c] += rQ * rQ + rO * rO + rN * rN;
        vshl[c] += go * v_shl + pl * sddow[c];
        vlin[c] += go * v_lin + pl * eta_do;
    }
}
/// The projections' backward, one term added to a row of sums (as b18_query_side):
/// dX row: term dH_rc·W_mc over m (w, wa: W's row c and its magnitudes);
ATTNREF_B18_VECTORISE inline void b18_dx_update(const double* __restrict w, const double* __restrict wa, double sd, double sh, double ga,
                                                double v, double li, double* __restrict mh, double* __restrict ms, double* __restrict sq,
                                                double* __restrict ab, double* __restrict sg, double* __restrict ln, std::size_t n) {
    for (std::size_t e = 0; e < n; ++e) {
        mh[e] += wa[e] * sd;
        ms[e] += wa[e] * sh;
        const double m = wa[e] * ga;
        sq[e] += m * m;
        ab[e] += m;
        sg[e] += w[e] * v;
        ln[e] += wa[e] * li;
    }
}
/// dW row (or db; dW_o's transpose): term x_rm·dH_rc over c;
ATTNREF_B18_VECTORISE inline void b18_dw_update(double xv, const double* __restrict gv, const double* __restrict gvar,
                                                const double* __restrict gsh, const double* __restrict gl, const double* __restrict gaa,
                                                double* __restrict vl, double* __restrict mk, double* __restrict sq, double* __restrict ab,
                                                double* __restrict sg, double* __restrict ln, std::size_t n) {
    const double xa = std::fabs(xv);
    for (std::size_t c = 0; c < n; ++c) {
        vl[c] += xa * xa * gvar[c];
        mk[c] += xa * gsh[c];
        const double m = xa * gaa[c];
        sq[c] += m * m;
        ab[c] += m;
        sg[c] += xv * gv[c];
        ln[c] += xa * gl[c];
    }
}
/// A projection's row: term x_e·W_ec over c (value, magnitude, square, and the inputs' magnitudes);
ATTNREF_B18_VECTORISE inline void b18_projection_update(double xe, const double* __restrict wr, double* __restrict v, double* __restrict m,
                                                        double* __restrict q, double* __restrict in, std::size_t n) {
    const double xa = std::fabs(xe);
    for (std::size_t c = 0; c < n; ++c) {
        const double t = xe * wr[c];
        v[c] += t, m[c] += std::fabs(t), q[c] += t * t, in[c] += xa + std::fabs(wr[c]);
    }
}
}  // namespace detail

#undef ATTNREF_B18_VECTORISE

}  // namespace attnref
