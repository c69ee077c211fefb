// Compile-only tests: the whole forward pass constant-evaluated on small fixed shapes, for every
// literal arithmetic, with its invariants checked by static_assert. Built by GCC 12 (as an object
// library) and by Clang 14 (ctest runs clang++ -fsyntax-only on this file).
#include "../support/fixed_inputs.hpp"
#include "attnref/attnref.hpp"

namespace {

using namespace attnref;

constexpr mha_shape small{.batch = 2, .query_length = 3, .key_length = 4, .model_dim = 4, .heads = 2, .kv_heads = 1,
                          .head_dim_qk = 2, .head_dim_v = 3};

// Deterministic small inputs: multiples of 1/16 in [−1/2, 1/2], exact in every type.
template <class T>
constexpr fixed_mha_inputs<T, small> make_inputs() {
    fixed_mha_inputs<T, small> in{};
    test::sixteenths gen;
    test::fill(gen, in);
    return in;
}

constexpr attention_options causal_bottom_right() {
    attention_options o;
    o.mask.causal = true;
    o.mask.alignment = causal_alignment::bottom_right;
    return o;
}

template <class T>
constexpr bool forward_pass_invariants_hold() {
    constexpr attention_options options = causal_bottom_right();
    const auto out = multi_head_attention<T, small>(make_inputs<T>(), options);
    const invariant_context ctx{options.mask};
    const double u = static_cast<double>(unit_roundoff<T>());
    // Row 0 (bottom-right, Sq = 3, Sk = 4) sees keys 0 and 1; row 2 sees all four.
    bool ok = rows_sum_to_one<T>(out.weights.view(), ctx, u).ok && masked_weights_are_zero<T>(out.weights.view(), ctx).ok &&
              weights_in_unit_interval<T>(out.weights.view(), ctx).ok;
    ok = ok && out.weights(0, 0, 0, 2) == T(0) && out.weights(0, 0, 0, 1) > T(0) && out.weights(1, 1, 2, 3) > T(0);
    return ok;
}

static_assert(forward_pass_invariants_hold<float>());
static_assert(forward_pass_invariants_hold<double>());
static_assert(forward_pass_invariants_hold<long double>());
#if defined(__SIZEOF_FLOAT128__)
static_assert(forward_pass_invariants_hold<__float128>());
#endif

// Hand-worked: equal logits give exactly uniform weights (exp(0) = 1, 1/(1 + 1) = 1/2 exactly), and a
// single visible key gives its value exactly.
template <class T>
constexpr bool hand_worked() {
    constexpr sdpa_shape s{.batch = 1, .heads = 1, .kv_heads = 1, .query_length = 2, .key_length = 2, .head_dim_qk = 1,
                           .head_dim_v = 1};
    fixed_sdpa_inputs<T, s> in{};
    in.q.values = {T(1), T(0)};   // row 1: q = 0, so both logits are 0
    in.k.values = {T(0), T(0)};   // row 0: both logits 0 too
    in.v.values = {T(2), T(6)};
    attention_options o;
    const auto r = scaled_dot_product_attention<T, s>(in, o);
    o.mask.causal = true;
    const auto c = scaled_dot_product_attention<T, s>(in, o);
    return r.weights(0, 0, 0, 0) == T(0.5) && r.output(0, 0, 1, 0) == T(4) && c.output(0, 0, 0, 0) == T(2) &&
           c.weights(0, 0, 0, 1) == T(0);
}
static_assert(hand_worked<float>());
static_assert(hand_worked<double>());
static_assert(hand_worked<long double>());

// Empty rows (bottom-right with Sq > Sk): lse = −inf and the policy's output, at compile time.
constexpr bool empty_row_policies() {
    constexpr sdpa_shape s{.batch = 1, .heads = 1, .kv_heads = 1, .query_length = 3, .key_length = 2, .head_dim_qk = 1,
                           .head_dim_v = 1};
    fixed_sdpa_inputs<double, s> in{};
    in.q.values = {1, 2, 3};
    in.k.values = {0.5, -0.5};
    in.v.values = {2, 6};
    attention_options o = causal_bottom_right();
    const auto zero = scaled_dot_product_attention<double, s>(in, o);
    o.softmax.empty_rows = empty_row_policy::uniform;
    const auto uniform = scaled_dot_product_attention<double, s>(in, o);
    o.softmax.empty_rows = empty_row_policy::nan;
    const auto nan = scaled_dot_product_attention<double, s>(in, o);
    return zero.output(0, 0, 0, 0) == 0 && zero.lse(0, 0, 0) < -1e308 && uniform.output(0, 0, 0, 0) == 4 &&
           is_nan(nan.output(0, 0, 0, 0)) && zero.weights(0, 0, 1, 0) == 1;
}
static_assert(empty_row_policies());

// Negative tests: invalid fixed shapes are rejected by the constraints.
template <mha_shape S>
concept accepted_mha_shape = requires { typename fixed_mha_inputs<double, S>; };
static_assert(accepted_mha_shape<small>);
static_assert(!accepted_mha_shape<mha_shape{.heads = 3, .kv_heads = 2}>);  // H % H_kv ≠ 0
static_assert(!accepted_mha_shape<mha_shape{.batch = 0}>);
template <sdpa_shape S>
concept accepted_sdpa_shape = requires { typename fixed_sdpa_inputs<float, S>; };
static_assert(!accepted_sdpa_shape<sdpa_shape{.heads = 4, .kv_heads = 3}>);
static_assert(!accepted_sdpa_shape<sdpa_shape{.head_dim_v = 0}>);

// Scalar concept: what the algorithms accept, and what they do not.
static_assert(Scalar<float> && Scalar<double> && Scalar<long double>);
struct not_a_number {};
static_assert(!Scalar<not_a_number>);
static_assert(!Scalar<int*>);

}  // namespace
