#pragma once
/// \file bounds/invariants.hpp
/// Properties every correct attention implementation's outputs satisfy, as functions over plain
/// views, so they can gate other implementations' results (the checker) as well as attnref's own
/// (tests, static_assert). Each returns an invariant_report: ok, how many elements were checked and
/// violated, the worst value found (in the invariant's own unit) against its bound, and where.
///
/// Tolerances are a-priori rounding-error bounds in terms of the unit roundoff of the arithmetic
/// that produced the values (pass 0 for exact or interval-midpoint checks). A report whose bound is
/// vacuous (infinite, NaN, or as large as the quantity it bounds) says so (`vacuous`): its pass
/// proves nothing, and the checker reports it INCONCLUSIVE instead of PASS.
/// - rows of P sum to 1: with u_acc the unit roundoff of the softmax's arithmetic and u_s that of the
///   format P is stored in, |Σ_j p̂_j − 1| ≤ (1 + γ_{n+3}(u_acc))(1 + u_s) − 1 + n·η_s + γ_n(u_sum)·(…)
///   (n = keys). The exact softmax of the computed logits sums to exactly 1 whatever the logits'
///   errors, so only the softmax's own evaluation counts: each weight is p_j(1 + θ_j) with
///   |θ_j| ≤ γ_{n+3}(u_acc) for the shifted softmax (Blanchard, Higham & Higham 2021, (n + 3)u to
///   first order), then stored: p̂_j = p_j(1 + θ_j)(1 + η_j), |η_j| ≤ u_s, or an absolute error ≤ η_s
///   (half the smallest subnormal spacing of the storage and accumulation formats) where the weight
///   is subnormal, so |Σ p̂_j − 1| ≤ Σ_j p_j·[(1 + γ_{n+3}(u_acc))(1 + u_s) − 1] + n·η_s; the check's
///   own sum (in double, or in T where T is wider) adds γ_n(u_sum)·Σ p̂_j. Never negative; infinite
///   (vacuous) only when n·u_acc ≥ 1, and vacuous when it reaches 1.
/// - P = exp(S − lse):   |p̂ − exp(s − l̂)| ≤ [(n + 3)u + 2u(|s| + |l̂| + 1)]·exp(s − l̂) + floor, where the
///   2u(|s| + |l̂|) term is the absolute error of s − l̂ that exp turns into relative error and floor
///   the absolute error of a weight that underflows in the producer's formats (e.g. float32's
///   smallest normal 2^-126 for a float32 candidate, not float64's).
/// - head outputs in the range of V: o = Σ p_j v_j is a convex combination; rounding can leave the
///   range by at most (2n + 4)u·max_j |v_j| (γ_n for the sum plus (n + 3)u for the weights) plus
///   (n + 5)·η·max(1, max_j |v_j|), η the arithmetic's underflow error (error_bounds::underflow_eta).

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "attnref/bounds/error_bounds.hpp"
#include "attnref/core/mask.hpp"
#include "attnref/core/math.hpp"
#include "attnref/core/scalar.hpp"
#include "attnref/core/tensor.hpp"

namespace attnref {

struct invariant_report {
    const char* name = "";
    bool ok = true;
    std::size_t checked = 0;
    std::size_t violations = 0;
    double worst = 0;  ///< largest |deviation| found (or the offending value)
    double bound = 0;  ///< the bound at the worst element
    std::array<std::size_t, 4> index{};
    /// The bound was vacuous somewhere (infinite, NaN, or as large as the quantity it bounds): a
    /// pass proves nothing there. The checker reports such an invariant INCONCLUSIVE.
    bool vacuous = false;

    constexpr void record(bool pass, double deviation, double bound_here, std::array<std::size_t, 4> where) {
        ++checked;
        if (!pass) {
            ok = false;
            ++violations;
        }
        // Keep the first violation, or the largest deviation while all pass.
        if ((!pass && violations == 1) || (ok && deviation > worst)) {
            worst = deviation;
            bound = bound_here;
            index = where;
        }
    }
};

/// The lse a producer writes for an empty row (every key structurally masked). attnref, PyTorch
/// and FlashAttention's split-KV path write −inf (log 0); FlashAttention 2 and 3 write +inf on
/// their normal path (flash-attention csrc/flash_attn/src/softmax.h normalize_softmax_lse and
/// hopper/softmax.h: `(sum == 0.f || sum != sum) ? (Split ? -INFINITY : INFINITY) : …`);
/// `any` accepts every value there (the row's output and weights are still checked).
enum class empty_row_lse { minus_inf, plus_inf, any };
/// Their names (`attnref check --empty-row-lse`), for name_in / value_in (name_table.hpp).
inline constexpr std::pair<const char*, empty_row_lse> empty_row_lse_names[] = {
    {"-inf", empty_row_lse::minus_inf}, {"+inf", empty_row_lse::plus_inf}, {"any", empty_row_lse::any}};

/// What the checks need to know about the call that produced the outputs: its masks, its
/// empty-row policy and its lse convention for empty rows. Rows where every key is structurally
/// masked are "empty".
struct invariant_context {
    mask_options mask{};
    empty_row_policy empty_rows = empty_row_policy::zero;
    empty_row_lse empty_lse = empty_row_lse::minus_inf;
};

/// Whether lse value l of an empty row follows convention c.
constexpr bool empty_row_lse_ok(empty_row_lse c, double l) {
    const bool infinite = l * 0.5 == l && l != 0;  // ±inf (NaN and 0 compare unequal or are excluded)
    switch (c) {
        case empty_row_lse::minus_inf: return infinite && l < 0;
        case empty_row_lse::plus_inf: return infinite && l > 0;
        case empty_row_lse::any: return true;
    }
    return false;
}

namespace detail {
constexpr double abs_value(double x) { return x < 0 ? -x : x; }
template <class T>
constexpr double to_double(const T& x) { return static_cast<double>(x); }
/// f(b, h, i) for every query row of a (B, H, Sq, Sk) tensor, in row-major order.
template <class F>
constexpr void for_each_row(const extents_t<4>& e, F&& f) {
    for (std::size_t b = 0; b < e[0]; ++b)
        for (std::size_t h = 0; h < e[1]; ++h)
            for (std::size_t i = 0; i < e[2]; ++i) f(b, h, i);
}
}  // namespace detail

/// Whether every key of query row i is structurally masked (an empty row).
constexpr bool row_is_empty(const mask_options& m, std::size_t b, std::size_t h, std::size_t i, std::size_t sq,
                            std::size_t sk) {
    for (std::size_t j = 0; j < sk; ++j)
        if (!structurally_masked(m, b, h, i, j, sq, sk)) return false;
    return true;
}

/// Half the smallest subnormal spacing of a format with p significand bits and minimum normal
/// exponent e_min (2^(e_min − p)): the largest absolute error of rounding a subnormal to it.
constexpr double half_subnormal_spacing(double u, double smallest_normal) { return smallest_normal * u; }

/// Bound on |Σ_j p̂_j − 1| for a row of n weights computed in an arithmetic of unit roundoff u_acc
/// and stored in a format of unit roundoff u_s (see the file comment); `eta` the absolute error of
/// a weight rounded in the subnormal range (half_subnormal_spacing), u_sum the check's own sum's.
/// +inf when n·u_acc ≥ 1 (γ undefined): the caller must treat that as vacuous.
constexpr double row_sum_bound(std::size_t n, double u_acc, double u_s, double eta, double u_sum) {
    const double weights = (1 + gamma(n + 3, u_acc)) * (1 + u_s) - 1 + static_cast<double>(n) * eta;  // γ: error_bounds.hpp
    return (weights + gamma(n, u_sum) * (1 + weights)) * (1 + 0x1p-50);  // (1 + 2^-50): this evaluation's rounding
}

/// Rows of P (B, H, Sq, Sk) sum to 1 within row_sum_bound(n, u_acc, u_s, …); empty rows sum to 0
/// (zero policy), 1 (uniform) or are all NaN (nan policy). u_acc: the softmax arithmetic's unit
/// roundoff; u_s: that of the format P is stored in; eta: the absolute error of a subnormal weight
/// (0 for formats without underflow in the range of P). The sum runs in double, or in T where T
/// has more than 53 bits. The report is `vacuous` when the bound is not below 1.
template <class T>
constexpr invariant_report rows_sum_to_one(tensor_view<const T, 4> p, const invariant_context& ctx, double u_acc, double u_s,
                                           double eta) {
    invariant_report r{"rows of P sum to 1"};
    const auto [batch, heads, sq, sk] = p.extents;
    constexpr bool wide = scalar_traits<T>::digits > 53;
    const double u_sum = wide ? static_cast<double>(unit_roundoff<T>()) : 0x1p-53;
    const double bound = row_sum_bound(sk, u_acc, u_s, eta, u_sum);
    r.vacuous = !(bound < 1);
    for (std::size_t b = 0; b < batch; ++b)
        for (std::size_t h = 0; h < heads; ++h)
            for (std::size_t i = 0; i < sq; ++i) {
                const bool empty = row_is_empty(ctx.mask, b, h, i, sq, sk);
                if (empty && ctx.empty_rows == empty_row_policy::nan) {
                    bool all_nan = true;
                    for (std::size_t j = 0; j < sk; ++j) all_nan = all_nan && is_nan(p(b, h, i, j));
                    r.record(all_nan, all_nan ? 0 : 1, 0, {b, h, i, 0});
                    continue;
                }
                const double target = empty && ctx.empty_rows == empty_row_policy::zero ? 0.0 : 1.0;
                double deviation = 0;
                if constexpr (wide) {
                    T sum = T(0);
                    for (std::size_t j = 0; j < sk; ++j) sum = sum + p(b, h, i, j);
                    deviation = detail::abs_value(detail::to_double(sum - T(target)));
                } else {
                    double sum = 0;  // every value of a format of ≤ 53 bits is exact in double
                    for (std::size_t j = 0; j < sk; ++j) sum = sum + detail::to_double(p(b, h, i, j));
                    deviation = detail::abs_value(sum - target);
                }
                r.record(deviation <= bound, deviation, bound, {b, h, i, 0});  // NaN fails: NaN <= x is false
            }
    return r;
}
/// The same for weights computed and stored in one arithmetic of unit roundoff u (subnormal
/// weights: T's own half subnormal spacing where T is a builtin type).
template <class T>
constexpr invariant_report rows_sum_to_one(tensor_view<const T, 4> p, const invariant_context& ctx, double u) {
    double eta = 0;
    if constexpr (BuiltinFloatingPoint<T>) eta = static_cast<double>(std::numeric_limits<T>::denorm_min()) / 2;
    return rows_sum_to_one(p, ctx, u, u, eta);
}

/// P is exactly 0 wherever a key is structurally masked (in non-empty rows).
template <class T>
constexpr invariant_report masked_weights_are_zero(tensor_view<const T, 4> p, const invariant_context& ctx) {
    invariant_report r{"masked weights are exactly 0"};
    const std::size_t sq = p.extents[2], sk = p.extents[3];
    detail::for_each_row(p.extents, [&](std::size_t b, std::size_t h, std::size_t i) {
        if (row_is_empty(ctx.mask, b, h, i, sq, sk)) return;
        for (std::size_t j = 0; j < sk; ++j) {
            if (!structurally_masked(ctx.mask, b, h, i, j, sq, sk)) continue;
            const double value = detail::to_double(p(b, h, i, j));
            r.record(value == 0, is_nan(value) ? 1 : detail::abs_value(value), 0, {b, h, i, j});
        }
    });
    return r;
}

/// 0 ≤ p ≤ 1 for every weight (NaN fails, except in empty rows under the nan policy).
template <class T>
constexpr invariant_report weights_in_unit_interval(tensor_view<const T, 4> p, const invariant_context& ctx) {
    invariant_report r{"0 <= P <= 1"};
    const std::size_t sq = p.extents[2], sk = p.extents[3];
    detail::for_each_row(p.extents, [&](std::size_t b, std::size_t h, std::size_t i) {
        if (ctx.empty_rows == empty_row_policy::nan && row_is_empty(ctx.mask, b, h, i, sq, sk)) return;
        for (std::size_t j = 0; j < sk; ++j) {
            const double value = detail::to_double(p(b, h, i, j));
            const bool pass = value >= 0 && value <= 1;
            r.record(pass, pass ? 0 : (value < 0 ? -value : value - 1), 0, {b, h, i, j});
        }
    });
    return r;
}

/// p = exp(s − lse) for attendable keys, within the bound in the file comment (n = keys, u of the
/// producing arithmetic). `logits` is S (B, H, Sq, Sk) with −inf where masked (attention_logits).
/// The check computes exp in double with attnref's own exp. `logit_error` (optional, one per row
/// (b, h, i)) bounds how far the producer's own logits may be from `logits` (e.g. through
/// projections, see tolerance::data_aware_scales): p and lse then both move with them, and the
/// relative bound widens by e^{2·logit_error} − 1. `floor`: the absolute error of a weight that
/// underflows in the producer's formats (the smallest normal of the format P was computed or
/// stored in, e.g. 2^-126 for float32). `u_weights`, `u_lse`: unit roundoffs of the formats P and
/// lse are stored in when narrower than the arithmetic u (P's rounding adds u_weights, lse's
/// u_lse·|lse|, to the relative bound). Empty rows must carry the lse of ctx.empty_lse. The report
/// is `vacuous` where the relative bound reaches 1 (or is not finite).
template <class T, class S, class L>
constexpr invariant_report weights_match_lse(tensor_view<const T, 4> p, tensor_view<const S, 4> logits,
                                             tensor_view<const L, 3> lse, const invariant_context& ctx, double u,
                                             std::span<const double> logit_error = {}, double floor = 0x1p-1022,
                                             double u_weights = 0, double u_lse = 0) {
    invariant_report r{"P = exp(S - lse)"};
    const auto [batch, heads, sq, sk] = p.extents;
    for (std::size_t b = 0; b < batch; ++b)
        for (std::size_t h = 0; h < heads; ++h)
            for (std::size_t i = 0; i < sq; ++i) {
                const double l = detail::to_double(lse(b, h, i));
                if (row_is_empty(ctx.mask, b, h, i, sq, sk)) {
                    r.record(empty_row_lse_ok(ctx.empty_lse, l), 0, 0, {b, h, i, 0});
                    continue;
                }
                for (std::size_t j = 0; j < sk; ++j) {
                    if (structurally_masked(ctx.mask, b, h, i, j, sq, sk)) continue;
                    const double s = detail::to_double(logits(b, h, i, j));
                    const double expected = math::exp(s - l);
                    double rel = static_cast<double>(sk + 3) * u + 2 * (u + 0x1p-53) * (detail::abs_value(s) + detail::abs_value(l) + 1);
                    rel += u_weights + u_lse * detail::abs_value(l);
                    if (!logit_error.empty()) rel += math::expm1(2 * logit_error[(b * heads + h) * sq + i]);
                    double bound = rel * expected + floor;
                    if (!(rel < 1)) {
                        // The relative form no longer pins p̂ (it could be 0 or twice p). To every order, the
                        // exponent's perturbation (the logit's and lse's errors above, as an absolute error of
                        // s − lse) is at most d and p̂ ≤ exp(s − lse + d)·(1 + the softmax's own roundings): a
                        // logit pushed far below the row's (a seed mask's −1e9) still pins p̂ to the underflow
                        // floor, which is a claim, not a vacuous bound.
                        const double d = 2 * (u + 0x1p-53) * (detail::abs_value(s) + detail::abs_value(l) + 1) + u_lse * detail::abs_value(l) +
                                         (logit_error.empty() ? 0.0 : 2 * logit_error[(b * heads + h) * sq + i]);
                        const double envelope = math::exp(s - l + d) * (1 + static_cast<double>(sk + 3) * u + u_weights) * (1 + 0x1p-40);
                        if (envelope <= floor) bound = envelope + floor;  // p̂ ∈ [0, envelope + floor]; NaN: not pinned
                        else r.vacuous = true;
                    }
                    const double deviation = detail::abs_value(detail::to_double(p(b, h, i, j)) - expected);
                    r.record(deviation <= bound, deviation, bound, {b, h, i, j});
                }
            }
    return r;
}

/// Each head's output before W_o lies in the range of the values it averages (keys with p ≠ 0),
/// widened by (2n + 4)u·max|v|; rows whose weights are all 0 must output 0.
/// head_outputs (B, H, Sq, dv), v (B, Hkv, Sk, dv), p (B, H, Sq, Sk); query head h reads kv head h / (H / Hkv).
template <class O, class V, class T>
constexpr invariant_report head_outputs_in_value_range(tensor_view<const O, 4> head_outputs, tensor_view<const V, 4> v,
                                                       tensor_view<const T, 4> p, double u) {
    invariant_report r{"head output within the range of V"};
    const auto [batch, heads, sq, dv] = head_outputs.extents;
    const std::size_t kv_heads = v.extents[1], sk = v.extents[2], group = heads / kv_heads;
    for (std::size_t b = 0; b < batch; ++b)
        for (std::size_t h = 0; h < heads; ++h)
            for (std::size_t i = 0; i < sq; ++i)
                for (std::size_t c = 0; c < dv; ++c) {
                    bool any = false;
                    double lo = 0, hi = 0, largest = 0;
                    for (std::size_t j = 0; j < sk; ++j) {
                        if (detail::to_double(p(b, h, i, j)) == 0) continue;
                        const double x = detail::to_double(v(b, h / group, j, c));
                        lo = any && lo < x ? lo : x;
                        hi = any && hi > x ? hi : x;
                        largest = detail::abs_value(x) > largest ? detail::abs_value(x) : largest;
                        any = true;
                    }
                    const double o = detail::to_double(head_outputs(b, h, i, c));
                    // + the storage underflow (docs/error-bounds.md eq. 26): Sk products, the weights' and o's roundings
                    const double slack = static_cast<double>(2 * sk + 4) * u * largest +
                                         static_cast<double>(sk + 5) * error_bounds::underflow_eta(u) * (largest > 1 ? largest : 1);
                    const bool pass = any ? (o >= lo - slack && o <= hi + slack) : o == 0;
                    const double deviation = o < lo ? lo - o : (o > hi ? o - hi : 0);
                    r.record(pass, pass ? deviation : (any ? deviation : detail::abs_value(o)), slack, {b, h, i, c});
                }
    return r;
}

/// Causality: for every cut t, changing keys and values at positions ≥ t must leave bitwise unchanged
/// every query row whose last attendable key (by the causal/window mask) is < t. `attend(q, k, v)`
/// returns the output (B, H, Sq, dv) of the implementation under test; k and v are (B, Hkv, Sk, d).
template <class F, class T>
constexpr invariant_report causality(F&& attend, const tensor<T, 4>& q, const tensor<T, 4>& k, const tensor<T, 4>& v,
                                     const mask_options& mask) {
    invariant_report r{"causality"};
    const auto base = attend(q, k, v);
    const std::size_t batch = q.extent(0), heads = q.extent(1), sq = q.extent(2), sk = k.extent(2), dv = v.extent(3);
    for (std::size_t t = 0; t < sk; ++t) {
        tensor<T, 4> k2 = k, v2 = v;
        for (std::size_t b = 0; b < batch; ++b)
            for (std::size_t h = 0; h < k.extent(1); ++h)
                for (std::size_t j = t; j < sk; ++j) {
                    for (std::size_t c = 0; c < k.extent(3); ++c) k2(b, h, j, c) = k2(b, h, j, c) * T(-3) + T(7);
                    for (std::size_t c = 0; c < dv; ++c) v2(b, h, j, c) = v2(b, h, j, c) * T(5) - T(11);
                }
        const auto changed = attend(q, k2, v2);
        for (std::size_t b = 0; b < batch; ++b)
            for (std::size_t h = 0; h < heads; ++h)
                for (std::size_t i = 0; i < sq; ++i) {
                    bool sees_future = false;  // does row i attend to any key ≥ t?
                    for (std::size_t j = t; j < sk; ++j)
                        sees_future = sees_future || !structurally_masked(mask, b, h, i, j, sq, sk);
                    if (sees_future) continue;
                    for (std::size_t c = 0; c < dv; ++c) {
                        const bool same = base(b, h, i, c) == changed(b, h, i, c) ||
                                          (is_nan(base(b, h, i, c)) && is_nan(changed(b, h, i, c)));
                        r.record(same, same ? 0 : 1, 0, {b, h, i, c});
                    }
                }
    }
    return r;
}

/// Permuting keys and values together (same permutation of axis 2 of k and v) leaves the output
/// unchanged up to summation order: |o − o_perm| ≤ 2(2n + 4)u·max|v| per element. Use without
/// position-dependent masks (or permute them too in `attend`).
template <class F, class T>
constexpr invariant_report key_permutation_invariance(F&& attend, const tensor<T, 4>& q, const tensor<T, 4>& k,
                                                      const tensor<T, 4>& v, std::span<const std::size_t> permutation,
                                                      double u) {
    invariant_report r{"key/value permutation invariance"};
    const auto base = attend(q, k, v);
    tensor<T, 4> k2 = k, v2 = v;
    const std::size_t sk = k.extent(2);
    double largest = 0;
    for (std::size_t b = 0; b < k.extent(0); ++b)
        for (std::size_t h = 0; h < k.extent(1); ++h)
            for (std::size_t j = 0; j < sk; ++j) {
                for (std::size_t c = 0; c < k.extent(3); ++c) k2(b, h, j, c) = k(b, h, permutation[j], c);
                for (std::size_t c = 0; c < v.extent(3); ++c) {
                    v2(b, h, j, c) = v(b, h, permutation[j], c);
                    const double x = detail::abs_value(detail::to_double(v(b, h, j, c)));
                    largest = x > largest ? x : largest;
                }
            }
    const auto permuted = attend(q, k2, v2);
    const double bound = 2 * static_cast<double>(2 * sk + 4) * u * largest;
    for (std::size_t n = 0; n < base.size(); ++n) {
        const double deviation = detail::abs_value(detail::to_double(base[n]) - detail::to_double(permuted[n]));
        r.record(deviation <= bound, deviation, bound, {n, 0, 0, 0});
    }
    return r;
}

}  // namespace attnref
