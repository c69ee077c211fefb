#pragma once
/// \file precision.hpp
/// Precision policies: which arithmetic each stage of attention uses. The algorithms are the same
/// code for every policy; a policy only names four types.
///   storage_type     inputs, weights, and the tensors a framework materialises between stages
///                    (projected Q/K/V, per-head outputs before W_o)
///   accumulate_type  every dot product, sum, exp and division
///   weights_type     P is rounded to this before P·V (FlashAttention casts P to bf16/fp16)
///   output_type      the final output
/// `uniform_precision<T>` computes everything in T.

#include "attnref/scalar.hpp"

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

template <class P>
concept PrecisionPolicy = Scalar<typename P::storage_type> && Scalar<typename P::accumulate_type> &&
                          Scalar<typename P::weights_type> && Scalar<typename P::output_type>;

/// Converts between scalar types; identity when the types agree.
template <class To, class From>
constexpr To convert(const From& x) {
    if constexpr (std::is_same_v<To, From>) return x;
    else return static_cast<To>(x);
}

}  // namespace attnref
