/// `attnref check`: gates a candidate implementation's outputs against a golden case.
///   attnref check --golden CASE_DIR --output FILE.npy [--weights FILE.npy] [--lse FILE.npy]
///                 [--dtype float64|float32|float16|bfloat16] [--tolerance data-aware|assert-close|ulp|baseline]
///                 [--json FILE] [--junit FILE]
/// The candidate dtype defaults to the output .npy's descr ('<f8', '<f4', '<f2'; '<u2' = bfloat16 bit
/// patterns). bfloat16 may also come as '<f4' values with --dtype bfloat16. Exit 0 pass, 1 fail or
/// untrustworthy, 2 usage or data error. Tolerance models: include/attnref/tolerance.hpp.

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <unistd.h>

#include <fmt/color.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "attnref/formats.hpp"
#include "attnref/invariants.hpp"
#include "attnref/npy.hpp"
#include "attnref/tolerance.hpp"
#include "check.hpp"
#include "commands.hpp"
#include "compute.hpp"
#include "golden_case.hpp"

namespace attnref::verify {

namespace fs = std::filesystem;
namespace tol = attnref::tolerance;

namespace {

std::string shape_text(const std::vector<std::size_t>& s) {
    std::string r = "(";
    for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + (s.size() == 1 ? ",)" : ")");
}

/// Reads a candidate .npy as doubles; '<u2' is decoded as bfloat16 bit patterns.
std::vector<double> read_candidate(const std::string& file, const std::vector<std::size_t>& shape,
                                   std::optional<tol::candidate_format>& format) {
    npy::array a;
    try {
        a = npy::read(file);
    } catch (const npy::error& e) {
        throw data_error(e.what());
    }
    if (a.shape != shape)
        throw data_error(file + ": header field 'shape': expected " + shape_text(shape) + ", got " + shape_text(a.shape));
    std::optional<tol::candidate_format> from_descr;
    if (a.descr == "<f8") from_descr = tol::candidate_format::float64;
    else if (a.descr == "<f4") from_descr = tol::candidate_format::float32;
    else if (a.descr == "<f2") from_descr = tol::candidate_format::float16;
    else if (a.descr == "<u2") from_descr = tol::candidate_format::bfloat16;
    else throw data_error(file + ": header field 'descr': expected '<f8', '<f4', '<f2' or '<u2' (bfloat16 bits), got '" + a.descr + "'");
    if (!format) format = from_descr;
    if (a.descr == "<u2") {
        if (*format != tol::candidate_format::bfloat16)
            throw data_error(file + ": header field 'descr': '<u2' holds bfloat16 bit patterns, but --dtype is " +
                             std::string(tol::format_name(*format)));
        std::vector<double> r;
        for (std::uint16_t b : npy::to_vector<std::uint16_t>(a)) r.push_back(static_cast<double>(formats::bfloat16::from_bits(b)));
        return r;
    }
    return npy::to_double(a);
}

const tensor_entry* find_entry(const manifest& m, const std::string& role) {
    for (const tensor_entry& t : m.tensors)
        if (t.role == role && !t.target) return &t;
    return nullptr;
}

std::vector<double> read_reference(const fs::path& dir, const tensor_entry& t) {
    try {
        return npy::to_double(npy::read(dir / t.file));
    } catch (const npy::error& e) {
        throw data_error(e.what());
    }
}

/// attnref's own straightforward implementation in the candidate's precision (baseline model).
std::vector<double> naive_output(const case_spec& spec, const case_data& data, tol::candidate_format f) {
    auto flat = [](const auto& t) {
        std::vector<double> r(t.size());
        for (std::size_t n = 0; n < t.size(); ++n) r[n] = static_cast<double>(t[n]);
        return r;
    };
    case_spec s = spec;
    s.outputs.weights = s.outputs.lse = false;
    switch (f) {
        case tol::candidate_format::float64: return flat(compute_case<uniform_precision<double>>(s, data, 0).output);
        case tol::candidate_format::float32: return flat(compute_case<uniform_precision<float>>(s, data, 0).output);
        case tol::candidate_format::bfloat16:
            return flat(compute_case<precision_policy<formats::bfloat16, float, formats::bfloat16, formats::bfloat16>>(s, data, 0).output);
        case tol::candidate_format::float16:
            return flat(compute_case<precision_policy<formats::float16, float, formats::float16, formats::float16>>(s, data, 0).output);
    }
    return {};
}

}  // namespace

tol::data_aware_scales data_aware_scales_for(const case_spec& spec, const case_data& data, const std::vector<double>& weights) {
    const case_shapes& d = spec.shapes;
    const attention_options o = options_for(spec, data, 0, softmax_algorithm::shifted_division, 64);
    tensor_view<const double, 4> p{weights.data(), {d.batch, d.heads, d.query_length, d.key_length}};
    if (spec.kind == case_kind::sdpa) {
        return tol::sdpa_scales({data.query.data(), {d.batch, d.heads, d.query_length, d.head_dim_qk}},
                                {data.key.data(), {d.batch, d.kv_heads, d.key_length, d.head_dim_qk}},
                                {data.value.data(), {d.batch, d.kv_heads, d.key_length, d.head_dim_v}}, p, o);
    }
    mha_parameters<double> w;
    w.w_q = {data.w_q.data(), {d.model_dim, d.heads * d.head_dim_qk}};
    w.w_k = {data.w_k.data(), {d.model_dim, d.kv_heads * d.head_dim_qk}};
    w.w_v = {data.w_v.data(), {d.model_dim, d.kv_heads * d.head_dim_v}};
    w.w_o = {data.w_o.data(), {d.heads * d.head_dim_v, d.output_dim}};
    if (spec.conventions.projection_bias) {
        w.b_q = {data.b_q.data(), {data.b_q.size()}};
        w.b_k = {data.b_k.data(), {data.b_k.size()}};
        w.b_v = {data.b_v.data(), {data.b_v.size()}};
        w.b_o = {data.b_o.data(), {data.b_o.size()}};
    }
    mha_options mo;
    mo.heads = d.heads;
    mo.kv_heads = d.kv_heads;
    mo.attention = o;
    return tol::mha_scales({data.query.data(), {d.batch, d.query_length, d.model_dim}},
                           {data.key.data(), {d.batch, d.key_length, d.model_dim}},
                           {data.value.data(), {d.batch, d.key_length, d.model_dim}}, w, p, mo);
}

std::vector<double> reference_weights(const fs::path& dir, const loaded_case& lc) {
    if (const tensor_entry* t = find_entry(lc.m, "weights")) return read_reference(dir, *t);
    case_spec s = lc.m.spec;  // not stored: attnref in double (σ only needs a few correct digits)
    s.outputs.weights = true;
    s.outputs.lse = false;
    const auto r = compute_case<uniform_precision<double>>(s, lc.data, 0);
    return std::vector<double>(r.weights.data(), r.weights.data() + r.weights.size());
}

check_result run_check(const check_request& rq) {
    const fs::path dir = rq.golden;
    const loaded_case lc = load_case(dir);
    const case_spec& spec = lc.m.spec;
    const case_shapes& d = spec.shapes;
    check_result res;
    res.case_name = spec.name;
    std::optional<tol::candidate_format> format = rq.dtype;
    const tensor_entry* out_entry = find_entry(lc.m, "output");
    if (!out_entry) throw data_error((dir / "manifest.json").string() + ": field 'tensors': no tensor with role 'output'");
    const std::vector<double> expected = read_reference(dir, *out_entry);
    const std::vector<double> candidate = read_candidate(rq.output, output_shape(spec), format);
    res.format = *format;
    res.model = rq.model;
    const double u = tol::unit_roundoff(*format);

    tensor_report out{"output", {}, {}, {}};
    switch (rq.model) {
        case tol::tolerance_model::data_aware:
            out.cmp = tol::compare_data_aware(candidate, expected, *format, data_aware_scales_for(spec, lc.data, reference_weights(dir, lc)));
            break;
        case tol::tolerance_model::assert_close: out.cmp = tol::compare_assert_close(candidate, expected, *format); break;
        case tol::tolerance_model::ulp: out.cmp = tol::compare_ulp(candidate, expected, *format); break;
        case tol::tolerance_model::baseline:
            out.cmp = tol::compare_baseline(candidate, expected, naive_output(spec, lc.data, *format), *format);
            break;
    }
    out.verdict = out.cmp.ok() ? "pass" : "FAIL";
    const std::vector<std::size_t> oshape = output_shape(spec);
    if (auto why = tol::untrustworthy(candidate, oshape.back())) {
        out.verdict = "untrustworthy";
        out.note = std::string(*why);
    }
    res.tensors.push_back(out);

    // Invariants on the weights and lse the candidate returned.
    const attention_options o = options_for(spec, lc.data, 0, softmax_algorithm::shifted_division, 64);
    invariant_context ctx{o.mask, spec.conventions.empty_rows};
    std::vector<double> w_cand, l_cand;
    const extents_t<4> wext{d.batch, d.heads, d.query_length, d.key_length};
    if (!rq.weights.empty()) {
        std::optional<tol::candidate_format> wf = rq.dtype ? rq.dtype : std::nullopt;
        w_cand = read_candidate(rq.weights, weights_shape(spec), wf);
        const double wu = tol::unit_roundoff(*wf);
        tensor_view<const double, 4> p{w_cand.data(), wext};
        res.invariants.push_back(rows_sum_to_one(p, ctx, wu));
        res.invariants.push_back(masked_weights_are_zero(p, ctx));
        res.invariants.push_back(weights_in_unit_interval(p, ctx));
    }
    if (!rq.lse.empty()) {
        std::optional<tol::candidate_format> lf = rq.dtype ? rq.dtype : std::nullopt;
        l_cand = read_candidate(rq.lse, lse_shape(spec), lf);
        if (!w_cand.empty() && spec.kind == case_kind::sdpa) {
            const tensor<double, 4> logits = attention_logits<uniform_precision<double>>(
                tensor_view<const double, 4>{lc.data.query.data(), {d.batch, d.heads, d.query_length, d.head_dim_qk}},
                tensor_view<const double, 4>{lc.data.key.data(), {d.batch, d.kv_heads, d.key_length, d.head_dim_qk}}, o);
            // The candidate's logits differ from the exact ones by ≤ γ_{dk+4}·|s||q|ᵀ|k|: widen u accordingly.
            const double lu = std::max(u, tol::gamma_for_logits(d.head_dim_qk, u));
            res.invariants.push_back(weights_match_lse(tensor_view<const double, 4>{w_cand.data(), wext}, logits.view(),
                                                       tensor_view<const double, 3>{l_cand.data(), {d.batch, d.heads, d.query_length}},
                                                       ctx, lu));
        }
        // lse against the reference: |Δlse| ≤ γ_{dk+4}·L + (n + 3)u, checked as assert_close-style with that atol.
        if (const tensor_entry* t = find_entry(lc.m, "lse")) {
            const std::vector<double> le = read_reference(dir, *t);
            tensor_report lr{"lse", {}, {}, {}};
            const double atol = (static_cast<double>(d.key_length) + 3) * u + 1e-300;
            lr.cmp = tol::compare(l_cand, le, *format, [&](std::size_t n) {
                return atol + 4 * tol::gamma_for_logits(d.head_dim_qk + 2 * d.model_dim, u) * (1 + std::abs(le[n]));
            });
            lr.verdict = lr.cmp.ok() ? "pass" : "FAIL";
            res.tensors.push_back(lr);
        }
    }
    res.passed = true;
    for (const tensor_report& t : res.tensors) res.passed = res.passed && t.verdict == "pass";
    for (const invariant_report& r : res.invariants) res.passed = res.passed && r.ok;
    return res;
}

std::string report_table(const check_result& r, bool colour) {
    std::string s = fmt::format("case {}  candidate {}  model {}\n", r.case_name, tol::format_name(r.format), tol::model_name(r.model));
    s += fmt::format("{:<8} {:>11} {:>11} {:>9} {:>11} {:>11} {:>10} {:>24} {:>14}  {}\n", "tensor", "max abs", "max rel", "max ULP",
                     "RMS", "worst/bound", "worst idx", "candidate vs expected", "violations", "verdict");
    for (const tensor_report& t : r.tensors) {
        const tol::comparison& c = t.cmp;
        const double pct = c.elements ? 100.0 * static_cast<double>(c.violations) / static_cast<double>(c.elements) : 0;
        std::string verdict = t.verdict;
        if (colour) verdict = fmt::format(fmt::fg(t.verdict == "pass" ? fmt::color::green : fmt::color::red), "{}", t.verdict);
        s += fmt::format("{:<8} {:>11.3e} {:>11.3e} {:>9.3g} {:>11.3e} {:>11.3g} {:>10} {:>11.4g} vs {:<9.4g} {:>6} ({:>5.1f}%)  {}{}\n",
                         t.name, c.max_abs, c.max_rel, c.max_ulp, c.rms, c.worst_ratio, c.worst_index, c.worst_candidate,
                         c.worst_expected, c.violations, pct, verdict, t.note.empty() ? "" : " (" + t.note + ")");
    }
    for (const invariant_report& i : r.invariants)
        s += fmt::format("invariant {:<36} checked {:>8}  violations {:>6}  worst {:.3e} (bound {:.3e})  {}\n", i.name, i.checked,
                         i.violations, i.worst, i.bound, i.ok ? "pass" : "FAIL");
    s += fmt::format("{}\n", r.passed ? "PASS" : "FAIL");
    return s;
}

std::string report_json(const check_result& r) {
    nlohmann::ordered_json j;
    j["case"] = r.case_name;
    j["candidate_dtype"] = tol::format_name(r.format);
    j["tolerance"] = tol::model_name(r.model);
    j["passed"] = r.passed;
    auto num = [](double x) -> nlohmann::ordered_json { return std::isfinite(x) ? nlohmann::ordered_json(x) : nlohmann::ordered_json(fmt::format("{}", x)); };
    for (const tensor_report& t : r.tensors) {
        const tol::comparison& c = t.cmp;
        j["tensors"].push_back({{"name", t.name}, {"elements", c.elements}, {"max_abs_error", num(c.max_abs)},
                                {"max_rel_error", num(c.max_rel)}, {"max_ulp", num(c.max_ulp)}, {"rms", num(c.rms)},
                                {"worst_in_bound_units", num(c.worst_ratio)}, {"worst_index", c.worst_index},
                                {"worst_candidate", num(c.worst_candidate)}, {"worst_expected", num(c.worst_expected)},
                                {"worst_bound", num(c.worst_bound)}, {"violations", c.violations},
                                {"nonfinite_mismatches", c.nonfinite_mismatches}, {"verdict", t.verdict}, {"note", t.note}});
    }
    j["invariants"] = nlohmann::ordered_json::array();
    for (const invariant_report& i : r.invariants)
        j["invariants"].push_back({{"name", i.name}, {"ok", i.ok}, {"checked", i.checked}, {"violations", i.violations},
                                   {"worst", num(i.worst)}, {"bound", num(i.bound)}});
    return j.dump(2) + "\n";
}

namespace {
std::string xml_escape(const std::string& s) {
    std::string r;
    for (char c : s) {
        switch (c) {
            case '<': r += "&lt;"; break;
            case '>': r += "&gt;"; break;
            case '&': r += "&amp;"; break;
            case '"': r += "&quot;"; break;
            default: r += c;
        }
    }
    return r;
}
}  // namespace

std::string report_junit(const check_result& r) {
    std::size_t failures = 0;
    std::string cases;
    auto add = [&](const std::string& name, bool ok, const std::string& detail) {
        cases += fmt::format("    <testcase classname=\"attnref.check.{}\" name=\"{}\">\n", xml_escape(r.case_name), xml_escape(name));
        if (!ok) {
            ++failures;
            cases += fmt::format("      <failure message=\"{}\">{}</failure>\n", xml_escape(detail), xml_escape(detail));
        }
        cases += fmt::format("      <system-out>{}</system-out>\n    </testcase>\n", xml_escape(detail));
    };
    for (const tensor_report& t : r.tensors) {
        const tol::comparison& c = t.cmp;
        add(t.name + " (" + std::string(tol::model_name(r.model)) + ")", t.verdict == "pass",
            fmt::format("{}: max abs {:.3e}, max rel {:.3e}, max ULP {:.3g}, RMS {:.3e}, worst {:.3g} bounds at {} ({:.6g} vs {:.6g}), "
                        "{} violations of {}{}",
                        t.verdict, c.max_abs, c.max_rel, c.max_ulp, c.rms, c.worst_ratio, c.worst_index, c.worst_candidate,
                        c.worst_expected, c.violations, c.elements, t.note.empty() ? "" : "; " + t.note));
    }
    for (const invariant_report& i : r.invariants)
        add(i.name, i.ok, fmt::format("{} checked, {} violations, worst {:.3e} (bound {:.3e})", i.checked, i.violations, i.worst, i.bound));
    const std::size_t tests = r.tensors.size() + r.invariants.size();
    return fmt::format("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites tests=\"{0}\" failures=\"{1}\">\n"
                       "  <testsuite name=\"attnref check {2}\" tests=\"{0}\" failures=\"{1}\">\n{3}  </testsuite>\n</testsuites>\n",
                       tests, failures, xml_escape(r.case_name), cases);
}

namespace {
void write_text(const std::string& file, const std::string& text) {
    std::ofstream f(file, std::ios::binary);
    f << text;
    if (!f.flush()) throw data_error(file + ": cannot write");
}
}  // namespace

void register_check(CLI::App& app) {
    struct args {
        std::string golden, output, weights, lse, dtype, tolerance = "data-aware", json, junit;
    };
    auto a = std::make_shared<args>();
    CLI::App* c = app.add_subcommand("check", "Gate an implementation's outputs (.npy) against a golden case");
    c->add_option("--golden", a->golden, "golden case directory")->required();
    c->add_option("--output", a->output, "candidate output .npy")->required();
    c->add_option("--weights", a->weights, "candidate attention weights P .npy (invariants)");
    c->add_option("--lse", a->lse, "candidate log-sum-exp .npy (invariants)");
    c->add_option("--dtype", a->dtype, "candidate precision (default: from the .npy; '<u2' = bfloat16 bits)")
        ->check(CLI::IsMember({"float64", "float32", "float16", "bfloat16"}));
    c->add_option("--tolerance", a->tolerance, "tolerance model")
        ->check(CLI::IsMember({"data-aware", "assert-close", "ulp", "baseline"}))
        ->capture_default_str();
    c->add_option("--json", a->json, "also write the report as JSON");
    c->add_option("--junit", a->junit, "also write the report as JUnit XML");
    c->callback([a] {
        check_request rq;
        rq.golden = a->golden;
        rq.output = a->output;
        rq.weights = a->weights;
        rq.lse = a->lse;
        if (!a->dtype.empty()) rq.dtype = tol::format_from_name(a->dtype);
        rq.model = *tol::model_from_name(a->tolerance);
        const check_result r = run_check(rq);
        std::fputs(report_table(r, ::isatty(fileno(stdout)) != 0).c_str(), stdout);
        std::fflush(stdout);
        if (!a->json.empty()) write_text(a->json, report_json(r));
        if (!a->junit.empty()) write_text(a->junit, report_junit(r));
        if (!r.passed) throw check_failure("check failed for case " + r.case_name + " (" + a->output + ")");
    });
}

}  // namespace attnref::verify
