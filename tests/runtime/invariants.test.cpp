// The invariant checks pass on correct outputs and fail on deliberately broken ones.
#define BOOST_TEST_MODULE invariants
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <numeric>

#include "attnref/core/formats.hpp"
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

// Rows of P sum to 1 for weights computed with fp32 accumulation and stored in bf16 or fp16 (the
// bf16_fp32acc / fp16_fp32acc policies): the bound is the softmax's accumulation error plus the
// storage rounding of each weight, (1 + γ_{n+3}(2^-24))(1 + u_s) − 1 + n·η — never negative (γ_n(2^-8)
// was, for n = 300) or infinite (n = 256) — and a row that sums to 1.01 fails.
template <class Storage>
void row_sums_with_storage(double u_s, double smallest_normal) {
    using policy = precision_policy<Storage, float, Storage, Storage>;
    for (const std::size_t sk : {256u, 300u, 512u}) {
        BOOST_TEST_CONTEXT("Sk = " << sk << ", u_s = " << u_s) {
            const auto q = to_tensor<Storage>(random_tensor<double, 4>({1, 2, 3, 16}, 11).view());
            const auto k = to_tensor<Storage>(random_tensor<double, 4>({1, 2, sk, 16}, 12).view());
            const auto v = to_tensor<Storage>(random_tensor<double, 4>({1, 2, sk, 8}, 13).view());
            attention_options o;
            o.scale = 4.0;  // logits up to ~16: weights over many binades, some far below 1/n
            const auto r = scaled_dot_product_attention<policy, Storage, Storage, Storage>(q.view(), k.view(), v.view(), o);
            const auto p = to_tensor<double>(r.weights.view());
            const double eta = half_subnormal_spacing(0x1p-24, 0x1p-126) + half_subnormal_spacing(u_s, smallest_normal);
            const invariant_context ctx{o.mask};
            const invariant_report good = rows_sum_to_one<double>(p.view(), ctx, 0x1p-24, u_s, eta);
            BOOST_TEST(good.ok, "worst " << good.worst << " bound " << good.bound);
            BOOST_TEST(!good.vacuous);
            BOOST_TEST(good.bound > 0);
            BOOST_TEST(good.bound < 1.01 * u_s + 1e-4);  // the storage rounding dominates: u_s, not n·u_s
            auto bad = p;
            for (std::size_t j = 0; j < sk; ++j) bad(0, 1, 2, j) = static_cast<double>(Storage(bad(0, 1, 2, j) * 1.01));
            const invariant_report wrong = rows_sum_to_one<double>(bad.view(), ctx, 0x1p-24, u_s, eta);
            BOOST_TEST(!wrong.ok);
            BOOST_TEST(wrong.index[1] == 1u);
            BOOST_TEST(wrong.index[2] == 2u);
        }
    }
}

BOOST_AUTO_TEST_CASE(row_sums_of_bf16_and_fp16_weights) {
    row_sums_with_storage<formats::bfloat16>(0x1p-8, 0x1p-126);
    row_sums_with_storage<formats::float16>(0x1p-11, 0x1p-14);
    // The bound is vacuous, and reported so, when it reaches 1 or γ is undefined (n·u_acc ≥ 1).
    const tensor<double, 4> p({1, 1, 1, 4});
    BOOST_TEST(rows_sum_to_one<double>(p.view(), {}, 0.3, 0.0, 0.0).vacuous);
    BOOST_TEST(rows_sum_to_one<double>(p.view(), {}, 0x1p-24, 1.0, 0.0).vacuous);
    BOOST_TEST(!rows_sum_to_one<double>(p.view(), {}, 0x1p-24, 0x1p-8, 0.0).vacuous);
}

// P = exp(S − lse) takes the producer's underflow floor: a float32 weight flushed to 0 (its exact
// value 1e-40 is below float32's smallest normal) is within 2^-126, not within float64's 2^-1022.
BOOST_AUTO_TEST_CASE(lse_consistency_uses_the_weights_floor) {
    tensor<double, 4> p({1, 1, 1, 2}), s({1, 1, 1, 2});
    tensor<double, 3> lse({1, 1, 1});
    s(0, 0, 0, 0) = 0, s(0, 0, 0, 1) = -92;  // exp(−92) ≈ 1.1e-40
    lse(0, 0, 0) = math::log1p(math::exp(-92.0));
    p(0, 0, 0, 0) = 1, p(0, 0, 0, 1) = 0;  // flushed
    const invariant_context ctx{};
    auto check = [&](double floor) {
        return weights_match_lse<double, double, double>(p.view(), s.view(), lse.view(), ctx, 0x1p-24, {}, floor).ok;
    };
    BOOST_TEST(!check(0x1p-1022));
    BOOST_TEST(check(0x1p-126));
}
