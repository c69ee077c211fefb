#pragma once
/// \file bounds/tolerance/worst_case.hpp
/// Owns: the rigorous worst-case bound of the `worst-case` tolerance model (docs/error-bounds.md,
/// §3, eqs. 10–14): per-element magnitudes (worst_case_scales) for SDPA and multi-head attention,
/// computed once from the golden case's inputs and certified weights, and their evaluation for a
/// candidate's unit roundoffs. Valid to every order; +inf (vacuous) when an n·u reaches 1.

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

namespace attnref::tolerance {

/// Coefficients of the storage underflow term (eq. 26): an element's absolute error gains
/// acc·η(u_acc) + store·η(u), η = error_bounds::underflow_eta the absolute error of a rounding into
/// the subnormal range, counted over every rounding the output depends on.
/// `weights` holds the part of the storage coefficient that comes from storing P before P·V (a declared
/// policy may store P in another format than the rest: at_policy).
struct underflow_coefficients {
    double acc = 0, store = 0, weights = 0;
    double at(double u, double u_acc) const {
        const double st = store + weights;
        const double a = acc == 0 ? 0.0 : acc * error_bounds::underflow_eta(u_acc), s = st == 0 ? 0.0 : st * error_bounds::underflow_eta(u);
        return a + s;
    }
    /// With P's storage apart: its absolute underflow error eta_p (η of P's format divided by P's static scale).
    double at_policy(double u, double u_acc, double eta_p) const {
        const double a = acc == 0 ? 0.0 : acc * error_bounds::underflow_eta(u_acc), s = store == 0 ? 0.0 : store * error_bounds::underflow_eta(u),
                     w = weights == 0 ? 0.0 : weights * eta_p;
        return a + s + w;
    }
};

/// How the storage underflow coefficients (eq. 26) are summed. per_feature: eq. 26 term by term,
/// per (key, feature) — the tightest, and what a format with a subnormal range within reach of the
/// data needs (float16, fp8: η(u) = 2⁻²⁵, 2⁻¹⁰). bounded: per-row upper bounds of the same sums from
/// per-key and per-feature maxima and sums (eq. 26b), a few operations per (query, key) instead of
/// ~20 per (query, key, feature). Both are upper bounds of the same quantity; bounded is for
/// formats whose η lies ~2⁻¹²⁶ below their unit roundoff (float64, float32, bfloat16), where either
/// coefficient times η is far below one unit in the last place of every bound that is not itself
/// of subnormal magnitude, so the two give the same bounds bit for bit but for such outputs.
enum class underflow_terms { per_feature, bounded };

/// The underflow coefficients a check needs for a candidate format (declared policy or not): bounded
/// for results in a format whose smallest normal is at most float32's, 2⁻¹²⁶ (float64, float32,
/// bfloat16; they accumulate in float32 or wider), without a declared policy (whose P may be stored
/// in a format with a subnormal range within reach, e.g. fp8); per_feature otherwise.
inline underflow_terms underflow_terms_for(candidate_format f, bool declared_policy) {
    return describe(f).min_exponent <= -126 && !declared_policy ? underflow_terms::bounded : underflow_terms::per_feature;
}

/// Per-element magnitudes of the worst-case bound and the counts that pick the γ's; bound()
/// evaluates eq. 12 of docs/error-bounds.md.
struct worst_case_scales {
    std::vector<double> t0;  ///< σ, or σ propagated through |W_o|
    std::vector<double> t1;  ///< L·σ, or L·σ propagated through |W_o|
    /// Per output row (row_length elements): the largest L of the row's heads (the second-order
    /// factor g of eq. 12; empty: rows of L = 0).
    std::vector<double> row_L;
    std::size_t row_length = 1;
    std::size_t n_keys = 0, n_dot = 0, n_extra = 0;
    /// Relative roundings of the whole row beyond the shifted softmax's, in u_acc: 0 for the
    /// shifted and naive softmax (the model the checker applies), error_bounds::
    /// online_rescale_roundings(n, block) for an online softmax of that block size (eq. 9).
    std::size_t rescale_roundings = 0;
    /// Per element: the storage underflow term (eq. 26); empty: none (callers that build t0, t1 alone).
    std::vector<underflow_coefficients> underflow;

    /// u: the candidate format's unit roundoff (storage: inputs, Q/K/V, P, head outputs, output);
    /// u_acc: that of its accumulation (see accumulate_roundoff). Vacuous (+inf) when n·u ≥ 1.
    /// Rigorous to every order (given the ingredients' bounds): logit perturbations ≤ δ = γ·L move
    /// each weight by a factor within [e^{−2δ}, e^{2δ}], so the weights' part is
    /// (e^{2δ} − 1)·σ = g·2γ·L·σ with g = (e^{2γ·L_max} − 1)/(2γ·L_max) ≥ 1 (expm1(x)/x increases with x,
    /// so L_max, the row's largest L, bounds every head's factor); the relative roundings of the
    /// softmax, P·V, W_o and the storage compose as a product (1 + A) = Π(1 + ε_i) instead of a sum
    /// (eqs. 10–12; γ and g from error_bounds.hpp, eqs. 1 and 6).
    double bound(std::size_t e, double u, double u_acc) const {
        const double gd = gamma(n_dot, u_acc) + gamma(8, u);  // logit perturbation per unit of L (eq. 10)
        const double a = (1 + gamma(n_keys + 3, u_acc)) * (1 + gamma(n_keys, u_acc)) * (1 + gamma(n_extra, u_acc)) *
                             (1 + u) * (1 + u) * (1 + u) * (1 + u) * (1 + u) * (1 + gamma(rescale_roundings, u_acc)) -
                         1;  // (eq. 11)
        const double l_max = row_L.empty() ? 0.0 : row_L[e / row_length];
        // NaN (inf·0) and 0 leave g = 1; +inf when e^x overflows
        const double g = error_bounds::second_order_factor(2 * gd * l_max);
        const double weights = t1[e] == 0 ? 0.0 : (1 + a) * g * 2 * gd * t1[e];  // (0·inf would be NaN)
        const double rest = t0[e] == 0 ? 0.0 : a * t0[e];
        const double under = underflow.size() == t0.size() ? (1 + a) * g * underflow[e].at(u, u_acc) : 0.0;  // (eq. 26)
        return (weights + rest + under) * (1 + 0x1p-40);  // (1 + 2⁻⁴⁰): this evaluation's own rounding, upward
    }
    double bound(std::size_t e, double u) const { return bound(e, u, u); }
    std::size_t size() const { return t0.size(); }
};

namespace detail {
/// Per (b, h, i) L and per (b, h, i, l) σ of one attention: q̃ (B,H,Sq,dk) and k̃ (B,Hkv,Sk,dk) are
/// nonnegative magnitudes, ṽ (B,Hkv,Sk,dv) too; logits S and weights P (B,H,Sq,Sk) from the reference.
/// Absolute underflow errors already in the head inputs q, k, v (per element, in η units; empty:
/// the inputs are rounded to the candidate's storage once, {0, 1} per element).
struct input_underflow {
    std::span<const underflow_coefficients> q, k, v;
};
inline void head_scales(tensor_view<const double, 4> q_abs, tensor_view<const double, 4> k_abs,
                        tensor_view<const double, 4> v_abs, tensor_view<const double, 4> logits,
                        tensor_view<const double, 4> p, double scale, std::vector<double>& L, std::vector<double>& sigma,
                        std::vector<underflow_coefficients>* underflow = nullptr, input_underflow in = {}, std::size_t threads = 0,
                        underflow_terms terms = underflow_terms::per_feature) {
    const auto [batch, heads, sq, dk] = q_abs.extents;
    const std::size_t kv = k_abs.extents[1], sk = k_abs.extents[2], dv = v_abs.extents[3], group = heads / kv;
    L.assign(batch * heads * sq, 0.0);
    sigma.assign(batch * heads * sq * dv, 0.0);
    if (underflow) underflow->assign(sigma.size(), {});
    const underflow_coefficients stored{0, 1};
    auto err = [&](std::span<const underflow_coefficients> e, std::size_t n) { return e.empty() ? stored : e[n]; };
    const double s_abs = abs_d(scale), s_factor = std::max(1.0, s_abs), la0 = static_cast<double>(dk + 4) * s_factor;
    // |K| and its underflow coefficients' halves transposed per (b, g) to (c, j), for the per-key sums
    // a pack of keys at a time (kernels::worst_key_block); q's and v's halves apart.
    const std::size_t skT = simd::transposed_stride(sk);  // row stride of the transposed arrays
    const bool per_feature = underflow && terms == underflow_terms::per_feature, bounded = underflow && !per_feature;
    std::vector<double> kT(batch * kv * dk * skT), ek_a, ek_s, eq_a, eq_s, ev_a, ev_s;
    if (per_feature) ek_a.resize(kT.size()), ek_s.resize(kT.size());
    for (std::size_t bg = 0; bg < batch * kv; ++bg)
        for (std::size_t j = 0; j < sk; ++j)
            for (std::size_t c = 0; c < dk; ++c) {
                const std::size_t from = (bg * sk + j) * dk + c, to = (bg * dk + c) * skT + j;
                kT[to] = k_abs.data[from];
                if (!per_feature) continue;
                const underflow_coefficients e = err(in.k, from);
                ek_a[to] = e.acc, ek_s[to] = e.store;
            }
    if (per_feature) {
        eq_a.resize(q_abs.size()), eq_s.resize(q_abs.size()), ev_a.resize(v_abs.size()), ev_s.resize(v_abs.size());
        for (std::size_t n = 0; n < q_abs.size(); ++n) eq_a[n] = err(in.q, n).acc, eq_s[n] = err(in.q, n).store;
        for (std::size_t n = 0; n < v_abs.size(); ++n) ev_a[n] = err(in.v, n).acc, ev_s[n] = err(in.v, n).store;
    }
    // (eq. 26b) bounded: per key (b, g, j) Σ_c |k_jc| and the largest coefficients of its k; per
    // (b, g, c) the largest coefficients of the keys' v_jc and Σ_j |v_jc| over all keys.
    std::vector<double> k_sum, ek_a_max, ek_s_max, ev_a_max, ev_s_max, v_sum;
    if (bounded) {
        k_sum.assign(batch * kv * sk, 0.0), ek_a_max.assign(k_sum.size(), 0.0), ek_s_max.assign(k_sum.size(), 0.0);
        for (std::size_t n = 0; n < k_sum.size(); ++n)
            for (std::size_t c = 0; c < dk; ++c) {
                const underflow_coefficients e = err(in.k, n * dk + c);
                k_sum[n] += k_abs.data[n * dk + c];
                ek_a_max[n] = std::max(ek_a_max[n], e.acc), ek_s_max[n] = std::max(ek_s_max[n], e.store);
            }
        ev_a_max.assign(batch * kv * dv, 0.0), ev_s_max.assign(ev_a_max.size(), 0.0), v_sum.assign(ev_a_max.size(), 0.0);
        for (std::size_t bg = 0; bg < batch * kv; ++bg)
            for (std::size_t j = 0; j < sk; ++j)
                for (std::size_t c = 0; c < dv; ++c) {
                    const std::size_t at = (bg * sk + j) * dv + c;
                    const underflow_coefficients e = err(in.v, at);
                    ev_a_max[bg * dv + c] = std::max(ev_a_max[bg * dv + c], e.acc), ev_s_max[bg * dv + c] = std::max(ev_s_max[bg * dv + c], e.store);
                    v_sum[bg * dv + c] += v_abs.data[at];
                }
    }
    // Blocks of row_block rows (b, h, i) on the threads, the keys in tiles of key_tile (a multiple of
    // the pack) that the block's rows go through in turn while the tile is in cache; every row still
    // takes its keys in order (each sum over j and over c in the order of the scalar loops), so no
    // value depends on the blocking or the thread count.
    constexpr std::size_t row_block = 16, key_tile = 32 * simd::lanes;
    const std::size_t rows = batch * heads * sq;
    ::attnref::parallel_for_dynamic((rows + row_block - 1) / row_block, threads, [&](std::size_t task) {
        const std::size_t r0 = task * row_block, nr = std::min(row_block, rows - r0);
        std::vector<double> le_acc(per_feature ? nr * sk : 0), le_store(per_feature ? nr * sk : 0);
        // bounded: per row the largest logit underflow sums la, ls over its live keys (eq. 26b), from
        // the query's Σ_c |q_c| and largest coefficients.
        std::vector<double> la_max(nr, la0), ls_max(nr, 0.0), q_sum(nr, 0.0), eq_a_max(nr, 0.0), eq_s_max(nr, 0.0);
        if (bounded)
            for (std::size_t k = 0; k < nr; ++k)
                for (std::size_t c = 0; c < dk; ++c) {
                    const std::size_t n = (r0 + k) * dk + c;
                    const underflow_coefficients e = err(in.q, n);
                    q_sum[k] += q_abs.data[n];
                    eq_a_max[k] = std::max(eq_a_max[k], e.acc), eq_s_max[k] = std::max(eq_s_max[k], e.store);
                }
        kernels::worst_key_dots dots;
        for (std::size_t jt = 0; jt < sk; jt += key_tile)
            for (std::size_t k = 0; k < nr; ++k) {
                const std::size_t row = r0 + k, b = row / (heads * sq), h = row / sq % heads, i = row % sq, g = h / group;
                double& l_row = L[row];
                double* s_row = &sigma[row * dv];
                const double* q = &q_abs(b, h, i, 0);
                const std::size_t kt_at = (b * kv + g) * dk * skT;
                auto live = [&](std::size_t j) { return p(b, h, i, j) != 0; };  // masked or underflowed keys add nothing (NaN weights do)
                for (std::size_t j0 = jt; j0 < std::min(sk, jt + key_tile); j0 += simd::lanes) {
                    const std::size_t n = std::min(simd::lanes, sk - j0);
                    bool any = false;
                    for (std::size_t l = 0; l < n; ++l) any = any || live(j0 + l);
                    if (!any) continue;
                    if (n == simd::lanes) {
                        kernels::worst_key_block(q, per_feature ? &eq_a[row * dk] : nullptr, per_feature ? &eq_s[row * dk] : nullptr,
                                                 &kT[kt_at + j0], per_feature ? &ek_a[kt_at + j0] : nullptr,
                                                 per_feature ? &ek_s[kt_at + j0] : nullptr, skT, dk, s_abs, la0, dots);
                    } else {  // the row's last keys, one at a time (the same operations per key)
                        for (std::size_t l = 0; l < n; ++l) {
                            double dot = 0, la = la0, ls = 0;
                            for (std::size_t c = 0; c < dk; ++c) {
                                const double kc = kT[kt_at + c * skT + j0 + l];
                                dot += q[c] * kc;
                                if (!per_feature) continue;
                                la += s_abs * (eq_a[row * dk + c] * kc + q[c] * ek_a[kt_at + c * skT + j0 + l]);
                                ls += s_abs * (eq_s[row * dk + c] * kc + q[c] * ek_s[kt_at + c * skT + j0 + l]);
                            }
                            dots.dot[l] = dot, dots.la[l] = la, dots.ls[l] = ls;
                        }
                    }
                    for (std::size_t l = 0; l < n; ++l) {
                        const std::size_t j = j0 + l;
                        if (!live(j)) continue;
                        const double pj = p(b, h, i, j), s = logits(b, h, i, j);
                        const double m = s_abs * dots.dot[l] * (1 + 0x1p-50) + (std::isfinite(s) ? abs_d(s) : 0.0);
                        if (m > l_row) l_row = m;
                        kernels::scaled_add2(abs_d(pj), 0, &v_abs(b, g, j, 0), dv, s_row, nullptr);  // σ_c += |p_j|·|v_jc|
                        // (eq. 26) the logit's absolute underflow: q's and k's through s·qᵀk, and the dot
                        // product's dk products and the scale's multiplications (η_acc each).
                        if (per_feature) le_acc[k * sk + j] = dots.la[l], le_store[k * sk + j] = dots.ls[l];
                        if (bounded) {  // (eq. 26b) la ≤ la0 + s·(max eq_a·Σ|k_j| + Σ|q|·max ek_a,j), ls likewise
                            const std::size_t kj = (b * kv + g) * sk + j;
                            la_max[k] = std::max(la_max[k], la0 + s_abs * (eq_a_max[k] * k_sum[kj] + q_sum[k] * ek_a_max[kj]));
                            ls_max[k] = std::max(ls_max[k], s_abs * (eq_s_max[k] * k_sum[kj] + q_sum[k] * ek_s_max[kj]));
                        }
                    }
                }
            }
        for (std::size_t k = 0; k < nr; ++k)
            for (std::size_t c = 0; c < dv; ++c) sigma[(r0 + k) * dv + c] *= 1 + 0x1p-48;  // this sum's own rounding, upward
        if (!underflow) return;
        // Per row: its live keys (p_j ≠ 0, NaN included) and A = Σ_j |p_j| over them.
        std::vector<double> n_live(nr, 0.0), a_sum(nr, 0.0);
        for (std::size_t k = 0; k < nr; ++k)
            for (std::size_t j = 0; j < sk; ++j)
                if (const double pj = p.data[(r0 + k) * sk + j]; pj != 0) n_live[k] += 1, a_sum[k] += abs_d(pj);
        if (bounded) {
            // (eq. 26b) With a_j = |p_j| over the live keys, A = Σ_j a_j and σ_c ≥ Σ_j a_j|v_jc|:
            //   Σ_j a_j(|v_jc| + σ_c)·la_j ≤ la_max·σ_c·(1 + A),  Σ_j a_j·ev_a,jc ≤ A·max_j ev_a,jc,
            //   Σ_j |v_jc| ≤ the sum over all keys (likewise ls, ev_s), every quantity nonnegative.
            // Each is computed with at most 3·Sk + 2·dk + 32 roundings to nearest along any path, all of
            // nonnegative values: the factor (1 + (3·Sk + 2·dk + 33)·2⁻⁵²) covers them (with σ's sum).
            const double slack = 1 + static_cast<double>(3 * sk + 2 * dk + 33) * 0x1p-52;
            for (std::size_t k = 0; k < nr; ++k) {
                const std::size_t row = r0 + k, b = row / (heads * sq), h = row / sq % heads, g = h / group;
                for (std::size_t c = 0; c < dv; ++c) {
                    const std::size_t vc = (b * kv + g) * dv + c;
                    const double sg = sigma[row * dv + c] * (1 + a_sum[k]);
                    const double ta = (n_live[k] + 1) + la_max[k] * sg + a_sum[k] * ev_a_max[vc] + 4 * v_sum[vc];
                    const double ts = 1 + ls_max[k] * sg + a_sum[k] * ev_s_max[vc];
                    (*underflow)[row * dv + c] = {ta * slack * (1 + 0x1p-40), ts * slack * (1 + 0x1p-40), v_sum[vc] * slack * (1 + 0x1p-40)};
                }
            }
            return;
        }
        // (eq. 26) Δo_c = Σ_j p_j (v_jc − o_c) ΔS_j + Σ_j p_j Δv_jc + Σ_j ΔP_j v_jc + P·V's products
        // + o's storage, with |v_jc − o_c| ≤ |v_jc| + σ_c and ΔP_j ≤ η(storage) + 4η_acc (exp, division).
        std::vector<double> ta(nr * dv), ts(nr * dv, 1.0), tw(nr * dv, 0.0);
        for (std::size_t k = 0; k < nr; ++k) std::fill_n(&ta[k * dv], dv, n_live[k] + 1);
        for (std::size_t jt = 0; jt < sk; jt += key_tile)
            for (std::size_t k = 0; k < nr; ++k) {
                const std::size_t row = r0 + k, b = row / (heads * sq), h = row / sq % heads, i = row % sq, g = h / group;
                for (std::size_t j = jt; j < std::min(sk, jt + key_tile); ++j) {
                    const double pj = p(b, h, i, j);
                    if (!(pj != 0)) continue;
                    const std::size_t at = ((b * kv + g) * sk + j) * dv;
                    kernels::worst_underflow_key(abs_d(pj), le_acc[k * sk + j], le_store[k * sk + j], &v_abs(b, g, j, 0), &ev_a[at], &ev_s[at],
                                                 &sigma[row * dv], dv, &ta[k * dv], &ts[k * dv], &tw[k * dv]);
                }
            }
        for (std::size_t k = 0; k < nr; ++k)
            for (std::size_t c = 0; c < dv; ++c)
                (*underflow)[(r0 + k) * dv + c] = {ta[k * dv + c] * (1 + 0x1p-40), ts[k * dv + c] * (1 + 0x1p-40), tw[k * dv + c] * (1 + 0x1p-40)};
    });
}

inline std::vector<double> abs_of(std::span<const double> x) {
    std::vector<double> r(x.size());
    for (std::size_t n = 0; n < x.size(); ++n) r[n] = abs_d(x[n]);
    return r;
}
}  // namespace detail

/// Worst-case magnitudes for scaled dot-product attention. q, k, v are the golden inputs, p the
/// golden (certified) weights (B, H, Sq, Sk); options as the case uses them; logits the exact S
/// (B, H, Sq, Sk), as attention_logits in double gives them.
inline worst_case_scales sdpa_worst_case_scales(tensor_view<const double, 4> q, tensor_view<const double, 4> k,
                                                tensor_view<const double, 4> v, tensor_view<const double, 4> p,
                                                const attention_options& options, tensor_view<const double, 4> logits,
                                                underflow_terms terms = underflow_terms::per_feature) {
    const std::vector<double> qa = detail::abs_of({q.data, q.size()}), ka = detail::abs_of({k.data, k.size()}),
                              va = detail::abs_of({v.data, v.size()});
    const double scale = ::attnref::logit_stage::logit_scale<double>(options, q.extents[3]);
    std::vector<double> L, sigma;
    worst_case_scales r;
    detail::head_scales({qa.data(), q.extents}, {ka.data(), k.extents}, {va.data(), v.extents}, logits, p, scale, L, sigma, &r.underflow, {},
                        options.threads, terms);
    r.n_keys = k.extents[2];
    r.n_dot = q.extents[3] + 4;
    r.n_extra = 0;
    const std::size_t dv = v.extents[3];
    r.t0 = sigma;
    r.t1.resize(sigma.size());
    for (std::size_t e = 0; e < sigma.size(); ++e) r.t1[e] = L[e / dv] * sigma[e];
    r.row_L = std::move(L);
    r.row_length = dv;
    return r;
}
inline worst_case_scales sdpa_worst_case_scales(tensor_view<const double, 4> q, tensor_view<const double, 4> k,
                                                tensor_view<const double, 4> v, tensor_view<const double, 4> p,
                                                const attention_options& options) {
    const tensor<double, 4> logits = attention_logits<uniform_precision<double>>(q, k, options);
    return sdpa_worst_case_scales(q, k, v, p, options, logits.view());
}

/// Worst-case magnitudes for multi-head attention (see multi_head_attention.hpp for the layout);
/// logits the exact S (B, H, Sq, Sk), as mha_logits in double gives them. inputs_exact: x and the
/// projections' W and b are values of the candidate's format, so reading them rounds nothing and the
/// underflow (eq. 26) of q, k, v counts two storage roundings of each, the projection's result and
/// a scaled copy (as kernels that scale q or k in their storage format make), instead of x's, W's and
/// b's rounding (Σ_e|x_e| + Σ_e|W_ec| + 2 of them). W_o's and b_o's rounding stay counted (~Σ_m σ_m·η).
inline worst_case_scales mha_worst_case_scales(tensor_view<const double, 3> x_q, tensor_view<const double, 3> x_k,
                                               tensor_view<const double, 3> x_v, const mha_parameters<double>& w,
                                               tensor_view<const double, 4> p, const mha_options& o,
                                               tensor_view<const double, 4> logits, underflow_terms terms = underflow_terms::per_feature,
                                               bool inputs_exact = false) {
    const mha_dims d = mha_dims_of(x_q, x_k, x_v, w, o);
    // Absolute projections |x|·|W| + |b| (for L and σ).
    auto project_abs = [&](tensor_view<const double, 3> x, tensor_view<const double, 2> W, tensor_view<const double, 1> b,
                           std::size_t heads) {
        tensor<double, 3> y({x.extents[0], x.extents[1], W.extents[1]});
        const std::vector<double> xa = detail::abs_of({x.data, x.size()}), Wa = detail::abs_of({W.data, W.size()});
        const std::vector<double> ba = b.empty() ? std::vector<double>{} : detail::abs_of({b.data, b.size()});
        linear_into<uniform_precision<double>>(
            tensor_view<const double, 3>{xa.data(), x.extents}, tensor_view<const double, 2>{Wa.data(), W.extents},
            b.empty() ? tensor_view<const double, 1>{} : tensor_view<const double, 1>{ba.data(), b.extents}, y.view(), o.attention.threads, "projection");
        for (std::size_t n = 0; n < y.size(); ++n) y[n] *= 1 + 0x1p-48;
        return split_heads<double>(y.view(), heads);
    };
    const tensor<double, 4> qah = project_abs(x_q, w.w_q, w.b_q, d.heads), kah = project_abs(x_k, w.w_k, w.b_k, d.kv_heads),
                            vah = project_abs(x_v, w.w_v, w.b_v, d.kv_heads);
    // (eq. 26) A projection's absolute underflow, per element in head layout (B, heads, S, d): E
    // products and the scale's multiplication in u_acc; x rounded (times |W|), W rounded (times |x|),
    // b rounded and the result stored in the candidate's format; inputs exact in that format: the
    // result and a scaled copy of it stored, 2.
    auto project_underflow = [&](tensor_view<const double, 3> x, tensor_view<const double, 2> W, tensor_view<const double, 1> b,
                                 std::size_t heads) {
        const std::size_t B = x.extents[0], S = x.extents[1], E = x.extents[2], N = W.extents[1], hd = N / heads;
        std::vector<double> w_col(N, 0.0);
        for (std::size_t e = 0; e < E; ++e)
            for (std::size_t c = 0; c < N; ++c) w_col[c] += detail::abs_d(W(e, c));
        std::vector<underflow_coefficients> r(B * S * N);
        for (std::size_t bb = 0; bb < B; ++bb)
            for (std::size_t i = 0; i < S; ++i) {
                double x_row = 0;
                for (std::size_t e = 0; e < E; ++e) x_row += detail::abs_d(x(bb, i, e));
                for (std::size_t c = 0; c < N; ++c)
                    r[((bb * heads + c / hd) * S + i) * hd + c % hd] = {
                        (static_cast<double>(E) + 2) * (1 + 0x1p-48),
                        inputs_exact ? 2.0 : (w_col[c] + x_row + (b.empty() ? 0.0 : 1.0) + 1) * (1 + 0x1p-40)};
            }
        return r;
    };
    const std::vector<underflow_coefficients> qu = project_underflow(x_q, w.w_q, w.b_q, d.heads),
                                              ku = project_underflow(x_k, w.w_k, w.b_k, d.kv_heads),
                                              vu = project_underflow(x_v, w.w_v, w.b_v, d.kv_heads);
    const double scale = ::attnref::logit_stage::logit_scale<double>(o.attention, d.head_dim_qk);
    std::vector<double> L, sigma;
    std::vector<underflow_coefficients> head_under;
    detail::head_scales(qah.view(), kah.view(), vah.view(), logits, p, scale, L, sigma, &head_under, {qu, ku, vu}, o.attention.threads, terms);
    // Through W_o: t0_l = Σ_m σ_m|W_o,ml|, t1_l = Σ_m L_m σ_m|W_o,ml|, m = (h, c) merged.
    const std::size_t H = d.heads, sq = d.query_length, dv = d.head_dim_v, eo = d.output_dim;
    worst_case_scales r;
    r.t0.assign(d.batch * sq * eo, 0.0);
    r.t1.assign(d.batch * sq * eo, 0.0);
    // (eq. 26) y_l = Σ_m h_m W_o,ml + b_l: the heads' underflow through |W_o|, H·dv products (u_acc),
    // W_o rounded (times |h_m| ≤ σ_m), b_o rounded and y stored.
    r.underflow.assign(d.batch * sq * eo, {});
    r.row_L.assign(d.batch * sq, 0.0);
    r.row_length = eo;
    // Output rows (b, i) in blocks on the threads, four outputs at a time over m = (h, c) in order
    // (kernels::worst_output_tile: the five sums in registers, the block's rows taking the same panel
    // of |W_o| in turn while it is in cache), the outputs past the last whole four one by one
    // (kernels::worst_output_projection's operations). Every row sums over m in order, whatever the
    // blocking or the split.
    const std::size_t M = H * dv, whole = eo - eo % simd::lanes;
    std::vector<double> wo_abs(w.w_o.size());
    for (std::size_t n = 0; n < wo_abs.size(); ++n) wo_abs[n] = detail::abs_d(w.w_o.data[n]);
    const std::vector<double> panels = simd::column_panels(wo_abs.data(), M, eo);
    constexpr std::size_t block = 8;
    const std::size_t rows = d.batch * sq;
    const double ua0 = static_cast<double>(H * dv) + 1, us0 = 2.0;
    ::attnref::parallel_for_dynamic((rows + block - 1) / block, o.attention.threads, [&](std::size_t task) {
        const std::size_t r0 = task * block, nr = std::min(block, rows - r0);
        std::vector<double> acc(5 * nr * eo);  // per row: underflow acc, store, weights, t0, t1
        std::vector<double> per_m(5 * nr * M);  // per row, per m: σ, L·σ, the underflow coefficients
        for (std::size_t k = 0; k < nr; ++k) {
            std::fill_n(&acc[5 * k * eo], eo, ua0);
            std::fill_n(&acc[(5 * k + 1) * eo], eo, us0);
            std::fill_n(&acc[(5 * k + 2) * eo], 3 * eo, 0.0);
            const std::size_t b = (r0 + k) / sq, i = (r0 + k) % sq;
            double* in = &per_m[5 * k * M];
            for (std::size_t h = 0; h < H; ++h)
                for (std::size_t c = 0; c < dv; ++c) {
                    const std::size_t hr = (b * H + h) * sq + i, m = h * dv + c;
                    const double l_row = L[hr], s = sigma[hr * dv + c];
                    const underflow_coefficients hu = head_under[hr * dv + c];
                    in[m] = s, in[M + m] = l_row * s, in[2 * M + m] = hu.acc, in[3 * M + m] = hu.store, in[4 * M + m] = hu.weights;
                }
        }
        for (std::size_t l = 0; l < whole; l += simd::lanes)
            for (std::size_t k = 0; k < nr; ++k) {
                const double* in = &per_m[5 * k * M];
                kernels::worst_output_tile({in, in + M, in + 2 * M, in + 3 * M, in + 4 * M}, ua0, us0, &panels[l * M], M, &acc[5 * k * eo + l], eo);
            }
        for (std::size_t k = 0; k < nr && whole < eo; ++k) {
            const double* in = &per_m[5 * k * M];
            double* a = &acc[5 * k * eo];
            for (std::size_t m = 0; m < M; ++m)
                kernels::worst_output_projection(in[m], in[M + m], in[2 * M + m], in[3 * M + m], in[4 * M + m], &wo_abs[m * eo + whole], eo - whole,
                                                 a + whole, a + eo + whole, a + 2 * eo + whole, a + 3 * eo + whole, a + 4 * eo + whole);
        }
        for (std::size_t k = 0; k < nr; ++k) {
            const std::size_t b = (r0 + k) / sq, i = (r0 + k) % sq, out = (b * sq + i) * eo;
            for (std::size_t h = 0; h < H; ++h) r.row_L[b * sq + i] = std::max(r.row_L[b * sq + i], L[(b * H + h) * sq + i]);
            const double* a = &acc[5 * k * eo];
            for (std::size_t l = 0; l < eo; ++l) {
                r.underflow[out + l] = {a[l], a[eo + l], a[2 * eo + l]};
                r.t0[out + l] = a[3 * eo + l], r.t1[out + l] = a[4 * eo + l];
            }
        }
    });
    // The output bias: adding it rounds once more, relative to |y| ≤ t0 + |b_o|.
    for (std::size_t n = 0; n < r.t0.size(); ++n) {
        const double bo = w.b_o.empty() ? 0.0 : detail::abs_d(w.b_o[n % eo]);
        r.t0[n] = (r.t0[n] + bo) * (1 + 0x1p-46);
        r.t1[n] *= 1 + 0x1p-46;
        r.underflow[n].acc *= 1 + 0x1p-40, r.underflow[n].store *= 1 + 0x1p-40, r.underflow[n].weights *= 1 + 0x1p-40;
    }
    const std::size_t em = x_q.extents[2];
    r.n_keys = d.key_length;
    r.n_dot = d.head_dim_qk + 2 * em + 8;
    r.n_extra = em + 2 + H * dv + 2;
    return r;
}
inline worst_case_scales mha_worst_case_scales(tensor_view<const double, 3> x_q, tensor_view<const double, 3> x_k,
                                               tensor_view<const double, 3> x_v, const mha_parameters<double>& w,
                                               tensor_view<const double, 4> p, const mha_options& o) {
    const tensor<double, 4> logits = mha_logits<uniform_precision<double>>(x_q, x_k, w, o);
    return mha_worst_case_scales(x_q, x_k, x_v, w, p, o, logits.view());
}

}  // namespace attnref::tolerance
