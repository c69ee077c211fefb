// The same computation constant-evaluated and run at run time gives bitwise identical results (the
// library uses its own exp/log/tanh for literal types at both times, and no FP contraction).
#define BOOST_TEST_MODULE compile_time
#include <boost/mpl/list.hpp>
#include <boost/test/unit_test.hpp>

#include <cstring>

#include "attnref/attnref.hpp"
#include "fixed_inputs.hpp"

using namespace attnref;

namespace {

constexpr mha_shape shape{.batch = 1, .query_length = 4, .key_length = 5, .model_dim = 6, .heads = 3, .kv_heads = 1,
                          .head_dim_qk = 2, .head_dim_v = 2};

// Inputs from a run-time-opaque seed at run time, the same seed at compile time.
template <class T>
constexpr fixed_mha_inputs<T, shape> make_inputs(int seed) {
    fixed_mha_inputs<T, shape> in{};
    test::lcg_sevenhundredths gen{static_cast<unsigned>(seed)};  // not exactly representable: rounds in T
    test::fill(gen, in, /*with_bias=*/true);
    return in;
}

template <class T>
constexpr attention_options options_for(int variant) {
    attention_options o;
    o.mask.causal = variant % 2 == 1;
    o.mask.alignment = causal_alignment::bottom_right;
    o.softcap = variant >= 2 ? std::optional<double>(1.5) : std::nullopt;
    o.placement = variant == 3 ? scale_placement::split_sqrt : scale_placement::on_product;
    o.softmax.algorithm = variant == 3 ? softmax_algorithm::online : softmax_algorithm::shifted_division;
    o.softmax.block_size = 2;
    o.threads = 1;
    return o;
}

template <class T, int Variant>
constexpr fixed_mha_outputs<T, shape> at_compile_time = multi_head_attention<T, shape>(make_inputs<T>(7), options_for<T>(Variant));

template <class T>
bool same_bits(const T& a, const T& b) {
    return std::memcmp(&a, &b, sizeof(T) >= 10 && sizeof(T) == sizeof(long double) && std::numeric_limits<long double>::digits == 64 ? 10 : sizeof(T)) == 0;
}

template <class T, int Variant>
void compare() {
    volatile int seed = 7;  // opaque to the optimiser: the run-time path really runs
    const auto run_time = multi_head_attention<T, shape>(make_inputs<T>(seed), options_for<T>(Variant));
    const auto& ct = at_compile_time<T, Variant>;
    std::size_t differing = 0;
    for (std::size_t n = 0; n < ct.output.values.size(); ++n) differing += !same_bits(ct.output.values[n], run_time.output.values[n]);
    for (std::size_t n = 0; n < ct.weights.values.size(); ++n) differing += !same_bits(ct.weights.values[n], run_time.weights.values[n]);
    for (std::size_t n = 0; n < ct.lse.values.size(); ++n) differing += !same_bits(ct.lse.values[n], run_time.lse.values[n]);
    BOOST_TEST(differing == 0u, "variant " << Variant << ": " << differing << " elements differ");
}

}  // namespace

#if defined(__SIZEOF_FLOAT128__)
using literal_types = boost::mpl::list<float, double, long double, __float128>;
#else
using literal_types = boost::mpl::list<float, double, long double>;
#endif

BOOST_AUTO_TEST_CASE_TEMPLATE(constant_evaluated_equals_run_time_bitwise, T, literal_types) {
    compare<T, 0>();
    compare<T, 1>();
    compare<T, 2>();
    compare<T, 3>();
}
