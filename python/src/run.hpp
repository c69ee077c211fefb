#pragma once
/// \file run.hpp
/// A call (core.hpp) through attnref's templates under one precision policy: the certified path
/// (uniform_precision<mpfr_interval<D>>) and every other arithmetic go through this one function.

#include <span>
#include <type_traits>
#include <vector>

#include "core.hpp"

namespace attnref::python {

template <class Policy>
struct outputs_of {
    std::vector<typename Policy::output_type> output;
    std::vector<typename Policy::weights_type> weights;
    std::vector<typename Policy::accumulate_type> lse;
};

/// Runs the call under Policy with its inputs first converted to Input (double for the exact
/// reference, the policy's storage type otherwise). `rows` (B, H, Sq flags, empty = all): only
/// those query rows are computed (attention_options::rows).
template <class Policy, class Input>
outputs_of<Policy> run_call(const call& c, bool want_weights, bool want_lse, std::span<const std::uint8_t> rows = {}) {
    attention_options o = c.conv.options();
    o.rows = rows;
    const std::vector<std::size_t> os = c.output_shape(), ws = c.weights_shape(), ls = c.lse_shape();
    auto count = [](const std::vector<std::size_t>& s) {
        std::size_t n = 1;
        for (std::size_t e : s) n *= e;
        return n;
    };
    outputs_of<Policy> r;
    r.output.assign(count(os), typename Policy::output_type(0));
    if (want_weights) r.weights.assign(count(ws), typename Policy::weights_type(0));
    if (want_lse) r.lse.assign(count(ls), typename Policy::accumulate_type(0));
    // The caller's float64 buffers are read in place when Input is double; other inputs are
    // converted (rounded) once. `owned` keeps the converted copies alive.
    std::vector<std::vector<Input>> owned;
    owned.reserve(11);
    auto as_input = [&owned](const array_ref& a) -> const Input* {
        if (!a.given()) return nullptr;
        if constexpr (std::is_same_v<Input, double>) {
            return a.data;
        } else {
            std::size_t n = 1;
            for (std::size_t e : a.shape) n *= e;
            std::vector<Input>& x = owned.emplace_back();
            x.reserve(n);
            for (std::size_t i = 0; i < n; ++i) x.push_back(convert<Input>(a.data[i]));
            return x.data();
        }
    };
    auto ext4 = [](const std::vector<std::size_t>& s) { return extents_t<4>{s[0], s[1], s[2], s[3]}; };
    auto ext3 = [](const std::vector<std::size_t>& s) { return extents_t<3>{s[0], s[1], s[2]}; };
    tensor_view<typename Policy::weights_type, 4> wv{};
    tensor_view<typename Policy::accumulate_type, 3> lv{};
    if (want_weights) wv = {r.weights.data(), ext4(ws)};
    if (want_lse) lv = {r.lse.data(), ext3(ls)};
    const Input *q = as_input(c.q), *k = as_input(c.k), *v = as_input(c.v);
    if (c.kind == call_kind::sdpa) {
        scaled_dot_product_attention_into<Policy>(tensor_view<const Input, 4>{q, ext4(c.q.shape)},
                                                  tensor_view<const Input, 4>{k, ext4(c.k.shape)},
                                                  tensor_view<const Input, 4>{v, ext4(c.v.shape)}, o,
                                                  tensor_view<typename Policy::output_type, 4>{r.output.data(), ext4(os)}, wv, lv);
        return r;
    }
    auto ext2 = [](const std::vector<std::size_t>& s) { return extents_t<2>{s[0], s[1]}; };
    auto bias = [&](const array_ref& b) {
        return b.given() ? tensor_view<const Input, 1>{as_input(b), {b.shape[0]}} : tensor_view<const Input, 1>{};
    };
    mha_parameters<Input> p;
    p.w_q = {as_input(c.w_q), ext2(c.w_q.shape)};
    p.w_k = {as_input(c.w_k), ext2(c.w_k.shape)};
    p.w_v = {as_input(c.w_v), ext2(c.w_v.shape)};
    p.w_o = {as_input(c.w_o), ext2(c.w_o.shape)};
    p.b_q = bias(c.b_q), p.b_k = bias(c.b_k), p.b_v = bias(c.b_v), p.b_o = bias(c.b_o);
    mha_options mo;
    mo.heads = c.heads;
    mo.kv_heads = c.kv_heads;
    mo.attention = o;
    multi_head_attention_into<Policy>(tensor_view<const Input, 3>{q, ext3(c.q.shape)}, tensor_view<const Input, 3>{k, ext3(c.k.shape)},
                                      tensor_view<const Input, 3>{v, ext3(c.v.shape)}, p, mo,
                                      tensor_view<typename Policy::output_type, 3>{r.output.data(), ext3(os)}, wv, lv,
                                      tensor_view<typename Policy::storage_type, 4>{});
    return r;
}

}  // namespace attnref::python
