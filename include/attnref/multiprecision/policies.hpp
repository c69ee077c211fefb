#pragma once
/// \file multiprecision/policies.hpp
/// Owns: the registry of named precision policies (name -> precision_policy).
/// Named precision policies: the arithmetics `attnref run` (and the study tool) can compute a case
/// with, by name. Each name maps to one precision_policy<Storage, Accumulate, Weights, Output>
/// (precision.hpp); the algorithms are the same templates for all of them.
///
///   name             storage    accumulate  P before P·V  output     what it models
///   float32          float      float       float         float      plain fp32
///   float64          double     double      double        double     plain fp64
///   longdouble       long dbl   long dbl    long dbl      long dbl   x87 80-bit on x86-64
///   float128         binary128  binary128   binary128     binary128  GCC __float128 (GCC builds)
///   bin50            cpp_bin_float<50> throughout                    Boost software float, 50 digits
///   bf16             bfloat16   bfloat16    bfloat16      bfloat16   pure bf16 (every op rounded)
///   fp16             float16    float16     float16       float16    pure fp16
///   bf16_fp32acc     bfloat16   float       bfloat16      bfloat16   FlashAttention-style bf16 kernel
///   fp16_fp32acc     float16    float       float16       float16    FlashAttention-style fp16 kernel
///   fp32_p_bf16      float      float       bfloat16      float      fp32 with P cast to bf16
///   fp32_p_fp8e4m3   float      float       float8_e4m3   float      fp32 with P cast to FP8 E4M3
///   fp32_p_fp8e5m2   float      float       float8_e5m2   float      fp32 with P cast to FP8 E5M2
///   fp32_p_fp8e4m3_s256 / fp32_p_fp8e5m2_s256: the same with P·256 cast, O divided by 256 (kernel_models.hpp)
///   bf16_materialised bfloat16  float       bfloat16      bfloat16   baseline attention: the logits S too
///                                                                    are stored in bf16 before the softmax
///   fp8e4m3_fa3_bf16 FP8 kernel in the FlashAttention-3 style: every input (q, k, v; x and the
///                    projections; dO) quantised per tensor to E4M3 with a power-of-two descale
///                    (golden/rounded_inputs.hpp quantise_fp8), the products accumulated in float
///                    and multiplied by the descales (exact: powers of two), P·256 cast to E4M3
///                    before P·V, O/256, output rounded to bfloat16. Modelled as
///                    with_fp8_inputs<with_weights_scale<precision_policy<float, float, float8_e4m3,
///                    bfloat16>, 256>, float8_e4m3>: the effective inputs code·descale are exact in
///                    float, so the float storage rounds nothing after the quantisation.
///   fp8e4m3_fa3_fp32 the same with a float32 output
///
/// Usage:
///     attnref::visit_policy("bf16_fp32acc", [&]<class P>(std::type_identity<P>) { ... });

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <string_view>
#include <type_traits>

#include "attnref/core/formats.hpp"
#include "attnref/core/kernel_models.hpp"
#include "attnref/multiprecision/multiprecision.hpp"
#include "attnref/core/precision.hpp"
#include "attnref/bounds/tolerance/names.hpp"

namespace attnref {

/// Policy P whose inputs are quantised per tensor to the FP8 format F (float8_e4m3 or float8_e5m2)
/// before the arithmetic: `attnref run` feeds it quantise_fp8's effective inputs, `attnref check
/// --policy` judges it against the certified result of those inputs (--input-format fp8e4m3).
template <class P, class F>
struct with_fp8_inputs : P {
    using fp8_input_type = F;
};
/// Whether policy P reads FP8-quantised inputs.
template <class P>
concept has_fp8_inputs = requires { typename P::fp8_input_type; };

struct policy_entry {
    std::string_view name;
    std::string_view description;
};

inline constexpr std::array policy_names = {
    policy_entry{"float32", "everything in IEEE binary32"},
    policy_entry{"float64", "everything in IEEE binary64"},
    policy_entry{"longdouble", "everything in long double (x87 80-bit on x86-64)"},
#ifdef ATTNREF_HAS_BOOST_FLOAT128
    policy_entry{"float128", "everything in IEEE binary128 (Boost float128)"},
#endif
    policy_entry{"bin50", "everything in cpp_bin_float with 50 decimal digits"},
    policy_entry{"bf16", "everything in bfloat16, each operation rounded"},
    policy_entry{"fp16", "everything in float16, each operation rounded"},
    policy_entry{"bf16_fp32acc", "bf16 storage, fp32 accumulation, P in bf16, bf16 output"},
    policy_entry{"fp16_fp32acc", "fp16 storage, fp32 accumulation, P in fp16, fp16 output"},
    policy_entry{"fp32_p_bf16", "fp32 storage and accumulation, P cast to bf16 before P·V"},
    policy_entry{"fp32_p_fp8e4m3", "fp32 storage and accumulation, P cast to FP8 E4M3 before P·V"},
    policy_entry{"fp32_p_fp8e5m2", "fp32 storage and accumulation, P cast to FP8 E5M2 before P·V"},
    policy_entry{"fp32_p_fp8e4m3_s256", "fp32 storage and accumulation, P·256 cast to FP8 E4M3 before P·V, O/256"},
    policy_entry{"fp32_p_fp8e5m2_s256", "fp32 storage and accumulation, P·256 cast to FP8 E5M2 before P·V, O/256"},
    policy_entry{"bf16_materialised", "baseline bf16 attention: logits S and P stored in bf16, fp32 accumulation, bf16 output"},
    policy_entry{"fp8e4m3_fa3_bf16", "FP8 E4M3 inputs with per-tensor descales, fp32 accumulation, P·256 in E4M3, bf16 output"},
    policy_entry{"fp8e4m3_fa3_fp32", "FP8 E4M3 inputs with per-tensor descales, fp32 accumulation, P·256 in E4M3, fp32 output"},
};

/// Calls visitor(std::type_identity<Policy>{}) for the policy called `name`; returns false (and
/// calls nothing) for an unknown name.
template <class Visitor>
bool visit_policy(std::string_view name, Visitor&& visitor) {
    auto call = [&]<class P>() {
        visitor(std::type_identity<P>{});
        return true;
    };
    if (name == "float32") return call.template operator()<uniform_precision<float>>();
    if (name == "float64") return call.template operator()<uniform_precision<double>>();
    if (name == "longdouble") return call.template operator()<uniform_precision<long double>>();
#ifdef ATTNREF_HAS_BOOST_FLOAT128
    if (name == "float128") return call.template operator()<uniform_precision<float128>>();
#endif
    if (name == "bin50") return call.template operator()<uniform_precision<bin_float_50>>();
    if (name == "bf16") return call.template operator()<uniform_precision<bfloat16>>();
    if (name == "fp16") return call.template operator()<uniform_precision<float16>>();
    if (name == "bf16_fp32acc") return call.template operator()<precision_policy<bfloat16, float, bfloat16, bfloat16>>();
    if (name == "fp16_fp32acc") return call.template operator()<precision_policy<float16, float, float16, float16>>();
    if (name == "fp32_p_bf16") return call.template operator()<precision_policy<float, float, bfloat16, float>>();
    if (name == "fp32_p_fp8e4m3") return call.template operator()<precision_policy<float, float, float8_e4m3, float>>();
    if (name == "fp32_p_fp8e5m2") return call.template operator()<precision_policy<float, float, float8_e5m2, float>>();
    if (name == "fp32_p_fp8e4m3_s256")
        return call.template operator()<with_weights_scale<precision_policy<float, float, float8_e4m3, float>, 256.0>>();
    if (name == "fp32_p_fp8e5m2_s256")
        return call.template operator()<with_weights_scale<precision_policy<float, float, float8_e5m2, float>, 256.0>>();
    if (name == "bf16_materialised")
        return call.template operator()<with_logits_storage<precision_policy<bfloat16, float, bfloat16, bfloat16>, bfloat16>>();
    if (name == "fp8e4m3_fa3_bf16")
        return call.template operator()<with_fp8_inputs<with_weights_scale<precision_policy<float, float, float8_e4m3, bfloat16>, 256.0>, float8_e4m3>>();
    if (name == "fp8e4m3_fa3_fp32")
        return call.template operator()<with_fp8_inputs<with_weights_scale<precision_policy<float, float, float8_e4m3, float>, 256.0>, float8_e4m3>>();
    return false;
}

/// The FP8 input format the policy called `name` reads ("fp8e4m3", "fp8e5m2"; "" for a policy whose
/// inputs are rounded to its storage format, or an unknown name).
inline std::string_view fp8_input_format_of_policy(std::string_view name) {
    std::string_view r;
    visit_policy(name, [&]<class P>(std::type_identity<P>) {
        if constexpr (has_fp8_inputs<P>) r = std::is_same_v<typename P::fp8_input_type, float8_e4m3> ? "fp8e4m3" : "fp8e5m2";
    });
    return r;
}

/// The roundoffs of the policy called `name` (nullopt for an unknown name).
/// (tolerance::policy_roundoffs: a candidate declaring the policy, `attnref check --policy NAME`.)
inline std::optional<tolerance::policy_roundoffs> roundoffs_of_policy(std::string_view name) {
    std::optional<tolerance::policy_roundoffs> r;
    visit_policy(name, [&]<class P>(std::type_identity<P>) {
        auto u = []<class T>(std::type_identity<T>) { return std::ldexp(1.0, -std::numeric_limits<T>::digits); };
        r = tolerance::policy_roundoffs{u(std::type_identity<typename P::storage_type>{}), u(std::type_identity<typename P::accumulate_type>{}),
                             u(std::type_identity<typename P::weights_type>{}), u(std::type_identity<typename P::output_type>{})};
        r->logits = u(std::type_identity<logits_storage_t<P>>{});
        r->weights_scale = weights_scale_v<P>;
    });
    return r;
}

}  // namespace attnref
