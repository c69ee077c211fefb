#pragma once
/// \file math.hpp
/// PLACEHOLDER API (being replaced by the constexpr kernels): attnref::math::{exp,log,log1p,expm1,sqrt,tanh}.
/// Dispatch: BuiltinFloatingPoint -> attnref's own kernels; WrapsBuiltinFloatingPoint -> wrap(kernel(unwrap(x)));
/// any other type -> its own function found by ADL (`using std::exp; return exp(x);`).
#include <cmath>
#include "attnref/scalar.hpp"

namespace attnref::math {

#define ATTNREF_MATH_PLACEHOLDER(fn)                                              \
    template <class T>                                                            \
    constexpr T fn(const T& x) {                                                  \
        if constexpr (BuiltinFloatingPoint<T>) {                                  \
            return static_cast<T>(std::fn(static_cast<long double>(x)));          \
        } else if constexpr (WrapsBuiltinFloatingPoint<T>) {                      \
            return scalar_traits<T>::wrap(math::fn(scalar_traits<T>::unwrap(x))); \
        } else {                                                                  \
            using std::fn;                                                        \
            return fn(x);                                                         \
        }                                                                         \
    }
ATTNREF_MATH_PLACEHOLDER(exp)
ATTNREF_MATH_PLACEHOLDER(log)
ATTNREF_MATH_PLACEHOLDER(log1p)
ATTNREF_MATH_PLACEHOLDER(expm1)
ATTNREF_MATH_PLACEHOLDER(sqrt)
ATTNREF_MATH_PLACEHOLDER(tanh)
#undef ATTNREF_MATH_PLACEHOLDER

}  // namespace attnref::math
