// Accuracy of attnref::math against MPFR (256 bits), special values, and compile-time == run-time.
//
// Point counts per function (Release; the sanitize build, ATTNREF_SANITIZE_BUILD, uses 1/100):
//   float 250'000, double 250'000, long double 100'000, __float128 30'000 — or 1'000'000 for
//   every type with ATTNREF_MATH_FULL=1 (ctest `math_full`, label exhaustive; CI's time budget takes
//   the smaller default) — (__float128 is software-emulated;
//   the MPFR reference, about 2-4 us per point at 256 bits, dominates the run time for all types).
// Each function's points are spread over several ranges (whole domain, the ranges softmax uses,
// tiny arguments, near overflow/underflow); the table printed at the end gives the max ulp per
// function per type, and the hardest points found (exact value closest to a rounding midpoint) are
// re-checked with their neighbours, and printed.
#define BOOST_TEST_MODULE math
#include <boost/test/unit_test.hpp>

#include <mpfr.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "attnref/core/math.hpp"

namespace math = attnref::math;
namespace detail = attnref::math::detail;

namespace {

#if defined(ATTNREF_SANITIZE_BUILD)
constexpr long point_divisor = 100;
#else
constexpr long point_divisor = 1;
#endif

using f128 = __float128;

// ATTNREF_MATH_FULL=1 (the ctest test `math_full`, label slow) takes 10^6 points per function for
// every type, long double and __float128 included.
template <class T>
long points_per_function() {
    const char* full = std::getenv("ATTNREF_MATH_FULL");
    if (full && std::string(full) == "1") return 1'000'000 / point_divisor;
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) return 250'000 / point_divisor;
    else if constexpr (std::is_same_v<T, long double>) return 100'000 / point_divisor;
    else return 30'000 / point_divisor;
}

template <class T>
const char* type_name() {
    if constexpr (std::is_same_v<T, float>) return "float";
    else if constexpr (std::is_same_v<T, double>) return "double";
    else if constexpr (std::is_same_v<T, long double>) return "long double";
    else return "__float128";
}

// ---- exact conversion T -> MPFR --------------------------------------------------------------
struct mp {
    mpfr_t v;
    mp() { mpfr_init2(v, 256); }
    ~mp() { mpfr_clear(v); }
    mp(const mp&) = delete;
    mp& operator=(const mp&) = delete;
};

void to_mpfr(mpfr_t r, float x) { mpfr_set_flt(r, x, MPFR_RNDN); }
void to_mpfr(mpfr_t r, double x) { mpfr_set_d(r, x, MPFR_RNDN); }
void to_mpfr(mpfr_t r, long double x) { mpfr_set_ld(r, x, MPFR_RNDN); }
/// binary128 from its bit fields (exact at 256 bits).
void to_mpfr(mpfr_t r, f128 x) {
    std::uint64_t w[2];
    static_assert(sizeof(w) == sizeof(x));
    std::memcpy(w, &x, sizeof(x));  // x86-64: little-endian, w[1] holds sign, exponent, top 48 bits
    const bool negative = (w[1] >> 63) != 0;
    const int biased = static_cast<int>((w[1] >> 48) & 0x7fff);
    std::uint64_t top = w[1] & ((std::uint64_t(1) << 48) - 1);
    if (biased == 0x7fff) {
        if (top != 0 || w[0] != 0) mpfr_set_nan(r);
        else mpfr_set_inf(r, negative ? -1 : 1);
        return;
    }
    if (biased != 0) top |= std::uint64_t(1) << 48;
    mpfr_set_ui(r, top, MPFR_RNDN);
    mpfr_mul_2ui(r, r, 64, MPFR_RNDN);
    mpfr_add_ui(r, r, w[0], MPFR_RNDN);
    mpfr_mul_2si(r, r, (biased == 0 ? 1 : biased) - 16383 - 112, MPFR_RNDN);
    if (negative) mpfr_neg(r, r, MPFR_RNDN);
}

template <class T>
bool is_nan(T x) {
    return !(x == x);
}
template <class T>
bool is_inf(T x) {
    return x == attnref::infinity<T>() || x == -attnref::infinity<T>();
}
template <class T>
bool sign_bit(T x) {
    if constexpr (std::is_same_v<T, f128>) {
        unsigned char b[sizeof(T)];
        std::memcpy(b, &x, sizeof(T));
        return (b[15] & 0x80) != 0;
    } else {
        return std::signbit(x);
    }
}
/// Bitwise equality of the value bits (x87 long double: 10 of its 16 bytes; the rest is padding).
template <class T>
bool same_bits(const T& a, const T& b) {
    constexpr std::size_t n = std::is_same_v<T, long double> && detail::format<T>::p == 64 ? 10 : sizeof(T);
    return std::memcmp(&a, &b, n) == 0;
}

enum class fn { exp, log, log1p, expm1, sqrt, tanh };
constexpr std::array<fn, 6> all_functions = {fn::exp, fn::log, fn::log1p, fn::expm1, fn::sqrt, fn::tanh};
const char* fn_name(fn f) {
    switch (f) {
        case fn::exp: return "exp";
        case fn::log: return "log";
        case fn::log1p: return "log1p";
        case fn::expm1: return "expm1";
        case fn::sqrt: return "sqrt";
        case fn::tanh: return "tanh";
    }
    return "?";
}
template <class T>
T evaluate(fn f, T x) {
    switch (f) {
        case fn::exp: return math::exp(x);
        case fn::log: return math::log(x);
        case fn::log1p: return math::log1p(x);
        case fn::expm1: return math::expm1(x);
        case fn::sqrt: return math::sqrt(x);
        case fn::tanh: return math::tanh(x);
    }
    return x;
}
void reference(fn f, mpfr_t y, const mpfr_t x) {
    switch (f) {
        case fn::exp: mpfr_exp(y, x, MPFR_RNDN); break;
        case fn::log: mpfr_log(y, x, MPFR_RNDN); break;
        case fn::log1p: mpfr_log1p(y, x, MPFR_RNDN); break;
        case fn::expm1: mpfr_expm1(y, x, MPFR_RNDN); break;
        case fn::sqrt: mpfr_sqrt(y, x, MPFR_RNDN); break;
        case fn::tanh: mpfr_tanh(y, x, MPFR_RNDN); break;
    }
}

/// Error of `computed` in ulps of T at the exact value's binade (subnormal binades have the fixed
/// ulp 2^(emin-p+1)). Also returns how close the exact value is to a rounding midpoint
/// (0 = on a midpoint, 0.5 = on a representable number), for the search for hard cases.
struct error_measure {
    double ulps;
    double midpoint_distance;
};
template <class T>
error_measure ulp_error(T computed, const mpfr_t exact) {
    constexpr int p = detail::format<T>::p, emin = detail::format<T>::emin, emax = detail::format<T>::emax;
    constexpr double bad = std::numeric_limits<double>::infinity();
    if (mpfr_nan_p(exact)) return {is_nan(computed) ? 0.0 : bad, 0.5};
    if (is_nan(computed)) return {bad, 0.5};
    if (mpfr_inf_p(exact)) return {is_inf(computed) && (computed > T(0)) == (mpfr_sgn(exact) > 0) ? 0.0 : bad, 0.5};
    if (mpfr_zero_p(exact)) return {computed == T(0) ? 0.0 : bad, 0.5};
    const long e = mpfr_get_exp(exact) - 1;  // exact in [2^e, 2^(e+1))
    static mp scaled, diff;                  // reused: allocation would cost as much as the rest
    if (is_inf(computed)) {
        // Correct iff |exact| >= (2 - 2^-p)·2^emax, the rounding boundary to infinity.
        mpfr_set_ui_2exp(scaled.v, 1, -p, MPFR_RNDN);
        mpfr_ui_sub(scaled.v, 2, scaled.v, MPFR_RNDN);
        mpfr_mul_2si(scaled.v, scaled.v, emax, MPFR_RNDN);
        mpfr_abs(diff.v, exact, MPFR_RNDN);
        const bool ok = mpfr_cmp(diff.v, scaled.v) >= 0 && (computed > T(0)) == (mpfr_sgn(exact) > 0);
        return {ok ? 0.0 : bad, 0.5};
    }
    const long ulp_exponent = (e < emin ? emin : e) - (p - 1);
    to_mpfr(diff.v, computed);
    mpfr_sub(diff.v, diff.v, exact, MPFR_RNDN);
    mpfr_mul_2si(diff.v, diff.v, -ulp_exponent, MPFR_RNDN);
    const double ulps = std::fabs(mpfr_get_d(diff.v, MPFR_RNDN));
    mpfr_mul_2si(scaled.v, exact, -ulp_exponent, MPFR_RNDN);
    mpfr_frac(scaled.v, scaled.v, MPFR_RNDN);
    const double frac = std::fabs(mpfr_get_d(scaled.v, MPFR_RNDN));
    return {ulps, std::fabs(frac - 0.5)};
}

// ---- sampling -------------------------------------------------------------------------------
template <class T>
T uniform01(std::mt19937_64& g) {
    constexpr int p = detail::format<T>::p;
    const int top = p < 64 ? p : 64;
    T u = T(g() >> (64 - top)) * detail::pow2<T>(-top);
    if (p > 64) u = u + T(g() >> (128 - p)) * detail::pow2<T>(-p);
    return u;  // in [0, 1), p random bits
}
template <class T>
T uniform(std::mt19937_64& g, T lo, T hi) {
    return lo + (hi - lo) * uniform01<T>(g);
}
/// (1 + u)·2^e, e uniform in [e_lo, e_hi], with a random sign when both_signs.
template <class T>
T log_uniform(std::mt19937_64& g, int e_lo, int e_hi, bool both_signs) {
    const int e = e_lo + static_cast<int>(g() % static_cast<std::uint64_t>(e_hi - e_lo + 1));
    constexpr int sub = detail::format<T>::emin - detail::format<T>::p + 1;
    T x = (T(1) + uniform01<T>(g)) * detail::pow2<T>(e < sub ? sub : e);
    return both_signs && (g() & 1) ? -x : x;
}

template <class T>
T ln2_approx() {
    return T(0.6931471805599453);
}

/// One sample for function f, drawing one of several ranges.
template <class T>
T sample(fn f, std::mt19937_64& g) {
    constexpr int p = detail::format<T>::p, emin = detail::format<T>::emin, emax = detail::format<T>::emax;
    const T ln2 = ln2_approx<T>();
    const T overflow = T(emax + 1) * ln2, underflow = T(emin - p - 1) * ln2;
    const unsigned pick = static_cast<unsigned>(g() % 100);
    switch (f) {
        case fn::exp:
            if (pick < 25) return uniform<T>(g, underflow - T(1), overflow + T(1));
            if (pick < 50) return std::is_same_v<T, float> ? uniform<T>(g, T(-110), T(0)) : uniform<T>(g, T(-750), T(0));
            if (pick < 60) return uniform<T>(g, overflow - T(2), overflow + T(0.01));
            if (pick < 70) return uniform<T>(g, underflow - T(0.5), T(emin) * ln2 + T(1));
            if (pick < 90) return log_uniform<T>(g, -p - 3, 2, true);
            return uniform<T>(g, T(-1), T(1));
        case fn::log:
            if (pick < 35) return log_uniform<T>(g, emin - p + 1, emax, false);
            if (pick < 60) return uniform<T>(g, T(1), T(1e6));
            if (pick < 80) return uniform<T>(g, T(0.5), T(2));
            return uniform<T>(g, T(1) - detail::pow2<T>(-10), T(1) + detail::pow2<T>(-10));
        case fn::log1p:
            if (pick < 25) return uniform<T>(g, T(0), T(1e4));
            if (pick < 50) return log_uniform<T>(g, -p - 4, -4, true);
            if (pick < 75) return uniform<T>(g, T(-1), T(1));
            if (pick < 90) return log_uniform<T>(g, 0, emax, false);
            return T(-1) + log_uniform<T>(g, -p, -2, false);
        case fn::expm1:
            if (pick < 30) return uniform<T>(g, T(-40), T(1));
            if (pick < 60) return log_uniform<T>(g, -p - 4, 0, true);
            if (pick < 80) return uniform<T>(g, -T(p + 4) * ln2, overflow + T(1));
            return uniform<T>(g, T(-1), T(1));
        case fn::sqrt:
            if (pick < 60) return log_uniform<T>(g, emin - p + 1, emax, false);
            return uniform<T>(g, T(0), T(4));
        case fn::tanh:
            if (pick < 40) return uniform<T>(g, T(-30), T(30));
            if (pick < 80) return log_uniform<T>(g, -p - 4, 5, true);
            return uniform<T>(g, T(-1), T(1));
    }
    return T(0);
}

template <class T>
struct sweep_result {
    double max_ulps = 0;
    T worst_x = T(0);
    long points = 0;
    std::vector<std::pair<double, T>> hardest;  // (midpoint distance, x), smallest first
};

template <class T>
double check_point(fn f, T x, mp& xm, mp& ym) {
    to_mpfr(xm.v, x);
    reference(f, ym.v, xm.v);
    return ulp_error<T>(evaluate(f, x), ym.v).ulps;
}

template <class T>
sweep_result<T> sweep(fn f, long n, std::uint64_t seed) {
    std::mt19937_64 g(seed);
    sweep_result<T> r;
    mp xm, ym;
    constexpr std::size_t keep = 4;
    for (long i = 0; i < n; ++i) {
        const T x = sample<T>(f, g);
        to_mpfr(xm.v, x);
        reference(f, ym.v, xm.v);
        const error_measure e = ulp_error<T>(evaluate(f, x), ym.v);
        ++r.points;
        if (!(e.ulps <= r.max_ulps)) {
            r.max_ulps = e.ulps;
            r.worst_x = x;
        }
        if (r.hardest.size() < keep || e.midpoint_distance < r.hardest.back().first) {
            if (r.hardest.size() == keep) r.hardest.pop_back();
            r.hardest.emplace_back(e.midpoint_distance, x);
            std::sort(r.hardest.begin(), r.hardest.end(),
                      [](const auto& a, const auto& b) { return a.first < b.first; });
        }
    }
    // Hard cases: the points whose exact value lies closest to a rounding midpoint, and their
    // neighbours a few ulps away (x·(1 ± k·2^-p)), are checked again.
    for (const auto& [distance, x] : r.hardest) {
        for (int k = -3; k <= 3; ++k) {
            const T y = x + x * T(k) * detail::pow2<T>(-detail::format<T>::p);
            const double u = check_point<T>(f, y, xm, ym);
            ++r.points;
            if (!(u <= r.max_ulps)) {
                r.max_ulps = u;
                r.worst_x = y;
            }
        }
    }
    return r;
}

std::string hex(double x) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%a", x);
    return buf;
}
template <class T>
std::string show(T x) {
    char buf[96];
    if constexpr (std::is_same_v<T, f128>) {
        const long double hi = static_cast<long double>(x);
        std::snprintf(buf, sizeof buf, "%.21Lg%+.3Lg", hi, static_cast<long double>(x - static_cast<f128>(hi)));
    } else {
        std::snprintf(buf, sizeof buf, "%.21Lg (%s)", static_cast<long double>(x), hex(static_cast<double>(x)).c_str());
    }
    return buf;
}

/// The maximum error each function documents in math.hpp (per type), asserted by the sampled sweep
/// below in the default run and in `math_full` (10^6 points for every type), and for float by the
/// exhaustive sweep over all 2^32 inputs (`math_exhaustive_float`). Each is the largest of those
/// measurements, rounded up to the next 10^-4.
template <class T>
double documented_max(fn f) {
    // Columns: exp, log, log1p, expm1, sqrt, tanh.
    std::array<double, 6> m{};
    if constexpr (std::is_same_v<T, float>) m = {0.5066, 0.5322, 0.5327, 0.5051, 0.5000, 0.5024};
    else if constexpr (std::is_same_v<T, double>) m = {0.5053, 0.5190, 0.5283, 0.5014, 0.5000, 0.5021};
    else if constexpr (std::is_same_v<T, long double>) m = {0.5051, 0.5225, 0.5257, 0.5006, 0.5000, 0.5011};
    else m = {0.5056, 0.5228, 0.5219, 0.5003, 0.5000, 0.5006};
    return m[static_cast<std::size_t>(f)];
}

template <class T>
void accuracy_for_type(std::uint64_t seed) {
    const auto start = std::chrono::steady_clock::now();
    std::string table;
    for (fn f : all_functions) {
        const auto t0 = std::chrono::steady_clock::now();
        const sweep_result<T> r = sweep<T>(f, points_per_function<T>(), seed + static_cast<std::uint64_t>(f));
        const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        char line[320];
        std::snprintf(line, sizeof line, "  %-6s %-12s max %.4f ulp over %ld points, %.1f s (worst at x = %s)\n",
                      fn_name(f), type_name<T>(), r.max_ulps, r.points, t, show(r.worst_x).c_str());
        table += line;
        std::string hard = "    hardest found (distance of exact value to a midpoint, in ulp):";
        for (const auto& [d, x] : r.hardest) {
            hard += ' ';
            hard += show(x);
            hard += " [";
            hard += hex(d);
            hard += ']';
        }
        table += hard;
        table += '\n';
        BOOST_TEST(r.max_ulps <= 1.0, fn_name(f) << "<" << type_name<T>() << ">: max " << r.max_ulps << " ulp at "
                                                  << show(r.worst_x));
        BOOST_TEST(r.max_ulps <= documented_max<T>(f), fn_name(f) << "<" << type_name<T>() << ">: max " << r.max_ulps
                                                                   << " ulp above the documented " << documented_max<T>(f));
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    BOOST_TEST_MESSAGE("max ulp error vs MPFR (256 bits), " << type_name<T>() << ", " << seconds << " s:\n" << table);
}

}  // namespace

// ---------------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(constants) {
    // ln2 built from the twelve pieces, per type, against MPFR: relative error below 2^(2-2p).
    mp ln2, v, t;
    mpfr_const_log2(ln2.v, MPFR_RNDN);
    auto check = [&](auto tag) {
        using T = decltype(tag);
        constexpr int p = detail::format<T>::p;
        const detail::dd<T> c = detail::ln2_v<T>;
        to_mpfr(v.v, c.hi);
        to_mpfr(t.v, c.lo);
        mpfr_add(v.v, v.v, t.v, MPFR_RNDN);
        mpfr_sub(v.v, v.v, ln2.v, MPFR_RNDN);
        mpfr_div(v.v, v.v, ln2.v, MPFR_RNDN);
        mpfr_mul_2si(v.v, v.v, 2 * p - 2, MPFR_RNDN);
        BOOST_TEST(std::fabs(mpfr_get_d(v.v, MPFR_RNDN)) <= 1.0, "ln2 in " << type_name<T>());
        // Cody–Waite parts of ln2/128: c1 + c2 + c3 == ln2/128 to 2p - 4 bits.
        const auto& cw = detail::constants<T>::ln2_over_n;
        to_mpfr(v.v, cw.c1);
        to_mpfr(t.v, cw.c2);
        mpfr_add(v.v, v.v, t.v, MPFR_RNDN);
        to_mpfr(t.v, cw.c3);
        mpfr_add(v.v, v.v, t.v, MPFR_RNDN);
        mpfr_mul_2ui(v.v, v.v, 7, MPFR_RNDN);
        mpfr_sub(v.v, v.v, ln2.v, MPFR_RNDN);
        mpfr_div(v.v, v.v, ln2.v, MPFR_RNDN);
        // c1 and c2 have p - kbits bits each (8 for float), so the split carries about
        // min(2p, 3p - 2·kbits) bits; k·(c1 + c2 + c3 - ln2/128) must stay far below 2^-p for
        // |k| < 2^kbits: 2^-(p+16) relative is ample (float: 2^-43.5 measured, kbits = 16).
        mpfr_mul_2si(v.v, v.v, p + 16, MPFR_RNDN);
        BOOST_TEST(std::fabs(mpfr_get_d(v.v, MPFR_RNDN)) <= 1.0, "ln2/128 split in " << type_name<T>());
        // Table 2^(j/128): hi + lo within 2^-(p+12) relative (the kernels need about 2^-(p+8); the
        // dd product chain gives about j·2^(2-2p), i.e. 2^-39 for float, far less for the others).
        const auto& table = detail::exp_table_v<T>;
        double worst = 0;
        for (int j = 0; j < detail::exp_table_size; ++j) {
            mp exact;
            mpfr_set_si(exact.v, j, MPFR_RNDN);
            mpfr_div_2ui(exact.v, exact.v, 7, MPFR_RNDN);
            mpfr_exp2(exact.v, exact.v, MPFR_RNDN);
            to_mpfr(v.v, table.hi[static_cast<std::size_t>(j)]);
            to_mpfr(t.v, table.lo[static_cast<std::size_t>(j)]);
            mpfr_add(v.v, v.v, t.v, MPFR_RNDN);
            mpfr_sub(v.v, v.v, exact.v, MPFR_RNDN);
            mpfr_div(v.v, v.v, exact.v, MPFR_RNDN);
            mpfr_mul_2si(v.v, v.v, p + 12, MPFR_RNDN);
            worst = std::max(worst, std::fabs(mpfr_get_d(v.v, MPFR_RNDN)));
        }
        BOOST_TEST(worst <= 1.0, "2^(j/128) table in " << type_name<T>());
    };
    check(float{});
    check(double{});
    check(static_cast<long double>(0));
    check(f128{});
}

BOOST_AUTO_TEST_CASE(accuracy_float) { accuracy_for_type<float>(1000); }
BOOST_AUTO_TEST_CASE(accuracy_double) { accuracy_for_type<double>(2000); }
BOOST_AUTO_TEST_CASE(accuracy_long_double) { accuracy_for_type<long double>(3000); }
BOOST_AUTO_TEST_CASE(accuracy_float128) { accuracy_for_type<f128>(4000); }

template <class T>
void special_values() {
    constexpr int p = detail::format<T>::p, emin = detail::format<T>::emin;
    const T inf = attnref::infinity<T>(), nan = attnref::quiet_NaN<T>();
    const T zero = T(0), minus_zero = -T(0);
    const T min_subnormal = detail::pow2<T>(emin - p + 1);
    const T big = T(100000), tiny = detail::pow2<T>(-p - 3);
    auto exactly = [](T got, T want) {
        if (is_nan(want)) return is_nan(got);
        return got == want && sign_bit(got) == sign_bit(want);
    };
    auto check = [&](const char* what, T got, T want) { BOOST_TEST(exactly(got, want), type_name<T>() << " " << what); };
    // exp
    check("exp(NaN)", math::exp(nan), nan);
    check("exp(+inf)", math::exp(inf), inf);
    check("exp(-inf)", math::exp(-inf), zero);
    check("exp(+0)", math::exp(zero), T(1));
    check("exp(-0)", math::exp(minus_zero), T(1));
    check("exp(overflow)", math::exp(big), inf);
    check("exp(underflow)", math::exp(-big), zero);
    // exp(x) is the smallest subnormal for x = ln(min_subnormal) (and rounds to it for x slightly less).
    const T ln_min_subnormal = T(emin - p + 1) * detail::ln2_v<T>.hi;
    check("exp(ln(min subnormal))", math::exp(ln_min_subnormal), min_subnormal);
    check("exp(ln(min subnormal) - 0.5)", math::exp(ln_min_subnormal - T(0.5)), min_subnormal);  // 0.6 of it
    check("exp(ln(min subnormal) - 0.8)", math::exp(ln_min_subnormal - T(0.8)), zero);           // 0.45 of it
    // log
    check("log(NaN)", math::log(nan), nan);
    check("log(-1)", math::log(T(-1)), nan);
    check("log(-inf)", math::log(-inf), nan);
    check("log(+0)", math::log(zero), -inf);
    check("log(-0)", math::log(minus_zero), -inf);
    check("log(+inf)", math::log(inf), inf);
    check("log(1)", math::log(T(1)), zero);
    // log1p
    check("log1p(NaN)", math::log1p(nan), nan);
    check("log1p(-1)", math::log1p(T(-1)), -inf);
    check("log1p(-2)", math::log1p(T(-2)), nan);
    check("log1p(-inf)", math::log1p(-inf), nan);
    check("log1p(+inf)", math::log1p(inf), inf);
    check("log1p(+0)", math::log1p(zero), zero);
    check("log1p(-0)", math::log1p(minus_zero), minus_zero);
    check("log1p(min subnormal)", math::log1p(min_subnormal), min_subnormal);
    check("log1p(tiny)", math::log1p(tiny), tiny);
    check("log1p(-tiny)", math::log1p(-tiny), -tiny);
    // expm1
    check("expm1(NaN)", math::expm1(nan), nan);
    check("expm1(+inf)", math::expm1(inf), inf);
    check("expm1(-inf)", math::expm1(-inf), T(-1));
    check("expm1(+0)", math::expm1(zero), zero);
    check("expm1(-0)", math::expm1(minus_zero), minus_zero);
    check("expm1(overflow)", math::expm1(big), inf);
    check("expm1(-big)", math::expm1(-big), T(-1));
    check("expm1(-min subnormal)", math::expm1(-min_subnormal), -min_subnormal);
    check("expm1(tiny)", math::expm1(tiny), tiny);
    // sqrt
    check("sqrt(NaN)", math::sqrt(nan), nan);
    check("sqrt(-1)", math::sqrt(T(-1)), nan);
    check("sqrt(-inf)", math::sqrt(-inf), nan);
    check("sqrt(+inf)", math::sqrt(inf), inf);
    check("sqrt(+0)", math::sqrt(zero), zero);
    check("sqrt(-0)", math::sqrt(minus_zero), minus_zero);
    check("sqrt(4)", math::sqrt(T(4)), T(2));
    const int even = ((emin - p + 1) % 2 == 0) ? emin - p + 1 : emin - p + 2;
    check("sqrt(2^even subnormal)", math::sqrt(detail::pow2<T>(even)), detail::pow2<T>(even / 2));
    // tanh
    check("tanh(NaN)", math::tanh(nan), nan);
    check("tanh(+inf)", math::tanh(inf), T(1));
    check("tanh(-inf)", math::tanh(-inf), T(-1));
    check("tanh(+0)", math::tanh(zero), zero);
    check("tanh(-0)", math::tanh(minus_zero), minus_zero);
    check("tanh(big)", math::tanh(big), T(1));
    check("tanh(-big)", math::tanh(-big), T(-1));
    check("tanh(-min subnormal)", math::tanh(-min_subnormal), -min_subnormal);
    std::mt19937_64 g(7);
    bool odd = true;
    for (int i = 0; i < 1000; ++i) {
        const T x = uniform<T>(g, T(0), T(25));
        odd = odd && same_bits(math::tanh(-x), -math::tanh(x));
    }
    BOOST_TEST(odd, type_name<T>() << " tanh(-x) == -tanh(x)");
}

BOOST_AUTO_TEST_CASE(special_values_all_types) {
    special_values<float>();
    special_values<double>();
    special_values<long double>();
    special_values<f128>();
}

// ---- compile time == run time ---------------------------------------------------------------

constexpr int identity_points = 240;  // per function per type

/// Arguments for function f: a deterministic spread over the function's interesting range, plus
/// the special values.
template <class T>
constexpr std::array<T, identity_points> identity_arguments(fn f) {
    std::array<T, identity_points> a{};
    std::uint64_t state = 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(f);
    constexpr int p = detail::format<T>::p, emin = detail::format<T>::emin, emax = detail::format<T>::emax;
    for (int i = 0; i < identity_points; ++i) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        const T u = T(static_cast<double>(state >> 11) * 0x1p-53);  // [0, 1)
        T x{};
        const int e = emin - p + 1 + static_cast<int>((state >> 3) % static_cast<std::uint64_t>(emax - emin + p));
        const T anywhere = (T(1) + u) * detail::pow2<T>(e);
        switch (f) {
            case fn::exp: x = i % 3 == 0 ? T(-750) * u : (i % 3 == 1 ? T(-20) + T(40) * u : T(emin - p) * u * T(0.7)); break;
            case fn::log: x = i % 2 == 0 ? anywhere : T(0.5) + u; break;
            case fn::log1p: x = i % 2 == 0 ? anywhere : T(-1) + T(2) * u; break;
            case fn::expm1: x = i % 2 == 0 ? T(-40) + T(41) * u : (u - T(0.5)) * detail::pow2<T>(-(i % 40)); break;
            case fn::sqrt: x = anywhere; break;
            case fn::tanh: x = i % 2 == 0 ? T(-30) + T(60) * u : (u - T(0.5)) * detail::pow2<T>(-(i % 40)); break;
        }
        a[static_cast<std::size_t>(i)] = x;
    }
    const T inf = attnref::infinity<T>();
    a[0] = T(0);
    a[1] = -T(0);
    a[2] = inf;
    a[3] = -inf;
    a[4] = attnref::quiet_NaN<T>();
    a[5] = T(1);
    a[6] = T(-1);
    a[7] = detail::pow2<T>(emin - p + 1);
    return a;
}

template <class T>
constexpr std::array<T, identity_points> apply_compile_time(fn f) {
    std::array<T, identity_points> a = identity_arguments<T>(f);
    std::array<T, identity_points> r{};
    for (std::size_t i = 0; i < a.size(); ++i) {
        switch (f) {
            case fn::exp: r[i] = math::exp(a[i]); break;
            case fn::log: r[i] = math::log(a[i]); break;
            case fn::log1p: r[i] = math::log1p(a[i]); break;
            case fn::expm1: r[i] = math::expm1(a[i]); break;
            case fn::sqrt: r[i] = math::sqrt(a[i]); break;
            case fn::tanh: r[i] = math::tanh(a[i]); break;
        }
    }
    return r;
}

template <class T>
struct compile_time_results {
    static constexpr std::array<T, identity_points> exp = apply_compile_time<T>(fn::exp);
    static constexpr std::array<T, identity_points> log = apply_compile_time<T>(fn::log);
    static constexpr std::array<T, identity_points> log1p = apply_compile_time<T>(fn::log1p);
    static constexpr std::array<T, identity_points> expm1 = apply_compile_time<T>(fn::expm1);
    static constexpr std::array<T, identity_points> sqrt = apply_compile_time<T>(fn::sqrt);
    static constexpr std::array<T, identity_points> tanh = apply_compile_time<T>(fn::tanh);
    static constexpr const std::array<T, identity_points>& of(fn f) {
        switch (f) {
            case fn::exp: return exp;
            case fn::log: return log;
            case fn::log1p: return log1p;
            case fn::expm1: return expm1;
            case fn::sqrt: return sqrt;
            case fn::tanh: return tanh;
        }
        return exp;
    }
};

template <class T>
void compile_time_equals_run_time() {
    for (fn f : all_functions) {
        const std::array<T, identity_points> args = identity_arguments<T>(f);
        const std::array<T, identity_points>& at_compile_time = compile_time_results<T>::of(f);
        int mismatches = 0;
        for (std::size_t i = 0; i < args.size(); ++i) {
            volatile T opaque = args[i];  // the run-time call cannot be folded
            const T x = opaque;
            const T at_run_time = evaluate(f, x);
            if (!same_bits(at_run_time, at_compile_time[i])) ++mismatches;
        }
        BOOST_TEST(mismatches == 0, fn_name(f) << "<" << type_name<T>() << ">: " << mismatches << " of "
                                               << identity_points << " differ between compile and run time");
    }
}

BOOST_AUTO_TEST_CASE(compile_time_equals_run_time_all_types) {
    compile_time_equals_run_time<float>();
    compile_time_equals_run_time<double>();
    compile_time_equals_run_time<long double>();
    compile_time_equals_run_time<f128>();
}

// ---- speed (printed, not asserted) ----------------------------------------------------------

template <class T>
void measure_speed(fn f, long n, T lo, T hi) {
    std::vector<T> xs(1024);
    std::mt19937_64 g(11);
    for (T& x : xs) x = uniform<T>(g, lo, hi);
    T sum = T(0);
    const auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < n; ++i) sum = sum + evaluate(f, xs[static_cast<std::size_t>(i) & 1023]);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    volatile T sink = sum;
    (void)sink;
    BOOST_TEST_MESSAGE("speed " << fn_name(f) << "<" << type_name<T>() << ">: " << n / seconds / 1e6
                                << " M calls/s (one core)");
}

BOOST_AUTO_TEST_CASE(speed) {
    const long n = 20'000'000 / point_divisor;
    measure_speed<double>(fn::exp, n, -50.0, 0.0);
    measure_speed<float>(fn::exp, n, -50.0f, 0.0f);
    measure_speed<double>(fn::log, n / 4, 1e-3, 1e3);
    measure_speed<double>(fn::tanh, n / 4, -5.0, 5.0);
    measure_speed<long double>(fn::exp, n / 10, -50.0L, 0.0L);
    measure_speed<f128>(fn::exp, n / 100, f128(-50), f128(0));
}

// ---- exhaustive float sweep (ctest `math_exhaustive_float`, label slow) ------------------------
//
// Every one of the 2^32 float bit patterns through each attnref::math function, against glibc's
// double function of the same (exactly converted) argument. The reference's own error: glibc 2.36
// documents at most 1 ulp (exp, log, log1p, expm1) and 2 ulps (tanh) of double on x86-64 and a
// correctly rounded sqrt (glibc manual, "Known Maximum Errors in Math Functions"); one double ulp is
// 2^-29 float ulps at the same binade (less for float subnormal results), so the reference moves the
// measured error by at most 2·2^-29 ≈ 3.7e-9 float ulps, far below 1e-6. The test does not take that
// on trust: it re-measures the worst points against MPFR at 256 bits (asserting the same maximum to
// 1e-6) and measures |glibc − MPFR| on 2^20 random floats per function (asserting < 1e-6 float ulp).
// Both cores, a strided split of the bit patterns. Disabled in the default run. Run time: all six
// functions took 254 (exp), 294 (log), 287 (log1p), 140 (expm1), 194 (sqrt), 259 s (tanh) on 2
// threads of this (heavily shared) 2-core machine, so the ctest job covers the two functions where
// the documented maximum matters most, log and log1p (the largest errors, and where 0.528 ulp was
// wrong); ATTNREF_MATH_EXHAUSTIVE=all runs all six.

namespace {

double glibc_reference(fn f, double x) {
    switch (f) {
        case fn::exp: return std::exp(x);
        case fn::log: return std::log(x);
        case fn::log1p: return std::log1p(x);
        case fn::expm1: return std::expm1(x);
        case fn::sqrt: return std::sqrt(x);
        case fn::tanh: return std::tanh(x);
    }
    return x;
}

/// Error of the float result y against the (double) reference r, in float ulps at r's binade;
/// special values: 0 when both are the same NaN/inf class (or y = ±inf and |r| is past float's
/// overflow boundary (2 − 2^-24)·2^127), +inf for any other mismatch.
double float_ulp_error(float y, double r) {
    constexpr double inf = std::numeric_limits<double>::infinity();
    if (std::isnan(r) || std::isnan(y)) return std::isnan(r) && std::isnan(y) ? 0.0 : inf;
    const double boundary = 0x1.ffffffp127;
    if (std::isinf(y)) return (std::fabs(r) >= boundary && (y > 0) == (r > 0)) ? 0.0 : inf;
    if (std::isinf(r)) return inf;
    int e = 0;
    std::frexp(r, &e);  // r in [2^(e-1), 2^e)
    const int ulp_exp = (r == 0 ? -126 : std::max(e - 1, -126)) - 23;
    return std::fabs((static_cast<double>(y) - r)) / std::ldexp(1.0, ulp_exp);
}

struct exhaustive_worst {
    double ulps = 0;
    std::uint32_t bits = 0;
};

double documented_float_max(fn f) { return documented_max<float>(f); }

}  // namespace

BOOST_AUTO_TEST_CASE(exhaustive_float, *boost::unit_test::disabled()) {
    const unsigned threads = 2;
    const char* which = std::getenv("ATTNREF_MATH_EXHAUSTIVE");
    const bool all = which && std::string(which) == "all";
    for (fn f : all_functions) {
        if (!all && f != fn::log && f != fn::log1p) continue;
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<exhaustive_worst> worst(threads);
        std::vector<std::thread> pool;
        for (unsigned t = 0; t < threads; ++t)
            pool.emplace_back([&, t] {
                exhaustive_worst w;
                // Blocks of 2^16 patterns, interleaved between the threads (costs differ by range).
                for (std::uint64_t block = t; block < (1ull << 16); block += threads)
                    for (std::uint64_t low = 0; low < (1ull << 16); ++low) {
                        const std::uint32_t bits = static_cast<std::uint32_t>((block << 16) | low);
                        float x;
                        std::memcpy(&x, &bits, sizeof x);
                        const double e = float_ulp_error(evaluate(f, x), glibc_reference(f, static_cast<double>(x)));
                        if (!(e <= w.ulps)) w = {e, bits};
                    }
                worst[t] = w;
            });
        for (std::thread& th : pool) th.join();
        exhaustive_worst w;
        for (const exhaustive_worst& x : worst)
            if (!(x.ulps <= w.ulps)) w = x;
        float x;
        std::memcpy(&x, &w.bits, sizeof x);
        // The worst point again, against MPFR at 256 bits.
        mp xm, ym;
        const double mpfr_ulps = check_point<float>(f, x, xm, ym);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        BOOST_TEST_MESSAGE("exhaustive float " << fn_name(f) << ": max " << w.ulps << " ulp (MPFR: " << mpfr_ulps
                                               << ") at x = " << show(x) << ", " << seconds << " s on " << threads << " threads");
        BOOST_TEST(std::fabs(mpfr_ulps - w.ulps) <= 1e-6, fn_name(f) << ": glibc and MPFR disagree at the worst point");
        // + 4e-9: the reference's own error (≤ 2 double ulps = 3.7e-9 float ulps, see above).
        BOOST_TEST(w.ulps <= documented_float_max(f) + 4e-9, fn_name(f) << "<float>: exhaustive max " << w.ulps
                                                                          << " ulp above the documented " << documented_float_max(f));
        // The reference's own error, on 2^20 random floats: glibc double vs MPFR, in float ulps.
        std::mt19937_64 g(99 + static_cast<std::uint64_t>(f));
        double reference_error = 0;
        for (int i = 0; i < (1 << 20) / static_cast<int>(point_divisor); ++i) {
            const std::uint32_t bits = static_cast<std::uint32_t>(g());
            float y;
            std::memcpy(&y, &bits, sizeof y);
            if (std::isnan(y)) continue;
            const double r = glibc_reference(f, static_cast<double>(y));
            if (!std::isfinite(r)) continue;
            to_mpfr(xm.v, y);
            reference(f, ym.v, xm.v);
            if (!mpfr_number_p(ym.v) || mpfr_zero_p(ym.v)) continue;
            mp d;
            mpfr_set_d(d.v, r, MPFR_RNDN);
            mpfr_sub(d.v, d.v, ym.v, MPFR_RNDN);
            const long e = mpfr_get_exp(ym.v) - 1;
            mpfr_mul_2si(d.v, d.v, -((e < -126 ? -126 : e) - 23), MPFR_RNDN);
            reference_error = std::max(reference_error, std::fabs(mpfr_get_d(d.v, MPFR_RNDN)));
        }
        BOOST_TEST_MESSAGE("  glibc double " << fn_name(f) << " vs MPFR: max " << reference_error << " float ulp");
        BOOST_TEST(reference_error < 1e-6);
    }
}
