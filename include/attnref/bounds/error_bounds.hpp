#pragma once
/// \file bounds/error_bounds.hpp
/// Owns: the building blocks of attnref's a-priori rounding-error bounds, derived in
/// docs/error-bounds.md (equation numbers below are that document's):
///   gamma(n, u)                  γ_n = n·u/(1 − n·u), guarded: +inf when n·u ≥ 1      (eq. 1)
///   second_order_factor(x)       (e^x − 1)/x ≥ 1, the factor that makes a first-order
///                                softmax bound valid to every order                    (eq. 6)
///   logit_error(m, u, a)         γ_m(u)·a, a logit's absolute error bound              (eq. 3)
///   sdpa_first_order_factor(…)   2δ + (n + 3)u + γ_n(u) + extra: an SDPA output's
///                                first-order error per unit of σ_l = Σ_j p_j|v_jl|     (eq. 7)
///   online_rescale_roundings(…)  4⌈n/b⌉: an online softmax's extra relative roundings  (eq. 9)
///   underflow_eta(u)             η: the absolute error of rounding into the subnormal
///                                range of the format of unit roundoff u                (eq. 26)
/// Used by tolerance (the worst-case and data-aware models), study (its per-point bound),
/// invariants and the tests. Plain double arithmetic, constexpr where <cmath> allows; no
/// dependency on the rest of the library.

#include <cmath>
#include <cstddef>
#include <limits>

namespace attnref {

/// γ_n(u) = n·u / (1 − n·u) (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed.,
/// Lemma 3.1): |Π_{i≤n} (1 + δ_i)^{±1} − 1| ≤ γ_n for |δ_i| ≤ u, valid while n·u < 1. Returns +inf
/// when n·u ≥ 1 (or is NaN), so that a bound built from it is vacuous, never negative. (eq. 1)
constexpr double gamma(std::size_t n, double u) {
    const double nu = static_cast<double>(n) * u;
    return nu < 1 ? nu / (1 - nu) : std::numeric_limits<double>::infinity();
}

namespace error_bounds {

/// g(x) = (e^x − 1)/x for x > 0, 1 for x ≤ 0 or NaN, +inf for x = +inf. Softmax weights under logit
/// perturbations of at most δ move by at most p_j·(e^{2δ} − 1) = p_j·2δ·g(2δ), not 2δ·p_j: g turns
/// a first-order bound into one valid to every order (expm1(x)/x increases with x). (eq. 6)
inline double second_order_factor(double x) {
    return x > 0 ? (x < std::numeric_limits<double>::infinity() ? std::expm1(x) / x : x) : 1.0;
}

/// The absolute error bound of a logit s·qᵀk formed by a dot product of `dot_roundings` rounded
/// operations (dk products and additions plus the scale's: dk + 4 for SDPA) in an arithmetic of unit
/// roundoff u: γ_m(u)·|s|·|q|ᵀ|k|, where `scaled_abs_dot` is |s|·|q|ᵀ|k| (or its row maximum). (eq. 3)
constexpr double logit_error(std::size_t dot_roundings, double u, double scaled_abs_dot) {
    return gamma(dot_roundings, u) * scaled_abs_dot;
}

/// First-order relative error of a scaled dot-product attention output element per unit of
/// σ_l = Σ_j p_j|v_jl|, for one query row of n keys in an arithmetic of unit roundoff u:
///   2δ + (n + 3)u + γ_n(u) + extra                                                         (eq. 7)
/// δ: the row's logit error bound (logit_error); 2δ: softmax's condition (eq. 5); (n + 3)u: the
/// shifted softmax's own evaluation (Blanchard, Higham & Higham 2021); γ_n(u): P·V in any order;
/// extra: further relative roundings (storage of P or of the output, a softmax algorithm's, eq. 9).
constexpr double sdpa_first_order_factor(double logit_error_bound, std::size_t n_keys, double u, double extra = 0) {
    return 2 * logit_error_bound + static_cast<double>(n_keys + 3) * u + gamma(n_keys, u) + extra;
}

/// The relative roundings an online softmax adds on top of the shifted softmax's: each of its
/// ⌈n/b⌉ blocks rescales the running sum and the output accumulator by a rounded exp(m − m'),
/// two roundings each. (eq. 9)
constexpr std::size_t online_rescale_roundings(std::size_t n_keys, std::size_t block) {
    const std::size_t b = block == 0 ? 1 : block;
    return 4 * ((n_keys + b - 1) / b);
}

/// η, half the smallest subnormal of the format whose unit roundoff is u: rounding x to nearest in that
/// format gives |fl(x) − x| ≤ max(u·|x|, η) ≤ u·|x| + η, the relative bound failing only in the
/// subnormal range (Higham §2.1). (eq. 26) Known formats: float16 (u = 2⁻¹¹, smallest subnormal 2⁻²⁴),
/// bfloat16 (2⁻⁸, 2⁻¹³³), float32 (2⁻²⁴, 2⁻¹⁴⁹), OCP FP8 E4M3 (2⁻⁴, 2⁻⁹) and E5M2 (2⁻³, 2⁻¹⁶); formats
/// of 53 bits or more (float64, long double, binary128, wide software floats) have η ≤ 2⁻¹⁰⁷⁴, the
/// smallest positive double. 0 for u = 0 (exact). Any other u: u·2⁻⁶, the largest η/u of the formats
/// above (E4M3's), so a bound built for an unlisted format stays an upper bound for all of them.
constexpr double underflow_eta(double u) {
    if (!(u > 0)) return 0;
    if (u <= 0x1p-53) return 0x1p-1074;
    if (u == 0x1p-24) return 0x1p-150;  // float32
    if (u == 0x1p-11) return 0x1p-25;   // float16
    if (u == 0x1p-8) return 0x1p-134;   // bfloat16
    if (u == 0x1p-4) return 0x1p-10;    // FP8 E4M3
    if (u == 0x1p-3) return 0x1p-17;    // FP8 E5M2
    return u * 0x1p-6;
}

}  // namespace error_bounds
}  // namespace attnref
