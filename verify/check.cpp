/// `attnref check`: gates a candidate implementation's outputs against a golden case.
///   attnref check --golden CASE_DIR --output FILE.npy [--weights FILE.npy] [--lse FILE.npy]
///                 [--dtype float64|float32|float16|bfloat16] [--tolerance data-aware|worst-case|assert-close|ulp|baseline]
///                 [--empty-row-lse -inf|+inf|any] [--json FILE] [--junit FILE]
/// The candidate dtype defaults to the output .npy's descr ('<f8', '<f4', '<f2'; '<u2' = bfloat16 bit
/// patterns). bfloat16 may also come as '<f4' values with --dtype bfloat16. Exit 0 PASS, 1 FAIL or
/// INCONCLUSIVE (a vacuous bound, an untrustworthy output), 2 usage or data error. Tolerance models: include/attnref/tolerance.hpp.
/// --weights: invariants (rows sum to 1, masked weights 0, 0 ≤ P ≤ 1, with --lse consistency) and an
/// element-by-element comparison with the golden weights (tolerance::weights_bound); --lse: compared
/// with the golden lse.

#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <sys/mman.h>
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
#include "safe_io.hpp"
#include "sha256.hpp"

namespace attnref::verify {

namespace fs = std::filesystem;
namespace tol = attnref::tolerance;

namespace {

std::string shape_text(const std::vector<std::size_t>& s) {
    std::string r = "(";
    for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + (s.size() == 1 ? ",)" : ")");
}

void advise_huge_pages([[maybe_unused]] void* p, [[maybe_unused]] std::size_t bytes) {
#ifdef MADV_HUGEPAGE
    const std::uintptr_t page = 4096, begin = (reinterpret_cast<std::uintptr_t>(p) + page - 1) & ~(page - 1),
                         end = (reinterpret_cast<std::uintptr_t>(p) + bytes) & ~(page - 1);
    if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);  // a hint: failure is harmless
#endif
}

/// The hot path for '<f8' and '<f4' candidates: the header is read and checked exactly as
/// npy::parse checks it (same magic, version, length, terminator, printable-ASCII and dict rules,
/// npy::detail::header_parser itself), then the data block is fread straight into the result — a
/// '<f4' block into the upper half of the doubles' storage and widened in place, front to back
/// (double n ends at byte 8n + 8 ≤ 4N + 4n + 4, where float n ends). One buffer, touched once.
/// Returns nullopt whenever anything is not plainly valid: the caller then takes the strict
/// npy::read path, which accepts or rejects it with its one-line message.
std::optional<std::vector<double>> read_in_place(const std::string& file, const std::vector<std::size_t>& shape,
                                                 std::string& descr) {
    if constexpr (std::endian::native != std::endian::little) return std::nullopt;
    std::error_code ec;
    if (!fs::is_regular_file(file, ec)) return std::nullopt;
    const std::uintmax_t size = fs::file_size(file, ec);
    if (ec) return std::nullopt;
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(file.c_str(), "rb"), &std::fclose);
    if (!f) return std::nullopt;
    unsigned char pre[12];
    if (size < 12 || std::fread(pre, 1, 12, f.get()) != 12 || std::memcmp(pre, "\x93NUMPY", 6) != 0) return std::nullopt;
    const unsigned major = pre[6];
    if (major < 1 || major > 3 || pre[7] != 0) return std::nullopt;
    const std::size_t preamble = major == 1 ? 10 : 12;
    const std::uint64_t header_length = major == 1 ? pre[8] | std::uint64_t{pre[9]} << 8
                                                   : pre[8] | std::uint64_t{pre[9]} << 8 | std::uint64_t{pre[10]} << 16 | std::uint64_t{pre[11]} << 24;
    if (header_length > npy::detail::max_header_length || header_length > size - preamble || header_length == 0) return std::nullopt;
    std::string header(header_length, '\0');
    if (std::fseek(f.get(), static_cast<long>(preamble), SEEK_SET) != 0 ||
        std::fread(header.data(), 1, header.size(), f.get()) != header.size() || header.back() != '\n')
        return std::nullopt;
    std::string_view h(header);
    h.remove_suffix(1);
    while (!h.empty() && h.back() == ' ') h.remove_suffix(1);
    for (char ch : h) {
        const auto c = static_cast<unsigned char>(ch);
        if (!((c >= 0x20 && c < 0x7f) || c == '\t')) return std::nullopt;
    }
    npy::array a;
    try {
        a = npy::detail::header_parser(h, file).parse();
    } catch (const npy::error&) {
        return std::nullopt;
    }
    if ((a.descr != "<f8" && a.descr != "<f4") || a.shape != shape) return std::nullopt;
    const std::optional<std::size_t> count = npy::detail::element_count(a.shape);
    const std::size_t item = a.descr == "<f8" ? 8 : 4;
    if (!count || *count > std::numeric_limits<std::size_t>::max() / 8) return std::nullopt;
    if (size - preamble - header_length != *count * item) return std::nullopt;
    std::vector<double> r;
    r.reserve(*count);  // allocated, not yet touched: ask for transparent huge pages (first-touch
    advise_huge_pages(r.data(), *count * 8);  // page faults dominate reading into fresh memory)
    r.resize(*count);
    std::byte* bytes = reinterpret_cast<std::byte*>(r.data());
    std::byte* block = item == 8 ? bytes : bytes + 4 * *count;
    if (std::fread(block, 1, *count * item, f.get()) != *count * item || std::fgetc(f.get()) != EOF) return std::nullopt;
    if (item == 4) {
        for (std::size_t n = 0; n < *count; ++n) {
            float v;
            std::memcpy(&v, block + 4 * n, 4);
            r[n] = static_cast<double>(v);
        }
    }
    descr = a.descr;
    return r;
}

}  // namespace

/// Reads a candidate .npy as doubles; '<u2' is decoded as bfloat16 bit patterns.
std::vector<double> read_candidate(const std::string& file, const std::vector<std::size_t>& shape,
                                   std::optional<tol::candidate_format>& format) {
    // Regular files only (a FIFO or device would block or stream forever), and nothing is allocated
    // before the header has been checked against `shape` and the file's size.
    require_regular_file(file, "candidate file");
    std::string fast_descr;
    if (std::optional<std::vector<double>> r = read_in_place(file, shape, fast_descr)) {
        const auto from_descr = fast_descr == "<f8" ? tol::candidate_format::float64 : tol::candidate_format::float32;
        if (!format) format = from_descr;
        return std::move(*r);
    }
    npy::array a;
    try {
        a = npy::read(file, npy::expectation{{"<f8", "<f4", "<f2", "<u2"}, shape});
    } catch (const npy::error& e) {
        throw data_error(e.what());
    }
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

namespace {

const tensor_entry* find_entry(const manifest& m, const std::string& role) {
    for (const tensor_entry& t : m.tensors)
        if (t.role == role && !t.target) return &t;
    return nullptr;
}

/// A golden tensor, whose manifest entry's dtype and shape parse_manifest has checked against the
/// case's shapes: the file must be a regular file inside the case with exactly that header.
std::vector<double> read_reference(const fs::path& dir, const tensor_entry& t) {
    require_regular_file(dir / t.file, "golden tensor", dir);
    try {
        return npy::to_double(npy::read(dir / t.file, npy::expectation{{t.dtype}, t.shape}));
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

namespace {
std::string vacuity_note(const tol::vacuity& v, std::size_t elements, const char* scale_name) {
    return fmt::format("bound vacuous on {} of {} elements (first at {}: bound {:.3g} {} {} {:.3g}); a pass would prove nothing",
                       v.elements, elements, v.index, v.bound, std::isfinite(v.bound) && v.bound >= 0 ? ">=" : "is not a finite bound;",
                       scale_name, v.scale);
}

/// A tensor's report for a finished comparison and its bounds' vacuity (see judge_output).
tensor_report judged(std::string name, const tol::comparison& cmp, const tol::vacuity& vac, const char* scale_name) {
    tensor_report out{std::move(name), cmp, "pass", {}, vac};
    if (!cmp.ok()) {
        out.verdict = "FAIL";
        out.note = fmt::format("{} of {} elements outside the bound", cmp.violations, cmp.elements);
    } else if (vac.any()) {
        out.verdict = "INCONCLUSIVE";
        out.note = vacuity_note(vac, cmp.elements, scale_name);
    }
    return out;
}
tensor_report judged_output(const tol::comparison& cmp, const tol::vacuity& vac, std::span<const double> candidate,
                            std::span<const double> expected, std::size_t row_length, const decoy* passing = nullptr) {
    tensor_report out = judged("output", cmp, vac, "row scale max|expected|");
    if (out.verdict == "pass" && passing) {
        out.verdict = "INCONCLUSIVE";
        out.note = "the bound admits a trivially wrong output (" + passing->name + "); a pass would prove nothing";
    }
    if (out.verdict == "pass")
        if (auto why = tol::untrustworthy(candidate, row_length, expected)) {
            out.verdict = "untrustworthy";
            out.note = std::string(*why);
        }
    return out;
}
}  // namespace

const decoy* passing_decoy(std::span<const decoy> decoys, std::span<const double> expected, tol::candidate_format f,
                           std::span<const double> bounds, std::size_t row_length) {
    const std::size_t n = expected.size(), row = row_length > 0 && n % row_length == 0 ? row_length : std::max<std::size_t>(n, 1);
    for (const decoy& d : decoys) {
        if (d.output.size() != n) continue;
        if (!tol::compare(d.output, expected, f, [&](std::size_t e) { return bounds[e]; }, std::nullopt, 1).ok()) continue;
        bool visible = false;  // off by ≥ decoy_significance of the row's scale somewhere
        for (std::size_t begin = 0; begin < n && !visible; begin += row) {
            double scale = 0;
            for (std::size_t e = begin; e < begin + row; ++e)
                if (std::isfinite(expected[e])) scale = std::max(scale, std::fabs(expected[e]));
            for (std::size_t e = begin; e < begin + row && !visible; ++e)
                visible = std::isfinite(expected[e]) && std::fabs(d.output[e] - expected[e]) >= decoy_significance * scale && scale > 0;
        }
        if (visible) return &d;
    }
    return nullptr;
}

tensor_report judge_output(std::span<const double> candidate, std::span<const double> expected, tol::candidate_format f,
                           std::span<const double> bounds, std::size_t row_length, std::span<const decoy> decoys) {
    if (candidate.size() != expected.size() || bounds.size() != expected.size())
        throw data_error(fmt::format("output: {} candidate values, {} reference values, {} bounds", candidate.size(),
                                     expected.size(), bounds.size()));
    return judged_output(tol::compare(candidate, expected, f, [&](std::size_t n) { return bounds[n]; }),
                         tol::find_vacuous(expected, row_length, bounds), candidate, expected, row_length,
                         passing_decoy(decoys, expected, f, bounds, row_length));
}

void decide(check_result& r) {
    r.overall = verdict::pass;
    r.reason.clear();
    auto note = [&](verdict v, const std::string& why) {
        if (v == verdict::fail && r.overall != verdict::fail) r.overall = verdict::fail, r.reason = why;
        else if (v == verdict::inconclusive && r.overall == verdict::pass) r.overall = verdict::inconclusive, r.reason = why;
    };
    for (const tensor_report& t : r.tensors) {
        if (t.verdict == "FAIL") note(verdict::fail, t.name + ": " + t.note);
        else if (t.verdict == "untrustworthy") note(verdict::inconclusive, t.name + " untrustworthy: " + t.note);
        else if (t.verdict != "pass") note(verdict::inconclusive, t.name + ": " + t.note);
    }
    for (const invariant_report& i : r.invariants) {
        if (!i.ok)
            note(verdict::fail, fmt::format("invariant '{}': {} of {} violated (worst {:.3g}, bound {:.3g})", i.name, i.violations,
                                            i.checked, i.worst, i.bound));
        else if (i.vacuous)
            note(verdict::inconclusive, fmt::format("invariant '{}': its bound is vacuous (as large as the quantity it bounds, or not "
                                                    "finite); a pass would prove nothing",
                                                    i.name));
    }
    r.passed = r.overall == verdict::pass;
}

namespace {
/// A loaded case's inputs as the library's views: q, k, v (B, H, S, d) for SDPA cases, x_q, x_k,
/// x_v (B, S, E) and the projections for multi-head ones.
struct case_views {
    const case_spec* spec;
    attention_options o;
    tensor_view<const double, 4> q, k, v;
    tensor_view<const double, 3> x_q, x_k, x_v;
    mha_parameters<double> w;
    mha_options mo;
    bool sdpa() const { return spec->kind == case_kind::sdpa; }
    tensor_view<const double, 4> weights(const std::vector<double>& p) const {
        const case_shapes& d = spec->shapes;
        return {p.data(), {d.batch, d.heads, d.query_length, d.key_length}};
    }
};

case_views views_of(const case_spec& spec, const case_data& data) {
    const case_shapes& d = spec.shapes;
    case_views c{&spec, options_for(spec, data, 0, softmax_algorithm::shifted_division, 64), {}, {}, {}, {}, {}, {}, {}, {}};
    if (c.sdpa()) {
        c.q = {data.query.data(), {d.batch, d.heads, d.query_length, d.head_dim_qk}};
        c.k = {data.key.data(), {d.batch, d.kv_heads, d.key_length, d.head_dim_qk}};
        c.v = {data.value.data(), {d.batch, d.kv_heads, d.key_length, d.head_dim_v}};
        return c;
    }
    c.x_q = {data.query.data(), {d.batch, d.query_length, d.model_dim}};
    c.x_k = {data.key.data(), {d.batch, d.key_length, d.model_dim}};
    c.x_v = {data.value.data(), {d.batch, d.key_length, d.model_dim}};
    c.w.w_q = {data.w_q.data(), {d.model_dim, d.heads * d.head_dim_qk}};
    c.w.w_k = {data.w_k.data(), {d.model_dim, d.kv_heads * d.head_dim_qk}};
    c.w.w_v = {data.w_v.data(), {d.model_dim, d.kv_heads * d.head_dim_v}};
    c.w.w_o = {data.w_o.data(), {d.heads * d.head_dim_v, d.output_dim}};
    if (spec.conventions.projection_bias) {
        c.w.b_q = {data.b_q.data(), {data.b_q.size()}};
        c.w.b_k = {data.b_k.data(), {data.b_k.size()}};
        c.w.b_v = {data.b_v.data(), {data.b_v.size()}};
        c.w.b_o = {data.b_o.data(), {data.b_o.size()}};
    }
    c.mo.heads = d.heads;
    c.mo.kv_heads = d.kv_heads;
    c.mo.attention = c.o;
    return c;
}

/// The case's exact logits S (B, H, Sq, Sk), in double.
tensor<double, 4> exact_logits(const case_views& c) {
    using pol = uniform_precision<double>;
    return c.sdpa() ? attention_logits<pol>(c.q, c.k, c.o) : mha_logits<pol>(c.x_q, c.x_k, c.w, c.mo);
}
}  // namespace

tol::data_aware_scales data_aware_scales_for(const case_spec& spec, const case_data& data, const std::vector<double>& weights) {
    const case_views c = views_of(spec, data);
    return c.sdpa() ? tol::sdpa_scales(c.q, c.k, c.v, c.weights(weights), c.o)
                    : tol::mha_scales(c.x_q, c.x_k, c.x_v, c.w, c.weights(weights), c.mo);
}

tol::worst_case_scales worst_case_scales_for(const case_spec& spec, const case_data& data, const std::vector<double>& weights) {
    const case_views c = views_of(spec, data);
    return c.sdpa() ? tol::sdpa_worst_case_scales(c.q, c.k, c.v, c.weights(weights), c.o)
                    : tol::mha_worst_case_scales(c.x_q, c.x_k, c.x_v, c.w, c.weights(weights), c.mo);
}

std::vector<double> reference_weights(const fs::path& dir, const loaded_case& lc) {
    if (const tensor_entry* t = find_entry(lc.m, "weights")) return read_reference(dir, *t);
    case_spec s = lc.m.spec;  // not stored: attnref in double (σ only needs a few correct digits)
    s.outputs.weights = true;
    s.outputs.lse = false;
    const auto r = compute_case<uniform_precision<double>>(s, lc.data, 0);
    return std::vector<double>(r.weights.data(), r.weights.data() + r.weights.size());
}

std::vector<decoy> decoy_outputs(const case_spec& spec, const case_data& data) {
    auto run = [&](const case_spec& s, const case_data& d) {
        case_spec t = s;
        t.outputs.weights = t.outputs.lse = false;
        const auto r = compute_case<uniform_precision<double>>(t, d, 0);
        return std::vector<double>(r.output.data(), r.output.data() + r.output.size());
    };
    std::vector<decoy> r;
    {
        case_spec s = spec;
        case_data d = data;
        if (s.kind == case_kind::sdpa) std::fill(d.query.begin(), d.query.end(), 0.0);
        else std::fill(d.w_q.begin(), d.w_q.end(), 0.0), std::fill(d.b_q.begin(), d.b_q.end(), 0.0);
        s.conventions.alibi_slopes.clear();
        for (double& x : d.additive_mask)
            if (std::isfinite(x)) x = 0;
        r.push_back({"uniform weights: the mean of V", run(s, d)});
    }
    const double scale = spec.conventions.scale ? *spec.conventions.scale : 1 / std::sqrt(static_cast<double>(spec.shapes.head_dim_qk));
    for (const double c : {2.0, 0.5}) {
        case_spec s = spec;
        s.conventions.scale = scale * c;
        r.push_back({fmt::format("the softmax with the scale x{}", c), run(s, data)});
    }
    return r;
}

namespace {
/// judge_output, computing the case's decoys only where they can change the verdict (a pass or an
/// untrustworthy output: FAIL and INCONCLUSIVE stand whatever the decoys do).
tensor_report judge_with_decoys(std::span<const double> candidate, std::span<const double> expected, tol::candidate_format f,
                                std::span<const double> bounds, std::size_t row, const case_spec& spec, const case_data& data) {
    tensor_report t = judge_output(candidate, expected, f, bounds, row);
    if (t.verdict != "pass" && t.verdict != "untrustworthy") return t;
    return judge_output(candidate, expected, f, bounds, row, decoy_outputs(spec, data));
}
}  // namespace

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
    const double u = tol::unit_roundoff(*format), u_acc = tol::accumulate_roundoff(*format);
    const case_views views = views_of(spec, lc.data);
    std::optional<std::vector<double>> golden_p;  // the golden weights, read (or computed) once when needed
    auto golden_weights = [&]() -> const std::vector<double>& {
        if (!golden_p) golden_p = reference_weights(dir, lc);
        return *golden_p;
    };
    // The data-aware terms (for the default model and the weights and lse bounds), computed once
    // when needed. Nothing is cached between runs: every bound that decides a verdict is computed
    // here from the golden case (whose files load_case checked against the manifest's sha256).
    std::optional<tol::data_aware_scales> scales;
    auto case_scales = [&]() -> const tol::data_aware_scales& {
        if (!scales) scales = data_aware_scales_for(spec, lc.data, golden_weights());
        return *scales;
    };

    const std::vector<std::size_t> oshape = output_shape(spec);
    const std::size_t row = oshape.back();
    if (rq.model == tol::tolerance_model::data_aware || rq.model == tol::tolerance_model::worst_case) {
        const std::vector<double> bounds = rq.model == tol::tolerance_model::data_aware
                                               ? tol::element_bounds(case_scales(), *format)
                                               : tol::element_bounds(worst_case_scales_for(spec, lc.data, golden_weights()), *format);
        res.tensors.push_back(judge_with_decoys(candidate, expected, *format, bounds, row, spec, lc.data));
    } else {
        if (candidate.size() != expected.size())
            throw data_error((dir / out_entry->file).string() + ": holds " + std::to_string(expected.size()) + " values, the output shape " +
                             shape_text(oshape) + " needs " + std::to_string(candidate.size()));
        if (rq.model == tol::tolerance_model::ulp) {
            // A bound in ULPs of the candidate's format: the values' own resolution, never vacuous.
            res.tensors.push_back(judged_output(tol::compare_ulp(candidate, expected, *format), {}, candidate, expected, row));
        } else {
            std::vector<double> bounds(expected.size());
            if (rq.model == tol::tolerance_model::assert_close) {
                const tol::rtol_atol t = tol::assert_close_defaults(*format);
                for (std::size_t n = 0; n < bounds.size(); ++n) bounds[n] = t.atol + t.rtol * std::fabs(expected[n]);
            } else {
                std::fill(bounds.begin(), bounds.end(), tol::baseline_bound(expected, naive_output(spec, lc.data, *format), *format));
            }
            res.tensors.push_back(judge_with_decoys(candidate, expected, *format, bounds, row, spec, lc.data));
        }
    }

    // Invariants on the weights and lse the candidate returned.
    invariant_context ctx{views.o.mask, spec.conventions.empty_rows, rq.empty_lse};
    std::vector<double> w_cand, l_cand;
    std::optional<tol::candidate_format> wf;  // the format the candidate's weights come in
    const extents_t<4> wext{d.batch, d.heads, d.query_length, d.key_length};
    if (!rq.weights.empty()) {
        wf = rq.dtype;
        w_cand = read_candidate(rq.weights, weights_shape(spec), wf);
        tensor_view<const double, 4> p{w_cand.data(), wext};
        // Computed with the candidate's accumulation, stored in the weights' format; a weight in the
        // subnormal range of either is rounded with an absolute error of half its subnormal spacing.
        const double u_w = tol::unit_roundoff(*wf);
        const double eta = half_subnormal_spacing(u_acc, tol::weights_floor(*format)) + half_subnormal_spacing(u_w, tol::weights_floor(*wf));
        res.invariants.push_back(rows_sum_to_one(p, ctx, u_acc, u_w, eta));
        res.invariants.push_back(masked_weights_are_zero(p, ctx));
        res.invariants.push_back(weights_in_unit_interval(p, ctx));
        // Against the golden weights, element by element (tolerance::weights_bound; any model).
        if (find_entry(lc.m, "weights")) {
            const std::vector<double>& pe = golden_weights();
            const auto bound_at = tol::weights_bound_at(pe, *format, *wf, case_scales());
            res.tensors.push_back(judged("weights", tol::compare(w_cand, pe, *wf, bound_at), tol::find_vacuous(pe, d.key_length, bound_at),
                                         "row scale max p"));
        }
    }
    if (!rq.lse.empty()) {
        std::optional<tol::candidate_format> lf = rq.dtype;
        l_cand = read_candidate(rq.lse, lse_shape(spec), lf);
        if (!w_cand.empty()) {
            // P = exp(S − lse) with the exact S: the candidate's own logits are within the row's
            // data-aware logit bound ε of it (tolerance::data_aware_scales::logit_epsilon), and its
            // weights may be stored in a narrower format than its output. The softmax runs in the
            // candidate's accumulation (u_acc); P and lse are rounded once more to their storage
            // formats. Weights below the smallest normal of the formats P is computed and stored in
            // may be flushed or rounded to it.
            const std::vector<double> eps = case_scales().logit_bounds(u, u_acc);
            const tensor<double, 4> logits = exact_logits(views);
            res.invariants.push_back(weights_match_lse(tensor_view<const double, 4>{w_cand.data(), wext}, logits.view(),
                                                       tensor_view<const double, 3>{l_cand.data(), {d.batch, d.heads, d.query_length}},
                                                       ctx, u_acc, eps, std::max(tol::weights_floor(*format), tol::weights_floor(*wf)),
                                                       tol::unit_roundoff(*wf), tol::unit_roundoff(*lf)));
        }
        // lse against the reference (tolerance::lse_bound). Empty rows are pinned by the candidate's
        // declared convention (--empty-row-lse), not by the golden −inf.
        if (const tensor_entry* t = find_entry(lc.m, "lse")) {
            const std::vector<double> le = read_reference(dir, *t);
            std::vector<double> lc_cmp = l_cand;
            std::size_t wrong_empty = 0;
            for (std::size_t b = 0; b < d.batch; ++b)
                for (std::size_t h = 0; h < d.heads; ++h)
                    for (std::size_t i = 0; i < d.query_length; ++i) {
                        if (!attnref::detail::row_is_empty(ctx.mask, b, h, i, d.query_length, d.key_length)) continue;
                        const std::size_t at = (b * d.heads + h) * d.query_length + i;
                        if (empty_row_lse_ok(rq.empty_lse, l_cand[at])) lc_cmp[at] = le[at];
                        else ++wrong_empty;
                    }
            const auto bound_at = tol::lse_bound_at(le, *format, *lf, case_scales());
            tensor_report lr = judged("lse", tol::compare(lc_cmp, le, *lf, bound_at), tol::find_vacuous(le, 1, bound_at, tol::lse_vacuity_scale),
                                      "ln 2 (the normaliser e^lse off by 2x)");
            if (wrong_empty) lr.note += (lr.note.empty() ? "" : "; ") + fmt::format("{} empty rows without the declared lse", wrong_empty);
            res.tensors.push_back(lr);
        }
    }
    decide(res);
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
        if (colour)
            verdict = fmt::format(fmt::fg(t.verdict == "pass" ? fmt::color::green : t.verdict == "FAIL" ? fmt::color::red : fmt::color::orange),
                                  "{}", t.verdict);
        s += fmt::format("{:<8} {:>11.3e} {:>11.3e} {:>9.3g} {:>11.3e} {:>11.3g} {:>10} {:>11.4g} vs {:<9.4g} {:>6} ({:>5.1f}%)  {}{}\n",
                         t.name, c.max_abs, c.max_rel, c.max_ulp, c.rms, c.worst_ratio, c.worst_index, c.worst_candidate,
                         c.worst_expected, c.violations, pct, verdict, t.note.empty() ? "" : " (" + t.note + ")");
    }
    for (const invariant_report& i : r.invariants)
        s += fmt::format("invariant {:<36} checked {:>8}  violations {:>6}  worst {:.3e} (bound {:.3e})  {}\n", i.name, i.checked,
                         i.violations, i.worst, i.bound, !i.ok ? "FAIL" : i.vacuous ? "INCONCLUSIVE (vacuous bound)" : "pass");
    s += r.overall == verdict::pass ? std::string("PASS\n") : fmt::format("{}: {}\n", verdict_name(r.overall), r.reason);
    return s;
}

std::string report_json(const check_result& r) {
    nlohmann::ordered_json j;
    j["case"] = r.case_name;
    j["candidate_dtype"] = tol::format_name(r.format);
    j["tolerance"] = tol::model_name(r.model);
    j["verdict"] = verdict_name(r.overall);  // PASS, FAIL or INCONCLUSIVE (exit 0, 1, 1)
    j["reason"] = r.reason;
    j["passed"] = r.passed;
    auto num = [](double x) -> nlohmann::ordered_json { return std::isfinite(x) ? nlohmann::ordered_json(x) : nlohmann::ordered_json(fmt::format("{}", x)); };
    for (const tensor_report& t : r.tensors) {
        const tol::comparison& c = t.cmp;
        j["tensors"].push_back({{"name", t.name}, {"elements", c.elements}, {"max_abs_error", num(c.max_abs)},
                                {"max_rel_error", num(c.max_rel)}, {"max_ulp", num(c.max_ulp)}, {"rms", num(c.rms)},
                                {"worst_in_bound_units", num(c.worst_ratio)}, {"worst_index", c.worst_index},
                                {"worst_candidate", num(c.worst_candidate)}, {"worst_expected", num(c.worst_expected)},
                                {"worst_bound", num(c.worst_bound)}, {"violations", c.violations},
                                {"nonfinite_mismatches", c.nonfinite_mismatches}, {"vacuous_bounds", t.vacuous.elements},
                                {"verdict", t.verdict}, {"note", t.note}});
    }
    j["invariants"] = nlohmann::ordered_json::array();
    for (const invariant_report& i : r.invariants)
        j["invariants"].push_back({{"name", i.name}, {"ok", i.ok}, {"vacuous_bound", i.vacuous}, {"checked", i.checked},
                                   {"violations", i.violations}, {"worst", num(i.worst)}, {"bound", num(i.bound)}});
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
    // A test case that is not a pass is a <failure>; its type says which verdict: FAIL, or
    // INCONCLUSIVE (a vacuous bound, an untrustworthy output) — neither may let CI go green.
    auto add = [&](const std::string& name, const std::string& type, const std::string& detail) {
        cases += fmt::format("    <testcase classname=\"attnref.check.{}\" name=\"{}\">\n", xml_escape(r.case_name), xml_escape(name));
        if (!type.empty()) {
            ++failures;
            cases += fmt::format("      <failure type=\"{}\" message=\"{}\">{}</failure>\n", type, xml_escape(detail), xml_escape(detail));
        }
        cases += fmt::format("      <system-out>{}</system-out>\n    </testcase>\n", xml_escape(detail));
    };
    for (const tensor_report& t : r.tensors) {
        const tol::comparison& c = t.cmp;
        add(t.name + " (" + std::string(tol::model_name(r.model)) + ")",
            t.verdict == "pass" ? "" : t.verdict == "FAIL" ? "FAIL" : "INCONCLUSIVE",
            fmt::format("{}: max abs {:.3e}, max rel {:.3e}, max ULP {:.3g}, RMS {:.3e}, worst {:.3g} bounds at {} ({:.6g} vs {:.6g}), "
                        "{} violations of {}{}",
                        t.verdict, c.max_abs, c.max_rel, c.max_ulp, c.rms, c.worst_ratio, c.worst_index, c.worst_candidate,
                        c.worst_expected, c.violations, c.elements, t.note.empty() ? "" : "; " + t.note));
    }
    for (const invariant_report& i : r.invariants)
        add(i.name, !i.ok ? "FAIL" : i.vacuous ? "INCONCLUSIVE" : "",
            fmt::format("{} checked, {} violations, worst {:.3e} (bound {:.3e}){}", i.checked, i.violations, i.worst, i.bound,
                        i.ok && i.vacuous ? "; the bound is vacuous: a pass proves nothing" : ""));
    const std::size_t tests = r.tensors.size() + r.invariants.size();
    return fmt::format("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites tests=\"{0}\" failures=\"{1}\">\n"
                       "  <testsuite name=\"attnref check {2}\" tests=\"{0}\" failures=\"{1}\">\n"
                       "    <properties><property name=\"verdict\" value=\"{4}\"/><property name=\"reason\" value=\"{5}\"/></properties>\n"
                       "{3}  </testsuite>\n</testsuites>\n",
                       tests, failures, xml_escape(r.case_name), cases, verdict_name(r.overall), xml_escape(r.reason));
}

namespace {
/// Reports are written atomically (temporary file + rename/link); an existing file only with --force.
void write_text(const std::string& file, const std::string& text, bool force) { write_file_atomic(file, text, force); }

/// Refuses report paths that would lose a file: --json and --junit naming the same file, a report
/// over an input (the candidate's files, anything in the golden case, the case directory itself),
/// and an existing file without --force. Checked before the check runs (exit 2).
void check_report_paths(const std::string& golden, const std::vector<std::string>& inputs, const std::string& json,
                        const std::string& junit, bool force) {
    if (!json.empty() && !junit.empty() && (json == junit || same_file(json, junit)))
        throw data_error("command line: --json and --junit: the same file '" + json + "' for both reports");
    std::error_code ec;
    for (const auto& [flag, path] : {std::pair<const char*, const std::string&>{"--json", json}, {"--junit", junit}}) {
        if (path.empty()) continue;
        const fs::path p(path);
        for (const std::string& in : inputs)
            if (!in.empty() && (p == fs::path(in) || same_file(p, in)))
                throw data_error("command line: " + std::string(flag) + ": '" + path + "' is an input of this check; refused");
        const fs::path parent = p.parent_path().empty() ? fs::path(".") : p.parent_path();
        if (same_file(parent, golden) || same_file(p, golden))
            throw data_error("command line: " + std::string(flag) + ": '" + path + "' is inside the golden case " + golden + "; refused");
        if (fs::exists(fs::symlink_status(p, ec)) && !force)
            throw data_error("command line: " + std::string(flag) + ": '" + path + "' exists; not overwritten (use --force)");
    }
}
}  // namespace

void register_check(CLI::App& app) {
    struct args {
        std::string golden, output, weights, lse, dtype, tolerance = "data-aware", json, junit, empty_lse = "-inf";
        bool force = false;
        std::string max_memory;
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
        ->check(CLI::IsMember({"data-aware", "worst-case", "assert-close", "ulp", "baseline"}))
        ->capture_default_str();
    c->add_option("--empty-row-lse", a->empty_lse,
                  "the lse the candidate writes for fully masked rows: -inf (attnref, PyTorch, FlashAttention split-KV), "
                  "+inf (FlashAttention 2/3) or any")
        ->check(CLI::IsMember({"-inf", "+inf", "any"}))
        ->capture_default_str();
    c->add_option("--json", a->json, "also write the report as JSON");
    c->add_option("--junit", a->junit, "also write the report as JUnit XML");
    c->add_flag("--force", a->force, "overwrite existing --json/--junit files (never an input)");
    c->add_option("--max-memory", a->max_memory, "refuse cases estimated to need more memory (bytes, K/M/G/T suffix; default 4G)");
    c->callback([a] {
        check_request rq;
        rq.golden = a->golden;
        rq.output = a->output;
        rq.weights = a->weights;
        rq.lse = a->lse;
        if (!a->dtype.empty()) rq.dtype = tol::format_from_name(a->dtype);
        if (!a->max_memory.empty()) set_max_memory(parse_memory_size(a->max_memory, "--max-memory"));
        check_report_paths(a->golden, {a->output, a->weights, a->lse}, a->json, a->junit, a->force);
        rq.model = *tol::model_from_name(a->tolerance);
        rq.empty_lse = a->empty_lse == "+inf" ? empty_row_lse::plus_inf : a->empty_lse == "any" ? empty_row_lse::any : empty_row_lse::minus_inf;
        const check_result r = run_check(rq);
        std::fputs(report_table(r, ::isatty(fileno(stdout)) != 0).c_str(), stdout);
        std::fflush(stdout);
        // The verdict survives a failure to write a report: each failure is reported on its own line
        // and the exit code stays 1 for a failed check (2 only when the check passed).
        std::string report_error;
        for (const auto& [path, text] : {std::pair<const std::string&, std::string>{a->json, a->json.empty() ? "" : report_json(r)},
                                         {a->junit, a->junit.empty() ? "" : report_junit(r)}}) {
            if (path.empty()) continue;
            try {
                write_text(path, text, a->force);
            } catch (const data_error& e) {
                std::fprintf(stderr, "%s\n", printable(e.what()).c_str());
                if (report_error.empty()) report_error = e.what();
            }
        }
        if (r.overall != verdict::pass)
            throw check_failure(fmt::format("check {} for case {} ({}): {}{}", r.overall == verdict::fail ? "failed" : "inconclusive",
                                            r.case_name, a->output, r.reason,
                                            report_error.empty() ? "" : "; a report could not be written"));
        if (!report_error.empty()) throw data_error(report_error);
    });
}

}  // namespace attnref::verify
