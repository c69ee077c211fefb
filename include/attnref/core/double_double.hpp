#pragma once
/// \file core/double_double.hpp
/// Double-word ("double-double") arithmetic: the one double-word type of attnref, `double_word<T>`
/// (hi + lo in any binary format T; `dd` = double_word<double>), and the generic error-free sums.
/// math.hpp's constexpr kernels use the type and the sums with their own FMA-free products (any T);
/// the fast certified path (certify/fast/) uses the double operations below with stated error
/// bounds. Owns: the error-free transformations TwoSum, Fast2Sum (constexpr, any T), TwoProd for
/// double (explicit std::fma; implicit contraction stays off), the double-word operations, the
/// per-operation relative error constant dd_eta, and `up` (an upward-safe evaluation of a
/// nonnegative bound). Standard library only.
///
/// A double-word value x = hi + lo (exact sum of two doubles, |lo| ≤ ulp(hi)/2 after
/// normalisation). Bounds, u = 2^-53, no underflow or overflow in any intermediate (the callers
/// keep every magnitude in [2^-900, 2^60] or exactly 0, docs/fast-certify.md (1)):
///   two_sum(a, b)      s + e = a + b exactly (Knuth; 6 additions).
///   fast_two_sum(a, b) s + e = a + b exactly when a = 0 or exponent(a) ≥ exponent(b) (Dekker).
///   two_prod(a, b)     p + e = a·b exactly (e = fma(a, b, −p)).
///   add(x, y)          Joldes, Muller & Popescu 2017 ("Tight and rigorous error bounds for basic
///                      building blocks of double-word arithmetic", ACM TOMS 44(2)), Algorithm 6
///                      (AccurateDWPlusDW): relative error ≤ 3u² + 13u³.
///   mul(x, y)          JMP 2017 Algorithm 12 (DWTimesDW3, with FMA): relative error ≤ 5u².
///   mul(x, d)          JMP 2017 Algorithm 9 (DWTimesFP3, with FMA): relative error ≤ 2u².
/// Also exact helpers without library calls: scale2 (= ldexp), exponent_of (= ilogb).
/// dd_eta = 2^-100 = 64u² bounds all three (docs/fast-certify.md (2)); no division is used (the
/// reciprocal is bounded a posteriori, fast_certify.hpp).

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace attnref::dw {

/// x = hi + lo, the exact sum of two values of T.
template <class T>
struct double_word {
    T hi = T(0);
    T lo = T(0);
};
using dd = double_word<double>;

/// Relative error bound of one add / mul (docs/fast-certify.md (2)).
inline constexpr double dd_eta = 0x1p-100;

/// Knuth's TwoSum: s + e == a + b exactly, s = RN(a + b).
template <class T>
constexpr double_word<T> two_sum(T a, T b) {
    const T s = a + b;
    const T bb = s - a;
    const T e = (a - (s - bb)) + (b - bb);
    return {s, e};
}

/// Dekker's Fast2Sum: s + e == a + b exactly when a == 0 or exponent(a) ≥ exponent(b).
template <class T>
constexpr double_word<T> fast_two_sum(T a, T b) {
    const T s = a + b;
    const T e = b - (s - a);
    return {s, e};
}

inline dd two_prod(double a, double b) {
    const double p = a * b;
    return {p, std::fma(a, b, -p)};
}

/// JMP 2017 Algorithm 6.
inline dd add(dd x, dd y) {
    const dd s = two_sum(x.hi, y.hi);
    const dd t = two_sum(x.lo, y.lo);
    const double c = s.lo + t.hi;
    const dd v = fast_two_sum(s.hi, c);
    const double w = t.lo + v.lo;
    return fast_two_sum(v.hi, w);
}

inline dd neg(dd x) { return {-x.hi, -x.lo}; }
inline dd sub(dd x, dd y) { return add(x, neg(y)); }

/// JMP 2017 Algorithm 12.
inline dd mul(dd x, dd y) {
    const dd c = two_prod(x.hi, y.hi);
    const double tl0 = x.lo * y.lo;
    const double tl1 = std::fma(x.hi, y.lo, tl0);
    const double cl2 = std::fma(x.lo, y.hi, tl1);
    const double cl3 = c.lo + cl2;
    return fast_two_sum(c.hi, cl3);
}

/// JMP 2017 Algorithm 9.
inline dd mul(dd x, double y) {
    const dd c = two_prod(x.hi, y);
    const double cl3 = std::fma(x.lo, y, c.lo);
    return fast_two_sum(c.hi, cl3);
}

/// An upper bound of |x| for a normalised double-word (|lo| ≤ ulp(hi)/2 ≤ u|hi|).
inline double mag(dd x) { return std::fabs(x.hi) * (1 + 0x1p-52); }

/// The value of a bound expression evaluated in round-to-nearest with at most 32 operations on
/// nonnegative operands (additions and multiplications only), made safe upward: the exact value is
/// at most computed·(1 − u)^-32 ≤ computed·(1 + 2^-46); underflowed intermediates lose at most
/// 2^-1074 each, covered by an absolute 2^-1000 while they are multiplied by factors below 2^60
/// (docs/fast-certify.md (3)). The result RN(RN(c·(1 + 2^-45)) + 2^-999) is at least
/// c·(1 + 2^-46) + 2^-1000 (3'), so no directed rounding or nextafter is needed.
inline double up(double computed) {
    if (!(computed < std::numeric_limits<double>::infinity())) return std::numeric_limits<double>::infinity();
    return computed * (1 + 0x1p-45) + 0x1p-999;
}

/// ⌊log₂|x|⌋ for finite x ≠ 0, the same value as std::ilogb(x), read from the exponent field for
/// normal x (no library call).
inline int exponent_of(double x) {
    const int biased = static_cast<int>((std::bit_cast<std::uint64_t>(x) >> 52) & 0x7ff);
    return biased != 0 ? biased - 1023 : std::ilogb(x);
}

/// x·2^k, the same value as std::ldexp(x, k) (a multiplication by an exact power of two rounds
/// once, as ldexp does, when the result is subnormal), without the library call for
/// −1022 ≤ k ≤ 1023.
inline double scale2(double x, long k) {
    if (k < -1022 || k > 1023) return std::ldexp(x, static_cast<int>(k));
    return x * std::bit_cast<double>(static_cast<std::uint64_t>(k + 1023) << 52);
}

/// A bound accumulated as a sum of n ≥ 0 nonnegative terms in round-to-nearest (each term itself
/// an `up` value): the exact sum is at most computed·(1 − u)^-(n+1) ≤ computed·(1 + (n + 2)·2^-52)
/// for n ≤ 2^40; then `up` (docs/fast-certify.md (3)).
inline double sum_up(double computed, std::size_t n) {
    return up(computed * (1 + (static_cast<double>(n) + 2) * 0x1p-52));
}

}  // namespace attnref::dw
