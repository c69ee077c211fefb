#pragma once
/// \file golden/rounded_inputs.hpp
/// Owns: the case a kernel of a narrower format actually computes on. A bf16 kernel reads its inputs
/// in bf16: the golden inputs rounded to nearest even (what torch's .to(torch.bfloat16), NumPy's
/// ml_dtypes cast and attnref's own storage conversions do). Judging it against the certified result
/// of the golden (float64) inputs makes its bound absorb the inputs' rounding — for d_model-wide
/// projections, logits near 1000 and gradients as large as the values themselves. Judged against the
/// certified result of the rounded inputs, the bound covers only the kernel's own arithmetic (the
/// checker then finds every input exact in the candidate's format: no input-rounding term, u_inputs = 0).
///
///   inputs_exact_in(data, f)       every real input and grad_output is a value of f
///   inputs_finite_in(data, f)      rounding them to f overflows none
///   round_inputs(data, f)          q, k, v (x for MHA), the projections' W and b and grad_output rounded
///                                  once to nearest even into f; masks (boolean, additive, seed) as given
///   rounded_spec(spec, data, f)    the derived case's spec: name + "_inputs_" + f, inputs.format f; the
///                                  generator's when it regenerates exactly these inputs, else a "files"
///                                  case recording each input's '<f8' file sha256
///   rounded_case(lc, f, threads)   the derived case certified (generate_case: the fast certified forward,
///                                  fast_certify.hpp, and the certified backward for gradient cases)
///   derived_case(lc, f, threads)   the derived case certified and read back in memory (load_case's
///                                  checks, load_generated_case)
///   fp8 inputs (fp8e4m3, fp8e5m2): every real input tensor and grad_output quantised per tensor
///                                  as FlashAttention-3, cuDNN and Transformer Engine take FP8 inputs
///                                  (core/formats.hpp fp8_tensor_scale: s = 2^e the largest power of
///                                  two with amax·s <= max finite, codes = round(x·s) saturating,
///                                  descale 1/s); the derived case's inputs are the effective values
///                                  codes·descale (exact), named name + "_inputs_fp8e4m3"
///   quantise_fp8(data, f)          the codes, scales and effective inputs of every tensor
///   input_selection, resolve_inputs(lc, choice, …)  which inputs a verdict is about (`attnref check
///                                  --input-format`, attnref.check(input_format=)), its names once; the
///                                  rule, the derived case in memory, the report line
/// Needs MPFR and MPFI (generate.hpp).

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <variant>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnref/core/formats.hpp"
#include "attnref/golden/case.hpp"
#include "attnref/golden/generate.hpp"
#include "attnref/golden/input_selection.hpp"
#include "attnref/golden/sha256.hpp"
#include "attnref/bounds/tolerance/names.hpp"

namespace attnref::golden {

namespace rounded_detail {
/// The real-valued inputs that a kernel reads in its storage format (not the masks).
inline std::vector<std::vector<double>*> rounded_roles(case_data& d) {
    return {&d.query, &d.key, &d.value, &d.w_q, &d.w_k, &d.w_v, &d.w_o, &d.b_q, &d.b_k, &d.b_v, &d.b_o, &d.grad_output};
}
}  // namespace rounded_detail

/// What the inputs are rounded to: a binary_format (round to nearest even) or an FP8 format with a
/// per-tensor scale.
using input_rounding = std::variant<binary_format, fp8_input_format>;
inline std::string rounding_name(const input_rounding& r) {
    return std::holds_alternative<binary_format>(r) ? std::string(format_name(std::get<binary_format>(r)))
                                                    : fp8_format_name(std::get<fp8_input_format>(r));
}

/// One input tensor quantised to FP8: its role, scale (core/formats.hpp fp8_tensor_scale) and codes
/// (the bit patterns, C order).
struct fp8_tensor {
    std::string role;
    fp8_tensor_scale scale;
    std::vector<std::uint8_t> codes;
    double amax = 0;  // max |x| over the tensor
};
/// Every real input and grad_output of a case quantised to FP8 (per tensor), with the effective
/// inputs codes·descale in `effective` (masks as given).
struct fp8_quantised {
    fp8_input_format format;
    std::vector<fp8_tensor> tensors;
    case_data effective;
};

/// Whether every real input and grad_output is finite: the amax scale needs finite tensors.
inline bool inputs_all_finite(const case_data& data) {
    case_data& d = const_cast<case_data&>(data);  // read only
    for (const std::vector<double>* v : rounded_detail::rounded_roles(d))
        for (double x : *v)
            if (!std::isfinite(x)) return false;
    return true;
}

/// The case's inputs quantised to f, tensor by tensor (the file comment's rule). Non-finite inputs
/// throw data_error (no amax scale is defined for them).
inline fp8_quantised quantise_fp8(const case_data& data, fp8_input_format f) {
    if (!inputs_all_finite(data)) throw data_error("the inputs hold a non-finite value: no per-tensor FP8 scale (amax) is defined");
    static constexpr const char* names[] = {"query", "key", "value", "w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o", "grad_output"};
    fp8_quantised r{f, {}, data};
    const auto roles = rounded_detail::rounded_roles(r.effective);
    for (std::size_t n = 0; n < roles.size(); ++n) {
        std::vector<double>& v = *roles[n];
        if (v.empty()) continue;
        double amax = 0;
        for (double x : v) amax = std::max(amax, std::abs(x));
        fp8_tensor t{names[n], {}, std::vector<std::uint8_t>(v.size()), amax};
        auto apply = [&]<class F>() {
            t.scale = fp8_scale_for<F>(amax);
            for (std::size_t i = 0; i < v.size(); ++i) {
                const F q = fp8_quantise<F>(v[i], t.scale);
                t.codes[i] = q.bits();
                v[i] = fp8_dequantise(q, t.scale);
                // A finite input near float64's limit whose code·descale overflows: no FP8 input
                // carries it (bad input, said at once rather than found by the certification).
                if (!std::isfinite(v[i]))
                    throw data_error(t.role + " (flat index " + std::to_string(i) + "): quantised to " + fp8_format_name(f) +
                                     " its effective value code·descale overflows float64 (descale 2^" + std::to_string(-t.scale.exponent) +
                                     "); no FP8 tensor holds an input this close to float64's largest value");
            }
        };
        if (f == fp8_input_format::e4m3) apply.template operator()<float8_e4m3>();
        else apply.template operator()<float8_e5m2>();
        r.tensors.push_back(std::move(t));
    }
    return r;
}

/// quantise_fp8 of a loaded case, its errors prefixed with `where` (e.g. "command line: --input-format
/// fp8e4m3", "input_format: fp8e4m3") and the case's name: the one rule every front end applies.
inline fp8_quantised quantise_case_fp8(const loaded_case& lc, fp8_input_format f, const std::string& where) {
    if (!inputs_all_finite(lc.data))
        throw data_error(where + ": case " + lc.m.spec.name + " has a non-finite input; no per-tensor FP8 scale is defined");
    try {
        return quantise_fp8(lc.data, f);
    } catch (const data_error& e) {
        throw data_error(where + ": case " + lc.m.spec.name + ": " + e.what());
    }
}

/// The descales as the report names them, e.g. "descale query 2^-8, key 2^-7, value 2^-8".
inline std::string fp8_descales_text(const fp8_quantised& q) {
    std::string t = "descale";
    for (const fp8_tensor& x : q.tensors)
        t += (t == "descale" ? " " : ", ") + x.role + " 2^" + std::to_string(-x.scale.exponent);
    return t;
}

/// Whether every real input of the case (and grad_output) is a value of format f (non-finite values
/// count as exact: rounding keeps them).
inline bool inputs_exact_in(const case_data& data, binary_format f) {
    case_data& d = const_cast<case_data&>(data);  // read only
    for (const std::vector<double>* v : rounded_detail::rounded_roles(d))
        for (double x : *v)
            if (std::isfinite(x) && round_to(f, x) != x) return false;
    return true;
}

/// Whether rounding the inputs to f keeps every finite input finite (no overflow to ±inf).
inline bool inputs_finite_in(const case_data& data, binary_format f) {
    case_data& d = const_cast<case_data&>(data);  // read only
    for (const std::vector<double>* v : rounded_detail::rounded_roles(d))
        for (double x : *v)
            if (std::isfinite(x) && !std::isfinite(round_to(f, x))) return false;
    return true;
}

/// The inputs rounded once to nearest even into f (IEEE overflow to ±inf, subnormals kept).
inline case_data round_inputs(const case_data& data, binary_format f) {
    case_data r = data;
    for (std::vector<double>* v : rounded_detail::rounded_roles(r))
        for (double& x : *v) x = round_to(f, x);
    return r;
}

/// The derived case's spec (see the file comment). `rounded`: round_inputs(data, f) of the case.
/// For FP8 (r an fp8_input_format) the spec is always a "files" case, named name + "_inputs_fp8e4m3",
/// its inputs.format the narrowest of bfloat16, float32, float64 that holds every effective input.
inline case_spec rounded_spec(const case_spec& spec, const case_data& rounded, const input_rounding& r) {
    case_spec s = spec;
    s.name = spec.name + "_inputs_" + rounding_name(r);
    if (std::holds_alternative<binary_format>(r)) {
        s.inputs.format = std::get<binary_format>(r);
    } else {
        s.inputs.format = binary_format::float64;
        for (binary_format f : {binary_format::float32, binary_format::bfloat16})
            if (inputs_exact_in(rounded, f)) s.inputs.format = f;
    }
    if (!spec.inputs.from_files && std::holds_alternative<binary_format>(r)) {
        const case_data regenerated = generate_inputs(s);
        bool same = true;
        case_data& a = const_cast<case_data&>(rounded);
        case_data& b = const_cast<case_data&>(regenerated);
        const auto ra = rounded_detail::rounded_roles(a), rb = rounded_detail::rounded_roles(b);
        for (std::size_t n = 0; n < ra.size() && same; ++n) same = *ra[n] == *rb[n];
        same = same && a.mask == b.mask && a.additive_mask == b.additive_mask && a.seed_mask == b.seed_mask;
        if (same) return s;  // the generator with inputs.format f makes exactly these inputs
    }
    // A "files" case: one record per input role, each the '<f8' file the case stores (its sha256).
    s.inputs.from_files = true;
    s.inputs.files.clear();
    for (const input_tensor_layout& t : input_layout(s)) {
        const std::string role(generator::role_name(t.role));
        std::vector<std::byte> bytes;
        std::string dtype = "<f8";
        if (t.role == generator::role::mask) {
            dtype = "|b1";
            bytes = npy::serialize(npy::make_array("|b1", t.shape, rounded.mask));
        } else {
            bytes = generate_detail::serialize_doubles(t.shape, *const_cast<case_data&>(rounded).real(t.role));
        }
        s.inputs.files.push_back({role, dtype, sha256_hex(bytes)});
    }
    return s;
}

/// The derived case: the inputs rounded to f and their certified reference (output, weights, lse and,
/// for gradient cases, every gradient), as generate_case writes a case.
/// with_gradients false: the forward only (a gradient case loses its gradients and grad_output).
/// For FP8 the inputs are quantise_fp8's effective inputs.
inline generated_case rounded_case(const loaded_case& lc, const input_rounding& f, std::size_t threads,
                                   const std::function<void(const std::string&)>& progress = {}, bool with_gradients = true) {
    case_data data = std::holds_alternative<binary_format>(f) ? round_inputs(lc.data, std::get<binary_format>(f))
                                                              : quantise_fp8(lc.data, std::get<fp8_input_format>(f)).effective;
    case_spec base = lc.m.spec;
    if (!with_gradients && base.outputs.gradients) {
        base.outputs.gradients = false;
        data.grad_output.clear();
    }
    const case_spec spec = rounded_spec(base, data, f);
    return generate_case(spec, threads, progress, certification_method::fast, &data);
}

/// The derived case certified and read back in memory (load_generated_case: load_case's checks on
/// its files, which never touch the disk).
inline loaded_case derived_case(const loaded_case& lc, const input_rounding& f, std::size_t threads, bool with_gradients = true) {
    return load_generated_case(rounded_case(lc, f, threads, {}, with_gradients));
}

/// The FP8 inputs of a derived case as files for users, in DIR/fp8/ (the derived case's directory
/// DIR: its '<f8' inputs are the effective values code·descale, its reference theirs):
///   <role>.npy   the codes of each quantised tensor, uint8 '|u1' bit patterns, the input's shape
///   fp8.json     {"format", "encoding", "scale_rule", "case", "tensors": [{"role", "file", "dtype",
///                "shape", "scale", "descale", "scale_exponent", "amax", "sha256"}]} (see golden/README.md)
/// fp8_files() makes them in memory, (file name, bytes), fp8.json last: one writer (write_fp8_files,
/// each file atomically) and one comparison (fp8_files_difference: `generate --verify`, a rerun
/// without --force) read them.
inline std::vector<std::pair<std::string, std::string>> fp8_files(const case_spec& derived, const fp8_quantised& q) {
    std::vector<std::pair<std::string, std::string>> files;
    nlohmann::ordered_json j;
    j["format"] = fp8_format_name(q.format);
    j["encoding"] = q.format == fp8_input_format::e4m3
                        ? "OCP E4M3FN: 1 sign, 4 exponent (bias 7), 3 fraction bits; max 448 (0x7E); no infinity; NaN 0x7F/0xFF; "
                          "min subnormal 2^-9"
                        : "OCP E5M2: 1 sign, 5 exponent (bias 15), 2 fraction bits; max 57344 (0x7B); inf 0x7C/0xFC; NaN 0x7D-0x7F/0xFD-0xFF; "
                          "min subnormal 2^-16";
    j["scale_rule"] = "per tensor: scale = 2^e, the largest power of two with amax*scale <= max finite (amax = max |x|; "
                      "amax 0: scale 1); code = x*scale rounded to nearest even, saturating (never reached: amax*scale <= max); "
                      "descale = 1/scale; effective input = value(code)*descale, exact";
    j["case"] = derived.name;
    j["tensors"] = nlohmann::ordered_json::array();
    for (const fp8_tensor& t : q.tensors) {
        std::vector<std::size_t> shape{t.codes.size()};
        for (const input_tensor_layout& l : input_layout(derived))
            if (generator::role_name(l.role) == t.role) shape = l.shape;
        if (t.role == "grad_output") shape = output_shape(derived);
        const std::vector<std::byte> bytes = npy::serialize(npy::make_array("|u1", shape, t.codes));
        const std::string file = t.role + ".npy";
        files.emplace_back(file, std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
        nlohmann::ordered_json e;
        e["role"] = t.role;
        e["file"] = file;
        e["dtype"] = "|u1";
        e["shape"] = shape;
        e["scale"] = t.scale.scale;
        e["descale"] = t.scale.descale;
        e["scale_exponent"] = t.scale.exponent;
        e["amax"] = t.amax;
        e["sha256"] = sha256_hex(bytes);
        j["tensors"].push_back(e);
    }
    files.emplace_back("fp8.json", j.dump(2) + "\n");
    return files;
}

inline void write_fp8_files(const std::filesystem::path& dir, const case_spec& derived, const fp8_quantised& q) {
    const std::filesystem::path sub = dir / "fp8";
    std::error_code ec;
    std::filesystem::create_directories(sub, ec);
    if (ec) throw data_error(sub.string() + ": cannot create the directory: " + ec.message());
    for (const auto& [file, bytes] : fp8_files(derived, q)) write_file_atomic(sub / file, bytes, true);
}

/// The first difference between <dir>/fp8/ on disk and the files fp8_files() makes ("" when every file
/// is there, byte for byte; a file that cannot be read counts as different).
inline std::string fp8_files_difference(const std::filesystem::path& dir, const case_spec& derived, const fp8_quantised& q) {
    for (const auto& [file, bytes] : fp8_files(derived, q)) {
        const std::filesystem::path p = dir / "fp8" / file;
        std::error_code ec;
        if (!std::filesystem::is_regular_file(p, ec)) return "fp8/" + file + " is missing";
        try {
            if (read_file_capped(p.string(), bytes.size() + 1, dir) != bytes) return "fp8/" + file + " differs";
        } catch (const data_error&) {
            return "fp8/" + file + " differs";
        }
    }
    return "";
}

/// The inputs a verdict is about: the derived case when the golden inputs were rounded or quantised
/// (`derived`, in memory; nullptr for the case's own), the format, and the report's line saying so.
struct resolved_inputs {
    std::optional<binary_format> rounded_to;
    std::optional<fp8_input_format> fp8;
    std::string text;
    std::shared_ptr<const loaded_case> derived;
    /// The case the candidate is judged against: the derived one, or `original`.
    const loaded_case& judged(const loaded_case& original) const { return derived ? *derived : original; }
};

/// Which inputs a candidate is judged on. "case": the case's own; a format F: the golden inputs
/// rounded to nearest even to F; fp8e4m3 or fp8e5m2: the inputs quantised per tensor (quantise_fp8;
/// non-finite inputs, an overflowing code·descale or a reference that cannot be certified throw
/// data_error); "auto": the candidate's format `candidate`, rounded only for 16-bit candidates and
/// declared policies — for float32 and float64 the inputs' rounding is far inside the bound (the
/// verdicts are the same), and certifying the rounded inputs' gradients costs seconds; a declared
/// policy's bounds count every storage rounding with its widest roundoff, so the inputs are rounded
/// for it too. The case's own inputs stay when they are exact in F, when rounding them would overflow,
/// or when the rounded inputs' reference cannot be certified (an exact zero or a tie of their
/// gradients); the line says which. The derived case (with its gradients when with_gradients) is
/// certified with `threads` threads and held in memory. `option` names the choice in the line and in
/// errors: "--input-format" (the command: "--input-format auto") or a keyword ending in '='
/// ("input_format=": "input_format='auto'").
inline resolved_inputs resolve_inputs(const loaded_case& lc, const input_selection& choice, std::optional<binary_format> candidate,
                                      bool policy_declared, bool with_gradients, std::size_t threads = 0,
                                      const std::string& option = "--input-format") {
    const bool keyword = !option.empty() && option.back() == '=';
    const std::string name = input_selection_name(choice);
    const std::string named = keyword ? option + "'" + name + "'" : option + " " + name;
    const std::string own = lc.m.spec.inputs.from_files ? "the case's own" : std::string("the case's own (") +
                                                                               std::string(format_name(lc.m.spec.inputs.format)) + ")";
    auto kept = [&](std::string why) { return resolved_inputs{std::nullopt, std::nullopt, "the golden inputs, " + own + why, nullptr}; };
    if (choice.k == input_selection::kind::case_inputs) return kept(" (" + named + ")");
    if (choice.k == input_selection::kind::fp8) {
        // FP8: always the quantised inputs (FP8 rounding is far outside any bound for the case's own
        // inputs); a case whose quantised inputs cannot be made or certified is a usage error, not a
        // fallback to inputs the kernel did not read.
        const std::string where = keyword ? option.substr(0, option.size() - 1) : "command line: " + option;
        const fp8_quantised q = quantise_case_fp8(lc, choice.fp8, where + ": " + name);
        resolved_inputs r{std::nullopt, choice.fp8, "", nullptr};
        try {
            r.derived = std::make_shared<const loaded_case>(derived_case(lc, choice.fp8, threads, with_gradients));
        } catch (const check_failure& e) {
            throw data_error(where + ": " + name + ": the reference for the inputs of " + lc.m.spec.name + " quantised to " + name +
                             " could not be certified: " + e.what());
        }
        r.text = "the golden inputs quantised to " + name + " with per-tensor power-of-two scales (amax rule, saturating; " +
                 fp8_descales_text(q) + "; the kernel's effective input is code·descale) (" + named +
                 "; reference certified for them: case " + r.derived->m.spec.name + ")";
        return r;
    }
    std::optional<binary_format> f = candidate;
    if (choice.k == input_selection::kind::rounded) f = choice.format;
    if (choice.k == input_selection::kind::automatic && f && !policy_declared && unit_roundoff(*f) <= unit_roundoff(binary_format::float32))
        return kept(" (" + named + ": rounded only for 16-bit candidates and declared policies)");
    if (!f || inputs_exact_in(lc.data, *f)) return kept(f ? std::string(", exact in ") + std::string(format_name(*f)) : std::string());
    const std::string fn(format_name(*f));
    if (!inputs_finite_in(lc.data, *f)) return kept(" (rounding them to " + fn + " would overflow)");
    resolved_inputs r{f, std::nullopt, "", nullptr};
    try {
        r.derived = std::make_shared<const loaded_case>(derived_case(lc, *f, threads, with_gradients));
    } catch (const check_failure& e) {  // e.g. an exact zero or a tie of the rounded inputs' gradients no interval can certify
        return kept(" (the reference for them rounded to " + fn + " could not be certified: " + e.what() + ")");
    } catch (const data_error& e) {
        return kept(" (the reference for them rounded to " + fn + " could not be made: " + e.what() + ")");
    }
    r.text = "the golden inputs rounded to nearest even to " + fn + " (" + named + "; reference certified for them: case " +
             r.derived->m.spec.name + ")";
    return r;
}

}  // namespace attnref::golden
