// The seed chapter's example (B = 2, S = 10, d_model = 512, 8 heads, y = x·W, scale 1/√64 on the
// product, no mask) computed in float, double and 50 digits (cpp_bin_float_50) with the same
// templates; prints the largest differences between them.
#include <fmt/core.h>

#include <chrono>
#include <cmath>
#include <cstdint>

#include "attnref/attnref.hpp"
#include "attnref/multiprecision/multiprecision.hpp"

namespace {
using namespace attnref;

// Inputs: a fixed LCG, values exactly representable in float so every arithmetic sees the same numbers.
template <std::size_t R>
tensor<double, R> make(const extents_t<R>& extents, std::uint64_t seed, double scale) {
    tensor<double, R> t(extents);
    std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
    for (std::size_t n = 0; n < t.size(); ++n) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        t[n] = static_cast<double>(static_cast<float>(scale * (static_cast<double>(state >> 40) * 0x1p-23 - 1)));
    }
    return t;
}

template <class T>
tensor<T, 3> run(const tensor<double, 3>& xq, const tensor<double, 3>& xk, const tensor<double, 3>& xv,
                 const tensor<double, 2>& wq, const tensor<double, 2>& wk, const tensor<double, 2>& wv,
                 const tensor<double, 2>& wo) {
    const auto c3 = [](const tensor<double, 3>& x) { return to_tensor<T>(x.view()); };
    const auto c2 = [](const tensor<double, 2>& x) { return to_tensor<T>(x.view()); };
    const auto wq_t = c2(wq), wk_t = c2(wk), wv_t = c2(wv), wo_t = c2(wo);
    const auto start = std::chrono::steady_clock::now();
    auto r = multi_head_attention(c3(xq), c3(xk), c3(xv), mha_parameters<T>{wq_t.view(), wk_t.view(), wv_t.view(), wo_t.view()},
                                  mha_options{8, 0, {}});
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    fmt::print("  {:<16} {:>8.3f} s\n", scalar_traits<T>::name, seconds);
    return std::move(r.output);
}
}  // namespace

int main() {
    const std::size_t batch = 2, length = 10, model = 512;
    const double w = std::sqrt(3.0 / model);  // U(−w, w) has the seed's variance 1/d_model
    const auto xq = make<3>({batch, length, model}, 1, 1), xk = make<3>({batch, length, model}, 2, 1),
               xv = make<3>({batch, length, model}, 3, 1);
    const auto wq = make<2>({model, model}, 4, w), wk = make<2>({model, model}, 5, w), wv = make<2>({model, model}, 6, w),
               wo = make<2>({model, model}, 7, w);
    fmt::print("seed example: B = 2, S = 10, d_model = 512, 8 heads, y = x·W, scale 1/sqrt(64) on the product\n");
    const auto f = run<float>(xq, xk, xv, wq, wk, wv, wo);
    const auto d = run<double>(xq, xk, xv, wq, wk, wv, wo);
    const auto m = run<bin_float_50>(xq, xk, xv, wq, wk, wv, wo);
    double float_vs_50 = 0, double_vs_50 = 0, largest = 0;
    for (std::size_t n = 0; n < m.size(); ++n) {
        const bin_float_50 ref = m[n];
        float_vs_50 = std::max(float_vs_50, static_cast<double>(abs(bin_float_50(f[n]) - ref)));
        double_vs_50 = std::max(double_vs_50, static_cast<double>(abs(bin_float_50(d[n]) - ref)));
        largest = std::max(largest, std::fabs(static_cast<double>(ref)));
    }
    fmt::print("output shape (2, 10, 512); max |output| = {:.6g}\n", largest);
    fmt::print("max |float  - 50 digits| = {:.3e}  ({:.1f} float ulps of max |output|)\n", float_vs_50,
               float_vs_50 / (largest * 0x1p-23));
    fmt::print("max |double - 50 digits| = {:.3e}  ({:.1f} double ulps of max |output|)\n", double_vs_50,
               double_vs_50 / (largest * 0x1p-52));
    fmt::print("output[0, 0, :5] (50 digits): {:.12f} {:.12f} {:.12f} {:.12f} {:.12f}\n", static_cast<double>(m[0]),
               static_cast<double>(m[1]), static_cast<double>(m[2]), static_cast<double>(m[3]), static_cast<double>(m[4]));
    return 0;
}
