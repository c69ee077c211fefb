#pragma once
/// \file golden/case.hpp
/// One golden case in memory, and the one mapping from a case to attnref's API. Owns:
/// - case_data: a case's inputs as exact doubles, by role; generate_inputs (the generator, no I/O);
/// - masks_of, options_for (the case's conventions as attention_options, problem.hpp options_of) and case_views (its inputs as
///   tensor views: q, k, v for SDPA, x and the projections for MHA) — the only place a case's
///   conventions and inputs become attnref's types; compute_case runs a case under any precision
///   policy through them; empty_rows_of, exact_logits;
/// - load_case (manifest, every file's sha256, tensor headers against the case's shapes, inputs
///   decoded — grad_output too in backward cases; safe_io's rules throughout), load_generated_case
///   (the same checks on a case made in this process, its files kept in memory) and
///   loaded_case::reference (a golden output, weights, lse or gradient tensor, by manifest entry);
/// - case_file / generated_case, compare_case and write_case (atomic, file by file, manifest last).
/// Certification (generate_case) is in golden/generate.hpp, which needs MPFR and MPFI; this header
/// does not. Needs nlohmann_json and OpenSSL's libcrypto (the CMake target attnref::golden).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attnref/core/attention.hpp"
#include "attnref/core/multi_head_attention.hpp"
#include "attnref/core/parallel.hpp"
#include "attnref/io/npy.hpp"
#include "attnref/core/precision.hpp"
#include "attnref/core/problem.hpp"
#include "attnref/core/tensor.hpp"
#include "attnref/golden/manifest.hpp"
#include "attnref/golden/safe_io.hpp"
#include "attnref/golden/sha256.hpp"

namespace attnref::golden {

/// The inputs of one case as exact doubles (values already in the input format), masks as
/// bytes / doubles. Indexed by role; absent roles are empty.
struct case_data {
    std::vector<double> query, key, value;           // sdpa: q, k, v; mha: x_q, x_k, x_v
    std::vector<double> w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o;  // mha only
    std::vector<std::uint8_t> mask;                  // boolean mask, (B, H, Sq, Sk)
    std::vector<double> additive_mask, seed_mask;    // (B, H, Sq, Sk)
    std::vector<double> grad_output;                 // backward cases: dO, shaped like the output

    std::vector<double>* real(generator::role r) {
        using generator::role;
        switch (r) {
            case role::query: return &query;
            case role::key: return &key;
            case role::value: return &value;
            case role::w_q: return &w_q;
            case role::w_k: return &w_k;
            case role::w_v: return &w_v;
            case role::w_o: return &w_o;
            case role::b_q: return &b_q;
            case role::b_k: return &b_k;
            case role::b_v: return &b_v;
            case role::b_o: return &b_o;
            case role::additive_mask: return &additive_mask;
            case role::seed_mask: return &seed_mask;
            case role::grad_output: return &grad_output;
            case role::mask: return nullptr;
        }
        return nullptr;
    }
};

/// Outputs of one computation, flattened in C order.
template <class Policy>
struct case_outputs_of {
    tensor<typename Policy::output_type, 1> output;
    tensor<typename Policy::weights_type, 1> weights;
    tensor<typename Policy::accumulate_type, 1> lse;
};

/// The case's masks as views of `data` (empty where the case has none), (B, H, Sq, Sk) each.
inline problem_masks masks_of(const case_spec& spec, const case_data& data) {
    const extents_t<4> e{spec.shapes.batch, spec.shapes.heads, spec.shapes.query_length, spec.shapes.key_length};
    problem_masks m;
    if (spec.conventions.boolean_mask) m.boolean = {data.mask.data(), e};
    if (spec.conventions.additive_mask) m.additive = {data.additive_mask.data(), e};
    if (spec.conventions.seed_mask) m.seed = {data.seed_mask.data(), e};
    return m;
}

/// Attention options for a case (problem.hpp options_of); spans point into `spec` and `data`,
/// which must outlive the result.
inline attention_options options_for(const case_spec& spec, const case_data& data, std::size_t threads,
                                     softmax_algorithm algorithm, std::size_t block) {
    return options_of(spec.conventions, masks_of(spec, data), {algorithm, block, threads});
}

/// Flags (B, H, Sq): 1 where query row i of head h in batch b has no attendable key. Decided from
/// the mask data alone (causal/window/padding indices, the boolean mask, −inf entries of the
/// additive mask: integers and doubles, never a computed value), so it is exact.
inline std::vector<std::uint8_t> empty_rows_of(const case_spec& spec, const case_data& data) {
    const case_shapes& d = spec.shapes;
    const attention_options o = options_for(spec, data, 1, softmax_algorithm::shifted_division, 64);
    std::vector<std::uint8_t> empty(d.batch * d.heads * d.query_length, 0);
    for (std::size_t b = 0; b < d.batch; ++b)
        for (std::size_t h = 0; h < d.heads; ++h)
            for (std::size_t i = 0; i < d.query_length; ++i) {
                bool any = false;
                for (std::size_t j = 0; j < d.key_length && !any; ++j)
                    any = !structurally_masked(o.mask, b, h, i, j, d.query_length, d.key_length);
                empty[(b * d.heads + h) * d.query_length + i] = any ? 0 : 1;
            }
    return empty;
}

/// A case's inputs converted (rounded) once to Input, with the case's shapes: the one place a
/// computation under a policy (compute_case here, compute_case_gradients in check/checker.hpp) turns
/// case_data into typed inputs. Views point into this object, which must outlive them.
/// A multi-head case's projections as views of its vectors (biases when the case has them), with
/// the role table's shapes.
template <class E>
mha_parameters<E> parameters_of(const case_spec& spec, const std::vector<E>& w_q, const std::vector<E>& w_k, const std::vector<E>& w_v,
                                const std::vector<E>& w_o, const std::vector<E>& b_q, const std::vector<E>& b_k,
                                const std::vector<E>& b_v, const std::vector<E>& b_o) {
    using R = tensor_role;
    mha_parameters<E> p;
    p.w_q = {w_q.data(), extents_of<2>(spec, R::w_q)};
    p.w_k = {w_k.data(), extents_of<2>(spec, R::w_k)};
    p.w_v = {w_v.data(), extents_of<2>(spec, R::w_v)};
    p.w_o = {w_o.data(), extents_of<2>(spec, R::w_o)};
    if (has_role(spec, R::b_q)) {
        p.b_q = {b_q.data(), extents_of<1>(spec, R::b_q)};
        p.b_k = {b_k.data(), extents_of<1>(spec, R::b_k)};
        p.b_v = {b_v.data(), extents_of<1>(spec, R::b_v)};
        p.b_o = {b_o.data(), extents_of<1>(spec, R::b_o)};
    }
    return p;
}

template <class Input>
struct converted_inputs {
    const case_spec& spec;
    std::vector<Input> q, k, v, w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o;

    static std::vector<Input> convert_all(std::span<const double> x) {
        std::vector<Input> r;
        r.reserve(x.size());
        for (double e : x) r.push_back(convert<Input>(e));
        return r;
    }
    converted_inputs(const case_spec& spec, const case_data& data)
        : spec(spec), q(convert_all(data.query)), k(convert_all(data.key)), v(convert_all(data.value)) {
        if (spec.kind == case_kind::sdpa) return;
        w_q = convert_all(data.w_q), w_k = convert_all(data.w_k), w_v = convert_all(data.w_v), w_o = convert_all(data.w_o);
        if (!spec.conventions.projection_bias) return;
        b_q = convert_all(data.b_q), b_k = convert_all(data.b_k), b_v = convert_all(data.b_v), b_o = convert_all(data.b_o);
    }
    // SDPA: q (B, H, Sq, dk), k (B, Hkv, Sk, dk), v (B, Hkv, Sk, dv) (problem.hpp's role table).
    tensor_view<const Input, 4> sdpa_q() const { return {q.data(), extents_of<4>(spec, tensor_role::query)}; }
    tensor_view<const Input, 4> sdpa_k() const { return {k.data(), extents_of<4>(spec, tensor_role::key)}; }
    tensor_view<const Input, 4> sdpa_v() const { return {v.data(), extents_of<4>(spec, tensor_role::value)}; }
    // MHA: x_q (B, Sq, E), x_k and x_v (B, Sk, E), and the projections (biases when present).
    tensor_view<const Input, 3> x_q() const { return {q.data(), extents_of<3>(spec, tensor_role::query)}; }
    tensor_view<const Input, 3> x_k() const { return {k.data(), extents_of<3>(spec, tensor_role::key)}; }
    tensor_view<const Input, 3> x_v() const { return {v.data(), extents_of<3>(spec, tensor_role::value)}; }
    mha_parameters<Input> params() const { return parameters_of<Input>(spec, w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o); }
};

/// Runs the case through attnref's templates under Policy. Inputs are first converted (rounded) to
/// Input, which is double for the reference and the policy's storage type for `attnref run`.
/// `rows` (B, H, Sq flags, empty = all): only those query rows are computed (attention_options::rows).
template <PrecisionPolicy Policy, class Input = typename Policy::storage_type>
case_outputs_of<Policy> compute_case(const case_spec& spec, const case_data& data, std::size_t threads,
                                     softmax_algorithm algorithm = softmax_algorithm::shifted_division,
                                     std::size_t block = 64, std::span<const std::uint8_t> rows = {}) {
    const case_shapes& d = spec.shapes;
    attention_options o = options_for(spec, data, threads, algorithm, block);
    o.rows = rows;
    case_outputs_of<Policy> r;
    std::size_t out_size = 1;
    for (std::size_t e : output_shape(spec)) out_size *= e;
    r.output = tensor<typename Policy::output_type, 1>({out_size});
    if (spec.outputs.weights) r.weights = tensor<typename Policy::weights_type, 1>({d.batch * d.heads * d.query_length * d.key_length});
    if (spec.outputs.lse) r.lse = tensor<typename Policy::accumulate_type, 1>({d.batch * d.heads * d.query_length});
    tensor_view<typename Policy::weights_type, 4> weights{};
    tensor_view<typename Policy::accumulate_type, 3> lse{};
    if (spec.outputs.weights) weights = {r.weights.data(), {d.batch, d.heads, d.query_length, d.key_length}};
    if (spec.outputs.lse) lse = {r.lse.data(), {d.batch, d.heads, d.query_length}};
    const converted_inputs<Input> in(spec, data);
    if (spec.kind == case_kind::sdpa) {
        tensor_view<typename Policy::output_type, 4> out{r.output.data(), {d.batch, d.heads, d.query_length, d.head_dim_v}};
        scaled_dot_product_attention_into<Policy>(in.sdpa_q(), in.sdpa_k(), in.sdpa_v(), o, out, weights, lse);
    } else {
        const mha_options mo = mha_options_of(spec, o);
        tensor_view<typename Policy::output_type, 3> out{r.output.data(), {d.batch, d.query_length, d.output_dim}};
        multi_head_attention_into<Policy>(in.x_q(), in.x_k(), in.x_v(), in.params(), mo, out, weights, lse, tensor_view<typename Policy::storage_type, 4>{});
    }
    return r;
}

/// A case's inputs as the library's views: q, k, v (B, H, S, d) for SDPA cases, x_q, x_k, x_v
/// (B, S, E) and the projections for multi-head ones, with the case's attention_options (and
/// mha_options). The views point into `data` and `spec`, which must outlive them.
struct case_views {
    const case_spec* spec;
    attention_options o;
    tensor_view<const double, 4> q, k, v;
    tensor_view<const double, 3> x_q, x_k, x_v;
    mha_parameters<double> w;
    mha_options mo;
    bool sdpa() const { return spec->kind == case_kind::sdpa; }
    tensor_view<const double, 4> weights(std::span<const double> p) const { return {p.data(), extents_of<4>(*spec, tensor_role::weights)}; }
};

inline case_views views_of(const case_spec& spec, const case_data& data, std::size_t threads = 0) {
    case_views c{&spec, options_for(spec, data, threads, softmax_algorithm::shifted_division, 64), {}, {}, {}, {}, {}, {}, {}, {}};
    using R = tensor_role;
    if (c.sdpa()) {
        c.q = {data.query.data(), extents_of<4>(spec, R::query)};
        c.k = {data.key.data(), extents_of<4>(spec, R::key)};
        c.v = {data.value.data(), extents_of<4>(spec, R::value)};
        return c;
    }
    c.x_q = {data.query.data(), extents_of<3>(spec, R::query)};
    c.x_k = {data.key.data(), extents_of<3>(spec, R::key)};
    c.x_v = {data.value.data(), extents_of<3>(spec, R::value)};
    c.w = parameters_of<double>(spec, data.w_q, data.w_k, data.w_v, data.w_o, data.b_q, data.b_k, data.b_v, data.b_o);
    c.mo = mha_options_of(spec, c.o);
    return c;
}

/// A golden case's problem (the views point into the case's data).
inline forward_problem problem_of(const case_views& c) { return {c.sdpa(), c.q, c.k, c.v, c.x_q, c.x_k, c.x_v, c.w, c.o, c.mo}; }

/// The case's exact logits S (B, H, Sq, Sk), in double.
inline tensor<double, 4> exact_logits(const case_views& c) {
    using pol = uniform_precision<double>;
    return c.sdpa() ? attention_logits<pol>(c.q, c.k, c.o) : mha_logits<pol>(c.x_q, c.x_k, c.w, c.mo);
}

/// The inputs of a case from the generator (no I/O).
inline case_data generate_inputs(const case_spec& spec) {
    case_data d;
    const generator::input_family& f = spec.inputs.family;
    for (const input_tensor_layout& t : input_layout(spec)) {
        std::size_t count = 1;
        for (std::size_t e : t.shape) count *= e;
        switch (t.role) {
            case generator::role::mask: d.mask = generator::generate_boolean_mask(f, spec.inputs.seed, count); break;
            case generator::role::seed_mask: d.seed_mask = generator::generate_seed_mask(f, spec.inputs.seed, count); break;
            case generator::role::additive_mask:
                d.additive_mask = generator::generate_additive_mask(f, spec.inputs.seed, count);
                break;
            default: *d.real(t.role) = generator::generate(f, spec.inputs.seed, t.role, t.shape, spec.inputs.format);
        }
    }
    return d;
}

/// One file of a case directory, fully serialised in memory.
struct case_file {
    std::string name;
    std::vector<std::byte> bytes;
};

/// A generated case: the manifest and the bytes of every file (manifest.json last).
struct generated_case {
    manifest m;
    std::vector<case_file> files;
    double seconds = 0;
    std::size_t certified_elements = 0;
    std::size_t escalated_elements = 0;
};

/// How a directory compares with a generated case.
struct comparison {
    bool exists = false;      ///< the directory exists
    bool identical = false;   ///< every file present with identical bytes
    std::string first_difference;  ///< file name of the first difference (or "missing file.npy")
};

namespace case_detail {
inline bool read_bytes(const std::filesystem::path& p, std::vector<std::byte>& out, std::size_t expected_size) {
    // Only regular files of the expected size are compared byte by byte: anything else differs
    // (and a FIFO or device is never opened).
    std::error_code ec;
    if (!std::filesystem::is_regular_file(p, ec) || std::filesystem::file_size(p, ec) != expected_size || ec) {
        out.clear();
        return std::filesystem::exists(p, ec);
    }
    std::ifstream in(p, std::ios::binary);
    if (!in) return false;
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    out.resize(chars.size());
    if (!chars.empty()) std::memcpy(out.data(), chars.data(), chars.size());
    return !in.bad();
}
}  // namespace case_detail

/// Compares a generated case with the files in `dir`, byte for byte.
ATTNREF_GOLDEN_FN comparison compare_case(const std::filesystem::path& dir, const generated_case& g);
/// Writes the case atomically file by file (write_file_atomic: temporary file + rename), manifest
/// last; removes the .npy files the new manifest no longer lists.
ATTNREF_GOLDEN_FN void write_case(const std::filesystem::path& dir, const generated_case& g);

#if ATTNREF_GOLDEN_BODIES  // golden/compiled.hpp: defined once in attnref::golden_compiled, or inline
ATTNREF_GOLDEN_FN comparison compare_case(const std::filesystem::path& dir, const generated_case& g) {
    comparison c;
    std::error_code ec;
    c.exists = std::filesystem::exists(dir, ec);
    if (!c.exists) return c;
    for (const case_file& f : g.files) {
        std::vector<std::byte> on_disk;
        if (!case_detail::read_bytes(dir / f.name, on_disk, f.bytes.size())) {
            c.first_difference = "missing " + f.name;
            return c;
        }
        if (on_disk != f.bytes) {
            c.first_difference = f.name;
            return c;
        }
    }
    c.identical = true;
    return c;
}

ATTNREF_GOLDEN_FN void write_case(const std::filesystem::path& dir, const generated_case& g) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw data_error(dir.string() + ": cannot create the directory: " + ec.message());
    for (const case_file& f : g.files)  // manifest.json is last
        write_file_atomic(dir / f.name, std::string_view(reinterpret_cast<const char*>(f.bytes.data()), f.bytes.size()), true);
    // An overwritten case may have had more tensors (e.g. weights.npy before --no-weights): remove
    // every .npy file the new manifest does not list, so no stale tensor is left for a later
    // check or a user to pick up.
    std::vector<std::filesystem::path> stale;
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const std::filesystem::path name = it->path().filename();
        if (name.extension() != ".npy" || it->is_directory(ec)) continue;
        if (std::none_of(g.files.begin(), g.files.end(), [&](const case_file& f) { return f.name == name.string(); }))
            stale.push_back(it->path());
    }
    for (const std::filesystem::path& p : stale) std::filesystem::remove(p, ec);
}
#endif  // ATTNREF_GOLDEN_BODIES

/// A case read back from disk: manifest (strictly parsed), every file's sha256 checked against it,
/// every tensor's header checked against the case's shapes, and the inputs decoded. data_error
/// names the file and field on any problem.
struct loaded_case {
    std::filesystem::path dir;  ///< the case directory (a case in memory: its name, for messages)
    manifest m;
    case_data data;
    /// A case made in this process (load_generated_case): its files, read from here instead of dir.
    std::shared_ptr<const std::vector<case_file>> memory;

    /// The manifest entry of a role's float64 values ("output", "weights", "lse", and in backward
    /// cases the gradients "grad_query", … of gradient_layout), or nullptr.
    const tensor_entry* entry(const std::string& role) const {
        for (const tensor_entry& t : m.tensors)
            if (t.role == role && !t.target) return &t;
        return nullptr;
    }
    /// A golden tensor's float64 values, read again from the case directory with the same rules
    /// as load_case (regular file inside the case, exactly the manifest's dtype and shape).
    std::vector<double> reference(const tensor_entry& t) const {
        try {
            if (memory) return npy::to_double(npy::parse(file_bytes(t.file), (dir / t.file).string(), npy::expectation{{t.dtype}, t.shape}));
            require_regular_file(dir / t.file, "golden tensor", dir);
            return npy::read_double(dir / t.file, npy::expectation{{t.dtype}, t.shape});
        } catch (const npy::error& e) {
            throw data_error(e.what());
        }
    }
    /// A file of a case in memory; data_error when the case has no such file.
    std::span<const std::byte> file_bytes(const std::string& name) const {
        for (const case_file& f : *memory)
            if (f.name == name) return f.bytes;
        throw data_error((dir / name).string() + ": no such file in the case made in memory");
    }
};

/// Reads a case directory (see loaded_case); data_error naming the file and field on any problem.
ATTNREF_GOLDEN_FN loaded_case load_case(const std::filesystem::path& dir);
/// A case made in this process (generate_case) read as load_case reads its directory — the manifest
/// parsed again, every file's sha256 and header checked, the inputs decoded — from its files in memory.
ATTNREF_GOLDEN_FN loaded_case load_generated_case(generated_case g);

#if ATTNREF_GOLDEN_BODIES
namespace detail {
/// One manifest tensor's file (tensors[i]): a regular file inside the case, no larger than its dtype
/// and shape allow, with the manifest's sha256 and a header of its dtype and shape; data_error otherwise.
inline void check_tensor_file(const tensor_entry& t, std::size_t i, const std::filesystem::path& dir, const std::string& manifest_file) {
    const std::string field = "tensors[" + std::to_string(i) + "]";
    const std::filesystem::path p = dir / t.file;
    // Regular file inside the case, no larger than its dtype and shape allow (plus the largest
    // header): checked before hashing, so neither /dev/zero nor a FIFO nor a 20 GB file is read.
    const std::uintmax_t size = require_regular_file(p, manifest_file + " field '" + field + ".file'", dir);
    std::uint64_t limit = t.dtype == "|b1" ? 1 : t.dtype == "<f8" ? 8 : t.dtype == "<f4" ? 4 : 2;
    for (std::size_t e : t.shape) limit = checked_mul(limit, e).value_or(UINT64_MAX);
    limit = checked_add(limit, 12 + npy::detail::max_header_length).value_or(UINT64_MAX);
    if (size > limit)
        throw data_error(p.string() + ": file: " + std::to_string(size) + " bytes, more than the " + std::to_string(limit) +
                         " that " + manifest_file + " field '" + field + ".shape' and '.dtype' allow");
    std::string digest;
    try {
        digest = sha256_file(p);
    } catch (const std::exception&) {
        throw data_error(p.string() + ": cannot read the file listed in " + manifest_file + " field '" + field + ".file'");
    }
    if (digest != t.sha256)
        throw data_error(p.string() + ": sha256 " + digest + " does not match " + manifest_file + " field '" + field + ".sha256'");
    // Every tensor's header must be the manifest's dtype and shape (checked against the case by
    // parse_manifest) now, not only when a later step happens to read it.
    try {
        (void)npy::read_header(p, npy::expectation{{t.dtype}, t.shape});
    } catch (const npy::error& e) {
        throw data_error(e.what());
    }
}
/// Decodes the inputs of lc.m (every input role of the case's layout) into lc.data; read(entry, shape)
/// returns the entry's array (throwing npy::error as npy::read does).
template <class Read>
void decode_inputs(loaded_case& lc, const std::string& manifest_file, Read&& read) {
    for (const input_tensor_layout& layout : input_layout(lc.m.spec)) {
        const std::string role(generator::role_name(layout.role));
        const tensor_entry* entry = nullptr;
        for (const tensor_entry& t : lc.m.tensors)
            if (t.role == role && !t.target) entry = &t;
        if (!entry) throw data_error(manifest_file + ": field 'tensors': no tensor with role '" + role + "'");
        npy::array a;
        try {
            a = read(*entry, layout.shape);
        } catch (const npy::error& e) {
            throw data_error(e.what());
        }
        const std::string path = (lc.dir / entry->file).string();
        if (layout.role == generator::role::mask) {
            if (a.descr != "|b1") throw data_error(path + ": header field 'descr': expected '|b1', got '" + a.descr + "'");
            lc.data.mask = npy::to_uint8(a);
        } else {
            if (a.descr != "<f8") throw data_error(path + ": header field 'descr': expected '<f8', got '" + a.descr + "'");
            *lc.data.real(layout.role) = npy::to_double(a);
        }
    }
}
}  // namespace detail

ATTNREF_GOLDEN_FN loaded_case load_case(const std::filesystem::path& dir) {
    loaded_case lc;
    lc.dir = dir;
    const std::string manifest_file = (dir / "manifest.json").string();
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) throw data_error(dir.string() + ": not a golden case directory");
    lc.m = parse_manifest(read_file_capped(manifest_file, max_json_bytes, dir), manifest_file);
    const case_spec& s = lc.m.spec;
    check_case_memory(s, manifest_file);
    // Every file checked (size, sha256, header) on the threads, the largest first (hashing is most of
    // a large case's loading); each check records its own error, and the first in the manifest's
    // order is thrown, as a loop in that order would.
    std::vector<std::string> errors(lc.m.tensors.size());
    std::vector<std::size_t> order(lc.m.tensors.size());
    std::vector<std::uint64_t> elements(lc.m.tensors.size(), 1);
    for (std::size_t i = 0; i < order.size(); ++i) {
        order[i] = i;
        for (std::size_t e : lc.m.tensors[i].shape) elements[i] = checked_mul(elements[i], e).value_or(UINT64_MAX);
    }
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return elements[a] > elements[b]; });
    parallel_for_dynamic(order.size(), 0, [&](std::size_t n) {
        const std::size_t i = order[n];
        try {
            detail::check_tensor_file(lc.m.tensors[i], i, dir, manifest_file);
        } catch (const data_error& e) {
            errors[i] = e.what();
        }
    });
    for (const std::string& e : errors)
        if (!e.empty()) throw data_error(e);
    detail::decode_inputs(lc, manifest_file, [&](const tensor_entry& t, const std::vector<std::size_t>& shape) {
        return npy::read(dir / t.file, npy::expectation{{t.dtype}, shape});
    });
    return lc;
}

ATTNREF_GOLDEN_FN loaded_case load_generated_case(generated_case g) {
    loaded_case lc;
    lc.dir = g.m.spec.name;
    lc.memory = std::make_shared<const std::vector<case_file>>(std::move(g.files));
    const std::string manifest_file = (lc.dir / "manifest.json").string();
    const std::span<const std::byte> text = lc.file_bytes("manifest.json");
    lc.m = parse_manifest(std::string(reinterpret_cast<const char*>(text.data()), text.size()), manifest_file);
    check_case_memory(lc.m.spec, manifest_file);
    for (std::size_t i = 0; i < lc.m.tensors.size(); ++i) {  // as check_tensor_file: sha256, then the header
        const tensor_entry& t = lc.m.tensors[i];
        const std::string field = "tensors[" + std::to_string(i) + "]", path = (lc.dir / t.file).string();
        const std::span<const std::byte> b = lc.file_bytes(t.file);
        if (sha256_hex(b) != t.sha256) throw data_error(path + ": sha256 does not match " + manifest_file + " field '" + field + ".sha256'");
        try {
            (void)npy::parse_layout(b.first(std::min<std::size_t>(b.size(), npy::max_prefix_bytes)), b.size(), path,
                                    npy::expectation{{t.dtype}, t.shape});
        } catch (const npy::error& e) {
            throw data_error(e.what());
        }
    }
    detail::decode_inputs(lc, manifest_file, [&](const tensor_entry& t, const std::vector<std::size_t>& shape) {
        return npy::parse(lc.file_bytes(t.file), (lc.dir / t.file).string(), npy::expectation{{t.dtype}, shape});
    });
    return lc;
}
#endif  // ATTNREF_GOLDEN_BODIES

}  // namespace attnref::golden
