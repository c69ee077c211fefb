#include <string>

#include "core.hpp"

namespace attnref::python {

attention_options conventions::options() const {
    problem_masks m;
    if (boolean_mask) m.boolean = {mask_values.data(), mask_extents};
    if (additive_mask) m.additive = {additive_values.data(), additive_extents};
    problem_execution x;
    x.threads = threads;
    return options_of(*this, m, x);
}

namespace {
void require_rank(const array_ref& a, std::size_t rank, const char* name, bool optional = false) {
    if (optional && !a.given()) return;
    if (a.shape.size() != rank)
        throw shape_error(std::string(name) + ": expected " + std::to_string(rank) + " dimensions, got " + std::to_string(a.shape.size()));
}
}  // namespace

void call::validate() const {
    if (kind == call_kind::sdpa) {
        require_rank(q, 4, "q");
        require_rank(k, 4, "k");
        require_rank(v, 4, "v");
        return;
    }
    require_rank(q, 3, "x_q");
    require_rank(k, 3, "x_k");
    require_rank(v, 3, "x_v");
    require_rank(w_q, 2, "w_q");
    require_rank(w_k, 2, "w_k");
    require_rank(w_v, 2, "w_v");
    require_rank(w_o, 2, "w_o");
    require_rank(b_q, 1, "b_q", true);
    require_rank(b_k, 1, "b_k", true);
    require_rank(b_v, 1, "b_v", true);
    require_rank(b_o, 1, "b_o", true);
    if (heads == 0) throw shape_error("heads: expected at least 1, got 0");
    // The library's own checks (mha_dims_of) name the weight axes; the input feature axes are checked here.
    require_extent("w_q axis 0 (input features of x_q)", w_q.shape[0], q.shape[2]);
    require_extent("w_k axis 0 (input features of x_k)", w_k.shape[0], k.shape[2]);
    require_extent("w_v axis 0 (input features of x_v)", w_v.shape[0], v.shape[2]);
    if (b_q.given()) require_extent("b_q size (w_q axis 1)", b_q.shape[0], w_q.shape[1]);
    if (b_k.given()) require_extent("b_k size (w_k axis 1)", b_k.shape[0], w_k.shape[1]);
    if (b_v.given()) require_extent("b_v size (w_v axis 1)", b_v.shape[0], w_v.shape[1]);
    if (b_o.given()) require_extent("b_o size (w_o axis 1)", b_o.shape[0], w_o.shape[1]);
    // The weights' axes against heads and kv_heads: the library's own rule, before any estimate.
    const forward_problem p = problem();
    (void)mha_dims_of(p.x_q, p.x_k, p.x_v, p.w, p.mo);
}

std::vector<std::size_t> call::output_shape() const {
    if (kind == call_kind::sdpa) return {q.shape[0], q.shape[1], q.shape[2], v.shape[3]};
    return {q.shape[0], q.shape[1], w_o.shape[1]};
}
std::vector<std::size_t> call::weights_shape() const {
    if (kind == call_kind::sdpa) return {q.shape[0], q.shape[1], q.shape[2], k.shape[2]};
    return {q.shape[0], heads, q.shape[1], k.shape[1]};
}
std::vector<std::size_t> call::lse_shape() const {
    const std::vector<std::size_t> w = weights_shape();
    return {w[0], w[1], w[2]};
}

namespace {
auto e4(const array_ref& a) { return tensor_view<const double, 4>{a.data, {a.shape[0], a.shape[1], a.shape[2], a.shape[3]}}; }
auto e3(const array_ref& a) { return tensor_view<const double, 3>{a.data, {a.shape[0], a.shape[1], a.shape[2]}}; }
auto e2(const array_ref& a) { return tensor_view<const double, 2>{a.data, {a.shape[0], a.shape[1]}}; }
auto e1(const array_ref& a) { return a.given() ? tensor_view<const double, 1>{a.data, {a.shape[0]}} : tensor_view<const double, 1>{}; }
}  // namespace

forward_problem call::problem() const {
    forward_problem p;
    p.sdpa = kind == call_kind::sdpa;
    const attention_options o = conv.options();
    if (p.sdpa) {
        p.q = e4(q), p.k = e4(k), p.v = e4(v);
        p.o = o;
        return p;
    }
    p.x_q = e3(q), p.x_k = e3(k), p.x_v = e3(v);
    p.w.w_q = e2(w_q), p.w.w_k = e2(w_k), p.w.w_v = e2(w_v), p.w.w_o = e2(w_o);
    p.w.b_q = e1(b_q), p.w.b_k = e1(b_k), p.w.b_v = e1(b_v), p.w.b_o = e1(b_o);
    p.mo.heads = heads;
    p.mo.kv_heads = kv_heads;
    p.mo.attention = o;
    return p;
}

}  // namespace attnref::python
