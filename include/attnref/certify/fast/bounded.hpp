#pragma once
/// \file certify/fast/bounded.hpp
/// The fast certified path's element: a double-word value with a bound on its distance to the
/// exact value (docs/fast-certify.md), and the input ranges its error analysis assumes ((1)).

#include <cmath>
#include <cstddef>
#include <limits>

#include "attnref/core/double_double.hpp"

namespace attnref::fast {

using dw::dd;

/// One element before rounding: value 2^scale·(v.hi + v.lo) with |exact − value| ≤ 2^scale·bound.
struct bounded {
    dd v;
    double bound = std::numeric_limits<double>::infinity();
    int scale = 0;
};

namespace detail {

/// Every nonzero |x| in [2^-400, 2^40] (the ranges of (1)).
inline bool in_range(const double* x, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
        const double a = std::fabs(x[i]);
        if (a != 0 && !(a >= 0x1p-400 && a <= 0x1p40)) return false;
    }
    return true;
}


}  // namespace detail
}  // namespace attnref::fast
