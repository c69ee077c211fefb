#pragma once
/// \file certify/fast/row_rung.hpp
/// The first MPFI rung of a multi-head escalation, at a cost proportional to the escalated query
/// rows (docs/fast-certify.md "What goes to MPFI", (11)). The whole-batch ladder recomputes the key
/// and value projections of every key in MPFI for any escalated row (B·Sk·Hkv·(dk + dv)·E interval
/// multiply-adds per rung). This rung never forms K or V: it reassociates the exact products,
///
///   q_i·k_j = x_k,j·(W_k^hk q_i) + b_k^hk·q_i                                  (logits)
///   Σ_d (Σ_j P_ij v_j)_d W_o[h·dv + d, c] = Σ_j P_ij (x_v,j·u_c + b_v^hk·w_c),
///        u_c = W_v^hk w_c,  w_c = W_o[h·dv : (h + 1)·dv, c]                       (values)
///
/// so that an escalated query row needs, per head, one vector r = W_k^hk q_i (triple-word products)
/// and, per undecided output column c, one vector u_c (triple-word dot products of exact doubles,
/// triple_dot.hpp (10)); every key then costs one triple-word dot product of x_k,j (and of x_v,j)
/// with those few columns, in double arithmetic. r is split into three doubles plus a bound
/// (r1 + r2 + r3 ± ρ, from its MPFI enclosure), so x_k,j·r is three (10) dot products plus
/// ‖x_k,j‖₁·max ρ. Each key's logit and value are then enclosed in mpfr_interval<D> (outward-rounded
/// additions of the parts and their bounds), and the rest follows the per-row steps of the forward's
/// templates (logits_row for the scale, soft-capping, ALiBi and masks; softmax_row or online_softmax;
/// P times the values) and adds the heads and the output bias. Every interval encloses the exact
/// value, so whatever the rung certifies is the correctly rounded value: the same bytes as the
/// whole-batch ladder; what it leaves undecided goes on to the ladder's next rungs.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <mpfi.h>

#include "attnref/core/attention.hpp"
#include "attnref/core/double_double.hpp"
#include "attnref/certify/fast/problem.hpp"
#include "attnref/certify/fast/triple_dot.hpp"
#include "attnref/core/multi_head_attention.hpp"
#include "attnref/multiprecision/multiprecision.hpp"
#include "attnref/core/parallel.hpp"
#include "attnref/core/precision.hpp"
#include "attnref/core/softmax.hpp"
#include "attnref/core/tensor.hpp"

namespace attnref::fast::detail {

/// Which elements a rung is asked for: per tensor (output, then weights and lse when present, as in
/// tensor_layout), the full indices and whether each is still pending.
struct wanted_elements {
    const std::vector<std::vector<std::size_t>>* index;
    const std::vector<std::vector<std::uint8_t>>* pending;  ///< empty: all
    bool is_pending(std::size_t t, std::size_t m) const {
        return pending->empty() || (*pending)[t].empty() || (*pending)[t][m];
    }
};

/// Columns given as three doubles per entry plus a bound: entry (e, c) of the exact matrix lies in
/// part[0] + part[1] + part[2] ± rho, rho = max over e of the bounds of column c.
struct split_columns {
    std::size_t rows = 0, cols = 0;
    std::vector<double> part[3];
    std::vector<double> rho;  ///< per column
    void resize(std::size_t r, std::size_t c) {
        rows = r, cols = c;
        for (auto& p : part) p.assign(r * c, 0.0);
        rho.assign(c, 0.0);
    }
    /// Entry (e, c) from its MPFI enclosure: the three nearest doubles of the successive midpoints,
    /// the rest bounded by the magnitude of the enclosure minus them (outward-rounded, rounded up).
    template <class T>
    void set_from(std::size_t e, std::size_t c, const T& x) {
        T rest = x;
        mpfr_t mid;
        mpfr_init2(mid, mpfi_get_prec(rest.backend().data()));
        for (auto& p : part) {
            mpfi_mid(mid, rest.backend().data());
            const double d = mpfr_get_d(mid, MPFR_RNDN);
            p[e * cols + c] = d;
            rest = rest - T(d);
        }
        mpfi_mag(mid, rest.backend().data());
        rho[c] = std::max(rho[c], mpfr_get_d(mid, MPFR_RNDU));
        mpfr_clear(mid);
    }
    /// Entry (e, c) from a triple-word dot product hi + mid + low ± err of exact doubles.
    void set_from(std::size_t e, std::size_t c, double hi, double mid, double low, double err) {
        part[0][e * cols + c] = hi, part[1][e * cols + c] = mid, part[2][e * cols + c] = low;
        rho[c] = std::max(rho[c], err);
    }
};

/// ‖x‖₁ of n exact doubles, rounded upward (sum_up).
inline double norm1_up(const double* x, std::size_t n) {
    double norm = 0;
    for (std::size_t e = 0; e < n; ++e) norm += std::fabs(x[e]);
    return dw::sum_up(norm, n);
}

/// r += hi + mid + low ± err, each addition in mpfr_interval rounded outward (bound: 53-bit scratch).
inline void add_enclosed(mpfi_ptr r, double hi, double mid, double low, double err, mpfi_ptr bound) {
    mpfi_add_d(r, r, hi);
    mpfi_add_d(r, r, mid);
    mpfi_add_d(r, r, low);
    mpfi_interv_d(bound, -err, err);
    mpfi_add(r, r, bound);
}

/// The enclosures of x·S (x a row of E exact doubles, S split columns) for every column: the three
/// parts' (10) dot products, their bounds and ‖x‖₁·ρ, added in mpfr_interval (each addition rounded
/// outward). Scratch: 4·cols doubles.
template <class T>
void enclose_row_times(const double* x, const split_columns& s, std::vector<double>& scratch, T* out) {
    const std::size_t n = s.rows, m = s.cols;
    scratch.resize(4 * m);
    double* hi = scratch.data();
    double* mi = hi + m;
    double* lo = mi + m;
    double* er = lo + m;
    const double norm = norm1_up(x, n);
    mpfi_t bound;
    mpfi_init2(bound, 53);
    for (std::size_t c = 0; c < m; ++c) out[c] = T(0);
    for (const auto& part : s.part) {
        dot3_rows(x, n, part.data(), m, m, hi, mi, lo, er);
        for (std::size_t c = 0; c < m; ++c) add_enclosed(out[c].backend().data(), hi[c], mi[c], lo[c], er[c], bound);
    }
    for (std::size_t c = 0; c < m; ++c)  // Σ_e |x_e|·|rest_e| ≤ ‖x‖₁·ρ_c
        add_enclosed(out[c].backend().data(), 0.0, 0.0, 0.0, dw::up(norm * s.rho[c]), bound);
    mpfi_clear(bound);
}

/// The first rung of a multi-head escalation (kept across the ladder's rungs; it only runs on the first).
struct row_rung {
    const fast_problem* p;
    std::size_t threads;

    /// The wanted elements (aligned with want.index: entry m of tensor t is element index[t][m];
    /// entries that are not pending are left 0); tensors: output, then weights and lse when present.
    /// Counts what it computed in stats (row_rung_rows, row_rung_query_rows, row_rung_output_rows).
    template <unsigned D>
    std::vector<std::vector<mpfr_interval<D>>> run(const wanted_elements& want, bool has_weights, bool has_lse,
                                                   fast_stats* stats = nullptr) {
        using T = mpfr_interval<D>;
        mha_options mo;
        mo.heads = p->heads;
        mo.kv_heads = p->kv_heads;
        const mha_dims d = mha_dims_of(p->x_q, p->x_k, p->x_v, p->params, mo);
        const std::size_t B = d.batch, H = d.heads, Hkv = d.kv_heads, Sq = d.query_length, Sk = d.key_length, dk = d.head_dim_qk,
                          dv = d.head_dim_v, E = p->x_q.extents[2], Ek = p->x_k.extents[2], Ev = p->x_v.extents[2],
                          dout = d.output_dim, group = H / Hkv;
        const std::size_t nt = want.index->size();
        const std::size_t w_t = has_weights ? 1 : nt, l_t = has_lse ? (has_weights ? 2 : 1) : nt;
        // What the pending elements need: an output → every head of its query row and its column;
        // a weight or an lse → its own (b, h, i) row.
        std::vector<std::uint8_t> head_rows(B * H * Sq, 0);
        std::vector<std::vector<std::size_t>> out_cols(B * Sq);
        for (std::size_t t = 0; t < nt; ++t)
            for (std::size_t m = 0; m < (*want.index)[t].size(); ++m) {
                if (!want.is_pending(t, m)) continue;
                const std::size_t n = (*want.index)[t][m];
                if (t == 0) {
                    const std::size_t row = n / dout, b = row / Sq, i = row % Sq;
                    out_cols[row].push_back(n % dout);
                    for (std::size_t h = 0; h < H; ++h) head_rows[(b * H + h) * Sq + i] = 1;
                } else if (t == w_t) {
                    head_rows[n / Sk] = 1;
                } else if (t == l_t) {
                    head_rows[n] = 1;
                }
            }
        for (auto& c : out_cols) std::sort(c.begin(), c.end()), c.erase(std::unique(c.begin(), c.end()), c.end());
        // Query rows with some head row, in (b, i) order.
        std::vector<std::size_t> q_rows;
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t i = 0; i < Sq; ++i)
                for (std::size_t h = 0; h < H; ++h)
                    if (head_rows[(b * H + h) * Sq + i]) {
                        q_rows.push_back(b * Sq + i);
                        break;
                    }
        std::vector<std::vector<T>> result(nt);
        for (std::size_t t = 0; t < nt; ++t) result[t].resize((*want.index)[t].size());
        if (q_rows.empty()) return result;

        const attention_options& o = p->options;
        const attention_dims adims{B, H, Hkv, Sq, Sk, dk, dv};
        // The Q projection of the escalated query rows by (10): q = hi + mid + low + b_q ± err per
        // column, kept as four exact parts (column-major per head: qp[(r·H·dk + h·dk + c)·4 + part])
        // and the bound.
        const std::size_t nq = q_rows.size(), nqc = H * dk;
        std::vector<double> qp(nq * nqc * 4), qerr(nq * nqc);
        parallel_for(nq, threads, [&](std::size_t r) {
            std::vector<double> hi(nqc), mid(nqc), low(nqc);
            dot3_rows(p->x_q.data + q_rows[r] * E, E, p->params.w_q.data, nqc, nqc, hi.data(), mid.data(), low.data(), qerr.data() + r * nqc);
            for (std::size_t c = 0; c < nqc; ++c) {
                double* part = qp.data() + (r * nqc + c) * 4;
                part[0] = hi[c], part[1] = mid[c], part[2] = low[c], part[3] = p->params.b_q.empty() ? 0.0 : p->params.b_q.data[c];
            }
        });

        // The output elements' vectors u_c = W_v^hk w_c (triple-word (10) dot products of exact
        // doubles, one per (e, h, c)) do not depend on the query row: computed once per column.
        std::vector<std::size_t> all_cols;
        for (const auto& c : out_cols) all_cols.insert(all_cols.end(), c.begin(), c.end());
        std::sort(all_cols.begin(), all_cols.end()), all_cols.erase(std::unique(all_cols.begin(), all_cols.end()), all_cols.end());
        const std::size_t nc = all_cols.size();
        std::vector<std::vector<double>> u3(nc * H);  // (h, column) → Ev × 4 (hi, mid, low, err)
        parallel_for(nc * H, threads, [&](std::size_t task) {
            const std::size_t ci = task / H, h = task % H, c = all_cols[ci], hk = h / group;
            std::vector<double> wc(dv);
            for (std::size_t dd = 0; dd < dv; ++dd) wc[dd] = p->params.w_o.data[(h * dv + dd) * dout + c];
            std::vector<double>& u = u3[task];
            u.resize(Ev * 4);
            for (std::size_t e = 0; e < Ev; ++e)
                dot3_rows(p->params.w_v.data + e * (Hkv * dv) + hk * dv, dv, wc.data(), 1, 1, &u[e * 4], &u[e * 4 + 1], &u[e * 4 + 2],
                          &u[e * 4 + 3]);
        });

        std::size_t attention_rows = 0, output_rows = 0;
        for (std::size_t r = 0; r < nq; ++r) {
            const std::size_t row = q_rows[r], b = row / Sq, i = row % Sq;
            std::vector<std::size_t> heads;
            for (std::size_t h = 0; h < H; ++h)
                if (head_rows[(b * H + h) * Sq + i]) heads.push_back(h);
            const std::vector<std::size_t>& cols = out_cols[row];
            const std::size_t nh = heads.size(), ncol = cols.size(), nvc = cols.empty() ? 0 : H * ncol;
            attention_rows += nh;
            output_rows += ncol ? 1 : 0;

            // Per head: r = W_k^hk q_i (logits) and β = b_k^hk·q_i, each a row of exact doubles
            // times q's four parts by (10) plus ‖row‖₁·max err_q, added in T; r then split.
            split_columns rk;
            rk.resize(Ek, nh);
            std::vector<T> beta_k(nh, T(0));
            parallel_for(nh, threads, [&](std::size_t a) {
                const std::size_t h = heads[a], hk = h / group;
                const double* qh = qp.data() + (r * nqc + h * dk) * 4;
                double qe = 0;
                for (std::size_t c = 0; c < dk; ++c) qe = std::max(qe, qerr[r * nqc + h * dk + c]);
                auto times_q = [&](const double* row, T& out) {
                    double hi[4], mid[4], low[4], err[4];
                    dot3_rows(row, dk, qh, 4, 4, hi, mid, low, err);
                    mpfi_t bound;
                    mpfi_init2(bound, 53);
                    out = T(0);
                    mpfi_ptr o = out.backend().data();
                    for (int k = 0; k < 4; ++k) add_enclosed(o, hi[k], mid[k], low[k], err[k], bound);
                    add_enclosed(o, 0.0, 0.0, 0.0, dw::up(norm1_up(row, dk) * qe), bound);  // ≥ Σ_c |row_c|·err_q,c
                    mpfi_clear(bound);
                };
                T s;
                for (std::size_t e = 0; e < Ek; ++e) {
                    times_q(p->params.w_k.data + e * (Hkv * dk) + hk * dk, s);
                    rk.set_from(e, a, s);
                }
                if (!p->params.b_k.empty()) times_q(p->params.b_k.data + hk * dk, beta_k[a]);
            }, &thread_cleanup<T>::run);
            // Per (h, c) of the row's output columns: u_c split as its (10) parts (values); β_v = b_v^hk·w_c.
            split_columns rv;
            rv.resize(Ev, nvc);
            std::vector<T> beta_v(nvc, T(0));
            for (std::size_t h = 0; h < H && ncol; ++h)
                for (std::size_t a = 0; a < ncol; ++a) {
                    const std::size_t ci = static_cast<std::size_t>(std::lower_bound(all_cols.begin(), all_cols.end(), cols[a]) - all_cols.begin());
                    const std::vector<double>& u = u3[ci * H + h];
                    for (std::size_t e = 0; e < Ev; ++e) rv.set_from(e, h * ncol + a, u[e * 4], u[e * 4 + 1], u[e * 4 + 2], u[e * 4 + 3]);
                    if (!p->params.b_v.empty())
                        for (std::size_t dd = 0; dd < dv; ++dd)
                            beta_v[h * ncol + a] = beta_v[h * ncol + a] +
                                                   T(p->params.b_v.data[(h / group) * dv + dd]) * T(p->params.w_o.data[(h * dv + dd) * dout + cols[a]]);
                }
            // Every key of batch b: its raw logit q_i·k_j per head and its value x_v,j·u_c + β_v per (h, c).
            std::vector<T> raw(Sk * nh), val(Sk * nvc);
            constexpr std::size_t chunk = 64;
            parallel_for((Sk + chunk - 1) / chunk, threads, [&](std::size_t block) {
                std::vector<double> scratch;
                std::vector<T> tmp(std::max(nh, nvc));
                for (std::size_t j = block * chunk; j < std::min(Sk, (block + 1) * chunk); ++j) {
                    enclose_row_times(p->x_k.data + (b * Sk + j) * Ek, rk, scratch, tmp.data());
                    for (std::size_t a = 0; a < nh; ++a) raw[a * Sk + j] = tmp[a] + beta_k[a];
                    if (nvc) {
                        enclose_row_times(p->x_v.data + (b * Sk + j) * Ev, rv, scratch, tmp.data());
                        for (std::size_t a = 0; a < nvc; ++a) val[j * nvc + a] = tmp[a] + beta_v[a];
                    }
                }
            }, &thread_cleanup<T>::run);

            // The attention rows (b, h, i): the per-row steps of scaled_dot_product_attention_into
            // (uniform precision: logits, softmax and P times the values in T, weights unscaled), on
            // the raw logits (logits_row with a one-element "head": the scale, soft-capping, ALiBi
            // and the masks as the templates apply them) and on the ncol values per key of head h.
            std::vector<T> head_out(nh * ncol);
            parallel_for(nh, threads, [&](std::size_t a) {
                const std::size_t h = heads[a];
                logit_stage::logits_context<T> ctx = logit_stage::make_logits_context<T>(o, adims, h);
                const T factor = o.placement == scale_placement::on_product ? T(1) : ctx.scale;  // q·s, or (q·√s)·(k·√s)
                ctx.dims.head_dim_qk = 1;
                std::vector<T> logits(Sk, T(0)), pr(Sk, T(0)), ov(ncol, T(0));
                std::vector<std::uint8_t> allowed(Sk, 0);
                logit_stage::logits_row<T>(ctx, b, h, i, std::span<const T>(&factor, 1), std::span<const T>(raw.data() + a * Sk, Sk), logits,
                                           allowed);
                T* out = ov.data();
                auto accumulate = [&](const T& w, std::size_t j) {
                    const T* vj = val.data() + j * nvc + h * ncol;
                    for (std::size_t c = 0; c < ncol; ++c) out[c] = out[c] + w * vj[c];
                };
                const T row_lse = softmax_and_values<T>(
                    o.softmax, logits, allowed, pr, has_weights, accumulate,
                    [&](const T& f) {
                        for (std::size_t c = 0; c < ncol; ++c) out[c] = out[c] * f;
                    },
                    [&](const T& sum) {
                        for (std::size_t c = 0; c < ncol; ++c) out[c] = out[c] / sum;
                    },
                    [&] {
                        for (std::size_t c = 0; c < ncol; ++c) out[c] = quiet_NaN<T>();
                    });
                for (std::size_t c = 0; c < ncol; ++c) head_out[a * ncol + c] = out[c];
                // The weights and lse this row was asked for.
                for (std::size_t t = 1; t < nt; ++t)
                    for (std::size_t m = 0; m < (*want.index)[t].size(); ++m) {
                        if (!want.is_pending(t, m)) continue;
                        const std::size_t n = (*want.index)[t][m];
                        const std::size_t hr = t == w_t ? n / Sk : n;
                        if (hr != (b * H + h) * Sq + i) continue;
                        result[t][m] = t == w_t ? pr[n % Sk] : row_lse;
                    }
            }, &thread_cleanup<T>::run);

            // The outputs: b_o[c] + Σ_h (head h's P times its values for column c).
            for (std::size_t m = 0; ncol && m < (*want.index)[0].size(); ++m) {
                if (!want.is_pending(0, m)) continue;
                const std::size_t n = (*want.index)[0][m];
                if (n / dout != row) continue;
                const std::size_t a = static_cast<std::size_t>(std::lower_bound(cols.begin(), cols.end(), n % dout) - cols.begin());
                T s = p->params.b_o.empty() ? T(0) : T(p->params.b_o.data[n % dout]);
                for (std::size_t h = 0; h < H; ++h) s = s + head_out[h * ncol + a];
                result[0][m] = s;
            }
        }
        if (stats) stats->row_rung_rows = attention_rows, stats->row_rung_query_rows = nq, stats->row_rung_output_rows = output_rows;
        return result;
    }
};

}  // namespace attnref::fast::detail
