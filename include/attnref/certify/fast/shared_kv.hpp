#pragma once
/// \file certify/fast/shared_kv.hpp
/// The first MPFI rung of a multi-head escalation, at a cost proportional to the escalated rows
/// (docs/fast-certify.md "What goes to MPFI"). The whole-batch ladder recomputes the key and value
/// projections of every key in MPFI for any escalated row (B·Sk·(Hkv·(dk + dv))·E interval
/// multiply-adds per rung); here they are enclosed once, for the batches that have an escalated
/// row, from triple-word dot products with a bound (triple_dot.hpp, (10)): each enclosure is
/// hi + mid + low + bias ± err, formed by outward-rounded MPFI additions, so it contains the exact
/// projection. The escalated query rows then run through the forward's own templates in
/// mpfr_interval<D> (linear_into for their Q and W_o projections, split_heads, scaled dot-product
/// attention with `rows`, merge_heads), exactly as multi_head_attention_into does, with these
/// enclosures in place of the MPFI projections. Every result interval encloses the exact value, so
/// whatever it certifies is the correctly rounded value: the same bytes as the whole-batch ladder.
/// The projections' enclosures are about n²u³ wide (n = E), far below the 134-bit rung's own
/// (≈ n·2^-134), so the rung decides what the first rung of the whole-batch ladder decides; what it
/// leaves goes on to the whole-batch ladder's next rungs.

#include <cstddef>
#include <cstdint>
#include <vector>

#include <mpfi.h>

#include "attnref/attention.hpp"
#include "attnref/certify/fast/problem.hpp"
#include "attnref/certify/fast/triple_dot.hpp"
#include "attnref/multi_head_attention.hpp"
#include "attnref/multiprecision.hpp"
#include "attnref/parallel.hpp"
#include "attnref/precision.hpp"
#include "attnref/tensor.hpp"

namespace attnref::fast::detail {

/// Triple-word projections x·W (no bias) of the batches that need them, (B·S) × N, with bounds.
struct triple_projection {
    std::size_t rows = 0, cols = 0;
    std::vector<std::uint8_t> batch_done;  ///< per batch: computed
    std::vector<double> hi, mid, low, err;

    /// Computes the rows of every batch b with need[b] not yet done (threads: parallel.hpp's pool).
    void compute(tensor_view<const double, 3> x, tensor_view<const double, 2> w, const std::vector<std::uint8_t>& need,
                 std::size_t threads) {
        const std::size_t B = x.extents[0], S = x.extents[1], E = x.extents[2], N = w.extents[1];
        if (hi.empty()) {
            rows = B * S, cols = N;
            batch_done.assign(B, 0);
            hi.assign(rows * cols, 0), mid.assign(rows * cols, 0), low.assign(rows * cols, 0), err.assign(rows * cols, 0);
        }
        std::vector<std::size_t> todo;
        for (std::size_t b = 0; b < B; ++b)
            if (need[b] && !batch_done[b])
                for (std::size_t s = 0; s < S; ++s) todo.push_back(b * S + s);
        ::attnref::detail::parallel_for(todo.size(), threads, [&](std::size_t t) {
            const std::size_t r = todo[t];
            dot3_rows(x.data + r * E, E, w.data, N, N, hi.data() + r * N, mid.data() + r * N, low.data() + r * N, err.data() + r * N);
        });
        for (std::size_t b = 0; b < B; ++b)
            if (need[b]) batch_done[b] = 1;
    }

    /// The MPFI enclosure of element n plus bias (0 when none): hi + mid + low + bias ± err,
    /// each addition rounded outward.
    template <unsigned D>
    void enclose(std::size_t n, double bias, mpfr_interval<D>& out) const {
        mpfi_ptr r = out.backend().data();
        mpfi_set_d(r, hi[n]);
        mpfi_add_d(r, r, mid[n]);
        mpfi_add_d(r, r, low[n]);
        if (bias != 0) mpfi_add_d(r, r, bias);
        mpfi_t e;
        mpfi_init2(e, 53);
        mpfi_interv_d(e, -err[n], err[n]);
        mpfi_add(r, r, e);
        mpfi_clear(e);
    }
};

/// The shared K/V rung for one escalation (kept across the ladder's rungs: the projections are
/// computed at most once per batch).
struct shared_kv_rung {
    const fast_problem* p;
    std::size_t threads;
    triple_projection k, v;

    /// {output, weights, lse} for the selected (b, h, i) rows (every head of a selected query row is
    /// computed, as multi_head_attention_into does); weights and lse are empty unless asked.
    template <unsigned D>
    std::vector<std::vector<mpfr_interval<D>>> run(const std::vector<std::uint8_t>& rows, bool want_weights, bool want_lse) {
        using T = mpfr_interval<D>;
        using P = uniform_precision<T>;
        mha_options mo;
        mo.heads = p->heads;
        mo.kv_heads = p->kv_heads;
        const mha_dims d = mha_dims_of(p->x_q, p->x_k, p->x_v, p->params, mo);
        const std::size_t B = d.batch, H = d.heads, Hkv = d.kv_heads, Sq = d.query_length, Sk = d.key_length, dk = d.head_dim_qk,
                          dv = d.head_dim_v;
        std::vector<std::uint8_t> query_rows(B * Sq, 0), head_rows(B * H * Sq, 0), batches(B, 0);
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t h = 0; h < H; ++h)
                for (std::size_t i = 0; i < Sq; ++i)
                    if (rows[(b * H + h) * Sq + i]) query_rows[b * Sq + i] = 1, batches[b] = 1;
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t h = 0; h < H; ++h)
                for (std::size_t i = 0; i < Sq; ++i) head_rows[(b * H + h) * Sq + i] = query_rows[b * Sq + i];
        k.compute(p->x_k, p->params.w_k, batches, threads);
        v.compute(p->x_v, p->params.w_v, batches, threads);
        // Keys and values per head, (B, Hkv, Sk, d): split_heads' layout, filled from the enclosures.
        tensor<T, 4> kh({B, Hkv, Sk, dk}), vh({B, Hkv, Sk, dv});
        ::attnref::detail::parallel_for(B * Sk, threads, [&](std::size_t r) {
            const std::size_t b = r / Sk, j = r % Sk;
            if (!batches[b]) return;
            for (std::size_t hk = 0; hk < Hkv; ++hk) {
                for (std::size_t c = 0; c < dk; ++c) {
                    const std::size_t col = hk * dk + c;
                    k.enclose(r * (Hkv * dk) + col, p->params.b_k.empty() ? 0.0 : p->params.b_k.data[col], kh(b, hk, j, c));
                }
                for (std::size_t c = 0; c < dv; ++c) {
                    const std::size_t col = hk * dv + c;
                    v.enclose(r * (Hkv * dv) + col, p->params.b_v.empty() ? 0.0 : p->params.b_v.data[col], vh(b, hk, j, c));
                }
            }
        }, &thread_cleanup<T>::run);
        attention_options ao = p->options;
        ao.rows = head_rows;
        ao.threads = threads;
        tensor<T, 3> q({B, Sq, H * dk});
        linear_into<P>(p->x_q, p->params.w_q, p->params.b_q, q.view(), threads, "w_q", query_rows);
        const tensor<T, 4> qh = split_heads<T>(q.view(), H);
        std::vector<std::vector<T>> r;
        r.emplace_back(B * Sq * d.output_dim);
        std::vector<T> wv(want_weights ? B * H * Sq * Sk : 0), lv(want_lse ? B * H * Sq : 0);
        tensor_view<T, 4> wview{};
        tensor_view<T, 3> lview{};
        if (want_weights) wview = {wv.data(), {B, H, Sq, Sk}};
        if (want_lse) lview = {lv.data(), {B, H, Sq}};
        tensor<T, 4> heads_out({B, H, Sq, dv});
        scaled_dot_product_attention_into<P>(tensor_view<const T, 4>(qh.view()), tensor_view<const T, 4>(kh.view()),
                                             tensor_view<const T, 4>(vh.view()), ao, heads_out.view(), wview, lview);
        const tensor<T, 3> merged = merge_heads<T>(heads_out.view());
        tensor_view<T, 3> out{r[0].data(), {B, Sq, d.output_dim}};
        linear_into<P>(tensor_view<const T, 3>(merged.view()), p->params.w_o, p->params.b_o, out, threads, "w_o", query_rows);
        r.push_back(std::move(wv));
        r.push_back(std::move(lv));
        return r;
    }
};

}  // namespace attnref::fast::detail
