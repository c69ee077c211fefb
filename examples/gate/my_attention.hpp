#pragma once
// "Your kernel": multi-head attention written the plain way, in float32, with no attnref template
// involved: y = x·W projections, per head softmax(q·kᵀ/√dk)·v with the row maximum subtracted,
// heads concatenated, output projection. It handles what golden/mha_seed_example needs (no bias, no
// mask, as many kv heads as query heads) and says so otherwise. The two gate examples
// (boost_test_gate.cpp, gtest_gate.cpp) compute the case with it and check it with attnref.
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <vector>

#include <attnref/golden/case.hpp>

namespace my_kernel {

// Inputs arrive as the case's doubles (exact float64 values); the kernel rounds them to float.
inline std::vector<float> to_float(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

// out (B, S, E_out) = concat_h softmax(q_h k_hᵀ / √dk) v_h · W_o, with q = x_q W_q, k = x_k W_k, v = x_v W_v.
inline std::vector<float> multi_head_attention(const attnref::golden::loaded_case& c) {
    const auto& d = c.m.spec.shapes;
    const auto& conv = c.m.spec.conventions;
    if (c.m.spec.kind != attnref::golden::case_kind::mha || d.kv_heads != d.heads || conv.projection_bias || conv.causal ||
        conv.boolean_mask || conv.additive_mask || conv.seed_mask || conv.window || !conv.key_lengths.empty() ||
        !conv.alibi_slopes.empty() || conv.softcap || conv.scale || d.query_length != d.key_length)
        throw std::invalid_argument("my_kernel: this example implements plain multi-head self-attention shapes only");
    const std::size_t B = d.batch, S = d.query_length, E = d.model_dim, H = d.heads, dk = d.head_dim_qk, dv = d.head_dim_v,
                      F = d.output_dim;
    const std::vector<float> xq = to_float(c.data.query), xk = to_float(c.data.key), xv = to_float(c.data.value);
    const std::vector<float> wq = to_float(c.data.w_q), wk = to_float(c.data.w_k), wv = to_float(c.data.w_v),
                             wo = to_float(c.data.w_o);
    auto project = [&](const std::vector<float>& x, const std::vector<float>& w, std::size_t width) {
        std::vector<float> y(B * S * width, 0.0f);
        for (std::size_t r = 0; r < B * S; ++r)
            for (std::size_t j = 0; j < width; ++j) {
                float acc = 0.0f;
                for (std::size_t e = 0; e < E; ++e) acc += x[r * E + e] * w[e * width + j];
                y[r * width + j] = acc;
            }
        return y;
    };
    const std::vector<float> q = project(xq, wq, H * dk), k = project(xk, wk, H * dk), v = project(xv, wv, H * dv);
    const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
    std::vector<float> heads(B * S * H * dv, 0.0f), p(S);
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t h = 0; h < H; ++h)
            for (std::size_t i = 0; i < S; ++i) {
                float m = -INFINITY;
                for (std::size_t j = 0; j < S; ++j) {
                    float s = 0.0f;
                    for (std::size_t t = 0; t < dk; ++t) s += q[(b * S + i) * H * dk + h * dk + t] * k[(b * S + j) * H * dk + h * dk + t];
                    p[j] = s * scale;
                    m = std::fmax(m, p[j]);
                }
                float sum = 0.0f;
                for (std::size_t j = 0; j < S; ++j) sum += (p[j] = std::exp(p[j] - m));
                for (std::size_t t = 0; t < dv; ++t) {
                    float acc = 0.0f;
                    for (std::size_t j = 0; j < S; ++j) acc += p[j] / sum * v[(b * S + j) * H * dv + h * dv + t];
                    heads[(b * S + i) * H * dv + h * dv + t] = acc;
                }
            }
    std::vector<float> out(B * S * F, 0.0f);
    for (std::size_t r = 0; r < B * S; ++r)
        for (std::size_t f = 0; f < F; ++f) {
            float acc = 0.0f;
            for (std::size_t e = 0; e < H * dv; ++e) acc += heads[r * H * dv + e] * wo[e * F + f];
            out[r * F + f] = acc;
        }
    return out;
}

// A broken kernel for the gates' negative test: the correct output widened to double with one
// element (index 3 of the first row) moved by 1% of that row's largest |value|.
inline std::vector<double> one_element_off(const attnref::golden::loaded_case& c) {
    const std::vector<float> out = multi_head_attention(c);
    std::vector<double> wrong(out.begin(), out.end());
    double row_max = 0;
    for (std::size_t f = 0; f < c.m.spec.shapes.output_dim; ++f) row_max = std::fmax(row_max, std::fabs(wrong[f]));
    wrong[3] += 0.01 * row_max;
    return wrong;
}

}  // namespace my_kernel
