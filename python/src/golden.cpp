/// Bindings of the golden-case library (include/attnref/golden/): load_case and check, for
/// attnref.load_case / attnref.check (python/attnref/__init__.py). The work runs with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <map>

#include "attnref/golden/case.hpp"

#include "attnref/golden/check.hpp"
#include "attnref/npy.hpp"

namespace py = pybind11;
using namespace attnref;

namespace {

py::array_t<double> array_of(const std::vector<double>& v, const std::vector<std::size_t>& shape) {
    std::vector<py::ssize_t> s(shape.begin(), shape.end());
    py::array_t<double> a(s);
    std::copy(v.begin(), v.end(), a.mutable_data());
    return a;
}

/// (name, kind, conventions JSON text, inputs {role: array}, golden {role: float64 array}).
py::tuple load_case(const std::string& dir) {
    golden::loaded_case lc;
    std::vector<std::pair<std::string, std::vector<double>>> golden_values;
    {
        py::gil_scoped_release release;
        lc = golden::load_case(dir);
        for (const golden::tensor_entry& t : lc.m.tensors) {
            if (t.target || (t.role != "output" && t.role != "weights" && t.role != "lse")) continue;
            // load_case checked the file's sha256, dtype and shape against the manifest.
            const npy::array a = npy::read(std::filesystem::path(dir) / t.file, npy::expectation{{t.dtype}, t.shape});
            golden_values.emplace_back(t.role, npy::to_vector<double>(a));
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
            inputs[role.c_str()] = array_of(*lc.data.real(layout.role), layout.shape);
        }
    }
    for (const auto& [role, values] : golden_values) {
        const std::vector<std::size_t> shape = role == "output" ? golden::output_shape(lc.m.spec)
                                               : role == "weights" ? golden::weights_shape(lc.m.spec)
                                                                   : golden::lse_shape(lc.m.spec);
        reference[role.c_str()] = array_of(values, shape);
    }
    return py::make_tuple(lc.m.spec.name, std::string(golden::kind_name(lc.m.spec.kind)), golden::to_json(lc.m.spec).dump(), inputs, reference);
}

tolerance::candidate_format format_named(const std::string& name, const char* argument) {
    const std::optional<binary_format> f = format_from_name(name);
    if (!f) throw std::invalid_argument(std::string(argument) + ": expected float64, float32, bfloat16 or float16, got '" + name + "'");
    return *f;
}

using f64 = py::array_t<double, py::array::c_style | py::array::forcecast>;

/// (verdict, reason, text report, JSON report, JUnit report). Every tensor is judged in `dtype`
/// unless `formats` names its own ({"output": "float32", "grad_query": "float16", …}).
py::tuple check(const std::string& dir, const std::optional<f64>& output, const std::optional<f64>& weights, const std::optional<f64>& lse,
                const std::string& dtype, const std::string& model, const std::string& empty_lse,
                const std::vector<std::pair<std::string, f64>>& gradients, const std::string& backward,
                const std::map<std::string, std::string>& formats) {
    golden::check_options opt;
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
    golden::check_result r;
    std::string text, json, junit;
    {
        py::gil_scoped_release release;
        const golden::loaded_case lc = golden::load_case(dir);
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
        r = golden::check(lc, c, opt);
        text = golden::report_table(r, false);
        json = golden::report_json(r);
        junit = golden::report_junit(r);
    }
    return py::make_tuple(std::string(golden::verdict_name(r.overall)), r.reason, text, json, junit);
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
    m.def("_load_case", &load_case, py::arg("path"));
    m.def("_check", &check, py::arg("path"), py::arg("output"), py::arg("weights"), py::arg("lse"), py::arg("dtype"),
          py::arg("tolerance"), py::arg("empty_row_lse"), py::arg("gradients"), py::arg("backward_algorithm"),
          py::arg("formats") = std::map<std::string, std::string>{});
}
