#pragma once
/// \file certify/fast/gradient_rung.hpp
/// The first MPFI rung of the SDPA gradient escalation, at a cost proportional to the rows and keys
/// of the undecided elements (docs/fast-certify.md (13)). The group ladder (golden/generate.hpp
/// certify_gradients_groups) recomputes a whole (batch, kv head) group's forward and backward in
/// MPFI for any undecided element of it: seven products of G·Sq·Sk·d interval multiply-adds. This
/// rung computes only the query rows an undecided element needs (its own row for dQ_ic; every row of
/// the group for dK_jc, dV_jc) and, from them, only the sums of the elements asked for. Per row:
///
///   raw_ij = q_i·k_j and dP_ij = dO_i·v_j   triple-word dot products of exact doubles (triple_dot.hpp
///                                            (10)), each enclosed in mpfr_interval<D> (outward-rounded
///                                            additions of its parts and bound)
///   S_i, P_i                                 the forward's logit step in mpfr_interval (logits_row for
///                                            the scale, soft-capping, ALiBi and masks), then P by
///                                            softmax_in_place (the softmax's exact value, any algorithm)
///   D_i = Σ_j P_ij dP_ij,  dS_ij = P_ij (dP_ij − D_i),  g_ij = s·dS_ij·(1 − t_ij²) (t = tanh(raw/cap)
///                                            with soft-capping, else 1)
///
/// and then, in mpfr_interval, a pending dQ_ic = Σ_j g_ij k_jc (its own row only), a pending
/// dK_jc = Σ_{h,i} g_ij q_ic and dV_jc = Σ_{h,i} P_ij dO_ic (every row of the group, but only key j
/// and column c). These are the exact gradients whatever the scale's placement: q·s, (q·√s)(k·√s)
/// and (q·k)·s are the same real logit, and backward.hpp's chain gives s·Σ_j dS_ij(1 − t²)k_j and
/// s·Σ_i dS_ij(1 − t²)q_i for each. The structural cases are backward.hpp's, decided from the mask:
/// masked keys add nothing, a row with one attendable key has dS = 0, an empty row gives dQ = 0
/// (zero, uniform; uniform rows add dV_j += dO_i/Sk for every key) or NaN (nan: dQ_i and the kv head's
/// dK, dV). Every interval encloses the exact value, so whatever the rung certifies is the correctly
/// rounded value: the group ladder's bytes; what it leaves undecided goes on to the ladder's next
/// rungs (the group backward in MPFI).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <cstdint>
#include <map>
#include <span>
#include <tuple>
#include <vector>

#include <mpfi.h>

#include "attnref/certify/fast/row_rung.hpp"
#include "attnref/certify/fast/triple_dot.hpp"
#include "attnref/core/attention.hpp"
#include "attnref/core/parallel.hpp"
#include "attnref/core/softmax.hpp"
#include "attnref/core/tensor.hpp"
#include "attnref/multiprecision/multiprecision.hpp"

namespace attnref::fast::detail {

/// What the gradient rung computed.
struct gradient_rung_stats {
    std::size_t groups = 0;    ///< (batch, kv head) groups it took
    std::size_t rows = 0;      ///< (b, h, i) query rows whose softmax it computed
    std::size_t declined = 0;  ///< groups left to the group ladder (more than max_keys keys asked for)
};

/// P = softmax(S) over the attendable keys as P_j = e^{S_j − c} / Σ_k e^{S_k − c}, with c the largest
/// midpoint of the logits' intervals (a double): for any real c that is the softmax's exact value, so
/// the intervals enclose the same P as softmax_row's; computed in place (no temporaries). A c that is
/// not finite (non-finite logits) falls back to softmax_row. Entries of other keys are not written.
template <class T>
void softmax_in_place(const std::vector<T>& logits, const std::vector<std::uint8_t>& allowed, std::vector<T>& p, T& sum, mpfr_t mid) {
    double c = -std::numeric_limits<double>::infinity();
    for (std::size_t j = 0; j < logits.size(); ++j)
        if (allowed[j]) {
            mpfi_mid(mid, logits[j].backend().data());
            c = std::max(c, mpfr_get_d(mid, MPFR_RNDN));
        }
    if (!std::isfinite(c)) {
        (void)softmax_row<T>(softmax_options{}, logits, allowed, p);
        return;
    }
    mpfi_set_si(sum.backend().data(), 0);
    for (std::size_t j = 0; j < logits.size(); ++j)
        if (allowed[j]) {
            mpfi_ptr e = p[j].backend().data();
            mpfi_sub_d(e, logits[j].backend().data(), c);
            mpfi_exp(e, e);
            mpfi_add(sum.backend().data(), sum.backend().data(), e);
        }
    for (std::size_t j = 0; j < logits.size(); ++j)
        if (allowed[j]) mpfi_div(p[j].backend().data(), p[j].backend().data(), sum.backend().data());
}

/// The first rung of the SDPA gradient escalation (kept across the ladder's rungs; it only runs on the first).
struct gradient_rung {
    tensor_view<const double, 4> q, k, v, dO;  ///< the exact inputs and grad_output
    const attention_options* options;
    std::size_t threads = 0;
    /// A group with more keys asked for (dK or dV) is declined: the rung keeps two intervals per
    /// (row, key asked for), G·Sq·max_keys·2 of them, and the group ladder's cost does not grow with them.
    std::size_t max_keys = 256;

    /// The wanted elements of dQ, dK, dV (tensors 0, 1, 2; entry m of tensor t is element
    /// index[t][m] in C order; entries that are not pending are left 0). `declined` (may be null)
    /// receives the groups b·Hkv + hk it left to the group ladder (their entries left 0).
    template <unsigned D>
    std::vector<std::vector<mpfr_interval<D>>> run(const wanted_elements& want, gradient_rung_stats* stats = nullptr,
                                                   std::vector<std::size_t>* declined = nullptr) const {
        using T = mpfr_interval<D>;
        const attention_options& o = *options;
        const std::size_t B = q.extents[0], H = q.extents[1], Sq = q.extents[2], dk = q.extents[3], Hkv = k.extents[1], Sk = k.extents[2],
                          dv = v.extents[3], G = H / Hkv;
        const attention_dims adims{B, H, Hkv, Sq, Sk, dk, dv};
        const std::size_t width[3] = {dk, dk, dv};
        // Per group: the dQ entries of each wanted row, (column, m); the dK/dV entries of each wanted key, (tensor, column, m).
        struct group_want {
            std::map<std::size_t, std::vector<std::pair<std::size_t, std::size_t>>> rows;                // (h, i) as h·Sq + i
            std::map<std::size_t, std::vector<std::tuple<std::size_t, std::size_t, std::size_t>>> keys;  // j
        };
        std::map<std::size_t, group_want> groups;
        for (std::size_t t = 0; t < 3; ++t)
            for (std::size_t m = 0; m < (*want.index)[t].size(); ++m) {
                if (!want.is_pending(t, m)) continue;
                const std::size_t n = (*want.index)[t][m], c = n % width[t], r = n / width[t];
                if (t == 0) {
                    const std::size_t b = r / (H * Sq), h = r / Sq % H, i = r % Sq;
                    groups[b * Hkv + h / G].rows[h % G * Sq + i].emplace_back(c, m);
                } else {
                    groups[r / Sk].keys[r % Sk].emplace_back(t, c, m);
                }
            }
        std::vector<std::vector<T>> result(3);
        for (std::size_t t = 0; t < 3; ++t) result[t].resize((*want.index)[t].size());
        gradient_rung_stats st;

        for (const auto& [gk, gw] : groups) {
            const std::size_t b = gk / Hkv, hk = gk % Hkv;
            if (gw.keys.size() > max_keys) {
                ++st.declined;
                if (declined) declined->push_back(gk);
                continue;
            }
            ++st.groups;
            // The keys asked for, and the rows to compute: every row of the group when a key is asked
            // for (its dK, dV sum over them), else the rows of the dQ elements asked for.
            std::vector<std::size_t> keys;
            for (const auto& kv : gw.keys) keys.push_back(kv.first);
            const std::size_t nk = keys.size();
            std::vector<std::size_t> rows;
            if (nk) {
                for (std::size_t r = 0; r < G * Sq; ++r) rows.push_back(r);
            } else {
                for (const auto& rw : gw.rows) rows.push_back(rw.first);
            }
            st.rows += rows.size();
            // kᵀ (dk × Sk) and vᵀ (dv × Sk) of the kv head, for the triple-word dot products.
            std::vector<double> kT(dk * Sk), vT(dv * Sk);
            for (std::size_t j = 0; j < Sk; ++j) {
                for (std::size_t c = 0; c < dk; ++c) kT[c * Sk + j] = k(b, hk, j, c);
                for (std::size_t c = 0; c < dv; ++c) vT[c * Sk + j] = v(b, hk, j, c);
            }

            // Per computed row: g and P of the keys asked for, the row's dQ entries, and whether the row is empty.
            struct row_result {
                std::vector<T> g, p, dq;
                bool empty_nan = false;
            };
            std::vector<row_result> rr(rows.size());
            constexpr std::size_t chunk = 8;
            parallel_for((rows.size() + chunk - 1) / chunk, threads, [&](std::size_t task) {
                std::vector<double> hi(Sk), mi(Sk), lo(Sk), er(Sk);
                std::vector<T> raw(Sk, T(0)), logits(Sk, T(0)), p(Sk, T(0)), dp(Sk, T(0)), g(Sk, T(0));
                std::vector<std::uint8_t> allowed(Sk, 0);
                T sum = T(0), tmp = T(0);
                mpfi_t bound;
                mpfi_init2(bound, 53);
                mpfr_t mid;
                mpfr_init2(mid, mpfi_get_prec(sum.backend().data()));
                // out[j] ⊇ x·(column j of B), every key: triple-word (10) dot products, then enclosed.
                auto enclose = [&](const double* x, std::size_t n, const std::vector<double>& bt, std::vector<T>& out) {
                    dot3_rows(x, n, bt.data(), Sk, Sk, hi.data(), mi.data(), lo.data(), er.data());
                    for (std::size_t j = 0; j < Sk; ++j) {
                        out[j] = T(0);
                        add_enclosed(out[j].backend().data(), hi[j], mi[j], lo[j], er[j], bound);
                    }
                };
                for (std::size_t a = task * chunk; a < std::min(rows.size(), (task + 1) * chunk); ++a) {
                    const std::size_t h = hk * G + rows[a] / Sq, i = rows[a] % Sq;
                    const auto dq_want = gw.rows.find(rows[a]);
                    const bool want_dq = dq_want != gw.rows.end();
                    row_result& out = rr[a];
                    out.g.assign(nk, T(0)), out.p.assign(nk, T(0));
                    if (want_dq) out.dq.assign(dq_want->second.size(), T(0));
                    logit_stage::logits_context<T> ctx = logit_stage::make_logits_context<T>(o, adims, h);
                    const T factor = o.placement == scale_placement::on_product ? T(1) : ctx.scale;  // as row_rung.hpp
                    ctx.dims.head_dim_qk = 1;
                    std::vector<double> qi(dk), doi(dv);
                    for (std::size_t c = 0; c < dk; ++c) qi[c] = q(b, h, i, c);
                    for (std::size_t c = 0; c < dv; ++c) doi[c] = dO(b, h, i, c);
                    enclose(qi.data(), dk, kT, raw);
                    logit_stage::logits_row<T>(ctx, b, h, i, std::span<const T>(&factor, 1), raw, logits, allowed);
                    const std::size_t attendable = count_allowed(allowed);
                    if (attendable == 0) {  // empty row (backward.hpp): dQ = 0 (zero, uniform) or NaN
                        if (o.softmax.empty_rows == empty_row_policy::nan) {
                            out.empty_nan = true;
                            for (T& x : out.dq) x = quiet_NaN<T>();
                        } else if (o.softmax.empty_rows == empty_row_policy::uniform) {
                            const T w = empty_row_weight<T>(o.softmax.empty_rows, Sk);
                            for (T& x : out.p) x = w;
                        }
                        continue;
                    }
                    softmax_in_place(logits, allowed, p, sum, mid);
                    enclose(doi.data(), dv, vT, dp);
                    T d = T(0);
                    for (std::size_t j = 0; j < Sk; ++j)
                        if (allowed[j]) {
                            mpfi_mul(tmp.backend().data(), p[j].backend().data(), dp[j].backend().data());
                            mpfi_add(d.backend().data(), d.backend().data(), tmp.backend().data());
                        }
                    // g_j = s·dS_j·(1 − t)(1 + t) where wanted: every key for dQ, the keys asked for otherwise.
                    auto g_of = [&](std::size_t j) {
                        if (attendable == 1) return T(0);  // one attendable key: dS = 0 exactly
                        T x = p[j] * (dp[j] - d);
                        if (o.softcap) {
                            const T t = math::tanh(ctx.scale * raw[j] / ctx.softcap);
                            x = x * ((T(1) - t) * (T(1) + t));
                        }
                        return x * ctx.scale;
                    };
                    if (want_dq) {
                        for (std::size_t j = 0; j < Sk; ++j)
                            if (allowed[j]) g[j] = g_of(j);
                        for (std::size_t e = 0; e < dq_want->second.size(); ++e) {
                            const std::size_t c = dq_want->second[e].first;
                            T s = T(0);
                            for (std::size_t j = 0; j < Sk; ++j)
                                if (allowed[j]) s = s + g[j] * T(kT[c * Sk + j]);
                            out.dq[e] = s;
                        }
                    }
                    for (std::size_t e = 0; e < nk; ++e) {
                        const std::size_t j = keys[e];
                        if (!allowed[j]) continue;  // masked: nothing from this row
                        out.g[e] = want_dq ? g[j] : g_of(j);
                        out.p[e] = p[j];
                    }
                }
                mpfi_clear(bound);
                mpfr_clear(mid);
            }, &thread_cleanup<T>::run);

            // dQ entries, then dK_jc = Σ_rows g·q_c and dV_jc = Σ_rows P·dO_c in row order (NaN for
            // the whole kv head when one of its rows is empty under the nan policy).
            bool group_nan = false;
            for (std::size_t a = 0; a < rows.size(); ++a) {
                group_nan = group_nan || rr[a].empty_nan;
                const auto dq_want = gw.rows.find(rows[a]);
                if (dq_want != gw.rows.end())
                    for (std::size_t e = 0; e < dq_want->second.size(); ++e) result[0][dq_want->second[e].second] = rr[a].dq[e];
            }
            for (std::size_t e = 0; e < nk; ++e)
                for (const auto& [t, c, m] : gw.keys.at(keys[e])) {
                    T s = T(0);
                    if (group_nan) {
                        s = quiet_NaN<T>();
                    } else {
                        for (std::size_t a = 0; a < rows.size(); ++a) {
                            const std::size_t h = hk * G + rows[a] / Sq, i = rows[a] % Sq;
                            s = s + (t == 1 ? rr[a].g[e] * T(q(b, h, i, c)) : rr[a].p[e] * T(dO(b, h, i, c)));
                        }
                    }
                    result[t][m] = s;
                }
        }
        if (stats) *stats = st;
        return result;
    }
};

}  // namespace attnref::fast::detail
