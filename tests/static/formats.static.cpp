// Compile-only tests of attnref/core/formats.hpp: building this file is the test.
#include "attnref/core/formats.hpp"

#include <bit>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace {

using attnref::bfloat16;
using attnref::convert;
using attnref::float16;
using attnref::float8_e4m3;
using attnref::float8_e5m2;
using attnref::overflow_policy;

constexpr double inf = std::numeric_limits<double>::infinity();
constexpr double nan = std::numeric_limits<double>::quiet_NaN();

// --- Shape and the Scalar concept -----------------------------------------------------------------
static_assert(sizeof(bfloat16) == 2 && sizeof(float16) == 2 && sizeof(float8_e4m3) == 1 && sizeof(float8_e5m2) == 1);
static_assert(std::is_trivially_copyable_v<bfloat16> && std::is_trivially_copyable_v<float8_e4m3>);
static_assert(attnref::Scalar<bfloat16>);
static_assert(attnref::Scalar<float16>);
static_assert(attnref::Scalar<float8_e4m3>);
static_assert(attnref::Scalar<float8_e5m2>);
static_assert(std::is_same_v<attnref::formats::bfloat16, bfloat16>);

// Negative tests: no implicit conversions, no mixed arithmetic, no construction from bool.
static_assert(!std::is_convertible_v<float, bfloat16>);
static_assert(!std::is_convertible_v<double, float16>);
static_assert(!std::is_convertible_v<int, float8_e4m3>);
static_assert(!std::is_convertible_v<bfloat16, float>);
static_assert(!std::is_convertible_v<bfloat16, float16>);
static_assert(!std::is_constructible_v<bfloat16, bool>);
static_assert(!std::is_constructible_v<bfloat16, float16>);
// (The requires-expressions sit in concepts so that their failure is a value, not an error.)
template <class A, class B>
concept Addable = requires(A a, B b) { a + b; };
template <class A, class B>
concept Subtractable = requires(A a, B b) { a - b; };
template <class A, class B>
concept Multipliable = requires(A a, B b) { a * b; };
template <class A, class B>
concept Divisible = requires(A a, B b) { a / b; };
template <class A, class B>
concept LessThanComparable = requires(A a, B b) { a < b; };
template <class To, class From>
concept StaticCastable = requires(From x) { static_cast<To>(x); };
static_assert(Addable<bfloat16, bfloat16> && LessThanComparable<float8_e4m3, float8_e4m3>);
static_assert(!Addable<bfloat16, float>);
static_assert(!Multipliable<bfloat16, double>);
static_assert(!Divisible<bfloat16, int>);
static_assert(!Subtractable<bfloat16, float16>);
static_assert(!LessThanComparable<float8_e4m3, float8_e5m2>);
static_assert(StaticCastable<float, bfloat16> && StaticCastable<double, float8_e5m2>);
static_assert(!StaticCastable<int, bfloat16>);

// --- Traits and limits ----------------------------------------------------------------------------
static_assert(attnref::scalar_traits<bfloat16>::digits == 8 && attnref::scalar_traits<float16>::digits == 11 &&
              attnref::scalar_traits<float8_e4m3>::digits == 4 && attnref::scalar_traits<float8_e5m2>::digits == 3);
static_assert(attnref::scalar_traits<bfloat16>::name == "bfloat16" && attnref::scalar_traits<float16>::name == "float16" &&
              attnref::scalar_traits<float8_e4m3>::name == "float8_e4m3fn" &&
              attnref::scalar_traits<float8_e5m2>::name == "float8_e5m2");
static_assert(static_cast<double>(attnref::scalar_traits<bfloat16>::epsilon()) == 0x1p-7);
static_assert(static_cast<double>(attnref::scalar_traits<float16>::epsilon()) == 0x1p-10);
static_assert(static_cast<double>(attnref::scalar_traits<float8_e4m3>::epsilon()) == 0x1p-3);
static_assert(static_cast<double>(attnref::scalar_traits<float8_e5m2>::epsilon()) == 0x1p-2);
static_assert(static_cast<double>(attnref::unit_roundoff<bfloat16>()) == 0x1p-8);
static_assert(static_cast<double>(attnref::unit_roundoff<float16>()) == 0x1p-11);

template <class F>
constexpr double max_of = static_cast<double>(std::numeric_limits<F>::max());
template <class F>
constexpr double min_of = static_cast<double>(std::numeric_limits<F>::min());
template <class F>
constexpr double denorm_min_of = static_cast<double>(std::numeric_limits<F>::denorm_min());

static_assert(max_of<bfloat16> == 0x1.FEp127 && min_of<bfloat16> == 0x1p-126 && denorm_min_of<bfloat16> == 0x1p-133);
static_assert(max_of<float16> == 65504 && min_of<float16> == 0x1p-14 && denorm_min_of<float16> == 0x1p-24);
static_assert(max_of<float8_e4m3> == 448 && min_of<float8_e4m3> == 0x1p-6 && denorm_min_of<float8_e4m3> == 0x1p-9);
static_assert(max_of<float8_e5m2> == 57344 && min_of<float8_e5m2> == 0x1p-14 && denorm_min_of<float8_e5m2> == 0x1p-16);
static_assert(static_cast<double>(std::numeric_limits<float16>::lowest()) == -65504);
static_assert(static_cast<double>(std::numeric_limits<float8_e4m3>::epsilon()) == 0.125);
static_assert(std::numeric_limits<bfloat16>::is_specialized && std::numeric_limits<float8_e4m3>::is_specialized);
static_assert(std::numeric_limits<bfloat16>::digits == 8 && std::numeric_limits<float8_e5m2>::digits == 3);
static_assert(std::numeric_limits<bfloat16>::has_infinity && std::numeric_limits<float16>::has_infinity &&
              std::numeric_limits<float8_e5m2>::has_infinity && !std::numeric_limits<float8_e4m3>::has_infinity);
static_assert(std::numeric_limits<float8_e4m3>::has_quiet_NaN && !std::numeric_limits<float8_e4m3>::has_signaling_NaN);
static_assert(std::numeric_limits<float16>::is_iec559 && !std::numeric_limits<bfloat16>::is_iec559);
// The same facts float16 and bfloat16 share with the hardware types they mirror.
static_assert(std::numeric_limits<float16>::max_exponent == 16 && std::numeric_limits<float16>::min_exponent == -13);
static_assert(std::numeric_limits<bfloat16>::max_exponent == std::numeric_limits<float>::max_exponent &&
              std::numeric_limits<bfloat16>::min_exponent == std::numeric_limits<float>::min_exponent &&
              std::numeric_limits<bfloat16>::max_exponent10 == std::numeric_limits<float>::max_exponent10 &&
              std::numeric_limits<bfloat16>::min_exponent10 == std::numeric_limits<float>::min_exponent10);
static_assert(std::numeric_limits<float16>::max_exponent10 == 4 && std::numeric_limits<float16>::min_exponent10 == -4);
static_assert(std::numeric_limits<float8_e4m3>::max_exponent10 == 2 && std::numeric_limits<float8_e4m3>::min_exponent10 == -1);
static_assert(std::numeric_limits<bfloat16>::digits10 == 2 && std::numeric_limits<bfloat16>::max_digits10 == 4);
static_assert(std::numeric_limits<float16>::digits10 == 3 && std::numeric_limits<float16>::max_digits10 == 5);

// --- Special encodings ----------------------------------------------------------------------------
static_assert(std::numeric_limits<bfloat16>::infinity().bits() == 0x7F80);
static_assert(std::numeric_limits<float16>::infinity().bits() == 0x7C00);
static_assert(std::numeric_limits<float8_e5m2>::infinity().bits() == 0x7C);
static_assert(std::numeric_limits<bfloat16>::quiet_NaN().bits() == 0x7FC0);
static_assert(std::numeric_limits<float16>::quiet_NaN().bits() == 0x7E00);
static_assert(std::numeric_limits<float8_e4m3>::quiet_NaN().bits() == 0x7F);
static_assert(std::numeric_limits<float8_e5m2>::quiet_NaN().bits() == 0x7E);
static_assert(isnan(float8_e4m3::from_bits(0x7F)) && isnan(float8_e4m3::from_bits(0xFF)));
static_assert(!isnan(float8_e4m3::from_bits(0x7E)) && isfinite(float8_e4m3::from_bits(0x78)));
static_assert(static_cast<double>(float8_e4m3::from_bits(0x78)) == 256);  // all-ones exponent is finite in FN
static_assert(isinf(float8_e5m2::from_bits(0xFC)) && isnan(float8_e5m2::from_bits(0x7D)));
static_assert(isnan(bfloat16::from_bits(0xFF81)) && isinf(bfloat16::from_bits(0xFF80)) && !isfinite(bfloat16::from_bits(0xFF80)));
static_assert(float16(nan).bits() == 0x7E00 && float16(-nan).bits() == 0xFE00);  // sign of NaN kept
static_assert(isnan(bfloat16(static_cast<float>(nan))));

// --- Conversions: exact values, ties to even, no double rounding ----------------------------------
static_assert(bfloat16(1.0).bits() == 0x3F80 && bfloat16(1.0f).bits() == 0x3F80 && bfloat16(1).bits() == 0x3F80);
static_assert(bfloat16(-2).bits() == 0xC000 && float16(1.0).bits() == 0x3C00 && float16(-2.0f).bits() == 0xC000);
static_assert(float8_e4m3(1.0).bits() == 0x38 && float8_e5m2(1.0).bits() == 0x3C);
static_assert(bfloat16(-0.0).bits() == 0x8000 && float8_e4m3(-0.0f).bits() == 0x80);
static_assert(bfloat16(1 + 0x1p-8).bits() == 0x3F80);          // tie, even neighbour is 1
static_assert(bfloat16(1 + 3 * 0x1p-8).bits() == 0x3F82);      // tie, even neighbour is up
static_assert(bfloat16(1 + 0x1p-8 + 0x1p-40).bits() == 0x3F81);  // via float this would be a tie -> 0x3F80
static_assert(bfloat16(static_cast<float>(1 + 0x1p-8 + 0x1p-40)).bits() == 0x3F80);  // the double rounding
static_assert(float16(1 + 0x1p-11 + 0x1p-30).bits() == 0x3C01);
static_assert(float16(0x1p-24).bits() == 0x0001 && float16(0x1p-25).bits() == 0x0000);  // tie to even: 0
static_assert(float16(0x1.8p-24).bits() == 0x0002 && float16(0x1p-25 + 0x1p-60).bits() == 0x0001);
static_assert(float16(0x1.FF8p-15).bits() == 0x03FF && float16(0x1.FFCp-15).bits() == 0x0400);  // rounds up from the subnormals into the min normal
static_assert(float8_e4m3(0x1p-10).bits() == 0x00 && float8_e4m3(0x1.8p-10).bits() == 0x01);
static_assert(float8_e5m2(0x1p-17).bits() == 0x00 && float8_e5m2(0x1.000001p-17).bits() == 0x01);
static_assert(bfloat16(0x1p-133).bits() == 0x0001 && bfloat16(0x1p-200).bits() == 0x0000);
static_assert(bfloat16(std::numeric_limits<double>::denorm_min()).bits() == 0 && bfloat16(-1e-300).bits() == 0x8000);
static_assert(bfloat16(3.140625).bits() == 0x4049);

// Overflow: standard and saturate.
static_assert(float16(65504.0).bits() == 0x7BFF && float16(65519.99).bits() == 0x7BFF);
static_assert(float16(65520.0).bits() == 0x7C00 && float16(-65520.0f).bits() == 0xFC00);  // tie at max + ulp/2 -> inf
static_assert(float16(65520).bits() == 0x7C00 && float16(65519).bits() == 0x7BFF);
static_assert(convert<float16>(65520.0, overflow_policy::saturate).bits() == 0x7BFF);
static_assert(convert<float16>(-1e300, overflow_policy::saturate).bits() == 0xFBFF);
static_assert(convert<float16>(inf, overflow_policy::saturate).bits() == 0x7BFF);
static_assert(convert<float16>(inf, overflow_policy::standard).bits() == 0x7C00);
static_assert(isnan(convert<float16>(nan, overflow_policy::saturate)));
static_assert(bfloat16(0x1.FEFFFFFFFFp127).bits() == 0x7F7F && bfloat16(0x1.FFp127).bits() == 0x7F80);
static_assert(bfloat16(1e300).bits() == 0x7F80 && bfloat16(static_cast<float>(inf)).bits() == 0x7F80);
static_assert(convert<bfloat16>(1e300, overflow_policy::saturate).bits() == 0x7F7F);
static_assert(convert<bfloat16>(std::numeric_limits<float>::max(), overflow_policy::saturate).bits() == 0x7F7F);
static_assert(float8_e4m3(448.0).bits() == 0x7E && float8_e4m3(464.0).bits() == 0x7E);  // 464 ties to even 448
static_assert(float8_e4m3(464.0001).bits() == 0x7F && float8_e4m3(-1000).bits() == 0xFF);  // overflow -> NaN
static_assert(float8_e4m3(inf).bits() == 0x7F && float8_e4m3(-inf).bits() == 0xFF);
static_assert(convert<float8_e4m3>(1000.0, overflow_policy::saturate).bits() == 0x7E);
static_assert(convert<float8_e4m3>(-inf, overflow_policy::saturate).bits() == 0xFE);
static_assert(convert<float8_e4m3>(nan, overflow_policy::saturate).bits() == 0x7F);
static_assert(float8_e5m2(57344.0).bits() == 0x7B && float8_e5m2(61439.0).bits() == 0x7B);
static_assert(float8_e5m2(61440.0).bits() == 0x7C && float8_e5m2(-inf).bits() == 0xFC);  // tie -> inf
static_assert(convert<float8_e5m2>(61440.0f, overflow_policy::saturate).bits() == 0x7B);

// Integers, including the extremes of int64 and uint64.
static_assert(static_cast<double>(bfloat16(std::numeric_limits<std::int64_t>::min())) == -0x1p63);
static_assert(static_cast<double>(bfloat16(std::numeric_limits<std::int64_t>::max())) == 0x1p63);
static_assert(static_cast<double>(bfloat16(std::numeric_limits<std::uint64_t>::max())) == 0x1p64);
static_assert(bfloat16(257).bits() == 0x4380 && bfloat16(259).bits() == 0x4382);  // ties to even
static_assert(bfloat16((std::int64_t{1} << 60) + (std::int64_t{1} << 52) + 1).bits() == 0x5D81);
static_assert(float8_e4m3(7u).bits() == 0x4E && float8_e4m3(9).bits() == 0x51 && float8_e4m3(17).bits() == 0x58 && float8_e4m3(500).bits() == 0x7F);

// Exact conversion back.
static_assert(static_cast<float>(bfloat16::from_bits(0x0001)) == 0x1p-133f);
static_assert(static_cast<double>(float16::from_bits(0x3555)) == 0x1.554p-2);
static_assert(static_cast<double>(float8_e4m3::from_bits(0x01)) == 0x1p-9);
static_assert(static_cast<float>(float8_e5m2::from_bits(0x83)) == -0x1.8p-15f);

// --- Arithmetic and comparisons -------------------------------------------------------------------
static_assert(bfloat16(1) + bfloat16(1) == bfloat16(2));
static_assert(float16(1) + float16(1) == float16(2) && float8_e4m3(1) + float8_e4m3(1) == float8_e4m3(2) &&
              float8_e5m2(1) + float8_e5m2(1) == float8_e5m2(2));
static_assert((bfloat16(1) + bfloat16(0x1p-8)).bits() == 0x3F80);  // tie to even
static_assert((bfloat16(1) + bfloat16(0x1.8p-8)).bits() == 0x3F81);
static_assert((bfloat16(3) / bfloat16(10)).bits() == bfloat16(0.3).bits());
static_assert((float16(1) / float16(3)).bits() == 0x3555);
static_assert((float16(1) - float16(1)).bits() == 0x0000 && (-float16(1)).bits() == 0xBC00);
static_assert((float8_e4m3(256) + float8_e4m3(256)).bits() == 0x7F);  // 512 overflows to NaN
static_assert((float8_e5m2(57344) * float8_e5m2(2)).bits() == 0x7C);
static_assert((float16(0x1p-14) * float16(0x1p-10)).bits() == 0x0001);  // gradual underflow
static_assert([] {
    float16 x(1);
    x += float16(2);
    x *= float16(4);
    x -= float16(2);
    x /= float16(5);
    return x == float16(2);
}());
static_assert(-bfloat16(0.0) == bfloat16(0.0) && (-bfloat16(0.0)).bits() == 0x8000);
static_assert(bfloat16(1) < bfloat16(2) && bfloat16(2) > bfloat16(-2) && bfloat16(1) <= bfloat16(1) && bfloat16(1) != bfloat16(2));
static_assert(!(bfloat16(nan) == bfloat16(nan)) && bfloat16(nan) != bfloat16(nan));
static_assert(!(bfloat16(nan) < bfloat16(1)) && !(bfloat16(nan) > bfloat16(1)) && !(bfloat16(nan) >= bfloat16(nan)));
static_assert(!(float8_e4m3(nan) == float8_e4m3(nan)) && float8_e4m3(-1) < float8_e4m3(0));
static_assert(abs(bfloat16(-3)) == bfloat16(3) && fabs(float8_e4m3(-0.5)) == float8_e4m3(0.5));
static_assert(signbit(float16(-0.0)) && !signbit(float16(0.0)));

}  // namespace

// --- binary_format.hpp: one description per format, derived from its encoding ------------------
// Expected values from independent sources: IEEE 754-2019 Table 3.5 and std::numeric_limits for
// float/double; hand derivations for the 16-bit formats ((2 − 2^-10)·2^15 = 65504; bfloat16's max
// (2 − 2^-7)·2^127 = 0x1.FEp127, min normal 2^-126 like float's).
namespace vocabulary {
using attnref::binary_format;
using attnref::describe;
static_assert(describe(binary_format::float64).max_finite == std::numeric_limits<double>::max());
static_assert(describe(binary_format::float32).max_finite == static_cast<double>(std::numeric_limits<float>::max()));
static_assert(describe(binary_format::float16).max_finite == (2 - 0x1p-10) * 0x1p15);
static_assert(describe(binary_format::bfloat16).max_finite == 0x1.FEp127);
static_assert(describe(binary_format::float64).precision == std::numeric_limits<double>::digits);
static_assert(describe(binary_format::float32).precision == std::numeric_limits<float>::digits);
static_assert(describe(binary_format::bfloat16).precision == 8 && describe(binary_format::float16).precision == 11);
static_assert(describe(binary_format::float32).min_normal() == static_cast<double>(std::numeric_limits<float>::min()));
static_assert(describe(binary_format::float64).min_normal() == std::numeric_limits<double>::min());
static_assert(describe(binary_format::bfloat16).min_normal() == 0x1p-126 && describe(binary_format::float16).min_normal() == 0x1p-14);
static_assert(describe(binary_format::float64).max_exponent == std::numeric_limits<double>::max_exponent - 1);
static_assert(describe(binary_format::float16).max_exponent == 15 && describe(binary_format::float16).min_exponent == -14);
static_assert(attnref::unit_roundoff(binary_format::float32) == 0x1p-24 && attnref::unit_roundoff(binary_format::bfloat16) == 0x1p-8);
// The storage types' limits come from the same encodings.
static_assert(static_cast<double>(std::numeric_limits<float16>::max()) == describe(binary_format::float16).max_finite);
static_assert(static_cast<double>(std::numeric_limits<bfloat16>::max()) == describe(binary_format::bfloat16).max_finite);
// One name table: names round-trip, unknown names are rejected.
static_assert(attnref::format_name(binary_format::bfloat16) == "bfloat16");
static_assert(attnref::format_from_name("float16") == binary_format::float16);
static_assert(attnref::format_from_name("float64") == binary_format::float64);
static_assert(!attnref::format_from_name("fp16").has_value());
// round_to: once, to nearest even, directly from the double (a tie goes to even; no double rounding
// through float: 1 + 2^-8 + 2^-30 rounds up in bfloat16, though float would first make it a tie).
static_assert(attnref::round_to(binary_format::bfloat16, 1 + 0x1p-8) == 1);
static_assert(attnref::round_to(binary_format::bfloat16, 1 + 3 * 0x1p-8) == 1 + 0x1p-6);
static_assert(attnref::round_to(binary_format::bfloat16, 1 + 0x1p-8 + 0x1p-30) == 1 + 0x1p-7);
static_assert(attnref::round_to(binary_format::float16, 65520.0) == inf);  // max + half an ulp: overflow
static_assert(attnref::round_to(binary_format::float16, 3 * 0x1p-26) == 0x1p-24);  // subnormal grid 2^-24
static_assert(attnref::round_to(binary_format::float32, 0.1) == static_cast<double>(0.1f));
static_assert(attnref::encode(binary_format::float16, 1.0) == 0x3C00 && attnref::encode(binary_format::bfloat16, -2.0) == 0xC000);
// Payload-keeping widening (npy): float16 0xFC01 (negative, payload 1) → binary64 with the payload
// shifted by 52 − 10 = 42 bits, as numpy's npy_half_to_double does.
static_assert(std::bit_cast<std::uint64_t>(attnref::encoding::widen_to_double<attnref::encoding::float16>(0xFC01)) ==
              0xFFF0000000000000ULL + (std::uint64_t{1} << 42));
static_assert(attnref::encoding::widen_to_double<attnref::encoding::float16>(0x3555) == 0.333251953125);
}  // namespace vocabulary
