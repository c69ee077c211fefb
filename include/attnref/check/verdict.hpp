#pragma once
/// \file check/verdict.hpp
/// The checker's verdicts: one `verdict` enum for every tensor, invariant and check, the report of
/// one judged tensor (tensor_report), the result of a check (check_result) and the rule that turns
/// the tensors' and invariants' verdicts into the check's (decide: FAIL before INCONCLUSIVE before
/// PASS). Standard library, fmt and the tolerance and invariant headers only.
///
///     tensor_report ─┐
///                    ├─ decide ─→ check_result::overall (+ reason, passed)
///  invariant_report ─┘

#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "attnref/core/backward.hpp"
#include "attnref/bounds/invariants.hpp"
#include "attnref/bounds/tolerance.hpp"

namespace attnref::golden {

namespace tol = attnref::tolerance;  ///< the checker's headers say tol:: for tolerance.hpp

/// The three verdicts. PASS: no element exceeds its bound, every bound is meaningful and the
/// output is not suspicious. FAIL: some element exceeds its bound (or an invariant is violated).
/// INCONCLUSIVE: nothing was violated, but a pass would prove nothing — a bound is vacuous
/// (tolerance::find_vacuous), a trivially wrong decoy would pass, or the output is untrustworthy
/// (tolerance::untrustworthy). Exit codes 0, 1, 1.
enum class verdict { pass, fail, inconclusive };
constexpr const char* verdict_name(verdict v) {
    return v == verdict::pass ? "PASS" : v == verdict::fail ? "FAIL" : "INCONCLUSIVE";
}

/// One judged tensor: its comparison with the reference, its verdict and why.
struct tensor_report {
    std::string name;
    tolerance::comparison cmp;
    golden::verdict verdict = golden::verdict::pass;
    /// An inconclusive verdict that comes from zero-trust (tolerance::untrustworthy) rather than
    /// from the bound (vacuous, or passed by a decoy); reports print it as "untrustworthy".
    bool untrustworthy = false;
    std::string note;             ///< why, for every verdict but a plain pass
    std::string decoy;            ///< the output's: the trivially wrong output its bounds would pass (passing_decoy), if any
    tolerance::vacuity vacuous;   ///< the elements whose bound is vacuous
    tolerance::candidate_format format = tolerance::candidate_format::float64;  ///< the format the tensor was judged in
};

/// A tensor's verdict as the reports print it: "pass", "FAIL", "INCONCLUSIVE" or "untrustworthy".
inline const char* verdict_text(const tensor_report& t) {
    if (t.verdict == verdict::pass) return "pass";
    if (t.verdict == verdict::fail) return "FAIL";
    return t.untrustworthy ? "untrustworthy" : "INCONCLUSIVE";
}

/// A check's result: its tensors and invariants, and the overall verdict decide() draws from them.
struct check_result {
    std::string case_name;
    /// The candidate's format: its output's (the weights and lse are judged as computed in it), or
    /// the first gradient's when no output was given. Each tensor carries the format it was judged in.
    tolerance::candidate_format format = tolerance::candidate_format::float64;
    tolerance::tolerance_model model = tolerance::tolerance_model::data_aware;
    std::optional<backward_algorithm> declared_backward;  ///< the backward algorithm the candidate declared (gradients)
    std::vector<tensor_report> tensors;
    std::vector<invariant_report> invariants;
    verdict overall = verdict::fail;
    std::string reason;  ///< for FAIL and INCONCLUSIVE: the first tensor or invariant that decided it
    bool passed = false;  ///< overall == verdict::pass
};

/// An invariant's verdict: FAIL when violated, INCONCLUSIVE when its bound is vacuous, else PASS.
inline verdict verdict_of(const invariant_report& i) { return !i.ok ? verdict::fail : i.vacuous ? verdict::inconclusive : verdict::pass; }

/// The overall verdict of a result's tensors and invariants (FAIL before INCONCLUSIVE before PASS),
/// with the reason (the first tensor or invariant of the deciding verdict); sets r.overall,
/// r.reason and r.passed.
inline void decide(check_result& r) {
    r.overall = verdict::pass;
    r.reason.clear();
    auto note = [&](verdict v, const std::string& why) {
        if (v == verdict::fail && r.overall != verdict::fail) r.overall = verdict::fail, r.reason = why;
        else if (v == verdict::inconclusive && r.overall == verdict::pass) r.overall = verdict::inconclusive, r.reason = why;
    };
    for (const tensor_report& t : r.tensors) {
        if (t.verdict == verdict::pass) continue;
        note(t.verdict, t.name + (t.untrustworthy ? " untrustworthy: " : ": ") + t.note);
    }
    for (const invariant_report& i : r.invariants) {
        if (!i.ok)
            note(verdict::fail, fmt::format("invariant '{}': {} of {} violated (worst {:.3g}, bound {:.3g})", i.name, i.violations,
                                            i.checked, i.worst, i.bound));
        else if (i.vacuous)
            note(verdict::inconclusive, fmt::format("invariant '{}': its bound is vacuous (as large as the quantity it bounds, or not "
                                                    "finite); a pass would prove nothing",
                                                    i.name));
    }
    r.passed = r.overall == verdict::pass;
}

}  // namespace attnref::golden
