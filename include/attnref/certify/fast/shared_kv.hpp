#pragma once
/// \file certify/fast/shared_kv.hpp
/// The first MPFI rung of a multi-head escalation, at a cost proportional to the escalated rows
/// (docs/fast-certify.md "What goes to MPFI"). The whole-batch ladder recomputes the key and value
/// projections of every key in MPFI for any escalated row (B·Sk·(Hkv·(dk + dv))·E interval
/// multiply-adds per rung); here they are enclosed once, for the batches that have an escalated
/// row, from triple-word dot products with a bound (triple_dot.hpp, (10)): each enclosure is
/// hi + mid + low + bias ± err, formed by outward-rounded MPFI additions, so it contains the exact
/// projection. Then only what the undecided elements need is computed in mpfr_interval<D>, by the
/// operations of the forward's templates in the same order: the Q projection of the escalated query
/// rows (linear_into on those rows of x_q), the attention rows (b, h, i) they need (every head of a
/// query row with an undecided output, only the head of an undecided weight or lse; the per-row steps
/// of scaled_dot_product_attention_into: logits_row, softmax_row or online_softmax, P·V), and the
/// output projection of the query rows with an undecided output (linear_into on their merged heads).
/// Every result interval encloses the exact value, so whatever it certifies is the correctly rounded
/// value: the same bytes as the whole-batch ladder. The projections' enclosures are about n²u³ wide
/// (n = E), far below the 134-bit rung's own (≈ n·2^-134), so the rung decides what the first rung
/// of the whole-batch ladder decides; what it leaves goes on to the whole-batch ladder's next rungs.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <mpfi.h>

#include "attnref/core/attention.hpp"
#include "attnref/certify/fast/problem.hpp"
#include "attnref/certify/fast/triple_dot.hpp"
#include "attnref/core/multi_head_attention.hpp"
#include "attnref/multiprecision/multiprecision.hpp"
#include "attnref/core/parallel.hpp"
#include "attnref/core/precision.hpp"
#include "attnref/core/softmax.hpp"
#include "attnref/core/tensor.hpp"

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
        ::attnref::parallel_for(todo.size(), threads, [&](std::size_t t) {
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

/// Which elements a rung is asked for: per tensor (output, then weights and lse when present, as in
/// tensor_layout), the full indices and whether each is still pending.
struct wanted_elements {
    const std::vector<std::vector<std::size_t>>* index;
    const std::vector<std::vector<std::uint8_t>>* pending;  ///< empty: all
    bool is_pending(std::size_t t, std::size_t m) const {
        return pending->empty() || (*pending)[t].empty() || (*pending)[t][m];
    }
};

/// The shared K/V rung for one escalation (kept across the ladder's rungs: the projections are
/// computed at most once per batch).
struct shared_kv_rung {
    const fast_problem* p;
    std::size_t threads;
    triple_projection k, v;

    /// The wanted elements (aligned with want.index: entry m of tensor t is element index[t][m];
    /// entries that are not pending are left 0); tensors: output, then weights and lse when present.
    /// Counts what it computed in stats (shared_kv_rows, shared_kv_query_rows, shared_kv_output_rows).
    template <unsigned D>
    std::vector<std::vector<mpfr_interval<D>>> run(const wanted_elements& want, bool has_weights, bool has_lse,
                                                   fast_stats* stats = nullptr) {
        using T = mpfr_interval<D>;
        using P = uniform_precision<T>;
        mha_options mo;
        mo.heads = p->heads;
        mo.kv_heads = p->kv_heads;
        const mha_dims d = mha_dims_of(p->x_q, p->x_k, p->x_v, p->params, mo);
        const std::size_t B = d.batch, H = d.heads, Hkv = d.kv_heads, Sq = d.query_length, Sk = d.key_length, dk = d.head_dim_qk,
                          dv = d.head_dim_v, E = p->x_q.extents[2], dout = d.output_dim, group = H / Hkv;
        const std::size_t nt = want.index->size();
        const std::size_t w_t = has_weights ? 1 : nt, l_t = has_lse ? (has_weights ? 2 : 1) : nt;
        // What the pending elements need: output → every head of its query row and the output
        // projection of that row; a weight or an lse → its own (b, h, i) row.
        std::vector<std::uint8_t> out_rows(B * Sq, 0), head_rows(B * H * Sq, 0);
        for (std::size_t t = 0; t < nt; ++t)
            for (std::size_t m = 0; m < (*want.index)[t].size(); ++m) {
                if (!want.is_pending(t, m)) continue;
                const std::size_t n = (*want.index)[t][m];
                if (t == 0) {
                    const std::size_t row = n / dout, b = row / Sq, i = row % Sq;
                    out_rows[row] = 1;
                    for (std::size_t h = 0; h < H; ++h) head_rows[(b * H + h) * Sq + i] = 1;
                } else if (t == w_t) {
                    head_rows[n / Sk] = 1;
                } else if (t == l_t) {
                    head_rows[n] = 1;
                }
            }
        // Query rows with some head row (their Q projection), in (b, i) order; the attention tasks.
        std::vector<std::size_t> q_pos(B * Sq, SIZE_MAX), q_rows, tasks, task_q;
        std::vector<std::uint8_t> batches(B, 0);
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t i = 0; i < Sq; ++i)
                for (std::size_t h = 0; h < H; ++h)
                    if (head_rows[(b * H + h) * Sq + i]) {
                        q_pos[b * Sq + i] = q_rows.size(), q_rows.push_back(b * Sq + i), batches[b] = 1;
                        break;
                    }
        std::vector<std::size_t> task_of(B * H * Sq, SIZE_MAX);
        for (std::size_t r = 0; r < B * H * Sq; ++r)
            if (head_rows[r]) {
                const std::size_t b = r / (H * Sq), i = r % Sq;
                task_of[r] = tasks.size(), tasks.push_back(r), task_q.push_back(q_pos[b * Sq + i]);
            }
        std::vector<std::vector<T>> result(nt);
        for (std::size_t t = 0; t < nt; ++t) result[t].resize((*want.index)[t].size());
        if (tasks.empty()) return result;

        const attention_options& o = p->options;
        const attention_dims adims{B, H, Hkv, Sq, Sk, dk, dv};
        const T scale = logit_stage::logit_scale<T>(o, dk);
        T q_factor = T(1), k_factor = T(1);
        if (o.placement == scale_placement::on_query) q_factor = scale;
        if (o.placement == scale_placement::split_sqrt) q_factor = k_factor = math::sqrt(scale);

        // Keys and values per kv head, (B, Hkv, Sk, d) as split_heads lays them out, from the
        // enclosures; keys times √s under split_sqrt, as convert_head_inputs does.
        k.compute(p->x_k, p->params.w_k, batches, threads);
        v.compute(p->x_v, p->params.w_v, batches, threads);
        tensor<T, 4> kh({B, Hkv, Sk, dk}), vh({B, Hkv, Sk, dv});
        parallel_for(B * Sk, threads, [&](std::size_t r) {
            const std::size_t b = r / Sk, j = r % Sk;
            if (!batches[b]) return;
            for (std::size_t hk = 0; hk < Hkv; ++hk) {
                for (std::size_t c = 0; c < dk; ++c) {
                    const std::size_t col = hk * dk + c;
                    T& kv = kh(b, hk, j, c);
                    k.enclose(r * (Hkv * dk) + col, p->params.b_k.empty() ? 0.0 : p->params.b_k.data[col], kv);
                    if (o.placement == scale_placement::split_sqrt) kv = kv * k_factor;
                }
                for (std::size_t c = 0; c < dv; ++c) {
                    const std::size_t col = hk * dv + c;
                    v.enclose(r * (Hkv * dv) + col, p->params.b_v.empty() ? 0.0 : p->params.b_v.data[col], vh(b, hk, j, c));
                }
            }
        }, &thread_cleanup<T>::run);

        // Q projection of the escalated query rows: linear_into's operations on those rows of x_q.
        const std::size_t nq = q_rows.size();
        std::vector<double> xq(nq * E);
        for (std::size_t r = 0; r < nq; ++r)
            for (std::size_t c = 0; c < E; ++c) xq[r * E + c] = p->x_q.data[q_rows[r] * E + c];
        tensor<T, 3> q({1, nq, H * dk});
        linear_into<P>(tensor_view<const double, 3>{xq.data(), {1, nq, E}}, p->params.w_q, p->params.b_q, q.view(), threads, "w_q");

        // The attention rows: the per-row steps of scaled_dot_product_attention_into (uniform
        // precision: logits, softmax and P·V in T, weights unscaled).
        const bool keep_weights = has_weights, keep_lse = has_lse;
        std::vector<T> heads_out(nq * H * dv), weights(keep_weights ? tasks.size() * Sk : 0), lse(keep_lse ? tasks.size() : 0);
        parallel_for(tasks.size(), threads, [&](std::size_t task) {
            const std::size_t r = tasks[task], b = r / (H * Sq), h = (r / Sq) % H, i = r % Sq, hk = h / group;
            const logit_stage::logits_context<T> ctx = logit_stage::make_logits_context<T>(o, adims, h);
            std::vector<T> qr(dk);
            const T* qs = q.data() + task_q[task] * (H * dk) + h * dk;
            for (std::size_t c = 0; c < dk; ++c) {
                qr[c] = qs[c];
                if (o.placement != scale_placement::on_product) qr[c] = qr[c] * q_factor;
            }
            const T* kd = &kh(b, hk, 0, 0);
            const T* vd = &vh(b, hk, 0, 0);
            std::vector<T> logits(Sk, T(0)), pr(Sk, T(0)), ov(dv, T(0));
            std::vector<std::uint8_t> allowed(Sk, 0);
            logit_stage::logits_row<T>(ctx, b, h, i, std::span<const T>(qr), std::span<const T>(kd, Sk * dk), logits, allowed);
            T* out = ov.data();
            auto accumulate = [&](const T& w, std::size_t j) {
                const T* vj = vd + j * dv;
                for (std::size_t c = 0; c < dv; ++c) out[c] = out[c] + w * vj[c];
            };
            T row_lse = T(0);
            const bool empty = count_allowed(allowed) == 0;
            if (empty || o.softmax.algorithm != softmax_algorithm::online) {
                row_lse = softmax_row<T>(o.softmax, logits, allowed, pr);
                if (empty && o.softmax.empty_rows == empty_row_policy::nan) {
                    for (std::size_t c = 0; c < dv; ++c) out[c] = quiet_NaN<T>();
                } else if (!empty || o.softmax.empty_rows == empty_row_policy::uniform) {
                    for (std::size_t j = 0; j < Sk; ++j)
                        if (allowed[j] || empty) accumulate(pr[j], j);
                }
            } else {
                online_softmax<T> state;
                const std::size_t block = o.softmax.block_size;
                const std::size_t blocks = (Sk + block - 1) / block;
                for (std::size_t t = 0; t < blocks; ++t) {
                    const std::size_t begin = (o.softmax.block_order == key_block_order::reverse ? blocks - 1 - t : t) * block;
                    const std::size_t end = begin + block < Sk ? begin + block : Sk;
                    const T factor = state.absorb(logits, allowed, begin, end, pr);
                    for (std::size_t c = 0; c < dv; ++c) out[c] = out[c] * factor;
                    for (std::size_t j = begin; j < end; ++j)
                        if (allowed[j]) accumulate(pr[j], j);
                }
                const T sum = state.sum;
                for (std::size_t c = 0; c < dv; ++c) out[c] = out[c] / sum;
                row_lse = state.lse();
                if (keep_weights) state.weights(logits, allowed, pr);
            }
            T* ho = heads_out.data() + task_q[task] * (H * dv) + h * dv;
            for (std::size_t c = 0; c < dv; ++c) ho[c] = out[c];
            if (keep_weights)
                for (std::size_t j = 0; j < Sk; ++j) weights[task * Sk + j] = pr[j];
            if (keep_lse) lse[task] = row_lse;
        }, &thread_cleanup<T>::run);

        // Output projection of the query rows with a pending output: linear_into's operations on
        // their merged heads (B, Sq, H·dv layout: head h in columns [h·dv, (h + 1)·dv)).
        std::vector<std::size_t> o_pos(B * Sq, SIZE_MAX);
        std::vector<std::size_t> o_rows;
        for (std::size_t row = 0; row < B * Sq; ++row)
            if (out_rows[row]) o_pos[row] = o_rows.size(), o_rows.push_back(row);
        tensor<T, 3> merged({1, o_rows.size(), H * dv}), outp({1, o_rows.size(), dout});
        for (std::size_t r = 0; r < o_rows.size(); ++r)
            for (std::size_t c = 0; c < H * dv; ++c) merged.data()[r * H * dv + c] = heads_out[q_pos[o_rows[r]] * H * dv + c];
        if (stats) stats->shared_kv_rows = tasks.size(), stats->shared_kv_query_rows = nq, stats->shared_kv_output_rows = o_rows.size();
        if (!o_rows.empty())
            linear_into<P>(tensor_view<const T, 3>(merged.view()), p->params.w_o, p->params.b_o, outp.view(), threads, "w_o");

        for (std::size_t t = 0; t < nt; ++t)
            for (std::size_t m = 0; m < (*want.index)[t].size(); ++m) {
                if (!want.is_pending(t, m)) continue;
                const std::size_t n = (*want.index)[t][m];
                if (t == 0) result[t][m] = outp.data()[o_pos[n / dout] * dout + n % dout];
                else if (t == w_t) result[t][m] = weights[task_of[n / Sk] * Sk + n % Sk];
                else if (t == l_t) result[t][m] = lse[task_of[n]];
            }
        return result;
    }
};

}  // namespace attnref::fast::detail
