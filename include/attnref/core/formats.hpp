#pragma once
/// \file core/formats.hpp
/// Owns: the emulated storage formats as scalar types (storage_float, its arithmetic, math functions
/// and numeric_limits). Their encodings and the one rounding conversion are binary_format.hpp's.
/// Emulated low-precision storage formats as scalar types: bfloat16, float16, float8_e4m3 (OCP
/// E4M3FN) and float8_e5m2, in attnref::formats and re-exported into attnref.
///
/// Each type stores only its bit pattern. Every conversion into a format rounds once, to nearest
/// with ties to even, directly from the bits of the source (float, double or an integer): converting
/// double -> float -> bfloat16 would round twice and is never done. Subnormals are kept.
///
/// Arithmetic (+ - * /) converts both operands to float exactly, operates in float, and rounds the
/// float result to the format once. This is the format's correctly rounded operation, not an
/// approximation of it: for + - * / (and sqrt), rounding first to precision p' and then to p gives the
/// correctly rounded p-bit result whenever p' >= 2p + 2 (Figueroa; FIELD-NOTES §5). float has
/// p' = 24 >= 2p + 2 for all four formats (p = 8, 11, 4, 3), and float's exponent range contains each
/// format's, subnormals included (bfloat16 shares float's exponent range, so its subnormal grid is
/// float's with 16 fewer bits). The math functions (exp, log, ...) are attnref::math's float kernels
/// rounded to the format: as accurate as the float kernel, then rounded once.
///
/// Example:
///     using attnref::bfloat16;
///     constexpr bfloat16 x(1.00390625);            // 1 + 2^-8: a tie, rounds to even = 1
///     static_assert(x == bfloat16(1));
///     static_assert(bfloat16(1e39).bits() == 0x7F80);  // overflow -> +inf
///     static_assert(attnref::convert<bfloat16>(1e39, attnref::overflow_policy::saturate).bits() == 0x7F7F);

#include <bit>
#include <cmath>
#include <compare>
#include <concepts>
#include <cstdint>
#include <limits>
#include <string_view>

#include "attnref/core/binary_format.hpp"
#include "attnref/core/math.hpp"
#include "attnref/core/scalar.hpp"

namespace attnref::formats {

using attnref::overflow_policy;

namespace detail {
// The encodings and the one rounding conversion between them live in binary_format.hpp.
using encoding::binary32;
using encoding::binary64;
using encoding::convert_bits;
using encoding::convert_integer;
using encoding::decode;
using encoding::decoded;
}  // namespace detail

/// A floating-point number stored in the encoding Format (one of binary_format.hpp's encoding::*);
/// see the aliases bfloat16, float16, float8_e4m3, float8_e5m2 below for each encoding's contract.
/// - Construction from float, double or an integer rounds once to nearest even, overflow per
///   overflow_policy::standard; use convert<F>(x, overflow_policy::saturate) to saturate.
/// - Explicit conversion to float and double is exact (NaN payloads are not kept: NaN -> quiet NaN).
/// - + - * / round the exact result once (computed in float; exact emulation, see the file comment).
/// - Comparisons follow IEEE: NaN is unordered and unequal to everything, -0 == +0.
template <class Format>
class storage_float {
public:
    using format = Format;
    using storage_type = typename Format::storage;

    constexpr storage_float() = default;
    explicit constexpr storage_float(float x)
        : bits_(detail::convert_bits<Format, detail::binary32>(std::bit_cast<std::uint32_t>(x),
                                                                       overflow_policy::standard)) {}
    explicit constexpr storage_float(double x)
        : bits_(detail::convert_bits<Format, detail::binary64>(std::bit_cast<std::uint64_t>(x),
                                                                       overflow_policy::standard)) {}
    template <std::integral I>
        requires(!std::same_as<I, bool>)
    explicit constexpr storage_float(I i) : bits_(detail::convert_integer<Format>(i, overflow_policy::standard)) {}

    static constexpr storage_float from_bits(storage_type bits) {
        storage_float x;
        x.bits_ = bits;
        return x;
    }
    constexpr storage_type bits() const { return bits_; }

    explicit constexpr operator float() const {
        return std::bit_cast<float>(
            detail::convert_bits<detail::binary32, Format>(bits_, overflow_policy::standard));
    }
    explicit constexpr operator double() const {
        return std::bit_cast<double>(
            detail::convert_bits<detail::binary64, Format>(bits_, overflow_policy::standard));
    }

    friend constexpr storage_float operator+(storage_float a) { return a; }
    friend constexpr storage_float operator-(storage_float a) {
        return from_bits(static_cast<storage_type>(a.bits_ ^ Format::sign_mask));
    }
    friend constexpr storage_float operator+(storage_float a, storage_float b) {
        return storage_float(static_cast<float>(a) + static_cast<float>(b));
    }
    friend constexpr storage_float operator-(storage_float a, storage_float b) {
        return storage_float(static_cast<float>(a) - static_cast<float>(b));
    }
    friend constexpr storage_float operator*(storage_float a, storage_float b) {
        return storage_float(static_cast<float>(a) * static_cast<float>(b));
    }
    friend constexpr storage_float operator/(storage_float a, storage_float b) {
        return storage_float(static_cast<float>(a) / static_cast<float>(b));
    }
    constexpr storage_float& operator+=(storage_float b) { return *this = *this + b; }
    constexpr storage_float& operator-=(storage_float b) { return *this = *this - b; }
    constexpr storage_float& operator*=(storage_float b) { return *this = *this * b; }
    constexpr storage_float& operator/=(storage_float b) { return *this = *this / b; }

    friend constexpr bool operator==(storage_float a, storage_float b) {
        return static_cast<float>(a) == static_cast<float>(b);
    }
    friend constexpr std::partial_ordering operator<=>(storage_float a, storage_float b) {
        return static_cast<float>(a) <=> static_cast<float>(b);
    }

private:
    storage_type bits_ = 0;
};

/// Google Brain bfloat16: 1 sign, 8 exponent (bias 127), 7 fraction bits; p = 8, the exponent range
/// of float. Max 0x1.FEp127 (0x7F7F), min normal 2^-126, min subnormal 2^-133. ±inf = 0x7F80/0xFF80;
/// NaN: exponent all ones, fraction != 0; conversions produce the quiet NaN 0x7FC0 (sign kept).
/// Rounding to nearest even; overflow -> ±inf (saturate: ±max). numpy/ml_dtypes dtype
/// `bfloat16`; golden .npy files store the bit patterns as uint16 '<u2'.
using bfloat16 = storage_float<encoding::bfloat16>;
/// IEEE 754 binary16: 1 sign, 5 exponent (bias 15), 10 fraction bits; p = 11. Max 65504 (0x7BFF),
/// min normal 2^-14, min subnormal 2^-24. ±inf = 0x7C00/0xFC00; NaN: exponent all ones, fraction != 0;
/// conversions produce the quiet NaN 0x7E00 (sign kept). Rounding to nearest even; overflow -> ±inf
/// (saturate: ±max). numpy dtype `float16`; golden .npy files store it as numpy float16 '<f2'.
using float16 = storage_float<encoding::float16>;
/// OCP 8-bit E4M3FN: 1 sign, 4 exponent (bias 7), 3 fraction bits; p = 4. No infinity: the all-ones
/// exponent holds finite values up to max 448 (0x7E) except the only NaN, S.1111.111 (0x7F/0xFF).
/// Min normal 2^-6, min subnormal 2^-9. Rounding to nearest even (464 ties to 448); overflow and ±inf
/// -> NaN (saturate: ±448). ml_dtypes dtype `float8_e4m3fn`; golden .npy files store the bit
/// patterns as uint8 '|u1'.
using float8_e4m3 = storage_float<encoding::float8_e4m3fn>;
/// OCP 8-bit E5M2 (IEEE-like): 1 sign, 5 exponent (bias 15), 2 fraction bits; p = 3. Max 57344 (0x7B),
/// min normal 2^-14, min subnormal 2^-16. ±inf = 0x7C/0xFC; NaN: exponent all ones, fraction != 0;
/// conversions produce the quiet NaN 0x7E (sign kept). Rounding to nearest even; overflow -> ±inf
/// (saturate: ±max). ml_dtypes dtype `float8_e5m2`; golden .npy files store the bit patterns as
/// uint8 '|u1'.
using float8_e5m2 = storage_float<encoding::float8_e5m2>;

/// x rounded to nearest even in F, with the chosen overflow policy (see overflow_policy).
template <class F>
constexpr F convert(double x, overflow_policy policy) {
    return F::from_bits(
        detail::convert_bits<typename F::format, detail::binary64>(std::bit_cast<std::uint64_t>(x), policy));
}
/// x rounded to nearest even in F, with the chosen overflow policy (see overflow_policy).
template <class F>
constexpr F convert(float x, overflow_policy policy) {
    return F::from_bits(
        detail::convert_bits<typename F::format, detail::binary32>(std::bit_cast<std::uint32_t>(x), policy));
}

// Classification and magnitude: exact, on the bits.
template <class Format>
constexpr bool isnan(storage_float<Format> x) {
    return detail::decode<Format>(x.bits()).what == detail::decoded::kind::nan;
}
template <class Format>
constexpr bool isinf(storage_float<Format> x) {
    return detail::decode<Format>(x.bits()).what == detail::decoded::kind::infinity;
}
template <class Format>
constexpr bool isfinite(storage_float<Format> x) {
    const detail::decoded::kind k = detail::decode<Format>(x.bits()).what;
    return k == detail::decoded::kind::zero || k == detail::decoded::kind::finite;
}
template <class Format>
constexpr bool signbit(storage_float<Format> x) {
    return (x.bits() & Format::sign_mask) != 0;
}
template <class Format>
constexpr storage_float<Format> abs(storage_float<Format> x) {
    return storage_float<Format>::from_bits(static_cast<typename Format::storage>(x.bits() & ~Format::sign_mask));
}
template <class Format>
constexpr storage_float<Format> fabs(storage_float<Format> x) {
    return abs(x);
}

// Elementary functions: attnref::math's float kernel, rounded once to the format. Error: the float
// kernel's error (a few float ulps) plus half a format ulp; sqrt is correctly rounded when the float
// kernel is (p' = 24 >= 2p + 2 again).
#define ATTNREF_FORMATS_MATH_FUNCTION(fn)                                         \
    template <class Format>                                                       \
    constexpr storage_float<Format> fn(storage_float<Format> x) {                 \
        return storage_float<Format>(attnref::math::fn(static_cast<float>(x)));   \
    }
ATTNREF_FORMATS_MATH_FUNCTION(exp)
ATTNREF_FORMATS_MATH_FUNCTION(log)
ATTNREF_FORMATS_MATH_FUNCTION(log1p)
ATTNREF_FORMATS_MATH_FUNCTION(expm1)
ATTNREF_FORMATS_MATH_FUNCTION(sqrt)
ATTNREF_FORMATS_MATH_FUNCTION(tanh)
#undef ATTNREF_FORMATS_MATH_FUNCTION

namespace detail {
using encoding::to_double;
/// floor(log10(x)) for x >= 1, by comparison with powers of ten computed in double; these are
/// inexact above 10^22, which cannot matter for the formats' max and 1/min (far from powers of ten).
constexpr int floor_log10(double x) {
    int k = 0;
    double power = 10;
    while (power <= x) {
        power *= 10;
        ++k;
    }
    return k;
}
}  // namespace detail

/// Per-tensor scaled FP8 quantisation, as FlashAttention-3, cuDNN and Transformer Engine take FP8
/// inputs: a tensor x is stored as codes q8 = round(x·s) in F (float8_e4m3 or float8_e5m2) with one
/// scale s per tensor, and the kernel multiplies its fp32 accumulators by descale = 1/s.
///
///   scale rule     s = 2^e, the largest power of two with amax·s <= max finite of F (448 for E4M3FN,
///                  57344 for E5M2), amax = max |x| over the tensor's finite values: Transformer
///                  Engine's amax rule with margin 0, rounded down to a power of two so that
///                  q8·descale is exact in binary64 (and in binary32 and bfloat16 within their
///                  exponent range). amax = 0 (or no finite value): s = 1. e is kept within
///                  [-1022, 1022] so that s and 1/s are normal doubles.
///   rounding       x·s (exact: a power-of-two scaling) rounded once to nearest even into F, the OCP
///                  8-bit specification's saturating conversion: a magnitude beyond max finite
///                  becomes ±max and ±inf becomes ±max. With the amax scale no finite value exceeds
///                  max (amax·s <= max and rounding is monotone, max being a value of F), so
///                  saturation never acts on finite inputs; it is chosen over the non-saturating
///                  mode (E4M3FN: overflow -> NaN, its only NaN code S.1111.111; E5M2: -> ±inf) because
///                  the FP8 casts of those libraries saturate. NaN stays NaN (E4M3FN 0x7F/0xFF, E5M2
///                  0x7E/0xFE). Subnormals of F are kept (E4M3FN down to 2^-9, E5M2 down to 2^-16);
///                  below half the smallest subnormal x·s rounds to ±0.
///   effective x    q8·descale, the value the kernel computes on (exact in binary64).
struct fp8_tensor_scale {
    int exponent = 0;     // e: s = 2^e
    double scale = 1;     // s
    double descale = 1;   // 1/s = 2^-e
};

/// The scale of a tensor whose largest finite magnitude is amax (see fp8_tensor_scale).
template <class F>
inline fp8_tensor_scale fp8_scale_for(double amax) {
    const double max = static_cast<double>(std::numeric_limits<F>::max());
    int e = 0;
    if (amax > 0 && amax <= std::numeric_limits<double>::max()) {
        double a = amax;  // amax·2^e, exact: halving only above max (normal), doubling is exact
        while (a > max && e > -1022) a /= 2, --e;
        while (a * 2 <= max && e < 1022) a *= 2, ++e;
    }
    fp8_tensor_scale s;
    s.exponent = e;
    s.scale = std::ldexp(1.0, e);
    s.descale = std::ldexp(1.0, -e);
    return s;
}

/// x·s rounded to nearest even into F with the OCP saturating conversion (see fp8_tensor_scale).
template <class F>
inline F fp8_quantise(double x, const fp8_tensor_scale& s) {
    return convert<F>(x * s.scale, overflow_policy::saturate);
}

/// The value a kernel computes on for the code q: q·descale (exact in binary64).
template <class F>
inline double fp8_dequantise(F q, const fp8_tensor_scale& s) {
    return static_cast<double>(q) * s.descale;
}

}  // namespace attnref::formats

namespace attnref {

using formats::bfloat16;
using formats::convert;
using formats::fp8_dequantise;
using formats::fp8_quantise;
using formats::fp8_scale_for;
using formats::fp8_tensor_scale;
using formats::float16;
using formats::float8_e4m3;
using formats::float8_e5m2;

template <class Format>
struct scalar_traits<formats::storage_float<Format>> {
    static constexpr int digits = Format::digits;
    static constexpr formats::storage_float<Format> epsilon() {
        // 2^(1 - digits): biased exponent bias + 1 - digits, fraction 0.
        return formats::storage_float<Format>::from_bits(
            static_cast<typename Format::storage>(static_cast<std::uint64_t>(Format::bias + 1 - Format::digits)
                                                  << Format::fraction_bits));
    }
    static constexpr std::string_view name = Format::name;
};

}  // namespace attnref

namespace std {
template <class Format>
class numeric_limits<attnref::formats::storage_float<Format>> {
    using F = attnref::formats::storage_float<Format>;
    using S = typename Format::storage;

public:
    static constexpr bool is_specialized = true;
    static constexpr bool is_signed = true;
    static constexpr bool is_integer = false;
    static constexpr bool is_exact = false;
    static constexpr bool has_infinity = Format::has_infinity;
    static constexpr bool has_quiet_NaN = true;
    static constexpr bool has_signaling_NaN = Format::has_infinity;  // E4M3FN has a single NaN
    static constexpr std::float_denorm_style has_denorm = std::denorm_present;
    static constexpr bool has_denorm_loss = false;
    static constexpr std::float_round_style round_style = std::round_to_nearest;
    static constexpr bool is_iec559 = Format::is_iec559;
    static constexpr bool is_bounded = true;
    static constexpr bool is_modulo = false;
    static constexpr int digits = Format::digits;
    // floor((p - 1) log10 2) and ceil(p log10 2 + 1); log10 2 = 0.30103 is close enough for p <= 11.
    static constexpr int digits10 = (Format::digits - 1) * 30103 / 100000;
    static constexpr int max_digits10 = 2 + Format::digits * 30103 / 100000;
    static constexpr int radix = 2;
    static constexpr int min_exponent = Format::min_exponent + 1;  // C convention: 2^(e-1) normal
    static constexpr int max_exponent = Format::max_exponent + 1;
    // ceil(log10(min normal)) and floor(log10(max)).
    static constexpr int min_exponent10 =
        -attnref::formats::detail::floor_log10(1 / attnref::formats::detail::to_double<Format>(std::uint64_t{1} << Format::fraction_bits));
    static constexpr int max_exponent10 =
        attnref::formats::detail::floor_log10(attnref::formats::detail::to_double<Format>(Format::max_finite_bits));
    static constexpr bool traps = false;
    static constexpr bool tinyness_before = false;

    static constexpr F min() noexcept { return F::from_bits(static_cast<S>(S{1} << Format::fraction_bits)); }
    static constexpr F max() noexcept { return F::from_bits(static_cast<S>(Format::max_finite_bits)); }
    static constexpr F lowest() noexcept {
        return F::from_bits(static_cast<S>(Format::max_finite_bits | Format::sign_mask));
    }
    static constexpr F epsilon() noexcept { return attnref::scalar_traits<F>::epsilon(); }
    static constexpr F round_error() noexcept { return F(0.5); }
    static constexpr F infinity() noexcept {
        return Format::has_infinity ? F::from_bits(static_cast<S>(Format::infinity_bits)) : F();
    }
    static constexpr F quiet_NaN() noexcept { return F::from_bits(static_cast<S>(Format::quiet_nan_bits)); }
    static constexpr F signaling_NaN() noexcept { return F::from_bits(static_cast<S>(Format::signaling_nan_bits)); }
    static constexpr F denorm_min() noexcept { return F::from_bits(S{1}); }
};
}  // namespace std
