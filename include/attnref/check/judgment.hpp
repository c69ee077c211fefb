#pragma once
/// \file check/judgment.hpp
/// How one tensor is judged, whatever the reference comes from (a golden case, an in-memory
/// certified call): the comparison under per-element bounds and the rules that turn a pass into
/// INCONCLUSIVE — a vacuous bound (tolerance::find_vacuous), a trivially wrong decoy output that
/// the bounds would pass (decoy_outputs, passing_decoy), an untrustworthy output
/// (tolerance::untrustworthy) — and the declared empty-row lse convention (check_empty_row_lse).
///
///     candidate output ─ compare(bounds) ─┬─ a violation ──────────────── FAIL
///                                         ├─ a vacuous bound ──────────── INCONCLUSIVE
///                                         ├─ a decoy within the bounds ── INCONCLUSIVE
///                                         ├─ untrustworthy ────────────── INCONCLUSIVE ("untrustworthy")
///                                         └─ otherwise ────────────────── PASS
///
/// The decoys are defined on a forward_problem (problem.hpp: views of the inputs and the options), which a
/// golden case (check/forward.hpp problem_of) and a Python call both describe. attnref's core,
/// tolerance.hpp, fmt and golden/safe_io.hpp's data_error only: no golden case.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "attnref/core/attention.hpp"
#include "attnref/bounds/invariants.hpp"
#include "attnref/core/multi_head_attention.hpp"
#include "attnref/core/precision.hpp"
#include "attnref/core/problem.hpp"
#include "attnref/bounds/tolerance.hpp"
#include "attnref/check/verdict.hpp"
#include "attnref/golden/safe_io.hpp"

namespace attnref::golden {

/// A trivially wrong output of a problem (computed exactly enough, in double): a bound that lets
/// one pass cannot tell a correct implementation from a broken one.
struct decoy {
    std::string name;
    std::vector<double> output;
};

/// The problem's output in double (attnref's own forward pass, inputs as given).
inline std::vector<double> forward_output(const forward_problem& p) {
    using pol = uniform_precision<double>;
    if (p.sdpa) {
        tensor<double, 4> out({p.q.extents[0], p.q.extents[1], p.q.extents[2], p.v.extents[3]});
        scaled_dot_product_attention_into<pol>(p.q, p.k, p.v, p.o, out.view(), tensor_view<double, 4>{}, tensor_view<double, 3>{});
        return std::vector<double>(out.data(), out.data() + out.size());
    }
    tensor<double, 3> out({p.x_q.extents[0], p.x_q.extents[1], p.w.w_o.extents[1]});
    multi_head_attention_into<pol>(p.x_q, p.x_k, p.x_v, p.w, p.mo, out.view(), tensor_view<double, 4>{}, tensor_view<double, 3>{},
                                   tensor_view<double, 4>{});
    return std::vector<double>(out.data(), out.data() + out.size());
}

/// A decoy's problem: a forward_problem whose output is the decoy, with the storage its changed
/// views point into (kept on the heap: moving it keeps the views valid).
struct decoy_problem {
    std::string name;
    forward_problem p;
    std::vector<double> zeros, zero_bias, additive;
};

/// The problem's decoys: uniform weights (the mean of V over the attendable keys: every logit 0 —
/// q = 0, or W_q = b_q = 0 — with ALiBi and finite additive masks dropped), and the softmax at twice
/// and at half the temperature (the scale ×1/2 and ×2), as problems (forward_output gives each).
inline std::vector<decoy_problem> decoy_problems(const forward_problem& p) {
    std::vector<decoy_problem> r;
    r.reserve(3);
    {
        decoy_problem& d = r.emplace_back(decoy_problem{"uniform weights: the mean of V", p, {}, {}, {}});
        forward_problem& u = d.p;
        d.zeros.assign(p.sdpa ? p.q.size() : p.w.w_q.size(), 0.0);
        d.zero_bias.assign(p.sdpa ? 0 : p.w.b_q.size(), 0.0);
        if (p.sdpa) {
            u.q = {d.zeros.data(), p.q.extents};
        } else {
            u.w.w_q = {d.zeros.data(), p.w.w_q.extents};
            if (!p.w.b_q.empty()) u.w.b_q = {d.zero_bias.data(), p.w.b_q.extents};
        }
        attention_options& o = p.sdpa ? u.o : u.mo.attention;
        o.alibi_slopes = {};
        if (o.mask.additive.present()) {
            const tensor_view<const double, 4> a = o.mask.additive.values;
            d.additive.assign(a.data, a.data + a.size());
            for (double& x : d.additive)
                if (std::isfinite(x)) x = 0;
            o.mask.additive.values = {d.additive.data(), a.extents};
        }
    }
    const attention_options& o = p.sdpa ? p.o : p.mo.attention;
    const std::size_t dk = p.sdpa ? p.q.extents[3] : p.w.w_q.extents[1] / p.mo.heads;
    const double scale = o.scale ? *o.scale : 1 / std::sqrt(static_cast<double>(dk));
    for (const double c : {2.0, 0.5}) {
        decoy_problem& d = r.emplace_back(decoy_problem{fmt::format("the softmax with the scale x{}", c), p, {}, {}, {}});
        (p.sdpa ? d.p.o : d.p.mo.attention).scale = scale * c;
    }
    return r;
}

/// The problem's decoys (decoy_problems), each computed whole: three forward passes in double.
inline std::vector<decoy> decoy_outputs(const forward_problem& p) {
    std::vector<decoy> r;
    for (const decoy_problem& d : decoy_problems(p)) r.push_back({d.name, forward_output(d.p)});
    return r;
}

/// The decoy rule: a decoy whose every element lies within its bound of the reference (so it would
/// pass the check) while it is off by at least decoy_significance of its row's scale (the row's
/// largest |reference|) somewhere — visibly wrong — makes the bounds vacuous.
inline constexpr double decoy_significance = 0x1p-7;

/// Whether a candidate value c is the certified reference e correctly rounded to format f: c is a
/// value of f and at least as close to e as e's rounding to nearest even in f, up to the reference's
/// own error (2^-53|e|, so a near-tie admits either neighbour). Such a value is the best answer the
/// format holds: it needs no bound to be known right (the correctly-rounded rule, docs/checker.md).
/// A value finer than f (a float32 file judged as bfloat16) is not one: the bound judges it.
inline bool correctly_rounded(double c, double e, tolerance::candidate_format f) {
    if (!std::isfinite(c) || !std::isfinite(e) || round_to(f, c) != c) return false;
    const double nearest = round_to(f, e);
    if (!std::isfinite(nearest)) return false;  // e beyond the format's range: no such value
    return std::fabs(c - e) <= std::fabs(nearest - e) + 0x1p-52 * std::fabs(e);
}
/// correctly_rounded element by element (1: correctly rounded); empty when the sizes differ.
inline std::vector<std::uint8_t> correctly_rounded_elements(std::span<const double> candidate, std::span<const double> expected,
                                                            tolerance::candidate_format f) {
    std::vector<std::uint8_t> r;
    if (candidate.size() != expected.size()) return r;
    r.resize(expected.size());
    for (std::size_t e = 0; e < expected.size(); ++e) r[e] = correctly_rounded(candidate[e], expected[e], f) ? 1 : 0;
    return r;
}
/// Whether every element is correctly rounded (an empty mask: no).
inline bool all_correctly_rounded(std::span<const std::uint8_t> exact) {
    return !exact.empty() && std::all_of(exact.begin(), exact.end(), [](std::uint8_t x) { return x != 0; });
}

/// The first decoy that passes under `bounds` while visibly wrong, or nullptr. `exact` (empty, or one
/// flag per element): the candidate's correctly-rounded elements, known right whatever the bound;
/// a decoy that is visibly wrong only there shows no looseness in the bounds the candidate's other
/// elements rely on, so it counts only where it is visibly wrong at another element. (The decoy must
/// still lie within the bounds everywhere: the rule only ever turns an INCONCLUSIVE into a PASS.)
inline const decoy* passing_decoy(std::span<const decoy> decoys, std::span<const double> expected, tolerance::candidate_format f,
                                  std::span<const double> bounds, std::size_t row_length, std::span<const std::uint8_t> exact = {}) {
    namespace tol = attnref::tolerance;
    const std::size_t n = expected.size(), row = row_length > 0 && n % row_length == 0 ? row_length : std::max<std::size_t>(n, 1);
    const bool masked = exact.size() == n;
    for (const decoy& d : decoys) {
        if (d.output.size() != n) continue;
        if (!tol::compare(d.output, expected, f, [&](std::size_t e) { return bounds[e]; }, std::nullopt, 1).ok()) continue;
        bool visible = false;  // off by ≥ decoy_significance of the row's scale somewhere (not correctly rounded in the candidate)
        for (std::size_t begin = 0; begin < n && !visible; begin += row) {
            double scale = 0;
            for (std::size_t e = begin; e < begin + row; ++e)
                if (std::isfinite(expected[e])) scale = std::max(scale, std::fabs(expected[e]));
            for (std::size_t e = begin; e < begin + row && !visible; ++e)
                visible = !(masked && exact[e]) && std::isfinite(expected[e]) &&
                          std::fabs(d.output[e] - expected[e]) >= decoy_significance * scale && scale > 0;
        }
        if (visible) return &d;
    }
    return nullptr;
}

/// The note of an INCONCLUSIVE verdict from a vacuous bound.
inline std::string vacuity_note(const tolerance::vacuity& v, std::size_t elements, const char* scale_name) {
    return fmt::format("bound vacuous on {} of {} elements (first at {}: bound {:.3g} {} {} {:.3g}); a pass would prove nothing",
                       v.elements, elements, v.index, v.bound, std::isfinite(v.bound) && v.bound >= 0 ? ">=" : "is not a finite bound;",
                       scale_name, v.scale);
}

/// A tensor's report for a finished comparison in format f and its bounds' vacuity: FAIL on a
/// violation, else INCONCLUSIVE where a bound is vacuous (scale_name: what the bound was measured
/// against), else PASS.
inline tensor_report judged(std::string name, const tolerance::comparison& cmp, const tolerance::vacuity& vac, const char* scale_name,
                            tolerance::candidate_format f) {
    tensor_report out;
    out.name = std::move(name);
    out.cmp = cmp;
    out.vacuous = vac;
    out.format = f;
    if (!cmp.ok()) {
        out.verdict = verdict::fail;
        out.note = fmt::format("{} of {} elements outside the bound", cmp.violations, cmp.elements);
        // A non-finite mismatch has no finite error: say what it is rather than an error of inf.
        if (cmp.nonfinite_mismatches) {
            const double x = cmp.worst_candidate, y = cmp.worst_expected;
            auto what = [](double v) { return std::isnan(v) ? std::string("NaN") : std::isinf(v) ? fmt::format("{}", v) : std::string("finite"); };
            out.note += fmt::format(" ({} of them non-finite mismatches", cmp.nonfinite_mismatches);
            if (!std::isfinite(x) || !std::isfinite(y))
                out.note += fmt::format("; at index {}: {} where the reference is {}", cmp.worst_index, what(x), what(y));
            out.note += ")";
        }
    } else if (vac.any()) {
        out.verdict = verdict::inconclusive;
        out.note = vacuity_note(vac, cmp.elements, scale_name);
    }
    return out;
}

/// The output's report: judged(), then a pass becomes INCONCLUSIVE when a decoy passes, or
/// untrustworthy (INCONCLUSIVE) when tolerance::untrustworthy finds the output suspicious.
inline tensor_report judged_output(const tolerance::comparison& cmp, const tolerance::vacuity& vac, tolerance::candidate_format f,
                                   std::span<const double> candidate, std::span<const double> expected, std::size_t row_length,
                                   const decoy* passing = nullptr) {
    tensor_report out = judged("output", cmp, vac, "row scale max|expected|", f);
    if (out.verdict == verdict::pass && passing) {
        out.verdict = verdict::inconclusive;
        out.note = "the bound admits a trivially wrong output (" + passing->name + "); a pass would prove nothing";
        out.decoy = passing->name;
    }
    if (out.verdict == verdict::pass)
        if (auto why = tolerance::untrustworthy(candidate, row_length, expected)) {
            out.verdict = verdict::inconclusive;
            out.untrustworthy = true;
            out.note = std::string(*why);
        }
    return out;
}

/// Judges a candidate output against the reference with per-element absolute bounds: FAIL when an
/// element exceeds its bound, else INCONCLUSIVE when a bound is vacuous (tolerance::find_vacuous,
/// rows of length row_length) or a decoy would pass (passing_decoy), else INCONCLUSIVE and
/// untrustworthy (zero-trust), else PASS. Sizes must agree (data_error otherwise).
inline tensor_report judge_output(std::span<const double> candidate, std::span<const double> expected, tolerance::candidate_format f,
                                  std::span<const double> bounds, std::size_t row_length, std::span<const decoy> decoys = {}) {
    namespace tol = attnref::tolerance;
    if (candidate.size() != expected.size() || bounds.size() != expected.size())
        throw data_error(fmt::format("output: {} candidate values, {} reference values, {} bounds", candidate.size(),
                                     expected.size(), bounds.size()));
    // The correctly-rounded rule: an element equal to the reference correctly rounded to f is never
    // too loosely bounded (a finite bound ≥ 0 counts as 0 for vacuity; a NaN, infinite or negative
    // bound stays vacuous: the bound itself is broken), and a decoy counts only where it is visibly
    // wrong at another element.
    const std::vector<std::uint8_t> exact = correctly_rounded_elements(candidate, expected, f);
    auto vacuity_bound = [&](std::size_t n) {
        const double b = bounds[n];
        return exact[n] && b >= 0 && b < std::numeric_limits<double>::infinity() ? 0.0 : b;
    };
    return judged_output(tol::compare(candidate, expected, f, [&](std::size_t n) { return bounds[n]; }),
                         tol::find_vacuous(expected, row_length, vacuity_bound), f,
                         candidate, expected, row_length, passing_decoy(decoys, expected, f, bounds, row_length, exact));
}

/// judge_output, computing the problem's decoys only where they can change the verdict (a pass or
/// an untrustworthy output: FAIL and INCONCLUSIVE from the bound stand whatever the decoys do).
inline tensor_report judge_with_decoys(std::span<const double> candidate, std::span<const double> expected, tolerance::candidate_format f,
                                       std::span<const double> bounds, std::size_t row, const forward_problem& p) {
    tensor_report t = judge_output(candidate, expected, f, bounds, row);
    if (t.verdict != verdict::pass && !t.untrustworthy) return t;
    if (all_correctly_rounded(correctly_rounded_elements(candidate, expected, f))) return t;  // no decoy can count
    return judge_output(candidate, expected, f, bounds, row, decoy_outputs(p));
}

/// The lse a candidate wrote, with its empty rows (every key masked) checked against the declared
/// convention: `compared` holds the candidate's lse with the empty rows that follow the convention
/// set to the reference's (so only the other rows are compared), `wrong` counts the empty rows
/// that do not follow it — each a violation (judge_lse).
struct empty_row_lse_check {
    std::vector<double> compared;
    std::size_t wrong = 0;
};
/// lse and expected (B, H, Sq) of a call with `mask` and Sk keys.
inline empty_row_lse_check check_empty_row_lse(std::span<const double> lse, std::span<const double> expected, const mask_options& mask,
                                               std::size_t batch, std::size_t heads, std::size_t sq, std::size_t sk, empty_row_lse convention) {
    empty_row_lse_check r{std::vector<double>(lse.begin(), lse.end()), 0};
    for (std::size_t b = 0; b < batch; ++b)
        for (std::size_t h = 0; h < heads; ++h)
            for (std::size_t i = 0; i < sq; ++i) {
                if (!attnref::row_is_empty(mask, b, h, i, sq, sk)) continue;
                const std::size_t at = (b * heads + h) * sq + i;
                if (empty_row_lse_ok(convention, lse[at])) r.compared[at] = expected[at];
                else ++r.wrong;
            }
    return r;
}
/// An lse report with the empty rows' verdict folded in: `wrong` rows without the declared
/// convention are violations, so the lse FAILs.
inline void fail_wrong_empty_rows(tensor_report& t, std::size_t wrong, empty_row_lse convention) {
    if (!wrong) return;
    const std::string why = fmt::format("{} empty rows without the declared lse ({})", wrong,
                                        convention == empty_row_lse::plus_inf ? "+inf" : "-inf");
    t.note = t.verdict == verdict::fail ? t.note + "; " + why : why;
    t.verdict = verdict::fail;
    t.untrustworthy = false;
    t.cmp.violations += wrong;
}

}  // namespace attnref::golden
