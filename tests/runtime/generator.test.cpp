// The portable input generator (generator.hpp): SplitMix64 reference values, rounding to the
// input formats, C++ regeneration of committed inputs, and the independent Python/numpy version
// (tests/generator_reference.py, also shown in golden/README.md) reproducing them bit for bit.
#define BOOST_TEST_MODULE generator
#include <boost/test/unit_test.hpp>

#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "attnref/io/generator.hpp"
#include "attnref/io/npy.hpp"
#include "attnref/golden/case.hpp"
#include "attnref/golden/manifest.hpp"

namespace fs = std::filesystem;
using namespace attnref;

BOOST_AUTO_TEST_CASE(splitmix64_matches_the_reference_sequence) {
    // SplitMix64 from state 0: the first outputs of Vigna's splitmix64.c.
    BOOST_TEST(generator::mix(1 * generator::gamma) == 0xE220A8397B1DCDAFULL);
    BOOST_TEST(generator::mix(2 * generator::gamma) == 0x6E789E6AA1B965F4ULL);
    // bits(seed, role, n) is SplitMix64 seeded with stream(seed, role), element n its (n+1)-th output.
    const std::uint64_t stream = generator::mix(7 ^ (3 * generator::gamma));
    BOOST_TEST(generator::bits(7, generator::role::value, 0) == generator::mix(stream + generator::gamma));
    BOOST_TEST(generator::bits(7, generator::role::value, 4) == generator::mix(stream + 5 * generator::gamma));
    const double u = generator::uniform(7, generator::role::value, 4);
    BOOST_TEST((u >= 0 && u < 1));
    BOOST_TEST(std::ldexp(u, 53) == std::floor(std::ldexp(u, 53)));
}

BOOST_AUTO_TEST_CASE(rounding_to_input_formats) {
    using generator::input_format;
    BOOST_TEST(round_to(input_format::bfloat16, 1.0 + 0x1p-8) == 1.0);
    BOOST_TEST(round_to(input_format::bfloat16, 1.0 + 3 * 0x1p-8) == 1.0 + 0x1p-6);
    BOOST_TEST(round_to(input_format::float16, 1.0 + 0x1p-11) == 1.0);
    BOOST_TEST(round_to(input_format::float32, 0.1) == static_cast<double>(0.1f));
    BOOST_TEST(round_to(input_format::float64, 0.1) == 0.1);
}

BOOST_AUTO_TEST_CASE(cpp_regenerates_the_stored_inputs_of_every_committed_case) {
    const std::string suite = ATTNREF_SOURCE_DIR "/golden/suite.json";
    const auto cases = golden::parse_suite(golden::read_text(suite), suite);
    BOOST_TEST_REQUIRE(cases.size() > 30u);
    for (const golden::case_spec& s : cases) {
        const fs::path dir = fs::path(ATTNREF_SOURCE_DIR "/golden") / s.name;
        const golden::loaded_case stored = golden::load_case(dir);  // checks every sha256 too
        golden::case_data mine = golden::generate_inputs(s);
        golden::case_data theirs = stored.data;
        for (const golden::input_tensor_layout& t : golden::input_layout(s)) {
            if (t.role == generator::role::mask) {
                BOOST_TEST((mine.mask == theirs.mask), s.name << " mask");
                continue;
            }
            const std::vector<double>& a = *mine.real(t.role);
            const std::vector<double>& b = *theirs.real(t.role);
            BOOST_TEST_REQUIRE(a.size() == b.size());
            bool identical = true;
            for (std::size_t n = 0; n < a.size(); ++n)
                identical = identical && std::bit_cast<std::uint64_t>(a[n]) == std::bit_cast<std::uint64_t>(b[n]);
            BOOST_TEST(identical, s.name << " " << generator::role_name(t.role));
        }
    }
}

BOOST_AUTO_TEST_CASE(python_reference_reproduces_committed_inputs_bit_for_bit) {
    if (!fs::exists("/usr/bin/python3")) {
        BOOST_TEST_MESSAGE("skipped: /usr/bin/python3 not found");
        return;
    }
    std::string dirs;
    // A selection covering every family feature and every input format (the whole suite takes
    // Python a while: the seed example alone has 1M weights).
    for (const char* c : {"sdpa_basic", "sdpa_input_float32", "sdpa_input_bfloat16", "sdpa_input_float16",
                          "sdpa_bool_mask_true_means_masked", "sdpa_additive_mask", "sdpa_seed_mask", "sdpa_adv_logit_offset_1000",
                          "sdpa_adv_attention_sink", "sdpa_adv_tied_maxima", "sdpa_adv_positive_mean_values",
                          "sdpa_adv_cancelling_outputs", "sdpa_combined_conventions", "mha_bias_gqa", "mha_causal_bfloat16",
                          "mha_seed_mask"})
        dirs += std::string(" " ATTNREF_SOURCE_DIR "/golden/") + c;
    const std::string command = "/usr/bin/python3 " ATTNREF_SOURCE_DIR "/tests/generator_reference.py" + dirs + " > /dev/null";
    const int status = std::system(command.c_str());
    BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0), "generator_reference.py found a difference: " << command);
}
