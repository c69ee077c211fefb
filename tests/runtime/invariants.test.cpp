// The invariant checks pass on correct outputs and fail on deliberately broken ones.
#define BOOST_TEST_MODULE invariants
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <numeric>

#include "test_support.hpp"

using namespace attnref;
using attnref::test::random_tensor;

namespace {
struct fixture {
    tensor<double, 4> q = random_tensor<double, 4>({2, 2, 5, 4}, 1), k = random_tensor<double, 4>({2, 1, 6, 4}, 2),
                      v = random_tensor<double, 4>({2, 1, 6, 3}, 3);
    attention_options options = [] {
        attention_options o;
        o.mask.causal = true;
        o.mask.alignment = causal_alignment::bottom_right;
        return o;
    }();
    attention_result<uniform_precision<double>> r = scaled_dot_product_attention(q, k, v, options);
    invariant_context ctx{options.mask};
    double u = 0x1p-53;
};
}  // namespace

BOOST_FIXTURE_TEST_CASE(correct_outputs_pass_every_invariant, fixture) {
    BOOST_TEST(rows_sum_to_one<double>(r.weights.view(), ctx, u).ok);
    BOOST_TEST(masked_weights_are_zero<double>(r.weights.view(), ctx).ok);
    BOOST_TEST(weights_in_unit_interval<double>(r.weights.view(), ctx).ok);
    const auto logits = attention_logits<uniform_precision<double>, double, double>(q.view(), k.view(), options);
    const bool lse_ok = weights_match_lse<double, double, double>(r.weights.view(), logits.view(), r.lse.view(), ctx, u).ok;
    BOOST_TEST(lse_ok);
    const bool range_ok = head_outputs_in_value_range<double, double, double>(r.output.view(), v.view(), r.weights.view(), u).ok;
    BOOST_TEST(range_ok);
}

BOOST_FIXTURE_TEST_CASE(broken_outputs_are_caught, fixture) {
    auto p = r.weights;
    p(1, 1, 4, 2) *= 1 + 1e-12;  // one weight off by 1e-12 relative: the row no longer sums to 1 within (n+3)u
    const auto report = rows_sum_to_one<double>(p.view(), ctx, u);
    BOOST_TEST(!report.ok);
    BOOST_TEST(report.index[0] == 1u);
    BOOST_TEST(report.index[2] == 4u);
    p = r.weights;
    p(0, 0, 0, 5) = 1e-300;  // a masked key (row 0 sees keys 0..1) with a tiny weight
    BOOST_TEST(!masked_weights_are_zero<double>(p.view(), ctx).ok);
    p(0, 0, 0, 5) = -0.0;  // −0 == 0: still "exactly 0"
    BOOST_TEST(masked_weights_are_zero<double>(p.view(), ctx).ok);
    p(0, 0, 0, 0) = 1.5;
    BOOST_TEST(!weights_in_unit_interval<double>(p.view(), ctx).ok);
    auto lse = r.lse;
    lse(0, 1, 3) += 1e-10;
    const auto logits = attention_logits<uniform_precision<double>, double, double>(q.view(), k.view(), options);
    const bool lse_ok = weights_match_lse<double, double, double>(r.weights.view(), logits.view(), lse.view(), ctx, u).ok;
    BOOST_TEST(!lse_ok);
    auto o = r.output;
    o(1, 0, 2, 1) = 2.0;  // values are in [−1, 1): outside the convex hull
    const bool range_ok = head_outputs_in_value_range<double, double, double>(o.view(), v.view(), r.weights.view(), u).ok;
    BOOST_TEST(!range_ok);
    auto nan_weights = r.weights;
    nan_weights(0, 0, 2, 0) = std::nan("");
    BOOST_TEST(!rows_sum_to_one<double>(nan_weights.view(), ctx, u).ok);
}

BOOST_FIXTURE_TEST_CASE(causality_holds_and_a_leaky_implementation_fails, fixture) {
    auto correct = [&](const tensor<double, 4>& qq, const tensor<double, 4>& kk, const tensor<double, 4>& vv) {
        return scaled_dot_product_attention(qq, kk, vv, options).output;
    };
    BOOST_TEST(causality(correct, q, k, v, options.mask).ok);
    // The same causal mask but aligned top-left: rows see fewer keys, still causal w.r.t. its own mask.
    // Checked against the bottom-right mask description it is fine too (it sees a subset), but an
    // implementation that ignores the mask entirely must fail.
    auto leaky = [&](const tensor<double, 4>& qq, const tensor<double, 4>& kk, const tensor<double, 4>& vv) {
        return scaled_dot_product_attention(qq, kk, vv).output;
    };
    BOOST_TEST(!causality(leaky, q, k, v, options.mask).ok);
}

BOOST_FIXTURE_TEST_CASE(key_permutation_invariance_within_bound, fixture) {
    auto unmasked = [&](const tensor<double, 4>& qq, const tensor<double, 4>& kk, const tensor<double, 4>& vv) {
        return scaled_dot_product_attention(qq, kk, vv).output;
    };
    const std::vector<std::size_t> reversed = {5, 4, 3, 2, 1, 0}, rotated = {2, 3, 4, 5, 0, 1};
    BOOST_TEST(key_permutation_invariance(unmasked, q, k, v, reversed, u).ok);
    BOOST_TEST(key_permutation_invariance(unmasked, q, k, v, rotated, u).ok);
    // With a causal mask, permuting keys changes which keys are visible: the check must catch it.
    auto masked = [&](const tensor<double, 4>& qq, const tensor<double, 4>& kk, const tensor<double, 4>& vv) {
        return scaled_dot_product_attention(qq, kk, vv, options).output;
    };
    BOOST_TEST(!key_permutation_invariance(masked, q, k, v, reversed, u).ok);
}

BOOST_AUTO_TEST_CASE(empty_rows_follow_the_policy) {
    const auto q = random_tensor<double, 4>({1, 1, 3, 2}, 4), k = random_tensor<double, 4>({1, 1, 2, 2}, 5),
               v = random_tensor<double, 4>({1, 1, 2, 2}, 6);
    for (empty_row_policy policy : {empty_row_policy::zero, empty_row_policy::nan, empty_row_policy::uniform}) {
        attention_options o;
        o.mask.causal = true;
        o.mask.alignment = causal_alignment::bottom_right;  // row 0 is empty
        o.softmax.empty_rows = policy;
        const auto r = scaled_dot_product_attention(q, k, v, o);
        const invariant_context ctx{o.mask, policy};
        BOOST_TEST(rows_sum_to_one<double>(r.weights.view(), ctx, 0x1p-53).ok);
        BOOST_TEST(weights_in_unit_interval<double>(r.weights.view(), ctx).ok);
        // The wrong policy in the context fails.
        const invariant_context wrong{o.mask, policy == empty_row_policy::zero ? empty_row_policy::uniform : empty_row_policy::zero};
        BOOST_TEST(!rows_sum_to_one<double>(r.weights.view(), wrong, 0x1p-53).ok);
    }
}
