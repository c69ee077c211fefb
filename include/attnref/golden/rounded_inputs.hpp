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
///   rounded_case_dir               the derived case written to a fresh temporary directory and loaded
///                                  back (load_case's checks), removed again when it goes out of scope
///   choose_inputs(lc, choice, …)   which inputs a verdict is about (`attnref check --input-format`,
///                                  attnref.check(input_format=)): the rule, the derived case, the report line
/// Needs MPFR and MPFI (generate.hpp).

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "attnref/golden/case.hpp"
#include "attnref/golden/generate.hpp"
#include "attnref/golden/sha256.hpp"
#include "attnref/bounds/tolerance/names.hpp"

namespace attnref::golden {

namespace rounded_detail {
/// The real-valued inputs that a kernel reads in its storage format (not the masks).
inline std::vector<std::vector<double>*> rounded_roles(case_data& d) {
    return {&d.query, &d.key, &d.value, &d.w_q, &d.w_k, &d.w_v, &d.w_o, &d.b_q, &d.b_k, &d.b_v, &d.b_o, &d.grad_output};
}
}  // namespace rounded_detail

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
inline case_spec rounded_spec(const case_spec& spec, const case_data& rounded, binary_format f) {
    case_spec s = spec;
    s.name = spec.name + "_inputs_" + std::string(format_name(f));
    s.inputs.format = f;
    if (!spec.inputs.from_files) {
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
inline generated_case rounded_case(const loaded_case& lc, binary_format f, std::size_t threads,
                                   const std::function<void(const std::string&)>& progress = {}, bool with_gradients = true) {
    case_data data = round_inputs(lc.data, f);
    case_spec base = lc.m.spec;
    if (!with_gradients && base.outputs.gradients) {
        base.outputs.gradients = false;
        data.grad_output.clear();
    }
    const case_spec spec = rounded_spec(base, data, f);
    return generate_case(spec, threads, progress, certification_method::fast, &data);
}

/// The derived case in a fresh temporary directory (removed by the destructor), loaded back.
class rounded_case_dir {
public:
    rounded_case_dir(const loaded_case& lc, binary_format f, std::size_t threads, bool with_gradients = true) {
        std::error_code ec;
        std::string pattern = (std::filesystem::temp_directory_path(ec) / "attnref-inputs-XXXXXX").string();
        if (ec) throw data_error("cannot find a temporary directory for the rounded-inputs case: " + ec.message());
        std::vector<char> buf(pattern.begin(), pattern.end());
        buf.push_back('\0');
        if (!::mkdtemp(buf.data())) throw data_error("cannot create a temporary directory for the rounded-inputs case (" + pattern + ")");
        root_ = buf.data();
        try {
            const generated_case g = rounded_case(lc, f, threads, {}, with_gradients);
            dir_ = root_ / g.m.spec.name;
            write_case(dir_, g);
            lc_ = load_case(dir_);
        } catch (...) {  // the destructor does not run for a constructor that throws
            std::error_code ec;
            std::filesystem::remove_all(root_, ec);
            throw;
        }
    }
    rounded_case_dir(const rounded_case_dir&) = delete;
    rounded_case_dir& operator=(const rounded_case_dir&) = delete;
    ~rounded_case_dir() {
        std::error_code ec;
        if (!root_.empty()) std::filesystem::remove_all(root_, ec);
    }
    const loaded_case& loaded() const { return lc_; }
    const std::filesystem::path& dir() const { return dir_; }

private:
    std::filesystem::path root_, dir_;
    loaded_case lc_;
};

/// The inputs a verdict is about: nullopt the case's own, else the format the golden inputs were
/// rounded to (the checker then judges against `rounded`'s case), and the report's line saying so.
struct input_choice {
    std::optional<binary_format> rounded_to;
    std::string text;
};

/// Which inputs a candidate is judged on (`attnref check --input-format CHOICE`, attnref.check's
/// input_format=). choice: "case" (the case's own inputs), a format name F (the golden inputs rounded
/// to nearest even to F), or "auto": the candidate's format `candidate`, rounded only for 16-bit
/// candidates and declared policies — for float32 and float64 the inputs' rounding is far inside the
/// bound (the verdicts are the same), and certifying the rounded inputs' gradients costs seconds; a
/// declared policy's bounds count every storage rounding with its widest roundoff, so the inputs are
/// rounded for it too. The case's own inputs stay when they are exact in F, when rounding them would
/// overflow, or when the rounded inputs' reference cannot be certified (an exact zero or a tie of
/// their gradients); the line says which. Otherwise `rounded` holds the derived case (rounded_case_dir,
/// with its gradients when with_gradients), certified with `threads` threads. `option` names the choice
/// in the line and in errors: "--input-format" (the command: "--input-format auto") or a keyword
/// ending in '=' ("input_format=": "input_format='auto'"). An unknown choice throws data_error.
inline input_choice choose_inputs(const loaded_case& lc, const std::string& choice, std::optional<binary_format> candidate,
                                   bool policy_declared, bool with_gradients, std::optional<rounded_case_dir>& rounded,
                                   std::size_t threads = 0, const std::string& option = "--input-format") {
    const bool keyword = !option.empty() && option.back() == '=';
    const std::string named = keyword ? option + "'" + choice + "'" : option + " " + choice;
    const std::string own = lc.m.spec.inputs.from_files ? "the case's own" : std::string("the case's own (") +
                                                                               std::string(format_name(lc.m.spec.inputs.format)) + ")";
    if (choice == "case") return {std::nullopt, "the golden inputs, " + own + " (" + named + ")"};
    std::optional<binary_format> f = candidate;
    if (choice != "auto") {
        f = format_from_name(choice);
        if (!f)
            throw data_error((keyword ? option.substr(0, option.size() - 1) : "command line: " + option) +
                             ": expected auto, case, float64, float32, bfloat16 or float16, got '" + choice + "'");
    }
    if (choice == "auto" && f && !policy_declared && unit_roundoff(*f) <= unit_roundoff(binary_format::float32))
        return {std::nullopt, "the golden inputs, " + own + " (" + named + ": rounded only for 16-bit candidates and declared policies)"};
    if (!f || inputs_exact_in(lc.data, *f))
        return {std::nullopt, "the golden inputs, " + own + (f ? std::string(", exact in ") + std::string(format_name(*f)) : std::string())};
    if (!inputs_finite_in(lc.data, *f))
        return {std::nullopt, "the golden inputs, " + own + " (rounding them to " + std::string(format_name(*f)) + " would overflow)"};
    try {
        rounded.emplace(lc, *f, threads, with_gradients);
    } catch (const check_failure& e) {  // e.g. an exact zero or a tie of the rounded inputs' gradients no interval can certify
        return {std::nullopt, "the golden inputs, " + own + " (the reference for them rounded to " + std::string(format_name(*f)) +
                                  " could not be certified: " + e.what() + ")"};
    } catch (const data_error& e) {
        return {std::nullopt, "the golden inputs, " + own + " (the reference for them rounded to " + std::string(format_name(*f)) +
                                  " could not be made: " + e.what() + ")"};
    }
    return {f, "the golden inputs rounded to nearest even to " + std::string(format_name(*f)) + " (" + named +
                   "; reference certified for them: case " + rounded->loaded().m.spec.name + ")"};
}

}  // namespace attnref::golden
