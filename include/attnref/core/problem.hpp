#pragma once
/// \file core/problem.hpp
/// One attention problem, described once: its kind (scaled dot-product attention or multi-head
/// attention), its shapes and its conventions (docs/conventions.md), and the table of the tensors
/// it reads and writes — each role's name, direction, which kinds have it and its shape as a
/// function of the problem. The golden manifest (golden/manifest.hpp, golden/layout.hpp), the
/// checker (check/), `attnref run`, the fast certified path and the Python package all read a
/// problem and its roles from here; attention_options / mha_options come from options_of and
/// mha_options_of. Standard library and attnref's core only.
///
///     attention_problem ─┬─ options_of / mha_options_of ─→ attention_options, mha_options
///                        └─ role_table ─→ roles_of(problem, selection) ─→ (role, name, shape)

#include <array>
#include <cstddef>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "attnref/core/attention.hpp"
#include "attnref/core/mask.hpp"
#include "attnref/core/multi_head_attention.hpp"

namespace attnref {

/// Scaled dot-product attention (q, k, v given per head) or multi-head attention (embeddings and
/// projections, multi_head_attention.hpp).
enum class problem_kind { sdpa, mha };

/// Sizes: B, H, H_kv, Sq, Sk, dk, dv; for multi-head attention also the model width E of x_q, x_k,
/// x_v and the output width of W_o (0 for SDPA).
struct problem_shapes {
    std::size_t batch = 1, heads = 2, kv_heads = 2, query_length = 8, key_length = 8, head_dim_qk = 8, head_dim_v = 8;
    std::size_t model_dim = 0, output_dim = 0;  ///< mha only
};

/// The conventions of a problem: every choice attention_options makes besides the input data. The
/// masks are named here (whether the problem has a boolean, an additive or a seed mask); their
/// values are inputs (problem_masks).
struct problem_conventions {
    std::optional<double> scale;  ///< nullopt: 1/√dk
    scale_placement placement = scale_placement::on_product;
    std::optional<double> softcap;
    std::vector<double> alibi_slopes;
    bool causal = false;
    causal_alignment alignment = causal_alignment::top_left;
    std::ptrdiff_t diagonal_offset = 0;
    std::optional<sliding_window> window;
    std::vector<std::size_t> key_lengths;
    bool boolean_mask = false;
    mask_polarity polarity = mask_polarity::true_means_attend;
    bool additive_mask = false;
    bool seed_mask = false;
    empty_row_policy empty_rows = empty_row_policy::zero;
    bool projection_bias = false;  ///< mha only
};

/// An attention problem: kind, shapes and conventions.
struct attention_problem {
    problem_kind kind = problem_kind::sdpa;
    problem_shapes shapes;
    problem_conventions conventions;
    bool sdpa() const { return kind == problem_kind::sdpa; }
};

/// The mask values of a problem (views, empty where the problem has no such mask), (B or 1, H or 1,
/// Sq, Sk) each.
struct problem_masks {
    tensor_view<const std::uint8_t, 4> boolean{};
    tensor_view<const double, 4> additive{}, seed{};
};

/// How the softmax is computed and on how many threads (not part of the problem: every algorithm
/// gives the same exact result).
struct problem_execution {
    softmax_algorithm algorithm = softmax_algorithm::shifted_division;
    std::size_t block = 64;
    std::size_t threads = 0;
};

/// The problem's conventions as attention_options. The options point into `c` (the ALiBi slopes,
/// the key lengths) and into the masks' data, which must outlive them.
inline attention_options options_of(const problem_conventions& c, const problem_masks& m = {}, const problem_execution& x = {}) {
    attention_options o;
    o.scale = c.scale;
    o.placement = c.placement;
    o.softcap = c.softcap;
    o.alibi_slopes = c.alibi_slopes;
    o.mask.causal = c.causal;
    o.mask.alignment = c.alignment;
    o.mask.diagonal_offset = c.diagonal_offset;
    o.mask.window = c.window;
    o.mask.key_lengths = c.key_lengths;
    o.mask.polarity = c.polarity;
    if (c.boolean_mask) o.mask.boolean.values = m.boolean;
    if (c.additive_mask) o.mask.additive.values = m.additive;
    if (c.seed_mask) o.mask.seed.values = m.seed;
    o.softmax.algorithm = x.algorithm;
    o.softmax.block_size = x.block;
    o.softmax.empty_rows = c.empty_rows;
    o.threads = x.threads;
    return o;
}

/// A multi-head problem's mha_options around its attention options.
inline mha_options mha_options_of(const attention_problem& p, const attention_options& o) {
    mha_options mo;
    mo.heads = p.shapes.heads;
    mo.kv_heads = p.shapes.kv_heads;
    mo.attention = o;
    return mo;
}

/// An attention problem as views of its inputs and its options, whatever holds them (a golden
/// case, a Python call): SDPA reads q, k, v and `o`; multi-head attention reads x_q, x_k, x_v, the
/// projections `w` and `mo` (whose attention options are mo.attention). What the checker's decoys
/// and the fast certified path (certify/fast/problem.hpp fast_problem_of) are computed from.
struct forward_problem {
    bool sdpa = true;
    tensor_view<const double, 4> q, k, v;
    tensor_view<const double, 3> x_q, x_k, x_v;
    mha_parameters<double> w;
    attention_options o;
    mha_options mo;
    /// The attention options in force (o for SDPA, mo.attention for multi-head attention).
    const attention_options& options() const { return sdpa ? o : mo.attention; }
};

// ---------------------------------------------------------------------------------------------
// The role table.

/// Every tensor a problem reads or writes. Names (role_name) are those of the golden manifests, the
/// CLI's flags (--grad_w_q …) and the Python dicts.
enum class tensor_role {
    query, key, value, w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o, mask, additive_mask, seed_mask, grad_output,
    output, weights, lse,
    grad_query, grad_key, grad_value, grad_w_q, grad_w_k, grad_w_v, grad_w_o, grad_b_q, grad_b_k, grad_b_v, grad_b_o,
};

/// An input of the problem, a forward output, or a gradient of the backward pass.
enum class role_direction { input, output, gradient };

/// When a problem has a role (besides its kind).
enum class role_presence {
    always,
    bias,           ///< conventions.projection_bias
    boolean_mask,   ///< conventions.boolean_mask
    additive_mask,  ///< conventions.additive_mask
    seed_mask,      ///< conventions.seed_mask
    weights,        ///< the weights are asked for (role_selection::weights)
    lse,            ///< the lse is asked for (role_selection::lse)
    backward,       ///< the backward pass is asked for (role_selection::gradients)
};

/// Which of a problem's optional tensors a use of it asks for (a golden case's outputs).
struct role_selection {
    bool weights = true, lse = true, gradients = false;
};

using shape_rule = std::vector<std::size_t> (*)(const attention_problem&);

/// One row of the role table.
struct role_info {
    tensor_role role;
    std::string_view name;
    role_direction direction;
    bool sdpa, mha;           ///< the kinds that have the role
    role_presence presence;
    shape_rule shape;         ///< its shape (C order)
    /// Gradients: the role they are the gradient of (their shape); else the role itself.
    tensor_role primal;
};

namespace problem_detail {
using S = std::vector<std::size_t>;
inline S query_shape(const attention_problem& p) {
    const problem_shapes& d = p.shapes;
    if (p.sdpa()) return {d.batch, d.heads, d.query_length, d.head_dim_qk};
    return {d.batch, d.query_length, d.model_dim};
}
inline S key_shape(const attention_problem& p) {
    const problem_shapes& d = p.shapes;
    if (p.sdpa()) return {d.batch, d.kv_heads, d.key_length, d.head_dim_qk};
    return {d.batch, d.key_length, d.model_dim};
}
inline S value_shape(const attention_problem& p) {
    const problem_shapes& d = p.shapes;
    if (p.sdpa()) return {d.batch, d.kv_heads, d.key_length, d.head_dim_v};
    return {d.batch, d.key_length, d.model_dim};
}
inline S w_q_shape(const attention_problem& p) { return {p.shapes.model_dim, p.shapes.heads * p.shapes.head_dim_qk}; }
inline S w_k_shape(const attention_problem& p) { return {p.shapes.model_dim, p.shapes.kv_heads * p.shapes.head_dim_qk}; }
inline S w_v_shape(const attention_problem& p) { return {p.shapes.model_dim, p.shapes.kv_heads * p.shapes.head_dim_v}; }
inline S w_o_shape(const attention_problem& p) { return {p.shapes.heads * p.shapes.head_dim_v, p.shapes.output_dim}; }
inline S b_q_shape(const attention_problem& p) { return {w_q_shape(p)[1]}; }
inline S b_k_shape(const attention_problem& p) { return {w_k_shape(p)[1]}; }
inline S b_v_shape(const attention_problem& p) { return {w_v_shape(p)[1]}; }
inline S b_o_shape(const attention_problem& p) { return {w_o_shape(p)[1]}; }
inline S weights_shape(const attention_problem& p) {
    const problem_shapes& d = p.shapes;
    return {d.batch, d.heads, d.query_length, d.key_length};
}
inline S lse_shape(const attention_problem& p) {
    const problem_shapes& d = p.shapes;
    return {d.batch, d.heads, d.query_length};
}
inline S output_shape(const attention_problem& p) {
    const problem_shapes& d = p.shapes;
    if (p.sdpa()) return {d.batch, d.heads, d.query_length, d.head_dim_v};
    return {d.batch, d.query_length, d.output_dim};
}
}  // namespace problem_detail

/// The role table, in file order: a golden case's inputs, then output, weights, lse, then the
/// gradients (the manifest lists its tensors in this order).
inline constexpr std::array<role_info, 29> role_table = [] {
    namespace d = problem_detail;
    using R = tensor_role;
    using D = role_direction;
    using P = role_presence;
    return std::array<role_info, 29>{{
        {R::query, "query", D::input, true, true, P::always, d::query_shape, R::query},
        {R::key, "key", D::input, true, true, P::always, d::key_shape, R::key},
        {R::value, "value", D::input, true, true, P::always, d::value_shape, R::value},
        {R::w_q, "w_q", D::input, false, true, P::always, d::w_q_shape, R::w_q},
        {R::w_k, "w_k", D::input, false, true, P::always, d::w_k_shape, R::w_k},
        {R::w_v, "w_v", D::input, false, true, P::always, d::w_v_shape, R::w_v},
        {R::w_o, "w_o", D::input, false, true, P::always, d::w_o_shape, R::w_o},
        {R::b_q, "b_q", D::input, false, true, P::bias, d::b_q_shape, R::b_q},
        {R::b_k, "b_k", D::input, false, true, P::bias, d::b_k_shape, R::b_k},
        {R::b_v, "b_v", D::input, false, true, P::bias, d::b_v_shape, R::b_v},
        {R::b_o, "b_o", D::input, false, true, P::bias, d::b_o_shape, R::b_o},
        {R::mask, "mask", D::input, true, true, P::boolean_mask, d::weights_shape, R::mask},
        {R::additive_mask, "additive_mask", D::input, true, true, P::additive_mask, d::weights_shape, R::additive_mask},
        {R::seed_mask, "seed_mask", D::input, true, true, P::seed_mask, d::weights_shape, R::seed_mask},
        {R::grad_output, "grad_output", D::input, true, true, P::backward, d::output_shape, R::output},
        {R::output, "output", D::output, true, true, P::always, d::output_shape, R::output},
        {R::weights, "weights", D::output, true, true, P::weights, d::weights_shape, R::weights},
        {R::lse, "lse", D::output, true, true, P::lse, d::lse_shape, R::lse},
        {R::grad_query, "grad_query", D::gradient, true, true, P::backward, d::query_shape, R::query},
        {R::grad_key, "grad_key", D::gradient, true, true, P::backward, d::key_shape, R::key},
        {R::grad_value, "grad_value", D::gradient, true, true, P::backward, d::value_shape, R::value},
        {R::grad_w_q, "grad_w_q", D::gradient, false, true, P::backward, d::w_q_shape, R::w_q},
        {R::grad_w_k, "grad_w_k", D::gradient, false, true, P::backward, d::w_k_shape, R::w_k},
        {R::grad_w_v, "grad_w_v", D::gradient, false, true, P::backward, d::w_v_shape, R::w_v},
        {R::grad_w_o, "grad_w_o", D::gradient, false, true, P::backward, d::w_o_shape, R::w_o},
        {R::grad_b_q, "grad_b_q", D::gradient, false, true, P::backward, d::b_q_shape, R::b_q},
        {R::grad_b_k, "grad_b_k", D::gradient, false, true, P::backward, d::b_k_shape, R::b_k},
        {R::grad_b_v, "grad_b_v", D::gradient, false, true, P::backward, d::b_v_shape, R::b_v},
        {R::grad_b_o, "grad_b_o", D::gradient, false, true, P::backward, d::b_o_shape, R::b_o},
    }};
}();

/// The table's row of a role.
constexpr const role_info& info_of(tensor_role r) {
    for (const role_info& i : role_table)
        if (i.role == r) return i;
    return role_table[0];  // unreachable: every role has a row
}
constexpr std::string_view role_name(tensor_role r) { return info_of(r).name; }
/// The role a name stands for, or nullopt.
constexpr std::optional<tensor_role> role_from_name(std::string_view n) {
    for (const role_info& i : role_table)
        if (i.name == n) return i.role;
    return std::nullopt;
}

/// Whether the problem, used with `selection`, has the role.
inline bool has_role(const attention_problem& p, tensor_role r, const role_selection& selection = {}) {
    const role_info& i = info_of(r);
    if (!(p.sdpa() ? i.sdpa : i.mha)) return false;
    const problem_conventions& c = p.conventions;
    switch (i.presence) {
        case role_presence::always: break;
        case role_presence::bias: if (!c.projection_bias) return false; break;
        case role_presence::boolean_mask: if (!c.boolean_mask) return false; break;
        case role_presence::additive_mask: if (!c.additive_mask) return false; break;
        case role_presence::seed_mask: if (!c.seed_mask) return false; break;
        case role_presence::weights: if (!selection.weights) return false; break;
        case role_presence::lse: if (!selection.lse) return false; break;
        case role_presence::backward: if (!selection.gradients) return false; break;
    }
    // A gradient exists where its primal input does (the biases' gradients with the biases).
    if (i.direction == role_direction::gradient && i.primal != r) return has_role(p, i.primal, selection);
    return true;
}

/// A role's shape in the problem (whether or not the problem has it).
inline std::vector<std::size_t> shape_of(const attention_problem& p, tensor_role r) { return info_of(r).shape(p); }

/// A role's shape as the extents of a rank-R view (R must be the shape's rank).
template <std::size_t R>
extents_t<R> extents_of(const attention_problem& p, tensor_role r) {
    const std::vector<std::size_t> s = shape_of(p, r);
    extents_t<R> e{};
    for (std::size_t i = 0; i < R && i < s.size(); ++i) e[i] = s[i];
    return e;
}

/// One tensor of a problem: role, name and shape.
struct role_tensor {
    tensor_role role;
    std::string_view name;
    std::vector<std::size_t> shape;
};

/// The tensors of direction `dir` the problem has under `selection`, in the table's order.
inline std::vector<role_tensor> roles_of(const attention_problem& p, role_direction dir, const role_selection& selection = {}) {
    std::vector<role_tensor> out;
    for (const role_info& i : role_table)
        if (i.direction == dir && has_role(p, i.role, selection)) out.push_back({i.role, i.name, i.shape(p)});
    return out;
}

/// Every gradient role of the problem's kind (with biases or not), as the backward computes them.
inline std::vector<role_tensor> gradient_roles_of(const attention_problem& p) {
    return roles_of(p, role_direction::gradient, role_selection{false, false, true});
}

}  // namespace attnref
