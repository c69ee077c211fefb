#pragma once
/// \file core/precision.hpp
/// Owns: precision policies (which arithmetic each stage uses) and convert<To>.
/// Precision policies: which arithmetic each stage of attention uses. The algorithms are the same
/// code for every policy; a policy only names four types.
///   storage_type     inputs, weights, and the tensors a framework materialises between stages
///                    (projected Q/K/V, per-head outputs before W_o)
///   accumulate_type  every dot product, sum, exp and division
///   weights_type     P is rounded to this before P·V (FlashAttention casts P to bf16/fp16)
///   output_type      the final output
/// `uniform_precision<T>` computes everything in T.
///
/// A policy may also name the arithmetic of individual stages (each defaults to accumulate_type):
///   logits_type      q·kᵀ, the scale, soft-capping, ALiBi and additive masks
///   softmax_type     max, exp, sum, division (or exp(x − lse)), lse, online rescaling
///   values_type      the P·V accumulation
///   projection_type  x·W + b of the four projections
/// `with_stage<Policy, Stage, T>` swaps one stage's arithmetic: precision studies run a policy again
/// with exactly one stage in high precision to show that stage's share of the error.

#include <type_traits>
#include <vector>

#include "attnref/core/scalar.hpp"

namespace attnref {

template <class Storage, class Accumulate = Storage, class Weights = Accumulate, class Output = Storage>
struct precision_policy {
    using storage_type = Storage;
    using accumulate_type = Accumulate;
    using weights_type = Weights;
    using output_type = Output;
};

template <class T>
using uniform_precision = precision_policy<T, T, T, T>;

namespace detail {
// stage_of<P>::type: P::NAME if the policy names it, else P::accumulate_type.
#define ATTNREF_STAGE_TYPE(NAME)                                        \
    template <class P>                                                  \
    struct NAME##_of {                                                  \
        using type = typename P::accumulate_type;                       \
    };                                                                  \
    template <class P>                                                  \
        requires requires { typename P::NAME##_type; }                  \
    struct NAME##_of<P> {                                               \
        using type = typename P::NAME##_type;                           \
    };
ATTNREF_STAGE_TYPE(logits)
ATTNREF_STAGE_TYPE(softmax)
ATTNREF_STAGE_TYPE(values)
ATTNREF_STAGE_TYPE(projection)
#undef ATTNREF_STAGE_TYPE
}  // namespace detail

template <class P>
using logits_type_t = typename detail::logits_of<P>::type;
template <class P>
using softmax_type_t = typename detail::softmax_of<P>::type;
template <class P>
using values_type_t = typename detail::values_of<P>::type;
template <class P>
using projection_type_t = typename detail::projection_of<P>::type;

/// The stages a policy can set apart (see the file comment). `weights` is P's rounding before P·V
/// and `output` the final rounding; replacing them with T removes that rounding.
enum class stage { projections, logits, softmax, weights, values, output };

/// Policy P with the arithmetic of one stage replaced by T.
template <class P, stage S, class T>
struct with_stage : P {
    using logits_type = std::conditional_t<S == stage::logits, T, logits_type_t<P>>;
    using softmax_type = std::conditional_t<S == stage::softmax, T, softmax_type_t<P>>;
    using values_type = std::conditional_t<S == stage::values, T, values_type_t<P>>;
    using projection_type = std::conditional_t<S == stage::projections, T, projection_type_t<P>>;
    using weights_type = std::conditional_t<S == stage::weights, T, typename P::weights_type>;
    using output_type = std::conditional_t<S == stage::output, T, typename P::output_type>;
};

template <class P>
concept PrecisionPolicy = Scalar<typename P::storage_type> && Scalar<typename P::accumulate_type> &&
                          Scalar<typename P::weights_type> && Scalar<typename P::output_type>;

/// Converts between scalar types; identity when the types agree.
template <class To, class From>
constexpr To convert(const From& x) {
    if constexpr (std::is_same_v<To, From>) return x;
    else return static_cast<To>(x);
}

/// Every element of x converted to To (convert above).
template <class To, class From>
std::vector<To> convert_all(const std::vector<From>& x) {
    std::vector<To> r;
    r.reserve(x.size());
    for (const From& e : x) r.push_back(convert<To>(e));
    return r;
}

}  // namespace attnref
