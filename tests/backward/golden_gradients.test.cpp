// The suite's certified gradients (golden backward cases, schema version 2), checked two ways:
//  (a) the manifest contract: version 1 manifests still load, version 3 is refused, gradients need
//      weights and lse, a version-1 file may not ask for gradients, a tampered grad_output.npy is
//      refused (sha256), a loaded backward case exposes dO and the gradients by role, and the numpy
//      generator (tests/generator_reference.py) regenerates dO bit for bit;
//  (b) the committed float64 gradients of small backward cases against two computations that share
//      nothing with the MPFI certification but the library's templates:
//        - attnref's backward in MPFR at >= 256 bits (plain numbers, not intervals), both algorithms,
//          rounded to double: equal to the stored value (a 256-bit value is within 2^-200 relative of
//          the exact one, so it rounds the same way unless the exact value is that close to a
//          midpoint);
//        - central finite differences of the forward loss L = sum(dO * O) in MPFR at >= 512 bits,
//          h = 2^-80 (truncation ~h^2 = 2^-160, cancellation ~2^-512/h = 2^-432 relative to L): the
//          independent algorithm. Tolerance: |fd - g| <= ulp(g) + 2^-120 (one float64 ulp; the absolute
//          term covers exact zeros, where the difference quotient is 0 up to 2^-150-sized noise).
//      Finite differences are taken at a deterministic sample of elements of every gradient tensor
//      (each costs two forward passes), always including element 0 (a structural zero in the causal
//      case: query row 0 sees one key).
#define BOOST_TEST_MODULE golden_gradients
#include <boost/test/unit_test.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "attnref/core/backward.hpp"
#include "attnref/golden/case.hpp"
#include "attnref/golden/generate.hpp"
#include "attnref/multiprecision/multiprecision.hpp"
#include "file_text.hpp"

namespace fs = std::filesystem;
using namespace attnref;
using namespace attnref::golden;
using attnref::test::read_file;
using attnref::test::write_file;

namespace {

const fs::path golden_dir = fs::path(ATTNREF_SOURCE_DIR) / "golden";

/// A scratch directory removed at the end of the test.
struct scratch {
    fs::path dir;
    explicit scratch(const std::string& tag)
        : dir(fs::temp_directory_path() / ("attnref-golden-gradients-" + tag + "-" + std::to_string(::getpid()))) {
        fs::remove_all(dir);
        fs::create_directories(dir);
    }
    ~scratch() {
        std::error_code ec;
        fs::remove_all(dir, ec);
    }
    /// A copy of a committed case.
    fs::path copy(const std::string& name) const {
        fs::copy(golden_dir / name, dir / name, fs::copy_options::recursive);
        return dir / name;
    }
};

std::string replaced(std::string text, const std::string& from, const std::string& to) {
    const std::size_t pos = text.find(from);
    BOOST_TEST_REQUIRE(pos != std::string::npos, from);
    return text.replace(pos, from.size(), to);
}
/// The message load_case throws for a directory (empty if it loads).
std::string load_error(const fs::path& dir) {
    try {
        (void)load_case(dir);
    } catch (const data_error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

BOOST_AUTO_TEST_CASE(version_1_manifest_loads_version_3_is_refused) {
    scratch s("version");
    const fs::path c = s.copy("sdpa_causal_top_left");
    const std::string text = read_file(c / "manifest.json");
    write_file(c / "manifest.json", replaced(text, "\"schema_version\": 2,", "\"schema_version\": 1,"));
    const loaded_case lc = load_case(c);
    BOOST_TEST(!lc.m.spec.outputs.gradients);
    BOOST_TEST(lc.data.grad_output.empty());
    BOOST_TEST(lc.reference(*lc.entry("output")).size() == 2u * 2 * 8 * 8);
    write_file(c / "manifest.json", replaced(text, "\"schema_version\": 2,", "\"schema_version\": 3,"));
    const std::string e = load_error(c);
    BOOST_TEST(e.find("manifest.json: field 'schema_version': expected 1 or 2, got 3") != std::string::npos, e);
}

BOOST_AUTO_TEST_CASE(backward_case_loads_with_grad_output_and_gradients) {
    const loaded_case lc = load_case(golden_dir / "sdpa_bwd_gqa");
    const case_spec& s = lc.m.spec;
    BOOST_TEST(s.outputs.gradients);
    // dO is the generator's role grad_output, stored in the input format, shaped like the output.
    BOOST_TEST(lc.data.grad_output == generate_inputs(s).grad_output);
    BOOST_TEST(lc.data.grad_output.size() == 2u * 4 * 8 * 8);
    for (const gradient_tensor_layout& g : gradient_layout(s)) {
        const tensor_entry* e = lc.entry(g.role);
        BOOST_TEST_REQUIRE(e != nullptr, g.role);
        BOOST_TEST(e->shape == g.shape);
        std::size_t n = 1;
        for (std::size_t x : g.shape) n *= x;
        BOOST_TEST(lc.reference(*e).size() == n);
    }
    BOOST_TEST(lc.entry("grad_key")->shape == (std::vector<std::size_t>{2, 2, 8, 8}));  // (B, Hkv, Sk, dk)
    BOOST_TEST(lc.m.reference.method.find("gradients: mpfi-interval") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(gradients_need_weights_lse_and_version_2) {
    scratch s("fields");
    const fs::path c = s.copy("sdpa_bwd_basic");
    const std::string text = read_file(c / "manifest.json");
    write_file(c / "manifest.json", replaced(text, "\"weights\": true,", "\"weights\": false,"));
    std::string e = load_error(c);
    BOOST_TEST(e.find("field 'outputs.weights': must be true when outputs.gradients is true") != std::string::npos, e);
    write_file(c / "manifest.json", replaced(text, "\"lse\": true,", "\"lse\": false,"));
    e = load_error(c);
    BOOST_TEST(e.find("field 'outputs.lse': must be true when outputs.gradients is true") != std::string::npos, e);
    write_file(c / "manifest.json", replaced(text, "\"schema_version\": 2,", "\"schema_version\": 1,"));
    e = load_error(c);
    BOOST_TEST(e.find("field 'outputs.gradients': gradients need schema_version 2") != std::string::npos, e);
    // The suite reader applies the same rules.
    const std::string suite = R"({"schema": "attnref.suite", "schema_version": 1, "cases": [{"name": "x", "outputs": {"gradients": true}}]})";
    BOOST_CHECK_EXCEPTION(parse_suite(suite, "s.json"), data_error, [](const data_error& x) {
        return std::string(x.what()).find("s.json: field 'cases[0].outputs.gradients'") != std::string::npos;
    });
    const std::string no_lse = R"({"schema": "attnref.suite", "schema_version": 2, "cases": [{"name": "x", "outputs": {"gradients": true, "lse": false}}]})";
    BOOST_CHECK_EXCEPTION(parse_suite(no_lse, "s.json"), data_error, [](const data_error& x) {
        return std::string(x.what()).find("s.json: field 'cases[0].outputs.lse'") != std::string::npos;
    });
}

BOOST_AUTO_TEST_CASE(tampered_grad_output_is_refused) {
    scratch s("tamper");
    const fs::path c = s.copy("sdpa_bwd_basic");
    std::string bytes = read_file(c / "grad_output.npy");
    bytes[bytes.size() - 3] ^= 0x01;  // one bit of the last value
    write_file(c / "grad_output.npy", bytes);
    const std::string e = load_error(c);
    BOOST_TEST(e.find("grad_output.npy: sha256") != std::string::npos, e);
    BOOST_TEST(e.find(".sha256'") != std::string::npos, e);
}

// grad_output is the generator's role 15: the numpy re-implementation (tests/generator_reference.py,
// golden/README.md's recipe) regenerates it, and every other input, bit for bit, in every input format.
BOOST_AUTO_TEST_CASE(python_reference_regenerates_grad_output) {
    if (!fs::exists("/usr/bin/python3")) {
        BOOST_TEST_MESSAGE("skipped: /usr/bin/python3 not found");
        return;
    }
    std::string command = "/usr/bin/python3 " ATTNREF_SOURCE_DIR "/tests/generator_reference.py";
    for (const char* c : {"sdpa_bwd_input_bfloat16", "sdpa_bwd_input_float16", "sdpa_bwd_adv_logit_offset_1000", "mha_bwd_bias_gqa"})
        command += " " + (golden_dir / c).string();
    const std::string log = (fs::temp_directory_path() / ("attnref-golden-gradients-py-" + std::to_string(::getpid()))).string();
    const int status = std::system((command + " > " + log).c_str());
    const std::string out = read_file(log);
    fs::remove(log);
    BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0), "generator_reference.py found a difference:\n" << out);
    BOOST_TEST(out.find("grad_output.npy: identical") != std::string::npos, out);
}

// A gradient that is exactly 0 by a symmetry of the data (not by the mask) is certified as +0: with
// key feature 0 the same constant c for every key, dQ[..., 0] = s·c·Σ_j dS_ij = s·c·(D_i − D_i·Σ_j P_ij)
// = 0 exactly (certify/forced_zeros.hpp); intervals alone could not narrow it away from 0.
BOOST_AUTO_TEST_CASE(symmetric_exact_zero_gradient_is_certified_as_zero) {
    const std::string suite = R"({"schema": "attnref.suite", "schema_version": 2, "cases": [{"name": "bwd_symmetric_zero",
        "shapes": {"batch": 1, "heads": 1, "query_length": 2, "key_length": 3, "head_dim_qk": 2},
        "inputs": {"seed": 5, "family": {"key_feature0": 1.0}}, "outputs": {"gradients": true}}]})";
    const case_spec spec = parse_suite(suite, "s.json").front();
    const loaded_case lc = load_generated_case(generate_case(spec, 1));
    const std::vector<double> dq = lc.reference(*lc.entry("grad_query"));
    BOOST_TEST(dq.size() == 4u);
    for (std::size_t i = 0; i < dq.size(); i += 2) BOOST_TEST((dq[i] == 0.0 && !std::signbit(dq[i])), "dQ[" << i << "] = " << dq[i]);
    for (std::size_t i = 1; i < dq.size(); i += 2) BOOST_TEST(dq[i] != 0.0);  // feature 1 varies over the keys
}

namespace {

using mp = mpfr_real<78>;   // >= 256 bits: the analytic backward
using hp = mpfr_real<155>;  // >= 512 bits: the finite differences

/// ulp of a double (spacing at |x|; the smallest subnormal for 0).
double ulp(double x) {
    x = std::fabs(x);
    return std::nextafter(x, INFINITY) - x;
}

template <class T>
std::vector<T> as(const std::vector<double>& v) {
    return std::vector<T>(v.begin(), v.end());
}

/// The inputs of a case in T, one vector per perturbable role (sdpa: q, k, v; mha: x_q, x_k, x_v,
/// w_q, w_k, w_v, w_o and the biases), in gradient_layout's order.
template <class T>
struct inputs_in {
    std::vector<std::vector<T>> v;
    explicit inputs_in(const case_spec& s, const case_data& d) {
        v = {as<T>(d.query), as<T>(d.key), as<T>(d.value)};
        if (s.kind == case_kind::mha) {
            for (const auto* x : {&d.w_q, &d.w_k, &d.w_v, &d.w_o}) v.push_back(as<T>(*x));
            if (s.conventions.projection_bias)
                for (const auto* x : {&d.b_q, &d.b_k, &d.b_v, &d.b_o}) v.push_back(as<T>(*x));
        }
    }
};

/// The forward output of the case on inputs `in` (all in T), options from the case.
template <class T>
std::vector<T> forward(const case_spec& s, const case_data& d, const inputs_in<T>& in) {
    using P = uniform_precision<T>;
    const case_views c = views_of(s, d, 1);
    const case_shapes& z = s.shapes;
    if (s.kind == case_kind::sdpa) {
        const tensor_view<const T, 4> q{in.v[0].data(), c.q.extents}, k{in.v[1].data(), c.k.extents}, v{in.v[2].data(), c.v.extents};
        const attention_result<P> r = scaled_dot_product_attention<P>(q, k, v, c.o);
        return std::vector<T>(r.output.data(), r.output.data() + r.output.size());
    }
    const tensor_view<const T, 3> xq{in.v[0].data(), c.x_q.extents}, xk{in.v[1].data(), c.x_k.extents}, xv{in.v[2].data(), c.x_v.extents};
    mha_parameters<T> p;
    p.w_q = {in.v[3].data(), c.w.w_q.extents};
    p.w_k = {in.v[4].data(), c.w.w_k.extents};
    p.w_v = {in.v[5].data(), c.w.w_v.extents};
    p.w_o = {in.v[6].data(), c.w.w_o.extents};
    if (s.conventions.projection_bias) {
        p.b_q = {in.v[7].data(), {z.heads * z.head_dim_qk}};
        p.b_k = {in.v[8].data(), {z.kv_heads * z.head_dim_qk}};
        p.b_v = {in.v[9].data(), {z.kv_heads * z.head_dim_v}};
        p.b_o = {in.v[10].data(), {z.output_dim}};
    }
    const mha_result<P> r = multi_head_attention<P>(xq, xk, xv, p, c.mo);
    return std::vector<T>(r.output.data(), r.output.data() + r.output.size());
}

/// The case's gradients by attnref's backward in T (uniform_precision<T>), in gradient_layout's order.
template <class T>
std::vector<std::vector<T>> backward_in(const case_spec& s, const case_data& d, backward_algorithm algorithm) {
    using P = uniform_precision<T>;
    const case_views c = views_of(s, d, 1);
    const case_shapes& z = s.shapes;
    backward_options bo;
    bo.algorithm = algorithm;
    auto flat = [](const auto& t) { return std::vector<T>(t.data(), t.data() + t.size()); };
    if (s.kind == case_kind::sdpa) {
        const tensor_view<const double, 4> g{d.grad_output.data(), {z.batch, z.heads, z.query_length, z.head_dim_v}};
        const attention_gradients<P> a = scaled_dot_product_attention_backward<P, double, double, double, double>(c.q, c.k, c.v, g, c.o, bo);
        return {flat(a.grad_query), flat(a.grad_key), flat(a.grad_value)};
    }
    const tensor_view<const double, 3> g{d.grad_output.data(), {z.batch, z.query_length, z.output_dim}};
    const mha_gradients<P> a = multi_head_attention_backward<P, double, double, double>(c.x_q, c.x_k, c.x_v, c.w, c.mo, g, bo);
    std::vector<std::vector<T>> r{flat(a.grad_x_q), flat(a.grad_x_k), flat(a.grad_x_v), flat(a.grad_w_q),
                                  flat(a.grad_w_k), flat(a.grad_w_v), flat(a.grad_w_o)};
    if (s.conventions.projection_bias)
        for (const auto* b : {&a.grad_b_q, &a.grad_b_k, &a.grad_b_v, &a.grad_b_o}) r.push_back(flat(*b));
    return r;
}

void check_case(const std::string& name, std::size_t samples_per_tensor) {
    const loaded_case lc = load_case(golden_dir / name);
    const case_spec& s = lc.m.spec;
    const std::vector<gradient_tensor_layout> layout = gradient_layout(s);
    std::vector<std::vector<double>> golden;
    for (const gradient_tensor_layout& g : layout) golden.push_back(lc.reference(*lc.entry(g.role)));

    // (1) MPFR backward at >= 256 bits, both algorithms, rounded to double: the stored values.
    for (backward_algorithm a : {backward_algorithm::textbook, backward_algorithm::flash}) {
        const std::vector<std::vector<mp>> m = backward_in<mp>(s, lc.data, a);
        BOOST_TEST_REQUIRE(m.size() == golden.size());
        std::size_t differ = 0, nonzero = 0;
        for (std::size_t t = 0; t < m.size(); ++t)
            for (std::size_t n = 0; n < m[t].size(); ++n) {
                const double x = static_cast<double>(m[t][n]);
                nonzero += golden[t][n] != 0;
                if (!(x == golden[t][n])) {
                    ++differ;
                    BOOST_TEST_MESSAGE(name << " " << layout[t].role << "[" << n << "]: MPFR " << x << " golden " << golden[t][n]);
                }
            }
        BOOST_TEST(differ == 0u, name << (a == backward_algorithm::flash ? " flash" : " textbook") << ": " << differ << " elements differ");
        BOOST_TEST(nonzero > 0u);
    }

    // (2) central finite differences of L = sum(dO * O) at >= 512 bits.
    const hp h = ldexp(hp(1), -80);
    const std::vector<hp> d_out = as<hp>(lc.data.grad_output);
    auto loss = [&](const inputs_in<hp>& in) {
        const std::vector<hp> o = forward<hp>(s, lc.data, in);
        hp l = 0;
        for (std::size_t n = 0; n < o.size(); ++n) l = l + d_out[n] * o[n];
        return l;
    };
    inputs_in<hp> in(s, lc.data);
    double worst = 0;  // |fd − g| / (ulp(g) + 2^-120)
    std::size_t checked = 0;
    for (std::size_t t = 0; t < layout.size(); ++t) {
        const std::size_t count = golden[t].size();
        const std::size_t stride = std::max<std::size_t>(1, count / samples_per_tensor);
        for (std::size_t n = 0; n < count; n += stride) {
            const hp x = in.v[t][n];
            in.v[t][n] = x + h;
            const hp up = loss(in);
            in.v[t][n] = x - h;
            const hp down = loss(in);
            in.v[t][n] = x;
            const double fd = static_cast<double>((up - down) / (2 * h));
            const double g = golden[t][n];
            const double ratio = std::fabs(fd - g) / (ulp(g) + 0x1p-120);
            worst = std::max(worst, ratio);
            BOOST_TEST(ratio <= 1.0, name << " " << layout[t].role << "[" << n << "]: finite difference " << fd << ", golden " << g);
            ++checked;
        }
    }
    BOOST_TEST_MESSAGE(name << ": " << checked << " finite differences, worst |fd - golden| / (ulp + 2^-120) = " << worst);
}

}  // namespace

BOOST_AUTO_TEST_CASE(certified_gradients_match_mpfr_backward_and_finite_differences) {
    check_case("sdpa_bwd_causal_top_left_sq_lt_sk", 24);  // includes exact zeros (query row 0 sees one key)
    check_case("sdpa_bwd_softcap", 24);                   // the tanh chain
    check_case("mha_bwd_cross_attention", 8);             // projections, biases (grad_b_k exactly 0)
}
