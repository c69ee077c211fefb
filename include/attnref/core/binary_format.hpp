#pragma once
/// \file core/binary_format.hpp
/// Owns: the one description of a binary floating-point format, for every module that names,
/// rounds to or reasons about one (formats, math, certify, tolerance, generator, npy, study).
///
/// Two layers, one source of facts:
/// - attnref::encoding: a format's bit-level encoding (binary<Storage, ExponentBits, FractionBits,
///   HasInfinity>), its named instances (binary64, binary32, bfloat16, float16, float8_e4m3fn,
///   float8_e5m2), decoding and the one correctly rounded conversion between encodings
///   (convert_bits; from double, float or an integer, in one rounding, constexpr).
/// - attnref::binary_format: the interchange formats of golden cases and candidates (float64,
///   float32, bfloat16, float16) as a value, with describe(f) -> format_description (name,
///   precision, exponent range, max finite, unit roundoff, storage bits, .npy descriptor), every
///   number derived from the encoding above, never typed by hand; format_name / format_from_name
///   (the one name table), round_to(f, x) (x rounded once to f, as the exact double) and
///   encode(f, x) (its bits).
/// Rounding from MPFR lives in binary_format_mpfr.hpp, so that this header stays free of MPFR.
///
/// Example:
///     static_assert(attnref::round_to(attnref::binary_format::bfloat16, 1 + 0x1p-8) == 1);  // a tie: even
///     static_assert(attnref::describe(attnref::binary_format::float16).max_finite == 65504);

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>

#include "attnref/core/name_table.hpp"

namespace attnref {

/// What a conversion does with a finite value too large for the format and with infinities.
/// - standard: the IEEE rule. Round to nearest even as if the exponent were unbounded; a result
///   beyond the largest finite value becomes ±inf, or NaN in a format without infinities (E4M3FN).
///   ±inf converts to ±inf (NaN in E4M3FN).
/// - saturate: a result beyond the largest finite value becomes ±max, and ±inf becomes ±max
///   (as ml_dtypes' saturating casts). NaN stays NaN under both policies.
enum class overflow_policy { standard, saturate };

namespace encoding {

/// Description of a binary floating-point encoding: sign, exponent_bits, fraction_bits, bias
/// 2^(exponent_bits-1) - 1. With has_infinity (IEEE-like), the all-ones exponent holds ±inf
/// (fraction 0) and NaN (fraction != 0). Without it (the OCP "FN" formats), the all-ones exponent
/// holds finite values except the single NaN S.1...1.1...1.
template <class Storage, int ExponentBits, int FractionBits, bool HasInfinity>
struct binary {
    using storage = Storage;
    static constexpr int exponent_bits = ExponentBits;
    static constexpr int fraction_bits = FractionBits;
    static constexpr int digits = FractionBits + 1;
    static constexpr bool has_infinity = HasInfinity;
    static constexpr int bias = (1 << (ExponentBits - 1)) - 1;
    static constexpr int min_exponent = 1 - bias;  // exponent of the smallest normal, 2^min_exponent
    static constexpr int total_bits = 1 + ExponentBits + FractionBits;
    static constexpr std::uint64_t sign_mask = std::uint64_t{1} << (ExponentBits + FractionBits);
    static constexpr std::uint64_t fraction_mask = (std::uint64_t{1} << FractionBits) - 1;
    static constexpr std::uint64_t exponent_field_max = (std::uint64_t{1} << ExponentBits) - 1;
    static constexpr std::uint64_t infinity_bits = exponent_field_max << FractionBits;  // IEEE-like only
    static constexpr std::uint64_t quiet_nan_bits =
        HasInfinity ? infinity_bits | (std::uint64_t{1} << (FractionBits - 1)) : infinity_bits | fraction_mask;
    static constexpr std::uint64_t signaling_nan_bits = HasInfinity ? infinity_bits | 1 : quiet_nan_bits;
    static constexpr std::uint64_t max_finite_bits =
        HasInfinity ? ((exponent_field_max - 1) << FractionBits) | fraction_mask : infinity_bits | (fraction_mask - 1);
    static constexpr int max_exponent = static_cast<int>(max_finite_bits >> FractionBits) - bias;  // of max
    /// IEEE 754-2019's binary16, binary32, binary64 (bfloat16 and the OCP 8-bit formats are not).
    static constexpr bool is_iec559 =
        HasInfinity && ((ExponentBits == 5 && FractionBits == 10) || (ExponentBits == 8 && FractionBits == 23) ||
                        (ExponentBits == 11 && FractionBits == 52));
    static_assert(sizeof(Storage) * 8 >= static_cast<std::size_t>(total_bits));
};

// The named encodings, one line each (is_iec559: an IEEE 754 interchange format, derived). The
// names are the numpy / ml_dtypes dtype names.
struct binary64 : binary<std::uint64_t, 11, 52, true> { static constexpr std::string_view name = "float64"; };
struct binary32 : binary<std::uint32_t, 8, 23, true> { static constexpr std::string_view name = "float32"; };
struct bfloat16 : binary<std::uint16_t, 8, 7, true> { static constexpr std::string_view name = "bfloat16"; };  // Google Brain
struct float16 : binary<std::uint16_t, 5, 10, true> { static constexpr std::string_view name = "float16"; };    // IEEE binary16
struct float8_e4m3fn : binary<std::uint8_t, 4, 3, false> { static constexpr std::string_view name = "float8_e4m3fn"; };  // OCP, no inf
struct float8_e5m2 : binary<std::uint8_t, 5, 2, true> { static constexpr std::string_view name = "float8_e5m2"; };  // OCP E5M2

/// A finite nonzero value q * 2^exponent, or a special value.
struct decoded {
    enum class kind { zero, finite, infinity, nan };
    kind what;
    bool negative;
    std::uint64_t q;
    int exponent;
};

template <class Format>
constexpr decoded decode(std::uint64_t bits) {
    const bool negative = (bits & Format::sign_mask) != 0;
    const std::uint64_t exponent_field = (bits >> Format::fraction_bits) & Format::exponent_field_max;
    const std::uint64_t fraction = bits & Format::fraction_mask;
    if (exponent_field == Format::exponent_field_max) {
        if constexpr (Format::has_infinity) {
            return {fraction == 0 ? decoded::kind::infinity : decoded::kind::nan, negative, 0, 0};
        } else {
            if (fraction == Format::fraction_mask) return {decoded::kind::nan, negative, 0, 0};
        }
    }
    if (exponent_field == 0) {
        if (fraction == 0) return {decoded::kind::zero, negative, 0, 0};
        return {decoded::kind::finite, negative, fraction, Format::min_exponent - Format::fraction_bits};
    }
    return {decoded::kind::finite, negative, fraction | (std::uint64_t{1} << Format::fraction_bits),
            static_cast<int>(exponent_field) - Format::bias - Format::fraction_bits};
}

/// Rounds q * 2^exponent (q != 0) to Format, to nearest with ties to even, in one step: the result's
/// quantum is 2^(max(floor(log2 |x|), min_exponent) - fraction_bits); q is shifted right onto that
/// grid, and the dropped bits decide the rounding. A carry out of the fraction moves into the
/// exponent field on its own, because the encoding of |x| is (biased exponent - 1) * 2^fraction_bits
/// plus the significand including its leading bit.
template <class Format>
constexpr std::uint64_t round_finite(bool negative, std::uint64_t q, int exponent, overflow_policy policy) {
    const int top = exponent + std::bit_width(q) - 1;  // floor(log2 |x|)
    const int result_exponent = top > Format::min_exponent ? top : Format::min_exponent;
    const int quantum = result_exponent - Format::fraction_bits;
    const int shift = quantum - exponent;
    std::uint64_t r = 0;
    if (shift <= 0) {
        r = q << -shift;  // exact; r <= 2^(fraction_bits + 1)
    } else if (shift >= 64) {
        // |x| < 2^(exponent + 64) <= 2^(quantum - shift + 64): at most half a quantum, and a tie
        // (q == 2^63, shift == 64) goes to the even neighbour, zero.
        r = (shift == 64 && q > (std::uint64_t{1} << 63)) ? 1 : 0;
    } else {
        r = q >> shift;
        const std::uint64_t dropped = q & ((std::uint64_t{1} << shift) - 1);
        const std::uint64_t half = std::uint64_t{1} << (shift - 1);
        if (dropped > half || (dropped == half && (r & 1) != 0)) ++r;
    }
    std::uint64_t magnitude =
        (static_cast<std::uint64_t>(result_exponent - Format::min_exponent) << Format::fraction_bits) + r;
    if (magnitude > Format::max_finite_bits) {
        if (policy == overflow_policy::saturate) {
            magnitude = Format::max_finite_bits;
        } else {
            magnitude = Format::has_infinity ? Format::infinity_bits : Format::quiet_nan_bits;
        }
    }
    return magnitude | (negative ? Format::sign_mask : 0);
}

/// Converts the bits of a value in Source to the bits of the correctly rounded value in Dest.
/// NaN becomes Dest's quiet NaN (sign kept, payload not).
template <class Dest, class Source>
constexpr typename Dest::storage convert_bits(std::uint64_t bits, overflow_policy policy) {
    const decoded d = decode<Source>(bits);
    const std::uint64_t sign = d.negative ? Dest::sign_mask : 0;
    std::uint64_t result = 0;
    switch (d.what) {
        case decoded::kind::nan: result = Dest::quiet_nan_bits | sign; break;
        case decoded::kind::zero: result = sign; break;
        case decoded::kind::infinity:
            if (policy == overflow_policy::saturate) {
                result = Dest::max_finite_bits | sign;
            } else {
                result = (Dest::has_infinity ? Dest::infinity_bits : Dest::quiet_nan_bits) | sign;
            }
            break;
        case decoded::kind::finite: result = round_finite<Dest>(d.negative, d.q, d.exponent, policy); break;
    }
    return static_cast<typename Dest::storage>(result);
}

/// Bits of the correctly rounded value of an integer in Dest.
template <class Dest, class I>
constexpr typename Dest::storage convert_integer(I i, overflow_policy policy) {
    if (i == 0) return 0;
    const bool negative = i < 0;
    // Magnitude in uint64 arithmetic, so that the most negative value needs no special case.
    const std::uint64_t q = negative ? std::uint64_t{0} - static_cast<std::uint64_t>(i) : static_cast<std::uint64_t>(i);
    return static_cast<typename Dest::storage>(round_finite<Dest>(negative, q, 0, policy));
}

/// The exact value of an encoding's bits as a double (every value of a format of at most 53 bits
/// of precision and binary64's exponent range is a double). NaN -> quiet NaN, payload not kept.
template <class Format>
constexpr double to_double(std::uint64_t bits) {
    return std::bit_cast<double>(convert_bits<binary64, Format>(bits, overflow_policy::standard));
}

/// The exact value as a double, keeping a NaN's sign and payload (quiet bit included) by shifting
/// the fraction into binary64's, as IEEE 754 widening and numpy's npy_half_to_double do. For the
/// IEEE-like encodings (has_infinity).
template <class Format>
constexpr double widen_to_double(std::uint64_t bits) {
    static_assert(Format::has_infinity, "payload-keeping widening is for IEEE-like encodings");
    if (decode<Format>(bits).what == decoded::kind::nan) {
        const std::uint64_t sign = (bits & Format::sign_mask) != 0 ? binary64::sign_mask : 0;
        return std::bit_cast<double>(sign | binary64::infinity_bits |
                                     ((bits & Format::fraction_mask) << (binary64::fraction_bits - Format::fraction_bits)));
    }
    return to_double<Format>(bits);
}

/// x rounded once, to nearest even, into Format; the bits.
template <class Format>
constexpr typename Format::storage from_double(double x, overflow_policy policy = overflow_policy::standard) {
    return convert_bits<Format, binary64>(std::bit_cast<std::uint64_t>(x), policy);
}

}  // namespace encoding

/// The interchange formats of golden cases, candidates and generated inputs.
enum class binary_format : std::uint8_t { float64, float32, bfloat16, float16 };

/// Everything a bound, a reader or a certifier needs to know about a format. Every number is
/// derived from the encoding (describe_encoding), none typed by hand.
struct format_description {
    const char* name;       ///< numpy / ml_dtypes dtype name ("float64", "bfloat16", ...)
    int precision;          ///< p: significand bits, hidden bit included
    int min_exponent;       ///< the smallest normal is 2^min_exponent
    int max_exponent;       ///< the largest finite value is below 2^(max_exponent + 1)
    double max_finite;      ///< the largest finite value
    int storage_bits;       ///< bits of one value
    const char* npy_descr;  ///< how golden .npy files store it: "<f8", "<f4", "<f2"; bit patterns "<u2", "|u1"
    /// 2^min_exponent.
    constexpr double min_normal() const { return pow2(min_exponent); }

private:
    static constexpr double pow2(int e) {
        double r = 1;
        for (; e < 0; ++e) r /= 2;
        for (; e > 0; --e) r *= 2;
        return r;
    }
};

/// The description of an encoding (its numbers computed from its bit layout).
template <class Encoding>
constexpr format_description describe_encoding(const char* npy_descr) {
    return {Encoding::name.data(),
            Encoding::digits,
            Encoding::min_exponent,
            Encoding::max_exponent,
            encoding::to_double<Encoding>(Encoding::max_finite_bits),
            Encoding::total_bits,
            npy_descr};
}

constexpr format_description describe(binary_format f) {
    switch (f) {
        case binary_format::float64: return describe_encoding<encoding::binary64>("<f8");
        case binary_format::float32: return describe_encoding<encoding::binary32>("<f4");
        case binary_format::bfloat16: return describe_encoding<encoding::bfloat16>("<u2");
        case binary_format::float16: return describe_encoding<encoding::float16>("<f2");
    }
    return describe_encoding<encoding::binary64>("<f8");
}

/// Every binary_format with its name: the one name table (also usable as a (name, value) choice
/// list by readers).
inline constexpr std::pair<const char*, binary_format> binary_format_names[] = {
    {describe(binary_format::float64).name, binary_format::float64},
    {describe(binary_format::float32).name, binary_format::float32},
    {describe(binary_format::bfloat16).name, binary_format::bfloat16},
    {describe(binary_format::float16).name, binary_format::float16},
};

constexpr std::string_view format_name(binary_format f) { return describe(f).name; }
constexpr std::optional<binary_format> format_from_name(std::string_view n) { return value_in(binary_format_names, n); }

/// Unit roundoff u = 2^-p of the format (rounding to nearest), exact.
constexpr double unit_roundoff(binary_format f) {
    double u = 1;
    for (int i = 0; i < describe(f).precision; ++i) u /= 2;
    return u;
}

/// The bits of x rounded once (to nearest even, IEEE overflow) into f, in f's encoding.
constexpr std::uint64_t encode(binary_format f, double x) {
    switch (f) {
        case binary_format::float64: return std::bit_cast<std::uint64_t>(x);
        case binary_format::float32: return std::bit_cast<std::uint32_t>(static_cast<float>(x));
        case binary_format::bfloat16: return encoding::from_double<encoding::bfloat16>(x);
        case binary_format::float16: return encoding::from_double<encoding::float16>(x);
    }
    return 0;
}

/// x rounded once (to nearest even, subnormals kept, IEEE overflow to ±inf) into f, returned as the
/// exact double value. float32 through the hardware conversion (round to nearest at run time, see
/// fp_environment.hpp), the others from the bits of x.
constexpr double round_to(binary_format f, double x) {
    switch (f) {
        case binary_format::float64: return x;
        case binary_format::float32: return static_cast<double>(static_cast<float>(x));
        case binary_format::bfloat16: return encoding::to_double<encoding::bfloat16>(encode(f, x));
        case binary_format::float16: return encoding::to_double<encoding::float16>(encode(f, x));
    }
    return x;
}

}  // namespace attnref
