// Certified reference (certify.hpp): agreement with an independent high-precision computation,
// enclosure, Ziv escalation on an element built to sit next to a rounding boundary, and the
// rounding of interval ends to each target format.
#define BOOST_TEST_MODULE certify
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <cmath>
#include <limits>
#include <vector>

#include <mpfr.h>

#include "attnref/core/attention.hpp"
#include "attnref/certify/certify.hpp"
#include "attnref/io/generator.hpp"
#include "attnref/multiprecision/multiprecision.hpp"

using namespace attnref;

namespace {

struct small_case {
    std::vector<double> q, k, v;
    extents_t<4> qe, ke, ve, oe;
    attention_options options;
};

small_case make_case() {
    small_case c;
    c.qe = {1, 2, 5, 4};
    c.ke = {1, 2, 6, 4};
    c.ve = {1, 2, 6, 3};
    c.oe = {1, 2, 5, 3};
    for (std::size_t n = 0; n < 40; ++n) c.q.push_back(2 * generator::uniform(11, generator::role::query, n) - 1);
    for (std::size_t n = 0; n < 48; ++n) c.k.push_back(2 * generator::uniform(11, generator::role::key, n) - 1);
    for (std::size_t n = 0; n < 36; ++n) c.v.push_back(2 * generator::uniform(11, generator::role::value, n) - 1);
    c.options.mask.causal = true;
    c.options.mask.alignment = causal_alignment::bottom_right;
    c.options.softcap = 3.0;
    c.options.threads = 1;
    return c;
}

template <class T>
struct outputs {
    tensor<T, 4> out, weights;
    tensor<T, 3> lse;
};

template <class T>
outputs<T> run(const small_case& c) {
    outputs<T> r{tensor<T, 4>(c.oe), tensor<T, 4>({1, 2, 5, 6}), tensor<T, 3>({1, 2, 5})};
    scaled_dot_product_attention_into<uniform_precision<T>>(tensor_view<const double, 4>{c.q.data(), c.qe},
                                                           tensor_view<const double, 4>{c.k.data(), c.ke},
                                                           tensor_view<const double, 4>{c.v.data(), c.ve}, c.options,
                                                           r.out.view(), r.weights.view(), r.lse.view());
    return r;
}

template <class T>
std::vector<std::vector<T>> flatten(const outputs<T>& r) {
    return {r.out.storage(), r.weights.storage(), r.lse.storage()};
}

double round_nearest(const mpfr_real<100>& x) { return mpfr_get_d(x.backend().data(), MPFR_RNDN); }

}  // namespace

BOOST_AUTO_TEST_CASE(certified_values_equal_correctly_rounded_mpfr_at_100_digits) {
    const small_case c = make_case();
    const certify::result cert = certify::certify({"output", "weights", "lse"}, {certify::float64_target},
                                                  [&]<unsigned D>(std::integral_constant<unsigned, D>) {
                                                      return flatten(run<mpfr_interval<D>>(c));
                                                  });
    const std::vector<std::vector<mpfr_real<100>>> exact = flatten(run<mpfr_real<100>>(c));
    const std::vector<std::vector<mpfr_interval<40>>> enclosure = flatten(run<mpfr_interval<40>>(c));
    std::size_t compared = 0;
    for (std::size_t t = 0; t < 3; ++t) {
        BOOST_TEST_REQUIRE(cert.values[t][0].size() == exact[t].size());
        for (std::size_t n = 0; n < exact[t].size(); ++n) {
            const double reference = round_nearest(exact[t][n]);
            BOOST_TEST(cert.values[t][0][n] == reference, "tensor " << t << " element " << n);
            if (std::isfinite(reference)) {
                // The 134-bit interval encloses the 335-bit MPFR value (both approximate the same
                // exact number; MPFR's error is far below the interval's width).
                const mpfr_real<100> lo(lower_end(enclosure[t][n])), hi(upper_end(enclosure[t][n]));
                BOOST_TEST((lo <= exact[t][n] && exact[t][n] <= hi), "enclosure, tensor " << t << " element " << n);
            }
            ++compared;
        }
    }
    BOOST_TEST(compared == 2u * 5 * 3 + 60 + 10);
    for (const certify::tensor_report& r : cert.reports) {
        BOOST_TEST(r.certified == r.elements);
        BOOST_TEST(r.escalated == 0u);
    }
    BOOST_TEST_MESSAGE("certified " << compared << " elements at " << cert.precisions_bits.front() << " bits");
}

// lse of a single key is the logit s = q·k = 1 + 2^-53 + 2^-160 exactly (scale 1): 1 + 2^-53 is the
// midpoint between 1 and 1 + 2^-52, so at 134 bits the interval [1 + 2^-53, 1 + 2^-53 + 2^-133]
// has ends that round to 1 and to 1 + 2^-52. At 267 bits the sum is exact and rounds up.
BOOST_AUTO_TEST_CASE(element_next_to_a_rounding_boundary_escalates_and_certifies) {
    const std::vector<double> q{1.0, 1.0, 0x1p-80}, k{1.0, 0x1p-53, 0x1p-80}, v{0.5};
    attention_options options;
    options.scale = 1.0;
    options.threads = 1;
    const certify::result cert = certify::certify(
        {"output", "lse"}, {certify::float64_target, certify::float32_target}, [&]<unsigned D>(std::integral_constant<unsigned, D>) {
            using T = mpfr_interval<D>;
            tensor<T, 4> out({1, 1, 1, 1});
            tensor<T, 3> lse({1, 1, 1});
            scaled_dot_product_attention_into<uniform_precision<T>>(
                tensor_view<const double, 4>{q.data(), {1, 1, 1, 3}}, tensor_view<const double, 4>{k.data(), {1, 1, 1, 3}},
                tensor_view<const double, 4>{v.data(), {1, 1, 1, 1}}, options, out.view(), tensor_view<T, 4>{}, lse.view());
            return std::vector<std::vector<T>>{out.storage(), lse.storage()};
        });
    BOOST_TEST(cert.values[1][0][0] == 1.0 + 0x1p-52);
    BOOST_TEST(cert.values[1][1][0] == 1.0);  // float32: far from a float32 boundary
    BOOST_TEST(cert.values[0][0][0] == 0.5);
    BOOST_TEST_REQUIRE(cert.reports.size() == 4u);
    BOOST_TEST(cert.reports[0].escalated == 0u);  // output, float64
    BOOST_TEST(cert.reports[2].tensor == "lse");
    BOOST_TEST(cert.reports[2].escalated == 1u);  // lse, float64
    BOOST_TEST(cert.reports[2].precisions_bits == std::vector<int>{certify::ladder_bits(1)});
    BOOST_TEST(cert.reports[3].escalated == 0u);  // lse, float32
    BOOST_TEST(cert.precisions_bits.size() == 2u);
    // Plain double arithmetic rounds 1 + 2^-53 to 1 first and gets the wrong answer.
    BOOST_TEST(((1.0 + 0x1p-53) + 0x1p-160) == 1.0);
}

BOOST_AUTO_TEST_CASE(an_interval_straddling_a_boundary_at_every_precision_fails_loudly) {
    auto compute = [&]<unsigned D>(std::integral_constant<unsigned, D>) {
        return std::vector<std::vector<mpfr_interval<D>>>{{mpfr_interval<D>(1.0, 1.0 + 0x1p-51)}};
    };
    BOOST_CHECK_THROW(certify::certify({"output"}, {certify::float64_target}, compute), certify::uncertified_error);
    try {
        certify::certify({"output"}, {certify::float64_target}, compute);
    } catch (const certify::uncertified_error& e) {
        BOOST_TEST(std::string(e.what()).find("tensor 'output' element 0") != std::string::npos);
    }
}

BOOST_AUTO_TEST_CASE(nan_and_infinite_ends) {
    auto compute = [&]<unsigned D>(std::integral_constant<unsigned, D>) {
        return std::vector<std::vector<mpfr_interval<D>>>{
            {quiet_NaN<mpfr_interval<D>>(), -infinity<mpfr_interval<D>>(), mpfr_interval<D>(0)}};
    };
    certify::options allow;
    allow.nan_allowed = {{1, 0, 0}};  // element 0 is NaN by construction
    const certify::result r = certify::certify({"output"}, {certify::float64_target}, compute, allow);
    BOOST_TEST(std::isnan(r.values[0][0][0]));
    BOOST_TEST(r.values[0][0][1] == -std::numeric_limits<double>::infinity());
    BOOST_TEST(r.values[0][0][2] == 0.0);
    BOOST_TEST(!std::signbit(r.values[0][0][2]));
    BOOST_CHECK_THROW(certify::certify({"output"}, {certify::float64_target}, compute), certify::uncertified_error);
}

BOOST_AUTO_TEST_CASE(rounding_to_targets) {
    auto round = [](double x, const format_description& f) {
        mpfr_real<40> m(x);
        return attnref::round_to(m.backend().data(), f);
    };
    // float16: subnormal grid 2^-24, ties to even, overflow at 65520 (max 65504 + half an ulp).
    BOOST_TEST(round(3 * 0x1p-25, certify::float16_target) == 2 * 0x1p-24);  // 1.5 quanta -> 2 (even)
    BOOST_TEST(round(0x1p-25, certify::float16_target) == 0.0);              // half the smallest -> 0
    BOOST_TEST(round(65519.0, certify::float16_target) == 65504.0);
    BOOST_TEST(std::isinf(round(65520.0, certify::float16_target)));
    // bfloat16: 8 bits.
    BOOST_TEST(round(1.0 + 0x1p-8, certify::bfloat16_target) == 1.0);
    BOOST_TEST(round(1.0 + 3 * 0x1p-8, certify::bfloat16_target) == 1.0 + 0x1p-6);
    // float32 and float64 agree with the hardware conversions on ordinary values.
    BOOST_TEST(round(0.1, certify::float32_target) == static_cast<double>(0.1f));
    BOOST_TEST(round(0x1p-1074, certify::float64_target) == 0x1p-1074);
    mpfr_real<40> tiny = mpfr_real<40>(0x1p-1074) / 2;  // exactly half the smallest subnormal: ties to 0
    BOOST_TEST(attnref::round_to(tiny.backend().data(), certify::float64_target) == 0.0);
}

// The two halves of "rounding to a format" (binary_format.hpp from the bits of a double,
// binary_format_mpfr.hpp by mpfr_rint on the format's grid) are independent algorithms: they must
// agree on every double, here ties, near-ties, subnormals, overflow thresholds and random values.
BOOST_AUTO_TEST_CASE(mpfr_and_double_rounding_agree) {
    std::vector<double> xs{0.1, -0.1, 1 + 0x1p-8, 1 + 3 * 0x1p-8, 1 + 0x1p-11, 1 + 0x1p-24, 1 + 0x1p-8 + 0x1p-40, 65504.0,
                           65519.99, 65520.0, 0x1.FEp127, 0x1.FFp127, 3 * 0x1p-25, 0x1p-25, 0x1p-150, 0x1p-149 * 3,
                           0x1p-1074, 1e300, -7.5e-9};
    std::uint64_t state = 12345;
    for (int i = 0; i < 2000; ++i) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        const int exponent = static_cast<int>(state >> 58) - 32;  // 2^-32 .. 2^31: every 16-bit range
        xs.push_back(std::ldexp(static_cast<double>(state >> 11) * 0x1p-53 + 0.5, exponent) * ((state & 1) ? -1 : 1));
    }
    for (const auto& [name, f] : binary_format_names)
        for (double x : xs) {
            const mpfr_real<40> m(x);
            const double via_mpfr = attnref::round_to(m.backend().data(), describe(f));
            const double via_bits = attnref::round_to(f, x);
            BOOST_TEST((via_mpfr == via_bits), name << " " << x << ": mpfr " << via_mpfr << ", bits " << via_bits);
        }
}

// ---- overlapping interval comparisons, exact zeros, NaN per element ------------------

namespace {

/// q = (1, 1, 1), k0 = (1, 2^-140, −1), k1 = (−1, 2^-140, 1), v0 = v0_value, v1 = v1_value (dv = 1):
/// both exact logits are 2^-140 (scaled by 1/√3), but at 134 bits the two dot products round
/// differently ([0, 2^-133]-ish vs a different interval), so the intervals overlap without being
/// equal. Boost's MPFI compare throws through a noexcept function there (std::terminate) if the
/// softmax compares them.
template <class T>
std::vector<std::vector<T>> tied_logits_case(double v0_value, double v1_value, const attention_options& options) {
    const std::vector<double> q{1.0, 1.0, 1.0}, k{1.0, 0x1p-140, -1.0, -1.0, 0x1p-140, 1.0}, v{v0_value, v1_value};
    tensor<T, 4> out({1, 1, 1, 1}), weights({1, 1, 1, 2});
    tensor<T, 3> lse({1, 1, 1});
    scaled_dot_product_attention_into<uniform_precision<T>>(
        tensor_view<const double, 4>{q.data(), {1, 1, 1, 3}}, tensor_view<const double, 4>{k.data(), {1, 1, 2, 3}},
        tensor_view<const double, 4>{v.data(), {1, 1, 2, 1}}, options, out.view(), weights.view(), lse.view());
    return {out.storage(), weights.storage(), lse.storage()};
}

}  // namespace

BOOST_AUTO_TEST_CASE(overlapping_logit_intervals_do_not_terminate) {
    attention_options options;
    options.threads = 1;
    // The two logit intervals really overlap without being equal (the precondition of the bug).
    {
        const std::vector<double> q{1.0, 1.0, 1.0}, k{1.0, 0x1p-140, -1.0, -1.0, 0x1p-140, 1.0};
        const tensor<mpfr_interval<40>, 4> s = attention_logits<uniform_precision<mpfr_interval<40>>>(
            tensor_view<const double, 4>{q.data(), {1, 1, 1, 3}}, tensor_view<const double, 4>{k.data(), {1, 1, 2, 3}}, options);
        const mpfr_interval<40>&a = s(0, 0, 0, 0), &b = s(0, 0, 0, 1);
        const bool overlap = lower_end(a) <= upper_end(b) && lower_end(b) <= upper_end(a);
        const bool equal = lower_end(a) == lower_end(b) && upper_end(a) == upper_end(b);
        BOOST_TEST_REQUIRE((overlap && !equal));
    }
    for (softmax_algorithm algorithm : {softmax_algorithm::shifted_division, softmax_algorithm::online,
                                        softmax_algorithm::division_free, softmax_algorithm::naive}) {
        options.softmax.algorithm = algorithm;
        options.softmax.block_size = 1;  // online: the second key's block compares with the first's max
        const certify::result cert = certify::certify(
            {"output", "weights", "lse"}, {certify::float64_target},
            [&]<unsigned D>(std::integral_constant<unsigned, D>) { return tied_logits_case<mpfr_interval<D>>(1.0, 3.0, options); });
        // Exact: both weights 1/2, output (1 + 3)/2 = 2, lse = 2^-140/√3 + log 2 (by hand; MPFR at
        // 1000 bits only rounds that formula).
        BOOST_TEST(cert.values[0][0][0] == 2.0);
        BOOST_TEST(cert.values[1][0][0] == 0.5);
        BOOST_TEST(cert.values[1][0][1] == 0.5);
        mpfr_real<300> lse = log(mpfr_real<300>(2)) + mpfr_real<300>(0x1p-140) / sqrt(mpfr_real<300>(3));
        BOOST_TEST(cert.values[2][0][0] == mpfr_get_d(lse.backend().data(), MPFR_RNDN));
    }
}

BOOST_AUTO_TEST_CASE(shift_order_compares_upper_ends_of_intervals_and_values_of_points) {
    const mpfr_interval<40> a(1.0, 3.0), b(2.0, 2.5);  // overlapping: Boost's a > b would throw
    BOOST_TEST(shift_order<mpfr_interval<40>>::greater(a, b));
    BOOST_TEST(!shift_order<mpfr_interval<40>>::greater(b, a));
    BOOST_TEST(shift_order<double>::greater(2.0, 1.0));
    BOOST_TEST(!shift_order<double>::greater(1.0, 1.0));
}

// v1 = −v0 under tied logits: the output is exactly 0 by symmetry. Narrowing never decides it
// (every interval keeps −tiny and +tiny), so it must end in an error naming the tensor and index,
// while the escalation recomputes only what is undecided (here: nothing but the output).
BOOST_AUTO_TEST_CASE(an_exact_zero_by_symmetry_fails_loudly_and_escalates_only_the_undecided) {
    attention_options options;
    options.threads = 1;
    std::vector<std::size_t> pending_per_rung;
    auto compute = [&]<unsigned D>(std::integral_constant<unsigned, D>, const certify::request& req) {
        std::size_t pending = 0;
        for (const auto& t : req.pending)
            for (std::uint8_t f : t) pending += f;
        pending_per_rung.push_back(pending);
        return tied_logits_case<mpfr_interval<D>>(0.75, -0.75, options);
    };
    certify::options opts;
    opts.shapes = {{1, 1, 1, 1}, {1, 1, 1, 2}, {1, 1, 1}};
    try {
        certify::certify({"output", "weights", "lse"}, {certify::float64_target}, compute, opts);
        BOOST_FAIL("an exact zero was certified by narrowing");
    } catch (const certify::uncertified_error& e) {
        const std::string m = e.what();
        BOOST_TEST(m.find("tensor 'output' element (0, 0, 0, 0)") != std::string::npos, m);
        BOOST_TEST(m.find("1065 bits") != std::string::npos, m);
    }
    // Rung 0 computes everything (no pending set yet); rungs 1-3 are asked for the output only.
    BOOST_TEST(pending_per_rung == (std::vector<std::size_t>{0, 1, 1, 1}));
}

BOOST_AUTO_TEST_CASE(sign_of_a_certified_zero_is_the_correctly_rounded_sign) {
    auto tiny = []<unsigned D>(std::integral_constant<unsigned, D>, int e) {
        return mpfr_real<D>(0x1p-1000) * mpfr_real<D>(std::ldexp(1.0, e));  // 2^(e - 1000), exact
    };
    auto compute = [&]<unsigned D>(std::integral_constant<unsigned, D> tag) {
        using I = mpfr_interval<D>;
        const mpfr_real<D> a = tiny(tag, -100), b = tiny(tag, -90);  // 2^-1100, 2^-1090: both round to 0
        return std::vector<std::vector<I>>{{I(a, b), I(-b, -a), I(0), I(-a, mpfr_real<D>(0))}};
    };
    // Element 3 reaches from −2^-1100 up to 0: exact 0 (+0) or negative (−0) — undecidable.
    BOOST_CHECK_THROW(certify::certify({"output"}, {certify::float64_target}, compute), certify::uncertified_error);
    auto decided = [&]<unsigned D>(std::integral_constant<unsigned, D> tag) {
        auto r = compute(tag);
        r[0].pop_back();
        return r;
    };
    const certify::result r = certify::certify({"output"}, {certify::float64_target, certify::float16_target}, decided);
    for (std::size_t k = 0; k < 2; ++k) {
        BOOST_TEST((r.values[0][k][0] == 0.0 && !std::signbit(r.values[0][k][0])));  // positive tiny -> +0
        BOOST_TEST((r.values[0][k][1] == 0.0 && std::signbit(r.values[0][k][1])));   // negative tiny -> -0
        BOOST_TEST((r.values[0][k][2] == 0.0 && !std::signbit(r.values[0][k][2])));  // exact 0 -> +0
    }
}

BOOST_AUTO_TEST_CASE(nan_is_allowed_per_element_not_per_case) {
    auto compute = [&]<unsigned D>(std::integral_constant<unsigned, D>) {
        return std::vector<std::vector<mpfr_interval<D>>>{{quiet_NaN<mpfr_interval<D>>(), quiet_NaN<mpfr_interval<D>>()}};
    };
    certify::options opts;
    opts.nan_allowed = {{1, 0}};  // row of element 0 is empty by construction; element 1's is not
    try {
        certify::certify({"output"}, {certify::float64_target}, compute, opts);
        BOOST_FAIL("a NaN outside an empty row was certified");
    } catch (const certify::uncertified_error& e) {
        BOOST_TEST(std::string(e.what()).find("element 1 ") != std::string::npos, e.what());
    }
    opts.nan_allowed = {{1, 1}};
    BOOST_TEST(std::isnan(certify::certify({"output"}, {certify::float64_target}, compute, opts).values[0][0][1]));
}
