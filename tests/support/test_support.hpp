#pragma once
// Shared helpers for attnref's tests: deterministic inputs, conversions, error measures.
#include <cmath>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "attnref/attnref.hpp"
#include "attnref/multiprecision/multiprecision.hpp"

namespace attnref::test {

/// Deterministic uniform values in [lo, hi) that are exactly representable in float (24-bit
/// fractions), so every arithmetic under test starts from identical inputs.
class input_stream {
public:
    explicit input_stream(std::uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 1) {}
    double next(double lo = -1, double hi = 1) {
        state_ = state_ * 6364136223846793005ull + 1442695040888963407ull;
        const double unit = static_cast<double>(state_ >> 40) * 0x1p-24;  // 24 bits
        return static_cast<double>(static_cast<float>(lo + (hi - lo) * unit));
    }

private:
    std::uint64_t state_;
};

template <class T, std::size_t R>
tensor<T, R> random_tensor(const extents_t<R>& extents, std::uint64_t seed, double lo = -1, double hi = 1) {
    input_stream s(seed);
    tensor<T, R> t(extents);
    for (std::size_t n = 0; n < t.size(); ++n) t[n] = T(s.next(lo, hi));
    return t;
}

template <class To, class From, std::size_t R>
tensor<To, R> cast(const tensor<From, R>& x) {
    return to_tensor<To>(x.view());
}

/// Sum_j p_j |v_jc| for SDPA outputs (B, H, Sq, dv): the scale of each output element.
template <class T>
tensor<double, 4> output_scale(const tensor<T, 4>& p, const tensor<T, 4>& v) {
    const std::size_t batch = p.extent(0), heads = p.extent(1), sq = p.extent(2), sk = p.extent(3), dv = v.extent(3);
    const std::size_t group = heads / v.extent(1);
    tensor<double, 4> s({batch, heads, sq, dv}, 0.0);
    for (std::size_t b = 0; b < batch; ++b)
        for (std::size_t h = 0; h < heads; ++h)
            for (std::size_t i = 0; i < sq; ++i)
                for (std::size_t c = 0; c < dv; ++c) {
                    double acc = 0;
                    for (std::size_t j = 0; j < sk; ++j)
                        acc += static_cast<double>(p(b, h, i, j)) * std::fabs(static_cast<double>(v(b, h / group, j, c)));
                    s(b, h, i, c) = acc;
                }
    return s;
}

/// max over elements of |a − b| / bound, the difference formed in 512-bit MPFR (0/0 counts as 0; a
/// nonzero difference over a zero bound as ∞): how much of an error bound an error uses.
template <class A, class B, std::size_t R>
double worst_ratio(const tensor<A, R>& a, const tensor<B, R>& b, const tensor<double, R>& bound) {
    using hp = mpfr_real<155>;
    double worst = 0;
    for (std::size_t n = 0; n < a.size(); ++n) {
        const double diff = std::fabs(static_cast<double>(hp(a[n]) - hp(b[n])));
        if (diff != 0) worst = std::max(worst, bound[n] == 0 ? std::numeric_limits<double>::infinity() : diff / bound[n]);
    }
    return worst;
}

}  // namespace attnref::test
