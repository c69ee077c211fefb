#pragma once
/// \file check/request.hpp
/// Owns the rules a front end must not decide: a check as it is asked for (check_request with its
/// input selection and policy name), resolved by the library. The command (`attnref check`) and the
/// Python package (attnref.check) only parse their arguments into these types and print the result.
///
///   front_end                      how a front end names its arguments in errors ("command line: --policy"
///                                  or "policy"), so one rule gives each its own message
///   resolve_policy(name, sel, fe)  a policy name: its roundoffs, and the input selection it implies
///                                  (a policy with FP8 inputs reads them quantised; another selection
///                                  is refused); an empty or unknown name is refused
///   check_memory_required(…)       the check's memory estimate (golden/memory.hpp) from the manifest,
///                                  before anything is loaded, refused above max_memory()
///   resolve_check(rq, lc)          the candidate's format for "auto" (its first file's dtype) and the
///                                  inputs the verdict is about (resolve_inputs: the derived case in memory)
///   run_check_request(rq)          all of it, then run_check: what `attnref check` does
/// Needs MPFR and MPFI (a derived case is certified: golden/rounded_inputs.hpp).

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "attnref/check/api.hpp"
#include "attnref/check/candidate.hpp"
#include "attnref/golden/memory.hpp"
#include "attnref/golden/rounded_inputs.hpp"
#include "attnref/multiprecision/policies.hpp"

namespace attnref::golden {

/// How a front end's errors name its arguments: the command "command line: --policy", Python "policy".
struct front_end {
    std::string policy = "command line: --policy";
    std::string input_format = "command line: --input-format";
    /// How resolve_inputs names the choice in the report line and its errors ("--input-format", "input_format=").
    std::string input_option = "--input-format";
};
inline front_end python_front_end() { return {"policy", "input_format", "input_format="}; }

/// The policies' names, "float32, float64, …", for messages.
inline std::string policy_list() {
    std::string t;
    for (const policy_entry& p : policy_names) t += (t.empty() ? "" : ", ") + std::string(p.name);
    return t;
}

/// A declared policy resolved: its roundoffs (nullopt: no policy) and the input selection it leaves.
/// A policy with FP8 inputs (fp8e4m3_fa3_bf16, …) is judged on the inputs it quantises: "auto"
/// becomes that FP8 format, another selection is refused. `given`: the policy was given at all (an
/// empty name is then refused, never read as "no policy").
inline std::optional<tolerance::policy_roundoffs> resolve_policy(const std::string& name, bool given, input_selection& inputs,
                                                                  const front_end& fe) {
    if (!given) return std::nullopt;
    if (name.empty()) throw data_error(fe.policy + ": an empty name; give one of " + policy_list() + ", or no policy");
    std::optional<tolerance::policy_roundoffs> r = roundoffs_of_policy(name);
    if (!r) throw data_error(fe.policy + ": no policy '" + printable(name) + "' (expected one of " + policy_list() + ")");
    if (const std::string f8(fp8_input_format_of_policy(name)); !f8.empty()) {
        const input_selection implied = *input_selection_from_name(f8);
        if (inputs.k == input_selection::kind::automatic) inputs = implied;
        else if (inputs.k != input_selection::kind::fp8 || inputs.fp8 != implied.fp8)
            throw data_error(fe.input_format + ": " + input_selection_name(inputs) + ": policy " + name + " reads its inputs in " + f8 +
                             " (leave the input format auto or give " + f8 + ")");
    }
    return r;
}

/// The check's memory estimate from the case's manifest and what is given (golden/memory.hpp
/// check_memory_estimate), refused with data_error above max_memory(). A directory or manifest that
/// cannot be read is left to load_case, which reports it as it always has.
inline void check_memory_required(const std::filesystem::path& dir, bool weights, bool lse, const std::vector<std::string>& gradient_roles_given,
                                  bool policy) {
    const std::string mf = (dir / "manifest.json").string();
    std::optional<manifest> m;
    try {
        std::error_code ec;
        if (std::filesystem::is_directory(dir, ec)) m = parse_manifest(read_file_capped(mf, max_json_bytes, dir), mf);
    } catch (const data_error&) {
    }
    if (!m) return;
    std::uint64_t gradient_values = 0;
    for (const gradient_tensor_layout& g : gradient_layout(m->spec))
        for (const std::string& role : gradient_roles_given)
            if (role == g.role) gradient_values += safe_io_detail::sat_count(g.shape);
    require_memory(check_memory_estimate(m->spec, weights, lse, gradient_values, policy), m->spec, mf, "check");
}

/// The inputs a file-based check is about: for "auto" without --dtype, the candidate's format from its
/// first file's dtype (the output's, else the first certified gradient's; a file that cannot be read
/// leaves it unknown, and run_check reports the file as it always does), then resolve_inputs.
inline resolved_inputs resolve_check(const check_request& rq, const loaded_case& lc, const front_end& fe = {}) {
    std::optional<tolerance::candidate_format> f = rq.dtype;
    if (rq.inputs.k == input_selection::kind::automatic && !f) {
        std::string file = rq.output;
        std::vector<std::size_t> shape = output_shape(lc.m.spec);
        if (file.empty())
            for (const auto& [role, path] : rq.gradients)
                for (const gradient_tensor_layout& g : gradient_layout(lc.m.spec))
                    if (file.empty() && g.role == role && lc.entry(role)) file = path, shape = g.shape;
        try {
            if (!file.empty()) (void)read_candidate(file, shape, f);
        } catch (const data_error&) {
            f.reset();
        }
    }
    return resolve_inputs(lc, rq.inputs, f, rq.policy.has_value(), !rq.gradients.empty(), 0, fe.input_option);
}

/// A check's result and the report's line saying which inputs it is about.
struct check_outcome {
    check_result result;
    std::string inputs;
};

/// `attnref check`: the memory estimate, the case, the inputs the verdict is about, the check.
/// rq.policy must already be resolved (resolve_policy).
inline check_outcome run_check_request(const check_request& rq) {
    std::vector<std::string> roles;
    for (const auto& [role, file] : rq.gradients) roles.push_back(role);
    check_memory_required(rq.golden, !rq.weights.empty(), !rq.lse.empty(), roles, rq.policy.has_value());
    const loaded_case lc = load_case(rq.golden);
    const resolved_inputs in = resolve_check(rq, lc);
    return {run_check(rq, in.judged(lc)), in.text};
}

}  // namespace attnref::golden
