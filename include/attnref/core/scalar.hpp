#pragma once
/// \file core/scalar.hpp
/// Owns: the Scalar concept, scalar_traits, and the per-type helpers built on them (unit_roundoff<T>).
/// The Scalar concept and per-type traits.
///
/// attnref's algorithms are written once, over a type parameter T. T is not restricted to
/// std::floating_point: Boost.Multiprecision numbers (float128, cpp_bin_float, mpfr_float, mpfi_float)
/// and the emulated storage formats (bfloat16, float16, fp8) are class types. What the algorithms
/// need from T is exactly what Scalar asks for: field arithmetic, ordering (used only to pick the
/// max shift, through shift_order, never to decide which keys are masked), construction from small
/// integers and from double, and explicit conversion back to double for reporting. Interval types
/// satisfy it too: every operation encloses, and no branch of the algorithms depends on an interval
/// comparison for correctness (the max shift may be any value; softmax is shift-invariant in exact
/// arithmetic; shift_order<interval> compares upper ends, so it never meets an ambiguous comparison).

#include <concepts>
#include <cstdint>
#include <limits>
#include <string_view>
#include <type_traits>

namespace attnref {

/// True for the hardware floating-point types whose arithmetic the compiler constant-evaluates:
/// float, double, long double and (GCC, Clang on x86-64) __float128.
template <class T>
concept BuiltinFloatingPoint = std::is_same_v<std::remove_cv_t<T>, float> ||
                               std::is_same_v<std::remove_cv_t<T>, double> ||
                               std::is_same_v<std::remove_cv_t<T>, long double>
#if defined(__SIZEOF_FLOAT128__)
                               || std::is_same_v<std::remove_cv_t<T>, __float128>
#endif
    ;

/// Per-type facts. Specialise for class types whose std::numeric_limits is missing or wrong.
/// - digits: significand precision p in bits (u = 2^-p is the unit roundoff).
/// - epsilon(): 2^(1-p), the distance from 1 to the next representable number.
/// - name: a stable human-readable name used in reports and manifests.
/// - builtin_type / unwrap / wrap (optional): for class types that wrap a BuiltinFloatingPoint
///   (Boost's float128), so that the constexpr math kernels can run on them.
/// The facts std::numeric_limits<T> holds (digits, epsilon, infinity, quiet NaN).
template <class T>
struct numeric_limits_traits {
    static constexpr int digits = std::numeric_limits<T>::digits;
    static constexpr T epsilon() { return std::numeric_limits<T>::epsilon(); }
    static constexpr T infinity() { return std::numeric_limits<T>::infinity(); }
    static constexpr T quiet_NaN() { return std::numeric_limits<T>::quiet_NaN(); }
};

template <class T>
struct scalar_traits : numeric_limits_traits<T> {
    static constexpr std::string_view name = "unnamed";
};
template <>
struct scalar_traits<float> : numeric_limits_traits<float> {
    static constexpr std::string_view name = "float32";
};
template <>
struct scalar_traits<double> : numeric_limits_traits<double> {
    static constexpr std::string_view name = "float64";
};
template <>
struct scalar_traits<long double> : numeric_limits_traits<long double> {
    static constexpr std::string_view name = std::numeric_limits<long double>::digits == 64 ? "x87_extended80"
                                             : std::numeric_limits<long double>::digits == 113 ? "binary128_long_double"
                                                                                              : "float64_long_double";
};
#if defined(__SIZEOF_FLOAT128__)
template <>
struct scalar_traits<__float128> {
    static constexpr __float128 infinity() { return static_cast<__float128>(__builtin_inf()); }
    static constexpr __float128 quiet_NaN() { return static_cast<__float128>(__builtin_nan("")); }
    static constexpr int digits = 113;
    static constexpr __float128 epsilon() {
        __float128 e = 1;
        for (int i = 0; i < 112; ++i) e /= 2;
        return e;
    }
    static constexpr std::string_view name = "binary128";
};
#endif

/// The requirements attnref's algorithms place on an arithmetic type; see the file comment.
template <class T>
concept Scalar = std::copyable<T> && requires(const T a, const T b, T c, double d, int i) {
    { a + b } -> std::convertible_to<T>;
    { a - b } -> std::convertible_to<T>;
    { a * b } -> std::convertible_to<T>;
    { a / b } -> std::convertible_to<T>;
    { -a } -> std::convertible_to<T>;
    { a < b } -> std::convertible_to<bool>;
    { a > b } -> std::convertible_to<bool>;
    T(d);
    T(i);
    static_cast<double>(a);
    { scalar_traits<T>::digits } -> std::convertible_to<int>;
};

/// True when scalar_traits<T> supplies unwrap/wrap to a BuiltinFloatingPoint (e.g. Boost float128).
template <class T>
concept WrapsBuiltinFloatingPoint = requires(const T x) {
    typename scalar_traits<T>::builtin_type;
    requires BuiltinFloatingPoint<typename scalar_traits<T>::builtin_type>;
    { scalar_traits<T>::unwrap(x) } -> std::same_as<typename scalar_traits<T>::builtin_type>;
    { scalar_traits<T>::wrap(typename scalar_traits<T>::builtin_type{}) } -> std::same_as<T>;
};

/// +inf of T: scalar_traits<T>::infinity() where the traits define it, else std::numeric_limits.
template <class T>
constexpr T infinity() {
    if constexpr (requires { scalar_traits<T>::infinity(); }) return scalar_traits<T>::infinity();
    else return std::numeric_limits<T>::infinity();
}
/// A quiet NaN of T (same lookup as infinity()).
template <class T>
constexpr T quiet_NaN() {
    if constexpr (requires { scalar_traits<T>::quiet_NaN(); }) return scalar_traits<T>::quiet_NaN();
    else return std::numeric_limits<T>::quiet_NaN();
}
/// The order the softmax uses to choose its shift m (the max logit). Softmax and lse are
/// shift-invariant in exact arithmetic, so any choice of m gives the same exact result; the order only
/// has to be total and never throw. For point types it is `a > b` (the first argmax, as before). An
/// interval type specialises it: comparing two overlapping intervals is ambiguous (Boost 1.74's MPFI
/// backend throws interval_error from a noexcept compare, i.e. calls std::terminate), so it compares
/// the upper ends instead (multiprecision.hpp), which is total and exception-free. Nothing else in
/// the forward pass compares values of T: masks are decided from integer and double data only.
template <class T>
struct shift_order {
    static constexpr bool greater(const T& a, const T& b) { return a > b; }
};

/// NaN test that needs only operator== (x ≠ x exactly for NaN); intervals with NaN ends included.
template <class T>
constexpr bool is_nan(const T& x) { return !(x == x); }

/// Per-thread teardown for arithmetic types that keep thread-local state (MPFR caches its constants
/// per thread): parallel_for runs thread_cleanup<T>::run() at the end of every worker thread it
/// starts. Specialised in multiprecision.hpp; nothing to do for the other types.
template <class T>
struct thread_cleanup {
    static void run() {}
};

/// Unit roundoff u = 2^-digits of T, computed in T.
template <Scalar T>
constexpr T unit_roundoff() {
    T u = T(1);
    for (int i = 0; i < scalar_traits<T>::digits; ++i) u = u / T(2);
    return u;
}

}  // namespace attnref
