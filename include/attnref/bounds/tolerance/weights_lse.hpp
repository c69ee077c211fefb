#pragma once
/// \file bounds/tolerance/weights_lse.hpp
/// Owns: the bounds on a candidate's attention weights and log-sum-exp against the golden ones
/// (docs/error-bounds.md §5, eqs. 23–24), built on the data-aware row logit bound ε, and their
/// comparisons.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>

#include "attnref/bounds/tolerance/compare.hpp"
#include "attnref/bounds/tolerance/data_aware.hpp"
#include "attnref/bounds/tolerance/names.hpp"

namespace attnref::tolerance {

/// Smallest positive normal number of the format (bfloat16 shares fp32's, 2^-126): the absolute
/// error a weight may have through underflow or flush-to-zero.
constexpr double weights_floor(candidate_format f) { return describe(f).min_normal(); }

/// Bound on |p̂_j − p_j| for the candidate's attention weights against the golden weights p
/// (B, H, Sq, Sk), with the row's logit bound ε (see data_aware_scales; u, u_acc those of the
/// candidate's format f): logit perturbations ≤ ε move p_j by at most p_j·(e^{2ε} − 1); the
/// softmax's own roundings add p_j·(λ·√(2n)·u_acc + 6u_acc) (the denominator's n additions as in
/// step 3, the shift, exp and division), storing p_j in format w adds p_j·u_w, and underflow or
/// flush-to-zero add weights_floor(w).
inline double weights_bound(const data_aware_scales& s, std::size_t row, double p, double u, double u_acc, double u_w, double floor) {
    const double eps = s.logit_epsilon(s.row_logit_var[row], s.row_logit_linear[row], u, u_acc);
    const double rel = std::expm1(2 * eps) + s.lambda * std::sqrt(2 * static_cast<double>(s.n_keys)) * u_acc + 6 * u_acc + u_w;
    return (detail::abs_d(p) * rel + floor) * (1 + 0x1p-40);
}
/// Element e's weights_bound for weights stored in format w of a candidate computing in format f.
inline auto weights_bound_at(std::span<const double> p, candidate_format f, candidate_format w, const data_aware_scales& s) {
    const double u = unit_roundoff(f), ua = accumulate_roundoff(f), uw = unit_roundoff(w), fl = std::max(weights_floor(f), weights_floor(w));
    const std::size_t n = std::max<std::size_t>(s.n_keys, 1);
    return [=, &s](std::size_t e) { return weights_bound(s, e / n, p[e], u, ua, uw, fl); };
}
/// Compares weights a (stored in format w) of a candidate computing in format f with the golden p.
inline comparison compare_weights(std::span<const double> a, std::span<const double> p, candidate_format f, candidate_format w,
                                  const data_aware_scales& s) {
    return compare(a, p, w, weights_bound_at(p, f, w, s));
}
inline comparison compare_weights(std::span<const double> a, std::span<const double> p, candidate_format f, const data_aware_scales& s) {
    return compare_weights(a, p, f, f, s);
}

/// Bound on |lŝe − lse| for a row's log-sum-exp: lse is 1-Lipschitz in the largest logit
/// perturbation, so ε (see data_aware_scales; u, u_acc of the candidate's format) plus the
/// denominator's roundings λ·√(2n)·u_acc, the shift, exp and log (6u_acc) and storing lse in a
/// format of unit roundoff u_l (u_l·|lse|).
inline double lse_bound(const data_aware_scales& s, std::size_t row, double lse, double u, double u_acc, double u_l) {
    const double eps = s.logit_epsilon(s.row_logit_var[row], s.row_logit_linear[row], u, u_acc);
    return (eps + s.lambda * std::sqrt(2 * static_cast<double>(s.n_keys)) * u_acc + 6 * u_acc + u_l * detail::abs_d(lse)) * (1 + 0x1p-40);
}
/// Element e's lse_bound for an lse stored in format l of a candidate computing in format f.
inline auto lse_bound_at(std::span<const double> lse, candidate_format f, candidate_format l, const data_aware_scales& s) {
    const double u = unit_roundoff(f), ua = accumulate_roundoff(f), ul = unit_roundoff(l);
    return [=, &s](std::size_t e) { return lse_bound(s, e, lse[e], u, ua, ul); };
}
/// Compares lse a (stored in format l) of a candidate computing in format f with the golden lse.
inline comparison compare_lse(std::span<const double> a, std::span<const double> lse, candidate_format f, candidate_format l,
                              const data_aware_scales& s) {
    return compare(a, lse, l, lse_bound_at(lse, f, l, s));
}
inline comparison compare_lse(std::span<const double> a, std::span<const double> lse, candidate_format f, const data_aware_scales& s) {
    return compare_lse(a, lse, f, f, s);
}

}  // namespace attnref::tolerance
