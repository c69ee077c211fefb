// Scaled dot-product attention: every convention on hand-worked cases, precision against
// higher-precision references with derived bounds, and interval enclosure.
#define BOOST_TEST_MODULE attention
#include <boost/mpl/list.hpp>
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>

#include "attnref/bounds/error_bounds.hpp"
#include "attnref/core/formats.hpp"
#include "attnref/bounds/tolerance/data_aware.hpp"
#include "attnref/bounds/tolerance/worst_case.hpp"
#include "attnref/bounds/tolerance/zero_trust.hpp"
#include "test_support.hpp"

using namespace attnref;
using attnref::test::random_tensor;
using reference_real = mpfr_real<60>;  // ~200 bits: far below every tested type's rounding

#ifdef ATTNREF_HAS_BOOST_FLOAT128
using floating_types = boost::mpl::list<float, double, long double, float128>;
#else
using floating_types = boost::mpl::list<float, double, long double>;
#endif

namespace {

// Single query, two keys, dk = dv = 1, scale 1: logits (0, 2)·q… derived by hand:
// s = (q·k0, q·k1) = (0, 2); p = (1, e²)/(1 + e²); o = (v0 + v1·e²)/(1 + e²); lse = log(1 + e²).
template <class T>
struct two_key_case {
    tensor<T, 4> q{{1, 1, 1, 1}, T(2)}, k{{1, 1, 2, 1}, T(0)}, v{{1, 1, 2, 1}, T(1)};
    two_key_case() {
        k(0, 0, 1, 0) = T(1);
        v(0, 0, 1, 0) = T(3);
    }
};

template <class T>
double ulp_of(double x) {
    const int e = std::ilogb(x == 0 ? 1.0 : x);
    return std::ldexp(1.0, e - scalar_traits<T>::digits + 1);
}

attention_options with_scale(double s) {
    attention_options o;
    o.scale = s;
    return o;
}

}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(hand_worked_two_keys, T, floating_types) {
    two_key_case<T> c;
    const auto r = scaled_dot_product_attention(c.q, c.k, c.v, with_scale(1.0));
    const reference_real e2 = exp(reference_real(2));
    const double p0 = static_cast<double>(1 / (1 + e2)), p1 = static_cast<double>(e2 / (1 + e2));
    const double o = static_cast<double>((1 + 3 * e2) / (1 + e2)), lse = static_cast<double>(log(1 + e2));
    const double u = static_cast<double>(unit_roundoff<T>());
    // Each is a handful of correctly-rounded-within-1-ulp operations: 8u is generous and still tight.
    BOOST_TEST(std::fabs(static_cast<double>(r.weights[0]) - p0) <= 8 * u * p0);
    BOOST_TEST(std::fabs(static_cast<double>(r.weights[1]) - p1) <= 8 * u * p1);
    BOOST_TEST(std::fabs(static_cast<double>(r.output[0]) - o) <= 8 * u * o);
    BOOST_TEST(std::fabs(static_cast<double>(r.lse[0]) - lse) <= 8 * u * lse);
}

BOOST_AUTO_TEST_CASE(default_scale_is_one_over_sqrt_dk) {
    // q = k = (1, 1, 1, 1): q·k = 4, default scale 1/√4 = 1/2 → logit 2 for both keys → weights 1/2.
    // With a different key (0, 0, 0, 0) the logits are (2, 0): p0 = e²/(1 + e²).
    tensor<double, 4> q({1, 1, 1, 4}, 1.0), k({1, 1, 2, 4}, 1.0), v({1, 1, 2, 1}, 0.0);
    for (std::size_t c = 0; c < 4; ++c) k(0, 0, 1, c) = 0;
    v(0, 0, 0, 0) = 1;
    const auto r = scaled_dot_product_attention(q, k, v);
    const double e2 = std::exp(2.0);
    BOOST_TEST(std::fabs(r.weights[0] - e2 / (1 + e2)) <= 4e-16);
    const auto logits = attention_logits<uniform_precision<double>, double, double>(q.view(), k.view());
    BOOST_TEST(logits[0] == 2.0);
    BOOST_TEST(logits[1] == 0.0);
}

BOOST_AUTO_TEST_CASE(causal_alignment_top_left_and_bottom_right) {
    // Sq = 2, Sk = 3. top_left: row i sees j ≤ i; bottom_right: row i sees j ≤ i + 1.
    const auto q = random_tensor<double, 4>({1, 1, 2, 4}, 1), k = random_tensor<double, 4>({1, 1, 3, 4}, 2),
               v = random_tensor<double, 4>({1, 1, 3, 2}, 3);
    attention_options o;
    o.mask.causal = true;
    const auto top = scaled_dot_product_attention(q, k, v, o);
    BOOST_TEST(top.weights(0, 0, 0, 0) == 1.0);
    BOOST_TEST(top.weights(0, 0, 0, 1) == 0.0);
    BOOST_TEST(top.weights(0, 0, 0, 2) == 0.0);
    BOOST_TEST(top.weights(0, 0, 1, 2) == 0.0);
    BOOST_TEST(top.weights(0, 0, 1, 1) > 0.0);
    BOOST_TEST(top.output(0, 0, 0, 1) == v(0, 0, 0, 1));  // one key: output is that value, exactly
    o.mask.alignment = causal_alignment::bottom_right;
    const auto bottom = scaled_dot_product_attention(q, k, v, o);
    BOOST_TEST(bottom.weights(0, 0, 0, 1) > 0.0);
    BOOST_TEST(bottom.weights(0, 0, 0, 2) == 0.0);
    BOOST_TEST(bottom.weights(0, 0, 1, 2) > 0.0);
    // An explicit diagonal offset of Sk − Sq = 1 on top_left is bottom_right, bitwise.
    o.mask.alignment = causal_alignment::top_left;
    o.mask.diagonal_offset = 1;
    const auto offset = scaled_dot_product_attention(q, k, v, o);
    BOOST_TEST(offset.output.storage() == bottom.output.storage());
}

BOOST_AUTO_TEST_CASE(bottom_right_with_sq_greater_than_sk_empties_leading_rows) {
    // Sq = 3, Sk = 2, bottom_right: diagonal(i) = i − 1, so row 0 has no key.
    const auto q = random_tensor<double, 4>({1, 1, 3, 4}, 4), k = random_tensor<double, 4>({1, 1, 2, 4}, 5),
               v = random_tensor<double, 4>({1, 1, 2, 3}, 6);
    attention_options o;
    o.mask.causal = true;
    o.mask.alignment = causal_alignment::bottom_right;
    o.softmax.empty_rows = empty_row_policy::zero;
    auto r = scaled_dot_product_attention(q, k, v, o);
    BOOST_TEST(r.lse(0, 0, 0) == -std::numeric_limits<double>::infinity());
    for (std::size_t c = 0; c < 3; ++c) BOOST_TEST(r.output(0, 0, 0, c) == 0.0);
    BOOST_TEST(r.weights(0, 0, 1, 0) == 1.0);  // row 1 sees key 0 only
    o.softmax.empty_rows = empty_row_policy::nan;
    r = scaled_dot_product_attention(q, k, v, o);
    BOOST_TEST(std::isnan(r.output(0, 0, 0, 0)));
    BOOST_TEST(std::isnan(r.weights(0, 0, 0, 1)));
    BOOST_TEST(r.lse(0, 0, 0) == -std::numeric_limits<double>::infinity());
    o.softmax.empty_rows = empty_row_policy::uniform;
    r = scaled_dot_product_attention(q, k, v, o);
    BOOST_TEST(r.weights(0, 0, 0, 0) == 0.5);
    for (std::size_t c = 0; c < 3; ++c)  // mean of V: 0.5·v0 + 0.5·v1, each product exact
        BOOST_TEST(r.output(0, 0, 0, c) == 0.5 * v(0, 0, 0, c) + 0.5 * v(0, 0, 1, c));
}

BOOST_AUTO_TEST_CASE(sliding_window_and_key_padding) {
    const auto q = random_tensor<double, 4>({2, 1, 5, 4}, 7), k = random_tensor<double, 4>({2, 1, 5, 4}, 8),
               v = random_tensor<double, 4>({2, 1, 5, 2}, 9);
    attention_options o;
    o.mask.causal = true;
    o.mask.window = sliding_window{1, 0};  // row i sees keys i−1 and i
    const std::size_t lengths[] = {5, 3};
    o.mask.key_lengths = lengths;
    const auto r = scaled_dot_product_attention(q, k, v, o);
    for (std::size_t b = 0; b < 2; ++b)
        for (std::size_t i = 0; i < 5; ++i)
            for (std::size_t j = 0; j < 5; ++j) {
                const bool visible = j <= i && j + 1 >= i && j < lengths[b];
                const bool empty = b == 1 && i == 4;  // keys 3 and 4 are padding, row 4 sees only them
                if (!empty) BOOST_TEST((r.weights(b, 0, i, j) > 0) == visible, "b=" << b << " i=" << i << " j=" << j);
            }
    BOOST_TEST(r.output(1, 0, 4, 0) == 0.0);  // empty row, zero policy
}

BOOST_AUTO_TEST_CASE(boolean_mask_polarity_and_additive_minus_infinity_agree) {
    const auto q = random_tensor<double, 4>({1, 2, 3, 4}, 10), k = random_tensor<double, 4>({1, 2, 4, 4}, 11),
               v = random_tensor<double, 4>({1, 2, 4, 3}, 12);
    // Mask of shape (1, 1, 3, 4), broadcast over heads.
    std::vector<std::uint8_t> attend = {1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 1, 1}, masked(12);
    std::vector<double> additive(12);
    for (std::size_t n = 0; n < 12; ++n) {
        masked[n] = !attend[n];
        additive[n] = attend[n] ? 0.0 : -std::numeric_limits<double>::infinity();
    }
    attention_options a, b, c;
    a.mask.boolean.values = {attend.data(), {1, 1, 3, 4}};
    b.mask.boolean.values = {masked.data(), {1, 1, 3, 4}};
    b.mask.polarity = mask_polarity::true_means_masked;
    c.mask.additive.values = {additive.data(), {1, 1, 3, 4}};
    const auto ra = scaled_dot_product_attention(q, k, v, a), rb = scaled_dot_product_attention(q, k, v, b),
               rc = scaled_dot_product_attention(q, k, v, c);
    BOOST_TEST(ra.output.storage() == rb.output.storage());
    BOOST_TEST(ra.weights.storage() == rb.weights.storage());
    // Adding +0 to a logit is exact, so the additive form is bitwise the boolean form.
    BOOST_TEST(ra.output.storage() == rc.output.storage());
    for (std::size_t h = 0; h < 2; ++h) BOOST_TEST(ra.weights(0, h, 0, 1) == 0.0);
    // Flipping the polarity without flipping the data changes the result.
    a.mask.polarity = mask_polarity::true_means_masked;
    BOOST_TEST(scaled_dot_product_attention(q, k, v, a).output.storage() != ra.output.storage());
}

BOOST_AUTO_TEST_CASE(seed_mask_convention) {
    // The seed adds mask·(−1e9). In double, exp(−1e9 − m) underflows to +0, so a partially masked
    // row equals the boolean-masked row bitwise (adding +0 terms is exact).
    const auto q = random_tensor<double, 4>({1, 1, 2, 4}, 13), k = random_tensor<double, 4>({1, 1, 3, 4}, 14),
               v = random_tensor<double, 4>({1, 1, 3, 2}, 15);
    std::vector<double> seed = {0, 1, 0, 1, 1, 1};  // row 1 fully masked
    std::vector<std::uint8_t> attend = {1, 0, 1, 0, 0, 0};
    attention_options s, bm;
    s.mask.seed.values = {seed.data(), {1, 1, 2, 3}};
    bm.mask.boolean.values = {attend.data(), {1, 1, 2, 3}};
    const auto rs = scaled_dot_product_attention(q, k, v, s), rb = scaled_dot_product_attention(q, k, v, bm);
    for (std::size_t j = 0; j < 3; ++j) BOOST_TEST(rs.weights(0, 0, 0, j) == rb.weights(0, 0, 0, j));
    // A fully masked row is not empty under the seed convention: in float, s − 1e9 rounds to −1e9
    // for |s| < 32 (ulp(1e9) = 64 in float), so all logits tie and the weights are exactly uniform.
    const auto rf = scaled_dot_product_attention(attnref::test::cast<float>(q), attnref::test::cast<float>(k),
                                                 attnref::test::cast<float>(v), s);
    for (std::size_t j = 0; j < 3; ++j) BOOST_TEST(rf.weights(0, 0, 1, j) == 1.0f / 3.0f);
    // In double the −1e9 shift is almost exact, so the row is ≈ the unmasked softmax (|Δs| ≤ ulp(1e9) = 2^-23).
    const auto ru = scaled_dot_product_attention(q, k, v);
    for (std::size_t j = 0; j < 3; ++j) BOOST_TEST(std::fabs(rs.weights(0, 0, 1, j) - ru.weights(0, 0, 1, j)) <= 4 * 0x1p-23);
}

BOOST_AUTO_TEST_CASE(masks_combine) {
    // causal ∧ padding ∧ boolean: a key is visible only if every mask allows it.
    const auto q = random_tensor<double, 4>({1, 1, 4, 4}, 16), k = random_tensor<double, 4>({1, 1, 4, 4}, 17),
               v = random_tensor<double, 4>({1, 1, 4, 2}, 18);
    std::vector<std::uint8_t> attend(16, 1);
    attend[3 * 4 + 0] = 0;  // row 3 may not see key 0
    const std::size_t lengths[] = {3};
    attention_options o;
    o.mask.causal = true;
    o.mask.key_lengths = lengths;
    o.mask.boolean.values = {attend.data(), {1, 1, 4, 4}};
    const auto r = scaled_dot_product_attention(q, k, v, o);
    for (std::size_t i = 0; i < 4; ++i)
        for (std::size_t j = 0; j < 4; ++j) {
            const bool visible = j <= i && j < 3 && !(i == 3 && j == 0);
            BOOST_TEST((r.weights(0, 0, i, j) > 0) == visible);
        }
}

BOOST_AUTO_TEST_CASE(softcap_and_alibi_logits) {
    const auto q = random_tensor<double, 4>({1, 2, 3, 4}, 19, -4, 4), k = random_tensor<double, 4>({1, 2, 5, 4}, 20, -4, 4);
    const double slopes[] = {0.5, 0.25};
    attention_options plain, capped;
    capped.softcap = 2.0;
    capped.alibi_slopes = slopes;
    capped.mask.alignment = causal_alignment::bottom_right;
    const auto s = attention_logits<uniform_precision<reference_real>, double, double>(q.view(), k.view(), plain);
    const auto t = attention_logits<uniform_precision<reference_real>, double, double>(q.view(), k.view(), capped);
    for (std::size_t h = 0; h < 2; ++h)
        for (std::size_t i = 0; i < 3; ++i)
            for (std::size_t j = 0; j < 5; ++j) {
                // Hand derivation: cap·tanh(s/cap) − slope·|i + (Sk − Sq) − j|, softcap before the bias.
                const reference_real expected =
                    2 * tanh(s(0, h, i, j) / 2) - reference_real(slopes[h]) * std::abs(double(i) + 2 - double(j));
                BOOST_TEST(static_cast<double>(abs(t(0, h, i, j) - expected)) <= 1e-50);
            }
    BOOST_TEST(static_cast<double>(abs(t(0, 0, 0, 2) - 2 * tanh(s(0, 0, 0, 2) / 2))) <= 1e-50);  // on the diagonal: no bias
}

BOOST_AUTO_TEST_CASE(gqa_equals_mha_with_repeated_kv_heads) {
    // H = 4 query heads, H_kv = 2: head h reads kv head h / 2. Repeating each kv head twice gives
    // plain MHA with the same numbers in the same order: bitwise equal.
    const auto q = random_tensor<double, 4>({2, 4, 3, 4}, 21), k = random_tensor<double, 4>({2, 2, 5, 4}, 22),
               v = random_tensor<double, 4>({2, 2, 5, 3}, 23);
    tensor<double, 4> k_rep({2, 4, 5, 4}), v_rep({2, 4, 5, 3});
    for (std::size_t b = 0; b < 2; ++b)
        for (std::size_t h = 0; h < 4; ++h)
            for (std::size_t j = 0; j < 5; ++j) {
                for (std::size_t c = 0; c < 4; ++c) k_rep(b, h, j, c) = k(b, h / 2, j, c);
                for (std::size_t c = 0; c < 3; ++c) v_rep(b, h, j, c) = v(b, h / 2, j, c);
            }
    BOOST_TEST(scaled_dot_product_attention(q, k, v).output.storage() ==
               scaled_dot_product_attention(q, k_rep, v_rep).output.storage());
    // MQA: one kv head shared by all.
    tensor<double, 4> k1({2, 1, 5, 4}), v1({2, 1, 5, 3});
    for (std::size_t n = 0; n < k1.size(); ++n) k1[n] = k[n % 20 + (n / 20) * 40];
    for (std::size_t n = 0; n < v1.size(); ++n) v1[n] = v[n % 15 + (n / 15) * 30];
    const auto mqa = scaled_dot_product_attention(q, k1, v1);
    for (std::size_t h = 0; h < 4; ++h) {
        tensor<double, 4> qh({2, 1, 3, 4});
        for (std::size_t b = 0; b < 2; ++b)
            for (std::size_t n = 0; n < 12; ++n) qh[b * 12 + n] = q(b, h, n / 4, n % 4);
        const auto single = scaled_dot_product_attention(qh, k1, v1);
        for (std::size_t b = 0; b < 2; ++b)
            for (std::size_t n = 0; n < 9; ++n) BOOST_TEST(single.output[b * 9 + n] == mqa.output(b, h, n / 3, n % 3));
    }
}

BOOST_AUTO_TEST_CASE(dk_differs_from_dv_and_cross_attention) {
    const auto q = random_tensor<double, 4>({1, 2, 3, 8}, 24), k = random_tensor<double, 4>({1, 2, 7, 8}, 25),
               v = random_tensor<double, 4>({1, 2, 7, 5}, 26);
    const auto r = scaled_dot_product_attention(q, k, v);
    BOOST_TEST(r.output.extent(3) == 5u);
    BOOST_TEST(r.weights.extent(3) == 7u);
    const auto hi = scaled_dot_product_attention(test::cast<reference_real>(q), test::cast<reference_real>(k),
                                                 test::cast<reference_real>(v));
    for (std::size_t n = 0; n < r.output.size(); ++n)
        BOOST_TEST(std::fabs(r.output[n] - static_cast<double>(hi.output[n])) <= 1e-14);
}

BOOST_AUTO_TEST_CASE(shape_errors_name_the_dimension) {
    const auto q = random_tensor<double, 4>({1, 3, 2, 4}, 27), k = random_tensor<double, 4>({1, 2, 5, 4}, 28),
               v = random_tensor<double, 4>({1, 2, 5, 4}, 29), k5 = random_tensor<double, 4>({1, 3, 5, 5}, 30);
    auto message = [](auto&& f) {
        try {
            f();
        } catch (const shape_error& e) {
            return std::string(e.what());
        }
        return std::string("no exception");
    };
    BOOST_TEST(message([&] { scaled_dot_product_attention(q, k, v); }).find("kv heads") != std::string::npos);
    BOOST_TEST(message([&] { scaled_dot_product_attention(q, k5, k5); }).find("head dim dk") != std::string::npos);
    const double slopes[] = {1.0};
    attention_options o;
    o.alibi_slopes = slopes;
    const auto k3 = random_tensor<double, 4>({1, 3, 5, 4}, 31);
    BOOST_TEST(message([&] { scaled_dot_product_attention(q, k3, k3, o); }).find("alibi_slopes") != std::string::npos);
}

// Precision: each arithmetic against a ~200-bit reference, within the library's own worst-case
// bound (tolerance::sdpa_worst_case_scales, docs/error-bounds.md eqs. 10–13; the online softmax's
// rescales through worst_case_scales::rescale_roundings, eq. 9). The test does not re-derive the
// bound: the MPFR reference is the independent computation, and the bound must also be useful —
// never vacuous (tolerance::find_vacuous) and within a measured factor of the observed error.
BOOST_AUTO_TEST_CASE_TEMPLATE(sdpa_within_the_librarys_worst_case_bound, T, floating_types) {
    const std::size_t sq = 6, sk = 33, dk = 16, dv = 8, block = 8;
    const auto q = random_tensor<double, 4>({2, 2, sq, dk}, 32, -2, 2), k = random_tensor<double, 4>({2, 2, sk, dk}, 33, -2, 2),
               v = random_tensor<double, 4>({2, 2, sk, dv}, 34);
    const auto ref = scaled_dot_product_attention(test::cast<reference_real>(q), test::cast<reference_real>(k),
                                                  test::cast<reference_real>(v));
    const tensor<double, 4> p_ref = test::cast<double>(ref.weights), o_ref = test::cast<double>(ref.output);
    const double u = static_cast<double>(unit_roundoff<T>());
    for (scale_placement placement : {scale_placement::on_product, scale_placement::on_query, scale_placement::split_sqrt})
        for (softmax_algorithm algorithm : {softmax_algorithm::shifted_division, softmax_algorithm::online}) {
            attention_options o;
            o.placement = placement;
            o.softmax.algorithm = algorithm;
            o.softmax.block_size = block;
            tolerance::worst_case_scales wc = tolerance::sdpa_worst_case_scales(q.view(), k.view(), v.view(), p_ref.view(), o);
            if (algorithm == softmax_algorithm::online) wc.rescale_roundings = error_bounds::online_rescale_roundings(sk, block);
            std::vector<double> bounds(wc.size());
            for (std::size_t e = 0; e < bounds.size(); ++e) bounds[e] = wc.bound(e, u);
            const auto r = scaled_dot_product_attention(test::cast<T>(q), test::cast<T>(k), test::cast<T>(v), o);
            double worst_ratio = 0;
            for (std::size_t e = 0; e < r.output.size(); ++e) {
                const double err = static_cast<double>(abs(reference_real(r.output[e]) - ref.output[e]));
                BOOST_TEST(err <= bounds[e]);
                worst_ratio = std::max(worst_ratio, err / bounds[e]);
            }
            BOOST_TEST_MESSAGE(scalar_traits<T>::name << " placement " << int(placement) << " softmax " << int(algorithm)
                                                      << ": worst error / bound = " << worst_ratio);
            // Useful: never as large as the outputs it bounds, and not looser than measured (worst
            // error / bound 0.0063–0.0082 over these types, placements and softmax algorithms).
            BOOST_TEST(!tolerance::find_vacuous(o_ref.storage(), dv, std::span<const double>(bounds)).any());
            BOOST_TEST(worst_ratio >= 3e-3, scalar_traits<T>::name << ": worst error / bound = " << worst_ratio);
            BOOST_TEST(worst_ratio > 0.0);  // the arithmetic under test really rounds
        }
}

BOOST_AUTO_TEST_CASE(scale_placements_agree_exactly_in_high_precision_and_differ_in_float) {
    // dk = 12: the default scale 1/√12 is not a power of two, so the placements round differently.
    const auto q = random_tensor<double, 4>({1, 2, 8, 12}, 35, -3, 3), k = random_tensor<double, 4>({1, 2, 8, 12}, 36, -3, 3),
               v = random_tensor<double, 4>({1, 2, 8, 4}, 37);
    std::vector<tensor<reference_real, 4>> hi;
    std::vector<tensor<float, 4>> lo;
    for (scale_placement placement : {scale_placement::on_product, scale_placement::on_query, scale_placement::split_sqrt}) {
        attention_options o;
        o.placement = placement;
        hi.push_back(scaled_dot_product_attention(test::cast<reference_real>(q), test::cast<reference_real>(k),
                                                  test::cast<reference_real>(v), o).output);
        lo.push_back(scaled_dot_product_attention(test::cast<float>(q), test::cast<float>(k), test::cast<float>(v), o).output);
    }
    for (std::size_t n = 0; n < hi[0].size(); ++n) {
        BOOST_TEST(static_cast<double>(abs(hi[0][n] - hi[1][n])) <= 1e-55);
        BOOST_TEST(static_cast<double>(abs(hi[0][n] - hi[2][n])) <= 1e-55);
    }
    BOOST_TEST(lo[0].storage() != lo[1].storage());  // they round differently in float
    BOOST_TEST(lo[0].storage() != lo[2].storage());
}

BOOST_AUTO_TEST_CASE(interval_encloses_high_precision_result) {
    const auto q = random_tensor<double, 4>({1, 2, 4, 8}, 38, -2, 2), k = random_tensor<double, 4>({1, 1, 6, 8}, 39, -2, 2),
               v = random_tensor<double, 4>({1, 1, 6, 3}, 40);
    for (softmax_algorithm algorithm : {softmax_algorithm::shifted_division, softmax_algorithm::naive,
                                        softmax_algorithm::division_free, softmax_algorithm::online}) {
        attention_options o;
        o.mask.causal = true;
        o.softcap = 3.0;
        o.softmax.algorithm = algorithm;
        o.softmax.block_size = 2;
        using I = mpfr_interval<30>;
        const auto box = scaled_dot_product_attention(test::cast<I>(q), test::cast<I>(k), test::cast<I>(v), o);
        const auto point = scaled_dot_product_attention(test::cast<reference_real>(q), test::cast<reference_real>(k),
                                                        test::cast<reference_real>(v), o);
        for (std::size_t n = 0; n < box.output.size(); ++n) BOOST_TEST(encloses(box.output[n], point.output[n]));
        for (std::size_t n = 0; n < box.weights.size(); ++n) BOOST_TEST(encloses(box.weights[n], point.weights[n]));
        for (std::size_t n = 0; n < box.lse.size(); ++n) BOOST_TEST(encloses(box.lse[n], point.lse[n]));
        // And the enclosure is tight: width ≤ 1e-25 relative at 30 digits.
        for (std::size_t n = 0; n < box.output.size(); ++n)
            BOOST_TEST(static_cast<double>(upper_end(box.output[n]) - lower_end(box.output[n])) <= 1e-25);
    }
}

BOOST_AUTO_TEST_CASE(results_do_not_depend_on_thread_count) {
    const auto q = random_tensor<double, 4>({3, 4, 9, 8}, 41), k = random_tensor<double, 4>({3, 2, 11, 8}, 42),
               v = random_tensor<double, 4>({3, 2, 11, 5}, 43);
    attention_options one, many;
    one.threads = 1;
    many.threads = 5;
    const auto a = scaled_dot_product_attention(q, k, v, one), b = scaled_dot_product_attention(q, k, v, many);
    BOOST_TEST(a.output.storage() == b.output.storage());
    BOOST_TEST(a.weights.storage() == b.weights.storage());
    BOOST_TEST(a.lse.storage() == b.lse.storage());
}

// 50-digit cpp_bin_float and 30-digit MPFR run through the same templates and agree with the
// ~200-bit reference to within their own precision (the same first-order bound, u = 2^-digits).
using multiprecision_types = boost::mpl::list<bin_float_50, mpfr_real<30>>;
BOOST_AUTO_TEST_CASE_TEMPLATE(multiprecision_types_within_their_precision, T, multiprecision_types) {
    const auto q = random_tensor<double, 4>({1, 2, 5, 8}, 44, -2, 2), k = random_tensor<double, 4>({1, 2, 9, 8}, 45, -2, 2),
               v = random_tensor<double, 4>({1, 2, 9, 4}, 46);
    attention_options o;
    o.mask.causal = true;
    o.mask.alignment = causal_alignment::bottom_right;
    o.softcap = 5.0;
    const auto ref = scaled_dot_product_attention(test::cast<reference_real>(q), test::cast<reference_real>(k),
                                                  test::cast<reference_real>(v), o);
    const auto r = scaled_dot_product_attention(test::cast<T>(q), test::cast<T>(k), test::cast<T>(v), o);
    // The softcap's tanh is itself rounded: one more relative u on each logit (|logit| ≤ cap).
    const double u = std::ldexp(1.0, -scalar_traits<T>::digits);
    double worst = 0;
    for (std::size_t n = 0; n < r.output.size(); ++n) {
        const double err = static_cast<double>(abs(reference_real(r.output[n]) - ref.output[n]));
        worst = std::max(worst, err);
        BOOST_TEST(err <= 1e3 * u);  // |v| < 1, logits < 5: (dk + n + 20)·u·(1 + 2·5) < 1e3·u
    }
    BOOST_TEST_MESSAGE(scalar_traits<T>::name << " (" << scalar_traits<T>::digits << " bits): max error " << worst
                                              << " = " << worst / u << " u");
}

// A precision policy: bf16 storage, fp32 accumulation, P rounded to bf16 before P·V, bf16 output (as
// FlashAttention runs in bf16): exactly the checker's bfloat16 candidate, so it must stay within the
// library's default (data-aware) bound for a bfloat16 candidate (u = 2^-8 storage, u_acc = 2^-24
// accumulation; docs/error-bounds.md eqs. 15–22), which must be useful here, far above fp32's error.
// (The rigorous worst-case bound, eq. 12, is vacuous for bf16 on this case: it reaches the row's
// largest output; it must still hold.)
BOOST_AUTO_TEST_CASE(bf16_storage_fp32_accumulate_policy) {
    using policy = precision_policy<bfloat16, float, bfloat16, bfloat16>;
    const std::size_t sq = 8, sk = 64, dk = 32, dv = 16;
    // Inputs rounded to bf16 first, so both computations see the same numbers.
    auto bf16_exact = [](tensor<double, 4> t) {
        for (std::size_t n = 0; n < t.size(); ++n) t[n] = round_to(binary_format::bfloat16, t[n]);
        return t;
    };
    const auto q = bf16_exact(random_tensor<double, 4>({1, 2, sq, dk}, 47, -2, 2)),
               k = bf16_exact(random_tensor<double, 4>({1, 2, sk, dk}, 48, -2, 2)),
               v = bf16_exact(random_tensor<double, 4>({1, 2, sk, dv}, 49));
    const auto ref = scaled_dot_product_attention(test::cast<reference_real>(q), test::cast<reference_real>(k),
                                                  test::cast<reference_real>(v));
    const auto qb = test::cast<bfloat16>(q), kb = test::cast<bfloat16>(k), vb = test::cast<bfloat16>(v);
    const auto r = scaled_dot_product_attention<policy, bfloat16, bfloat16, bfloat16>(qb.view(), kb.view(), vb.view());
    const auto rf = scaled_dot_product_attention(test::cast<float>(q), test::cast<float>(k), test::cast<float>(v));
    const tensor<double, 4> p_ref = test::cast<double>(ref.weights), o_ref = test::cast<double>(ref.output);
    const tolerance::data_aware_scales da = tolerance::sdpa_scales(q.view(), k.view(), v.view(), p_ref.view(), {});
    const double u = unit_roundoff(binary_format::bfloat16), ua = tolerance::accumulate_roundoff(binary_format::bfloat16);
    std::vector<double> bounds(da.size());
    for (std::size_t e = 0; e < bounds.size(); ++e) bounds[e] = da.bound(e, u, ua);
    double worst_policy = 0, worst_float = 0, worst_ratio = 0;
    for (std::size_t e = 0; e < r.output.size(); ++e) {
        const double exact = o_ref[e];
        const double err = std::fabs(static_cast<double>(r.output[e]) - exact);
        BOOST_TEST(err <= bounds[e]);
        BOOST_TEST(err <= da.worst_case.bound(e, u, ua));
        worst_ratio = std::max(worst_ratio, err / bounds[e]);
        worst_policy = std::max(worst_policy, err);
        worst_float = std::max(worst_float, std::fabs(static_cast<double>(rf.output[e]) - exact));
    }
    BOOST_TEST(!tolerance::find_vacuous(o_ref.storage(), dv, std::span<const double>(bounds)).any());
    // P really was rounded to bf16: every stored weight is a bf16 value, and the error is far above fp32's.
    for (std::size_t n = 0; n < r.weights.size(); ++n)
        BOOST_TEST(round_to(binary_format::bfloat16, static_cast<double>(r.weights[n])) == static_cast<double>(r.weights[n]));
    BOOST_TEST_MESSAGE("bf16/fp32-accumulate max error " << worst_policy << " (" << worst_ratio << " of the bound), fp32 max error "
                                                         << worst_float);
    BOOST_TEST(worst_policy > 100 * worst_float);
    BOOST_TEST(worst_ratio >= 5e-3);  // not looser than measured (worst error / bound 0.0139 here)
}

// Per-stage arithmetic: with_stage<Policy, stage, T> runs one stage in T. Putting every stage of a
// float policy in double (and removing the float roundings of P and of the output) reproduces the
// double computation bitwise; each single stage in double changes the float result and moves it
// toward the double one (that stage's share of the error).
BOOST_AUTO_TEST_CASE(stage_policies) {
    using F = uniform_precision<float>;
    using all_double = with_stage<with_stage<with_stage<with_stage<with_stage<F, stage::logits, double>, stage::softmax, double>,
                                                       stage::values, double>, stage::weights, double>, stage::output, double>;
    const auto q = random_tensor<double, 4>({1, 2, 6, 8}, 50, -3, 3), k = random_tensor<double, 4>({1, 2, 40, 8}, 51, -3, 3),
               v = random_tensor<double, 4>({1, 2, 40, 4}, 52);
    const auto qf = test::cast<float>(q), kf = test::cast<float>(k), vf = test::cast<float>(v);  // exact: inputs are floats
    const auto as_double = scaled_dot_product_attention(q, k, v);
    const auto staged = scaled_dot_product_attention<all_double, float, float, float>(qf.view(), kf.view(), vf.view());
    BOOST_TEST(staged.output.storage() == as_double.output.storage());
    const auto plain = scaled_dot_product_attention(qf, kf, vf);
    auto error = [&](const auto& out) {
        double e = 0;
        for (std::size_t n = 0; n < out.size(); ++n) e += std::fabs(static_cast<double>(out[n]) - as_double.output[n]);
        return e;
    };
    const double base = error(plain.output);
    const double logits = error(scaled_dot_product_attention<with_stage<F, stage::logits, double>, float, float, float>(
                                    qf.view(), kf.view(), vf.view()).output);
    const double softmax = error(scaled_dot_product_attention<with_stage<F, stage::softmax, double>, float, float, float>(
                                     qf.view(), kf.view(), vf.view()).output);
    const double values = error(scaled_dot_product_attention<with_stage<F, stage::values, double>, float, float, float>(
                                    qf.view(), kf.view(), vf.view()).output);
    BOOST_TEST_MESSAGE("float SDPA, sum |error| vs double: all float " << base << ", logits in double " << logits
                                                                         << ", softmax in double " << softmax << ", P·V in double " << values);
    BOOST_TEST(logits != base);
    BOOST_TEST(softmax != base);
    BOOST_TEST(values != base);
}

// attention_options::rows (used by certification to recompute only undecided rows): the selected
// rows get exactly the bits of a full call, the others are not written.
BOOST_AUTO_TEST_CASE(selected_rows_equal_a_full_call_and_the_rest_is_untouched) {
    const auto q = random_tensor<double, 4>({2, 2, 5, 4}, 61), k = random_tensor<double, 4>({2, 1, 6, 4}, 62),
               v = random_tensor<double, 4>({2, 1, 6, 3}, 63);
    attention_options o;
    o.mask.causal = true;
    o.threads = 2;
    const auto full = scaled_dot_product_attention(q, k, v, o);
    std::vector<std::uint8_t> rows(2 * 2 * 5, 0);
    rows[0 * 5 + 1] = rows[(1 * 2 + 1) * 5 + 4] = 1;  // (b0, h0, i1) and (b1, h1, i4)
    o.rows = rows;
    tensor<double, 4> out({2, 2, 5, 3}, -7.0), w({2, 2, 5, 6}, -7.0);
    tensor<double, 3> lse({2, 2, 5}, -7.0);
    scaled_dot_product_attention_into<uniform_precision<double>>(tensor_view<const double, 4>(q.view()), tensor_view<const double, 4>(k.view()),
                                                                 tensor_view<const double, 4>(v.view()), o, out.view(), w.view(), lse.view());
    for (std::size_t b = 0; b < 2; ++b)
        for (std::size_t h = 0; h < 2; ++h)
            for (std::size_t i = 0; i < 5; ++i) {
                const bool on = rows[(b * 2 + h) * 5 + i] != 0;
                BOOST_TEST((lse(b, h, i) == (on ? full.lse(b, h, i) : -7.0)));
                for (std::size_t c = 0; c < 3; ++c) BOOST_TEST((out(b, h, i, c) == (on ? full.output(b, h, i, c) : -7.0)));
                for (std::size_t j = 0; j < 6; ++j) BOOST_TEST((w(b, h, i, j) == (on ? full.weights(b, h, i, j) : -7.0)));
            }
    rows.pop_back();
    o.rows = rows;
    BOOST_CHECK_THROW(scaled_dot_product_attention(q, k, v, o), shape_error);
}
