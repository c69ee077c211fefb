#pragma once
/// \file bounds/tolerance/weights_lse.hpp
/// Owns: the bounds on a candidate's attention weights and log-sum-exp against the golden ones
/// (docs/error-bounds.md §5, eqs. 23–24), built on the data-aware row logit bound ε, and their
/// comparisons.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <span>

#include "attnref/bounds/error_bounds.hpp"
#include "attnref/bounds/tolerance/compare.hpp"
#include "attnref/bounds/tolerance/data_aware.hpp"
#include "attnref/bounds/tolerance/names.hpp"

namespace attnref::tolerance {

/// Where a kernel's softmax rounds, for the weights and lse bounds (docs/error-bounds.md §5, "Weights
/// and lse under a declared policy"): u the storage of q and k (the logits' error ε), u_acc the
/// softmax's arithmetic (shift, exp, row sum, division, log), u_p and p_floor P's rounding to its own
/// format before it is stored (relative, and η_P absolute near underflow), u_logits
/// the relative rounding of each logit beyond ε (logits stored, or the logit-level constants rounded,
/// in a format coarser than u_acc). All zero but u and u_acc: the bounds as they were.
struct softmax_roundoffs {
    double u = 0, u_acc = 0, u_p = 0, p_floor = 0, u_logits = 0;
    bool beyond_format() const { return u_p > 0 || p_floor > 0 || u_logits > 0; }
};

/// The roundoffs of a kernel of format f: a declared policy's, each where it rounds; undeclared, every
/// kernel of the format — for bfloat16 and float16 that includes accumulating and storing the logits in
/// the format itself (pure 16-bit kernels), so u_acc and u_logits are the format's u.
inline softmax_roundoffs softmax_roundoffs_of(candidate_format f, const std::optional<policy_roundoffs>& pr) {
    if (pr) {
        // P's underflow: η_P, not η_P/S — the weights a kernel writes may be P's cast without the
        // static scale (attnref's own kernels write fl(P) for the P·V of fl(S·P)/S), and η_P covers both.
        softmax_roundoffs r{pr->storage_but_weights(), pr->accumulate, pr->weights, error_bounds::underflow_eta(pr->weights), 0};
        if (pr->logits > pr->accumulate) r.u_logits = pr->logit_level();
        return r;
    }
    const double u = unit_roundoff(f);
    if (f == candidate_format::bfloat16 || f == candidate_format::float16) return {u, u, 0, 0, u};
    return {u, accumulate_roundoff(f), 0, 0, 0};
}

/// ε of a row, with the logits' own rounding u_logits·(max |S| + ε), twice (the constants and the
/// storage), when there is one; `max_abs_logit` the row's largest finite |S_ij| of the exact logits.
inline double softmax_epsilon(const data_aware_scales& s, std::size_t row, const softmax_roundoffs& r, double max_abs_logit) {
    const double eps = s.logit_epsilon(s.row_logit_var[row], s.row_logit_linear[row], r.u, r.u_acc);
    if (!(r.u_logits > 0)) return eps;
    return eps + (2 * r.u_logits + r.u_logits * r.u_logits) * (max_abs_logit + eps) * (1 + 0x1p-40);
}

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
/// weights_bound for a kernel whose softmax rounds as `r` (softmax_roundoffs_of): P computed with its
/// error rel₁ = e^{2ε} − 1 + λ·√(2n)·u_acc + 6u_acc, rounded to P's format (1 + δ_P, |δ_P| ≤ u_p, or η_P/S
/// absolute), then to the file's format w (u_w; floor its underflow): |p̂ − p| ≤ p·((1 + rel₁)(1 + u_p)(1 + u_w) − 1)
/// + (1 + u_w)·p_floor + floor.
inline double weights_bound(const data_aware_scales& s, std::size_t row, double p, const softmax_roundoffs& r, double u_w, double floor,
                            double max_abs_logit) {
    if (!r.beyond_format()) return weights_bound(s, row, p, r.u, r.u_acc, u_w, floor);
    const double eps = softmax_epsilon(s, row, r, max_abs_logit);
    const double rel1 = std::expm1(2 * eps) + s.lambda * std::sqrt(2 * static_cast<double>(s.n_keys)) * r.u_acc + 6 * r.u_acc;
    const double rel = (1 + rel1) * (1 + r.u_p) * (1 + u_w) - 1;
    return (detail::abs_d(p) * rel + (1 + u_w) * r.p_floor + floor) * (1 + 0x1p-40);
}
/// Element e's bound for weights stored in format w of a kernel rounding as `r`; `max_abs_logit` per
/// row (empty when r has no u_logits).
inline auto weights_bound_at(std::span<const double> p, const softmax_roundoffs& r, candidate_format f, candidate_format w,
                             const data_aware_scales& s, std::span<const double> max_abs_logit) {
    const double uw = unit_roundoff(w), fl = std::max(weights_floor(f), weights_floor(w));
    const std::size_t n = std::max<std::size_t>(s.n_keys, 1);
    return [=, &s](std::size_t e) { return weights_bound(s, e / n, p[e], r, uw, fl, max_abs_logit.empty() ? 0.0 : max_abs_logit[e / n]); };
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
/// lse_bound for a kernel whose softmax rounds as `r`: ε (with the logits' own rounding) plus the
/// softmax's λ·√(2n)·u_acc + 6u_acc and the file's u_l·|lse|.
inline double lse_bound(const data_aware_scales& s, std::size_t row, double lse, const softmax_roundoffs& r, double u_l, double max_abs_logit) {
    if (!r.beyond_format()) return lse_bound(s, row, lse, r.u, r.u_acc, u_l);
    const double eps = softmax_epsilon(s, row, r, max_abs_logit);
    return (eps + s.lambda * std::sqrt(2 * static_cast<double>(s.n_keys)) * r.u_acc + 6 * r.u_acc + u_l * detail::abs_d(lse)) * (1 + 0x1p-40);
}
inline auto lse_bound_at(std::span<const double> lse, const softmax_roundoffs& r, candidate_format l, const data_aware_scales& s,
                         std::span<const double> max_abs_logit) {
    const double ul = unit_roundoff(l);
    return [=, &s](std::size_t e) { return lse_bound(s, e, lse[e], r, ul, max_abs_logit.empty() ? 0.0 : max_abs_logit[e]); };
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
