#pragma once
/// \file certify/fast/constants.hpp
/// Double-word constants of the fast certified path from 256-bit MPFR values: ln 2, 1/i! (i ≤ 10),
/// 2^(j/64) (j < 64) and 1/√n, each with relative error ≤ 2^-105 (docs/fast-certify.md (4)).

#include <cstddef>

#include <mpfr.h>

#include "attnref/core/double_double.hpp"

namespace attnref::fast::detail {

using dw::dd;

/// A double-word from a 256-bit MPFR value: hi = RN(x), lo = RN(x − hi); |x − (hi + lo)| ≤
/// 2^-105·|x| (4).
inline dd dd_of(mpfr_srcptr x) {
    mpfr_t r;
    mpfr_init2(r, 256);
    const double hi = mpfr_get_d(x, MPFR_RNDN);
    mpfr_sub_d(r, x, hi, MPFR_RNDN);
    const double lo = mpfr_get_d(r, MPFR_RNDN);
    mpfr_clear(r);
    return dw::fast_two_sum(hi, lo);
}

struct constants {
    dd ln2;
    double ln2_64_c1 = 0, ln2_64_c2 = 0;  ///< ln 2/64 = c1 + c2 + c3: c1, c2 of 36 bits (K·c exact for |K| < 2^17) (6a)
    dd ln2_64_c3;                          ///< the rest, as a double-word (relative error ≤ 2^-105)
    dd inv_fact[11];    ///< 1/i!, i = 0 … 10
    dd exp2_table[64];  ///< 2^(j/64), j = 0 … 63 (6)
};

inline const constants& consts() {
    static const constants c = [] {
        constants k{};
        mpfr_t x;
        mpfr_init2(x, 256);
        mpfr_const_log2(x, MPFR_RNDN);
        k.ln2 = dd_of(x);
        {  // Cody–Waite split of ln 2/64 (6a)
            mpfr_t l64, part;
            mpfr_init2(l64, 256);
            mpfr_init2(part, 36);
            mpfr_div_2ui(l64, x, 6, MPFR_RNDN);  // exact
            mpfr_set(part, l64, MPFR_RNDN);
            k.ln2_64_c1 = mpfr_get_d(part, MPFR_RNDN);  // exact: 36 bits
            mpfr_sub(l64, l64, part, MPFR_RNDN);       // exact at 256 bits
            mpfr_set(part, l64, MPFR_RNDN);
            k.ln2_64_c2 = mpfr_get_d(part, MPFR_RNDN);
            mpfr_sub(l64, l64, part, MPFR_RNDN);
            k.ln2_64_c3 = dd_of(l64);
            mpfr_clear(l64);
            mpfr_clear(part);
        }
        mpfr_set_ui(x, 1, MPFR_RNDN);
        for (int i = 0; i < 11; ++i) {
            if (i > 0) mpfr_div_ui(x, x, static_cast<unsigned long>(i), MPFR_RNDN);
            k.inv_fact[i] = dd_of(x);
        }
        for (int j = 0; j < 64; ++j) {
            mpfr_set_si(x, j, MPFR_RNDN);
            mpfr_div_2ui(x, x, 6, MPFR_RNDN);  // j/64, exact
            mpfr_exp2(x, x, MPFR_RNDN);
            k.exp2_table[j] = dd_of(x);
        }
        mpfr_clear(x);
        mpfr_free_cache2(MPFR_FREE_LOCAL_CACHE);  // ln 2's cache, in whichever thread got here first
        return k;
    }();
    return c;
}

/// 1/√n as a double-word, relative error ≤ 2^-105 (4).
inline dd inv_sqrt(std::size_t n) {
    mpfr_t x;
    mpfr_init2(x, 256);
    mpfr_set_ui(x, static_cast<unsigned long>(n), MPFR_RNDN);
    mpfr_rec_sqrt(x, x, MPFR_RNDN);
    const dd r = dd_of(x);
    mpfr_clear(x);
    return r;
}

/// One column j of (5), the reference order of operations (the AVX2 kernel below performs the

}  // namespace attnref::fast::detail
