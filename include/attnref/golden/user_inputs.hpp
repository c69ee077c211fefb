#pragma once
/// \file golden/user_inputs.hpp
/// Owns reading a directory of the user's own input .npy files into a golden case (`attnref generate
/// --inputs-from DIR`, golden/README.md "Your own inputs"): which files a case reads, the shapes they
/// imply, the dtypes accepted, the value rules, and the narrowest input format holding every value.
/// The case itself (manifest inputs.generator "files", certification, atomic writing) is the golden
/// module's usual path (manifest.hpp, generate.hpp, case.hpp).
///
/// Rules (each violation is a data_error, exit 2, one line naming the file and the field, axis or index):
/// - DIR holds <role>.npy for every input the case reads (case.hpp's roles: query, key, value; mha
///   also w_q, w_k, w_v, w_o and, with biases, b_q, b_k, b_v, b_o; mask, additive_mask, seed_mask when
///   the conventions ask for them; grad_output when DIR holds grad_output.npy, see below). Any other *.npy file in DIR is refused (a mask.npy without
///   --boolean-mask is a forgotten flag, not something to ignore); other files are ignored.
/// - Every file is read through safe_io (regular files only; a symlink must resolve inside DIR) and
///   npy.hpp's strict reader (little-endian, C order, no object arrays), once: the sha256 recorded is
///   that of the bytes parsed.
/// - dtypes: real inputs '<f8', '<f4', '<f2', or '<u2' holding bfloat16 bit patterns (golden/README.md's
///   convention for bfloat16 copies) when the caller says so (bfloat16_bits); mask '|b1'; additive and
///   seed masks '<f8', '<f4' or '<f2'.
/// - values: real inputs finite; additive_mask finite or −inf; seed_mask 0 or 1.
/// - shapes: from the files (sdpa: query (B, H, Sq, dk), key (B, Hkv, Sk, dk), value (B, Hkv, Sk, dv);
///   mha: x (B, S, E) and the projections, heads from the caller); every disagreement names the file
///   and the axis. Masks are (B, H, Sq, Sk).
/// - gradients: a grad_output.npy in DIR (dO, the output's shape: sdpa (B, H, Sq, dv), mha (B, Sq, E_out);
///   a real input like the others) makes the case a backward case (manifest outputs.gradients, as the
///   suite's *_bwd_* cases): its certified gradients are those of sum(dO * output). A backward case
///   stores weights and lse, so --no-weights or --no-lse with it is refused.
/// - format: the narrowest of bfloat16, float16, float32, float64 (tried in that order; a value set
///   exact in both 16-bit formats is called bfloat16) in which every value of every real input
///   (queries, keys, values, projections, biases; not the masks, which are exact doubles in every
///   case, as in the suite) is exact; or a declared format, refused if some value is not exact in it.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <span>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "attnref/core/binary_format.hpp"
#include "attnref/io/npy.hpp"
#include "attnref/golden/case.hpp"
#include "attnref/golden/manifest.hpp"
#include "attnref/golden/safe_io.hpp"
#include "attnref/golden/sha256.hpp"

namespace attnref::golden {

/// What the caller says about the files (the rest comes from the files).
struct user_input_options {
    case_kind kind = case_kind::sdpa;
    std::size_t heads = 0, kv_heads = 0;  ///< mha only: H (0: 1) and H_kv (0: H); sdpa reads them from the files
    bool bias = false, boolean_mask = false, additive_mask = false, seed_mask = false;
    bool bfloat16_bits = false;  ///< '<u2' files hold bfloat16 bit patterns
};

/// The shapes the files imply, from their headers alone (no data read). Throws data_error naming
/// the file and the axis.
inline case_shapes user_input_shapes(const std::filesystem::path& dir, const user_input_options& o);

/// The inputs read from `dir` for `spec` (its shapes from user_input_shapes, its conventions final),
/// with one record per input (role, dtype as given, sha256 of the file) and the narrowest format.
struct user_inputs {
    case_data data;
    std::vector<input_file_record> files;
    binary_format narrowest = binary_format::float64;
};
inline user_inputs read_user_inputs(const std::filesystem::path& dir, const case_spec& spec, const user_input_options& o);

/// Makes `spec` a backward case (outputs.gradients) when `dir` holds grad_output.npy (any entry of
/// that name: read_user_inputs then reads and checks it like every input). Throws data_error naming
/// the file when spec stores no weights or no lse, which the gradients' bound needs.
inline void request_user_gradients(const std::filesystem::path& dir, case_spec& spec);

/// Throws data_error "<file>: element N, index (…): value … is not exact in <format> (<why>)" for the
/// first value of a real input not exactly representable in `f`.
inline void require_exact_in(const std::filesystem::path& dir, const case_spec& spec, const case_data& data, binary_format f,
                             const std::string& why);


// ---------------------------------------------------------------------------------------------
// Definitions.


namespace user_inputs_detail {

inline std::string fmt_double(double x) {
    char b[40];
    std::snprintf(b, sizeof b, "%.17g", x);
    return b;
}

inline std::string shape_text(const std::vector<std::size_t>& s) {
    std::string t = "(";
    for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
    return t + (s.size() == 1 ? ",)" : ")");
}

inline std::string index_text(std::size_t n, const std::vector<std::size_t>& shape) {
    std::vector<std::size_t> idx(shape.size());
    for (std::size_t a = shape.size(); a-- > 0;) {
        idx[a] = shape[a] ? n % shape[a] : 0;
        n = shape[a] ? n / shape[a] : 0;
    }
    return shape_text(idx);
}

inline bool is_real_role(generator::role r) {
    return r != generator::role::mask && r != generator::role::additive_mask && r != generator::role::seed_mask;
}

inline std::filesystem::path path_of(const std::filesystem::path& dir, generator::role r) {
    return dir / (std::string(generator::role_name(r)) + ".npy");
}

inline std::vector<std::string> descrs_for(generator::role r, bool bfloat16_bits) {
    if (r == generator::role::mask) return {"|b1"};
    if (is_real_role(r) && bfloat16_bits) return {"<f8", "<f4", "<f2", "<u2"};
    return {"<f8", "<f4", "<f2"};
}

/// The header of a role's file: regular, inside dir, an accepted dtype.
inline npy::array header_of(const std::filesystem::path& dir, generator::role r, const user_input_options& o) {
    const std::filesystem::path p = path_of(dir, r);
    require_regular_file(p, "--inputs-from file", dir);
    npy::array h;
    try {
        h = npy::read_header(p);
    } catch (const npy::error& e) {
        throw data_error(e.what());
    }
    const std::vector<std::string> ok = descrs_for(r, o.bfloat16_bits);
    if (std::find(ok.begin(), ok.end(), h.descr) == ok.end()) {
        std::string list;
        for (const std::string& d : ok) list += (list.empty() ? "'" : ", '") + d + "'";
        std::string hint;
        if (h.descr == "<u2" && is_real_role(r)) hint = " ('<u2' is read as bfloat16 bit patterns with --input-dtype bfloat16)";
        throw data_error(p.string() + ": header field 'descr': expected " + list + ", got '" + h.descr + "'" + hint);
    }
    return h;
}

[[noreturn]] inline void axis_error(const std::filesystem::path& dir, generator::role r, const std::string& what) {
    throw data_error(path_of(dir, r).string() + ": header field 'shape': " + what);
}

inline void require_rank(const std::filesystem::path& dir, generator::role r, const npy::array& h, std::size_t rank,
                         const char* layout) {
    if (h.shape.size() != rank)
        axis_error(dir, r, "expected " + std::to_string(rank) + " axes " + layout + ", got " + shape_text(h.shape));
    for (std::size_t a = 0; a < rank; ++a)
        if (h.shape[a] == 0) axis_error(dir, r, "axis " + std::to_string(a) + " is 0 (every extent must be positive)");
}

/// Axis `a` of role r's file must equal `want` (taken from `source`).
inline void require_axis(const std::filesystem::path& dir, generator::role r, const npy::array& h, std::size_t a, const char* name,
                         std::size_t want, const std::string& source) {
    if (h.shape[a] != want)
        axis_error(dir, r, "axis " + std::to_string(a) + " (" + name + ") is " + std::to_string(h.shape[a]) + ", expected " +
                               std::to_string(want) + " (" + source + ")");
}

}  // namespace user_inputs_detail

inline case_shapes user_input_shapes(const std::filesystem::path& dir, const user_input_options& o) {
    using namespace user_inputs_detail;
    using generator::role;
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) throw data_error(dir.string() + ": --inputs-from: not a directory");
    case_shapes s;
    if (o.kind == case_kind::sdpa) {
        const npy::array q = header_of(dir, role::query, o), k = header_of(dir, role::key, o), v = header_of(dir, role::value, o);
        require_rank(dir, role::query, q, 4, "(B, H, Sq, dk)");
        require_rank(dir, role::key, k, 4, "(B, Hkv, Sk, dk)");
        require_rank(dir, role::value, v, 4, "(B, Hkv, Sk, dv)");
        require_axis(dir, role::key, k, 0, "batch", q.shape[0], "axis 0 of query.npy");
        require_axis(dir, role::key, k, 3, "dk", q.shape[3], "axis 3 of query.npy");
        require_axis(dir, role::value, v, 0, "batch", k.shape[0], "axis 0 of key.npy");
        require_axis(dir, role::value, v, 1, "kv heads", k.shape[1], "axis 1 of key.npy");
        require_axis(dir, role::value, v, 2, "Sk", k.shape[2], "axis 2 of key.npy");
        if (q.shape[1] % k.shape[1] != 0)
            axis_error(dir, role::key, "axis 1 (kv heads) is " + std::to_string(k.shape[1]) + ", which does not divide the " +
                                           std::to_string(q.shape[1]) + " query heads of query.npy");
        s = {q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3], 0, 0};
        return s;
    }
    const std::size_t h = o.heads ? o.heads : 1, hkv = o.kv_heads ? o.kv_heads : h;
    const npy::array xq = header_of(dir, role::query, o), xk = header_of(dir, role::key, o), xv = header_of(dir, role::value, o);
    require_rank(dir, role::query, xq, 3, "(B, Sq, E)");
    require_rank(dir, role::key, xk, 3, "(B, Sk, E)");
    require_rank(dir, role::value, xv, 3, "(B, Sk, E)");
    const std::size_t e = xq.shape[2];
    require_axis(dir, role::key, xk, 0, "batch", xq.shape[0], "axis 0 of query.npy");
    require_axis(dir, role::key, xk, 2, "E", e, "axis 2 of query.npy");
    require_axis(dir, role::value, xv, 0, "batch", xq.shape[0], "axis 0 of query.npy");
    require_axis(dir, role::value, xv, 1, "Sk", xk.shape[1], "axis 1 of key.npy");
    require_axis(dir, role::value, xv, 2, "E", e, "axis 2 of query.npy");
    const npy::array wq = header_of(dir, role::w_q, o), wk = header_of(dir, role::w_k, o), wv = header_of(dir, role::w_v, o),
                     wo = header_of(dir, role::w_o, o);
    require_rank(dir, role::w_q, wq, 2, "(E, H·dk)");
    require_rank(dir, role::w_k, wk, 2, "(E, Hkv·dk)");
    require_rank(dir, role::w_v, wv, 2, "(E, Hkv·dv)");
    require_rank(dir, role::w_o, wo, 2, "(H·dv, E_out)");
    for (const auto& [r, w] : {std::pair{role::w_q, &wq}, std::pair{role::w_k, &wk}, std::pair{role::w_v, &wv}})
        require_axis(dir, r, *w, 0, "E", e, "axis 2 of query.npy");
    if (wq.shape[1] % h != 0)
        axis_error(dir, role::w_q, "axis 1 (H·dk) is " + std::to_string(wq.shape[1]) + ", not a multiple of the " + std::to_string(h) +
                                       " heads (--heads)");
    const std::size_t dk = wq.shape[1] / h;
    require_axis(dir, role::w_k, wk, 1, "Hkv·dk", hkv * dk, std::to_string(hkv) + " kv heads × dk " + std::to_string(dk) + " from w_q.npy");
    if (wv.shape[1] % hkv != 0)
        axis_error(dir, role::w_v, "axis 1 (Hkv·dv) is " + std::to_string(wv.shape[1]) + ", not a multiple of the " +
                                       std::to_string(hkv) + " kv heads");
    const std::size_t dv = wv.shape[1] / hkv;
    require_axis(dir, role::w_o, wo, 0, "H·dv", h * dv, std::to_string(h) + " heads × dv " + std::to_string(dv) + " from w_v.npy");
    if (o.bias) {
        const std::pair<generator::role, std::size_t> biases[] = {
            {role::b_q, h * dk}, {role::b_k, hkv * dk}, {role::b_v, hkv * dv}, {role::b_o, wo.shape[1]}};
        for (const auto& [r, n] : biases) {
            const npy::array b = header_of(dir, r, o);
            require_rank(dir, r, b, 1, "(features)");
            require_axis(dir, r, b, 0, "features", n, "the projection's columns");
        }
    }
    s = {xq.shape[0], h, hkv, xq.shape[1], xk.shape[1], dk, dv, e, wo.shape[1]};
    return s;
}

inline void request_user_gradients(const std::filesystem::path& dir, case_spec& spec) {
    const std::filesystem::path p = user_inputs_detail::path_of(dir, generator::role::grad_output);
    std::error_code ec;
    if (!std::filesystem::exists(std::filesystem::symlink_status(p, ec))) return;
    if (!spec.outputs.weights || !spec.outputs.lse)
        throw data_error(printable(p.string()) + ": --inputs-from: a grad_output makes a backward case, which stores the weights and lse; "
                         "drop --no-weights and --no-lse (or the file)");
    spec.outputs.gradients = true;
}

inline user_inputs read_user_inputs(const std::filesystem::path& dir, const case_spec& spec, const user_input_options& o) {
    using namespace user_inputs_detail;
    using generator::role;
    user_inputs in;
    const std::vector<input_tensor_layout> layout = input_layout(spec);
    // No *.npy file the case would not read: a mask.npy without --boolean-mask is a forgotten flag.
    std::set<std::string> wanted;
    for (const input_tensor_layout& t : layout) wanted.insert(std::string(generator::role_name(t.role)) + ".npy");
    std::error_code ec;
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (name.size() >= 4 && name.substr(name.size() - 4) == ".npy" && !wanted.count(name))
            throw data_error(printable(it->path().string()) +
                             ": --inputs-from: not an input of this case (masks need --boolean-mask, --additive-mask or "
                             "--seed-mask, biases --bias); refused rather than ignored");
    }
    if (ec) throw data_error(dir.string() + ": --inputs-from: cannot list the directory: " + ec.message());
    for (const input_tensor_layout& t : layout) {
        const std::filesystem::path p = path_of(dir, t.role);
        const std::string source = p.string();
        require_regular_file(p, "--inputs-from file", dir);
        std::uint64_t count = 1;
        for (std::size_t e : t.shape) count = checked_mul(count, e).value_or(UINT64_MAX);
        const std::uint64_t cap = checked_add(checked_mul(count, 8).value_or(UINT64_MAX), 12 + npy::detail::max_header_length).value_or(UINT64_MAX);
        // Read once: the bytes hashed are the bytes parsed.
        const std::string bytes = read_file_capped(p, static_cast<std::size_t>(std::min<std::uint64_t>(cap, SIZE_MAX)), dir);
        const auto span = std::as_bytes(std::span(bytes.data(), bytes.size()));
        npy::array a;
        try {
            a = npy::parse(span, source, npy::expectation{descrs_for(t.role, o.bfloat16_bits), t.shape});
        } catch (const npy::error& e) {
            throw data_error(e.what());
        }
        in.files.push_back({std::string(generator::role_name(t.role)), a.descr, sha256_hex(span)});
        if (t.role == role::mask) {
            in.data.mask = npy::to_uint8(a);
            continue;
        }
        std::vector<double> values;
        if (a.descr == "<u2") {  // bfloat16 bit patterns
            values.resize(a.data.size() / 2);
            for (std::size_t n = 0; n < values.size(); ++n) {
                const std::uint64_t bits = std::to_integer<std::uint64_t>(a.data[2 * n]) | (std::to_integer<std::uint64_t>(a.data[2 * n + 1]) << 8);
                values[n] = encoding::widen_to_double<encoding::bfloat16>(bits);
            }
        } else {
            values = npy::to_double(a);
        }
        for (std::size_t n = 0; n < values.size(); ++n) {
            const double x = values[n];
            const bool ok = t.role == role::additive_mask ? !std::isnan(x) && x != std::numeric_limits<double>::infinity()
                            : t.role == role::seed_mask   ? (x == 0 || x == 1)
                                                          : std::isfinite(x);
            if (!ok) {
                const char* rule = t.role == role::additive_mask ? "finite or -inf" : t.role == role::seed_mask ? "0 or 1" : "finite";
                throw data_error(source + ": element " + std::to_string(n) + ", index " + index_text(n, t.shape) + ": value " +
                                 fmt_double(x) + "; expected " + rule);
            }
        }
        *in.data.real(t.role) = std::move(values);
    }
    for (binary_format f : {binary_format::bfloat16, binary_format::float16, binary_format::float32, binary_format::float64}) {
        bool exact = true;
        for (const input_tensor_layout& t : layout) {
            if (!is_real_role(t.role)) continue;
            for (double x : *in.data.real(t.role))
                if (round_to(f, x) != x) {
                    exact = false;
                    break;
                }
            if (!exact) break;
        }
        if (exact) {
            in.narrowest = f;
            break;
        }
    }
    return in;
}

inline void require_exact_in(const std::filesystem::path& dir, const case_spec& spec, const case_data& data, binary_format f,
                             const std::string& why) {
    using namespace user_inputs_detail;
    for (const input_tensor_layout& t : input_layout(spec)) {
        if (!is_real_role(t.role)) continue;
        const std::vector<double>& v = *const_cast<case_data&>(data).real(t.role);
        for (std::size_t n = 0; n < v.size(); ++n)
            if (round_to(f, v[n]) != v[n])
                throw data_error(path_of(dir, t.role).string() + ": element " + std::to_string(n) + ", index " + index_text(n, t.shape) +
                                 ": value " + fmt_double(v[n]) + " is not exact in " + std::string(format_name(f)) + " (" + why + ")");
    }
}

}  // namespace attnref::golden
