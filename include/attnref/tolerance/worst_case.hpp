#pragma once
/// \file tolerance/worst_case.hpp
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

#include "attnref/attention.hpp"
#include "attnref/error_bounds.hpp"
#include "attnref/multi_head_attention.hpp"
#include "attnref/tensor.hpp"
#include "attnref/parallel.hpp"
#include "attnref/tolerance/names.hpp"
#include "attnref/tolerance/parallel_bounds.hpp"

namespace attnref::tolerance {

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
        return (weights + rest) * (1 + 0x1p-40);  // (1 + 2⁻⁴⁰): this evaluation's own rounding, upward
    }
    double bound(std::size_t e, double u) const { return bound(e, u, u); }
    std::size_t size() const { return t0.size(); }
};

namespace detail {
/// Per (b, h, i) L and per (b, h, i, l) σ of one attention: q̃ (B,H,Sq,dk) and k̃ (B,Hkv,Sk,dk) are
/// nonnegative magnitudes, ṽ (B,Hkv,Sk,dv) too; logits S and weights P (B,H,Sq,Sk) from the reference.
inline void head_scales(tensor_view<const double, 4> q_abs, tensor_view<const double, 4> k_abs,
                        tensor_view<const double, 4> v_abs, tensor_view<const double, 4> logits,
                        tensor_view<const double, 4> p, double scale, std::vector<double>& L, std::vector<double>& sigma,
                        std::size_t threads = 0) {
    const auto [batch, heads, sq, dk] = q_abs.extents;
    const std::size_t kv = k_abs.extents[1], sk = k_abs.extents[2], dv = v_abs.extents[3], group = heads / kv;
    L.assign(batch * heads * sq, 0.0);
    sigma.assign(batch * heads * sq * dv, 0.0);
    // Rows (b, h, i) on the threads, each computed alone in the same order whatever the split.
    ::attnref::detail::parallel_for(batch * heads * sq, threads, [&](std::size_t row) {
                const std::size_t b = row / (heads * sq), h = row / sq % heads, i = row % sq;
                double& l_row = L[row];
                double* s_row = &sigma[row * dv];
                const double* q_row = &q_abs(b, h, i, 0);
                for (std::size_t j = 0; j < sk; ++j) {
                    const double pj = p(b, h, i, j);
                    if (!(pj != 0)) continue;  // masked or underflowed keys (and NaN rows) add nothing
                    const double* k_row = &k_abs(b, h / group, j, 0);
                    double dot = 0;
                    for (std::size_t c = 0; c < dk; ++c) dot += q_row[c] * k_row[c];
                    const double s = logits(b, h, i, j);
                    const double m = abs_d(scale) * dot * (1 + 0x1p-50) + (std::isfinite(s) ? abs_d(s) : 0.0);
                    if (m > l_row) l_row = m;
                    kernels::scaled_add2(abs_d(pj), 0, &v_abs(b, h / group, j, 0), dv, s_row, nullptr);  // σ_c += |p_j|·ṽ_jc
                }
                for (std::size_t c = 0; c < dv; ++c) s_row[c] *= 1 + 0x1p-48;  // this sum's own rounding, upward
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
                                                const attention_options& options, tensor_view<const double, 4> logits) {
    const std::vector<double> qa = detail::abs_of({q.data, q.size()}), ka = detail::abs_of({k.data, k.size()}),
                              va = detail::abs_of({v.data, v.size()});
    const double scale = ::attnref::detail::logit_scale<double>(options, q.extents[3]);
    std::vector<double> L, sigma;
    detail::head_scales({qa.data(), q.extents}, {ka.data(), k.extents}, {va.data(), v.extents}, logits, p, scale, L, sigma, options.threads);
    worst_case_scales r;
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
/// logits the exact S (B, H, Sq, Sk), as mha_logits in double gives them.
inline worst_case_scales mha_worst_case_scales(tensor_view<const double, 3> x_q, tensor_view<const double, 3> x_k,
                                               tensor_view<const double, 3> x_v, const mha_parameters<double>& w,
                                               tensor_view<const double, 4> p, const mha_options& o,
                                               tensor_view<const double, 4> logits) {
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
    const double scale = ::attnref::detail::logit_scale<double>(o.attention, d.head_dim_qk);
    std::vector<double> L, sigma;
    detail::head_scales(qah.view(), kah.view(), vah.view(), logits, p, scale, L, sigma, o.attention.threads);
    // Through W_o: t0_l = Σ_m σ_m|W_o,ml|, t1_l = Σ_m L_m σ_m|W_o,ml|, m = (h, c) merged.
    const std::size_t H = d.heads, sq = d.query_length, dv = d.head_dim_v, eo = d.output_dim;
    worst_case_scales r;
    r.t0.assign(d.batch * sq * eo, 0.0);
    r.t1.assign(d.batch * sq * eo, 0.0);
    r.row_L.assign(d.batch * sq, 0.0);
    r.row_length = eo;
    std::vector<double> wo_abs(w.w_o.size());  // |W_o|
    for (std::size_t n = 0; n < wo_abs.size(); ++n) wo_abs[n] = detail::abs_d(w.w_o.data[n]);
    // Output rows (b, i) on the threads, each computed alone in the same order whatever the split.
    ::attnref::detail::parallel_for(d.batch * sq, o.attention.threads, [&](std::size_t bi) {
            const std::size_t b = bi / sq, i = bi % sq;
            for (std::size_t h = 0; h < H; ++h) {
                const double l_row = L[(b * H + h) * sq + i];
                r.row_L[b * sq + i] = std::max(r.row_L[b * sq + i], l_row);
                for (std::size_t c = 0; c < dv; ++c) {
                    const double s = sigma[((b * H + h) * sq + i) * dv + c];
                    if (s == 0) continue;
                    // t0_e += σ·|W_o[m, e]|, t1_e += (L·σ)·|W_o[m, e]|
                    kernels::scaled_add2(s, l_row * s, &wo_abs[(h * dv + c) * eo], eo, &r.t0[(b * sq + i) * eo], &r.t1[(b * sq + i) * eo]);
                }
            }
    });
    // The output bias: adding it rounds once more, relative to |y| ≤ t0 + |b_o|.
    for (std::size_t n = 0; n < r.t0.size(); ++n) {
        const double bo = w.b_o.empty() ? 0.0 : detail::abs_d(w.b_o[n % eo]);
        r.t0[n] = (r.t0[n] + bo) * (1 + 0x1p-46);
        r.t1[n] *= 1 + 0x1p-46;
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
