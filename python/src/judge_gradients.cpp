/// A candidate's gradients against a Reference's certified gradients, for
/// attnref.testing.assert_attention_close: the call and its dO become the golden backward case
/// (backward_case.hpp), and the checker judges them exactly as `attnref check --grad-*` does —
/// golden::check_gradients (gradient_bounds_for's data-aware bounds, the vacuity rule, the
/// decoy gradients, the gradient invariants) and golden::decide. Nothing here restates a rule.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "attnref/check/checker.hpp"
#include "attnref/check/gradients.hpp"  // check_gradients, gradient_reference (not among the compiled entry points)
#include "backward_case.hpp"
#include "dicts.hpp"

namespace py = pybind11;

namespace attnref::python {

namespace {

using f64 = py::array_t<double, py::array::c_style | py::array::forcecast>;

std::vector<double> vector_of(const f64& a) { return std::vector<double>(a.data(), a.data() + a.size()); }

py::dict tensor_dict(const golden::tensor_report& t) {
    py::dict d;
    d["name"] = t.name;
    d["verdict"] = std::string(golden::verdict_name(t.verdict));
    d["note"] = t.note;
    add_comparison(d, t.cmp, t.vacuous);
    return d;
}

}  // namespace

/// Registers _judge_gradients(call, grad_output, weights, lse, certified, format, candidate,
/// backward_algorithm): `certified` and `candidate` are lists of (role, float64 array);
/// weights and lse are the Reference's certified forward values. Returns {"verdict", "reason",
/// "tensors", "invariants"}, the rows of `attnref check`'s report. `call_of` reads module.cpp's
/// call object.
void bind_judge_gradients(py::module_& m, const call& (*call_of)(py::handle)) {
    m.def(
        "_judge_gradients",
        [call_of](py::handle pc, const f64& grad_output, const f64& weights, const f64& lse,
                  const std::vector<std::pair<std::string, f64>>& certified, const std::string& format,
                  const std::vector<std::pair<std::string, f64>>& candidate, const std::string& backward) {
            const call& c = call_of(pc);
            const std::optional<binary_format> f = format_from_name(format);
            if (!f) throw std::invalid_argument("dtype: expected float64, float32, bfloat16 or float16, got '" + format + "'");
            std::optional<backward_algorithm> declared;
            if (backward != "unknown") {
                declared = backward_algorithm_from_name(backward);
                if (!declared) throw std::invalid_argument("backward_algorithm: expected 'textbook', 'flash' or None, got '" + backward + "'");
            }
            array_ref g;
            g.data = grad_output.data();
            for (py::ssize_t d = 0; d < grad_output.ndim(); ++d) g.shape.push_back(static_cast<std::size_t>(grad_output.shape(d)));
            golden::gradient_reference ref;
            ref.weights = vector_of(weights);
            ref.lse = vector_of(lse);
            for (const auto& [role, a] : certified) ref.certified.push_back({role, vector_of(a)});
            std::vector<golden::gradient_tensor> got;
            for (const auto& [role, a] : candidate) got.push_back({role, {a.data(), static_cast<std::size_t>(a.size())}, std::nullopt});  // judged in the call's format
            golden::check_result res;
            {
                py::gil_scoped_release release;
                golden::case_spec spec;
                golden::case_data data;
                backward_case_of(c, g, spec, data);
                ref.grad_output = data.grad_output;
                res.case_name = spec.name;
                res.format = *f;
                res.declared_backward = declared;
                golden::check_gradients(spec, data, ref, got, *f, tolerance::tolerance_model::data_aware, res, declared);
                golden::decide(res);
            }
            py::list tensors, invariants;
            for (const golden::tensor_report& t : res.tensors) tensors.append(tensor_dict(t));
            for (const invariant_report& i : res.invariants) invariants.append(invariant_dict(i));
            py::dict out;
            out["verdict"] = std::string(golden::verdict_name(res.overall));
            out["reason"] = res.reason;
            out["tensors"] = tensors;
            out["invariants"] = invariants;
            return out;
        },
        py::arg("call"), py::arg("grad_output"), py::arg("weights"), py::arg("lse"), py::arg("certified"), py::arg("format"),
        py::arg("candidate"), py::arg("backward_algorithm"));
}

}  // namespace attnref::python
