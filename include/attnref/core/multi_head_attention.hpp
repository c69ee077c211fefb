#pragma once
/// \file core/multi_head_attention.hpp
/// Multi-head attention: projections, head split, scaled dot-product attention, head merge, output
/// projection. Weights are in the seed chapter's layout, y = x·W + b:
///
///   x_q (B, Sq, Eq) · W_q (Eq, H·dk)   + b_q (H·dk)   → Q (B, Sq, H·dk)  → split → (B, H, Sq, dk)
///   x_k (B, Sk, Ek) · W_k (Ek, Hkv·dk) + b_k (Hkv·dk) → K (B, Sk, Hkv·dk) → split → (B, Hkv, Sk, dk)
///   x_v (B, Sk, Ev) · W_v (Ev, Hkv·dv) + b_v (Hkv·dv) → V (B, Sk, Hkv·dv) → split → (B, Hkv, Sk, dv)
///   attention (attention.hpp) → per-head outputs (B, H, Sq, dv) → merge → (B, Sq, H·dv)
///   · W_o (H·dv, Eo) + b_o (Eo) → output (B, Sq, Eo)
///
/// Head h owns feature columns [h·dk, (h+1)·dk) (split_heads), as the seed's reshape and PyTorch's
/// view(…, H, head_dim) do. PyTorch nn.MultiheadAttention: in_proj_weight = [W_qᵀ; W_kᵀ; W_vᵀ]
/// (so W_q = in_proj_weight[0:E]ᵀ), in_proj_bias = [b_q; b_k; b_v], out_proj.weight = W_oᵀ,
/// out_proj.bias = b_o. Each projection sums over the input features in ascending order from +0,
/// then adds the bias; projected tensors are rounded to the policy's storage_type, as a framework
/// materialises them.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/core/attention.hpp"
#include "attnref/core/parallel.hpp"
#include "attnref/core/precision.hpp"
#include "attnref/core/tensor.hpp"

namespace attnref {

/// Projection weights and optional biases (an empty bias view means no bias).
template <class E>
struct mha_parameters {
    tensor_view<const E, 2> w_q, w_k, w_v, w_o;
    tensor_view<const E, 1> b_q{}, b_k{}, b_v{}, b_o{};
};

struct mha_options {
    std::size_t heads = 1;
    std::size_t kv_heads = 0;  ///< 0 = heads (plain MHA); 1 = MQA; else GQA, heads % kv_heads == 0
    attention_options attention{};
};

/// (B, S, H·d) → (B, H, S, d): head h takes feature columns [h·d, (h+1)·d). Exact (a copy).
template <class T>
constexpr tensor<T, 4> split_heads(tensor_view<const T, 3> x, std::size_t heads) {
    const std::size_t batch = x.extents[0], length = x.extents[1], features = x.extents[2];
    if (heads == 0 || features % heads != 0)
        throw shape_error("split_heads axis 2 (features): expected a multiple of the head count " + std::to_string(heads) +
                          ", got " + std::to_string(features));
    const std::size_t d = features / heads;
    tensor<T, 4> y({batch, heads, length, d});
    // Contiguous runs of d elements through raw pointers (cheap in the constant evaluator too).
    T* out = y.data();
    for (std::size_t b = 0; b < batch; ++b)
        for (std::size_t h = 0; h < heads; ++h)
            for (std::size_t s = 0; s < length; ++s) {
                const T* in = x.data + (b * length + s) * features + h * d;
                for (std::size_t c = 0; c < d; ++c) out[c] = in[c];
                out += d;
            }
    return y;
}

/// (B, H, S, d) → (B, S, H·d), the inverse of split_heads. Exact (a copy).
template <class T>
constexpr tensor<T, 3> merge_heads(tensor_view<const T, 4> x) {
    const std::size_t batch = x.extents[0], heads = x.extents[1], length = x.extents[2], d = x.extents[3];
    tensor<T, 3> y({batch, length, heads * d});
    const T* in = x.data;
    for (std::size_t b = 0; b < batch; ++b)
        for (std::size_t h = 0; h < heads; ++h)
            for (std::size_t s = 0; s < length; ++s) {
                T* out = y.data() + (b * length + s) * heads * d + h * d;
                for (std::size_t c = 0; c < d; ++c) out[c] = in[c];
                in += d;
            }
    return y;
}

/// x86-64 with GCC or Clang, not the sanitizer build: linear_into's double path has an AVX2 copy.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(ATTNREF_SANITIZE_BUILD)
#define ATTNREF_LINEAR_AVX2 1
#endif

namespace linear_detail {
/// The double projection of linear_into outside constant evaluation: the same operations in the same
/// order for every element (acc_j = +0, then acc_j = acc_j + x_k·W_kj for k ascending, then + b_j,
/// no contraction), computed `block` rows at a time so that each row of W is read once per block
/// instead of once per row, with the accumulators of a block of columns in cache and the column loop
/// in vector registers (lanes are distinct outputs). x86-64 builds with GCC or Clang also compile it
/// for AVX2 and take that copy when the processor has AVX2; neither copy uses FMA, so no bit
/// depends on the choice (tests/runtime/multi_head_attention.test.cpp compares it with the generic loop).
inline constexpr std::size_t block_rows = 4, block_cols = 512;

/// a[j] = a[j] + xk·w[j], j < n.
inline void axpy(double* __restrict a, const double* __restrict w, double xk, std::size_t n) {
    std::size_t j = 0;
#if defined(__GNUC__) || defined(__clang__)
    typedef double v4 __attribute__((vector_size(32), aligned(alignof(double)), may_alias));
    const v4 xv = {xk, xk, xk, xk};
    for (; j + 8 <= n; j += 8) {
        v4 a0 = *reinterpret_cast<const v4*>(a + j), a1 = *reinterpret_cast<const v4*>(a + j + 4);
        a0 = a0 + xv * *reinterpret_cast<const v4*>(w + j);
        a1 = a1 + xv * *reinterpret_cast<const v4*>(w + j + 4);
        *reinterpret_cast<v4*>(a + j) = a0;
        *reinterpret_cast<v4*>(a + j + 4) = a1;
    }
#endif
    for (; j < n; ++j) a[j] = a[j] + xk * w[j];
}

/// Rows rows[0..nr) of y = x·W + b (x: m features per row, W: m × n, bias: n or null).
inline void rows_block(const double* x, const double* w, const double* bias, double* y, const std::size_t* rows, std::size_t nr,
                       std::size_t m, std::size_t n, double* acc) {
    for (std::size_t j0 = 0; j0 < n; j0 += block_cols) {
        const std::size_t nc = std::min(block_cols, n - j0);
        for (std::size_t r = 0; r < nr; ++r)
            for (std::size_t j = 0; j < nc; ++j) acc[r * block_cols + j] = 0.0;
        for (std::size_t k = 0; k < m; ++k)
            for (std::size_t r = 0; r < nr; ++r) axpy(acc + r * block_cols, w + k * n + j0, x[rows[r] * m + k], nc);
        for (std::size_t r = 0; r < nr; ++r) {
            double* yr = y + rows[r] * n + j0;
            const double* a = acc + r * block_cols;
            for (std::size_t j = 0; j < nc; ++j) yr[j] = bias ? a[j] + bias[j0 + j] : a[j];
        }
    }
}

#ifdef ATTNREF_LINEAR_AVX2
__attribute__((target("avx2"), flatten)) inline void rows_block_avx2(const double* x, const double* w, const double* bias, double* y,
                                                                      const std::size_t* rows, std::size_t nr, std::size_t m,
                                                                      std::size_t n, double* acc) {
    rows_block(x, w, bias, y, rows, nr, m, n, acc);
}
/// Whether rows_block_avx2 may run (asked once); tests turn it off to compare the two copies.
inline std::atomic<bool>& avx2_allowed() {
    static std::atomic<bool> allowed{true};
    return allowed;
}
inline bool use_avx2() {
    static const bool has = [] {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") != 0;
    }();
    return has && avx2_allowed().load(std::memory_order_relaxed);
}
#endif

inline void project(const double* x, const double* w, const double* bias, double* y, std::size_t rows, std::size_t m, std::size_t n,
                    std::size_t threads, std::span<const std::uint8_t> row_filter) {
    // Blocks of the selected rows, in order; a block's rows are computed alone, whatever the split.
    std::vector<std::size_t> selected;
    selected.reserve(row_filter.empty() ? rows : 0);
    for (std::size_t r = 0; r < rows; ++r)
        if (row_filter.empty() || row_filter[r]) selected.push_back(r);
    const std::size_t blocks = (selected.size() + block_rows - 1) / block_rows;
    parallel_for(blocks, threads, [&](std::size_t b) {
        thread_local std::vector<double> acc;
        acc.resize(block_rows * block_cols);
        const std::size_t r0 = b * block_rows, nr = std::min(block_rows, selected.size() - r0);
#ifdef ATTNREF_LINEAR_AVX2
        if (use_avx2()) return rows_block_avx2(x, w, bias, y, selected.data() + r0, nr, m, n, acc.data());
#endif
        rows_block(x, w, bias, y, selected.data() + r0, nr, m, n, acc.data());
    });
}
}  // namespace linear_detail

/// y (B, S, N) = x (B, S, M) · W (M, N) + bias (N): sums over M ascending from +0 in the policy's
/// projection type (default: its accumulate type), then adds the bias, then rounds to Y. Rows run in
/// parallel.
/// `row_filter` (B·S flags, or empty for all): rows not selected are not written.
///
/// The loops walk contiguous storage through raw pointers with precomputed row offsets: this one
/// loop is what both the compiler and the constant evaluator run, and the evaluator pays for every
/// call, view and index computation per multiply-add (docs/compile-time.md). W is converted to the
/// projection type once per call (not once per row) when its element type differs; the values are
/// the same.
template <PrecisionPolicy Policy, class X, class E, class Y>
constexpr void linear_into(tensor_view<const X, 3> x, tensor_view<const E, 2> w, tensor_view<const E, 1> bias,
                           tensor_view<Y, 3> y, std::size_t threads, const char* name,
                           std::span<const std::uint8_t> row_filter = {}) {
    using A = projection_type_t<Policy>;
    const std::size_t rows = x.extents[0] * x.extents[1], m = x.extents[2], n = w.extents[1];
    require_extent("weight axis 0 (input features)", w.extents[0], m, name);
    if (!bias.empty()) require_extent("bias size (output features)", bias.extents[0], n, name);
    std::vector<A> w_converted;
    const A* wa = nullptr;
    if constexpr (std::is_same_v<E, A>) {
        wa = w.data;
    } else {
        w_converted.reserve(m * n);
        for (std::size_t e = 0; e < m * n; ++e) w_converted.push_back(convert<A>(w.data[e]));
        wa = w_converted.data();
    }
    if constexpr (std::is_same_v<A, double> && std::is_same_v<X, double> && std::is_same_v<E, double> && std::is_same_v<Y, double>) {
        if (!std::is_constant_evaluated()) {
            linear_detail::project(x.data, wa, bias.empty() ? nullptr : bias.data, y.data, rows, m, n, threads, row_filter);
            return;
        }
    }
    auto row = [&](std::size_t r) {
        if (!row_filter.empty() && !row_filter[r]) return;
        std::vector<A> acc_storage(n, A(0));
        A* acc = acc_storage.data();
        const X* xr = x.data + r * m;
        const std::size_t cols = n;  // a local: the constant evaluator reads a capture at greater cost
        for (std::size_t k = 0; k < m; ++k) {  // i-k-j order: W's rows are contiguous; each acc[j] still sums k ascending
            const A xk = convert<A>(xr[k]);
            const A* w_row = wa + k * cols;
            A* a = acc;
            // Four columns per iteration, through pointers bumped once: the constant evaluator spends
            // less per multiply-add on fewer loop steps and index computations (docs/compile-time.md).
            std::size_t j = 0;
            for (; j + 4 <= cols; j += 4, a += 4, w_row += 4) {
                a[0] = a[0] + xk * w_row[0];
                a[1] = a[1] + xk * w_row[1];
                a[2] = a[2] + xk * w_row[2];
                a[3] = a[3] + xk * w_row[3];
            }
            for (; j < cols; ++j, ++a, ++w_row) a[0] = a[0] + xk * w_row[0];
        }
        Y* yr = y.data + r * n;
        for (std::size_t j = 0; j < n; ++j) {
            if (!bias.empty()) acc[j] = acc[j] + convert<A>(bias.data[j]);
            yr[j] = convert<Y>(acc[j]);
        }
    };
    parallel_for(rows, threads, row, &thread_cleanup<A>::run);
}

/// Sizes of a multi-head attention call, read off the inputs and checked.
struct mha_dims {
    std::size_t batch, query_length, key_length, heads, kv_heads, head_dim_qk, head_dim_v, output_dim;
};

template <class X, class E>
constexpr mha_dims mha_dims_of(tensor_view<const X, 3> x_q, tensor_view<const X, 3> x_k, tensor_view<const X, 3> x_v,
                               const mha_parameters<E>& p, const mha_options& o) {
    const std::size_t heads = o.heads, kv = o.kv_heads == 0 ? o.heads : o.kv_heads;
    if (heads == 0) throw shape_error("heads: expected at least 1, got 0");
    if (heads % kv != 0)
        throw shape_error("kv_heads: expected a divisor of heads " + std::to_string(heads) + ", got " + std::to_string(kv));
    require_extent("key input axis 0 (batch)", x_k.extents[0], x_q.extents[0]);
    require_extent("value input axis 0 (batch)", x_v.extents[0], x_q.extents[0]);
    require_extent("value input axis 1 (key length)", x_v.extents[1], x_k.extents[1]);
    if (p.w_q.extents[1] % heads != 0)
        throw shape_error("w_q axis 1 (heads·dk): expected a multiple of heads " + std::to_string(heads) + ", got " +
                          std::to_string(p.w_q.extents[1]));
    const std::size_t dk = p.w_q.extents[1] / heads;
    require_extent("w_k axis 1 (kv_heads·dk)", p.w_k.extents[1], kv * dk);
    if (p.w_v.extents[1] % kv != 0)
        throw shape_error("w_v axis 1 (kv_heads·dv): expected a multiple of kv_heads " + std::to_string(kv) + ", got " +
                          std::to_string(p.w_v.extents[1]));
    const std::size_t dv = p.w_v.extents[1] / kv;
    require_extent("w_o axis 0 (heads·dv)", p.w_o.extents[0], heads * dv);
    return {x_q.extents[0], x_q.extents[1], x_k.extents[1], heads, kv, dk, dv, p.w_o.extents[1]};
}

/// Multi-head attention into caller-provided views. `weights` (B, H, Sq, Sk), `lse` (B, H, Sq) and
/// `head_outputs` (B, H, Sq, dv: each head's output before W_o) may be empty views.
template <PrecisionPolicy Policy, class X, class E, class O, class W, class L, class HO>
constexpr void multi_head_attention_into(tensor_view<const X, 3> x_q, tensor_view<const X, 3> x_k,
                                         tensor_view<const X, 3> x_v, const mha_parameters<E>& p,
                                         const mha_options& o, tensor_view<O, 3> out, tensor_view<W, 4> weights,
                                         tensor_view<L, 3> lse, tensor_view<HO, 4> head_outputs) {
    using S = typename Policy::storage_type;
    if (!std::is_constant_evaluated()) require_reference_fp_environment();  // see fp_environment.hpp
    const mha_dims d = mha_dims_of(x_q, x_k, x_v, p, o);
    require_extent("output axis 0 (batch)", out.extents[0], d.batch);
    require_extent("output axis 1 (query length)", out.extents[1], d.query_length);
    require_extent("output axis 2 (output features)", out.extents[2], d.output_dim);
    const std::size_t threads = o.attention.threads;
    // o.attention.rows (B, H, Sq), if given: output row (b, i) needs every head of query row i, so a
    // query row is computed (all heads, its Q and W_o projections) when any of its heads is selected.
    std::vector<std::uint8_t> query_rows, head_rows;
    attention_options ao = o.attention;
    if (!o.attention.rows.empty()) {
        require_extent("rows size (batch·heads·query length)", o.attention.rows.size(), d.batch * d.heads * d.query_length);
        query_rows.assign(d.batch * d.query_length, 0);
        for (std::size_t b = 0; b < d.batch; ++b)
            for (std::size_t h = 0; h < d.heads; ++h)
                for (std::size_t i = 0; i < d.query_length; ++i)
                    if (o.attention.rows[(b * d.heads + h) * d.query_length + i]) query_rows[b * d.query_length + i] = 1;
        head_rows.assign(o.attention.rows.size(), 0);
        for (std::size_t b = 0; b < d.batch; ++b)
            for (std::size_t h = 0; h < d.heads; ++h)
                for (std::size_t i = 0; i < d.query_length; ++i)
                    head_rows[(b * d.heads + h) * d.query_length + i] = query_rows[b * d.query_length + i];
        ao.rows = head_rows;
    }
    tensor<S, 3> q({d.batch, d.query_length, d.heads * d.head_dim_qk}), k({d.batch, d.key_length, d.kv_heads * d.head_dim_qk}),
        v({d.batch, d.key_length, d.kv_heads * d.head_dim_v});
    linear_into<Policy>(x_q, p.w_q, p.b_q, q.view(), threads, "w_q", query_rows);
    linear_into<Policy>(x_k, p.w_k, p.b_k, k.view(), threads, "w_k");
    linear_into<Policy>(x_v, p.w_v, p.b_v, v.view(), threads, "w_v");
    const tensor<S, 4> qh = split_heads<S>(q.view(), d.heads), kh = split_heads<S>(k.view(), d.kv_heads),
                       vh = split_heads<S>(v.view(), d.kv_heads);
    tensor<S, 4> heads_out({d.batch, d.heads, d.query_length, d.head_dim_v});
    scaled_dot_product_attention_into<Policy>(qh.view(), kh.view(), vh.view(), ao, heads_out.view(), weights, lse);
    if (!head_outputs.empty())
        for (std::size_t n = 0; n < heads_out.size(); ++n) head_outputs[n] = convert<HO>(heads_out[n]);
    const tensor<S, 3> merged = merge_heads<S>(heads_out.view());
    linear_into<Policy>(merged.view(), p.w_o, p.b_o, out, threads, "w_o", query_rows);
}

/// The logits S (B, H, Sq, Sk) multi-head attention feeds its softmax: the query and key
/// projections split into heads, then attention_logits, all in Policy.
template <PrecisionPolicy Policy, class X, class E>
constexpr tensor<logits_type_t<Policy>, 4> mha_logits(tensor_view<const X, 3> x_q, tensor_view<const X, 3> x_k,
                                                      const mha_parameters<E>& p, const mha_options& o) {
    using S = typename Policy::storage_type;
    tensor<S, 3> q({x_q.extents[0], x_q.extents[1], p.w_q.extents[1]}), k({x_k.extents[0], x_k.extents[1], p.w_k.extents[1]});
    linear_into<Policy>(x_q, p.w_q, p.b_q, q.view(), o.attention.threads, "w_q");
    linear_into<Policy>(x_k, p.w_k, p.b_k, k.view(), o.attention.threads, "w_k");
    const tensor<S, 4> qh = split_heads<S>(q.view(), o.heads), kh = split_heads<S>(k.view(), o.kv_heads == 0 ? o.heads : o.kv_heads);
    return attention_logits<Policy>(tensor_view<const S, 4>(qh.view()), tensor_view<const S, 4>(kh.view()), o.attention);
}

/// Result of multi_head_attention: output (B, Sq, Eo), weights (B, H, Sq, Sk), lse (B, H, Sq),
/// head_outputs (B, H, Sq, dv).
template <PrecisionPolicy Policy>
struct mha_result {
    tensor<typename Policy::output_type, 3> output;
    tensor<typename Policy::weights_type, 4> weights;
    tensor<typename Policy::accumulate_type, 3> lse;
    tensor<typename Policy::storage_type, 4> head_outputs;
};

template <PrecisionPolicy Policy, class X, class E>
constexpr mha_result<Policy> multi_head_attention(tensor_view<const X, 3> x_q, tensor_view<const X, 3> x_k,
                                                  tensor_view<const X, 3> x_v, const mha_parameters<E>& p,
                                                  const mha_options& o) {
    const mha_dims d = mha_dims_of(x_q, x_k, x_v, p, o);
    mha_result<Policy> r{tensor<typename Policy::output_type, 3>({d.batch, d.query_length, d.output_dim}),
                         tensor<typename Policy::weights_type, 4>({d.batch, d.heads, d.query_length, d.key_length}),
                         tensor<typename Policy::accumulate_type, 3>({d.batch, d.heads, d.query_length}),
                         tensor<typename Policy::storage_type, 4>({d.batch, d.heads, d.query_length, d.head_dim_v})};
    multi_head_attention_into<Policy>(x_q, x_k, x_v, p, o, r.output.view(), r.weights.view(), r.lse.view(),
                                      r.head_outputs.view());
    return r;
}

/// Everything in T.
template <Scalar T>
constexpr mha_result<uniform_precision<T>> multi_head_attention(const tensor<T, 3>& x_q, const tensor<T, 3>& x_k,
                                                               const tensor<T, 3>& x_v, const mha_parameters<T>& p,
                                                               const mha_options& o) {
    return multi_head_attention<uniform_precision<T>, T, T>(x_q.view(), x_k.view(), x_v.view(), p, o);
}

}  // namespace attnref
