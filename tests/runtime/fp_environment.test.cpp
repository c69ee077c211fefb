// fp_environment.hpp: the reference build's environment passes; a changed rounding mode, flush-to-
// zero and denormals-are-zero are refused by the run-time entry points with a message naming the
// fix, and the constant-evaluated path is unaffected. (Contraction is exercised by the CTest job
// fp_environment_consumer, which needs a build without -ffp-contract=off.)
#define BOOST_TEST_MODULE fp_environment
#include <boost/test/unit_test.hpp>

#include <cfenv>
#include <string>
#include <vector>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "attnref/core/attention.hpp"
#include "attnref/core/fp_environment.hpp"
#include "attnref/core/multi_head_attention.hpp"

using namespace attnref;

namespace {

/// Runs a tiny float SDPA and an MHA; returns the fp_environment_error message of each ("" if none).
std::vector<std::string> messages_of_calls() {
    tensor<float, 4> q({1, 1, 2, 2}, 0.5f), k({1, 1, 2, 2}, 0.25f), v({1, 1, 2, 2}, 1.0f);
    tensor<float, 3> x({1, 2, 2}, 0.5f);
    tensor<float, 2> w({2, 2}, 0.5f);
    mha_options o;
    o.attention.threads = 1;
    std::vector<std::string> r;
    try {
        (void)scaled_dot_product_attention(q, k, v);
        r.emplace_back();
    } catch (const fp_environment_error& e) {
        r.emplace_back(e.what());
    }
    try {
        (void)multi_head_attention(x, x, x, mha_parameters<float>{w.view(), w.view(), w.view(), w.view()}, o);
        r.emplace_back();
    } catch (const fp_environment_error& e) {
        r.emplace_back(e.what());
    }
    return r;
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_reference_build_passes) {
    BOOST_TEST(check_fp_environment() == "");
    for (const std::string& m : messages_of_calls()) BOOST_TEST(m == "");
}

BOOST_AUTO_TEST_CASE(a_changed_rounding_mode_is_refused) {
    for (int mode : {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO}) {
        std::fesetround(mode);
        const std::vector<std::string> m = messages_of_calls();
        std::fesetround(FE_TONEAREST);
        for (const std::string& s : m) BOOST_TEST(s.find("std::fesetround(FE_TONEAREST)") != std::string::npos, s);
    }
    BOOST_TEST(check_fp_environment() == "");
}

#if defined(__SSE__)
BOOST_AUTO_TEST_CASE(flush_to_zero_and_denormals_are_zero_are_refused) {
    const unsigned saved = _mm_getcsr();
    _mm_setcsr(saved | 0x8000u);  // FTZ
    const std::vector<std::string> ftz = messages_of_calls();
    _mm_setcsr(saved | 0x0040u);  // DAZ
    const std::vector<std::string> daz = messages_of_calls();
    _mm_setcsr(saved);
    for (const std::string& s : ftz) BOOST_TEST(s.find("flush-to-zero") != std::string::npos, s);
    for (const std::string& s : daz) BOOST_TEST(s.find("denormals-are-zero") != std::string::npos, s);
    BOOST_TEST(check_fp_environment() == "");
}
#endif

// The constant-evaluated path involves no environment and never calls the check.
constexpr float constant_output() {
    tensor<float, 4> q({1, 1, 1, 1}, 1.0f), k({1, 1, 1, 1}, 1.0f), v({1, 1, 1, 1}, 0.5f);
    return scaled_dot_product_attention(q, k, v).output[0];
}
static_assert(constant_output() == 0.5f);
BOOST_AUTO_TEST_CASE(constant_evaluation_is_unaffected) { BOOST_TEST(constant_output() == 0.5f); }
