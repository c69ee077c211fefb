#pragma once
/// \file study/reproduce.hpp
/// Owns: reproductions of published claims about attention numerics (docs/studies-reproduced.md),
/// run through attnref's own attention templates and kernel models (kernel_models.hpp):
///
///   pcast_fp8   FP8 P-cast underflow under attention sinks: blockwise online softmax (FlashAttention
///               rescaling, P rounded per key block) with P·S cast to fp8 e4m3 or e5m2, key blocks in
///               forward or reverse order; measured: the fraction of non-sink weights the cast flushes
///               to zero (read from the attention's pv_weights observer, i.e. exactly what the kernel
///               multiplied V by) against the closed form Φ(Δ + δ_k − c_F − ln S), and the output MSE of
///               forward against reverse order.
///   flash_bf16  bf16 FlashAttention (bf16 inputs, fp32 logits and online softmax, P rounded to bf16
///               per block, fp32 P·V, bf16 output) against materialised baseline attention (the score
///               matrix S and P stored in bf16, fp32 accumulation); measured: each one's deviation from
///               the reference and their ratio.
///
/// Reference: the same templates in float64 (uniform_precision<double>, shifted softmax) on the same
/// rounded inputs. Its own error is at most a few hundred units of 2^-53 of the output's scale (the
/// first-order bound of docs/error-bounds.md with u = 2^-53 and n ≤ 16384), below 1e-11 of every
/// effect measured here (fp8 and bf16 errors are ≥ 1e-6 of it), so the measured errors are the kernels'.
///
/// Statistics: the rows (query × seed) are the independent units (all keys of a row share its
/// running max); a fraction's 95% interval is mean ± 1.96·sd/√rows over the rows' fractions; a ratio
/// of mean squared errors Σa_i/Σb_i gets the ratio estimator's delta-method interval
/// R ± 1.96·√(Σ(a_i − R·b_i)² / (m(m − 1))) / b̄.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>
#include <numbers>
#include <string>
#include <vector>

#include "attnref/core/attention.hpp"
#include "attnref/core/formats.hpp"
#include "attnref/io/generator_normal.hpp"
#include "attnref/core/kernel_models.hpp"
#include "attnref/core/parallel.hpp"
#include "attnref/core/precision.hpp"

namespace attnref::study::reproduce {

/// A mean or ratio with its 95% confidence interval.
struct estimate {
    double value = 0, lo = 0, hi = 0;
};

/// Mean of the values with mean ± 1.96·sd/√m.
inline estimate mean_ci(const std::vector<double>& x) {
    const double m = static_cast<double>(x.size());
    double s = 0;
    for (double v : x) s += v;
    const double mean = s / std::max(m, 1.0);
    double ss = 0;
    for (double v : x) ss += (v - mean) * (v - mean);
    const double se = x.size() > 1 ? std::sqrt(ss / (m - 1) / m) : 0.0;
    return {mean, mean - 1.96 * se, mean + 1.96 * se};
}

/// Σa/Σb with the ratio estimator's delta-method 95% interval (file comment).
inline estimate ratio_ci(const std::vector<double>& a, const std::vector<double>& b) {
    const double m = static_cast<double>(a.size());
    double sa = 0, sb = 0;
    for (std::size_t i = 0; i < a.size(); ++i) sa += a[i], sb += b[i];
    const double r = sa / sb, bbar = sb / m;
    double ss = 0;
    for (std::size_t i = 0; i < a.size(); ++i) ss += (a[i] - r * b[i]) * (a[i] - r * b[i]);
    const double se = a.size() > 1 ? std::sqrt(ss / (m * (m - 1))) / bbar : 0.0;
    return {r, r - 1.96 * se, r + 1.96 * se};
}

/// Standard normal CDF.
inline double normal_cdf(double x) { return 0.5 * std::erfc(-x / std::numbers::sqrt2); }

/// δ_k = E[max of k independent N(0, 1)] (0 for k ≤ 1), by the trapezoid rule on [−12, 12].
inline double expected_max_normal(std::size_t k) {
    if (k <= 1) return 0;
    const double h = 1e-3;
    double s = 0;
    for (int i = -12000; i <= 12000; ++i) {
        const double t = i * h;
        const double density = static_cast<double>(k) * std::exp(-t * t / 2) / std::sqrt(2 * std::numbers::pi) *
                               std::pow(normal_cdf(t), static_cast<double>(k) - 1);
        s += (i == -12000 || i == 12000 ? 0.5 : 1.0) * t * density;
    }
    return s * h;
}

/// c_F = −ln(half the smallest subnormal of F): below it a weight rounds to 0 (ties to even).
/// e4m3: 10·ln 2 = 6.93; e5m2: 17·ln 2 = 11.78.
template <class F>
double underflow_log_threshold() {
    return -std::log(static_cast<double>(std::numeric_limits<F>::denorm_min()) / 2);
}

// ---------------------------------------------------------------------------------------------
// FP8 P-cast under attention sinks
// ---------------------------------------------------------------------------------------------

/// One configuration of the P-cast experiment (docs/studies-reproduced.md states the choices).
struct pcast_config {
    std::string label = "main";
    std::vector<double> deltas;      ///< sink strengths Δ
    std::size_t seq = 4096;          ///< keys n
    std::size_t block = 128;         ///< keys per block (FlashAttention-3's kBlockN for d = 64..128)
    std::size_t sinks = 4;           ///< k_sink
    generator::sink_placement placement = generator::sink_placement::first;
    std::size_t queries = 16;        ///< query rows per seed
    std::size_t head_dim_v = 64;     ///< dv; values ~ N(0, 1)
    bool qk_inputs = false;          ///< false: logits N(0, 1) + Δ given directly; true: q, k ~ N(0, 1)
    std::size_t head_dim_qk = 64;    ///< dk when qk_inputs (logits q·k/√dk + Δ at the sinks)
    std::vector<std::uint64_t> seeds{1, 2, 3, 4};
    bool e5m2 = true;                ///< also run e5m2 (S = 1 and 256)
    bool all_scales = true;          ///< e4m3 with S = 1, 16, 256 (false: 1 and 256)
};

/// One measured curve point: (format, S, order, Δ) of a configuration.
struct pcast_row {
    std::string label, format, order;
    double scale = 1, delta = 0;
    std::size_t seq = 0, block = 0, sinks = 0, rows = 0;
    std::string placement, inputs;
    estimate underflow;                  ///< fraction of non-sink weights flushed to 0 (mean over rows)
    double underflow_outside = 0;        ///< same, over the non-sink keys outside every block holding a sink
    std::size_t flushed = 0;             ///< non-sink weights flushed to 0, all rows
    double closed_form = 0;              ///< Φ(Δ + δ_k − c_F − ln S)
    double mse = 0;                      ///< mean over rows and dv of (ô − o)²
    estimate mse_ratio{std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::quiet_NaN(),
                       std::numeric_limits<double>::quiet_NaN()};  ///< forward rows: MSE forward / reverse
};

namespace detail {

template <class F, double S>
using pcast_policy = with_weights_scale<precision_policy<float, float, F, float>, S>;

struct row_stats {
    std::vector<double> underflow, mse;  // per row
    double outside_flushed = 0, outside_keys = 0;
    std::size_t flushed = 0;
};

/// The kernel of one (format, S, order) on one seed's inputs; per-row statistics appended to `st`.
template <class Policy>
void pcast_run(const pcast_config& c, key_block_order order, const std::vector<float>& q, const std::vector<float>& k,
               const std::vector<float>& v, const std::vector<double>& additive, const std::vector<double>& reference,
               const std::vector<std::uint8_t>& sink, const std::vector<std::uint8_t>& sink_block, row_stats& st) {
    const std::size_t sq = c.queries, n = c.seq, dk = c.qk_inputs ? c.head_dim_qk : 1, dv = c.head_dim_v;
    attention_options o;
    if (!c.qk_inputs) o.scale = 1.0;  // q = k = 0: the logits are the additive term, exactly
    o.softmax.algorithm = softmax_algorithm::online;
    o.softmax.block_size = c.block;
    o.softmax.block_order = order;
    o.threads = 1;
    o.mask.additive.values = {additive.data(), {1, 1, sq, n}};
    std::vector<double> pv(sq * n, -1.0);
    o.pv_weights = pv;
    const auto r = scaled_dot_product_attention<Policy, float, float, float>(tensor_view<const float, 4>{q.data(), {1, 1, sq, dk}},
                                                                             tensor_view<const float, 4>{k.data(), {1, 1, n, dk}},
                                                                             tensor_view<const float, 4>{v.data(), {1, 1, n, dv}}, o);
    std::size_t non_sink = 0;
    for (std::size_t j = 0; j < n; ++j) non_sink += sink[j] ? 0 : 1;
    for (std::size_t i = 0; i < sq; ++i) {
        std::size_t flushed = 0;
        for (std::size_t j = 0; j < n; ++j) {
            if (sink[j]) continue;
            const bool zero = pv[i * n + j] == 0.0;
            flushed += zero ? 1 : 0;
            if (!sink_block[j]) {
                st.outside_flushed += zero ? 1 : 0;
                st.outside_keys += 1;
            }
        }
        st.flushed += flushed;
        st.underflow.push_back(static_cast<double>(flushed) / static_cast<double>(non_sink));
        double se = 0;
        for (std::size_t e = 0; e < dv; ++e) {
            const double d = static_cast<double>(r.output.data()[i * dv + e]) - reference[i * dv + e];
            se += d * d;
        }
        st.mse.push_back(se / static_cast<double>(dv));
    }
}

/// The (format, S) pairs of a configuration, as (name, S, c_F) and a runner for both orders.
struct pcast_kernel {
    std::string format;
    double scale;
    double threshold;  // c_F
    void (*run)(const pcast_config&, key_block_order, const std::vector<float>&, const std::vector<float>&,
                const std::vector<float>&, const std::vector<double>&, const std::vector<double>&,
                const std::vector<std::uint8_t>&, const std::vector<std::uint8_t>&, row_stats&);
};

inline std::vector<pcast_kernel> pcast_kernels(const pcast_config& c) {
    std::vector<pcast_kernel> k;
    const double e4 = underflow_log_threshold<float8_e4m3>(), e5 = underflow_log_threshold<float8_e5m2>();
    k.push_back({"e4m3", 1, e4, &pcast_run<pcast_policy<float8_e4m3, 1.0>>});
    if (c.all_scales) k.push_back({"e4m3", 16, e4, &pcast_run<pcast_policy<float8_e4m3, 16.0>>});
    k.push_back({"e4m3", 256, e4, &pcast_run<pcast_policy<float8_e4m3, 256.0>>});
    if (c.e5m2) {
        k.push_back({"e5m2", 1, e5, &pcast_run<pcast_policy<float8_e5m2, 1.0>>});
        k.push_back({"e5m2", 256, e5, &pcast_run<pcast_policy<float8_e5m2, 256.0>>});
    }
    return k;
}

}  // namespace detail

/// Runs one configuration: for each Δ, kernel and order, the underflow fraction and output MSE over
/// all seeds' rows. Tasks (seed, Δ) run on `threads` threads; results do not depend on the count.
inline std::vector<pcast_row> run_pcast(const pcast_config& c, std::size_t threads = 0) {
    const std::size_t sq = c.queries, n = c.seq, dv = c.head_dim_v, dk = c.qk_inputs ? c.head_dim_qk : 1;
    if (sq == 0 || n == 0 || dv == 0 || c.block == 0 || c.seeds.empty() || c.sinks >= n)
        throw std::invalid_argument("pcast: queries, seq, head dims, block and seeds must be positive and sinks < seq");
    const std::vector<detail::pcast_kernel> kernels = detail::pcast_kernels(c);
    const double delta_k = expected_max_normal(c.sinks);
    generator::sink_family fam{0, c.sinks, c.placement, 1};
    std::vector<std::uint8_t> sink(n, 0), sink_block(n, 0);
    for (std::size_t j = 0; j < n; ++j) sink[j] = generator::is_sink(fam, j, n) ? 1 : 0;
    for (std::size_t j = 0; j < n; ++j)
        if (sink[j])
            for (std::size_t t = (j / c.block) * c.block; t < std::min(n, (j / c.block + 1) * c.block); ++t) sink_block[t] = 1;
    const std::size_t nd = c.deltas.size(), ns = c.seeds.size(), nk = kernels.size();
    // stats[((d·seeds + s)·kernels + k)·2 + order]
    std::vector<detail::row_stats> stats(nd * ns * nk * 2);
    auto task = [&](std::size_t t) {
        const std::size_t di = t / ns, si = t % ns;
        const std::uint64_t seed = c.seeds[si];
        generator::sink_family f = fam;
        f.delta = c.deltas[di];
        const auto as_float = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
        const std::vector<double> vd = generator::generate_normal(seed, generator::role::value, n * dv, binary_format::float32);
        std::vector<double> qd(sq * dk, 0.0), kd(n * dk, 0.0), additive;
        if (c.qk_inputs) {
            qd = generator::generate_normal(seed, generator::role::query, sq * dk, binary_format::float32);
            kd = generator::generate_normal(seed, generator::role::key, n * dk, binary_format::float32);
            additive.assign(sq * n, 0.0);
            for (std::size_t i = 0; i < sq; ++i)
                for (std::size_t j = 0; j < n; ++j) additive[i * n + j] = sink[j] ? f.delta : 0.0;
        } else {
            additive = generator::sink_logits(f, seed, sq, n, binary_format::float32);
        }
        // Reference: float64, shifted softmax, same inputs and conventions.
        attention_options ro;
        if (!c.qk_inputs) ro.scale = 1.0;
        ro.threads = 1;
        ro.mask.additive.values = {additive.data(), {1, 1, sq, n}};
        const auto ref = scaled_dot_product_attention<uniform_precision<double>, double, double, double>(
            tensor_view<const double, 4>{qd.data(), {1, 1, sq, dk}}, tensor_view<const double, 4>{kd.data(), {1, 1, n, dk}},
            tensor_view<const double, 4>{vd.data(), {1, 1, n, dv}}, ro);
        const std::vector<double> reference(ref.output.data(), ref.output.data() + ref.output.size());
        const std::vector<float> q = as_float(qd), k = as_float(kd), v = as_float(vd);
        for (std::size_t ki = 0; ki < nk; ++ki)
            for (std::size_t o = 0; o < 2; ++o)
                kernels[ki].run(c, o == 0 ? key_block_order::forward : key_block_order::reverse, q, k, v, additive, reference, sink,
                                sink_block, stats[((di * ns + si) * nk + ki) * 2 + o]);
    };
    attnref::parallel_for(nd * ns, threads, task);
    std::vector<pcast_row> rows;
    for (std::size_t di = 0; di < nd; ++di)
        for (std::size_t ki = 0; ki < nk; ++ki) {
            std::vector<double> mse_order[2];
            for (std::size_t o = 0; o < 2; ++o) {
                detail::row_stats all;
                for (std::size_t si = 0; si < ns; ++si) {
                    const detail::row_stats& s = stats[((di * ns + si) * nk + ki) * 2 + o];
                    all.underflow.insert(all.underflow.end(), s.underflow.begin(), s.underflow.end());
                    all.mse.insert(all.mse.end(), s.mse.begin(), s.mse.end());
                    all.outside_flushed += s.outside_flushed;
                    all.outside_keys += s.outside_keys;
                    all.flushed += s.flushed;
                }
                pcast_row r;
                r.label = c.label;
                r.format = kernels[ki].format;
                r.scale = kernels[ki].scale;
                r.order = o == 0 ? "forward" : "reverse";
                r.delta = c.deltas[di];
                r.seq = n;
                r.block = c.block;
                r.sinks = c.sinks;
                r.rows = all.underflow.size();
                r.placement = std::string(generator::sink_placement_name(c.placement));
                r.inputs = c.qk_inputs ? "qk_gaussian" : "logits_gaussian";
                r.underflow = mean_ci(all.underflow);
                r.underflow_outside = all.outside_keys > 0 ? all.outside_flushed / all.outside_keys : 0.0;
                r.flushed = all.flushed;
                r.closed_form = normal_cdf(r.delta + delta_k - kernels[ki].threshold - std::log(r.scale));
                double m = 0;
                for (double e : all.mse) m += e;
                r.mse = m / static_cast<double>(std::max<std::size_t>(all.mse.size(), 1));
                mse_order[o] = all.mse;
                rows.push_back(r);
            }
            rows[rows.size() - 2].mse_ratio = ratio_ci(mse_order[0], mse_order[1]);
        }
    return rows;
}

/// The full reproduction: the main configuration (direct N(0, 1) logits, n = 4096, blocks of 128,
/// 4 sinks first, Δ = 0..18, 4 seeds × 16 rows) and the sensitivity configurations (sequence length,
/// block size, sink placement, Q/K inputs, sink count). `reduced`: the CTest size (n = 1024, blocks of
/// 64, 2 seeds × 16 rows, fewer Δ and variants).
inline std::vector<pcast_config> pcast_configs(bool reduced) {
    std::vector<pcast_config> v;
    pcast_config main;
    if (reduced) {
        main.seq = 1024;
        main.block = 64;
        main.seeds = {1, 2};
        main.deltas = {0, 2, 4, 6, 8, 10, 12, 14};
        v.push_back(main);
        pcast_config rev = main;
        rev.label = "placement_last";
        rev.placement = generator::sink_placement::last;
        rev.e5m2 = false;
        rev.all_scales = false;
        v.push_back(rev);
        return v;
    }
    for (int d = 0; d <= 18; ++d) main.deltas.push_back(d);
    v.push_back(main);
    auto variant = [&](std::string label, auto change) {
        pcast_config c = main;
        c.label = std::move(label);
        c.e5m2 = false;
        c.all_scales = false;
        c.deltas.clear();
        for (int d = 0; d <= 18; d += 2) c.deltas.push_back(d);
        change(c);
        v.push_back(c);
    };
    variant("seq_1024", [](pcast_config& c) { c.seq = 1024; c.seeds = {1, 2, 3, 4, 5, 6, 7, 8}; });
    variant("seq_16384", [](pcast_config& c) { c.seq = 16384; c.seeds = {1}; });
    variant("block_64", [](pcast_config& c) { c.block = 64; });
    variant("block_256", [](pcast_config& c) { c.block = 256; });
    variant("block_4096", [](pcast_config& c) { c.block = 4096; });
    variant("placement_last", [](pcast_config& c) { c.placement = generator::sink_placement::last; });
    variant("placement_spread", [](pcast_config& c) { c.placement = generator::sink_placement::spread; });
    variant("qk_gaussian", [](pcast_config& c) { c.qk_inputs = true; });
    variant("sinks_1", [](pcast_config& c) { c.sinks = 1; });
    variant("sinks_16", [](pcast_config& c) { c.sinks = 16; });
    return v;
}

// ---------------------------------------------------------------------------------------------
// bf16 FlashAttention vs materialised baseline
// ---------------------------------------------------------------------------------------------

/// The kernels compared (policy name of policies.hpp where it has one, and the softmax).
///   flash          bf16_fp32acc, online softmax in blocks of `block`: FlashAttention-2
///   baseline       bf16_materialised, shifted softmax: S and P stored in bf16
///   baseline_p     bf16_fp32acc, shifted softmax: only P stored in bf16 (S kept in fp32)
///   flash_pure     bf16 (every operation in bf16), online softmax
///   baseline_pure  bf16 (every operation in bf16), shifted softmax
inline constexpr const char* flash_kernels[] = {"flash", "baseline", "baseline_p", "flash_pure", "baseline_pure"};

struct flash_config {
    std::string label = "main";
    std::vector<std::size_t> seqs{256, 1024, 4096, 16384};
    std::size_t head_dim = 64, block = 128, queries = 16;
    std::vector<std::uint64_t> seeds{1, 2, 3, 4};
    bool uniform_inputs = false;  ///< false: q, k, v ~ N(0, 1); true: uniform [-1, 1) (generator's standard family)
    double sigma = 1;             ///< Gaussian inputs: N(0, σ²) for q and k
};

struct flash_row {
    std::string label, kernel, inputs;
    std::size_t seq = 0, head_dim = 0, block = 0, rows = 0;
    double sigma = 1;
    double max_dev = 0, rms_dev = 0;  ///< max and RMS of |ô − o| over all rows and dv
    estimate rms_ratio;               ///< RMS deviation / baseline's (√ of the MSE ratio and its interval)
    double max_ratio = 0;             ///< max deviation / baseline's
};

namespace detail {

template <class Policy>
void flash_run(const flash_config& c, std::size_t n, softmax_algorithm alg, const std::vector<double>& q, const std::vector<double>& k,
               const std::vector<double>& v, const std::vector<double>& reference, std::vector<double>& row_mse, double& max_dev) {
    using S = typename Policy::storage_type;
    const std::size_t sq = c.queries, d = c.head_dim;
    const std::vector<S> qs = convert_all<S>(q), ks = convert_all<S>(k), vs = convert_all<S>(v);
    attention_options o;
    o.softmax.algorithm = alg;
    o.softmax.block_size = c.block;
    o.threads = 1;
    const auto r = scaled_dot_product_attention<Policy, S, S, S>(tensor_view<const S, 4>{qs.data(), {1, 1, sq, d}},
                                                                 tensor_view<const S, 4>{ks.data(), {1, 1, n, d}},
                                                                 tensor_view<const S, 4>{vs.data(), {1, 1, n, d}}, o);
    for (std::size_t i = 0; i < sq; ++i) {
        double se = 0;
        for (std::size_t e = 0; e < d; ++e) {
            const double diff = std::abs(static_cast<double>(r.output.data()[i * d + e]) - reference[i * d + e]);
            se += diff * diff;
            max_dev = std::max(max_dev, diff);
        }
        row_mse.push_back(se / static_cast<double>(d));
    }
}

}  // namespace detail

/// Runs one configuration: every kernel of flash_kernels at every n, over all seeds' rows.
inline std::vector<flash_row> run_flash(const flash_config& c, std::size_t threads = 0) {
    const std::size_t sq = c.queries, d = c.head_dim, nk = std::size(flash_kernels);
    if (sq == 0 || d == 0 || c.block == 0 || c.seeds.empty() || c.seqs.empty())
        throw std::invalid_argument("flash: queries, head_dim, block, seeds and seqs must be positive/non-empty");
    const std::size_t nn = c.seqs.size(), ns = c.seeds.size();
    std::vector<std::vector<double>> mse(nn * ns * nk);
    std::vector<double> maxd(nn * ns * nk, 0.0);
    auto task = [&](std::size_t t) {
        const std::size_t ni = t / ns, si = t % ns, n = c.seqs[ni];
        const std::uint64_t seed = c.seeds[si];
        std::vector<double> q, k, v;
        if (c.uniform_inputs) {
            generator::input_family fam;
            for (const char* role : {"query", "key", "value"}) fam.roles[role] = {1, 0};
            q = generator::generate(fam, seed, generator::role::query, {1, 1, sq, d}, binary_format::bfloat16);
            k = generator::generate(fam, seed, generator::role::key, {1, 1, n, d}, binary_format::bfloat16);
            v = generator::generate(fam, seed, generator::role::value, {1, 1, n, d}, binary_format::bfloat16);
        } else {
            q = generator::generate_normal(seed, generator::role::query, sq * d, binary_format::bfloat16, c.sigma);
            k = generator::generate_normal(seed, generator::role::key, n * d, binary_format::bfloat16, c.sigma);
            v = generator::generate_normal(seed, generator::role::value, n * d, binary_format::bfloat16);
        }
        attention_options ro;
        ro.threads = 1;
        const auto ref = scaled_dot_product_attention<uniform_precision<double>, double, double, double>(
            tensor_view<const double, 4>{q.data(), {1, 1, sq, d}}, tensor_view<const double, 4>{k.data(), {1, 1, n, d}},
            tensor_view<const double, 4>{v.data(), {1, 1, n, d}}, ro);
        const std::vector<double> reference(ref.output.data(), ref.output.data() + ref.output.size());
        using flash_policy = precision_policy<bfloat16, float, bfloat16, bfloat16>;
        using baseline_policy = with_logits_storage<flash_policy, bfloat16>;
        using pure = uniform_precision<bfloat16>;
        const std::size_t base = (ni * ns + si) * nk;
        detail::flash_run<flash_policy>(c, n, softmax_algorithm::online, q, k, v, reference, mse[base + 0], maxd[base + 0]);
        detail::flash_run<baseline_policy>(c, n, softmax_algorithm::shifted_division, q, k, v, reference, mse[base + 1], maxd[base + 1]);
        detail::flash_run<flash_policy>(c, n, softmax_algorithm::shifted_division, q, k, v, reference, mse[base + 2], maxd[base + 2]);
        detail::flash_run<pure>(c, n, softmax_algorithm::online, q, k, v, reference, mse[base + 3], maxd[base + 3]);
        detail::flash_run<pure>(c, n, softmax_algorithm::shifted_division, q, k, v, reference, mse[base + 4], maxd[base + 4]);
    };
    attnref::parallel_for(nn * ns, threads, task, [] { thread_cleanup<bfloat16>::run(); });
    std::vector<flash_row> rows;
    for (std::size_t ni = 0; ni < nn; ++ni) {
        std::vector<std::vector<double>> all(nk);
        std::vector<double> mx(nk, 0.0);
        for (std::size_t si = 0; si < ns; ++si)
            for (std::size_t ki = 0; ki < nk; ++ki) {
                const std::vector<double>& m = mse[(ni * ns + si) * nk + ki];
                all[ki].insert(all[ki].end(), m.begin(), m.end());
                mx[ki] = std::max(mx[ki], maxd[(ni * ns + si) * nk + ki]);
            }
        for (std::size_t ki = 0; ki < nk; ++ki) {
            flash_row r;
            r.label = c.label;
            r.kernel = flash_kernels[ki];
            r.inputs = c.uniform_inputs ? "uniform" : "gaussian";
            r.seq = c.seqs[ni];
            r.head_dim = d;
            r.block = c.block;
            r.rows = all[ki].size();
            r.sigma = c.sigma;
            double s = 0;
            for (double e : all[ki]) s += e;
            r.rms_dev = std::sqrt(s / static_cast<double>(all[ki].size()));
            r.max_dev = mx[ki];
            // Ratios against the baseline of the same arithmetic (pure against pure).
            const std::size_t against = ki >= 3 ? 4 : 1;
            const estimate m = ratio_ci(all[ki], all[against]);
            r.rms_ratio = {std::sqrt(m.value), std::sqrt(std::max(m.lo, 0.0)), std::sqrt(m.hi)};
            r.max_ratio = mx[ki] / mx[against];
            rows.push_back(r);
        }
    }
    return rows;
}

/// The full reproduction (Gaussian N(0, 1) inputs, dk = dv = 64, blocks of 128, n = 256..16384, 4 seeds
/// × 16 rows) and its sensitivity configurations (dk = 128, block 64, uniform inputs, σ = 2 for larger
/// logits); `reduced`: the CTest size.
inline std::vector<flash_config> flash_configs(bool reduced) {
    std::vector<flash_config> v;
    flash_config main;
    if (reduced) {
        main.seqs = {256, 1024};
        main.seeds = {1, 2};
        v.push_back(main);
        return v;
    }
    v.push_back(main);
    auto variant = [&](std::string label, auto change) {
        flash_config c = main;
        c.label = std::move(label);
        c.seqs = {256, 1024, 4096};
        change(c);
        v.push_back(c);
    };
    variant("head_dim_128", [](flash_config& c) { c.head_dim = 128; });
    variant("block_64", [](flash_config& c) { c.block = 64; });
    variant("uniform_inputs", [](flash_config& c) { c.uniform_inputs = true; });
    variant("sigma_2", [](flash_config& c) { c.sigma = 2; });
    return v;
}

}  // namespace attnref::study::reproduce
