#pragma once
/// \file bounds/tolerance/data_aware.hpp
/// Owns: the data-aware bound of the default `data-aware` tolerance model (docs/error-bounds.md §4,
/// eqs. 15–22): a per-element probabilistic rounding-error bound λ·u·√(Σ c_e²) (Higham & Mary;
/// Azuma–Hoeffding, λ = 8) for SDPA and multi-head attention, computed from the shapes and the golden
/// case's own values, capped by the rigorous worst-case bound (tolerance/worst_case.hpp).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "attnref/core/attention.hpp"
#include "attnref/bounds/error_bounds.hpp"
#include "attnref/core/multi_head_attention.hpp"
#include "attnref/core/tensor.hpp"
#include "attnref/core/parallel.hpp"
#include "attnref/bounds/tolerance/names.hpp"
#include "attnref/bounds/tolerance/parallel_bounds.hpp"
#include "attnref/bounds/tolerance/worst_case.hpp"

namespace attnref::tolerance {

/// Two coefficients of a rounding-error term: its value is acc·u_acc^k + store·u^k, with k = 2 for
/// variance-like terms and k = 1 for linear ones (u_acc, u: see data_aware_scales::bound).
struct two_part {
    double acc = 0, store = 0;
    two_part& operator+=(const two_part& o) {
        acc += o.acc, store += o.store;
        return *this;
    }
    friend two_part operator*(double a, const two_part& t) { return {a * t.acc, a * t.store}; }
    friend two_part operator+(two_part a, const two_part& b) { return a += b; }
    /// Componentwise maximum: an upper bound of the maximum of the two evaluated terms.
    static two_part max(const two_part& a, const two_part& b) { return {std::max(a.acc, b.acc), std::max(a.store, b.store)}; }
};

/// Confidence parameter λ of the data-aware model: a bound λ·u·√(Σ c_e²) on Σ c_e δ_e fails with
/// probability at most 2·exp(−λ²/2) ≈ 2.5e-14 per element (Azuma–Hoeffding) under the model.
inline constexpr double data_aware_lambda = 8;

/// Per-element terms of the data-aware (probabilistic, first-order) bound (docs/error-bounds.md §4).
struct data_aware_scales {
    std::vector<two_part> coupled;      ///< variance of the logit- and softmax-path errors (Σ c_e², per unit roundoff²)
    std::vector<two_part> independent;  ///< variance of the value-path, P·V, W_o and storage errors
    std::vector<two_part> linear;       ///< worst-case terms summed as absolute values (correlated roundings, floor)
    std::vector<two_part> logit_var;    ///< the largest logit variance of the element's rows (second-order factor)
    std::vector<double> logit_linear;   ///< the largest linear logit perturbation, per u_acc (second-order factor)
    /// σ_c = Σ_j p_j|v_jc| (through |W_o| for multi-head): the part of `linear.store` that is P's storage
    /// rounding, counted twice there (P stored, and benchdnn's floor); the rest of linear.store is the
    /// logit-level constants' rounding (scale, softcap, slopes: 3·Σ_j p_j·M_j·|v_jc − o_c|). Lets a
    /// declared policy (bound(e, policy_roundoffs)) put each in its own format.
    std::vector<double> sigma_linear;
    /// Multi-head only, σ_P ≤ sigma_linear: P's storage rounding by value through W_o. A weight P_hij is
    /// rounded once for all the head's dv features, so its error reaches y_l as δ_hij·p_hij·(V_hj·W_o^h)_l:
    /// σ_P,l = Σ_{h,j} p_hij |Σ_c V_hjc W_o[h·dv + c, l]| (+ those double sums' rounding) instead of
    /// Σ_{h,c} σ_hc |W_o[h·dv + c, l]|. Empty (too large a case, or SDPA): sigma_linear is used.
    std::vector<double> sigma_weights;
    /// The exact output value per element: its storage rounding, u²·o² in `independent.store`, is one
    /// rounding of the computed value, which a declared policy bounds as such (bound(e, policy_roundoffs)).
    std::vector<double> output_value;
    double lambda = data_aware_lambda;
    /// The rigorous worst-case bound of the same case: where it is smaller (short sums), it is used.
    worst_case_scales worst_case;
    /// Per attention row (b, h, i): the logit variance and linear logit term (for weights_bound).
    std::vector<two_part> row_logit_var;
    std::vector<double> row_logit_linear;
    std::size_t n_keys = 0;
    /// SDPA only (empty for multi-head): per element (b,h,i,c), the row's largest weight p* = max_j p_j
    /// and |v_j*c| of its key j* (the first in key order), for the dominant key's P-storage term of a
    /// declared policy (dominant_key_rounding).
    std::vector<double> dominant_weight, dominant_value;

    /// ε (eq. 21): a bound on every logit perturbation of the row.
    double logit_epsilon(const two_part& var, double linear_term, double u, double u_acc) const {
        return lambda * std::sqrt(var.acc * u_acc * u_acc + var.store * u * u) + linear_term * u_acc;
    }
    /// ε for every attention row (b, h, i).
    std::vector<double> logit_bounds(double u, double u_acc) const {
        std::vector<double> eps(row_logit_var.size());
        for (std::size_t r = 0; r < eps.size(); ++r) eps[r] = logit_epsilon(row_logit_var[r], row_logit_linear[r], u, u_acc);
        return eps;
    }

    std::size_t size() const { return coupled.size(); }
    /// u: the candidate format's unit roundoff (storage: inputs, Q/K/V, P, head outputs, output);
    /// u_acc: that of its accumulation (see accumulate_roundoff). +inf when the first-order model
    /// breaks down (logit perturbations of order 1: the bound is then vacuous, and reported so).
    double bound(std::size_t e, double u, double u_acc) const {
        const double ua2 = u_acc * u_acc, us2 = u * u;
        const double eps = logit_epsilon(logit_var[e], logit_linear[e], u, u_acc);
        const double g = error_bounds::second_order_factor(2 * eps);  // (e^{2ε} − 1)/(2ε) ≥ 1 (eq. 6)
        // g·x with g = +inf (ε beyond exp's range) and x = 0 is 0 here, not NaN.
        const auto times = [](double a, double x) { return x == 0 ? 0.0 : a * x; };
        const double var = times(g * g, coupled[e].acc * ua2 + coupled[e].store * us2) + independent[e].acc * ua2 +
                           independent[e].store * us2;
        // Storage underflow (eq. 26), a worst-case term: the worst-case scales carry its coefficients.
        const double under = worst_case.underflow.size() == size() ? times(g, worst_case.underflow[e].at(u, u_acc)) : 0.0;
        const double b = (lambda * std::sqrt(var) + times(g, linear[e].acc * u_acc + linear[e].store * u) + under) * (1 + 0x1p-40);
        if (worst_case.size() != size()) return b;  // (1 + 2⁻⁴⁰): this evaluation's own rounding
        // Both are upper bounds (the worst-case one rigorous to every order, see worst_case_scales::
        // bound), so the smaller is one too; a NaN b stays NaN (reported as vacuous, never a pass).
        const double w = worst_case.bound(e, u, u_acc);
        return w < b ? w : b;
    }
    double bound(std::size_t e, double u) const { return bound(e, u, u); }

    /// The P-storage rounding of a row's dominant key (docs/error-bounds.md eq. 27), as an absolute
    /// error of its weight; +inf where it does not apply. A policy rounds S·x to P's format (unit
    /// roundoff u_P, S = a power of two in [1, 256]: S·1 is then a normal number of every P format of
    /// the registry), x the key's weight before the cast, normalised (x = p̃*) or not (x = e^{S̃* − m̃}
    /// with m̃ the largest logit seen so far, FlashAttention's online softmax). With logits within ε of
    /// the exact ones, exp, the row sum of n keys and the division within (n + 4)·u_acc relative, both
    /// are ≥ lo = p*·e^{−2ε}·(1 − γ) and ≤ 1 + 2u_acc. If lo ≥ 1 − u_P/2 every such S·x lies between
    /// the midpoints S(1 − u_P/2) and S(1 + u_P) around S (ties go to S, whose significand is even):
    /// the stored value is exactly S, the weight used is exactly 1 (or e⁰/l̃, whose rounding the
    /// normalisation's terms count), and the rounding moved it by |1 − x| ≤ max(1 − lo, 2u_acc): d*.
    static double dominant_key_rounding(double p, double eps, double u_p, double u_acc, double S, std::size_t n) {
        const double inf = std::numeric_limits<double>::infinity();
        int ex = 0;
        if (!(u_p > 2 * u_acc) || !(S >= 1 && S <= 256) || std::frexp(S, &ex) != 0.5 || !(p > 0.5) || !(eps >= 0)) return inf;
        const double nu = (static_cast<double>(n) + 4) * u_acc;
        if (!(nu < 0.25)) return inf;
        const double gamma = nu / (1 - nu) * (1 + 0x1p-40);
        const double lo = p * std::exp(-2 * eps) * (1 - gamma) * (1 - 0x1p-40);  // rounded low by the 2⁻⁴⁰ factor
        if (!(lo >= 1 - u_p / 2)) return inf;
        return std::max(1 - lo, 2 * u_acc) * (1 + 0x1p-40);
    }

    /// The bound of a candidate that declares its policy (attnref check --policy): the same terms
    /// (eqs. 15–22, 26), each rounding in the format the policy performs it in — storage roundings
    /// (inputs, Q/K/V, head outputs, output, benchdnn's floor) in u_s = storage_but_weights(), P's
    /// storage in u_P (its underflow η(u_P)/S with P's static scale S), the logit-level constants and
    /// stored logits in logit_level() — instead of one u for all of them. Capped by the worst-case
    /// bound of the policy's widest storage (valid for it). Without sigma_linear (scales built by hand):
    /// bound(e, widest, accumulate).
    double bound(std::size_t e, const policy_roundoffs& pr) const {
        const double u_acc = pr.accumulate, u_s = pr.storage_but_weights(), u_p = pr.weights, u_c = pr.logit_level();
        if (sigma_linear.size() != size() || output_value.size() != size()) return bound(e, pr.widest_storage(), u_acc);
        const double ua2 = u_acc * u_acc, us2 = u_s * u_s;
        const double eps = logit_epsilon(logit_var[e], logit_linear[e], u_s, u_acc);
        const double g = error_bounds::second_order_factor(2 * eps);
        const auto times = [](double a, double x) { return x == 0 ? 0.0 : a * x; };
        // The output's own storage rounding, fl(ô) = ô(1 + δ) with |δ| ≤ u_out, comes last:
        // |fl(ô) − o| ≤ (1 + u_out)·|ô − o| + u_out·|o|. Its u²·o² leaves the variance (the rest of
        // independent.store, summed in double from nonnegative terms, up to relative 2⁻⁴⁰).
        const double o2 = output_value[e] * output_value[e], ist = independent[e].store;
        const double ind_store = std::max(0.0, ist - o2) + 0x1p-40 * ist;
        const double var = times(g * g, coupled[e].acc * ua2 + coupled[e].store * us2) + independent[e].acc * ua2 + ind_store * us2;
        // linear.store = 2σ + C, both summed in double from nonnegative terms: C ≤ linear.store − 2σ
        // up to the two sums' rounding (relative 2⁻³⁰ covers 2²² terms).
        const double sg = sigma_linear[e], st = linear[e].store;
        const double consts = std::max(0.0, st - 2 * sg) + 0x1p-30 * st;
        // P's storage rounding: u_P·Σ_j p_j|v_jc| (σ; multi-head: sigma_weights, by value through W_o),
        // but for a dominant key whose stored weight the rounding fixes (SDPA, dominant_key_rounding):
        // its u_P·p*|v*| becomes d*·|v*|. σ − p*|v*| is summed in double from nonnegative terms:
        // relative 2⁻³⁰ covers its rounding as above.
        const double sp = sigma_weights.size() == size() ? sigma_weights[e] : sg;
        double p_store = sp * u_p;
        if (dominant_weight.size() == size() && dominant_value.size() == size()) {
            const double d = dominant_key_rounding(dominant_weight[e], eps, u_p, u_acc, pr.weights_scale, n_keys);
            const double pv = dominant_weight[e] * dominant_value[e];
            if (d < dominant_weight[e] * u_p) p_store = (std::max(0.0, sg - pv) + 0x1p-30 * sg) * u_p + d * dominant_value[e];
        }
        const double lin = linear[e].acc * u_acc + p_store + sg * u_s + consts * u_c;
        const double eta_p = error_bounds::underflow_eta(u_p) / pr.weights_scale;
        const double under = worst_case.underflow.size() == size() ? times(g, worst_case.underflow[e].at_policy(u_s, u_acc, eta_p)) : 0.0;
        const double b = ((lambda * std::sqrt(var) + times(g, lin) + under) * (1 + pr.output) + pr.output * std::fabs(output_value[e])) *
                         (1 + 0x1p-40);
        if (worst_case.size() != size()) return b;
        const double w = worst_case.bound(e, pr.widest_storage(), u_acc);
        return w < b ? w : b;
    }
};

namespace detail {
/// A bound on every partial sum of terms whose positive ones add up to `pos` and whose negative ones
/// to −`neg`, in whatever order and grouping they are summed: max(pos, neg) (rounded upward).
inline double partial_sum_bound(double pos, double neg) { return std::max(pos, neg) * (1 + 0x1p-48); }

/// Exact values and error variances (Σ c_e² per unit roundoff², two_part) of the q, k, v one
/// attention reads, in the layouts (B,H,Sq,dk), (B,Hkv,Sk,dk), (B,Hkv,Sk,dv).
struct head_inputs {
    tensor_view<const double, 4> q, k, v;
    std::span<const two_part> var_q, var_k, var_v;
};

/// Per (b,h,i,c) terms of the head output o = softmax(S)·V and per (b,h,i) logit terms.
struct head_terms {
    std::vector<two_part> coupled, independent, linear, logit_var;  // logit_var per (b,h,i)
    std::vector<double> logit_linear, out;                          // logit_linear per (b,h,i); out = o per (b,h,i,c)
    std::vector<double> sigma;                                      // σ_c = Σ_j p_j|v_jc| per (b,h,i,c)
    std::vector<double> dominant_p, dominant_v;                     // max_j p_j per (b,h,i); |v_j*c| per (b,h,i,c)
};

/// The data-aware terms of one attention (eqs. 15–19 of docs/error-bounds.md). `logits`
/// and `p` are the reference's (B,H,Sq,Sk); keys with p_j = 0 (masked, underflowed) add nothing.
inline head_terms attention_terms(const head_inputs& in, tensor_view<const double, 4> logits, tensor_view<const double, 4> p,
                                  double scale, std::size_t threads = 0) {
    const auto [batch, heads, sq, dk] = in.q.extents;
    const std::size_t kv = in.k.extents[1], sk = in.k.extents[2], dv = in.v.extents[3], group = heads / kv;
    const double s = abs_d(scale), s2 = scale * scale, n = static_cast<double>(sk);
    head_terms t;
    t.coupled.assign(batch * heads * sq * dv, {});
    t.independent.assign(t.coupled.size(), {});
    t.linear.assign(t.coupled.size(), {});
    t.out.assign(t.coupled.size(), 0.0);
    t.sigma.assign(t.coupled.size(), 0.0);
    t.dominant_p.assign(batch * heads * sq, 0.0);
    t.dominant_v.assign(t.coupled.size(), 0.0);
    t.logit_var.assign(batch * heads * sq, {});
    t.logit_linear.assign(batch * heads * sq, 0.0);
    // Var(v)'s two halves apart, for the vectorised per-key loop (kernels::key_contribution).
    std::vector<double> vv_acc(in.var_v.size()), vv_store(in.var_v.size());
    for (std::size_t e = 0; e < in.var_v.size(); ++e) vv_acc[e] = in.var_v[e].acc, vv_store[e] = in.var_v[e].store;
    // K and Var(K)'s halves transposed per (b, g) to (c, j), and Var(q)'s halves apart, for the
    // per-key dot products a pack of keys at a time (kernels::key_dot_block).
    const std::size_t skT = simd::transposed_stride(sk);  // row stride of the transposed arrays
    std::vector<double> kT(batch * kv * dk * skT), vkT_acc(kT.size()), vkT_store(kT.size()), vq_acc(in.var_q.size()), vq_store(in.var_q.size());
    for (std::size_t bg = 0; bg < batch * kv; ++bg)
        for (std::size_t j = 0; j < sk; ++j)
            for (std::size_t c = 0; c < dk; ++c) {
                const std::size_t from = (bg * sk + j) * dk + c, to = (bg * dk + c) * skT + j;
                kT[to] = in.k.data[from], vkT_acc[to] = in.var_k[from].acc, vkT_store[to] = in.var_k[from].store;
            }
    for (std::size_t e = 0; e < in.var_q.size(); ++e) vq_acc[e] = in.var_q[e].acc, vq_store[e] = in.var_q[e].store;
    // Rows (b, h, i) in blocks on the threads, the keys of each pass in tiles of key_tile (a multiple
    // of the pack) that the block's rows go through in turn while the tile is in cache; every row
    // still takes its keys in order in each pass, so no value depends on the blocking or the split.
    constexpr std::size_t block = 8, key_tile = 32 * simd::lanes;
    const std::size_t rows = batch * heads * sq;
    ::attnref::parallel_for_dynamic((rows + block - 1) / block, threads, [&](std::size_t task) {
    const std::size_t r0 = task * block, nr = std::min(block, rows - r0);
    std::vector<double> sigma_all(nr * dv, 0.0), k2_all(nr * dk, 0.0), d2_all(nr * dv, 0.0), acc_all(nr * 6 * dv, 0.0), m_all(nr);
    std::vector<two_part> eps_var_all(nr);
    std::vector<double> eps_lin_all(nr, 0.0), pmax_all(nr, 0.0);
    std::vector<std::size_t> jmax_all(nr, sk);
    auto for_tiles = [&](auto&& body) {  // body(k, row, b, h, i, g, j_begin, j_end)
        for (std::size_t jt = 0; jt < sk; jt += key_tile)
            for (std::size_t k = 0; k < nr; ++k) {
                const std::size_t row = r0 + k, b = row / (heads * sq), h = row / sq % heads, i = row % sq, g = h / group;
                body(k, row, b, h, i, g, jt, std::min(sk, jt + key_tile));
            }
    };
    for (std::size_t k = 0; k < nr; ++k) m_all[k] = -std::numeric_limits<double>::infinity();
    // Pass 1: o_c += p_j v_jc, σ_c += p_j |v_jc|, Σ_j p_j k_jc², the largest finite logit.
    for_tiles([&](std::size_t k, std::size_t row, std::size_t b, std::size_t h, std::size_t i, std::size_t g, std::size_t j0, std::size_t j1) {
        double* o = &t.out[row * dv];
        for (std::size_t j = j0; j < j1; ++j) {
            const double pj = p(b, h, i, j);
            if (!(pj > 0)) continue;  // false for 0 and NaN
            if (pj > pmax_all[k]) pmax_all[k] = pj, jmax_all[k] = j;  // the first largest weight
            const double sj = logits(b, h, i, j);
            if (std::isfinite(sj)) m_all[k] = std::max(m_all[k], sj);
            kernels::weighted_value(pj, &in.v(b, g, j, 0), dv, o, &sigma_all[k * dv]);
            kernels::weighted_square(pj, &in.k(b, g, j, 0), dk, &k2_all[k * dk]);
        }
    });
    // Pass 2: Σ_j p_j (v_jc − o_c)².
    for_tiles([&](std::size_t k, std::size_t row, std::size_t b, std::size_t h, std::size_t i, std::size_t g, std::size_t j0, std::size_t j1) {
        for (std::size_t j = j0; j < j1; ++j) {
            const double pj = p(b, h, i, j);
            if (!(pj > 0)) continue;
            kernels::weighted_deviation_square(pj, &in.v(b, g, j, 0), &t.out[row * dv], dv, &d2_all[k * dv]);
        }
    });
    // Pass 3: the per-key logit terms and their contributions to the row's terms.
    for_tiles([&](std::size_t k, std::size_t row, std::size_t b, std::size_t h, std::size_t i, std::size_t g, std::size_t j0, std::size_t j1) {
                const double* q = &in.q(b, h, i, 0);
                const two_part* vq = &in.var_q[row * dk];
                const double* o = &t.out[row * dv];
                double* acc = &acc_all[k * 6 * dv];
                double *cpl_a = acc, *cpl_s = cpl_a + dv, *lin_a = cpl_s + dv, *lin_s = lin_a + dv, *ind_a = lin_s + dv, *ind_s = ind_a + dv;
                auto live = [&](std::size_t j) { return p(b, h, i, j) > 0; };  // false for 0 and NaN
                const double m = m_all[k];
                two_part& eps_var = eps_var_all[k];
                double& eps_lin = eps_lin_all[k];
                kernels::key_dots block_dots;
                const std::size_t kt_at = (b * kv + g) * dk * skT;
                for (std::size_t j = j0; j < j1; ++j) {
                    const std::size_t lane = j % simd::lanes;
                    const bool packed = j - lane + simd::lanes <= sk;  // j's pack of keys lies within the row
                    if (packed && lane == 0) {  // the dot products of keys j … j + lanes − 1 at once, when one is live
                        bool any = false;
                        for (std::size_t l = 0; l < simd::lanes; ++l) any = any || live(j + l);
                        if (any)
                            kernels::key_dot_block(q, &vq_acc[row * dk], &vq_store[row * dk], &kT[kt_at + j], &vkT_acc[kt_at + j],
                                                   &vkT_store[kt_at + j], skT, dk, block_dots);
                    }
                    if (!live(j)) continue;
                    const double pj = p(b, h, i, j), sj = logits(b, h, i, j);
                    double qk2 = 0, qka = 0, qkp = 0, qkn = 0;
                    two_part var_k_dot, var_q_dot;  // Σ_c q_c² Var(k_jc), Σ_c k_jc² Var(q_c)
                    if (packed) {
                        qk2 = block_dots.qk2[lane], qka = block_dots.qka[lane], qkp = block_dots.qkp[lane], qkn = block_dots.qkn[lane];
                        var_k_dot = {block_dots.vk_a[lane], block_dots.vk_s[lane]}, var_q_dot = {block_dots.vq_a[lane], block_dots.vq_s[lane]};
                    } else {
                        const double* kr = &in.k(b, g, j, 0);
                        const two_part* vk = &in.var_k[((b * kv + g) * sk + j) * dk];
                        for (std::size_t c = 0; c < dk; ++c) {
                            const double x = q[c] * kr[c];
                            qk2 += x * x, qka += abs_d(x);
                            (x > 0 ? qkp : qkn) += abs_d(x);
                            var_k_dot += (q[c] * q[c]) * vk[c];
                            var_q_dot += (kr[c] * kr[c]) * vq[c];
                        }
                    }
                    const double mag = s * qka + (std::isfinite(sj) ? abs_d(sj) : 0.0);  // M_j
                    const double shifted = std::isfinite(sj) ? abs_d(sj - m) : 0.0;
                    // The dot product's own roundings (dk products, dk additions with partial sums ≤ s·Σ|q k|)
                    // and four more of magnitude ≤ M_j (scale, softcap, ALiBi, additive mask).
                    const double partial = partial_sum_bound(qkp, qkn);
                    const two_part dot{s2 * (qk2 + static_cast<double>(dk) * partial * partial) + 4 * mag * mag, 0};
                    eps_var = two_part::max(eps_var, s2 * (var_q_dot + var_k_dot) + dot);
                    eps_lin = std::max(eps_lin, shifted + 4);
                    const two_part per_key = (pj * pj) * (s2 * var_k_dot + dot);
                    // Per c, with d = v_jc − o_c: cpl += d²·per_key; lin.acc += p_j|d|(shifted + 4) + p_j|v_jc|;
                    // lin.store += p_j|v_jc| + 3p_j·M_j|d|; ind += p_j²·Var(v_jc); ind.acc += p_j² v_jc².
                    const std::size_t vrow = ((b * kv + g) * sk + j) * dv;
                    kernels::key_contribution({pj, per_key.acc, per_key.store, shifted + 4, mag}, &in.v(b, g, j, 0), o, &vv_acc[vrow],
                                              &vv_store[vrow], dv, cpl_a, cpl_s, lin_a, lin_s, ind_a, ind_s);
                }
    });
    for (std::size_t k = 0; k < nr; ++k) {
                const std::size_t row = r0 + k;
                const two_part* vq = &in.var_q[row * dk];
                const double* o = &t.out[row * dv];
                const double* sigma = &sigma_all[k * dv];
                const double* k2 = &k2_all[k * dk];
                const double* d2 = &d2_all[k * dv];
                const double* acc = &acc_all[k * 6 * dv];
                const double *cpl_a = acc, *cpl_s = cpl_a + dv, *lin_a = cpl_s + dv, *lin_s = lin_a + dv, *ind_a = lin_s + dv, *ind_s = ind_a + dv;
                two_part* cpl = &t.coupled[row * dv];
                two_part* ind = &t.independent[row * dv];
                two_part* lin = &t.linear[row * dv];
                two_part vqk;  // Σ_c Var(q_c)·Σ_j p_j k_jc²
                for (std::size_t c = 0; c < dk; ++c) vqk += k2[c] * vq[c];
                for (std::size_t c = 0; c < dv; ++c) {
                    cpl[c] = {cpl_a[c], cpl_s[c]}, ind[c] = {ind_a[c], ind_s[c]}, lin[c] = {lin_a[c], lin_s[c]};
                    cpl[c] += (s2 * d2[c]) * vqk;
                    cpl[c].acc += 2 * n * sigma[c] * sigma[c];
                    ind[c].acc += n * sigma[c] * sigma[c];
                    ind[c].store += o[c] * o[c];
                    lin[c].store += sigma[c];
                    t.sigma[row * dv + c] = sigma[c];
                }
                t.dominant_p[row] = pmax_all[k];
                if (jmax_all[k] < sk) {
                    const std::size_t b = row / (heads * sq), g = row / sq % heads / group;
                    for (std::size_t c = 0; c < dv; ++c) t.dominant_v[row * dv + c] = abs_d(in.v(b, g, jmax_all[k], c));
                }
                t.logit_var[row] = eps_var_all[k];
                t.logit_linear[row] = eps_lin_all[k];
    }
    });
    return t;
}
}  // namespace detail

/// Data-aware terms for scaled dot-product attention. q, k, v are the golden inputs, p the golden
/// (certified) weights (B, H, Sq, Sk); options as the case uses them. inputs_exact: the inputs are
/// values of the candidate's format (a reference certified for the inputs the candidate reads,
/// golden/rounded_inputs.hpp), so reading them rounds nothing and their storage term is dropped.
/// terms: how the storage underflow coefficients are summed (underflow_terms_for the candidate).
inline data_aware_scales sdpa_scales(tensor_view<const double, 4> q, tensor_view<const double, 4> k,
                                     tensor_view<const double, 4> v, tensor_view<const double, 4> p,
                                     const attention_options& options, bool inputs_exact = false,
                                     underflow_terms terms = underflow_terms::per_feature) {
    const tensor<double, 4> logits = attention_logits<uniform_precision<double>>(q, k, options);
    // Rounding the inputs to the candidate's format: one rounding per element, each used by one q_i,
    // k_j, v_j; and one more in u_acc where the scale multiplies q or k (on_query, split_sqrt).
    auto input_var = [&](tensor_view<const double, 4> x) {
        std::vector<two_part> r(x.size());
        for (std::size_t n = 0; n < x.size(); ++n) r[n] = {x.data[n] * x.data[n], inputs_exact ? 0.0 : x.data[n] * x.data[n]};
        return r;
    };
    const std::vector<two_part> vq = input_var(q), vk = input_var(k), vv = input_var(v);
    const double scale = ::attnref::logit_stage::logit_scale<double>(options, q.extents[3]);
    detail::head_terms t = detail::attention_terms({q, k, v, vq, vk, vv}, logits.view(), p, scale, options.threads);
    data_aware_scales r;
    r.worst_case = sdpa_worst_case_scales(q, k, v, p, options, logits.view(), terms);
    const std::size_t dv = v.extents[3];
    r.coupled = std::move(t.coupled);
    r.independent = std::move(t.independent);
    r.linear = std::move(t.linear);
    r.logit_var.resize(r.coupled.size());
    r.logit_linear.resize(r.coupled.size());
    for (std::size_t e = 0; e < r.coupled.size(); ++e) r.logit_var[e] = t.logit_var[e / dv], r.logit_linear[e] = t.logit_linear[e / dv];
    r.sigma_linear = std::move(t.sigma);
    r.output_value = std::move(t.out);
    r.dominant_weight.resize(r.coupled.size());
    for (std::size_t e = 0; e < r.coupled.size(); ++e) r.dominant_weight[e] = t.dominant_p[e / dv];
    r.dominant_value = std::move(t.dominant_v);
    r.row_logit_var = std::move(t.logit_var);
    r.row_logit_linear = std::move(t.logit_linear);
    r.n_keys = k.extents[2];
    return r;
}

namespace detail {
/// Exact y = x·W + b (B, S, F) in double and the variance of its computed value in head layout
/// (B, F/d, S, d): products and additions in u_acc (partial sums ≤ |x|·|W| + |b|), rounding x (used
/// by the row's `uses_x` outputs), W and b (used by `uses_w` rows) and the result to storage.
inline void projection_terms(tensor_view<const double, 3> x, tensor_view<const double, 2> W, tensor_view<const double, 1> bias,
                             std::size_t heads, double uses_x, double uses_w, tensor<double, 4>& y, std::vector<two_part>& var,
                             bool inputs_exact = false, std::size_t threads = 0) {
    const std::size_t batch = x.extents[0], len = x.extents[1], in = x.extents[2], out = W.extents[1], d = out / heads;
    y = tensor<double, 4>({batch, heads, len, d});
    var.assign(y.size(), {});
    // Blocks of `block` rows (b, s) on the threads. Within a block, four features at a time for two
    // rows at a time over all the input features (kernels::projection_tile: the sums in registers,
    // the block's rows taking the same strip of W in turn while it is in cache), the features past
    // the last whole four one by one, the same operations. Every element is summed over e in order,
    // whatever the blocking or the split.
    constexpr std::size_t block = 16;
    const std::size_t rows = batch * len, whole = out - out % simd::lanes;
    const std::vector<double> panels = simd::column_panels(W.data, in, out);
    ::attnref::parallel_for_dynamic((rows + block - 1) / block, threads, [&](std::size_t task) {
        const std::size_t r0 = task * block, nr = std::min(block, rows - r0);
        std::vector<double> acc(4 * block * out, 0.0);  // per row: sum, sq, pos, neg
        for (std::size_t f = 0; f < whole; f += simd::lanes)
            for (std::size_t r = 0; r < nr; r += 2) {
                const std::size_t r1 = r + 1 < nr ? r + 1 : r;  // an odd last row is paired with itself
                kernels::projection_tile(x.data + (r0 + r) * in, x.data + (r0 + r1) * in, &panels[f * in], simd::lanes, in, &acc[4 * r * out + f],
                                         &acc[4 * r1 * out + f], out);
            }
        for (std::size_t r = 0; r < nr && whole < out; ++r) {
            const double* xr = x.data + (r0 + r) * in;
            double* a = &acc[4 * r * out];
            for (std::size_t e = 0; e < in; ++e) {
                const double xe = xr[e];
                if (xe == 0) continue;
                for (std::size_t f = whole; f < out; ++f) {
                    const double t = xe * W(e, f);
                    a[f] += t, a[out + f] += t * t;
                    (t > 0 ? a[2 * out + f] : a[3 * out + f]) += abs_d(t);
                }
            }
        }
        for (std::size_t r = 0; r < nr; ++r) {
            const std::size_t b = (r0 + r) / len, s = (r0 + r) % len;
            const double *sum = &acc[4 * r * out], *sq = sum + out, *pos = sum + 2 * out, *neg = sum + 3 * out;
            for (std::size_t f = 0; f < out; ++f) {
                const double bf = bias.empty() ? 0.0 : bias[f], yf = sum[f] + bf;
                const double m = partial_sum_bound(pos[f] + (bf > 0 ? bf : 0.0), neg[f] + (bf < 0 ? -bf : 0.0));
                const std::size_t h = f / d, c = f % d, at = ((b * heads + h) * len + s) * d + c;
                y.data()[at] = yf;
                // (+ y² in u_acc: the scale's multiplication where it is applied to q or k)
                var[at] = {sq[f] + bf * bf + static_cast<double>(in + 1) * m * m + yf * yf,
                           (inputs_exact ? 0.0 : (uses_x + uses_w) * sq[f] + uses_w * bf * bf) + yf * yf};
            }
        }
    });
}
}  // namespace detail

/// Data-aware terms for multi-head attention (see multi_head_attention.hpp for the layout);
/// inputs_exact and terms as for sdpa_scales (x, W, b values of the candidate's format: no rounding to read them).
inline data_aware_scales mha_scales(tensor_view<const double, 3> x_q, tensor_view<const double, 3> x_k,
                                    tensor_view<const double, 3> x_v, const mha_parameters<double>& w,
                                    tensor_view<const double, 4> p, const mha_options& o, bool inputs_exact = false,
                                    underflow_terms terms = underflow_terms::per_feature) {
    const mha_dims d = mha_dims_of(x_q, x_k, x_v, w, o);
    const std::size_t H = d.heads, Hkv = d.kv_heads, sq = d.query_length, sk = d.key_length, dv = d.head_dim_v,
                      eo = d.output_dim, group = H / Hkv;
    tensor<double, 4> qh, kh, vh;
    std::vector<two_part> vq, vk, vv;
    // A rounding of an input x[j, e] reaches all features of row j of every projection that reads x
    // (self-attention: Q, K and V alike), so every projection counts all H·dk + Hkv·(dk + dv) of
    // them; a rounding of W_k[e, f] or W_v[e, f] reaches all Sk keys, one of W_q[e, f] one query.
    const double uses_x = static_cast<double>(H * d.head_dim_qk + Hkv * (d.head_dim_qk + dv));
    detail::projection_terms(x_q, w.w_q, w.b_q, H, uses_x, 1, qh, vq, inputs_exact, o.attention.threads);
    detail::projection_terms(x_k, w.w_k, w.b_k, Hkv, uses_x, static_cast<double>(sk), kh, vk, inputs_exact, o.attention.threads);
    detail::projection_terms(x_v, w.w_v, w.b_v, Hkv, uses_x, static_cast<double>(sk), vh, vv, inputs_exact, o.attention.threads);
    const tensor<double, 4> logits = attention_logits<uniform_precision<double>>(tensor_view<const double, 4>(qh.view()),
                                                                                 tensor_view<const double, 4>(kh.view()), o.attention);
    const double scale = ::attnref::logit_stage::logit_scale<double>(o.attention, d.head_dim_qk);
    detail::head_terms t = detail::attention_terms({qh.view(), kh.view(), vh.view(), vq, vk, vv}, logits.view(), p, scale, o.attention.threads);
    // Through W_o: a coupled event of head h (one δ moving the whole head output) reaches y_l through
    // Σ_c W_o[h·dv + c, l]·A_c ≤ ‖W_o^h[·, l]‖·‖A‖ (Cauchy–Schwarz); independent events through W_o².
    // GQA: a K/V rounding feeds the group's H/Hkv heads, (Σ of G terms)² ≤ G·Σ of squares.
    std::vector<double> wn2(H * eo, 0.0);
    for (std::size_t h = 0; h < H; ++h)
        for (std::size_t c = 0; c < dv; ++c)
            for (std::size_t l = 0; l < eo; ++l) wn2[h * eo + l] += w.w_o(h * dv + c, l) * w.w_o(h * dv + c, l);
    const double G = static_cast<double>(group), hd = static_cast<double>(H * dv);
    data_aware_scales r;
    r.worst_case = mha_worst_case_scales(x_q, x_k, x_v, w, p, o, logits.view(), terms, inputs_exact);
    const std::size_t total = d.batch * sq * eo;
    r.coupled.assign(total, {}), r.independent.assign(total, {}), r.linear.assign(total, {});
    r.logit_var.assign(total, {}), r.logit_linear.assign(total, 0.0);
    r.sigma_linear.assign(total, 0.0);
    r.output_value.assign(total, 0.0);
    const std::size_t M = H * dv, whole = eo - eo % simd::lanes;
    const std::vector<double> wo_panels = simd::column_panels(w.w_o.data, M, eo);  // for kernels::output_tile
    // σ_P (sigma_weights): V_hj·W_o^h per (b, h, j) in double, where the work stays within a few times
    // the bound's own (B·H·Sk·Eo ≤ 2^22 values, B·Sq·H·Sk·Eo ≤ 2^30 products); else left empty.
    const double vw_values = static_cast<double>(d.batch * H * sk) * static_cast<double>(eo);
    const bool weights_by_value = vw_values <= 0x1p22 && vw_values * static_cast<double>(sq) <= 0x1p30;
    std::vector<double> vw;
    if (weights_by_value) {
        vw.assign(d.batch * H * sk * eo, 0.0);
        for (std::size_t b = 0; b < d.batch; ++b)
            for (std::size_t h = 0; h < H; ++h)
                for (std::size_t j = 0; j < sk; ++j) {
                    double* out = &vw[((b * H + h) * sk + j) * eo];
                    for (std::size_t c = 0; c < dv; ++c) {
                        const double vc = vh(b, h / group, j, c);
                        for (std::size_t l = 0; l < eo; ++l) out[l] += vc * w.w_o(h * dv + c, l);
                    }
                }
        r.sigma_weights.assign(total, 0.0);
    }
    // Output rows (b, i) in blocks on the threads. A row's terms through W_o: four outputs at a time
    // over the head-output elements m = (h, c) in order (kernels::output_tile: the nine sums in
    // registers, the block's rows taking the same panel of W_o in turn while it is in cache), the
    // outputs past the last whole four one by one with the same operations; the coupled terms per
    // head. Every row is computed alone, in the same order whatever the blocking or the split, in
    // row-local arrays (the two_part halves apart), and stored at its end.
    constexpr std::size_t block = 8;
    const std::size_t out_rows = d.batch * sq;
    ::attnref::parallel_for_dynamic((out_rows + block - 1) / block, o.attention.threads, [&](std::size_t task) {
        const std::size_t r0 = task * block, nr = std::min(block, out_rows - r0);
        // Per row of the block: ind_a, ind_s, lin_a, lin_s, y, y2, ypos, yneg, sig (kernels::output_tile's
        // order), cpl_a, cpl_s.
        constexpr std::size_t arrays = 11;
        std::vector<double> acc(nr * arrays * eo, 0.0);
        auto row_array = [&](std::size_t k, std::size_t a) { return &acc[(k * arrays + a) * eo]; };
        // Per row of the block, per m: the head output o_m, its independent and linear terms' halves, σ_m.
        constexpr std::size_t inputs = 6;
        std::vector<double> per_m(nr * inputs * M);
        std::vector<two_part> eps_var(nr);
        std::vector<double> eps_lin(nr, 0.0);
        for (std::size_t k = 0; k < nr; ++k) {
            const std::size_t b = (r0 + k) / sq, i = (r0 + k) % sq;
            double* in = &per_m[k * inputs * M];
            for (std::size_t h = 0; h < H; ++h) {
                const std::size_t row = (b * H + h) * sq + i;
                eps_var[k] = two_part::max(eps_var[k], t.logit_var[row]);
                eps_lin[k] = std::max(eps_lin[k], t.logit_linear[row]);
                two_part head_cpl{};
                for (std::size_t c = 0; c < dv; ++c) head_cpl += t.coupled[row * dv + c];
                double *cpl_a = row_array(k, 9), *cpl_s = row_array(k, 10);
                for (std::size_t l = 0; l < eo; ++l) {
                    const double a = G * wn2[h * eo + l];
                    cpl_a[l] += a * head_cpl.acc, cpl_s[l] += a * head_cpl.store;
                }
                for (std::size_t c = 0; c < dv; ++c) {
                    const std::size_t at = row * dv + c, m = h * dv + c;
                    in[m] = t.out[at], in[M + m] = t.independent[at].acc, in[2 * M + m] = t.independent[at].store;
                    in[3 * M + m] = t.linear[at].acc, in[4 * M + m] = t.linear[at].store, in[5 * M + m] = t.sigma[at];
                }
            }
        }
        auto terms_of = [&](std::size_t k) {
            const double* in = &per_m[k * inputs * M];
            return kernels::output_row_terms{in, in + M, in + 2 * M, in + 3 * M, in + 4 * M, in + 5 * M};
        };
        for (std::size_t l = 0; l < whole; l += simd::lanes)
            for (std::size_t k = 0; k < nr; ++k) kernels::output_tile(terms_of(k), G, &wo_panels[l * M], M, row_array(k, 0) + l, eo);
        for (std::size_t k = 0; k < nr && whole < eo; ++k) {
            const kernels::output_row_terms tk = terms_of(k);
            double *ind_a = row_array(k, 0), *ind_s = row_array(k, 1), *lin_a = row_array(k, 2), *lin_s = row_array(k, 3), *y = row_array(k, 4),
                   *y2 = row_array(k, 5), *ypos = row_array(k, 6), *yneg = row_array(k, 7), *sig = row_array(k, 8);
            for (std::size_t m = 0; m < M; ++m)
                for (std::size_t l = whole; l < eo; ++l) {
                    const double wml = w.w_o(m, l), x = tk.hm[m] * wml, gww = G * wml * wml, aw = detail::abs_d(wml);
                    ind_a[l] += gww * tk.ti_a[m], ind_s[l] += gww * tk.ti_s[m];
                    lin_a[l] += aw * tk.tl_a[m], lin_s[l] += aw * tk.tl_s[m];
                    y[l] += x, y2[l] += x * x;
                    (x > 0 ? ypos[l] : yneg[l]) += detail::abs_d(x);
                    sig[l] += tk.sigma[m] * aw;
                }
        }
        for (std::size_t k = 0; k < nr; ++k) {
            const std::size_t b = (r0 + k) / sq, i = (r0 + k) % sq, out_row = (b * sq + i) * eo;
            const double *ind_a = row_array(k, 0), *ind_s = row_array(k, 1), *lin_a = row_array(k, 2), *lin_s = row_array(k, 3), *y = row_array(k, 4),
                         *y2 = row_array(k, 5), *ypos = row_array(k, 6), *yneg = row_array(k, 7), *sig = row_array(k, 8), *cpl_a = row_array(k, 9),
                         *cpl_s = row_array(k, 10);
            for (std::size_t l = 0; l < eo; ++l) {
                r.coupled[out_row + l] = {cpl_a[l], cpl_s[l]};
                r.independent[out_row + l] = {ind_a[l], ind_s[l]};
                r.linear[out_row + l] = {lin_a[l], lin_s[l]};
                r.sigma_linear[out_row + l] = sig[l];
                const double bl = w.b_o.empty() ? 0.0 : w.b_o[l], yl = y[l] + bl;
                r.output_value[out_row + l] = yl;
                const double m = detail::partial_sum_bound(ypos[l] + (bl > 0 ? bl : 0.0), yneg[l] + (bl < 0 ? -bl : 0.0));
                // W_o's products and H·dv additions (+ bias) in u_acc; rounding W_o, b_o and y to storage.
                r.independent[out_row + l] += two_part{y2[l] + (hd + 1) * m * m, (inputs_exact ? 0.0 : y2[l] + bl * bl) + yl * yl};
                r.logit_var[out_row + l] = eps_var[k];
                r.logit_linear[out_row + l] = eps_lin[k];
            }
            if (weights_by_value) {
                std::vector<double> sp(eo, 0.0);
                for (std::size_t h = 0; h < H; ++h)
                    for (std::size_t j = 0; j < sk; ++j) {
                        const double pw = p(b, h, i, j);
                        if (!(pw > 0)) continue;  // masked keys (0); NaN rows' outputs are NaN whatever the bound
                        const double* x = &vw[((b * H + h) * sk + j) * eo];
                        for (std::size_t l = 0; l < eo; ++l) sp[l] += pw * detail::abs_d(x[l]);
                    }
                // Each V·W_o sum (dv terms) and this sum (H·Sk terms) in double: within (H·Sk + dv + 2)·2^-53·σ.
                const double slack = static_cast<double>(H * sk + dv + 2) * 0x1p-53;
                for (std::size_t l = 0; l < eo; ++l) r.sigma_weights[out_row + l] = std::min(sig[l], sp[l] + slack * sig[l]);
            }
        }
    });
    r.row_logit_var = std::move(t.logit_var);
    r.row_logit_linear = std::move(t.logit_linear);
    r.n_keys = sk;
    return r;
}

/// The data-aware bounds of a candidate that declares its precision policy
/// (data_aware_scales::bound(e, policy_roundoffs): each rounding in the format the policy performs it in).
inline std::vector<double> element_bounds(const data_aware_scales& s, const policy_roundoffs& pr) {
    std::vector<double> b(s.size());
    for (std::size_t n = 0; n < b.size(); ++n) b[n] = s.bound(n, pr);
    return b;
}

}  // namespace attnref::tolerance
