#pragma once
/// \file io/generator.hpp
/// Owns: the portable input recipe "splitmix64-v1" and the input families. Input formats are
/// binary_format.hpp's (round_to rounds to them).
/// Portable, counter-based golden inputs: every element is a pure function of (seed, tensor role,
/// element index), computable on its own in any language with IEEE-754 doubles and 64-bit unsigned
/// integers. The recipe ("splitmix64-v1"), which golden/README.md repeats with a Python version:
///
///   mix(z)        z = (z ^ (z >> 30)) · 0xBF58476D1CE4E5B9;  z = (z ^ (z >> 27)) · 0x94D049BB133111EB;
///                 return z ^ (z >> 31)                             (all arithmetic mod 2^64)
///   γ             0x9E3779B97F4A7C15
///   stream(s, r)  mix(s ^ (role_id(r) · γ))                        one stream per (seed, role)
///   bits(s, r, n) mix(stream(s, r) + (n + 1) · γ)                  = SplitMix64's (n+1)-th output
///   u(s, r, n)    (bits >> 11) · 2^-53                             uniform on [0, 1), exact
///
/// n is the element's index in C (row-major) order of the role's stored shape. role_id: query 1,
/// key 2, value 3, w_q 4, w_k 5, w_v 6, w_o 7, b_q 8, b_k 9, b_v 10, b_o 11, mask 12,
/// additive_mask 13, seed_mask 14, grad_output 15 (the upstream gradient dO of a backward case,
/// shaped like the output; default affine map scale 1, offset 0).
///
/// Values (family parameters, see input_family): for a real-valued role,
///   x = round_format( fl64( fl64(2u − 1) · scale_r + offset_r ) )
/// where 2u − 1 is exact, fl64 is one IEEE double rounding (so the product and the sum round
/// separately, no FMA) and round_format rounds once to nearest-even into the input format
/// (float64: identity; float32, bfloat16, float16: directly from the double, subnormals kept).
/// Structured overrides for sdpa roles (shape (B, H, S, d), c = feature index, j = position):
///   tied_keys t        key (b, h, j, c) with j < t takes the value of key (b, h, 0, c)
///   key_feature0 v     key (b, h, j, 0) = round_format(v) for j < key_feature0_keys (0: all keys)
///   query_feature0 v   query (b, h, i, 0) = round_format(v)
///   negate_odd_value_rows  value (b, h, j, c) with j odd = −value (b, h, j − 1, c)
/// Masks (not rounded): mask (boolean) = u < mask_true_probability; seed_mask = 1.0 if
/// u < mask_true_probability else 0.0; additive_mask = −inf if u < additive_inf_probability else
/// fl64(2u − 1) · scale_additive_mask.
///
/// Only correctly rounded IEEE operations appear, so every language reproduces the same bits.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "attnref/core/binary_format.hpp"

namespace attnref::generator {

inline constexpr std::string_view name = "splitmix64-v1";
inline constexpr std::uint64_t gamma = 0x9E3779B97F4A7C15ULL;

/// SplitMix64's output function (Steele, Lea & Flood 2014; Vigna's reference constants).
constexpr std::uint64_t mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/// The tensors the generator fills, with their stable ids (part of the recipe: never renumber).
enum class role : std::uint64_t {
    query = 1, key, value, w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o, mask, additive_mask, seed_mask, grad_output,
};
inline constexpr std::uint64_t last_role_id = 15;

inline constexpr std::string_view role_name(role r) {
    constexpr std::string_view names[] = {"",    "query", "key", "value", "w_q",  "w_k",           "w_v",      "w_o",
                                          "b_q", "b_k",   "b_v", "b_o",   "mask", "additive_mask", "seed_mask",
                                          "grad_output"};
    return names[static_cast<std::uint64_t>(r)];
}

/// The (n+1)-th SplitMix64 output of the stream (seed, role).
constexpr std::uint64_t bits(std::uint64_t seed, role r, std::uint64_t index) {
    const std::uint64_t stream = mix(seed ^ (static_cast<std::uint64_t>(r) * gamma));
    return mix(stream + (index + 1) * gamma);
}

/// Uniform on [0, 1) with 53 random bits; exact.
constexpr double uniform(std::uint64_t seed, role r, std::uint64_t index) {
    return static_cast<double>(bits(seed, r, index) >> 11) * 0x1p-53;
}

/// Formats the inputs are rounded to (binary_format.hpp: names, round_to); the stored .npy holds
/// their values as float64.
using input_format = binary_format;
using attnref::format_from_name;
using attnref::format_name;

/// value = fl64(2u − 1)·scale + offset (two roundings, see the file comment).
struct affine {
    double scale = 1;
    double offset = 0;
};

/// An input family: per-role affine maps plus the structured overrides of the file comment.
/// `roles` holds the effective map of every real-valued role the case uses (the manifest writes
/// them all, so consumers need no defaults).
struct input_family {
    std::string name = "standard";
    std::map<std::string, affine> roles;
    std::optional<double> query_feature0;
    std::optional<double> key_feature0;
    std::size_t key_feature0_keys = 0;
    std::size_t tied_keys = 0;
    bool negate_odd_value_rows = false;
    double mask_true_probability = 0.5;
    double additive_inf_probability = 0.25;
};

/// Default affine map of a role: scale 1 for activations and additive masks; for projection
/// weights scale √(3 / fan_in) (uniform with variance 1/fan_in, like N(0, 1)/√d_model), for
/// biases 1/√fan_in (PyTorch's nn.Linear bias bound). fan_in is the weight's axis 0.
inline affine default_affine(role r, std::size_t fan_in) {
    switch (r) {
        case role::w_q: case role::w_k: case role::w_v: case role::w_o:
            return {std::sqrt(3.0 / static_cast<double>(fan_in)), 0};
        case role::b_q: case role::b_k: case role::b_v: case role::b_o:
            return {1.0 / std::sqrt(static_cast<double>(fan_in)), 0};
        default: return {1, 0};
    }
}

/// Generates a real-valued role of the given shape (C order). Roles query/key/value with 4-D
/// shapes honour the structured overrides; everything else is plain affine.
inline std::vector<double> generate(const input_family& family, std::uint64_t seed, role r,
                                    const std::vector<std::size_t>& shape, input_format format) {
    const auto it = family.roles.find(std::string(role_name(r)));
    if (it == family.roles.end())
        throw std::invalid_argument("inputs.family.roles: no affine map for role '" + std::string(role_name(r)) + "'");
    const affine a = it->second;
    std::size_t count = 1;
    for (std::size_t e : shape) count *= e;
    const bool structured = shape.size() == 4;
    const std::size_t length = structured ? shape[2] : 1, features = structured ? shape[3] : 1;
    auto plain = [&](std::size_t n) {
        const double u = uniform(seed, r, n);
        const double centred = 2 * u - 1;
        const double scaled = centred * a.scale;
        const double shifted = scaled + a.offset;
        return round_to(format, shifted);
    };
    std::vector<double> out(count);
    for (std::size_t n = 0; n < count; ++n) {
        const std::size_t c = n % features, j = (n / features) % length;
        double x = 0;
        if (structured && r == role::key && j < family.tied_keys) x = plain(n - j * features);
        else if (structured && r == role::value && family.negate_odd_value_rows && j % 2 == 1) x = -plain(n - features);
        else x = plain(n);
        if (structured && c == 0 && r == role::query && family.query_feature0)
            x = round_to(format, *family.query_feature0);
        if (structured && c == 0 && r == role::key && family.key_feature0 &&
            (family.key_feature0_keys == 0 || j < family.key_feature0_keys))
            x = round_to(format, *family.key_feature0);
        out[n] = x;
    }
    return out;
}

/// Boolean mask: element n is true iff u(seed, mask, n) < mask_true_probability.
inline std::vector<std::uint8_t> generate_boolean_mask(const input_family& family, std::uint64_t seed, std::size_t count) {
    std::vector<std::uint8_t> out(count);
    for (std::size_t n = 0; n < count; ++n) out[n] = uniform(seed, role::mask, n) < family.mask_true_probability ? 1 : 0;
    return out;
}

/// Seed-convention mask (logits += value · −1e9): 1.0 iff u(seed, seed_mask, n) < mask_true_probability.
inline std::vector<double> generate_seed_mask(const input_family& family, std::uint64_t seed, std::size_t count) {
    std::vector<double> out(count);
    for (std::size_t n = 0; n < count; ++n)
        out[n] = uniform(seed, role::seed_mask, n) < family.mask_true_probability ? 1.0 : 0.0;
    return out;
}

/// Additive mask: −inf iff u < additive_inf_probability, else fl64(2u − 1)·scale_additive_mask.
inline std::vector<double> generate_additive_mask(const input_family& family, std::uint64_t seed, std::size_t count) {
    const auto it = family.roles.find("additive_mask");
    const double scale = it == family.roles.end() ? 1.0 : it->second.scale;
    std::vector<double> out(count);
    for (std::size_t n = 0; n < count; ++n) {
        const double u = uniform(seed, role::additive_mask, n);
        if (u < family.additive_inf_probability) {
            out[n] = -std::numeric_limits<double>::infinity();
        } else {
            const double centred = 2 * u - 1;
            out[n] = centred * scale;
        }
    }
    return out;
}

}  // namespace attnref::generator
