// A consumer that includes attnref's headers directly, built by tests/fp_environment_consumer.cmake
// with and without the reference flags. It computes a small float MHA and prints every output's
// bits, or, if attnref refuses the floating-point environment, "refused: <message>" and exits 3.
// `upward` as the first argument switches the rounding mode to FE_UPWARD first.
#include <cfenv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include <attnref/attnref.hpp>

int main(int argc, char** argv) {
    const bool upward = argc > 1 && std::string(argv[1]) == "upward";
    const std::size_t batch = 1, length = 5, model = 12, heads = 3;
    std::uint64_t state = 12345;
    auto next = [&] {  // deterministic values in [-1, 1), exact in float
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        return static_cast<float>(static_cast<double>(state >> 40) * 0x1p-23 - 1.0);
    };
    attnref::tensor<float, 3> x({batch, length, model});
    attnref::tensor<float, 2> wq({model, model}), wk({model, model}), wv({model, model}), wo({model, model});
    for (auto* t : {&x}) for (std::size_t n = 0; n < t->size(); ++n) (*t)[n] = next();
    for (auto* t : {&wq, &wk, &wv, &wo}) for (std::size_t n = 0; n < t->size(); ++n) (*t)[n] = next();
    attnref::mha_parameters<float> p{wq.view(), wk.view(), wv.view(), wo.view()};
    attnref::mha_options o;
    o.heads = heads;
    o.attention.threads = 1;
    if (upward) std::fesetround(FE_UPWARD);
    try {
        const auto r = attnref::multi_head_attention(x, x, x, p, o);
        for (std::size_t n = 0; n < r.output.size(); ++n) {
            std::uint32_t bits;
            const float y = r.output[n];
            std::memcpy(&bits, &y, sizeof bits);
            std::printf("%08x\n", static_cast<unsigned>(bits));
        }
    } catch (const attnref::fp_environment_error& e) {
        std::printf("refused: %s\n", e.what());
        return 3;
    }
    return 0;
}
