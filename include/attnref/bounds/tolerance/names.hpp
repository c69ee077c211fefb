#pragma once
/// \file bounds/tolerance/names.hpp
/// Owns: the tolerance models' vocabulary — the candidate's format (binary_format.hpp's
/// binary_format, here candidate_format), the model names, the accumulation the bounds assume for
/// each format, torch.testing's per-dtype rtol/atol, and the exact ULP distance.

#include <bit>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>

#include "attnref/core/binary_format.hpp"
#include "attnref/core/name_table.hpp"

namespace attnref::tolerance {

/// Format the candidate computed and stored its results in: one of binary_format.hpp's formats
/// (names, unit roundoff, rounding: format_name, format_from_name, unit_roundoff, round_to).
using candidate_format = binary_format;
using attnref::format_from_name;
using attnref::format_name;
using attnref::round_to;
using attnref::unit_roundoff;

enum class tolerance_model { data_aware, worst_case, assert_close, ulp, baseline };

inline constexpr std::pair<const char*, tolerance_model> tolerance_model_names[] = {
    {"data-aware", tolerance_model::data_aware}, {"worst-case", tolerance_model::worst_case},
    {"assert-close", tolerance_model::assert_close}, {"ulp", tolerance_model::ulp}, {"baseline", tolerance_model::baseline}};
constexpr std::string_view model_name(tolerance_model m) { return name_in(tolerance_model_names, m); }
constexpr std::optional<tolerance_model> model_from_name(std::string_view n) { return value_in(tolerance_model_names, n); }

/// Unit roundoff of the accumulation the data-aware bound assumes: fp32 (2^-24) for bfloat16 and
/// float16 candidates — every bf16/fp16 attention kernel (FlashAttention, cuDNN, PyTorch's math
/// backend) accumulates dot products, softmax sums and P·V in fp32 and rounds to 16 bits only when
/// storing Q/K/V, P, head outputs and the output — and the format's own u otherwise. A 16-bit
/// candidate that also accumulates in 16 bits is less accurate than that and is reported as such.
constexpr double accumulate_roundoff(candidate_format f) {
    return f == candidate_format::bfloat16 || f == candidate_format::float16 ? unit_roundoff(candidate_format::float32)
                                                                             : unit_roundoff(f);
}

/// A declared precision policy (`attnref check --policy NAME`, policies.hpp's roundoffs_of_policy):
/// the unit roundoffs of the formats the candidate stores in (inputs, Q/K/V, head outputs), accumulates
/// in, stores P in before P·V, and writes its results in. The bounds then follow where it rounds
/// instead of assuming the format's default (accumulate_roundoff).
struct policy_roundoffs {
    double storage = 0, accumulate = 0, weights = 0, output = 0;
    /// The unit roundoff of the format the logits are stored in before the softmax (0: they stay in
    /// the accumulation format, as FlashAttention's kernels keep them), and the static scale S by which
    /// P is multiplied before its rounding to `weights` (kernel_models.hpp; 1: none).
    double logits = 0, weights_scale = 1;
    /// The roundoff of everything stored but P: inputs, Q/K/V, head outputs, output.
    constexpr double storage_but_weights() const { return storage > output ? storage : output; }
    /// The roundoff of the logit-level constants (scale, softcap, slopes) and of the logits' storage.
    constexpr double logit_level() const { return logits > accumulate ? logits : accumulate; }
    /// The largest storage-side roundoff: the `u` of the forward bounds, which count every storage
    /// rounding (inputs, Q/K/V, P, head outputs, output) with one unit roundoff.
    constexpr double widest_storage() const {
        const double a = storage > weights ? storage : weights;
        return a > output ? a : output;
    }
};

struct rtol_atol {
    double rtol, atol;
};
/// torch.testing.assert_close defaults.
constexpr rtol_atol assert_close_defaults(candidate_format f) {
    switch (f) {
        case candidate_format::float64: return {1e-7, 1e-7};
        case candidate_format::float32: return {1.3e-6, 1e-5};
        case candidate_format::bfloat16: return {1.6e-2, 1e-5};
        case candidate_format::float16: return {1e-3, 1e-5};
    }
    return {0, 0};
}

namespace detail {
inline double abs_d(double x) { return x < 0 ? -x : x; }

/// Maps the bits of a sign-magnitude encoding onto a monotone unsigned line (−0 and +0 coincide):
/// magnitude m ↦ 2^63 + m, −m ↦ 2^63 − m. Every value of ≤ 64 bits fits without overflow.
inline std::uint64_t ordered(std::uint64_t bits, int total_bits) {
    const std::uint64_t sign = std::uint64_t{1} << (total_bits - 1);
    const std::uint64_t magnitude = bits & (sign - 1), middle = std::uint64_t{1} << 63;
    return (bits & sign) ? middle - magnitude : middle + magnitude;
}
inline std::uint64_t ordered_in(candidate_format f, double x) { return ordered(encode(f, x), describe(f).storage_bits); }
}  // namespace detail

/// Distance in ULPs of the format between a (a value of the format) and e rounded to the format:
/// the number of representable values between them, counted exactly in 64-bit unsigned integers
/// (values of opposite signs included: the distance is the sum of both magnitudes' counts, up to
/// 2^64 − 2^53 for float64) and then rounded to double. Both must be finite.
inline double ulp_distance(candidate_format f, double a, double e) {
    const std::uint64_t x = detail::ordered_in(f, a), y = detail::ordered_in(f, e);
    return static_cast<double>(x > y ? x - y : y - x);
}

}  // namespace attnref::tolerance
