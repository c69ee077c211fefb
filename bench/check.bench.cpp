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
//
// With --golden DIR --output FILE [--weights FILE --lse FILE]: `attnref check` end to end on a real
// case (run_check: read, bounds, compare, decoys, invariants; then the report), timed (wall and the
// process's CPU seconds), side by side with PyTorch's float64 multi_head_attention_forward of the
// same shape (B, S, E, H) (bench/torch_mha.py as a child process through posix_spawn, no shell,
// torch.set_num_threads(N) and OPENBLAS/OMP threads N, N = --threads, default 2), their ratio, the
// verdict, the peak RSS, the load average and whether the bound kernels ran their AVX2 copies.
// --grad-<role> FILE (as `attnref check`: --grad-query, --grad-w-q, …) adds gradient tensors; the
// comparison is then PyTorch's float64 forward + autograd backward of the same layer
// (bench/torch_mha_backward.py for an mha case, torch_sdpa_backward.py for sdpa), and --output may
// be left out (gradients alone).
// attnref uses std::thread::hardware_concurrency() threads (printed). --python PATH (default
// /usr/bin/python3), --repeat R: PyTorch's best of R.
// Unless --no-own-forward (or gradients alone), it also times attnref's own float64 forward of the
// case (compute_case, the path of `attnref run --arith float64`: output, weights, lse; best of R) and
// prints it beside PyTorch's: the arithmetic any bound evaluated with attnref's deterministic
// kernels repeats at least, i.e. the check's floor on this machine.

#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
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

#include "attnref/io/npy.hpp"
#include "attnref/bounds/tolerance.hpp"
#include "attnref/check/checker.hpp"
#include "torch_mha.hpp"

namespace fs = std::filesystem;
namespace tol = attnref::tolerance;
using namespace attnref;
using namespace attnref::golden;

namespace {
/// PyTorch's float64 forward of the case's shape (bench/torch_mha.hpp); false when it fails.
bool torch_forward(const std::string& python, const case_shapes& d, std::size_t threads, std::size_t repeats, double& wall, double& cpu) {
    return bench::torch_mha_seconds(python, d.batch, d.query_length, d.model_dim, d.heads, threads, repeats, wall, cpu);
}

double process_cpu_seconds() {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

bool grads_only(const check_request& rq) { return rq.output.empty() && rq.weights.empty() && rq.lse.empty(); }

/// `attnref check` on a real case against PyTorch's float64 forward of the same shape (and, with
/// own_forward, attnref's own float64 forward of the case).
int bench_case(const check_request& rq, const std::string& python, std::size_t threads, std::size_t repeats, bool own_forward) {
    double l[3] = {0, 0, 0};
    if (::getloadavg(l, 3) != 3) l[0] = l[1] = l[2] = -1;
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = process_cpu_seconds();
    const check_result r = run_check(rq);
    const std::string table = report_table(r, false);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), cpu = process_cpu_seconds() - c0;
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    std::printf("%s", table.c_str());
    const loaded_case lc = load_case(rq.golden);
    const case_spec& spec = lc.m.spec;
    const case_shapes& d = spec.shapes;
    // attnref's own float64 forward of the case (the path `attnref run --arith float64` takes: output,
    // weights and lse, every thread), best of --repeat: the least arithmetic any bound evaluated
    // with attnref's deterministic kernels repeats (logits, softmax, P·V, projections).
    double own_wall = -1, own_cpu = -1;
    if (own_forward && !grads_only(rq))
        for (std::size_t rep = 0; rep < repeats; ++rep) {
            const auto f0 = std::chrono::steady_clock::now();
            const double fc0 = process_cpu_seconds();
            const auto out = compute_case<uniform_precision<double>, double>(spec, lc.data, 0);
            const double fw = std::chrono::duration<double>(std::chrono::steady_clock::now() - f0).count(), fc = process_cpu_seconds() - fc0;
            if (own_wall < 0 || fw < own_wall) own_wall = fw, own_cpu = fc;
            (void)out;
        }
    double torch_wall = -1, torch_cpu = -1;
    const bool grads = !rq.gradients.empty();
    // The bench scripts take (batch, length, model dim, heads): sdpa's model dim is heads·dk.
    const bool mha = spec.kind == case_kind::mha, square = d.query_length == d.key_length;
    const bool torch_ok =
        grads ? square && bench::torch_mha_seconds(python, d.batch, d.query_length, mha ? d.model_dim : d.heads * d.head_dim_qk, d.heads,
                                                   threads, repeats, torch_wall, torch_cpu,
                                                   mha ? "torch_mha_backward.py" : "torch_sdpa_backward.py")
              : mha && square && torch_forward(python, d, threads, repeats, torch_wall, torch_cpu);
    std::string what = rq.output.empty() ? "" : "output";
    if (!rq.weights.empty()) what += " + weights";
    if (!rq.lse.empty()) what += " + lse";
    if (grads) what += (what.empty() ? "" : " + ") + std::to_string(rq.gradients.size()) + " gradient tensor(s)";
    std::printf("%s\n", fmt::format("check.bench: case {} (B={} S={} E={} H={}), {}; load average {:.2f} {:.2f} {:.2f} before", spec.name,
                                    d.batch, d.query_length, d.model_dim, d.heads, what, l[0], l[1], l[2]).c_str());
    std::printf("%s\n", fmt::format("  attnref check   wall {:8.2f} s  CPU {:8.2f} s  ({} threads, {} bound kernels)  peak RSS {:.2f} GB  verdict {}",
                                    wall, cpu, std::max(1u, std::thread::hardware_concurrency()),
                                    tol::simd::use_avx2() ? "AVX2" : "default-target", static_cast<double>(u.ru_maxrss) / 1e6,
                                    verdict_name(r.overall)).c_str());
    if (own_wall >= 0)
        std::printf("%s\n", fmt::format("  attnref float64 forward (no bounds) wall {:8.2f} s  CPU {:8.2f} s  (best of {}; the check's floor)", own_wall,
                                        own_cpu, repeats).c_str());
    if (!torch_ok) {
        std::printf("  PyTorch float64 %s: not run (%s)\n", grads ? "forward + backward" : "forward",
                    !square            ? "cases with as many keys as queries only"
                    : !grads && !mha   ? "MHA cases only"
                                       : "the bench/ script failed: is torch importable by --python?");
        return 0;
    }
    std::printf("%s\n", fmt::format("  PyTorch {} wall {:8.2f} s  CPU {:8.2f} s  ({} threads, best of {})", grads ? "fwd+bwd" : "forward", torch_wall,
                                    torch_cpu, threads, repeats).c_str());
    std::printf("%s\n", fmt::format("  ratio (wall)    {:8.1f}x   (CPU {:.1f}x)", wall / torch_wall, cpu / torch_cpu).c_str());
    if (own_wall >= 0)
        std::printf("%s\n", fmt::format("  attnref's own float64 forward / PyTorch's (wall) {:.1f}x;  check / attnref's own forward {:.1f}x", own_wall / torch_wall,
                                        wall / own_wall).c_str());
    return 0;
}
}  // namespace

int main(int argc, char** argv) {
    std::size_t elements = std::size_t{1} << 25, repeat = 3, torch_threads = 2;
    bool own_forward = true;
    fs::path dir = fs::temp_directory_path() / ("attnref-check-bench-" + std::to_string(::getpid()));
    check_request rq;
    std::string python = "/usr/bin/python3";
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--elements") && i + 1 < argc) elements = std::stoul(argv[++i]);
        else if (!std::strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = std::stoul(argv[++i]);
        else if (!std::strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else if (!std::strcmp(argv[i], "--golden") && i + 1 < argc) rq.golden = argv[++i];
        else if (!std::strcmp(argv[i], "--output") && i + 1 < argc) rq.output = argv[++i];
        else if (!std::strcmp(argv[i], "--weights") && i + 1 < argc) rq.weights = argv[++i];
        else if (!std::strcmp(argv[i], "--lse") && i + 1 < argc) rq.lse = argv[++i];
        else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) torch_threads = std::stoul(argv[++i]);
        else if (!std::strcmp(argv[i], "--python") && i + 1 < argc) python = argv[++i];
        else if (!std::strcmp(argv[i], "--no-own-forward")) own_forward = false;
        else if (!std::strncmp(argv[i], "--grad-", 7) && i + 1 < argc) {
            std::string role = argv[i] + 2;  // grad-w-q → grad_w_q
            std::replace(role.begin(), role.end(), '-', '_');
            rq.gradients.emplace_back(role, argv[++i]);  // run_check refuses a role the case does not have
        } else {
            std::fprintf(stderr, "check.bench: unknown or incomplete argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!rq.golden.empty()) {
        if (rq.output.empty() && rq.gradients.empty()) {
            std::fprintf(stderr, "check.bench: --golden needs --output or --grad-<role>\n");
            return 2;
        }
        try {
            return bench_case(rq, python, torch_threads, std::max<std::size_t>(repeat, 1), own_forward);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "check.bench: %s\n", e.what());
            return 2;
        }
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
