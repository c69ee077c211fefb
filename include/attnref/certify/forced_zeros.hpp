#pragma once
/// \file certify/forced_zeros.hpp
/// Gradient elements whose exact value the mathematics fixes, decided from the mask and the input
/// doubles alone (never from a computed value, which no interval can decide for an exact 0 or NaN):
///
///   forced_zero_query_gradients  SDPA dQ_ic = 0 where feature c of the keys is the same over the
///                                row's attendable keys (no soft-capping). Proof: for any scale
///                                placement the exact gradient is dQ_ic = s·Σ_{j∈J} dS_ij k_jc over
///                                the attendable keys J (backward.hpp, docs/backward.md), and
///                                Σ_{j∈J} dS_ij = Σ_j P_ij dP_ij − D_i·Σ_j P_ij = D_i − D_i = 0 with
///                                D_i = Σ_j P_ij dP_ij and Σ_j P_ij = 1 (any mask, ALiBi, additive or
///                                seed offset: they only move the logits). So with k_jc = κ for every
///                                j ∈ J, dQ_ic = s·κ·Σ_j dS_ij = 0 exactly, i.e. the centred sum
///                                s·Σ_j dS_ij (k_jc − κ) has every term 0. Soft-capping multiplies
///                                dS_ij by 1 − tanh², which breaks Σ_j = 0: never flagged there. Rows
///                                with no attendable key are left to their empty-row policy.
///   mha_nan_gradients            under empty_row_policy::nan, the multi-head gradient elements
///                                core/backward.hpp makes NaN by construction (the NaN of an empty
///                                row's output and of its SDPA gradients, carried through every sum
///                                that reads them), so that the certifier accepts exactly those NaN.
///
/// Used by the MPFI ladder (golden/generate.hpp certify_gradients, certify_gradients_groups) and the
/// fast backward (certify/fast/backward.hpp), so every path certifies the same elements.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "attnref/core/attention.hpp"
#include "attnref/core/mask.hpp"
#include "attnref/core/tensor.hpp"

namespace attnref::certify {

/// True when the sk values k[j·ld] agree (as reals: −0 equals +0) over the keys j with allowed[j],
/// and at least one key is allowed. A NaN never agrees.
inline bool constant_over_allowed(const double* k, std::size_t ld, std::size_t sk, const std::uint8_t* allowed) {
    bool seen = false;
    double first = 0;
    for (std::size_t j = 0; j < sk; ++j) {
        if (!allowed[j]) continue;
        const double x = k[j * ld];
        if (!seen) {
            if (x != x) return false;
            first = x, seen = true;
        } else if (!(x == first)) {
            return false;
        }
    }
    return seen;
}

/// Flags in dQ's layout (B, H, Sq, dk), C order: 1 where dQ_ic is exactly 0 because feature c of
/// the keys is constant over row (b, h, i)'s attendable keys (see the file comment). q gives B, H,
/// Sq; k (B, Hkv, Sk, dk) the keys of kv head h / (H / Hkv). Empty (no flags) under soft-capping.
inline std::vector<std::uint8_t> forced_zero_query_gradients(const attention_options& o, const extents_t<4>& q,
                                                             tensor_view<const double, 4> k) {
    const std::size_t B = q[0], H = q[1], Sq = q[2], dk = q[3], Hkv = k.extents[1], Sk = k.extents[2];
    if (o.softcap || Hkv == 0 || H % Hkv != 0) return {};
    const std::size_t G = H / Hkv;
    std::vector<std::uint8_t> flags(B * H * Sq * dk, 0), allowed(Sk, 0);
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t h = 0; h < H; ++h) {
            const double* kh = k.data + (b * Hkv + h / G) * Sk * dk;
            for (std::size_t i = 0; i < Sq; ++i) {
                for (std::size_t j = 0; j < Sk; ++j) allowed[j] = !structurally_masked(o.mask, b, h, i, j, Sq, Sk);
                for (std::size_t c = 0; c < dk; ++c)
                    flags[((b * H + h) * Sq + i) * dk + c] = constant_over_allowed(kh + c, dk, Sk, allowed.data()) ? 1 : 0;
            }
        }
    return flags;
}

/// The dimensions mha_nan_gradients needs: batch, query and kv heads, lengths, head dimensions, the
/// model widths of x_q, x_k, x_v and of the output.
struct mha_gradient_dims {
    std::size_t B, H, Hkv, Sq, Sk, dk, dv, Eq, Ek, Ev, Eo;
};

/// Under empty_row_policy::nan, per gradient of multi_head_attention_backward (core/backward.hpp's
/// mha_gradients order: grad_x_q, grad_x_k, grad_x_v, grad_w_q, grad_w_k, grad_w_v, grad_w_o,
/// grad_b_q, grad_b_k, grad_b_v, grad_b_o; flat, C order), flags 1 where the element is NaN by
/// construction, from `empty` (B, H, Sq: the rows with no attendable key, from the mask alone).
/// The backward's NaN: an empty row (b, h, i) makes the head output O_{b,h,i} and dQ_{b,h,i} NaN,
/// and dK, dV of every key of its kv head (b, h / G) (the SDPA backward's nan rule); every sum that
/// reads one NaN is NaN (in IEEE and in MPFI arithmetic alike, 0·NaN included). Hence
///   grad_w_o[a, :]   a = h·dv + c of a head h with an empty row in some batch (mergedᵀ·dOut)
///   grad_x_q[(b,i), :]  a row (b, i) empty in some head (dQ·W_qᵀ over every head's columns)
///   grad_w_q[:, n], grad_b_q[n]  n = h·dk + c of a head h with an empty row in some batch
///   grad_x_k[(b,j), :], grad_x_v[(b,j), :]  every key j of a batch b with a NaN kv head
///   grad_w_k[:, n], grad_w_v[:, n], grad_b_v[n]  the columns of a kv head NaN in some batch
/// grad_b_k is exactly 0 (the softmax's shift invariance, under every policy) and grad_b_o = Σ dOut
/// never NaN. Every flag is empty (nothing NaN) when no row is empty.
inline std::vector<std::vector<std::uint8_t>> mha_nan_gradients(const mha_gradient_dims& d, const std::vector<std::uint8_t>& empty) {
    const std::size_t G = d.Hkv ? d.H / d.Hkv : 1;
    std::vector<std::uint8_t> head_nan(d.H, 0), row_nan(d.B * d.Sq, 0), kv_any(d.Hkv, 0), batch_nan(d.B, 0);
    bool any = false;
    for (std::size_t b = 0; b < d.B; ++b)
        for (std::size_t h = 0; h < d.H; ++h)
            for (std::size_t i = 0; i < d.Sq; ++i)
                if (empty[(b * d.H + h) * d.Sq + i]) {
                    any = true;
                    head_nan[h] = 1, row_nan[b * d.Sq + i] = 1, kv_any[h / G] = 1, batch_nan[b] = 1;
                }
    std::vector<std::vector<std::uint8_t>> f(11);
    if (!any) return f;
    f[0].assign(d.B * d.Sq * d.Eq, 0), f[1].assign(d.B * d.Sk * d.Ek, 0), f[2].assign(d.B * d.Sk * d.Ev, 0);
    f[3].assign(d.Eq * d.H * d.dk, 0), f[4].assign(d.Ek * d.Hkv * d.dk, 0), f[5].assign(d.Ev * d.Hkv * d.dv, 0);
    f[6].assign(d.H * d.dv * d.Eo, 0), f[7].assign(d.H * d.dk, 0), f[8].assign(d.Hkv * d.dk, 0), f[9].assign(d.Hkv * d.dv, 0);
    f[10].assign(d.Eo, 0);
    for (std::size_t r = 0; r < d.B * d.Sq; ++r)
        if (row_nan[r]) std::fill_n(f[0].begin() + static_cast<std::ptrdiff_t>(r * d.Eq), d.Eq, std::uint8_t{1});
    for (std::size_t b = 0; b < d.B; ++b)
        if (batch_nan[b]) {
            std::fill_n(f[1].begin() + static_cast<std::ptrdiff_t>(b * d.Sk * d.Ek), d.Sk * d.Ek, std::uint8_t{1});
            std::fill_n(f[2].begin() + static_cast<std::ptrdiff_t>(b * d.Sk * d.Ev), d.Sk * d.Ev, std::uint8_t{1});
        }
    for (std::size_t h = 0; h < d.H; ++h) {
        if (!head_nan[h]) continue;
        for (std::size_t c = 0; c < d.dk; ++c) {
            const std::size_t n = h * d.dk + c;
            f[7][n] = 1;
            for (std::size_t a = 0; a < d.Eq; ++a) f[3][a * d.H * d.dk + n] = 1;
        }
        for (std::size_t c = 0; c < d.dv; ++c)
            std::fill_n(f[6].begin() + static_cast<std::ptrdiff_t>((h * d.dv + c) * d.Eo), d.Eo, std::uint8_t{1});
    }
    for (std::size_t hk = 0; hk < d.Hkv; ++hk) {
        if (!kv_any[hk]) continue;
        for (std::size_t c = 0; c < d.dk; ++c)
            for (std::size_t a = 0; a < d.Ek; ++a) f[4][a * d.Hkv * d.dk + hk * d.dk + c] = 1;
        for (std::size_t c = 0; c < d.dv; ++c) {
            f[9][hk * d.dv + c] = 1;
            for (std::size_t a = 0; a < d.Ev; ++a) f[5][a * d.Hkv * d.dv + hk * d.dv + c] = 1;
        }
    }
    return f;
}

}  // namespace attnref::certify
