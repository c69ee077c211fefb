// Compile-only tests of attnref::math: every line is evaluated by the compiler (GCC via the
// attnref_static_tests object library, Clang 14 via `clang++ -fsyntax-only` in ctest).
#include <bit>
#include <cstdint>

#include "attnref/core/math.hpp"

namespace {

namespace math = attnref::math;

template <class T>
constexpr T abs_value(T x) {
    return x < T(0) ? -x : x;
}
/// |a - b| <= n ulps of b (b normal).
template <class T>
constexpr bool within_ulps(T a, T b, int n) {
    const auto d = attnref::math::detail::decompose(abs_value(b));
    return abs_value(a - b) <= T(n) * attnref::math::detail::pow2<T>(d.e - attnref::math::detail::format<T>::p + 1);
}
template <class T>
constexpr bool is_nan(T x) {
    return !(x == x);
}

template <class T>
constexpr bool basic_identities() {
    const T inf = attnref::infinity<T>();
    bool ok = math::exp(T(0)) == T(1) && math::log(T(1)) == T(0) && math::sqrt(T(4)) == T(2) &&
              math::sqrt(T(9)) == T(3) && math::expm1(T(0)) == T(0) && math::log1p(T(0)) == T(0) &&
              math::tanh(T(0)) == T(0);
    // exp(log(x)) within 2 ulp of x (each function < 1 ulp; exp amplifies log's error by |log x| ulps of
    // log x relative, so keep |log x| small).
    for (const T x : {T(0.25), T(0.7), T(1.5), T(2), T(3), T(10)}) ok = ok && within_ulps(math::exp(math::log(x)), x, 2);
    for (const T x : {T(0.001), T(0.5), T(1), T(-0.3)}) ok = ok && within_ulps(math::log1p(math::expm1(x)), x, 2);
    // Known values against double literals: within 1 ulp of T for float, of double otherwise.
    if constexpr (attnref::math::detail::format<T>::p <= 24) {
        ok = ok && within_ulps(math::exp(T(1)), T(2.718281828459045), 1) && within_ulps(math::log(T(2)), T(0.6931471805599453), 1);
    } else {
        ok = ok && within_ulps(static_cast<double>(math::exp(T(1))), 2.718281828459045, 1) &&
             within_ulps(static_cast<double>(math::log(T(2))), 0.6931471805599453, 1);
    }
    // Special values.
    ok = ok && math::exp(inf) == inf && math::exp(-inf) == T(0) && math::log(T(0)) == -inf && math::log(inf) == inf;
    ok = ok && is_nan(math::log(T(-1))) && is_nan(math::sqrt(T(-1))) && is_nan(math::log1p(T(-2)));
    ok = ok && math::log1p(T(-1)) == -inf && math::expm1(-inf) == T(-1) && math::tanh(inf) == T(1) && math::tanh(-inf) == T(-1);
    ok = ok && math::exp(T(100000)) == inf && math::exp(T(-100000)) == T(0);
    // tanh is odd; tanh saturates to ±1.
    for (const T x : {T(0.001), T(0.3), T(1), T(4), T(15)}) ok = ok && math::tanh(-x) == -math::tanh(x);
    ok = ok && math::tanh(T(100)) == T(1);
    // Monotonic around 1 for log, around 0 for exp.
    ok = ok && math::log(T(0.999)) < T(0) && T(0) < math::log(T(1.001)) && math::exp(T(-0.001)) < T(1) && T(1) < math::exp(T(0.001));
    return ok;
}

static_assert(basic_identities<float>() && basic_identities<double>() && basic_identities<long double>());
#if defined(__SIZEOF_FLOAT128__)
static_assert(basic_identities<__float128>());
#endif

// Signed zeros and subnormals (float/double, where std::bit_cast reads the sign bit).
static_assert(std::bit_cast<std::uint64_t>(math::expm1(-0.0)) == std::bit_cast<std::uint64_t>(-0.0));
static_assert(std::bit_cast<std::uint64_t>(math::log1p(-0.0)) == std::bit_cast<std::uint64_t>(-0.0));
static_assert(std::bit_cast<std::uint64_t>(math::tanh(-0.0)) == std::bit_cast<std::uint64_t>(-0.0));
static_assert(std::bit_cast<std::uint64_t>(math::sqrt(-0.0)) == std::bit_cast<std::uint64_t>(-0.0));
static_assert(std::bit_cast<std::uint32_t>(math::tanh(-0.0f)) == std::bit_cast<std::uint32_t>(-0.0f));
static_assert(math::exp(-745.0) == 0x1p-1074);            // rounds to the smallest subnormal
static_assert(math::exp(-746.0) == 0.0);                  // below half of it
static_assert(math::sqrt(0x1p-1074) == 0x1p-537);         // subnormal argument
static_assert(math::log(0x1p-1074) < -744.4 && math::log(0x1p-1074) > -744.5);
static_assert(math::exp(709.78) < attnref::infinity<double>() &&
              math::exp(709.79) == attnref::infinity<double>());  // ln(max) = 709.7827
static_assert(math::expm1(1e-300) == 1e-300 && math::log1p(1e-300) == 1e-300);
static_assert(math::exp(-103.0f) > 0.0f && math::exp(-104.0f) == 0.0f);  // ln(2^-150) = -103.97

}  // namespace
