// The float64 and float32 gradients of PyTorch's autograd (an independent implementation: ATen's
// matmul, softmax and their autograd formulas, run by tests/backward/torch_autograd.py with
// /usr/bin/python3) on the same inputs as attnref's, judged against attnref's MPFR gradients with
// the library's first-order bound (backward_bounds.hpp): both must be within it, and the bound must
// be tight enough to catch a wrong gradient (a dropped scale in dS fails it).
#define BOOST_TEST_MODULE backward_torch
#include <boost/test/unit_test.hpp>

#include <spawn.h>
#include <sys/wait.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "attnref/core/backward.hpp"
#include "attnref/bounds/backward_bounds.hpp"
#include "attnref/io/npy.hpp"
#include "test_support.hpp"

extern char** environ;

using namespace attnref;
using namespace attnref::test;  // random_tensor, cast, worst_ratio

namespace {

using mp = mpfr_real<78>;  // ≥ 256 bits

struct torch_case {
    std::string name;
    std::size_t batch = 1, heads = 2, kv_heads = 2, sq = 4, sk = 5, dk = 4, dv = 3;
    double input_range = 1;
    bool causal = false;
    std::vector<std::size_t> key_lengths;
    std::optional<double> softcap, scale;
    bool additive = false;
};

std::vector<torch_case> cases() {
    std::vector<torch_case> c(7);
    c[0].name = "plain";
    c[1].name = "causal_gqa";
    c[1].causal = true, c[1].heads = 4, c[1].kv_heads = 2, c[1].sq = 6, c[1].sk = 6;
    c[2].name = "key_padding_explicit_scale";
    c[2].batch = 2, c[2].key_lengths = {5, 2}, c[2].scale = 0.3;
    c[3].name = "softcap_large_logits";
    c[3].softcap = 3.0, c[3].input_range = 2.5;
    c[4].name = "additive_mqa";
    c[4].additive = true, c[4].heads = 3, c[4].kv_heads = 1;
    c[5].name = "long_rows";  // Sk = 128, dk = 64: the sums the bound grows with
    c[5].sq = 16, c[5].sk = 128, c[5].dk = 64, c[5].dv = 32;
    c[6].name = "large_logits_causal";
    c[6].input_range = 4, c[6].causal = true, c[6].sq = 8, c[6].sk = 8, c[6].dk = 16;
    return c;
}

/// Runs argv[0] with argv, waits, returns its exit status (-1 if it could not start).
int run(std::vector<std::string> args) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid;
    if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

tensor<double, 4> read4(const std::filesystem::path& p) {
    const npy::array a = npy::read(p);
    BOOST_REQUIRE_EQUAL(a.shape.size(), 4u);
    tensor<double, 4> t({a.shape[0], a.shape[1], a.shape[2], a.shape[3]});
    const std::vector<double> v = npy::to_vector<double>(a);
    std::copy(v.begin(), v.end(), t.data());
    return t;
}

/// max bound / max |g|: how large the bound is against the gradient's own scale.
double relative_width(const tensor<double, 4>& bound, const tensor<mp, 4>& exact) {
    double b = 0, g = 0;
    for (std::size_t n = 0; n < bound.size(); ++n) {
        b = std::max(b, bound[n]);
        g = std::max(g, std::fabs(static_cast<double>(exact[n])));
    }
    return b / g;
}

}  // namespace

BOOST_AUTO_TEST_CASE(pytorch_autograd_gradients_within_the_first_order_bound) {
    const std::filesystem::path root = std::filesystem::path(ATTNREF_BINARY_DIR) / "backward_torch";
    std::uint64_t seed = 500;
    for (const torch_case& c : cases()) {
        BOOST_TEST_CONTEXT(c.name) {
            const std::filesystem::path dir = root / c.name;
            std::filesystem::remove_all(dir);
            std::filesystem::create_directories(dir);
            const auto q = random_tensor<double, 4>({c.batch, c.heads, c.sq, c.dk}, seed++, -c.input_range, c.input_range);
            const auto k = random_tensor<double, 4>({c.batch, c.kv_heads, c.sk, c.dk}, seed++, -c.input_range, c.input_range);
            const auto v = random_tensor<double, 4>({c.batch, c.kv_heads, c.sk, c.dv}, seed++);
            const auto g = random_tensor<double, 4>({c.batch, c.heads, c.sq, c.dv}, seed++);
            const auto additive = c.additive ? random_tensor<double, 4>({c.batch, c.heads, c.sq, c.sk}, seed++, -2, 2)
                                             : tensor<double, 4>({c.batch, c.heads, c.sq, c.sk}, 0.0);
            attention_options o;
            o.threads = 1;
            o.scale = c.scale;
            o.softcap = c.softcap;
            o.mask.causal = c.causal;
            o.mask.key_lengths = c.key_lengths;
            if (c.additive) o.mask.additive.values = additive.view();
            std::vector<bool> attend;
            for (std::size_t b = 0; b < c.batch; ++b)
                for (std::size_t h = 0; h < c.heads; ++h)
                    for (std::size_t i = 0; i < c.sq; ++i) {
                        bool any = false;
                        for (std::size_t j = 0; j < c.sk; ++j) {
                            attend.push_back(!structurally_masked(o.mask, b, h, i, j, c.sq, c.sk));
                            any = any || attend.back();
                        }
                        BOOST_REQUIRE(any);  // no empty rows: PyTorch's softmax would give NaN
                    }
            auto save = [&](const char* name, const tensor<double, 4>& t) {
                npy::write(dir / name, npy::make_array("<f8", {t.extent(0), t.extent(1), t.extent(2), t.extent(3)}, t.storage()));
            };
            save("q.npy", q), save("k.npy", k), save("v.npy", v), save("grad_output.npy", g), save("additive.npy", additive);
            npy::write(dir / "attend.npy", npy::make_array("|b1", {c.batch, c.heads, c.sq, c.sk}, attend));
            const double s = c.scale ? *c.scale : 1 / std::sqrt(static_cast<double>(c.dk));  // exact enough: the bound is order u
            {
                std::ofstream params(dir / "params.json");
                params.precision(17);
                params << "{\"scale\": " << s << ", \"softcap\": ";
                if (c.softcap) params << *c.softcap; else params << "null";
                params << "}\n";
            }
            BOOST_REQUIRE_EQUAL(run({ATTNREF_PYTHON, std::string(ATTNREF_SOURCE_DIR) + "/tests/backward/torch_autograd.py", dir.string()}), 0);

            // attnref's scale is 1/√dk in the arithmetic; PyTorch gets it as a double: exact in MPFR only
            // when given, so the exact reference uses the double PyTorch used.
            o.scale = s;
            const auto forward = scaled_dot_product_attention(cast<mp>(q), cast<mp>(k), cast<mp>(v), o);
            const auto exact = scaled_dot_product_attention_backward(cast<mp>(q), cast<mp>(k), cast<mp>(v), cast<mp>(g), o);
            const tensor<double, 4> weights = cast<double>(forward.weights);
            const tensor<double, 3> lse = cast<double>(forward.lse);
            for (const auto& [format, u, width] : {std::tuple{"float64", 0x1p-53, 1e-9}, std::tuple{"float32", 0x1p-24, 0x1p-7}}) {
                const sdpa_gradient_bounds bound =
                    sdpa_gradient_first_order_bounds(q.view(), k.view(), v.view(), g.view(), weights.view(), lse.view(), o, u);
                const std::string f = format;
                const auto dq = read4(dir / ("grad_query_" + f + ".npy")), dk = read4(dir / ("grad_key_" + f + ".npy")),
                           dv = read4(dir / ("grad_value_" + f + ".npy"));
                const double w = std::max({worst_ratio(dq, exact.grad_query, bound.grad_query), worst_ratio(dk, exact.grad_key, bound.grad_key),
                                           worst_ratio(dv, exact.grad_value, bound.grad_value)});
                BOOST_TEST_INFO(f);
                BOOST_TEST(w <= 1.0);
                // The bound tells right from wrong: it is small against the gradients' scale, and a
                // gradient with the scale dropped from dS (dQ/s) exceeds it.
                BOOST_TEST(relative_width(bound.grad_query, exact.grad_query) <= width);
                BOOST_TEST(relative_width(bound.grad_key, exact.grad_key) <= width);
                BOOST_TEST(relative_width(bound.grad_value, exact.grad_value) <= width);
                tensor<double, 4> unscaled = dq;
                for (double& x : unscaled.storage()) x /= s;
                BOOST_TEST(worst_ratio(unscaled, exact.grad_query, bound.grad_query) > 1.0);
                BOOST_TEST_MESSAGE(c.name << " PyTorch " << f << ": worst |error| / bound = " << w);
            }
        }
    }
}
