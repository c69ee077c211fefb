/// `attnref check`: gates a candidate implementation's outputs against a golden case.
///   attnref check --golden CASE_DIR --output FILE.npy [--weights FILE.npy] [--lse FILE.npy]
///                 [--dtype float64|float32|float16|bfloat16] [--tolerance data-aware|worst-case|assert-close|ulp|baseline]
///                 [--json FILE] [--junit FILE] [--cache-dir DIR | --no-cache] [--verbose]
/// The candidate dtype defaults to the output .npy's descr ('<f8', '<f4', '<f2'; '<u2' = bfloat16 bit
/// patterns). bfloat16 may also come as '<f4' values with --dtype bfloat16. Exit 0 pass, 1 fail or
/// untrustworthy, 2 usage or data error. Tolerance models: include/attnref/tolerance.hpp.
/// --weights: invariants (rows sum to 1, masked weights 0, 0 ≤ P ≤ 1, with --lse consistency) and an
/// element-by-element comparison with the golden weights (tolerance::weights_bound); --lse: compared
/// with the golden lse.

#include <array>
#include <bit>
#include <cstdio>
#include <cstdlib>
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

// ---------------------------------------------------------------------------------------------
// Bound cache. The data-aware and worst-case bounds need the case's per-element terms (variances and
// magnitudes per head output, and their propagation through W_o), which cost
// O(B·H·Sq·Sk·(dk + dv) + B·S·E·(H·dk) + B·Sq·H·dv·E_out) to compute; the bounds are a
// pure function of the case (pinned by its manifest.json, which pins every tensor by sha256), the
// candidate format, the model and the derivation (tolerance.hpp's sha256), so they are computed once
// and stored as
//     <cache dir>/<sha256 of the key text>.npy
// a '<f8' vector of 16 + N values: [0] the layout version, [1..8] the sha256 of the key text as
// eight 32-bit integers, [9] N, [10..15] 0, then the N bounds. An entry is used only when it parses,
// has exactly that shape, and its version, key and N match; anything else (truncated, corrupt,
// another key, another size, a negative bound) is ignored, recomputed and rewritten atomically
// (npy::write). Failing to write the cache never fails the check.

constexpr std::size_t cache_preamble = 16;
constexpr double cache_version = 3;  // bump when this layout changes
#ifndef ATTNREF_TOLERANCE_SHA256
#define ATTNREF_TOLERANCE_SHA256 "unknown"
#endif

std::string cache_key_text(const std::string& manifest_sha256, tol::candidate_format f, tol::tolerance_model m) {
    // The derivation's own text is part of the key (verify/CMakeLists.txt): bounds cached by a build
    // with another tolerance.hpp are never used.
    return fmt::format("attnref check bound cache v{}\ntolerance.hpp sha256 {}\nmanifest.json sha256 {}\nformat {}\nmodel {}\n",
                       cache_version, ATTNREF_TOLERANCE_SHA256, manifest_sha256, tol::format_name(f), tol::model_name(m));
}

std::array<double, 8> digest_words(const std::string& hex) {
    std::array<double, 8> w{};
    for (std::size_t i = 0; i < 8; ++i) w[i] = static_cast<double>(std::stoul(hex.substr(8 * i, 8), nullptr, 16));
    return w;
}

/// The cached bounds, or nullopt with the reason in `why` ("" when the file does not exist).
std::optional<std::vector<double>> load_cached_bounds(const fs::path& file, const std::string& digest, std::size_t n,
                                                      std::string& why) {
    std::error_code ec;
    if (!fs::exists(file, ec)) return std::nullopt;
    npy::array a;
    try {
        a = npy::read(file);
    } catch (const npy::error& e) {
        why = e.what();
        return std::nullopt;
    }
    if (a.descr != "<f8" || a.shape != std::vector<std::size_t>{cache_preamble + n}) {
        why = "expected '<f8' of shape (" + std::to_string(cache_preamble + n) + ",), got '" + a.descr + "' " + shape_text(a.shape);
        return std::nullopt;
    }
    std::vector<double> v = npy::to_double(a);
    const std::array<double, 8> key = digest_words(digest);
    if (v[0] != cache_version || !std::equal(key.begin(), key.end(), v.begin() + 1) || v[9] != static_cast<double>(n)) {
        why = "stored key does not match";
        return std::nullopt;
    }
    for (std::size_t i = 10; i < cache_preamble; ++i)
        if (v[i] != 0) {
            why = "stored key does not match";
            return std::nullopt;
        }
    if (std::any_of(v.begin() + cache_preamble, v.end(), [](double b) { return b < 0; })) {
        why = "negative bound";
        return std::nullopt;
    }
    v.erase(v.begin(), v.begin() + cache_preamble);
    return v;
}

/// Stores the bounds; returns "" or why it could not.
std::string store_cached_bounds(const fs::path& file, const std::string& digest, const std::vector<double>& bounds) {
    std::vector<double> v(cache_preamble, 0.0);
    v[0] = cache_version;
    const std::array<double, 8> key = digest_words(digest);
    std::copy(key.begin(), key.end(), v.begin() + 1);
    v[9] = static_cast<double>(bounds.size());
    v.insert(v.end(), bounds.begin(), bounds.end());
    try {
        std::error_code ec;
        fs::create_directories(file.parent_path(), ec);
        if (ec) return file.parent_path().string() + ": " + ec.message();
        npy::write(file, npy::make_array("<f8", {v.size()}, v));
    } catch (const npy::error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

std::optional<fs::path> default_cache_dir() {
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    if (xdg && *xdg && fs::path(xdg).is_absolute()) return fs::path(xdg) / "attnref";
    const char* home = std::getenv("HOME");
    if (home && *home) return fs::path(home) / ".cache" / "attnref";
    return std::nullopt;
}

namespace {
/// The output's report for a finished comparison: "pass" or "FAIL", then zero-trust.
tensor_report judged(const tol::comparison& cmp, std::span<const double> candidate, std::span<const double> expected,
                     std::size_t row_length) {
    tensor_report out{"output", cmp, cmp.ok() ? "pass" : "FAIL", {}};
    if (auto why = tol::untrustworthy(candidate, row_length, expected)) {
        out.verdict = "untrustworthy";
        out.note = std::string(*why);
    }
    return out;
}
}  // namespace

tensor_report judge_output(std::span<const double> candidate, std::span<const double> expected, tol::candidate_format f,
                           std::span<const double> bounds, std::size_t row_length) {
    if (candidate.size() != expected.size() || bounds.size() != expected.size())
        throw data_error(fmt::format("output: {} candidate values, {} reference values, {} bounds", candidate.size(),
                                     expected.size(), bounds.size()));
    return judged(tol::compare(candidate, expected, f, [&](std::size_t n) { return bounds[n]; }), candidate, expected, row_length);
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
    const case_views views = views_of(spec, lc.data);
    std::optional<std::vector<double>> golden_p;  // the golden weights, read (or computed) once when needed
    auto golden_weights = [&]() -> const std::vector<double>& {
        if (!golden_p) golden_p = reference_weights(dir, lc);
        return *golden_p;
    };

    const std::vector<std::size_t> oshape = output_shape(spec);
    if (rq.model == tol::tolerance_model::data_aware || rq.model == tol::tolerance_model::worst_case) {
        std::optional<std::vector<double>> cached;
        std::string digest;
        if (rq.cache_dir) {
            const std::string key = cache_key_text(sha256_file(dir / "manifest.json"), *format, rq.model);
            digest = sha256_hex(std::as_bytes(std::span(key.data(), key.size())));
            res.cache_file = *rq.cache_dir / (digest + ".npy");
            std::string why;
            cached = load_cached_bounds(res.cache_file, digest, expected.size(), why);
            res.cache_status = cached ? "hit" : why.empty() ? "miss" : "rejected: " + why;
        }
        std::vector<double> bounds;
        if (cached) {
            bounds = std::move(*cached);
        } else {
            const std::vector<double>& p = golden_weights();
            bounds = rq.model == tol::tolerance_model::data_aware ? tol::element_bounds(data_aware_scales_for(spec, lc.data, p), *format)
                                                                  : tol::element_bounds(worst_case_scales_for(spec, lc.data, p), *format);
            if (rq.cache_dir)
                if (std::string why = store_cached_bounds(res.cache_file, digest, bounds); !why.empty())
                    res.cache_status = "unwritable: " + why;
        }
        res.tensors.push_back(judge_output(candidate, expected, *format, bounds, oshape.back()));
    } else {
        if (candidate.size() != expected.size())
            throw data_error((dir / out_entry->file).string() + ": holds " + std::to_string(expected.size()) + " values, the output shape " +
                             shape_text(oshape) + " needs " + std::to_string(candidate.size()));
        const tol::comparison cmp =
            rq.model == tol::tolerance_model::assert_close ? tol::compare_assert_close(candidate, expected, *format)
            : rq.model == tol::tolerance_model::ulp        ? tol::compare_ulp(candidate, expected, *format)
                                                           : tol::compare_baseline(candidate, expected, naive_output(spec, lc.data, *format), *format);
        res.tensors.push_back(judged(cmp, candidate, expected, oshape.back()));
    }

    // Invariants on the weights and lse the candidate returned.
    invariant_context ctx{views.o.mask, spec.conventions.empty_rows};
    std::vector<double> w_cand, l_cand;
    double weights_u = u;  // unit roundoff of the format the candidate's weights come in
    std::optional<tol::data_aware_scales> scales;  // for the weights and lse bounds, computed once when needed
    auto case_scales = [&]() -> const tol::data_aware_scales& {
        if (!scales) scales = data_aware_scales_for(spec, lc.data, golden_weights());
        return *scales;
    };
    const extents_t<4> wext{d.batch, d.heads, d.query_length, d.key_length};
    if (!rq.weights.empty()) {
        std::optional<tol::candidate_format> wf = rq.dtype ? rq.dtype : std::nullopt;
        w_cand = read_candidate(rq.weights, weights_shape(spec), wf);
        weights_u = tol::unit_roundoff(*wf);
        tensor_view<const double, 4> p{w_cand.data(), wext};
        res.invariants.push_back(rows_sum_to_one(p, ctx, weights_u));
        res.invariants.push_back(masked_weights_are_zero(p, ctx));
        res.invariants.push_back(weights_in_unit_interval(p, ctx));
        // Against the golden weights, element by element (tolerance::weights_bound; any model).
        if (find_entry(lc.m, "weights")) {
            tensor_report wr{"weights", {}, {}, {}};
            wr.cmp = tol::compare_weights(w_cand, golden_weights(), *format, *wf, case_scales());
            wr.verdict = wr.cmp.ok() ? "pass" : "FAIL";
            res.tensors.push_back(wr);
        }
    }
    if (!rq.lse.empty()) {
        std::optional<tol::candidate_format> lf = rq.dtype ? rq.dtype : std::nullopt;
        l_cand = read_candidate(rq.lse, lse_shape(spec), lf);
        if (!w_cand.empty()) {
            // P = exp(S − lse) with the exact S: the candidate's own logits are within the row's
            // data-aware logit bound ε of it (tolerance::data_aware_scales::logit_epsilon), and its
            // weights may be stored in a narrower format than its output.
            const std::vector<double> eps = case_scales().logit_bounds(u, tol::accumulate_roundoff(*format));
            const tensor<double, 4> logits = exact_logits(views);
            res.invariants.push_back(weights_match_lse(tensor_view<const double, 4>{w_cand.data(), wext}, logits.view(),
                                                       tensor_view<const double, 3>{l_cand.data(), {d.batch, d.heads, d.query_length}},
                                                       ctx, std::max(u, weights_u), eps));
        }
        // lse against the reference (tolerance::lse_bound).
        if (const tensor_entry* t = find_entry(lc.m, "lse")) {
            const std::vector<double> le = read_reference(dir, *t);
            tensor_report lr{"lse", {}, {}, {}};
            lr.cmp = tol::compare_lse(l_cand, le, *format, *lf, case_scales());
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
        std::string golden, output, weights, lse, dtype, tolerance = "data-aware", json, junit, cache_dir;
        bool no_cache = false, verbose = false, force = false;
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
    c->add_option("--json", a->json, "also write the report as JSON");
    c->add_option("--junit", a->junit, "also write the report as JUnit XML");
    c->add_option("--cache-dir", a->cache_dir,
                  "cache of the data-aware bounds, keyed by the manifest's sha256, format and model "
                  "(default: $XDG_CACHE_HOME/attnref or ~/.cache/attnref)");
    c->add_flag("--no-cache", a->no_cache, "neither read nor write the bound cache");
    c->add_flag("--verbose", a->verbose, "print what the cache did (stderr)");
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
        if (!a->no_cache) rq.cache_dir = a->cache_dir.empty() ? default_cache_dir() : std::optional<fs::path>(a->cache_dir);
        const check_result r = run_check(rq);
        if (a->verbose)
            std::fprintf(stderr, "attnref check: bound cache: %s%s\n", r.cache_status.empty() ? "not used" : r.cache_status.c_str(),
                         r.cache_file.empty() ? "" : (" (" + r.cache_file.string() + ")").c_str());
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
        if (!r.passed)
            throw check_failure("check failed for case " + r.case_name + " (" + a->output + ")" +
                                (report_error.empty() ? "" : "; a report could not be written"));
        if (!report_error.empty()) throw data_error(report_error);
    });
}

}  // namespace attnref::verify
