#pragma once
/// \file bounds/backward_mha.hpp
/// Owns the first-order data-aware error bound of multi-head attention gradients (dX_q, dX_k, dX_v,
/// dW_q/k/v/o, db_q/k/v/o) (B8)–(B13) with (B14) and, for a declared policy storing the projections in
/// a known format, (B15), (B15v) (mha_gradient_first_order_bounds), on top of the SDPA head bound
/// (B9)–(B11) of backward_sdpa.hpp. Derivation: docs/backward.md, "Multi-head attention: (B8)–(B13)"
/// and "(B15) Declared storage of the projections".

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include "attnref/bounds/backward_row_kernels.hpp"
#include "attnref/bounds/backward_sdpa.hpp"
#include "attnref/bounds/error_bounds.hpp"
#include "attnref/core/attention.hpp"
#include "attnref/core/backward.hpp"
#include "attnref/core/binary_format.hpp"
#include "attnref/core/multi_head_attention.hpp"
#include "attnref/core/parallel.hpp"
#include "attnref/core/tensor.hpp"

namespace attnref {

/// Per-element bounds on |ĝ − g| of multi-head attention gradients, shaped like mha_gradients.
struct mha_gradient_bounds {
    tensor<double, 3> grad_x_q, grad_x_k, grad_x_v;
    tensor<double, 2> grad_w_q, grad_w_k, grad_w_v, grad_w_o;
    tensor<double, 1> grad_b_q, grad_b_k, grad_b_v, grad_b_o;
};

namespace detail {
/// Multi-head attention's gradients in double from given head inputs (B, H, S, d) Q, K, V and head
/// upstream gradients dO (as mha_gradient_bounds' tensors): SDPA forward (for dW_o) and textbook
/// backward per head, then the projections' backward, y = x·W + b, every sum in double.
inline mha_gradient_bounds mha_gradients_in_double(tensor_view<const double, 3> x_q, tensor_view<const double, 3> x_k,
                                                   tensor_view<const double, 3> x_v, const mha_parameters<double>& p, const mha_options& o,
                                                   tensor_view<const double, 3> grad_output, const tensor<double, 4>& qh,
                                                   const tensor<double, 4>& kh, const tensor<double, 4>& vh, const tensor<double, 4>& doh) {
    using D = uniform_precision<double>;
    const attention_result<D> f = scaled_dot_product_attention<D, double, double, double>(qh.view(), kh.view(), vh.view(), o.attention);
    const attention_gradients<D> g =
        scaled_dot_product_attention_backward<D, double, double, double, double>(qh.view(), kh.view(), vh.view(), doh.view(), o.attention);
    mha_gradient_bounds r;
    // The projections' backward is core/backward.hpp's linear_backward_into in double: every sum over
    // its terms in ascending order from +0 (dX over the columns, dW and db over the rows), whatever
    // the thread count.
    const std::size_t threads = o.attention.threads;
    auto linear = [&](tensor_view<const double, 3> x, tensor_view<const double, 2> w, const tensor<double, 3>& dh, tensor<double, 3>& gx,
                      tensor<double, 2>& gw, tensor<double, 1>& gb, const char* name) {
        gx = tensor<double, 3>(x.extents, 0.0);
        gw = tensor<double, 2>(w.extents, 0.0);
        gb = tensor<double, 1>({w.extents[1]}, 0.0);
        linear_backward_into<D>(x, w, dh.view(), gx.view(), gw.view(), gb.view(), threads, name);
    };
    linear(x_q, p.w_q, merge_heads<double>(g.grad_query.view()), r.grad_x_q, r.grad_w_q, r.grad_b_q, "w_q");
    linear(x_k, p.w_k, merge_heads<double>(g.grad_key.view()), r.grad_x_k, r.grad_w_k, r.grad_b_k, "w_k");
    linear(x_v, p.w_v, merge_heads<double>(g.grad_value.view()), r.grad_x_v, r.grad_w_v, r.grad_b_v, "w_v");
    // dW_o = mergedᵀ·dOut and db_o = Σ_r dOut (no dMerged: the heads' dO are given).
    const tensor<double, 3> merged = merge_heads<double>(f.output.view());
    r.grad_w_o = tensor<double, 2>(p.w_o.extents, 0.0);
    r.grad_b_o = tensor<double, 1>({grad_output.extents[2]}, 0.0);
    linear_backward_into<D>(merged.view(), p.w_o, grad_output, tensor_view<double, 3>{}, r.grad_w_o.view(), r.grad_b_o.view(), threads, "w_o");
    return r;
}
}  // namespace detail

/// The first-order bound (B8)–(B13) for multi-head attention gradients computed with unit roundoff
/// `u` and intermediates (projections, head outputs, head gradients) and results stored with
/// `u_storage` (0: the arithmetic's own format). x_q, x_k, x_v, the parameters and grad_output
/// (B, Sq, Eo) exact; weights (B, H, Sq, Sk) and lse (B, H, Sq) the exact forward's. Biases absent in
/// `p` count as 0 (their gradients are still bounded: the gradient at b = 0). u_inputs: the inputs
/// (x, W, b, grad_output) are first rounded to a format with that unit roundoff (a candidate computing
/// in a narrower format than the case's inputs): each product of two inputs carries 2·u_inputs more.
inline mha_gradient_bounds mha_gradient_first_order_bounds(tensor_view<const double, 3> x_q, tensor_view<const double, 3> x_k,
                                                           tensor_view<const double, 3> x_v, const mha_parameters<double>& p,
                                                           const mha_options& o, tensor_view<const double, 3> grad_output,
                                                           tensor_view<const double, 4> weights, tensor_view<const double, 3> lse,
                                                           double u, double u_storage = 0, double u_weights = 0,
                                                           double u_inputs = 0,
                                                           std::optional<backward_algorithm> declared = std::nullopt,
                                                           double u_intermediates = 0,
                                                           std::optional<binary_format> predicted_storage = std::nullopt) {
    const mha_dims md = mha_dims_of(x_q, x_k, x_v, p, o);
    require_extent("grad_output axis 0 (batch)", grad_output.extents[0], md.batch);
    require_extent("grad_output axis 1 (query length)", grad_output.extents[1], md.query_length);
    require_extent("grad_output axis 2 (output features)", grad_output.extents[2], md.output_dim);
    require_extent("weights axis 3 (key length)", weights.extents[3], md.key_length);
    const double us = u_storage;
    // (B14): η_a per product, η_in per rounded input, η_mat for a materialised (stored) intermediate.
    const double eta_a = error_bounds::underflow_eta(u), eta_in = error_bounds::underflow_eta(u_inputs),
                 eta_mat = us > 0 ? error_bounds::underflow_eta(us) : eta_a;
    // (B8): a projection y = x·W + b in double (values and magnitudes), split into heads.
    struct projected {
        tensor<double, 4> value, error;  // (B, heads, S, d)
    };
    // Every sum below runs over its terms in ascending order from +0 (the value per element fixed by
    // that order alone); rows (or weight rows) go to the threads in blocks and the lanes of the
    // innermost loops are distinct elements (detail::projection_sums_row), so neither the thread count
    // nor the blocking changes a bit.
    const std::size_t threads = o.attention.threads;
    // y = x·w (+ bias), w (E, N), split into `heads`; `rel` the relative error factor of its sums.
    auto project = [&](tensor_view<const double, 3> x, tensor_view<const double, 2> w, tensor_view<const double, 1> bias,
                       std::size_t heads, double rel) {
        const std::size_t B = x.extents[0], S = x.extents[1], E = x.extents[2], N = w.extents[1], hd = N / heads;
        projected r{tensor<double, 4>({B, heads, S, hd}, 0.0), tensor<double, 4>({B, heads, S, hd}, 0.0)};
        std::vector<double> w_abs(E * N);
        for (std::size_t n = 0; n < E * N; ++n) w_abs[n] = std::fabs(w.data[n]);
        ::attnref::parallel_for_dynamic(B * S, threads, [&](std::size_t row) {
            const std::size_t b = row / S, i = row % S;
            thread_local std::vector<double> v, m, in;
            v.assign(N, 0.0), m.assign(N, 0.0), in.assign(N, 0.0);
            for (std::size_t e = 0; e < E; ++e)
                detail::projection_sums_row(x(b, i, e), w.data + e * N, w_abs.data() + e * N, v.data(), m.data(), in.data(), N);
            for (std::size_t c = 0; c < N; ++c) {
                if (!bias.empty()) v[c] += bias[c], m[c] += std::fabs(bias[c]), in[c] += 1;
                r.value(b, c / hd, i, c % hd) = v[c];
                r.error(b, c / hd, i, c % hd) = rel * m[c] + eta_in * in[c] + (static_cast<double>(E) + 1) * eta_a + eta_mat;  // (B8), (B14)
            }
        });
        return r;
    };
    // (B8): each input projection's sums have E products, the bias and the rounding of the inputs.
    auto rel_of = [&](tensor_view<const double, 3> x) { return (static_cast<double>(x.extents[2]) + 2) * u + us + 2 * u_inputs; };
    projected Q = project(x_q, p.w_q, p.b_q, md.heads, rel_of(x_q)), K = project(x_k, p.w_k, p.b_k, md.kv_heads, rel_of(x_k)),
              V = project(x_v, p.w_v, p.b_v, md.kv_heads, rel_of(x_v));
    // dO = dOut·W_oᵀ split into heads, and its error (B14): Eo products, no bias.
    const std::size_t Eo = md.output_dim, dv = md.head_dim_v, Mo = md.heads * dv;
    tensor<double, 2> wo_t({Eo, Mo}, 0.0);
    for (std::size_t m = 0; m < Mo; ++m)
        for (std::size_t n = 0; n < Eo; ++n) wo_t(n, m) = p.w_o(m, n);
    projected dO = project(grad_output, wo_t.view(), {}, md.heads, (static_cast<double>(Eo) + 1) * u + us + 2 * u_inputs);
    const attention_options& ao = o.attention;
    // (B15) a declared policy that stores the projections and dO in a known format (round to nearest
    // even, as linear_into does): the stored values are predicted, not bounded; the bound is taken at
    // the predicted head inputs and the exact shift they cause is added at the end.
    const bool predict = predicted_storage.has_value() && us > 0 && !(u_inputs > 0);
    const tensor_view<const double, 4> weights_exact = weights;
    const tensor_view<const double, 3> lse_exact = lse;
    tensor<double, 4> w_hat;
    tensor<double, 3> lse_hat;
    std::optional<projected> exact_q, exact_k, exact_v, exact_do;
    if (predict) {
        auto predict_heads = [&](projected& y, std::size_t terms_plus_one, const std::vector<double>& magnitude) {
            // |y_kernel − y| ≤ ε = (n + 1)(u + 2^-52)·Σ|terms| + (n + 1)·η_a (the kernel's sum and ours in double)
            projected out{y.value, tensor<double, 4>(y.value.extents(), 0.0)};
            const double n1 = static_cast<double>(terms_plus_one);
            for (std::size_t e = 0; e < out.value.size(); ++e) {
                const double v = y.value[e], eps = n1 * (u + 0x1p-52) * magnitude[e] + n1 * eta_a;
                const double c = round_to(*predicted_storage, v), lo = round_to(*predicted_storage, v - eps),
                             hi = round_to(*predicted_storage, v + eps);
                out.value[e] = c;
                out.error[e] = std::max(hi - c, c - lo);  // 0 unless y lies within ε of a rounding boundary
            }
            y = std::move(out);
        };
        auto magnitudes = [&](tensor_view<const double, 3> x, tensor_view<const double, 2> w, tensor_view<const double, 1> bias,
                              std::size_t heads) {
            const std::size_t B = x.extents[0], S = x.extents[1], E = x.extents[2], N = w.extents[1], hd = N / heads;
            std::vector<double> m(B * S * N, 0.0);
            for (std::size_t b = 0; b < B; ++b)
                for (std::size_t i = 0; i < S; ++i)
                    for (std::size_t c = 0; c < N; ++c) {
                        double a = bias.empty() ? 0.0 : std::fabs(bias[c]);
                        for (std::size_t e = 0; e < E; ++e) a += std::fabs(x(b, i, e) * w(e, c));
                        m[((b * heads + c / hd) * S + i) * hd + c % hd] = a;
                    }
            return m;
        };
        exact_q = Q, exact_k = K, exact_v = V, exact_do = dO;
        predict_heads(Q, x_q.extents[2] + 2, magnitudes(x_q, p.w_q, p.b_q, md.heads));
        predict_heads(K, x_k.extents[2] + 2, magnitudes(x_k, p.w_k, p.b_k, md.kv_heads));
        predict_heads(V, x_v.extents[2] + 2, magnitudes(x_v, p.w_v, p.b_v, md.kv_heads));
        {
            std::vector<double> m(dO.value.size(), 0.0);
            for (std::size_t b = 0; b < md.batch; ++b)
                for (std::size_t i = 0; i < md.query_length; ++i)
                    for (std::size_t mm = 0; mm < md.heads * dv; ++mm) {
                        double a = 0;
                        for (std::size_t n = 0; n < Eo; ++n) a += std::fabs(grad_output(b, i, n) * p.w_o(mm, n));
                        m[((b * md.heads + mm / dv) * md.query_length + i) * dv + mm % dv] = a;
                    }
            predict_heads(dO, Eo + 1, m);
        }
        // The forward at the predicted heads, in double (its own rounding is second order).
        attention_result<uniform_precision<double>> f =
            scaled_dot_product_attention<uniform_precision<double>, double, double, double>(Q.value.view(), K.value.view(), V.value.view(), ao);
        w_hat = std::move(f.weights);
        lse_hat = std::move(f.lse);
        weights = w_hat.view();
        lse = lse_hat.view();
    }
    detail::perturbed_head_bounds hb = detail::perturbed_sdpa_bounds(Q.value.view(), K.value.view(), V.value.view(), dO.value.view(),
                                                                     Q.error.view(), K.error.view(), V.error.view(), dO.error.view(),
                                                                     weights, lse, ao, u, us, u_weights, declared, u_intermediates, predict);
    if (predict) {
        // (B15v): the heads' gradients' storage by value, u_s(|g(predicted heads)| + the rest), g in
        // double (its own error ≤ 2^-29 of the rest, as below).
        const attention_gradients<uniform_precision<double>> gh =
            scaled_dot_product_attention_backward<uniform_precision<double>, double, double, double, double>(
                Q.value.view(), K.value.view(), V.value.view(), dO.value.view(), ao);
        auto by_value = [&](tensor<double, 4>& a, const tensor<double, 4>& g) {
            for (std::size_t n = 0; n < a.size(); ++n) {
                const double rest = a[n] * (1 + 0x1p-28);
                a[n] = rest + us * (std::fabs(g[n]) + rest);
            }
        };
        by_value(hb.a_dq, gh.grad_query);
        by_value(hb.a_dk, gh.grad_key);
        by_value(hb.a_dv, gh.grad_value);
    }
    tensor<double, 4>&a_dq = hb.a_dq, &a_dk = hb.a_dk, &a_dv = hb.a_dv, &m_dq = hb.m_dq, &m_dk = hb.m_dk, &m_dv = hb.m_dv, &a_o = hb.a_o,
                     &m_o = hb.m_o;
    // (B12), (B13): the linear backward's sums over the merged (B, S, heads·d) layout.
    const tensor<double, 3> A_dq = merge_heads<double>(a_dq.view()), A_dk = merge_heads<double>(a_dk.view()),
                            A_dv = merge_heads<double>(a_dv.view()), M_dq = merge_heads<double>(m_dq.view()),
                            M_dk = merge_heads<double>(m_dk.view()), M_dv = merge_heads<double>(m_dv.view()),
                            A_o = merge_heads<double>(a_o.view()), M_o = merge_heads<double>(m_o.view());
    mha_gradient_bounds r;
    // The results' own storage rounding, u_s·|g|: bounded by the magnitude sums below, or under (B15)
    // by the value, u_s·(|g(predicted heads)| + the rest of the bound), added at the end (B15v).
    const double us_final = predict ? 0.0 : us;
    auto linear = [&](tensor_view<const double, 3> x, tensor_view<const double, 2> w, const tensor<double, 3>& a, const tensor<double, 3>& m,
                      tensor<double, 3>& gx, tensor<double, 2>& gw, tensor<double, 1>& gb) {
        const std::size_t B = x.extents[0], S = x.extents[1], E = x.extents[2], N = w.extents[1], R = B * S;
        const double rel_x = (static_cast<double>(N) + 1) * u + us_final + u_inputs,
                     rel_r = (static_cast<double>(R) + 1) * u + us_final + u_inputs;
        // (B14): N (or R) products' η_a and the result's storage; the rounded W's (x's) η_in times |dH|.
        gx = tensor<double, 3>({B, S, E}, (static_cast<double>(N) + 1) * eta_a + eta_mat);
        gw = tensor<double, 2>({E, N}, (static_cast<double>(R) + 1) * eta_a + eta_mat);
        gb = tensor<double, 1>({N}, (static_cast<double>(R) + 1) * eta_a + eta_mat);
        // Per (r, c): what reaches dX (to_x) and dW, db (to_w), and the rounded inputs' underflow.
        std::vector<double> to_x(R * N), to_w(R * N), under(R * N), w_abs_t(N * E);
        for (std::size_t n = 0; n < R * N; ++n)
            to_x[n] = a[n] + rel_x * m[n], to_w[n] = a[n] + rel_r * m[n], under[n] = eta_in * m[n];
        for (std::size_t e = 0; e < E; ++e)
            for (std::size_t c = 0; c < N; ++c) w_abs_t[c * E + e] = std::fabs(w(e, c));
        for (std::size_t rr = 0; rr < R; ++rr)
            for (std::size_t c = 0; c < N; ++c) gb[c] += to_w[rr * N + c];
        // dX row r: over c ascending; dW row e: over r ascending.
        ::attnref::parallel_for_dynamic(R, threads, [&](std::size_t rr) {
            for (std::size_t c = 0; c < N; ++c)
                detail::scaled_abs_row(&gx[rr * E], w_abs_t.data() + c * E, to_x[rr * N + c], under[rr * N + c], E);
        });
        ::attnref::parallel_for_dynamic(E, threads, [&](std::size_t e) {
            for (std::size_t rr = 0; rr < R; ++rr)
                detail::scale_row_add(&gw(e, 0), to_w.data() + rr * N, under.data() + rr * N, std::fabs(x[rr * E + e]), N);
        });
    };
    linear(x_q, p.w_q, A_dq, M_dq, r.grad_x_q, r.grad_w_q, r.grad_b_q);
    linear(x_k, p.w_k, A_dk, M_dk, r.grad_x_k, r.grad_w_k, r.grad_b_k);
    linear(x_v, p.w_v, A_dv, M_dv, r.grad_x_v, r.grad_w_v, r.grad_b_v);
    {
        const std::size_t R = md.batch * md.query_length;
        const double rel_r = (static_cast<double>(R) + 1) * u + us_final + u_inputs;
        r.grad_w_o = tensor<double, 2>({Mo, Eo}, (static_cast<double>(R) + 1) * eta_a + eta_mat);  // (B14)
        r.grad_b_o = tensor<double, 1>({Eo}, (static_cast<double>(R) + 1) * eta_a + eta_mat);
        std::vector<double> g_abs(R * Eo);
        for (std::size_t n = 0; n < R * Eo; ++n) g_abs[n] = std::fabs(grad_output[n]);
        for (std::size_t rr = 0; rr < R; ++rr)
            for (std::size_t n = 0; n < Eo; ++n) {
                const double g = g_abs[rr * Eo + n];
                r.grad_b_o[n] += rel_r * g + (g != 0 ? eta_in : 0.0);
            }
        // dW_o row m: over r ascending, (A_o + rel·M_o)·|dOut| + η_in·(M_o + |dOut|) per term.
        ::attnref::parallel_for_dynamic(Mo, threads, [&](std::size_t m) {
            for (std::size_t rr = 0; rr < R; ++rr)
                detail::output_weight_row(&r.grad_w_o(m, 0), g_abs.data() + rr * Eo, A_o[rr * Mo + m] + rel_r * M_o[rr * Mo + m],
                                          M_o[rr * Mo + m], eta_in, Eo);
        });
    }
    constexpr double inflation = 1 + 0x1p-20;  // second-order terms and the bound's own rounding
    for (tensor<double, 3>* t : {&r.grad_x_q, &r.grad_x_k, &r.grad_x_v})
        for (double& x : t->storage()) x *= inflation;
    for (tensor<double, 2>* t : {&r.grad_w_q, &r.grad_w_k, &r.grad_w_v, &r.grad_w_o})
        for (double& x : t->storage()) x *= inflation;
    for (tensor<double, 1>* t : {&r.grad_b_q, &r.grad_b_k, &r.grad_b_v, &r.grad_b_o})
        for (double& x : t->storage()) x *= inflation;
    if (predict) {
        // (B15): |ĝ − g| ≤ bound at the predicted heads (r) + |g(predicted) − g(exact)|, both gradients
        // computed in double: g(exact)'s double error is bounded by this bound at u = 2^-53 without
        // storage, g(predicted)'s by 2^-29 of r (the same first-order form at 2^-53 ≤ 2^-29·u).
        // (B15v): r omits the results' final storage rounding; the kernel's unrounded result y lies
        // within r·(1 + 2^-28) of the double g(predicted), so storing it adds ≤ u_s(|g(predicted)| + r(1 + 2^-28)).
        const mha_gradient_bounds at_hat = detail::mha_gradients_in_double(x_q, x_k, x_v, p, o, grad_output, Q.value, K.value, V.value, dO.value);
        const mha_gradient_bounds at_exact =
            detail::mha_gradients_in_double(x_q, x_k, x_v, p, o, grad_output, exact_q->value, exact_k->value, exact_v->value, exact_do->value);
        const mha_gradient_bounds in_double = mha_gradient_first_order_bounds(x_q, x_k, x_v, p, o, grad_output, weights_exact, lse_exact, 0x1p-53);
        auto add = [&](auto& bound, const auto& a, const auto& e, const auto& d) {
            for (std::size_t n = 0; n < bound.size(); ++n) {
                const double rest = bound[n] * (1 + 0x1p-28);
                bound[n] = (rest + us * (std::fabs(a[n]) + rest)) * inflation + std::fabs(a[n] - e[n]) * inflation + d[n];
            }
        };
        add(r.grad_x_q, at_hat.grad_x_q, at_exact.grad_x_q, in_double.grad_x_q);
        add(r.grad_x_k, at_hat.grad_x_k, at_exact.grad_x_k, in_double.grad_x_k);
        add(r.grad_x_v, at_hat.grad_x_v, at_exact.grad_x_v, in_double.grad_x_v);
        add(r.grad_w_q, at_hat.grad_w_q, at_exact.grad_w_q, in_double.grad_w_q);
        add(r.grad_w_k, at_hat.grad_w_k, at_exact.grad_w_k, in_double.grad_w_k);
        add(r.grad_w_v, at_hat.grad_w_v, at_exact.grad_w_v, in_double.grad_w_v);
        add(r.grad_w_o, at_hat.grad_w_o, at_exact.grad_w_o, in_double.grad_w_o);
        add(r.grad_b_q, at_hat.grad_b_q, at_exact.grad_b_q, in_double.grad_b_q);
        add(r.grad_b_k, at_hat.grad_b_k, at_exact.grad_b_k, in_double.grad_b_k);
        add(r.grad_b_v, at_hat.grad_b_v, at_exact.grad_b_v, in_double.grad_b_v);
        add(r.grad_b_o, at_hat.grad_b_o, at_exact.grad_b_o, in_double.grad_b_o);
    }
    return r;
}

}  // namespace attnref
