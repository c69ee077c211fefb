#pragma once
/// \file compute.hpp
/// One golden case's inputs in memory and the call into attnref's templates for any precision
/// policy: the certified reference (uniform_precision<mpfr_interval<D>>) and `attnref run` (every
/// registered policy) go through this same function.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "attnref/attention.hpp"
#include "attnref/multi_head_attention.hpp"
#include "attnref/precision.hpp"
#include "attnref/tensor.hpp"
#include "manifest.hpp"

namespace attnref::verify {

/// The inputs of one case as exact doubles (values already in the input format), masks as
/// bytes / doubles. Indexed by role; absent roles are empty.
struct case_data {
    std::vector<double> query, key, value;           // sdpa: q, k, v; mha: x_q, x_k, x_v
    std::vector<double> w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o;  // mha only
    std::vector<std::uint8_t> mask;                  // boolean mask, (B, H, Sq, Sk)
    std::vector<double> additive_mask, seed_mask;    // (B, H, Sq, Sk)

    std::vector<double>* real(generator::role r) {
        using generator::role;
        switch (r) {
            case role::query: return &query;
            case role::key: return &key;
            case role::value: return &value;
            case role::w_q: return &w_q;
            case role::w_k: return &w_k;
            case role::w_v: return &w_v;
            case role::w_o: return &w_o;
            case role::b_q: return &b_q;
            case role::b_k: return &b_k;
            case role::b_v: return &b_v;
            case role::b_o: return &b_o;
            case role::additive_mask: return &additive_mask;
            case role::seed_mask: return &seed_mask;
            case role::mask: return nullptr;
        }
        return nullptr;
    }
};

/// Outputs of one computation, flattened in C order.
template <class Policy>
struct case_outputs_of {
    tensor<typename Policy::output_type, 1> output;
    tensor<typename Policy::weights_type, 1> weights;
    tensor<typename Policy::accumulate_type, 1> lse;
};

/// Attention options for a case; spans point into `spec` and `data`, which must outlive the result.
inline attention_options options_for(const case_spec& spec, const case_data& data, std::size_t threads,
                                     softmax_algorithm algorithm, std::size_t block) {
    const case_conventions& c = spec.conventions;
    const case_shapes& d = spec.shapes;
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
    const extents_t<4> mask_extents{d.batch, d.heads, d.query_length, d.key_length};
    if (c.boolean_mask) o.mask.boolean.values = {data.mask.data(), mask_extents};
    if (c.additive_mask) o.mask.additive.values = {data.additive_mask.data(), mask_extents};
    if (c.seed_mask) o.mask.seed.values = {data.seed_mask.data(), mask_extents};
    o.softmax.algorithm = algorithm;
    o.softmax.block_size = block;
    o.softmax.empty_rows = c.empty_rows;
    o.threads = threads;
    return o;
}

/// Flags (B, H, Sq): 1 where query row i of head h in batch b has no attendable key. Decided from
/// the mask data alone (causal/window/padding indices, the boolean mask, −inf entries of the
/// additive mask: integers and doubles, never a computed value), so it is exact.
inline std::vector<std::uint8_t> empty_rows_of(const case_spec& spec, const case_data& data) {
    const case_shapes& d = spec.shapes;
    const attention_options o = options_for(spec, data, 1, softmax_algorithm::shifted_division, 64);
    std::vector<std::uint8_t> empty(d.batch * d.heads * d.query_length, 0);
    for (std::size_t b = 0; b < d.batch; ++b)
        for (std::size_t h = 0; h < d.heads; ++h)
            for (std::size_t i = 0; i < d.query_length; ++i) {
                bool any = false;
                for (std::size_t j = 0; j < d.key_length && !any; ++j)
                    any = !structurally_masked(o.mask, b, h, i, j, d.query_length, d.key_length);
                empty[(b * d.heads + h) * d.query_length + i] = any ? 0 : 1;
            }
    return empty;
}

/// Runs the case through attnref's templates under Policy. Inputs are first converted (rounded) to
/// Input, which is double for the reference and the policy's storage type for `attnref run`.
/// `rows` (B, H, Sq flags, empty = all): only those query rows are computed (attention_options::rows).
template <PrecisionPolicy Policy, class Input = typename Policy::storage_type>
case_outputs_of<Policy> compute_case(const case_spec& spec, const case_data& data, std::size_t threads,
                                     softmax_algorithm algorithm = softmax_algorithm::shifted_division,
                                     std::size_t block = 64, std::span<const std::uint8_t> rows = {}) {
    const case_shapes& d = spec.shapes;
    attention_options o = options_for(spec, data, threads, algorithm, block);
    o.rows = rows;
    auto as_input = [](const std::vector<double>& v) {
        std::vector<Input> r;
        r.reserve(v.size());
        for (double x : v) r.push_back(convert<Input>(x));
        return r;
    };
    case_outputs_of<Policy> r;
    const std::size_t out_size = spec.kind == case_kind::sdpa ? d.batch * d.heads * d.query_length * d.head_dim_v
                                                               : d.batch * d.query_length * d.output_dim;
    r.output = tensor<typename Policy::output_type, 1>({out_size});
    if (spec.outputs.weights) r.weights = tensor<typename Policy::weights_type, 1>({d.batch * d.heads * d.query_length * d.key_length});
    if (spec.outputs.lse) r.lse = tensor<typename Policy::accumulate_type, 1>({d.batch * d.heads * d.query_length});
    tensor_view<typename Policy::weights_type, 4> weights{};
    tensor_view<typename Policy::accumulate_type, 3> lse{};
    if (spec.outputs.weights) weights = {r.weights.data(), {d.batch, d.heads, d.query_length, d.key_length}};
    if (spec.outputs.lse) lse = {r.lse.data(), {d.batch, d.heads, d.query_length}};
    const std::vector<Input> q = as_input(data.query), k = as_input(data.key), v = as_input(data.value);
    if (spec.kind == case_kind::sdpa) {
        tensor_view<const Input, 4> qv{q.data(), {d.batch, d.heads, d.query_length, d.head_dim_qk}};
        tensor_view<const Input, 4> kv{k.data(), {d.batch, d.kv_heads, d.key_length, d.head_dim_qk}};
        tensor_view<const Input, 4> vv{v.data(), {d.batch, d.kv_heads, d.key_length, d.head_dim_v}};
        tensor_view<typename Policy::output_type, 4> out{r.output.data(), {d.batch, d.heads, d.query_length, d.head_dim_v}};
        scaled_dot_product_attention_into<Policy>(qv, kv, vv, o, out, weights, lse);
    } else {
        const std::vector<Input> wq = as_input(data.w_q), wk = as_input(data.w_k), wv = as_input(data.w_v), wo = as_input(data.w_o);
        const std::vector<Input> bq = as_input(data.b_q), bk = as_input(data.b_k), bv = as_input(data.b_v), bo = as_input(data.b_o);
        mha_parameters<Input> p;
        p.w_q = {wq.data(), {d.model_dim, d.heads * d.head_dim_qk}};
        p.w_k = {wk.data(), {d.model_dim, d.kv_heads * d.head_dim_qk}};
        p.w_v = {wv.data(), {d.model_dim, d.kv_heads * d.head_dim_v}};
        p.w_o = {wo.data(), {d.heads * d.head_dim_v, d.output_dim}};
        if (spec.conventions.projection_bias) {
            p.b_q = {bq.data(), {bq.size()}};
            p.b_k = {bk.data(), {bk.size()}};
            p.b_v = {bv.data(), {bv.size()}};
            p.b_o = {bo.data(), {bo.size()}};
        }
        mha_options mo;
        mo.heads = d.heads;
        mo.kv_heads = d.kv_heads;
        mo.attention = o;
        tensor_view<const Input, 3> xq{q.data(), {d.batch, d.query_length, d.model_dim}};
        tensor_view<const Input, 3> xk{k.data(), {d.batch, d.key_length, d.model_dim}};
        tensor_view<const Input, 3> xv{v.data(), {d.batch, d.key_length, d.model_dim}};
        tensor_view<typename Policy::output_type, 3> out{r.output.data(), {d.batch, d.query_length, d.output_dim}};
        multi_head_attention_into<Policy>(xq, xk, xv, p, mo, out, weights, lse, tensor_view<typename Policy::storage_type, 4>{});
    }
    return r;
}

}  // namespace attnref::verify
