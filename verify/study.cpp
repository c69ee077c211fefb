/// `attnref study`: precision studies (include/attnref/study/study.hpp). Runs a sweep described by flags,
/// by a JSON file (--json), or the default study; writes DIR/study.csv and DIR/table.txt, prints the
/// table, and draws DIR/*.svg with tools/plot_study.py (python3 + matplotlib) when available.
///
/// JSON: {"sweeps": [{"name": "...", "policy": ["fp32", ...], "algorithm": ["shifted", ...],
///        "block": [64], "placement": ["on_product"], "seq": [256], "head_dim": [64], "offset": [0],
///        "ramp": [0], "logit_scale": [1], "queries": 8, "seeds": [1, 2, 3, 4],
///        "direct_logits": false, "spread": 4, "positive_values": false,
///        "backward": false, "backward_algorithm": ["textbook", "flash"]}, ...]}   (all keys optional)
/// Backward sweeps (--backward, "backward": true) measure dQ, dK, dV against the MPFR backward and its
/// first-order bound (study.hpp); a bound exceeded anywhere makes the command exit 1 after writing.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <cerrno>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <thread>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "attnref/study/study.hpp"
#include "commands.hpp"
#include "reproduce.hpp"
#include "attnref/golden/manifest.hpp"
#include "attnref/golden/safe_io.hpp"

namespace attnref::verify {

namespace {

struct study_flags {
    std::string out, json, plot_script;
    std::vector<std::string> policies, algorithms, placements;
    std::vector<std::size_t> blocks, seqs, head_dims;
    std::vector<double> offsets, ramps, logit_scales;
    std::vector<std::uint64_t> seeds;
    std::size_t queries = 8, threads = 0;
    bool queries_given = false;
    std::string max_memory;
    double spread = 4;
    bool direct_logits = false, positive_values = false, no_plot = false;
    bool backward = false;
    std::vector<std::string> backward_algorithms;
    std::string reproduce;  ///< --reproduce NAME (verify/reproduce.hpp); --reduced: its CTest sample
    bool reduced = false;
};

std::string parse_policy(const std::string& s) {
    if (auto p = study::policy_from_name(s)) return *p;
    std::string names;
    for (const policy_entry& e : policy_names) names += (names.empty() ? "" : ", ") + std::string(e.name);
    throw data_error("attnref study: unknown policy '" + s + "' (" + names + ")");
}
softmax_algorithm parse_algorithm(const std::string& s) {
    if (auto a = study::algorithm_from_name(s)) return *a;
    throw data_error("attnref study: unknown softmax algorithm '" + s + "' (naive, shifted, division_free, online)");
}
backward_algorithm parse_backward_algorithm(const std::string& s) {
    if (auto a = attnref::backward_algorithm_from_name(s)) return *a;
    throw data_error("attnref study: unknown backward algorithm '" + s + "' (textbook, flash)");
}
scale_placement parse_placement(const std::string& s) {
    if (auto p = study::placement_from_name(s)) return *p;
    throw data_error("attnref study: unknown scale placement '" + s + "' (on_product, on_query, split_sqrt)");
}

template <class T, class F>
std::vector<T> map_all(const std::vector<std::string>& v, F f) {
    std::vector<T> r;
    for (const std::string& s : v) r.push_back(f(s));
    return r;
}

/// Strict reader of one sweep of a study description: known keys only, each of its documented type
/// (docs/studies.md); every violation is a data_error naming the file and the field.
study::sweep sweep_from_json(const nlohmann::json& j, const std::string& file, const std::string& where) {
    auto fail = [&](const std::string& field, const std::string& why) -> void {
        throw data_error("attnref study: " + file + ": field '" + where + (field.empty() ? "" : "." + field) + "': " + why);
    };
    if (!j.is_object()) fail("", "expected an object");
    static const char* const keys[] = {"name",        "policy", "algorithm", "block",         "placement",     "seq",
                                       "head_dim",    "offset", "ramp",      "logit_scale",   "queries",       "seeds",
                                       "direct_logits", "spread", "positive_values", "backward", "backward_algorithm"};
    for (const auto& [key, value] : j.items())
        if (std::find_if(std::begin(keys), std::end(keys), [&](const char* k) { return key == k; }) == std::end(keys))
            fail(printable(key), "unknown field");
    auto array = [&](const char* key) -> const nlohmann::json& {
        const nlohmann::json& v = j.at(key);
        if (!v.is_array() || v.empty()) fail(key, "expected a non-empty array");
        return v;
    };
    auto strings = [&](const char* key) {
        std::vector<std::string> r;
        const nlohmann::json& v = array(key);
        for (std::size_t i = 0; i < v.size(); ++i) {
            if (!v[i].is_string()) fail(std::string(key) + "[" + std::to_string(i) + "]", "expected a string");
            r.push_back(v[i].get<std::string>());
        }
        return r;
    };
    auto positive = [&](const nlohmann::json& v, const std::string& field, std::uint64_t min) {
        if (!v.is_number_unsigned() || v.get<std::uint64_t>() < min)
            fail(field, std::string("expected ") + (min ? "a positive" : "a non-negative") + " integer, got " + printable(v.dump()));
        return v.get<std::uint64_t>();
    };
    auto integers = [&](const char* key, std::uint64_t min) {
        std::vector<std::uint64_t> r;
        const nlohmann::json& v = array(key);
        for (std::size_t i = 0; i < v.size(); ++i) r.push_back(positive(v[i], std::string(key) + "[" + std::to_string(i) + "]", min));
        return r;
    };
    auto sizes = [&](const char* key) {
        std::vector<std::size_t> r;
        for (std::uint64_t x : integers(key, 1)) r.push_back(static_cast<std::size_t>(x));
        return r;
    };
    auto finite = [&](const nlohmann::json& v, const std::string& field) {
        if (!v.is_number() || !std::isfinite(v.get<double>())) fail(field, "expected a finite number, got " + printable(v.dump()));
        return v.get<double>();
    };
    auto numbers = [&](const char* key) {
        std::vector<double> r;
        const nlohmann::json& v = array(key);
        for (std::size_t i = 0; i < v.size(); ++i) r.push_back(finite(v[i], std::string(key) + "[" + std::to_string(i) + "]"));
        return r;
    };
    auto boolean = [&](const char* key, bool def) {
        if (!j.contains(key)) return def;
        if (!j.at(key).is_boolean()) fail(key, "expected true or false");
        return j.at(key).get<bool>();
    };
    auto named = [&](const char* key, auto parse) {
        using T = decltype(parse(std::string()));
        std::vector<T> r;
        const std::vector<std::string> names = strings(key);
        for (std::size_t i = 0; i < names.size(); ++i) {
            try {
                r.push_back(parse(names[i]));
            } catch (const data_error& e) {
                fail(std::string(key) + "[" + std::to_string(i) + "]", std::string(e.what()).substr(std::string("attnref study: ").size()));
            }
        }
        return r;
    };
    study::sweep s;
    if (j.contains("name")) {
        if (!j.at("name").is_string()) fail("name", "expected a string");
        s.name = j.at("name").get<std::string>();
    } else {
        s.name = "custom";
    }
    if (j.contains("policy")) s.policies = named("policy", parse_policy);
    if (j.contains("algorithm")) s.algorithms = named("algorithm", parse_algorithm);
    if (j.contains("placement")) s.placements = named("placement", parse_placement);
    if (j.contains("block")) s.blocks = sizes("block");
    if (j.contains("seq")) s.seqs = sizes("seq");
    if (j.contains("head_dim")) s.head_dims = sizes("head_dim");
    if (j.contains("offset")) s.offsets = numbers("offset");
    if (j.contains("ramp")) s.ramps = numbers("ramp");
    if (j.contains("logit_scale")) s.logit_scales = numbers("logit_scale");
    if (j.contains("seeds")) s.seeds = integers("seeds", 0);
    if (j.contains("queries")) s.queries = static_cast<std::size_t>(positive(j.at("queries"), "queries", 1));
    s.direct_logits = boolean("direct_logits", s.direct_logits);
    if (j.contains("spread")) s.spread = finite(j.at("spread"), "spread");
    s.positive_values = boolean("positive_values", s.positive_values);
    s.backward = boolean("backward", s.backward);
    if (j.contains("backward_algorithm")) s.backward_algorithms = named("backward_algorithm", parse_backward_algorithm);
    return s;
}

bool any_axis_flag(const study_flags& f) {
    return !f.policies.empty() || !f.algorithms.empty() || !f.placements.empty() || !f.blocks.empty() || !f.seqs.empty() ||
           !f.head_dims.empty() || !f.offsets.empty() || !f.ramps.empty() || !f.logit_scales.empty() || !f.seeds.empty() ||
           f.queries_given || f.direct_logits || f.positive_values || !f.backward_algorithms.empty();
}

/// The flags' values a sweep cannot take: zero sizes, non-finite numbers (exit 2 naming the flag).
void validate_flags(const study_flags& f) {
    auto positive = [](const char* flag, const std::vector<std::size_t>& v) {
        for (std::size_t x : v)
            if (x == 0) throw data_error(std::string("attnref study: ") + flag + ": expected positive integers, got 0");
    };
    positive("--block", f.blocks);
    positive("--seq", f.seqs);
    positive("--head-dim", f.head_dims);
    if (f.queries_given && f.queries == 0) throw data_error("attnref study: --queries: expected a positive integer, got 0");
    auto finite = [](const char* flag, const std::vector<double>& v) {
        for (double x : v)
            if (!std::isfinite(x)) throw data_error(std::string("attnref study: ") + flag + ": expected finite numbers, got " + fmt::format("{}", x));
    };
    finite("--offset", f.offsets);
    finite("--ramp", f.ramps);
    finite("--logit-scale", f.logit_scales);
    finite("--spread", {f.spread});
}

study::sweep sweep_from_flags(const study_flags& f) {
    study::sweep s;
    if (!f.policies.empty()) s.policies = map_all<std::string>(f.policies, parse_policy);
    if (!f.algorithms.empty()) s.algorithms = map_all<softmax_algorithm>(f.algorithms, parse_algorithm);
    if (!f.placements.empty()) s.placements = map_all<scale_placement>(f.placements, parse_placement);
    if (!f.blocks.empty()) s.blocks = f.blocks;
    if (!f.seqs.empty()) s.seqs = f.seqs;
    if (!f.head_dims.empty()) s.head_dims = f.head_dims;
    if (!f.offsets.empty()) s.offsets = f.offsets;
    if (!f.ramps.empty()) s.ramps = f.ramps;
    if (!f.logit_scales.empty()) s.logit_scales = f.logit_scales;
    if (!f.seeds.empty()) s.seeds = f.seeds;
    if (f.queries_given) s.queries = f.queries;
    s.direct_logits = f.direct_logits;
    s.spread = f.spread;
    s.positive_values = f.positive_values;
    s.backward = f.backward;
    if (!f.backward_algorithms.empty()) s.backward_algorithms = map_all<backward_algorithm>(f.backward_algorithms, parse_backward_algorithm);
    if (s.backward) s.name = "backward";
    return s;
}

std::string csv_header() {
    return "sweep,policy,algorithm,block,placement,seq,queries,head_dim,offset,ramp,logit_scale,direct_logits,seeds,"
           "u,out_max,out_rms,p_max,p_rms,lse_max,lse_rms,ulp_max,bias,bias_z,bound_ratio,"
           "rms_hi_logits,rms_hi_softmax,rms_hi_p_cast,rms_hi_pv,rms_hi_output,"
           "backward,backward_algorithm,dq_bound_ratio,dk_bound_ratio,dv_bound_ratio,dq_norm_rel,dk_norm_rel,dv_norm_rel,"
           "dq_bound_norm_rel,dk_bound_norm_rel,dv_bound_norm_rel,bound_infinite";
}

std::string csv_row(const study::point& p, const study::result& r) {
    return fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{:.6e},{:.6e},{:.6e},{:.6e},{:.6e},{:.6e},{:.6e},{:.6e},{:.6e},{:.4f},{:.6e},"
                       "{:.6e},{:.6e},{:.6e},{:.6e},{:.6e}",
                       p.sweep, p.policy, study::algorithm_name(p.algorithm), p.block,
                       study::placement_name(p.placement), p.seq, p.queries, p.head_dim, p.offset, p.ramp, p.logit_scale,
                       p.direct_logits ? 1 : 0, p.seeds.size(), r.u, r.out_max, r.out_rms, r.p_max, r.p_rms, r.lse_max,
                       r.lse_rms, r.ulp_max, r.bias, r.bias_z,
                       // A vacuous bound (infinite somewhere) has no ratio: nan, with bound_infinite > 0.
                       r.bound_infinite ? std::numeric_limits<double>::quiet_NaN() : r.bound_ratio, r.stage_rms[0], r.stage_rms[1],
                       r.stage_rms[2], r.stage_rms[3], r.stage_rms[4]) +
           fmt::format(",{},{},{:.4e},{:.4e},{:.4e},{:.6e},{:.6e},{:.6e},{:.4e},{:.4e},{:.4e}", p.backward ? 1 : 0,
                       p.backward ? attnref::backward_algorithm_name(p.backward_alg) : "", r.grad_bound_ratio[0], r.grad_bound_ratio[1],
                       r.grad_bound_ratio[2], r.grad_norm_rel[0], r.grad_norm_rel[1], r.grad_norm_rel[2], r.grad_bound_norm_rel[0],
                       r.grad_bound_norm_rel[1], r.grad_bound_norm_rel[2]) +
           fmt::format(",{}", r.bound_infinite);
}

/// The backward points' table: per gradient the worst |error|/bound and the normwise relative error.
std::string backward_table(const std::vector<study::point>& points, const std::vector<study::result>& results) {
    std::string t = fmt::format("backward: dQ, dK, dV vs attnref's backward in MPFR (133 bits); err/bound: max |error| / first-order bound "
                                "(backward_bounds.hpp, must be <= 1); norm: ||error||_2 / ||g||_2; bound/g: max over dQ, dK, dV of "
                                "||bound||_2 / ||g||_2 (>= 1: the bound is vacuous)\n");
    t += fmt::format("{:<14} {:<9} {:>5} {:>4} | {:>9} {:>9} {:>9} | {:>9} {:>9} {:>9} | {:>8}\n", "policy", "backward", "n", "dk", "dQ e/b",
                     "dK e/b", "dV e/b", "dQ norm", "dK norm", "dV norm", "bound/g");
    for (std::size_t i = 0; i < points.size(); ++i) {
        const study::point& p = points[i];
        const study::result& r = results[i];
        if (!p.backward) continue;
        const bool violated = !(std::max({r.grad_bound_ratio[0], r.grad_bound_ratio[1], r.grad_bound_ratio[2]}) <= 1);
        const double tightness = std::max({r.grad_bound_norm_rel[0], r.grad_bound_norm_rel[1], r.grad_bound_norm_rel[2]});
        t += fmt::format("{:<14} {:<9} {:>5} {:>4} | {:>9.2e} {:>9.2e} {:>9.2e} | {:>9.2e} {:>9.2e} {:>9.2e} | {:>8.2e}{}{}\n", p.policy,
                         attnref::backward_algorithm_name(p.backward_alg), p.seq, p.head_dim, r.grad_bound_ratio[0], r.grad_bound_ratio[1],
                         r.grad_bound_ratio[2], r.grad_norm_rel[0], r.grad_norm_rel[1], r.grad_norm_rel[2], tightness,
                         violated ? "  BOUND EXCEEDED" : "", !(tightness < 1) ? "  VACUOUS" : "");
    }
    return t;
}

std::string forward_table(const std::vector<study::point>& points, const std::vector<study::result>& results) {
    std::string t = fmt::format("{:<9} {:<14} {:<13} {:>5} {:>5} {:>4} {:>7} {:>6} | {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>9}\n",
                                "sweep", "policy", "softmax", "block", "n", "dk", "offset", "ramp", "out max", "out rms",
                                "P max", "lse max", "ulp max", "bias", "bias z", "err/bound");
    for (std::size_t i = 0; i < points.size(); ++i) {
        const study::point& p = points[i];
        const study::result& r = results[i];
        // err/bound: "vacuous" where the a-priori bound is infinite for some element (err/∞ = 0 proves nothing).
        const std::string ratio = r.bound_infinite ? std::string("vacuous") : fmt::format("{:.2e}", r.bound_ratio);
        t += fmt::format("{:<9} {:<14} {:<13} {:>5} {:>5} {:>4} {:>7g} {:>6g} | {:>9.2e} {:>9.2e} {:>9.2e} {:>9.2e} {:>9.3g} {:>9.1e} {:>7.2f} {:>9}\n",
                         p.sweep, p.policy, study::algorithm_name(p.algorithm), p.block, p.seq,
                         p.head_dim, p.offset, p.ramp, r.out_max, r.out_rms, r.p_max, r.lse_max, r.ulp_max, r.bias,
                         r.bias_z, ratio);
    }
    bool vacuous = false;
    for (const study::result& r : results) vacuous = vacuous || r.bound_infinite;
    if (vacuous)
        t += "err/bound 'vacuous': the first-order bound (docs/error-bounds.md, eq. 8) is infinite for some output element "
             "(its condition on n and u fails), so it bounds nothing there\n";
    // Stage attribution: each stage's share of the output RMS error, 1 − rms(stage in double)/rms
    // ("-" where the stage already runs in double or wider).
    t += fmt::format("\nstage attribution (share of the output RMS error removed by running one stage in double)\n");
    t += fmt::format("{:<9} {:<14} {:<13} {:>5} {:>7} | {:>9} {:>8} {:>8} {:>8} {:>8} {:>8}\n", "sweep", "policy", "softmax",
                     "n", "offset", "out rms", "logits", "softmax", "P cast", "P.V", "output");
    auto share = [](double base, double staged) {
        return std::isnan(staged) || base <= 0 ? std::string("-") : fmt::format("{:.0f}%", 100 * (1 - staged / base));
    };
    for (std::size_t i = 0; i < points.size(); ++i) {
        const study::point& p = points[i];
        const study::result& r = results[i];
        t += fmt::format("{:<9} {:<14} {:<13} {:>5} {:>7g} | {:>9.2e} {:>8} {:>8} {:>8} {:>8} {:>8}\n", p.sweep, p.policy,
                         study::algorithm_name(p.algorithm), p.seq, p.offset, r.out_rms, share(r.out_rms, r.stage_rms[0]),
                         share(r.out_rms, r.stage_rms[1]), share(r.out_rms, r.stage_rms[2]), share(r.out_rms, r.stage_rms[3]),
                         share(r.out_rms, r.stage_rms[4]));
    }
    return t;
}

std::string table(const std::vector<study::point>& all_points, const std::vector<study::result>& all_results) {
    std::vector<study::point> points;
    std::vector<study::result> results;
    for (std::size_t i = 0; i < all_points.size(); ++i)
        if (!all_points[i].backward) points.push_back(all_points[i]), results.push_back(all_results[i]);
    const bool backward = points.size() != all_points.size();
    if (!backward) return forward_table(points, results);
    const std::string b = backward_table(all_points, all_results);
    return points.empty() ? b : forward_table(points, results) + "\n" + b;
}

}  // namespace

/// Runs argv[0] with arguments argv[1..] (no shell, no PATH lookup), stdout and stderr to
/// /dev/null; true if it exited with status 0 (declared in commands.hpp).
bool run_quietly(const std::vector<std::string>& argv) {
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    if (posix_spawn_file_actions_init(&actions) != 0) return false;
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) return false;
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return false;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

namespace {

/// `s` in POSIX shell single quotes, for the command printed for the user to copy (never run).
std::string shell_quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}


void plot(const study_flags& f, const std::filesystem::path& out);

void run_study(const study_flags& f) {
    if (!f.reproduce.empty()) return run_reproduction(f.reproduce, f.out, f.threads, f.reduced, f.no_plot);
    std::vector<study::sweep> sweeps;
    if (!f.backward_algorithms.empty() && !f.backward) throw data_error("attnref study: --backward-algorithm: needs --backward");
    validate_flags(f);
    if (!f.max_memory.empty()) set_max_memory(parse_memory_size(f.max_memory, "--max-memory"));
    if (any_axis_flag(f)) {
        sweeps.push_back(sweep_from_flags(f));
    } else if (!f.json.empty()) {
        const std::string text = read_text(f.json);
        json_prepass(text, f.json);  // depth and duplicate keys before the recursive parser
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(text);
        } catch (const nlohmann::json::exception& e) {
            throw data_error("attnref study: " + f.json + ": not valid JSON: " + printable(e.what()));
        }
        if (!j.is_object()) throw data_error("attnref study: " + f.json + ": expected an object {\"sweeps\": [...]}");
        for (const auto& [key, value] : j.items())
            if (key != "sweeps") throw data_error("attnref study: " + f.json + ": field '" + printable(key) + "': unknown field");
        if (!j.contains("sweeps") || !j.at("sweeps").is_array() || j.at("sweeps").empty())
            throw data_error("attnref study: " + f.json + ": field 'sweeps': expected a non-empty array of sweeps");
        for (std::size_t i = 0; i < j.at("sweeps").size(); ++i)
            sweeps.push_back(sweep_from_json(j.at("sweeps")[i], f.json, "sweeps[" + std::to_string(i) + "]"));
    } else {
        sweeps = f.backward ? study::default_backward_study() : study::default_study();
    }
    std::vector<study::point> points;
    for (const study::sweep& s : sweeps) {
        std::vector<study::point> expanded;
        try {
            expanded = study::expand(s);
        } catch (const std::invalid_argument& e) {
            throw data_error(std::string("attnref study: ") + e.what());
        }
        for (study::point& p : expanded) points.push_back(std::move(p));
    }
    const std::string source = any_axis_flag(f) || f.json.empty() ? std::string("command line") : f.json;
    for (const study::point& p : points)
        if (!std::isfinite(p.offset + p.ramp * static_cast<double>(p.seq)))
            throw data_error(fmt::format("attnref study: {}: --offset/--ramp (JSON offset, ramp): offset {} + ramp {} x n {} is not finite",
                                         source, p.offset, p.ramp, p.seq));
    // Memory up front: the points run concurrently, one per thread.
    const std::size_t threads = f.threads ? f.threads : std::max(1u, std::thread::hardware_concurrency());
    const study::memory_estimate need = study::study_memory_estimate(points, threads);
    if (need.bytes > max_memory()) {
        const study::point& p = points[need.largest];
        throw data_error(fmt::format("attnref study: {}: --seq/--queries/--head-dim (JSON seq, queries, head_dim): the study would need about "
                                     "{} ({} point(s) at once; the largest, {} n={} queries={} head_dim={}{}, about {}), above the limit "
                                     "of {} (raise it with --max-memory)",
                                     source, safe_io_detail::gib(need.bytes), std::min(threads, points.size()), p.policy, p.seq, p.queries,
                                     p.head_dim, p.backward ? " backward" : "", safe_io_detail::gib(study::point_memory_estimate(p)),
                                     safe_io_detail::gib(max_memory())));
    }
    const std::filesystem::path out(f.out);
    std::error_code ec;
    std::filesystem::create_directories(out, ec);
    if (ec) throw data_error("attnref study: --out: " + printable(out.string()) + ": cannot create the directory: " + ec.message());
    std::fprintf(stderr, "attnref study: %zu points\n", points.size());
    const std::vector<study::result> results = study::run(points, f.threads, [&](std::size_t done) {
        std::fprintf(stderr, "\r  %zu/%zu points", done, points.size());
        if (done == points.size()) std::fprintf(stderr, "\n");
    });
    std::string csv = csv_header() + "\n";
    for (std::size_t i = 0; i < points.size(); ++i) csv += csv_row(points[i], results[i]) + "\n";
    const std::string text = table(points, results);
    // Atomically (a temporary file, then rename): a symlink planted at either name is replaced, never written through.
    write_file_atomic(out / "study.csv", csv, true);
    write_file_atomic(out / "table.txt", text, true);
    std::fputs(text.c_str(), stdout);
    std::printf("wrote %s and %s\n", (out / "study.csv").c_str(), (out / "table.txt").c_str());
    // A backward bound exceeded is a finding the study asserts: exit 1, after writing everything.
    std::size_t exceeded = 0;
    std::string first;
    for (std::size_t i = 0; i < points.size(); ++i) {
        const study::result& r = results[i];
        if (points[i].backward && !(std::max({r.grad_bound_ratio[0], r.grad_bound_ratio[1], r.grad_bound_ratio[2]}) <= 1) && exceeded++ == 0)
            first = fmt::format("{} {} n={}", points[i].policy, attnref::backward_algorithm_name(points[i].backward_alg), points[i].seq);
    }
    if (!f.no_plot) plot(f, out);
    if (exceeded)
        throw check_failure(fmt::format("attnref study: the first-order backward bound was exceeded at {} point(s); first: {}", exceeded, first));
}

/// Draws DIR/*.svg with the plot script, or prints the command to run.
void plot(const study_flags& f, const std::filesystem::path& out) {
    const std::string script = f.plot_script.empty() ? default_plot_script() : f.plot_script;
    // No shell: the script runs from an argument vector (posix_spawn), so a path holding ', $( ),
    // ; or a newline is only ever a file name.
    const std::vector<std::string> argv{"/usr/bin/python3", script, (out / "study.csv").string(), out.string()};
    const bool have = std::filesystem::exists("/usr/bin/python3") && std::filesystem::exists(script);
    if (have && run_quietly(argv)) {
        std::printf("plots: %s/*.svg\n", printable(out.string()).c_str());
    } else {
        std::string command;
        for (const std::string& arg : argv) command += (command.empty() ? "" : " ") + shell_quote(arg);
        std::printf("plots not drawn (needs python3 with matplotlib); run: %s\n", printable(command).c_str());
    }
}

}  // namespace

void register_study(CLI::App& app) {
    auto f = std::make_shared<study_flags>();
    CLI::App* s = app.add_subcommand("study", "Precision study: sweep policies/algorithms/sizes against an MPFR reference");
    s->add_option("--out", f->out, "output directory (study.csv, table.txt, *.svg)")->required();
    s->add_option("--json", f->json, "study description (JSON, see docs/studies.md); ignored if any axis flag is given");
    s->add_option("--policy", f->policies, "policy names (policies.hpp / attnref run), e.g. float32 bf16_fp32acc fp32_p_bf16");
    s->add_option("--algorithm", f->algorithms, "softmax: naive shifted division_free online");
    s->add_option("--block", f->blocks, "online softmax block sizes")->check(unsigned_text());
    s->add_option("--placement", f->placements, "scale placement: on_product on_query split_sqrt");
    s->add_option("--seq", f->seqs, "key lengths n")->check(unsigned_text());
    s->add_option("--head-dim", f->head_dims, "head dims dk = dv")->check(unsigned_text());
    s->add_option("--offset", f->offsets, "constants added to every logit");
    s->add_option("--ramp", f->ramps, "logit ramp per key index (ramp*j)");
    s->add_option("--logit-scale", f->logit_scales, "scale = logit_scale/sqrt(dk)");
    s->add_option("--queries", f->queries, "query length (default 8)")->check(unsigned_text());
    s->add_option("--seeds", f->seeds, "generator seeds (default 1 2 3 4)")->check(unsigned_text());
    s->add_flag("--direct-logits", f->direct_logits, "logits = offset + ramp*j + spread*U[-1,1) given exactly (softmax alone)");
    s->add_option("--spread", f->spread, "noise amplitude of direct logits (default 4)");
    s->add_flag("--positive-values", f->positive_values, "values uniform on [0, 1)");
    s->add_option("--threads", f->threads, "worker threads (0: all cores); results do not depend on it")->check(unsigned_text());
    s->add_option("--max-memory", f->max_memory,
                  "refuse a study estimated to need more memory (bytes, K/M/G/T suffix; default: half the machine's memory, at least 4G; the points running at once)");
    s->add_option("--plot-script", f->plot_script, "plot script (default: share/attnref/tools/plot_study.py beside the attnref executable)");
    s->add_flag("--no-plot", f->no_plot, "do not draw plots");
    s->add_option("--reproduce", f->reproduce, "reproduce a published result: pcast-fp8 or flash-bf16 (docs/studies-reproduced.md); it fixes its own grid and takes only --out, --threads, --reduced and --no-plot");
    s->add_flag("--reduced", f->reduced, "with --reproduce: the reduced sample of the CTest check");
    s->add_flag("--backward", f->backward,
                "measure the backward pass (dQ, dK, dV vs the MPFR backward and backward_bounds.hpp's bound); alone: the "
                "default backward study");
    s->add_option("--backward-algorithm", f->backward_algorithms, "with --backward: textbook flash (default both)");
    s->callback([f, s] {
        f->queries_given = s->get_option("--queries")->count() > 0;
        // Every flag is honoured or refused: an empty --out or --reproduce is not a choice, and a
        // reproduction fixes its own grid, so the study's own flags would be silently ignored there.
        if (f->out.empty()) throw data_error("attnref study: --out: an empty path; name the output directory");
        const bool reproducing = s->get_option("--reproduce")->count() > 0;
        if (reproducing && f->reproduce.empty())
            throw data_error("attnref study: --reproduce: an empty name; expected pcast-fp8 or flash-bf16");
        if (f->reduced && !reproducing) throw data_error("attnref study: --reduced: only with --reproduce (its reduced sample)");
        if (reproducing)
            for (const CLI::Option* o : s->get_options()) {
                const std::string flag = o->get_name();
                if (o->count() == 0 || flag == "--reproduce" || flag == "--out" || flag == "--threads" || flag == "--reduced" ||
                    flag == "--no-plot" || flag == "--help")
                    continue;
                throw data_error("attnref study: " + flag + ": not used with --reproduce (a reproduction fixes its own grid; it takes "
                                 "--out, --threads, --reduced and --no-plot)");
            }
        run_study(*f);
    });
}

}  // namespace attnref::verify
