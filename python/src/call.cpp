#include <string>

#include "core.hpp"

namespace attnref::python {

attention_options conventions::options() const {
    attention_options o;
    o.scale = scale;
    o.placement = placement;
    o.softcap = softcap;
    o.alibi_slopes = alibi_slopes;
    o.mask.causal = causal;
    o.mask.alignment = alignment;
    o.mask.diagonal_offset = diagonal_offset;
    o.mask.window = window;
    o.mask.key_lengths = key_lengths;
    o.mask.polarity = polarity;
    if (!boolean_mask.empty()) o.mask.boolean.values = {boolean_mask.data(), mask_extents};
    if (!additive_mask.empty()) o.mask.additive.values = {additive_mask.data(), additive_extents};
    o.softmax.empty_rows = empty_rows;
    o.threads = threads;
    return o;
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

}  // namespace attnref::python
