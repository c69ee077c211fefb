#pragma once
/// \file bounds/backward_sdpa.hpp
/// Owns the first-order data-aware error bounds of SDPA gradients (dQ, dK, dV and the row sums of dS)
/// computed in a floating-point format with unit roundoff u, as a function of the exact-enough forward
/// quantities (inputs, weights P, lse): (B1)–(B7) with (B2s), (B4s), (B14)
/// (sdpa_gradient_first_order_bounds), the centred dQ bound (B5t) of a declared textbook backward,
/// the bound at inputs already carrying errors (B9)–(B11) (detail::perturbed_sdpa_bounds, also the head
/// bound of backward_mha.hpp) and the bound for a backward that first rounds its inputs
/// (sdpa_gradient_first_order_bounds_rounded_inputs). Derivation: docs/backward.md, "Backward pass:
/// the gradient error bound, and checking gradients" and "Multi-head attention: (B8)–(B13)".

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include "attnref/bounds/backward_row_kernels.hpp"
#include "attnref/bounds/error_bounds.hpp"
#include "attnref/core/attention.hpp"
#include "attnref/core/backward.hpp"
#include "attnref/core/mask.hpp"
#include "attnref/core/parallel.hpp"
#include "attnref/core/tensor.hpp"

namespace attnref {

/// Per-element bounds on |ĝ − g|, shaped like the gradients; logits_row_sum is (B, H, Sq, 1).
struct sdpa_gradient_bounds {
    tensor<double, 4> grad_query, grad_key, grad_value, logits_row_sum;
};

namespace detail {
/// Whether (B5t) replaces (B5) for dQ: a declared textbook backward, without soft-capping.
inline bool textbook_bound_applies(std::optional<backward_algorithm> declared, const attention_options& options) {
    return declared == backward_algorithm::textbook && !options.softcap;
}
/// (B5t): the dQ bound of a declared textbook backward, shaped (B, H, Sq, dk), before the final
/// inflation. eq, ek, ev, edo: absolute errors already in q, k, v, grad_output ((B9); empty views: none).
inline tensor<double, 4> textbook_grad_query_bounds(tensor_view<const double, 4> q, tensor_view<const double, 4> k,
                                                    tensor_view<const double, 4> v, tensor_view<const double, 4> grad_output,
                                                    tensor_view<const double, 4> eq, tensor_view<const double, 4> ek,
                                                    tensor_view<const double, 4> ev, tensor_view<const double, 4> edo,
                                                    tensor_view<const double, 4> weights, tensor_view<const double, 3> lse,
                                                    const attention_options& options, double u, double u_storage, double u_weights,
                                                    double u_intermediates = 0, bool final_storage_by_value = false) {
    const attention_dims d = logit_stage::attention_dims_of(q, k, v);
    const std::size_t group = d.heads / d.kv_heads, sq = d.query_length, sk = d.key_length, dk = d.head_dim_qk, dv = d.head_dim_v;
    const double us_final = final_storage_by_value ? 0.0 : u_storage;  // dQ's own storage: left to the caller
    const double s = bound_logit_scale(options, dk), gamma = bound_terms(d) * u;
    const double Sk = static_cast<double>(sk), Dk = static_cast<double>(dk), Dv = static_cast<double>(dv);
    const bool errors = !eq.empty();
    const underflow_terms uf = underflow_of(u, u_storage, u_weights, d, s);
    tensor<double, 4> out({d.batch, d.heads, sq, dk}, 0.0);
    std::vector<double> dp_abs(sk), dp(sk), g(sk), z(sk), C(sk), T(sk), dS(sk), w(sk), eta(sk);
    std::vector<std::pair<double, double>> kw;  // (k_jc, weight) for the weighted median
    kw.reserve(sk);
    for (std::size_t b = 0; b < d.batch; ++b)
        for (std::size_t h = 0; h < d.heads; ++h)
            for (std::size_t i = 0; i < sq; ++i) {
                const std::size_t hk = h / group;
                const gradient_row r = gradient_row_terms(q, k, v, grad_output, weights, lse, options, d, b, h, i, s, u, u_weights, dp_abs);
                if (r.empty) continue;  // no attendable key: dQ is exactly 0
                auto attendable = [&](std::size_t j) {
                    return !structurally_masked(options.mask, b, h, i, j, sq, sk) && weights(b, h, i, j) > 0;
                };
                double sigma = 0, D = 0, z_bar = 0;
                for (std::size_t j = 0; j < sk; ++j) {
                    double x = 0, sg = 0, pj = 0;
                    for (std::size_t c = 0; c < dv; ++c) x += grad_output(b, h, i, c) * v(b, hk, j, c);
                    if (errors) {
                        for (std::size_t c = 0; c < dk; ++c)
                            sg += eq(b, h, i, c) * std::fabs(k(b, hk, j, c)) + std::fabs(q(b, h, i, c)) * ek(b, hk, j, c);
                        for (std::size_t c = 0; c < dv; ++c)
                            pj += edo(b, h, i, c) * std::fabs(v(b, hk, j, c)) + std::fabs(grad_output(b, h, i, c)) * ev(b, hk, j, c);
                    }
                    dp[j] = x;
                    z[j] = (gamma + u_storage) * dp_abs[j] + pj;  // Z_ij
                    if (!attendable(j)) continue;
                    sigma = std::max(sigma, s * sg);
                    D += weights(b, h, i, j) * x;
                    z_bar += weights(b, h, i, j) * z[j];
                }
                // dP and D in double: |computed − exact| ≤ (dv + Sk + 4)·2^-52·(|dP|_ij + D̄_i), added to g.
                const double margin = (Dv + Sk + 4) * 0x1p-52;
                const double abs_d = std::fabs(D) + margin * r.d_abs;
                double A = 0;
                for (std::size_t j = 0; j < sk; ++j) {
                    g[j] = std::fabs(dp[j] - D) + margin * (dp_abs[j] + r.d_abs);
                    if (attendable(j)) A += weights(b, h, i, j) * g[j];
                }
                const double E = u * ((Dk + 5) * r.logit_magnitude + std::fabs(lse(b, h, i)) + 2) + sigma +
                                 stored_logit_roundings(options) * u_intermediates * r.logit_magnitude;  // (B2s)
                const double lambda = u * (Sk + 3 + std::fabs(lse(b, h, i)) + 2 * r.logit_magnitude);
                const double beta = 2 * u + u_weights;
                const double psi = (Sk + 2 * Dv + 4) * u * r.d_abs + u_storage * abs_d;
                for (std::size_t j = 0; j < sk; ++j) {
                    if (!attendable(j)) {
                        C[j] = T[j] = dS[j] = w[j] = eta[j] = 0;
                        continue;
                    }
                    const double p = weights(b, h, i, j);
                    // (B14): dS's underflow (uncentred: it need not keep the row sum) and the scaling's η_a
                    eta[j] = uf.eta_ds + uf.eta_p * (dp_abs[j] + r.d_abs + r.dp_sum) + uf.eta_a;
                    C[j] = p * ((2 * E + lambda) * g[j] + 2 * E * A + z[j] + z_bar);
                    T[j] = p * ((beta + 3 * u + u_storage + u_intermediates) * g[j] + lambda * abs_d + beta * r.d_abs + psi);  // (B4s): scaled dS
                    dS[j] = p * g[j];
                    w[j] = C[j] + us_final * dS[j];
                }
                for (std::size_t c = 0; c < dk; ++c) {
                    // m_c: the weighted median of k_jc (weights w_j) minimises Σ_j w_j |k_jc − m_c|.
                    kw.clear();
                    double total = 0;
                    for (std::size_t j = 0; j < sk; ++j)
                        if (w[j] > 0) kw.emplace_back(k(b, hk, j, c), w[j]), total += w[j];
                    std::sort(kw.begin(), kw.end());
                    double m = 0, acc = 0;
                    for (const auto& [kv, wt] : kw)
                        if ((acc += wt) >= total / 2) {
                            m = kv;
                            break;
                        }
                    double bound = 0;
                    for (std::size_t j = 0; j < sk; ++j) {
                        if (!(dS[j] > 0 || C[j] > 0 || T[j] > 0 || eta[j] > 0)) continue;
                        const double kk = k(b, hk, j, c);
                        bound += w[j] * std::fabs(kk - m) + (T[j] + (Sk + 4) * u * dS[j] + eta[j]) * std::fabs(kk);
                        if (errors) bound += dS[j] * ek(b, hk, j, c);
                    }
                    // (B14): the Sk products' and the scale's η_a, and the stored result's η_out
                    out(b, h, i, c) = s * bound + (Sk + 2) * uf.eta_a * uf.scale_factor + uf.eta_out;
                }
            }
    return out;
}
}  // namespace detail

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
                                                             double u_storage = 0, double u_weights = 0,
                                                             std::optional<backward_algorithm> declared = std::nullopt,
                                                             double u_intermediates = 0, bool final_storage_by_value = false,
                                                             bool exact_weights = false) {
    const attention_dims d = logit_stage::attention_dims_of(q, k, v);
    require_extent("grad_output axis 3 (head dim dv)", grad_output.extents[3], d.head_dim_v);
    require_extent("weights axis 3 (key length)", weights.extents[3], d.key_length);
    const std::size_t group = d.heads / d.kv_heads;
    const double s = detail::bound_logit_scale(options, d.head_dim_qk);
    const double gamma = detail::bound_terms(d) * u;
    const double dk = static_cast<double>(d.head_dim_qk);
    sdpa_gradient_bounds b{tensor<double, 4>({d.batch, d.heads, d.query_length, d.head_dim_qk}, 0.0),
                           tensor<double, 4>({d.batch, d.kv_heads, d.key_length, d.head_dim_qk}, 0.0),
                           tensor<double, 4>({d.batch, d.kv_heads, d.key_length, d.head_dim_v}, 0.0),
                           tensor<double, 4>({d.batch, d.heads, d.query_length, 1}, 0.0)};
    // exact_weights: the backward is given `weights` exactly (B17): no (B2) error of P (e_P = 0), and
    // its rows need not sum to 1, so (B5) and not (B5t).
    const bool centred = !exact_weights && detail::textbook_bound_applies(declared, options);  // (B5t) gives dQ below
    // (B7)'s final rounding u_s·|g| of dQ, dK, dV left to the caller, who bounds it by the value
    // (final_storage_by_value: (B15v), (B16), a declared policy's check).
    const double us_final = final_storage_by_value ? 0.0 : u_storage;
    const detail::underflow_terms uf = detail::underflow_of(u, u_storage, u_weights, d, s);
    // One task per (batch, kv head) group: its heads and rows in order, so every element of dK and
    // dV sums its terms in the order of a loop over (batch, head, row), whatever the thread count.
    // Within a group, rows in blocks and keys in tiles that the block's rows go through in turn (the
    // tile's dK, dV rows stay in cache): every element still sums its terms in the plain loops' order
    // (dQ and the row sums over keys ascending, dK and dV over (head, row) ascending), so the same values.
    auto group_task = [&](std::size_t task) {
        const std::size_t bb = task / d.kv_heads, hk = task % d.kv_heads, sq = d.query_length, sk = d.key_length, nrows = group * sq;
        struct row_terms {
            detail::gradient_row r;
            double e_p = 0, rho = 0, rho_stored = 0;
            std::size_t h = 0, i = 0;
        };
        std::vector<row_terms> rt(detail::bound_row_block);
        std::vector<std::vector<double>> dp_abs(detail::bound_row_block, std::vector<double>(sk));
        for (std::size_t r0 = 0; r0 < nrows; r0 += detail::bound_row_block) {
            const std::size_t nr = std::min(detail::bound_row_block, nrows - r0);
            for (std::size_t a = 0; a < nr; ++a) {
                row_terms& t = rt[a];
                t.h = hk * group + (r0 + a) / sq, t.i = (r0 + a) % sq;
                t.r = detail::gradient_row_terms(q, k, v, grad_output, weights, lse, options, d, bb, t.h, t.i, s, u, u_weights, dp_abs[a],
                                                 u_intermediates);
                t.e_p = exact_weights ? 0.0 : t.r.e_p;
                const double e_cap = options.softcap ? u * (4 + 2 * (dk + 3) * t.r.logit_magnitude / std::fabs(*options.softcap)) : 0;
                t.rho = 4 * gamma + 2 * t.e_p + e_cap + 3 * u + detail::stored_ds_roundings(options) * u_intermediates;  // (B5), (B4s)
                t.rho_stored = t.rho + us_final;                                                                       // (B7)
            }
            for (std::size_t j0 = 0; j0 < sk; j0 += detail::bound_key_tile)
                for (std::size_t a = 0; a < nr; ++a) {
                    const row_terms& t = rt[a];
                    const std::size_t h = t.h, i = t.i, j1 = std::min(sk, j0 + detail::bound_key_tile);
                    if (t.r.empty) {  // only the uniform policy's dV_j += dO_i/Sk
                        for (std::size_t j = j0; j < j1; ++j)
                            for (std::size_t x = 0; x < d.head_dim_v; ++x)
                                b.grad_value(bb, hk, j, x) += (gamma + us_final) * std::fabs(weights(bb, h, i, j)) * std::fabs(grad_output(bb, h, i, x));
                        continue;
                    }
                    const double d_abs = t.r.d_abs, e_p = t.e_p, rho = t.rho, rho_stored = t.rho_stored;
                    for (std::size_t j = j0; j < j1; ++j) {
                        if (structurally_masked(options.mask, bb, h, i, j, d.query_length, d.key_length)) continue;
                        const double p = weights(bb, h, i, j);
                        const double m = p * (dp_abs[a][j] + d_abs);  // M_ij (B4)
                        // (B14): dS_ij's underflow, and the η_a of scaling it
                        const double eta_ds = uf.eta_ds + uf.eta_p * (dp_abs[a][j] + d_abs + t.r.dp_sum);
                        b.logits_row_sum(bb, h, i, 0) += rho * m + eta_ds;
                        const double to_qk = s * (rho_stored * m + eta_ds + uf.eta_a);
                        // Row by row (distinct tensors, contiguous rows): each element's update as before.
                        if (!centred) detail::add_scaled_abs(&b.grad_query(bb, h, i, 0), &k(bb, hk, j, 0), to_qk, d.head_dim_qk);
                        detail::add_scaled_abs(&b.grad_key(bb, hk, j, 0), &q(bb, h, i, 0), to_qk, d.head_dim_qk);
                        const double to_v = (gamma + e_p + us_final) * p + uf.eta_p;
                        detail::add_scaled_abs(&b.grad_value(bb, hk, j, 0), &grad_output(bb, h, i, 0), to_v, d.head_dim_v);
                    }
                }
        }
    };
    ::attnref::parallel_for_dynamic(d.batch * d.kv_heads, options.threads, group_task);
    // (B14): each element's sum of products (η_a per product, before or after the scale) and its storage
    {
        const double sk = static_cast<double>(d.key_length), rows = static_cast<double>(group * d.query_length);
        if (!centred)
            for (double& x : b.grad_query.storage()) x += (sk + 2) * uf.eta_a * uf.scale_factor + uf.eta_out;
        for (double& x : b.grad_key.storage()) x += (rows + 2) * uf.eta_a * uf.scale_factor + uf.eta_out;
        for (double& x : b.grad_value.storage()) x += (rows + 1) * uf.eta_a + uf.eta_out;
    }
    if (centred)  // (B5t)
        b.grad_query = detail::textbook_grad_query_bounds(q, k, v, grad_output, {}, {}, {}, {}, weights, lse, options, u, u_storage, u_weights,
                                                          u_intermediates, final_storage_by_value);
    constexpr double inflation = 1 + 0x1p-20;  // second-order terms and the bound's own rounding
    for (tensor<double, 4>* t : {&b.grad_query, &b.grad_key, &b.grad_value, &b.logits_row_sum})
        for (double& x : t->storage()) x *= inflation;
    return b;
}

namespace detail {
/// (B9)–(B11): the SDPA gradient bound at exact inputs (q, k, v, dO) plus the first-order effect of
/// errors a_q, a_k, a_v, a_do already in those inputs; also the magnitudes of the head gradients and
/// the error and magnitude of the head outputs (for dW_o).
struct perturbed_head_bounds {
    tensor<double, 4> a_dq, a_dk, a_dv, m_dq, m_dk, m_dv, a_o, m_o;
};
inline perturbed_head_bounds perturbed_sdpa_bounds(tensor_view<const double, 4> q_value, tensor_view<const double, 4> k_value,
                                                   tensor_view<const double, 4> v_value, tensor_view<const double, 4> do_value,
                                                   tensor_view<const double, 4> q_error, tensor_view<const double, 4> k_error,
                                                   tensor_view<const double, 4> v_error, tensor_view<const double, 4> do_error,
                                                   tensor_view<const double, 4> weights, tensor_view<const double, 3> lse,
                                                   const attention_options& ao, double u, double us, double u_weights,
                                                   std::optional<backward_algorithm> declared, double u_intermediates = 0,
                                                   bool final_storage_by_value = false) {
    struct view_pair {
        tensor_view<const double, 4> value, error;
    };
    const view_pair Q{q_value, q_error}, K{k_value, k_error}, V{v_value, v_error}, dO{do_value, do_error};
    const std::size_t dk = q_value.extents[3], dv = v_value.extents[3];
    // (B10) the SDPA bound at the exact head inputs; (B9) the perturbation by the inputs' errors.
    const sdpa_gradient_bounds sb = sdpa_gradient_first_order_bounds(Q.value, K.value, V.value, dO.value,
                                                                      weights, lse, ao, u, us, u_weights, std::nullopt, u_intermediates,
                                                                      final_storage_by_value);
    const attention_dims d = logit_stage::attention_dims_of(Q.value, K.value, V.value);
    const std::size_t group = d.heads / d.kv_heads, sq = d.query_length, sk = d.key_length;
    const double s = detail::bound_logit_scale(ao, dk), gamma = detail::bound_terms(d) * u;
    tensor<double, 4> a_dq = sb.grad_query, a_dk = sb.grad_key, a_dv = sb.grad_value;  // (B10) errors of the head gradients
    tensor<double, 4> m_dq(a_dq.extents(), 0.0), m_dk(a_dk.extents(), 0.0), m_dv(a_dv.extents(), 0.0);  // their magnitudes
    tensor<double, 4> a_o({d.batch, d.heads, sq, dv}, 0.0), m_o({d.batch, d.heads, sq, dv}, 0.0);        // (B11)
    const underflow_terms uf = underflow_of(u, us, u_weights, d, s);
    // (B14): a head output's Sk products and its storage
    for (double& x : a_o.storage()) x += (static_cast<double>(sk) + 1) * uf.eta_a + uf.eta_out;
    // One task per (batch, kv head) group, as in sdpa_gradient_first_order_bounds: the same order of
    // accumulation for every element whatever the thread count.
    auto group_task = [&](std::size_t task) {
        const std::size_t b = task / d.kv_heads, hk = task % d.kv_heads;
        // Rows in blocks, keys in tiles, as in sdpa_gradient_first_order_bounds: the same order of every
        // element's terms (the query side over keys ascending, the key side over (head, row) ascending).
        struct row_terms {
            detail::gradient_row r;
            double delta = 0, pi_sum = 0;
            std::size_t h = 0, i = 0;
        };
        std::vector<row_terms> rt(bound_row_block);
        std::vector<std::vector<double>> dp_abs(bound_row_block, std::vector<double>(sk)), pi(bound_row_block, std::vector<double>(sk));
        std::vector<double> sigma(sk);
        for (std::size_t r0 = 0; r0 < group * sq; r0 += bound_row_block) {
            const std::size_t nr = std::min(bound_row_block, group * sq - r0);
            for (std::size_t a = 0; a < nr; ++a) {
                row_terms& t = rt[a];
                const std::size_t h = hk * group + (r0 + a) / sq, i = (r0 + a) % sq;
                t.h = h, t.i = i;
                t.r = detail::gradient_row_terms(Q.value, K.value, V.value, dO.value, weights, lse, ao, d, b, h, i, s, u, u_weights, dp_abs[a],
                                                 u_intermediates);
                double delta = 0, pi_sum = 0;
                // Σ_c (e_q,c |k_jc| + |q_c| e_k,jc) and Σ_c (e_dO,c |v_jc| + |dO_c| e_v,jc) for every key (contiguous rows).
                const double *qv = &Q.value(b, h, i, 0), *qe = &Q.error(b, h, i, 0), *kv = &K.value(b, hk, 0, 0), *ke = &K.error(b, hk, 0, 0);
                const double *ov = &dO.value(b, h, i, 0), *oe = &dO.error(b, h, i, 0), *vv = &V.value(b, hk, 0, 0), *ve = &V.error(b, hk, 0, 0);
                row_sums4(sk, dk, sigma.data(), [=](std::size_t c, std::size_t j) { return qe[c] * std::fabs(kv[j * dk + c]) + std::fabs(qv[c]) * ke[j * dk + c]; });
                row_sums4(sk, dv, pi[a].data(), [=](std::size_t c, std::size_t j) { return oe[c] * std::fabs(vv[j * dv + c]) + std::fabs(ov[c]) * ve[j * dv + c]; });
                for (std::size_t j = 0; j < sk; ++j) {
                    sigma[j] = s * sigma[j];
                    if (t.r.empty || structurally_masked(ao.mask, b, h, i, j, sq, sk)) continue;
                    delta = std::max(delta, sigma[j]);
                    pi_sum += weights(b, h, i, j) * pi[a][j];
                }
                t.delta = delta, t.pi_sum = pi_sum;
            }
            for (std::size_t j0 = 0; j0 < sk; j0 += bound_key_tile)
                for (std::size_t a = 0; a < nr; ++a) {
                    const std::size_t h = rt[a].h, i = rt[a].i, j1 = std::min(sk, j0 + bound_key_tile);
                    const detail::gradient_row& r = rt[a].r;
                    const double delta = rt[a].delta, pi_sum = rt[a].pi_sum;
                    for (std::size_t j = j0; j < j1; ++j) {
                        // Empty rows (uniform policy): dV_j += P_ij dO_i and O_i = Σ_j P_ij V_j, constant in q and k.
                        const bool masked = r.empty || structurally_masked(ao.mask, b, h, i, j, sq, sk);
                        const double pw = std::fabs(weights(b, h, i, j));
                        if (!(pw > 0)) continue;  // masked keys; NaN weights (nan policy) are not bounded
                        const double dl = masked ? 0 : delta;
                        // dV_j, its magnitude, O_i's error and magnitude (rows of distinct tensors), per element:
                        //   a_dv += pw(2·dl·|dO| + e_dO);  m_dv += pw|dO|;  a_o += pw(f|v| + e_v) + η_p|v|;  m_o += pw|v|.
                        perturbed_value_rows(&a_dv(b, hk, j, 0), &m_dv(b, hk, j, 0), &a_o(b, h, i, 0), &m_o(b, h, i, 0), &V.value(b, hk, j, 0),
                                             &V.error(b, hk, j, 0), &dO.value(b, h, i, 0), &dO.error(b, h, i, 0), pw, dl,
                                             r.e_p + 2 * dl + gamma + us, uf.eta_p, dv);
                        if (masked) continue;
                        const double m = pw * (dp_abs[a][j] + r.d_abs);  // M_ij (B4)
                        double nn = 4 * delta * m + pw * (pi[a][j] + pi_sum);
                        if (ao.softcap) nn += delta * m / std::fabs(*ao.softcap);
                        // dQ_i, dK_j and their magnitudes, per element: a_dq += s(nn|k| + m·e_k); a_dk += s(nn|q| + m·e_q);
                        // m_dq += s·m·|k|; m_dk += s·m·|q|.
                        perturbed_qk_rows(&a_dq(b, h, i, 0), &a_dk(b, hk, j, 0), &m_dq(b, h, i, 0), &m_dk(b, hk, j, 0), &K.value(b, hk, j, 0),
                                          &K.error(b, hk, j, 0), &Q.value(b, h, i, 0), &Q.error(b, h, i, 0), s, nn, m, dk);
                    }
                }
        }
    };
    ::attnref::parallel_for_dynamic(d.batch * d.kv_heads, ao.threads, group_task);
    if (textbook_bound_applies(declared, ao))  // (B5t) with the inputs' errors, in place of (B10)'s dQ
        a_dq = textbook_grad_query_bounds(Q.value, K.value, V.value, dO.value, Q.error, K.error, V.error, dO.error, weights, lse, ao, u, us,
                                          u_weights, u_intermediates, final_storage_by_value);
    return {std::move(a_dq), std::move(a_dk), std::move(a_dv), std::move(m_dq), std::move(m_dk), std::move(m_dv), std::move(a_o),
            std::move(m_o)};
}
}  // namespace detail

/// The bound (B1)–(B7) for a backward that first rounds q, k, v and grad_output to a format with unit
/// roundoff u_inputs (a candidate computing in a narrower format than the inputs): the rounding is an
/// input error a = u_inputs·|x|, carried through (B9). The row sums of dS stay those of (B6) (exactly
/// 0 for the rounded inputs too).
inline sdpa_gradient_bounds sdpa_gradient_first_order_bounds_rounded_inputs(
    tensor_view<const double, 4> q, tensor_view<const double, 4> k, tensor_view<const double, 4> v, tensor_view<const double, 4> grad_output,
    tensor_view<const double, 4> weights, tensor_view<const double, 3> lse, const attention_options& options, double u, double u_storage,
    double u_weights, double u_inputs, std::optional<backward_algorithm> declared = std::nullopt, double u_intermediates = 0) {
    if (!(u_inputs > 0))
        return sdpa_gradient_first_order_bounds(q, k, v, grad_output, weights, lse, options, u, u_storage, u_weights, declared, u_intermediates);
    const double eta_in = error_bounds::underflow_eta(u_inputs);  // (B14): a nonzero input rounded into the subnormal range
    auto error = [&](tensor_view<const double, 4> x) {
        tensor<double, 4> e(x.extents, 0.0);
        for (std::size_t n = 0; n < e.size(); ++n) e[n] = u_inputs * std::fabs(x[n]) + (x[n] != 0 ? eta_in : 0.0);
        return e;
    };
    const tensor<double, 4> eq = error(q), ek = error(k), ev = error(v), eg = error(grad_output);
    detail::perturbed_head_bounds hb = detail::perturbed_sdpa_bounds(q, k, v, grad_output, eq.view(), ek.view(), ev.view(), eg.view(),
                                                                     weights, lse, options, u, u_storage, u_weights, declared, u_intermediates);
    sdpa_gradient_bounds b =
        sdpa_gradient_first_order_bounds(q, k, v, grad_output, weights, lse, options, u, u_storage, u_weights, std::nullopt, u_intermediates);
    constexpr double inflation = 1 + 0x1p-20;
    for (tensor<double, 4>* t : {&hb.a_dq, &hb.a_dk, &hb.a_dv})
        for (double& x : t->storage()) x *= inflation;
    b.grad_query = std::move(hb.a_dq);
    b.grad_key = std::move(hb.a_dk);
    b.grad_value = std::move(hb.a_dv);
    return b;
}

}  // namespace attnref
