/// `attnref run`: computes a golden case with one of attnref's own arithmetics (a built-in
/// implementation under test) and writes candidate outputs.

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "attnref/npy.hpp"
#include "attnref/policies.hpp"
#include "commands.hpp"
#include "compute.hpp"
#include "golden_case.hpp"

namespace attnref::verify {

namespace fs = std::filesystem;

namespace {

struct run_args {
    std::string golden, arith, out, softmax = "shifted_division";
    std::size_t block = 64, threads = 0;
};

template <class T>
std::vector<double> as_doubles(const tensor<T, 1>& t) {
    std::vector<double> v(t.size());
    for (std::size_t n = 0; n < t.size(); ++n) v[n] = static_cast<double>(t[n]);
    return v;
}

void run_case(const run_args& a) {
    const std::optional<softmax_algorithm> algorithm = softmax_from_name(a.softmax);
    if (!algorithm) throw data_error("command line: --softmax: expected naive, shifted_division, division_free or online, got '" + a.softmax + "'");
    if (a.block == 0) throw data_error("command line: --block: expected a positive integer");
    const loaded_case lc = load_case(a.golden);
    const case_spec& s = lc.m.spec;
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::pair<std::string, std::vector<double>>> results;
    const bool known = visit_policy(a.arith, [&]<class P>(std::type_identity<P>) {
        const case_outputs_of<P> r = compute_case<P>(s, lc.data, a.threads, *algorithm, a.block);
        results.emplace_back("output", as_doubles(r.output));
        if (s.outputs.weights) results.emplace_back("weights", as_doubles(r.weights));
        if (s.outputs.lse) results.emplace_back("lse", as_doubles(r.lse));
    });
    if (!known) {
        std::string names;
        for (const policy_entry& p : policy_names) names += (names.empty() ? "" : ", ") + std::string(p.name);
        throw data_error("command line: --arith: expected one of " + names + ", got '" + a.arith + "'");
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::error_code ec;
    fs::create_directories(a.out, ec);
    if (ec) throw data_error(a.out + ": cannot create the directory: " + ec.message());
    for (const auto& [role, values] : results) {
        const std::vector<std::size_t> shape = role == "output" ? output_shape(s) : role == "weights" ? weights_shape(s) : lse_shape(s);
        try {
            npy::write(fs::path(a.out) / (role + ".npy"), npy::make_array("<f8", shape, values));
        } catch (const npy::error& e) {
            throw data_error(e.what());
        }
    }
    std::printf("%s\n", fmt::format("attnref run: {} with {} ({} softmax) in {:.3f} s -> {}", s.name, a.arith, a.softmax, seconds, a.out).c_str());
}

}  // namespace

void register_run(CLI::App& app) {
    auto a = std::make_shared<run_args>();
    std::string arith_help = "arithmetic / precision policy:";
    for (const policy_entry& p : policy_names) arith_help += " " + std::string(p.name);
    CLI::App* r = app.add_subcommand("run",
                                     "Compute a golden case with one of attnref's own arithmetics and write candidate "
                                     "output.npy, weights.npy, lse.npy (float64 '<f8')");
    r->add_option("--golden", a->golden, "case directory (holding manifest.json)")->required();
    r->add_option("--arith", a->arith, arith_help)->required();
    r->add_option("--out", a->out, "directory for the candidate .npy files")->required();
    r->add_option("--softmax", a->softmax, "naive, shifted_division, division_free or online")->capture_default_str();
    r->add_option("--block", a->block, "online softmax block size (keys per block)")->capture_default_str();
    r->add_option("--threads", a->threads, "threads (0 = all cores)")->capture_default_str();
    r->callback([a] { run_case(*a); });
}

}  // namespace attnref::verify
