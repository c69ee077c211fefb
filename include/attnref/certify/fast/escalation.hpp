#pragma once
/// \file certify/fast/escalation.hpp
/// The elements the fast rung leaves undecided, through Ziv's MPFI ladder (certify.hpp): their
/// query rows are recomputed by the forward templates in mpfr_interval<D> (generation's own path),
/// and only those elements are read. Multi-head attention's first rung goes through the row rung
/// (row_rung.hpp) instead of projecting every key in MPFI; later rungs, and SDPA
/// (whose keys and values are inputs), through the whole-batch ladder. The result is the correctly rounded value, as for every
/// element the ladder certifies.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnref/core/attention.hpp"
#include "attnref/certify/certify.hpp"
#include "attnref/certify/fast/problem.hpp"
#include "attnref/certify/fast/row_rung.hpp"
#include "attnref/core/multi_head_attention.hpp"
#include "attnref/multiprecision/multiprecision.hpp"
#include "attnref/core/precision.hpp"
#include "attnref/core/tensor.hpp"

namespace attnref::fast::detail {


/// Runs the MPFI ladder for the undecided elements only (by rows), writing their values.
template <class RunMPFI>
void escalate(const std::vector<std::string>& names, const std::vector<format_description>& targets,
              std::vector<std::vector<std::vector<double>>>& values, const std::vector<std::vector<std::uint8_t>>& undecided,
              const std::vector<std::uint8_t>& nan_rows, RunMPFI&& run, std::size_t rows_total, fast_stats& stats,
              std::vector<int>& precisions, const std::vector<std::vector<std::size_t>>& shapes) {
    const std::size_t nt = names.size();
    std::vector<std::vector<std::size_t>> idx(nt);
    for (std::size_t t = 0; t < nt; ++t)
        for (std::size_t n = 0; n < undecided[t].size(); ++n)
            if (undecided[t][n]) idx[t].push_back(n);
    std::size_t total = 0;
    for (auto& i : idx) total += i.size();
    if (total == 0) return;
    // row of element n of tensor t: run.row_of(t, n) → set of (b,h,i) rows (flags)
    auto compute = [&]<unsigned D>(std::integral_constant<unsigned, D> tag, const certify::request& req) {
        std::vector<std::uint8_t> rows(rows_total, 0);
        for (std::size_t t = 0; t < nt; ++t)
            for (std::size_t m = 0; m < idx[t].size(); ++m)
                if (req.pending.empty() || req.pending[t].empty() || req.pending[t][m]) run.mark_rows(t, idx[t][m], rows);
        std::size_t count = 0;
        for (std::uint8_t r : rows) count += r;
        stats.escalated_rows = std::max(stats.escalated_rows, count);
        return run(tag, rows, wanted_elements{&idx, &req.pending});
    };
    // NaN is exact only in the rows that the mask alone leaves empty under empty_row_policy::nan
    // (and what they feed), as in generation.
    certify::options opts;
    opts.nan_allowed.resize(nt);
    for (std::size_t t = 0; t < nt; ++t)
        for (std::size_t n : idx[t]) opts.nan_allowed[t].push_back(run.nan_by_construction(t, n, nan_rows) ? 1 : 0);
    opts.shapes = shapes;  // messages name an uncertified element by its index in the full tensor
    opts.full_index = idx;
    certify::result r = certify::certify(names, targets, compute, opts);
    precisions = r.precisions_bits;
    for (std::size_t t = 0; t < nt; ++t)
        for (std::size_t k = 0; k < targets.size(); ++k)
            for (std::size_t m = 0; m < idx[t].size(); ++m) values[t][k][idx[t][m]] = r.values[t][k][m];
}



/// The MPFI path for selected (b, h, i) rows, through the same templates as generation.
struct mpfi_runner {
    const fast_problem* p;
    std::size_t B, H, Sq, Sk, dv, dout;
    bool want_weights, want_lse;
    std::vector<std::uint8_t> need;  ///< per tensor: some element of it is undecided
    std::size_t threads;
    row_rung* first = nullptr;  ///< multi-head: the first rung through row_rung.hpp
    fast_stats* stats = nullptr;

    bool nan_by_construction(std::size_t t, std::size_t n, const std::vector<std::uint8_t>& nan_rows) const {
        if (want_lse && t == tensor_layout{want_weights, want_lse}.lse_index()) return false;  // lse of an empty row is −inf
        if (t == 0 && p->mha) {
            const std::size_t row = n / dout, b = row / Sq, i = row % Sq;
            for (std::size_t h = 0; h < H; ++h)
                if (nan_rows[(b * H + h) * Sq + i]) return true;
            return false;
        }
        return nan_rows[n / (t == 0 ? dv : Sk)] != 0;
    }
    void mark_rows(std::size_t t, std::size_t n, std::vector<std::uint8_t>& rows) const {
        if (t == 0 && p->mha) {
            const std::size_t row = n / dout, b = row / Sq, i = row % Sq;
            for (std::size_t h = 0; h < H; ++h) rows[(b * H + h) * Sq + i] = 1;
            return;
        }
        const std::size_t width = t == tensor_layout::output ? dv : (want_weights && t == tensor_layout{want_weights, want_lse}.weights_index()) ? Sk : 1;
        rows[n / width] = 1;
    }

    /// The wanted elements (want.index[t][m]; entries not pending are left 0) of the rows flagged.
    template <unsigned D>
    std::vector<std::vector<mpfr_interval<D>>> operator()(std::integral_constant<unsigned, D>, const std::vector<std::uint8_t>& rows,
                                                          const wanted_elements& want) const {
        using T = mpfr_interval<D>;
        using P = uniform_precision<T>;
        const tensor_layout layout{want_weights, want_lse};
        const bool w = want_weights && need[layout.weights_index()], l = want_lse && need[layout.lse_index()];
        std::size_t count = 0;
        for (std::uint8_t f : rows) count += f;
        if constexpr (D == certify::ladder[0]) {
            if (first && p->mha) {
                return first->template run<D>(want, want_weights, want_lse, stats);
            }
        }
        if (stats) stats->ladder_rows = std::max(stats->ladder_rows, count);
        attention_options o = p->options;
        o.rows = rows;
        o.threads = threads;
        std::vector<std::vector<T>> r;
        const std::size_t out_size = p->mha ? B * Sq * dout : B * H * Sq * dv;
        r.emplace_back(out_size);
        std::vector<T> wv(w ? B * H * Sq * Sk : 0), lv(l ? B * H * Sq : 0);
        tensor_view<T, 4> wview{};
        tensor_view<T, 3> lview{};
        if (w) wview = {wv.data(), {B, H, Sq, Sk}};
        if (l) lview = {lv.data(), {B, H, Sq}};
        if (!p->mha) {
            tensor_view<T, 4> out{r[0].data(), {B, H, Sq, dv}};
            scaled_dot_product_attention_into<P>(p->q, p->k, p->v, o, out, wview, lview);
        } else {
            mha_options mo;
            mo.heads = p->heads;
            mo.kv_heads = p->kv_heads;
            mo.attention = o;
            tensor_view<T, 3> out{r[0].data(), {B, Sq, dout}};
            multi_head_attention_into<P>(p->x_q, p->x_k, p->x_v, p->params, mo, out, wview, lview, tensor_view<T, 4>{});
        }
        if (want_weights) r.push_back(std::move(wv));
        if (want_lse) r.push_back(std::move(lv));
        std::vector<std::vector<T>> out(r.size());
        for (std::size_t t = 0; t < r.size(); ++t) {
            out[t].resize((*want.index)[t].size());
            for (std::size_t m = 0; m < out[t].size(); ++m)
                if (want.is_pending(t, m)) out[t][m] = std::move(r[t][(*want.index)[t][m]]);
        }
        return out;
    }
};

}  // namespace attnref::fast::detail
