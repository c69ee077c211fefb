#pragma once
/// \file bounds/tolerance/compare.hpp
/// Owns: the compare engine — one tensor of a candidate against its reference under per-element
/// bounds (comparison: violations, max abs/rel/ULP error, RMS, the worst element), deterministic
/// for every thread count — and the element bounds of the simple models (assert-close, ulp,
/// baseline) and of a data-aware or worst-case Scales.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "attnref/core/parallel.hpp"
#include "attnref/bounds/tolerance/names.hpp"

namespace attnref::tolerance {

/// FlashAttention's baseline-relative bound for one tensor: 2·max|naive − ref| + 2·max|(ref + 0.3 −
/// 0.3) − ref| with the ±0.3 evaluated in the candidate's format (FA3). One number for the tensor.
inline double baseline_bound(std::span<const double> reference, std::span<const double> naive, candidate_format f) {
    double naive_err = 0, floor = 0;
    for (std::size_t n = 0; n < reference.size(); ++n) {
        const double e = reference[n];
        if (!std::isfinite(e)) continue;
        if (std::isfinite(naive[n])) naive_err = std::max(naive_err, detail::abs_d(naive[n] - e));
        const double shifted = round_to(f, round_to(f, round_to(f, e) + 0.3) - 0.3);
        floor = std::max(floor, detail::abs_d(shifted - e));
    }
    return 2 * naive_err + 2 * floor;
}

/// Result of comparing one tensor under one model.
struct comparison {
    std::size_t elements = 0, violations = 0, nonfinite_mismatches = 0;
    double max_abs = 0, max_rel = 0, max_ulp = 0, rms = 0;
    double worst_ratio = 0;  ///< max over elements of |a − e| / bound (inf where the bound is 0 and the error is not)
    std::size_t worst_index = 0;
    double worst_candidate = 0, worst_expected = 0, worst_bound = 0;
    bool ok() const { return violations == 0 && nonfinite_mismatches == 0; }
};

/// Compares candidate a against reference e elementwise. `bound_at(n)` gives the absolute bound of
/// element n (for the ulp model pass ulp_limit instead and a null bound_at). NaN must match NaN, ±inf
/// must match the same infinity; any other non-finite mismatch is a violation.
///
/// The elements are compared in fixed chunks of compare_chunk_elements, the chunks on up to
/// `threads` threads (0: std::thread::hardware_concurrency(); an input of one chunk stays on the
/// calling thread), and the chunks' results merged in chunk order: counts add, maxima take the max,
/// the worst element is the first (lowest index) with the largest ratio, and rms adds the chunks'
/// sums of squares in chunk order. The result is the same, bit for bit, for every thread count.
/// `bound_at` is called concurrently from several threads (once per n, in no particular order across
/// chunks): it must be safe to call that way, e.g. a lambda that only reads.
namespace detail {
/// x/y > limit may hold only if x ≥ limit·y·(1 − 2⁻⁵⁰) (x, y ≥ 0, limit ≥ 0): a cheap test that
/// skips the division for the (common) elements that cannot raise a running maximum. Conservative:
/// whenever it answers false, the exact quotient is below limit, so fl(x/y) ≤ limit.
inline bool may_exceed(double x, double y, double limit) { return !(x < limit * y * (1 - 0x1p-50)); }

/// Elements per chunk of compare(): a constant, so that the chunks (and the order their sums of
/// squares are added in) never depend on the thread count.
inline constexpr std::size_t compare_chunk_elements = std::size_t{1} << 16;

/// One element as a candidate for comparison's worst_* fields.
struct compare_worst {
    double ratio = 0;
    std::size_t index = 0;
    double candidate = 0, expected = 0, bound = 0;
};

/// compare()'s result over one chunk. The sequential rule — the first element to reach the worst
/// test becomes the worst, a later one replaces it only when its ratio is strictly larger — is
/// split so that chunks merge exactly: `worst` is the first element with the largest non-NaN ratio
/// and `first` the chunk's first element to reach the test (it decides alone when its ratio is NaN,
/// as no ratio compares larger than NaN; ratios are NaN e.g. for inf/inf).
struct compare_partial {
    std::size_t violations = 0, nonfinite_mismatches = 0;
    double max_abs = 0, max_rel = 0, max_ulp = 0, sum_sq = 0;
    compare_worst first, worst;
    bool have_first = false, have_worst = false;
};

/// Compares elements [begin, end) with the format fixed at compile time (the per-element ULP
/// distance then has no switch).
template <candidate_format F, class BoundAt>
compare_partial compare_chunk(std::span<const double> a, std::span<const double> e, std::size_t begin, std::size_t end,
                              BoundAt& bound_at, std::optional<double> ulp_limit) {
    // Locals, not compare_partial's fields, in the loop: they stay in registers.
    std::size_t violations = 0, nonfinite_mismatches = 0;
    double max_abs = 0, max_rel = 0, max_ulp = 0, sum_sq = 0;
    compare_worst first, worst;
    bool have_first = false, have_worst = false;
    const auto consider = [&](double ratio, std::size_t n, double x, double y, double bound) {
        if (!have_first) first = {ratio, n, x, y, bound}, have_first = true;
        if (ratio > worst.ratio || (!have_worst && !std::isnan(ratio))) worst = {ratio, n, x, y, bound}, have_worst = true;
    };
    for (std::size_t n = begin; n < end; ++n) {
        const double x = a[n], y = e[n];
        double ratio = 0, bound = 0;
        if (!std::isfinite(x) || !std::isfinite(y)) {
            const bool same = (std::isnan(x) && std::isnan(y)) || x == y;
            if (same) continue;
            ++nonfinite_mismatches;
            ++violations;
            consider(std::numeric_limits<double>::infinity(), n, x, y, 0);
            max_abs = std::numeric_limits<double>::infinity();
            continue;
        }
        // std::fabs, not abs_d: branch-free (abs_d's branch on the sign mispredicts on real data) and
        // the same values but for the sign of a zero err, which nothing below can tell apart.
        const double err = std::fabs(x - y);
        sum_sq += err * err;
        max_abs = std::max(max_abs, err);
        if (y != 0) {
            if (may_exceed(err, std::fabs(y), max_rel)) max_rel = std::max(max_rel, err / std::fabs(y));
        } else if (err != 0) {
            max_rel = std::numeric_limits<double>::infinity();
        }
        const double ulps = ulp_distance(F, x, y);
        max_ulp = std::max(max_ulp, ulps);
        if (ulp_limit) {
            bound = *ulp_limit;
            ratio = ulps / *ulp_limit;
        } else {
            bound = bound_at(n);
            // Skip the division when err ≤ bound and err/bound cannot exceed the chunk's worst ratio
            // so far: then ratio ≤ 1 and ≤ worst.ratio, and neither the count nor the worst can change.
            if (have_worst && err <= bound && !may_exceed(err, bound, worst.ratio)) continue;
            ratio = err == 0 ? 0 : (bound > 0 ? err / bound : std::numeric_limits<double>::infinity());
        }
        if (ratio > 1) ++violations;
        consider(ratio, n, x, y, bound);
    }
    compare_partial p;
    p.violations = violations, p.nonfinite_mismatches = nonfinite_mismatches;
    p.max_abs = max_abs, p.max_rel = max_rel, p.max_ulp = max_ulp, p.sum_sq = sum_sq;
    p.first = first, p.worst = worst, p.have_first = have_first, p.have_worst = have_worst;
    return p;
}

/// compare() with the format fixed at compile time: chunks, then their merge in chunk order.
template <candidate_format F, class BoundAt>
comparison compare_in(std::span<const double> a, std::span<const double> e, BoundAt& bound_at, std::optional<double> ulp_limit,
                      std::size_t threads = 0) {
    const std::size_t size = a.size();
    const std::size_t chunks = (size + compare_chunk_elements - 1) / compare_chunk_elements;
    std::vector<compare_partial> parts(chunks);
    ::attnref::parallel_for_dynamic(chunks, chunks < 2 ? 1 : threads, [&](std::size_t k) {
        const std::size_t begin = k * compare_chunk_elements;
        parts[k] = compare_chunk<F>(a, e, begin, std::min(size, begin + compare_chunk_elements), bound_at, ulp_limit);
    });
    comparison c;
    c.elements = a.size();
    compare_partial all;
    for (const compare_partial& p : parts) {
        all.violations += p.violations;
        all.nonfinite_mismatches += p.nonfinite_mismatches;
        all.max_abs = std::max(all.max_abs, p.max_abs);
        all.max_rel = std::max(all.max_rel, p.max_rel);
        all.max_ulp = std::max(all.max_ulp, p.max_ulp);
        all.sum_sq += p.sum_sq;
        if (!all.have_first && p.have_first) all.first = p.first, all.have_first = true;
        if (p.have_worst && (!all.have_worst || p.worst.ratio > all.worst.ratio)) all.worst = p.worst, all.have_worst = true;
    }
    c.violations = all.violations;
    c.nonfinite_mismatches = all.nonfinite_mismatches;
    c.max_abs = all.max_abs;
    c.max_rel = all.max_rel;
    c.max_ulp = all.max_ulp;
    const compare_worst* w = all.have_first && std::isnan(all.first.ratio) ? &all.first : all.have_worst ? &all.worst : nullptr;
    if (w) c.worst_ratio = w->ratio, c.worst_index = w->index, c.worst_candidate = w->candidate, c.worst_expected = w->expected,
           c.worst_bound = w->bound;
    c.rms = a.empty() ? 0 : std::sqrt(all.sum_sq / static_cast<double>(a.size()));
    return c;
}
}  // namespace detail

/// `threads`: as above (0: one per hardware thread); the result does not depend on it.
template <class BoundAt>
comparison compare(std::span<const double> a, std::span<const double> e, candidate_format f, BoundAt&& bound_at,
                   std::optional<double> ulp_limit = std::nullopt, std::size_t threads = 0) {
    switch (f) {
        case candidate_format::float64: return detail::compare_in<candidate_format::float64>(a, e, bound_at, ulp_limit, threads);
        case candidate_format::float32: return detail::compare_in<candidate_format::float32>(a, e, bound_at, ulp_limit, threads);
        case candidate_format::bfloat16: return detail::compare_in<candidate_format::bfloat16>(a, e, bound_at, ulp_limit, threads);
        case candidate_format::float16: return detail::compare_in<candidate_format::float16>(a, e, bound_at, ulp_limit, threads);
    }
    return {};
}

/// Elementwise assert_close bound atol + rtol·|e|.
inline comparison compare_assert_close(std::span<const double> a, std::span<const double> e, candidate_format f) {
    const rtol_atol t = assert_close_defaults(f);
    return compare(a, e, f, [&](std::size_t n) { return t.atol + t.rtol * detail::abs_d(e[n]); });
}
inline comparison compare_ulp(std::span<const double> a, std::span<const double> e, candidate_format f, double limit = 4) {
    return compare(a, e, f, [](std::size_t) { return 0.0; }, limit);
}
/// Evaluates a data-aware or worst-case bound for every element, for candidates in format f: the
/// per-element bounds compare() and the checker's judge_output take.
/// Each element's bound is computed alone, so `threads` (0: one per hardware thread) changes no value.
template <class Scales>
std::vector<double> element_bounds(const Scales& s, candidate_format f, std::size_t threads = 0) {
    const double u = unit_roundoff(f), ua = accumulate_roundoff(f);
    std::vector<double> b(s.size());
    const std::size_t chunks = (b.size() + detail::compare_chunk_elements - 1) / detail::compare_chunk_elements;
    ::attnref::parallel_for_dynamic(chunks, threads, [&](std::size_t k) {
        const std::size_t end = std::min(b.size(), (k + 1) * detail::compare_chunk_elements);
        for (std::size_t n = k * detail::compare_chunk_elements; n < end; ++n) b[n] = s.bound(n, u, ua);
    });
    return b;
}
/// The same for explicit unit roundoffs (a declared policy: u its widest storage, u_acc its accumulation).
template <class Scales>
std::vector<double> element_bounds(const Scales& s, double u, double ua) {
    std::vector<double> b(s.size());
    for (std::size_t n = 0; n < b.size(); ++n) b[n] = s.bound(n, u, ua);
    return b;
}
/// Compares under a data_aware_scales or worst_case_scales bound.
template <class Scales>
comparison compare_data_aware(std::span<const double> a, std::span<const double> e, candidate_format f, const Scales& s) {
    const double u = unit_roundoff(f), ua = accumulate_roundoff(f);
    return compare(a, e, f, [&](std::size_t n) { return s.bound(n, u, ua); });
}

}  // namespace attnref::tolerance
