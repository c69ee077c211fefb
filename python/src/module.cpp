/// pybind11 bindings of the extension `attnref._attnref` (the public API is the Python package
/// `attnref`, python/attnref/__init__.py, which validates arguments and documents conventions).
/// Every computation runs with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "attnref/certify/certify.hpp"
#include "attnref/core/fp_environment.hpp"
#include "core.hpp"
#include "dicts.hpp"

namespace py = pybind11;
using namespace attnref;
using namespace attnref::python;

namespace {

using f64_array = py::array_t<double, py::array::c_style>;

/// A call plus the arrays it reads (kept alive as long as the call).
struct py_call {
    call c;
    std::vector<py::object> keep;
};

array_ref ref_of(py_call& pc, const std::optional<f64_array>& a) {
    array_ref r;
    if (!a) return r;
    pc.keep.push_back(*a);
    r.data = a->data();
    for (py::ssize_t d = 0; d < a->ndim(); ++d) r.shape.push_back(static_cast<std::size_t>(a->shape(d)));
    if (r.shape.empty()) r.shape.push_back(1);  // a 0-d array is rejected by the rank checks
    return r;
}

template <class E>
extents_t<4> extents4(const py::array_t<E, py::array::c_style>& a, const char* name) {
    if (a.ndim() != 4) throw std::invalid_argument(std::string(name) + ": expected 4 dimensions after broadcasting, got " + std::to_string(a.ndim()));
    return {static_cast<std::size_t>(a.shape(0)), static_cast<std::size_t>(a.shape(1)), static_cast<std::size_t>(a.shape(2)),
            static_cast<std::size_t>(a.shape(3))};
}

/// The value called `value` in an enum's name table (name_table.hpp), or ValueError naming the keyword.
template <class Enum, std::size_t N>
Enum parse(const std::string& value, const char* name, const std::pair<const char*, Enum> (&names)[N]) {
    if (const std::optional<Enum> e = value_in(names, value)) return *e;
    std::string known;
    for (const auto& [n, e] : names) known += (known.empty() ? "" : ", ") + std::string("'") + n + "'";
    throw std::invalid_argument(std::string(name) + ": expected one of " + known + ", got '" + value + "'");
}

/// A NumPy array of v's values; float64 ones take over v's buffer (no copy: the peak memory of a
/// call is what attnref.sdpa's estimate counts).
py::array to_numpy(std::vector<double>& v, const std::vector<std::size_t>& shape, bool single) {
    std::vector<py::ssize_t> s(shape.begin(), shape.end());
    if (!single) {
        auto* owned = new std::vector<double>(std::move(v));
        py::capsule free_when_done(owned, [](void* p) { delete static_cast<std::vector<double>*>(p); });
        return py::array_t<double>(s, owned->data(), free_when_done);
    }
    {
        py::array_t<float> a(s);
        float* d = a.mutable_data();
        for (std::size_t n = 0; n < v.size(); ++n) d[n] = static_cast<float>(v[n]);  // exact: float32 values
        std::vector<double>().swap(v);
        return a;
    }
}

py::dict result_dict(const py_call& pc, result& r, bool weights, bool lse) {
    py::dict d;
    d["output"] = to_numpy(r.output, pc.c.output_shape(), r.single);
    d["weights"] = weights ? py::object(to_numpy(r.weights, pc.c.weights_shape(), r.single)) : py::none();
    d["lse"] = lse ? py::object(to_numpy(r.lse, pc.c.lse_shape(), r.single)) : py::none();
    d["certification"] = certification_list(r.certifications);
    d["precisions_bits"] = r.precisions_bits;
    d["arith_bits"] = r.arith_bits;
    d["undecided"] = r.undecided;
    return d;
}

std::vector<double> to_vector(const std::optional<f64_array>& a) {
    if (!a) return {};
    return std::vector<double>(a->data(), a->data() + a->size());
}

}  // namespace

void bind_golden(py::module_& m);  // golden.cpp
namespace attnref::python {
void bind_judge_gradients(py::module_& m, const call& (*call_of)(py::handle));  // judge_gradients.cpp
}

PYBIND11_MODULE(_attnref, m) {
    m.doc() = "attnref's compiled core; use the package `attnref`.";
    // The names of the conventions' enums, from their C++ tables (name_table.hpp): the keywords' choices.
    py::dict enum_names;
    enum_names["scale_placement"] = names_of(scale_placement_names);
    enum_names["causal_alignment"] = names_of(causal_alignment_names);
    enum_names["mask_polarity"] = names_of(mask_polarity_names);
    enum_names["empty_row_policy"] = names_of(empty_row_policy_names);
    m.attr("_enum_names") = enum_names;
    static py::exception<certify::uncertified_error> uncertified(m, "UncertifiedError", PyExc_ArithmeticError);
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const certify::uncertified_error& e) {
            uncertified(e.what());
        } catch (const fp_environment_error& e) {
            PyErr_SetString(PyExc_RuntimeError, e.what());
        }
    });

    bind_golden(m);

    py::class_<py_call>(m, "_Call");
    bind_judge_gradients(m, [](py::handle h) -> const call& { return h.cast<const py_call&>().c; });

    m.def(
        "_make_call",
        [](const std::string& kind, const f64_array& q, const f64_array& k, const f64_array& v, const std::optional<f64_array>& w_q,
           const std::optional<f64_array>& w_k, const std::optional<f64_array>& w_v, const std::optional<f64_array>& w_o,
           const std::optional<f64_array>& b_q, const std::optional<f64_array>& b_k, const std::optional<f64_array>& b_v,
           const std::optional<f64_array>& b_o, std::size_t heads, std::size_t kv_heads, std::optional<double> scale,
           const std::string& placement, const std::string& causal, const std::string& alignment, long long diagonal_offset, std::optional<long long> window_left,
           std::optional<long long> window_right, bool window, std::optional<std::vector<long long>> key_lengths,
           std::optional<py::array_t<std::uint8_t, py::array::c_style>> mask, const std::string& polarity,
           std::optional<py::array_t<double, py::array::c_style>> additive, const std::string& empty_rows,
           std::optional<double> softcap, std::optional<std::vector<double>> alibi, std::size_t threads) {
            auto pc = std::make_unique<py_call>();
            call& c = pc->c;
            c.kind = kind == "sdpa" ? call_kind::sdpa : call_kind::mha;
            c.q = ref_of(*pc, q), c.k = ref_of(*pc, k), c.v = ref_of(*pc, v);
            c.w_q = ref_of(*pc, w_q), c.w_k = ref_of(*pc, w_k), c.w_v = ref_of(*pc, w_v), c.w_o = ref_of(*pc, w_o);
            c.b_q = ref_of(*pc, b_q), c.b_k = ref_of(*pc, b_k), c.b_v = ref_of(*pc, b_v), c.b_o = ref_of(*pc, b_o);
            c.heads = heads, c.kv_heads = kv_heads;
            conventions& cv = c.conv;
            cv.scale = scale;
            cv.placement = parse(placement, "scale_placement", scale_placement_names);
            cv.causal = causal == "causal";
            if (causal != "causal" && causal != "none") throw std::invalid_argument("causal: internal value '" + causal + "'");
            cv.alignment = parse(alignment, "alignment", causal_alignment_names);
            cv.diagonal_offset = static_cast<std::ptrdiff_t>(diagonal_offset);
            if (window) {
                sliding_window w;
                if (window_left) w.left = static_cast<std::size_t>(*window_left);
                if (window_right) w.right = static_cast<std::size_t>(*window_right);
                cv.window = w;
            }
            if (key_lengths)
                for (long long n : *key_lengths) cv.key_lengths.push_back(static_cast<std::size_t>(n));
            if (mask) {
                cv.boolean_mask = true;
                cv.mask_extents = extents4(*mask, "mask");
                cv.mask_values.assign(mask->data(), mask->data() + mask->size());
            }
            cv.polarity = parse(polarity, "mask_polarity", mask_polarity_names);
            if (additive) {
                cv.additive_mask = true;
                cv.additive_extents = extents4(*additive, "additive_mask");
                cv.additive_values.assign(additive->data(), additive->data() + additive->size());
            }
            cv.empty_rows = parse(empty_rows, "empty_rows", empty_row_policy_names);
            cv.softcap = softcap;
            if (alibi) cv.alibi_slopes = *alibi;
            cv.threads = threads;
            c.validate();
            return pc;
        },
        py::arg("kind"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("w_q"), py::arg("w_k"), py::arg("w_v"), py::arg("w_o"),
        py::arg("b_q"), py::arg("b_k"), py::arg("b_v"), py::arg("b_o"), py::arg("heads"), py::arg("kv_heads"), py::arg("scale"),
        py::arg("scale_placement"), py::arg("causal"), py::arg("alignment"), py::arg("diagonal_offset"), py::arg("window_left"), py::arg("window_right"),
        py::arg("window"), py::arg("key_lengths"), py::arg("mask"), py::arg("mask_polarity"), py::arg("additive_mask"),
        py::arg("empty_rows"), py::arg("softcap"), py::arg("alibi_slopes"), py::arg("threads"));

    m.def(
        "_compute",
        [](const py_call& pc, const std::string& arith, bool weights, bool lse, bool escalate) {
            result r;
            if (arith == "certified") {
                py::gil_scoped_release release;
                r = compute_certified(pc.c, escalate);
            } else {
                bool known = false;
                {
                    py::gil_scoped_release release;
                    known = compute_arith(pc.c, arith, weights, lse, r);
                }
                if (!known) throw std::invalid_argument("arith: unknown arithmetic '" + arith + "'");
            }
            return result_dict(pc, r, weights || arith == "certified", lse || arith == "certified");
        },
        py::arg("call"), py::arg("arith"), py::arg("weights"), py::arg("lse"), py::arg("escalate") = true);

    m.def(
        "_gradients",
        [](const py_call& pc, const f64_array& grad_output, std::uint64_t max_memory) {
            array_ref g;
            g.data = grad_output.data();
            for (py::ssize_t d = 0; d < grad_output.ndim(); ++d) g.shape.push_back(static_cast<std::size_t>(grad_output.shape(d)));
            gradient_result r;
            {
                py::gil_scoped_release release;
                r = compute_certified_gradients(pc.c, g, max_memory);
            }
            py::dict grads;
            for (gradient_tensor& t : r.tensors) grads[t.role.c_str()] = to_numpy(t.values, t.shape, false);
            py::dict d;
            d["gradients"] = grads;
            d["certification"] = certification_list(r.certifications);
            return d;
        },
        py::arg("call"), py::arg("grad_output"), py::arg("max_memory"));
    m.def(
        "_certified_memory",
        [](const py_call& pc, const std::optional<f64_array>& grad_output) {
            array_ref g;
            if (grad_output) {
                g.data = grad_output->data();
                for (py::ssize_t d = 0; d < grad_output->ndim(); ++d) g.shape.push_back(static_cast<std::size_t>(grad_output->shape(d)));
            }
            return certified_memory(pc.c, grad_output ? &g : nullptr);
        },
        py::arg("call"), py::arg("grad_output") = py::none());

    m.def("_mpfr_bits", &mpfr_bits);

    m.def(
        "_judge",
        [](const py_call* pc, const std::string& model, const std::string& format, double reference_u, const f64_array& expected_output,
           const std::optional<f64_array>& expected_weights, const std::optional<f64_array>& expected_lse,
           const f64_array& actual_output, const std::optional<f64_array>& actual_weights, const std::optional<f64_array>& actual_lse,
           std::size_t output_row, double ulp_limit, const std::string& empty_lse_name) {
            judge_request rq;
            const auto mdl = tolerance::model_from_name(model);
            if (!mdl || *mdl == tolerance::tolerance_model::baseline)
                throw std::invalid_argument("tolerance: expected 'data-aware', 'worst-case', 'assert-close' or 'ulp', got '" + model + "'");
            rq.model = *mdl;
            const auto f = tolerance::format_from_name(format);
            if (!f) throw std::invalid_argument("dtype: expected float64, float32, bfloat16 or float16, got '" + format + "'");
            rq.format = *f;
            rq.reference_u = reference_u;
            rq.expected_output = to_vector(expected_output), rq.expected_weights = to_vector(expected_weights),
            rq.expected_lse = to_vector(expected_lse);
            rq.actual_output = to_vector(actual_output), rq.actual_weights = to_vector(actual_weights), rq.actual_lse = to_vector(actual_lse);
            rq.output_row = output_row;
            rq.ulp_limit = ulp_limit;
            if (empty_lse_name == "-inf") rq.empty_lse = empty_row_lse::minus_inf;
            else if (empty_lse_name == "+inf") rq.empty_lse = empty_row_lse::plus_inf;
            else if (empty_lse_name == "any") rq.empty_lse = empty_row_lse::any;
            else throw std::invalid_argument("empty_row_lse: expected '-inf', '+inf' or 'any', got '" + empty_lse_name + "'");
            golden::forward_judgment js;
            {
                py::gil_scoped_release release;
                js = judge(pc ? &pc->c : nullptr, rq);
            }
            py::list tensors, invariants;
            for (const golden::judged_tensor& t : js.tensors) {
                py::dict d;
                d["name"] = t.report.name;
                d["verdict"] = std::string(golden::verdict_name(t.report.verdict));
                add_comparison(d, t.report.cmp, t.report.vacuous);
                d["untrustworthy"] = t.untrustworthy;
                d["decoy"] = t.report.decoy;
                d["wrong_empty_lse"] = t.wrong_empty_lse;
                d["bound_max"] = t.bound_max;
                tensors.append(d);
            }
            for (const invariant_report& i : js.invariants) invariants.append(invariant_dict(i));
            py::dict out;
            out["verdict"] = std::string(golden::verdict_name(js.result.overall));
            out["reason"] = js.result.reason;
            out["tensors"] = tensors;
            out["invariants"] = invariants;
            return out;
        },
        py::arg("call").none(true), py::arg("model"), py::arg("format"), py::arg("reference_u"), py::arg("expected_output"),
        py::arg("expected_weights"), py::arg("expected_lse"), py::arg("actual_output"), py::arg("actual_weights"), py::arg("actual_lse"),
        py::arg("output_row"), py::arg("ulp_limit"), py::arg("empty_row_lse"));
}
