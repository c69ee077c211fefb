#pragma once
/// \file study/study.hpp
/// Owns: precision studies (points, sweeps, measurements against an MPFR reference).
/// Precision studies: run scaled dot-product attention on generated inputs under a precision policy
/// and against a high-precision reference (the same templates in mpfr_real<40>, 133 bits), and
/// measure the error. A study is a list of points; each point fixes every axis:
///
///   policy      a name of the policy registry (policies.hpp): float64, float32, bf16, fp16 (pure:
///               everything in the format), bf16_fp32acc, fp16_fp32acc (storage, P and output in the
///               format, accumulation in fp32), fp32_p_bf16 (fp32 with P rounded to bf16 before
///               P·V), fp32_p_fp8e4m3/e5m2, longdouble, float128, bin50
///   algorithm   softmax algorithm (softmax.hpp); block = online block size
///   placement   scale placement (attention.hpp)
///   seq         key length n;  queries = query length;  head_dim = dk = dv
///   offset      constant added to every logit (through an additive mask, in the accumulate type)
///   ramp        plus ramp·j on key j: slowly increasing logits make every online block rescale
///   logit_scale scale = logit_scale/√dk (1: the default 1/√dk computed in each precision)
///   direct      direct logits (point::direct_logits), positive_values: see point
///   seeds       inputs are attnref::generator's "standard" family (uniform [-1, 1)) rounded to the
///               policy's storage format; the reference runs on the same (rounded) inputs, so the
///               measured error is the computation's own, output rounding included.
///
/// Reported per point (over all seeds and elements):
///   out_max, out_rms     |ô_l − o_l| / Σ_j p_j|v_jl|   (relative to the output's natural scale,
///                        = |o_l| when the v_jl share a sign; robust when o_l ≈ 0)
///   p_max, p_rms         |p̂_j − p_j| / p_j over p_j > 0
///   lse_max, lse_rms     |l̂ − l| / max(|l|, 1)
///   ulp_max              |ô_l − o_l| in units of the last place of o_l in the output format
///   bias, bias_z         mean signed output error (same normalisation), averaged over seeds, and
///                        its z-score mean/(sd/√seeds) across seeds (|z| > 3: rounding bias)
///   bound_ratio          max_l |ô_l − o_l| / bound_l  (≤ 1 means the a-priori bound held)
///
/// Backward points (point::backward, `attnref study --backward`): the gradients dQ, dK, dV of SDPA
/// (backward.hpp) under the policy and the backward algorithm (textbook or flash), for an upstream
/// gradient dO from the generator (stream "value" of seed + 2^32, rounded to the storage format like
/// the inputs), against attnref's own backward in mpfr_real<40> on the same inputs. Reported per
/// gradient g ∈ {dQ, dK, dV} over all seeds:
///   grad_bound_ratio     max_e |ĝ_e − g_e| / bound_e with backward_bounds.hpp's first-order bound
///                        (u: unit roundoff of the accumulate type; u_storage: that of the output type
///                        where narrower, the gradients being stored in it); ≤ 1 means it held
///   grad_norm_rel        ‖ĝ − g‖₂ / ‖g‖₂ (normwise relative error)
///   grad_bound_norm_rel  ‖bound‖₂ / ‖g‖₂: the bound's size against the gradient's; ≥ 1 means the bound
///                        is as large as the values it bounds (vacuous: a ratio ≤ 1 then proves nothing)
/// The forward columns of a backward point are NaN (not measured).
///
/// The a-priori bound is error_bounds.hpp's first-order SDPA bound (docs/error-bounds.md, eq. 8):
/// per output element, with u the unit roundoff of the accumulate type, u_w of the weights type
/// and u_o of the output type where narrower,
///   bound_l = sdpa_first_order_factor(δ, n, u, 2u + u_w + a_alg)·Σ_j p_j|v_jl|  +  u_o·|o_l|,
///   δ = γ_{dk+4}(u)·s·max_j |q|ᵀ|k_j| + u·max_j |x_j|     (the additive offset x's rounding),
/// 2u for the exp/log1p kernels, a_alg: division_free 2u·|lse| (x − lse loses |lse|·u), online
/// online_rescale_roundings(n, b)·u (eq. 9), naive 0.

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <ios>
#include <vector>

#include "attnref/core/attention.hpp"
#include "attnref/core/backward.hpp"
#include "attnref/bounds/backward_bounds.hpp"
#include "attnref/core/binary_format.hpp"
#include "attnref/bounds/error_bounds.hpp"
#include "attnref/core/formats.hpp"
#include "attnref/io/generator.hpp"
#include "attnref/core/name_table.hpp"
#include "attnref/multiprecision/multiprecision.hpp"
#include "attnref/core/parallel.hpp"
#include "attnref/multiprecision/policies.hpp"
#include "attnref/core/precision.hpp"

// Compiled use (the build's internal target attnref_study_compiled, which defines
// ATTNREF_STUDY_COMPILED): run_point, which instantiates the measurements for every policy, is
// declared here and defined once in that library (src/study/study.cpp, which defines
// ATTNREF_STUDY_DEFINE); `attnref study` and study.test link it. Header-only use: defined inline.
#if defined(ATTNREF_STUDY_COMPILED)
#define ATTNREF_STUDY_FN
#else
#define ATTNREF_STUDY_FN inline
#endif

namespace attnref::study {

/// Policies are named as in attnref's registry (policies.hpp: float64, float32, bf16, fp16,
/// bf16_fp32acc, fp16_fp32acc, fp32_p_bf16, fp32_p_fp8e4m3, ...); the short names fp64, fp32,
/// bf16-fp32, fp16-fp32 and fp32-pbf16 are accepted as aliases.
inline constexpr std::string_view default_policies[] = {"float64", "float32", "bf16", "fp16",
                                                        "bf16_fp32acc", "fp16_fp32acc", "fp32_p_bf16"};

/// The registry name for `n` (aliases resolved), or nullopt when no policy has that name.
inline std::optional<std::string> policy_from_name(std::string_view n) {
    if (n == "fp64") n = "float64";
    else if (n == "fp32") n = "float32";
    else if (n == "bf16-fp32") n = "bf16_fp32acc";
    else if (n == "fp16-fp32") n = "fp16_fp32acc";
    else if (n == "fp32-pbf16") n = "fp32_p_bf16";
    for (const policy_entry& e : policy_names)
        if (e.name == n) return std::string(n);
    return std::nullopt;
}

/// The names studies use for softmax algorithms and scale placements: softmax_algorithm_names and
/// scale_placement_names, except that studies (their JSON, CSV and tables, docs/studies.md) call
/// shifted_division "shifted"; both names are accepted.
inline constexpr std::string_view algorithm_name(softmax_algorithm a) {
    return a == softmax_algorithm::shifted_division ? "shifted" : name_in(softmax_algorithm_names, a);
}
inline std::optional<softmax_algorithm> algorithm_from_name(std::string_view n) {
    return n == "shifted" ? softmax_algorithm::shifted_division : value_in(softmax_algorithm_names, n);
}
inline constexpr std::string_view placement_name(scale_placement p) { return name_in(scale_placement_names, p); }
inline std::optional<scale_placement> placement_from_name(std::string_view n) { return value_in(scale_placement_names, n); }

/// One point of a study.
struct point {
    std::string sweep = "custom";  ///< label for tables and plots
    std::string policy = "float32";  ///< a name of policies.hpp's registry
    softmax_algorithm algorithm = softmax_algorithm::shifted_division;
    std::size_t block = 64;
    scale_placement placement = scale_placement::on_product;
    std::size_t seq = 256;
    std::size_t queries = 8;
    std::size_t head_dim = 64;
    double offset = 0;
    double ramp = 0;
    double logit_scale = 1;
    std::vector<std::uint64_t> seeds{1, 2, 3, 4};
    /// Direct logits (softmax in isolation, as Blanchard, Higham & Higham measure it): the scale is 0
    /// and the logits are offset + ramp·j + spread·(2u − 1), rounded once to the accumulate format,
    /// so they reach softmax exactly. Otherwise logits are s·qᵀk_j + offset + ramp·j.
    bool direct_logits = false;
    double spread = 4;
    /// Values uniform on [0, 1) instead of [-1, 1): no cancellation in P·V.
    bool positive_values = false;
    /// A backward point: dQ, dK, dV with this backward algorithm instead of the forward's measurements.
    bool backward = false;
    backward_algorithm backward_alg = backward_algorithm::textbook;
};

/// Measurements of one point (see the file comment).
struct result {
    double out_max = 0, out_rms = 0, p_max = 0, p_rms = 0, lse_max = 0, lse_rms = 0, ulp_max = 0;
    double bias = 0, bias_z = 0, bound_ratio = 0;
    /// Output elements whose a-priori bound is infinite (the first-order factor's condition fails,
    /// e.g. bf16 at n ≥ 256): the bound says nothing there, and bound_ratio (err/∞ = 0) is not a
    /// finding. Tables and CSV show such a point as vacuous.
    std::size_t bound_infinite = 0;
    double u = 0;  ///< unit roundoff of the accumulate type
    /// Stage attribution: output RMS error (relative to Σ_j p_j|v_jl|, as out_rms) when exactly one
    /// stage runs in double instead (with_stage<Policy, stage, double>), in the order of
    /// attribution_stages; NaN where the stage is already at least double. The stage's share of the
    /// error is 1 − stage_rms / out_rms.
    std::array<double, 5> stage_rms{};
    /// Backward points: per gradient dQ, dK, dV (NaN for forward points), see the file comment.
    std::array<double, 3> grad_bound_ratio{}, grad_norm_rel{}, grad_bound_norm_rel{};
};

/// The stages studied one at a time in double: q·kᵀ (with scale), the softmax (max, exp, sum,
/// division), P's cast before P·V, the P·V accumulation, the final output rounding. (SDPA points
/// have no projections.)
inline constexpr std::array<stage, 5> attribution_stages{stage::logits, stage::softmax, stage::weights, stage::values,
                                                         stage::output};
inline constexpr std::array<const char*, 5> attribution_stage_names{"logits", "softmax", "p_cast", "pv", "output"};

namespace detail {

using reference_real = mpfr_real<40>;

/// Distance between x and the next representable number of magnitude ≥ |x| in a p-bit format with
/// smallest normal 2^emin.
inline double ulp_of(double x, int p, int emin) {
    int e = 0;
    std::frexp(x == 0 ? std::ldexp(1.0, emin) : x, &e);  // |x| in [2^(e-1), 2^e)
    return std::ldexp(1.0, std::max(e - 1, emin) - (p - 1));
}

/// The interchange format with T's precision (float64 for anything at least as wide as double).
template <class T>
binary_format format_of() {
    for (const auto& [name, f] : binary_format_names)
        if (describe(f).precision == scalar_traits<T>::digits && scalar_traits<T>::digits < 53) return f;
    return binary_format::float64;
}

inline double scale_of(const point& pt) {
    return pt.direct_logits ? 0.0 : pt.logit_scale / std::sqrt(static_cast<double>(pt.head_dim));
}

/// x as a reference real, exactly (through double only for formats no wider than double).
template <class R, class T>
R to_reference(const T& x) {
    if constexpr (std::is_same_v<T, R> || std::is_arithmetic_v<T>) return R(x);
    else if constexpr (scalar_traits<T>::digits <= 53) return R(static_cast<double>(x));
    else return R(x.str(0, std::ios_base::scientific));  // Boost numbers: round-trip decimal
}

/// Outputs of one run, as doubles (exact for every emulated format) or reference reals.
template <class R>
struct run_outputs {
    std::vector<R> out, p, lse;
};

template <class Policy, class Out>
run_outputs<Out> run_sdpa(const point& pt, const std::vector<double>& q, const std::vector<double>& k,
                          const std::vector<double>& v, const std::vector<double>& additive) {
    using S = typename Policy::storage_type;
    const std::size_t sq = pt.queries, n = pt.seq, d = pt.head_dim;
    const std::vector<S> qs = convert_all<S>(q), ks = convert_all<S>(k), vs = convert_all<S>(v);
    attention_options o;
    if (pt.logit_scale != 1 || pt.direct_logits) o.scale = scale_of(pt);
    o.placement = pt.placement;
    o.softmax.algorithm = pt.algorithm;
    o.softmax.block_size = pt.block;
    o.threads = 1;
    if (!additive.empty()) o.mask.additive.values = {additive.data(), {1, 1, sq, n}};
    const auto r = scaled_dot_product_attention<Policy, S, S, S>(tensor_view<const S, 4>{qs.data(), {1, 1, sq, d}},
                                                                 tensor_view<const S, 4>{ks.data(), {1, 1, n, d}},
                                                                 tensor_view<const S, 4>{vs.data(), {1, 1, n, d}}, o);
    run_outputs<Out> out;
    for (std::size_t i = 0; i < r.output.size(); ++i) out.out.push_back(to_reference<Out>(r.output.data()[i]));
    for (std::size_t i = 0; i < r.weights.size(); ++i) out.p.push_back(to_reference<Out>(r.weights.data()[i]));
    for (std::size_t i = 0; i < r.lse.size(); ++i) out.lse.push_back(to_reference<Out>(r.lse.data()[i]));
    return out;
}

/// The reference: same inputs, same conventions, uniform mpfr_real<40>, shifted softmax.
inline run_outputs<reference_real> run_reference(const point& pt, const std::vector<double>& q, const std::vector<double>& k,
                                                 const std::vector<double>& v, const std::vector<double>& additive) {
    using R = reference_real;
    const std::size_t sq = pt.queries, n = pt.seq, d = pt.head_dim;
    const std::vector<R> qs = convert_all<R>(q), ks = convert_all<R>(k), vs = convert_all<R>(v);
    attention_options o;
    if (pt.logit_scale != 1 || pt.direct_logits) o.scale = scale_of(pt);
    o.placement = pt.placement;
    o.threads = 1;
    if (!additive.empty()) o.mask.additive.values = {additive.data(), {1, 1, sq, n}};
    auto r = scaled_dot_product_attention<uniform_precision<R>, R, R, R>(tensor_view<const R, 4>{qs.data(), {1, 1, sq, d}},
                                                                         tensor_view<const R, 4>{ks.data(), {1, 1, n, d}},
                                                                         tensor_view<const R, 4>{vs.data(), {1, 1, n, d}}, o);
    run_outputs<R> out;
    out.out.assign(r.output.data(), r.output.data() + r.output.size());
    out.p.assign(r.weights.data(), r.weights.data() + r.weights.size());
    out.lse.assign(r.lse.data(), r.lse.data() + r.lse.size());
    return out;
}

/// The unit roundoff of T where T is narrower than the arithmetic A (rounding into it adds error), else 0.
template <class T, class A>
double narrower_roundoff() {
    return scalar_traits<T>::digits < scalar_traits<A>::digits ? static_cast<double>(attnref::unit_roundoff<T>()) : 0.0;
}

inline void require_positive_sizes(const point& pt) {
    if (pt.queries == 0 || pt.seq == 0 || pt.head_dim == 0)
        throw std::invalid_argument("study point: queries, seq and head_dim must be positive");
}

template <class Policy>
result measure(const point& pt) {
    using R = reference_real;
    using A = typename Policy::accumulate_type;
    using W = typename Policy::weights_type;
    using O = typename Policy::output_type;
    const std::size_t sq = pt.queries, n = pt.seq, d = pt.head_dim;
    require_positive_sizes(pt);
    result res;
    res.grad_bound_ratio.fill(std::numeric_limits<double>::quiet_NaN());
    res.grad_norm_rel.fill(std::numeric_limits<double>::quiet_NaN());
    res.grad_bound_norm_rel.fill(std::numeric_limits<double>::quiet_NaN());
    const double u = static_cast<double>(attnref::unit_roundoff<A>());
    res.u = u;
    const double u_w = narrower_roundoff<W, A>(), u_o = narrower_roundoff<O, A>();
    const int out_digits = scalar_traits<O>::digits;
    const int out_emin = std::numeric_limits<O>::min_exponent - 1;
    const double s = scale_of(pt);
    const binary_format accumulate_format = format_of<A>();
    double out_sq = 0, p_sq = 0, lse_sq = 0;
    std::array<double, attribution_stages.size()> stage_sq{};
    std::size_t out_count = 0, p_count = 0, lse_count = 0;
    std::vector<double> seed_bias;
    const binary_format fmt = format_of<typename Policy::storage_type>();
    generator::input_family family;
    for (const char* role : {"query", "key"}) family.roles[role] = {1, 0};
    family.roles["value"] = pt.positive_values ? generator::affine{0.5, 0.5} : generator::affine{1, 0};
    for (std::uint64_t seed : pt.seeds) {
        const auto q = generator::generate(family, seed, generator::role::query, {1, 1, sq, d}, fmt);
        const auto k = generator::generate(family, seed, generator::role::key, {1, 1, n, d}, fmt);
        const auto v = generator::generate(family, seed, generator::role::value, {1, 1, n, d}, fmt);
        std::vector<double> additive;
        if (pt.offset != 0 || pt.ramp != 0 || pt.direct_logits) {
            additive.resize(sq * n);
            for (std::size_t i = 0; i < sq; ++i)
                for (std::size_t j = 0; j < n; ++j) {
                    double x = pt.offset + pt.ramp * static_cast<double>(j);
                    if (pt.direct_logits) {
                        const double noise = 2 * generator::uniform(seed, generator::role::additive_mask, i * n + j) - 1;
                        x = round_to(accumulate_format, x + pt.spread * noise);
                    }
                    additive[i * n + j] = x;
                }
        }
        const run_outputs<R> ref = run_reference(pt, q, k, v, additive);
        const run_outputs<R> got = run_sdpa<Policy, R>(pt, q, k, v, additive);
        // Stage attribution: the same point with one stage in double.
        std::vector<double> sigma(sq * d, 0.0);  // Σ_j p_j|v_jl|
        for (std::size_t i = 0; i < sq; ++i)
            for (std::size_t c = 0; c < d; ++c)
                for (std::size_t j = 0; j < n; ++j) sigma[i * d + c] += static_cast<double>(ref.p[i * n + j]) * std::abs(v[j * d + c]);
        auto stage_squares = [&]<std::size_t I>(std::integral_constant<std::size_t, I>) {
            using staged = with_stage<Policy, attribution_stages[I], double>;
            constexpr bool narrower = [] {
                switch (attribution_stages[I]) {
                    case stage::logits: return scalar_traits<logits_type_t<Policy>>::digits < 53;
                    case stage::softmax: return scalar_traits<softmax_type_t<Policy>>::digits < 53;
                    case stage::weights: return scalar_traits<W>::digits < 53;
                    case stage::values: return scalar_traits<values_type_t<Policy>>::digits < 53;
                    case stage::output: return scalar_traits<O>::digits < 53;
                    default: return false;
                }
            }();
            if constexpr (!narrower) {
                stage_sq[I] = std::numeric_limits<double>::quiet_NaN();
            } else {
                const run_outputs<R> hi = run_sdpa<staged, R>(pt, q, k, v, additive);
                for (std::size_t e = 0; e < sq * d; ++e) {
                    const double err = std::abs(static_cast<double>(R(hi.out[e] - ref.out[e])));
                    const double rel = sigma[e] > 0 ? err / sigma[e] : err;
                    stage_sq[I] += rel * rel;
                }
            }
        };
        [&]<std::size_t... I>(std::index_sequence<I...>) {
            (stage_squares(std::integral_constant<std::size_t, I>{}), ...);
        }(std::make_index_sequence<attribution_stages.size()>{});
        double signed_sum = 0;
        for (std::size_t i = 0; i < sq; ++i) {
            // Row quantities for the bound, in double from the exact inputs and reference P.
            double qk_max = 0, x_max = 0;
            for (std::size_t j = 0; j < n; ++j) {
                double qk = 0;
                for (std::size_t c = 0; c < d; ++c) qk += std::abs(q[i * d + c] * k[j * d + c]);
                qk_max = std::max(qk_max, qk);
                const double x = static_cast<double>(ref.p[i * n + j]) > 0
                                     ? std::abs(std::log(static_cast<double>(ref.p[i * n + j])) + static_cast<double>(ref.lse[i]))
                                     : 0.0;
                x_max = std::max(x_max, x);
            }
            const double lse = static_cast<double>(ref.lse[i]);
            double a_alg = 0;
            if (pt.algorithm == softmax_algorithm::division_free) a_alg = 2 * u * std::abs(lse);
            if (pt.algorithm == softmax_algorithm::online)
                a_alg = static_cast<double>(error_bounds::online_rescale_roundings(n, pt.block)) * u;  // (eq. 9)
            // (eq. 7): logit error from the dot product (eq. 3) and the additive offset's rounding;
            // 2u for the exp/log1p kernels, u_w for P's storage, a_alg the algorithm's own.
            const double logit_error = error_bounds::logit_error(d + 4, u, s * qk_max) + u * x_max;
            const double factor = error_bounds::sdpa_first_order_factor(logit_error, n, u, 2 * u + u_w + a_alg);
            for (std::size_t c = 0; c < d; ++c) {
                double weight = 0;
                for (std::size_t j = 0; j < n; ++j) weight += static_cast<double>(ref.p[i * n + j]) * std::abs(v[j * d + c]);
                const std::size_t e = i * d + c;
                const double o = static_cast<double>(ref.out[e]);
                const double diff = static_cast<double>(R(got.out[e] - ref.out[e]));
                const double err = std::abs(diff);
                const double rel = weight > 0 ? err / weight : err;
                res.out_max = std::max(res.out_max, std::isnan(rel) ? std::numeric_limits<double>::infinity() : rel);
                out_sq += rel * rel;
                ++out_count;
                signed_sum += weight > 0 ? diff / weight : diff;
                res.ulp_max = std::max(res.ulp_max, err / ulp_of(o, out_digits, out_emin));
                const double bound = factor * weight + u_o * std::abs(o);
                if (!std::isfinite(bound)) ++res.bound_infinite;
                const double ratio = err == 0 ? 0.0 : err / bound;
                res.bound_ratio = std::max(res.bound_ratio, std::isnan(ratio) ? std::numeric_limits<double>::infinity() : ratio);
            }
            for (std::size_t j = 0; j < n; ++j) {
                const R& p = ref.p[i * n + j];
                if (!(p > 0)) continue;
                const double rel = static_cast<double>(R(abs(got.p[i * n + j] - p) / p));
                res.p_max = std::max(res.p_max, std::isnan(rel) ? std::numeric_limits<double>::infinity() : rel);
                p_sq += rel * rel;
                ++p_count;
            }
            const double lse_rel = static_cast<double>(R(abs(got.lse[i] - ref.lse[i]))) / std::max(std::abs(lse), 1.0);
            res.lse_max = std::max(res.lse_max, std::isnan(lse_rel) ? std::numeric_limits<double>::infinity() : lse_rel);
            lse_sq += lse_rel * lse_rel;
            ++lse_count;
        }
        seed_bias.push_back(signed_sum / static_cast<double>(sq * d));
    }
    res.out_rms = std::sqrt(out_sq / static_cast<double>(std::max<std::size_t>(out_count, 1)));
    for (std::size_t st = 0; st < stage_sq.size(); ++st)
        res.stage_rms[st] = std::sqrt(stage_sq[st] / static_cast<double>(std::max<std::size_t>(out_count, 1)));
    res.p_rms = std::sqrt(p_sq / static_cast<double>(std::max<std::size_t>(p_count, 1)));
    res.lse_rms = std::sqrt(lse_sq / static_cast<double>(std::max<std::size_t>(lse_count, 1)));
    const double k = static_cast<double>(seed_bias.size());
    double mean = 0;
    for (double b : seed_bias) mean += b;
    mean /= std::max(k, 1.0);
    res.bias = mean;
    if (seed_bias.size() > 1) {
        double var = 0;
        for (double b : seed_bias) var += (b - mean) * (b - mean);
        const double sd = std::sqrt(var / (k - 1));
        res.bias_z = sd > 0 ? mean / (sd / std::sqrt(k)) : 0.0;
    }
    return res;
}

/// A backward point (see the file comment): gradients under Policy vs attnref's backward in
/// mpfr_real<40>, each element against backward_bounds.hpp's first-order bound.
template <class Policy>
result measure_backward(const point& pt) {
    using S = typename Policy::storage_type;
    using A = typename Policy::accumulate_type;
    using O = typename Policy::output_type;
    using R = reference_real;
    const std::size_t sq = pt.queries, n = pt.seq, d = pt.head_dim;
    require_positive_sizes(pt);
    // The reference must be well beyond the policy: 133 bits leave 20 bits over binary128's 113.
    if constexpr (scalar_traits<A>::digits > 113)
        throw std::invalid_argument("study: backward point of policy '" + pt.policy + "': its " + std::to_string(scalar_traits<A>::digits) +
                                    "-bit arithmetic is not 20 bits less precise than the 133-bit MPFR reference; its error cannot be measured");
    constexpr double nan = std::numeric_limits<double>::quiet_NaN();
    result res;
    res.out_max = res.out_rms = res.p_max = res.p_rms = res.lse_max = res.lse_rms = res.ulp_max = res.bias = res.bias_z = res.bound_ratio = nan;
    res.stage_rms.fill(nan);
    const double u = static_cast<double>(attnref::unit_roundoff<A>());
    res.u = u;
    const double u_storage = narrower_roundoff<O, A>();
    // P stored narrower than the arithmetic (fp32_p_bf16, bf16_fp32acc …): backward_bounds.hpp's u_weights.
    using W = typename Policy::weights_type;
    const double u_weights = narrower_roundoff<W, A>();
    const binary_format fmt = format_of<S>();
    generator::input_family family;
    for (const char* role : {"query", "key"}) family.roles[role] = {1, 0};
    family.roles["value"] = pt.positive_values ? generator::affine{0.5, 0.5} : generator::affine{1, 0};
    attention_options o;
    if (pt.logit_scale != 1) o.scale = scale_of(pt);
    o.placement = pt.placement;
    o.softmax.algorithm = pt.algorithm;
    o.softmax.block_size = pt.block;
    o.threads = 1;
    const extents_t<4> qe{1, 1, sq, d}, ke{1, 1, n, d};
    std::array<double, 3> diff_sq{}, ref_sq{}, bound_sq{};
    for (std::uint64_t seed : pt.seeds) {
        const std::vector<double> q = generator::generate(family, seed, generator::role::query, {1, 1, sq, d}, fmt);
        const std::vector<double> k = generator::generate(family, seed, generator::role::key, {1, 1, n, d}, fmt);
        const std::vector<double> v = generator::generate(family, seed, generator::role::value, {1, 1, n, d}, fmt);
        const std::vector<double> g = generator::generate(family, seed + (std::uint64_t{1} << 32), generator::role::value, {1, 1, sq, d}, fmt);
        const std::vector<S> qs = convert_all<S>(q), ks = convert_all<S>(k), vs = convert_all<S>(v), gs = convert_all<S>(g);
        const std::vector<R> qr = convert_all<R>(q), kr = convert_all<R>(k), vr = convert_all<R>(v), gr = convert_all<R>(g);
        // The reference: forward (P, lse for the bound) and backward in mpfr_real<40>.
        attention_options ro = o;
        ro.softmax.algorithm = softmax_algorithm::shifted_division;
        const auto fwd = scaled_dot_product_attention<uniform_precision<R>, R, R, R>(
            tensor_view<const R, 4>{qr.data(), qe}, tensor_view<const R, 4>{kr.data(), ke}, tensor_view<const R, 4>{vr.data(), ke}, ro);
        const auto ref = scaled_dot_product_attention_backward<uniform_precision<R>, R, R, R, R>(
            tensor_view<const R, 4>{qr.data(), qe}, tensor_view<const R, 4>{kr.data(), ke}, tensor_view<const R, 4>{vr.data(), ke},
            tensor_view<const R, 4>{gr.data(), qe}, ro);
        const auto got = scaled_dot_product_attention_backward<Policy, S, S, S, S>(
            tensor_view<const S, 4>{qs.data(), qe}, tensor_view<const S, 4>{ks.data(), ke}, tensor_view<const S, 4>{vs.data(), ke},
            tensor_view<const S, 4>{gs.data(), qe}, o, backward_options{pt.backward_alg});
        std::vector<double> weights(fwd.weights.size()), lse(fwd.lse.size());
        for (std::size_t e = 0; e < weights.size(); ++e) weights[e] = static_cast<double>(fwd.weights.data()[e]);
        for (std::size_t e = 0; e < lse.size(); ++e) lse[e] = static_cast<double>(fwd.lse.data()[e]);
        // The bound for the scale the policy computes with: the default 1/√dk in the policy's own arithmetic
        // is within u of the exact one, a first-order effect the bound's (B5) scale term covers.
        const sdpa_gradient_bounds bound = sdpa_gradient_first_order_bounds(
            tensor_view<const double, 4>{q.data(), qe}, tensor_view<const double, 4>{k.data(), ke}, tensor_view<const double, 4>{v.data(), ke},
            tensor_view<const double, 4>{g.data(), qe}, tensor_view<const double, 4>{weights.data(), {1, 1, sq, n}},
            tensor_view<const double, 3>{lse.data(), {1, 1, sq}}, o, u, u_storage, u_weights, pt.backward_alg);  // textbook: (B5t) for dQ
        const std::array refs{&ref.grad_query, &ref.grad_key, &ref.grad_value};
        const std::array gots{&got.grad_query, &got.grad_key, &got.grad_value};
        const std::array bounds{&bound.grad_query, &bound.grad_key, &bound.grad_value};
        for (std::size_t t = 0; t < 3; ++t)
            for (std::size_t e = 0; e < refs[t]->size(); ++e) {
                const R& exact = refs[t]->data()[e];
                const double err = std::abs(static_cast<double>(R(to_reference<R>(gots[t]->data()[e]) - exact)));
                const double b = bounds[t]->data()[e];
                const double ratio = err == 0 ? 0.0 : err / b;
                res.grad_bound_ratio[t] = std::max(res.grad_bound_ratio[t], std::isnan(ratio) ? std::numeric_limits<double>::infinity() : ratio);
                diff_sq[t] += err * err;
                bound_sq[t] += b * b;
                const double x = static_cast<double>(exact);
                ref_sq[t] += x * x;
            }
    }
    for (std::size_t t = 0; t < 3; ++t) {
        res.grad_norm_rel[t] = ref_sq[t] > 0 ? std::sqrt(diff_sq[t] / ref_sq[t]) : std::sqrt(diff_sq[t]);
        res.grad_bound_norm_rel[t] = ref_sq[t] > 0 ? std::sqrt(bound_sq[t] / ref_sq[t]) : std::numeric_limits<double>::infinity();
    }
    return res;
}

}  // namespace detail

/// Runs one point: SDPA (or its backward, point::backward) under the point's policy and in
/// mpfr_real<40>, and the measurements.
ATTNREF_STUDY_FN result run_point(const point& pt);
#if !defined(ATTNREF_STUDY_COMPILED) || defined(ATTNREF_STUDY_DEFINE)
ATTNREF_STUDY_FN result run_point(const point& pt) {
    result r;
    const std::optional<std::string> name = policy_from_name(pt.policy);
    if (!name || !visit_policy(*name, [&]<class P>(std::type_identity<P>) {
            r = pt.backward ? detail::measure_backward<P>(pt) : detail::measure<P>(pt);
        }))
        throw std::invalid_argument("study: unknown policy '" + pt.policy + "'");
    return r;
}
#endif

/// Runs every point on `threads` threads (0: all hardware threads). Each point is computed on one
/// thread in a fixed order, so the results do not depend on the thread count. `progress` (may be
/// empty) is called after each point with the number finished; calls are serialised.
inline std::vector<result> run(const std::vector<point>& points, std::size_t threads = 0,
                               const std::function<void(std::size_t)>& progress = {}) {
    std::vector<result> results(points.size());
    if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
    threads = std::min(threads, std::max<std::size_t>(points.size(), 1));
    std::atomic<std::size_t> done{0};
    std::mutex progress_mutex;
    ::attnref::parallel_for_dynamic(points.size(), threads, [&](std::size_t i) {
        std::exception_ptr failed;
        try {
            results[i] = run_point(points[i]);
        } catch (...) {
            failed = std::current_exception();
        }
        const std::size_t finished = done.fetch_add(1) + 1;
        if (progress) {
            const std::lock_guard lock(progress_mutex);
            progress(finished);
        }
        if (failed) std::rethrow_exception(failed);
    }, &thread_cleanup<detail::reference_real>::run);  // MPFR's per-thread constant caches
    return results;
}

/// Axes of a sweep: the study is the Cartesian product (in this nesting order, outermost first).
struct sweep {
    std::string name = "custom";
    std::vector<std::string> policies{"float32"};
    std::vector<softmax_algorithm> algorithms{softmax_algorithm::shifted_division};
    std::vector<std::size_t> blocks{64};
    std::vector<scale_placement> placements{scale_placement::on_product};
    std::vector<std::size_t> seqs{256};
    std::vector<std::size_t> head_dims{64};
    std::vector<double> offsets{0};
    std::vector<double> ramps{0};
    std::vector<double> logit_scales{1};
    std::size_t queries = 8;
    std::vector<std::uint64_t> seeds{1, 2, 3, 4};
    bool direct_logits = false;
    double spread = 4;
    bool positive_values = false;
    /// A backward sweep: one point per backward algorithm below for every other combination.
    bool backward = false;
    std::vector<backward_algorithm> backward_algorithms{backward_algorithm::textbook, backward_algorithm::flash};
};

inline std::vector<point> expand(const sweep& s) {
    std::vector<point> out;
    for (const std::string& p : s.policies)
        for (softmax_algorithm a : s.algorithms)
            for (std::size_t b : s.blocks)
                for (scale_placement pl : s.placements)
                    for (std::size_t n : s.seqs)
                        for (std::size_t d : s.head_dims)
                            for (double off : s.offsets)
                                for (double ramp : s.ramps)
                                    for (double ls : s.logit_scales) {
                                        if (s.backward && (off != 0 || ramp != 0 || s.direct_logits))
                                            throw std::invalid_argument("study sweep '" + s.name +
                                                                        "': backward points have no logit offset, ramp or direct logits");
                                        if (!s.backward) {
                                            out.push_back({s.name, p, a, b, pl, n, s.queries, d, off, ramp, ls, s.seeds,
                                                           s.direct_logits, s.spread, s.positive_values});
                                            continue;
                                        }
                                        for (backward_algorithm ba : s.backward_algorithms)
                                            out.push_back({s.name, p, a, b, pl, n, s.queries, d, off, ramp, ls, s.seeds,
                                                           s.direct_logits, s.spread, s.positive_values, true, ba});
                                    }
    return out;
}

/// Estimated peak memory (bytes) of run_point(pt), from its sizes alone (saturating at 2^64 − 1): the
/// MPFR reference holds inputs, weights P (queries × n) and outputs as mpfr_real<40> (about 100 bytes
/// each with their heap limbs), the policy's own run and the stage-attribution runs more copies of P
/// and the outputs. Counted, at 128 bytes per reference value and 32 per policy or double value:
/// forward 5 copies of P and 4 of the (queries + 2n) × head_dim inputs and outputs; backward 6 of P (P,
/// dP, dS of the reference and the bound's terms) and 6 of the inputs, outputs and gradients.
inline std::uint64_t point_memory_estimate(const point& pt) {
    auto mul = [](std::uint64_t a, std::uint64_t b) -> std::uint64_t {
        return a != 0 && b > UINT64_MAX / a ? UINT64_MAX : a * b;
    };
    auto add = [](std::uint64_t a, std::uint64_t b) -> std::uint64_t { return b > UINT64_MAX - a ? UINT64_MAX : a + b; };
    const std::uint64_t sq = pt.queries, n = pt.seq, d = pt.head_dim;
    const std::uint64_t p = mul(sq, n), io = mul(add(sq, mul(2, n)), d);
    const std::uint64_t copies_p = pt.backward ? 6 : 5, copies_io = pt.backward ? 6 : 4;
    const std::uint64_t values = add(mul(copies_p, p), mul(copies_io, io));
    return add(mul(values, 128 + 32), std::uint64_t{1} << 20);
}

/// The study's estimate: run() computes min(threads, points) points at once, so the sum of that many
/// largest point estimates; `largest` indexes the largest point.
struct memory_estimate {
    std::uint64_t bytes = 0;
    std::size_t largest = 0;
};
inline memory_estimate study_memory_estimate(const std::vector<point>& points, std::size_t threads) {
    memory_estimate r;
    std::vector<std::uint64_t> each;
    for (std::size_t i = 0; i < points.size(); ++i) {
        each.push_back(point_memory_estimate(points[i]));
        if (each.back() > each[r.largest]) r.largest = i;
    }
    std::sort(each.begin(), each.end(), std::greater<>());
    for (std::size_t i = 0; i < each.size() && i < std::max<std::size_t>(threads, 1); ++i)
        r.bytes = each[i] > UINT64_MAX - r.bytes ? UINT64_MAX : r.bytes + each[i];
    return r;
}

/// The default study (about 20 s on two cores): error vs sequence length for every policy; error vs
/// logit offset for each softmax algorithm in fp32 (direct logits offset + U[-4, 4)); online
/// softmax's error vs the number of rescales (direct logits 0.0005·j, positive values, block size
/// from n down to 16).
inline std::vector<sweep> default_study() {
    sweep length;
    length.name = "length";
    length.policies.assign(std::begin(default_policies), std::end(default_policies));
    length.seqs = {64, 256, 1024};
    sweep offset;
    offset.name = "offset";
    offset.algorithms = {softmax_algorithm::shifted_division, softmax_algorithm::division_free, softmax_algorithm::online};
    offset.offsets = {0, 10, 100, 1000, 10000};
    offset.direct_logits = true;
    sweep rescale;
    rescale.name = "rescales";
    rescale.algorithms = {softmax_algorithm::online};
    rescale.seqs = {1024};
    rescale.blocks = {1024, 256, 64, 16};
    rescale.ramps = {0.0005};
    rescale.direct_logits = true;
    rescale.spread = 0;
    rescale.positive_values = true;
    return {length, offset, rescale};
}

/// The default backward study (`attnref study --backward`): dQ, dK, dV error vs sequence length n for
/// float64, float32, pure bf16, the bf16/fp16 kernels with fp32 accumulation and fp32 with P cast to
/// bf16, textbook and flash backward, 8 queries, dk = dv = 64, 4 seeds.
inline std::vector<sweep> default_backward_study() {
    sweep s;
    s.name = "backward";
    s.policies = {"float64", "float32", "bf16", "bf16_fp32acc", "fp16_fp32acc", "fp32_p_bf16"};
    s.seqs = {16, 64, 256, 1024};
    s.backward = true;
    return {s};
}

}  // namespace attnref::study
