#include "golden_case.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <unistd.h>

#include "attnref/certify.hpp"
#include "attnref/formats.hpp"
#include "attnref/multiprecision.hpp"
#include "safe_io.hpp"
#include "sha256.hpp"

namespace attnref::verify {

namespace fs = std::filesystem;

case_data generate_inputs(const case_spec& spec) {
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

namespace {

std::vector<std::byte> serialize_doubles(const std::vector<std::size_t>& shape, const std::vector<double>& v) {
    return npy::serialize(npy::make_array("<f8", shape, v));
}

/// A target copy: float32 '<f4', float16 '<f2' (IEEE half), bfloat16 '<u2' (bit patterns).
std::pair<std::string, std::vector<std::byte>> serialize_target(const std::string& target, const std::vector<std::size_t>& shape,
                                                                 const std::vector<double>& v) {
    if (target == "float32") {
        std::vector<float> f(v.begin(), v.end());  // exact: v holds float32 values
        return {"<f4", npy::serialize(npy::make_array("<f4", shape, f))};
    }
    std::vector<std::uint16_t> bits;
    bits.reserve(v.size());
    for (double x : v)
        bits.push_back(target == "bfloat16" ? formats::bfloat16(x).bits() : formats::float16(x).bits());  // exact
    npy::array a = npy::make_array("<u2", shape, bits);
    if (target == "float16") a.descr = "<f2";
    return {a.descr, npy::serialize(a)};
}

template <class T>
std::vector<T> flat(const tensor<T, 1>& t) {
    return std::vector<T>(t.data(), t.data() + t.size());
}

}  // namespace

generated_case generate_case(const case_spec& spec, std::size_t threads, const std::function<void(const std::string&)>& progress) {
    const auto start = std::chrono::steady_clock::now();
    generated_case g;
    g.m.spec = spec;
    const case_data data = generate_inputs(spec);

    // Inputs: '<f8' values of the input format; mask '|b1'.
    for (const input_tensor_layout& t : input_layout(spec)) {
        const std::string role(generator::role_name(t.role));
        case_file f{role + ".npy", {}};
        std::string dtype = "<f8";
        if (t.role == generator::role::mask) {
            dtype = "|b1";
            f.bytes = npy::serialize(npy::make_array("|b1", t.shape, data.mask));
        } else {
            f.bytes = serialize_doubles(t.shape, *const_cast<case_data&>(data).real(t.role));
        }
        g.m.tensors.push_back({role, std::nullopt, f.name, dtype, t.shape, sha256_hex(f.bytes)});
        g.files.push_back(std::move(f));
    }

    // Certified outputs.
    std::vector<std::string> names{"output"};
    std::vector<std::vector<std::size_t>> shapes{output_shape(spec)};
    if (spec.outputs.weights) names.push_back("weights"), shapes.push_back(weights_shape(spec));
    if (spec.outputs.lse) names.push_back("lse"), shapes.push_back(lse_shape(spec));
    std::vector<certify::binary_format> targets{certify::float64_target};
    for (const std::string& t : spec.outputs.targets) targets.push_back(*target_format(t));

    certify::options opts;
    opts.shapes = shapes;
    // NaN is exact only in rows that are empty from the mask alone under the nan policy, and in
    // what they feed: their output and weights (sdpa: row (b, h, i); mha: every output feature of
    // query row (b, i) once one of its heads is empty). lse of an empty row is −inf, never NaN.
    const std::vector<std::uint8_t> empty = empty_rows_of(spec, data);
    const case_shapes& d = spec.shapes;
    const std::size_t rows_total = d.batch * d.heads * d.query_length;
    if (spec.conventions.empty_rows == empty_row_policy::nan) {
        auto per_row = [&](std::size_t width) {
            std::vector<std::uint8_t> f(rows_total * width, 0);
            for (std::size_t r = 0; r < rows_total; ++r)
                for (std::size_t c = 0; c < width && empty[r]; ++c) f[r * width + c] = 1;
            return f;
        };
        if (spec.kind == case_kind::sdpa) {
            opts.nan_allowed.push_back(per_row(d.head_dim_v));
        } else {
            std::vector<std::uint8_t> f(d.batch * d.query_length * d.output_dim, 0);
            for (std::size_t b = 0; b < d.batch; ++b)
                for (std::size_t h = 0; h < d.heads; ++h)
                    for (std::size_t i = 0; i < d.query_length; ++i)
                        if (empty[(b * d.heads + h) * d.query_length + i])
                            for (std::size_t c = 0; c < d.output_dim; ++c) f[(b * d.query_length + i) * d.output_dim + c] = 1;
            opts.nan_allowed.push_back(std::move(f));
        }
        if (spec.outputs.weights) opts.nan_allowed.push_back(per_row(d.key_length));
    }
    opts.progress = [&](std::size_t rung, int bits, std::size_t pending) {
        if (!progress) return;
        if (rung == 0) progress(spec.name + ": computing the enclosure at " + std::to_string(bits) + " bits");
        else progress(spec.name + ": " + std::to_string(pending) + " element(s) uncertified, escalating to " + std::to_string(bits) + " bits");
    };
    // Escalation recomputes only the query rows (b, h, i) that hold undecided elements: an output
    // element of sdpa (b, h, i, c), a weight (b, h, i, j) and an lse (b, h, i) belong to row (b, h, i);
    // an mha output (b, i, c) to query row (b, i) of every head (multi_head_attention_into then
    // recomputes that query row's projections and all its heads). Every row is computed exactly as
    // in a full call, and the values certified at a lower rung are kept, so the result is the same.
    auto rows_for = [&](const certify::request& req) {
        std::vector<std::uint8_t> rows;
        if (req.pending.empty() || req.pending[0].empty()) return rows;  // first rung: everything
        rows.assign(rows_total, 0);
        const std::size_t sq = d.query_length;
        for (std::size_t t = 0; t < names.size(); ++t) {
            const std::vector<std::uint8_t>& p = req.pending[t];
            for (std::size_t n = 0; n < p.size(); ++n) {
                if (!p[n]) continue;
                if (names[t] == "output" && spec.kind == case_kind::mha) {
                    const std::size_t row = n / d.output_dim, b = row / sq, i = row % sq;  // (b, i)
                    for (std::size_t h = 0; h < d.heads; ++h) rows[(b * d.heads + h) * sq + i] = 1;
                } else {
                    const std::size_t width = names[t] == "output" ? d.head_dim_v : names[t] == "weights" ? d.key_length : 1;
                    rows[n / width] = 1;
                }
            }
        }
        return rows;
    };
    certify::result cert;
    try {
        cert = certify::certify(
            names, targets,
            [&]<unsigned D>(std::integral_constant<unsigned, D>, const certify::request& req) {
                using P = uniform_precision<mpfr_interval<D>>;
                const std::vector<std::uint8_t> rows = rows_for(req);
                const case_outputs_of<P> out = compute_case<P, double>(spec, data, threads, softmax_algorithm::shifted_division, 64, rows);
                std::vector<std::vector<mpfr_interval<D>>> r{flat(out.output)};
                if (spec.outputs.weights) r.push_back(flat(out.weights));
                if (spec.outputs.lse) r.push_back(flat(out.lse));
                return r;
            },
            opts);
    } catch (const certify::uncertified_error& e) {
        // Inconclusive, not bad input: exit 1 as golden/README.md says; nothing is written.
        throw check_failure("case '" + spec.name + "': " + e.what());
    }
    g.m.reference.precisions_bits = cert.precisions_bits;
    g.m.reference.certification = cert.reports;
    for (const certify::tensor_report& r : cert.reports) {
        g.certified_elements += r.certified;
        g.escalated_elements += r.escalated;
    }
    for (std::size_t t = 0; t < names.size(); ++t) {
        case_file f{names[t] + ".npy", serialize_doubles(shapes[t], cert.values[t][0])};
        g.m.tensors.push_back({names[t], std::nullopt, f.name, "<f8", shapes[t], sha256_hex(f.bytes)});
        g.files.push_back(std::move(f));
        for (std::size_t k = 1; k < targets.size(); ++k) {
            auto [dtype, bytes] = serialize_target(targets[k].name, shapes[t], cert.values[t][k]);
            case_file c{names[t] + "." + targets[k].name + ".npy", std::move(bytes)};
            g.m.tensors.push_back({names[t], std::string(targets[k].name), c.name, dtype, shapes[t], sha256_hex(c.bytes)});
            g.files.push_back(std::move(c));
        }
    }
    const std::string text = manifest_text(g.m);
    // generate never writes a case its own parser rejects.
    (void)parse_manifest(text, spec.name + "/manifest.json (as generated)");
    case_file mf{"manifest.json", {}};
    mf.bytes.resize(text.size());
    std::memcpy(mf.bytes.data(), text.data(), text.size());
    g.files.push_back(std::move(mf));
    g.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return g;
}

namespace {

bool read_bytes(const fs::path& p, std::vector<std::byte>& out, std::size_t expected_size) {
    // Only regular files of the expected size are compared byte by byte: anything else differs
    // (and a FIFO or device is never opened).
    std::error_code ec;
    if (!fs::is_regular_file(p, ec) || fs::file_size(p, ec) != expected_size || ec) {
        out.clear();
        return fs::exists(p, ec);
    }
    std::ifstream in(p, std::ios::binary);
    if (!in) return false;
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    out.resize(chars.size());
    if (!chars.empty()) std::memcpy(out.data(), chars.data(), chars.size());
    return !in.bad();
}

void atomic_write(const fs::path& path, const std::vector<std::byte>& bytes) {
    static std::atomic<unsigned long> counter{0};
    fs::path tmp = path;
    tmp.replace_filename("." + path.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::FILE* f = std::fopen(tmp.c_str(), "wbx");
    if (!f) throw data_error(path.string() + ": cannot create a temporary file next to it");
    bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    ok = std::fflush(f) == 0 && ok;
    ok = std::fclose(f) == 0 && ok;
    std::error_code ec;
    if (ok) fs::rename(tmp, path, ec);
    if (!ok || ec) {
        fs::remove(tmp, ec);
        throw data_error(path.string() + ": write failed");
    }
}

}  // namespace

comparison compare_case(const fs::path& dir, const generated_case& g) {
    comparison c;
    std::error_code ec;
    c.exists = fs::exists(dir, ec);
    if (!c.exists) return c;
    for (const case_file& f : g.files) {
        std::vector<std::byte> on_disk;
        if (!read_bytes(dir / f.name, on_disk, f.bytes.size())) {
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

void write_case(const fs::path& dir, const generated_case& g) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw data_error(dir.string() + ": cannot create the directory: " + ec.message());
    for (const case_file& f : g.files) atomic_write(dir / f.name, f.bytes);  // manifest.json is last
    // An overwritten case may have had more tensors (e.g. weights.npy before --no-weights): remove
    // every .npy file the new manifest does not list, so no stale tensor is left for a later
    // check or a user to pick up.
    std::vector<fs::path> stale;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const fs::path name = it->path().filename();
        if (name.extension() != ".npy" || it->is_directory(ec)) continue;
        if (std::none_of(g.files.begin(), g.files.end(), [&](const case_file& f) { return f.name == name.string(); }))
            stale.push_back(it->path());
    }
    for (const fs::path& p : stale) fs::remove(p, ec);
}

loaded_case load_case(const fs::path& dir) {
    loaded_case lc;
    const std::string manifest_file = (dir / "manifest.json").string();
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) throw data_error(dir.string() + ": not a golden case directory");
    lc.m = parse_manifest(read_file_capped(manifest_file, max_json_bytes, dir), manifest_file);
    const case_spec& s = lc.m.spec;
    check_case_memory(s, manifest_file);
    for (std::size_t i = 0; i < lc.m.tensors.size(); ++i) {
        const tensor_entry& t = lc.m.tensors[i];
        const std::string field = "tensors[" + std::to_string(i) + "]";
        const fs::path p = dir / t.file;
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
    for (const input_tensor_layout& layout : input_layout(s)) {
        const std::string role(generator::role_name(layout.role));
        const tensor_entry* entry = nullptr;
        for (const tensor_entry& t : lc.m.tensors)
            if (t.role == role && !t.target) entry = &t;
        if (!entry) throw data_error(manifest_file + ": field 'tensors': no tensor with role '" + role + "'");
        npy::array a;
        try {
            a = npy::read(dir / entry->file, npy::expectation{{entry->dtype}, layout.shape});
        } catch (const npy::error& e) {
            throw data_error(e.what());
        }
        const std::string path = (dir / entry->file).string();
        if (layout.role == generator::role::mask) {
            if (a.descr != "|b1") throw data_error(path + ": header field 'descr': expected '|b1', got '" + a.descr + "'");
            lc.data.mask = npy::to_uint8(a);
        } else {
            if (a.descr != "<f8") throw data_error(path + ": header field 'descr': expected '<f8', got '" + a.descr + "'");
            *lc.data.real(layout.role) = npy::to_double(a);
        }
    }
    return lc;
}

}  // namespace attnref::verify
