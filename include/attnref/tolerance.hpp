#pragma once
/// \file tolerance.hpp
/// Tolerance models for gating another implementation's outputs against a golden reference. All
/// models work on plain double arrays (candidate values converted exactly to double) and return, per
/// element, whether the error is within the model's bound, and the bound itself.
///
/// Models (tolerance_model):
/// - assert_close: |a − e| ≤ atol + rtol·|e| with torch.testing.assert_close's per-dtype defaults
///   (rtol, atol): fp16 (1e-3, 1e-5), bf16 (1.6e-2, 1e-5), fp32 (1.3e-6, 1e-5), fp64 (1e-7, 1e-7).
/// - ulp: distance in units in the last place of the candidate's format (the reference first rounded
///   to that format); default limit 4 ULP. Meaningless near cancellation; offered for comparison.
/// - data_aware (the default): an a-priori probabilistic rounding-error bound per element (derived
///   first below), or the worst-case bound where that is smaller.
/// - worst_case: a rigorous first-order a-priori bound per element (derived second below).
/// - baseline: FlashAttention's rule |a − e| ≤ 2·max|naive − e| + floor, where `naive` is attnref's
///   own straightforward implementation in the candidate's precision and the floor is FA3's
///   2·max|(e + 0.3 − 0.3) − e| evaluated in the candidate's format, so it never collapses to 0.
///
/// ## The data-aware (default) bound
/// Model (Higham & Mary 2019; Connolly, Higham & Mary 2021): every rounding is fl(x op y) =
/// (x op y)(1 + δ), |δ| ≤ u, the δ's mean-independent with mean 0. To first order the output error is
/// a sum Σ_e c_e·δ_e over all roundings e, and Azuma–Hoeffding gives |Σ_e c_e δ_e| ≤ λ·u·√(Σ_e c_e²)
/// except with probability 2·exp(−λ²/2); λ = 8 (2.5e-14 per element). Only bounds on the |c_e| that
/// hold for EVERY summation order and grouping are used: a partial sum of terms t_1..t_m is bounded
/// by P = max(Σ t⁺, Σ t⁻), so the m − 1 additions of a sum add at most m·P²·u² to Σ c², its m products
/// Σ t_i². The roundings counted, with u_acc the accumulation's unit roundoff and u the storage
/// format's (see accumulate_roundoff), per head and query row (p_j, S_j, o = Σ_j p_j v_j exact):
/// 1. Inputs and projections. Rounding an input to the candidate's format: u·|x|. A projection
///    y_f = Σ_e x_e W_ef + b_f: Var(y_f) = u_acc²·(Σ_e (x_e W_ef)² + b_f² + (E + 1)·P_f²) + u²·(m_x·Σ_e (x_e
///    W_ef)² + m_W·(Σ_e (x_e W_ef)² + b_f²) + y_f²), where one rounding of x_e reaches m_x outputs
///    of its row and one of W_ef reaches m_W outputs in the same output row (m_x = H·dk + Hkv·(dk +
///    dv) for all three, as self-attention feeds one x to Q, K and V; m_W = 1 for Q, Sk for K, V);
///    (Σ_{k≤m} a_k)² ≤ m·Σ a_k² (Cauchy–Schwarz) turns a shared rounding into m independent ones.
///    For SDPA the inputs are only rounded: u²·x². Both add u_acc²·y² for a scale applied to q or k.
/// 2. Logits. ΔS_j = s·Σ_c (Δq_c k_jc + q_c Δk_jc) + the dot product's roundings (products s²Σ(q_c
///    k_jc)², dk additions, partial sums ≤ s·P) + 4 roundings ≤ M_j = s·Σ|q_c k_jc| + |S_j| (scale,
///    softcap, ALiBi, additive mask).
/// 3. Softmax. ∂o/∂S_j = p_j(v_j − o) (first order, exact). A rounding inside Δq_c is shared by all
///    keys: its coefficient s·Σ_j p_j k_jc (v_jc' − o_c') is bounded by s·√(Σ_j p_j k_jc²)·√(Σ_j p_j
///    (v_jc' − o_c')²); roundings of k_j and of the dot products are per key. Roundings that can be
///    equal for equal inputs (the max subtraction, relative to |S_j − m|; exp, counted as 4u; the
///    division; rounding P to storage; the scale/softcap/slope constants, ≤ 3·M_j) are NOT treated as
///    independent: they enter a linear worst-case term Σ_j p_j·(…)·|v_j − o| or Σ_j p_j|v_j|. The
///    softmax denominator's (and an online softmax's rescaling) roundings scale the whole row: 2n
///    roundings of coefficient ≤ σ_c = Σ_j p_j|v_jc|.
/// 4. P·V: products Σ_j p_j² v_jc², n additions with partial sums ≤ σ_c, the value errors Σ_j p_j²
///    Var(v_jc), and rounding o to storage: u²·o_c². The benchdnn floor u·σ_c is added to the linear
///    term (outputs that cancel are judged on the scale of what was summed).
/// 5. Multi-head: a head's coupled roundings (steps 2–3: one δ moves the whole head output by a
///    vector A) reach y_l through |Σ_c W_o[h·dv + c, l]·A_c| ≤ ‖W_o^h[·, l]‖·‖A‖; the per-feature
///    ones (step 4) through W_o²; linear terms through |W_o|; GQA multiplies by G = H/Hkv (a K/V
///    rounding feeds G heads); W_o's own sum adds u_acc²·(Σ_m (h_m W_ml)² + (H·dv + 1)·P_l²) and
///    rounding W_o, b_o and y to storage u²·(Σ_m (h_m W_ml)² + b_l² + y_l²).
/// The bound is λ·√(g²·V_coupled + V_independent) + g·linear, where g = (e^{2ε} − 1)/(2ε) ≥ 1 with
/// ε = λ·max_j √Var(ΔS_j) + u_acc·max_j(|S_j − m| + 4) is the second-order safeguard: softmax
/// weights under logit perturbations ≤ ε move by at most p_j(e^{2ε} − 1), not 2ε·p_j (g → ∞ makes
/// the bound vacuous, and reported so, when logit errors approach 1). Where the rigorous bound below
/// is smaller (short sums, small d) it is used instead: both are upper bounds (the first with
/// probability ≥ 1 − 2.5e-14 under the model, the second to every order: its second-order safeguard
/// is the same g), so the minimum is one too. Known limits: the model
/// assumes rounding errors behave as independent — the roundings that can correlate through equal
/// operands are kept linear, but an adversary summing identical values in low precision can exceed
/// it; the tests run every committed case in float, double, long double, binary128, bf16 and fp16
/// storage with fp32 accumulation, online softmax and reversed, blocked and sign-sorted (largest
/// partial sums) summation orders (worst error 0.15 of the bound), and show that a 0.1% error in
/// one output row fails it (check.test).
///
/// ## Derivation of the worst-case bound (one head, one query row, output feature l)
/// Notation: u the unit roundoff of the candidate's format, γ_m = m·u/(1 − m·u), s the logit scale,
/// n the number of keys, p_j the exact weights, S_j the exact logits.
/// 1. Logits. s·qᵀk_j summed in any order in working precision u (inputs first rounded to it: 2 more
///    roundings, scale placement and the scale's own rounding: 2 more) has
///    |Δs_j| ≤ γ_{dk+4}·|s|·|q|ᵀ|k_j| (Higham §3.1; the bound holds for every summation order).
///    Softcap (tanh is 1-Lipschitz), ALiBi and additive masks add ≤ γ_3·|S_j|; both terms are
///    collected in L = max over keys with p_j ≠ 0 of (|s|·|q|ᵀ|k_j| + |S_j|), so |Δs_j| ≤ γ_{dk+4}·L.
/// 2. Softmax. p_j = exp(S_j)/Σ exp(S_k) has ∂p_j/∂S_k = p_j(δ_jk − p_k), so
///    |Δp_j| ≤ p_j(|Δs_j| + Σ_k p_k|Δs_k|) ≤ 2γ_{dk+4}·L·p_j. Evaluating the shifted softmax adds a
///    relative (n + 3)u (Blanchard, Higham & Higham 2021); rounding P to a storage format adds u.
/// 3. P·V. fl(Σ_j p̂_j v_jl) in any order: error ≤ γ_n·Σ_j p̂_j|v_jl|.
/// Summing, to first order, with σ_l = Σ_j p_j|v_jl| (exact, from the reference's weights):
///    |ô_l − o_l| ≤ [2γ_{dk+4}·L + (n + 3)u + γ_n]·σ_l  +  u·σ_l,
/// where the last term is benchdnn's floor (eps·Σ_j p_j|v_j|) and also pays for rounding V and the
/// output to the candidate's format. It is proportional to σ_l, not |o_l|, so outputs that cancel are
/// judged on the scale of what was summed. κ = 1: no fudge factor (the tests show the bound holds for
/// attnref's own float, double, long double and bf16-storage policies, and that bugs exceed it).
/// Multi-head attention: q, k, v come from projections x·W + b summed over E inputs and rounded to
/// storage, so |q|ᵀ|k| is replaced by the same product of the absolute projections
/// (|x|·|W| + |b|), dk + 4 by dk + 2E + 8 (the projection errors of q and k), and σ gains γ_{E+2}
/// for V's projection. Head outputs h_m (|h_m| ≤ σ_m) then go through W_o (H·dv terms):
///    |Δy_l| ≤ Σ_m β_m|W_o,ml| + (γ_{H·dv+2} + u)·Σ_m σ_m|W_o,ml|,
/// β_m the head bound above. Everything reduces to two precomputed per-element magnitudes
///    t0 = σ (or Σ_m σ_m|W_o,ml|),  t1 = L·σ (or Σ_m L_m σ_m|W_o,ml|),
/// and, to first order, bound ≈ 2[γ_{n_dot}(u_acc) + γ_8(u)]·t1 + [(n + 3)u_acc + γ_n(u_acc) +
/// γ_{n_extra}(u_acc) + 5u]·t0, where u_acc is the accumulation's unit roundoff (fp32 for 16-bit
/// candidates, see accumulate_roundoff) and u the storage format's: γ_8(u) pays for rounding q and k
/// (or Q, K) to storage, 5u for rounding V, P, head outputs, the output, and the floor. For fp32/fp64
/// candidates u_acc = u. The first-order form is not an upper bound where 2γL is not small (a logit
/// perturbation δ moves a weight by up to p_j(e^{2δ} − 1), not 2δ·p_j), so what is evaluated is
/// its version valid to every order: with γ = γ_{n_dot}(u_acc) + γ_8(u), g = (e^{2γL_max} − 1)/(2γL_max)
/// (L_max the largest L of the row's heads) and 1 + A = (1 + γ_{n+3}(u_acc))(1 + γ_n(u_acc))(1 +
/// γ_{n_extra}(u_acc))(1 + u)⁵ (relative roundings compose as a product),
///    bound = (1 + A)·g·2γ·t1 + A·t0
/// (worst_case_scales::bound). The magnitudes are computed once from the golden inputs and weights.
/// When n·u ≥ 1 a γ is +inf and the bound is vacuous (reported INCONCLUSIVE, never a pass).

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "attnref/attention.hpp"
#include "attnref/formats.hpp"
#include "attnref/invariants.hpp"
#include "attnref/multi_head_attention.hpp"
#include "attnref/parallel.hpp"
#include "attnref/tensor.hpp"

namespace attnref::tolerance {

/// Format the candidate computed and stored its results in.
enum class candidate_format { float64, float32, bfloat16, float16 };
enum class tolerance_model { data_aware, worst_case, assert_close, ulp, baseline };

constexpr std::string_view format_name(candidate_format f) {
    switch (f) {
        case candidate_format::float64: return "float64";
        case candidate_format::float32: return "float32";
        case candidate_format::bfloat16: return "bfloat16";
        case candidate_format::float16: return "float16";
    }
    return "?";
}
constexpr std::string_view model_name(tolerance_model m) {
    switch (m) {
        case tolerance_model::data_aware: return "data-aware";
        case tolerance_model::worst_case: return "worst-case";
        case tolerance_model::assert_close: return "assert-close";
        case tolerance_model::ulp: return "ulp";
        case tolerance_model::baseline: return "baseline";
    }
    return "?";
}
constexpr std::optional<candidate_format> format_from_name(std::string_view n) {
    if (n == "float64") return candidate_format::float64;
    if (n == "float32") return candidate_format::float32;
    if (n == "bfloat16") return candidate_format::bfloat16;
    if (n == "float16") return candidate_format::float16;
    return std::nullopt;
}
constexpr std::optional<tolerance_model> model_from_name(std::string_view n) {
    if (n == "data-aware") return tolerance_model::data_aware;
    if (n == "worst-case") return tolerance_model::worst_case;
    if (n == "assert-close") return tolerance_model::assert_close;
    if (n == "ulp") return tolerance_model::ulp;
    if (n == "baseline") return tolerance_model::baseline;
    return std::nullopt;
}

/// Unit roundoff u = 2^-p of the format.
constexpr double unit_roundoff(candidate_format f) {
    switch (f) {
        case candidate_format::float64: return 0x1p-53;
        case candidate_format::float32: return 0x1p-24;
        case candidate_format::bfloat16: return 0x1p-8;
        case candidate_format::float16: return 0x1p-11;
    }
    return 0;
}

/// Unit roundoff of the accumulation the data-aware bound assumes: fp32 (2^-24) for bfloat16 and
/// float16 candidates — every bf16/fp16 attention kernel (FlashAttention, cuDNN, PyTorch's math
/// backend) accumulates dot products, softmax sums and P·V in fp32 and rounds to 16 bits only when
/// storing Q/K/V, P, head outputs and the output — and the format's own u otherwise. A 16-bit
/// candidate that also accumulates in 16 bits is less accurate than that and is reported as such.
constexpr double accumulate_roundoff(candidate_format f) {
    return f == candidate_format::bfloat16 || f == candidate_format::float16 ? 0x1p-24 : unit_roundoff(f);
}

struct rtol_atol {
    double rtol, atol;
};
/// torch.testing.assert_close defaults.
constexpr rtol_atol assert_close_defaults(candidate_format f) {
    switch (f) {
        case candidate_format::float64: return {1e-7, 1e-7};
        case candidate_format::float32: return {1.3e-6, 1e-5};
        case candidate_format::bfloat16: return {1.6e-2, 1e-5};
        case candidate_format::float16: return {1e-3, 1e-5};
    }
    return {0, 0};
}

/// Rounds x to the format (to nearest even) and back to double.
inline double round_to(candidate_format f, double x) {
    switch (f) {
        case candidate_format::float64: return x;
        case candidate_format::float32: return static_cast<double>(static_cast<float>(x));
        case candidate_format::bfloat16: return static_cast<double>(formats::bfloat16(x));
        case candidate_format::float16: return static_cast<double>(formats::float16(x));
    }
    return x;
}

namespace detail {
/// Maps the bits of a sign-magnitude encoding onto a monotone unsigned line (−0 and +0 coincide):
/// magnitude m ↦ 2^63 + m, −m ↦ 2^63 − m. Every value of ≤ 64 bits fits without overflow.
inline std::uint64_t ordered(std::uint64_t bits, int total_bits) {
    const std::uint64_t sign = std::uint64_t{1} << (total_bits - 1);
    const std::uint64_t magnitude = bits & (sign - 1), middle = std::uint64_t{1} << 63;
    return (bits & sign) ? middle - magnitude : middle + magnitude;
}
inline std::uint64_t ordered_in(candidate_format f, double x) {
    switch (f) {
        case candidate_format::float64: return ordered(std::bit_cast<std::uint64_t>(x), 64);
        case candidate_format::float32: return ordered(std::bit_cast<std::uint32_t>(static_cast<float>(x)), 32);
        case candidate_format::bfloat16: return ordered(formats::bfloat16(x).bits(), 16);
        case candidate_format::float16: return ordered(formats::float16(x).bits(), 16);
    }
    return 0;
}
}  // namespace detail

/// Distance in ULPs of the format between a (a value of the format) and e rounded to the format:
/// the number of representable values between them, counted exactly in 64-bit unsigned integers
/// (values of opposite signs included: the distance is the sum of both magnitudes' counts, up to
/// 2^64 − 2^53 for float64) and then rounded to double. Both must be finite.
inline double ulp_distance(candidate_format f, double a, double e) {
    const std::uint64_t x = detail::ordered_in(f, a), y = detail::ordered_in(f, e);
    return static_cast<double>(x > y ? x - y : y - x);
}

/// Per-element magnitudes of the worst-case bound (see the file comment) and the counts that pick
/// the γ's; bound() evaluates the formula in the file comment.
struct worst_case_scales {
    std::vector<double> t0;  ///< σ, or σ propagated through |W_o|
    std::vector<double> t1;  ///< L·σ, or L·σ propagated through |W_o|
    /// Per output row (row_length elements): the largest L of the row's heads (the second-order
    /// factor g of the file comment; empty: rows of L = 0).
    std::vector<double> row_L;
    std::size_t row_length = 1;
    std::size_t n_keys = 0, n_dot = 0, n_extra = 0;

    /// u: the candidate format's unit roundoff (storage: inputs, Q/K/V, P, head outputs, output);
    /// u_acc: that of its accumulation (see accumulate_roundoff). Vacuous (+inf) when n·u ≥ 1.
    /// Rigorous to every order (given the ingredients' bounds): logit perturbations ≤ δ = γ·L move
    /// each weight by a factor within [e^{−2δ}, e^{2δ}], so the weights' part is
    /// (e^{2δ} − 1)·σ = g·2γ·L·σ with g = (e^{2γ·L_max} − 1)/(2γ·L_max) ≥ 1 (expm1(x)/x increases with x,
    /// so L_max, the row's largest L, bounds every head's factor); the relative roundings of the
    /// softmax, P·V, W_o and the storage compose as a product (1 + A) = Π(1 + ε_i) instead of a sum.
    double bound(std::size_t e, double u, double u_acc) const {
        const double gd = safe_gamma(n_dot, u_acc) + safe_gamma(8, u);  // logit perturbation per unit of L
        const double a = (1 + safe_gamma(n_keys + 3, u_acc)) * (1 + safe_gamma(n_keys, u_acc)) * (1 + safe_gamma(n_extra, u_acc)) *
                             (1 + u) * (1 + u) * (1 + u) * (1 + u) * (1 + u) - 1;
        const double l_max = row_L.empty() ? 0.0 : row_L[e / row_length];
        const double x = 2 * gd * l_max;  // NaN (inf·0) and 0 leave g = 1; +inf when e^x overflows
        const double g = x > 0 ? (x < std::numeric_limits<double>::infinity() ? std::expm1(x) / x : x) : 1.0;
        const double weights = t1[e] == 0 ? 0.0 : (1 + a) * g * 2 * gd * t1[e];  // (0·inf would be NaN)
        const double rest = t0[e] == 0 ? 0.0 : a * t0[e];
        return (weights + rest) * (1 + 0x1p-40);  // (1 + 2⁻⁴⁰): this evaluation's own rounding, upward
    }
    double bound(std::size_t e, double u) const { return bound(e, u, u); }
    std::size_t size() const { return t0.size(); }
    static double safe_gamma(std::size_t m, double u) {
        const double nu = static_cast<double>(m) * u;
        return nu < 1 ? nu / (1 - nu) : std::numeric_limits<double>::infinity();
    }
};

namespace detail {
inline double abs_d(double x) { return x < 0 ? -x : x; }

/// Per (b, h, i) L and per (b, h, i, l) σ of one attention: q̃ (B,H,Sq,dk) and k̃ (B,Hkv,Sk,dk) are
/// nonnegative magnitudes, ṽ (B,Hkv,Sk,dv) too; logits S and weights P (B,H,Sq,Sk) from the reference.
inline void head_scales(tensor_view<const double, 4> q_abs, tensor_view<const double, 4> k_abs,
                        tensor_view<const double, 4> v_abs, tensor_view<const double, 4> logits,
                        tensor_view<const double, 4> p, double scale, std::vector<double>& L, std::vector<double>& sigma) {
    const auto [batch, heads, sq, dk] = q_abs.extents;
    const std::size_t kv = k_abs.extents[1], sk = k_abs.extents[2], dv = v_abs.extents[3], group = heads / kv;
    L.assign(batch * heads * sq, 0.0);
    sigma.assign(batch * heads * sq * dv, 0.0);
    for (std::size_t b = 0; b < batch; ++b)
        for (std::size_t h = 0; h < heads; ++h)
            for (std::size_t i = 0; i < sq; ++i) {
                double& l_row = L[(b * heads + h) * sq + i];
                double* s_row = &sigma[((b * heads + h) * sq + i) * dv];
                for (std::size_t j = 0; j < sk; ++j) {
                    const double pj = p(b, h, i, j);
                    if (!(pj != 0)) continue;  // masked or underflowed keys (and NaN rows) add nothing
                    double dot = 0;
                    for (std::size_t c = 0; c < dk; ++c) dot += q_abs(b, h, i, c) * k_abs(b, h / group, j, c);
                    const double s = logits(b, h, i, j);
                    const double m = abs_d(scale) * dot * (1 + 0x1p-50) + (std::isfinite(s) ? abs_d(s) : 0.0);
                    if (m > l_row) l_row = m;
                    for (std::size_t c = 0; c < dv; ++c) s_row[c] += abs_d(pj) * v_abs(b, h / group, j, c);
                }
                for (std::size_t c = 0; c < dv; ++c) s_row[c] *= 1 + 0x1p-48;  // this sum's own rounding, upward
            }
}

inline std::vector<double> abs_of(std::span<const double> x) {
    std::vector<double> r(x.size());
    for (std::size_t n = 0; n < x.size(); ++n) r[n] = abs_d(x[n]);
    return r;
}
}  // namespace detail

/// Worst-case magnitudes for scaled dot-product attention. q, k, v are the golden inputs, p the
/// golden (certified) weights (B, H, Sq, Sk); options as the case uses them; logits the exact S
/// (B, H, Sq, Sk), as attention_logits in double gives them.
inline worst_case_scales sdpa_worst_case_scales(tensor_view<const double, 4> q, tensor_view<const double, 4> k,
                                                tensor_view<const double, 4> v, tensor_view<const double, 4> p,
                                                const attention_options& options, tensor_view<const double, 4> logits) {
    const std::vector<double> qa = detail::abs_of({q.data, q.size()}), ka = detail::abs_of({k.data, k.size()}),
                              va = detail::abs_of({v.data, v.size()});
    const double scale = ::attnref::detail::logit_scale<double>(options, q.extents[3]);
    std::vector<double> L, sigma;
    detail::head_scales({qa.data(), q.extents}, {ka.data(), k.extents}, {va.data(), v.extents}, logits, p, scale, L, sigma);
    worst_case_scales r;
    r.n_keys = k.extents[2];
    r.n_dot = q.extents[3] + 4;
    r.n_extra = 0;
    const std::size_t dv = v.extents[3];
    r.t0 = sigma;
    r.t1.resize(sigma.size());
    for (std::size_t e = 0; e < sigma.size(); ++e) r.t1[e] = L[e / dv] * sigma[e];
    r.row_L = std::move(L);
    r.row_length = dv;
    return r;
}
inline worst_case_scales sdpa_worst_case_scales(tensor_view<const double, 4> q, tensor_view<const double, 4> k,
                                                tensor_view<const double, 4> v, tensor_view<const double, 4> p,
                                                const attention_options& options) {
    const tensor<double, 4> logits = attention_logits<uniform_precision<double>>(q, k, options);
    return sdpa_worst_case_scales(q, k, v, p, options, logits.view());
}

/// Worst-case magnitudes for multi-head attention (see multi_head_attention.hpp for the layout);
/// logits the exact S (B, H, Sq, Sk), as mha_logits in double gives them.
inline worst_case_scales mha_worst_case_scales(tensor_view<const double, 3> x_q, tensor_view<const double, 3> x_k,
                                               tensor_view<const double, 3> x_v, const mha_parameters<double>& w,
                                               tensor_view<const double, 4> p, const mha_options& o,
                                               tensor_view<const double, 4> logits) {
    const mha_dims d = mha_dims_of(x_q, x_k, x_v, w, o);
    // Absolute projections |x|·|W| + |b| (for L and σ).
    auto project_abs = [&](tensor_view<const double, 3> x, tensor_view<const double, 2> W, tensor_view<const double, 1> b,
                           std::size_t heads) {
        tensor<double, 3> y({x.extents[0], x.extents[1], W.extents[1]});
        const std::vector<double> xa = detail::abs_of({x.data, x.size()}), Wa = detail::abs_of({W.data, W.size()});
        const std::vector<double> ba = b.empty() ? std::vector<double>{} : detail::abs_of({b.data, b.size()});
        linear_into<uniform_precision<double>>(
            tensor_view<const double, 3>{xa.data(), x.extents}, tensor_view<const double, 2>{Wa.data(), W.extents},
            b.empty() ? tensor_view<const double, 1>{} : tensor_view<const double, 1>{ba.data(), b.extents}, y.view(), 1, "projection");
        for (std::size_t n = 0; n < y.size(); ++n) y[n] *= 1 + 0x1p-48;
        return split_heads<double>(y.view(), heads);
    };
    const tensor<double, 4> qah = project_abs(x_q, w.w_q, w.b_q, d.heads), kah = project_abs(x_k, w.w_k, w.b_k, d.kv_heads),
                            vah = project_abs(x_v, w.w_v, w.b_v, d.kv_heads);
    const double scale = ::attnref::detail::logit_scale<double>(o.attention, d.head_dim_qk);
    std::vector<double> L, sigma;
    detail::head_scales(qah.view(), kah.view(), vah.view(), logits, p, scale, L, sigma);
    // Through W_o: t0_l = Σ_m σ_m|W_o,ml|, t1_l = Σ_m L_m σ_m|W_o,ml|, m = (h, c) merged.
    const std::size_t H = d.heads, sq = d.query_length, dv = d.head_dim_v, eo = d.output_dim;
    worst_case_scales r;
    r.t0.assign(d.batch * sq * eo, 0.0);
    r.t1.assign(d.batch * sq * eo, 0.0);
    r.row_L.assign(d.batch * sq, 0.0);
    r.row_length = eo;
    for (std::size_t b = 0; b < d.batch; ++b)
        for (std::size_t i = 0; i < sq; ++i)
            for (std::size_t h = 0; h < H; ++h) {
                const double l_row = L[(b * H + h) * sq + i];
                r.row_L[b * sq + i] = std::max(r.row_L[b * sq + i], l_row);
                for (std::size_t c = 0; c < dv; ++c) {
                    const double s = sigma[((b * H + h) * sq + i) * dv + c];
                    if (s == 0) continue;
                    for (std::size_t e = 0; e < eo; ++e) {
                        const double wa = detail::abs_d(w.w_o(h * dv + c, e));
                        r.t0[(b * sq + i) * eo + e] += s * wa;
                        r.t1[(b * sq + i) * eo + e] += l_row * s * wa;
                    }
                }
            }
    // The output bias: adding it rounds once more, relative to |y| ≤ t0 + |b_o|.
    for (std::size_t n = 0; n < r.t0.size(); ++n) {
        const double bo = w.b_o.empty() ? 0.0 : detail::abs_d(w.b_o[n % eo]);
        r.t0[n] = (r.t0[n] + bo) * (1 + 0x1p-46);
        r.t1[n] *= 1 + 0x1p-46;
    }
    const std::size_t em = x_q.extents[2];
    r.n_keys = d.key_length;
    r.n_dot = d.head_dim_qk + 2 * em + 8;
    r.n_extra = em + 2 + H * dv + 2;
    return r;
}
inline worst_case_scales mha_worst_case_scales(tensor_view<const double, 3> x_q, tensor_view<const double, 3> x_k,
                                               tensor_view<const double, 3> x_v, const mha_parameters<double>& w,
                                               tensor_view<const double, 4> p, const mha_options& o) {
    const tensor<double, 4> logits = mha_logits<uniform_precision<double>>(x_q, x_k, w, o);
    return mha_worst_case_scales(x_q, x_k, x_v, w, p, o, logits.view());
}

/// Two coefficients of a rounding-error term: its value is acc·u_acc^k + store·u^k, with k = 2 for
/// variance-like terms and k = 1 for linear ones (u_acc, u: see data_aware_scales::bound).
struct two_part {
    double acc = 0, store = 0;
    two_part& operator+=(const two_part& o) {
        acc += o.acc, store += o.store;
        return *this;
    }
    friend two_part operator*(double a, const two_part& t) { return {a * t.acc, a * t.store}; }
    friend two_part operator+(two_part a, const two_part& b) { return a += b; }
    /// Componentwise maximum: an upper bound of the maximum of the two evaluated terms.
    static two_part max(const two_part& a, const two_part& b) { return {std::max(a.acc, b.acc), std::max(a.store, b.store)}; }
};

/// Confidence parameter λ of the data-aware model: a bound λ·u·√(Σ c_e²) on Σ c_e δ_e fails with
/// probability at most 2·exp(−λ²/2) ≈ 2.5e-14 per element (Azuma–Hoeffding) under the model.
inline constexpr double data_aware_lambda = 8;

/// Per-element terms of the data-aware (probabilistic, first-order) bound; see the file comment.
struct data_aware_scales {
    std::vector<two_part> coupled;      ///< variance of the logit- and softmax-path errors (Σ c_e², per unit roundoff²)
    std::vector<two_part> independent;  ///< variance of the value-path, P·V, W_o and storage errors
    std::vector<two_part> linear;       ///< worst-case terms summed as absolute values (correlated roundings, floor)
    std::vector<two_part> logit_var;    ///< the largest logit variance of the element's rows (second-order factor)
    std::vector<double> logit_linear;   ///< the largest linear logit perturbation, per u_acc (second-order factor)
    double lambda = data_aware_lambda;
    /// The rigorous worst-case bound of the same case: where it is smaller (short sums), it is used.
    worst_case_scales worst_case;
    /// Per attention row (b, h, i): the logit variance and linear logit term (for weights_bound).
    std::vector<two_part> row_logit_var;
    std::vector<double> row_logit_linear;
    std::size_t n_keys = 0;

    /// ε of the file comment: a bound on every logit perturbation of the row.
    double logit_epsilon(const two_part& var, double linear_term, double u, double u_acc) const {
        return lambda * std::sqrt(var.acc * u_acc * u_acc + var.store * u * u) + linear_term * u_acc;
    }
    /// ε for every attention row (b, h, i).
    std::vector<double> logit_bounds(double u, double u_acc) const {
        std::vector<double> eps(row_logit_var.size());
        for (std::size_t r = 0; r < eps.size(); ++r) eps[r] = logit_epsilon(row_logit_var[r], row_logit_linear[r], u, u_acc);
        return eps;
    }

    std::size_t size() const { return coupled.size(); }
    /// u: the candidate format's unit roundoff (storage: inputs, Q/K/V, P, head outputs, output);
    /// u_acc: that of its accumulation (see accumulate_roundoff). +inf when the first-order model
    /// breaks down (logit perturbations of order 1: the bound is then vacuous, and reported so).
    double bound(std::size_t e, double u, double u_acc) const {
        const double ua2 = u_acc * u_acc, us2 = u * u;
        const double eps = logit_epsilon(logit_var[e], logit_linear[e], u, u_acc);
        const double g = eps > 0 ? std::expm1(2 * eps) / (2 * eps) : 1.0;  // (e^{2ε} − 1)/(2ε) ≥ 1
        // g·x with g = +inf (ε beyond exp's range) and x = 0 is 0 here, not NaN.
        const auto times = [](double a, double x) { return x == 0 ? 0.0 : a * x; };
        const double var = times(g * g, coupled[e].acc * ua2 + coupled[e].store * us2) + independent[e].acc * ua2 +
                           independent[e].store * us2;
        const double b = (lambda * std::sqrt(var) + times(g, linear[e].acc * u_acc + linear[e].store * u)) * (1 + 0x1p-40);
        if (worst_case.size() != size()) return b;  // (1 + 2⁻⁴⁰): this evaluation's own rounding
        // Both are upper bounds (the worst-case one rigorous to every order, see worst_case_scales::
        // bound), so the smaller is one too; a NaN b stays NaN (reported as vacuous, never a pass).
        const double w = worst_case.bound(e, u, u_acc);
        return w < b ? w : b;
    }
    double bound(std::size_t e, double u) const { return bound(e, u, u); }
};

namespace detail {
/// A bound on every partial sum of terms whose positive ones add up to `pos` and whose negative ones
/// to −`neg`, in whatever order and grouping they are summed: max(pos, neg) (rounded upward).
inline double partial_sum_bound(double pos, double neg) { return std::max(pos, neg) * (1 + 0x1p-48); }

/// Exact values and error variances (Σ c_e² per unit roundoff², two_part) of the q, k, v one
/// attention reads, in the layouts (B,H,Sq,dk), (B,Hkv,Sk,dk), (B,Hkv,Sk,dv).
struct head_inputs {
    tensor_view<const double, 4> q, k, v;
    std::span<const two_part> var_q, var_k, var_v;
};

/// Per (b,h,i,c) terms of the head output o = softmax(S)·V and per (b,h,i) logit terms.
struct head_terms {
    std::vector<two_part> coupled, independent, linear, logit_var;  // logit_var per (b,h,i)
    std::vector<double> logit_linear, out;                          // logit_linear per (b,h,i); out = o per (b,h,i,c)
};

/// The data-aware terms of one attention (steps 1–4 of the derivation in the file comment). `logits`
/// and `p` are the reference's (B,H,Sq,Sk); keys with p_j = 0 (masked, underflowed) add nothing.
inline head_terms attention_terms(const head_inputs& in, tensor_view<const double, 4> logits, tensor_view<const double, 4> p,
                                  double scale) {
    const auto [batch, heads, sq, dk] = in.q.extents;
    const std::size_t kv = in.k.extents[1], sk = in.k.extents[2], dv = in.v.extents[3], group = heads / kv;
    const double s = abs_d(scale), s2 = scale * scale, n = static_cast<double>(sk);
    head_terms t;
    t.coupled.assign(batch * heads * sq * dv, {});
    t.independent.assign(t.coupled.size(), {});
    t.linear.assign(t.coupled.size(), {});
    t.out.assign(t.coupled.size(), 0.0);
    t.logit_var.assign(batch * heads * sq, {});
    t.logit_linear.assign(batch * heads * sq, 0.0);
    std::vector<double> sigma(dv), k2(dk), d2(dv);
    for (std::size_t b = 0; b < batch; ++b)
        for (std::size_t h = 0; h < heads; ++h)
            for (std::size_t i = 0; i < sq; ++i) {
                const std::size_t row = (b * heads + h) * sq + i, g = h / group;
                const double* q = &in.q(b, h, i, 0);
                const two_part* vq = &in.var_q[row * dk];
                double* o = &t.out[row * dv];
                two_part* cpl = &t.coupled[row * dv];
                two_part* ind = &t.independent[row * dv];
                two_part* lin = &t.linear[row * dv];
                auto live = [&](std::size_t j) { return p(b, h, i, j) > 0; };  // false for 0 and NaN
                double m = -std::numeric_limits<double>::infinity();
                std::fill(sigma.begin(), sigma.end(), 0.0);
                std::fill(k2.begin(), k2.end(), 0.0);
                std::fill(d2.begin(), d2.end(), 0.0);
                for (std::size_t j = 0; j < sk; ++j) {
                    if (!live(j)) continue;
                    const double pj = p(b, h, i, j), sj = logits(b, h, i, j);
                    if (std::isfinite(sj)) m = std::max(m, sj);
                    for (std::size_t c = 0; c < dv; ++c) o[c] += pj * in.v(b, g, j, c), sigma[c] += pj * abs_d(in.v(b, g, j, c));
                    for (std::size_t c = 0; c < dk; ++c) k2[c] += pj * in.k(b, g, j, c) * in.k(b, g, j, c);
                }
                for (std::size_t j = 0; j < sk; ++j) {
                    if (!live(j)) continue;
                    for (std::size_t c = 0; c < dv; ++c) {
                        const double d = in.v(b, g, j, c) - o[c];
                        d2[c] += p(b, h, i, j) * d * d;
                    }
                }
                two_part vqk;  // Σ_c Var(q_c)·Σ_j p_j k_jc²
                for (std::size_t c = 0; c < dk; ++c) vqk += k2[c] * vq[c];
                two_part eps_var;
                double eps_lin = 0;
                for (std::size_t j = 0; j < sk; ++j) {
                    if (!live(j)) continue;
                    const double pj = p(b, h, i, j), sj = logits(b, h, i, j);
                    const double* k = &in.k(b, g, j, 0);
                    const two_part* vk = &in.var_k[((b * kv + g) * sk + j) * dk];
                    const two_part* vv = &in.var_v[((b * kv + g) * sk + j) * dv];
                    double qk2 = 0, qka = 0, qkp = 0, qkn = 0;
                    two_part var_k_dot, var_q_dot;  // Σ_c q_c² Var(k_jc), Σ_c k_jc² Var(q_c)
                    for (std::size_t c = 0; c < dk; ++c) {
                        const double x = q[c] * k[c];
                        qk2 += x * x, qka += abs_d(x);
                        (x > 0 ? qkp : qkn) += abs_d(x);
                        var_k_dot += (q[c] * q[c]) * vk[c];
                        var_q_dot += (k[c] * k[c]) * vq[c];
                    }
                    const double mag = s * qka + (std::isfinite(sj) ? abs_d(sj) : 0.0);  // M_j
                    const double shifted = std::isfinite(sj) ? abs_d(sj - m) : 0.0;
                    // The dot product's own roundings (dk products, dk additions with partial sums ≤ s·Σ|q k|)
                    // and four more of magnitude ≤ M_j (scale, softcap, ALiBi, additive mask).
                    const double partial = partial_sum_bound(qkp, qkn);
                    const two_part dot{s2 * (qk2 + static_cast<double>(dk) * partial * partial) + 4 * mag * mag, 0};
                    eps_var = two_part::max(eps_var, s2 * (var_q_dot + var_k_dot) + dot);
                    eps_lin = std::max(eps_lin, shifted + 4);
                    const two_part per_key = (pj * pj) * (s2 * var_k_dot + dot);
                    for (std::size_t c = 0; c < dv; ++c) {
                        const double vjc = in.v(b, g, j, c), d = vjc - o[c];
                        cpl[c] += (d * d) * per_key;
                        lin[c].acc += pj * abs_d(d) * (shifted + 4) + pj * abs_d(vjc);
                        lin[c].store += pj * abs_d(vjc) + 3 * pj * mag * abs_d(d);
                        ind[c] += (pj * pj) * vv[c];
                        ind[c].acc += pj * pj * vjc * vjc;
                    }
                }
                for (std::size_t c = 0; c < dv; ++c) {
                    cpl[c] += (s2 * d2[c]) * vqk;
                    cpl[c].acc += 2 * n * sigma[c] * sigma[c];
                    ind[c].acc += n * sigma[c] * sigma[c];
                    ind[c].store += o[c] * o[c];
                    lin[c].store += sigma[c];
                }
                t.logit_var[row] = eps_var;
                t.logit_linear[row] = eps_lin;
            }
    return t;
}
}  // namespace detail

/// Data-aware terms for scaled dot-product attention. q, k, v are the golden inputs, p the golden
/// (certified) weights (B, H, Sq, Sk); options as the case uses them.
inline data_aware_scales sdpa_scales(tensor_view<const double, 4> q, tensor_view<const double, 4> k,
                                     tensor_view<const double, 4> v, tensor_view<const double, 4> p,
                                     const attention_options& options) {
    const tensor<double, 4> logits = attention_logits<uniform_precision<double>>(q, k, options);
    // Rounding the inputs to the candidate's format: one rounding per element, each used by one q_i,
    // k_j, v_j; and one more in u_acc where the scale multiplies q or k (on_query, split_sqrt).
    auto input_var = [](tensor_view<const double, 4> x) {
        std::vector<two_part> r(x.size());
        for (std::size_t n = 0; n < x.size(); ++n) r[n] = {x.data[n] * x.data[n], x.data[n] * x.data[n]};
        return r;
    };
    const std::vector<two_part> vq = input_var(q), vk = input_var(k), vv = input_var(v);
    const double scale = ::attnref::detail::logit_scale<double>(options, q.extents[3]);
    detail::head_terms t = detail::attention_terms({q, k, v, vq, vk, vv}, logits.view(), p, scale);
    data_aware_scales r;
    r.worst_case = sdpa_worst_case_scales(q, k, v, p, options, logits.view());
    const std::size_t dv = v.extents[3];
    r.coupled = std::move(t.coupled);
    r.independent = std::move(t.independent);
    r.linear = std::move(t.linear);
    r.logit_var.resize(r.coupled.size());
    r.logit_linear.resize(r.coupled.size());
    for (std::size_t e = 0; e < r.coupled.size(); ++e) r.logit_var[e] = t.logit_var[e / dv], r.logit_linear[e] = t.logit_linear[e / dv];
    r.row_logit_var = std::move(t.logit_var);
    r.row_logit_linear = std::move(t.logit_linear);
    r.n_keys = k.extents[2];
    return r;
}

namespace detail {
/// Exact y = x·W + b (B, S, F) in double and the variance of its computed value in head layout
/// (B, F/d, S, d): products and additions in u_acc (partial sums ≤ |x|·|W| + |b|), rounding x (used
/// by the row's `uses_x` outputs), W and b (used by `uses_w` rows) and the result to storage.
inline void projection_terms(tensor_view<const double, 3> x, tensor_view<const double, 2> W, tensor_view<const double, 1> bias,
                             std::size_t heads, double uses_x, double uses_w, tensor<double, 4>& y, std::vector<two_part>& var) {
    const std::size_t batch = x.extents[0], len = x.extents[1], in = x.extents[2], out = W.extents[1], d = out / heads;
    y = tensor<double, 4>({batch, heads, len, d});
    var.assign(y.size(), {});
    std::vector<double> sum(out), sq(out), pos(out), neg(out);
    for (std::size_t b = 0; b < batch; ++b)
        for (std::size_t s = 0; s < len; ++s) {
            std::fill(sum.begin(), sum.end(), 0.0), std::fill(sq.begin(), sq.end(), 0.0);
            std::fill(pos.begin(), pos.end(), 0.0), std::fill(neg.begin(), neg.end(), 0.0);
            for (std::size_t e = 0; e < in; ++e) {
                const double xe = x(b, s, e);
                if (xe == 0) continue;
                for (std::size_t f = 0; f < out; ++f) {
                    const double t = xe * W(e, f);
                    sum[f] += t, sq[f] += t * t;
                    (t > 0 ? pos[f] : neg[f]) += abs_d(t);
                }
            }
            for (std::size_t f = 0; f < out; ++f) {
                const double bf = bias.empty() ? 0.0 : bias[f], yf = sum[f] + bf;
                const double m = partial_sum_bound(pos[f] + (bf > 0 ? bf : 0.0), neg[f] + (bf < 0 ? -bf : 0.0));
                const std::size_t h = f / d, c = f % d, at = ((b * heads + h) * len + s) * d + c;
                y.data()[at] = yf;
                // (+ y² in u_acc: the scale's multiplication where it is applied to q or k)
                var[at] = {sq[f] + bf * bf + static_cast<double>(in + 1) * m * m + yf * yf,
                           (uses_x + uses_w) * sq[f] + uses_w * bf * bf + yf * yf};
            }
        }
}
}  // namespace detail

/// Data-aware terms for multi-head attention (see multi_head_attention.hpp for the layout).
inline data_aware_scales mha_scales(tensor_view<const double, 3> x_q, tensor_view<const double, 3> x_k,
                                    tensor_view<const double, 3> x_v, const mha_parameters<double>& w,
                                    tensor_view<const double, 4> p, const mha_options& o) {
    const mha_dims d = mha_dims_of(x_q, x_k, x_v, w, o);
    const std::size_t H = d.heads, Hkv = d.kv_heads, sq = d.query_length, sk = d.key_length, dv = d.head_dim_v,
                      eo = d.output_dim, group = H / Hkv;
    tensor<double, 4> qh, kh, vh;
    std::vector<two_part> vq, vk, vv;
    // A rounding of an input x[j, e] reaches all features of row j of every projection that reads x
    // (self-attention: Q, K and V alike), so every projection counts all H·dk + Hkv·(dk + dv) of
    // them; a rounding of W_k[e, f] or W_v[e, f] reaches all Sk keys, one of W_q[e, f] one query.
    const double uses_x = static_cast<double>(H * d.head_dim_qk + Hkv * (d.head_dim_qk + dv));
    detail::projection_terms(x_q, w.w_q, w.b_q, H, uses_x, 1, qh, vq);
    detail::projection_terms(x_k, w.w_k, w.b_k, Hkv, uses_x, static_cast<double>(sk), kh, vk);
    detail::projection_terms(x_v, w.w_v, w.b_v, Hkv, uses_x, static_cast<double>(sk), vh, vv);
    const tensor<double, 4> logits = attention_logits<uniform_precision<double>>(tensor_view<const double, 4>(qh.view()),
                                                                                 tensor_view<const double, 4>(kh.view()), o.attention);
    const double scale = ::attnref::detail::logit_scale<double>(o.attention, d.head_dim_qk);
    detail::head_terms t = detail::attention_terms({qh.view(), kh.view(), vh.view(), vq, vk, vv}, logits.view(), p, scale);
    // Through W_o: a coupled event of head h (one δ moving the whole head output) reaches y_l through
    // Σ_c W_o[h·dv + c, l]·A_c ≤ ‖W_o^h[·, l]‖·‖A‖ (Cauchy–Schwarz); independent events through W_o².
    // GQA: a K/V rounding feeds the group's H/Hkv heads, (Σ of G terms)² ≤ G·Σ of squares.
    std::vector<double> wn2(H * eo, 0.0);
    for (std::size_t h = 0; h < H; ++h)
        for (std::size_t c = 0; c < dv; ++c)
            for (std::size_t l = 0; l < eo; ++l) wn2[h * eo + l] += w.w_o(h * dv + c, l) * w.w_o(h * dv + c, l);
    const double G = static_cast<double>(group), hd = static_cast<double>(H * dv);
    data_aware_scales r;
    r.worst_case = mha_worst_case_scales(x_q, x_k, x_v, w, p, o, logits.view());
    const std::size_t total = d.batch * sq * eo;
    r.coupled.assign(total, {}), r.independent.assign(total, {}), r.linear.assign(total, {});
    r.logit_var.assign(total, {}), r.logit_linear.assign(total, 0.0);
    std::vector<two_part> head_cpl(H);
    std::vector<double> y(eo), y2(eo), ypos(eo), yneg(eo);
    for (std::size_t b = 0; b < d.batch; ++b)
        for (std::size_t i = 0; i < sq; ++i) {
            const std::size_t out_row = (b * sq + i) * eo;
            two_part eps_var;
            double eps_lin = 0;
            std::fill(y.begin(), y.end(), 0.0), std::fill(y2.begin(), y2.end(), 0.0);
            std::fill(ypos.begin(), ypos.end(), 0.0), std::fill(yneg.begin(), yneg.end(), 0.0);
            for (std::size_t h = 0; h < H; ++h) {
                const std::size_t row = (b * H + h) * sq + i;
                eps_var = two_part::max(eps_var, t.logit_var[row]);
                eps_lin = std::max(eps_lin, t.logit_linear[row]);
                head_cpl[h] = {};
                for (std::size_t c = 0; c < dv; ++c) head_cpl[h] += t.coupled[row * dv + c];
                for (std::size_t l = 0; l < eo; ++l) r.coupled[out_row + l] += (G * wn2[h * eo + l]) * head_cpl[h];
                for (std::size_t c = 0; c < dv; ++c) {
                    const std::size_t at = row * dv + c;
                    const double hm = t.out[at];
                    for (std::size_t l = 0; l < eo; ++l) {
                        const double wml = w.w_o(h * dv + c, l), x = hm * wml;
                        r.independent[out_row + l] += (G * wml * wml) * t.independent[at];
                        r.linear[out_row + l] += detail::abs_d(wml) * t.linear[at];
                        y[l] += x, y2[l] += x * x;
                        (x > 0 ? ypos[l] : yneg[l]) += detail::abs_d(x);
                    }
                }
            }
            for (std::size_t l = 0; l < eo; ++l) {
                const double bl = w.b_o.empty() ? 0.0 : w.b_o[l], yl = y[l] + bl;
                const double m = detail::partial_sum_bound(ypos[l] + (bl > 0 ? bl : 0.0), yneg[l] + (bl < 0 ? -bl : 0.0));
                // W_o's products and H·dv additions (+ bias) in u_acc; rounding W_o, b_o and y to storage.
                r.independent[out_row + l] += two_part{y2[l] + (hd + 1) * m * m, y2[l] + bl * bl + yl * yl};
                r.logit_var[out_row + l] = eps_var;
                r.logit_linear[out_row + l] = eps_lin;
            }
        }
    r.row_logit_var = std::move(t.logit_var);
    r.row_logit_linear = std::move(t.logit_linear);
    r.n_keys = sk;
    return r;
}


/// FlashAttention's baseline-relative bound for one tensor: 2·max|naive − ref| + 2·max|(ref + 0.3 −
/// 0.3) − ref| with the ±0.3 evaluated in the candidate's format (FA3). One number for the tensor.
inline double baseline_bound(std::span<const double> reference, std::span<const double> naive, candidate_format f) {
    double naive_err = 0, floor = 0;
    for (std::size_t n = 0; n < reference.size(); ++n) {
        const double e = reference[n];
        if (!std::isfinite(e)) continue;
        if (std::isfinite(naive[n])) naive_err = std::max(naive_err, detail::abs_d(naive[n] - e));
        const double shifted = round_to(f, round_to(f, round_to(f, e) + 0.3) - 0.3);
        floor = std::max(floor, detail::abs_d(shifted - e));
    }
    return 2 * naive_err + 2 * floor;
}

/// Result of comparing one tensor under one model.
struct comparison {
    std::size_t elements = 0, violations = 0, nonfinite_mismatches = 0;
    double max_abs = 0, max_rel = 0, max_ulp = 0, rms = 0;
    double worst_ratio = 0;  ///< max over elements of |a − e| / bound (inf where the bound is 0 and the error is not)
    std::size_t worst_index = 0;
    double worst_candidate = 0, worst_expected = 0, worst_bound = 0;
    bool ok() const { return violations == 0 && nonfinite_mismatches == 0; }
};

/// Compares candidate a against reference e elementwise. `bound_at(n)` gives the absolute bound of
/// element n (for the ulp model pass ulp_limit instead and a null bound_at). NaN must match NaN, ±inf
/// must match the same infinity; any other non-finite mismatch is a violation.
///
/// The elements are compared in fixed chunks of compare_chunk_elements, the chunks on up to
/// `threads` threads (0: std::thread::hardware_concurrency(); an input of one chunk stays on the
/// calling thread), and the chunks' results merged in chunk order: counts add, maxima take the max,
/// the worst element is the first (lowest index) with the largest ratio, and rms adds the chunks'
/// sums of squares in chunk order. The result is the same, bit for bit, for every thread count.
/// `bound_at` is called concurrently from several threads (once per n, in no particular order across
/// chunks): it must be safe to call that way, e.g. a lambda that only reads.
namespace detail {
/// x/y > limit may hold only if x ≥ limit·y·(1 − 2⁻⁵⁰) (x, y ≥ 0, limit ≥ 0): a cheap test that
/// skips the division for the (common) elements that cannot raise a running maximum. Conservative:
/// whenever it answers false, the exact quotient is below limit, so fl(x/y) ≤ limit.
inline bool may_exceed(double x, double y, double limit) { return !(x < limit * y * (1 - 0x1p-50)); }

/// Elements per chunk of compare(): a constant, so that the chunks (and the order their sums of
/// squares are added in) never depend on the thread count.
inline constexpr std::size_t compare_chunk_elements = std::size_t{1} << 16;

/// One element as a candidate for comparison's worst_* fields.
struct compare_worst {
    double ratio = 0;
    std::size_t index = 0;
    double candidate = 0, expected = 0, bound = 0;
};

/// compare()'s result over one chunk. The sequential rule — the first element to reach the worst
/// test becomes the worst, a later one replaces it only when its ratio is strictly larger — is
/// split so that chunks merge exactly: `worst` is the first element with the largest non-NaN ratio
/// and `first` the chunk's first element to reach the test (it decides alone when its ratio is NaN,
/// as no ratio compares larger than NaN; ratios are NaN e.g. for inf/inf).
struct compare_partial {
    std::size_t violations = 0, nonfinite_mismatches = 0;
    double max_abs = 0, max_rel = 0, max_ulp = 0, sum_sq = 0;
    compare_worst first, worst;
    bool have_first = false, have_worst = false;
};

/// Compares elements [begin, end) with the format fixed at compile time (the per-element ULP
/// distance then has no switch).
template <candidate_format F, class BoundAt>
compare_partial compare_chunk(std::span<const double> a, std::span<const double> e, std::size_t begin, std::size_t end,
                              BoundAt& bound_at, std::optional<double> ulp_limit) {
    // Locals, not compare_partial's fields, in the loop: they stay in registers.
    std::size_t violations = 0, nonfinite_mismatches = 0;
    double max_abs = 0, max_rel = 0, max_ulp = 0, sum_sq = 0;
    compare_worst first, worst;
    bool have_first = false, have_worst = false;
    const auto consider = [&](double ratio, std::size_t n, double x, double y, double bound) {
        if (!have_first) first = {ratio, n, x, y, bound}, have_first = true;
        if (ratio > worst.ratio || (!have_worst && !std::isnan(ratio))) worst = {ratio, n, x, y, bound}, have_worst = true;
    };
    for (std::size_t n = begin; n < end; ++n) {
        const double x = a[n], y = e[n];
        double ratio = 0, bound = 0;
        if (!std::isfinite(x) || !std::isfinite(y)) {
            const bool same = (std::isnan(x) && std::isnan(y)) || x == y;
            if (same) continue;
            ++nonfinite_mismatches;
            ++violations;
            consider(std::numeric_limits<double>::infinity(), n, x, y, 0);
            max_abs = std::numeric_limits<double>::infinity();
            continue;
        }
        // std::fabs, not abs_d: branch-free (abs_d's branch on the sign mispredicts on real data) and
        // the same values but for the sign of a zero err, which nothing below can tell apart.
        const double err = std::fabs(x - y);
        sum_sq += err * err;
        max_abs = std::max(max_abs, err);
        if (y != 0) {
            if (may_exceed(err, std::fabs(y), max_rel)) max_rel = std::max(max_rel, err / std::fabs(y));
        } else if (err != 0) {
            max_rel = std::numeric_limits<double>::infinity();
        }
        const double ulps = ulp_distance(F, x, y);
        max_ulp = std::max(max_ulp, ulps);
        if (ulp_limit) {
            bound = *ulp_limit;
            ratio = ulps / *ulp_limit;
        } else {
            bound = bound_at(n);
            // Skip the division when err ≤ bound and err/bound cannot exceed the chunk's worst ratio
            // so far: then ratio ≤ 1 and ≤ worst.ratio, and neither the count nor the worst can change.
            if (have_worst && err <= bound && !may_exceed(err, bound, worst.ratio)) continue;
            ratio = err == 0 ? 0 : (bound > 0 ? err / bound : std::numeric_limits<double>::infinity());
        }
        if (ratio > 1) ++violations;
        consider(ratio, n, x, y, bound);
    }
    compare_partial p;
    p.violations = violations, p.nonfinite_mismatches = nonfinite_mismatches;
    p.max_abs = max_abs, p.max_rel = max_rel, p.max_ulp = max_ulp, p.sum_sq = sum_sq;
    p.first = first, p.worst = worst, p.have_first = have_first, p.have_worst = have_worst;
    return p;
}

/// compare() with the format fixed at compile time: chunks, then their merge in chunk order.
template <candidate_format F, class BoundAt>
comparison compare_in(std::span<const double> a, std::span<const double> e, BoundAt& bound_at, std::optional<double> ulp_limit,
                      std::size_t threads = 0) {
    const std::size_t size = a.size();
    const std::size_t chunks = (size + compare_chunk_elements - 1) / compare_chunk_elements;
    std::vector<compare_partial> parts(chunks);
    ::attnref::detail::parallel_for(chunks, chunks < 2 ? 1 : threads, [&](std::size_t k) {
        const std::size_t begin = k * compare_chunk_elements;
        parts[k] = compare_chunk<F>(a, e, begin, std::min(size, begin + compare_chunk_elements), bound_at, ulp_limit);
    });
    comparison c;
    c.elements = a.size();
    compare_partial all;
    for (const compare_partial& p : parts) {
        all.violations += p.violations;
        all.nonfinite_mismatches += p.nonfinite_mismatches;
        all.max_abs = std::max(all.max_abs, p.max_abs);
        all.max_rel = std::max(all.max_rel, p.max_rel);
        all.max_ulp = std::max(all.max_ulp, p.max_ulp);
        all.sum_sq += p.sum_sq;
        if (!all.have_first && p.have_first) all.first = p.first, all.have_first = true;
        if (p.have_worst && (!all.have_worst || p.worst.ratio > all.worst.ratio)) all.worst = p.worst, all.have_worst = true;
    }
    c.violations = all.violations;
    c.nonfinite_mismatches = all.nonfinite_mismatches;
    c.max_abs = all.max_abs;
    c.max_rel = all.max_rel;
    c.max_ulp = all.max_ulp;
    const compare_worst* w = all.have_first && std::isnan(all.first.ratio) ? &all.first : all.have_worst ? &all.worst : nullptr;
    if (w) c.worst_ratio = w->ratio, c.worst_index = w->index, c.worst_candidate = w->candidate, c.worst_expected = w->expected,
           c.worst_bound = w->bound;
    c.rms = a.empty() ? 0 : std::sqrt(all.sum_sq / static_cast<double>(a.size()));
    return c;
}
}  // namespace detail

/// `threads`: as above (0: one per hardware thread); the result does not depend on it.
template <class BoundAt>
comparison compare(std::span<const double> a, std::span<const double> e, candidate_format f, BoundAt&& bound_at,
                   std::optional<double> ulp_limit = std::nullopt, std::size_t threads = 0) {
    switch (f) {
        case candidate_format::float64: return detail::compare_in<candidate_format::float64>(a, e, bound_at, ulp_limit, threads);
        case candidate_format::float32: return detail::compare_in<candidate_format::float32>(a, e, bound_at, ulp_limit, threads);
        case candidate_format::bfloat16: return detail::compare_in<candidate_format::bfloat16>(a, e, bound_at, ulp_limit, threads);
        case candidate_format::float16: return detail::compare_in<candidate_format::float16>(a, e, bound_at, ulp_limit, threads);
    }
    return {};
}

/// Elementwise assert_close bound atol + rtol·|e|.
inline comparison compare_assert_close(std::span<const double> a, std::span<const double> e, candidate_format f) {
    const rtol_atol t = assert_close_defaults(f);
    return compare(a, e, f, [&](std::size_t n) { return t.atol + t.rtol * detail::abs_d(e[n]); });
}
inline comparison compare_ulp(std::span<const double> a, std::span<const double> e, candidate_format f, double limit = 4) {
    return compare(a, e, f, [](std::size_t) { return 0.0; }, limit);
}
/// Evaluates a data-aware or worst-case bound for every element, for candidates in format f: the
/// per-element bounds compare() and the checker's judge_output take.
template <class Scales>
std::vector<double> element_bounds(const Scales& s, candidate_format f) {
    const double u = unit_roundoff(f), ua = accumulate_roundoff(f);
    std::vector<double> b(s.size());
    for (std::size_t n = 0; n < b.size(); ++n) b[n] = s.bound(n, u, ua);
    return b;
}
/// Compares under a data_aware_scales or worst_case_scales bound.
template <class Scales>
comparison compare_data_aware(std::span<const double> a, std::span<const double> e, candidate_format f, const Scales& s) {
    const double u = unit_roundoff(f), ua = accumulate_roundoff(f);
    return compare(a, e, f, [&](std::size_t n) { return s.bound(n, u, ua); });
}

/// Smallest positive normal number of the format (of fp32 for 16-bit formats, whose exponentials are
/// taken in fp32): the absolute error a weight may have through underflow or flush-to-zero.
constexpr double weights_floor(candidate_format f) {
    switch (f) {
        case candidate_format::float64: return 0x1p-1022;
        case candidate_format::float32:
        case candidate_format::bfloat16: return 0x1p-126;
        case candidate_format::float16: return 0x1p-14;
    }
    return 0;
}

/// Bound on |p̂_j − p_j| for the candidate's attention weights against the golden weights p
/// (B, H, Sq, Sk), with the row's logit bound ε (see data_aware_scales; u, u_acc those of the
/// candidate's format f): logit perturbations ≤ ε move p_j by at most p_j·(e^{2ε} − 1); the
/// softmax's own roundings add p_j·(λ·√(2n)·u_acc + 6u_acc) (the denominator's n additions as in
/// step 3, the shift, exp and division), storing p_j in format w adds p_j·u_w, and underflow or
/// flush-to-zero add weights_floor(w).
inline double weights_bound(const data_aware_scales& s, std::size_t row, double p, double u, double u_acc, double u_w, double floor) {
    const double eps = s.logit_epsilon(s.row_logit_var[row], s.row_logit_linear[row], u, u_acc);
    const double rel = std::expm1(2 * eps) + s.lambda * std::sqrt(2 * static_cast<double>(s.n_keys)) * u_acc + 6 * u_acc + u_w;
    return (detail::abs_d(p) * rel + floor) * (1 + 0x1p-40);
}
/// Element e's weights_bound for weights stored in format w of a candidate computing in format f.
inline auto weights_bound_at(std::span<const double> p, candidate_format f, candidate_format w, const data_aware_scales& s) {
    const double u = unit_roundoff(f), ua = accumulate_roundoff(f), uw = unit_roundoff(w), fl = std::max(weights_floor(f), weights_floor(w));
    const std::size_t n = std::max<std::size_t>(s.n_keys, 1);
    return [=, &s](std::size_t e) { return weights_bound(s, e / n, p[e], u, ua, uw, fl); };
}
/// Compares weights a (stored in format w) of a candidate computing in format f with the golden p.
inline comparison compare_weights(std::span<const double> a, std::span<const double> p, candidate_format f, candidate_format w,
                                  const data_aware_scales& s) {
    return compare(a, p, w, weights_bound_at(p, f, w, s));
}
inline comparison compare_weights(std::span<const double> a, std::span<const double> p, candidate_format f, const data_aware_scales& s) {
    return compare_weights(a, p, f, f, s);
}

/// Bound on |lŝe − lse| for a row's log-sum-exp: lse is 1-Lipschitz in the largest logit
/// perturbation, so ε (see data_aware_scales; u, u_acc of the candidate's format) plus the
/// denominator's roundings λ·√(2n)·u_acc, the shift, exp and log (6u_acc) and storing lse in a
/// format of unit roundoff u_l (u_l·|lse|).
inline double lse_bound(const data_aware_scales& s, std::size_t row, double lse, double u, double u_acc, double u_l) {
    const double eps = s.logit_epsilon(s.row_logit_var[row], s.row_logit_linear[row], u, u_acc);
    return (eps + s.lambda * std::sqrt(2 * static_cast<double>(s.n_keys)) * u_acc + 6 * u_acc + u_l * detail::abs_d(lse)) * (1 + 0x1p-40);
}
/// Element e's lse_bound for an lse stored in format l of a candidate computing in format f.
inline auto lse_bound_at(std::span<const double> lse, candidate_format f, candidate_format l, const data_aware_scales& s) {
    const double u = unit_roundoff(f), ua = accumulate_roundoff(f), ul = unit_roundoff(l);
    return [=, &s](std::size_t e) { return lse_bound(s, e, lse[e], u, ua, ul); };
}
/// Compares lse a (stored in format l) of a candidate computing in format f with the golden lse.
inline comparison compare_lse(std::span<const double> a, std::span<const double> lse, candidate_format f, candidate_format l,
                              const data_aware_scales& s) {
    return compare(a, lse, l, lse_bound_at(lse, f, l, s));
}
inline comparison compare_lse(std::span<const double> a, std::span<const double> lse, candidate_format f, const data_aware_scales& s) {
    return compare_lse(a, lse, f, f, s);
}
inline comparison compare_baseline(std::span<const double> a, std::span<const double> e, std::span<const double> naive,
                                   candidate_format f) {
    const double b = baseline_bound(e, naive, f);
    return compare(a, e, f, [&](std::size_t) { return b; });
}

/// Where a tensor's bounds cannot support a pass (see find_vacuous).
struct vacuity {
    std::size_t elements = 0;  ///< elements whose bound is vacuous
    std::size_t index = 0;     ///< the first of them
    double bound = 0, scale = 0;  ///< its bound and the scale that bound reached
    bool any() const { return elements > 0; }
};

/// The scale an lse bound is measured against: an error of ln 2 in lse is an error of a factor 2
/// in the normaliser e^lse, as large as the normaliser itself (lse has no scale of its own: it
/// shifts with the logits).
inline constexpr double lse_vacuity_scale = 0.6931471805599453;

/// The vacuity criterion. A bound b for an element whose reference is finite (non-finite ones
/// must match exactly) is *vacuous* when
///   - it is not a finite number ≥ 0 (NaN, +inf, negative), or
///   - it is as large as the quantity it bounds: b > 0 and b ≥ R, where R is `fixed_scale` when
///     given (> 0), else the largest finite |reference| value of the element's row (the last axis,
///     `row_length` elements: an output row, a row of weights over the keys).
/// Then every candidate value within b of the reference carries no information about it — a 0,
/// the row's values in any order, the mean of V and the output of an unscaled softmax are all
/// "within the bound" once b ≥ R — so a comparison that finds no violation proves nothing.
/// Rows whose finite reference values are all exactly 0 (empty rows, outputs that are 0 by
/// construction) have no scale: only non-finite bounds are vacuous there (zero-trust covers them).
template <class BoundAt>
vacuity find_vacuous(std::span<const double> reference, std::size_t row_length, BoundAt&& bound_at, double fixed_scale = 0) {
    vacuity v;
    const std::size_t n = reference.size();
    const std::size_t row = row_length > 0 && n % row_length == 0 ? row_length : std::max<std::size_t>(n, 1);
    for (std::size_t begin = 0; begin < n; begin += row) {
        double scale = fixed_scale;
        if (!(fixed_scale > 0)) {
            scale = 0;
            for (std::size_t e = begin; e < begin + row; ++e)
                if (std::isfinite(reference[e])) scale = std::max(scale, detail::abs_d(reference[e]));
        }
        for (std::size_t e = begin; e < begin + row; ++e) {
            if (!std::isfinite(reference[e])) continue;
            const double b = bound_at(e);
            const bool usable = b >= 0 && b < std::numeric_limits<double>::infinity();  // false for NaN
            if (usable && !(b > 0 && scale > 0 && b >= scale)) continue;
            if (v.elements++ == 0) v.index = e, v.bound = b, v.scale = scale;
        }
    }
    return v;
}
/// find_vacuous for per-element bounds given as a vector.
inline vacuity find_vacuous(std::span<const double> reference, std::size_t row_length, std::span<const double> bounds) {
    return find_vacuous(reference, row_length, [&](std::size_t e) { return bounds[e]; });
}

/// Zero-trust (benchdnn): outputs with more than 30% exact zeros, or whose rows (last axis) are all
/// identical, prove nothing. Returns the reason, or nullopt when the output is trustworthy.
/// With the reference (same size), rows whose reference is entirely exact zeros or entirely NaN —
/// empty rows under the zero and NaN policies, zeros by construction that the comparison already
/// pins — are left out of both counts; a case with no other row is untrustworthy.
inline std::optional<std::string_view> untrustworthy(std::span<const double> a, std::size_t row_length,
                                                     std::span<const double> reference = {}, std::size_t threads = 0) {
    if (a.empty()) return std::nullopt;
    const std::size_t row = row_length > 0 && a.size() % row_length == 0 ? row_length : a.size(), rows = a.size() / row;
    const bool with_reference = reference.size() == a.size();
    auto structural = [&](std::size_t r) {
        if (!with_reference) return false;
        const auto e = reference.subspan(r * row, row);
        return std::all_of(e.begin(), e.end(), [](double x) { return x == 0; }) ||
               std::all_of(e.begin(), e.end(), [](double x) { return std::isnan(x); });
    };
    std::size_t first = 0;  // the first row taking part
    while (first < rows && structural(first)) ++first;
    if (first == rows) return "every reference row is empty (exactly 0 or NaN): the case pins only its empty-row policy";
    // Rows in fixed chunks (independent of the thread count); integer counts, so the merge is exact.
    struct part {
        std::size_t kept = 0, zeros = 0;
        bool identical = true;
    };
    const std::size_t rows_per_chunk = std::max<std::size_t>(1, detail::compare_chunk_elements / row);
    const std::size_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
    std::vector<part> parts(chunks);
    ::attnref::detail::parallel_for(chunks, chunks < 2 ? 1 : threads, [&](std::size_t k) {
        part& p = parts[k];
        for (std::size_t r = k * rows_per_chunk; r < std::min(rows, (k + 1) * rows_per_chunk); ++r) {
            if (r < first || (r > first && structural(r))) continue;
            ++p.kept;
            for (std::size_t c = 0; c < row; ++c) {
                const double x = a[r * row + c], y = a[first * row + c];
                p.zeros += x == 0;
                p.identical = p.identical && (x == y || (std::isnan(x) && std::isnan(y)));
            }
        }
    });
    std::size_t kept = 0, zeros = 0;
    bool identical = true;
    for (const part& p : parts) kept += p.kept, zeros += p.zeros, identical = identical && p.identical;
    if (static_cast<double>(zeros) > 0.3 * static_cast<double>(kept * row))
        return with_reference ? "more than 30% of the outputs outside empty rows are exactly 0" : "more than 30% of the outputs are exactly 0";
    if (row_length > 0 && kept > 1 && identical) return "all output rows are identical";
    return std::nullopt;
}

}  // namespace attnref::tolerance
