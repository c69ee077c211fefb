#pragma once
/// \file core/math.hpp
/// Owns: the constexpr elementary functions (exp, log, log1p, expm1, sqrt, tanh). The precision and
/// exponent range of float and double come from binary_format.hpp's encodings.
/// attnref's own constexpr elementary functions: attnref::math::{exp, log, log1p, expm1, sqrt, tanh}.
///
/// Why attnref has its own: a reference implementation must give the same bits whether a value is
/// computed during constant evaluation or at run time. std::exp is not constexpr before C++26 (GCC
/// folds it as an extension, Clang 14 refuses), and where it does fold, the compiler's folding (MPFR,
/// correctly rounded) and the run-time libm need not agree. The kernels below are plain IEEE
/// arithmetic (+ - * /, comparisons, conversions to int, std::bit_cast for float and double), so a
/// conforming compiler evaluates them to the same bits in both contexts. This requires
/// -ffp-contract=off (attnref's CMake target sets it), and round-to-nearest at run time.
///
/// Dispatch, for each function f:
///   - BuiltinFloatingPoint T (float, double, long double, __float128): attnref's kernel
///     detail::f_kernel<T>, at compile time and at run time alike (never std::f).
///   - WrapsBuiltinFloatingPoint T (e.g. Boost's float128): wrap(f(unwrap(x))).
///   - any other T: `using std::f; return f(x);` so that ADL finds the type's own function
///     (Boost.Multiprecision, MPFR/MPFI wrappers).
///
/// Algorithms (one generic body per function, parametrised by the format's precision p, emin, emax):
///   exp    x = (128 m + j) ln2/128 + r, |r| <= ln2/256 (three-part Cody–Waite constant);
///          exp(x) = 2^m · 2^(j/128) · exp(r); 2^(j/128) from a 128-entry table held as hi + lo
///          (built at compile time in double-length arithmetic); exp(r) − 1 by a Taylor polynomial
///          whose degree is chosen per type; one final rounding of hi + lo, then an exact scaling by
///          2^m (subnormal results are rounded once, directly to the subnormal grid).
///   expm1  the same reduction, with 2^m · (table + table · p) − 1 accumulated in double-length
///          arithmetic (exact products by Dekker/Veltkamp), so there is no cancellation loss.
///   log    x = 2^e · f, f in [√½, √2); s = (f − 1)/(f + 1) in double-length arithmetic;
///          log f = 2 atanh s = 2s + s³·(2/3 + 2/5 s² + …); e·ln2 added with a split constant.
///   log1p  1 + x formed exactly as hi + lo, then the log kernel on that double-length input.
///   sqrt   Newton iterations from a linear guess on [1, 4), then one correction step using the
///          exact residual f − y² (Dekker product): correctly rounded except in rare near-ties.
///   tanh   E = expm1(2|x|) as a double-length value, tanh = E/(E + 2) by double-length division.
///
/// Constants are computed in T, never passed through long double: ln2 is the exact sum of twelve
/// double literals of ≤ 24 significant bits each (so each is exact even in float), 288 bits in all;
/// everything else (Cody–Waite splits, table, coefficients) is derived from it at compile time.
/// See detail::ln2_pieces for provenance; tests/runtime/math.test.cpp checks the sum against MPFR.
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "attnref/core/binary_format.hpp"
#include "attnref/core/double_double.hpp"
#include "attnref/core/scalar.hpp"

namespace attnref::math {

namespace detail {

// ---------------------------------------------------------------------------------------------
// Binary format facts. p: significand bits; a normal x satisfies 2^emin <= |x| < 2^(emax+1).
// float and double take them from their encodings (binary_format.hpp); long double and __float128
// have no encoding there (x87's explicit leading bit, no 128-bit storage integer).
template <class T>
struct format;
template <class Encoding>
struct format_of_encoding {
    static constexpr int p = Encoding::digits, emin = Encoding::min_exponent, emax = Encoding::max_exponent;
    using bits = typename Encoding::storage;
};
template <>
struct format<float> : format_of_encoding<encoding::binary32> {};
template <>
struct format<double> : format_of_encoding<encoding::binary64> {};
template <>
struct format<long double> {
    static constexpr int p = std::numeric_limits<long double>::digits;
    static constexpr int emin = std::numeric_limits<long double>::min_exponent - 1;
    static constexpr int emax = std::numeric_limits<long double>::max_exponent - 1;
};
#if defined(__SIZEOF_FLOAT128__)
template <>
struct format<__float128> {
    static constexpr int p = 113, emin = -16382, emax = 16383;
};
#endif

/// float and double: bit patterns via std::bit_cast (constexpr on GCC 12 and Clang 14).
/// long double (padding bits) and __float128 (no standard 128-bit integer): exact arithmetic scaling.
template <class T>
concept BitCastable = std::is_same_v<T, float> || std::is_same_v<T, double>;

// ---------------------------------------------------------------------------------------------
// Exact powers of two.

/// 2^(±2^i) for i = 0..14, built by repeated squaring (exact: every value is a power of two inside
/// the format's range; 2^(2^14) is never formed because it overflows every format here).
template <class T>
struct power_table {
    std::array<T, 15> up{};    // 2^(2^i), valid while 2^i <= emax
    std::array<T, 15> down{};  // 2^(-2^i), valid while -2^i >= emin - p + 1
};
template <class T>
constexpr power_table<T> make_power_table() {
    power_table<T> t;
    T u = T(2);
    T d = T(0.5);
    for (int i = 0; i < 15; ++i) {
        const int n = 1 << i;
        t.up[static_cast<std::size_t>(i)] = n <= format<T>::emax ? u : T(0);
        t.down[static_cast<std::size_t>(i)] = -n >= format<T>::emin - format<T>::p + 1 ? d : T(0);
        if (2 * n <= format<T>::emax) u = u * u;
        if (-2 * n >= format<T>::emin - format<T>::p + 1) d = d * d;
    }
    return t;
}
template <class T>
inline constexpr power_table<T> power_table_v = make_power_table<T>();

/// 2^e exactly, for emin - p + 1 <= e <= emax (subnormal powers included).
template <class T>
constexpr T pow2(int e) {
    constexpr int p = format<T>::p;
    if constexpr (BitCastable<T>) {
        using U = typename format<T>::bits;
        constexpr int bias = format<T>::emax;
        if (e >= format<T>::emin) return std::bit_cast<T>(static_cast<U>(static_cast<U>(e + bias) << (p - 1)));
        return std::bit_cast<T>(static_cast<U>(U(1) << (e - format<T>::emin + p - 1)));
    } else {
        // Multiply the table entries of the set bits of |e|, largest first; every partial product is
        // a power of two between 1 and 2^e, hence representable, so every product is exact.
        const auto& t = power_table_v<T>;
        T r = T(1);
        unsigned n = static_cast<unsigned>(e < 0 ? -e : e);
        for (int i = 14; i >= 0; --i) {
            if (n & (1u << i)) r = r * (e < 0 ? t.down[static_cast<std::size_t>(i)] : t.up[static_cast<std::size_t>(i)]);
        }
        return r;
    }
}

/// For finite x > 0: f in [1, 2) and e with x = f · 2^e exactly.
template <class T>
struct decomposed {
    T f;
    int e;
};
template <class T>
constexpr decomposed<T> decompose(T x) {
    constexpr int p = format<T>::p;
    int e = 0;
    if (x < pow2<T>(format<T>::emin)) {  // subnormal: scale into the normal range (exact)
        x = x * pow2<T>(p);
        e = -p;
    }
    if constexpr (BitCastable<T>) {
        using U = typename format<T>::bits;
        constexpr int bias = format<T>::emax;
        const U bits = std::bit_cast<U>(x);
        const int biased = static_cast<int>(bits >> (p - 1));  // x > 0: no sign bit
        const U mantissa = bits & ((U(1) << (p - 1)) - 1);
        return {std::bit_cast<T>(static_cast<U>(mantissa | (static_cast<U>(bias) << (p - 1)))), e + biased - bias};
    } else {
        // Binary search on the exponent with exact power-of-two scalings.
        const auto& t = power_table_v<T>;
        for (int i = 13; i >= 0; --i) {
            const int n = 1 << i;
            if (n <= format<T>::emax && x >= t.up[static_cast<std::size_t>(i)]) {
                x = x * t.down[static_cast<std::size_t>(i)];
                e += n;
            }
        }
        for (int i = 13; i >= 0; --i) {  // now x < 2; bring it to [1, 2)
            const int n = 1 << i;
            if (n <= format<T>::emax && x < T(2) * t.down[static_cast<std::size_t>(i)]) {
                x = x * t.up[static_cast<std::size_t>(i)];
                e -= n;
            }
        }
        return {x, e};
    }
}

// ---------------------------------------------------------------------------------------------
// Error-free transformations and double-length ("dd") arithmetic in T. Valid without FMA, with
// round-to-nearest and no contraction; the products assume no overflow/underflow of partial terms.

/// The double-word type and its error-free sums are double_double.hpp's (one type for attnref).
template <class T>
using dd = dw::double_word<T>;
using dw::fast_two_sum;
using dw::two_sum;
/// Veltkamp split: a == hi + lo, hi has at most p - s significant bits.
template <class T>
constexpr dd<T> split(T a, int s) {
    const T c = (pow2<T>(s) + T(1)) * a;
    const T hi = c - (c - a);
    return {hi, a - hi};
}
/// Dekker's TwoProduct: p + e == a · b exactly, p = fl(a · b).
template <class T>
constexpr dd<T> two_prod(T a, T b) {
    constexpr int s = (format<T>::p + 1) / 2;
    const T prod = a * b;
    const dd<T> as = split(a, s);
    const dd<T> bs = split(b, s);
    const T err = ((as.hi * bs.hi - prod) + as.hi * bs.lo + as.lo * bs.hi) + as.lo * bs.lo;
    return {prod, err};
}
template <class T>
constexpr dd<T> dd_add(dd<T> a, dd<T> b) {
    const dd<T> s = two_sum(a.hi, b.hi);
    return fast_two_sum(s.hi, s.lo + (a.lo + b.lo));
}
template <class T>
constexpr dd<T> dd_mul(dd<T> a, dd<T> b) {
    const dd<T> p = two_prod(a.hi, b.hi);
    return fast_two_sum(p.hi, p.lo + (a.hi * b.lo + a.lo * b.hi));
}
template <class T>
constexpr dd<T> dd_div_int(dd<T> a, int n) {
    const T d = T(n);
    const T q1 = a.hi / d;
    const dd<T> back = two_prod(q1, d);
    const T q2 = (((a.hi - back.hi) - back.lo) + a.lo) / d;
    return fast_two_sum(q1, q2);
}
/// (n.hi + n.lo) / (d.hi + d.lo) to about 2p bits.
template <class T>
constexpr dd<T> dd_div(dd<T> n, dd<T> d) {
    const T q1 = n.hi / d.hi;
    const dd<T> back = two_prod(q1, d.hi);
    const T rem = (((n.hi - back.hi) - back.lo) + n.lo) - q1 * d.lo;
    return fast_two_sum(q1, rem / d.hi);
}

// ---------------------------------------------------------------------------------------------
// Constants.

/// ln 2 as an exact sum of twelve doubles, each with at most 24 significant bits (so each literal is
/// exact in float, double, x87 long double and binary128), together 288 bits. Derivation: with MPFR
/// at 600 bits, c = log(2); repeat 12 times { piece = c rounded to nearest with 24 bits; c -= piece }.
/// The test (math.test.cpp, "constants") checks ln2_v<T> against MPFR's log(2) for every type.
inline constexpr std::array<double, 12> ln2_pieces = {
    0x1.62e43p-1,    -0x1.05c61p-29,  -0x1.950d88p-54,  0x1.d9cc02p-79,   -0x1.a12a18p-109, 0x1.e6864cp-137,
    0x1.ca62d8p-162, 0x1.6c5068p-187, 0x1.75b8bap-212, 0x1.5f457cp-237, 0x1.ee1d88p-262, 0x1.b7aeb2p-290};

/// Sum of the pieces in T, smallest first, in dd arithmetic: ln2 to about 2p bits (relative 2^(1-2p)).
/// Pieces below T's subnormal range round to zero on conversion, which loses nothing at 2p bits.
template <class T>
constexpr dd<T> make_ln2() {
    dd<T> s{T(0), T(0)};
    for (std::size_t i = ln2_pieces.size(); i-- > 0;) s = dd_add(s, dd<T>{static_cast<T>(ln2_pieces[i]), T(0)});
    return s;
}
template <class T>
inline constexpr dd<T> ln2_v = make_ln2<T>();

/// Number of bits needed for |n|.
constexpr int bit_width_of(long n) {
    int b = 0;
    for (unsigned long u = static_cast<unsigned long>(n < 0 ? -n : n); u != 0; u >>= 1) ++b;
    return b;
}

/// A constant c split for Cody–Waite reduction by an integer multiplier k with |k| < 2^kbits:
/// c == c1 + c2 + c3 to about 2p bits; c1 and c2 have at most p - kbits significant bits each, so
/// k·c1 and k·c2 are exact; only k·c3 (below 2^-(2p-2kbits) of k·c) is rounded.
template <class T>
struct cody_waite {
    T c1, c2, c3;
};
template <class T>
constexpr cody_waite<T> make_cody_waite(dd<T> c, int kbits) {
    const dd<T> s1 = split(c.hi, kbits);
    const dd<T> rest = two_sum(s1.lo, c.lo);
    const dd<T> s2 = split(rest.hi, kbits);
    return {s1.hi, s2.hi, s2.lo + rest.lo};
}

inline constexpr int exp_table_bits = 7;
inline constexpr int exp_table_size = 1 << exp_table_bits;  // N = 128

/// Per-type constants of the kernels, all derived in T from ln2_v<T>.
template <class T>
struct constants {
    static constexpr int p = format<T>::p, emin = format<T>::emin, emax = format<T>::emax;
    static constexpr dd<T> ln2 = ln2_v<T>;
    /// ln2/N split for exp's reduction; |k| <= (emax - emin + p + 8)·N.
    static constexpr cody_waite<T> ln2_over_n = make_cody_waite<T>(
        dd<T>{ln2.hi / T(exp_table_size), ln2.lo / T(exp_table_size)},
        bit_width_of(static_cast<long>(emax - emin + p + 8) * exp_table_size));
    /// ln2 split for log's e·ln2, |e| <= emax - emin + p.
    static constexpr cody_waite<T> ln2_split = make_cody_waite<T>(ln2, bit_width_of(emax - emin + p));
    static constexpr T n_over_ln2 = T(exp_table_size) / ln2.hi;
    /// Rounds a |z| < 2^(p-2) to an integer: (z + shifter) - shifter.
    static constexpr T shifter = pow2<T>(p - 1) + pow2<T>(p - 2);
    /// exp(x) > 2^(emax+1) (overflow) above, < 2^(emin-p-1) (rounds to 0) below.
    static constexpr T exp_overflow = T(emax + 1) * ln2.hi;
    static constexpr T exp_underflow = T(emin - p - 1) * ln2.hi;
    static constexpr T expm1_large = T(emax - 2) * ln2.hi;   // above: expm1(x) = exp(x) after rounding
    static constexpr T expm1_minus_one = -T(p + 2) * ln2.hi;  // below: expm1(x) rounds to -1
    static constexpr T tiny = pow2<T>(-p);                    // below: expm1/log1p return x
    static constexpr T exp_tiny = pow2<T>(-p - 1);            // below: exp returns 1 + x
    static constexpr T tanh_tiny = pow2<T>(-(p / 2 + 1));     // below: tanh(x) rounds to x
    /// Above: 1 - tanh(x) < 2·e^(-2x) < 2^-(p+1), tanh rounds to 1. 0.35 > ln2/2.
    static constexpr T tanh_saturation = T(p + 3) * T(0.35);
    static constexpr T sqrt2 = T(1.4142135623730951);  // any value near √2 works: it bounds |s| in log
};

/// Degree d of the Taylor polynomial for exp(r) - 1 on |r| <= ln2/256: the first omitted term
/// r^(d+1)/(d+1)! is below 2^-(p+16) so that expm1's result, which can be as small as ln2/256 when
/// the table index is non-zero, keeps its relative accuracy.
template <class T>
constexpr int exp_degree() {
    const double r = 0.6931471805599453 / (2 * exp_table_size);
    double term = r;
    int n = 1;
    double bound = 1;
    for (int i = 0; i < format<T>::p + 16; ++i) bound /= 2;
    while (term >= bound) {
        ++n;
        term = term * r / n;
    }
    return n - 1;
}
/// Q(r) = sum_{n=2}^{d} r^(n-2)/n!, coefficients 1/n! rounded once in T (relative error 2^-p on
/// terms that are at most r/2 of the result: negligible).
template <class T>
constexpr std::array<T, exp_degree<T>() - 1> make_exp_coefficients() {
    std::array<T, exp_degree<T>() - 1> c{};
    for (int n = 2; n <= exp_degree<T>(); ++n) {
        // 1/n! computed in dd then rounded: correctly rounded up to a negligible double rounding.
        dd<T> f{T(1), T(0)};
        for (int i = 2; i <= n; ++i) f = dd_div_int(f, i);
        c[static_cast<std::size_t>(n - 2)] = f.hi;
    }
    return c;
}
template <class T>
inline constexpr auto exp_coefficients_v = make_exp_coefficients<T>();

/// Table 2^(j/N), j = 0..N-1, as hi + lo. E = 2^(1/N) = exp(ln2/N) by a Taylor series in dd, then
/// 2^(j/N) = 2^((j-1)/N) · E in dd: relative error about j·2^(2-2p), far below 2^-(p+10).
template <class T>
struct exp_table {
    std::array<T, exp_table_size> hi{};
    std::array<T, exp_table_size> lo{};
};
template <class T>
constexpr exp_table<T> make_exp_table() {
    const dd<T> y{ln2_v<T>.hi / T(exp_table_size), ln2_v<T>.lo / T(exp_table_size)};
    dd<T> e{T(1), T(0)};
    dd<T> term{T(1), T(0)};
    const T stop = pow2<T>(-2 * format<T>::p - 8);
    for (int n = 1; n < 200 && (term.hi > stop || n == 1); ++n) {
        term = dd_div_int(dd_mul(term, y), n);
        e = dd_add(e, term);
    }
    exp_table<T> t;
    dd<T> v{T(1), T(0)};
    for (int j = 0; j < exp_table_size; ++j) {
        t.hi[static_cast<std::size_t>(j)] = v.hi;
        t.lo[static_cast<std::size_t>(j)] = v.lo;
        v = dd_mul(v, e);
    }
    return t;
}
template <class T>
inline constexpr exp_table<T> exp_table_v = make_exp_table<T>();

/// log: number of atanh series terms n such that s²^(n+1)/(2n+3) < 2^-(p+8) for s² <= 0.0295.
template <class T>
constexpr int log_terms() {
    double s2n = 0.0295;
    int n = 1;
    double bound = 1;
    for (int i = 0; i < format<T>::p + 8; ++i) bound /= 2;
    while (s2n * 0.0295 / (2 * n + 3) >= bound) {
        s2n *= 0.0295;
        ++n;
    }
    return n;
}
/// R(s²) = sum_{i=1}^{n} 2/(2i+1) · s²^(i-1); coefficients rounded once in T.
template <class T>
constexpr std::array<T, log_terms<T>()> make_log_coefficients() {
    std::array<T, log_terms<T>()> c{};
    for (int i = 1; i <= log_terms<T>(); ++i) c[static_cast<std::size_t>(i - 1)] = dd_div_int(dd<T>{T(2), T(0)}, 2 * i + 1).hi;
    return c;
}
template <class T>
inline constexpr auto log_coefficients_v = make_log_coefficients<T>();

// ---------------------------------------------------------------------------------------------
// Kernels.

/// exp(x) = 2^m · (hi + lo), hi = 2^(j/N) rounded, |lo| < 0.006·hi. Also returns the pieces that
/// expm1 needs: table lo, and exp(r) - 1 as p_hi + p_lo (p_hi = r_hi).
template <class T>
struct exp_reduced {
    int m;
    T table_hi, table_lo;
    T p_hi, p_lo;
};
/// Requires exp_underflow <= x <= exp_overflow (so |k| fits the Cody–Waite split).
template <class T>
constexpr exp_reduced<T> exp_reduce(T x) {
    using C = constants<T>;
    const T kf = (x * C::n_over_ln2 + C::shifter) - C::shifter;
    const int k = static_cast<int>(kf);
    // r = x - k·(c1 + c2 + c3) as r_hi + r_lo: k·c1 and k·c2 are exact, the subtractions are
    // error-free (Cody–Waite, TwoSum); only k·c3 is rounded. k·c3 is not negligible for float
    // (c1 and c2 have only 8 bits there), so it is subtracted from r_hi, not just added to r_lo.
    const T r1 = x - kf * C::ln2_over_n.c1;
    const dd<T> r2 = two_sum(r1, -(kf * C::ln2_over_n.c2));
    const dd<T> r = two_sum(r2.hi, -(kf * C::ln2_over_n.c3));
    const T r_lo = r.lo + r2.lo;
    const auto& c = exp_coefficients_v<T>;
    T q = c[c.size() - 1];
    for (std::size_t i = c.size() - 1; i-- > 0;) q = c[i] + r.hi * q;
    const T p_lo = r_lo + r.hi * r.hi * q;
    const int j = k & (exp_table_size - 1);
    const int m = k >> exp_table_bits;  // arithmetic shift (C++20): floor(k / N)
    const auto& t = exp_table_v<T>;
    return {m, t.hi[static_cast<std::size_t>(j)], t.lo[static_cast<std::size_t>(j)], r.hi, p_lo};
}

template <class T>
constexpr T exp_kernel(T x) {
    using C = constants<T>;
    if (is_nan(x)) return x;
    if (x > C::exp_overflow) return infinity<T>();
    if (x < C::exp_underflow) return T(0);
    if ((x < T(0) ? -x : x) < C::exp_tiny) return T(1) + x;
    const exp_reduced<T> e = exp_reduce(x);
    const T hi = e.table_hi;
    // 2^(j/N)·exp(r) = hi + (lo + hi·p): hi·p is below 0.006·hi, so its rounding costs < 0.01 ulp.
    const T lo = e.table_lo + hi * (e.p_hi + e.p_lo);
    if (e.m > C::emin || (e.m == C::emin && hi + lo >= T(1))) {
        const T y = hi + lo;  // the one rounding; y in [0.99, 1.995)
        if (e.m > C::emax) return y >= T(1) ? infinity<T>() : (y + y) * pow2<T>(C::emax);
        return y * pow2<T>(e.m);
    }
    // Subnormal result: round (hi + lo)·2^m once, directly onto the subnormal grid. With
    // s = m - emin <= 0, w = (hi + lo)·2^s < 1 and 1 + w has ulp 2^(1-p), the grid scaled by 2^-emin.
    const T scale = pow2<T>(e.m - C::emin);
    const T hs = hi * scale;
    const T ls = lo * scale;
    const T t = T(1) + hs;
    const T err = (T(1) - t) + hs;  // Fast2Sum, 1 >= hs
    const T t2 = t + (err + ls);
    return (t2 - T(1)) * pow2<T>(C::emin);
}

/// expm1 as an unrounded double-length value (for tanh); requires tiny <= |x| and
/// expm1_minus_one <= x <= expm1_large.
template <class T>
constexpr dd<T> expm1_dd(T x) {
    const exp_reduced<T> e = exp_reduce(x);
    // 2^m·(th + tl)·(1 + p) - 1 with p = p_hi + p_lo:
    //   = [th·2^m - 1] + [th·p_hi]·2^m + [th·p_lo + tl·(1 + p)]·2^m
    const dd<T> b = two_prod(e.table_hi, e.p_hi);
    const T b_lo = b.lo + e.table_hi * e.p_lo + e.table_lo * (T(1) + e.p_hi);
    const T scale = pow2<T>(e.m);
    const dd<T> a = two_sum(e.table_hi * scale, T(-1));  // th·2^m exact: 2^m is a normal power
    const dd<T> s = two_sum(a.hi, b.hi * scale);
    return fast_two_sum(s.hi, s.lo + (a.lo + b_lo * scale));
}

template <class T>
constexpr T expm1_kernel(T x) {
    using C = constants<T>;
    if (is_nan(x)) return x;
    if ((x < T(0) ? -x : x) < C::tiny) return x;  // expm1(x) = x + x²/2 + ..., x²/2 < ulp(x)/2
    if (x > C::expm1_large) return exp_kernel(x);
    if (x < C::expm1_minus_one) return T(-1);
    const dd<T> r = expm1_dd(x);
    return r.hi + r.lo;
}

/// log(2^e · (f_hi + f_lo)) as double-length, for f_hi in [√½, √2] and |f_lo| <= ulp(f_hi).
template <class T>
constexpr dd<T> log_dd(int e, T f_hi, T f_lo) {
    using C = constants<T>;
    const dd<T> num = two_sum(f_hi - T(1), f_lo);  // f_hi - 1 is exact (Sterbenz)
    dd<T> den = two_sum(f_hi, T(1));
    den = fast_two_sum(den.hi, den.lo + f_lo);
    const dd<T> s = dd_div(num, den);  // |s| <= 0.1716
    const T s2 = s.hi * s.hi;
    const auto& c = log_coefficients_v<T>;
    T q = c[c.size() - 1];
    for (std::size_t i = c.size() - 1; i-- > 0;) q = c[i] + s2 * q;
    const T tail = (s.lo + s.lo) + s.hi * s2 * q;  // 2s_lo + s³·R(s²)
    const T ef = T(e);
    const dd<T> h = two_sum(ef * C::ln2_split.c1, s.hi + s.hi);  // e·c1 exact, 2s_hi exact
    return fast_two_sum(h.hi, h.lo + (tail + (ef * C::ln2_split.c2 + ef * C::ln2_split.c3)));
}

template <class T>
constexpr T log_kernel(T x) {
    using C = constants<T>;
    if (is_nan(x)) return x;
    if (x < T(0)) return quiet_NaN<T>();
    if (x == T(0)) return -infinity<T>();
    if (x == infinity<T>()) return x;
    decomposed<T> d = decompose(x);
    if (d.f > C::sqrt2) {
        d.f = d.f * T(0.5);
        ++d.e;
    }
    const dd<T> r = log_dd(d.e, d.f, T(0));
    return r.hi + r.lo;
}

template <class T>
constexpr T log1p_kernel(T x) {
    using C = constants<T>;
    if (is_nan(x)) return x;
    if (x < T(-1)) return quiet_NaN<T>();
    if (x == T(-1)) return -infinity<T>();
    if (x == infinity<T>()) return x;
    if ((x < T(0) ? -x : x) < C::tiny) return x;  // log1p(x) = x - x²/2 + ..., x²/2 < ulp(x)/2
    const dd<T> u = x > T(1) ? fast_two_sum(x, T(1)) : fast_two_sum(T(1), x);  // 1 + x exactly
    decomposed<T> d = decompose(u.hi);
    if (d.f > C::sqrt2) {
        d.f = d.f * T(0.5);
        ++d.e;
    }
    // u.lo · 2^-e (|e| <= emax + 1): exact unless it drops below T's subnormal range, where it is
    // far below the result's ulp anyway.
    const T f_lo = u.lo * pow2<T>(-d.e);
    const dd<T> r = log_dd(d.e, d.f, f_lo);
    return r.hi + r.lo;
}

template <class T>
constexpr T sqrt_kernel(T x) {
    if (is_nan(x) || x == T(0) || x == infinity<T>()) return x;  // sqrt(±0) = ±0
    if (x < T(0)) return quiet_NaN<T>();
    decomposed<T> d = decompose(x);
    if (d.e % 2 != 0) {  // make e even, f in [1, 4)
        d.f = d.f + d.f;
        --d.e;
    }
    const T f = d.f;
    T y = T(1) + (f - T(1)) / T(3);  // chord of √f on [1, 4): relative error < 6%
    // Newton: relative error 0.06 -> 0.0018 -> 1.6e-6 -> 1.3e-12 -> 8e-25 -> 3e-49.
    constexpr int iterations = format<T>::p <= 24 ? 3 : format<T>::p <= 53 ? 4 : 5;
    for (int i = 0; i < iterations; ++i) y = T(0.5) * (y + f / y);
    // One correction with the exact residual f - y² (Sterbenz: f - y²_hi is exact).
    const dd<T> yy = two_prod(y, y);
    const T residual = (f - yy.hi) - yy.lo;
    y = y + residual / (y + y);
    return y * pow2<T>(d.e / 2);
}

template <class T>
constexpr T tanh_kernel(T x) {
    using C = constants<T>;
    if (is_nan(x)) return x;
    const bool negative = x < T(0);
    const T a = negative ? -x : x;
    if (a < C::tanh_tiny) return x;  // tanh(x) = x - x³/3 + ..., rounds to x; keeps ±0
    if (a > C::tanh_saturation) return negative ? T(-1) : T(1);
    const dd<T> e = expm1_dd(a + a);                                   // E = e^(2a) - 1
    const dd<T> den = two_sum(e.hi, T(2));
    const dd<T> d = fast_two_sum(den.hi, den.lo + e.lo);  // E + 2
    const dd<T> q = dd_div(e, d);
    const T t = q.hi + q.lo;
    return negative ? -t : t;
}

}  // namespace detail

/// Each function below, for T = float, double, long double (x87 80-bit), __float128: the max error
/// quoted is measured and asserted by tests/runtime/math.test.cpp — float over all 2^32 inputs
/// (ctest `math_exhaustive_float`: log and log1p by default, all six with
/// ATTNREF_MATH_EXHAUSTIVE=all; against glibc's double functions, whose error adds < 4e-9 float ulp,
/// worst points re-checked against MPFR), the other types against MPFR at 256 bits on 10^6 sampled
/// points per function (`math_full`; the default run samples 10^6 double, 10^5 long double, 3·10^4
/// __float128 points). Each number is the largest measured, rounded up to 10^-4; sampled maxima are
/// lower bounds of the true maxima. The contract is <= 1 ulp everywhere, and results are identical at
/// compile time and run time. Speed (GCC 12 -O3, one core): exp<double> about 75-80 M calls/s, log<double> about 21 M/s.
/// For class types wrapping a builtin (WrapsBuiltinFloatingPoint) the same kernel runs; for
/// other types the type's own function is used (found by ADL) and its accuracy is the type's.

#define ATTNREF_MATH_DISPATCH(fn)                                                 \
    if constexpr (BuiltinFloatingPoint<T>) {                                      \
        return detail::fn##_kernel<std::remove_cv_t<T>>(x);                       \
    } else if constexpr (WrapsBuiltinFloatingPoint<T>) {                          \
        return scalar_traits<T>::wrap(math::fn(scalar_traits<T>::unwrap(x)));     \
    } else {                                                                      \
        using std::fn;                                                            \
        return fn(x);                                                             \
    }

/// e^x. Max error measured: 0.5066 ulp (float 0.5066 exhaustive, double 0.5053, long double 0.5051,
/// __float128 0.5056).
/// Domain: all x.
/// Special values: exp(NaN) = NaN, exp(+inf) = +inf, exp(-inf) = +0, exp(±0) = 1; overflow to +inf
/// above ln(max); results below the normal range are rounded once onto the subnormal grid, and
/// underflow to +0 below ln(min subnormal / 2).
/// Example: `static_assert(attnref::math::exp(0.0) == 1.0);`
template <class T> constexpr T exp(const T& x) { ATTNREF_MATH_DISPATCH(exp) }

/// Natural logarithm. Max error measured: 0.5322 ulp (float 0.5322 exhaustive, double 0.5190,
/// long double 0.5225, __float128 0.5228). Domain: x >= 0 (subnormal x included).
/// Special values: log(NaN) = NaN, log(x < 0) = NaN, log(±0) = -inf, log(+inf) = +inf, log(1) = +0.
template <class T> constexpr T log(const T& x) { ATTNREF_MATH_DISPATCH(log) }

/// log(1 + x), accurate for small x. Max error measured: 0.5327 ulp (float 0.5327 exhaustive,
/// double 0.5283, long double 0.5257, __float128 0.5219). Domain: x >= -1.
/// Special values: log1p(NaN) = NaN, log1p(x < -1) = NaN, log1p(-1) = -inf, log1p(+inf) = +inf,
/// log1p(x) = x exactly for |x| < 2^-p (keeps ±0 and subnormals).
template <class T> constexpr T log1p(const T& x) { ATTNREF_MATH_DISPATCH(log1p) }

/// e^x - 1, accurate for small x. Max error measured: 0.5051 ulp (float 0.5051 exhaustive,
/// double 0.5014, long double 0.5006, __float128 0.5003). Domain: all x.
/// Special values: expm1(NaN) = NaN, expm1(+inf) = +inf, expm1(-inf) = -1, expm1(x) = x exactly for
/// |x| < 2^-p (keeps ±0 and subnormals), -1 for x < -(p+2)·ln2, +inf above ln(max).
template <class T> constexpr T expm1(const T& x) { ATTNREF_MATH_DISPATCH(expm1) }

/// Square root. Max error measured: 0.5000 ulp (correctly rounded on every tested point, and on
/// every float; not proven correctly rounded in general). Domain: x >= 0.
/// Special values: sqrt(NaN) = NaN, sqrt(x < 0) = NaN, sqrt(±0) = ±0, sqrt(+inf) = +inf.
template <class T> constexpr T sqrt(const T& x) { ATTNREF_MATH_DISPATCH(sqrt) }

/// Hyperbolic tangent. Max error measured: 0.5024 ulp (float 0.5024 exhaustive, double 0.5021,
/// long double 0.5011, __float128 0.5006). Domain: all x. Odd: tanh(-x) == -tanh(x) bitwise.
/// Special values: tanh(NaN) = NaN, tanh(±inf) = ±1, tanh(±0) = ±0, tanh(x) = x for
/// |x| < 2^-(p/2+1), ±1 for |x| > 0.35·(p+3) (where 1 - tanh(x) < 2^-(p+1)).
template <class T> constexpr T tanh(const T& x) { ATTNREF_MATH_DISPATCH(tanh) }

#undef ATTNREF_MATH_DISPATCH

}  // namespace attnref::math
