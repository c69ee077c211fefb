// The backward bug catalog: five classic wrong gradient implementations, each written out below as a
// variant of one plain textbook backward (the kind a kernel author writes), computed in float32 and
// in bfloat16 (bf16 inputs and gradients, float32 accumulation: the bound with u = 2^-24 and
// u_storage = 2^-8, (B7)), must exceed the library's first-order gradient bound (backward_bounds.hpp) against attnref's MPFR gradients; the correct
// variant must stay within it. The bound is thus tight enough to reject each bug in both formats.
//   no_scale          dS not multiplied by the scale s in dQ and dK
//   wrong_transpose   dQ = s·dSᵀ·K (the transpose of the right product; Sq = Sk so it type-checks)
//   dropped_d_term    dS = P ∘ dP (the rowsum(dP ∘ P) term dropped)
//   gqa_not_summed    dK, dV of a kv head take only the first query head of its group
//   masked_key_leak   the backward recomputes P = exp(S − lse) without the mask, so masked keys
//                     receive gradient
#define BOOST_TEST_MODULE backward_bug_catalog
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attnref/core/backward.hpp"
#include "attnref/bounds/backward_bounds.hpp"
#include "attnref/core/formats.hpp"
#include "test_support.hpp"

using namespace attnref;
using namespace attnref::test;  // random_tensor, cast, worst_ratio

namespace {

using mp = mpfr_real<78>;  // ≥ 256 bits

enum class bug { none, no_scale, wrong_transpose, dropped_d_term, gqa_not_summed, masked_key_leak };
constexpr bug all_bugs[] = {bug::no_scale, bug::wrong_transpose, bug::dropped_d_term, bug::gqa_not_summed, bug::masked_key_leak};
const char* bug_name(bug b) {
    switch (b) {
        case bug::none: return "correct";
        case bug::no_scale: return "no_scale";
        case bug::wrong_transpose: return "wrong_transpose";
        case bug::dropped_d_term: return "dropped_d_term";
        case bug::gqa_not_summed: return "gqa_not_summed";
        case bug::masked_key_leak: return "masked_key_leak";
    }
    return "?";
}

struct gradients {
    tensor<double, 4> dq, dk, dv;
};

/// A plain textbook SDPA backward in float (scale on the product, masks from attention_options),
/// with one bug injected; `round` is applied to the stored gradients (identity for float32, bf16
/// rounding for the bf16 kernel). Inputs are already in the candidate's storage format.
template <class Round>
gradients candidate(const tensor<double, 4>& q, const tensor<double, 4>& k, const tensor<double, 4>& v,
                    const tensor<double, 4>& g, const attention_options& o, bug b, Round round) {
    const std::size_t B = q.extent(0), H = q.extent(1), Sq = q.extent(2), dk = q.extent(3), Hkv = k.extent(1), Sk = k.extent(2),
                      dv = v.extent(3), group = H / Hkv;
    const float s = 1 / std::sqrt(static_cast<float>(dk));
    std::vector<float> dq(q.size(), 0), dkk(k.size(), 0), dvv(v.size(), 0);
    for (std::size_t bb = 0; bb < B; ++bb)
        for (std::size_t h = 0; h < H; ++h) {
            const std::size_t hk = h / group;
            const bool contributes_to_kv = b != bug::gqa_not_summed || h % group == 0;
            // dS for the whole head (Sq × Sk), so that the transposed-product bug can read dS_ji.
            std::vector<float> ds(Sq * Sk, 0), p(Sq * Sk, 0);
            for (std::size_t i = 0; i < Sq; ++i) {
                std::vector<float> logits(Sk);
                float m = -std::numeric_limits<float>::infinity();
                for (std::size_t j = 0; j < Sk; ++j) {
                    float acc = 0;
                    for (std::size_t x = 0; x < dk; ++x) acc += static_cast<float>(q(bb, h, i, x)) * static_cast<float>(k(bb, hk, j, x));
                    logits[j] = acc * s;
                    if (!structurally_masked(o.mask, bb, h, i, j, Sq, Sk)) m = std::max(m, logits[j]);
                }
                float sum = 0;
                for (std::size_t j = 0; j < Sk; ++j)
                    if (!structurally_masked(o.mask, bb, h, i, j, Sq, Sk)) sum += std::exp(logits[j] - m);
                const float lse = m + std::log(sum);
                for (std::size_t j = 0; j < Sk; ++j) {
                    const bool masked = structurally_masked(o.mask, bb, h, i, j, Sq, Sk);
                    p[i * Sk + j] = masked && b != bug::masked_key_leak ? 0.0f : std::exp(logits[j] - lse);
                }
                std::vector<float> dp(Sk, 0);
                float d = 0;
                for (std::size_t j = 0; j < Sk; ++j) {
                    for (std::size_t x = 0; x < dv; ++x) dp[j] += static_cast<float>(g(bb, h, i, x)) * static_cast<float>(v(bb, hk, j, x));
                    d += p[i * Sk + j] * dp[j];
                }
                for (std::size_t j = 0; j < Sk; ++j) ds[i * Sk + j] = p[i * Sk + j] * (b == bug::dropped_d_term ? dp[j] : dp[j] - d);
            }
            const float scale = b == bug::no_scale ? 1.0f : s;
            for (std::size_t i = 0; i < Sq; ++i)
                for (std::size_t j = 0; j < Sk; ++j) {
                    const float dsq = b == bug::wrong_transpose ? ds[j * Sk + i] : ds[i * Sk + j];
                    for (std::size_t x = 0; x < dk; ++x) dq[q.view().offset(bb, h, i, x)] += scale * dsq * static_cast<float>(k(bb, hk, j, x));
                    if (!contributes_to_kv) continue;
                    for (std::size_t x = 0; x < dk; ++x)
                        dkk[k.view().offset(bb, hk, j, x)] += scale * ds[i * Sk + j] * static_cast<float>(q(bb, h, i, x));
                    for (std::size_t x = 0; x < dv; ++x)
                        dvv[v.view().offset(bb, hk, j, x)] += p[i * Sk + j] * static_cast<float>(g(bb, h, i, x));
                }
        }
    auto out = [&](const std::vector<float>& x, const extents_t<4>& e) {
        tensor<double, 4> t(e);
        for (std::size_t n = 0; n < x.size(); ++n) t[n] = round(x[n]);
        return t;
    };
    return {out(dq, q.extents()), out(dkk, k.extents()), out(dvv, v.extents())};
}

struct catalog_case {
    std::string name;
    std::size_t heads, kv_heads, s, d;
    bool causal;
    std::vector<std::size_t> key_lengths;
};

template <class Round>
void run_catalog(const char* format, double u, double u_storage, Round round) {
    const catalog_case cases[] = {{"causal_gqa", 4, 2, 16, 16, true, {}}, {"padding_gqa", 4, 2, 12, 8, false, {9}}};
    std::uint64_t seed = 900;
    for (const catalog_case& c : cases) {
        auto in = [&](const extents_t<4>& e) {
            tensor<double, 4> t = random_tensor<double, 4>(e, seed++);
            for (double& x : t.storage()) x = round(static_cast<float>(x));
            return t;
        };
        const auto q = in({1, c.heads, c.s, c.d}), k = in({1, c.kv_heads, c.s, c.d}), v = in({1, c.kv_heads, c.s, c.d}),
                   g = in({1, c.heads, c.s, c.d});
        attention_options o;
        o.threads = 1;
        o.mask.causal = c.causal;
        o.mask.key_lengths = c.key_lengths;
        // The candidate's scale is float(1/√d); the exact reference uses the same value.
        o.scale = static_cast<double>(1 / std::sqrt(static_cast<float>(c.d)));
        const auto forward = scaled_dot_product_attention(cast<mp>(q), cast<mp>(k), cast<mp>(v), o);
        const auto exact = scaled_dot_product_attention_backward(cast<mp>(q), cast<mp>(k), cast<mp>(v), cast<mp>(g), o);
        const tensor<double, 4> weights = cast<double>(forward.weights);
        const tensor<double, 3> lse = cast<double>(forward.lse);
        const sdpa_gradient_bounds bound =
            sdpa_gradient_first_order_bounds(q.view(), k.view(), v.view(), g.view(), weights.view(), lse.view(), o, u, u_storage);
        for (bug b : {bug::none, all_bugs[0], all_bugs[1], all_bugs[2], all_bugs[3], all_bugs[4]}) {
            const gradients r = candidate(q, k, v, g, o, b, round);
            const double w = std::max({worst_ratio(r.dq, exact.grad_query, bound.grad_query), worst_ratio(r.dk, exact.grad_key, bound.grad_key),
                                       worst_ratio(r.dv, exact.grad_value, bound.grad_value)});
            BOOST_TEST_CONTEXT(format << ' ' << c.name << ' ' << bug_name(b)) {
                if (b == bug::none) BOOST_TEST(w <= 1.0);
                else BOOST_TEST(w > 1.0);
            }
            BOOST_TEST_MESSAGE(format << ' ' << c.name << ' ' << bug_name(b) << ": worst |error| / bound = " << w);
        }
    }
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_backward_bug_fails_in_float32) {
    run_catalog("float32", 0x1p-24, 0, [](float x) { return static_cast<double>(x); });
}

BOOST_AUTO_TEST_CASE(every_backward_bug_fails_in_bfloat16) {
    run_catalog("bfloat16", 0x1p-24, 0x1p-8, [](float x) { return static_cast<double>(bfloat16(x)); });
}
