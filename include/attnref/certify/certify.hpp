#pragma once
/// \file certify/certify.hpp
/// Owns: certification of reference values over MPFI enclosures (Ziv's ladder). Target formats and
/// per-tensor reports are certify_report.hpp's (no MPFR); rounding an MPFR end to a format is
/// binary_format_mpfr.hpp's.
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
/// Special values: an element whose interval is NaN at both ends counts as certified only where the
/// caller marks it NaN by construction (options::nan_allowed, per element: the rows that the mask
/// alone leaves empty under empty_row_policy::nan); ±inf ends (lse = −inf of an empty row) round to
/// themselves. Zero: the correctly rounded sign (+0 when the lower end is ≥ 0, −0 when the upper end
/// is < 0; an exact 0 is +0), undecided when the interval reaches below 0 and up to 0 or beyond.
/// Exact zeros (an output cancelling by symmetry) and exact rounding midpoints never certify by
/// narrowing: uncertified_error after the last rung, naming the tensor and the index.
///
/// Why the output intervals enclose (the proof obligation; tests/runtime/enclosure.test.cpp checks
/// every row below against MPFR at 4× and 16× the bits on adversarial points, and that the check
/// fails on non-enclosing stand-ins). Boost 1.74's mpfi_float_backend (boost/multiprecision/mpfi.hpp)
/// maps each operation to one MPFI call; MPFI rounds the lower end down and the upper end up, so its
/// result contains the exact image of its input intervals (Revol & Rouillier, "Motivations for an
/// arbitrary precision interval arithmetic and the MPFI library", Reliable Computing 11, 2005).
/// Expression templates are off (et_off), so each operator is one call, never a fused one.
///
///   operation in the forward pass            where                          Boost → MPFI       encloses because
///   a + b, a − b                              dot products, sums, bias,      mpfi_add, mpfi_sub outward rounding
///                                             logits − m, m + log1p(S')
///   a × b (a·a with one object: mpfi_sqr)     products, scale, P·V, W·x,     mpfi_mul/mpfi_sqr  outward rounding; sqr only
///                                             seed mask m·(−1e9), ALiBi                         when both are one value
///   a ÷ b                                     p_j = e_j/(1 + S'), s/cap,     mpfi_div           outward; 0 in b gives
///                                             1/√dk, 1/Sk (uniform rows)                        [−inf, +inf]
///   −a                                        negation                       mpfi_neg           exact
///   sqrt                                      √dk for 1/√dk, √s (split_sqrt) mpfi_sqrt          outward rounding
///   exp                                       softmax terms e^(x_j − m)      mpfi_exp           outward; MPFR's exponent
///                                                                                               range overflow → +inf,
///                                                                                               underflow → [0, tiny]
///   log1p                                     lse = m + log1p(S')            mpfi_log1p         outward rounding
///   log                                       naive/online softmax lse       mpfi_log           outward rounding
///   expm1                                     (not reached: tanh_kernel is   mpfi_expm1         outward rounding
///                                             for builtin types only)
///   tanh                                      softcap cap·tanh(s/cap)        mpfi_tanh          outward rounding
///   T(double): inputs, scale, softcap, ALiBi  conversion                     mpfi_set_d         exact (≥ 134 ≥ 53 bits)
///     slopes, additive/seed mask, −1e9,
///     ALiBi distance |d| (< 2^53)
///   T(int): 0, 1, dk, Sk                      conversion                     mpfi_set_si        exact
///   NaN, −inf                                 empty rows (by construction)   numeric_limits     exact by definition
///   max shift m                               softmax                        shift_order<T>:    no comparison of
///                                                                            mpfr_greater_p on  values is needed: the
///                                                                            the upper ends     softmax is shift-
///                                                                                               invariant (any m)
///   masks (causal, window, padding, boolean,  structurally_masked            none: integer and  exact; never an interval
///     additive −inf)                                                         double data only   comparison
///
/// Nothing else of T is used: no comparison of interval values (Boost's compare throws on
/// overlapping intervals through a noexcept function, i.e. std::terminate), no conversion back to
/// double inside the computation, no floor/ceil/pow. A new function in the forward pass, or a Boost
/// upgrade that changes a mapping above, must add its row here and its case to enclosure.test.
///
/// Example:
///     auto result = attnref::certify::certify({"output"}, {float64_target},
///         [&]<unsigned D>(std::integral_constant<unsigned, D>) {
///             /* run the templates in uniform_precision<mpfr_interval<D>>, return one flat
///                std::vector<mpfr_interval<D>> per tensor */ });

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <mpfr.h>

#include "attnref/multiprecision/binary_format_mpfr.hpp"
#include "attnref/certify/report.hpp"
#include "attnref/multiprecision/multiprecision.hpp"

namespace attnref::certify {

/// The ladder of precisions (decimal digits of mpfr_interval<D>).
inline constexpr unsigned ladder[] = {40, 80, 160, 320};
template <unsigned D>
inline constexpr int bits_of = std::numeric_limits<mpfr_interval<D>>::digits;
inline int ladder_bits(std::size_t rung) {
    constexpr int b[] = {bits_of<40>, bits_of<80>, bits_of<160>, bits_of<320>};
    return b[rung];
}

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
    /// Per tensor (in the order of `tensors`): flags, one per element, 1 where a NaN is exact by
    /// construction (a row that is empty from the mask alone under empty_row_policy::nan, and what
    /// it feeds). An empty vector (or a missing tensor) allows NaN nowhere in that tensor. A NaN
    /// interval anywhere else is never certified: it is an error, whatever the case's policy.
    std::vector<std::vector<std::uint8_t>> nan_allowed;
    /// Optional, per tensor: its shape, so that the error names a multi-index, e.g. (0, 1, 3, 2).
    std::vector<std::vector<std::size_t>> shapes;
    /// Per tensor (optional): the index each element has in the caller's full tensor, when the
    /// caller certifies a selection of its elements (the fast path's escalation); error messages
    /// then name the full tensor's index (in `shapes`).
    std::vector<std::vector<std::size_t>> full_index;
    /// Called before each rung is computed: (rung, bits, elements still pending).
    std::function<void(std::size_t, int, std::size_t)> progress;
};

/// What `compute` is asked for at one rung: pending[t][n] is 1 for the elements of tensor t that
/// are still undecided (for any target). At the first rung pending[t] is empty: compute every
/// element. At the later rungs `compute` may
/// skip the elements that are not pending (their entries of the returned vectors are never read),
/// which is how an escalation recomputes only the undecided rows instead of the whole case.
struct request {
    const std::vector<std::vector<std::uint8_t>>& pending;
};

namespace detail {

/// Tries to certify one element for one target; writes the value on success.
///
/// Proof obligation: x encloses the exact value v. If both ends round to the same target value a,
/// then v (between them) rounds to a too, because rounding to nearest is monotonic. For a = 0 the
/// sign is decided as well: the correctly rounded value of a negative v is −0 and of a positive v
/// +0 (IEEE 754 §6.3, rounding keeps the sign), and an exact 0 is +0 (the sign of an exact zero sum
/// in round-to-nearest). So the element is +0 when the lower end is ≥ 0 (v ≥ 0), −0 when the
/// upper end is < 0 (v < 0), and undecided when the interval reaches below 0 and up to or above
/// 0: v could be 0 or negative. NaN: only where `nan_allowed` (exact by construction) and only
/// when both ends are NaN.
template <unsigned D>
bool certify_element(const mpfr_interval<D>& x, const format_description& f, bool nan_allowed, double& value) {
    mpfr_srcptr lo = &x.backend().data()[0].left, hi = &x.backend().data()[0].right;
    const bool lo_nan = mpfr_nan_p(lo) != 0, hi_nan = mpfr_nan_p(hi) != 0;
    if (lo_nan || hi_nan) {
        if (lo_nan && hi_nan && nan_allowed) {
            value = std::numeric_limits<double>::quiet_NaN();
            return true;
        }
        return false;
    }
    const double a = ::attnref::round_to(lo, f), b = ::attnref::round_to(hi, f);
    if (!(a == b)) return false;
    if (a == 0) {
        if (mpfr_sgn(lo) >= 0) value = 0.0;
        else if (mpfr_sgn(hi) < 0) value = -0.0;
        else return false;  // v in [lo, hi] with lo < 0 <= hi: exact 0 (+0) or negative (−0)
        return true;
    }
    value = a;
    return true;
}

/// "(i0, i1, …)" of flat index n in C order, or "n" without a shape.
inline std::string index_text(std::size_t n, const std::vector<std::size_t>* shape) {
    if (!shape || shape->empty()) return std::to_string(n);
    std::vector<std::size_t> idx(shape->size());
    for (std::size_t a = shape->size(); a-- > 0;) {
        const std::size_t e = (*shape)[a] == 0 ? 1 : (*shape)[a];
        idx[a] = n % e;
        n /= e;
    }
    std::string s = "(";
    for (std::size_t a = 0; a < idx.size(); ++a) s += (a ? ", " : "") + std::to_string(idx[a]);
    return s + ")";
}

}  // namespace detail

/// Runs `compute` at increasing precision until every element of every tensor is certified for
/// every target. `compute` is called as compute(std::integral_constant<unsigned, D>{}, request) (or
/// compute(std::integral_constant<unsigned, D>{}) if it takes no request) and returns
/// std::vector<std::vector<mpfr_interval<D>>>: one flat vector per tensor, in the order of `tensors`,
/// with the same sizes at every D. Throws uncertified_error naming the first element left.
///
/// An element whose exact value is representable and not 0 (e.g. 1/2) certifies by narrowing; an
/// exact 0 (an output that cancels by symmetry) or an exact rounding midpoint never does, since
/// the interval keeps both neighbours at every precision. Such an element ends in uncertified_error
/// after the last rung; with a compute that honours `request`, the higher rungs only recompute the
/// rows that hold undecided elements, not the whole case.
template <class Compute>
result certify(const std::vector<std::string>& tensors, const std::vector<format_description>& targets, Compute&& compute,
               const options& opts = {}) {
    result r;
    const std::size_t nt = tensors.size(), nk = targets.size();
    r.values.assign(nt, std::vector<std::vector<double>>(nk));
    std::vector<std::vector<std::vector<signed char>>> rung_of(nt, std::vector<std::vector<signed char>>(nk));
    std::vector<std::vector<std::uint8_t>> pending_flags(nt);  // per tensor: undecided for some target
    std::vector<std::size_t> sizes;
    std::size_t pending = 0;
    bool sized = false;
    auto nan_ok = [&](std::size_t t, std::size_t n) {
        return t < opts.nan_allowed.size() && n < opts.nan_allowed[t].size() && opts.nan_allowed[t][n] != 0;
    };

    auto attempt = [&]<unsigned D>(std::integral_constant<unsigned, D> tag, std::size_t rung) {
        if (opts.progress) opts.progress(rung, bits_of<D>, sized ? pending : 0);
        std::vector<std::vector<mpfr_interval<D>>> out;
        if constexpr (std::is_invocable_v<Compute&, std::integral_constant<unsigned, D>, const request&>)
            out = compute(tag, request{pending_flags});
        else
            out = compute(tag);
        if (out.size() != nt) throw std::logic_error("certify: compute returned the wrong number of tensors");
        if (!sized) {
            for (std::size_t t = 0; t < nt; ++t) {
                sizes.push_back(out[t].size());
                pending_flags[t].assign(out[t].size(), 1);
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
            for (std::size_t n = 0; n < out[t].size(); ++n) {
                if (!pending_flags[t][n]) continue;
                bool left = false;
                for (std::size_t k = 0; k < nk; ++k) {
                    if (rung_of[t][k][n] >= 0) continue;
                    if (detail::certify_element(out[t][n], targets[k], nan_ok(t, n), r.values[t][k][n])) {
                        rung_of[t][k][n] = static_cast<signed char>(rung);
                        --pending;
                    } else {
                        left = true;
                    }
                }
                pending_flags[t][n] = left ? 1 : 0;
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
                            const std::vector<std::size_t>* shape = t < opts.shapes.size() ? &opts.shapes[t] : nullptr;
                            std::string why;
                            if (std::isnan(lo) || std::isnan(hi)) why = " (NaN where the mask leaves the row non-empty)";
                            else if (lo <= 0 && hi >= 0) why = " (the interval keeps containing 0: an exact 0, e.g. cancelling by symmetry, cannot be certified by narrowing)";
                            const std::size_t full = t < opts.full_index.size() && n < opts.full_index[t].size() ? opts.full_index[t][n] : n;
                            throw uncertified_error("tensor '" + tensors[t] + "' element " + detail::index_text(full, shape) +
                                                    " target " + targets[k].name + ": still uncertified at " +
                                                    std::to_string(bits_of<D>) + " bits (interval ends ≈ " +
                                                    std::to_string(lo) + ", " + std::to_string(hi) + ")" + why + "; " +
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
