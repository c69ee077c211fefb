#pragma once
/// \file core.hpp
/// The Python extension's C++ side (no pybind11 here): one attention call on the caller's own
/// inputs, described once (`call`), and the three things the module does with it —
///   compute_certified  correctly rounded float64 through certify.hpp's MPFI ladder (certified.cpp)
///   compute_arith      one of attnref's arithmetics: a precision policy of policies.hpp, or
///                      MPFR at a compiled precision (arith.cpp)
///   judge              a candidate against a reference under tolerance.hpp's models (judge.cpp)
/// Inputs are read through views of the caller's float64 buffers (no copy); masks, key lengths
/// and slopes are owned here. Nothing in these functions touches Python, so the bindings release
/// the GIL around them.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnref/core/attention.hpp"
#include "attnref/check/judge_forward.hpp"
#include "attnref/certify/report.hpp"
#include "attnref/bounds/invariants.hpp"
#include "attnref/core/multi_head_attention.hpp"
#include "attnref/core/problem.hpp"
#include "attnref/bounds/tolerance.hpp"

namespace attnref::python {

/// A read-only float64 C-contiguous buffer of the caller's (an empty shape = not given).
struct array_ref {
    const double* data = nullptr;
    std::vector<std::size_t> shape;
    bool given() const { return !shape.empty(); }
};

/// Conventions of one call (problem.hpp's problem_conventions), owning what attention_options only
/// points to: the masks' values (boolean_mask, additive_mask say whether they are given).
struct conventions : problem_conventions {
    std::vector<std::uint8_t> mask_values;  ///< (mask_extents), nonzero = true
    std::vector<double> additive_values;    ///< (additive_extents)
    extents_t<4> mask_extents{}, additive_extents{};
    std::size_t threads = 0;

    /// attention_options pointing into this object (which must outlive them).
    attention_options options() const;
};

using call_kind = problem_kind;

/// One call: SDPA reads q, k, v (B, H, Sq, dk), (B, Hkv, Sk, dk), (B, Hkv, Sk, dv); MHA reads x_q,
/// x_k, x_v (B, S, E) and the projections in attnref's layout y = x·W + b (multi_head_attention.hpp).
struct call {
    call_kind kind = call_kind::sdpa;
    array_ref q, k, v;                   // sdpa: q, k, v; mha: x_q, x_k, x_v
    array_ref w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o;  // mha only; biases optional
    std::size_t heads = 0, kv_heads = 0;  // mha only
    conventions conv;

    /// Checks ranks and shapes (shape_error naming the argument) and returns (B, H, Sq, Sk) and the
    /// output shape.
    void validate() const;
    std::vector<std::size_t> output_shape() const;
    std::vector<std::size_t> weights_shape() const;  ///< (B, H, Sq, Sk)
    std::vector<std::size_t> lse_shape() const;      ///< (B, H, Sq)
    /// The call as views of its arrays and its options (problem.hpp), for the checker and the
    /// fast certified path; views into this call, which must outlive them.
    forward_problem problem() const;
};

/// A computation's results as exact doubles of their format (C order).
struct result {
    std::vector<double> output, weights, lse;
    bool single = false;  ///< the arithmetic's output, weights and lse are float32 (or narrower) values
    std::vector<certify::tensor_report> certifications;  ///< certified only (float64 target)
    std::vector<int> precisions_bits;           ///< certified: every rung computed
    int arith_bits = 0;                         ///< the arithmetic's precision (certified: 0)
    std::size_t undecided = 0;  ///< certified without escalation: elements the fast path left undecided
};

/// Correctly rounded float64 output, weights and lse (always all three: the weights feed the
/// data-aware bound). Throws certify::uncertified_error naming the element that never certifies.
/// `escalate` false: elements the fast path cannot decide are not sent to the MPFI ladder (whose
/// intervals span whole tensors); they are counted in result::undecided and their values are not
/// to be used (the caller refuses the call).
result compute_certified(const call& c, bool escalate = true);

/// Certified gradients of a call (sdpa: grad_query, grad_key, grad_value; mha: also grad_w_q …
/// grad_w_o and, with biases, grad_b_q … grad_b_o), each the correctly rounded float64 of the exact
/// gradient for the upstream gradient dO (`grad_output`, shaped like the output): the call as a golden
/// backward case, certified by golden::certify_gradients_fast as `attnref generate --gradients` certifies (gradients.cpp).
struct gradient_tensor {
    std::string role;
    std::vector<std::size_t> shape;
    std::vector<double> values;
};
struct gradient_result {
    std::vector<gradient_tensor> tensors;
    std::vector<certify::tensor_report> certifications;
    std::vector<int> precisions_bits;
};
gradient_result compute_certified_gradients(const call& c, const array_ref& grad_output, std::uint64_t max_memory);
/// The library's estimate (golden/memory.hpp, as `attnref generate [--gradients]` estimates the case
/// the call is) of the certified path's bytes: (the fast path's buffers, and the fast backward's with
/// grad_output; the forward's MPFI escalation of undecided rows). The backward's own escalation is
/// checked against max_memory when it runs. nullopt: no case describes the call.
std::optional<std::pair<std::uint64_t, std::uint64_t>> certified_memory(const call& c, const array_ref* grad_output);

/// `arith`: a policy name of policies.hpp (inputs first rounded to its storage format) or
/// "mpfr:BITS" for a compiled precision (mpfr_bits()). Returns false for an unknown name.
bool compute_arith(const call& c, const std::string& arith, bool weights, bool lse, result& r);
/// The MPFR precisions (bits) "mpfr:BITS" accepts.
std::vector<int> mpfr_bits();

struct judge_request {
    tolerance::tolerance_model model = tolerance::tolerance_model::data_aware;  ///< data-aware, worst-case, assert-close, ulp
    tolerance::candidate_format format = tolerance::candidate_format::float32;
    /// Unit roundoff of the reference's own error (0: certified, correctly rounded).
    double reference_u = 0;
    std::vector<double> expected_output, expected_weights, expected_lse;
    std::vector<double> actual_output, actual_weights, actual_lse;  ///< weights, lse optional
    std::size_t output_row = 1;
    double ulp_limit = 4;
    empty_row_lse empty_lse = empty_row_lse::minus_inf;  ///< the lse the candidate writes for empty rows
};

/// Compares as `attnref check` does: the checker's golden::judge_forward (check/judge_forward.hpp)
/// on the call's problem, after checking the sizes (shape_error naming the argument).
/// assert-close and ulp need no call (`c` may be null: then no decoys, weights or lse).
golden::forward_judgment judge(const call* c, const judge_request& rq);

}  // namespace attnref::python
