#pragma once
/// \file fast_case.hpp
/// A golden case's inputs as an attnref::fast::fast_problem, and the fast certified reference of
/// the case (include/attnref/fast_certify.hpp): what generate_case computes through the MPFI
/// ladder alone, with the same tensors and targets. Owns nothing else.

#include <vector>

#include "attnref/fast_certify.hpp"
#include "compute.hpp"
#include "manifest.hpp"

namespace attnref::verify {

/// Views into `spec` and `data`, which must outlive the result.
inline fast::fast_problem fast_problem_for(const case_spec& spec, const case_data& data, std::size_t threads) {
    const case_shapes& d = spec.shapes;
    fast::fast_problem p;
    p.options = options_for(spec, data, threads, softmax_algorithm::shifted_division, 64);
    if (spec.kind == case_kind::sdpa) {
        p.q = {data.query.data(), {d.batch, d.heads, d.query_length, d.head_dim_qk}};
        p.k = {data.key.data(), {d.batch, d.kv_heads, d.key_length, d.head_dim_qk}};
        p.v = {data.value.data(), {d.batch, d.kv_heads, d.key_length, d.head_dim_v}};
        return p;
    }
    p.mha = true;
    p.heads = d.heads;
    p.kv_heads = d.kv_heads;
    p.x_q = {data.query.data(), {d.batch, d.query_length, d.model_dim}};
    p.x_k = {data.key.data(), {d.batch, d.key_length, d.model_dim}};
    p.x_v = {data.value.data(), {d.batch, d.key_length, d.model_dim}};
    p.params.w_q = {data.w_q.data(), {d.model_dim, d.heads * d.head_dim_qk}};
    p.params.w_k = {data.w_k.data(), {d.model_dim, d.kv_heads * d.head_dim_qk}};
    p.params.w_v = {data.w_v.data(), {d.model_dim, d.kv_heads * d.head_dim_v}};
    p.params.w_o = {data.w_o.data(), {d.heads * d.head_dim_v, d.output_dim}};
    if (spec.conventions.projection_bias) {
        p.params.b_q = {data.b_q.data(), {data.b_q.size()}};
        p.params.b_k = {data.b_k.data(), {data.b_k.size()}};
        p.params.b_v = {data.b_v.data(), {data.b_v.size()}};
        p.params.b_o = {data.b_o.data(), {data.b_o.size()}};
    }
    return p;
}

/// The case's certified tensors (output, then weights and lse when the case has them) for float64
/// and the case's extra targets, in generate_case's order.
inline certify::result certify_case_fast(const case_spec& spec, const case_data& data, std::size_t threads,
                                         fast::fast_stats* stats = nullptr, const fast::fast_options& base = {}) {
    std::vector<certify::binary_format> targets{certify::float64_target};
    for (const std::string& t : spec.outputs.targets) targets.push_back(*target_format(t));
    fast::fast_options fo = base;
    fo.threads = threads;
    return fast::certify_fast(fast_problem_for(spec, data, threads), spec.outputs.weights, spec.outputs.lse, targets, fo, stats);
}

}  // namespace attnref::verify
