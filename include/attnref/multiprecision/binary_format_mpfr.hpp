#pragma once
/// \file multiprecision/binary_format_mpfr.hpp
/// Owns: rounding an MPFR number to a binary format (format_description, binary_format.hpp), the
/// MPFR half of "rounding to a format" (the double half is binary_format.hpp's round_to). Kept
/// apart so that a format's description does not pull in MPFR.

#include <limits>

#include <mpfr.h>

#include "attnref/core/binary_format.hpp"

namespace attnref {

/// x rounded to nearest, ties to even, in `f` (subnormals kept; beyond max_finite + half an ulp:
/// ±inf), returned as the exact double value. NaN → quiet NaN. Formats of at most 53 bits within
/// double's exponent range (every format_description of binary_format.hpp).
inline double round_to(mpfr_srcptr x, const format_description& f) {
    if (mpfr_nan_p(x)) return std::numeric_limits<double>::quiet_NaN();
    if (mpfr_inf_p(x)) return mpfr_sgn(x) > 0 ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
    if (mpfr_zero_p(x)) return 0.0;
    // |x| = m · 2^e with m in [1/2, 1): floor(log2 |x|) = e − 1. Quantum 2^q of the result's grid.
    const long e = static_cast<long>(mpfr_get_exp(x)) - 1;
    const long q = (e > f.min_exponent ? e : f.min_exponent) - (f.precision - 1);
    mpfr_t y;
    mpfr_init2(y, mpfr_get_prec(x));
    mpfr_mul_2si(y, x, -q, MPFR_RNDN);  // exact: only the exponent changes
    mpfr_rint(y, y, MPFR_RNDN);          // nearest integer, ties to even
    mpfr_mul_2si(y, y, q, MPFR_RNDN);    // exact
    const double r = mpfr_get_d(y, MPFR_RNDN);  // exact: at most p ≤ 53 bits, in double's range
    mpfr_clear(y);
    if (r > f.max_finite) return std::numeric_limits<double>::infinity();
    if (r < -f.max_finite) return -std::numeric_limits<double>::infinity();
    return r == 0 ? 0.0 : r;
}
inline double round_to(mpfr_srcptr x, binary_format f) { return round_to(x, describe(f)); }

}  // namespace attnref
