#pragma once
/// \file bounds/backward_predicted.hpp
/// Owns the SDPA gradient bounds of a declared policy whose rounded quantities are predicted rather
/// than bounded: inputs rounded by the kernel to its storage format (B16,
/// sdpa_gradient_first_order_bounds_predicted_inputs) and weights P stored in a narrow format (B17,
/// sdpa_gradient_first_order_bounds_predicted_weights), each the bound of backward_sdpa.hpp at the
/// predicted values plus the exact shift they cause. Derivation: docs/backward.md, "(B16) Declared
/// policy, inputs rounded by the kernel" and "(B17) Declared policy storing P in a narrow format".

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <vector>

#include "attnref/bounds/backward_row_kernels.hpp"
#include "attnref/bounds/backward_sdpa.hpp"
#include "attnref/bounds/error_bounds.hpp"
#include "attnref/core/attention.hpp"
#include "attnref/core/backward.hpp"
#include "attnref/core/binary_format.hpp"
#include "attnref/core/mask.hpp"
#include "attnref/core/tensor.hpp"

namespace attnref {

/// (B16) The bound of a declared policy that rounds q, k, v and grad_output to nearest even in
/// `input_format` before its backward (the inputs are not values of that format): the rounded inputs
/// x̂ are predicted exactly, so |ĝ − g(x)| ≤ bound(x̂) + |g(x̂) − g(x)| — the bound (B1)–(B7) (with
/// (B5t) where declared) at the rounded inputs and forward weights, plus the exact shift of the
/// gradients the rounding causes, both gradients computed in double by the textbook backward and
/// each carrying its own double error ((B1)–(B6) at u = 2^-53). Row sums of dS: the bound at x̂.
/// std::nullopt where a gradient is not finite (the caller keeps the rounded-inputs bound).
inline std::optional<sdpa_gradient_bounds> sdpa_gradient_first_order_bounds_predicted_inputs(
    tensor_view<const double, 4> q, tensor_view<const double, 4> k, tensor_view<const double, 4> v, tensor_view<const double, 4> grad_output,
    tensor_view<const double, 4> weights, tensor_view<const double, 3> lse, const attention_options& options, double u, double u_storage,
    double u_weights, binary_format input_format, std::optional<backward_algorithm> declared = std::nullopt, double u_intermediates = 0) {
    using D = uniform_precision<double>;
    auto rounded = [&](tensor_view<const double, 4> x) {
        tensor<double, 4> r(x.extents, 0.0);
        for (std::size_t n = 0; n < r.size(); ++n) r[n] = round_to(input_format, x[n]);
        return r;
    };
    const tensor<double, 4> qh = rounded(q), kh = rounded(k), vh = rounded(v), gh = rounded(grad_output);
    const attention_result<D> f = scaled_dot_product_attention<D, double, double, double>(qh.view(), kh.view(), vh.view(), options);
    const attention_gradients<D> at_hat =
        scaled_dot_product_attention_backward<D, double, double, double, double>(qh.view(), kh.view(), vh.view(), gh.view(), options);
    const attention_gradients<D> at_exact =
        scaled_dot_product_attention_backward<D, double, double, double, double>(q, k, v, grad_output, options);
    sdpa_gradient_bounds b = sdpa_gradient_first_order_bounds(qh.view(), kh.view(), vh.view(), gh.view(), f.weights.view(), f.lse.view(),
                                                              options, u, u_storage, u_weights, declared, u_intermediates, true);
    const sdpa_gradient_bounds hat_double =
        sdpa_gradient_first_order_bounds(qh.view(), kh.view(), vh.view(), gh.view(), f.weights.view(), f.lse.view(), options, 0x1p-53);
    const sdpa_gradient_bounds exact_double = sdpa_gradient_first_order_bounds(q, k, v, grad_output, weights, lse, options, 0x1p-53);
    constexpr double inflation = 1 + 0x1p-20;
    // The final storage by value: the kernel's unrounded y is within bound + da of g(x̂) (in double).
    auto add = [&](tensor<double, 4>& bound, const tensor<double, 4>& a, const tensor<double, 4>& e, const tensor<double, 4>& da,
                   const tensor<double, 4>& de) {
        for (std::size_t n = 0; n < bound.size(); ++n) {
            const double rest = bound[n] + da[n], stored = u_storage * (std::fabs(a[n]) + rest);
            const double x = (rest + stored + std::fabs(a[n] - e[n]) + de[n]) * inflation;
            if (!std::isfinite(x)) return false;
            bound[n] = x;
        }
        return true;
    };
    if (!add(b.grad_query, at_hat.grad_query, at_exact.grad_query, hat_double.grad_query, exact_double.grad_query) ||
        !add(b.grad_key, at_hat.grad_key, at_exact.grad_key, hat_double.grad_key, exact_double.grad_key) ||
        !add(b.grad_value, at_hat.grad_value, at_exact.grad_value, hat_double.grad_value, exact_double.grad_value))
        return std::nullopt;
    return b;
}

/// (B17) The bound of a declared textbook backward that stores P in a narrow format (u_weights > u,
/// P rounded to nearest even, times `weights_scale` before the rounding and divided by it after; the
/// fp32_p_fp8* and fp32_p_bf16 policies) with its gradients in the arithmetic's format. The stored
/// weights are predicted, not bounded by u_weights·P: the kernel's P̃_ij (its forward's, within
/// ε_ij = e_P·P_ij + 4η_a of the exact P_ij at the inputs x̂ it computes on, (B2) without u_weights)
/// rounds to P̂_ij ∈ [w(P − ε), w(P + ε)], w(y) = round(S·y)/S, a single value c_ij = w(P_ij) except
/// within ε of a rounding boundary (residual r_ij = max of the distances to the ends, usually 0). So
///   |ĝ − g(x)| ≤ bound(x̂, c, u_weights = 0)            ((B1)–(B6) at the exact weights c, uncentred:
///                                                       c need not sum to 1, so (B5t) does not apply)
///              + Δ_r                                    (the residual: |ΔdS_ij| ≤ r_ij|dP_ij − D̃_i| +
///                                                       (c_ij + r_ij)Σ_l r_il|dP_il|, |ΔdV_jc| ≤ Σ_i r_ij|dO_ic|)
///              + |g̃(x̂, c) − g(x)|                      (the exact shift: g̃ the textbook formulas with
///                                                       weights c, D̃_i = Σ_j c_ij dP_ij, in double)
///              + both double computations' errors      ((B1)–(B6) at u = 2^-53),
/// per element, with the data: the weights' rounding errors enter with their signs, and small weights
/// with their own (absolute, underflow) error. input_format: the kernel first rounds q, k, v, dO to
/// it (x̂ = round(x), as (B16)); nullopt: x̂ = x. shift_factor scales the exact shift (1; a test
/// weakens it). Rows of NaN weights (the nan policy's empty rows) are left out, and elements whose
/// exact gradient is not finite get bound 0 (they are matched exactly); std::nullopt where any other
/// weight or bound is not finite (the caller keeps (B*)).
inline std::optional<sdpa_gradient_bounds> sdpa_gradient_first_order_bounds_predicted_weights(
    tensor_view<const double, 4> q, tensor_view<const double, 4> k, tensor_view<const double, 4> v, tensor_view<const double, 4> grad_output,
    const attention_options& options, double u, double (*round_weights)(double), double weights_scale,
    std::optional<binary_format> input_format = std::nullopt, double shift_factor = 1) {
    using D = uniform_precision<double>;
    const attention_dims d = logit_stage::attention_dims_of(q, k, v);
    require_extent("grad_output axis 3 (head dim dv)", grad_output.extents[3], d.head_dim_v);
    auto rounded = [&](tensor_view<const double, 4> x) {
        tensor<double, 4> r(x.extents, 0.0);
        for (std::size_t n = 0; n < r.size(); ++n) r[n] = input_format ? round_to(*input_format, x[n]) : x[n];
        return r;
    };
    const tensor<double, 4> qh = rounded(q), kh = rounded(k), vh = rounded(v), gh = rounded(grad_output);
    const attention_result<D> f = scaled_dot_product_attention<D, double, double, double>(qh.view(), kh.view(), vh.view(), options);
    const attention_result<D> fe = scaled_dot_product_attention<D, double, double, double>(q, k, v, options);
    const attention_gradients<D> at_exact =
        scaled_dot_product_attention_backward<D, double, double, double, double>(q, k, v, grad_output, options);
    const std::size_t group = d.heads / d.kv_heads, sq = d.query_length, sk = d.key_length, dk = d.head_dim_qk, dv = d.head_dim_v;
    const double s_abs = detail::bound_logit_scale(options, dk), s = options.scale ? *options.scale : s_abs;
    const double eta_a = error_bounds::underflow_eta(u);
    auto w = [&](double y) { return round_weights(weights_scale * y) / weights_scale; };
    // The predicted weights c and their residuals r.
    tensor<double, 4> c(f.weights.extents(), 0.0), r(f.weights.extents(), 0.0);
    std::vector<double> dp_abs(sk), dp(sk), ds(sk), dsr(sk);
    for (std::size_t b = 0; b < d.batch; ++b)
        for (std::size_t h = 0; h < d.heads; ++h)
            for (std::size_t i = 0; i < sq; ++i) {
                const detail::gradient_row row = detail::gradient_row_terms(qh.view(), kh.view(), vh.view(), gh.view(), f.weights.view(),
                                                                            f.lse.view(), options, d, b, h, i, s_abs, u, 0.0, dp_abs);
                bool nan_row = false;
                for (std::size_t j = 0; j < sk; ++j) nan_row = nan_row || std::isnan(f.weights(b, h, i, j));
                if (nan_row) continue;  // the nan policy's empty row: its gradients are NaN, matched exactly
                for (std::size_t j = 0; j < sk; ++j) {
                    const double p = f.weights(b, h, i, j);
                    if (!std::isfinite(p)) return std::nullopt;
                    if (!row.empty && structurally_masked(options.mask, b, h, i, j, sq, sk)) continue;
                    // An empty row's uniform weight 1/Sk is computed with one rounding (u·p).
                    const double eps = (row.empty ? u * p : (1 + 0x1p-10) * row.e_p * p + 4 * eta_a) + 0x1p-1074;
                    const double cc = w(p), lo = w(std::max(0.0, p - eps)), hi = w(p + eps);
                    c(b, h, i, j) = cc;
                    r(b, h, i, j) = std::max(hi - cc, cc - lo);
                }
            }
    // g̃(x̂, c) in double and the residual's bound Δ_r.
    tensor<double, 4> dq({d.batch, d.heads, sq, dk}, 0.0), dkk({d.batch, d.kv_heads, sk, dk}, 0.0), dvv({d.batch, d.kv_heads, sk, dv}, 0.0);
    tensor<double, 4> rq(dq.extents(), 0.0), rk(dkk.extents(), 0.0), rv(dvv.extents(), 0.0);
    for (std::size_t b = 0; b < d.batch; ++b)
        for (std::size_t h = 0; h < d.heads; ++h)
            for (std::size_t i = 0; i < sq; ++i) {
                const std::size_t hk = h / group;
                bool empty = true;
                for (std::size_t j = 0; j < sk && empty; ++j) empty = structurally_masked(options.mask, b, h, i, j, sq, sk);
                for (std::size_t j = 0; j < sk; ++j)
                    for (std::size_t x = 0; x < dv; ++x) {
                        dvv(b, hk, j, x) += c(b, h, i, j) * gh(b, h, i, x);
                        rv(b, hk, j, x) += r(b, h, i, j) * std::fabs(gh(b, h, i, x));
                    }
                if (empty) continue;  // the uniform policy's dV only; dQ = 0
                double Dt = 0, R = 0;
                for (std::size_t j = 0; j < sk; ++j) {
                    double x = 0, xa = 0;
                    for (std::size_t y = 0; y < dv; ++y) x += gh(b, h, i, y) * vh(b, hk, j, y), xa += std::fabs(gh(b, h, i, y) * vh(b, hk, j, y));
                    dp[j] = x, dp_abs[j] = xa;
                    Dt += c(b, h, i, j) * x;
                    R += r(b, h, i, j) * xa;
                }
                for (std::size_t j = 0; j < sk; ++j) {
                    double factor = 1;
                    if (options.softcap) {
                        double raw = 0;
                        for (std::size_t y = 0; y < dk; ++y) raw += qh(b, h, i, y) * kh(b, hk, j, y);
                        const double t = std::tanh(s * raw / *options.softcap);
                        factor = (1 - t) * (1 + t);
                    }
                    ds[j] = c(b, h, i, j) * (dp[j] - Dt) * factor;
                    // The residual (exact, not first order: the weights' ξ enter dS and D̃ linearly and their product once).
                    dsr[j] = (r(b, h, i, j) * (std::fabs(dp[j] - Dt) + R) + c(b, h, i, j) * R) * std::fabs(factor);
                    for (std::size_t y = 0; y < dk; ++y) {
                        dq(b, h, i, y) += s * ds[j] * kh(b, hk, j, y);
                        dkk(b, hk, j, y) += s * ds[j] * qh(b, h, i, y);
                        rq(b, h, i, y) += s_abs * dsr[j] * std::fabs(kh(b, hk, j, y));
                        rk(b, hk, j, y) += s_abs * dsr[j] * std::fabs(qh(b, h, i, y));
                    }
                }
            }
    // bound(x̂, c) in the arithmetic, and the two double computations' own errors.
    sdpa_gradient_bounds bnd = sdpa_gradient_first_order_bounds(qh.view(), kh.view(), vh.view(), gh.view(), c.view(), f.lse.view(), options, u,
                                                                0, 0, std::nullopt, 0, false, true);
    const sdpa_gradient_bounds hat_double = sdpa_gradient_first_order_bounds(qh.view(), kh.view(), vh.view(), gh.view(), c.view(),
                                                                             f.lse.view(), options, 0x1p-53, 0, 0, std::nullopt, 0, false, true);
    const sdpa_gradient_bounds exact_double =
        sdpa_gradient_first_order_bounds(q, k, v, grad_output, fe.weights.view(), fe.lse.view(), options, 0x1p-53);
    constexpr double inflation = 1 + 0x1p-20;
    auto add = [&](tensor<double, 4>& bound, const tensor<double, 4>& g_hat, const tensor<double, 4>& g_exact, const tensor<double, 4>& res,
                   const tensor<double, 4>& da, const tensor<double, 4>& de) {
        for (std::size_t n = 0; n < bound.size(); ++n) {
            if (!std::isfinite(g_exact[n])) {  // a non-finite exact gradient is matched exactly (tol::compare)
                bound[n] = 0;
                continue;
            }
            const double x = (bound[n] + res[n] + shift_factor * std::fabs(g_hat[n] - g_exact[n]) + da[n] + de[n]) * inflation;
            if (!std::isfinite(x)) return false;
            bound[n] = x;
        }
        return true;
    };
    if (!add(bnd.grad_query, dq, at_exact.grad_query, rq, hat_double.grad_query, exact_double.grad_query) ||
        !add(bnd.grad_key, dkk, at_exact.grad_key, rk, hat_double.grad_key, exact_double.grad_key) ||
        !add(bnd.grad_value, dvv, at_exact.grad_value, rv, hat_double.grad_value, exact_double.grad_value))
        return std::nullopt;
    return bnd;
}

}  // namespace attnref
