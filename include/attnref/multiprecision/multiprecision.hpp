#pragma once
/// \file multiprecision/multiprecision.hpp
/// Boost.Multiprecision glue, kept out of the core's include graph. Link MPFR, MPFI and GMP (and
/// libquadmath with GCC); CMake: attnref::multiprecision.
///
/// Types (all with expression templates off, so `acc = acc + a*b` rounds the product and the sum
/// separately exactly as it does for double — with them on, Boost may fuse it into one mpfr_fma):
///   attnref::float128               Boost's float128 (GCC; wraps __float128, a literal type — the
///                                   constexpr math kernels run on it)
///   attnref::bin_float<Digits10>     cpp_bin_float, e.g. bin_float_50 (not a literal type)
///   attnref::mpfr_real<Digits10>     MPFR, correctly rounded elementary functions
///   attnref::mpfr_interval<Digits10> MPFI intervals: every operation returns an interval that
///                                   encloses the exact result, so the computed output encloses
///                                   the exact attention output
/// Use the fixed-precision types with threads > 1 (see parallel.hpp).

#include <string_view>

#include <boost/multiprecision/cpp_bin_float.hpp>
#include <boost/multiprecision/mpfi.hpp>
#include <boost/multiprecision/mpfr.hpp>
#if defined(__GNUC__) && !defined(__clang__) && defined(__SIZEOF_FLOAT128__)
#include <boost/multiprecision/float128.hpp>
#define ATTNREF_HAS_BOOST_FLOAT128 1
#endif

#include "attnref/core/scalar.hpp"

namespace attnref {

template <unsigned Digits10>
using bin_float = boost::multiprecision::number<boost::multiprecision::cpp_bin_float<Digits10>,
                                                boost::multiprecision::et_off>;
using bin_float_50 = bin_float<50>;
template <unsigned Digits10>
using mpfr_real = boost::multiprecision::number<boost::multiprecision::mpfr_float_backend<Digits10>,
                                                boost::multiprecision::et_off>;
template <unsigned Digits10>
using mpfr_interval = boost::multiprecision::number<boost::multiprecision::mpfi_float_backend<Digits10>,
                                                    boost::multiprecision::et_off>;

template <unsigned D>
struct scalar_traits<bin_float<D>> {
    static constexpr int digits = std::numeric_limits<bin_float<D>>::digits;
    static bin_float<D> epsilon() { return std::numeric_limits<bin_float<D>>::epsilon(); }
    static constexpr std::string_view name = "cpp_bin_float";
};
template <unsigned D>
struct scalar_traits<mpfr_real<D>> {
    static constexpr int digits = std::numeric_limits<mpfr_real<D>>::digits;
    static mpfr_real<D> epsilon() { return std::numeric_limits<mpfr_real<D>>::epsilon(); }
    static constexpr std::string_view name = "mpfr";
};
template <unsigned D>
struct scalar_traits<mpfr_interval<D>> {
    static constexpr int digits = std::numeric_limits<mpfr_interval<D>>::digits;
    static mpfr_interval<D> epsilon() { return std::numeric_limits<mpfr_interval<D>>::epsilon(); }
    static constexpr std::string_view name = "mpfi";
};

#ifdef ATTNREF_HAS_BOOST_FLOAT128
using float128 = boost::multiprecision::float128;
template <>
struct scalar_traits<float128> {
    using builtin_type = __float128;
    static constexpr int digits = 113;
    static constexpr float128 epsilon() { return wrap(scalar_traits<__float128>::epsilon()); }
    static constexpr std::string_view name = "binary128";
    static constexpr float128 infinity() { return wrap(scalar_traits<__float128>::infinity()); }
    static constexpr float128 quiet_NaN() { return wrap(scalar_traits<__float128>::quiet_NaN()); }
    static constexpr __float128 unwrap(const float128& x) { return x.backend().value(); }
    static constexpr float128 wrap(__float128 x) { return float128(x); }
};
#endif

/// Softmax shift order for intervals: by upper end (mpfr_greater_p: total on non-NaN ends, false
/// with a NaN, never throws). Boost's own operator> throws on overlapping intervals; see scalar.hpp.
template <unsigned D>
struct shift_order<mpfr_interval<D>> {
    static bool greater(const mpfr_interval<D>& a, const mpfr_interval<D>& b) {
        return mpfr_greater_p(&a.backend().data()[0].right, &b.backend().data()[0].right) != 0;
    }
};

/// MPFR caches constants (log 2, π, …) per thread; free them when a worker thread ends.
template <unsigned D>
struct thread_cleanup<mpfr_real<D>> {
    static void run() { mpfr_free_cache2(MPFR_FREE_LOCAL_CACHE); }
};
template <unsigned D>
struct thread_cleanup<mpfr_interval<D>> {
    static void run() { mpfr_free_cache2(MPFR_FREE_LOCAL_CACHE); }
};

/// Lower and upper ends of an interval, as MPFR numbers of the same precision.
template <unsigned D>
mpfr_real<D> lower_end(const mpfr_interval<D>& x) {
    return mpfr_real<D>(boost::multiprecision::lower(x));
}
template <unsigned D>
mpfr_real<D> upper_end(const mpfr_interval<D>& x) {
    return mpfr_real<D>(boost::multiprecision::upper(x));
}
/// True if the interval contains the point.
template <unsigned D, class T>
bool encloses(const mpfr_interval<D>& x, const T& point) {
    return lower_end(x) <= point && point <= upper_end(x);
}

}  // namespace attnref
