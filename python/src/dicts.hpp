#pragma once
/// The Python dicts the bindings return for the library's report structs: one definition each, used
/// by module.cpp (_judge, certified results, certified gradients) and judge_gradients.cpp.
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "attnref/certify/report.hpp"
#include "attnref/bounds/invariants.hpp"
#include "attnref/bounds/tolerance/compare.hpp"
#include "attnref/bounds/tolerance/zero_trust.hpp"

namespace attnref::python {

/// A comparison (tolerance::compare) and the vacuity of its bounds, as the keys testing.py reads.
inline void add_comparison(pybind11::dict& d, const tolerance::comparison& cmp, const tolerance::vacuity& vac) {
    d["elements"] = cmp.elements;
    d["violations"] = cmp.violations;
    d["nonfinite_mismatches"] = cmp.nonfinite_mismatches;
    d["max_abs"] = cmp.max_abs;
    d["max_rel"] = cmp.max_rel;
    d["max_ulp"] = cmp.max_ulp;
    d["rms"] = cmp.rms;
    d["worst_ratio"] = cmp.worst_ratio;
    d["worst_index"] = cmp.worst_index;
    d["worst_actual"] = cmp.worst_candidate;
    d["worst_expected"] = cmp.worst_expected;
    d["worst_bound"] = cmp.worst_bound;
    d["vacuous_elements"] = vac.elements;
    d["vacuous_index"] = vac.index;
    d["vacuous_bound"] = vac.bound;
    d["vacuous_scale"] = vac.scale;
}

inline pybind11::dict invariant_dict(const invariant_report& i) {
    pybind11::dict d;
    d["name"] = std::string(i.name);
    d["ok"] = i.ok;
    d["vacuous"] = i.vacuous;
    d["checked"] = i.checked;
    d["violations"] = i.violations;
    d["worst"] = i.worst;
    d["bound"] = i.bound;
    d["index"] = pybind11::make_tuple(i.index[0], i.index[1], i.index[2], i.index[3]);
    return d;
}

/// Reference.certification: one dict per certified tensor.
inline pybind11::list certification_list(const std::vector<certify::tensor_report>& reports) {
    pybind11::list certs;
    for (const certify::tensor_report& c : reports) {
        pybind11::dict e;
        e["tensor"] = c.tensor;
        e["elements"] = c.elements;
        e["certified"] = c.certified;
        e["escalated"] = c.escalated;
        e["precisions_bits"] = c.precisions_bits;
        certs.append(e);
    }
    return certs;
}

}  // namespace attnref::python
