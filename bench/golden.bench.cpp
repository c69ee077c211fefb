// Benchmark (not a test): time and multiply-adds per second of the golden-data paths for the seed
// example (B=2, S=10, d_model=512, H=8) and for B=1, S=512, d_model=512, H=8:
//   plain double            uniform_precision<double>
//   certified path          uniform_precision<mpfr_interval<40>> (134-bit MPFI) + rounding check
//   plain MPFR              uniform_precision<mpfr_real<40>> at the certified path's precision
// Usage: golden.bench [--threads N] [--skip-large]

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "attnref/certify.hpp"
#include "attnref/multiprecision.hpp"
#include "attnref/golden/generate.hpp"
#include "attnref/golden/manifest.hpp"

using namespace attnref;
using namespace attnref::golden;

namespace {

case_spec mha_case(std::size_t batch, std::size_t length) {
    const std::string json = fmt::format(
        R"({{"schema": "attnref.suite", "schema_version": 1, "cases": [{{"name": "bench", "kind": "mha",
            "shapes": {{"batch": {0}, "heads": 8, "query_length": {1}, "key_length": {1}, "head_dim_qk": 64,
                        "model_dim": 512, "output_dim": 512}}, "inputs": {{"seed": 1}}}}]}})",
        batch, length);
    return parse_suite(json, "bench").front();
}

double multiply_adds(const case_spec& s) {
    const case_shapes& d = s.shapes;
    const double projections = double(d.batch) * d.model_dim *
                                   (d.query_length * d.heads * d.head_dim_qk + d.key_length * d.kv_heads * (d.head_dim_qk + d.head_dim_v)) +
                               double(d.batch) * d.query_length * d.heads * d.head_dim_v * d.output_dim;
    return projections + double(d.batch) * d.heads * d.query_length * d.key_length * (d.head_dim_qk + d.head_dim_v);
}

template <class F>
double seconds(F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void report(const char* label, const char* path, double macs, double s) {
    std::printf("%s\n", fmt::format("{:<28} {:<34} {:>10.3f} s  {:>10.2f} M multiply-adds/s", label, path, s, macs / s / 1e6).c_str());
}

}  // namespace

int main(int argc, char** argv) {
    std::size_t threads = 0;
    bool skip_large = false;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) threads = std::stoul(argv[++i]);
        else if (!std::strcmp(argv[i], "--skip-large")) skip_large = true;
    }
    std::printf("%s\n", fmt::format("golden.bench: threads {} (0 = all cores); certified precision {} bits", threads,
                                    certify::bits_of<40>).c_str());
    struct setup {
        const char* label;
        std::size_t batch, length;
    };
    for (const setup& c : {setup{"seed example B2 S10", 2, 10}, setup{"B1 S512", 1, 512}}) {
        if (skip_large && c.length > 10) continue;
        const case_spec s = mha_case(c.batch, c.length);
        const case_data data = generate_inputs(s);
        const double macs = multiply_adds(s);
        std::printf("%s\n", fmt::format("{}: {:.1f} M multiply-adds", c.label, macs / 1e6).c_str());
        report(c.label, "plain double", macs, seconds([&] { compute_case<uniform_precision<double>, double>(s, data, threads); }));
        report(c.label, "plain MPFR (134 bits)", macs,
               seconds([&] { compute_case<uniform_precision<mpfr_real<40>>, double>(s, data, threads); }));
        report(c.label, "certified (MPFI 134 bits + check)", macs, seconds([&] { generate_case(s, threads); }));
    }
    return 0;
}
