// Certified reference (certify.hpp): agreement with an independent high-precision computation,
// enclosure, Ziv escalation on an element built to sit next to a rounding boundary, and the
// rounding of interval ends to each target format.
#define BOOST_TEST_MODULE certify
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include <mpfr.h>

#include "attnref/attention.hpp"
#include "attnref/certify.hpp"
#include "attnref/generator.hpp"
#include "attnref/multiprecision.hpp"

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
    allow.allow_nan = true;
    const certify::result r = certify::certify({"output"}, {certify::float64_target}, compute, allow);
    BOOST_TEST(std::isnan(r.values[0][0][0]));
    BOOST_TEST(r.values[0][0][1] == -std::numeric_limits<double>::infinity());
    BOOST_TEST(r.values[0][0][2] == 0.0);
    BOOST_TEST(!std::signbit(r.values[0][0][2]));
    BOOST_CHECK_THROW(certify::certify({"output"}, {certify::float64_target}, compute), certify::uncertified_error);
}

BOOST_AUTO_TEST_CASE(rounding_to_targets) {
    auto round = [](double x, const certify::binary_format& f) {
        mpfr_real<40> m(x);
        return certify::round_to(m.backend().data(), f);
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
    BOOST_TEST(certify::round_to(tiny.backend().data(), certify::float64_target) == 0.0);
}
