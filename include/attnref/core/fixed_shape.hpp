#pragma once
/// \file core/fixed_shape.hpp
/// Attention over shapes fixed at compile time: inputs and outputs are fixed_tensor (std::array
/// storage, literal types), invalid shapes are rejected by the constraints, and the whole forward
/// pass can be constant-evaluated, e.g.
///
///     constexpr attnref::mha_shape s{.batch = 1, .query_length = 3, .key_length = 3, .model_dim = 4,
///                                    .heads = 2, .kv_heads = 2, .head_dim_qk = 2, .head_dim_v = 2};
///     constexpr auto out = attnref::multi_head_attention<double, s>(make_inputs());
///     static_assert(attnref::rows_sum_to_one(out.weights.view(), 1e-15).ok);
///
/// The math is the run-time code (multi_head_attention_into) called on views of the arrays.

#include <cstddef>

#include "attnref/core/attention.hpp"
#include "attnref/core/multi_head_attention.hpp"
#include "attnref/core/tensor.hpp"

namespace attnref {

/// Shape of a scaled dot-product attention call, as a structural type for template arguments.
struct sdpa_shape {
    std::size_t batch = 1, heads = 1, kv_heads = 1, query_length = 1, key_length = 1, head_dim_qk = 1, head_dim_v = 1;
    constexpr bool valid() const {
        return batch > 0 && heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && query_length > 0 && key_length > 0 &&
               head_dim_qk > 0 && head_dim_v > 0;
    }
};

template <class T, sdpa_shape S>
    requires(S.valid())
struct fixed_sdpa_inputs {
    fixed_tensor<T, S.batch, S.heads, S.query_length, S.head_dim_qk> q;
    fixed_tensor<T, S.batch, S.kv_heads, S.key_length, S.head_dim_qk> k;
    fixed_tensor<T, S.batch, S.kv_heads, S.key_length, S.head_dim_v> v;
};

template <class T, sdpa_shape S>
    requires(S.valid())
struct fixed_sdpa_outputs {
    fixed_tensor<T, S.batch, S.heads, S.query_length, S.head_dim_v> output;
    fixed_tensor<T, S.batch, S.heads, S.query_length, S.key_length> weights;
    fixed_tensor<T, S.batch, S.heads, S.query_length> lse;
};

template <class T, sdpa_shape S>
    requires(S.valid())
constexpr fixed_sdpa_outputs<T, S> scaled_dot_product_attention(const fixed_sdpa_inputs<T, S>& in,
                                                                const attention_options& options = {}) {
    fixed_sdpa_outputs<T, S> r{};
    scaled_dot_product_attention_into<uniform_precision<T>>(in.q.view(), in.k.view(), in.v.view(), options,
                                                            r.output.view(), r.weights.view(), r.lse.view());
    return r;
}

/// Shape of a multi-head attention call (query, key and value inputs share model_dim; the output
/// projection maps back to model_dim).
struct mha_shape {
    std::size_t batch = 1, query_length = 1, key_length = 1, model_dim = 1, heads = 1, kv_heads = 1, head_dim_qk = 1,
                head_dim_v = 1;
    constexpr bool valid() const {
        return batch > 0 && query_length > 0 && key_length > 0 && model_dim > 0 && heads > 0 && kv_heads > 0 &&
               heads % kv_heads == 0 && head_dim_qk > 0 && head_dim_v > 0;
    }
};

template <class T, mha_shape S>
    requires(S.valid())
struct fixed_mha_inputs {
    fixed_tensor<T, S.batch, S.query_length, S.model_dim> x_q;
    fixed_tensor<T, S.batch, S.key_length, S.model_dim> x_k, x_v;
    fixed_tensor<T, S.model_dim, S.heads * S.head_dim_qk> w_q;
    fixed_tensor<T, S.model_dim, S.kv_heads * S.head_dim_qk> w_k;
    fixed_tensor<T, S.model_dim, S.kv_heads * S.head_dim_v> w_v;
    fixed_tensor<T, S.heads * S.head_dim_v, S.model_dim> w_o;
    bool has_bias = false;  ///< when false the b_* arrays are ignored
    fixed_tensor<T, S.heads * S.head_dim_qk> b_q;
    fixed_tensor<T, S.kv_heads * S.head_dim_qk> b_k;
    fixed_tensor<T, S.kv_heads * S.head_dim_v> b_v;
    fixed_tensor<T, S.model_dim> b_o;

    /// Views of the weights and, when has_bias, of the biases (multi_head_attention_into's parameters).
    constexpr mha_parameters<T> parameters() const {
        mha_parameters<T> p{w_q.view(), w_k.view(), w_v.view(), w_o.view()};
        if (has_bias) {
            p.b_q = b_q.view();
            p.b_k = b_k.view();
            p.b_v = b_v.view();
            p.b_o = b_o.view();
        }
        return p;
    }
};

template <class T, mha_shape S>
    requires(S.valid())
struct fixed_mha_outputs {
    fixed_tensor<T, S.batch, S.query_length, S.model_dim> output;
    fixed_tensor<T, S.batch, S.heads, S.query_length, S.key_length> weights;
    fixed_tensor<T, S.batch, S.heads, S.query_length> lse;
    fixed_tensor<T, S.batch, S.heads, S.query_length, S.head_dim_v> head_outputs;
};

template <class T, mha_shape S>
    requires(S.valid())
constexpr fixed_mha_outputs<T, S> multi_head_attention(const fixed_mha_inputs<T, S>& in,
                                                      const attention_options& options = {}) {
    fixed_mha_outputs<T, S> r{};
    const mha_options o{S.heads, S.kv_heads, options};
    multi_head_attention_into<uniform_precision<T>>(in.x_q.view(), in.x_k.view(), in.x_v.view(), in.parameters(), o, r.output.view(),
                                                    r.weights.view(), r.lse.view(), r.head_outputs.view());
    return r;
}

}  // namespace attnref
