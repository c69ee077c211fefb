/// `attnref check`: gates a candidate implementation's outputs against a golden case.
///   attnref check --golden CASE_DIR [--output FILE.npy] [--weights FILE.npy] [--lse FILE.npy]
///                 [--grad-query F] [--grad-key F] [--grad-value F] [--grad-w-q F … --grad-b-o F] (backward cases)
///                 [--dtype float64|float32|float16|bfloat16] [--tolerance data-aware|worst-case|assert-close|ulp|baseline]
///                 [--empty-row-lse -inf|+inf|any] [--backward-algorithm textbook|flash|unknown] [--json FILE] [--junit FILE]
///                 [--input-format auto|case|float64|float32|bfloat16|float16|fp8e4m3|fp8e5m2] [--policy NAME]
/// Each file is judged in its own descr's format ('<f8', '<f4', '<f2'; '<u2' = bfloat16 bit
/// patterns), or in --dtype for every file; bfloat16 may also come as '<f4' values with --dtype
/// bfloat16. The report names each tensor's format. Exit 0 PASS, 1 FAIL or
/// INCONCLUSIVE (a vacuous bound, an untrustworthy output), 2 usage or data error. Tolerance models: include/attnref/bounds/tolerance.hpp.
/// --weights: invariants (rows sum to 1, masked weights 0, 0 ≤ P ≤ 1, with --lse consistency) and an
/// element-by-element comparison with the golden weights (tolerance::weights_bound); --lse: compared
/// with the golden lse.

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include <unistd.h>

#include <fmt/format.h>

#include "attnref/check/request.hpp"
#include "attnref/check/checker.hpp"
#include "commands.hpp"

namespace attnref::verify {

using namespace attnref::golden;
namespace fs = std::filesystem;
namespace tol = attnref::tolerance;

namespace {
/// Reports are written atomically (temporary file + rename/link); an existing file only with --force.
void write_text(const std::string& file, const std::string& text, bool force) { write_file_atomic(file, text, force); }

/// Refuses report paths that would lose a file: --json and --junit naming the same file, a report
/// over an input (the candidate's files, anything in the golden case, the case directory itself),
/// and an existing file without --force. Checked before the check runs (exit 2).
void check_report_paths(const std::string& golden, const std::vector<std::string>& inputs, const std::string& json,
                        const std::string& junit, bool force) {
    if (golden.empty()) throw data_error("command line: --golden: an empty path; name a golden case directory");
    if (!json.empty() && !junit.empty() && (json == junit || same_file(json, junit)))
        throw data_error("command line: --json and --junit: the same file '" + json + "' for both reports");
    std::error_code ec;
    for (const auto& [flag, path] : {std::pair<const char*, const std::string&>{"--json", json}, {"--junit", junit}}) {
        if (path.empty()) continue;
        const std::filesystem::path p(path);
        for (const std::string& in : inputs)
            if (!in.empty() && (p == std::filesystem::path(in) || same_file(p, in)))
                throw data_error("command line: " + std::string(flag) + ": '" + path + "' is an input of this check; refused");
        const std::filesystem::path parent = p.parent_path().empty() ? std::filesystem::path(".") : p.parent_path();
        if (same_file(parent, golden) || same_file(p, golden))
            throw data_error("command line: " + std::string(flag) + ": '" + path + "' is inside the golden case " + golden + "; refused");
        if (std::filesystem::exists(std::filesystem::symlink_status(p, ec)) && !force)
            throw data_error("command line: " + std::string(flag) + ": '" + path + "' exists; not overwritten (use --force)");
        // The report's directory must exist before the check runs, not be found missing after it.
        if (!std::filesystem::is_directory(parent, ec))
            throw data_error("command line: " + std::string(flag) + ": '" + path + "': the directory " + parent.string() + " does not exist");
    }
}

/// A flag's choices: `before`, the names of an enum's table (name_table.hpp), then `after`.
template <class E, std::size_t N>
std::vector<std::string> with_names(std::vector<std::string> before, const std::pair<const char*, E> (&table)[N],
                                    std::initializer_list<const char*> after) {
    for (std::string& n : names_of(table)) before.push_back(std::move(n));
    before.insert(before.end(), after.begin(), after.end());
    return before;
}

/// The JSON report with the "inputs" line (and the declared policy) added.
std::string with_inputs(const std::string& json, const std::string& inputs, const std::string& policy) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(json);
    j["inputs"] = inputs;
    if (!policy.empty()) j["policy"] = policy;
    return j.dump(2) + "\n";
}
}  // namespace
void register_check(CLI::App& app) {
    struct args {
        std::string golden, output, weights, lse, dtype, tolerance = "data-aware", json, junit, empty_lse = "-inf", backward = "unknown";
        std::string input_format = "auto";  // which inputs the verdict is about (golden/rounded_inputs.hpp)
        std::string policy;                 // a declared precision policy (run --arith's names; policies.hpp)
        std::vector<std::pair<std::string, std::string>> gradients;  // (role, file)
        bool force = false;
        std::string max_memory;
    };
    auto a = std::make_shared<args>();
    CLI::App* c = app.add_subcommand("check", "Gate an implementation's outputs (.npy) against a golden case");
    c->add_option("--golden", a->golden, "golden case directory")->required();
    c->add_option("--output", a->output, "candidate output .npy (optional when gradients are given)");
    // Gradients (backward cases): one flag per role; a role the case's kind lacks is a usage error.
    for (const role_info& i : role_table) {
        if (i.direction != role_direction::gradient) continue;
        const std::string role(i.name);
        std::string flag = "--" + role;
        std::replace(flag.begin(), flag.end(), '_', '-');
        c->add_option_function<std::string>(
            flag, [a, role](const std::string& file) { a->gradients.emplace_back(role, file); },
            std::string("candidate ") + role + " .npy (gradient; see golden/README.md for the roles)");
    }
    c->add_option("--weights", a->weights, "candidate attention weights P .npy (invariants)");
    c->add_option("--lse", a->lse, "candidate log-sum-exp .npy (invariants)");
    c->add_option("--dtype", a->dtype, "candidate precision of every file (default: each file's own descr; '<u2' = bfloat16 bits)")
        ->check(CLI::IsMember(names_of(binary_format_names)));
    c->add_option("--tolerance", a->tolerance, "tolerance model")
        ->check(CLI::IsMember(names_of(tol::tolerance_model_names)))
        ->capture_default_str();
    c->add_option("--empty-row-lse", a->empty_lse,
                  "the lse the candidate writes for fully masked rows: -inf (attnref, PyTorch, FlashAttention split-KV), "
                  "+inf (FlashAttention 2/3) or any")
        ->check(CLI::IsMember(names_of(empty_row_lse_names)))
        ->capture_default_str();
    c->add_option("--backward-algorithm", a->backward,
                  "the candidate's backward: textbook (dS from the forward's own normalised P, as autograd does: a tighter dQ bound), "
                  "flash (P recomputed from lse) or unknown")
        ->check(CLI::IsMember(with_names({}, backward_algorithm_names, {"unknown"})))
        ->capture_default_str();
    c->add_option("--input-format", a->input_format,
                  "the format the candidate's inputs were in: the reference is certified for the golden inputs rounded to nearest "
                  "even to it (auto: the candidate's format when it is bfloat16 or float16, or a --policy is declared, and the case's inputs are not exact in it; "
                  "case: the case's own inputs; fp8e4m3, fp8e5m2: the inputs quantised per tensor with power-of-two descales, as FP8 kernels read them; "
                  "implied by a --policy with FP8 inputs)")
        ->check(CLI::IsMember(input_selection_names()))
        ->capture_default_str();
    std::string policy_help = "a declared precision policy (the names of run --arith; longdouble, float128 and bin50 write results no candidate file holds, and are refused): the bounds follow where it rounds:";
    for (const policy_entry& p : policy_names) policy_help += " " + std::string(p.name);
    c->add_option("--policy", a->policy, policy_help);
    c->add_option("--json", a->json, "also write the report as JSON");
    c->add_option("--junit", a->junit, "also write the report as JUnit XML");
    c->add_flag("--force", a->force, "overwrite existing --json/--junit files (never an input)");
    c->add_option("--max-memory", a->max_memory, "refuse cases estimated to need more memory (bytes, K/M/G/T suffix; default: half the machine's memory, at least 4G)");
    c->callback([a, c] {
        check_request rq;
        rq.golden = a->golden;
        rq.output = a->output;
        rq.weights = a->weights;
        rq.lse = a->lse;
        if (!a->dtype.empty()) rq.dtype = tol::format_from_name(a->dtype);
        // Given at all, it must be a byte count: an empty value is refused, not read as "unset".
        if (c->count("--max-memory")) set_max_memory(parse_memory_size(a->max_memory, "--max-memory"));
        if (a->output.empty() && a->gradients.empty())
            throw data_error("command line: --output: required unless a gradient (--grad-query, --grad-key, --grad-value, …) is given");
        rq.gradients = a->gradients;
        std::vector<std::string> inputs{a->output, a->weights, a->lse};
        for (const auto& g : a->gradients) inputs.push_back(g.second);
        check_report_paths(a->golden, inputs, a->json, a->junit, a->force);
        rq.model = *tol::model_from_name(a->tolerance);
        rq.declared_backward = backward_algorithm_from_name(a->backward);  // nullopt for unknown
        rq.inputs = *input_selection_from_name(a->input_format);  // checked by CLI11
        rq.policy = resolve_policy(a->policy, c->count("--policy") > 0, rq.inputs, front_end{});
        rq.empty_lse = *value_in(empty_row_lse_names, a->empty_lse);  // checked by CLI11
        // The library decides the rest (check/request.hpp): the memory estimate, the inputs the
        // verdict is about (the derived case in memory), the check.
        const auto [r, judged] = run_check_request(rq);
        std::printf("inputs: %s\n", judged.c_str());
        if (!a->policy.empty()) std::printf("policy: %s (declared)\n", a->policy.c_str());
        std::fputs(report_table(r, ::isatty(fileno(stdout)) != 0).c_str(), stdout);
        std::fflush(stdout);
        // The verdict survives a failure to write a report: each failure is reported on its own line
        // and the exit code stays 1 for a failed check (2 only when the check passed).
        // Each failure is said once: on its own line, except the one a passed check exits 2 with.
        std::vector<std::string> report_errors;
        for (const auto& [path, text] : {std::pair<const std::string&, std::string>{a->json, a->json.empty() ? "" : with_inputs(report_json(r), judged, a->policy)},
                                         {a->junit, a->junit.empty() ? "" : report_junit(r)}}) {
            if (path.empty()) continue;
            try {
                write_text(path, text, a->force);
            } catch (const data_error& e) {
                report_errors.emplace_back(e.what());
            }
        }
        const bool passed = r.overall == verdict::pass;
        for (std::size_t i = 0; i < report_errors.size(); ++i)
            if (!passed || i + 1 < report_errors.size()) std::fprintf(stderr, "%s\n", printable(report_errors[i]).c_str());
        if (!passed)
            throw check_failure(fmt::format("check {} for case {} ({}): {}{}", r.overall == verdict::fail ? "failed" : "inconclusive",
                                            r.case_name, a->output.empty() ? std::string("gradients") : a->output, r.reason,
                                            report_errors.empty() ? "" : "; a report could not be written"));
        if (!report_errors.empty()) throw data_error(report_errors.back());
    });
}

}  // namespace attnref::verify
