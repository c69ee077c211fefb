// Benchmark (not a test): throughput of `attnref check`'s hot path — read the candidate .npy,
// compare it with the reference under the default (data-aware) model, zero-trust, report — in MB/s
// of candidate data, with the per-element bound already computed (computing it is timed apart:
// README, `attnref check` on the committed cases).
//
// The reference and the per-element bounds are synthetic (a quick deterministic formula: no
// certification is needed to time the comparison): bound = c·(|e| + 0.25) with c = 1e-6 for float32
// and 1e-15 for float64, which a correctly rounded candidate passes. The candidates are written to a
// temporary directory as float32 and float64 .npy files and then checked through the same library
// functions run_check uses: read_candidate, judge_output (comparison, vacuity, zero-trust), decide,
// report_table. The comparison runs on
// std::thread::hardware_concurrency() threads (tolerance::compare's default); the count is printed.
// Usage: check.bench [--elements N (default 2^25)] [--repeat R (default 3)] [--dir DIR]

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "attnref/npy.hpp"
#include "attnref/tolerance.hpp"
#include "attnref/golden/check.hpp"

namespace fs = std::filesystem;
namespace tol = attnref::tolerance;
using namespace attnref;
using namespace attnref::golden;

int main(int argc, char** argv) {
    std::size_t elements = std::size_t{1} << 25, repeat = 3;
    fs::path dir = fs::temp_directory_path() / ("attnref-check-bench-" + std::to_string(::getpid()));
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--elements") && i + 1 < argc) elements = std::stoul(argv[++i]);
        else if (!std::strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = std::stoul(argv[++i]);
        else if (!std::strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
    }
    const std::size_t dv = 64, heads = 16;
    const std::size_t rows = std::max<std::size_t>(1, elements / (dv * heads));
    elements = rows * dv * heads;
    const std::vector<std::size_t> shape{1, heads, rows, dv};

    // Synthetic reference.
    std::vector<double> expected(elements);
    for (std::size_t n = 0; n < elements; ++n) {
        const double x = static_cast<double>((n * 2654435761u) % 1000003) / 1000003.0 - 0.5;
        expected[n] = x + 1e-3 * static_cast<double>(n % 7);
    }
    fs::create_directories(dir);
    const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
    std::printf("%s\n", fmt::format("check.bench: {} elements, shape (1, {}, {}, {}), {} threads, files in {}", elements, heads, rows,
                                    dv, threads, dir.string()).c_str());

    for (const tol::candidate_format f : {tol::candidate_format::float32, tol::candidate_format::float64}) {
        const fs::path file = dir / (std::string(tol::format_name(f)) + ".npy");
        if (f == tol::candidate_format::float32) {
            std::vector<float> c(elements);
            for (std::size_t n = 0; n < elements; ++n) c[n] = static_cast<float>(expected[n]);
            npy::write(file, npy::make_array("<f4", shape, c));
        } else {
            std::vector<double> c(elements);
            for (std::size_t n = 0; n < elements; ++n) c[n] = expected[n] * (1 + 0x1p-52);
            npy::write(file, npy::make_array("<f8", shape, c));
        }
        const double mb = static_cast<double>(fs::file_size(file)) / 1e6;
        // Synthetic per-element bounds (precomputed, not timed).
        const double scale = f == tol::candidate_format::float32 ? 1e-6 : 1e-15;
        std::vector<double> bounds(elements);
        for (std::size_t n = 0; n < elements; ++n) bounds[n] = scale * (std::abs(expected[n]) + 0.25);
        std::vector<double> times;
        std::string verdict;
        for (std::size_t r = 0; r < repeat; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            std::optional<tol::candidate_format> format;
            const std::vector<double> candidate = read_candidate(file.string(), shape, format);
            const auto t1 = std::chrono::steady_clock::now();
            check_result res;
            res.case_name = "bench";
            res.format = *format;
            res.tensors.push_back(judge_output(candidate, expected, *format, bounds, dv));
            decide(res);
            const std::string table = report_table(res, false);
            const auto t2 = std::chrono::steady_clock::now();
            const double total = std::chrono::duration<double>(t2 - t0).count(), read = std::chrono::duration<double>(t1 - t0).count();
            times.push_back(total);
            verdict = verdict_text(res.tensors.back());
            std::printf("%s\n", fmt::format("  {:<8} {:8.1f} MB  read {:6.3f} s  compare+report {:6.3f} s  total {:6.3f} s  {:8.1f} MB/s  ({})",
                                            tol::format_name(f), mb, read, total - read, total, mb / total, verdict).c_str());
        }
        std::sort(times.begin(), times.end());
        std::printf("%s\n", fmt::format("{:<8} best {:8.1f} MB/s  median {:8.1f} MB/s of candidate data  ({} threads)",
                                        tol::format_name(f), mb / times.front(), mb / times[times.size() / 2], threads).c_str());
        fs::remove(file);
    }
    fs::remove_all(dir);
    return 0;
}
