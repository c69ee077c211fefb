// Benchmark (not a test): certified golden data, fast path vs PyTorch float64 and vs the MPFI
// path, for the seed example (B=2, S=10, d_model=512, H=8), (1, 512, 512, 8) and (1, 2048, 1024, 16).
// Per shape it prints, side by side in one run: PyTorch float64 multi_head_attention_forward wall
// and CPU seconds (bench/torch_mha.py, a child process started with posix_spawn, no shell;
// torch.set_num_threads(N), OPENBLAS/OMP threads N; best of several runs), attnref's fast certified
// wall and CPU seconds (include/attnref/certify/fast.hpp: output, weights and lse, float64, every
// element correctly rounded, the undecided ones through the MPFI ladder), the two ratios, the
// elements the fast rung escalated, attnref's peak resident memory (the process's high-water mark so
// far: shapes run smallest first), and the MPFI path's time (generate_case) for the shapes it
// compares byte for byte with the fast path.
// With --fast-rung-only the escalated elements are counted but not sent to MPFI (the time is then
// the fast rung's alone, and those elements are NOT certified; the table says so).
// Under each shape a breakdown line gives the fast path's stages (a fast::stage_timer observer):
// projections, attention core (wall) with its thread-seconds for logits / softmax / P·V, output
// projection, escalation (and how many rows the row rung and the whole-batch ladder took),
// and the load average before the shape.
// With --bound-histogram, the distribution of log2(bound / ulp(value)) of every bounded output and
// weight element (an element is certified only when the ratio is below ~1/4 and it is not too near
// a rounding midpoint). --seed S sets the inputs' seed (default 1); --only-large runs the largest shape.
// With --gradients [--length L] [--seeds N]: certified SDPA gradients instead (golden::certify_gradients_fast:
// dQ, dK, dV in float64 through the fast backward, certify/fast/backward.hpp) of (1, 16, L, 64) (default
// L = 2048) for N seeds (default 5) from --seed on, against PyTorch float64 forward + backward of the same
// shape (bench/torch_sdpa_backward.py, same threads), one line per seed, then the worst and median ratio;
// for L ≤ 256 also the MPFI path's time and a byte comparison. Undecided elements are escalated (the
// gradient rung, certify/fast/gradient_rung.hpp, then the group ladder) and their time is included.
// With --gradients --kind mha: certified multi-head gradients (every gradient role, float64, through
// certify/fast/backward.hpp's mha_gradients_fast) of (1, L, 1024, 16) with biases, against PyTorch float64
// multi_head_attention_forward + autograd backward (bench/torch_mha_backward.py); undecided elements go to
// the whole-case MPFI ladder when it fits in the memory limit, else the seed's line says why it is not
// certified. --family large_logits|positive_values: bench/llm_adversarial_suite.json's adversarial input
// families instead of the standard one. --fast-rung-only (with --gradients): undecided elements counted
// per tensor, not certified.
// Usage: golden.bench [--threads N] [--skip-mpfi-large] [--skip-large] [--only-large] [--seed S]
//                     [--fast-rung-only] [--bound-histogram] [--python PATH]
//                     [--gradients [--kind sdpa|mha [--family F]] [--length L] [--seeds N]]

#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "attnref/certify/certify.hpp"
#include "attnref/certify/fast.hpp"
#include "attnref/certify/fast/profile.hpp"
#include "attnref/multiprecision/multiprecision.hpp"
#include "attnref/golden/generate.hpp"
#include "attnref/golden/manifest.hpp"
#include "torch_mha.hpp"

using namespace attnref;
using namespace attnref::golden;

namespace {

struct shape {
    const char* label;
    std::size_t batch, length, model_dim, heads;
    bool mpfi;
};

case_spec mha_case(const shape& s, unsigned long seed) {
    const std::string json = fmt::format(
        R"({{"schema": "attnref.suite", "schema_version": 1, "cases": [{{"name": "bench", "kind": "mha",
            "shapes": {{"batch": {0}, "heads": {3}, "query_length": {1}, "key_length": {1}, "head_dim_qk": {4},
                        "model_dim": {2}, "output_dim": {2}}}, "conventions": {{"projection_bias": true}},
            "inputs": {{"seed": {5}}}}}]}})",
        s.batch, s.length, s.model_dim, s.heads, s.model_dim / s.heads, seed);
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

/// PyTorch's float64 forward of shape s (bench/torch_mha.hpp): best wall seconds, and the CPU
/// seconds of that run (into cpu); -1 when it fails.
double torch_seconds(const std::string& python, const shape& s, std::size_t threads, int repeats, double& cpu) {
    cpu = -1;
    double wall = 0, c = 0;
    if (!bench::torch_mha_seconds(python, s.batch, s.length, s.model_dim, s.heads, threads, static_cast<std::size_t>(repeats), wall, c))
        return -1;
    cpu = c;
    return wall;
}

double user_cpu_seconds() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_utime.tv_sec) + static_cast<double>(u.ru_utime.tv_usec) * 1e-6 +
           static_cast<double>(u.ru_stime.tv_sec) + static_cast<double>(u.ru_stime.tv_usec) * 1e-6;
}

/// The process's peak resident set so far, GiB.
double peak_rss_gib() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_maxrss) / (1024.0 * 1024.0);  // ru_maxrss is in KiB on Linux
}

std::string load_average() {
    double l[3] = {0, 0, 0};
    if (getloadavg(l, 3) != 3) return "?";
    return fmt::format("{:.2f} {:.2f} {:.2f}", l[0], l[1], l[2]);
}

/// log2(bound / ulp(value)) histogram: below -56, [-56, -8) in bins of width 8, [-8, -2), and ≥ -2
/// (never certified: the bound exceeds a quarter ulp).
struct histogram {
    static constexpr int bins = 9;
    std::array<std::atomic<std::size_t>, bins> count{};
    void add(const fast::bounded& x) {
        if (x.v.hi == 0 || x.bound == 0) return count[0]++, void();
        const int r = std::ilogb(x.bound) - std::ilogb(x.v.hi) + 52;  // ≈ log2(bound / ulp)
        const int b = r >= -2 ? bins - 1 : std::clamp((r + 64) / 8, 0, bins - 2);
        count[static_cast<std::size_t>(b)]++;
    }
    std::string line(const char* name) const {
        std::string s = fmt::format("    log2(bound/ulp) of {:<8}", name);
        for (int b = 0; b < bins; ++b)
            s += fmt::format(" {}:{}",
                             b == bins - 1   ? std::string("[-2,)")
                             : b == 0        ? std::string("(,-56)")
                             : b == bins - 2 ? std::string("[-8,-2)")
                                             : fmt::format("[{},{})", b * 8 - 64, b * 8 - 56),
                             count[static_cast<std::size_t>(b)].load());
        return s;
    }
};

case_spec sdpa_gradient_case(std::size_t heads, std::size_t length, std::size_t dk, unsigned long seed) {
    const std::string json = fmt::format(
        R"({{"schema": "attnref.suite", "schema_version": 2, "cases": [{{"name": "bench", "kind": "sdpa",
            "shapes": {{"batch": 1, "heads": {0}, "query_length": {1}, "key_length": {1}, "head_dim_qk": {2}, "head_dim_v": {2}}},
            "inputs": {{"seed": {3}}}, "outputs": {{"gradients": true}}}}]}})",
        heads, length, dk, seed);
    return parse_suite(json, "bench").front();
}

/// family: "" (standard), or bench/llm_adversarial_suite.json's input families: "large_logits" (x_q × 4),
/// "positive_values" (x_v + 2, x_q × 10^-3).
case_spec mha_gradient_case(std::size_t heads, std::size_t length, std::size_t dk, unsigned long seed, const std::string& family) {
    const std::string fam = family == "large_logits"      ? R"(, "family": {"name": "large_logits", "roles": {"query": {"scale": 4.0}}})"
                            : family == "positive_values" ? R"(, "family": {"name": "positive_values_uniform", "roles": {"value": {"scale": 1.0, "offset": 2.0}, "query": {"scale": 0.001}}})"
                                                          : "";
    const std::string json = fmt::format(
        R"({{"schema": "attnref.suite", "schema_version": 2, "cases": [{{"name": "bench", "kind": "mha",
            "shapes": {{"batch": 1, "heads": {0}, "query_length": {1}, "key_length": {1}, "head_dim_qk": {2},
                        "model_dim": {3}, "output_dim": {3}}}, "conventions": {{"projection_bias": true}},
            "inputs": {{"format": "float64", "seed": {4}{5}}}, "outputs": {{"gradients": true}}}}]}})",
        heads, length, dk, heads * dk, seed, fam);
    return parse_suite(json, "bench").front();
}

/// --gradients: certified SDPA gradients of (1, 16, L, 64), or (--kind mha) multi-head gradients of
/// (1, L, 1024, 16), for several seeds against PyTorch float64 forward + backward in the same run.
int gradients_bench(std::size_t threads, std::size_t length, unsigned long seed, std::size_t seeds, const std::string& python, bool mha,
                    bool fast_rung_only, const std::string& family) {
    const std::size_t heads = 16, dk = 64;
    double torch_cpu = -1;
    const std::string load0 = load_average();
    const double torch_s = [&] {
        double wall = 0;
        if (!bench::torch_mha_seconds(python, 1, length, heads * dk, heads, threads, length > 512 ? 3 : 10, wall, torch_cpu,
                                      mha ? "torch_mha_backward.py" : "torch_sdpa_backward.py"))
            return -1.0;
        return wall;
    }();
    std::printf("%s\n", fmt::format("golden.bench --gradients: {} certified in float64, {} threads on both sides; "
                                    "PyTorch f64 forward+backward {:.3f} s wall / {:.3f} s CPU (load average before {}){}",
                                    mha ? fmt::format("MHA (1, {}, {}, {}){} grad_x_q/k/v, grad_w_q/k/v/o, grad_b_q/k/v/o", length, heads * dk, heads,
                                                      family.empty() ? std::string() : " inputs family " + family)
                                        : fmt::format("SDPA (1, {}, {}, {}) dQ, dK, dV", heads, length, dk),
                                    threads, torch_s, torch_cpu, load0,
                                    fast_rung_only ? "; FAST RUNG ONLY: undecided elements are counted, not certified"
                                    : mha ? "; undecided elements through the whole-case MPFI ladder when it fits in --max-memory, time included"
                                          : "; undecided elements escalated (the gradient rung, then the group ladder), time included")
                            .c_str());
    std::printf("%s\n", fmt::format("{:>6} {:>21} {:>15} {:>10} {:>9} {:>8} {:>10} {:>16}", "seed", "attnref wall/CPU", "ratio wall/CPU",
                                    "elements", "escalated", "peak RSS", "MPFI path", "load average")
                            .c_str());
    std::vector<double> ratios;
    int status = 0;
    for (unsigned long sd = seed; sd < seed + seeds; ++sd) {
        const case_spec spec = mha ? mha_gradient_case(heads, length, dk, sd, family) : sdpa_gradient_case(heads, length, dk, sd);
        const case_data data = generate_inputs(spec);
        fast::fast_stats stats;
        fast::fast_options fo;
        fo.fallback = !fast_rung_only;
        certify::result r;
        std::string failure;
        const std::string load = load_average();
        const double cpu0 = user_cpu_seconds();
        const double wall = seconds([&] {
            try {
                r = certify_gradients_fast(spec, data, threads, {certify::float64_target}, {}, &stats, fo);
            } catch (const certify::uncertified_error& e) {
                failure = e.what();
            }
        });
        const double cpu = user_cpu_seconds() - cpu0;
        std::size_t elements = 0;
        for (const certify::tensor_report& rep : r.reports) elements += rep.elements;
        if (!failure.empty()) {
            std::printf("%s\n", fmt::format("{:>6} not certified after {:.3f} s wall / {:.3f} s CPU: {}", sd, wall, cpu, failure).c_str());
            status = 1;
            continue;
        }
        std::string per_tensor;
        for (const certify::tensor_report& rep : r.reports)
            if (rep.escalated) per_tensor += fmt::format(" {} {}", rep.tensor, rep.escalated);
        std::string mpfi = "-";
        if (length <= 256) {
            certify::result m;
            mpfi = fmt::format("{:.3f} s", seconds([&] { m = certify_gradients(spec, data, threads, {certify::float64_target}); }));
            for (std::size_t t = 0; t < m.values.size(); ++t)
                if (m.values[t][0] != r.values[t][0]) {
                    std::fprintf(stderr, "golden.bench: seed %lu: fast gradient %zu differs from the MPFI path\n", sd, t);
                    status = 1;
                }
        }
        ratios.push_back(torch_s > 0 ? wall / torch_s : 0.0);
        std::printf("%s\n", fmt::format("{:>6} {:>21} {:>15} {:>10} {:>9} {:>6.2f} G {:>10} {:>16}{}", sd, fmt::format("{:.3f} / {:.3f} s", wall, cpu),
                                        fmt::format("{:.1f}x / {:.1f}x", ratios.back(), torch_cpu > 0 ? cpu / torch_cpu : 0.0), elements,
                                        stats.escalated_elements, peak_rss_gib(), mpfi, load, per_tensor.empty() ? "" : " (escalated:" + per_tensor + ")")
                                .c_str());
        std::fflush(stdout);
    }
    std::sort(ratios.begin(), ratios.end());
    if (!ratios.empty())
        std::printf("%s\n", fmt::format("wall ratio to PyTorch f64 forward+backward: worst {:.1f}x, median {:.1f}x over {} seeds", ratios.back(),
                                        ratios[ratios.size() / 2], ratios.size())
                                .c_str());
    return status;
}

}  // namespace

int main(int argc, char** argv) {
    std::size_t threads = 2;
    bool skip_mpfi_large = false, skip_large = false, only_large = false, fast_rung_only = false, bound_histogram = false;
    unsigned long seed = 1;
    std::string python = "/usr/bin/python3";
    bool gradients = false;
    std::size_t length = 2048, seeds = 5;
    std::string kind = "sdpa", family;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) threads = std::stoul(argv[++i]);
        else if (!std::strcmp(argv[i], "--skip-mpfi-large")) skip_mpfi_large = true;
        else if (!std::strcmp(argv[i], "--skip-large")) skip_large = true;
        else if (!std::strcmp(argv[i], "--only-large")) only_large = true;
        else if (!std::strcmp(argv[i], "--seed") && i + 1 < argc) seed = std::stoul(argv[++i]);
        else if (!std::strcmp(argv[i], "--fast-rung-only")) fast_rung_only = true;
        else if (!std::strcmp(argv[i], "--bound-histogram")) bound_histogram = true;
        else if (!std::strcmp(argv[i], "--python") && i + 1 < argc) python = argv[++i];
        else if (!std::strcmp(argv[i], "--gradients")) gradients = true;
        else if (!std::strcmp(argv[i], "--length") && i + 1 < argc) length = std::stoul(argv[++i]);
        else if (!std::strcmp(argv[i], "--seeds") && i + 1 < argc) seeds = std::stoul(argv[++i]);
        else if (!std::strcmp(argv[i], "--family") && i + 1 < argc &&
                 (!std::strcmp(argv[i + 1], "large_logits") || !std::strcmp(argv[i + 1], "positive_values"))) family = argv[++i];
        else if (!std::strcmp(argv[i], "--kind") && i + 1 < argc && (!std::strcmp(argv[i + 1], "sdpa") || !std::strcmp(argv[i + 1], "mha"))) kind = argv[++i];
        else {
            std::fprintf(stderr, "golden.bench: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (gradients) return gradients_bench(threads, length, seed, seeds, python, kind == "mha", fast_rung_only, family);
    std::printf("%s\n", fmt::format("golden.bench: {} threads on both sides; inputs seed {}; certified: output, weights, lse in float64{}",
                                    threads, seed, fast_rung_only ? "; FAST RUNG ONLY: escalated elements are not certified" : "")
                            .c_str());
    std::printf("%s\n", fmt::format("{:<19} {:>7} {:>21} {:>21} {:>15} {:>10} {:>9} {:>8} {:>10}", "shape (B,S,E,H)", "G MACs",
                                    "PyTorch f64 wall/CPU", "attnref wall/CPU", "ratio wall/CPU", "elements", "escalated",
                                    "peak RSS", "MPFI path").c_str());
    const shape shapes[] = {{"seed (2,10,512,8)", 2, 10, 512, 8, true},
                            {"(1,512,512,8)", 1, 512, 512, 8, !skip_mpfi_large},
                            {"(1,2048,1024,16)", 1, 2048, 1024, 16, false}};
    int status = 0;
    for (const shape& s : shapes) {
        if ((skip_large && s.length > 512) || (only_large && s.length <= 512)) continue;
        const case_spec spec = mha_case(s, seed);
        const case_data data = generate_inputs(spec);
        const double macs = multiply_adds(spec);
        double torch_cpu = -1;
        const double torch_s = torch_seconds(python, s, threads, s.length > 512 ? 3 : 10, torch_cpu);
        certify::result fast;
        fast::fast_stats stats;
        fast::fast_options fo;
        fast::stage_timer timer;
        fo.observer = &timer;
        fo.fallback = !fast_rung_only;
        histogram hist[2];
        if (bound_histogram)
            fo.observe = [&](std::size_t t, std::size_t, const fast::bounded& x) {
                if (t < 2) hist[t].add(x);
            };
        const std::string load = load_average();
        const double cpu0 = user_cpu_seconds();
        const double fast_s = seconds([&] { fast = certify_case_fast(spec, data, threads, &stats, fo); });
        const double fast_cpu = user_cpu_seconds() - cpu0;
        std::size_t elements = 0, escalated = 0;
        for (const certify::tensor_report& r : fast.reports) elements += r.elements, escalated += r.escalated;
        std::string mpfi = "-";
        if (s.mpfi && !fast_rung_only) {
            generated_case g;
            const double mpfi_s = seconds([&] { g = generate_case(spec, threads, {}, certification_method::mpfi); });
            mpfi = fmt::format("{:.3f} s", mpfi_s);
            // The two paths must agree byte for byte on every certified tensor.
            generated_case f = g;
            std::size_t t = 0;
            for (const char* name : {"output", "weights", "lse"}) {
                std::vector<std::size_t> shp;
                for (const tensor_entry& e : g.m.tensors)
                    if (e.role == name && !e.target) shp = e.shape;
                const std::vector<std::byte> bytes = npy::serialize(npy::make_array("<f8", shp, fast.values[t][0]));
                for (const case_file& cf : g.files)
                    if (cf.name == std::string(name) + ".npy" && cf.bytes != bytes) {
                        std::fprintf(stderr, "golden.bench: %s: fast %s.npy differs from the MPFI path\n", s.label, name);
                        status = 1;
                    }
                ++t;
            }
        }
        using fast::fast_stage;
        auto pair = [](double wall, double cpu) { return fmt::format("{:.3f} / {:.3f} s", wall, cpu); };
        std::printf("%s\n", fmt::format("{:<19} {:>7.3f} {:>21} {:>21} {:>15} {:>10} {:>9} {:>6.2f} G {:>10}", s.label, macs / 1e9,
                                        pair(torch_s, torch_cpu), pair(fast_s, fast_cpu),
                                        fmt::format("{:.1f}x / {:.1f}x", torch_s > 0 ? fast_s / torch_s : 0.0,
                                                    torch_cpu > 0 ? fast_cpu / torch_cpu : 0.0),
                                        elements, escalated, peak_rss_gib(), mpfi).c_str());
        std::printf("%s\n", fmt::format("    stages: projections {:.3f} s, attention {:.3f} s (thread-s: logits {:.2f}, softmax {:.2f}, "
                                        "P.V {:.2f}), output projection {:.3f} s, escalation {:.3f} s ({} rows: {} by the row "
                                        "rung, {} by the whole-batch ladder); load average before {}",
                                        timer.seconds(fast_stage::projections), timer.seconds(fast_stage::attention),
                                        timer.seconds(fast_stage::logits), timer.seconds(fast_stage::softmax),
                                        timer.seconds(fast_stage::values), timer.seconds(fast_stage::output_projection),
                                        timer.seconds(fast_stage::escalation), stats.escalated_rows, stats.row_rung_rows,
                                        stats.ladder_rows, load).c_str());
        if (bound_histogram) {
            std::printf("%s\n", hist[0].line("output").c_str());
            std::printf("%s\n", hist[1].line("weights").c_str());
        }
        std::fflush(stdout);
    }
    return status;
}
