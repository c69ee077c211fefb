// Consumer of the installed header-only library: a compile-time multi-head attention whose
// invariants are checked by static_assert, then the same computation at run time.
#include <attnref/attnref.hpp>

#include <cstdio>

namespace {
constexpr attnref::mha_shape shape{.batch = 1, .query_length = 2, .key_length = 3, .model_dim = 4, .heads = 2,
                                   .kv_heads = 2, .head_dim_qk = 2, .head_dim_v = 2};

constexpr attnref::fixed_mha_inputs<double, shape> inputs(int seed) {
    attnref::fixed_mha_inputs<double, shape> in{};
    int n = seed;
    auto fill = [&n](auto& t) {
        for (auto& x : t.values) x = ((n++ * 29) % 13 - 6) / 8.0;
    };
    fill(in.x_q), fill(in.x_k), fill(in.x_v), fill(in.w_q), fill(in.w_k), fill(in.w_v), fill(in.w_o);
    return in;
}

constexpr auto compile_time = attnref::multi_head_attention<double, shape>(inputs(1));
static_assert(attnref::rows_sum_to_one<double>(compile_time.weights.view(), {}, 0x1p-53).ok);
}  // namespace

int main() {
    volatile int seed = 1;
    const auto run_time = attnref::multi_head_attention<double, shape>(inputs(seed));
    for (std::size_t n = 0; n < run_time.output.values.size(); ++n)
        if (run_time.output.values[n] != compile_time.output.values[n]) {
            std::printf("consumer: compile-time and run-time outputs differ at %zu\n", n);
            return 1;
        }
    std::printf("consumer: attnref %s OK, output[0] = %.17g\n", "found", run_time.output.values[0]);
    return 0;
}
