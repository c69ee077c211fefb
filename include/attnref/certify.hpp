#pragma once
/// \file certify.hpp
/// Certified reference values (Ziv's strategy over MPFI enclosures).
///
/// A computation is run through attnref's own templates in uniform_precision<mpfr_interval<D>>:
/// every operation returns an interval enclosing its exact result, so each output interval encloses
/// the exact attention output of the (exact) inputs. An element is certified for a target format
/// when both ends of its interval round (to nearest, ties to even, subnormals and overflow as IEEE
/// 754 says) to the same value of that format: the exact value then rounds to it too, i.e. the
/// stored value is the correctly rounded exact result. Elements that are not certified at the first
/// precision are retried at the next rung of the ladder (40, 80, 160, 320 decimal digits = 134, 267,
/// 535, 1065 bits); everything still uncertified after the last rung is an error (never silently
/// stored).
///
/// Special values: an element whose interval is NaN at both ends (the NaN empty-row policy) is NaN
/// by construction and counts as certified when the caller allows NaN; ±inf ends (lse = −inf of an
/// empty row) round to themselves. An exact zero is stored as +0 (MPFI may carry −0 at an end).
///
/// Example:
///     auto result = attnref::certify::certify({"output"}, {float64_target},
///         [&]<unsigned D>(std::integral_constant<unsigned, D>) {
///             /* run the templates in uniform_precision<mpfr_interval<D>>, return one flat
///                std::vector<mpfr_interval<D>> per tensor */ });

#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <mpfr.h>

#include "attnref/multiprecision.hpp"

namespace attnref::certify {

/// A binary floating-point target: precision p (bits, hidden bit included), the exponent of the
/// smallest normal (2^min_exponent) and the largest finite value.
struct binary_format {
    const char* name;
    int precision;
    int min_exponent;
    double max_finite;
};

inline constexpr binary_format float64_target{"float64", 53, -1022, DBL_MAX};
inline constexpr binary_format float32_target{"float32", 24, -126, static_cast<double>(FLT_MAX)};
inline constexpr binary_format bfloat16_target{"bfloat16", 8, -126, 0x1.FEp127};
inline constexpr binary_format float16_target{"float16", 11, -14, 65504.0};

/// x rounded to nearest, ties to even, in `f` (subnormals kept; beyond max_finite + half an ulp:
/// ±inf), returned as the exact double value. NaN → quiet NaN.
inline double round_to(mpfr_srcptr x, const binary_format& f) {
    if (mpfr_nan_p(x)) return std::numeric_limits<double>::quiet_NaN();
    if (mpfr_inf_p(x)) return mpfr_sgn(x) > 0 ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
    if (mpfr_zero_p(x)) return 0.0;
    // |x| = m · 2^e with m in [1/2, 1): floor(log2 |x|) = e − 1. Quantum 2^q of the result's grid.
    const long e = static_cast<long>(mpfr_get_exp(x)) - 1;
    const long q = (e > f.min_exponent ? e : f.min_exponent) - (f.precision - 1);
    mpfr_t y;
    mpfr_init2(y, mpfr_get_prec(x));
    mpfr_mul_2si(y, x, -q, MPFR_RNDN);  // exact: only the exponent changes
    mpfr_rint(y, y, MPFR_RNDN);          // nearest integer, ties to even
    mpfr_mul_2si(y, y, q, MPFR_RNDN);    // exact
    const double r = mpfr_get_d(y, MPFR_RNDN);  // exact: at most p ≤ 53 bits, in double's range
    mpfr_clear(y);
    if (r > f.max_finite) return std::numeric_limits<double>::infinity();
    if (r < -f.max_finite) return -std::numeric_limits<double>::infinity();
    return r == 0 ? 0.0 : r;
}

/// The ladder of precisions (decimal digits of mpfr_interval<D>).
inline constexpr unsigned ladder[] = {40, 80, 160, 320};
template <unsigned D>
inline constexpr int bits_of = std::numeric_limits<mpfr_interval<D>>::digits;
inline int ladder_bits(std::size_t rung) {
    constexpr int b[] = {bits_of<40>, bits_of<80>, bits_of<160>, bits_of<320>};
    return b[rung];
}

/// Per tensor and target: how many elements were certified, how many needed escalation, and at
/// which precisions (bits) elements were certified.
struct tensor_report {
    std::string tensor;
    std::string target;
    std::size_t elements = 0;
    std::size_t certified = 0;
    std::size_t escalated = 0;
    std::vector<int> precisions_bits;
};

struct result {
    /// values[t][k][n]: tensor t, target k (in the order given), element n, as exact doubles.
    std::vector<std::vector<std::vector<double>>> values;
    std::vector<tensor_report> reports;  ///< tensor-major, then target
    std::vector<int> precisions_bits;    ///< every rung that was computed
};

/// Thrown when an element stays uncertified after the last rung; the message names it.
class uncertified_error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

struct options {
    bool allow_nan = false;  ///< NaN intervals are exact by construction (empty_row_policy::nan)
    /// Called before each rung is computed: (rung, bits, elements still pending).
    std::function<void(std::size_t, int, std::size_t)> progress;
};

namespace detail {

/// Tries to certify one element for one target; writes the value on success.
template <unsigned D>
bool certify_element(const mpfr_interval<D>& x, const binary_format& f, bool allow_nan, double& value) {
    const mpfr_real<D> lo = lower_end(x), hi = upper_end(x);
    const bool lo_nan = mpfr_nan_p(lo.backend().data()) != 0, hi_nan = mpfr_nan_p(hi.backend().data()) != 0;
    if (lo_nan || hi_nan) {
        if (lo_nan && hi_nan && allow_nan) {
            value = std::numeric_limits<double>::quiet_NaN();
            return true;
        }
        return false;
    }
    const double a = round_to(lo.backend().data(), f), b = round_to(hi.backend().data(), f);
    if (!(a == b)) return false;
    value = a;
    return true;
}

}  // namespace detail

/// Runs `compute` at increasing precision until every element of every tensor is certified for
/// every target. `compute` is called as compute(std::integral_constant<unsigned, D>{}) and returns
/// std::vector<std::vector<mpfr_interval<D>>>: one flat vector per tensor, in the order of `tensors`,
/// with the same sizes at every D. Throws uncertified_error naming the first element left.
template <class Compute>
result certify(const std::vector<std::string>& tensors, const std::vector<binary_format>& targets, Compute&& compute,
               const options& opts = {}) {
    result r;
    const std::size_t nt = tensors.size(), nk = targets.size();
    r.values.assign(nt, std::vector<std::vector<double>>(nk));
    std::vector<std::vector<std::vector<signed char>>> rung_of(nt, std::vector<std::vector<signed char>>(nk));
    std::vector<std::size_t> sizes;
    std::size_t pending = 0;
    bool sized = false;

    auto attempt = [&]<unsigned D>(std::integral_constant<unsigned, D> tag, std::size_t rung) {
        if (opts.progress) opts.progress(rung, bits_of<D>, sized ? pending : 0);
        const std::vector<std::vector<mpfr_interval<D>>> out = compute(tag);
        if (out.size() != nt) throw std::logic_error("certify: compute returned the wrong number of tensors");
        if (!sized) {
            for (std::size_t t = 0; t < nt; ++t) {
                sizes.push_back(out[t].size());
                for (std::size_t k = 0; k < nk; ++k) {
                    r.values[t][k].assign(out[t].size(), 0.0);
                    rung_of[t][k].assign(out[t].size(), -1);
                    pending += out[t].size();
                }
            }
            sized = true;
        }
        r.precisions_bits.push_back(bits_of<D>);
        for (std::size_t t = 0; t < nt; ++t) {
            if (out[t].size() != sizes[t])
                throw std::logic_error("certify: tensor size changed between precisions");
            for (std::size_t k = 0; k < nk; ++k)
                for (std::size_t n = 0; n < out[t].size(); ++n) {
                    if (rung_of[t][k][n] >= 0) continue;
                    if (detail::certify_element(out[t][n], targets[k], opts.allow_nan, r.values[t][k][n])) {
                        rung_of[t][k][n] = static_cast<signed char>(rung);
                        --pending;
                    }
                }
        }
        if (pending == 0) return true;
        if (rung + 1 == std::size(ladder)) {
            for (std::size_t t = 0; t < nt; ++t)
                for (std::size_t k = 0; k < nk; ++k)
                    for (std::size_t n = 0; n < out[t].size(); ++n)
                        if (rung_of[t][k][n] < 0) {
                            const double lo = static_cast<double>(lower_end(out[t][n]));
                            const double hi = static_cast<double>(upper_end(out[t][n]));
                            throw uncertified_error("certify: tensor '" + tensors[t] + "' element " + std::to_string(n) +
                                                    " target " + targets[k].name + ": still uncertified at " +
                                                    std::to_string(bits_of<D>) + " bits (interval ends ≈ " +
                                                    std::to_string(lo) + ", " + std::to_string(hi) + "); " +
                                                    std::to_string(pending) + " element(s) left");
                        }
        }
        return false;
    };
    (void)(attempt(std::integral_constant<unsigned, 40>{}, 0) || attempt(std::integral_constant<unsigned, 80>{}, 1) ||
           attempt(std::integral_constant<unsigned, 160>{}, 2) || attempt(std::integral_constant<unsigned, 320>{}, 3));

    for (std::size_t t = 0; t < nt; ++t)
        for (std::size_t k = 0; k < nk; ++k) {
            tensor_report rep{tensors[t], targets[k].name, rung_of[t][k].size(), 0, 0, {}};
            std::vector<bool> used(std::size(ladder), false);
            for (signed char g : rung_of[t][k]) {
                if (g < 0) continue;
                ++rep.certified;
                if (g > 0) ++rep.escalated;
                used[static_cast<std::size_t>(g)] = true;
            }
            for (std::size_t g = 0; g < used.size(); ++g)
                if (used[g]) rep.precisions_bits.push_back(ladder_bits(g));
            r.reports.push_back(rep);
        }
    return r;
}

}  // namespace attnref::certify
