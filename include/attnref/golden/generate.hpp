#pragma once
/// \file golden/generate.hpp
/// Generating a golden case: the inputs from the generator, the certified reference — by default
/// through the fast path (certify/fast.hpp: double-double with rigorous bounds, undecided rows sent
/// to the MPFI ladder), or through the MPFI ladder alone (certify.hpp, Ziv's escalation); both give
/// the same bytes, a correctly rounded value being unique — every file serialised in memory with
/// its sha256, and the manifest. Backward cases (outputs.gradients) also certify their gradients
/// (certify_gradients: attnref's templated backward, backward.hpp, in MPFI through the same ladder;
/// or, on request, certify_gradients_fast: the fast SDPA backward, certify/fast/backward.hpp). Needs MPFR, MPFI and Boost.Multiprecision (the CMake target attnref::multiprecision);
/// loading and checking a case (golden/case.hpp, check/checker.hpp) do not.

#include <algorithm>
#include <cstdint>
#include <chrono>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <thread>
#include <string>
#include <utility>
#include <vector>

#include "attnref/core/backward.hpp"
#include "attnref/certify/certify.hpp"
#include "attnref/certify/fast.hpp"
#include "attnref/certify/fast/backward.hpp"
#include "attnref/certify/fast/gradient_rung.hpp"
#include "attnref/certify/fast/problem_of.hpp"
#include "attnref/certify/forced_zeros.hpp"
#include "attnref/core/formats.hpp"
#include "attnref/multiprecision/multiprecision.hpp"
#include "attnref/golden/case.hpp"
#include "attnref/golden/generate_memory.hpp"

// Compiled use (the build's internal target attnref_certify_compiled, which defines
// ATTNREF_GENERATE_COMPILED): the certification entry points below (certify_case_fast,
// certify_gradients, certify_gradients_groups, certify_gradients_fast, generate_case) are declared
// here and defined once in that library (src/golden/generate.cpp, which defines
// ATTNREF_GENERATE_DEFINE), so the tools and tests linking it compile none of the certification
// machinery. Header-only use: every definition, inline.
#if defined(ATTNREF_GENERATE_COMPILED)
#define ATTNREF_GENERATE_FN
#else
#define ATTNREF_GENERATE_FN inline
#endif
#if !defined(ATTNREF_GENERATE_COMPILED) || defined(ATTNREF_GENERATE_DEFINE)
#define ATTNREF_GENERATE_BODIES 1
#else
#define ATTNREF_GENERATE_BODIES 0
#endif

namespace attnref::golden {

/// The certification target of an output copy named in a case's outputs.targets (or "float64");
/// the names are binary_format's (validated by the manifest reader).
inline format_description target_format(const std::string& name) {
    const std::optional<binary_format> f = format_from_name(name);
    if (!f) throw data_error("unknown target format '" + printable(name) + "'");
    return describe(*f);
}

/// The formats a case is certified in, in the order of its files and of certify::result's values:
/// float64, then the case's extra targets (outputs.targets).
inline std::vector<format_description> target_formats(const case_spec& spec) {
    std::vector<format_description> targets{certify::float64_target};
    for (const std::string& t : spec.outputs.targets) targets.push_back(target_format(t));
    return targets;
}

/// fast::certify_fast (certify/fast.hpp) of a problem, compiled once with generate_case where the
/// build links attnref_certify_compiled (the Python module's certified reference of a call).
ATTNREF_GENERATE_FN certify::result certify_problem_fast(const fast::fast_problem& p, bool want_weights, bool want_lse,
                                                         const std::vector<format_description>& targets,
                                                         const fast::fast_options& options = {}, fast::fast_stats* stats = nullptr);
#if ATTNREF_GENERATE_BODIES
ATTNREF_GENERATE_FN certify::result certify_problem_fast(const fast::fast_problem& p, bool want_weights, bool want_lse,
                                                         const std::vector<format_description>& targets,
                                                         const fast::fast_options& options, fast::fast_stats* stats) {
    return fast::certify_fast(p, want_weights, want_lse, targets, options, stats);
}
#endif

/// The fast certified reference of a case (output, then weights and lse when the case has them; for
/// float64 and the case's extra targets, in generate_case's order).
ATTNREF_GENERATE_FN certify::result certify_case_fast(const case_spec& spec, const case_data& data, std::size_t threads,
                                         fast::fast_stats* stats = nullptr, fast::fast_options options = {});
#if ATTNREF_GENERATE_BODIES
ATTNREF_GENERATE_FN certify::result certify_case_fast(const case_spec& spec, const case_data& data, std::size_t threads,
                                         fast::fast_stats* stats, fast::fast_options options) {
    options.threads = threads;
    return certify_problem_fast(fast::fast_problem_of(problem_of(views_of(spec, data, threads))), spec.outputs.weights, spec.outputs.lse, target_formats(spec),
                                options, stats);
}
#endif

namespace generate_detail {
inline std::vector<std::byte> serialize_doubles(const std::vector<std::size_t>& shape, const std::vector<double>& v) {
    return npy::serialize(npy::make_array("<f8", shape, v));
}

/// A target copy in its golden .npy form (describe(f).npy_descr): float32 '<f4', float16 '<f2' (IEEE
/// half), bfloat16 '<u2' (bit patterns). The values are exact in the target already.
inline std::pair<std::string, std::vector<std::byte>> serialize_target(const std::string& target, const std::vector<std::size_t>& shape,
                                                                 const std::vector<double>& v) {
    const binary_format f = *format_from_name(target);
    if (f == binary_format::float32) {
        std::vector<float> x(v.begin(), v.end());  // exact: v holds float32 values
        return {"<f4", npy::serialize(npy::make_array("<f4", shape, x))};
    }
    std::vector<std::uint16_t> bits;
    bits.reserve(v.size());
    for (double x : v) bits.push_back(f == binary_format::bfloat16 ? formats::bfloat16(x).bits() : formats::float16(x).bits());  // exact
    npy::array a = npy::make_array("<u2", shape, bits);
    a.descr = describe(f).npy_descr;
    return {a.descr, npy::serialize(a)};
}

template <class T, std::size_t N>
inline std::vector<T> flat(const tensor<T, N>& t) {
    return std::vector<T>(t.data(), t.data() + t.size());
}

}  // namespace generate_detail

/// The certified gradients of a backward case (gradient_layout's tensors, in its order; for float64
/// and the case's targets), through the MPFI ladder: attnref's templated backward (backward.hpp, the
/// textbook algorithm — exact gradients do not depend on the algorithm) runs in
/// uniform_precision<mpfr_interval<D>> on the exact inputs and dO, so each gradient interval encloses
/// the exact gradient; an undecided element recomputes the whole backward at the next rung.
/// Exact zeros certify because the backward produces them structurally (decided from the mask,
/// never from an interval): masked keys, empty rows under the zero and uniform policies, query
/// rows with exactly one attendable key (dS = 0, backward.hpp) and mha's grad_b_k without
/// soft-capping; and, set here, an sdpa dQ_ic whose feature c of the keys is the same over the row's
/// attendable keys (certify/forced_zeros.hpp: Σ_j dS_ij = 0). NaN is allowed exactly where the
/// backward puts it by construction under the nan policy: for sdpa dQ of the rows the mask leaves
/// empty, dK and dV of every key of a kv head one of whose query rows is empty (backward.hpp's file
/// comment); for mha what those NaN reach through the projections (certify::mha_nan_gradients).
ATTNREF_GENERATE_FN certify::result certify_gradients(const case_spec& spec, const case_data& data, std::size_t threads,
                                         const std::vector<format_description>& targets,
                                         const std::function<void(const std::string&)>& progress = {});
#if ATTNREF_GENERATE_BODIES
ATTNREF_GENERATE_FN certify::result certify_gradients(const case_spec& spec, const case_data& data, std::size_t threads,
                                         const std::vector<format_description>& targets,
                                         const std::function<void(const std::string&)>& progress) {
    const std::vector<gradient_tensor_layout> layout = gradient_layout(spec);
    std::vector<std::string> names;
    certify::options opts;
    for (const gradient_tensor_layout& g : layout) names.push_back(g.role), opts.shapes.push_back(g.shape);
    const case_shapes& d = spec.shapes;
    if (spec.kind == case_kind::sdpa && spec.conventions.empty_rows == empty_row_policy::nan) {
        const std::vector<std::uint8_t> empty = empty_rows_of(spec, data);
        const std::size_t group = d.heads / d.kv_heads;
        std::vector<std::uint8_t> dq(d.batch * d.heads * d.query_length * d.head_dim_qk, 0);
        std::vector<std::uint8_t> dk(d.batch * d.kv_heads * d.key_length * d.head_dim_qk, 0);
        std::vector<std::uint8_t> dv(d.batch * d.kv_heads * d.key_length * d.head_dim_v, 0);
        for (std::size_t b = 0; b < d.batch; ++b)
            for (std::size_t h = 0; h < d.heads; ++h)
                for (std::size_t i = 0; i < d.query_length; ++i) {
                    if (!empty[(b * d.heads + h) * d.query_length + i]) continue;
                    const std::size_t row = (b * d.heads + h) * d.query_length + i, kv = b * d.kv_heads + h / group;
                    std::fill_n(dq.begin() + static_cast<std::ptrdiff_t>(row * d.head_dim_qk), d.head_dim_qk, std::uint8_t{1});
                    std::fill_n(dk.begin() + static_cast<std::ptrdiff_t>(kv * d.key_length * d.head_dim_qk), d.key_length * d.head_dim_qk,
                                std::uint8_t{1});
                    std::fill_n(dv.begin() + static_cast<std::ptrdiff_t>(kv * d.key_length * d.head_dim_v), d.key_length * d.head_dim_v,
                                std::uint8_t{1});
                }
        opts.nan_allowed = {std::move(dq), std::move(dk), std::move(dv)};
    }
    if (spec.kind == case_kind::mha && spec.conventions.empty_rows == empty_row_policy::nan) {
        const certify::mha_gradient_dims md{d.batch, d.heads, d.kv_heads, d.query_length, d.key_length, d.head_dim_qk, d.head_dim_v,
                                            layout[0].shape.back(), layout[1].shape.back(), layout[2].shape.back(), layout[6].shape.back()};
        opts.nan_allowed = certify::mha_nan_gradients(md, empty_rows_of(spec, data));
        opts.nan_allowed.resize(layout.size());  // without projection biases: no bias gradients
    }
    const case_views c = views_of(spec, data, threads);
    // dQ elements that are exactly 0 by the keys' equal feature (certify/forced_zeros.hpp), set as such.
    const std::vector<std::uint8_t> dq_zero =
        c.sdpa() ? certify::forced_zero_query_gradients(c.o, c.q.extents, c.k) : std::vector<std::uint8_t>{};
    opts.progress = [&](std::size_t rung, int bits, std::size_t pending) {
        if (!progress) return;
        if (rung == 0) progress(spec.name + ": computing the gradients' enclosure at " + std::to_string(bits) + " bits");
        else progress(spec.name + ": " + std::to_string(pending) + " gradient element(s) uncertified, escalating to " + std::to_string(bits) + " bits");
    };
    return certify::certify(
        names, targets,
        [&]<unsigned D>(std::integral_constant<unsigned, D>) {
            using T = mpfr_interval<D>;
            using P = uniform_precision<T>;
            std::vector<std::vector<T>> r;
            if (c.sdpa()) {
                const tensor_view<const double, 4> g{data.grad_output.data(), {d.batch, d.heads, d.query_length, d.head_dim_v}};
                const attention_gradients<P> a = scaled_dot_product_attention_backward<P, double, double, double, double>(c.q, c.k, c.v, g, c.o);
                r = {generate_detail::flat(a.grad_query), generate_detail::flat(a.grad_key), generate_detail::flat(a.grad_value)};
                for (std::size_t n = 0; n < dq_zero.size(); ++n)
                    if (dq_zero[n]) r[0][n] = T(0);
            } else {
                const tensor_view<const double, 3> g{data.grad_output.data(), {d.batch, d.query_length, d.output_dim}};
                const mha_gradients<P> a = multi_head_attention_backward<P, double, double, double>(c.x_q, c.x_k, c.x_v, c.w, c.mo, g);
                r = {generate_detail::flat(a.grad_x_q), generate_detail::flat(a.grad_x_k), generate_detail::flat(a.grad_x_v),
                     generate_detail::flat(a.grad_w_q), generate_detail::flat(a.grad_w_k), generate_detail::flat(a.grad_w_v),
                     generate_detail::flat(a.grad_w_o)};
                if (spec.conventions.projection_bias)
                    for (const tensor<T, 1>* b : {&a.grad_b_q, &a.grad_b_k, &a.grad_b_v, &a.grad_b_o}) r.push_back(generate_detail::flat(*b));
            }
            return r;
        },
        opts);
}
#endif

namespace generate_detail {
/// The part of a broadcast mask (B or 1, H or 1, Sq, Sk) that batch b and query heads h0 … h0 + G − 1
/// see, as a mask of the sub-problem (1, G or 1, Sq, Sk); contiguous in C order.
template <class E>
broadcast_mask<E> group_mask(const broadcast_mask<E>& m, std::size_t b, std::size_t h0, std::size_t G) {
    if (!m.present()) return m;
    const extents_t<4>& e = m.values.extents;
    const std::size_t bb = e[0] == 1 ? 0 : b, hh = e[1] == 1 ? 0 : h0;
    return {{m.values.data + ((bb * e[1] + hh) * e[2]) * e[3], {1, e[1] == 1 ? 1 : G, e[2], e[3]}}};
}
}  // namespace generate_detail

/// The options of the SDPA sub-problem of one (batch b, kv head) group whose query heads are
/// h0 … h0 + G − 1: what is per batch or per head (key lengths, ALiBi slopes, the boolean, additive
/// and seed masks) sliced to that batch and those heads, the rest as in `o`, one thread. Every row of
/// the sub-problem is the full problem's row (b, h0 + g, i) with the same keys, so its backward is the
/// group's part of the full backward (backward.hpp: tasks are (batch, kv head) pairs).
inline attention_options group_options(const attention_options& o, std::size_t b, std::size_t h0, std::size_t G) {
    attention_options s = o;
    s.threads = 1;
    s.rows = {};
    s.pv_weights = {};
    if (!o.alibi_slopes.empty()) s.alibi_slopes = o.alibi_slopes.subspan(h0, G);
    if (!o.mask.key_lengths.empty()) s.mask.key_lengths = o.mask.key_lengths.subspan(b, 1);
    s.mask.boolean = generate_detail::group_mask(o.mask.boolean, b, h0, G);
    s.mask.additive = generate_detail::group_mask(o.mask.additive, b, h0, G);
    s.mask.seed = generate_detail::group_mask(o.mask.seed, b, h0, G);
    return s;
}

/// What certify_gradients_groups certified: per gradient tensor (dQ, dK, dV), the flat index in the
/// full tensor of each element asked for (`index`) and its values (result.values, in that order).
struct group_escalation {
    certify::result result;
    std::vector<std::vector<std::size_t>> index;
    std::size_t groups = 0;      ///< (batch, kv head) groups holding some element asked for
    std::size_t concurrent = 0;  ///< groups computed at the same time (threads, within max_memory())
    std::vector<std::size_t> group_computations;  ///< per group: how many ladder rungs recomputed it
    fast::detail::gradient_rung_stats rung;       ///< what the first rung (gradient_rung.hpp) computed, when it ran
};

/// The MPFI ladder (certify::certify, as certify_gradients) for the elements of an SDPA case's
/// gradients flagged in `wanted` (per tensor dQ, dK, dV, flat in C order). The first rung is the
/// gradient rung (certify/fast/gradient_rung.hpp: the rows and keys of the elements asked for,
/// triple-word dot products enclosed in mpfr_interval<D>) unless `rung` is false; the next rungs
/// recompute only the (batch, kv head) groups still holding undecided elements: each group's
/// backward runs as an SDPA problem of its own (group_options; attnref's templated backward in
/// mpfr_interval<D>, one thread per group, groups in parallel). An element is certified from the
/// enclosure of the same exact value as in certify_gradients, so its certified value is the same (a
/// correctly rounded value is unique). `reserved`: bytes the caller holds already; the groups
/// computed at once are as many as fit in max_memory() beside it (at least one; throws
/// uncertified_error when a group's backward is needed and one group does not fit).
ATTNREF_GENERATE_FN group_escalation certify_gradients_groups(const case_spec& spec, const case_data& data, std::size_t threads,
                                                 const std::vector<format_description>& targets,
                                                 const std::vector<std::vector<std::uint8_t>>& wanted,
                                                 const std::function<void(const std::string&)>& progress = {},
                                                 std::uint64_t reserved = 0, bool rung = true);
#if ATTNREF_GENERATE_BODIES
ATTNREF_GENERATE_FN group_escalation certify_gradients_groups(const case_spec& spec, const case_data& data, std::size_t threads,
                                                 const std::vector<format_description>& targets,
                                                 const std::vector<std::vector<std::uint8_t>>& wanted,
                                                 const std::function<void(const std::string&)>& progress,
                                                 std::uint64_t reserved, bool rung) {
    if (spec.kind != case_kind::sdpa) throw std::logic_error("certify_gradients_groups: SDPA cases only");
    const case_shapes& d = spec.shapes;
    const std::size_t B = d.batch, H = d.heads, Hkv = d.kv_heads, G = H / Hkv, Sq = d.query_length, Sk = d.key_length,
                      dk = d.head_dim_qk, dv = d.head_dim_v;
    const std::vector<gradient_tensor_layout> layout = gradient_layout(spec);
    const std::size_t width[3] = {dk, dk, dv};
    // The group (b·Hkv + hk) of element n of tensor t, and its flat index in the group's sub-problem.
    auto group_of = [&](std::size_t t, std::size_t n) {
        if (t == 0) {
            const std::size_t bh = n / (Sq * dk);
            return (bh / H) * Hkv + (bh % H) / G;
        }
        return n / (Sk * width[t]);
    };
    auto local_of = [&](std::size_t t, std::size_t n) {
        if (t == 0) {
            const std::size_t bh = n / (Sq * dk), b = bh / H, h0 = (bh % H) / G * G;
            return n - (b * H + h0) * Sq * dk;
        }
        return n % (Sk * width[t]);
    };
    group_escalation e;
    e.index.resize(3);
    std::vector<std::size_t> group_id(B * Hkv, SIZE_MAX), groups;
    for (std::size_t t = 0; t < 3; ++t)
        for (std::size_t n = 0; n < wanted[t].size(); ++n) {
            if (!wanted[t][n]) continue;
            e.index[t].push_back(n);
            const std::size_t gk = group_of(t, n);
            if (group_id[gk] == SIZE_MAX) group_id[gk] = 0, groups.push_back(gk);
        }
    std::sort(groups.begin(), groups.end());
    for (std::size_t k = 0; k < groups.size(); ++k) group_id[groups[k]] = k;
    e.groups = groups.size();
    e.group_computations.assign(groups.size(), 0);
    // Per group: (tensor, position in the compact tensor) of its elements.
    std::vector<std::vector<std::pair<std::size_t, std::size_t>>> members(groups.size());
    for (std::size_t t = 0; t < 3; ++t)
        for (std::size_t m = 0; m < e.index[t].size(); ++m) members[group_id[group_of(t, e.index[t][m])]].emplace_back(t, m);
    if (groups.empty()) {
        for (std::size_t t = 0; t < 3; ++t)
            for (const format_description& f : targets) e.result.reports.push_back(certify::tensor_report{layout[t].role, f.name, 0, 0, 0, {}});
        e.result.values.assign(3, std::vector<std::vector<double>>(targets.size()));
        return e;
    }
    // Memory: as many groups at once as fit beside what the caller holds.
    const std::uint64_t per_group = gradients_group_mpfi_bytes(spec), limit = max_memory();
    const std::uint64_t held = safe_io_detail::sat_add(reserved, program_bytes);
    const std::uint64_t fit = held >= limit ? 0 : (limit - held) / std::max<std::uint64_t>(per_group, 1);
    auto require_fit = [&] {  // before a group's backward (the gradient rung needs a few rows of Sk intervals per thread)
        if (fit == 0)
            throw certify::uncertified_error("the MPFI ladder for the undecided gradient elements recomputes their (batch, kv head) group's "
                                             "backward, about " + safe_io_detail::gib(safe_io_detail::sat_add(per_group, held)) +
                                             " with what is held already, above the limit of " + safe_io_detail::gib(limit) +
                                             " (raise it with --max-memory)");
    };
    if (!rung) require_fit();
    const std::size_t hw = threads ? threads : std::max<std::size_t>(1, std::thread::hardware_concurrency());
    e.concurrent = static_cast<std::size_t>(std::min<std::uint64_t>({std::uint64_t{hw}, std::uint64_t{groups.size()}, std::max<std::uint64_t>(fit, 1)}));

    // NaN is exact where certify_gradients allows it (sdpa, nan policy): dQ of empty rows, dK and dV
    // of a kv head one of whose query rows is empty.
    certify::options opts;
    std::vector<std::string> names;
    for (std::size_t t = 0; t < 3; ++t) {
        names.push_back(layout[t].role);
        opts.shapes.push_back(layout[t].shape);
    }
    opts.full_index = e.index;
    if (spec.conventions.empty_rows == empty_row_policy::nan) {
        const std::vector<std::uint8_t> empty = empty_rows_of(spec, data);
        std::vector<std::uint8_t> kv_nan(B * Hkv, 0);
        for (std::size_t r = 0; r < empty.size(); ++r)
            if (empty[r]) kv_nan[(r / (H * Sq)) * Hkv + (r / Sq % H) / G] = 1;
        opts.nan_allowed.resize(3);
        for (std::size_t t = 0; t < 3; ++t)
            for (std::size_t n : e.index[t]) opts.nan_allowed[t].push_back(t == 0 ? empty[n / dk] : kv_nan[group_of(t, n)]);
    }
    opts.progress = [&](std::size_t rung_index, int bits, std::size_t pending) {
        if (!progress) return;
        if (rung_index == 0 && rung)
            progress(spec.name + ": the rows and keys of " + std::to_string(e.index[0].size() + e.index[1].size() + e.index[2].size()) +
                     " gradient element(s) in " + std::to_string(groups.size()) + " (batch, kv head) group(s) in MPFI at " + std::to_string(bits) + " bits");
        else if (rung_index == 0) progress(spec.name + ": recomputing " + std::to_string(groups.size()) + " (batch, kv head) group(s) in MPFI at " +
                                std::to_string(bits) + " bits");
        else progress(spec.name + ": " + std::to_string(pending) + " gradient element(s) uncertified, escalating to " + std::to_string(bits) + " bits");
    };
    const case_views c = views_of(spec, data, 1);
    // dQ elements exactly 0 by the keys' equal feature (certify/forced_zeros.hpp), as certify_gradients sets them.
    std::vector<std::size_t> dq_zero;  // positions m in e.index[0]
    {
        const std::vector<std::uint8_t> z = certify::forced_zero_query_gradients(c.o, c.q.extents, c.k);
        for (std::size_t m = 0; m < e.index[0].size() && !z.empty(); ++m)
            if (z[e.index[0][m]]) dq_zero.push_back(m);
    }
    e.result = certify::certify(
        names, targets,
        [&]<unsigned D>(std::integral_constant<unsigned, D>, const certify::request& req) {
            using T = mpfr_interval<D>;
            using P = uniform_precision<T>;
            std::vector<std::vector<T>> out(3);
            for (std::size_t t = 0; t < 3; ++t) out[t].resize(e.index[t].size());
            std::vector<std::uint8_t> by_rung(groups.size(), 0);  // groups the gradient rung took
            if (rung && D == certify::ladder[0]) {  // the first rung: the gradient rung, the groups' backward after
                const tensor_view<const double, 4> g{data.grad_output.data(), {B, H, Sq, dv}};
                const fast::detail::gradient_rung first{c.q, c.k, c.v, g, &c.o, threads};
                std::vector<std::size_t> declined;
                out = first.template run<D>(fast::detail::wanted_elements{&e.index, &req.pending}, &e.rung, &declined);
                by_rung.assign(groups.size(), 1);
                for (std::size_t gk : declined) by_rung[group_id[gk]] = 0;
            }
            std::vector<std::size_t> todo;
            for (std::size_t k = 0; k < groups.size(); ++k) {
                bool pending = req.pending.empty() || (req.pending[0].empty() && req.pending[1].empty() && req.pending[2].empty());
                for (const auto& [t, m] : members[k]) pending = pending || (t < req.pending.size() && m < req.pending[t].size() && req.pending[t][m]);
                if (pending && !by_rung[k]) todo.push_back(k);
            }
            if (!todo.empty()) require_fit();
            parallel_for_dynamic(
                todo.size(), e.concurrent,
                [&](std::size_t task) {
                    const std::size_t k = todo[task], gk = groups[k], b = gk / Hkv, hk = gk % Hkv, h0 = hk * G;
                    const tensor_view<const double, 4> q{c.q.data + (b * H + h0) * Sq * dk, {1, G, Sq, dk}};
                    const tensor_view<const double, 4> kk{c.k.data + gk * Sk * dk, {1, 1, Sk, dk}};
                    const tensor_view<const double, 4> v{c.v.data + gk * Sk * dv, {1, 1, Sk, dv}};
                    const tensor_view<const double, 4> g{data.grad_output.data() + (b * H + h0) * Sq * dv, {1, G, Sq, dv}};
                    const attention_gradients<P> a =
                        scaled_dot_product_attention_backward<P, double, double, double, double>(q, kk, v, g, group_options(c.o, b, h0, G));
                    const T* src[3] = {a.grad_query.data(), a.grad_key.data(), a.grad_value.data()};
                    for (const auto& [t, m] : members[k]) out[t][m] = src[t][local_of(t, e.index[t][m])];
                    ++e.group_computations[k];
                },
                &thread_cleanup<T>::run);
            for (std::size_t m : dq_zero) out[0][m] = T(0);
            return out;
        },
        opts);
    return e;
}
#endif

/// The certified gradients of an SDPA backward case through the fast rung (certify/fast/backward.hpp:
/// double-word values with rigorous bounds, each element decided by the rounding check), the
/// elements it leaves undecided certified by the MPFI ladder on the (batch, kv head) groups that hold
/// them (certify_gradients_groups). Same values as certify_gradients (a correctly rounded value is
/// unique; tested on the committed backward cases); reports: escalated = elements the fast rung left
/// undecided, precisions_bits {106} plus the MPFI rungs when any. Multi-head cases: the fast rung
/// mha_gradients_fast (docs/fast-certify.md (14)), and what it leaves undecided through
/// certify_gradients for the whole case when that fits in max_memory() beside the fast path's
/// buffers (else uncertified_error naming the estimate). `stats`: elements escalated, and the reason when the fast rung declined
/// the whole case; `escalation`: what the MPFI ladder certified (groups, rungs per group).
ATTNREF_GENERATE_FN certify::result certify_gradients_fast(const case_spec& spec, const case_data& data, std::size_t threads,
                                              const std::vector<format_description>& targets,
                                              const std::function<void(const std::string&)>& progress = {},
                                              fast::fast_stats* stats = nullptr, fast::fast_options options = {},
                                              group_escalation* escalation = nullptr);
#if ATTNREF_GENERATE_BODIES
ATTNREF_GENERATE_FN certify::result certify_gradients_fast(const case_spec& spec, const case_data& data, std::size_t threads,
                                              const std::vector<format_description>& targets,
                                              const std::function<void(const std::string&)>& progress,
                                              fast::fast_stats* stats, fast::fast_options options,
                                              group_escalation* escalation) {
    const case_shapes& d = spec.shapes;
    const case_views c = views_of(spec, data, threads);
    options.threads = threads;
    const std::vector<gradient_tensor_layout> layout = gradient_layout(spec);
    if (progress) progress(spec.name + ": computing the gradients in double-double with error bounds");
    fast::fast_gradients fg;
    if (spec.kind == case_kind::sdpa) {
        const tensor_view<const double, 4> g{data.grad_output.data(), {d.batch, d.heads, d.query_length, d.head_dim_v}};
        fg = fast::sdpa_gradients_fast(fast::fast_problem_of(problem_of(c)), g, targets, options);
    } else {
        const tensor_view<const double, 3> g{data.grad_output.data(), {d.batch, d.query_length, d.output_dim}};
        fg = fast::mha_gradients_fast(fast::fast_problem_of(problem_of(c)), g, targets, options);
        fg.values.resize(layout.size());  // without projection biases: no bias gradients
        fg.undecided.resize(layout.size());
        fast::detail::count_undecided(fg);
    }
    certify::result r;
    r.precisions_bits = {106};
    for (std::size_t t = 0; t < layout.size(); ++t) {
        std::size_t left = 0;
        for (std::uint8_t f : fg.undecided[t]) left += f;
        for (const format_description& f : targets)
            r.reports.push_back(certify::tensor_report{layout[t].role, f.name, fg.undecided[t].size(), fg.undecided[t].size(), left, {106}});
    }
    if (stats) {
        stats->whole_case_reason = fg.whole_case_reason;
        stats->escalated_elements = fg.undecided_elements;
    }
    if (fg.undecided_elements && options.fallback && spec.kind == case_kind::mha) {
        // Multi-head attention: the MPFI ladder for the whole case (every projection couples all rows),
        // when it fits in max_memory() beside the fast path's buffers; else the case is inconclusive.
        const std::uint64_t need = safe_io_detail::sat_add(gradients_mpfi_bytes(spec), gradients_fast_bytes(spec, threads));
        if (need > max_memory())
            throw certify::uncertified_error(std::to_string(fg.undecided_elements) +
                                             " gradient element(s) undecided by the fast backward; the MPFI ladder for the whole multi-head "
                                             "case would need about " + safe_io_detail::gib(need) + ", above the limit of " +
                                             safe_io_detail::gib(max_memory()) + " (raise it with --max-memory)");
        if (progress)
            progress(spec.name + ": " + std::to_string(fg.undecided_elements) + " gradient element(s) undecided, through the MPFI ladder (whole case)");
        const certify::result whole = certify_gradients(spec, data, threads, targets, progress);
        for (std::size_t t = 0; t < layout.size(); ++t)
            for (std::size_t n = 0; n < fg.undecided[t].size(); ++n)
                if (fg.undecided[t][n])
                    for (std::size_t k = 0; k < targets.size(); ++k) fg.values[t][k][n] = whole.values[t][k][n];
        for (int b : whole.precisions_bits) r.precisions_bits.push_back(b);
        for (certify::tensor_report& rep : r.reports)
            if (rep.escalated) rep.precisions_bits.insert(rep.precisions_bits.end(), whole.precisions_bits.begin(), whole.precisions_bits.end());
    } else if (fg.undecided_elements && options.fallback) {
        if (progress) progress(spec.name + ": " + std::to_string(fg.undecided_elements) + " gradient element(s) undecided, through the MPFI ladder");
        group_escalation ge;
        try {
            ge = certify_gradients_groups(spec, data, threads, targets, fg.undecided, progress, gradients_fast_bytes(spec, threads),
                                          options.gradient_rung);
        } catch (const certify::uncertified_error& e) {
            throw certify::uncertified_error(std::to_string(fg.undecided_elements) + " gradient element(s) undecided by the fast backward; " + e.what());
        }
        for (std::size_t t = 0; t < layout.size(); ++t)
            for (std::size_t m = 0; m < ge.index[t].size(); ++m)
                for (std::size_t k = 0; k < targets.size(); ++k) fg.values[t][k][ge.index[t][m]] = ge.result.values[t][k][m];
        for (int b : ge.result.precisions_bits) r.precisions_bits.push_back(b);
        for (certify::tensor_report& rep : r.reports)
            if (rep.escalated)
                rep.precisions_bits.insert(rep.precisions_bits.end(), ge.result.precisions_bits.begin(), ge.result.precisions_bits.end());
        if (escalation) *escalation = std::move(ge);
    } else if (fg.undecided_elements) {
        for (certify::tensor_report& rep : r.reports) rep.certified = rep.elements - rep.escalated;
    }
    r.values = std::move(fg.values);
    return r;
}
#endif

/// Generates the inputs, certifies the reference (threads for attnref's parallel_for) and
/// serialises everything. `progress` receives one-line messages (may be empty). `inputs`: the
/// case's inputs when they do not come from the generator (a "files" case, user_inputs.hpp).
/// `fast_gradients`: an SDPA backward case's gradients through the fast backward
/// (certify_gradients_fast; the manifest says so with reference_method_fast_gradients_suffix) under
/// the fast method; otherwise, and for the committed suite, through the MPFI ladder (certify_gradients).
ATTNREF_GENERATE_FN generated_case generate_case(const case_spec& spec, std::size_t threads, const std::function<void(const std::string&)>& progress = {},
                                    certification_method method = certification_method::fast, const case_data* inputs = nullptr,
                                    bool fast_gradients = false);
#if ATTNREF_GENERATE_BODIES
ATTNREF_GENERATE_FN generated_case generate_case(const case_spec& spec, std::size_t threads, const std::function<void(const std::string&)>& progress,
                                    certification_method method, const case_data* inputs,
                                    bool fast_gradients) {
    const auto start = std::chrono::steady_clock::now();
    generated_case g;
    g.m.spec = spec;
    const case_data data = inputs ? *inputs : generate_inputs(spec);

    // Inputs: '<f8' values of the input format; mask '|b1'.
    for (const input_tensor_layout& t : input_layout(spec)) {
        const std::string role(generator::role_name(t.role));
        case_file f{role + ".npy", {}};
        std::string dtype = "<f8";
        if (t.role == generator::role::mask) {
            dtype = "|b1";
            f.bytes = npy::serialize(npy::make_array("|b1", t.shape, data.mask));
        } else {
            f.bytes = generate_detail::serialize_doubles(t.shape, *const_cast<case_data&>(data).real(t.role));
        }
        g.m.tensors.push_back({role, std::nullopt, f.name, dtype, t.shape, sha256_hex(f.bytes)});
        g.files.push_back(std::move(f));
    }

    // Certified outputs.
    std::vector<std::string> names{"output"};
    std::vector<std::vector<std::size_t>> shapes{output_shape(spec)};
    if (spec.outputs.weights) names.push_back("weights"), shapes.push_back(weights_shape(spec));
    if (spec.outputs.lse) names.push_back("lse"), shapes.push_back(lse_shape(spec));
    const std::vector<format_description> targets = target_formats(spec);

    // The fast path by default; the MPFI ladder alone on request (its NaN and row rules below).
    certify::result cert;
    try {
        if (method == certification_method::fast) {
            if (progress) progress(spec.name + ": computing in double-double with error bounds");
            cert = certify_case_fast(spec, data, threads);
        } else {
            certify::options opts;
            opts.shapes = shapes;
            // NaN is exact only in rows that are empty from the mask alone under the nan policy, and in
            // what they feed: their output and weights (sdpa: row (b, h, i); mha: every output feature of
            // query row (b, i) once one of its heads is empty). lse of an empty row is −inf, never NaN.
            const std::vector<std::uint8_t> empty = empty_rows_of(spec, data);
            const case_shapes& d = spec.shapes;
            const std::size_t rows_total = d.batch * d.heads * d.query_length;
            if (spec.conventions.empty_rows == empty_row_policy::nan) {
                auto per_row = [&](std::size_t width) {
                    std::vector<std::uint8_t> f(rows_total * width, 0);
                    for (std::size_t r = 0; r < rows_total; ++r)
                        for (std::size_t c = 0; c < width && empty[r]; ++c) f[r * width + c] = 1;
                    return f;
                };
                if (spec.kind == case_kind::sdpa) {
                    opts.nan_allowed.push_back(per_row(d.head_dim_v));
                } else {
                    std::vector<std::uint8_t> f(d.batch * d.query_length * d.output_dim, 0);
                    for (std::size_t b = 0; b < d.batch; ++b)
                        for (std::size_t h = 0; h < d.heads; ++h)
                            for (std::size_t i = 0; i < d.query_length; ++i)
                                if (empty[(b * d.heads + h) * d.query_length + i])
                                    for (std::size_t c = 0; c < d.output_dim; ++c) f[(b * d.query_length + i) * d.output_dim + c] = 1;
                    opts.nan_allowed.push_back(std::move(f));
                }
                if (spec.outputs.weights) opts.nan_allowed.push_back(per_row(d.key_length));
            }
            opts.progress = [&](std::size_t rung, int bits, std::size_t pending) {
                if (!progress) return;
                if (rung == 0) progress(spec.name + ": computing the enclosure at " + std::to_string(bits) + " bits");
                else progress(spec.name + ": " + std::to_string(pending) + " element(s) uncertified, escalating to " + std::to_string(bits) + " bits");
            };
            // Escalation recomputes only the query rows (b, h, i) that hold undecided elements: an output
            // element of sdpa (b, h, i, c), a weight (b, h, i, j) and an lse (b, h, i) belong to row (b, h, i);
            // an mha output (b, i, c) to query row (b, i) of every head (multi_head_attention_into then
            // recomputes that query row's projections and all its heads). Every row is computed exactly as
            // in a full call, and the values certified at a lower rung are kept, so the result is the same.
            auto rows_for = [&](const certify::request& req) {
                std::vector<std::uint8_t> rows;
                if (req.pending.empty() || req.pending[0].empty()) return rows;  // first rung: everything
                rows.assign(rows_total, 0);
                const std::size_t sq = d.query_length;
                for (std::size_t t = 0; t < names.size(); ++t) {
                    const std::vector<std::uint8_t>& p = req.pending[t];
                    for (std::size_t n = 0; n < p.size(); ++n) {
                        if (!p[n]) continue;
                        if (names[t] == "output" && spec.kind == case_kind::mha) {
                            const std::size_t row = n / d.output_dim, b = row / sq, i = row % sq;  // (b, i)
                            for (std::size_t h = 0; h < d.heads; ++h) rows[(b * d.heads + h) * sq + i] = 1;
                        } else {
                            const std::size_t width = names[t] == "output" ? d.head_dim_v : names[t] == "weights" ? d.key_length : 1;
                            rows[n / width] = 1;
                        }
                    }
                }
                return rows;
            };
            cert = certify::certify(
                names, targets,
                [&]<unsigned D>(std::integral_constant<unsigned, D>, const certify::request& req) {
                    using P = uniform_precision<mpfr_interval<D>>;
                    const std::vector<std::uint8_t> rows = rows_for(req);
                    const case_outputs_of<P> out = compute_case<P, double>(spec, data, threads, softmax_algorithm::shifted_division, 64, rows);
                    std::vector<std::vector<mpfr_interval<D>>> r{generate_detail::flat(out.output)};
                    if (spec.outputs.weights) r.push_back(generate_detail::flat(out.weights));
                    if (spec.outputs.lse) r.push_back(generate_detail::flat(out.lse));
                    return r;
                },
                opts);
        }
        if (spec.outputs.gradients) {
            certify::result grads = uses_fast_gradients(spec, method, fast_gradients)
                                        ? certify_gradients_fast(spec, data, threads, targets, progress)
                                        : certify_gradients(spec, data, threads, targets, progress);
            for (const gradient_tensor_layout& gl : gradient_layout(spec)) names.push_back(gl.role), shapes.push_back(gl.shape);
            for (auto& v : grads.values) cert.values.push_back(std::move(v));
            for (auto& r : grads.reports) cert.reports.push_back(std::move(r));
            for (int b : grads.precisions_bits)
                if (std::find(cert.precisions_bits.begin(), cert.precisions_bits.end(), b) == cert.precisions_bits.end())
                    cert.precisions_bits.push_back(b);
            std::sort(cert.precisions_bits.begin(), cert.precisions_bits.end());
        }
    } catch (const certify::uncertified_error& e) {
        // Inconclusive, not bad input: exit 1 as golden/README.md says; nothing is written.
        throw check_failure("case '" + spec.name + "': " + e.what());
    }
    g.m.reference.method = std::string(method == certification_method::fast ? reference_method_fast : reference_method_mpfi) +
                           (!spec.outputs.gradients                                 ? ""
                            : uses_fast_gradients(spec, method, fast_gradients) ? reference_method_fast_gradients_suffix
                                                                                : reference_method_gradients_suffix);
    g.m.reference.precisions_bits = cert.precisions_bits;
    g.m.reference.certification = cert.reports;
    for (const certify::tensor_report& r : cert.reports) {
        g.certified_elements += r.certified;
        g.escalated_elements += r.escalated;
    }
    for (std::size_t t = 0; t < names.size(); ++t) {
        case_file f{names[t] + ".npy", generate_detail::serialize_doubles(shapes[t], cert.values[t][0])};
        g.m.tensors.push_back({names[t], std::nullopt, f.name, "<f8", shapes[t], sha256_hex(f.bytes)});
        g.files.push_back(std::move(f));
        for (std::size_t k = 1; k < targets.size(); ++k) {
            auto [dtype, bytes] = generate_detail::serialize_target(targets[k].name, shapes[t], cert.values[t][k]);
            case_file c{names[t] + "." + targets[k].name + ".npy", std::move(bytes)};
            g.m.tensors.push_back({names[t], std::string(targets[k].name), c.name, dtype, shapes[t], sha256_hex(c.bytes)});
            g.files.push_back(std::move(c));
        }
    }
    const std::string text = manifest_text(g.m);
    // generate never writes a case its own parser rejects.
    (void)parse_manifest(text, spec.name + "/manifest.json (as generated)");
    case_file mf{"manifest.json", {}};
    mf.bytes.resize(text.size());
    std::memcpy(mf.bytes.data(), text.data(), text.size());
    g.files.push_back(std::move(mf));
    g.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return g;
}
#endif

}  // namespace attnref::golden
