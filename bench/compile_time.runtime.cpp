// Benchmark (not a test): run-time speed of the shared forward path that the constant evaluator
// also runs (bench/compile_time.sh measures that side). Multi-head attention in double, one thread
// and all threads, at the seed example's shape (B = 2, S = 10, d_model = 512, H = 8, repeated) and at
// B = 1, S = 512, d_model = 512, H = 8. Prints the best of `trials` wall-clock times (best, because
// on a shared machine only the fastest trial approaches the undisturbed time) and multiply-adds per
// second, so a change to the shared loops can be checked for a run-time regression.
// Usage: compile_time.runtime [--quick | --once]   (--quick: seed shape only; --once: one seed-shape
// call on one thread, e.g. to count instructions under valgrind)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "attnref/attnref.hpp"

namespace {
using namespace attnref;

template <std::size_t R>
tensor<double, R> make(const extents_t<R>& extents, std::uint64_t seed) {
    tensor<double, R> t(extents);
    std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
    for (std::size_t n = 0; n < t.size(); ++n) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        t[n] = static_cast<double>(state >> 40) * 0x1p-23 - 1;
    }
    return t;
}

void run(std::size_t batch, std::size_t length, std::size_t model, std::size_t heads, int repeats, int trials, std::size_t threads) {
    const auto xq = make<3>({batch, length, model}, 1), xk = make<3>({batch, length, model}, 2),
               xv = make<3>({batch, length, model}, 3);
    const auto wq = make<2>({model, model}, 4), wk = make<2>({model, model}, 5), wv = make<2>({model, model}, 6),
               wo = make<2>({model, model}, 7);
    const mha_parameters<double> p{wq.view(), wk.view(), wv.view(), wo.view()};
    mha_options o{heads, 0, {}};
    o.attention.threads = threads;
    const double rows = double(batch * length), d = double(model), dh = d / double(heads);
    const double macs = 4 * rows * d * d + 2 * double(batch * heads) * double(length) * double(length) * dh;
    double best = 1e300, checksum = 0;
    for (int trial = 0; trial < trials; ++trial) {
        const auto start = std::chrono::steady_clock::now();
        for (int r = 0; r < repeats; ++r) checksum += multi_head_attention(xq, xk, xv, p, o).output[0];
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / repeats);
    }
    std::printf("B=%zu S=%zu d_model=%zu H=%zu threads=%zu: %.3f ms per call, %.0f M multiply-adds/s (checksum %.17g)\n", batch,
                length, model, heads, threads, best * 1e3, macs / best / 1e6, checksum);
}
}  // namespace

int main(int argc, char** argv) {
    const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
    if (argc > 1 && std::strcmp(argv[1], "--once") == 0) {
        run(2, 10, 512, 8, 1, 1, 1);
        return 0;
    }
    for (std::size_t threads : {std::size_t{1}, std::size_t{0}}) {
        run(2, 10, 512, 8, 5, quick ? 10 : 20, threads);
        if (!quick) run(1, 512, 512, 8, 1, 3, threads);
    }
    return 0;
}
