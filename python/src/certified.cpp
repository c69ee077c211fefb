/// The certified reference for a call, float64 target: the fast certified path (certify/fast.hpp:
/// double-double with rigorous bounds; the query rows holding undecided elements recomputed by
/// certify.hpp's MPFI ladder through attnref's own templates), exactly as `attnref generate` certifies.
#include "attnref/certify/fast/problem_of.hpp"
#include "attnref/golden/generate.hpp"  // certify_problem_fast: compiled once (attnref_certify_compiled)
#include "core.hpp"
#include "run.hpp"

namespace attnref::python {

result compute_certified(const call& c, bool escalate) {
    c.validate();
    // The fast certified path (certify/fast.hpp): double-double with rigorous bounds; the query rows
    // holding undecided elements go to the MPFI ladder (with its NaN-by-construction rule for rows
    // the mask leaves empty), so every element is certified or UncertifiedError is raised.
    const fast::fast_problem p = fast::fast_problem_of(c.problem());
    fast::fast_options fo;
    fo.threads = c.conv.threads;
    fo.fallback = escalate;
    certify::result cert = golden::certify_problem_fast(p, true, true, {certify::float64_target}, fo);
    result r;
    r.output = std::move(cert.values[0][0]);
    r.weights = std::move(cert.values[1][0]);
    r.lse = std::move(cert.values[2][0]);
    r.precisions_bits = cert.precisions_bits;
    r.certifications = cert.reports;
    for (const certify::tensor_report& t : r.certifications) r.undecided += t.elements - t.certified;
    return r;
}

}  // namespace attnref::python
