#pragma once
/// \file bounds/backward_row_kernels.hpp
/// Owns what the backward bounds (backward_sdpa.hpp, backward_mha.hpp, backward_predicted.hpp and
/// backward_probabilistic.hpp) compute per query row or per row of a sum: the logit scale and term
/// count n of the bound, the per-row terms L_i, e_P, D̄_i and |dP|_ij of (B1)–(B4) (gradient_row_terms),
/// the underflow terms (B14), the stored-intermediates counts (B2s), (B4s), and the row updates the
/// bounds' loops are written with (each element's operations and their order as in plain loops, so
/// the compiler may vectorise them without changing a bit). Derivation: docs/backward.md, "Backward
/// pass: the gradient error bound, and checking gradients".

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "attnref/bounds/error_bounds.hpp"
#include "attnref/core/attention.hpp"
#include "attnref/core/mask.hpp"
#include "attnref/core/tensor.hpp"

namespace attnref {

namespace detail {
/// |s|: the logit scale of the bounds (the caller's, or 1/√dk).
inline double bound_logit_scale(const attention_options& options, std::size_t dk) {
    return options.scale ? std::fabs(*options.scale) : 1 / std::sqrt(static_cast<double>(dk));
}
/// n of the SDPA bound: max(dk, dv, Sk, Sq·group) + 10.
inline double bound_terms(const attention_dims& d) {
    return static_cast<double>(std::max({d.head_dim_qk, d.head_dim_v, d.key_length, d.query_length * (d.heads / d.kv_heads)}) + 10);
}
/// The per-row terms of (B1)–(B4) shared by the SDPA and MHA bounds: L_i (B1), e_P (B2), D̄_i (B3),
/// and |dP|_ij = Σ_c|dO_ic v_jc| into dp_abs (every key, masked ones included).
struct gradient_row {
    bool empty = true;
    double logit_magnitude = 0, d_abs = 0, e_p = 0;
    double dp_sum = 0;  ///< Σ_j |dP|_ij over the attendable keys ((B14): D's share of the weights' underflow)
};

/// (B14) storage underflow: every rounding into a format's subnormal range has an absolute error up
/// to η = error_bounds::underflow_eta(u) beyond its relative one (|fl(x) − x| ≤ u|x| + η). η_a: the
/// arithmetic's (each product), η_s: the gradients' and dS's storage format's, η_w: the weights'.
/// A weight P̂_ij carries η_p = η_w + 4η_a absolutely (exp, the division or exp(S − lse), storage);
/// dS_ij = P_ij(dP_ij − D_i) carries η_ds = 3η_s + (Sk + 2dv + 6)η_a (dP's dv products and storage,
/// D's Sk + dv products and storage, dS's products and storage) plus η_p(|dP|_ij + D̄_i + Σ_l |dP|_il)
/// (the weights' through dP − D and through D); a stored gradient η_out (η_s, or η_a unstored).
struct underflow_terms {
    double eta_a = 0, eta_s = 0, eta_w = 0, eta_out = 0, eta_p = 0, eta_ds = 0, scale_factor = 1;
};
inline underflow_terms underflow_of(double u, double u_storage, double u_weights, const attention_dims& d, double s) {
    underflow_terms t;
    t.eta_a = error_bounds::underflow_eta(u);
    t.eta_s = error_bounds::underflow_eta(u_storage);
    t.eta_w = error_bounds::underflow_eta(u_weights);
    t.eta_out = u_storage > 0 ? t.eta_s : t.eta_a;
    t.eta_p = t.eta_w + 4 * t.eta_a;
    t.eta_ds = 3 * t.eta_s + static_cast<double>(d.key_length + 2 * d.head_dim_v + 6) * t.eta_a;
    t.scale_factor = std::max(1.0, s);  // an η_a before or after the scale's multiplication
    return t;
}
/// (B2s): how many roundings to a storage format a logit may take in a kernel that stores its
/// intermediates in that format (PyTorch's eager bf16/fp16): the scaled q or the product, the scaled k
/// or the scale's multiplication, the stored logit, each additive term (ALiBi, additive mask) and
/// soft-capping's division, tanh and multiplication; each moves the logit by ≤ u_intermediates·L_i.
inline double stored_logit_roundings(const attention_options& options) {
    return 3.0 + (options.alibi_slopes.empty() ? 0.0 : 1.0) + (options.mask.additive.present() ? 1.0 : 0.0) + (options.softcap ? 3.0 : 0.0);
}
/// (B4s): the roundings to storage format of dS-sized quantities besides dS's final one: dP (through
/// dS and D), D, the scaled dS, and soft-capping's dS·(1 − t²).
inline double stored_ds_roundings(const attention_options& options) { return 4.0 + (options.softcap ? 1.0 : 0.0); }
/// The gradient bounds' blocking (sdpa_gradient_first_order_bounds, perturbed_sdpa_bounds): query
/// rows per block and keys per tile; the order of every element's terms does not depend on them.
inline constexpr std::size_t bound_row_block = 32, bound_key_tile = 64;
/// y_x += a·|x_x| over a row (the gradient bounds' per-key updates; distinct rows, by-value scalars,
/// so the compiler can use vector registers: each element's operations and order unchanged).
inline void add_scaled_abs(double* __restrict y, const double* __restrict x, double a, std::size_t n) {
    for (std::size_t c = 0; c < n; ++c) y[c] += a * std::fabs(x[c]);
}
/// perturbed_sdpa_bounds' value-side row updates (see there), element by element as written there.
inline void perturbed_value_rows(double* __restrict adv, double* __restrict mdv, double* __restrict ao, double* __restrict mo,
                                 const double* __restrict vr, const double* __restrict ver, const double* __restrict gr,
                                 const double* __restrict ger, double pw, double dl, double f, double eta_p, std::size_t n) {
    for (std::size_t c = 0; c < n; ++c) {
        const double vo = std::fabs(vr[c]), go = std::fabs(gr[c]);
        adv[c] += pw * (2 * dl * go + ger[c]);
        mdv[c] += pw * go;
        ao[c] += pw * (f * vo + ver[c]) + eta_p * vo;
        mo[c] += pw * vo;
    }
}
/// perturbed_sdpa_bounds' query and key row updates (see there), element by element as written there.
inline void perturbed_qk_rows(double* __restrict adq, double* __restrict adk, double* __restrict mdq, double* __restrict mdk,
                              const double* __restrict kr, const double* __restrict ker, const double* __restrict qr,
                              const double* __restrict qer, double s, double nn, double m, std::size_t n) {
    for (std::size_t c = 0; c < n; ++c) {
        const double kk = std::fabs(kr[c]), qq = std::fabs(qr[c]);
        adq[c] += s * (nn * kk + m * ker[c]);
        adk[c] += s * (nn * qq + m * qer[c]);
        mdq[c] += s * m * kk;
        mdk[c] += s * m * qq;
    }
}

/// The multi-head bound's row updates (mha_gradient_first_order_bounds), element by element as the
/// plain loops wrote them (distinct outputs per lane, each in its own order):
/// v += x·w, m += |x·w|, in += |x| + |w| (a projection's value, magnitude and input sum);
inline void projection_sums_row(double x, const double* __restrict w, const double* __restrict w_abs, double* __restrict v,
                                double* __restrict m, double* __restrict in, std::size_t n) {
    const double xa = std::fabs(x);
    for (std::size_t c = 0; c < n; ++c) {
        const double t = x * w[c];
        v[c] += t;
        m[c] += std::fabs(t);
        in[c] += xa + w_abs[c];
    }
}
/// y += a·x + b (dX from one column's error: a = to_x, x = |W| row, b = its underflow);
inline void scaled_abs_row(double* __restrict y, const double* __restrict x, double a, double b, std::size_t n) {
    for (std::size_t c = 0; c < n; ++c) y[c] += a * x[c] + b;
}
/// y += s·t + b (dW from one row: s = |x|, t = to_w row, b = underflow row);
inline void scale_row_add(double* __restrict y, const double* __restrict t, const double* __restrict b, double s, std::size_t n) {
    for (std::size_t c = 0; c < n; ++c) y[c] += s * t[c] + b[c];
}
/// y += k·g + η·(mo + g) (dW_o from one row: k = A_o + rel·M_o, mo = M_o, g = |dOut| row).
inline void output_weight_row(double* __restrict y, const double* __restrict g, double k, double mo, double eta, std::size_t n) {
    for (std::size_t c = 0; c < n; ++c) y[c] += k * g[c] + eta * (mo + g[c]);
}

/// out[j] = Σ_c f(c, j) over c = 0 … n − 1 in order, for j = 0 … m − 1, four j side by side in
/// independent accumulators (the plain loop's additions for each j, so the same values; the chains'
/// latencies overlap and the accumulators stay in registers).
template <class F>
inline void row_sums4(std::size_t m, std::size_t n, double* out, F f) {
    std::size_t j = 0;
    for (; j + 4 <= m; j += 4) {
        double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        for (std::size_t c = 0; c < n; ++c) {
            a0 += f(c, j);
            a1 += f(c, j + 1);
            a2 += f(c, j + 2);
            a3 += f(c, j + 3);
        }
        out[j] = a0, out[j + 1] = a1, out[j + 2] = a2, out[j + 3] = a3;
    }
    for (; j < m; ++j) {
        double a = 0;
        for (std::size_t c = 0; c < n; ++c) a += f(c, j);
        out[j] = a;
    }
}

inline gradient_row gradient_row_terms(tensor_view<const double, 4> q, tensor_view<const double, 4> k, tensor_view<const double, 4> v,
                                       tensor_view<const double, 4> grad_output, tensor_view<const double, 4> weights,
                                       tensor_view<const double, 3> lse, const attention_options& options, const attention_dims& d,
                                       std::size_t bb, std::size_t h, std::size_t i, double s, double u, double u_weights,
                                       std::vector<double>& dp_abs, double u_intermediates = 0) {
    const std::size_t hk = h / (d.heads / d.kv_heads), n_qk = d.head_dim_qk, n_v = d.head_dim_v;
    gradient_row r;
    const double dk = static_cast<double>(d.head_dim_qk);
    // Σ_x |q_x k_jx| and Σ_x |dO_x v_jx| for every key j (contiguous rows).
    thread_local std::vector<double> qk_abs;
    qk_abs.resize(d.key_length);
    const double *qr = &q(bb, h, i, 0), *kb = &k(bb, hk, 0, 0), *gr = &grad_output(bb, h, i, 0), *vb = &v(bb, hk, 0, 0);
    row_sums4(d.key_length, n_qk, qk_abs.data(), [=](std::size_t x, std::size_t j) { return std::fabs(qr[x] * kb[j * n_qk + x]); });
    row_sums4(d.key_length, n_v, dp_abs.data(), [=](std::size_t x, std::size_t j) { return std::fabs(gr[x] * vb[j * n_v + x]); });
    // Keys the seed mask pushes down by 1e9 (seed = 1) while another key of the row is not seed-masked:
    // their logits stay below the row's by ≥ 1e9/2 whatever the rounding (checked below), so their
    // weights are exactly 0 in every format and they add exactly 0 to every sum — they do not enter L_i.
    // (A key without seed whose logit magnitude is ≤ 1e9/8 keeps the row's maximum ≥ −1e9/8.)
    auto rest_magnitude = [&](std::size_t j) {
        double m = s * qk_abs[j];
        if (!options.alibi_slopes.empty())
            m += std::fabs(options.alibi_slopes[h]) * static_cast<double>(d.query_length + d.key_length);
        if (options.mask.additive.present()) m += std::fabs(options.mask.additive.at(bb, h, i, j));
        return m;
    };
    bool any_unseeded = false;
    if (options.mask.seed.present())
        for (std::size_t j = 0; j < d.key_length && !any_unseeded; ++j)
            any_unseeded = !structurally_masked(options.mask, bb, h, i, j, d.query_length, d.key_length) &&
                           options.mask.seed.at(bb, h, i, j) == 0 && rest_magnitude(j) <= -seed_mask_value / 8;
    for (std::size_t j = 0; j < d.key_length; ++j) {
        if (structurally_masked(options.mask, bb, h, i, j, d.query_length, d.key_length)) continue;
        r.empty = false;
        double m = rest_magnitude(j);
        const double seed = options.mask.seed.present() ? -seed_mask_value * std::fabs(options.mask.seed.at(bb, h, i, j)) : 0;
        if (any_unseeded && seed >= -seed_mask_value && 8 * m <= seed && (dk + 3) * u * (m + seed) <= seed / 8) {
            r.d_abs += weights(bb, h, i, j) * dp_abs[j];
            r.dp_sum += dp_abs[j];
            continue;
        }
        m += seed;
        r.logit_magnitude = std::max(r.logit_magnitude, m);
        r.d_abs += weights(bb, h, i, j) * dp_abs[j];
        r.dp_sum += dp_abs[j];
    }
    if (!r.empty) {
        // (B14): the logits' dk + 4 products and scalings may each underflow by η_a (relative to P: 2×).
        r.e_p = u * (2 * (dk + 4) * r.logit_magnitude + 2 * std::fabs(lse(bb, h, i)) + 2 * static_cast<double>(d.key_length) + 10) +
                u_weights + 2 * (dk + 4) * error_bounds::underflow_eta(u) * std::max(1.0, s) +   // (B2), (B7), (B14)
                2 * stored_logit_roundings(options) * u_intermediates * r.logit_magnitude;   // (B2s)
    }
    return r;
}
}  // namespace detail

}  // namespace attnref
