/// Bindings of the golden-case library (include/attnref/golden/): load_case and check, for
/// attnref.load_case / attnref.check (python/attnref/__init__.py), with the inputs a verdict is about
/// (golden/rounded_inputs.hpp: resolve_inputs, derived_case; check/request.hpp: resolve_policy) and a declared precision policy
/// (policies.hpp: roundoffs_of_policy, check_options::policy). The work runs with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <map>

#include "attnref/golden/case.hpp"

#include "attnref/check/checker.hpp"
#include "attnref/check/gradients.hpp"  // gradient_roles
#include "attnref/check/request.hpp"
#include "attnref/golden/rounded_inputs.hpp"
#include "attnref/io/npy.hpp"
#include "attnref/multiprecision/policies.hpp"

namespace py = pybind11;
using namespace attnref;

namespace {

py::array_t<double> array_of(const std::vector<double>& v, const std::vector<std::size_t>& shape) {
    std::vector<py::ssize_t> s(shape.begin(), shape.end());
    py::array_t<double> a(s);
    std::copy(v.begin(), v.end(), a.mutable_data());
    return a;
}

/// (name, kind, conventions JSON text, inputs {role: array}, golden {role: float64 array}) of a loaded case.
py::tuple case_tuple(const golden::loaded_case& lc, const std::vector<double>* extra_grad_output = nullptr) {
    std::vector<std::pair<std::string, std::vector<double>>> golden_values;
    {
        py::gil_scoped_release release;
        for (const golden::tensor_entry& t : lc.m.tensors) {
            if (t.target || (t.role != "output" && t.role != "weights" && t.role != "lse")) continue;
            // load_case checked the file's sha256, dtype and shape against the manifest (a case in
            // memory: load_generated_case did, on its bytes).
            golden_values.emplace_back(t.role, lc.reference(t));
        }
    }
    py::dict inputs, reference;
    for (const golden::input_tensor_layout& layout : golden::input_layout(lc.m.spec)) {
        const std::string role(generator::role_name(layout.role));
        if (layout.role == generator::role::mask) {
            std::vector<py::ssize_t> s(layout.shape.begin(), layout.shape.end());
            py::array_t<bool> a(s);
            for (std::size_t n = 0; n < lc.data.mask.size(); ++n) a.mutable_data()[n] = lc.data.mask[n] != 0;
            inputs[role.c_str()] = a;
        } else {
            inputs[role.c_str()] = array_of(*const_cast<golden::case_data&>(lc.data).real(layout.role), layout.shape);  // read only
        }
    }
    if (extra_grad_output && !extra_grad_output->empty())
        inputs[std::string(generator::role_name(generator::role::grad_output)).c_str()] = array_of(*extra_grad_output, golden::output_shape(lc.m.spec));
    for (const auto& [role, values] : golden_values) {
        const std::vector<std::size_t> shape = role == "output" ? golden::output_shape(lc.m.spec)
                                               : role == "weights" ? golden::weights_shape(lc.m.spec)
                                                                   : golden::lse_shape(lc.m.spec);
        reference[role.c_str()] = array_of(values, shape);
    }
    return py::make_tuple(lc.m.spec.name, std::string(golden::kind_name(lc.m.spec.kind)), golden::to_json(lc.m.spec).dump(), inputs, reference);
}

/// The case at `dir` as case_tuple, plus the line saying which inputs it holds. input_format "":
/// the case's own inputs; a format F: the golden inputs rounded to nearest even to F and their
/// certified output, weights and lse (derived_case, in memory, the forward only: as `attnref generate
/// --golden DIR --input-format F` derives them; dO of a backward case rounded with the other inputs).
py::tuple load_case(const std::string& dir, const std::string& input_format) {
    std::optional<golden::loaded_case> lc;
    std::shared_ptr<const golden::loaded_case> rounded;  // the derived case, in memory
    std::optional<golden::fp8_quantised> fp8;
    std::vector<double> grad_output;
    std::string inputs;
    {
        py::gil_scoped_release release;
        lc = golden::load_case(dir);
        const std::string own = lc->m.spec.inputs.from_files ? "the case's own" : std::string("the case's own (") +
                                                                                   std::string(format_name(lc->m.spec.inputs.format)) + ")";
        inputs = "the golden inputs, " + own;
        if (const std::optional<golden::fp8_input_format> f8 = golden::fp8_format_from_name(input_format)) {
            // FP8: the inputs quantised per tensor (golden/rounded_inputs.hpp quantise_fp8), as
            // `attnref generate --golden DIR --input-format fp8e4m3` derives them.
            fp8.emplace(golden::quantise_case_fp8(*lc, *f8, "input_format: " + input_format));
            rounded = std::make_shared<const golden::loaded_case>(golden::derived_case(*lc, *f8, 0, false));
            grad_output = fp8->effective.grad_output;
            inputs = "the golden inputs quantised to " + input_format + " with per-tensor power-of-two scales (" + golden::fp8_descales_text(*fp8) +
                     "; reference certified for them: case " + rounded->m.spec.name + ")";
        } else if (!input_format.empty()) {
            const std::optional<binary_format> f = format_from_name(input_format);
            if (!f) throw std::invalid_argument("input_format: expected None, " + golden::input_selection_list(false) + ", got '" + input_format + "'");
            if (!golden::inputs_finite_in(lc->data, *f))
                throw std::invalid_argument("input_format: rounding the inputs of " + lc->m.spec.name + " to " + input_format + " overflows");
            rounded = std::make_shared<const golden::loaded_case>(golden::derived_case(*lc, *f, 0, false));
            if (!lc->data.grad_output.empty()) grad_output = golden::round_inputs(lc->data, *f).grad_output;
            inputs = "the golden inputs rounded to nearest even to " + input_format + " (reference certified for them: case " +
                     rounded->m.spec.name + ")";
        }
    }
    const py::tuple t = case_tuple(rounded ? *rounded : *lc, &grad_output);
    py::dict codes, descales;  // FP8: role -> uint8 codes (the input's shape), role -> descale
    if (fp8) {
        const golden::loaded_case& d = *rounded;
        for (const golden::fp8_tensor& x : fp8->tensors) {
            std::vector<std::size_t> shape{x.codes.size()};
            for (const golden::input_tensor_layout& l : golden::input_layout(d.m.spec))
                if (generator::role_name(l.role) == x.role) shape = l.shape;
            if (x.role == "grad_output") shape = golden::output_shape(d.m.spec);
            std::vector<py::ssize_t> s(shape.begin(), shape.end());
            py::array_t<std::uint8_t> a(s);
            std::copy(x.codes.begin(), x.codes.end(), a.mutable_data());
            codes[x.role.c_str()] = a;
            descales[x.role.c_str()] = x.scale.descale;
        }
    }
    return py::make_tuple(t[0], t[1], t[2], t[3], t[4], inputs, codes, descales);
}

tolerance::candidate_format format_named(const std::string& name, const char* argument) {
    const std::optional<binary_format> f = format_from_name(name);
    if (!f) throw std::invalid_argument(std::string(argument) + ": expected float64, float32, bfloat16 or float16, got '" + name + "'");
    return *f;
}

using f64 = py::array_t<double, py::array::c_style | py::array::forcecast>;

/// (verdict, reason, text report, JSON report, JUnit report, inputs rounded to (format name or ""),
/// the line saying which inputs). Every tensor is judged in `dtype` unless `formats` names its own
/// ({"output": "float32", "grad_query": "float16", …}). input_format: "auto", "case" or a format,
/// as `attnref check --input-format` (resolve_inputs; auto: the output's format, else the first
/// gradient's). policy: "" or a policy name of `attnref run --arith` (check --policy).
py::tuple check(const std::string& dir, const std::optional<f64>& output, const std::optional<f64>& weights, const std::optional<f64>& lse,
                const std::string& dtype, const std::string& model, const std::string& empty_lse,
                const std::vector<std::pair<std::string, f64>>& gradients, const std::string& backward,
                const std::map<std::string, std::string>& formats, const std::string& input_format, const std::string& policy) {
    // The library's rules (check/request.hpp): the policy, the inputs it implies; Python's argument names.
    golden::check_options opt;
    const std::optional<golden::input_selection> chosen = golden::input_selection_from_name(input_format);
    if (!chosen) throw std::invalid_argument("input_format: expected " + golden::input_selection_list() + ", got '" + input_format + "'");
    golden::input_selection inputs = *chosen;
    opt.policy = golden::resolve_policy(policy, !policy.empty(), inputs, golden::python_front_end());
    if (backward != "unknown") {
        opt.declared_backward = backward_algorithm_from_name(backward);
        if (!opt.declared_backward)
            throw std::invalid_argument("backward_algorithm: expected 'textbook', 'flash' or None, got '" + backward + "'");
    }
    const std::optional<tolerance::tolerance_model> m = tolerance::model_from_name(model);
    if (!m) throw std::invalid_argument("tolerance: unknown tolerance model '" + model + "'");
    opt.model = *m;
    if (empty_lse == "-inf") opt.empty_lse = empty_row_lse::minus_inf;
    else if (empty_lse == "+inf") opt.empty_lse = empty_row_lse::plus_inf;
    else if (empty_lse == "any") opt.empty_lse = empty_row_lse::any;
    else throw std::invalid_argument("empty_row_lse: expected '-inf', '+inf' or 'any', got '" + empty_lse + "'");
    golden::candidate c;
    c.format = format_named(dtype, "dtype");
    auto format_of = [&](const std::string& tensor) -> std::optional<tolerance::candidate_format> {
        const auto it = formats.find(tensor);
        if (it == formats.end()) return std::nullopt;
        return format_named(it->second, ("formats['" + tensor + "']").c_str());
    };
    for (const auto& [tensor, name] : formats) {
        const bool known = tensor == "output" || tensor == "weights" || tensor == "lse" ||
                           std::any_of(gradients.begin(), gradients.end(), [&](const auto& g) { return g.first == tensor; });
        if (!known) throw std::invalid_argument("formats: '" + tensor + "' is not a tensor given to this check");
    }
    if (const auto f = format_of("output")) c.format = *f;
    c.weights_format = format_of("weights");
    c.lse_format = format_of("lse");
    if (output) c.output = {output->data(), static_cast<std::size_t>(output->size())};
    for (const auto& [role, g] : gradients) c.gradients.push_back({role, {g.data(), static_cast<std::size_t>(g.size())}, format_of(role)});
    if (weights) c.weights = {weights->data(), static_cast<std::size_t>(weights->size())};
    if (lse) c.lse = {lse->data(), static_cast<std::size_t>(lse->size())};
    // The candidate's format for input_format "auto", as the command takes it from its first file:
    // the output's, else the first gradient's.
    const tolerance::candidate_format auto_format =
        output || gradients.empty() ? c.format : format_of(gradients.front().first).value_or(c.format);
    golden::check_result r;
    std::string text, json, junit;
    golden::resolved_inputs judged;
    {
        py::gil_scoped_release release;
        std::vector<std::string> roles;
        for (const auto& [role, g] : gradients) roles.push_back(role);
        golden::check_memory_required(dir, weights.has_value(), lse.has_value(), roles, opt.policy.has_value());
        const golden::loaded_case original = golden::load_case(dir);
        judged = golden::resolve_inputs(original, inputs, auto_format, opt.policy.has_value(), !gradients.empty(), 0,
                                        golden::python_front_end().input_option);
        const golden::loaded_case& lc = judged.judged(original);
        auto require = [&](const char* name, const py::array& a, const std::vector<std::size_t>& shape) {
            std::vector<std::size_t> got(a.shape(), a.shape() + a.ndim());
            if (got != shape) throw std::invalid_argument(std::string(name) + ": expected shape " + golden::shape_text(shape) + ", got " + golden::shape_text(got));
        };
        {
            py::gil_scoped_acquire acquire;
            if (output) require("output", *output, golden::output_shape(lc.m.spec));
            const auto roles = golden::gradient_roles(lc.m.spec);
            for (const auto& [role, g] : gradients) {
                const auto it = std::find_if(roles.begin(), roles.end(), [&](const auto& r) { return r.first == role; });
                if (it == roles.end())
                    throw std::invalid_argument(role + ": not a gradient of the " + std::string(golden::kind_name(lc.m.spec.kind)) + " case " + lc.m.spec.name);
                require(role.c_str(), g, it->second);
            }
            if (weights) require("weights", *weights, golden::weights_shape(lc.m.spec));
            if (lse) require("lse", *lse, golden::lse_shape(lc.m.spec));
        }
        try {
            r = golden::check(lc, c, opt);
        } catch (const golden::data_error& e) {
            // The library names the command's flag; the Python argument is policy=.
            const std::string m = e.what(), flag = "command line: --policy: ";
            if (m.rfind(flag, 0) == 0) throw std::invalid_argument("policy: " + m.substr(flag.size()));
            throw;
        }
        // As `attnref check` prints and writes them: the inputs line (and the declared policy) first.
        text = "inputs: " + judged.text + "\n" + (policy.empty() ? "" : "policy: " + policy + " (declared)\n") +
               golden::report_table(r, false);
        nlohmann::ordered_json j = nlohmann::ordered_json::parse(golden::report_json(r));
        j["inputs"] = judged.text;
        if (!policy.empty()) j["policy"] = policy;
        json = j.dump(2) + "\n";
        junit = golden::report_junit(r);
    }
    return py::make_tuple(std::string(golden::verdict_name(r.overall)), r.reason, text, json, junit,
                          judged.fp8 ? golden::fp8_format_name(*judged.fp8)
                          : judged.rounded_to ? std::string(format_name(*judged.rounded_to)) : std::string(), judged.text);
}

}  // namespace

void bind_golden(py::module_& m) {
    // A bad case directory or file: ValueError with the library's one-line message (file and field).
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const golden::data_error& e) {
            PyErr_SetString(PyExc_ValueError, e.what());
        }
    });
    m.def("_load_case", &load_case, py::arg("path"), py::arg("input_format") = std::string());
    m.def("_check", &check, py::arg("path"), py::arg("output"), py::arg("weights"), py::arg("lse"), py::arg("dtype"),
          py::arg("tolerance"), py::arg("empty_row_lse"), py::arg("gradients"), py::arg("backward_algorithm"),
          py::arg("formats") = std::map<std::string, std::string>{}, py::arg("input_format") = std::string("auto"),
          py::arg("policy") = std::string());
    // The precision policies' names (policies.hpp), as `attnref run --arith` and `check --policy` take them.
    // The input formats of load_case/check (golden/input_selection.hpp), without "auto" and "case".
    m.def("_input_format_names", [] { return golden::input_selection_names(false); });
    m.def("_policy_names", [] {
        std::vector<std::string> names;
        for (const policy_entry& p : policy_names) names.emplace_back(p.name);
        return names;
    });
}
