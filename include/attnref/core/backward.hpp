#pragma once
/// \file core/backward.hpp
/// The backward pass of scaled dot-product attention and of multi-head attention: given the forward's
/// inputs, its attention_options and the upstream gradient dO = ∂L/∂out, the gradients of L with
/// respect to every input. Same templated code for every arithmetic and precision policy as the
/// forward (attention.hpp), constexpr for fixed shapes.
///
/// SDPA, one query head h of kv head hk = h / (H / Hkv); reverse mode of attention.hpp's diagram,
/// each step the adjoint of one forward step, in reverse order:
///
///   forward (recomputed through the public forward and its logits helpers, same policy)
///        q', k' = q, k with the scale where the placement puts it     (q' = q·s, q·√s or q; k' = k·√s or k)
///        raw_ij = q'_i·k'_j  (·s for on_product)                     the logit before soft-capping
///        S_ij   = cap·tanh(raw_ij/cap) − ALiBi + additive + seed·(−1e9)
///        P, lse = softmax rows of S;  O = round_P(P)·V               (forward: P, lse, O)
///
///   dO (B, H, Sq, dv)
///        │── dP_ij = dO_i·v_j                        (ascending c, from +0)        values_type
///        │── textbook:  r_i = Σ_j P̂_ij·dP_ij         P̂ = the forward's weights (weights_type)
///        │   flash:     D_i = Σ_c dO_ic·O_ic           O = the forward's output (output_type),
///        │              P_ij = exp(S_ij − lse_i)       recomputed from S and the forward's lse
///        ▼
///   dS_ij = P_ij·(dP_ij − r_i  or  D_i)           (softmax backward)   softmax_type ──► grad_logits
///        │  masked keys: dS_ij = 0 exactly (never computed)
///        │  ALiBi, additive and seed offsets are constants: derivative 1
///        │  softcap: g_ij = dS_ij·((1 − t)(1 + t)),  t = tanh(raw_ij/cap)        logits_type
///        │  on_product: g_ij = g_ij·s
///        ▼
///   dq'_i = Σ_j g_ij·k'_j   (ascending j)          dk'_j = Σ_h Σ_i g_ij·q'_i  (heads of the group
///        │                                                 ascending, then i ascending, one accumulator)
///   on_query: dQ = dq'·s;  split_sqrt: dQ = dq'·√s, dK = dk'·√s;  on_product: dQ = dq', dK = dk'
///   dV_j = Σ_h Σ_i round_P(P_ij)·dO_i                (heads ascending, then i; values_type)
///
/// Both algorithms compute the same function (Σ_j P_ij·dP_ij = dO_i·O_i in exact arithmetic) and
/// round differently: textbook reuses the stored P, flash (FlashAttention-2, Dao 2023, Algorithm 2)
/// stores only O and lse. Textbook uses P̂ for both dS and dV (as autograd through a stored softmax
/// output does); in flash, P in softmax_type feeds dS and round_P(P) feeds dV, as FlashAttention
/// casts P to fp16/bf16 before dV = Pᵀ·dO. Each sum starts from +0; inputs are converted once to the
/// stage's type; the gradients are rounded once to the caller's view types (output_type in the
/// result structs). The forward is run once per call (its cost is that of one forward pass).
///
/// Empty rows (no attendable key), per the forward's empty_row_policy:
///   zero     the row's output is the constant 0: no gradient reaches dQ, dK, dV from it.
///   uniform  the row's output is mean(V) over all Sk keys, constant in q and k: dQ_i = 0 and
///            dV_j += round_P(1/Sk)·dO_i for every key j, masked ones included (they are averaged).
///   nan      the row's output is NaN, so is every gradient it reaches (as autograd through a softmax
///            of −inf gives): dQ_i and grad_logits row i are NaN, and dK, dV of every key of that
///            kv head are NaN.
/// Otherwise, keys masked for every query of a kv head get dK = dV = 0 exactly, and a query row with
/// exactly one attendable key gets dS = 0 exactly (so dQ_i = 0 and no dK from it), decided from the mask.
/// For multi-head attention without soft-capping, the key-bias gradient db_k is exactly 0 under every
/// empty-row policy (the softmax is invariant to the per-row shift q'_i·b_k, and an empty row's output
/// does not depend on b_k) and is returned as 0.
///
/// Multi-head attention (weights y = x·W + b, multi_head_attention.hpp): the projections and the
/// head outputs are recomputed, then
///   dW_o = mergedᵀ·dOut, db_o = Σ_rows dOut, dMerged = dOut·W_oᵀ → split → dO (B, H, Sq, dv)
///   SDPA backward → dQ, dK, dV heads → merge → (B, S, H·d)
///   dW_x = xᵀ·dX, db_x = Σ_rows dX, dx = dX·W_xᵀ     for x = q, k, v
/// in the policy's projection_type; the gradients between stages are rounded to storage_type, as a
/// framework materialises them. Self-attention (one tensor x fed as x_q = x_k = x_v): the caller sums
/// the three input gradients, dx = dX_q + dX_k + dX_v. Bias gradients are returned whether or not the
/// forward had a bias (the gradient at b = 0).
///
/// Results do not depend on the thread count: tasks are (batch, kv head) pairs for SDPA and rows (or
/// weight rows) for the projections, each summed in the fixed order above.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <span>
#include <vector>

#include "attnref/core/attention.hpp"
#include "attnref/core/fixed_shape.hpp"
#include "attnref/core/math.hpp"
#include "attnref/core/multi_head_attention.hpp"
#include "attnref/core/name_table.hpp"
#include "attnref/core/parallel.hpp"
#include "attnref/core/precision.hpp"
#include "attnref/core/problem.hpp"
#include "attnref/core/softmax.hpp"
#include "attnref/core/tensor.hpp"

namespace attnref {

/// How the softmax backward forms dS (see the file comment). Same function, different rounding.
enum class backward_algorithm {
    textbook,  ///< dS = P ∘ (dP − rowsum(dP ∘ P)), P the forward's stored weights   [default]
    flash,     ///< dS = P ∘ (dP − D), D = rowsum(dO ∘ O), P = exp(S − lse) recomputed
};

/// Their names (`attnref run --backward-algorithm`, `attnref check --backward-algorithm`, studies, Python).
inline constexpr std::pair<const char*, backward_algorithm> backward_algorithm_names[] = {
    {"textbook", backward_algorithm::textbook}, {"flash", backward_algorithm::flash}};
inline constexpr std::string_view backward_algorithm_name(backward_algorithm a) { return name_in(backward_algorithm_names, a); }
inline std::optional<backward_algorithm> backward_algorithm_from_name(std::string_view n) { return value_in(backward_algorithm_names, n); }

struct backward_options {
    backward_algorithm algorithm = backward_algorithm::textbook;
};

/// Gradients of SDPA into caller-provided views. Shapes: q, k, v and grad_output (B, H, Sq, dv) as
/// for the forward; grad_q like q, grad_k like k, grad_v like v; grad_logits (B, H, Sq, Sk), the
/// gradient dS with respect to the logits S that enter the softmax, may be an empty view.
/// Throws shape_error naming the offending dimension.
template <PrecisionPolicy Policy, class Q, class K, class V, class G, class DQ, class DK, class DV, class DS>
constexpr void scaled_dot_product_attention_backward_into(
    tensor_view<const Q, 4> q, tensor_view<const K, 4> k, tensor_view<const V, 4> v, tensor_view<const G, 4> grad_output,
    const attention_options& options, const backward_options& backward, tensor_view<DQ, 4> grad_q,
    tensor_view<DK, 4> grad_k, tensor_view<DV, 4> grad_v, tensor_view<DS, 4> grad_logits) {
    using Lg = logits_type_t<Policy>;
    using A = softmax_type_t<Policy>;
    using Vt = values_type_t<Policy>;
    using P = typename Policy::weights_type;
    const attention_dims d = logit_stage::attention_dims_of(q, k, v);
    const std::size_t sq = d.query_length, sk = d.key_length, dk = d.head_dim_qk, dv = d.head_dim_v;
    const std::size_t group = d.heads / d.kv_heads;
    const extents_t<4> out_extents{d.batch, d.heads, sq, dv};
    const char* const axes[4] = {"axis 0 (batch)", "axis 1 (heads)", "axis 2 (length)", "axis 3 (head dim)"};
    auto require_shape = [&](const extents_t<4>& got, const extents_t<4>& expected, const char* name) {
        for (std::size_t a = 0; a < 4; ++a) require_extent(axes[a], got[a], expected[a], name);
    };
    require_shape(grad_output.extents, out_extents, "grad_output");
    require_shape(grad_q.extents, q.extents, "grad_q");
    require_shape(grad_k.extents, k.extents, "grad_k");
    require_shape(grad_v.extents, v.extents, "grad_v");
    if (!grad_logits.empty()) require_shape(grad_logits.extents, {d.batch, d.heads, sq, sk}, "grad_logits");

    // The forward (validates options and masks): P, lse, O exactly as a forward call stores them.
    const attention_result<Policy> fwd = scaled_dot_product_attention<Policy>(q, k, v, options);
    // Options without the constant logit offsets and the soft-cap: logits_row then yields raw_ij.
    attention_options raw_options = options;
    raw_options.softcap.reset();
    raw_options.alibi_slopes = {};
    raw_options.mask.additive = {};
    raw_options.mask.seed = {};
    const bool textbook = backward.algorithm == backward_algorithm::textbook;
    const empty_row_policy empty_policy = options.softmax.empty_rows;

    auto run_kv_head = [&](std::size_t task) {
        const std::size_t b = task / d.kv_heads, hk = task % d.kv_heads;
        std::vector<Lg> qh(sq * dk, Lg(0)), kh(sk * dk, Lg(0)), logits(sk, Lg(0)), raw(sk, Lg(0)), g(sk, Lg(0));
        std::vector<Lg> dk_acc(sk * dk, Lg(0)), dq_row(dk, Lg(0));
        std::vector<Vt> vh(sk * dv, Vt(0)), dv_acc(sk * dv, Vt(0)), do_row(dv, Vt(0)), dp(sk, Vt(0));
        std::vector<A> p(sk, A(0)), ds(sk, A(0));
        std::vector<std::uint8_t> allowed(sk, 0), raw_allowed(sk, 0);
        bool nan_head = false;
        for (std::size_t j = 0; j < sk; ++j)
            for (std::size_t c = 0; c < dv; ++c) vh[j * dv + c] = convert<Vt>(v(b, hk, j, c));
        for (std::size_t h = hk * group; h < (hk + 1) * group; ++h) {
            const logit_stage::logits_context<Lg> ctx = logit_stage::make_logits_context<Lg>(options, d, h);
            const logit_stage::logits_context<Lg> raw_ctx = logit_stage::make_logits_context<Lg>(raw_options, d, h);
            logit_stage::convert_head_inputs(options, ctx.scale, q, k, b, h, hk, qh, kh);
            for (std::size_t i = 0; i < sq; ++i) {
                const std::span<const Lg> q_row = std::span<const Lg>(qh).subspan(i * dk, dk);
                logit_stage::logits_row<Lg>(ctx, b, h, i, q_row, kh, logits, allowed);
                if (options.softcap) logit_stage::logits_row<Lg>(raw_ctx, b, h, i, q_row, kh, raw, raw_allowed);
                for (std::size_t c = 0; c < dv; ++c) do_row[c] = convert<Vt>(grad_output(b, h, i, c));
                for (std::size_t c = 0; c < dk; ++c) grad_q(b, h, i, c) = convert<DQ>(Lg(0));
                if (!grad_logits.empty())
                    for (std::size_t j = 0; j < sk; ++j) grad_logits(b, h, i, j) = convert<DS>(A(0));
                if (count_allowed(allowed) == 0) {  // empty row: see the file comment
                    if (empty_policy == empty_row_policy::nan) {
                        nan_head = true;
                        for (std::size_t c = 0; c < dk; ++c) grad_q(b, h, i, c) = convert<DQ>(quiet_NaN<Lg>());
                        if (!grad_logits.empty())
                            for (std::size_t j = 0; j < sk; ++j) grad_logits(b, h, i, j) = convert<DS>(quiet_NaN<A>());
                    } else if (empty_policy == empty_row_policy::uniform) {
                        const Vt w = convert<Vt>(convert<P>(empty_row_weight<A>(empty_policy, sk)));
                        for (std::size_t j = 0; j < sk; ++j)
                            for (std::size_t c = 0; c < dv; ++c) {
                                const Vt product = w * do_row[c];
                                dv_acc[j * dv + c] = dv_acc[j * dv + c] + product;
                            }
                    }
                    continue;
                }
                // P row and the row term (r_i or D_i).
                A row_term = A(0);
                for (std::size_t j = 0; j < sk; ++j) {
                    p[j] = A(0);
                    if (!allowed[j]) continue;
                    Vt acc = Vt(0);
                    for (std::size_t c = 0; c < dv; ++c) {
                        const Vt product = do_row[c] * vh[j * dv + c];
                        acc = acc + product;
                    }
                    dp[j] = acc;
                    if (textbook) {
                        p[j] = convert<A>(fwd.weights(b, h, i, j));
                    } else {
                        const A shifted = convert<A>(logits[j]) - convert<A>(fwd.lse(b, h, i));
                        p[j] = math::exp(shifted);
                    }
                }
                if (textbook) {
                    for (std::size_t j = 0; j < sk; ++j) {
                        if (!allowed[j]) continue;
                        const A product = p[j] * convert<A>(dp[j]);
                        row_term = row_term + product;
                    }
                } else {
                    for (std::size_t c = 0; c < dv; ++c) {
                        const A product = convert<A>(grad_output(b, h, i, c)) * convert<A>(fwd.output(b, h, i, c));
                        row_term = row_term + product;
                    }
                }
                // dS, then the chain through soft-capping and the scale; dV.
                // A row with exactly one attendable key has P = 1 whatever its logit, so dS = 0 exactly
                // (mathematically P·(dP − D) with P = 1, D = dP). Set structurally, from the mask alone
                // (no comparison of computed values, which scalar.hpp forbids for intervals), for every
                // arithmetic: in floating point it is what the textbook algorithm computes anyway
                // (P̂ = 1 exactly, dP − 1·dP = 0); flash's D = dO·O and recomputed P could leave a
                // rounding residue, which this removes; and in interval arithmetic it is the only way
                // such a row's dQ (and its share of dK) can certify: dP − dP is an interval around 0
                // that never rounds to one double. Even a non-finite dO gives 0 here: P does not depend
                // on the logits, so neither does L.
                const bool single_key = count_allowed(allowed) == 1;
                for (std::size_t j = 0; j < sk; ++j) {
                    ds[j] = A(0);
                    g[j] = Lg(0);
                    if (!allowed[j]) continue;
                    const A centred = convert<A>(dp[j]) - row_term;
                    ds[j] = single_key ? A(0) : p[j] * centred;
                    if (!grad_logits.empty()) grad_logits(b, h, i, j) = convert<DS>(ds[j]);
                    Lg gj = convert<Lg>(ds[j]);
                    if (options.softcap) {
                        const Lg ratio = raw[j] / ctx.softcap;
                        const Lg t = math::tanh(ratio);
                        const Lg derivative = (Lg(1) - t) * (Lg(1) + t);
                        gj = gj * derivative;
                    }
                    if (options.placement == scale_placement::on_product) gj = gj * ctx.scale;
                    g[j] = gj;
                    const Vt w = convert<Vt>(convert<P>(p[j]));
                    for (std::size_t c = 0; c < dv; ++c) {
                        const Vt product = w * do_row[c];
                        dv_acc[j * dv + c] = dv_acc[j * dv + c] + product;
                    }
                }
                // dq'_i = Σ_j g_ij·k'_j; dk'_j += g_ij·q'_i.
                for (std::size_t c = 0; c < dk; ++c) dq_row[c] = Lg(0);
                for (std::size_t j = 0; j < sk; ++j) {
                    if (!allowed[j]) continue;
                    for (std::size_t c = 0; c < dk; ++c) {
                        const Lg product = g[j] * kh[j * dk + c];
                        dq_row[c] = dq_row[c] + product;
                        const Lg back = g[j] * q_row[c];
                        dk_acc[j * dk + c] = dk_acc[j * dk + c] + back;
                    }
                }
                for (std::size_t c = 0; c < dk; ++c) {
                    Lg x = dq_row[c];
                    if (options.placement == scale_placement::on_query) x = x * ctx.scale;
                    if (options.placement == scale_placement::split_sqrt) x = x * math::sqrt(ctx.scale);
                    grad_q(b, h, i, c) = convert<DQ>(x);
                }
            }
        }
        const Lg k_factor = options.placement == scale_placement::split_sqrt
                                ? math::sqrt(logit_stage::logit_scale<Lg>(options, dk))
                                : Lg(1);
        for (std::size_t j = 0; j < sk; ++j) {
            for (std::size_t c = 0; c < dk; ++c) {
                Lg x = dk_acc[j * dk + c];
                if (options.placement == scale_placement::split_sqrt) x = x * k_factor;
                grad_k(b, hk, j, c) = nan_head ? convert<DK>(quiet_NaN<Lg>()) : convert<DK>(x);
            }
            for (std::size_t c = 0; c < dv; ++c)
                grad_v(b, hk, j, c) = nan_head ? convert<DV>(quiet_NaN<Vt>()) : convert<DV>(dv_acc[j * dv + c]);
        }
    };
    parallel_for(d.batch * d.kv_heads, options.threads, run_kv_head, [] {
        thread_cleanup<Lg>::run();
        thread_cleanup<A>::run();
        thread_cleanup<Vt>::run();
    });
}

/// Gradients of SDPA in the policy's output_type; grad_logits is dS (B, H, Sq, Sk).
template <PrecisionPolicy Policy>
struct attention_gradients {
    tensor<typename Policy::output_type, 4> grad_query, grad_key, grad_value, grad_logits;
    /// A gradient by its role in problem.hpp's table (grad_query, grad_key, grad_value), flat in C
    /// order; empty for any other role.
    constexpr std::span<const typename Policy::output_type> values(tensor_role r) const {
        switch (r) {
            case tensor_role::grad_query: return {grad_query.data(), grad_query.size()};
            case tensor_role::grad_key: return {grad_key.data(), grad_key.size()};
            case tensor_role::grad_value: return {grad_value.data(), grad_value.size()};
            default: return {};
        }
    }
};

template <PrecisionPolicy Policy, class Q, class K, class V, class G>
constexpr attention_gradients<Policy> scaled_dot_product_attention_backward(
    tensor_view<const Q, 4> q, tensor_view<const K, 4> k, tensor_view<const V, 4> v, tensor_view<const G, 4> grad_output,
    const attention_options& options = {}, const backward_options& backward = {}) {
    using T = typename Policy::output_type;
    attention_gradients<Policy> r{tensor<T, 4>(q.extents), tensor<T, 4>(k.extents), tensor<T, 4>(v.extents),
                                  tensor<T, 4>({q.extents[0], q.extents[1], q.extents[2], k.extents[2]})};
    scaled_dot_product_attention_backward_into<Policy>(q, k, v, grad_output, options, backward, r.grad_query.view(),
                                                       r.grad_key.view(), r.grad_value.view(), r.grad_logits.view());
    return r;
}

/// Convenience overload: everything in T.
template <Scalar T>
constexpr attention_gradients<uniform_precision<T>> scaled_dot_product_attention_backward(
    const tensor<T, 4>& q, const tensor<T, 4>& k, const tensor<T, 4>& v, const tensor<T, 4>& grad_output,
    const attention_options& options = {}, const backward_options& backward = {}) {
    return scaled_dot_product_attention_backward<uniform_precision<T>, T, T, T, T>(q.view(), k.view(), v.view(),
                                                                                   grad_output.view(), options, backward);
}

/// Backward of y (B, S, N) = x (B, S, M)·W (M, N) + bias (N), in the policy's projection_type:
///   grad_x[r, m] = Σ_n dy[r, n]·W[m, n]   (ascending n; rows in parallel; may be an empty view)
///   grad_w[m, n] = Σ_r x[r, m]·dy[r, n]   (ascending r = b·S + s; weight rows in parallel)
///   grad_b[n]    = Σ_r dy[r, n]           (ascending r; may be an empty view)
template <PrecisionPolicy Policy, class X, class E, class G, class DX, class DW, class DB>
constexpr void linear_backward_into(tensor_view<const X, 3> x, tensor_view<const E, 2> w, tensor_view<const G, 3> grad_y,
                                    tensor_view<DX, 3> grad_x, tensor_view<DW, 2> grad_w, tensor_view<DB, 1> grad_b,
                                    std::size_t threads, const char* name) {
    using A = projection_type_t<Policy>;
    const std::size_t rows = x.extents[0] * x.extents[1], m = x.extents[2], n = w.extents[1];
    require_extent("weight axis 0 (input features)", w.extents[0], m, name);
    require_extent("output gradient axis 0 (batch)", grad_y.extents[0], x.extents[0], name);
    require_extent("output gradient axis 1 (length)", grad_y.extents[1], x.extents[1], name);
    require_extent("output gradient axis 2 (output features)", grad_y.extents[2], n, name);
    if (!grad_x.empty()) {
        require_extent("input gradient axis 0 (batch)", grad_x.extents[0], x.extents[0], name);
        require_extent("input gradient axis 1 (length)", grad_x.extents[1], x.extents[1], name);
        require_extent("input gradient axis 2 (input features)", grad_x.extents[2], m, name);
    }
    require_extent("weight gradient axis 0 (input features)", grad_w.extents[0], m, name);
    require_extent("weight gradient axis 1 (output features)", grad_w.extents[1], n, name);
    if (!grad_b.empty()) require_extent("bias gradient size (output features)", grad_b.extents[0], n, name);
    if (!grad_x.empty()) {
        auto row = [&](std::size_t r) {
            for (std::size_t a = 0; a < m; ++a) {
                A acc = A(0);
                for (std::size_t c = 0; c < n; ++c) {
                    const A product = convert<A>(grad_y[r * n + c]) * convert<A>(w(a, c));
                    acc = acc + product;
                }
                grad_x[r * m + a] = convert<DX>(acc);
            }
        };
        parallel_for(rows, threads, row, &thread_cleanup<A>::run);
    }
    auto weight_row = [&](std::size_t a) {
        std::vector<A> acc(n, A(0));
        for (std::size_t r = 0; r < rows; ++r) {
            const A xa = convert<A>(x[r * m + a]);
            for (std::size_t c = 0; c < n; ++c) {
                const A product = xa * convert<A>(grad_y[r * n + c]);
                acc[c] = acc[c] + product;
            }
        }
        for (std::size_t c = 0; c < n; ++c) grad_w(a, c) = convert<DW>(acc[c]);
    };
    parallel_for(m, threads, weight_row, &thread_cleanup<A>::run);
    if (!grad_b.empty())
        for (std::size_t c = 0; c < n; ++c) {
            A acc = A(0);
            for (std::size_t r = 0; r < rows; ++r) acc = acc + convert<A>(grad_y[r * n + c]);
            grad_b[c] = convert<DB>(acc);
        }
}

/// Gradients of multi-head attention in the policy's output_type (see the file comment).
template <PrecisionPolicy Policy>
struct mha_gradients {
    using T = typename Policy::output_type;
    tensor<T, 3> grad_x_q, grad_x_k, grad_x_v;
    tensor<T, 2> grad_w_q, grad_w_k, grad_w_v, grad_w_o;
    tensor<T, 1> grad_b_q, grad_b_k, grad_b_v, grad_b_o;
    /// A gradient by its role in problem.hpp's table (grad_query, grad_key, grad_value are those of
    /// x_q, x_k, x_v), flat in C order; empty for any other role.
    constexpr std::span<const T> values(tensor_role r) const {
        auto flat = [](const auto& t) { return std::span<const T>(t.data(), t.size()); };
        switch (r) {
            case tensor_role::grad_query: return flat(grad_x_q);
            case tensor_role::grad_key: return flat(grad_x_k);
            case tensor_role::grad_value: return flat(grad_x_v);
            case tensor_role::grad_w_q: return flat(grad_w_q);
            case tensor_role::grad_w_k: return flat(grad_w_k);
            case tensor_role::grad_w_v: return flat(grad_w_v);
            case tensor_role::grad_w_o: return flat(grad_w_o);
            case tensor_role::grad_b_q: return flat(grad_b_q);
            case tensor_role::grad_b_k: return flat(grad_b_k);
            case tensor_role::grad_b_v: return flat(grad_b_v);
            case tensor_role::grad_b_o: return flat(grad_b_o);
            default: return {};
        }
    }
};

/// Gradients of multi_head_attention given grad_output (B, Sq, Eo).
template <PrecisionPolicy Policy, class X, class E, class G>
constexpr mha_gradients<Policy> multi_head_attention_backward(tensor_view<const X, 3> x_q, tensor_view<const X, 3> x_k,
                                                              tensor_view<const X, 3> x_v, const mha_parameters<E>& p,
                                                              const mha_options& o, tensor_view<const G, 3> grad_output,
                                                              const backward_options& backward = {}) {
    using S = typename Policy::storage_type;
    using T = typename Policy::output_type;
    const mha_dims d = mha_dims_of(x_q, x_k, x_v, p, o);
    require_extent("grad_output axis 0 (batch)", grad_output.extents[0], d.batch);
    require_extent("grad_output axis 1 (query length)", grad_output.extents[1], d.query_length);
    require_extent("grad_output axis 2 (output features)", grad_output.extents[2], d.output_dim);
    const std::size_t threads = o.attention.threads;
    // The forward's intermediates, recomputed as multi_head_attention_into forms them.
    tensor<S, 3> q({d.batch, d.query_length, d.heads * d.head_dim_qk}), k({d.batch, d.key_length, d.kv_heads * d.head_dim_qk}),
        v({d.batch, d.key_length, d.kv_heads * d.head_dim_v});
    linear_into<Policy>(x_q, p.w_q, p.b_q, q.view(), threads, "w_q");
    linear_into<Policy>(x_k, p.w_k, p.b_k, k.view(), threads, "w_k");
    linear_into<Policy>(x_v, p.w_v, p.b_v, v.view(), threads, "w_v");
    const tensor<S, 4> qh = split_heads<S>(q.view(), d.heads), kh = split_heads<S>(k.view(), d.kv_heads),
                       vh = split_heads<S>(v.view(), d.kv_heads);
    tensor<S, 4> heads_out({d.batch, d.heads, d.query_length, d.head_dim_v});
    scaled_dot_product_attention_into<Policy>(qh.view(), kh.view(), vh.view(), o.attention, heads_out.view(),
                                              tensor_view<S, 4>{}, tensor_view<S, 3>{});
    const tensor<S, 3> merged = merge_heads<S>(heads_out.view());

    mha_gradients<Policy> r{
        tensor<T, 3>(x_q.extents), tensor<T, 3>(x_k.extents), tensor<T, 3>(x_v.extents),
        tensor<T, 2>(p.w_q.extents), tensor<T, 2>(p.w_k.extents), tensor<T, 2>(p.w_v.extents), tensor<T, 2>(p.w_o.extents),
        tensor<T, 1>({p.w_q.extents[1]}), tensor<T, 1>({p.w_k.extents[1]}), tensor<T, 1>({p.w_v.extents[1]}),
        tensor<T, 1>({p.w_o.extents[1]})};
    tensor<S, 3> d_merged(merged.extents());
    linear_backward_into<Policy>(merged.view(), p.w_o, grad_output, d_merged.view(), r.grad_w_o.view(), r.grad_b_o.view(),
                                 threads, "w_o");
    const tensor<S, 4> d_heads = split_heads<S>(d_merged.view(), d.heads);
    tensor<S, 4> dqh(qh.extents()), dkh(kh.extents()), dvh(vh.extents());
    scaled_dot_product_attention_backward_into<Policy>(qh.view(), kh.view(), vh.view(), d_heads.view(), o.attention, backward,
                                                       dqh.view(), dkh.view(), dvh.view(), tensor_view<S, 4>{});
    const tensor<S, 3> dq = merge_heads<S>(dqh.view()), dk = merge_heads<S>(dkh.view()), dv = merge_heads<S>(dvh.view());
    linear_backward_into<Policy>(x_q, p.w_q, dq.view(), r.grad_x_q.view(), r.grad_w_q.view(), r.grad_b_q.view(), threads, "w_q");
    linear_backward_into<Policy>(x_k, p.w_k, dk.view(), r.grad_x_k.view(), r.grad_w_k.view(), r.grad_b_k.view(), threads, "w_k");
    // The key bias shifts every logit of a query row by the same q'_i·b_k, which the softmax ignores:
    // ∂L/∂b_k = Σ_j dk'_j = Σ_i q'_i·(s·Σ_j dS_ij) = 0 exactly, since Σ_j dS_ij = D_i − D_i·Σ_j P_ij = 0
    // for every attendable row (any mask, ALiBi, additive or seed offsets, any scale placement) and
    // dS = 0 in empty rows under the zero and uniform policies; under the nan policy an empty row's
    // output is NaN whatever b_k, so the loss does not depend on b_k there either (the NaN that dK
    // carries from such a row is the nan rule's, not a derivative in b_k). Not under soft-capping (tanh
    // breaks the shift invariance). Set structurally from the options, for every arithmetic, as the
    // single-key rule above: the computed sum is rounding noise around an exact 0, which no interval
    // can certify.
    if (!o.attention.softcap)
        for (std::size_t c = 0; c < r.grad_b_k.size(); ++c) r.grad_b_k[c] = T(0);
    linear_backward_into<Policy>(x_v, p.w_v, dv.view(), r.grad_x_v.view(), r.grad_w_v.view(), r.grad_b_v.view(), threads, "w_v");
    return r;
}

/// Everything in T.
template <Scalar T>
constexpr mha_gradients<uniform_precision<T>> multi_head_attention_backward(const tensor<T, 3>& x_q, const tensor<T, 3>& x_k,
                                                                           const tensor<T, 3>& x_v, const mha_parameters<T>& p,
                                                                           const mha_options& o, const tensor<T, 3>& grad_output,
                                                                           const backward_options& backward = {}) {
    return multi_head_attention_backward<uniform_precision<T>, T, T, T>(x_q.view(), x_k.view(), x_v.view(), p, o,
                                                                        grad_output.view(), backward);
}

/// Fixed shapes (fixed_shape.hpp): gradients of SDPA as literal types, for constant evaluation.
template <class T, sdpa_shape S>
    requires(S.valid())
struct fixed_sdpa_gradients {
    fixed_tensor<T, S.batch, S.heads, S.query_length, S.head_dim_qk> grad_query;
    fixed_tensor<T, S.batch, S.kv_heads, S.key_length, S.head_dim_qk> grad_key;
    fixed_tensor<T, S.batch, S.kv_heads, S.key_length, S.head_dim_v> grad_value;
    fixed_tensor<T, S.batch, S.heads, S.query_length, S.key_length> grad_logits;
};

template <class T, sdpa_shape S>
    requires(S.valid())
constexpr fixed_sdpa_gradients<T, S> scaled_dot_product_attention_backward(
    const fixed_sdpa_inputs<T, S>& in, const fixed_tensor<T, S.batch, S.heads, S.query_length, S.head_dim_v>& grad_output,
    const attention_options& options = {}, const backward_options& backward = {}) {
    fixed_sdpa_gradients<T, S> r{};
    scaled_dot_product_attention_backward_into<uniform_precision<T>>(in.q.view(), in.k.view(), in.v.view(), grad_output.view(),
                                                                     options, backward, r.grad_query.view(), r.grad_key.view(),
                                                                     r.grad_value.view(), r.grad_logits.view());
    return r;
}

template <class T, mha_shape S>
    requires(S.valid())
struct fixed_mha_gradients {
    fixed_tensor<T, S.batch, S.query_length, S.model_dim> grad_x_q;
    fixed_tensor<T, S.batch, S.key_length, S.model_dim> grad_x_k, grad_x_v;
    fixed_tensor<T, S.model_dim, S.heads * S.head_dim_qk> grad_w_q;
    fixed_tensor<T, S.model_dim, S.kv_heads * S.head_dim_qk> grad_w_k;
    fixed_tensor<T, S.model_dim, S.kv_heads * S.head_dim_v> grad_w_v;
    fixed_tensor<T, S.heads * S.head_dim_v, S.model_dim> grad_w_o;
    fixed_tensor<T, S.heads * S.head_dim_qk> grad_b_q;
    fixed_tensor<T, S.kv_heads * S.head_dim_qk> grad_b_k;
    fixed_tensor<T, S.kv_heads * S.head_dim_v> grad_b_v;
    fixed_tensor<T, S.model_dim> grad_b_o;
};

/// Gradients of the fixed-shape multi_head_attention (fixed_shape.hpp) given grad_output.
template <class T, mha_shape S>
    requires(S.valid())
constexpr fixed_mha_gradients<T, S> multi_head_attention_backward(
    const fixed_mha_inputs<T, S>& in, const fixed_tensor<T, S.batch, S.query_length, S.model_dim>& grad_output,
    const attention_options& options = {}, const backward_options& backward = {}) {
    const mha_options o{S.heads, S.kv_heads, options};
    const mha_gradients<uniform_precision<T>> g = multi_head_attention_backward<uniform_precision<T>, T, T, T>(
        in.x_q.view(), in.x_k.view(), in.x_v.view(), in.parameters(), o, grad_output.view(), backward);
    fixed_mha_gradients<T, S> r{};
    auto copy = [](const auto& from, auto& to) {
        for (std::size_t n = 0; n < to.values.size(); ++n) to.values[n] = from[n];
    };
    copy(g.grad_x_q, r.grad_x_q);
    copy(g.grad_x_k, r.grad_x_k);
    copy(g.grad_x_v, r.grad_x_v);
    copy(g.grad_w_q, r.grad_w_q);
    copy(g.grad_w_k, r.grad_w_k);
    copy(g.grad_w_v, r.grad_w_v);
    copy(g.grad_w_o, r.grad_w_o);
    copy(g.grad_b_q, r.grad_b_q);
    copy(g.grad_b_k, r.grad_b_k);
    copy(g.grad_b_v, r.grad_b_v);
    copy(g.grad_b_o, r.grad_b_o);
    return r;
}

}  // namespace attnref
