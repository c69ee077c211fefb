#pragma once
/// \file certify/fast/round_check.hpp
/// The rounding check (docs/fast-certify.md (9)): the value of a target format that every real
/// number within a bounded element's bound rounds to, when there is one.

#include <algorithm>
#include <cmath>

#include "attnref/certify/fast/bounded.hpp"
#include "attnref/certify/report.hpp"
#include "attnref/core/double_double.hpp"

namespace attnref::fast {

/// (9) Rounding check: writes the target value (an exact double) when every real number within
/// the bound rounds (nearest, ties to even) to it; false when undecided (or beyond the format's
/// largest finite value, or an exact zero of unknown sign: left to MPFI).
inline bool round_check(const bounded& x, const format_description& f, double& out) {
    const double b = x.bound;
    if (!(b >= 0) || std::isinf(b)) return false;
    if (x.v.hi == 0) {
        if (x.v.lo == 0 && b == 0) {  // exact 0 is +0 (certify.hpp)
            out = 0.0;
            return true;
        }
        return false;
    }
    const dd n = dw::two_sum(x.v.hi, x.v.lo);
    const double h = n.hi, l = n.lo;
    const long e = static_cast<long>(dw::exponent_of(h)) + x.scale;  // floor(log2|h|) in real terms
    const long q = std::max<long>(e, f.min_exponent) - (f.precision - 1);  // quantum exponent
    const long g = q - x.scale;                                            // in scaled units
    if (e - q < -60) {
        // |h| far below the quantum: rounds to ±0 when |v| < 2^q/4 and its sign is known.
        const double spread = std::fabs(l) + b;
        if (!(spread <= 0.5 * std::fabs(h)) || !(dw::scale2(std::fabs(h) + spread, static_cast<int>(-g)) < 0.25)) return false;
        out = h > 0 ? 0.0 : -0.0;
        return true;
    }
    const double m = dw::scale2(h, static_cast<int>(-g));  // exact: |m| < 2^53, no underflow (e − q ≥ −60)
    const double y0 = std::nearbyint(m);                    // ties to even (reference environment)
    const double rr = m - y0;                               // exact (|rr| ≤ 1/2, same binade)
    const double ts = rr + dw::scale2(l, static_cast<int>(-g));
    const double bs = dw::scale2(b, static_cast<int>(-g));
    // (9) y = y0·2^q is a value of the format; every v with |v − y| < half the smaller gap to its
    // neighbours rounds to y. Gaps in units of 2^q: 1, except ½ below y = 2^(p−1)·2^q when q is
    // above the subnormal quantum. |v − y| ≤ |ts| + bs, each computed with ≤ 2^-53 absolute error.
    const long qmin = static_cast<long>(f.min_exponent) - (f.precision - 1);
    const double half_gap = (std::fabs(y0) == dw::scale2(1.0, f.precision - 1) && q > qmin) ? 0.25 : 0.5;
    double yr = y0;
    if (b == 0 && std::fabs(ts) == 0.5 && half_gap == 0.5) {
        // An exact value (bound 0) on the midpoint between y0 and its neighbour y0 ± 1 (the gap on
        // either side of y0 is 1 here): ties to even. Only when ts is exact — rr + l·2^-g without
        // rounding, l scaled without loss — else it is left undecided.
        const double ls = dw::scale2(l, static_cast<int>(-g));
        const dd t = dw::two_sum(rr, ls);
        if (t.lo != 0 || dw::scale2(ls, static_cast<int>(g)) != l) return false;
        yr = std::fmod(y0, 2.0) == 0 ? y0 : y0 + (ts > 0 ? 1.0 : -1.0);
    } else if (!(std::fabs(ts) + bs <= half_gap - 0x1p-50)) {
        return false;
    }
    if (yr == 0) {
        if (!(std::fabs(l) + b <= 0.5 * std::fabs(h))) return false;
        out = h > 0 ? 0.0 : -0.0;
        return true;
    }
    const double y = dw::scale2(yr, static_cast<int>(q));  // exact: yr has ≤ p bits (or is 2^p), q ≥ min − p + 1
    if (std::fabs(y) > f.max_finite) return false;
    out = y;
    return true;
}

}  // namespace attnref::fast
