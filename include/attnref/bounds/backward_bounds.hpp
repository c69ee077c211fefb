#pragma once
/// \file bounds/backward_bounds.hpp
/// Owns the first-order data-aware error bounds of SDPA gradients (dQ, dK, dV and the row sums of dS)
/// and of multi-head attention gradients (dX_q, dX_k, dX_v, dW_q/k/v/o, db_q/k/v/o) computed in a
/// floating-point format with unit roundoff u, as a function of the exact-enough forward quantities
/// (inputs, weights P, lse). The checker uses it to judge a candidate's gradients
/// and the tests use it to judge attnref's own; the derivation is below and in docs/backward.md.
///
/// Derivation (first order in u; n = max(dk, dv, Sk, Sq·H/Hkv) + 10, γ = n·u; every sum of m terms
/// carries ≤ (m + 1)u relative error on the sum of the magnitudes — Higham, Accuracy and Stability of
/// Numerical Algorithms, 2nd ed., §3.1):
///  (B1) logits: |ΔS_ij| ≤ (dk + 3)u·L_i, L_i = max_j of s·Σ_c|q_ic k_jc| + |ALiBi| + |additive| + 1e9·seed,
///       over the attendable keys except those the seed mask pushes down by 1e9 (seed 1, the rest of
///       the logit ≤ 1e9/8, (dk + 3)u·(its magnitude) ≤ 1e9/8) when the row has a key without seed
///       whose logit magnitude is ≤ 1e9/8: those logits stay ≥ 1e9/2 below the row's maximum, so
///       their weights are 0 in every format and they add exactly 0 to every sum;
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
///       (B5), i.e. ρ_i → ρ_i + u_storage for dQ and dK and γ + e_P → γ + e_P + u_storage for dV;
///       weights P stored in a narrower format (u_weights: a bf16 P before dV = Pᵀ·dO, as
///       FlashAttention casts it) add u_weights to e_P.
/// Rows the mask leaves empty contribute only the uniform policy's dV_j += dO_i/Sk (γ·P_ij|dO_ic|).
/// Second-order terms (products of two u's) are dropped: the bound is first order, as are the
/// forward's data-aware bounds (tolerance.hpp), and callers that turn it into a verdict say so. It is
/// evaluated in double, rounding upward in effect by a final factor 1 + 2^-20 (each bound is a sum of
/// at most a few times n·(dk + dv) nonnegative products, whose relative rounding error is far below it).
///
/// The bound holds for every summation order of the sums (the analysis uses the order-free (m + 1)u
/// form), for both backward algorithms (textbook and FlashAttention's), and for any scale placement.
///
/// Multi-head attention (y = x·W + b; Q, K, V projected, split into heads, SDPA, merged, W_o), first
/// order, u_s = u_storage (every materialised intermediate — projections, head outputs, head
/// gradients — is rounded to the storage format), R = B·Sq (or B·Sk) rows, s the logit scale:
///  (B8)  projections: |ΔQ_ic| ≤ a^Q_ic = ((E + 2)u + u_s)·Q̃_ic, Q̃_ic = Σ_m|x_im W_mc| + |b_c| (a sum of
///        E + 1 terms); K, V alike; dO = dOut·W_oᵀ (the upstream gradient of each head, split):
///        a^dO_ic = ((Eo + 1)u + u_s)·Σ_n|dOut_in W_o,cn|;
///  (B9)  the perturbed SDPA inputs move the head gradients by (first order, exact arithmetic):
///        logits |ΔS_ij| ≤ σ_ij = s Σ_c(a^Q_ic|K_jc| + |Q_ic|a^K_jc) ≤ δ_i = max_j σ_ij (soft-capping
///        has slope ≤ 1); P: |ΔP_ij| ≤ 2δ_i P_ij (ΔP_ij = P_ij(ΔS_ij − Σ_l P_il ΔS_il));
///        dP: |ΔdP_ij| ≤ π_ij = Σ_c(a^dO_ic|V_jc| + |dO_ic|a^V_jc); D: |ΔD_i| ≤ 2δ_i D̄_i + Π_i,
///        Π_i = Σ_j P_ij π_ij; dS: |ΔdS_ij| ≤ N_ij = 4δ_i M_ij + P_ij(π_ij + Π_i) (+ δ_i M_ij/cap with
///        soft-capping: |d(1 − t²)/draw| ≤ 0.77/cap);
///        ΔdQ_ic ≤ s Σ_j(N_ij|K_jc| + M_ij a^K_jc); ΔdK_jc ≤ s Σ_{h,i}(N_ij|Q_ic| + M_ij a^Q_ic);
///        ΔdV_jc ≤ Σ_{h,i} P_ij(2δ_i|dO_ic| + a^dO_ic);
///  (B10) head gradients: a^dQ = (B5)+(B7) at (Q, K, V, dO) with (u, u_s) plus (B9); dK, dV alike;
///        their magnitudes |dQ|~_ic = s Σ_j M_ij|K_jc|, |dK|~_jc = s Σ_{h,i} M_ij|Q_ic|,
///        |dV|~_jc = Σ_{h,i} P_ij|dO_ic| bound |dQ|, |dK|, |dV|;
///  (B11) head outputs (for dW_o): |ΔO_ic| ≤ a^O_ic = Σ_j P_ij((e_P + 2δ_i + γ + u_s)|V_jc| + a^V_jc),
///        e_P from (B2), γ = n·u as above; |O|~_ic = Σ_j P_ij|V_jc|;
///  (B12) dW_o = mergedᵀ·dOut, db_o = Σ_r dOut: |ΔdW_o,mn| ≤ Σ_r(a^O_rm + ((R + 1)u + u_s)|O|~_rm)|dOut_rn|,
///        |Δdb_o,n| ≤ ((R + 1)u + u_s)Σ_r|dOut_rn|;
///  (B13) dX = dH·Wᵀ, dW = xᵀ·dH, db = Σ_r dH for H = Q (n = H·dk terms), K, V:
///        |ΔdX_rm| ≤ Σ_c(a^dH_rc + ((n + 1)u + u_s)|dH|~_rc)|W_mc|,
///        |ΔdW_mc| ≤ Σ_r |x_rm|(a^dH_rc + ((R + 1)u + u_s)|dH|~_rc), |Δdb_c| ≤ Σ_r(a^dH_rc + ((R + 1)u + u_s)|dH|~_rc).
/// Evaluated in double with the same final factor 1 + 2^-20.
///  (B15) a declared policy storing Q, K, V and the heads' dO in a format narrower than its accumulation
///        (predicted_storage): each stored value is round(y) of a sum within ε of y, hence predicted
///        exactly (one ulp of residual error where round(y − ε) ≠ round(y + ε)); the bound is (B9)–(B13)
///        at the predicted heads plus |g(predicted heads) − g(exact heads)|, both in double, plus their
///        double rounding (docs/backward.md (B15)). (B15v): the results' (and the heads' dK, dV) final
///        storage bounded by their value, u_s(|g(predicted)| + the rest of the bound), not u_s times magnitude sums.
///  (B16) a declared policy rounding SDPA's q, k, v, dO to nearest even in its storage format: the rounded
///        inputs are predicted; bound at them (final storage by value) + the exact shift of the gradients.
///  (B17) a declared textbook policy storing P in a narrower format than its arithmetic (gradients in
///        the arithmetic's): the stored weights round(P̃) are predicted (P̃ within (B2)'s error of P); bound
///        at those exact weights (e_P = 0, uncentred) + the exact shift they cause + a residual where the
///        prediction straddles a rounding boundary (docs/backward.md (B17)).
///
/// (B5t) dQ of a declared textbook backward (dS from the forward's own normalised weights P, D = Σ_j P dP
/// or dO·O). Σ_j dS_ij = 0 exactly, and every perturbation that acts through the exact dS function —
/// the logits' errors, the exp's rounding (exp(x)(1 + α) = exp(x + log(1 + α))), a common factor of the
/// row's weights, the errors of dP — moves dS by a row of sum 0, which leaves dQ_ic = s Σ_j dS_ij k_jc
/// unchanged when k_jc is replaced by k_jc − m_c for any centre m_c. Only what breaks the row sum —
/// the per-weight rounding after normalisation, D's own rounding, the products of dS — multiplies |k_jc|:
///   E_i = u((dk + 5)L_i + |lse_i| + 2) + σ_i   (logit, exp-argument and exp errors; σ_i the inputs', (B9)),
///   λ_i = u(Sk + 3 + |lse_i| + 2L_i)           (the row's common normalisation error, Σ_j P̂_ij ≠ 1: the sum's
///                                               rounding, exp(S − lse)'s lse, an online softmax's rescalings),
///   β = 2u + u_weights                         (each weight's rounding after normalisation),
///   ψ_i = (Sk + 2dv + 4)u·D̄_i + u_s|D_i|       (D = Σ_j P̂ dP̂ or dO·Ô: its rounding, and its storage),
///   g_ij = |dP_ij − D_i|, A_i = Σ_j P_ij g_ij, Z_ij = (γ + u_s)|dP|_ij + π_ij (dP's rounding and storage,
///   the inputs' errors π, (B9)), Z̄_i = Σ_j P_ij Z_ij,
///   C_ij = P_ij((2E_i + λ_i)g_ij + 2E_i A_i + Z_ij + Z̄_i)   (the zero-sum part: |ΔP_ij| ≤ 2E_i P_ij),
///   T_ij = P_ij((β + 3u + u_s)g_ij + λ_i|D_i| + βD̄_i + ψ_i) (the rest; u_s: dS stored),
///   |ΔdQ_ic| ≤ s[Σ_j (C_ij + u_s P_ij g_ij)|k_jc − m_c| + Σ_j (T_ij + (Sk + 4)u P_ij g_ij)|k_jc| + Σ_j P_ij g_ij a^k_jc],
/// the (Sk + 4)u for the sum over keys and the scale's roundings, u_s·|dQ| ≤ u_s·s Σ_j |dS_ij||k_jc − m_c|
/// for the storage. m_c is the weighted median of the k_jc with weights C_ij + u_s P_ij g_ij, which
/// minimises the first sum. The identity needs the backward's P to be the forward's normalised P:
/// FlashAttention's P = exp(S − lse) recomputed from logits rounded otherwise than the forward's does
/// not sum to 1 to within the logit errors, so a flash or unknown backward keeps (B5). Not with
/// soft-capping (1 − t² breaks the row sum); not used for dK (its sum is over queries).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include "attnref/core/attention.hpp"
#include "attnref/core/backward.hpp"
#include "attnref/core/binary_format.hpp"
#include "attnref/bounds/error_bounds.hpp"
#include "attnref/core/mask.hpp"
#include "attnref/core/multi_head_attention.hpp"
#include "attnref/core/tensor.hpp"

namespace attnref {

/// Per-element bounds on |ĝ − g|, shaped like the gradients; logits_row_sum is (B, H, Sq, 1).
struct sdpa_gradient_bounds {
    tensor<double, 4> grad_query, grad_key, grad_value, logits_row_sum;
};

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

/// Per-element bounds on |ĝ − g| of multi-head attention gradients, shaped like mha_gradients.
struct mha_gradient_bounds {
    tensor<double, 3> grad_x_q, grad_x_k, grad_x_v;
    tensor<double, 2> grad_w_q, grad_w_k, grad_w_v, grad_w_o;
    tensor<double, 1> grad_b_q, grad_b_k, grad_b_v, grad_b_o;
};

namespace detail {
/// Multi-head attention's gradients in double from given head inputs (B, H, S, d) Q, K, V and head
/// upstream gradients dO (as mha_gradient_bounds' tensors): SDPA forward (for dW_o) and textbook
/// backward per head, then the projections' backward, y = x·W + b, every sum in double.
inline mha_gradient_bounds mha_gradients_in_double(tensor_view<const double, 3> x_q, tensor_view<const double, 3> x_k,
                                                   tensor_view<const double, 3> x_v, const mha_parameters<double>& p, const mha_options& o,
                                                   tensor_view<const double, 3> grad_output, const tensor<double, 4>& qh,
                                                   const tensor<double, 4>& kh, const tensor<double, 4>& vh, const tensor<double, 4>& doh) {
    using D = uniform_precision<double>;
    const attention_result<D> f = scaled_dot_product_attention<D, double, double, double>(qh.view(), kh.view(), vh.view(), o.attention);
    const attention_gradients<D> g =
        scaled_dot_product_attention_backward<D, double, double, double, double>(qh.view(), kh.view(), vh.view(), doh.view(), o.attention);
    mha_gradient_bounds r;
    auto linear = [](tensor_view<const double, 3> x, tensor_view<const double, 2> w, const tensor<double, 3>& dh, tensor<double, 3>& gx,
                     tensor<double, 2>& gw, tensor<double, 1>& gb) {
        const std::size_t B = x.extents[0], S = x.extents[1], E = x.extents[2], N = w.extents[1];
        gx = tensor<double, 3>({B, S, E}, 0.0);
        gw = tensor<double, 2>({E, N}, 0.0);
        gb = tensor<double, 1>({N}, 0.0);
        for (std::size_t rr = 0; rr < B * S; ++rr)
            for (std::size_t c = 0; c < N; ++c) {
                const double d = dh[rr * N + c];
                gb[c] += d;
                for (std::size_t e = 0; e < E; ++e) {
                    gx[rr * E + e] += d * w(e, c);
                    gw(e, c) += x[rr * E + e] * d;
                }
            }
    };
    linear(x_q, p.w_q, merge_heads<double>(g.grad_query.view()), r.grad_x_q, r.grad_w_q, r.grad_b_q);
    linear(x_k, p.w_k, merge_heads<double>(g.grad_key.view()), r.grad_x_k, r.grad_w_k, r.grad_b_k);
    linear(x_v, p.w_v, merge_heads<double>(g.grad_value.view()), r.grad_x_v, r.grad_w_v, r.grad_b_v);
    const tensor<double, 3> merged = merge_heads<double>(f.output.view());
    const std::size_t R = merged.extents()[0] * merged.extents()[1], Mo = merged.extents()[2], Eo = grad_output.extents[2];
    r.grad_w_o = tensor<double, 2>({Mo, Eo}, 0.0);
    r.grad_b_o = tensor<double, 1>({Eo}, 0.0);
    for (std::size_t rr = 0; rr < R; ++rr)
        for (std::size_t n = 0; n < Eo; ++n) {
            const double gn = grad_output[rr * Eo + n];
            r.grad_b_o[n] += gn;
            for (std::size_t m = 0; m < Mo; ++m) r.grad_w_o(m, n) += merged[rr * Mo + m] * gn;
        }
    return r;
}
}  // namespace detail

/// The first-order bound (B8)–(B13) for multi-head attention gradients computed with unit roundoff
/// `u` and intermediates (projections, head outputs, head gradients) and results stored with
/// `u_storage` (0: the arithmetic's own format). x_q, x_k, x_v, the parameters and grad_output
/// (B, Sq, Eo) exact; weights (B, H, Sq, Sk) and lse (B, H, Sq) the exact forward's. Biases absent in
/// `p` count as 0 (their gradients are still bounded: the gradient at b = 0). u_inputs: the inputs
/// (x, W, b, grad_output) are first rounded to a format with that unit roundoff (a candidate computing
/// in a narrower format than the case's inputs): each product of two inputs carries 2·u_inputs more.
inline mha_gradient_bounds mha_gradient_first_order_bounds(tensor_view<const double, 3> x_q, tensor_view<const double, 3> x_k,
                                                           tensor_view<const double, 3> x_v, const mha_parameters<double>& p,
                                                           const mha_options& o, tensor_view<const double, 3> grad_output,
                                                           tensor_view<const double, 4> weights, tensor_view<const double, 3> lse,
                                                           double u, double u_storage = 0, double u_weights = 0,
                                                           double u_inputs = 0,
                                                           std::optional<backward_algorithm> declared = std::nullopt,
                                                           double u_intermediates = 0,
                                                           std::optional<binary_format> predicted_storage = std::nullopt) {
    const mha_dims md = mha_dims_of(x_q, x_k, x_v, p, o);
    require_extent("grad_output axis 0 (batch)", grad_output.extents[0], md.batch);
    require_extent("grad_output axis 1 (query length)", grad_output.extents[1], md.query_length);
    require_extent("grad_output axis 2 (output features)", grad_output.extents[2], md.output_dim);
    require_extent("weights axis 3 (key length)", weights.extents[3], md.key_length);
    const double us = u_storage;
    // (B14): η_a per product, η_in per rounded input, η_mat for a materialised (stored) intermediate.
    const double eta_a = error_bounds::underflow_eta(u), eta_in = error_bounds::underflow_eta(u_inputs),
                 eta_mat = us > 0 ? error_bounds::underflow_eta(us) : eta_a;
    // (B8): a projection y = x·W + b in double (values and magnitudes), split into heads.
    struct projected {
        tensor<double, 4> value, error;  // (B, heads, S, d)
    };
    // Every sum below runs over its terms in ascending order from +0 (the value per element fixed by
    // that order alone); rows (or weight rows) go to the threads in blocks and the lanes of the
    // innermost loops are distinct elements (detail::projection_sums_row), so neither the thread count
    // nor the blocking changes a bit.
    const std::size_t threads = o.attention.threads;
    // y = x·w (+ bias), w (E, N), split into `heads`; `rel` the relative error factor of its sums.
    auto project = [&](tensor_view<const double, 3> x, tensor_view<const double, 2> w, tensor_view<const double, 1> bias,
                       std::size_t heads, double rel) {
        const std::size_t B = x.extents[0], S = x.extents[1], E = x.extents[2], N = w.extents[1], hd = N / heads;
        projected r{tensor<double, 4>({B, heads, S, hd}, 0.0), tensor<double, 4>({B, heads, S, hd}, 0.0)};
        std::vector<double> w_abs(E * N);
        for (std::size_t n = 0; n < E * N; ++n) w_abs[n] = std::fabs(w.data[n]);
        ::attnref::parallel_for_dynamic(B * S, threads, [&](std::size_t row) {
            const std::size_t b = row / S, i = row % S;
            thread_local std::vector<double> v, m, in;
            v.assign(N, 0.0), m.assign(N, 0.0), in.assign(N, 0.0);
            for (std::size_t e = 0; e < E; ++e)
                detail::projection_sums_row(x(b, i, e), w.data + e * N, w_abs.data() + e * N, v.data(), m.data(), in.data(), N);
            for (std::size_t c = 0; c < N; ++c) {
                if (!bias.empty()) v[c] += bias[c], m[c] += std::fabs(bias[c]), in[c] += 1;
                r.value(b, c / hd, i, c % hd) = v[c];
                r.error(b, c / hd, i, c % hd) = rel * m[c] + eta_in * in[c] + (static_cast<double>(E) + 1) * eta_a + eta_mat;  // (B8), (B14)
            }
        });
        return r;
    };
    // (B8): each input projection's sums have E products, the bias and the rounding of the inputs.
    auto rel_of = [&](tensor_view<const double, 3> x) { return (static_cast<double>(x.extents[2]) + 2) * u + us + 2 * u_inputs; };
    projected Q = project(x_q, p.w_q, p.b_q, md.heads, rel_of(x_q)), K = project(x_k, p.w_k, p.b_k, md.kv_heads, rel_of(x_k)),
              V = project(x_v, p.w_v, p.b_v, md.kv_heads, rel_of(x_v));
    // dO = dOut·W_oᵀ split into heads, and its error (B14): Eo products, no bias.
    const std::size_t Eo = md.output_dim, dv = md.head_dim_v, Mo = md.heads * dv;
    tensor<double, 2> wo_t({Eo, Mo}, 0.0);
    for (std::size_t m = 0; m < Mo; ++m)
        for (std::size_t n = 0; n < Eo; ++n) wo_t(n, m) = p.w_o(m, n);
    projected dO = project(grad_output, wo_t.view(), {}, md.heads, (static_cast<double>(Eo) + 1) * u + us + 2 * u_inputs);
    const attention_options& ao = o.attention;
    // (B15) a declared policy that stores the projections and dO in a known format (round to nearest
    // even, as linear_into does): the stored values are predicted, not bounded; the bound is taken at
    // the predicted head inputs and the exact shift they cause is added at the end.
    const bool predict = predicted_storage.has_value() && us > 0 && !(u_inputs > 0);
    const tensor_view<const double, 4> weights_exact = weights;
    const tensor_view<const double, 3> lse_exact = lse;
    tensor<double, 4> w_hat;
    tensor<double, 3> lse_hat;
    std::optional<projected> exact_q, exact_k, exact_v, exact_do;
    if (predict) {
        auto predict_heads = [&](projected& y, std::size_t terms_plus_one, const std::vector<double>& magnitude) {
            // |y_kernel − y| ≤ ε = (n + 1)(u + 2^-52)·Σ|terms| + (n + 1)·η_a (the kernel's sum and ours in double)
            projected out{y.value, tensor<double, 4>(y.value.extents(), 0.0)};
            const double n1 = static_cast<double>(terms_plus_one);
            for (std::size_t e = 0; e < out.value.size(); ++e) {
                const double v = y.value[e], eps = n1 * (u + 0x1p-52) * magnitude[e] + n1 * eta_a;
                const double c = round_to(*predicted_storage, v), lo = round_to(*predicted_storage, v - eps),
                             hi = round_to(*predicted_storage, v + eps);
                out.value[e] = c;
                out.error[e] = std::max(hi - c, c - lo);  // 0 unless y lies within ε of a rounding boundary
            }
            y = std::move(out);
        };
        auto magnitudes = [&](tensor_view<const double, 3> x, tensor_view<const double, 2> w, tensor_view<const double, 1> bias,
                              std::size_t heads) {
            const std::size_t B = x.extents[0], S = x.extents[1], E = x.extents[2], N = w.extents[1], hd = N / heads;
            std::vector<double> m(B * S * N, 0.0);
            for (std::size_t b = 0; b < B; ++b)
                for (std::size_t i = 0; i < S; ++i)
                    for (std::size_t c = 0; c < N; ++c) {
                        double a = bias.empty() ? 0.0 : std::fabs(bias[c]);
                        for (std::size_t e = 0; e < E; ++e) a += std::fabs(x(b, i, e) * w(e, c));
                        m[((b * heads + c / hd) * S + i) * hd + c % hd] = a;
                    }
            return m;
        };
        exact_q = Q, exact_k = K, exact_v = V, exact_do = dO;
        predict_heads(Q, x_q.extents[2] + 2, magnitudes(x_q, p.w_q, p.b_q, md.heads));
        predict_heads(K, x_k.extents[2] + 2, magnitudes(x_k, p.w_k, p.b_k, md.kv_heads));
        predict_heads(V, x_v.extents[2] + 2, magnitudes(x_v, p.w_v, p.b_v, md.kv_heads));
        {
            std::vector<double> m(dO.value.size(), 0.0);
            for (std::size_t b = 0; b < md.batch; ++b)
                for (std::size_t i = 0; i < md.query_length; ++i)
                    for (std::size_t mm = 0; mm < md.heads * dv; ++mm) {
                        double a = 0;
                        for (std::size_t n = 0; n < Eo; ++n) a += std::fabs(grad_output(b, i, n) * p.w_o(mm, n));
                        m[((b * md.heads + mm / dv) * md.query_length + i) * dv + mm % dv] = a;
                    }
            predict_heads(dO, Eo + 1, m);
        }
        // The forward at the predicted heads, in double (its own rounding is second order).
        attention_result<uniform_precision<double>> f =
            scaled_dot_product_attention<uniform_precision<double>, double, double, double>(Q.value.view(), K.value.view(), V.value.view(), ao);
        w_hat = std::move(f.weights);
        lse_hat = std::move(f.lse);
        weights = w_hat.view();
        lse = lse_hat.view();
    }
    detail::perturbed_head_bounds hb = detail::perturbed_sdpa_bounds(Q.value.view(), K.value.view(), V.value.view(), dO.value.view(),
                                                                     Q.error.view(), K.error.view(), V.error.view(), dO.error.view(),
                                                                     weights, lse, ao, u, us, u_weights, declared, u_intermediates, predict);
    if (predict) {
        // (B15v): the heads' gradients' storage by value, u_s(|g(predicted heads)| + the rest), g in
        // double (its own error ≤ 2^-29 of the rest, as below).
        const attention_gradients<uniform_precision<double>> gh =
            scaled_dot_product_attention_backward<uniform_precision<double>, double, double, double, double>(
                Q.value.view(), K.value.view(), V.value.view(), dO.value.view(), ao);
        auto by_value = [&](tensor<double, 4>& a, const tensor<double, 4>& g) {
            for (std::size_t n = 0; n < a.size(); ++n) {
                const double rest = a[n] * (1 + 0x1p-28);
                a[n] = rest + us * (std::fabs(g[n]) + rest);
            }
        };
        by_value(hb.a_dq, gh.grad_query);
        by_value(hb.a_dk, gh.grad_key);
        by_value(hb.a_dv, gh.grad_value);
    }
    tensor<double, 4>&a_dq = hb.a_dq, &a_dk = hb.a_dk, &a_dv = hb.a_dv, &m_dq = hb.m_dq, &m_dk = hb.m_dk, &m_dv = hb.m_dv, &a_o = hb.a_o,
                     &m_o = hb.m_o;
    // (B12), (B13): the linear backward's sums over the merged (B, S, heads·d) layout.
    const tensor<double, 3> A_dq = merge_heads<double>(a_dq.view()), A_dk = merge_heads<double>(a_dk.view()),
                            A_dv = merge_heads<double>(a_dv.view()), M_dq = merge_heads<double>(m_dq.view()),
                            M_dk = merge_heads<double>(m_dk.view()), M_dv = merge_heads<double>(m_dv.view()),
                            A_o = merge_heads<double>(a_o.view()), M_o = merge_heads<double>(m_o.view());
    mha_gradient_bounds r;
    // The results' own storage rounding, u_s·|g|: bounded by the magnitude sums below, or under (B15)
    // by the value, u_s·(|g(predicted heads)| + the rest of the bound), added at the end (B15v).
    const double us_final = predict ? 0.0 : us;
    auto linear = [&](tensor_view<const double, 3> x, tensor_view<const double, 2> w, const tensor<double, 3>& a, const tensor<double, 3>& m,
                      tensor<double, 3>& gx, tensor<double, 2>& gw, tensor<double, 1>& gb) {
        const std::size_t B = x.extents[0], S = x.extents[1], E = x.extents[2], N = w.extents[1], R = B * S;
        const double rel_x = (static_cast<double>(N) + 1) * u + us_final + u_inputs,
                     rel_r = (static_cast<double>(R) + 1) * u + us_final + u_inputs;
        // (B14): N (or R) products' η_a and the result's storage; the rounded W's (x's) η_in times |dH|.
        gx = tensor<double, 3>({B, S, E}, (static_cast<double>(N) + 1) * eta_a + eta_mat);
        gw = tensor<double, 2>({E, N}, (static_cast<double>(R) + 1) * eta_a + eta_mat);
        gb = tensor<double, 1>({N}, (static_cast<double>(R) + 1) * eta_a + eta_mat);
        // Per (r, c): what reaches dX (to_x) and dW, db (to_w), and the rounded inputs' underflow.
        std::vector<double> to_x(R * N), to_w(R * N), under(R * N), w_abs_t(N * E);
        for (std::size_t n = 0; n < R * N; ++n)
            to_x[n] = a[n] + rel_x * m[n], to_w[n] = a[n] + rel_r * m[n], under[n] = eta_in * m[n];
        for (std::size_t e = 0; e < E; ++e)
            for (std::size_t c = 0; c < N; ++c) w_abs_t[c * E + e] = std::fabs(w(e, c));
        for (std::size_t rr = 0; rr < R; ++rr)
            for (std::size_t c = 0; c < N; ++c) gb[c] += to_w[rr * N + c];
        // dX row r: over c ascending; dW row e: over r ascending.
        ::attnref::parallel_for_dynamic(R, threads, [&](std::size_t rr) {
            for (std::size_t c = 0; c < N; ++c)
                detail::scaled_abs_row(&gx[rr * E], w_abs_t.data() + c * E, to_x[rr * N + c], under[rr * N + c], E);
        });
        ::attnref::parallel_for_dynamic(E, threads, [&](std::size_t e) {
            for (std::size_t rr = 0; rr < R; ++rr)
                detail::scale_row_add(&gw(e, 0), to_w.data() + rr * N, under.data() + rr * N, std::fabs(x[rr * E + e]), N);
        });
    };
    linear(x_q, p.w_q, A_dq, M_dq, r.grad_x_q, r.grad_w_q, r.grad_b_q);
    linear(x_k, p.w_k, A_dk, M_dk, r.grad_x_k, r.grad_w_k, r.grad_b_k);
    linear(x_v, p.w_v, A_dv, M_dv, r.grad_x_v, r.grad_w_v, r.grad_b_v);
    {
        const std::size_t R = md.batch * md.query_length;
        const double rel_r = (static_cast<double>(R) + 1) * u + us_final + u_inputs;
        r.grad_w_o = tensor<double, 2>({Mo, Eo}, (static_cast<double>(R) + 1) * eta_a + eta_mat);  // (B14)
        r.grad_b_o = tensor<double, 1>({Eo}, (static_cast<double>(R) + 1) * eta_a + eta_mat);
        std::vector<double> g_abs(R * Eo);
        for (std::size_t n = 0; n < R * Eo; ++n) g_abs[n] = std::fabs(grad_output[n]);
        for (std::size_t rr = 0; rr < R; ++rr)
            for (std::size_t n = 0; n < Eo; ++n) {
                const double g = g_abs[rr * Eo + n];
                r.grad_b_o[n] += rel_r * g + (g != 0 ? eta_in : 0.0);
            }
        // dW_o row m: over r ascending, (A_o + rel·M_o)·|dOut| + η_in·(M_o + |dOut|) per term.
        ::attnref::parallel_for_dynamic(Mo, threads, [&](std::size_t m) {
            for (std::size_t rr = 0; rr < R; ++rr)
                detail::output_weight_row(&r.grad_w_o(m, 0), g_abs.data() + rr * Eo, A_o[rr * Mo + m] + rel_r * M_o[rr * Mo + m],
                                          M_o[rr * Mo + m], eta_in, Eo);
        });
    }
    constexpr double inflation = 1 + 0x1p-20;  // second-order terms and the bound's own rounding
    for (tensor<double, 3>* t : {&r.grad_x_q, &r.grad_x_k, &r.grad_x_v})
        for (double& x : t->storage()) x *= inflation;
    for (tensor<double, 2>* t : {&r.grad_w_q, &r.grad_w_k, &r.grad_w_v, &r.grad_w_o})
        for (double& x : t->storage()) x *= inflation;
    for (tensor<double, 1>* t : {&r.grad_b_q, &r.grad_b_k, &r.grad_b_v, &r.grad_b_o})
        for (double& x : t->storage()) x *= inflation;
    if (predict) {
        // (B15): |ĝ − g| ≤ bound at the predicted heads (r) + |g(predicted) − g(exact)|, both gradients
        // computed in double: g(exact)'s double error is bounded by this bound at u = 2^-53 without
        // storage, g(predicted)'s by 2^-29 of r (the same first-order form at 2^-53 ≤ 2^-29·u).
        // (B15v): r omits the results' final storage rounding; the kernel's unrounded result y lies
        // within r·(1 + 2^-28) of the double g(predicted), so storing it adds ≤ u_s(|g(predicted)| + r(1 + 2^-28)).
        const mha_gradient_bounds at_hat = detail::mha_gradients_in_double(x_q, x_k, x_v, p, o, grad_output, Q.value, K.value, V.value, dO.value);
        const mha_gradient_bounds at_exact =
            detail::mha_gradients_in_double(x_q, x_k, x_v, p, o, grad_output, exact_q->value, exact_k->value, exact_v->value, exact_do->value);
        const mha_gradient_bounds in_double = mha_gradient_first_order_bounds(x_q, x_k, x_v, p, o, grad_output, weights_exact, lse_exact, 0x1p-53);
        auto add = [&](auto& bound, const auto& a, const auto& e, const auto& d) {
            for (std::size_t n = 0; n < bound.size(); ++n) {
                const double rest = bound[n] * (1 + 0x1p-28);
                bound[n] = (rest + us * (std::fabs(a[n]) + rest)) * inflation + std::fabs(a[n] - e[n]) * inflation + d[n];
            }
        };
        add(r.grad_x_q, at_hat.grad_x_q, at_exact.grad_x_q, in_double.grad_x_q);
        add(r.grad_x_k, at_hat.grad_x_k, at_exact.grad_x_k, in_double.grad_x_k);
        add(r.grad_x_v, at_hat.grad_x_v, at_exact.grad_x_v, in_double.grad_x_v);
        add(r.grad_w_q, at_hat.grad_w_q, at_exact.grad_w_q, in_double.grad_w_q);
        add(r.grad_w_k, at_hat.grad_w_k, at_exact.grad_w_k, in_double.grad_w_k);
        add(r.grad_w_v, at_hat.grad_w_v, at_exact.grad_w_v, in_double.grad_w_v);
        add(r.grad_w_o, at_hat.grad_w_o, at_exact.grad_w_o, in_double.grad_w_o);
        add(r.grad_b_q, at_hat.grad_b_q, at_exact.grad_b_q, in_double.grad_b_q);
        add(r.grad_b_k, at_hat.grad_b_k, at_exact.grad_b_k, in_double.grad_b_k);
        add(r.grad_b_v, at_hat.grad_b_v, at_exact.grad_b_v, in_double.grad_b_v);
        add(r.grad_b_o, at_hat.grad_b_o, at_exact.grad_b_o, in_double.grad_b_o);
    }
    return r;
}

}  // namespace attnref
