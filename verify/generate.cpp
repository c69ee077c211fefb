/// `attnref generate`: certified golden cases from the suite or from command-line flags.

#include <algorithm>
#include <cmath>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "commands.hpp"
#include "attnref/golden/generate.hpp"
#include "attnref/golden/manifest.hpp"
#include "attnref/golden/rounded_inputs.hpp"
#include "attnref/golden/safe_io.hpp"
#include "attnref/golden/sha256.hpp"
#include "attnref/golden/user_inputs.hpp"
#include "attnref/core/parallel.hpp"
#include "shard.hpp"
#include "summary.hpp"

namespace attnref::verify {

namespace fs = std::filesystem;

namespace {

struct generate_args {
    std::string suite = default_suite();
    std::vector<std::string> cases;
    std::string out;
    bool force = false;
    bool verify = false;
    bool quiet = false;
    std::size_t threads = 0;
    // Ad-hoc case (used when --name is given).
    std::string name, description = "ad-hoc case from the command line", kind = "sdpa";
    std::size_t batch = 1, heads = 1, kv_heads = 0, sq = 8, sk = 0, dk = 8, dv = 0, model_dim = 0, output_dim = 0;
    std::string causal, diagonal, window_left, window_right, polarity = "true_means_attend", empty_rows = "zero", placement = "on_product";
    std::vector<std::size_t> key_lengths;
    std::vector<double> alibi_slopes;
    bool boolean_mask = false, additive_mask = false, seed_mask = false, bias = false, no_weights = false, no_lse = false;
    bool gradients = false;  ///< --gradients: a backward case (generated grad_output, certified gradients)
    std::optional<double> scale, softcap;
    std::ptrdiff_t diagonal_offset = 0;
    std::string input_format = "float64";
    std::uint64_t seed = 0;
    std::vector<std::string> targets;
    std::string max_memory;
    std::string method = "fast";
    std::string shard;  ///< "I/N": only shard I of N of the selected cases (shard.hpp)
    bool shard_given = false;  ///< --shard was on the command line (even as ""; parse_shard refuses that)
    // The user's own inputs (--inputs-from DIR, user_inputs.hpp) and regenerating one case directory (--golden).
    std::string inputs_from, input_dtype, golden;
    std::set<std::string> given;  ///< the ad-hoc flags given on the command line (filled by the callback)
};

/// The ad-hoc case as suite JSON, parsed by the same strict reader as golden/suite.json.
case_spec ad_hoc_case(const generate_args& a) {
    // Non-finite numbers would be written to JSON as null (the default), silently: refuse them.
    auto finite_positive = [](const char* flag, const std::optional<double>& v) {
        if (v && !(std::isfinite(*v) && *v > 0))
            throw data_error(std::string("command line: ") + flag + ": expected a positive finite number, got " + std::to_string(*v));
    };
    finite_positive("--scale", a.scale);
    finite_positive("--softcap", a.softcap);
    for (double slope : a.alibi_slopes)
        if (!std::isfinite(slope)) throw data_error("command line: --alibi-slopes: expected finite numbers, got " + std::to_string(slope));
    // The flags as a case description, written to suite JSON by the library's one writer
    // (to_json) and read back by the same strict reader as golden/suite.json: defaults, ranges
    // and cross-field rules all come from there. The names were checked by CLI11 (IsMember).
    case_spec s;
    s.name = a.name;
    s.description = a.description;
    s.kind = *from_name<case_kind>(a.kind);
    s.shapes = {a.batch, a.heads, a.kv_heads ? a.kv_heads : a.heads, a.sq, a.sk ? a.sk : a.sq, a.dk, a.dv ? a.dv : a.dk,
                a.model_dim, a.output_dim};
    case_conventions& cv = s.conventions;
    cv.scale = a.scale;
    cv.placement = *from_name<scale_placement>(a.placement);
    cv.softcap = a.softcap;
    cv.alibi_slopes = a.alibi_slopes;
    if (!a.causal.empty()) {
        cv.causal = true;
        cv.alignment = *from_name<causal_alignment>(a.causal);
    }
    // The diagonal is shared by the causal mask, the sliding window and ALiBi: --diagonal sets it
    // without a causal mask (a bottom-right window); with --causal both must name the same one.
    if (!a.diagonal.empty()) {
        if (!a.causal.empty() && a.diagonal != a.causal)
            throw data_error("command line: --diagonal " + a.diagonal + ": --causal " + a.causal +
                             " already aligns the diagonal (give one of them, or the same alignment)");
        cv.alignment = *from_name<causal_alignment>(a.diagonal);
    }
    cv.diagonal_offset = a.diagonal_offset;
    if (!a.window_left.empty() || !a.window_right.empty()) {
        auto bound = [](const std::string& t) -> std::optional<std::size_t> {
            if (t.empty() || t == "none") return std::nullopt;
            // Digits only: std::stoull would accept "-1" (wrapping to 2^64 − 1) and leading spaces.
            if (t.find_first_not_of("0123456789") == std::string::npos && t.size() <= 20) {
                try {
                    return static_cast<std::size_t>(std::stoull(t));
                } catch (const std::exception&) {
                }
            }
            throw data_error("command line: --window-left/--window-right: expected a non-negative integer or 'none', got '" + t + "'");
        };
        cv.window = sliding_window{bound(a.window_left), bound(a.window_right)};
    }
    cv.key_lengths = a.key_lengths;
    cv.boolean_mask = a.boolean_mask;
    cv.polarity = *from_name<mask_polarity>(a.polarity);
    cv.additive_mask = a.additive_mask;
    cv.seed_mask = a.seed_mask;
    cv.empty_rows = *from_name<empty_row_policy>(a.empty_rows);
    cv.projection_bias = a.bias;
    s.inputs.format = *from_name<generator::input_format>(a.input_format);
    s.inputs.seed = a.seed;
    s.outputs = {!a.no_weights, !a.no_lse, a.targets};
    if (a.gradients) {
        // The gradients' bound (check/checker.hpp) needs the stored weights and lse.
        if (a.no_weights || a.no_lse)
            throw data_error("command line: --gradients: a backward case stores the weights and lse; drop --no-weights and --no-lse");
        s.outputs.gradients = true;  // grad_output from the generator, like the suite's backward cases
    }
    nlohmann::ordered_json c = to_json(s);
    // Omitted, the multi-head widths take the suite's defaults (model_dim = heads × dk, output_dim = model_dim).
    if (s.kind == case_kind::mha && !a.model_dim) c["shapes"].erase("model_dim");
    if (s.kind == case_kind::mha && !a.output_dim) c["shapes"].erase("output_dim");
    nlohmann::ordered_json suite{{"schema", suite_schema}, {"schema_version", schema_version}, {"cases", {c}}};
    return parse_suite(suite.dump(), "command line").front();
}

/// The ad-hoc case with its inputs from the user's files (--inputs-from): shapes from the files (shape
/// flags, when given, must agree), conventions from the flags, inputs.format the narrowest exact one or
/// the --input-format given (checked), generator "files" with each file's dtype and sha256.
std::pair<case_spec, case_data> inputs_from_case(generate_args a) {
    const fs::path dir = a.inputs_from;
    if (a.given.count("--seed")) throw data_error("command line: --seed: the inputs come from --inputs-from, not from the generator");
    if (!a.input_dtype.empty() && a.input_dtype != "bfloat16")
        throw data_error("command line: --input-dtype: expected 'bfloat16' (the only dtype .npy cannot name), got '" + printable(a.input_dtype) + "'");
    user_input_options o;
    o.kind = *from_name<case_kind>(a.kind);
    o.heads = a.given.count("--heads") ? a.heads : 0;
    o.kv_heads = a.given.count("--kv-heads") ? a.kv_heads : 0;
    o.bias = a.bias;
    o.boolean_mask = a.boolean_mask;
    o.additive_mask = a.additive_mask;
    o.seed_mask = a.seed_mask;
    o.bfloat16_bits = a.input_dtype == "bfloat16";
    const case_shapes sh = user_input_shapes(dir, o);
    const std::string from = (dir / "query.npy").string();
    const std::pair<const char*, std::pair<std::size_t*, std::size_t>> shape_flags[] = {
        {"--batch", {&a.batch, sh.batch}},          {"--heads", {&a.heads, sh.heads}},
        {"--kv-heads", {&a.kv_heads, sh.kv_heads}}, {"--sq", {&a.sq, sh.query_length}},
        {"--sk", {&a.sk, sh.key_length}},           {"--dk", {&a.dk, sh.head_dim_qk}},
        {"--dv", {&a.dv, sh.head_dim_v}},           {"--model-dim", {&a.model_dim, sh.model_dim}},
        {"--output-dim", {&a.output_dim, sh.output_dim}}};
    for (const auto& [flag, v] : shape_flags) {
        if (a.given.count(flag) && *v.first != v.second)
            throw data_error("command line: " + std::string(flag) + " " + std::to_string(*v.first) + " disagrees with the files in " +
                             printable(dir.string()) + ", which give " + std::to_string(v.second) + " (see query.npy, key.npy, value.npy" +
                             (o.kind == case_kind::mha ? ", w_q.npy, w_v.npy, w_o.npy)" : ")"));
        *v.first = v.second;
    }
    const std::optional<generator::input_format> declared =
        a.given.count("--input-format") ? from_name<generator::input_format>(a.input_format) : std::nullopt;
    a.input_format = "float64";
    const bool gradients_flag = a.gradients;
    a.gradients = false;  // here the file decides: grad_output.npy makes the backward case
    case_spec spec = ad_hoc_case(a);
    request_user_gradients(dir, spec);  // grad_output.npy: a backward case
    if (gradients_flag && !spec.outputs.gradients)
        throw data_error("command line: --gradients: with --inputs-from the gradients need " + printable((dir / "grad_output.npy").string()) +
                         " (dO, the output's shape), which is missing");
    check_generate_memory(spec, a.method == "mpfi" ? certification_method::mpfi : certification_method::fast,
                          a.threads ? a.threads : std::max(1u, std::thread::hardware_concurrency()),
                          printable(dir.string()) + " (--inputs-from)", nullptr, gradients_flag);
    user_inputs in = read_user_inputs(dir, spec, o);
    // The values may send the whole case to the MPFI ladder (fast_path_declines): the estimate again, with them.
    check_generate_memory(spec, a.method == "mpfi" ? certification_method::mpfi : certification_method::fast,
                          a.threads ? a.threads : std::max(1u, std::thread::hardware_concurrency()),
                          printable(dir.string()) + " (--inputs-from)", &in.data, gradients_flag);
    if (declared) require_exact_in(dir, spec, in.data, *declared, "--input-format " + std::string(format_name(*declared)));
    spec.inputs.format = declared ? *declared : in.narrowest;
    spec.inputs.seed = 0;
    spec.inputs.from_files = true;
    spec.inputs.files = std::move(in.files);
    // The finished description through the strict reader's own validation, as every case.
    complete_and_validate(spec, "command line");
    return {std::move(spec), std::move(in.data)};
}

struct case_outcome {
    std::string status;
    double seconds = 0;
    std::size_t certified = 0, escalated = 0;
    bool differs = false, conflict = false;
    std::string detail;
};

void run_generate(generate_args a) {
    std::vector<case_spec> cases;
    fs::path out = a.out;
    std::optional<case_data> inputs;    // a "files" case's inputs (not the generator's)
    std::optional<fs::path> case_dir;   // --golden: the one directory compared or written
    std::optional<fp8_quantised> fp8;   // --golden --input-format fp8e4m3|fp8e5m2: the codes and scales
    if (a.golden.empty() && fp8_format_from_name(a.input_format))
        throw data_error("command line: --input-format " + a.input_format + ": only with --golden (the derived case of a golden case)");
    // Ad-hoc cases asked for with --gradients (also with --inputs-from) certify SDPA and multi-head
    // gradients through the fast backward; --golden follows its manifest; the suite's cases and --inputs-from without
    // --gradients keep the MPFI ladder's (the suite's committed record).
    bool fast_gradients = !a.name.empty() && a.gradients;
    if (!a.golden.empty()) {
        if (!a.name.empty() || !a.inputs_from.empty() || !a.cases.empty() || a.shard_given)
            throw data_error("command line: --golden: regenerates one case from its own manifest; not with --name, --inputs-from, --case or --shard");
        if (!a.max_memory.empty()) set_max_memory(parse_memory_size(a.max_memory, "--max-memory"));
        // load_case checks the manifest and every file's sha256: a "files" case's stored inputs are
        // used as they are; other cases' inputs come from the generator again.
        loaded_case lc = load_case(a.golden);
        if (a.given.count("--input-format")) {
            // The derived case a kernel of that format computes on (golden/rounded_inputs.hpp): the inputs
            // rounded to nearest even, their certified reference, named <case>_inputs_<format>; needs --out.
            if (a.out.empty()) throw data_error("command line: --input-format with --golden: needs --out (the derived case's parent directory)");
            if (const std::optional<fp8_input_format> f8 = fp8_format_from_name(a.input_format)) {
                // FP8: the inputs quantised per tensor (quantise_fp8); the codes and descales also go to <derived>/fp8/.
                fp8.emplace(quantise_case_fp8(lc, *f8, "command line: --input-format " + a.input_format));
                inputs = fp8->effective;
                cases.push_back(rounded_spec(lc.m.spec, *inputs, *f8));
            } else {
            const binary_format f = *format_from_name(a.input_format);
            if (!inputs_finite_in(lc.data, f))
                throw data_error("command line: --input-format " + a.input_format + ": rounding the inputs of " + lc.m.spec.name + " overflows");
            inputs = round_inputs(lc.data, f);
            cases.push_back(rounded_spec(lc.m.spec, *inputs, f));
            }
            case_dir = fs::path(a.out) / cases.back().name;
            out = a.out;
        } else {
        if (lc.m.spec.inputs.from_files) inputs = std::move(lc.data);
        if (lc.m.reference.method == reference_method_mpfi && a.method == "fast") a.method = "mpfi";
        fast_gradients = lc.m.reference.method == reference_method_fast + std::string(reference_method_fast_gradients_suffix);
        cases.push_back(lc.m.spec);
        case_dir = a.out.empty() ? fs::path(a.golden) : fs::path(a.out) / lc.m.spec.name;
        if (out.empty()) out = fs::path(a.golden).parent_path();
        if (out.empty()) out = ".";
        }
    } else if (!a.inputs_from.empty()) {
        if (a.name.empty()) throw data_error("command line: --inputs-from: needs --name (the case's name)");
        if (!a.cases.empty() || a.shard_given) throw data_error("command line: --inputs-from: makes one ad-hoc case; not with --case or --shard");
        if (!a.max_memory.empty()) set_max_memory(parse_memory_size(a.max_memory, "--max-memory"));
        auto [spec, data] = inputs_from_case(a);
        cases.push_back(std::move(spec));
        inputs = std::move(data);
        if (out.empty()) out = ".";
    } else if (!a.name.empty()) {
        cases.push_back(ad_hoc_case(a));
        if (out.empty()) out = ".";
    } else {
        const std::vector<case_spec> suite = parse_suite(read_text(a.suite), a.suite);
        if (out.empty()) out = fs::path(a.suite).parent_path();
        if (out.empty()) out = ".";
        if (a.cases.empty()) cases = suite;
        for (const std::string& n : a.cases) {
            auto it = std::find_if(suite.begin(), suite.end(), [&](const case_spec& s) { return s.name == n; });
            if (it == suite.end()) throw data_error(a.suite + ": field 'cases': no case named '" + n + "' (--case)");
            cases.push_back(*it);
        }
    }
    std::optional<shard_record> shard;
    if (a.shard_given) {
        if (!a.name.empty()) throw data_error("command line: --shard: shards a suite's cases; not with an ad-hoc case (--name)");
        if (a.out.empty()) throw data_error("command line: --shard: needs --out (the shard directory)");
        const shard_id id = parse_shard(a.shard, "--shard");
        const std::string text = read_text(a.suite);
        shard.emplace();
        shard->suite_sha256 = sha256_hex(std::as_bytes(std::span(text.data(), text.size())));
        shard->shard = id;
        std::vector<case_spec> mine;
        for (const case_spec& c : cases) shard->selection.push_back(c.name);
        for (std::size_t i : shard_cases(cases, id)) {
            mine.push_back(cases[i]);
            shard->cases.push_back(cases[i].name);
        }
        cases = std::move(mine);
    }
    std::size_t threads = a.threads ? a.threads : std::max(1u, std::thread::hardware_concurrency());
    if (!a.max_memory.empty()) set_max_memory(parse_memory_size(a.max_memory, "--max-memory"));
    // Cases run one at a time on every thread (large) or concurrently on one thread each (small):
    // each case's estimate on `threads` threads bounds the first, and the small ones are small.
    for (std::size_t i = 0; i < cases.size(); ++i)
        check_generate_memory(cases[i], a.method == "mpfi" ? certification_method::mpfi : certification_method::fast, threads,
                              a.name.empty() ? a.suite + " case '" + cases[i].name + "'" : std::string("command line"), nullptr, fast_gradients);
    if (!a.verify) {
        std::error_code ec;
        fs::create_directories(out, ec);
        if (ec) throw data_error(out.string() + ": cannot create the directory: " + ec.message());
    }

    std::vector<case_outcome> outcomes(cases.size());
    std::mutex io;
    auto say = [&](const std::string& line) {
        if (a.quiet) return;
        const std::lock_guard<std::mutex> lock(io);
        std::fprintf(stderr, "attnref generate: %s\n", line.c_str());
    };
    auto process = [&](std::size_t i, std::size_t inner_threads) {
        const case_spec& s = cases[i];
        const bool long_case = case_cost(s) > 2e6;
        const generated_case g = generate_case(s, inner_threads,
                                               long_case ? std::function<void(const std::string&)>(say) : std::function<void(const std::string&)>(),
                                               a.method == "mpfi" ? certification_method::mpfi : certification_method::fast,
                                               inputs ? &*inputs : nullptr, fast_gradients);
        case_outcome& o = outcomes[i];
        o.seconds = g.seconds;
        o.certified = g.certified_elements;
        o.escalated = g.escalated_elements;
        const fs::path dir = case_dir ? *case_dir : out / s.name;
        // Compare and publish under an exclusive lock on --out: a concurrent `generate` into the
        // same directory waits, then sees this case as written (unchanged or CONFLICT), so no run
        // silently replaces another's case.
        std::optional<directory_lock> lock;
        if (!a.verify) lock.emplace(out);
        comparison c = compare_case(dir, g);
        // The FP8 codes and descales (<dir>/fp8/) are part of the case: compared like its other files.
        if (fp8 && c.exists && c.identical)
            if (std::string d = fp8_files_difference(dir, s, *fp8); !d.empty()) c.identical = false, c.first_difference = d;
        if (a.verify) {
            o.status = c.identical ? "identical" : "DIFFERS";
            o.differs = !c.identical;
            o.detail = !c.exists ? "missing directory" : c.first_difference;
        } else if (!c.exists) {
            write_case(dir, g);
            o.status = "written";
        } else if (c.identical) {
            o.status = "unchanged";
        } else if (a.force) {
            write_case(dir, g);
            o.status = "overwritten";
        } else {
            o.status = "CONFLICT";
            o.conflict = true;
            o.detail = c.first_difference;
        }
        if (fp8 && !a.verify && !o.conflict && o.status != "unchanged") write_fp8_files(dir, s, *fp8);  // <dir>/fp8/
        say(fmt::format("[{}/{}] {}: {} ({:.1f} s)", i + 1, cases.size(), s.name, o.status, o.seconds));
    };

    // Large cases one at a time with every thread inside attnref's parallel_for; the rest
    // concurrently, one thread each. Results never depend on the split (see parallel.hpp).
    std::vector<std::size_t> big, small;
    for (std::size_t i = 0; i < cases.size(); ++i) (case_cost(cases[i]) > 2e6 && threads > 1 ? big : small).push_back(i);
    for (std::size_t i : big) process(i, threads);
    ::attnref::parallel_for_dynamic(small.size(), threads, [&](std::size_t k) { process(small[k], 1); },
                                 &thread_cleanup<mpfr_interval<40>>::run);  // MPFR's per-thread constant caches

    std::vector<summary_row> rows;
    for (std::size_t i = 0; i < cases.size(); ++i)
        rows.push_back({&cases[i], outcomes[i].status, outcomes[i].certified, outcomes[i].escalated, outcomes[i].seconds});
    if (!a.quiet) std::fputs(summary_table(rows).c_str(), stdout);  // --quiet: the exit status and errors only
    std::fflush(stdout);

    for (std::size_t i = 0; i < cases.size(); ++i)
        if (outcomes[i].conflict)
            throw data_error((case_dir ? *case_dir : out / cases[i].name).string() + ": existing case differs from the regenerated one (" +
                             outcomes[i].detail + "); not overwritten, use --force");
    // The shard's record last: a shard directory without it is incomplete (merge refuses it).
    if (shard && !a.verify) {
        const fs::path record = out / shard_file;
        const std::string text = shard_text(*shard);
        std::error_code ec;
        const bool same = fs::exists(record, ec) && read_text(record.string()) == text;
        if (!same) write_file_atomic(record, text, a.force);
    }
    std::size_t differing = 0;
    std::string first;
    for (std::size_t i = 0; i < cases.size(); ++i)
        if (outcomes[i].differs && differing++ == 0) first = (case_dir ? *case_dir : out / cases[i].name).string() + ": " + outcomes[i].detail;
    if (differing)
        throw check_failure(fmt::format("--verify: {} of {} case(s) differ from the regenerated data; first: {}", differing,
                                        cases.size(), first));
}

}  // namespace

void register_generate(CLI::App& app) {
    auto a = std::make_shared<generate_args>();
    CLI::App* g = app.add_subcommand("generate",
                                     "Generate certified golden cases: the suite (default), selected --case names, or one "
                                     "ad-hoc case described by flags (--name ...)");
    g->add_option("--suite", a->suite, "suite definition")->capture_default_str();
    g->add_option("--case", a->cases, "generate only these suite cases (repeatable)");
    g->add_option("--out", a->out, "output directory (default: the suite file's directory; '.' for ad-hoc cases)");
    g->add_flag("--force", a->force, "overwrite existing cases whose content differs");
    g->add_flag("--verify", a->verify, "regenerate in memory and compare with the files on disk; write nothing; exit 1 on any difference");
    g->add_flag("--quiet", a->quiet, "no progress lines on stderr and no summary table on stdout: errors and the exit status only");
    g->add_option("--threads", a->threads, "threads (0 = all cores); results do not depend on it")
        ->check(unsigned_text())->capture_default_str();
    g->add_option("--method", a->method,
                  "fast: double-double with rigorous bounds, undecided rows through MPFI (default); mpfi: the MPFI ladder "
                  "alone. Same values; the manifest records the method")
        ->check(CLI::IsMember({"fast", "mpfi"}))->capture_default_str();
    g->add_option("--shard", a->shard,
                  "compute only shard I of N (I/N, 0-based) of the selected cases into --out, with shard.json; "
                  "`attnref merge` assembles the shards");
    g->add_option("--golden", a->golden,
                  "regenerate the one case in this directory from its own manifest (a 'files' case from its stored "
                  "inputs, sha256-checked) and compare (--verify) or write it there (or into --out/NAME)");
    g->add_option("--max-memory", a->max_memory,
                  "refuse cases estimated to need more memory (bytes, K/M/G/T suffix; default: half the machine's memory, at least 4G; the estimate is the chosen "
                  "--method's, docs/hostile.md)");
    auto* adhoc = "Ad-hoc case";
    g->add_option("--name", a->name, "ad-hoc case name ([a-z0-9_]); enables the flags below")->group(adhoc);
    g->add_option("--inputs-from", a->inputs_from,
                  "read the inputs from DIR/query.npy, key.npy, value.npy (mha: and w_q ... w_o, b_* with --bias; masks "
                  "when asked for; grad_output.npy: a backward case with certified gradients): shapes from the files, values "
                  "certified as given (golden/README.md, 'Your own inputs')")
        ->group(adhoc);
    g->add_option("--input-dtype", a->input_dtype, "with --inputs-from: bfloat16 reads '<u2' files as bfloat16 bit patterns")
        ->group(adhoc);
    g->add_option("--description", a->description, "one-line description")->group(adhoc);
    g->add_option("--kind", a->kind, "sdpa or mha")->check(CLI::IsMember({"sdpa", "mha"}))->group(adhoc);
    g->add_option("--batch", a->batch, "B")->check(unsigned_text())->group(adhoc);
    g->add_option("--heads", a->heads, "H (query heads)")->check(unsigned_text())->group(adhoc);
    g->add_option("--kv-heads", a->kv_heads, "H_kv (default H)")->check(unsigned_text())->group(adhoc);
    g->add_option("--sq", a->sq, "query length")->check(unsigned_text())->group(adhoc);
    g->add_option("--sk", a->sk, "key length (default Sq)")->check(unsigned_text())->group(adhoc);
    g->add_option("--dk", a->dk, "head dimension of q and k")->check(unsigned_text())->group(adhoc);
    g->add_option("--dv", a->dv, "head dimension of v (default dk)")->check(unsigned_text())->group(adhoc);
    g->add_option("--model-dim", a->model_dim, "mha: embedding dimension (default H*dk)")->check(unsigned_text())->group(adhoc);
    g->add_option("--output-dim", a->output_dim, "mha: output features (default model dim)")->check(unsigned_text())->group(adhoc);
    g->add_flag("--bias", a->bias, "mha: projections with biases")->group(adhoc);
    g->add_option("--causal", a->causal, "causal mask, aligned top_left or bottom_right (sets the diagonal too)")
        ->check(CLI::IsMember(names_of(causal_alignment_names)))->group(adhoc);
    g->add_option("--diagonal", a->diagonal,
                  "where query i's diagonal lies, for the causal mask, the sliding window and ALiBi: top_left (key i) or "
                  "bottom_right (key i + Sk - Sq); default top_left, or --causal's")
        ->check(CLI::IsMember(names_of(causal_alignment_names)))->group(adhoc);
    g->add_option("--diagonal-offset", a->diagonal_offset, "diagonal offset (ONNX past length)")->group(adhoc);
    g->add_option("--window-left", a->window_left, "sliding window: keys before the diagonal (or none)")->group(adhoc);
    g->add_option("--window-right", a->window_right, "sliding window: keys after the diagonal (or none)")->group(adhoc);
    g->add_option("--key-lengths", a->key_lengths, "valid keys per batch (key padding)")->delimiter(',')->check(unsigned_text())->group(adhoc);
    g->add_flag("--boolean-mask", a->boolean_mask, "a generated boolean mask (B, H, Sq, Sk)")->group(adhoc);
    g->add_option("--polarity", a->polarity, "boolean mask polarity")
        ->check(CLI::IsMember(names_of(mask_polarity_names)))->group(adhoc);
    g->add_flag("--additive-mask", a->additive_mask, "a generated additive mask (with -inf entries)")->group(adhoc);
    g->add_flag("--seed-mask", a->seed_mask, "a generated seed-convention mask (logits += m * -1e9)")->group(adhoc);
    g->add_option("--empty-rows", a->empty_rows, "fully masked rows: zero, nan or uniform")
        ->check(CLI::IsMember(names_of(empty_row_policy_names)))->group(adhoc);
    g->add_option("--scale", a->scale, "logit scale (default 1/sqrt(dk))")->group(adhoc);
    g->add_option("--scale-placement", a->placement, "on_product, on_query or split_sqrt")
        ->check(CLI::IsMember(names_of(scale_placement_names)))->group(adhoc);
    g->add_option("--softcap", a->softcap, "soft-capping constant")->group(adhoc);
    g->add_option("--alibi-slopes", a->alibi_slopes, "ALiBi slopes, one per head")->delimiter(',')->group(adhoc);
    g->add_option("--input-format", a->input_format,
                  "float64, float32, bfloat16 or float16 (with --inputs-from: default the narrowest holding every value exactly; with "
                  "--golden: write the derived case <case>_inputs_<format> under --out, the inputs rounded to nearest even to it "
                  "and their certified reference; fp8e4m3, fp8e5m2 (--golden only): the inputs quantised per tensor with power-of-two descales, "
                  "the codes as uint8 and the descales in <derived>/fp8/, which --verify and a rerun compare too)")
        ->check(CLI::IsMember(input_selection_names(false)))->group(adhoc);
    g->add_option("--seed", a->seed, "generator seed")->check(unsigned_text())->group(adhoc);
    g->add_option("--targets", a->targets, "extra correctly rounded copies: float32, bfloat16, float16")->delimiter(',')->group(adhoc);
    g->add_flag("--no-weights", a->no_weights, "do not store the attention weights P")->group(adhoc);
    g->add_flag("--no-lse", a->no_lse, "do not store the log-sum-exp")->group(adhoc);
    g->add_flag("--gradients", a->gradients,
                "a backward case: grad_output from the generator (the suite's), certified gradients of every gradient role "
                "of the kind, through the fast backward (docs/fast-certify.md (11) SDPA, (14) mha); with --inputs-from: needs "
                "DIR/grad_output.npy, and its gradients go through the fast backward too")
        ->group(adhoc);
    g->callback([a, g] {
        for (const char* flag : {"--batch", "--heads", "--kv-heads", "--sq", "--sk", "--dk", "--dv", "--model-dim", "--output-dim",
                                 "--input-format", "--seed"})
            if (g->get_option(flag)->count() > 0) a->given.insert(flag);
        a->shard_given = g->get_option("--shard")->count() > 0;
        run_generate(*a);
    });
}

}  // namespace attnref::verify
