#pragma once
// Deterministic inputs for fixed-shape tests (fixed_shape.hpp), usable in constant evaluation: the
// static tests (tests/static), the compile-time/run-time comparison (tests/runtime/compile_time) and
// the seed example constant-evaluated whole (tests/static/seed_example.constexpr.cpp) share these
// generators. Only attnref's own headers, so Clang's -fsyntax-only runs need nothing else.
#include <cstddef>
#include <cstdint>

#include "attnref/core/fixed_shape.hpp"
#include "attnref/core/math.hpp"

namespace attnref::test {

/// Multiples of 1/16 in [−1/2, 1/2], exact in every type: the n-th value is ((37n) mod 17 − 8)/16.
struct sixteenths {
    int n = 0;
    template <class T>
    constexpr T next() {
        const T x = T((n * 37) % 17 - 8) / T(16);
        ++n;
        return x;
    }
    template <class T>
    constexpr void fill(T* p, std::size_t count) {
        for (std::size_t e = 0; e < count; ++e) p[e] = next<T>();
    }
};

/// A 32-bit LCG: (((state >> 8) mod 2001) − 1000)/700, which is not exactly representable, so it
/// rounds in T; the seed may be opaque at run time and a literal at compile time.
struct lcg_sevenhundredths {
    unsigned state;
    template <class T>
    constexpr T next() {
        state = state * 1103515245u + 12345u;
        return T(static_cast<int>((state >> 8) % 2001) - 1000) / T(700);
    }
    template <class T>
    constexpr void fill(T* p, std::size_t count) {
        for (std::size_t e = 0; e < count; ++e) p[e] = next<T>();
    }
};

/// The seed example's recipe (examples/seed_example.cpp): a 64-bit LCG giving values exactly
/// representable in float, uniform in scale·[−1, 1). `seed` numbers the tensor.
struct seed_example_stream {
    std::uint64_t state;
    double scale;
    constexpr seed_example_stream(std::uint64_t seed, double scale_) : state(seed * 0x9E3779B97F4A7C15ull + 1), scale(scale_) {}
    template <class T>
    constexpr void fill(T* p, std::size_t count) {  // the loop inlined, with the state in a local
        std::uint64_t s = state;
        const double c = scale;
        for (std::size_t e = 0; e < count; ++e) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            p[e] = T(static_cast<double>(static_cast<float>(c * (static_cast<double>(s >> 40) * 0x1p-23 - 1))));
        }
        state = s;
    }
};

/// Every element of a fixed_tensor (values in storage order) from the generator. (Its fill member:
/// the seed example's inputs are 10^6 values, and the constant evaluator pays for a call per value.)
template <class Gen, class Tensor>
constexpr void fill(Gen& gen, Tensor& t) {
    gen.fill(t.values.data(), t.values.size());
}

/// The tensors of fixed-shape attention inputs in declaration order from one generator; the MHA
/// biases (b_q, b_k, b_v, b_o, after w_o) only when `with_bias`, which also sets has_bias.
template <class Gen, class T, sdpa_shape S>
constexpr void fill(Gen& gen, fixed_sdpa_inputs<T, S>& in) {
    fill(gen, in.q);
    fill(gen, in.k);
    fill(gen, in.v);
}
template <class Gen, class T, mha_shape S>
constexpr void fill(Gen& gen, fixed_mha_inputs<T, S>& in, bool with_bias = false) {
    fill(gen, in.x_q);
    fill(gen, in.x_k);
    fill(gen, in.x_v);
    fill(gen, in.w_q);
    fill(gen, in.w_k);
    fill(gen, in.w_v);
    fill(gen, in.w_o);
    in.has_bias = with_bias;
    if (!with_bias) return;
    fill(gen, in.b_q);
    fill(gen, in.b_k);
    fill(gen, in.b_v);
    fill(gen, in.b_o);
}

/// The seed example's inputs (examples/seed_example.cpp): x_q, x_k, x_v uniform in [−1, 1) from
/// streams 1, 2, 3 (plus `offset`), W_q, W_k, W_v, W_o uniform in ±√(3/d_model) (variance 1/d_model)
/// from streams 4 to 7, no bias. `offset` lets a run-time caller make the inputs opaque to the
/// optimiser (pass a volatile 0). Fills in place: at run time the inputs are megabytes.
template <class T, mha_shape S>
constexpr void fill_seed_example(fixed_mha_inputs<T, S>& in, std::uint64_t offset = 0) {
    const double w = math::sqrt(3.0 / static_cast<double>(S.model_dim));
    auto stream = [&](std::uint64_t seed, double scale, auto& t) {
        seed_example_stream s(seed + offset, scale);
        fill(s, t);
    };
    stream(1, 1, in.x_q);
    stream(2, 1, in.x_k);
    stream(3, 1, in.x_v);
    stream(4, w, in.w_q);
    stream(5, w, in.w_k);
    stream(6, w, in.w_v);
    stream(7, w, in.w_o);
    in.has_bias = false;
}

}  // namespace attnref::test
