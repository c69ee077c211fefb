#pragma once
/// \file core/attention.hpp
/// Scaled dot-product attention for one batch of heads.
///
///   q (B, H, Sq, dk)      k (B, Hkv, Sk, dk)      v (B, Hkv, Sk, dv)       query head h reads kv head
///        │                     │                       │                   h / (H / Hkv)  (GQA, MQA;
///        │  scale placement:   │                       │                   PyTorch enable_gqa, ONNX)
///        │  on_query: q·s      │  split_sqrt: k·√s      │
///        │  split_sqrt: q·√s   │                       │
///        └──────── S = q·kᵀ ───┘  (dot products in ascending d, from +0)
///                   │  on_product: S·s
///                   │  softcap: cap·tanh(S / cap)          before any mask, so −inf stays −inf
///                   │  ALiBi: − slope_h·|diagonal(i) − j|
///                   │  additive mask: + A(b,h,i,j)         −inf excludes the key
///                   │  seed mask: + M(b,h,i,j)·(−1e9)
///                   │  structural masks (causal, window, key padding, boolean): key excluded
///                   ▼
///        softmax row by row (softmax.hpp) ──► P (B, H, Sq, Sk), lse (B, H, Sq)
///                   │  P rounded to the policy's weights_type
///                   ▼
///        O = P·V (ascending j, from +0)   ──► out (B, H, Sq, dv)
///   online softmax instead accumulates O block by block with FlashAttention's rescaling and
///   divides by the running sum at the end (key blocks forward or in reverse, softmax.hpp).
///   Kernel models (kernel_models.hpp): logits rounded to the policy's logits_storage_type before the
///   softmax (materialised S); P·S rounded instead of P and O divided by S for a static scale S.
///
/// Arithmetic per stage (precision.hpp): logits in the policy's logits_type, softmax in its
/// softmax_type, P·V in its values_type (all default to accumulate_type); inputs are converted once.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/core/fp_environment.hpp"
#include "attnref/core/kernel_models.hpp"
#include "attnref/core/mask.hpp"
#include "attnref/core/math.hpp"
#include "attnref/core/name_table.hpp"
#include "attnref/core/parallel.hpp"
#include "attnref/core/precision.hpp"
#include "attnref/core/softmax.hpp"
#include "attnref/core/tensor.hpp"

namespace attnref {

/// Where the scale s multiplies. Equal in exact arithmetic; each rounds differently.
enum class scale_placement {
    on_product,  ///< (q·k)·s: the seed chapter, PyTorch's documented formula, cuDNN     [default]
    on_query,    ///< (s·q)·k: FlashAttention
    split_sqrt,  ///< (√s·q)·(√s·k): PyTorch's math backend, ONNX Attention
};
/// The names of the scale placements (golden manifests, the CLI, the Python keywords, studies), for
/// name_in / value_in (name_table.hpp).
inline constexpr std::pair<const char*, scale_placement> scale_placement_names[] = {
    {"on_product", scale_placement::on_product}, {"on_query", scale_placement::on_query}, {"split_sqrt", scale_placement::split_sqrt}};

/// Every convention of one attention call. The defaults are the seed chapter's formula with the
/// conventions most libraries share; README.md maps each field to PyTorch, ONNX and FlashAttention.
struct attention_options {
    std::optional<double> scale;  ///< nullopt: 1/√dk computed in the accumulate type
    scale_placement placement = scale_placement::on_product;
    std::optional<double> softcap;           ///< logits → cap·tanh(logits/cap)
    std::span<const double> alibi_slopes{};  ///< one per query head; empty = no ALiBi
    mask_options mask{};
    softmax_options softmax{};  ///< algorithm, online block size, empty-row policy
    std::size_t threads = 0;    ///< 0 = all hardware threads; results do not depend on it
    /// Query rows to compute: flags (B, H, Sq) in C order, or empty for all rows. A row that is not
    /// selected is not written (its output, weights and lse keep what the caller's views hold); the
    /// rows that are computed get exactly the values of a full call (each row is independent).
    /// Certification uses it to recompute only the rows holding undecided elements.
    std::span<const std::uint8_t> rows{};
    /// Optional observer, (B, H, Sq, Sk) in C order or empty: the weight each key's value row was
    /// multiplied by in P·V, as the kernel rounded it (weights_type, times S for a scaled cast;
    /// online softmax: the block's unnormalised exp(x_j − m)), as double. Keys not accumulated are not
    /// written. For precision studies (e.g. counting the weights an FP8 cast flushes to zero).
    std::span<double> pv_weights{};
};

/// Sizes of one attention call, read off the views and checked.
struct attention_dims {
    std::size_t batch, heads, kv_heads, query_length, key_length, head_dim_qk, head_dim_v;
};

/// The logit stage S = scale·q·kᵀ (+ ALiBi, soft-capping, masks), one row at a time, and the sizes
/// and scale it needs: shared by the forward pass (below), the backward pass (backward.hpp), the
/// error bounds (bounds/) and the fast certified path (certify/fast/), so the stage is defined once.
namespace logit_stage {

/// Sizes read off q (B, H, Sq, dk) and k (B, Hkv, Sk, dk); head_dim_v is left 0.
template <class Q, class K>
constexpr attention_dims attention_dims_of(tensor_view<const Q, 4> q, tensor_view<const K, 4> k) {
    const attention_dims d{q.extents[0], q.extents[1], k.extents[1], q.extents[2], k.extents[2], q.extents[3], 0};
    require_extent("key axis 0 (batch)", k.extents[0], d.batch);
    require_extent("key axis 3 (head dim dk)", k.extents[3], d.head_dim_qk);
    if (d.kv_heads == 0 || d.heads % d.kv_heads != 0)
        throw shape_error("key axis 1 (kv heads): expected a divisor of the query heads " + std::to_string(d.heads) +
                          ", got " + std::to_string(d.kv_heads));
    return d;
}

/// Sizes of a full call: q, k as above and v (B, Hkv, Sk, dv).
template <class Q, class K, class V>
constexpr attention_dims attention_dims_of(tensor_view<const Q, 4> q, tensor_view<const K, 4> k,
                                           tensor_view<const V, 4> v) {
    attention_dims d = attention_dims_of(q, k);
    require_extent("value axis 0 (batch)", v.extents[0], d.batch);
    require_extent("value axis 1 (kv heads)", v.extents[1], d.kv_heads);
    require_extent("value axis 2 (key length)", v.extents[2], d.key_length);
    d.head_dim_v = v.extents[3];
    return d;
}

/// The logit scale s a call uses: options.scale, or 1/√dk computed in A.
template <class A>
constexpr A logit_scale(const attention_options& options, std::size_t head_dim_qk) {
    return options.scale ? A(*options.scale) : A(1) / math::sqrt(A(static_cast<int>(head_dim_qk)));
}

/// Logits row i of one head: s_j for attendable keys, and the attendable flags.
template <class A>
struct logits_context {
    const attention_options* options;
    attention_dims dims;
    A scale;        ///< s: the given scale, or 1/√dk computed in A
    A softcap;      ///< only read when options->softcap
    A alibi_slope;  ///< only read when ALiBi is on
};

template <class A>
constexpr logits_context<A> make_logits_context(const attention_options& options, const attention_dims& d, std::size_t h) {
    const A scale = logit_scale<A>(options, d.head_dim_qk);
    return {&options, d, scale, options.softcap ? A(*options.softcap) : A(1),
            options.alibi_slopes.empty() ? A(0) : A(options.alibi_slopes[h])};
}

template <class A>
constexpr void logits_row(const logits_context<A>& ctx, std::size_t b, std::size_t h, std::size_t i,
                          std::span<const A> q_row, std::span<const A> k_head, std::span<A> logits,
                          std::span<std::uint8_t> allowed) {
    const attention_options& opt = *ctx.options;
    const std::size_t dk = ctx.dims.head_dim_qk;
    const std::size_t sq = ctx.dims.query_length, sk = ctx.dims.key_length;
    const A seed_factor = A(seed_mask_value);
    const A* q = q_row.data();
    for (std::size_t j = 0; j < sk; ++j) allowed[j] = !structurally_masked(opt.mask, b, h, i, j, sq, sk);
    // The dot products q·k_j, each summed from +0 over c in order. For a built-in floating type at
    // run time, eight keys at a time: eight independent sums (the same operations, in the same order,
    // for every key), so the adds' latency overlaps instead of adding up key after key.
    std::size_t j0 = 0;
    if constexpr (std::is_floating_point_v<A>) {
        if (!std::is_constant_evaluated()) {
            constexpr std::size_t group = 8;
            for (; j0 + group <= sk; j0 += group) {
                bool any = false;
                for (std::size_t g = 0; g < group; ++g) any = any || allowed[j0 + g];
                if (!any) continue;
                // Eight named sums (not an array: kept in registers, not stored and reloaded per c).
                A s0 = A(0), s1 = A(0), s2 = A(0), s3 = A(0), s4 = A(0), s5 = A(0), s6 = A(0), s7 = A(0);
                const A* k0 = k_head.data() + j0 * dk;
                for (std::size_t c = 0; c < dk; ++c) {
                    const A qc = q[c];
                    s0 = s0 + qc * k0[c], s1 = s1 + qc * k0[dk + c], s2 = s2 + qc * k0[2 * dk + c], s3 = s3 + qc * k0[3 * dk + c];
                    s4 = s4 + qc * k0[4 * dk + c], s5 = s5 + qc * k0[5 * dk + c], s6 = s6 + qc * k0[6 * dk + c], s7 = s7 + qc * k0[7 * dk + c];
                }
                const A sum[group] = {s0, s1, s2, s3, s4, s5, s6, s7};
                for (std::size_t g = 0; g < group; ++g)
                    if (allowed[j0 + g]) logits[j0 + g] = sum[g];
            }
        }
    }
    for (std::size_t j = j0; j < sk; ++j) {
        if (!allowed[j]) continue;
        A s = A(0);
        const A* kj = k_head.data() + j * dk;
        for (std::size_t c = 0; c < dk; ++c) s = s + q[c] * kj[c];
        logits[j] = s;
    }
    for (std::size_t j = 0; j < sk; ++j) {
        if (!allowed[j]) continue;
        A s = logits[j];
        if (opt.placement == scale_placement::on_product) s = s * ctx.scale;
        if (opt.softcap) {
            const A ratio = s / ctx.softcap;
            const A t = math::tanh(ratio);
            s = ctx.softcap * t;
        }
        if (!opt.alibi_slopes.empty()) {
            const A bias = ctx.alibi_slope * A(alibi_distance(opt.mask, i, j, sq, sk));
            s = s - bias;
        }
        if (opt.mask.additive.present()) s = s + A(opt.mask.additive.at(b, h, i, j));
        if (opt.mask.seed.present()) {
            const A offset = A(opt.mask.seed.at(b, h, i, j)) * seed_factor;
            s = s + offset;
        }
        logits[j] = s;
    }
}

/// Converts query head h and kv head hk to A once, applying the scale where the placement says:
/// on_query q·s; split_sqrt q·√s and k·√s; on_product neither (the product is scaled later).
template <class A, class Q, class K>
constexpr void convert_head_inputs(const attention_options& options, const A& scale, tensor_view<const Q, 4> q,
                                   tensor_view<const K, 4> k, std::size_t b, std::size_t h, std::size_t hk,
                                   std::vector<A>& qh, std::vector<A>& kh) {
    const std::size_t sq = q.extents[2], sk = k.extents[2], dk = q.extents[3];
    A q_factor = A(1), k_factor = A(1);
    if (options.placement == scale_placement::on_query) q_factor = scale;
    if (options.placement == scale_placement::split_sqrt) q_factor = k_factor = math::sqrt(scale);
    // Head (b, h) of q is sq·dk contiguous elements, as is head (b, hk) of k (sk·dk).
    const Q* qs = q.data + q.offset(b, h, 0, 0);
    const K* ks = k.data + k.offset(b, hk, 0, 0);
    A* qd = qh.data();
    A* kd = kh.data();
    for (std::size_t e = 0; e < sq * dk; ++e) {
        qd[e] = convert<A>(qs[e]);
        if (options.placement != scale_placement::on_product) qd[e] = qd[e] * q_factor;
    }
    for (std::size_t e = 0; e < sk * dk; ++e) {
        kd[e] = convert<A>(ks[e]);
        if (options.placement == scale_placement::split_sqrt) kd[e] = kd[e] * k_factor;
    }
}

}  // namespace logit_stage

/// One query row's softmax and weighted sum of the value rows, as the forward pass computes them
/// (also certify/fast/row_rung.hpp's MPFI rows): for an empty row or a non-online algorithm,
/// softmax_row, then add(p_j, j) for every attendable key (every key of an empty row under the
/// uniform policy; fill_nan() for an empty row under the NaN policy; nothing under zero); for the
/// online algorithm, the key blocks in the configured order, rescale(f) by each block's factor
/// before its keys are added, divide(sum) at the end, and the normalised weights in p when
/// keep_weights. The callbacks own the outputs. Returns the row's lse.
template <class A, class Add, class Rescale, class Divide, class FillNaN>
constexpr A softmax_and_values(const softmax_options& so, std::span<const A> logits, std::span<const std::uint8_t> allowed, std::span<A> p,
                               bool keep_weights, Add&& add, Rescale&& rescale, Divide&& divide, FillNaN&& fill_nan) {
    // Raw pointers in the loops: the constant evaluator pays for every span::operator[] call.
    const std::size_t sk = logits.size();
    const std::uint8_t* al = allowed.data();
    A* pp = p.data();
    const bool empty = count_allowed(allowed) == 0;
    if (empty || so.algorithm != softmax_algorithm::online) {
        const A lse = softmax_row<A>(so, logits, allowed, p);
        if (empty && so.empty_rows == empty_row_policy::nan) {
            fill_nan();
        } else if (!empty || so.empty_rows == empty_row_policy::uniform) {
            for (std::size_t j = 0; j < sk; ++j)
                if (al[j] || empty) add(pp[j], j);
        }
        return lse;
    }
    online_softmax<A> state;
    const std::size_t block = so.block_size;
    const std::size_t blocks = (sk + block - 1) / block;
    for (std::size_t t = 0; t < blocks; ++t) {
        const std::size_t begin = (so.block_order == key_block_order::reverse ? blocks - 1 - t : t) * block;
        const std::size_t end = begin + block < sk ? begin + block : sk;
        rescale(state.absorb(logits, allowed, begin, end, p));
        for (std::size_t j = begin; j < end; ++j)
            if (al[j]) add(pp[j], j);
    }
    divide(state.sum);
    const A lse = state.lse();
    if (keep_weights) state.weights(logits, allowed, p);
    return lse;
}

/// Scaled dot-product attention into caller-provided views (any element types; values are converted
/// with static_cast). `weights` (B, H, Sq, Sk) and `lse` (B, H, Sq) may be empty views.
/// Shapes: q (B, H, Sq, dk), k (B, Hkv, Sk, dk), v (B, Hkv, Sk, dv), out (B, H, Sq, dv).
/// Throws shape_error naming the offending dimension, and (at run time) fp_environment_error when the
/// floating-point environment is not the reference one (fp_environment.hpp).
template <PrecisionPolicy Policy, class Q, class K, class V, class O, class W, class L>
constexpr void scaled_dot_product_attention_into(tensor_view<const Q, 4> q, tensor_view<const K, 4> k,
                                                 tensor_view<const V, 4> v, const attention_options& options,
                                                 tensor_view<O, 4> out, tensor_view<W, 4> weights,
                                                 tensor_view<L, 3> lse) {
    using Lg = logits_type_t<Policy>;   // q·kᵀ and everything added to the logits
    using A = softmax_type_t<Policy>;   // the softmax
    using Vt = values_type_t<Policy>;   // P·V
    using P = typename Policy::weights_type;
    using LS = logits_storage_t<Policy>;  // the logits as stored before the softmax (kernel_models.hpp)
    constexpr double weights_scale = weights_scale_v<Policy>;
    // Run time only: refuse an environment (FP contraction, rounding mode, FTZ/DAZ, excess precision)
    // in which the builtin types would not compute attnref's reference semantics (fp_environment.hpp).
    if (!std::is_constant_evaluated()) require_reference_fp_environment();
    const attention_dims d = logit_stage::attention_dims_of(q, k, v);
    require_extent("output axis 0 (batch)", out.extents[0], d.batch);
    require_extent("output axis 1 (heads)", out.extents[1], d.heads);
    require_extent("output axis 2 (query length)", out.extents[2], d.query_length);
    require_extent("output axis 3 (head dim dv)", out.extents[3], d.head_dim_v);
    if (!weights.empty()) {
        require_extent("weights axis 0 (batch)", weights.extents[0], d.batch);
        require_extent("weights axis 1 (heads)", weights.extents[1], d.heads);
        require_extent("weights axis 2 (query length)", weights.extents[2], d.query_length);
        require_extent("weights axis 3 (key length)", weights.extents[3], d.key_length);
    }
    if (!lse.empty()) {
        require_extent("lse axis 0 (batch)", lse.extents[0], d.batch);
        require_extent("lse axis 1 (heads)", lse.extents[1], d.heads);
        require_extent("lse axis 2 (query length)", lse.extents[2], d.query_length);
    }
    if (!options.alibi_slopes.empty()) require_extent("alibi_slopes size (heads)", options.alibi_slopes.size(), d.heads);
    if (options.softmax.algorithm == softmax_algorithm::online && options.softmax.block_size == 0)
        throw shape_error("softmax block_size: expected at least 1, got 0");
    validate_masks(options.mask, d.batch, d.heads, d.query_length, d.key_length);
    if (!options.rows.empty()) require_extent("rows size (batch·heads·query length)", options.rows.size(), d.batch * d.heads * d.query_length);
    if (!options.pv_weights.empty())
        require_extent("pv_weights size (batch·heads·query length·key length)", options.pv_weights.size(),
                       d.batch * d.heads * d.query_length * d.key_length);

    const std::size_t group = d.heads / d.kv_heads;
    const std::size_t sq = d.query_length, sk = d.key_length, dk = d.head_dim_qk, dv = d.head_dim_v;

    auto run_head = [&](std::size_t task) {
        const std::size_t b = task / d.heads, h = task % d.heads, hk = h / group;
        const logit_stage::logits_context<Lg> ctx = logit_stage::make_logits_context<Lg>(options, d, h);
        std::vector<Lg> qh(sq * dk, Lg(0)), kh(sk * dk, Lg(0));
        std::vector<Vt> vh(sk * dv, Vt(0));
        logit_stage::convert_head_inputs(options, ctx.scale, q, k, b, h, hk, qh, kh);
        // Contiguous storage through raw pointers with precomputed offsets: the loops below are what
        // the constant evaluator runs too, and it pays for every call and index computation.
        const V* vs = v.data + v.offset(b, hk, 0, 0);
        Vt* vd = vh.data();
        for (std::size_t e = 0; e < sk * dv; ++e) vd[e] = convert<Vt>(vs[e]);
        std::vector<Lg> raw_logits(sk, Lg(0));
        std::vector<A> logits(sk, A(0)), p(sk, A(0));
        std::vector<Vt> o_storage(dv, Vt(0));
        Vt* o = o_storage.data();
        std::vector<std::uint8_t> allowed(sk, 0);
        const std::span<const Lg> q_head(qh);
        for (std::size_t i = 0; i < sq; ++i) {
            if (!options.rows.empty() && !options.rows[task * sq + i]) continue;
            logit_stage::logits_row<Lg>(ctx, b, h, i, q_head.subspan(i * dk, dk), kh, raw_logits, allowed);
            for (std::size_t j = 0; j < sk; ++j) logits[j] = convert<A>(convert<LS>(raw_logits[j]));
            for (std::size_t c = 0; c < dv; ++c) o[c] = Vt(0);
            // o += round_P(w)·v_j  for one key
            auto accumulate = [&](const A& w, std::size_t j) {
                const Vt w_rounded = weights_scale != 1.0 ? convert<Vt>(convert<P>(w * A(weights_scale))) : convert<Vt>(convert<P>(w));
                if constexpr (requires { static_cast<double>(w_rounded); })
                    if (!options.pv_weights.empty()) options.pv_weights[(task * sq + i) * sk + j] = static_cast<double>(w_rounded);
                const Vt* vj = vd + j * dv;
                for (std::size_t c = 0; c < dv; ++c) o[c] = o[c] + w_rounded * vj[c];
            };
            const A row_lse = softmax_and_values<A>(
                options.softmax, logits, allowed, p, !weights.empty(), accumulate,
                [&](const A& f) {
                    const Vt factor = convert<Vt>(f);
                    for (std::size_t c = 0; c < dv; ++c) o[c] = o[c] * factor;  // factor 1: exact
                },
                [&](const A& s) {
                    const Vt sum = convert<Vt>(s);
                    for (std::size_t c = 0; c < dv; ++c) o[c] = o[c] / sum;
                },
                [&] {
                    for (std::size_t c = 0; c < dv; ++c) o[c] = quiet_NaN<Vt>();
                });
            if constexpr (weights_scale != 1.0)
                for (std::size_t c = 0; c < dv; ++c) o[c] = o[c] / Vt(weights_scale);  // undo P's static scale
            O* out_row = out.data + out.offset(b, h, i, 0);
            for (std::size_t c = 0; c < dv; ++c) out_row[c] = convert<O>(o[c]);
            if (!weights.empty()) {
                W* weights_row = weights.data + weights.offset(b, h, i, 0);
                for (std::size_t j = 0; j < sk; ++j) weights_row[j] = convert<W>(convert<P>(p[j]));
            }
            if (!lse.empty()) lse(b, h, i) = convert<L>(row_lse);
        }
    };
    parallel_for(d.batch * d.heads, options.threads, run_head, [] {
        thread_cleanup<Lg>::run();
        thread_cleanup<A>::run();
        thread_cleanup<Vt>::run();
    });
}

/// The logits S (B, H, Sq, Sk) exactly as scaled_dot_product_attention_into forms them (scale,
/// softcap, ALiBi, additive masks), with −inf for structurally masked keys. For checks: P = exp(S − lse).
template <PrecisionPolicy Policy, class Q, class K>
constexpr tensor<logits_type_t<Policy>, 4> attention_logits(tensor_view<const Q, 4> q, tensor_view<const K, 4> k,
                                                            const attention_options& options = {}) {
    using A = logits_type_t<Policy>;
    const attention_dims d = logit_stage::attention_dims_of(q, k);
    validate_masks(options.mask, d.batch, d.heads, d.query_length, d.key_length);
    const std::size_t group = d.heads / d.kv_heads, sq = d.query_length, sk = d.key_length, dk = d.head_dim_qk;
    tensor<A, 4> result({d.batch, d.heads, sq, sk}, A(0));
    // Heads (b, h) on options.threads, as scaled_dot_product_attention_into runs them: each head's
    // rows computed alone and written to its own slice, so no value depends on the split.
    auto run_head = [&](std::size_t task) {
        const std::size_t b = task / d.heads, h = task % d.heads;
        const logit_stage::logits_context<A> ctx = logit_stage::make_logits_context<A>(options, d, h);
        std::vector<A> qh(sq * dk, A(0)), kh(sk * dk, A(0)), logits(sk, A(0));
        std::vector<std::uint8_t> allowed(sk, 0);
        logit_stage::convert_head_inputs(options, ctx.scale, q, k, b, h, h / group, qh, kh);
        for (std::size_t i = 0; i < sq; ++i) {
            logit_stage::logits_row<A>(ctx, b, h, i, std::span<const A>(qh).subspan(i * dk, dk), kh, logits, allowed);
            for (std::size_t j = 0; j < sk; ++j) result(b, h, i, j) = allowed[j] ? logits[j] : -infinity<A>();
        }
    };
    parallel_for(d.batch * d.heads, options.threads, run_head, [] { thread_cleanup<A>::run(); });
    return result;
}

/// Result of scaled_dot_product_attention: output (B, H, Sq, dv), weights P (B, H, Sq, Sk) in the
/// policy's weights_type, lse (B, H, Sq) in its accumulate_type.
template <PrecisionPolicy Policy>
struct attention_result {
    tensor<typename Policy::output_type, 4> output;
    tensor<typename Policy::weights_type, 4> weights;
    tensor<typename Policy::accumulate_type, 3> lse;
};

/// Scaled dot-product attention over run-time shapes (see scaled_dot_product_attention_into).
template <PrecisionPolicy Policy, class Q, class K, class V>
constexpr attention_result<Policy> scaled_dot_product_attention(tensor_view<const Q, 4> q, tensor_view<const K, 4> k,
                                                                tensor_view<const V, 4> v,
                                                                const attention_options& options = {}) {
    const attention_dims d = logit_stage::attention_dims_of(q, k, v);
    attention_result<Policy> r{
        tensor<typename Policy::output_type, 4>({d.batch, d.heads, d.query_length, d.head_dim_v}),
        tensor<typename Policy::weights_type, 4>({d.batch, d.heads, d.query_length, d.key_length}),
        tensor<typename Policy::accumulate_type, 3>({d.batch, d.heads, d.query_length})};
    scaled_dot_product_attention_into<Policy>(q, k, v, options, r.output.view(), r.weights.view(), r.lse.view());
    return r;
}

/// Convenience overload: everything in T.
template <Scalar T>
constexpr attention_result<uniform_precision<T>> scaled_dot_product_attention(const tensor<T, 4>& q, const tensor<T, 4>& k,
                                                                              const tensor<T, 4>& v,
                                                                              const attention_options& options = {}) {
    return scaled_dot_product_attention<uniform_precision<T>, T, T, T>(q.view(), k.view(), v.view(), options);
}

}  // namespace attnref
