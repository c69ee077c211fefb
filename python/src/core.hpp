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

#include "attnref/attention.hpp"
#include "attnref/certify_report.hpp"
#include "attnref/invariants.hpp"
#include "attnref/multi_head_attention.hpp"
#include "attnref/tolerance.hpp"

namespace attnref::python {

/// A read-only float64 C-contiguous buffer of the caller's (an empty shape = not given).
struct array_ref {
    const double* data = nullptr;
    std::vector<std::size_t> shape;
    bool given() const { return !shape.empty(); }
};

/// Conventions of one call, owning what attention_options only points to.
struct conventions {
    std::optional<double> scale;
    scale_placement placement = scale_placement::on_product;
    bool causal = false;
    causal_alignment alignment = causal_alignment::top_left;
    std::ptrdiff_t diagonal_offset = 0;
    std::optional<sliding_window> window;
    std::vector<std::size_t> key_lengths;
    std::vector<std::uint8_t> boolean_mask;  ///< (mask_extents), nonzero = true
    std::vector<double> additive_mask;       ///< (additive_extents)
    extents_t<4> mask_extents{}, additive_extents{};
    mask_polarity polarity = mask_polarity::true_means_attend;
    empty_row_policy empty_rows = empty_row_policy::zero;
    std::optional<double> softcap;
    std::vector<double> alibi_slopes;
    std::size_t threads = 0;

    /// attention_options pointing into this object (which must outlive them).
    attention_options options() const;
};

enum class call_kind { sdpa, mha };

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
/// backward case, certified by golden::certify_gradients as `attnref generate` certifies (gradients.cpp).
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
gradient_result compute_certified_gradients(const call& c, const array_ref& grad_output);

/// `arith`: a policy name of policies.hpp (inputs first rounded to its storage format) or
/// "mpfr:BITS" for a compiled precision (mpfr_bits()). Returns false for an unknown name.
bool compute_arith(const call& c, const std::string& arith, bool weights, bool lse, result& r);
/// The MPFR precisions (bits) "mpfr:BITS" accepts.
std::vector<int> mpfr_bits();

/// One tensor's judgement (see judge()).
struct tensor_judgement {
    std::string name;
    tolerance::comparison cmp;
    tolerance::vacuity vacuous;
    std::string untrustworthy;  ///< zero-trust reason (output only), empty when trustworthy
    std::string decoy;          ///< output only: a trivially wrong output the bounds would pass (see judge())
    std::size_t wrong_empty_lse = 0;  ///< lse only: empty rows without the declared lse convention
    double bound_max = 0;       ///< the largest finite bound
};

struct judgement {
    std::vector<tensor_judgement> tensors;
    std::vector<invariant_report> invariants;  ///< invariants.hpp, on the candidate's weights (and lse)
};

struct judge_request {
    std::string model = "data-aware";  ///< data-aware, worst-case, assert-close, ulp
    tolerance::candidate_format format = tolerance::candidate_format::float32;
    /// Unit roundoff of the reference's own error (0: certified, correctly rounded): its own bound
    /// under the same model is added to the candidate's.
    double reference_u = 0;
    std::vector<double> expected_output, expected_weights, expected_lse;
    std::vector<double> actual_output, actual_weights, actual_lse;  ///< weights, lse optional
    std::size_t output_row = 1;
    double ulp_limit = 4;
    empty_row_lse empty_lse = empty_row_lse::minus_inf;  ///< the lse the candidate writes for empty rows
};

/// Compares, as `attnref check` does (verify/check.cpp): the output under the model, with the
/// vacuity rule (tolerance::find_vacuous), the decoy rule (an output bound that would pass the
/// mean of V or the softmax at scale x2 / x1/2 while they are visibly wrong is vacuous) and
/// zero-trust (tolerance::untrustworthy); weights and lse against the reference's under
/// tolerance::weights_bound / lse_bound, plus invariants.hpp's invariants on them.
/// assert-close and ulp need no call (`c` may be null: then no decoys, weights or lse);
/// data-aware and worst-case derive their bounds from the call's inputs and the reference's weights.
judgement judge(const call* c, const judge_request& rq);

}  // namespace attnref::python
