#pragma once
/// \file core/kernel_models.hpp
/// Owns: the optional policy parameters that model attention kernels beyond the four types of a
/// precision_policy (precision.hpp), and the wrappers that set them.
///
///   weights_scale          static scale S of P's cast before P·V: P·S is rounded to weights_type,
///                          accumulated in values_type, and the output divided by S at the end
///                          (FP8 kernels scale P so that small weights stay above fp8's underflow
///                          threshold; S a power of two makes the scaling and unscaling exact).
///                          Default 1: no scaling, no division (the arithmetic is unchanged).
///   logits_storage_type    the logits S = s·q·kᵀ (+ masks) are rounded to this before the softmax,
///                          as a materialised ("baseline") attention stores the score matrix in its
///                          storage format. Default: logits_type, no rounding.
///
/// Blockwise online softmax (FlashAttention-2/3: running max, rescaling of the accumulated output, P
/// rounded per key block) is the attention's softmax_algorithm::online with softmax_options'
/// block_size and block_order (softmax.hpp): the key-block size and the order of the key blocks are
/// run-time options of the same templates, not policy parameters.
///
/// Usage:
///     using fp8_pcast = with_weights_scale<precision_policy<float, float, float8_e4m3, float>, 256.0>;
///     using baseline_bf16 = with_logits_storage<precision_policy<bfloat16, float, bfloat16, bfloat16>, bfloat16>;

#include "attnref/core/precision.hpp"

namespace attnref {

/// S of a policy: P::weights_scale when the policy names one, else 1.
template <class P>
inline constexpr double weights_scale_v = 1.0;
template <class P>
    requires requires { P::weights_scale; }
inline constexpr double weights_scale_v<P> = P::weights_scale;

namespace detail {
template <class P>
struct logits_storage_of {
    using type = logits_type_t<P>;
};
template <class P>
    requires requires { typename P::logits_storage_type; }
struct logits_storage_of<P> {
    using type = typename P::logits_storage_type;
};
}  // namespace detail

/// The type the logits are rounded to before the softmax (logits_type_t<P>: no rounding).
template <class P>
using logits_storage_t = typename detail::logits_storage_of<P>::type;

/// Policy P with P's cast scaled by S before the rounding to weights_type (and the output divided by S).
template <class P, double S>
    requires(S > 0)
struct with_weights_scale : P {
    static constexpr double weights_scale = S;
};

/// Policy P with the logits stored in T before the softmax (a materialised score matrix).
template <class P, class T>
struct with_logits_storage : P {
    using logits_storage_type = T;
};

}  // namespace attnref
