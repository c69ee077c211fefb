#pragma once
/// \file check/gradients.hpp
/// Judging a candidate's gradients (backward cases): the roles and their shapes (gradient_roles),
/// attnref's own gradients of a case under a precision policy (compute_case_gradients), the
/// data-aware bounds of backward_bounds.hpp fed with a case (gradient_bounds_for), and the verdict
/// rows and gradient invariants (check_gradients). Each gradient is judged in its own format.
///
///     gradient_reference_of(case) ─→ certified gradients, grad_output, P, lse
///                                         │
///     candidate gradient (format g) ─ compare(gradient_bounds_for(g)) ─→ FAIL / INCONCLUSIVE
///                                         (vacuity, decoys: 0, 2×, scale dropped) / PASS
///     dK, dV ─→ invariants (masked keys 0, Σ_j dK_j = 0, dV = Pᵀ dO)

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "attnref/core/backward.hpp"
#include "attnref/bounds/backward_bounds.hpp"
#include "attnref/bounds/backward_probabilistic.hpp"
#include "attnref/core/formats.hpp"
#include "attnref/bounds/invariants.hpp"
#include "attnref/core/parallel.hpp"
#include "attnref/bounds/tolerance.hpp"
#include "attnref/check/candidate.hpp"
#include "attnref/check/forward.hpp"
#include "attnref/check/verdict.hpp"
#include "attnref/golden/case.hpp"

namespace attnref::golden {

/// The gradient roles of a case and their shapes, in report order (problem.hpp's role table,
/// gradient_roles_of: every gradient of the case's kind, with its biases' when it has them).
inline std::vector<std::pair<std::string, std::vector<std::size_t>>> gradient_roles(const case_spec& spec) {
    std::vector<std::pair<std::string, std::vector<std::size_t>>> r;
    for (const role_tensor& t : gradient_roles_of(spec)) r.push_back({std::string(t.name), t.shape});
    return r;
}

/// attnref's own gradients of a case under Policy (inputs and grad_output rounded to Input first), by role.
template <PrecisionPolicy Policy, class Input = typename Policy::storage_type>
std::vector<std::pair<std::string, std::vector<double>>> compute_case_gradients(const case_spec& spec, const case_data& data,
                                                                                std::span<const double> grad_output,
                                                                                backward_algorithm algorithm = backward_algorithm::textbook,
                                                                                std::size_t threads = 0) {
    const attention_options o = options_for(spec, data, threads, softmax_algorithm::shifted_division, 64);
    const converted_inputs<Input> in(spec, data);
    const std::vector<Input> g = converted_inputs<Input>::convert_all(grad_output);
    std::vector<std::pair<std::string, std::vector<double>>> out;
    auto by_role = [&](const auto& r) {
        for (const role_tensor& t : gradient_roles_of(spec)) {
            const auto v = r.values(t.role);
            std::vector<double> d(v.size());
            for (std::size_t n = 0; n < v.size(); ++n) d[n] = static_cast<double>(v[n]);
            out.push_back({std::string(t.name), std::move(d)});
        }
    };
    if (spec.kind == case_kind::sdpa)
        by_role(scaled_dot_product_attention_backward<Policy, Input, Input, Input, Input>(
            in.sdpa_q(), in.sdpa_k(), in.sdpa_v(), {g.data(), extents_of<4>(spec, tensor_role::grad_output)}, o, {algorithm}));
    else
        by_role(multi_head_attention_backward<Policy, Input, Input, Input>(in.x_q(), in.x_k(), in.x_v(), in.params(), mha_options_of(spec, o),
                                                                            {g.data(), extents_of<3>(spec, tensor_role::grad_output)}, {algorithm}));
    return out;
}

/// What judging gradients takes from a case: grad_output, the exact forward's weights and lse, and
/// the certified float64 gradients by role.
struct gradient_reference {
    std::vector<double> grad_output, weights, lse;
    std::vector<std::pair<std::string, std::vector<double>>> certified;
    const std::vector<double>* find(const std::string& role) const {
        for (const auto& [r, v] : certified)
            if (r == role) return &v;
        return nullptr;
    }
};

namespace check_detail {
/// attnref's own gradients in the candidate's format (the baseline rule's "naive" implementation):
/// float64, float32, and bf16/fp16 storage with float32 accumulation.
inline std::vector<std::pair<std::string, std::vector<double>>> naive_gradients(const case_spec& spec, const case_data& data,
                                                                               std::span<const double> g, tol::candidate_format f) {
    switch (f) {
        case tol::candidate_format::float64: return compute_case_gradients<uniform_precision<double>>(spec, data, g);
        case tol::candidate_format::float32: return compute_case_gradients<uniform_precision<float>>(spec, data, g);
        case tol::candidate_format::bfloat16:
            return compute_case_gradients<precision_policy<formats::bfloat16, float, formats::bfloat16, formats::bfloat16>>(spec, data, g);
        case tol::candidate_format::float16:
            return compute_case_gradients<precision_policy<formats::float16, float, formats::float16, formats::float16>>(spec, data, g);
    }
    return {};
}
/// Whether every input (and grad_output) of the case is a value of format f (else the candidate
/// rounds them first, and the bound carries that rounding: u_inputs).
inline bool inputs_representable(const case_data& data, std::span<const double> g, tol::candidate_format f) {
    for (const std::vector<double>* v : {&data.query, &data.key, &data.value, &data.w_q, &data.w_k, &data.w_v, &data.w_o, &data.b_q,
                                         &data.b_k, &data.b_v, &data.b_o})
        for (double x : *v)
            if (std::isfinite(x) && tol::round_to(f, x) != x) return false;
    for (double x : g)
        if (std::isfinite(x) && tol::round_to(f, x) != x) return false;
    return true;
}
/// Rounding to nearest even into the format of unit roundoff u_weights (a policy's P storage): the
/// formats P is stored in (bfloat16, float16, FP8 E4M3 and E5M2); nullptr for any other.
inline double (*weights_rounding(double u_weights))(double) {
    if (u_weights == 0x1p-8) return [](double x) { return static_cast<double>(formats::bfloat16(x)); };
    if (u_weights == 0x1p-11) return [](double x) { return static_cast<double>(formats::float16(x)); };
    if (u_weights == 0x1p-4) return [](double x) { return static_cast<double>(formats::float8_e4m3(x)); };
    if (u_weights == 0x1p-3) return [](double x) { return static_cast<double>(formats::float8_e5m2(x)); };
    return nullptr;
}
/// Whether (B17) (predicted weights) bounds an SDPA case's gradients: a declared policy whose P is
/// stored in a format narrower than its arithmetic (u_weights > 0) and its gradients in the
/// arithmetic's own (u_storage = 0), a declared textbook backward, and inputs the kernel takes as
/// given or rounds to nearest even to a known format (inputs_known).
inline bool weights_predicted(const std::optional<tol::policy_roundoffs>& policy, std::optional<backward_algorithm> declared, double us,
                              double uw, bool inputs_known) {
    return policy && declared == backward_algorithm::textbook && !(us > 0) && uw > 0 && inputs_known && weights_rounding(policy->weights);
}
inline std::vector<double> flat_of(const auto& t) { return std::vector<double>(t.data(), t.data() + t.size()); }
}  // namespace check_detail

/// The data-aware bounds (backward_bounds.hpp) of every gradient role for a candidate in format f,
/// plus the certified reference's own rounding (2^-53 relative).
inline std::vector<std::pair<std::string, std::vector<double>>> gradient_bounds_for(const case_spec& spec, const case_data& data,
                                                                                    const gradient_reference& ref, tol::candidate_format f,
                                                                                    std::optional<backward_algorithm> declared = std::nullopt,
                                                                                    const std::optional<tol::policy_roundoffs>& policy = std::nullopt,
                                                                                    bool* predicted_weights = nullptr, bool* b18_used = nullptr,
                                                                                    bool probabilistic = true) {
    namespace cd = check_detail;
    if (predicted_weights) *predicted_weights = false;
    if (b18_used) *b18_used = false;
    const case_shapes& d = spec.shapes;
    // A declared policy's roundoffs, else the format's defaults (valid for any kernel of the format).
    const double u = policy ? policy->accumulate : tol::accumulate_roundoff(f),
                 u_fmt = policy ? std::max(policy->storage, policy->output) : tol::unit_roundoff(f);
    const double us = u_fmt > u ? u_fmt : 0;  // bf16/fp16 storage with float32 accumulation: (B7)
    const double uw = policy ? (policy->weights > u ? policy->weights : 0) : us;  // P stored before dV = Pᵀ·dO
    // Undeclared: a correct kernel of the format may also store its logits, dP, D and dS in it
    // (PyTorch's eager bf16/fp16): (B2s), (B4s). A declared policy keeps them in its accumulation format.
    const double ui = policy ? 0 : us;
    const double u_in = cd::inputs_representable(data, ref.grad_output, f) ? 0 : u_fmt;
    const case_views c = views_of(spec, data);
    const tensor_view<const double, 4> w = c.weights(ref.weights);
    const tensor_view<const double, 3> lse{ref.lse.data(), {d.batch, d.heads, d.query_length}};
    std::vector<std::pair<std::string, std::vector<double>>> r;
    if (c.sdpa()) {
        const tensor_view<const double, 4> g{ref.grad_output.data(), {d.batch, d.heads, d.query_length, d.head_dim_v}};
        // A declared policy whose inputs are rounded to its storage format (not values of it): the
        // rounded inputs are predicted exactly (docs/backward.md (B16)).
        std::optional<binary_format> input_format;
        if (policy && u_in > 0 && policy->storage == u_fmt)
            for (binary_format sf : {binary_format::bfloat16, binary_format::float16, binary_format::float32})
                if (tol::unit_roundoff(sf) == u_fmt) input_format = sf;
        std::optional<sdpa_gradient_bounds> predicted;
        // A declared textbook policy storing P in a narrow format, its gradients in the arithmetic's:
        // the stored weights are predicted (docs/backward.md (B17)); attnref's backward stores P
        // unscaled (its weights_scale applies to the forward's P·V only).
        if (cd::weights_predicted(policy, declared, us, uw, input_format.has_value() || !(u_in > 0)))
            predicted = sdpa_gradient_first_order_bounds_predicted_weights(c.q, c.k, c.v, g, c.o, u, cd::weights_rounding(policy->weights), 1.0,
                                                                           input_format);
        if (predicted_weights) *predicted_weights = predicted.has_value();  // (B17) taken (it declines on non-finite weights)
        if (!predicted && input_format)
            predicted = sdpa_gradient_first_order_bounds_predicted_inputs(c.q, c.k, c.v, g, w, lse, c.o, u, us, uw, *input_format, declared, ui);
        sdpa_gradient_bounds b;
        if (predicted) {
            b = std::move(*predicted);
        } else if (policy && us > 0 && !(u_in > 0)) {
            // A declared policy's gradients stored from y: u_s|y| ≤ u_s(|g| + the rest of the bound),
            // g the certified gradient (within 2^-53 of its value): docs/backward.md (B15v).
            b = sdpa_gradient_first_order_bounds(c.q, c.k, c.v, g, w, lse, c.o, u, us, uw, declared, ui, true);
            auto by_value = [&](tensor<double, 4>& bound, const char* role) {
                const std::vector<double>* e = ref.find(role);
                for (std::size_t n = 0; n < bound.size(); ++n) {
                    // A non-finite certified value is matched exactly (tol::compare), whatever the bound.
                    if (!e || n >= e->size() || !std::isfinite((*e)[n])) continue;
                    bound[n] = (bound[n] + us * (std::fabs((*e)[n]) * (1 + 0x1p-52) + bound[n])) * (1 + 0x1p-50);
                }
            };
            by_value(b.grad_query, "grad_query");
            by_value(b.grad_key, "grad_key");
            by_value(b.grad_value, "grad_value");
        } else {
            b = sdpa_gradient_first_order_bounds_rounded_inputs(c.q, c.k, c.v, g, w, lse, c.o, u, us, uw, u_in, declared, ui);
        }
        r = {{"grad_query", cd::flat_of(b.grad_query)}, {"grad_key", cd::flat_of(b.grad_key)}, {"grad_value", cd::flat_of(b.grad_value)}};
    } else {
        const tensor_view<const double, 3> g{ref.grad_output.data(), {d.batch, d.query_length, d.output_dim}};
        // A declared policy stores Q, K, V and the heads' dO in its storage format, rounded to nearest
        // even: the bound predicts those values (docs/backward.md (B15)).
        std::optional<binary_format> stored;
        if (policy && us > 0 && policy->storage == us)
            for (binary_format sf : {binary_format::bfloat16, binary_format::float16, binary_format::float32})
                if (tol::unit_roundoff(sf) == us) stored = sf;
        mha_gradient_bounds b = mha_gradient_first_order_bounds(c.x_q, c.x_k, c.x_v, c.w, c.mo, g, w, lse, u, us, uw, u_in, declared, ui, stored);
        // (B18): a candidate computing and storing in one format (its inputs rounded to it or not) also has the data-aware
        // (probabilistic) bound; each element takes the smaller of the two (docs/backward.md (B18)).
        if (probabilistic && !(us > 0) && !(uw > 0) && !stored)
            if (const std::optional<mha_gradient_bounds> pb =
                    mha_gradient_probabilistic_bounds(c.x_q, c.x_k, c.x_v, c.w, c.mo, g, w, lse, u, u_in, tol::data_aware_lambda)) {
                auto take_min = [](auto& x, const auto& y) {
                    for (std::size_t n = 0; n < x.size(); ++n) x[n] = std::min(x[n], y[n]);
                };
                take_min(b.grad_x_q, pb->grad_x_q), take_min(b.grad_x_k, pb->grad_x_k), take_min(b.grad_x_v, pb->grad_x_v);
                take_min(b.grad_w_q, pb->grad_w_q), take_min(b.grad_w_k, pb->grad_w_k), take_min(b.grad_w_v, pb->grad_w_v);
                take_min(b.grad_w_o, pb->grad_w_o), take_min(b.grad_b_q, pb->grad_b_q), take_min(b.grad_b_k, pb->grad_b_k);
                take_min(b.grad_b_v, pb->grad_b_v), take_min(b.grad_b_o, pb->grad_b_o);
                if (b18_used) *b18_used = true;
            }
        r = {{"grad_query", cd::flat_of(b.grad_x_q)}, {"grad_key", cd::flat_of(b.grad_x_k)}, {"grad_value", cd::flat_of(b.grad_x_v)},
             {"grad_w_q", cd::flat_of(b.grad_w_q)},   {"grad_w_k", cd::flat_of(b.grad_w_k)}, {"grad_w_v", cd::flat_of(b.grad_w_v)},
             {"grad_w_o", cd::flat_of(b.grad_w_o)},   {"grad_b_q", cd::flat_of(b.grad_b_q)}, {"grad_b_k", cd::flat_of(b.grad_b_k)},
             {"grad_b_v", cd::flat_of(b.grad_b_v)},   {"grad_b_o", cd::flat_of(b.grad_b_o)}};
    }
    for (auto& [role, bounds] : r)
        if (const std::vector<double>* e = ref.find(role))
            for (std::size_t n = 0; n < bounds.size() && n < e->size(); ++n) bounds[n] += 0x1p-53 * std::fabs((*e)[n]);  // the reference's rounding
    return r;
}

/// Judges the candidate's gradients (tensor rows, one per role given, each in its own format:
/// gradient_tensor::format, else f) and the gradient invariants into `res` under the data-aware
/// model (default) or FlashAttention's baseline rule.
inline void check_gradients(const case_spec& spec, const case_data& data, const gradient_reference& ref, std::span<const gradient_tensor> got,
                            tol::candidate_format f, tol::tolerance_model model, check_result& res,
                            std::optional<backward_algorithm> declared = std::nullopt,
                            const std::optional<tol::policy_roundoffs>& declared_policy = std::nullopt) {
    namespace cd = check_detail;
    // data-aware: the smaller of the first-order bounds and, for multi-head cases, the probabilistic
    // (B18); worst-case: the first-order bounds alone (every summation order, no rounding model);
    // baseline: FlashAttention's rule (the invariants keep the data-aware bounds).
    if (model != tol::tolerance_model::data_aware && model != tol::tolerance_model::worst_case && model != tol::tolerance_model::baseline)
        throw data_error(std::string("command line: --tolerance: ") + std::string(tol::model_name(model)) +
                         " is not available for gradients (data-aware, worst-case or baseline)");
    const auto roles = gradient_roles(spec);
    auto shape_of = [&](const std::string& role) -> const std::vector<std::size_t>* {
        for (const auto& [r, s] : roles)
            if (r == role) return &s;
        return nullptr;
    };
    // Bounds and the baseline's naive gradients depend on the format a tensor is judged in: each
    // tensor is judged in its own (gradient_tensor::format, else f); computed once per format.
    using role_values = std::vector<std::pair<std::string, std::vector<double>>>;
    std::map<tol::candidate_format, role_values> bounds_by_format, naive_by_format;
    std::map<tol::candidate_format, bool> predicted_weights_in;  // whether gradient_bounds_for took (B17) for that format
    std::map<tol::candidate_format, bool> b18_in;  // whether it took the smaller of (B8)–(B13) and (B18) (multi-head)
    auto bounds_in = [&](tol::candidate_format g) -> const role_values& {
        auto it = bounds_by_format.find(g);
        if (it == bounds_by_format.end())
            it = bounds_by_format
                     .emplace(g, gradient_bounds_for(spec, data, ref, g, declared, declared_policy, &predicted_weights_in[g], &b18_in[g],
                                                     model != tol::tolerance_model::worst_case))
                     .first;
        return it->second;
    };
    std::map<std::string, tol::candidate_format> format_of;
    auto find = [](const auto& list, const std::string& role) -> const std::vector<double>* {
        for (const auto& [r, v] : list)
            if (r == role) return &v;
        return nullptr;
    };
    const double scale = spec.conventions.scale ? std::fabs(*spec.conventions.scale)
                                                : 1 / std::sqrt(static_cast<double>(spec.shapes.head_dim_qk));
    std::map<std::string, std::span<const double>> given;
    for (const gradient_tensor& t : got) {
        const std::vector<std::size_t>* shape = shape_of(t.role);
        if (!shape) throw data_error("command line: --" + flag_of(t.role) + ": not a gradient of the " + std::string(spec.kind == case_kind::sdpa ? "sdpa" : "mha") + " case " + spec.name);
        const std::vector<double>* expected = ref.find(t.role);
        if (!expected) throw data_error("case " + spec.name + ": no certified gradient '" + t.role + "' in its manifest");
        std::size_t n = 1;
        for (std::size_t e : *shape) n *= e;
        if (t.values.size() != n || expected->size() != n)
            throw data_error("candidate " + t.role + ": " + std::to_string(t.values.size()) + " values, the case " + spec.name + " needs " +
                             std::to_string(n) + " (shape " + shape_text(*shape) + ")");
        given[t.role] = t.values;
        const tol::candidate_format tf = t.format.value_or(f);
        format_of[t.role] = tf;
        std::vector<double> b;
        if (model != tol::tolerance_model::baseline) {
            b = *find(bounds_in(tf), t.role);
        } else {  // FlashAttention's rule, one number per tensor (tol::baseline_bound)
            auto it = naive_by_format.find(tf);
            if (it == naive_by_format.end()) it = naive_by_format.emplace(tf, cd::naive_gradients(spec, data, ref.grad_output, tf)).first;
            b.assign(n, tol::baseline_bound(*expected, *find(it->second, t.role), tf));
        }
        const std::size_t row = shape->back();
        // grad_b_k is exactly 0 (a key bias shifts a row's logits alike): its scale is grad_w_k's.
        double fixed_scale = 0;
        if (t.role == "grad_b_k")
            if (const std::vector<double>* wk = ref.find("grad_w_k"))
                for (double x : *wk) fixed_scale = std::max(fixed_scale, std::isfinite(x) ? std::fabs(x) : 0.0);
        const tol::comparison cmp = tol::compare(t.values, *expected, tf, [&](std::size_t e) { return b[e]; });
        const tol::vacuity vac = tol::find_vacuous(*expected, shape->size() == 1 ? n : row, [&](std::size_t e) { return b[e]; }, fixed_scale);
        tensor_report tr = judged(t.role, cmp, vac, fixed_scale > 0 ? "max |grad_w_k|" : "row scale max|expected|", tf);
        if (tr.verdict == verdict::pass) {
            // Decoys: a grossly wrong gradient (0, twice the gradient, the gradient with the scale dropped).
            std::vector<decoy> decoys;
            decoys.push_back({"zero gradient", std::vector<double>(n, 0.0)});
            std::vector<double> twice(*expected), unscaled(*expected);
            for (double& x : twice) x *= 2;
            for (double& x : unscaled) x /= scale;
            decoys.push_back({"twice the gradient", twice});
            if (scale != 1) decoys.push_back({"the gradient with the scale dropped", unscaled});
            if (const decoy* p = passing_decoy(decoys, *expected, tf, b, shape->size() == 1 ? n : row)) {
                tr.verdict = verdict::inconclusive;
                tr.note = "the bound admits a trivially wrong gradient (" + p->name + "); a pass would prove nothing";
            }
        }
        if (model == tol::tolerance_model::data_aware && b18_in[tf])
            tr.note += std::string(tr.note.empty() ? "" : "; ") + "bound: the smaller of (B8)-(B13) and the probabilistic (B18), lambda = 8";
        if (model != tol::tolerance_model::baseline && predicted_weights_in[tf])
            tr.note += std::string(tr.note.empty() ? "" : "; ") + "bound (B17): the declared policy's stored weights predicted";
        else if (model != tol::tolerance_model::baseline && t.role == "grad_query" && attnref::detail::textbook_bound_applies(declared, views_of(spec, data).o))
            tr.note += std::string(tr.note.empty() ? "" : "; ") + "bound (B5t) of the declared textbook backward";
        if (spec.shapes.heads != spec.shapes.kv_heads && (t.role == "grad_key" || t.role == "grad_value"))
            tr.note += std::string(tr.note.empty() ? "" : "; ") + "GQA: the sum over the group is checked by this comparison with the certified values";
        res.tensors.push_back(std::move(tr));
    }
    if (spec.kind != case_kind::sdpa) return;  // the invariants below are on SDPA's dK, dV
    const case_shapes& d = spec.shapes;
    const std::size_t group = d.heads / d.kv_heads, sq = d.query_length, sk = d.key_length, dk = d.head_dim_qk, dv = d.head_dim_v;
    const case_views c = views_of(spec, data);
    const empty_row_policy policy = spec.conventions.empty_rows;
    auto masked_for_group = [&](std::size_t b, std::size_t hk, std::size_t j) {
        for (std::size_t h = hk * group; h < (hk + 1) * group; ++h)
            for (std::size_t i = 0; i < sq; ++i)
                if (!structurally_masked(c.o.mask, b, h, i, j, sq, sk)) return false;
        return true;
    };
    const auto dK = given.find("grad_key"), dV = given.find("grad_value");
    if (policy == empty_row_policy::zero && (dK != given.end() || dV != given.end())) {
        invariant_report r;
        r.name = "dK, dV of fully masked keys exactly 0";
        for (std::size_t b = 0; b < d.batch; ++b)
            for (std::size_t hk = 0; hk < d.kv_heads; ++hk)
                for (std::size_t j = 0; j < sk; ++j) {
                    if (!masked_for_group(b, hk, j)) continue;
                    double worst = 0;
                    if (dK != given.end())
                        for (std::size_t x = 0; x < dk; ++x) {
                            const double y = dK->second[((b * d.kv_heads + hk) * sk + j) * dk + x];
                            worst = std::isnan(y) ? std::numeric_limits<double>::infinity() : std::max(worst, std::fabs(y));
                        }
                    if (dV != given.end())
                        for (std::size_t x = 0; x < dv; ++x) {
                            const double y = dV->second[((b * d.kv_heads + hk) * sk + j) * dv + x];
                            worst = std::isnan(y) ? std::numeric_limits<double>::infinity() : std::max(worst, std::fabs(y));
                        }
                    r.record(worst == 0, worst, 0, {b, hk, j, 0});
                }
        res.invariants.push_back(r);
    }
    const bool nan_rows = policy == empty_row_policy::nan && std::any_of(ref.weights.begin(), ref.weights.end(), [](double x) { return std::isnan(x); });
    if (dK != given.end() && !spec.conventions.softcap && !nan_rows) {
        // Σ_j dK_jc = s Σ_i (Σ_j dS_ij) q_ic = 0: within the sum of the elements' bounds (data-aware).
        const std::vector<double>& bk = *find(bounds_in(format_of.at("grad_key")), "grad_key");
        const std::vector<double>& ek = *ref.find("grad_key");  // the certified dK: the invariant's scale
        invariant_report r;
        r.name = "sum over keys of dK = 0";
        for (std::size_t b = 0; b < d.batch; ++b)
            for (std::size_t hk = 0; hk < d.kv_heads; ++hk)
                for (std::size_t x = 0; x < dk; ++x) {
                    double sum = 0, magnitude = 0, bound = 0, terms = 0;
                    for (std::size_t j = 0; j < sk; ++j) {
                        const std::size_t e = ((b * d.kv_heads + hk) * sk + j) * dk + x;
                        sum += dK->second[e];
                        magnitude += std::fabs(dK->second[e]);
                        bound += bk[e];
                        terms += std::fabs(ek[e]);
                    }
                    bound += static_cast<double>(sk + 1) * 0x1p-53 * magnitude;  // this double sum's own rounding
                    // Vacuous when the bound reaches Σ_j |dK_jc| (the size of the terms summed). Under the
                    // data-aware model its bound is the sum of the bounds dK itself was compared with (each
                    // carrying the certified values' rounding, whose exact sum is 0): every dK within them
                    // satisfies it, so it is implied by dK's comparison (which has its own vacuity and decoy
                    // rules), can only FAIL with it, and a vacuous bound here adds nothing to that verdict.
                    if (!(bound < terms) && terms > 0 && model == tol::tolerance_model::baseline) r.vacuous = true;
                    r.record(std::fabs(sum) <= bound, std::fabs(sum), bound, {b, hk, x, 0});
                }
        res.invariants.push_back(r);
    }
    if (dV != given.end() && !nan_rows) {
        // dV_j = Σ_{h in group} Σ_i P_ij dO_i with the certified P, within dV's bound (plus this sum's rounding).
        const std::vector<double>& bv = *find(bounds_in(format_of.at("grad_value")), "grad_value");
        const std::vector<double>& ev = *ref.find("grad_value");
        invariant_report r;
        r.name = "dV = P^T dO (certified P)";
        // Pᵀ dO per element (b, hk, j, x), summed over the group's heads ascending, then i ascending
        // (rows outer, so P and dO are read in order); the (batch, kv head) groups on the threads.
        std::vector<double> acc(dV->second.size(), 0.0), magnitude(acc.size(), 0.0);
        parallel_for(d.batch * d.kv_heads, 0, [&](std::size_t bk) {
            const std::size_t b = bk / d.kv_heads, hk = bk % d.kv_heads;
            double* a = &acc[bk * sk * dv];
            double* m = &magnitude[bk * sk * dv];
            for (std::size_t h = hk * group; h < (hk + 1) * group; ++h)
                for (std::size_t i = 0; i < sq; ++i) {
                    const double* p = &ref.weights[((b * d.heads + h) * sq + i) * sk];
                    const double* g = &ref.grad_output[((b * d.heads + h) * sq + i) * dv];
                    for (std::size_t j = 0; j < sk; ++j)
                        for (std::size_t x = 0; x < dv; ++x) {
                            a[j * dv + x] += p[j] * g[x];
                            m[j * dv + x] += std::fabs(p[j] * g[x]);
                        }
                }
        });
        for (std::size_t b = 0; b < d.batch; ++b)
            for (std::size_t hk = 0; hk < d.kv_heads; ++hk)
                for (std::size_t j = 0; j < sk; ++j) {
                    // Vacuous where the bound reaches the row's scale max_c |dV_jc| (find_vacuous's rule).
                    double row_scale = 0;
                    for (std::size_t y = 0; y < dv; ++y)
                        row_scale = std::max(row_scale, std::fabs(ev[((b * d.kv_heads + hk) * sk + j) * dv + y]));
                    for (std::size_t x = 0; x < dv; ++x) {
                        const std::size_t e = ((b * d.kv_heads + hk) * sk + j) * dv + x;
                        const double bound = bv[e] + static_cast<double>(group * sq + 3) * 0x1p-53 * magnitude[e];
                        const double dev = std::isnan(dV->second[e]) ? std::numeric_limits<double>::infinity() : std::fabs(dV->second[e] - acc[e]);
                        if (!(bound < row_scale) && row_scale > 0) r.vacuous = true;
                        r.record(dev <= bound, dev, bound, {b, hk, j, x});
                    }
                }
        res.invariants.push_back(r);
    }
}

/// A loaded case's gradient_reference (grad_output, certified gradients, weights, lse); data_error
/// when the case has no certified gradients.
inline gradient_reference gradient_reference_of(const loaded_case& lc) {
    const case_spec& spec = lc.m.spec;
    gradient_reference r;
    const tensor_entry* g = lc.entry("grad_output");
    if (!g) throw data_error((lc.dir / "manifest.json").string() + ": field 'tensors': no tensor with role 'grad_output' (the case " + spec.name + " has no certified gradients)");
    r.grad_output = lc.reference(*g);
    for (const auto& [role, shape] : gradient_roles(spec))
        if (const tensor_entry* t = lc.entry(role)) r.certified.push_back({role, lc.reference(*t)});
    r.weights = reference_weights(lc);
    if (const tensor_entry* t = lc.entry("lse")) r.lse = lc.reference(*t);
    else {
        case_spec s = spec;
        s.outputs.weights = false;
        s.outputs.lse = true;
        const auto o = compute_case<uniform_precision<double>>(s, lc.data, 0);
        r.lse.assign(o.lse.data(), o.lse.data() + o.lse.size());
    }
    return r;
}

}  // namespace attnref::golden
