#pragma once
/// \file io/generator_normal.hpp
/// Owns: portable standard-normal inputs and the attention-sink logit family, extending the
/// generator's "splitmix64-v1" recipe (generator.hpp) with only correctly rounded IEEE operations
/// (+ − × ÷ and sqrt, no libm), so that every language reproduces the same bits:
///
///   u'(s, r, n)    ((bits(s, r, n) >> 12) + 0.5) · 2^-52          uniform on (0, 1), exact
///   normal(s,r,n)  acklam(u')                                       ≈ N(0, 1)
///   acklam(p)      P. J. Acklam's rational approximation of the inverse normal CDF (relative error
///                  below 1.15e-9): central region |p − ½| ≤ ½ − 0.02425 a rational function of
///                  q = p − ½; tails of √(−2 log p) (or of 1 − p, exact for p ≥ ½), evaluated by
///                  Horner's rule in the order written in acklam() below, every step one IEEE double
///                  operation; log is portable_log
///   portable_log(x) x = m·2^e with m ∈ [√½, √2) (frexp, then m·2 and e − 1 if m < √½: exact);
///                  f = (m − 1)/(m + 1); s = f²; log x = e·ln2_hi + (e·ln2_lo + 2f·Σ_{k=0..11} s^k/(2k+1)),
///                  the sum by Horner from k = 11 down with coefficients fl(1/(2k+1))
///
/// Input families built on it (a value is round_format(fl64(σ·normal)) unless said otherwise):
///   gaussian role          q, k, v ~ N(0, σ²) per element
///   sink logits (Δ, k_sink, placement, σ)
///                          x_ij = fl64(σ·normal(s, additive_mask, i·n + j)) + Δ·[j is a sink]
///                          (one fl64 addition), sinks at j < k_sink ("first"), j ≥ n − k_sink
///                          ("last") or j = t·⌊n/k_sink⌋ for t < k_sink ("spread"); rounded to the
///                          given format. Every query row has the same sink keys; the logits of a
///                          row are independent N(0, σ²) draws, the sinks' shifted by Δ.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "attnref/core/binary_format.hpp"
#include "attnref/io/generator.hpp"
#include "attnref/core/name_table.hpp"

namespace attnref::generator {

/// log(x) for finite x > 0 by the recipe of the file comment (a few ulps; portable bit for bit).
inline double portable_log(double x) {
    int e = 0;
    double m = std::frexp(x, &e);  // x = m·2^e, m ∈ [0.5, 1)
    if (m < 0.70710678118654752440) {
        m = m * 2;
        e = e - 1;
    }
    const double f = (m - 1) / (m + 1);
    const double s = f * f;
    double poly = 1.0 / 23.0;
    for (int k = 10; k >= 0; --k) poly = poly * s + 1.0 / static_cast<double>(2 * k + 1);
    const double ln2_hi = 0.6931471805599453094;   // 0x3FE62E42FEFA39EF
    const double ln2_lo = 2.319046813846299558e-17;
    const double ed = static_cast<double>(e);
    const double series = 2 * f * poly;
    return ed * ln2_hi + (ed * ln2_lo + series);
}

/// Acklam's inverse normal CDF on (0, 1) (see the file comment).
inline double acklam(double p) {
    constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                            1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
    constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                            6.680131188771972e+01,  -1.328068155288572e+01};
    constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                            -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
    constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00};
    constexpr double low = 0.02425;
    auto tail = [&](double t) {  // t = p or 1 − p, below `low`
        const double q = std::sqrt(-2 * portable_log(t));
        const double num = ((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5];
        const double den = (((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1;
        return num / den;
    };
    if (p < low) return tail(p);
    if (p > 1 - low) return -tail(1 - p);
    const double q = p - 0.5;
    const double r = q * q;
    const double num = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q;
    const double den = ((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1;
    return num / den;
}

/// Uniform on (0, 1), never 0 or 1: ((bits >> 12) + 0.5)·2^-52, exact.
inline double open_uniform(std::uint64_t seed, role r, std::uint64_t index) {
    return (static_cast<double>(bits(seed, r, index) >> 12) + 0.5) * 0x1p-52;
}

/// ≈ N(0, 1) from (seed, role, index), portable (file comment).
inline double normal(std::uint64_t seed, role r, std::uint64_t index) { return acklam(open_uniform(seed, r, index)); }

/// Role r of `count` elements (C order), each round_format(fl64(sigma·normal)).
inline std::vector<double> generate_normal(std::uint64_t seed, role r, std::size_t count, binary_format format, double sigma = 1) {
    std::vector<double> out(count);
    for (std::size_t n = 0; n < count; ++n) {
        const double z = normal(seed, r, n);
        const double scaled = sigma * z;
        out[n] = round_to(format, scaled);
    }
    return out;
}

/// Where the k_sink sink keys of a sink family sit.
enum class sink_placement { first, last, spread };
inline constexpr std::pair<const char*, sink_placement> sink_placement_names[] = {
    {"first", sink_placement::first}, {"last", sink_placement::last}, {"spread", sink_placement::spread}};
inline constexpr std::string_view sink_placement_name(sink_placement p) { return name_in(sink_placement_names, p); }

/// Attention sinks: k_sink keys whose logits are Δ above the others'.
struct sink_family {
    double delta = 0;
    std::size_t sinks = 4;
    sink_placement placement = sink_placement::first;
    double sigma = 1;
};

/// Whether key j of n is a sink of the family.
inline bool is_sink(const sink_family& f, std::size_t j, std::size_t n) {
    if (f.sinks == 0) return false;
    switch (f.placement) {
        case sink_placement::first: return j < f.sinks;
        case sink_placement::last: return j + f.sinks >= n;
        case sink_placement::spread: {
            const std::size_t stride = n / f.sinks == 0 ? 1 : n / f.sinks;
            return j % stride == 0 && j / stride < f.sinks;
        }
    }
    return false;
}

/// Logits (rows, n) in C order: fl64(σ·normal(seed, additive_mask, i·n + j)) + Δ at sinks, rounded to
/// `format` (file comment).
inline std::vector<double> sink_logits(const sink_family& f, std::uint64_t seed, std::size_t rows, std::size_t n,
                                       binary_format format) {
    std::vector<double> out(rows * n);
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < n; ++j) {
            const double z = f.sigma * normal(seed, role::additive_mask, i * n + j);
            const double x = is_sink(f, j, n) ? z + f.delta : z;
            out[i * n + j] = round_to(format, x);
        }
    return out;
}

}  // namespace attnref::generator
