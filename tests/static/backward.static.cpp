// Compile-only test of the backward pass (backward.hpp): gradients of a tiny GQA case with a padded
// key constant-evaluated, with its invariants checked by static_assert. Built by GCC (object
// library) and by Clang (ctest runs clang++ -fsyntax-only on this file).
#include "../support/fixed_inputs.hpp"
#include "attnref/attnref.hpp"

namespace {

using namespace attnref;

// B = 1, H = 2 query heads sharing Hkv = 1 kv head, Sq = 2, Sk = 3; key 2 is padding.
constexpr sdpa_shape tiny{.batch = 1, .heads = 2, .kv_heads = 1, .query_length = 2, .key_length = 3, .head_dim_qk = 2,
                          .head_dim_v = 2};
constexpr std::size_t key_lengths[] = {2};

template <class T>
constexpr fixed_sdpa_inputs<T, tiny> inputs() {
    fixed_sdpa_inputs<T, tiny> in{};
    test::sixteenths gen;  // multiples of 1/16, exact
    test::fill(gen, in);
    return in;
}

template <class T>
constexpr T magnitude(T x) {
    return x < T(0) ? -x : x;
}

// Σ_j dS_ij = 0 for every row (softmax is shift-invariant), within n·u·Σ_j |dS_ij| (Sk sequential
// additions of terms each carrying a few ulps); the padded key gets dK = dV = dS = 0 exactly; and
// dV_j = Σ_h Σ_i P_ij·dO_i exactly (the textbook algorithm reuses the forward's P in the same order).
template <class T>
constexpr bool backward_invariants_hold(backward_algorithm algorithm) {
    attention_options o;
    o.mask.key_lengths = key_lengths;
    const auto in = inputs<T>();
    fixed_tensor<T, 1, 2, 2, 2> grad_output{};
    for (std::size_t n = 0; n < grad_output.values.size(); ++n) grad_output.values[n] = T(int(n % 3) - 1) / T(4);
    const auto g = scaled_dot_product_attention_backward<T, tiny>(in, grad_output, o, backward_options{algorithm});
    const auto f = scaled_dot_product_attention<T, tiny>(in, o);
    const T u = unit_roundoff<T>();
    bool ok = true;
    for (std::size_t h = 0; h < 2; ++h)
        for (std::size_t i = 0; i < 2; ++i) {
            T sum = T(0), abs_sum = T(0);
            for (std::size_t j = 0; j < 3; ++j) {
                sum = sum + g.grad_logits(0, h, i, j);
                abs_sum = abs_sum + magnitude(g.grad_logits(0, h, i, j));
            }
            ok = ok && magnitude(sum) <= T(16) * u * abs_sum && g.grad_logits(0, h, i, 2) == T(0);
        }
    for (std::size_t c = 0; c < 2; ++c) ok = ok && g.grad_key(0, 0, 2, c) == T(0) && g.grad_value(0, 0, 2, c) == T(0);
    if (algorithm == backward_algorithm::textbook)
        for (std::size_t j = 0; j < 3; ++j)
            for (std::size_t c = 0; c < 2; ++c) {
                T acc = T(0);
                for (std::size_t h = 0; h < 2; ++h)
                    for (std::size_t i = 0; i < 2; ++i) {
                        const T product = f.weights(0, h, i, j) * grad_output(0, h, i, c);
                        acc = acc + product;
                    }
                ok = ok && acc == g.grad_value(0, 0, j, c);
            }
    // Not vacuous: the attended keys do get gradient.
    return ok && g.grad_key(0, 0, 0, 0) != T(0) && g.grad_value(0, 0, 1, 1) != T(0);
}

static_assert(backward_invariants_hold<float>(backward_algorithm::textbook));
static_assert(backward_invariants_hold<double>(backward_algorithm::textbook));
static_assert(backward_invariants_hold<double>(backward_algorithm::flash));
static_assert(backward_invariants_hold<long double>(backward_algorithm::flash));

// Multi-head attention, constant-evaluated. A common shift b_k of every key adds s·q_i·b_k to a whole
// row of logits, which softmax ignores: ∂L/∂b_k = 0 in exact arithmetic (no soft-cap here). The inputs
// are O(1) multiples of 1/16 on tiny shapes, so the computed value is a few hundred ulps of O(1)
// terms at most (measured: 5e-18); 2^-40 (9e-13) separates that from a wrong gradient (dropping the
// D term of dS gives 0.06; grad_b_q, checked nonzero, is 3e-3). And ∂L/∂b_o = Σ_rows dOut, formed
// here in the same order.
constexpr mha_shape small_mha{.batch = 1, .query_length = 2, .key_length = 3, .model_dim = 3, .heads = 2, .kv_heads = 1,
                              .head_dim_qk = 2, .head_dim_v = 2};

constexpr bool mha_backward_invariants_hold() {
    fixed_mha_inputs<double, small_mha> in{};
    test::sixteenths gen;
    test::fill(gen, in, /*with_bias=*/true);
    fixed_tensor<double, 1, 2, 3> grad_output{};
    test::fill(gen, grad_output);
    attention_options o;
    o.mask.causal = true;
    o.mask.alignment = causal_alignment::bottom_right;
    const auto g = multi_head_attention_backward<double, small_mha>(in, grad_output, o);
    bool ok = true;
    for (double x : g.grad_b_k.values) ok = ok && magnitude(x) <= 0x1p-40;
    for (std::size_t c = 0; c < 3; ++c) ok = ok && g.grad_b_o(c) == (0.0 + grad_output(0, 0, c)) + grad_output(0, 1, c);
    return ok && magnitude(g.grad_b_q(0)) > 1e-3 && magnitude(g.grad_w_k(1, 1)) > 0;
}
static_assert(mha_backward_invariants_hold());

}  // namespace
