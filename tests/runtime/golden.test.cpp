// The `attnref` command on golden data: byte-for-byte regeneration independent of the thread
// count, --force protection, strict manifests (one-line errors, exit 2), and `run --arith float64`
// close to the certified reference.
#define BOOST_TEST_MODULE golden
#include <boost/test/unit_test.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "attnref/io/npy.hpp"
#include "attnref/golden/manifest.hpp"
#include "file_text.hpp"

namespace fs = std::filesystem;
using attnref::test::read_file;
using attnref::test::write_file;

namespace {

const std::string exe = ATTNREF_BINARY_DIR "/verify/attnref";
const fs::path golden = ATTNREF_SOURCE_DIR "/golden";
const std::string suite = ATTNREF_SOURCE_DIR "/golden/suite.json";

struct outcome {
    int code;
    std::string err;
};

outcome run_attnref(const std::string& args) {
    const fs::path err = fs::temp_directory_path() / ("attnref-golden-test-" + std::to_string(::getpid()) + ".err");
    const int status = std::system((exe + " " + args + " > /dev/null 2> " + err.string()).c_str());
    std::string text = read_file(err);
    fs::remove(err);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text};
}

bool same_directory_files(const fs::path& a, const fs::path& b) {
    std::size_t n = 0;
    for (const auto& e : fs::directory_iterator(a)) {
        if (read_file(e.path()) != read_file(b / e.path().filename())) return false;
        ++n;
    }
    return n > 0;
}

struct scratch {
    fs::path dir;
    scratch() : dir(fs::temp_directory_path() / ("attnref-golden-test-" + std::to_string(::getpid()))) {
        fs::remove_all(dir);
        fs::create_directories(dir);
    }
    ~scratch() { fs::remove_all(dir); }
};

std::size_t line_count(const std::string& s) { return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n')); }

}  // namespace

BOOST_AUTO_TEST_CASE(role_table_gives_every_tensor_of_a_case_in_file_order_with_its_shape) {
    // An MHA backward case with biases, GQA and cross attention: B=2, H=4, Hkv=2, Sq=3, Sk=5, dk=6,
    // dv=7, E=10, output width 9. Expected shapes written out from the layout y = x·W + b
    // (multi_head_attention.hpp): W_q (E, H·dk), W_k (E, Hkv·dk), W_v (E, Hkv·dv), W_o (H·dv, Eo).
    namespace g = attnref::golden;
    g::case_spec s;
    s.kind = g::case_kind::mha;
    s.shapes = {2, 4, 2, 3, 5, 6, 7, 10, 9};
    s.conventions.projection_bias = true;
    s.conventions.boolean_mask = true;
    s.outputs.gradients = true;
    using V = std::vector<std::size_t>;
    const std::vector<std::pair<std::string, V>> want_inputs{
        {"query", {2, 3, 10}}, {"key", {2, 5, 10}}, {"value", {2, 5, 10}}, {"w_q", {10, 24}}, {"w_k", {10, 12}}, {"w_v", {10, 14}},
        {"w_o", {28, 9}}, {"b_q", {24}}, {"b_k", {12}}, {"b_v", {14}}, {"b_o", {9}}, {"mask", {2, 4, 3, 5}}, {"grad_output", {2, 3, 9}}};
    const auto inputs = g::input_layout(s);
    BOOST_TEST_REQUIRE(inputs.size() == want_inputs.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        BOOST_TEST(std::string(attnref::generator::role_name(inputs[i].role)) == want_inputs[i].first);
        BOOST_TEST(inputs[i].shape == want_inputs[i].second, want_inputs[i].first);
    }
    BOOST_TEST(g::output_shape(s) == (V{2, 3, 9}));
    BOOST_TEST(g::weights_shape(s) == (V{2, 4, 3, 5}));
    BOOST_TEST(g::lse_shape(s) == (V{2, 4, 3}));
    const auto grads = g::gradient_layout(s);
    BOOST_TEST_REQUIRE(grads.size() == 11u);
    for (std::size_t i = 0; i < 11; ++i) {  // the gradient of each of the 11 real-valued inputs, shaped like it
        BOOST_TEST(grads[i].role == "grad_" + want_inputs[i].first);
        BOOST_TEST(grads[i].shape == want_inputs[i].second, grads[i].role);
    }
    // SDPA without biases or gradients: q, k, v per head, no projections, no gradients.
    g::case_spec d;
    d.shapes = {2, 4, 2, 3, 5, 6, 7, 0, 0};
    const auto sdpa = g::input_layout(d);
    BOOST_TEST_REQUIRE(sdpa.size() == 3u);
    BOOST_TEST(sdpa[0].shape == (V{2, 4, 3, 6}));
    BOOST_TEST(sdpa[1].shape == (V{2, 2, 5, 6}));
    BOOST_TEST(sdpa[2].shape == (V{2, 2, 5, 7}));
    BOOST_TEST(g::output_shape(d) == (V{2, 4, 3, 7}));
    BOOST_TEST(g::gradient_layout(d).empty());
    BOOST_TEST((attnref::role_from_name("grad_w_q") == attnref::tensor_role::grad_w_q));
    BOOST_TEST(!attnref::role_from_name("grad_x_q").has_value());
}

BOOST_AUTO_TEST_CASE(regenerates_committed_cases_byte_for_byte_with_1_and_2_threads) {
    scratch s;
    std::vector<std::string> cases{"sdpa_basic", "sdpa_input_bfloat16", "sdpa_empty_rows_nan", "sdpa_combined_conventions",
                                   "sdpa_adv_logit_offset_1000", "mha_bias_gqa"};
    // The seed example (21 M multiply-adds in MPFI, twice) only in the optimised build: under the
    // sanitizers it takes a minute and exercises the same code paths as mha_bias_gqa.
#if !defined(ATTNREF_SANITIZE_BUILD)
    cases.push_back("mha_seed_example");
#endif
    std::string selection;
    for (const std::string& c : cases) selection += " --case " + c;
    for (const char* threads : {"1", "2"}) {
        const fs::path out = s.dir / (std::string("t") + threads);
        const outcome r = run_attnref("generate --quiet --suite " + suite + selection + " --out " + out.string() + " --threads " + threads);
        BOOST_TEST_REQUIRE(r.code == 0, r.err);
        for (const std::string& c : cases) BOOST_TEST(same_directory_files(out / c, golden / c), c << " with " << threads << " thread(s)");
    }
}

BOOST_AUTO_TEST_CASE(existing_case_that_differs_is_not_overwritten_without_force) {
    scratch s;
    const std::string adhoc = "generate --quiet --name tiny --heads 2 --kv-heads 1 --sq 4 --sk 6 --dk 4 --causal bottom_right --seed 3 --out " + s.dir.string();
    BOOST_TEST_REQUIRE(run_attnref(adhoc).code == 0);
    const fs::path output = s.dir / "tiny" / "output.npy";
    const std::string original = read_file(output);
    const auto written = fs::last_write_time(output);
    // Identical content: left untouched.
    BOOST_TEST(run_attnref(adhoc).code == 0);
    BOOST_TEST((fs::last_write_time(output) == written));
    // Changed content: exit 2, one line naming the case, the file untouched.
    std::string changed = original;
    changed.back() = static_cast<char>(changed.back() ^ 1);
    write_file(output, changed);
    const outcome r = run_attnref(adhoc);
    BOOST_TEST(r.code == 2);
    BOOST_TEST(line_count(r.err) == 1u, r.err);
    BOOST_TEST(r.err.find("tiny") != std::string::npos);
    BOOST_TEST(r.err.find("--force") != std::string::npos);
    BOOST_TEST(read_file(output) == changed);
    // --verify reports the difference with exit 1 and writes nothing.
    BOOST_TEST(run_attnref(adhoc + " --verify").code == 1);
    BOOST_TEST(read_file(output) == changed);
    // --force restores it.
    BOOST_TEST(run_attnref(adhoc + " --force").code == 0);
    BOOST_TEST(read_file(output) == original);
}

BOOST_AUTO_TEST_CASE(strict_manifest_errors_are_one_line_naming_file_and_field) {
    scratch s;
    fs::copy(golden / "sdpa_gqa", s.dir / "case");
    const fs::path manifest = s.dir / "case" / "manifest.json";
    const std::string text = read_file(manifest);
    auto check = [&](const std::string& edited, const std::string& expected) {
        write_file(manifest, edited);
        const outcome r = run_attnref("run --golden " + (s.dir / "case").string() + " --arith float64 --out " + (s.dir / "out").string());
        BOOST_TEST(r.code == 2, expected);
        BOOST_TEST(line_count(r.err) == 1u, r.err);
        BOOST_TEST(r.err.find(expected) != std::string::npos, r.err);
        BOOST_TEST((r.err.find("manifest.json") != std::string::npos || expected.find(".npy") != std::string::npos), r.err);
    };
    auto replace = [&](const std::string& from, const std::string& to) {
        std::string t = text;
        const std::size_t pos = t.find(from);
        BOOST_TEST_REQUIRE(pos != std::string::npos, from);
        t.replace(pos, from.size(), to);
        return t;
    };
    check(replace("\"heads\": 4,", ""), "field 'shapes.heads': missing");
    check(replace("\"schema_version\": 2", "\"schema_version\": 3"), "field 'schema_version': expected 1 or 2, got 3");
    check(replace("\"heads\": 4,", "\"heads\": -4,"), "field 'shapes.heads': expected a positive integer");
    check(replace("\"causal\": false,", "\"causal\": false, \"colour\": 1,"), "field 'conventions.colour': unknown field");
    check(text.substr(0, text.size() / 2), "not valid JSON");
    // Found by fuzz/manifest.fuzz.cpp: a number no double holds made nlohmann::json throw
    // out_of_range (not parse_error), which escaped the parser as a foreign exception.
    check(replace("\"scale\": null,", "\"scale\": 1e400,"), "not valid JSON: number overflow parsing '1e400'");
    BOOST_CHECK_THROW(attnref::golden::parse_manifest(replace("\"scale\": null,", "\"scale\": -1e999,"), "m.json"),
                      attnref::golden::data_error);
    BOOST_CHECK_THROW(attnref::golden::parse_suite(R"({"schema": "attnref.suite", "schema_version": 1e400, "cases": []})", "s.json"),
                      attnref::golden::data_error);
    // A tensor whose bytes do not match its sha256.
    write_file(manifest, text);
    const fs::path key = s.dir / "case" / "key.npy";
    std::string bytes = read_file(key);
    bytes.back() = static_cast<char>(bytes.back() ^ 1);
    write_file(key, bytes);
    check(text, "key.npy: sha256");
}

BOOST_AUTO_TEST_CASE(run_float64_is_within_a_few_ulps_of_the_certified_reference) {
    scratch s;
    for (const char* c : {"sdpa_basic", "sdpa_causal_bottom_right_sq_gt_sk", "mha_bias_gqa"}) {
        const outcome r = run_attnref("run --golden " + (golden / c).string() + " --arith float64 --out " + (s.dir / c).string());
        BOOST_TEST_REQUIRE(r.code == 0, r.err);
        for (const char* t : {"output.npy", "weights.npy", "lse.npy"}) {
            const std::vector<double> ref = attnref::npy::to_double(attnref::npy::read(golden / c / t));
            const std::vector<double> got = attnref::npy::to_double(attnref::npy::read(s.dir / c / t));
            BOOST_TEST_REQUIRE(ref.size() == got.size());
            double worst = 0, scale = 0;
            for (std::size_t n = 0; n < ref.size(); ++n) {
                if (std::isinf(ref[n])) {
                    BOOST_TEST(got[n] == ref[n]);
                    continue;
                }
                worst = std::max(worst, std::abs(got[n] - ref[n]));
                scale = std::max(scale, std::abs(ref[n]));
            }
            BOOST_TEST(worst <= 64 * 0x1p-52 * std::max(scale, 1.0), c << "/" << t << ": max |diff| " << worst);
        }
    }
    BOOST_TEST(run_attnref("run --golden " + (golden / "sdpa_basic").string() + " --arith nonsense --out " + s.dir.string()).code == 2);
}
