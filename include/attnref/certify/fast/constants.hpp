#pragma once
/// \file certify/fast/constants.hpp
/// Double-word constants of the fast certified path from 256-bit MPFR values: ln 2, 1/i! (i ≤ 9)
/// and 1/√n, each with relative error ≤ 2^-105 (docs/fast-certify.md (4)).

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
    dd inv_fact[10];  ///< 1/i!, i = 0 … 9
};

inline const constants& consts() {
    static const constants c = [] {
        constants k{};
        mpfr_t x;
        mpfr_init2(x, 256);
        mpfr_const_log2(x, MPFR_RNDN);
        k.ln2 = dd_of(x);
        mpfr_set_ui(x, 1, MPFR_RNDN);
        for (int i = 0; i < 10; ++i) {
            if (i > 0) mpfr_div_ui(x, x, static_cast<unsigned long>(i), MPFR_RNDN);
            k.inv_fact[i] = dd_of(x);
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
