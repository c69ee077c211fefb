// Multi-head attention: projections, head split/merge, GQA, and the seed chapter's example.
#define BOOST_TEST_MODULE multi_head_attention
#include <boost/mpl/list.hpp>
#include <boost/test/unit_test.hpp>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "attnref/bounds/tolerance/data_aware.hpp"
#include "attnref/bounds/tolerance/worst_case.hpp"
#include "attnref/bounds/tolerance/zero_trust.hpp"
#include "test_support.hpp"

using namespace attnref;
using attnref::test::cast;
using attnref::test::random_tensor;

BOOST_AUTO_TEST_CASE(split_and_merge_heads_round_trip_exactly) {
    const auto x = random_tensor<double, 3>({2, 5, 12}, 1);
    const auto heads = split_heads<double>(x.view(), 3);
    BOOST_TEST(heads.extent(1) == 3u);
    BOOST_TEST(heads(1, 2, 4, 3) == x(1, 4, 2 * 4 + 3));  // head h owns columns [h·d, (h+1)·d)
    BOOST_TEST(merge_heads<double>(heads.view()).storage() == x.storage());
    BOOST_CHECK_THROW(split_heads<double>(x.view(), 5), shape_error);
}

BOOST_AUTO_TEST_CASE(identity_projections_equal_plain_sdpa) {
    // One head, W = I, no bias: x·I = x exactly (every other product is +0), so MHA is SDPA bitwise.
    const std::size_t e = 6;
    const auto xq = random_tensor<double, 3>({2, 4, e}, 2), xk = random_tensor<double, 3>({2, 7, e}, 3),
               xv = random_tensor<double, 3>({2, 7, e}, 4);
    tensor<double, 2> identity({e, e}, 0.0);
    for (std::size_t i = 0; i < e; ++i) identity(i, i) = 1.0;
    const mha_parameters<double> p{identity.view(), identity.view(), identity.view(), identity.view()};
    attention_options a;
    a.mask.causal = true;
    const auto mha = multi_head_attention(xq, xk, xv, p, mha_options{1, 1, a});
    tensor<double, 4> q({2, 1, 4, e}), k({2, 1, 7, e}), v({2, 1, 7, e});
    q.storage() = xq.storage();
    k.storage() = xk.storage();
    v.storage() = xv.storage();
    const auto sdpa = scaled_dot_product_attention(q, k, v, a);
    BOOST_TEST(mha.output.storage() == sdpa.output.storage());
    BOOST_TEST(mha.weights.storage() == sdpa.weights.storage());
}

BOOST_AUTO_TEST_CASE(gqa_projection_equals_mha_with_repeated_kv_weights) {
    // H = 4, H_kv = 2: repeating each kv head's columns of W_k and W_v (kv head h/2 for query head h)
    // gives plain MHA, bitwise.
    const std::size_t e = 8, dk = 2, dv = 3;
    const auto xq = random_tensor<double, 3>({1, 3, e}, 5), xk = random_tensor<double, 3>({1, 5, e}, 6);
    const auto wq = random_tensor<double, 2>({e, 4 * dk}, 7), wk = random_tensor<double, 2>({e, 2 * dk}, 8),
               wv = random_tensor<double, 2>({e, 2 * dv}, 9), wo = random_tensor<double, 2>({4 * dv, e}, 10);
    tensor<double, 2> wk4({e, 4 * dk}), wv4({e, 4 * dv});
    for (std::size_t r = 0; r < e; ++r)
        for (std::size_t h = 0; h < 4; ++h) {
            for (std::size_t c = 0; c < dk; ++c) wk4(r, h * dk + c) = wk(r, (h / 2) * dk + c);
            for (std::size_t c = 0; c < dv; ++c) wv4(r, h * dv + c) = wv(r, (h / 2) * dv + c);
        }
    const auto gqa = multi_head_attention(xq, xk, xk, {wq.view(), wk.view(), wv.view(), wo.view()}, mha_options{4, 2, {}});
    const auto mha = multi_head_attention(xq, xk, xk, {wq.view(), wk4.view(), wv4.view(), wo.view()}, mha_options{4, 4, {}});
    BOOST_TEST(gqa.output.storage() == mha.output.storage());
    BOOST_CHECK_THROW(multi_head_attention(xq, xk, xk, {wq.view(), wk.view(), wv.view(), wo.view()}, mha_options{4, 3, {}}),
                      shape_error);
}

BOOST_AUTO_TEST_CASE(mha_logits_are_what_the_softmax_sees) {
    // GQA (H = 4, H_kv = 2) with query and key biases: a softmax of mha_logits, taken here in long
    // double, gives the weights multi_head_attention returns.
    const std::size_t e = 8, dk = 2, dv = 3;
    const auto xq = random_tensor<double, 3>({2, 3, e}, 21), xk = random_tensor<double, 3>({2, 5, e}, 22);
    const auto wq = random_tensor<double, 2>({e, 4 * dk}, 23), wk = random_tensor<double, 2>({e, 2 * dk}, 24),
               wv = random_tensor<double, 2>({e, 2 * dv}, 25), wo = random_tensor<double, 2>({4 * dv, e}, 26);
    const auto bq = random_tensor<double, 1>({4 * dk}, 27), bk = random_tensor<double, 1>({2 * dk}, 28);
    const mha_parameters<double> p{wq.view(), wk.view(), wv.view(), wo.view(), bq.view(), bk.view()};
    const mha_options o{4, 2, {}};
    const auto r = multi_head_attention(xq, xk, xk, p, o);
    const auto s = mha_logits<uniform_precision<double>>(tensor_view<const double, 3>(xq.view()), tensor_view<const double, 3>(xk.view()),
                                                         p, o);
    BOOST_TEST((s.extents() == extents_t<4>{2, 4, 3, 5}));
    for (std::size_t b = 0; b < 2; ++b)
        for (std::size_t h = 0; h < 4; ++h)
            for (std::size_t i = 0; i < 3; ++i) {
                long double m = s(b, h, i, 0), sum = 0;
                for (std::size_t j = 1; j < 5; ++j) m = std::max<long double>(m, s(b, h, i, j));
                for (std::size_t j = 0; j < 5; ++j) sum += std::exp(static_cast<long double>(s(b, h, i, j)) - m);
                for (std::size_t j = 0; j < 5; ++j) {
                    const long double expected = std::exp(static_cast<long double>(s(b, h, i, j)) - m) / sum;
                    BOOST_TEST(std::abs(static_cast<long double>(r.weights(b, h, i, j)) - expected) <= 1e-14L);
                }
            }
}

BOOST_AUTO_TEST_CASE(biases_are_added_after_the_sum) {
    // With W = 0 the projections are exactly the biases: Q = b_q, K = b_k, V = b_v; then every key has
    // the same logit, weights are uniform and the head output is b_v; the output is b_v·W_o + b_o.
    const std::size_t e = 4;
    const auto x = random_tensor<double, 3>({1, 3, e}, 11);
    const tensor<double, 2> zero({e, e}, 0.0);
    tensor<double, 2> wo({e, e}, 0.0);
    for (std::size_t i = 0; i < e; ++i) wo(i, i) = 2.0;
    const tensor<double, 1> bq({e}, 0.5), bk({e}, -0.25), bv({e}, 0.75), bo({e}, 1.0);
    mha_parameters<double> p{zero.view(), zero.view(), zero.view(), wo.view(), bq.view(), bk.view(), bv.view(), bo.view()};
    const auto r = multi_head_attention(x, x, x, p, mha_options{2, 2, {}});
    for (std::size_t n = 0; n < r.weights.size(); ++n) BOOST_TEST(r.weights[n] == 1.0 / 3.0);
    for (std::size_t n = 0; n < r.output.size(); ++n) BOOST_TEST(r.output[n] == 0.75 * 2.0 + 1.0);
}

// The seed chapter's example: B = 2, S = 10, d_model = 512, 8 heads, y = x·W, no bias, scale on the
// product 1/√64, weights ~ U(−1, 1)·√(3/d_model) (the seed's N(0,1)·√(1/d_model) has the same variance).
// Each arithmetic against a ~100-bit MPFR reference (the independent computation) within the
// library's own bounds for multi-head attention: tolerance::mha_scales (the default data-aware
// bound, docs/error-bounds.md eqs. 15–22), which must also be useful, and the rigorous worst-case
// bound inside it (eqs. 10–14).
using seed_types = boost::mpl::list<float, double, long double>;

namespace {
struct seed_example {
    static constexpr std::size_t batch = 2, length = 10, model = 512, heads = 8, depth = 64;
    tensor<double, 3> xq = random_tensor<double, 3>({batch, length, model}, 12), xk = random_tensor<double, 3>({batch, length, model}, 13),
                      xv = random_tensor<double, 3>({batch, length, model}, 14);
    double w_scale = std::sqrt(3.0 / model);
    tensor<double, 2> wq = random_tensor<double, 2>({model, model}, 15, -w_scale, w_scale),
                      wk = random_tensor<double, 2>({model, model}, 16, -w_scale, w_scale),
                      wv = random_tensor<double, 2>({model, model}, 17, -w_scale, w_scale),
                      wo = random_tensor<double, 2>({model, model}, 18, -w_scale, w_scale);
};
using ref_real = mpfr_real<30>;

}  // namespace

#if defined(ATTNREF_SANITIZE_BUILD)
constexpr bool sanitize_build = true;
#else
constexpr bool sanitize_build = false;
#endif

// A 21 M multiply-add MPFR reference: numerics only, run by the optimised build; the sanitizer build
// (-Og, instrumented Boost.Multiprecision) would spend a minute on it and check no memory access the
// other cases here do not.
BOOST_TEST_DECORATOR(*boost::unit_test::enable_if<!sanitize_build>())
BOOST_AUTO_TEST_CASE_TEMPLATE(seed_example_within_derived_bound, T, seed_types) {
    static const seed_example s;
    static const auto ref = [] {
        mha_options o{seed_example::heads, 0, {}};
        return multi_head_attention(cast<ref_real>(s.xq), cast<ref_real>(s.xk), cast<ref_real>(s.xv),
                                    mha_parameters<ref_real>{cast<ref_real>(s.wq).view(), cast<ref_real>(s.wk).view(),
                                                             cast<ref_real>(s.wv).view(), cast<ref_real>(s.wo).view()},
                                    o);
    }();
    const auto wq = cast<T>(s.wq), wk = cast<T>(s.wk), wv = cast<T>(s.wv), wo = cast<T>(s.wo);
    const auto r = multi_head_attention(cast<T>(s.xq), cast<T>(s.xk), cast<T>(s.xv),
                                        mha_parameters<T>{wq.view(), wk.view(), wv.view(), wo.view()},
                                        mha_options{seed_example::heads, 0, {}});
    BOOST_TEST(r.output.extent(0) == 2u);
    BOOST_TEST(r.output.extent(2) == 512u);
    BOOST_TEST(r.weights.extent(1) == 8u);
    // Invariants on this arithmetic's own outputs.
    const double u = static_cast<double>(unit_roundoff<T>());
    BOOST_TEST(rows_sum_to_one<T>(r.weights.view(), {}, u).ok);
    BOOST_TEST(weights_in_unit_interval<T>(r.weights.view(), {}).ok);

    // The library's bounds, from the inputs and the reference weights (as the checker computes them
    // from a golden case's inputs and certified weights): the default data-aware bound, which must
    // hold and be useful, and the rigorous worst-case bound it is capped by, which must hold (through
    // three d_model-wide projections it is loose by orders of magnitude: vacuous for float here).
    const tensor<double, 4> p_ref = cast<double>(ref.weights);
    const tensor<double, 3> o_ref = cast<double>(ref.output);
    const tolerance::data_aware_scales da =
        tolerance::mha_scales(s.xq.view(), s.xk.view(), s.xv.view(),
                              mha_parameters<double>{s.wq.view(), s.wk.view(), s.wv.view(), s.wo.view()}, p_ref.view(),
                              mha_options{seed_example::heads, 0, {}});
    std::vector<double> bounds(da.size());
    for (std::size_t e = 0; e < bounds.size(); ++e) bounds[e] = da.bound(e, u);
    double worst = 0, worst_rigorous = 0, largest = 0;
    for (std::size_t e = 0; e < r.output.size(); ++e) {
        const double err = static_cast<double>(abs(ref_real(r.output[e]) - ref.output[e]));
        BOOST_TEST(err <= bounds[e]);
        BOOST_TEST(err <= da.worst_case.bound(e, u));
        worst = std::max(worst, err / bounds[e]);
        worst_rigorous = std::max(worst_rigorous, err / da.worst_case.bound(e, u));
        largest = std::max(largest, err);
    }
    BOOST_TEST(!tolerance::find_vacuous(o_ref.storage(), seed_example::model, std::span<const double>(bounds)).any());
    BOOST_TEST_MESSAGE(scalar_traits<T>::name << " seed example: max |error| = " << largest << ", worst error / data-aware bound = "
                                              << worst << ", / worst-case bound = " << worst_rigorous);
    BOOST_TEST(largest > 0.0);  // the arithmetic under test really rounds (the comparison is live)
    // Not looser than measured (worst error / data-aware bound 0.0034–0.0048 over float, double,
    // long double; / worst-case bound 2.7e-8–3.6e-8).
    BOOST_TEST(worst >= 2e-3, scalar_traits<T>::name << ": worst error / bound = " << worst);
}

// attention_options::rows in multi-head attention: a selected (b, h, i) computes query row (b, i)
// for every head (its output needs them all), bit for bit as a full call; other rows are untouched.
BOOST_AUTO_TEST_CASE(selected_query_rows_equal_a_full_call) {
    const std::size_t e = 8;
    const auto xq = random_tensor<double, 3>({2, 3, e}, 71), xk = random_tensor<double, 3>({2, 4, e}, 72);
    const auto wq = random_tensor<double, 2>({e, e}, 73), wk = random_tensor<double, 2>({e, e}, 74),
               wv = random_tensor<double, 2>({e, e}, 75), wo = random_tensor<double, 2>({e, e}, 76);
    mha_options o{2, 0, {}};
    const mha_parameters<double> p{wq.view(), wk.view(), wv.view(), wo.view()};
    const auto full = multi_head_attention(xq, xk, xk, p, o);
    std::vector<std::uint8_t> rows(2 * 2 * 3, 0);
    rows[(1 * 2 + 1) * 3 + 2] = 1;  // (b1, h1, i2): query row (1, 2), both heads
    o.attention.rows = rows;
    tensor<double, 3> out({2, 3, e}, -7.0);
    tensor<double, 3> lse({2, 2, 3}, -7.0);
    multi_head_attention_into<uniform_precision<double>>(tensor_view<const double, 3>(xq.view()), tensor_view<const double, 3>(xk.view()),
                                                         tensor_view<const double, 3>(xk.view()), p, o, out.view(),
                                                         tensor_view<double, 4>{}, lse.view(), tensor_view<double, 4>{});
    for (std::size_t b = 0; b < 2; ++b)
        for (std::size_t i = 0; i < 3; ++i) {
            const bool on = b == 1 && i == 2;
            for (std::size_t c = 0; c < e; ++c) BOOST_TEST((out(b, i, c) == (on ? full.output(b, i, c) : -7.0)));
            for (std::size_t h = 0; h < 2; ++h) BOOST_TEST((lse(b, h, i) == (on ? full.lse(b, h, i) : -7.0)));
        }
}

BOOST_AUTO_TEST_CASE(double_projection_path_follows_the_specified_order_bitwise) {
    // linear_into's double path (blocked rows and columns, vector lanes, an AVX2 copy) against the
    // order the projection is specified by, written out here: acc = +0, acc = acc + x_k·W_kj for k
    // ascending, then + b_j. Shapes not multiples of the blocks (rows, 8 lanes, 512 columns), a row
    // filter, zeros and signed values; one thread and two; the AVX2 copy on and off.
    for (const auto& [batch, len, m, n] : std::vector<std::array<std::size_t, 4>>{{1, 7, 5, 13}, {2, 9, 33, 515}, {1, 3, 64, 1031}}) {
        // Full 53-bit significands (the generator's values have 24 bits: their sums would often be exact
        // in any order, and a wrong order would go unnoticed).
        auto x = random_tensor<double, 3>({batch, len, m}, 11 + n);
        auto w = random_tensor<double, 2>({m, n}, 12 + n);
        auto bias = random_tensor<double, 1>({n}, 13 + n);
        for (double& v : x.storage()) v /= 3;
        for (double& v : w.storage()) v /= 7;
        for (double& v : bias.storage()) v /= 11;
        x(0, 0, 0) = 0.0, x(0, 1, 1 % m) = -0.0;
        std::vector<std::uint8_t> filter(batch * len, 1);
        filter[1] = 0;
        for (const bool with_bias : {false, true})
            for (const bool filtered : {false, true}) {
                tensor<double, 3> expected({batch, len, n}, 7.0);
                for (std::size_t r = 0; r < batch * len; ++r) {
                    if (filtered && !filter[r]) continue;
                    for (std::size_t j = 0; j < n; ++j) {
                        volatile double acc = +0.0;  // volatile: no reassociation, no contraction
                        for (std::size_t k = 0; k < m; ++k) {
                            const double t = x.data()[r * m + k] * w(k, j);
                            acc = acc + t;
                        }
                        expected.data()[r * n + j] = with_bias ? acc + bias[j] : static_cast<double>(acc);
                    }
                }
                for (const std::size_t threads : {1, 2})
                    for (const bool avx2 : {true, false}) {
#ifdef ATTNREF_LINEAR_AVX2
                        linear_detail::avx2_allowed() = avx2;
#endif
                        tensor<double, 3> y({batch, len, n}, 7.0);
                        linear_into<uniform_precision<double>>(tensor_view<const double, 3>(x.view()), tensor_view<const double, 2>(w.view()),
                                                               with_bias ? tensor_view<const double, 1>(bias.view()) : tensor_view<const double, 1>{},
                                                               y.view(), threads, "w", filtered ? std::span<const std::uint8_t>(filter) : std::span<const std::uint8_t>{});
                        bool same = true;
                        for (std::size_t e = 0; e < y.size(); ++e) same = same && std::bit_cast<std::uint64_t>(y.data()[e]) == std::bit_cast<std::uint64_t>(expected.data()[e]);
                        BOOST_TEST(same, "n = " << n << " bias " << with_bias << " filtered " << filtered << " threads " << threads << " avx2 " << avx2);
                    }
            }
    }
#ifdef ATTNREF_LINEAR_AVX2
    linear_detail::avx2_allowed() = true;
#endif
}
