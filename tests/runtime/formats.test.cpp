// Tests of attnref/core/formats.hpp against references that share no code with it:
// - a table of every finite value of each format, built from the format's published parameters
//   (precision, min normal exponent, max), with rounding decided by comparing against the exact
//   midpoint of the two neighbours (ties to the even encoding = even table index);
// - MPFR at the format's precision with subnormals emulated (mpfr_subnormalize) for arithmetic;
// - numpy's float32/float64 -> float16 casts.
#define BOOST_TEST_MODULE formats
#include <boost/test/unit_test.hpp>

#include <mpfr.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <unistd.h>
#include <vector>

#include "attnref/core/formats.hpp"

namespace {

using attnref::bfloat16;
using attnref::float16;
using attnref::float8_e4m3;
using attnref::float8_e5m2;
using attnref::overflow_policy;

using all_formats = std::tuple<bfloat16, float16, float8_e4m3, float8_e5m2>;
using wide_formats = std::tuple<bfloat16, float16>;
using fp8_formats = std::tuple<float8_e4m3, float8_e5m2>;

#if defined(ATTNREF_SANITIZE_BUILD)
constexpr bool sanitize_build = true;
#else
constexpr bool sanitize_build = false;
#endif

// The published parameters of each format (FIELD-NOTES §5), written out here rather than taken from
// the header: precision p, exponent of the smallest normal, largest finite value, and the encodings
// of +inf (0 when there is none) and of the sign.
template <int P, int MinNormalExponent, double Max, std::uint32_t Infinity, std::uint32_t Sign, bool HasInfinity>
struct published_facts {
    static constexpr int p = P, min_normal_exponent = MinNormalExponent;
    static constexpr double max = Max;
    static constexpr std::uint32_t infinity = Infinity, sign = Sign;
    static constexpr bool has_infinity = HasInfinity;
};
template <class F>
struct published;
template <>
struct published<bfloat16> : published_facts<8, -126, 0x1.FEp127, 0x7F80, 0x8000, true> {};
template <>
struct published<float16> : published_facts<11, -14, 65504.0, 0x7C00, 0x8000, true> {};
template <>
struct published<float8_e4m3> : published_facts<4, -6, 448.0, 0, 0x80, false> {
    static constexpr std::uint32_t nan = 0x7F;  // the only NaN: S.1111.111
};
template <>
struct published<float8_e5m2> : published_facts<3, -14, 57344.0, 0x7C, 0x80, true> {};

/// The expected result of a rounding: either exact bits, or "some NaN".
struct expected {
    bool any_nan;
    std::uint32_t bits;
};

template <class F>
bool matches(F got, expected e) {
    return e.any_nan ? isnan(got) : got.bits() == e.bits;
}

/// values[i] is the value of the positive encoding i, for i = 0 .. max_bits; values[max_bits + 1] is
/// the value the next encoding would have with an unbounded exponent (max + one top-binade ulp).
/// Built from the published parameters by enumerating significands and exponents.
template <class F>
struct reference_table {
    using P = published<F>;
    std::vector<double> values;
    std::uint32_t max_bits = 0;
    double overflow_value = 0;  // max + ulp

    reference_table() {
        const int fraction = P::p - 1;
        for (int k = 0; k < (1 << fraction); ++k) values.push_back(std::ldexp(k, P::min_normal_exponent - fraction));
        for (int e = P::min_normal_exponent;; ++e) {
            for (int k = 1 << fraction; k < (1 << P::p); ++k) {
                const double v = std::ldexp(k, e - fraction);
                if (v > P::max) goto done;
                values.push_back(v);
            }
        }
    done:
        max_bits = static_cast<std::uint32_t>(values.size() - 1);
        overflow_value = P::max + std::ldexp(1.0, std::ilogb(P::max) - fraction);
        values.push_back(overflow_value);
    }

    expected overflow(bool negative, overflow_policy policy) const {
        const std::uint32_t sign = negative ? P::sign : 0;
        if (policy == overflow_policy::saturate) return {false, max_bits | sign};
        if constexpr (P::has_infinity) {
            return {false, P::infinity | sign};
        } else {
            return {false, P::nan | sign};
        }
    }

    /// Rounds a nonnegative finite a, given i with values[i] <= a < values[i + 1].
    template <class T>
    expected round_between(std::size_t i, T a, bool negative, overflow_policy policy) const {
        const std::uint32_t sign = negative ? P::sign : 0;
        std::size_t pick = i;
        if (a != static_cast<T>(values[i])) {
            const double mid = (values[i] + values[i + 1]) / 2;  // p + 1 bits: exact
            if (a > static_cast<T>(mid) || (a == static_cast<T>(mid) && i % 2 == 1)) pick = i + 1;
        }
        if (pick > max_bits) return overflow(negative, policy);
        return {false, static_cast<std::uint32_t>(pick) | sign};
    }

    /// The correctly rounded value of x (float, double or long double; all exact in long double).
    template <class T>
    expected round(T x, overflow_policy policy) const {
        if (std::isnan(x)) return {true, 0};
        const bool negative = std::signbit(x);
        const T a = negative ? -x : x;
        if (a >= static_cast<T>(overflow_value)) return overflow(negative, policy);
        const auto it = std::upper_bound(values.begin(), values.end(), a,
                                         [](T v, double w) { return v < static_cast<T>(w); });
        return round_between(static_cast<std::size_t>(it - values.begin()) - 1, a, negative, policy);
    }
};

/// Collects mismatches; reports the first few in full.
struct mismatches {
    std::uint64_t count = 0;
    void add(const std::string& what) {
        if (++count <= 10) BOOST_ERROR(what);
    }
};

template <class T>
std::string hex(T x) {
    std::ostringstream s;
    s << std::hexfloat << x;
    return s.str();
}

std::string describe(expected e) {
    std::ostringstream s;
    if (e.any_nan) {
        s << "NaN";
    } else {
        s << "0x" << std::hex << e.bits;
    }
    return s.str();
}

template <class F, class T>
void check_conversion(const reference_table<F>& table, T x, overflow_policy policy, mismatches& bad) {
    const expected e = table.round(x, policy);
    const F got = attnref::convert<F>(x, policy);
    if (!matches(got, e)) {
        bad.add(std::string(attnref::scalar_traits<F>::name) + ": convert(" + hex(x) + (policy == overflow_policy::saturate ? ", saturate" : ", standard") +
                ") = " + std::to_string(got.bits()) + ", expected " + describe(e));
    }
    if (policy == overflow_policy::standard && F(x).bits() != got.bits()) bad.add("constructor differs from convert at " + hex(x));
}

}  // namespace

// --- The reference table and the decoder agree: every encoding's value, both signs -----------------
BOOST_AUTO_TEST_CASE_TEMPLATE(decode_every_encoding, F, all_formats) {
    using P = published<F>;
    const reference_table<F> table;
    mismatches bad;
    const std::uint32_t encodings = 1u << (8 * sizeof(F));
    for (std::uint32_t bits = 0; bits < encodings; ++bits) {
        const F x = F::from_bits(static_cast<typename F::storage_type>(bits));
        const std::uint32_t magnitude = bits & ~P::sign;
        const double sign = (bits & P::sign) != 0 ? -1.0 : 1.0;
        const double d = static_cast<double>(x);
        if (magnitude <= table.max_bits) {
            if (d != sign * table.values[magnitude] || std::signbit(d) != (sign < 0)) bad.add("decode " + std::to_string(bits));
            if (!isfinite(x) || isnan(x) || isinf(x)) bad.add("classification " + std::to_string(bits));
        } else if (P::has_infinity && magnitude == P::infinity) {
            if (!(std::isinf(d) && std::signbit(d) == (sign < 0)) || !isinf(x)) bad.add("infinity " + std::to_string(bits));
        } else {
            if (!std::isnan(d) || !isnan(x) || isinf(x) || isfinite(x)) bad.add("NaN " + std::to_string(bits));
        }
    }
    BOOST_TEST(bad.count == 0u);
    BOOST_TEST_MESSAGE(attnref::scalar_traits<F>::name << ": decoded all " << encodings << " encodings, "
                                                       << table.max_bits + 1 << " finite magnitudes");
}

// --- Every encoding survives the round trip through float and through double ---------------------
BOOST_AUTO_TEST_CASE_TEMPLATE(round_trip_every_encoding, F, all_formats) {
    mismatches bad;
    const std::uint32_t encodings = 1u << (8 * sizeof(F));
    for (std::uint32_t bits = 0; bits < encodings; ++bits) {
        const F x = F::from_bits(static_cast<typename F::storage_type>(bits));
        for (const overflow_policy policy : {overflow_policy::standard, overflow_policy::saturate}) {
            const F via_float = attnref::convert<F>(static_cast<float>(x), policy);
            const F via_double = attnref::convert<F>(static_cast<double>(x), policy);
            // Saturation maps infinities to the largest finite value; everything else comes back.
            const std::uint32_t back = isinf(x) && policy == overflow_policy::saturate
                                           ? (bits & ~published<F>::infinity) | std::numeric_limits<F>::max().bits()
                                           : bits;
            if (isnan(x)) {
                if (!isnan(via_float) || !isnan(via_double)) bad.add("NaN lost: " + std::to_string(bits));
            } else if (via_float.bits() != back || via_double.bits() != back) {
                bad.add("round trip " + std::to_string(bits));
            }
        }
        if (!isnan(x) && static_cast<double>(static_cast<float>(x)) != static_cast<double>(x)) bad.add("float != double");
    }
    BOOST_TEST(bad.count == 0u);
    BOOST_TEST_MESSAGE(attnref::scalar_traits<F>::name << ": " << encodings
                                                       << " encodings round-tripped via float and double, both policies");
}

// --- float -> format, swept over float bit patterns in increasing order ----------------------------
// The reference walks the table alongside the sweep, so each check costs O(1). Full 2^32 per format
// does not fit the time budget; the sample is every positive pattern whose low 8 bits are 0000 0000,
// 0000 0001 or 1111 1111 (ties to even and their float neighbours fall on these for every format,
// since a tie's dropped bits are 100...0 and every format here drops at least 13 of float's 23
// fraction bits), each checked with both signs: 3/256 of all 2^32 patterns. ATTNREF_FORMATS_FULL=1
// (ctest `formats_full`, label exhaustive) takes the low 4 bits instead: 3/16 of them.
BOOST_AUTO_TEST_CASE_TEMPLATE(from_float_sweep, F, all_formats) {
    const reference_table<F> table;
    mismatches bad;
    const char* full = std::getenv("ATTNREF_FORMATS_FULL");
    const std::uint32_t block = sanitize_build ? 1u << 12 : (full && std::string(full) == "1") ? 16 : 256;
    const std::uint32_t offsets[] = {0, 1, block - 1};
    std::uint64_t checked = 0;
    std::size_t i = 0;
    const double saturate_from = table.values[table.max_bits] / 2;
    const std::uint32_t positive_infinity = 0x7F800000;
    for (std::uint64_t base = 0; base < positive_infinity; base += block) {
        for (const std::uint32_t offset : offsets) {
            const std::uint32_t u = static_cast<std::uint32_t>(base) + offset;
            const float x = std::bit_cast<float>(u);
            const double a = x;
            expected e{};
            if (a >= table.overflow_value) {
                e = table.overflow(false, overflow_policy::standard);
            } else {
                while (table.values[i + 1] <= a) ++i;
                e = table.round_between(i, a, false, overflow_policy::standard);
            }
            const F positive(x);
            const F negative(-x);
            if (positive.bits() != e.bits || negative.bits() != (e.bits | published<F>::sign)) {
                std::string m(attnref::scalar_traits<F>::name);  // appended piecewise: GCC 12's -Warray-bounds misfires on a chain of +
                m += ": F(" + hex(x) + ") = ";
                m += std::to_string(positive.bits()) + ", expected " + describe(e);
                bad.add(m);
            }
            if (a >= saturate_from) {
                check_conversion(table, x, overflow_policy::saturate, bad);
                check_conversion(table, -x, overflow_policy::saturate, bad);
            }
            checked += 2;
        }
    }
    // Infinities and a sample of the NaN patterns.
    for (const float x : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()}) {
        check_conversion(table, x, overflow_policy::standard, bad);
        check_conversion(table, x, overflow_policy::saturate, bad);
    }
    for (std::uint32_t u = positive_infinity + 1; u < 0x80000000u; u += 4099) {
        for (const std::uint32_t v : {u, u | 0x80000000u}) {
            const float x = std::bit_cast<float>(v);
            if (!isnan(F(x)) || !isnan(attnref::convert<F>(x, overflow_policy::saturate))) bad.add("NaN pattern " + std::to_string(v));
        }
    }
    BOOST_TEST(bad.count == 0u);
    BOOST_TEST_MESSAGE(attnref::scalar_traits<F>::name << ": float -> format checked on " << checked
                                                       << " float patterns (sample: base + {0, 1, " << block - 1 << "} for every base a multiple of " << block << ")");
}

// --- double -> format: constructed cases and random doubles, both policies --------------------------
BOOST_AUTO_TEST_CASE_TEMPLATE(from_double, F, all_formats) {
    const reference_table<F> table;
    mismatches bad;
    std::uint64_t constructed = 0, random = 0;
    const overflow_policy policies[] = {overflow_policy::standard, overflow_policy::saturate};
    auto check_both = [&](double x, std::uint64_t& counter) {
        for (const overflow_policy policy : policies) {
            check_conversion(table, x, policy, bad);
            check_conversion(table, -x, policy, bad);
            counter += 2;
        }
    };
    constexpr double inf = std::numeric_limits<double>::infinity();
    // Every value, every midpoint between neighbours (the last one is the overflow threshold), and
    // their double neighbours: midpoint +- 1 double ulp rounds to the midpoint in float, so a
    // conversion through float would round these wrongly. Also the float neighbours of each.
    for (std::size_t i = 0; i + 1 < table.values.size(); ++i) {
        const double v = table.values[i];
        const double mid = (v + table.values[i + 1]) / 2;
        for (const double x : {v, std::nextafter(v, inf), std::nextafter(v, -inf), mid, std::nextafter(mid, inf),
                               std::nextafter(mid, -inf),
                               static_cast<double>(std::nextafter(static_cast<float>(mid), std::numeric_limits<float>::infinity())),
                               static_cast<double>(std::nextafter(static_cast<float>(mid), 0.0f))}) {
            check_both(x, constructed);
        }
        // The same points as floats (mid has p + 1 bits: a float).
        for (const float x : {static_cast<float>(mid), std::nextafter(static_cast<float>(mid), std::numeric_limits<float>::infinity()),
                              std::nextafter(static_cast<float>(mid), 0.0f)}) {
            for (const overflow_policy policy : policies) {
                check_conversion(table, x, policy, bad);
                check_conversion(table, -x, policy, bad);
                constructed += 2;
            }
        }
    }
    // Beyond the ends: overflow threshold and above, underflow below the smallest subnormal.
    const double top = table.overflow_value;
    for (const double x : {top, std::nextafter(top, inf), 2 * top, std::numeric_limits<double>::max(), inf,
                           table.values[1] / 2, std::nextafter(table.values[1] / 2, inf), table.values[1] / 4,
                           std::numeric_limits<double>::denorm_min(), std::numeric_limits<double>::min(), 0.0}) {
        check_both(x, constructed);
    }
    // Random doubles: a quarter raw bit patterns, the rest with exponents spread over the format's
    // range and a little beyond.
    std::mt19937_64 rng(20240611);
    const int low = published<F>::min_normal_exponent - published<F>::p - 3;
    const int high = std::ilogb(published<F>::max) + 3;
    std::uniform_int_distribution<int> exponent(low, high);
    const std::uint64_t n = sanitize_build ? 200'000 : 10'000'000;
    for (std::uint64_t k = 0; k < n; ++k) {
        const std::uint64_t bits = rng();
        double x = std::bit_cast<double>(bits);
        if (k % 4 != 0) x = std::ldexp(1.0 + std::ldexp(static_cast<double>(bits >> 12), -52), exponent(rng));
        if (std::isnan(x)) continue;
        check_conversion(table, x, policies[k % 2], bad);
        ++random;
    }
    BOOST_TEST(bad.count == 0u);
    BOOST_TEST_MESSAGE(attnref::scalar_traits<F>::name << ": double -> format checked on " << constructed
                                                       << " constructed cases and " << random << " random doubles");
}

// --- integer -> format, against the table with long double comparisons (exact for int64) ---------
BOOST_AUTO_TEST_CASE_TEMPLATE(from_integer, F, all_formats) {
    const reference_table<F> table;
    mismatches bad;
    std::uint64_t checked = 0;
    auto check = [&](std::int64_t i) {
        const expected e = table.round(static_cast<long double>(i), overflow_policy::standard);
        if (!matches(F(i), e)) bad.add("F(" + std::to_string(i) + ") = " + std::to_string(F(i).bits()) + ", expected " + describe(e));
        ++checked;
    };
    for (std::size_t i = 0; i + 1 < table.values.size(); ++i) {
        const double mid = (table.values[i] + table.values[i + 1]) / 2;
        if (mid < 1 || mid >= 0x1p62 || mid != std::floor(mid)) continue;
        const auto m = static_cast<std::int64_t>(mid);
        for (const std::int64_t x : {m - 1, m, m + 1}) {
            check(x);
            check(-x);
        }
    }
    std::mt19937_64 rng(7);
    for (int k = 0; k < 100'000; ++k) check(static_cast<std::int64_t>(rng()) >> (k % 64));
    check(std::numeric_limits<std::int64_t>::min());
    check(std::numeric_limits<std::int64_t>::max());
    // 2^64 - 1 rounds to 2^64 (all formats' p < 64), which overflows the fp8 formats and float16.
    BOOST_TEST(F(std::numeric_limits<std::uint64_t>::max()).bits() ==
               table.round(0x1p64L, overflow_policy::standard).bits);
    BOOST_TEST(bad.count == 0u);
    BOOST_TEST_MESSAGE(attnref::scalar_traits<F>::name << ": integer -> format checked on " << checked << " integers");
}

// --- Arithmetic against MPFR at the format's precision with emulated subnormals ---------------------
namespace {

/// Correctly rounded + - * / in F by MPFR: precision p, emin such that the smallest subnormal is
/// 0.1b * 2^emin, mpfr_subnormalize after each operation; overflow classified by the table.
template <class F>
class mpfr_oracle {
public:
    mpfr_oracle() : saved_emin_(mpfr_get_emin()) {
        const int p = published<F>::p;
        mpfr_set_emin(published<F>::min_normal_exponent - (p - 1) + 1);
        mpfr_init2(a_, p);
        mpfr_init2(b_, p);
        mpfr_init2(r_, p);
    }
    ~mpfr_oracle() {
        mpfr_clear(a_);
        mpfr_clear(b_);
        mpfr_clear(r_);
        mpfr_set_emin(saved_emin_);
    }
    mpfr_oracle(const mpfr_oracle&) = delete;
    mpfr_oracle& operator=(const mpfr_oracle&) = delete;

    expected apply(char op, double a, double b) {
        mpfr_set_d(a_, a, MPFR_RNDN);  // exact: a and b are values of F
        mpfr_set_d(b_, b, MPFR_RNDN);
        int t = 0;
        switch (op) {
            case '+': t = mpfr_add(r_, a_, b_, MPFR_RNDN); break;
            case '-': t = mpfr_sub(r_, a_, b_, MPFR_RNDN); break;
            case '*': t = mpfr_mul(r_, a_, b_, MPFR_RNDN); break;
            default: t = mpfr_div(r_, a_, b_, MPFR_RNDN); break;
        }
        mpfr_subnormalize(r_, t, MPFR_RNDN);
        return table_.round(mpfr_get_d(r_, MPFR_RNDN), overflow_policy::standard);  // exact unless overflow
    }

private:
    mpfr_exp_t saved_emin_;
    mpfr_t a_, b_, r_;
    reference_table<F> table_;
};

template <class F>
F apply(char op, F a, F b) {
    switch (op) {
        case '+': return a + b;
        case '-': return a - b;
        case '*': return a * b;
        default: return a / b;
    }
}

template <class F>
void check_operation(mpfr_oracle<F>& oracle, char op, F a, F b, mismatches& bad) {
    const F got = apply(op, a, b);
    const expected e = oracle.apply(op, static_cast<double>(a), static_cast<double>(b));
    if (!matches(got, e)) {
        bad.add(std::string(attnref::scalar_traits<F>::name) + ": " + hex(static_cast<double>(a)) + " " + op + " " +
                hex(static_cast<double>(b)) + " = " + std::to_string(got.bits()) + ", expected " + describe(e));
    }
    // The compound assignment is the same operation.
    F c = a;
    switch (op) {
        case '+': c += b; break;
        case '-': c -= b; break;
        case '*': c *= b; break;
        default: c /= b; break;
    }
    if (c.bits() != got.bits() && !(isnan(c) && isnan(got))) bad.add("compound assignment differs");
}

/// a + b, a − b, a · b and a / b against the oracle; returns the number of operations checked.
template <class F>
std::uint64_t check_four_operations(mpfr_oracle<F>& oracle, F a, F b, mismatches& bad) {
    for (const char op : {'+', '-', '*', '/'}) check_operation(oracle, op, a, b, bad);
    return 4;
}

}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(arithmetic_exhaustive_fp8, F, fp8_formats) {
    mpfr_oracle<F> oracle;
    mismatches bad;
    std::uint64_t checked = 0;
    for (std::uint32_t i = 0; i < 256; ++i)
        for (std::uint32_t j = 0; j < 256; ++j)
            checked += check_four_operations(oracle, F::from_bits(static_cast<std::uint8_t>(i)),
                                             F::from_bits(static_cast<std::uint8_t>(j)), bad);
    BOOST_TEST(bad.count == 0u);
    BOOST_TEST_MESSAGE(attnref::scalar_traits<F>::name << ": + - * / checked exhaustively, " << checked << " operations");
}

// bfloat16 and float16: every encoding a against a fixed set of special and random b (both orders),
// then random pairs, half of them with exponents within p + 2 of each other (where cancellation and
// ties happen).
BOOST_AUTO_TEST_CASE_TEMPLATE(arithmetic_sampled, F, wide_formats) {
    using P = published<F>;
    mpfr_oracle<F> oracle;
    mismatches bad;
    std::uint64_t checked = 0;
    std::mt19937_64 rng(12345);
    const int exponent_shift = P::p - 1;
    const std::uint32_t exponent_mask = (P::sign - 1) & ~((1u << exponent_shift) - 1);
    const auto fixed = [&] {
        std::vector<F> b = {F(0), -F(0), F(1), F(-1), F(3), F(0.1), std::numeric_limits<F>::max(),
                            std::numeric_limits<F>::lowest(), std::numeric_limits<F>::min(),
                            std::numeric_limits<F>::denorm_min(), std::numeric_limits<F>::infinity(),
                            -std::numeric_limits<F>::infinity(), std::numeric_limits<F>::quiet_NaN()};
        for (int k = 0; k < 11; ++k) b.push_back(F::from_bits(static_cast<std::uint16_t>(rng())));
        return b;
    }();
    const std::uint32_t every = sanitize_build ? 61 : 1;
    for (std::uint32_t i = 0; i < 65536; i += every) {
        const F a = F::from_bits(static_cast<std::uint16_t>(i));
        for (const F b : fixed) checked += check_four_operations(oracle, a, b, bad) + check_four_operations(oracle, b, a, bad);
    }
    const std::uint64_t pairs = sanitize_build ? 20'000 : 1'000'000;
    std::uniform_int_distribution<int> near(-(P::p + 2), P::p + 2);
    for (std::uint64_t k = 0; k < pairs; ++k) {
        const std::uint64_t r = rng();
        const auto x = static_cast<std::uint32_t>(r & 0xFFFF);
        auto y = static_cast<std::uint32_t>((r >> 16) & 0xFFFF);
        if (k % 2 == 1) {
            const int ex = static_cast<int>((x & exponent_mask) >> exponent_shift);
            const int field_max = static_cast<int>(exponent_mask >> exponent_shift);
            const int ey = std::clamp(ex + near(rng), 0, field_max - 1);
            y = (y & ~exponent_mask) | (static_cast<std::uint32_t>(ey) << exponent_shift);
        }
        checked += check_four_operations(oracle, F::from_bits(static_cast<std::uint16_t>(x)),
                                         F::from_bits(static_cast<std::uint16_t>(y)), bad);
    }
    BOOST_TEST(bad.count == 0u);
    BOOST_TEST_MESSAGE(attnref::scalar_traits<F>::name << ": + - * / checked on " << checked
                                                       << " operations (every encoding against " << fixed.size()
                                                       << " fixed operands" << (sanitize_build ? ", 1 in 61 encodings" : "")
                                                       << ", then " << pairs << " random pairs)");
}

// --- Comparisons follow IEEE, exhaustively for the fp8 formats ------------------------------------
BOOST_AUTO_TEST_CASE_TEMPLATE(comparisons_exhaustive_fp8, F, fp8_formats) {
    mismatches bad;
    for (std::uint32_t i = 0; i < 256; ++i) {
        for (std::uint32_t j = 0; j < 256; ++j) {
            const F a = F::from_bits(static_cast<std::uint8_t>(i));
            const F b = F::from_bits(static_cast<std::uint8_t>(j));
            const double x = static_cast<double>(a), y = static_cast<double>(b);
            if ((a == b) != (x == y) || (a != b) != (x != y) || (a < b) != (x < y) || (a <= b) != (x <= y) ||
                (a > b) != (x > y) || (a >= b) != (x >= y)) {
                bad.add("comparison " + std::to_string(i) + " " + std::to_string(j));
            }
        }
    }
    BOOST_TEST(bad.count == 0u);
    BOOST_TEST_MESSAGE(attnref::scalar_traits<F>::name << ": comparisons checked on all 65536 pairs");
}

// --- Math functions: found by ADL, the float kernel rounded once ----------------------------------
BOOST_AUTO_TEST_CASE_TEMPLATE(math_functions, F, all_formats) {
    const double u = std::ldexp(1.0, -published<F>::p);
    auto near = [&](F got, double exact) { return std::fabs(static_cast<double>(got) - exact) <= 1.01 * u * std::fabs(exact); };
    BOOST_TEST(near(exp(F(1)), std::exp(1.0)));
    BOOST_TEST(near(log(F(3)), std::log(3.0)));
    BOOST_TEST(near(log1p(F(0.25)), std::log1p(0.25)));
    BOOST_TEST(near(expm1(F(0.25)), std::expm1(0.25)));
    BOOST_TEST(near(tanh(F(0.5)), std::tanh(0.5)));
    BOOST_TEST(sqrt(F(4)).bits() == F(2).bits());
    BOOST_TEST(near(sqrt(F(2)), std::sqrt(2.0)));
    BOOST_TEST(isnan(log(F(-1))));
    BOOST_TEST(static_cast<double>(attnref::math::exp(F(0))) == 1.0);  // attnref::math dispatches by ADL
    BOOST_TEST(abs(F(-2)).bits() == F(2).bits());
    BOOST_TEST(signbit(abs(F(-0.0))) == false);
}

// --- Cross-check with numpy: float32 and float64 -> float16 ----------------------------------------
namespace {

bool numpy_available() {
    if (!std::filesystem::exists("/usr/bin/python3")) return false;
    return std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0;
}

/// Writes xs, converts them with numpy's astype(np.float16), returns the bit patterns.
template <class T>
std::vector<std::uint16_t> numpy_float16_bits(const std::vector<T>& xs) {
    const auto dir = std::filesystem::temp_directory_path();
    const std::string stem = "attnref-formats-" + std::to_string(::getpid());
    const auto in = dir / (stem + ".in"), out = dir / (stem + ".out");
    {
        std::ofstream f(in, std::ios::binary);
        f.write(reinterpret_cast<const char*>(xs.data()), static_cast<std::streamsize>(xs.size() * sizeof(T)));
    }
    const std::string dtype = sizeof(T) == 4 ? "<f4" : "<f8";
    const std::string command = "/usr/bin/python3 -W ignore -c \"import numpy as np, sys; "
                                "np.fromfile(sys.argv[1], dtype='" + dtype + "').astype(np.float16).view('<u2').tofile(sys.argv[2])\" " +
                                in.string() + " " + out.string();
    BOOST_REQUIRE_MESSAGE(std::system(command.c_str()) == 0, "numpy conversion failed: " + command);
    std::vector<std::uint16_t> bits(xs.size());
    {
        std::ifstream f(out, std::ios::binary);
        f.read(reinterpret_cast<char*>(bits.data()), static_cast<std::streamsize>(bits.size() * 2));
        BOOST_REQUIRE_MESSAGE(f.gcount() == static_cast<std::streamsize>(bits.size() * 2), "short read from " + out.string());
    }
    std::filesystem::remove(in);
    std::filesystem::remove(out);
    return bits;
}

template <class T>
void compare_with_numpy(const std::vector<T>& xs) {
    const std::vector<std::uint16_t> theirs = numpy_float16_bits(xs);
    std::uint64_t bad = 0;
    for (std::size_t k = 0; k < xs.size(); ++k) {
        const float16 ours(xs[k]);
        const bool both_nan = isnan(ours) && isnan(float16::from_bits(theirs[k]));
        if (ours.bits() != theirs[k] && !both_nan) {
            if (++bad <= 10) BOOST_ERROR("float16(" << hex(xs[k]) << ") = " << ours.bits() << ", numpy " << theirs[k]);
        }
    }
    BOOST_TEST(bad == 0u);
    BOOST_TEST_MESSAGE("float16: " << xs.size() << (sizeof(T) == 4 ? " float32" : " float64")
                                   << " values agree with numpy astype(np.float16)");
}

}  // namespace

BOOST_AUTO_TEST_CASE(numpy_float16_cross_check) {
    if (!numpy_available()) {
        BOOST_TEST_MESSAGE("skipped: /usr/bin/python3 with numpy is not available");
        return;
    }
    const reference_table<float16> table;
    std::vector<float> floats;
    std::vector<double> doubles;
    // Midpoints and their neighbours (as floats and as doubles), every 7th pair of neighbours.
    for (std::size_t i = 0; i + 1 < table.values.size(); i += 7) {
        const double mid = (table.values[i] + table.values[i + 1]) / 2;
        for (const double x : {mid, std::nextafter(mid, 0.0), std::nextafter(mid, 1e300), table.values[i]}) {
            doubles.push_back(x);
            doubles.push_back(-x);
        }
        const float f = static_cast<float>(mid);
        for (const float x : {f, std::nextafter(f, 0.0f), std::nextafter(f, 1e30f)}) floats.push_back(x);
    }
    std::mt19937 rng(99);
    for (int k = 0; k < 2000; ++k) floats.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng())));
    for (const float x : {65504.0f, 65519.0f, 65520.0f, 1e6f, 0x1p-25f, 0x1p-26f, std::numeric_limits<float>::infinity()}) {
        floats.push_back(x);
        floats.push_back(-x);
    }
    compare_with_numpy(floats);
    compare_with_numpy(doubles);
}

// Per-tensor scaled FP8 quantisation (fp8_scale_for, fp8_quantise, fp8_dequantise): scales and bit
// patterns derived by hand from the OCP 8-bit specification's encodings.
// E4M3FN: S.EEEE.MMM, bias 7, max 448 = 1.75·2^8 = 0.1111.110; E5M2: S.EEEEE.MM, bias 15, max 57344 = 1.75·2^15.
BOOST_AUTO_TEST_CASE(fp8_per_tensor_scale_and_codes) {
    using attnref::fp8_dequantise;
    using attnref::fp8_quantise;
    using attnref::fp8_scale_for;
    using attnref::fp8_tensor_scale;
    // Scale: the largest power of two s with amax·s <= max.
    BOOST_TEST(fp8_scale_for<float8_e4m3>(1.0).exponent == 8);     // 256 <= 448 < 512
    BOOST_TEST(fp8_scale_for<float8_e4m3>(1.0).descale == 0x1p-8);
    BOOST_TEST(fp8_scale_for<float8_e4m3>(3.0).exponent == 7);     // 384 <= 448 < 768
    BOOST_TEST(fp8_scale_for<float8_e4m3>(448.0).exponent == 0);
    BOOST_TEST(fp8_scale_for<float8_e4m3>(449.0).exponent == -1);  // 224.5 <= 448 < 449
    BOOST_TEST(fp8_scale_for<float8_e4m3>(0.0).exponent == 0);     // nothing to scale
    BOOST_TEST(fp8_scale_for<float8_e5m2>(1.0).exponent == 15);    // 32768 <= 57344 < 65536
    BOOST_TEST(fp8_scale_for<float8_e5m2>(57345.0).exponent == -1);
    const fp8_tensor_scale one{};  // s = 1
    const auto e4 = [&](double x) { return static_cast<unsigned>(fp8_quantise<float8_e4m3>(x, one).bits()); };
    const auto e5 = [&](double x) { return static_cast<unsigned>(fp8_quantise<float8_e5m2>(x, one).bits()); };
    const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    // E4M3FN normals, ties to even, saturation (no infinity; its only NaN is S.1111.111).
    BOOST_TEST(e4(1.0) == 0x38u);              // 0.0111.000
    BOOST_TEST(e4(1.0625) == 0x38u);           // 1 + 2^-4: tie of 1.000 and 1.001, even 1.000
    BOOST_TEST(e4(1.1875) == 0x3Au);           // tie of 1.001 and 1.010, even 1.010
    BOOST_TEST(e4(448.0) == 0x7Eu);            // 0.1111.110 = max
    BOOST_TEST(e4(464.0) == 0x7Eu);            // tie of 1.110·2^8 and 1.111·2^8: even 448
    BOOST_TEST(e4(480.0) == 0x7Eu);            // 1.111·2^8 is the NaN code: beyond max, saturates
    BOOST_TEST(e4(1e6) == 0x7Eu);
    BOOST_TEST(e4(-1e6) == 0xFEu);
    BOOST_TEST(e4(inf) == 0x7Eu);              // saturating conversion: ±inf -> ±max
    BOOST_TEST(e4(nan) == 0x7Fu);              // NaN stays NaN: S.1111.111
    // E4M3FN subnormals 0.0000.MMM = M·2^-9.
    BOOST_TEST(e4(0x1p-9) == 0x01u);
    BOOST_TEST(e4(0x1p-10) == 0x00u);          // tie of 0 and 2^-9: even 0
    BOOST_TEST(e4(0x3p-10) == 0x02u);          // tie of 1·2^-9 and 2·2^-9: even 2
    BOOST_TEST(e4(0x7p-9) == 0x07u);           // largest subnormal
    BOOST_TEST(e4(0x1p-6) == 0x08u);           // smallest normal 0.0001.000
    // E5M2: 1.0 = 0.01111.00, max 0.11110.11, inf 0.11111.00, NaN 0.11111.1x.
    BOOST_TEST(e5(1.0) == 0x3Cu);
    BOOST_TEST(e5(57344.0) == 0x7Bu);
    BOOST_TEST(e5(61440.0) == 0x7Bu);          // tie of max and 2^16 (overflow): saturates
    BOOST_TEST(e5(-inf) == 0xFBu);
    BOOST_TEST(e5(nan) == 0x7Eu);
    BOOST_TEST(e5(0x1p-16) == 0x01u);          // smallest subnormal 0.00000.01
    BOOST_TEST(e5(0x1p-17) == 0x00u);          // tie with 0: even 0
    BOOST_TEST(e5(0x3p-17) == 0x02u);          // tie of 1 and 2 ·2^-16: even 2
    BOOST_TEST(e5(0x1p-14) == 0x04u);          // smallest normal 0.00001.00
    // With a scale: amax 1 -> s = 256; 0.3·256 = 76.8 lies between 72 and 80 (spacing 8 at 2^6): 80 =
    // 1.010·2^6 = 0.1101.010; the effective input is 80/256 = 0.3125 exactly.
    const fp8_tensor_scale s = fp8_scale_for<float8_e4m3>(1.0);
    const float8_e4m3 q = fp8_quantise<float8_e4m3>(0.3, s);
    BOOST_TEST(static_cast<unsigned>(q.bits()) == 0x6Au);
    BOOST_TEST(fp8_dequantise(q, s) == 0.3125);
    BOOST_TEST(fp8_dequantise(fp8_quantise<float8_e4m3>(-1.0, s), s) == -1.0);  // amax itself: 256 = 0.1111.000
    BOOST_TEST(static_cast<unsigned>(fp8_quantise<float8_e4m3>(-1.0, s).bits()) == 0xF8u);
}
