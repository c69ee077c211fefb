/// The certified reference for a call, float64 target: the fast certified path (fast_certify.hpp:
/// double-double with rigorous bounds; the query rows holding undecided elements recomputed by
/// certify.hpp's MPFI ladder through attnref's own templates), exactly as `attnref generate` certifies.
#include "attnref/certify.hpp"
#include "attnref/fast_certify.hpp"
#include "attnref/multiprecision.hpp"
#include "core.hpp"
#include "run.hpp"

namespace attnref::python {


result compute_certified(const call& c, bool escalate) {
    c.validate();
    const attention_options o = c.conv.options();
    // The fast certified path (fast_certify.hpp): double-double with rigorous bounds; the query rows
    // holding undecided elements go to the MPFI ladder (with its NaN-by-construction rule for rows
    // the mask leaves empty), so every element is certified or UncertifiedError is raised.
    auto ext4 = [](const std::vector<std::size_t>& s) { return extents_t<4>{s[0], s[1], s[2], s[3]}; };
    auto ext3 = [](const std::vector<std::size_t>& s) { return extents_t<3>{s[0], s[1], s[2]}; };
    auto ext2 = [](const std::vector<std::size_t>& s) { return extents_t<2>{s[0], s[1]}; };
    fast::fast_problem p;
    p.options = o;
    if (c.kind == call_kind::sdpa) {
        p.q = {c.q.data, ext4(c.q.shape)};
        p.k = {c.k.data, ext4(c.k.shape)};
        p.v = {c.v.data, ext4(c.v.shape)};
    } else {
        p.mha = true;
        p.heads = c.heads;
        p.kv_heads = c.kv_heads;
        p.x_q = {c.q.data, ext3(c.q.shape)};
        p.x_k = {c.k.data, ext3(c.k.shape)};
        p.x_v = {c.v.data, ext3(c.v.shape)};
        p.params.w_q = {c.w_q.data, ext2(c.w_q.shape)};
        p.params.w_k = {c.w_k.data, ext2(c.w_k.shape)};
        p.params.w_v = {c.w_v.data, ext2(c.w_v.shape)};
        p.params.w_o = {c.w_o.data, ext2(c.w_o.shape)};
        auto bias = [](const array_ref& b) { return b.given() ? tensor_view<const double, 1>{b.data, {b.shape[0]}} : tensor_view<const double, 1>{}; };
        p.params.b_q = bias(c.b_q);
        p.params.b_k = bias(c.b_k);
        p.params.b_v = bias(c.b_v);
        p.params.b_o = bias(c.b_o);
    }
    fast::fast_options fo;
    fo.threads = c.conv.threads;
    fo.fallback = escalate;
    certify::result cert = fast::certify_fast(p, true, true, {certify::float64_target}, fo);
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
