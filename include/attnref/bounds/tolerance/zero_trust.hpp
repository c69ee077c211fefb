#pragma once
/// \file bounds/tolerance/zero_trust.hpp
/// Owns: the rules that keep a pass meaningful — the vacuity criterion (a bound as large as the
/// quantity it bounds, or not a finite number ≥ 0, proves nothing) and benchdnn's zero-trust
/// (outputs with > 30% exact zeros or identical rows are untrustworthy). Either turns a pass into
/// INCONCLUSIVE.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "attnref/core/parallel.hpp"
#include "attnref/bounds/tolerance/compare.hpp"
#include "attnref/bounds/tolerance/names.hpp"

namespace attnref::tolerance {

/// Where a tensor's bounds cannot support a pass (see find_vacuous).
struct vacuity {
    std::size_t elements = 0;  ///< elements whose bound is vacuous
    std::size_t index = 0;     ///< the first of them
    double bound = 0, scale = 0;  ///< its bound and the scale that bound reached
    bool any() const { return elements > 0; }
};

/// The scale an lse bound is measured against: an error of ln 2 in lse is an error of a factor 2
/// in the normaliser e^lse, as large as the normaliser itself (lse has no scale of its own: it
/// shifts with the logits).
inline constexpr double lse_vacuity_scale = 0.6931471805599453;

/// The vacuity criterion. A bound b for an element whose reference is finite (non-finite ones
/// must match exactly) is *vacuous* when
///   - it is not a finite number ≥ 0 (NaN, +inf, negative), or
///   - it is as large as the quantity it bounds: b > 0 and b ≥ R, where R is `fixed_scale` when
///     given (> 0), else the largest finite |reference| value of the element's row (the last axis,
///     `row_length` elements: an output row, a row of weights over the keys).
/// Then every candidate value within b of the reference carries no information about it — a 0,
/// the row's values in any order, the mean of V and the output of an unscaled softmax are all
/// "within the bound" once b ≥ R — so a comparison that finds no violation proves nothing.
/// Rows whose finite reference values are all exactly 0 (empty rows, outputs that are 0 by
/// construction) have no scale: only non-finite bounds are vacuous there (zero-trust covers them).
template <class BoundAt>
vacuity find_vacuous(std::span<const double> reference, std::size_t row_length, BoundAt&& bound_at, double fixed_scale = 0) {
    vacuity v;
    const std::size_t n = reference.size();
    const std::size_t row = row_length > 0 && n % row_length == 0 ? row_length : std::max<std::size_t>(n, 1);
    for (std::size_t begin = 0; begin < n; begin += row) {
        double scale = fixed_scale;
        if (!(fixed_scale > 0)) {
            scale = 0;
            for (std::size_t e = begin; e < begin + row; ++e)
                if (std::isfinite(reference[e])) scale = std::max(scale, detail::abs_d(reference[e]));
        }
        for (std::size_t e = begin; e < begin + row; ++e) {
            if (!std::isfinite(reference[e])) continue;
            const double b = bound_at(e);
            const bool usable = b >= 0 && b < std::numeric_limits<double>::infinity();  // false for NaN
            if (usable && !(b > 0 && scale > 0 && b >= scale)) continue;
            if (v.elements++ == 0) v.index = e, v.bound = b, v.scale = scale;
        }
    }
    return v;
}
/// find_vacuous for per-element bounds given as a vector.
inline vacuity find_vacuous(std::span<const double> reference, std::size_t row_length, std::span<const double> bounds) {
    return find_vacuous(reference, row_length, [&](std::size_t e) { return bounds[e]; });
}

/// Zero-trust (benchdnn): outputs with more than 30% exact zeros, or whose rows (last axis) are all
/// identical, prove nothing. Returns the reason, or nullopt when the output is trustworthy.
/// With the reference (same size), rows whose reference is entirely exact zeros or entirely NaN —
/// empty rows under the zero and NaN policies, zeros by construction that the comparison already
/// pins — are left out of both counts; a case with no other row is untrustworthy.
inline std::optional<std::string_view> untrustworthy(std::span<const double> a, std::size_t row_length,
                                                     std::span<const double> reference = {}, std::size_t threads = 0) {
    if (a.empty()) return std::nullopt;
    const std::size_t row = row_length > 0 && a.size() % row_length == 0 ? row_length : a.size(), rows = a.size() / row;
    const bool with_reference = reference.size() == a.size();
    auto structural = [&](std::size_t r) {
        if (!with_reference) return false;
        const auto e = reference.subspan(r * row, row);
        return std::all_of(e.begin(), e.end(), [](double x) { return x == 0; }) ||
               std::all_of(e.begin(), e.end(), [](double x) { return std::isnan(x); });
    };
    std::size_t first = 0;  // the first row taking part
    while (first < rows && structural(first)) ++first;
    if (first == rows) return "every reference row is empty (exactly 0 or NaN): the case pins only its empty-row policy";
    // Rows in fixed chunks (independent of the thread count); integer counts, so the merge is exact.
    struct part {
        std::size_t kept = 0, zeros = 0;
        bool identical = true;
    };
    const std::size_t rows_per_chunk = std::max<std::size_t>(1, detail::compare_chunk_elements / row);
    const std::size_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
    std::vector<part> parts(chunks);
    ::attnref::parallel_for_dynamic(chunks, chunks < 2 ? 1 : threads, [&](std::size_t k) {
        part& p = parts[k];
        for (std::size_t r = k * rows_per_chunk; r < std::min(rows, (k + 1) * rows_per_chunk); ++r) {
            if (r < first || (r > first && structural(r))) continue;
            ++p.kept;
            for (std::size_t c = 0; c < row; ++c) {
                const double x = a[r * row + c], y = a[first * row + c];
                p.zeros += x == 0;
                p.identical = p.identical && (x == y || (std::isnan(x) && std::isnan(y)));
            }
        }
    });
    std::size_t kept = 0, zeros = 0;
    bool identical = true;
    for (const part& p : parts) kept += p.kept, zeros += p.zeros, identical = identical && p.identical;
    if (static_cast<double>(zeros) > 0.3 * static_cast<double>(kept * row))
        return with_reference ? "more than 30% of the outputs outside empty rows are exactly 0" : "more than 30% of the outputs are exactly 0";
    if (row_length > 0 && kept > 1 && identical) return "all output rows are identical";
    return std::nullopt;
}

}  // namespace attnref::tolerance
