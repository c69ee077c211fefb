// The seed example (B = 2, S = 10, d_model = 512, H = 8, head dim 64; inputs from
// examples/seed_example.cpp's recipe) constant-evaluated whole: projections, softmax, P·V and W_o,
// in double, with a seed-convention mask (logits += M·(−1e9)). Checked twice:
// - static_assert: every row of P sums to 1 within invariants.hpp's row_sum_bound, and every
//   weight the seed mask masks is exactly 0 (while every unmasked one is > 0);
// - main(): the same call at run time (inputs offset by an opaque 0), compared bitwise, element by
//   element, with the constant-evaluated output, weights, lse and head outputs; exit 1 if any differ.
// Built and run by Clang 14 (tests/core.cmake: seed_example_constexpr_full, label exhaustive; CI's
// seed_example_constexpr at d_model = 128); GCC 12 is
// measured by bench/compile_time.sh (docs/compile-time.md). ATTNREF_SEED_MODEL_DIM (default 512)
// changes d_model for the benchmark; the heads stay 8.
#include <cstdio>
#include <cstring>
#include <memory>

#include "../support/fixed_inputs.hpp"
#include "attnref/attnref.hpp"

#ifndef ATTNREF_SEED_MODEL_DIM
#define ATTNREF_SEED_MODEL_DIM 512
#endif

namespace {

using namespace attnref;

constexpr mha_shape seed{.batch = 2, .query_length = 10, .key_length = 10, .model_dim = ATTNREF_SEED_MODEL_DIM, .heads = 8,
                         .kv_heads = 8, .head_dim_qk = ATTNREF_SEED_MODEL_DIM / 8, .head_dim_v = ATTNREF_SEED_MODEL_DIM / 8};

// The seed convention's mask M (1 = masked), broadcast over heads: batch 0 the decoder's look-ahead
// mask (key j > query i masked), batch 1 padding (keys 7, 8, 9 masked for every query).
constexpr fixed_tensor<double, 2, 1, 10, 10> make_seed_mask() {
    fixed_tensor<double, 2, 1, 10, 10> m{};
    for (std::size_t i = 0; i < 10; ++i)
        for (std::size_t j = 0; j < 10; ++j) {
            m(0, 0, i, j) = j > i ? 1 : 0;
            m(1, 0, i, j) = j >= 7 ? 1 : 0;
        }
    return m;
}
constexpr fixed_tensor<double, 2, 1, 10, 10> seed_mask = make_seed_mask();

constexpr attention_options seed_options() {
    attention_options o;
    o.mask.seed.values = seed_mask.view();
    o.threads = 1;
    return o;
}

constexpr fixed_mha_outputs<double, seed> run_constant_evaluated() {
    fixed_mha_inputs<double, seed> in{};
    test::fill_seed_example(in);
    return multi_head_attention<double, seed>(in, seed_options());
}

// The whole forward pass, constant-evaluated (constexpr forces it).
constexpr fixed_mha_outputs<double, seed> at_compile_time = run_constant_evaluated();

constexpr bool rows_sum_to_one_within_bound() {
    const invariant_context ctx{seed_options().mask};  // the seed mask is not structural: every key counts
    const invariant_report r = rows_sum_to_one<double>(at_compile_time.weights.view(), ctx, 0x1p-53);
    return r.ok && !r.vacuous && r.checked == seed.batch * seed.heads * seed.query_length;
}
static_assert(rows_sum_to_one_within_bound());

constexpr bool masked_weights_exactly_zero() {
    std::size_t masked = 0;
    for (std::size_t b = 0; b < seed.batch; ++b)
        for (std::size_t h = 0; h < seed.heads; ++h)
            for (std::size_t i = 0; i < seed.query_length; ++i)
                for (std::size_t j = 0; j < seed.key_length; ++j) {
                    const double p = at_compile_time.weights(b, h, i, j);
                    if (seed_mask(b, 0, i, j) != 0) {
                        if (p != 0) return false;
                        ++masked;
                    } else if (!(p > 0)) {
                        return false;
                    }
                }
    return masked == seed.heads * (45 + 30);  // 45 look-ahead and 30 padding entries per head
}
static_assert(masked_weights_exactly_zero());

template <class Tensor>
std::size_t differing(const Tensor& a, const Tensor& b) {
    std::size_t n = 0;
    for (std::size_t e = 0; e < a.values.size(); ++e) n += std::memcmp(&a.values[e], &b.values[e], sizeof(double)) != 0;
    return n;
}

}  // namespace

int main() {
    volatile std::uint64_t opaque = 0;  // the run-time path really runs: the optimiser cannot see the inputs
    auto in = std::make_unique<fixed_mha_inputs<double, seed>>();
    test::fill_seed_example(*in, opaque);
    const auto run_time = std::make_unique<fixed_mha_outputs<double, seed>>(multi_head_attention<double, seed>(*in, seed_options()));
    const std::size_t output = differing(at_compile_time.output, run_time->output),
                      weights = differing(at_compile_time.weights, run_time->weights),
                      lse = differing(at_compile_time.lse, run_time->lse),
                      heads = differing(at_compile_time.head_outputs, run_time->head_outputs);
    std::printf("seed example (d_model %zu): constant-evaluated vs run time, elements differing: output %zu of %zu, "
                "weights %zu of %zu, lse %zu of %zu, head outputs %zu of %zu\n",
                seed.model_dim, output, at_compile_time.output.values.size(), weights, at_compile_time.weights.values.size(), lse,
                at_compile_time.lse.values.size(), heads, at_compile_time.head_outputs.values.size());
    std::printf("output[0, 0, 0..2] = %.17g %.17g %.17g\n", at_compile_time.output(0, 0, 0), at_compile_time.output(0, 0, 1),
                at_compile_time.output(0, 0, 2));
    return output + weights + lse + heads == 0 ? 0 : 1;
}
