#pragma once
/// \file backward_bounds.hpp
/// Owns the first-order data-aware error bound of SDPA gradients (dQ, dK, dV and the row sums of dS)
/// computed in a floating-point format with unit roundoff u, as a function of the exact-enough
/// forward quantities (inputs, weights P, lse). The checker uses it to judge a candidate's gradients
/// and the tests use it to judge attnref's own; the derivation is below and in docs/backward.md.
///
/// Derivation (first order in u; n = max(dk, dv, Sk, Sq·H/Hkv) + 10, γ = n·u; every sum of m terms
/// carries ≤ (m + 1)u relative error on the sum of the magnitudes — Higham, Accuracy and Stability of
/// Numerical Algorithms, 2nd ed., §3.1):
///  (B1) logits: |ΔS_ij| ≤ (dk + 3)u·L_i, L_i = max_j of s·Σ_c|q_ic k_jc| + |ALiBi| + |additive| + 1e9·seed;
///  (B2) P (the forward's, or exp(S − lse) recomputed): |ΔP_ij| ≤ e_P·P_ij,
///       e_P = u(2(dk + 4)L_i + 2|lse_i| + 2Sk + 10): the softmax's sensitivity doubles the logit
///       error, the softmax itself adds (Sk + 3)u (Blanchard, Higham & Mary, "Accurate computation of
///       the log-sum-exp and softmax functions", IMA J. Numer. Anal. 41, 2021), exp(S − lse) loses
///       |S − lse|·u;
///  (B3) dP_ij = dO_i·v_j: ≤ γ·|dP|_ij with |dP|_ij = Σ_c|dO_ic v_jc|; D_i (either Σ_j P dP or dO·O):
///       ≤ (2γ + e_P)·D̄_i, D̄_i = Σ_j P_ij |dP|_ij;
///  (B4) dS_ij = P_ij(dP_ij − D_i): ≤ (3γ + 2e_P)·M_ij, M_ij = P_ij(|dP|_ij + D̄_i); soft-capping
///       multiplies by 1 − t² ≤ 1, computed with e_cap = (4 + 2(dk + 3)L_i/cap)u absolute error; the
///       scale adds 3u;
///  (B5) dQ_ic = s·Σ_j dS_ij k_jc: ≤ s·Σ_j ρ_i M_ij |k_jc|, ρ_i = 4γ + 2e_P + e_cap + 3u; dK likewise
///       with |q_ic| summed over the group's heads and rows (GQA); dV_jc = Σ_i P_ij dO_ic:
///       ≤ Σ_i (γ + e_P) P_ij |dO_ic|;
///  (B6) Σ_j dS_ij, exactly 0: its computed value ≤ Σ_j ρ_i M_ij.
///  (B7) gradients stored in a narrower format than the arithmetic (bf16 or fp16 kernels with float32
///       accumulation): the final rounding adds u_storage·|g| ≤ u_storage times the magnitude sums of
///       (B5), i.e. ρ_i → ρ_i + u_storage for dQ and dK and γ + e_P → γ + e_P + u_storage for dV.
/// Rows the mask leaves empty contribute only the uniform policy's dV_j += dO_i/Sk (γ·P_ij|dO_ic|).
/// Second-order terms (products of two u's) are dropped: the bound is first order, as are the
/// forward's data-aware bounds (tolerance.hpp), and callers that turn it into a verdict say so. It is
/// evaluated in double, rounding upward in effect by a final factor 1 + 2^-20 (each bound is a sum of
/// at most a few times n·(dk + dv) nonnegative products, whose relative rounding error is far below it).
///
/// The bound holds for every summation order of the sums (the analysis uses the order-free (m + 1)u
/// form), for both backward algorithms (textbook and FlashAttention's), and for any scale placement.

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "attnref/attention.hpp"
#include "attnref/mask.hpp"
#include "attnref/tensor.hpp"

namespace attnref {

/// Per-element bounds on |ĝ − g|, shaped like the gradients; logits_row_sum is (B, H, Sq, 1).
struct sdpa_gradient_bounds {
    tensor<double, 4> grad_query, grad_key, grad_value, logits_row_sum;
};

/// The first-order bound (B1)–(B7) for gradients computed with unit roundoff `u` (2^-53 for float64,
/// 2^-24 float32, 2^-8 bfloat16, 2^-11 float16) and stored with unit roundoff `u_storage` (0: stored
/// in the arithmetic's own format; 2^-8 for bf16 gradients accumulated in float32). q, k, v, grad_output as given to the backward
/// (exact values); weights (B, H, Sq, Sk) and lse (B, H, Sq) the exact forward's (certified golden
/// values or a high-precision computation: their own rounding is second order).
inline sdpa_gradient_bounds sdpa_gradient_first_order_bounds(tensor_view<const double, 4> q, tensor_view<const double, 4> k,
                                                             tensor_view<const double, 4> v,
                                                             tensor_view<const double, 4> grad_output,
                                                             tensor_view<const double, 4> weights, tensor_view<const double, 3> lse,
                                                             const attention_options& options, double u,
                                                             double u_storage = 0) {
    const attention_dims d = detail::attention_dims_of(q, k, v);
    require_extent("grad_output axis 3 (head dim dv)", grad_output.extents[3], d.head_dim_v);
    require_extent("weights axis 3 (key length)", weights.extents[3], d.key_length);
    const std::size_t group = d.heads / d.kv_heads;
    const double s = options.scale ? std::fabs(*options.scale) : 1 / std::sqrt(static_cast<double>(d.head_dim_qk));
    const double n = static_cast<double>(std::max({d.head_dim_qk, d.head_dim_v, d.key_length, d.query_length * group}) + 10);
    const double gamma = n * u;
    const double dk = static_cast<double>(d.head_dim_qk);
    sdpa_gradient_bounds b{tensor<double, 4>({d.batch, d.heads, d.query_length, d.head_dim_qk}, 0.0),
                           tensor<double, 4>({d.batch, d.kv_heads, d.key_length, d.head_dim_qk}, 0.0),
                           tensor<double, 4>({d.batch, d.kv_heads, d.key_length, d.head_dim_v}, 0.0),
                           tensor<double, 4>({d.batch, d.heads, d.query_length, 1}, 0.0)};
    std::vector<double> dp_abs(d.key_length);
    for (std::size_t bb = 0; bb < d.batch; ++bb)
        for (std::size_t h = 0; h < d.heads; ++h)
            for (std::size_t i = 0; i < d.query_length; ++i) {
                const std::size_t hk = h / group;
                double logit_magnitude = 0, d_abs = 0;
                bool empty = true;
                for (std::size_t j = 0; j < d.key_length; ++j) {
                    double qk = 0, ov = 0;
                    for (std::size_t x = 0; x < d.head_dim_qk; ++x) qk += std::fabs(q(bb, h, i, x) * k(bb, hk, j, x));
                    for (std::size_t x = 0; x < d.head_dim_v; ++x) ov += std::fabs(grad_output(bb, h, i, x) * v(bb, hk, j, x));
                    dp_abs[j] = ov;
                    if (structurally_masked(options.mask, bb, h, i, j, d.query_length, d.key_length)) continue;
                    empty = false;
                    double m = s * qk;
                    if (!options.alibi_slopes.empty())
                        m += std::fabs(options.alibi_slopes[h]) * static_cast<double>(d.query_length + d.key_length);
                    if (options.mask.additive.present()) m += std::fabs(options.mask.additive.at(bb, h, i, j));
                    if (options.mask.seed.present()) m += 1e9 * std::fabs(options.mask.seed.at(bb, h, i, j));
                    logit_magnitude = std::max(logit_magnitude, m);
                    d_abs += weights(bb, h, i, j) * dp_abs[j];
                }
                if (empty) {  // only the uniform policy's dV_j += dO_i/Sk
                    for (std::size_t j = 0; j < d.key_length; ++j)
                        for (std::size_t x = 0; x < d.head_dim_v; ++x)
                            b.grad_value(bb, hk, j, x) += (gamma + u_storage) * std::fabs(weights(bb, h, i, j)) * std::fabs(grad_output(bb, h, i, x));
                    continue;
                }
                const double lse_i = std::fabs(lse(bb, h, i));
                const double e_p = u * (2 * (dk + 4) * logit_magnitude + 2 * lse_i + 2 * static_cast<double>(d.key_length) + 10);  // (B2)
                const double e_cap = options.softcap ? u * (4 + 2 * (dk + 3) * logit_magnitude / std::fabs(*options.softcap)) : 0;
                const double rho = 4 * gamma + 2 * e_p + e_cap + 3 * u;  // (B5)
                const double rho_stored = rho + u_storage;                 // (B7)
                for (std::size_t j = 0; j < d.key_length; ++j) {
                    if (structurally_masked(options.mask, bb, h, i, j, d.query_length, d.key_length)) continue;
                    const double p = weights(bb, h, i, j);
                    const double m = p * (dp_abs[j] + d_abs);  // M_ij (B4)
                    b.logits_row_sum(bb, h, i, 0) += rho * m;
                    for (std::size_t x = 0; x < d.head_dim_qk; ++x) {
                        b.grad_query(bb, h, i, x) += s * rho_stored * m * std::fabs(k(bb, hk, j, x));
                        b.grad_key(bb, hk, j, x) += s * rho_stored * m * std::fabs(q(bb, h, i, x));
                    }
                    for (std::size_t x = 0; x < d.head_dim_v; ++x)
                        b.grad_value(bb, hk, j, x) += (gamma + e_p + u_storage) * p * std::fabs(grad_output(bb, h, i, x));
                }
            }
    constexpr double inflation = 1 + 0x1p-20;  // second-order terms and the bound's own rounding
    for (tensor<double, 4>* t : {&b.grad_query, &b.grad_key, &b.grad_value, &b.logits_row_sum})
        for (double& x : t->storage()) x *= inflation;
    return b;
}

}  // namespace attnref
