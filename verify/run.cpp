/// `attnref run`: computes a golden case with one of attnref's own arithmetics (a built-in
/// implementation under test) and writes candidate outputs; for gradient cases (a grad_output input)
/// also the gradients, grad_<role>.npy, with --backward-algorithm textbook (default) or flash.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "attnref/core/formats.hpp"
#include "attnref/io/npy.hpp"
#include "attnref/multiprecision/policies.hpp"
#include "commands.hpp"
#include "attnref/golden/case.hpp"
#include "attnref/check/gradients.hpp"
#include "attnref/check/checker.hpp"
#include "attnref/golden/memory.hpp"
#include "attnref/golden/rounded_inputs.hpp"
#include "attnref/golden/safe_io.hpp"

namespace attnref::verify {

namespace fs = std::filesystem;

namespace {

struct run_args {
    std::string golden, arith, out, softmax = "shifted_division", backward = "textbook";
    std::size_t block = 64, threads = 0;
    bool float64 = false;
    std::string max_memory;
};

/// The tensor as an .npy array in the natural dtype of its element type, as a kernel computing in
/// that format would write it: float '<f4'; bfloat16 '<u2' (bit patterns, as `attnref check` reads
/// them); float16 '<f2'; FP8 '<f4' (exact); double and wider '<f8' (wider types rounded to double).
/// With as_float64, always '<f8'.
template <class T>
npy::array encode(const tensor<T, 1>& t, std::vector<std::size_t> shape, bool as_float64) {
    const std::size_t n = t.size();
    if constexpr (std::is_same_v<T, formats::bfloat16> || std::is_same_v<T, formats::float16>) {
        if (!as_float64) {
            std::vector<std::uint16_t> bits(n);
            for (std::size_t i = 0; i < n; ++i) bits[i] = t[i].bits();
            if constexpr (std::is_same_v<T, formats::bfloat16>) return npy::make_array("<u2", std::move(shape), bits);
            npy::array a = npy::make_array("<u2", std::move(shape), bits);
            a.descr = "<f2";  // same little-endian 2-byte layout, read as IEEE binary16
            return a;
        }
    }
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, formats::float8_e4m3> || std::is_same_v<T, formats::float8_e5m2>) {
        if (!as_float64) {
            std::vector<float> v(n);
            for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(t[i]);
            return npy::make_array("<f4", std::move(shape), v);
        }
    }
    std::vector<double> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<double>(t[i]);
    return npy::make_array("<f8", std::move(shape), v);
}

void run_case(const run_args& a) {
    const std::optional<softmax_algorithm> algorithm = softmax_from_name(a.softmax);
    if (!algorithm) throw data_error("command line: --softmax: expected naive, shifted_division, division_free or online, got '" + a.softmax + "'");
    if (a.block == 0) throw data_error("command line: --block: expected a positive integer");
    if (!a.max_memory.empty()) set_max_memory(parse_memory_size(a.max_memory, "--max-memory"));
    // Candidate files never go into a golden case: that would overwrite its certified tensors.
    std::error_code ec;
    if (fs::exists(fs::path(a.out) / "manifest.json", ec) || same_file(a.out, a.golden))
        throw data_error("command line: --out: '" + a.out + "' is a golden case directory (it holds manifest.json); refused");
    const std::optional<backward_algorithm> backward = backward_algorithm_from_name(a.backward);
    if (!backward) throw data_error("command line: --backward-algorithm: expected textbook or flash, got '" + a.backward + "'");
    // Memory first, from the manifest alone, with the widest type of the chosen arithmetic.
    {
        const std::string manifest_file = (fs::path(a.golden) / "manifest.json").string();
        if (!fs::is_directory(a.golden, ec)) throw data_error(a.golden + ": not a golden case directory");
        const manifest m = parse_manifest(read_file_capped(manifest_file, max_json_bytes, fs::path(a.golden)), manifest_file);
        std::uint64_t value_bytes = 0;
        if (visit_policy(a.arith, [&]<class P>(std::type_identity<P>) {
                value_bytes = std::max({sizeof(typename P::storage_type), sizeof(typename P::accumulate_type), sizeof(typename P::weights_type),
                                        sizeof(typename P::output_type), sizeof(double)});
            }))
            require_memory(run_memory_estimate(m.spec, value_bytes), m.spec, manifest_file, "run --arith " + a.arith);
    }
    const loaded_case lc = load_case(a.golden);
    // Gradient cases (a grad_output input): the candidate gradients too, grad_<role>.npy.
    std::optional<std::vector<double>> grad_output;
    if (const tensor_entry* g = lc.entry("grad_output")) grad_output = lc.reference(*g);
    const case_spec& s = lc.m.spec;
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::pair<std::string, npy::array>> results;
    std::string quantised;  // the FP8 descales of a policy with FP8 inputs, for the summary line
    const bool known = visit_policy(a.arith, [&]<class P>(std::type_identity<P>) {
        // A policy with FP8 inputs computes on the inputs quantised per tensor (golden/rounded_inputs.hpp
        // quantise_fp8): code·descale, exact in its float storage.
        const case_data* data = &lc.data;
        std::optional<golden::fp8_quantised> q8;
        if constexpr (has_fp8_inputs<P>) {
            case_data d = lc.data;
            if (grad_output) d.grad_output = *grad_output;
            q8 = golden::quantise_fp8(d, std::is_same_v<typename P::fp8_input_type, formats::float8_e4m3> ? golden::fp8_input_format::e4m3
                                                                                                     : golden::fp8_input_format::e5m2);
            data = &q8->effective;
            if (grad_output) grad_output = q8->effective.grad_output;
            quantised = " (inputs quantised to " + golden::fp8_format_name(q8->format) + ", " + golden::fp8_descales_text(*q8) + ")";
        }
        const case_outputs_of<P> r = compute_case<P>(s, *data, a.threads, *algorithm, a.block);
        results.emplace_back("output", encode(r.output, output_shape(s), a.float64));
        if (s.outputs.weights) results.emplace_back("weights", encode(r.weights, weights_shape(s), a.float64));
        if (s.outputs.lse) results.emplace_back("lse", encode(r.lse, lse_shape(s), a.float64));
        if (grad_output) {
            for (const auto& [role, values] : compute_case_gradients<P>(s, *data, *grad_output, *backward, a.threads)) {
                tensor<typename P::output_type, 1> t({values.size()});  // exact: the values are output_type's
                for (std::size_t n = 0; n < values.size(); ++n) t[n] = convert<typename P::output_type>(values[n]);
                results.emplace_back(role, encode(t, shape_of(s, *role_from_name(role)), a.float64));
            }
        }
    });
    if (!known) {
        std::string names;
        for (const policy_entry& p : policy_names) names += (names.empty() ? "" : ", ") + std::string(p.name);
        throw data_error("command line: --arith: expected one of " + names + ", got '" + a.arith + "'");
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    fs::create_directories(a.out, ec);
    if (ec) throw data_error(a.out + ": cannot create the directory: " + ec.message());
    for (const auto& [role, array] : results) {
        try {
            npy::write(fs::path(a.out) / (role + ".npy"), array);
        } catch (const npy::error& e) {
            throw data_error(e.what());
        }
    }
    // A weights.npy or lse.npy left by an earlier run of a case that stores them would be read by
    // a later `check --weights` as if it belonged to this run: remove what this run did not write.
    for (const role_info& i : role_table) {
        const std::string role(i.name);
        if (i.direction == role_direction::input || i.role == tensor_role::output) continue;  // weights, lse and every gradient
        if (std::none_of(results.begin(), results.end(), [&](const auto& r) { return r.first == role; }))
            fs::remove(fs::path(a.out) / (role + ".npy"), ec);
    }
    std::printf("%s\n", fmt::format("attnref run: {} with {}{} ({} softmax) in {:.3f} s -> {}", s.name, a.arith, quantised, a.softmax, seconds, a.out).c_str());
}

}  // namespace

void register_run(CLI::App& app) {
    auto a = std::make_shared<run_args>();
    std::string arith_help = "arithmetic / precision policy:";
    for (const policy_entry& p : policy_names) arith_help += " " + std::string(p.name);
    CLI::App* r = app.add_subcommand("run",
                                     "Compute a golden case with one of attnref's own arithmetics and write candidate "
                                     "output.npy, weights.npy, lse.npy in the arithmetic's own format (float32 '<f4', "
                                     "bfloat16 '<u2' bits, float16 '<f2', double and wider '<f8')");
    r->add_option("--golden", a->golden, "case directory (holding manifest.json)")->required();
    r->add_option("--arith", a->arith, arith_help)->required();
    r->add_option("--out", a->out, "directory for the candidate .npy files")->required();
    r->add_option("--softmax", a->softmax, "naive, shifted_division, division_free or online")->capture_default_str();
    r->add_option("--block", a->block, "online softmax block size (keys per block)")->check(unsigned_text())->capture_default_str();
    r->add_option("--threads", a->threads, "threads (0 = all cores)")->check(unsigned_text())->capture_default_str();
    r->add_option("--max-memory", a->max_memory, "refuse cases estimated to need more memory (bytes, K/M/G/T suffix; default: half the machine's memory, at least 4G)");
    r->add_option("--backward-algorithm", a->backward, "gradient cases: textbook (dS from the stored P) or flash (FlashAttention-2: D = rowsum(dO∘O), P recomputed)")
        ->capture_default_str();
    r->add_flag("--float64", a->float64, "write every tensor as float64 '<f8' instead");
    r->callback([a] { run_case(*a); });
}

}  // namespace attnref::verify
