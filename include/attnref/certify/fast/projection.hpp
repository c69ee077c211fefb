#pragma once
/// \file certify/fast/projection.hpp
/// The projections of multi-head attention in double-word with per-element bounds
/// (docs/fast-certify.md (7)), rows on parallel.hpp's threads.

#include <algorithm>
#include <cstddef>
#include <vector>

#include "attnref/certify/fast/dot.hpp"
#include "attnref/core/double_double.hpp"
#include "attnref/core/parallel.hpp"

namespace attnref::fast::detail {

/// A projected or input matrix as double-words with per-element bounds, rows × cols.
struct dd_matrix {
    std::size_t rows = 0, cols = 0;
    std::vector<double> hi, lo, err;
};

/// Whether row x (hi, lo and err may be null) is exactly 0 with bound 0.
inline bool is_exact_zero_row(const double* h, const double* l, const double* e, std::size_t n) {
    for (std::size_t c = 0; c < n; ++c)
        if (h[c] != 0 || (l && l[c] != 0) || (e && e[c] != 0)) return false;
    return true;
}

/// (7) Y = X·W + bias for X rows × k (double-words with bounds, or plain doubles when X.lo is
/// empty), W k × n doubles (exact), bias n doubles or empty.
inline dd_matrix project(const dd_matrix& x, const double* w, std::size_t n, const double* bias, std::size_t threads) {
    const std::size_t k = x.cols;
    dd_matrix y{x.rows, n, std::vector<double>(x.rows * n), std::vector<double>(x.rows * n), std::vector<double>(x.rows * n)};
    std::vector<double> wnorm(n);
    for (std::size_t j = 0; j < n; ++j) wnorm[j] = norm_up(w + j, k, n);
    const double cdot = dot_constant(k);
    ::attnref::parallel_for(x.rows, threads, [&](std::size_t r) {
        const double* xh = x.hi.data() + r * k;
        const double* xl = x.lo.empty() ? nullptr : x.lo.data() + r * k;
        double* oh = y.hi.data() + r * n;
        double* ol = y.lo.data() + r * n;
        double* oe = y.err.data() + r * n;
        if (is_exact_zero_row(xh, xl, x.err.empty() ? nullptr : x.err.data() + r * k, k)) {
            // An exactly zero row (a gradient row the mask zeroes): exact results, bound 0 (the
            // bound expressions below would add up()'s 2^-999 and leave a zero of unknown sign).
            for (std::size_t j = 0; j < n; ++j) oh[j] = bias ? bias[j] : 0.0, ol[j] = 0, y.err[r * n + j] = 0;
            return;
        }
        dot_rows(xh, xl, k, w, nullptr, n, n, oh, ol, oe);
        const double xn = norm_up(xh, k);
        const double xe = x.err.empty() ? 0.0 : norm_up(x.err.data() + r * k, k);
        for (std::size_t j = 0; j < n; ++j) {
            // (7): the smaller of (5a) (n+3)²u²‖x‖‖w_j‖ and (5b), plus ‖e_x‖‖w_j‖ (Cauchy–Schwarz),
            // then the bias addition (η).
            const double cs = xn * wnorm[j];
            double e = dw::up(std::min(cdot * cs, oe[j] + dot_remainder_constant * cs) + xe * wnorm[j]);
            if (bias) {
                const dd s = dw::add({oh[j], ol[j]}, {bias[j], 0.0});
                oh[j] = s.hi;
                ol[j] = s.lo;
                e = dw::up(e + dw::dd_eta * 1.01 * dw::mag(s));
            }
            y.err[r * n + j] = e;
        }
    });
    return y;
}

}  // namespace attnref::fast::detail
