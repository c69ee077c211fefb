// Gating a kernel in-process with Boost.Test: load a golden case, compute it with your own code,
// check it with attnref's checker. ATTNREF_GOLDEN_CASE (a compile definition, see CMakeLists.txt)
// is the installed golden/mha_seed_example.
#define BOOST_TEST_MODULE attnref_gate
#include <boost/test/included/unit_test.hpp>

#include <attnref/check/checker.hpp>

#include "my_attention.hpp"

namespace golden = attnref::golden;
using attnref::tolerance::candidate_format;

BOOST_AUTO_TEST_CASE(my_float32_kernel_passes) {
    const golden::loaded_case c = golden::load_case(ATTNREF_GOLDEN_CASE);
    const std::vector<float> out = my_kernel::multi_head_attention(c);
    const std::vector<double> widened(out.begin(), out.end());
    const golden::check_result r = golden::check(c, widened, candidate_format::float32);
    BOOST_TEST_MESSAGE(golden::report_table(r, false));  // shown with --log_level=message
    BOOST_TEST(r.passed, golden::report_table(r, false));
}

// The gate must be able to fail: one output element moved by 1% of its row's largest value.
BOOST_AUTO_TEST_CASE(a_wrong_kernel_fails) {
    const golden::loaded_case c = golden::load_case(ATTNREF_GOLDEN_CASE);
    const std::vector<double> wrong = my_kernel::one_element_off(c);
    const golden::check_result r = golden::check(c, wrong, candidate_format::float32);
    BOOST_TEST((r.overall == golden::verdict::fail), golden::report_table(r, false));
}
