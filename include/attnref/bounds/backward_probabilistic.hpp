#pragma once
/// \file bounds/backward_probabilistic.hpp
/// Owns the data-aware (probabilistic) error bound of multi-head attention gradients (B18): the model of
/// the forward's data-aware bound (docs/error-bounds.md §4; Higham & Mary, SIAM J. Sci. Comput. 41,
/// 2019) carried through the backward pass. The first-order bound (B8)–(B13) (backward_bounds.hpp)
/// adds every error source by its largest effect; through projections → logits → P → dS → dQ → dW
/// that is ~10⁶ times a float32 kernel's error at S = 1024 and vacuous. Here every rounding δ_e
/// (|δ_e| ≤ u, mean-independent with mean 0) enters the result as c_e·δ_e, and
/// |Σ_e c_e δ_e| ≤ λ·u·√(Σ_e c_e²) except with probability 2·exp(−λ²/2) (Azuma–Hoeffding); λ = 8.
///
/// Bookkeeping (docs/backward.md (B18)): every head-level quantity carries
///   var  the variance of its sources local to its own row (a query row for dQ and the head outputs O,
///        a key row for dK and dV): independent across the rows a later sum adds (dW = xᵀ·dH);
///   sh   a standard deviation of its sources shared by rows (K and V for a query row; the query rows'
///        own sources for a key row), added across rows by Minkowski's inequality (‖Σ v‖ ≤ Σ ‖v‖);
///   lin  a linear (worst-case) part: roundings that can be equal for equal operands (exp, the
///        division, the exp argument) and the underflow terms η, added in absolute value.
/// Within one sum, sources shared by its terms are added by Minkowski, independent ones in quadrature;
/// a partial sum of terms t is bounded by max(Σt⁺, Σt⁻) = (Σ|t| + |Σt|)/2 in every order. The
/// softmax's first-order perturbation is exact: ΔP_ij = P_ij(ΔS_ij − Σ_l P_il ΔS_il), so
///   ΔdS_ij = dS_ij(ΔS_ij − S̄_i) − P_ij T_i,  S̄_i = Σ_l P_il ΔS_il,  T_i = Σ_l dS_il ΔS_il  (dS = P(dP − D)),
///   ΔdQ_ic = Σ_l [s·dS_il(K_lc − K̄_ic) − dQ_ic·P_il]·ΔS_il + Σ_l s·P_il(K_lc − K̄_ic)·ΔdP_il + …,
/// K̄_ic = Σ_l P_il K_lc, and the same for dK, dV and O. Roundings that a flash backward repeats
/// with other values (the recomputed logits, dP without D) take the coefficients' absolute sums.
/// The result is λ·√(var + sh² + the final sums' own roundings) + lin, times 1 + 2⁻²⁰ (second-order
/// terms and the bound's own evaluation; the double centres it uses carry a relative slack ρ of
/// their magnitudes). Applies to a candidate computing in one format (u) on inputs exact in it, no
/// soft-capping, finite weights; the checker takes the smaller of it and (B8)–(B13) per element.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <optional>
#include <vector>

#include "attnref/bounds/backward_bounds.hpp"
#include "attnref/bounds/backward_probabilistic_rows.hpp"
#include "attnref/bounds/error_bounds.hpp"
#include "attnref/bounds/tolerance/parallel_bounds.hpp"
#include "attnref/core/mask.hpp"
#include "attnref/core/multi_head_attention.hpp"
#include "attnref/core/parallel.hpp"
#include "attnref/core/tensor.hpp"

namespace attnref {

/// (B18) for multi-head attention gradients computed in one format with unit roundoff u (intermediates
/// and results in it), the inputs x, W, b and grad_output rounded to it first when u_in > 0 (0: exact
/// in it). weights and lse: the exact forward's (double); lambda: λ of (15) (the checker's is 8).
/// Returns nothing where it does not apply (soft-capping, non-finite weights).
inline std::optional<mha_gradient_bounds> mha_gradient_probabilistic_bounds(
    tensor_view<const double, 3> x_q, tensor_view<const double, 3> x_k, tensor_view<const double, 3> x_v, const mha_parameters<double>& p,
    const mha_options& o, tensor_view<const double, 3> grad_output, tensor_view<const double, 4> weights, tensor_view<const double, 3> lse,
    double u, double u_in, double lambda) {
    const attention_options& ao = o.attention;
    if (ao.softcap) return std::nullopt;
    for (std::size_t n = 0; n < weights.size(); ++n)
        if (!std::isfinite(weights.data[n])) return std::nullopt;
    const mha_dims md = mha_dims_of(x_q, x_k, x_v, p, o);
    const std::size_t B = md.batch, H = md.heads, Hkv = md.kv_heads, G = H / Hkv, Sq = md.query_length, Sk = md.key_length,
                      dk = md.head_dim_qk, dv = md.head_dim_v, Eo = md.output_dim, Eq = x_q.extents[2], Ek = x_k.extents[2],
                      Ev = x_v.extents[2], threads = ao.threads;
    const double s = detail::bound_logit_scale(ao, dk), u2 = u * u, eta = error_bounds::underflow_eta(u);
    // Inputs rounded to the candidate's format first (u_in > 0): each x_e, W_ec, b_c, dOut_n carries
    // u_in·|value| (+ η_in). A rounding of x_e reaches every feature of its row (fan-out: the dk or dv
    // terms of a head's dot product, (Σ_{k≤m} a_k)² ≤ m·Σ a_k²); one of W_ec or b_c every row (shared).
    const double ui2 = u_in * u_in, eta_in = u_in > 0 ? error_bounds::underflow_eta(u_in) : 0.0;
    // ρ: the double centres' relative error against their magnitudes (each a chain of at most a few
    // sums of these lengths, 2^-53 per term), with a factor 8 of room.
    const double rho = std::max(0x1p-40, 8 * static_cast<double>(std::max({Eq, Ek, Ev}) + Eo + Sk + G * Sq + dk + dv + 16) * 0x1p-53);
    const double grow = 1 + rho;

    // Projections y = x·W + b in double: value, magnitude Σ|t|, standard deviation of the kernel's own
    // roundings √(u²(Σt² + (n + 1)P²)), P = (Σ|t| + |Σt|)/2; split into heads.
    //   sd: the kernel's own roundings √(u²(Σt² + (n + 1)P²)) and the rounded x's, fan-out times u_in²Σt²;
    //   sdw: the rounded W's and b's, u_in·√(Σt² + b²) — sources shared by every row.
    struct projected {
        tensor<double, 4> value, mag, sd, sdw;
        double eta = 0;  ///< the largest absolute underflow term of an element
    };
    auto project = [&](tensor_view<const double, 3> x, const double* w, std::size_t N, tensor_view<const double, 1> bias, std::size_t heads,
                       double fan) {
        const std::size_t Bx = x.extents[0], S = x.extents[1], E = x.extents[2], hd = N / heads;
        projected r{tensor<double, 4>({Bx, heads, S, hd}, 0.0), tensor<double, 4>({Bx, heads, S, hd}, 0.0),
                    tensor<double, 4>({Bx, heads, S, hd}, 0.0), tensor<double, 4>({Bx, heads, S, hd}, 0.0)};
        std::vector<double> eta_row(Bx * S, 0.0);
        ::attnref::parallel_for_dynamic(Bx * S, threads, [&](std::size_t row) {
            const std::size_t b = row / S, i = row % S;
            thread_local std::vector<double> v, m, q, in;
            v.assign(N, 0.0), m.assign(N, 0.0), q.assign(N, 0.0), in.assign(N, 0.0);
            for (std::size_t e = 0; e < E; ++e) detail::b18_projection_update(x(b, i, e), w + e * N, v.data(), m.data(), q.data(), in.data(), N);
            double et = 0;
            for (std::size_t c = 0; c < N; ++c) {
                double b2 = 0;
                if (!bias.empty()) v[c] += bias[c], m[c] += std::fabs(bias[c]), b2 = bias[c] * bias[c], in[c] += 1;
                const double P = (m[c] + std::fabs(v[c])) / 2 * grow;
                r.value(b, c / hd, i, c % hd) = v[c];
                r.mag(b, c / hd, i, c % hd) = m[c];
                r.sd(b, c / hd, i, c % hd) = std::sqrt((u2 * (q[c] + b2) + fan * ui2 * q[c]) * grow + u2 * (static_cast<double>(E) + 1) * P * P);
                r.sdw(b, c / hd, i, c % hd) = u_in * std::sqrt((q[c] + b2) * grow);
                et = std::max(et, (static_cast<double>(E) + 1) * eta + eta_in * in[c]);
            }
            eta_row[row] = et;
        });
        for (double e : eta_row) r.eta = std::max(r.eta, e);
        return r;
    };
    std::vector<double> wo_t(Eo * H * dv);
    for (std::size_t m = 0; m < H * dv; ++m)
        for (std::size_t n = 0; n < Eo; ++n) wo_t[n * H * dv + m] = p.w_o(m, n);
    const double fk = static_cast<double>(dk), fv = static_cast<double>(dv);
    // Fan-out of a rounded x_e or dOut_n: the dk (dv) terms of one head's dot product, times the heads
    // it reaches (dX sums the heads in quadrature below).
    const double fh = static_cast<double>(H), fkv = static_cast<double>(Hkv);
    const projected Q = project(x_q, p.w_q.data, H * dk, p.b_q, H, fk * fh), K = project(x_k, p.w_k.data, Hkv * dk, p.b_k, Hkv, fk * fkv),
                    V = project(x_v, p.w_v.data, Hkv * dv, p.b_v, Hkv, fv * fkv), dO = project(grad_output, wo_t.data(), H * dv, {}, H, fv * fh);
    // η of the projections (absolute, per element, the largest).
    const double eta_q = Q.eta, eta_k = K.eta, eta_v = V.eta, eta_do = dO.eta;

    detail::b18_quantity dQ({B, H, Sq, dk}), Oh({B, H, Sq, dv}), dK({B, Hkv, Sk, dk}), dV({B, Hkv, Sk, dv});
    const double sig_nu = u * std::sqrt(2 * static_cast<double>(Sk) + 6);  // the softmax normalisation's std (relative)
    const double sk_d = static_cast<double>(Sk), rows_d = static_cast<double>(G * Sq);

    auto group_task = [&](std::size_t task) {
        const std::size_t b = task / Hkv, hk = task % Hkv;
        // Key-side accumulators of the group: dK (Sk × dk) and dV (Sk × dv).
        std::vector<double> kval(Sk * dk, 0.0), kmag(Sk * dk, 0.0), kvar(Sk * dk, 0.0), kKs(Sk * dk, 0.0), kVs(Sk * dk, 0.0),
            kshv(Sk * dk, 0.0), kshl(Sk * dk, 0.0), klin(Sk * dk, 0.0);
        std::vector<double> vval(Sk * dv, 0.0), vmag(Sk * dv, 0.0), vvar(Sk * dv, 0.0), vKs(Sk * dv, 0.0), vshv(Sk * dv, 0.0),
            vshl(Sk * dv, 0.0), vlin(Sk * dv, 0.0);
        // K's and V's value, magnitude |value| + ρ·mag, sd and sdw transposed to (feature, key), for
        // phase A's per-key sums a pack of keys at a time (kernels::gradient_key_block); and per key
        // Σ_c |K_lc| and Σ_c |V_lc| of those magnitudes (for the projections' η through the logits and dP).
        constexpr std::size_t lanes = tolerance::simd::lanes;
        const std::size_t skT = tolerance::simd::transposed_stride(Sk);
        std::vector<double> kvT(dk * skT, 0.0), kaT(dk * skT, 0.0), ksT(dk * skT, 0.0), kswT(dk * skT, 0.0);
        std::vector<double> vvT(dv * skT, 0.0), vaT(dv * skT, 0.0), vsT(dv * skT, 0.0), vswT(dv * skT, 0.0);
        double kabs_max = 0;
        std::vector<double> vabs(Sk, 0.0);
        for (std::size_t l = 0; l < Sk; ++l) {
            double ka = 0, va = 0;
            for (std::size_t c = 0; c < dk; ++c) {
                const double kv = K.value(b, hk, l, c), ka_c = std::fabs(kv) + rho * K.mag(b, hk, l, c);
                kvT[c * skT + l] = kv, kaT[c * skT + l] = ka_c, ka += ka_c;
                ksT[c * skT + l] = K.sd(b, hk, l, c), kswT[c * skT + l] = K.sdw(b, hk, l, c);
            }
            for (std::size_t c = 0; c < dv; ++c) {
                const double vv = V.value(b, hk, l, c), va_c = std::fabs(vv) + rho * V.mag(b, hk, l, c);
                vvT[c * skT + l] = vv, vaT[c * skT + l] = va_c, va += va_c;
                vsT[c * skT + l] = V.sd(b, hk, l, c), vswT[c * skT + l] = V.sdw(b, hk, l, c);
            }
            kabs_max = std::max(kabs_max, ka);
            vabs[l] = va;
        }
        // Rows (h, i) in blocks of row_block: each row's per-key terms first (phase A and the sums over
        // keys), then the block's rows go through the keys together, so that a key's rows of K, V and of
        // the group's dK, dV accumulators are read once per block instead of once per row (fifteen
        // accumulator arrays of Sk·dk or Sk·dv doubles, 1 MB each at LLM size, far beyond the caches).
        // Every sum keeps its order: a row's over keys l ascending, a key's over rows (h, i) ascending.
        constexpr std::size_t row_block = 4;
        struct row_state {
            // Per key: P, dP, |dP|'s terms, the logit and dP standard deviations (a, bb, c2, ap, bp, cp2; aw, bw,
            // apw, bpw the same from the rounded W, b, shared by every row), dS, |dS|, f, eds and dP's underflow edp.
            std::vector<double> P, dP, dpabs, a, bb, c2, ap, bp, cp2, dS, dSa, f, eds, aw, bw, apw, bpw, edp;
            std::vector<char> used;
            std::vector<double> qa, dOa, kbar, kbar_abs, sdq, sddo, sdqw, sddow, kba, dqv, dqm, dqa, ov, om, oa;
            std::vector<double> qstd, qstdo, qvar, qshv, qshl, qlin, ostd, ovar, oshv, oshl, olin;
            double L = 0, lse_abs = 0, qabs = 0, doabs = 0, D = 0, dbar = 0, dpsum = 0;
            double Da = 0, sig_d = 0, tau = 0, eta_p = 0, abar = 0, adS = 0, bbar = 0, bdS = 0, cbar = 0, cdS = 0;
            double apbar = 0, bpbar = 0, cpbar = 0, sumdS = 0, awbar = 0, awdS = 0, bwbar = 0, bwdS = 0, apwbar = 0, bpwbar = 0;
        };
        std::vector<row_state> rows(row_block);
        for (row_state& st : rows) {
            for (std::vector<double>* v : {&st.P, &st.dP, &st.dpabs, &st.a, &st.bb, &st.c2, &st.ap, &st.bp, &st.cp2, &st.dS, &st.dSa, &st.f,
                                           &st.eds, &st.aw, &st.bw, &st.apw, &st.bpw, &st.edp})
                v->resize(Sk);
            st.used.resize(Sk);
            for (std::vector<double>* v : {&st.qa, &st.kbar, &st.kbar_abs, &st.sdq, &st.sdqw, &st.kba, &st.dqv, &st.dqm, &st.dqa, &st.qstd,
                                           &st.qstdo, &st.qvar, &st.qshv, &st.qshl, &st.qlin})
                v->resize(dk);
            for (std::vector<double>* v : {&st.dOa, &st.sddo, &st.sddow, &st.ov, &st.om, &st.oa, &st.ostd, &st.ovar, &st.oshv, &st.oshl, &st.olin})
                v->resize(dv);
        }
        for (std::size_t h = hk * G; h < (hk + 1) * G; ++h)
            for (std::size_t i0 = 0; i0 < Sq; i0 += row_block) {
                const std::size_t nr = std::min(row_block, Sq - i0);
                for (std::size_t r = 0; r < nr; ++r) {
                    const std::size_t i = i0 + r;
                    row_state& st = rows[r];
                    auto &P = st.P, &dpabs = st.dpabs, &qa = st.qa, &dOa = st.dOa, &sdq = st.sdq, &sddo = st.sddo, &sdqw = st.sdqw;
                    auto& sddow = st.sddow;
                    auto& used = st.used;
                    double qabs = 0, doabs = 0;
                    for (std::size_t c = 0; c < dk; ++c) {
                        qa[c] = std::fabs(Q.value(b, h, i, c)) + rho * Q.mag(b, h, i, c);
                        sdq[c] = Q.sd(b, h, i, c);
                        sdqw[c] = Q.sdw(b, h, i, c);
                        qabs += qa[c];
                    }
                    for (std::size_t c = 0; c < dv; ++c) {
                        dOa[c] = std::fabs(dO.value(b, h, i, c)) + rho * dO.mag(b, h, i, c);
                        sddo[c] = dO.sd(b, h, i, c);
                        sddow[c] = dO.sdw(b, h, i, c);
                        doabs += dOa[c];
                    }
                    // The row's logit magnitude L_i (with ALiBi, additive and seed masks) and D̄_i, as (B1)–(B3).
                    const detail::gradient_row gr = detail::gradient_row_terms(Q.value.view(), K.value.view(), V.value.view(), dO.value.view(),
                                                                               weights, lse, ao, attention_dims{B, H, Hkv, Sq, Sk, dk, dv}, b,
                                                                               h, i, s, u, 0, dpabs);
                    const double L = gr.logit_magnitude, lse_abs = std::isfinite(lse(b, h, i)) ? std::fabs(lse(b, h, i)) : 0.0;
                    st.L = L, st.lse_abs = lse_abs, st.qabs = qabs, st.doabs = doabs;
                    for (std::size_t l = 0; l < Sk; ++l) {
                        P[l] = weights(b, h, i, l);
                        used[l] = P[l] > 0 || !structurally_masked(ao.mask, b, h, i, l, Sq, Sk);
                    }
                    st.D = 0, st.dbar = 0, st.dpsum = 0;
                }
                // Phase A: per key, the centres and the standard deviations entering the logit and dP. The sums
                // over the features a pack of keys at a time for each row of the block (kernels::gradient_key_block,
                // lanes past Sk on the transposed arrays' zero padding, unused); each key's sums in feature order,
                // each row's sums over keys in key order.
                for (std::size_t l0 = 0; l0 < Sk; l0 += lanes)
                    for (std::size_t r = 0; r < nr; ++r) {
                        const std::size_t i = i0 + r;
                        row_state& st = rows[r];
                        const std::size_t n = std::min(lanes, Sk - l0);
                        bool any = false;
                        for (std::size_t t = 0; t < n; ++t) any = any || st.used[l0 + t];
                        if (!any) continue;
                        tolerance::kernels::gradient_key_dots kd, vd;
                        tolerance::kernels::gradient_key_block(&Q.value(b, h, i, 0), st.qa.data(), st.sdq.data(), st.sdqw.data(), &kvT[l0], &kaT[l0],
                                                               &ksT[l0], &kswT[l0], skT, dk, kd);
                        tolerance::kernels::gradient_key_block(&dO.value(b, h, i, 0), st.dOa.data(), st.sddo.data(), st.sddow.data(), &vvT[l0],
                                                               &vaT[l0], &vsT[l0], &vswT[l0], skT, dv, vd);
                        auto &P = st.P, &dP = st.dP, &dpabs = st.dpabs, &a = st.a, &bb = st.bb, &c2 = st.c2, &ap = st.ap, &bp = st.bp;
                        auto &cp2 = st.cp2, &aw = st.aw, &bw = st.bw, &apw = st.apw, &bpw = st.bpw;
                        double &D = st.D, &dbar = st.dbar, &dpsum = st.dpsum;
                        const double L = st.L;
                        for (std::size_t t = 0; t < n; ++t) {
                            const std::size_t l = l0 + t;
                            if (!st.used[l]) continue;
                            const double sqk = kd.dot[t], aqk = kd.mag[t], qq2 = kd.mag2[t], av = kd.a[t], bv = kd.b[t], avw = kd.aw[t], bvw = kd.bw[t];
                            const double sdp = vd.dot[t], dq2 = vd.mag2[t], av2 = vd.a[t], bv2 = vd.b[t], av2w = vd.aw[t], bv2w = vd.bw[t];
                            aw[l] = s * std::sqrt(avw * grow);
                            bw[l] = s * std::sqrt(bvw * grow);
                            apw[l] = std::sqrt(av2w * grow);
                            bpw[l] = std::sqrt(bv2w * grow);
                            const double PS = s * (aqk + std::fabs(sqk)) / 2, PdP = (dpabs[l] * grow + std::fabs(sdp)) / 2;
                            a[l] = s * std::sqrt(av * grow);
                            bb[l] = s * std::sqrt(bv * grow);
                            // The dot product's dk products (either scale placement: up to 3 per term) and dk additions, and
                            // four roundings of logit size (scale, ALiBi, additive mask, subtraction of the maximum).
                            c2[l] = u2 * (3 * s * s * qq2 * grow + static_cast<double>(dk) * PS * PS + 4 * L * L);
                            ap[l] = std::sqrt(av2 * grow);
                            bp[l] = std::sqrt(bv2 * grow);
                            cp2[l] = u2 * (dq2 * grow + static_cast<double>(dv) * PdP * PdP);
                            dP[l] = sdp;
                            D += P[l] * sdp;
                            dbar += P[l] * dpabs[l];
                            dpsum += dpabs[l];
                        }
                    }
                for (std::size_t r = 0; r < nr; ++r) {
                    row_state& st = rows[r];
                    auto &P = st.P, &dP = st.dP, &dpabs = st.dpabs, &a = st.a, &bb = st.bb, &c2 = st.c2, &ap = st.ap, &bp = st.bp;
                    auto &cp2 = st.cp2, &dS = st.dS, &dSa = st.dSa, &f = st.f, &eds = st.eds, &aw = st.aw, &bw = st.bw, &apw = st.apw;
                    auto &bpw = st.bpw, &edp = st.edp;
                    auto& used = st.used;
                    const double L = st.L, lse_abs = st.lse_abs, qabs = st.qabs, doabs = st.doabs;
                    double D = st.D, dbar = st.dbar, dpsum = st.dpsum;
                    dbar = dbar * grow;
                    const double Da = std::fabs(D) + rho * dbar;
                    // D's own roundings (textbook Σ_l P dP, or flash dO·O with O's sums and storage).
                    const double sig_d = u * (std::sqrt(sk_d + 3) + std::sqrt(static_cast<double>(dv) + 3)) * dbar;
                    // τ̂_i: a weight's relative error that may repeat with equal operands (exp argument, exp,
                    // lse, the division), doubled for a backward that recomputes P; with the logits' η.
                    const double eta_s = (static_cast<double>(dk) + 6) * eta * std::max(1.0, s) + s * (eta_q * kabs_max + eta_k * qabs);
                    const double tau = u * (2 * L + 2 * lse_abs + 10) + eta_s;
                    const double eta_p = 4 * eta;
                    double abar = 0, adS = 0, bbar = 0, bdS = 0, cbar = 0, cdS = 0, apbar = 0, bpbar = 0, cpbar = 0, sumdS = 0;
                    double awbar = 0, awdS = 0, bwbar = 0, bwdS = 0, apwbar = 0, bpwbar = 0;
                    double eta_d = (sk_d + static_cast<double>(dv) + 4) * eta;
                    for (std::size_t l = 0; l < Sk; ++l)
                        if (used[l]) {
                            edp[l] = (static_cast<double>(dv) + 2) * eta + eta_do * vabs[l] + eta_v * doabs;
                            eta_d += P[l] * edp[l];
                        }
                    for (std::size_t l = 0; l < Sk; ++l) {
                        if (!used[l]) continue;
                        dS[l] = P[l] * (dP[l] - D);
                        dSa[l] = std::fabs(dS[l]) + rho * P[l] * (dpabs[l] + dbar);
                        f[l] = 4 * u2 * s * s * dSa[l] * dSa[l];  // dS's three roundings and the dQ (dK) product
                        eds[l] = 3 * eta + P[l] * (edp[l] + eta_d) + eta_p * (dpabs[l] + dbar + dpsum);
                        const double c = std::sqrt(c2[l]), cp = std::sqrt(cp2[l]);
                        abar += P[l] * a[l], adS += dSa[l] * a[l], bbar += P[l] * bb[l], bdS += dSa[l] * bb[l];
                        cbar += P[l] * c, cdS += dSa[l] * c, apbar += P[l] * ap[l], bpbar += P[l] * bp[l], cpbar += P[l] * cp;
                        sumdS += dSa[l];
                        awbar += P[l] * aw[l], awdS += dSa[l] * aw[l], bwbar += P[l] * bw[l], bwdS += dSa[l] * bw[l];
                        apwbar += P[l] * apw[l], bpwbar += P[l] * bpw[l];
                    }
                    st.Da = Da, st.sig_d = sig_d, st.tau = tau, st.eta_p = eta_p;
                    st.abar = abar, st.adS = adS, st.bbar = bbar, st.bdS = bdS, st.cbar = cbar, st.cdS = cdS, st.apbar = apbar;
                    st.bpbar = bpbar, st.cpbar = cpbar, st.sumdS = sumdS, st.awbar = awbar, st.awdS = awdS, st.bwbar = bwbar;
                    st.bwdS = bwdS, st.apwbar = apwbar, st.bpwbar = bpwbar;
                }
                for (std::size_t r = 0; r < nr; ++r) {
                    row_state& st = rows[r];
                    auto &kbar = st.kbar, &kba = st.kba, &dqv = st.dqv, &dqm = st.dqm, &ov = st.ov, &om = st.om;
                    // dQ_ic and the head output O_ic: centres first (K̄, dQ, O), then the errors; keys outer,
                    // features inner (contiguous rows of K, V and of the group's dK, dV accumulators).
                    std::fill(kbar.begin(), kbar.end(), 0.0), std::fill(kba.begin(), kba.end(), 0.0);
                    std::fill(dqv.begin(), dqv.end(), 0.0), std::fill(dqm.begin(), dqm.end(), 0.0);
                    std::fill(ov.begin(), ov.end(), 0.0), std::fill(om.begin(), om.end(), 0.0);
                }
                for (std::size_t l = 0; l < Sk; ++l)
                    for (std::size_t r = 0; r < nr; ++r) {
                        row_state& st = rows[r];
                        auto &P = st.P, &dS = st.dS, &dSa = st.dSa, &kbar = st.kbar, &kba = st.kba, &dqv = st.dqv, &dqm = st.dqm, &ov = st.ov;
                        auto &om = st.om;
                        const auto& used = st.used;
                        if (!used[l]) continue;
                        const double *kr = &K.value(b, hk, l, 0), *km = &K.mag(b, hk, l, 0), *vr = &V.value(b, hk, l, 0), *vm = &V.mag(b, hk, l, 0);
                        const double pl = P[l], dsl = dS[l], dsa = dSa[l];
                        for (std::size_t c = 0; c < dk; ++c) {
                            const double ka = std::fabs(kr[c]) + rho * km[c];
                            kbar[c] += pl * kr[c], kba[c] += pl * ka, dqv[c] += dsl * kr[c], dqm[c] += dsa * ka;
                        }
                        for (std::size_t c = 0; c < dv; ++c) ov[c] += pl * vr[c], om[c] += pl * (std::fabs(vr[c]) + rho * vm[c]);
                    }
                for (std::size_t r = 0; r < nr; ++r) {
                    row_state& st = rows[r];
                    auto &kbar = st.kbar, &kbar_abs = st.kbar_abs, &kba = st.kba, &dqv = st.dqv, &dqm = st.dqm, &dqa = st.dqa, &ov = st.ov, &om = st.om;
                    auto &oa = st.oa;
                    for (std::size_t c = 0; c < dk; ++c) {
                        dqv[c] *= s, dqm[c] *= s;
                        kbar_abs[c] = std::fabs(kbar[c]) + rho * kba[c];
                        dqa[c] = std::fabs(dqv[c]) + rho * dqm[c];
                    }
                    for (std::size_t c = 0; c < dv; ++c) oa[c] = std::fabs(ov[c]) + rho * om[c];
                }
                for (std::size_t r = 0; r < nr; ++r) {
                    row_state& st = rows[r];
                    auto &qstd = st.qstd, &qstdo = st.qstdo, &qvar = st.qvar, &qshv = st.qshv, &qshl = st.qshl, &qlin = st.qlin, &ostd = st.ostd, &ovar = st.ovar;
                    auto &oshv = st.oshv, &oshl = st.oshl, &olin = st.olin;
                    for (std::vector<double>* z : {&qstd, &qstdo, &qvar, &qshv, &qshl, &qlin, &ostd, &ovar, &oshv, &oshl, &olin})
                        std::fill(z->begin(), z->end(), 0.0);
                }
                for (std::size_t l = 0; l < Sk; ++l)
                    for (std::size_t r = 0; r < nr; ++r) {
                        const std::size_t i = i0 + r;
                        row_state& st = rows[r];
                        auto &P = st.P, &a = st.a, &bb = st.bb, &c2 = st.c2, &ap = st.ap, &bp = st.bp, &cp2 = st.cp2, &dS = st.dS;
                        auto &dSa = st.dSa, &f = st.f, &eds = st.eds, &aw = st.aw, &bw = st.bw, &apw = st.apw, &bpw = st.bpw, &qa = st.qa;
                        auto &dOa = st.dOa, &kbar = st.kbar, &kbar_abs = st.kbar_abs, &sdq = st.sdq, &sddo = st.sddo, &sdqw = st.sdqw;
                        auto &sddow = st.sddow, &kba = st.kba;
                        auto &dqa = st.dqa, &ov = st.ov, &om = st.om, &qstd = st.qstd, &qstdo = st.qstdo, &qvar = st.qvar, &qshv = st.qshv, &qshl = st.qshl;
                        auto &qlin = st.qlin, &ostd = st.ostd, &ovar = st.ovar, &oshv = st.oshv, &oshl = st.oshl, &olin = st.olin;
                        const auto& used = st.used;
                        const double Da = st.Da, sig_d = st.sig_d, tau = st.tau, eta_p = st.eta_p, abar = st.abar, adS = st.adS, bbar = st.bbar;
                        const double bdS = st.bdS, cbar = st.cbar, cdS = st.cdS, apbar = st.apbar, bpbar = st.bpbar, cpbar = st.cpbar, sumdS = st.sumdS;
                        const double awbar = st.awbar, awdS = st.awdS, bwbar = st.bwbar, bwdS = st.bwdS, apwbar = st.apwbar, bpwbar = st.bpwbar;
                        if (!used[l]) continue;
                        const double *kr = &K.value(b, hk, l, 0), *km = &K.mag(b, hk, l, 0), *ks = &K.sd(b, hk, l, 0), *ksw = &K.sdw(b, hk, l, 0);
                        const double *vr = &V.value(b, hk, l, 0), *vm = &V.mag(b, hk, l, 0), *vs = &V.sd(b, hk, l, 0), *vsw = &V.sdw(b, hk, l, 0);
                        const double *qr = &Q.value(b, h, i, 0), *gr = &dO.value(b, h, i, 0);
                        const double pl = P[l], dsl = dS[l], dsa = dSa[l], al = a[l], bl = bb[l], c2l = c2[l], apl = ap[l], bpl = bp[l], cp2l = cp2[l];
                        const double fl = f[l], edsl = eds[l], awl = aw[l], bwl = bw[l], apwl = apw[l], bpwl = bpw[l];
                        double *kval_l = &kval[l * dk], *kmag_l = &kmag[l * dk], *kKs_l = &kKs[l * dk], *kVs_l = &kVs[l * dk], *kvar_l = &kvar[l * dk],
                               *kshv_l = &kshv[l * dk], *kshl_l = &kshl[l * dk], *klin_l = &klin[l * dk];
                        // The row's dK coefficients that do not depend on the feature.
                        const double k_kks = s * dsa * std::fabs(1 - 2 * pl) * bl, k_kvs = s * pl * (1 - pl) * bpl;
                        const double k_e1 = s * dsa * (1 + 2 * pl), k_e2 = s * pl;
                        const double k_var = k_e1 * k_e1 * c2l + k_e2 * k_e2 * cp2l + fl;
                        const double k_rq = s * (dsa * (al + abar) + pl * adS), k_ro = s * pl * (apl + apbar), k_rd = s * pl * sig_d,
                                     k_rn = s * (dsa + pl * Da) * 2 * sig_nu;
                        const double k_shl = s * (dsa * (bbar + cbar) + pl * (bdS + cdS) + pl * (bpbar + cpbar)) + s * dsa * std::fabs(1 - 2 * pl) * bwl +
                                             s * (dsa * bwbar + pl * bwdS) + s * pl * (1 - pl) * bpwl + s * pl * bpwbar +
                                             s * (dsa * (awl + awbar) + pl * awdS) + s * pl * (apwl + apwbar);
                        const double k_lin = s * (2 * tau * dsa + pl * tau * sumdS + edsl);
                        const detail::b18_key_terms kt{s,   rho,  pl,   dsl,  dsa,  al,    bl,    c2l,   apl,   bpl,   cp2l,  fl,    edsl,  awl,  bwl,
                                                       apwl, bpwl, tau,  eta_k, eta_q, k_kks, k_kvs, k_var, k_rq, k_ro, k_rd, k_rn, k_shl, k_lin};
                        detail::b18_query_side(kt, kr, km, ks, ksw, kbar.data(), kba.data(), kbar_abs.data(), dqa.data(), qstd.data(), qstdo.data(),
                                               qvar.data(), qshv.data(), qshl.data(), qlin.data(), dk);
                        detail::b18_key_side(kt, qr, qa.data(), sdq.data(), sdqw.data(), kval_l, kmag_l, kKs_l, kVs_l, kvar_l, kshv_l, kshl_l, klin_l, dk);
                        double *vval_l = &vval[l * dv], *vmag_l = &vmag[l * dv], *vKs_l = &vKs[l * dv], *vvar_l = &vvar[l * dv], *vshv_l = &vshv[l * dv],
                               *vshl_l = &vshl[l * dv], *vlin_l = &vlin[l * dv];
                        const double v_ks = pl * (1 - pl) * bl, v_e1 = pl * (1 + pl), v_var = v_e1 * v_e1 * c2l + u2 * pl * pl;
                        const double v_rq = pl * (al + abar), v_rn = pl * 2 * sig_nu;
                        const double v_shl = pl * (bbar + cbar) + pl * (awl + awbar) + pl * (1 - pl) * bwl + pl * bwbar;
                        const double v_lin = pl * 2 * tau + eta_p;
                        detail::b18_output_side(pl, rho, al, bl, c2l, awl, bwl, tau, eta_p, eta_v, u2, vr, vm, vs, vsw, ov.data(), om.data(), ostd.data(),
                                                ovar.data(), oshv.data(), oshl.data(), olin.data(), dv);
                        detail::b18_value_side(pl, v_ks, v_var, v_rq, v_rn, v_shl, v_lin, eta_do, gr, dOa.data(), sddo.data(), sddow.data(), vval_l, vmag_l,
                                               vKs_l, vvar_l, vshv_l, vshl_l, vlin_l, dv);
                    }
                for (std::size_t r = 0; r < nr; ++r) {
                    const std::size_t i = i0 + r;
                    row_state& st = rows[r];
                    auto &kbar_abs = st.kbar_abs, &dqv = st.dqv, &dqm = st.dqm, &dqa = st.dqa, &ov = st.ov, &om = st.om, &oa = st.oa, &qstd = st.qstd;
                    auto &qstdo = st.qstdo, &qvar = st.qvar, &qshv = st.qshv, &qshl = st.qshl, &qlin = st.qlin, &ostd = st.ostd, &ovar = st.ovar, &oshv = st.oshv;
                    auto &oshl = st.oshl, &olin = st.olin;
                    const double Da = st.Da, sig_d = st.sig_d;
                    for (std::size_t c = 0; c < dk; ++c) {
                        const double kn = s * kbar_abs[c] * sig_d, nu = (dqa[c] + s * Da * kbar_abs[c]) * 2 * sig_nu, Pq = (dqm[c] + dqa[c]) / 2;
                        const double var = qvar[c] + kn * kn + nu * nu + u2 * ((sk_d + 1) * Pq * Pq + dqa[c] * dqa[c]);
                        dQ.value(b, h, i, c) = dqv[c];
                        dQ.mag(b, h, i, c) = dqm[c];
                        dQ.var(b, h, i, c) = qstd[c] * qstd[c] + qstdo[c] * qstdo[c] + var;
                        dQ.sh(b, h, i, c) = std::sqrt(qshv[c]) + qshl[c];
                        dQ.lin(b, h, i, c) = qlin[c] + (sk_d + 2) * eta * std::max(1.0, s);
                    }
                    for (std::size_t c = 0; c < dv; ++c) {
                        const double Po = (om[c] + oa[c]) / 2;
                        Oh.value(b, h, i, c) = ov[c];
                        Oh.mag(b, h, i, c) = om[c];
                        Oh.var(b, h, i, c) = ovar[c] + ostd[c] * ostd[c] + oa[c] * sig_nu * oa[c] * sig_nu + u2 * (sk_d + 1) * Po * Po;
                        Oh.sh(b, h, i, c) = std::sqrt(oshv[c]) + oshl[c];
                        Oh.lin(b, h, i, c) = olin[c] + (sk_d + 1) * eta;
                    }
                }
            }
        // The key rows: the group's sums over (head, row), their own roundings.
        for (std::size_t l = 0; l < Sk; ++l) {
            for (std::size_t c = 0; c < dk; ++c) {
                const std::size_t kc = l * dk + c;
                const double va = std::fabs(kval[kc]) + rho * kmag[kc], Pk = (kmag[kc] + va) / 2;
                dK.value(b, hk, l, c) = kval[kc];
                dK.mag(b, hk, l, c) = kmag[kc];
                dK.var(b, hk, l, c) = kKs[kc] * kKs[kc] + kVs[kc] * kVs[kc] + kvar[kc] + u2 * ((rows_d + 1) * Pk * Pk + va * va);
                dK.sh(b, hk, l, c) = std::sqrt(kshv[kc]) + kshl[kc];
                dK.lin(b, hk, l, c) = klin[kc] + (rows_d + 2) * eta * std::max(1.0, s);
            }
            for (std::size_t c = 0; c < dv; ++c) {
                const std::size_t vc = l * dv + c;
                const double va = std::fabs(vval[vc]) + rho * vmag[vc], Pv = (vmag[vc] + va) / 2;
                dV.value(b, hk, l, c) = vval[vc];
                dV.mag(b, hk, l, c) = vmag[vc];
                dV.var(b, hk, l, c) = vKs[vc] * vKs[vc] + vvar[vc] + u2 * (rows_d + 1) * Pv * Pv;
                dV.sh(b, hk, l, c) = std::sqrt(vshv[vc]) + vshl[vc];
                dV.lin(b, hk, l, c) = vlin[vc] + (rows_d + 1) * eta;
            }
        }
    };
    ::attnref::parallel_for_dynamic(B * Hkv, threads, group_task);

    // The projections' backward: dX = dH·Wᵀ (N terms), dW = xᵀ·dH and db = Σ_r dH (R terms). In dX the
    // row-local parts of different heads have distinct sources (each head its own projection columns,
    // cells, D, normalisation; a rounded x_e or dOut_n reaching every head carries the fan-out H above):
    // Minkowski within a head, quadrature across heads; the shared parts Minkowski over all N. A source
    // may sit in both classes of one element (self-attention: x_i's rounding in Q_i and K_i; a cell in
    // dK's own and cross terms): (‖c₁‖ + ‖c₂‖)² ≤ 2(‖c₁‖² + ‖c₂‖²), hence the factor 2 on the variance.
    // The products use rounded W (dX) or x (dW, dW_o's dOut): u² + u_in² per product.
    mha_gradient_bounds r;
    const double up2 = u2 + ui2;
    auto finish = [&](double var, double lin) { return (lambda * std::sqrt(2 * var) + lin) * (1 + 0x1p-20); };
    // dW = xᵀ·dH (and, with `bias`, db = Σ_r dH): out (E, N) and bias (N); x exact (rounded when u_in > 0),
    // g carrying the errors. Also dW_o = mergedᵀ·dOut, transposed: x = dOut, g = the head outputs.
    auto weight_sums = [&](tensor_view<const double, 3> x, const detail::b18_merged& g, tensor<double, 2>& out, tensor<double, 1>* bias) {
        const std::size_t E = x.extents[2], N = g.value.extents()[2], R = x.extents[0] * x.extents[1];
        out = tensor<double, 2>({E, N}, 0.0);
        if (bias) *bias = tensor<double, 1>({N}, 0.0);
        std::vector<double> ga(R * N), ga_col(N, 0.0);
        for (std::size_t n = 0; n < R * N; ++n) ga[n] = std::fabs(g.value[n]) + rho * g.mag[n], ga_col[n % N] += ga[n];
        // Input features in blocks of four per task: each row of the merged gradient (five arrays of N)
        // is read once for the block's features instead of once per feature (at LLM size those arrays
        // are R·N = 2^21 doubles each, far beyond the caches). Every element sums its rows in order.
        constexpr std::size_t feature_block = 4;
        auto over_rows = [&](std::size_t e0, std::size_t ne) {  // features e0 … e0 + ne − 1; e = E: the bias (x = 1, not rounded)
            thread_local std::vector<double> acc;  // per feature: vl, mk, sq, ab, sg, ln (N each)
            acc.assign(6 * ne * N, 0.0);
            for (std::size_t rr = 0; rr < R; ++rr)
                for (std::size_t k = 0; k < ne; ++k) {
                    const std::size_t e = e0 + k;
                    const double xv = e < E ? x[rr * E + e] : 1.0;
                    double* a = &acc[6 * k * N];
                    detail::b18_dw_update(xv, &g.value[rr * N], &g.var[rr * N], &g.sh[rr * N], &g.lin[rr * N], &ga[rr * N], a, a + N, a + 2 * N,
                                          a + 3 * N, a + 4 * N, a + 5 * N, N);
                }
            for (std::size_t k = 0; k < ne; ++k) {
                const std::size_t e = e0 + k;
                double* dst = e < E ? &out(e, 0) : &(*bias)[0];
                const double *vl = &acc[6 * k * N], *mk = vl + N, *sq = vl + 2 * N, *ab = vl + 3 * N, *sg = vl + 4 * N, *ln = vl + 5 * N;
                const double uprod = e < E ? up2 : u2, ein = e < E ? eta_in : 0.0;
                for (std::size_t c = 0; c < N; ++c) {
                    const double Pn = (ab[c] + std::fabs(sg[c]) + rho * ab[c]) / 2;
                    dst[c] = finish(vl[c] + mk[c] * mk[c] + uprod * sq[c] + u2 * (static_cast<double>(R) + 1) * Pn * Pn,
                                    ln[c] + (static_cast<double>(R) + 1) * eta + ein * ga_col[c]);
                }
            }
        };
        const std::size_t F = bias ? E + 1 : E;
        ::attnref::parallel_for_dynamic((F + feature_block - 1) / feature_block, threads, [&](std::size_t t) {
            over_rows(t * feature_block, std::min(feature_block, F - t * feature_block));
        });
    };
    auto linear = [&](tensor_view<const double, 3> x, tensor_view<const double, 2> w, const detail::b18_merged& g, std::size_t hd,
                      tensor<double, 3>& gx, tensor<double, 2>& gw, tensor<double, 1>& gb) {
        const std::size_t Bx = x.extents[0], S = x.extents[1], E = x.extents[2], N = w.extents[1], R = Bx * S;
        gx = tensor<double, 3>({Bx, S, E}, 0.0);
        std::vector<double> ga(R * N), sdv(R * N), wt(N * E), wta(N * E);
        for (std::size_t n = 0; n < R * N; ++n) ga[n] = std::fabs(g.value[n]) + rho * g.mag[n], sdv[n] = std::sqrt(g.var[n]);
        for (std::size_t e = 0; e < E; ++e)
            for (std::size_t c = 0; c < N; ++c) wt[c * E + e] = w(e, c), wta[c * E + e] = std::fabs(w(e, c));
        // Rows in blocks of four per task: each row of Wᵀ and |W|ᵀ (E each) is read once for the block's
        // rows instead of once per row. Every element sums its columns c in order.
        constexpr std::size_t row_block = 4;
        ::attnref::parallel_for_dynamic((R + row_block - 1) / row_block, threads, [&](std::size_t task) {
            const std::size_t r0 = task * row_block, nr = std::min(row_block, R - r0);
            thread_local std::vector<double> acc;  // per row: mh, vh, ms, sq, ab, sg, ln (E each)
            acc.assign(7 * nr * E, 0.0);
            double ga_row[row_block] = {};
            for (std::size_t c = 0; c < N; ++c)
                for (std::size_t k = 0; k < nr; ++k) {
                    const std::size_t rr = r0 + k;
                    double *mh = &acc[7 * k * E], *vh = mh + E, *ms = mh + 2 * E, *sq = mh + 3 * E, *ab = mh + 4 * E, *sg = mh + 5 * E, *ln = mh + 6 * E;
                    const double t = sdv[rr * N + c], sh = g.sh[rr * N + c], a_ = ga[rr * N + c], v = g.value[rr * N + c], li = g.lin[rr * N + c];
                    ga_row[k] += a_;
                    detail::b18_dx_update(&wt[c * E], &wta[c * E], t, sh, a_, v, li, mh, ms, sq, ab, sg, ln, E);
                    if ((c + 1) % hd == 0)
                        for (std::size_t e = 0; e < E; ++e) vh[e] += mh[e] * mh[e], mh[e] = 0;
                }
            for (std::size_t k = 0; k < nr; ++k) {
                const std::size_t rr = r0 + k;
                const double *vh = &acc[7 * k * E] + E, *ms = vh + E, *sq = vh + 2 * E, *ab = vh + 3 * E, *sg = vh + 4 * E, *ln = vh + 5 * E;
                for (std::size_t e = 0; e < E; ++e) {
                    const double Pn = (ab[e] + std::fabs(sg[e]) + rho * ab[e]) / 2;
                    gx[rr * E + e] = finish(vh[e] + ms[e] * ms[e] + up2 * sq[e] + u2 * (static_cast<double>(N) + 1) * Pn * Pn,
                                            ln[e] + (static_cast<double>(N) + 1) * eta + eta_in * ga_row[k]);
                }
            }
        });
        weight_sums(x, g, gw, &gb);
    };
    linear(x_q, p.w_q, detail::b18_merge(dQ), dk, r.grad_x_q, r.grad_w_q, r.grad_b_q);
    linear(x_k, p.w_k, detail::b18_merge(dK), dk, r.grad_x_k, r.grad_w_k, r.grad_b_k);
    linear(x_v, p.w_v, detail::b18_merge(dV), dv, r.grad_x_v, r.grad_w_v, r.grad_b_v);
    {
        // dW_o = mergedᵀ·dOut: weight_sums with dOut as the exact operand, transposed; db_o = Σ_r dOut (exact terms).
        tensor<double, 2> wo_sums;
        weight_sums(grad_output, detail::b18_merge(Oh), wo_sums, nullptr);
        const std::size_t R = B * Sq, Mo = H * dv;
        r.grad_w_o = tensor<double, 2>({Mo, Eo}, 0.0);
        for (std::size_t n = 0; n < Eo; ++n)
            for (std::size_t mm = 0; mm < Mo; ++mm) r.grad_w_o(mm, n) = wo_sums(n, mm);
        r.grad_b_o = tensor<double, 1>({Eo}, 0.0);
        for (std::size_t n = 0; n < Eo; ++n) {
            double ab = 0, sg = 0, sq = 0;
            for (std::size_t rr = 0; rr < R; ++rr) {
                const double gv = grad_output[rr * Eo + n];
                ab += std::fabs(gv), sg += gv, sq += gv * gv;
            }
            const double Pn = (ab + std::fabs(sg)) / 2 * grow;
            r.grad_b_o[n] = finish(ui2 * sq * grow + u2 * (static_cast<double>(R) + 1) * Pn * Pn,
                                   static_cast<double>(R + 1) * eta + static_cast<double>(R) * eta_in);
        }
    }
    return r;
}

}  // namespace attnref
