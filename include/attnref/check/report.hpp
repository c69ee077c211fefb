#pragma once
/// \file check/report.hpp
/// A check_result as text: the table `attnref check` prints (report_table), JSON (`--json`,
/// report_json) and JUnit XML (`--junit`, report_junit: every tensor or invariant that is not a
/// pass is a <failure> whose type is FAIL or INCONCLUSIVE). Each tensor's row names the format it
/// was judged in.

#include <cmath>
#include <string>

#include <fmt/color.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "attnref/core/backward.hpp"
#include "attnref/bounds/tolerance.hpp"
#include "attnref/check/api.hpp"
#include "attnref/check/verdict.hpp"

// Defined here in header-only use, and once in the compiled library (check/api.hpp).
#if ATTNREF_GOLDEN_BODIES
namespace attnref::golden {

namespace check_detail {
/// The candidate's format for the report's header: r.format (the output's, in which the weights
/// and lse are judged as computed), or "mixed" when a tensor other than weights and lse was judged
/// in another format (each tensor's own is in its row).
inline std::string candidate_formats(const check_result& r) {
    for (const tensor_report& t : r.tensors)
        if (t.name != "weights" && t.name != "lse" && t.format != r.format) return "mixed";
    return std::string(tol::format_name(r.format));
}
}  // namespace check_detail

/// The verdict as the table `attnref check` prints (`colour`: ANSI colours on the verdict column).
ATTNREF_GOLDEN_FN std::string report_table(const check_result& r, bool colour) {
    std::string s = fmt::format("case {}  candidate {}  model {}{}\n", r.case_name, check_detail::candidate_formats(r), tol::model_name(r.model),
                                r.declared_backward ? fmt::format("  backward {} (declared)", backward_algorithm_name(*r.declared_backward)) : "");
    s += fmt::format("{:<10} {:<8} {:>11} {:>11} {:>9} {:>11} {:>11} {:>10} {:>24} {:>14}  {}\n", "tensor", "dtype", "max abs", "max rel", "max ULP",
                     "RMS", "worst/bound", "worst idx", "candidate vs expected", "violations", "verdict");
    for (const tensor_report& t : r.tensors) {
        const tol::comparison& c = t.cmp;
        const double pct = c.elements ? 100.0 * static_cast<double>(c.violations) / static_cast<double>(c.elements) : 0;
        std::string text = verdict_text(t);
        if (colour)
            text = fmt::format(fmt::fg(t.verdict == verdict::pass ? fmt::color::green : t.verdict == verdict::fail ? fmt::color::red : fmt::color::orange),
                               "{}", verdict_text(t));
        s += fmt::format("{:<10} {:<8} {:>11.3e} {:>11.3e} {:>9.3g} {:>11.3e} {:>11.3g} {:>10} {:>11.4g} vs {:<9.4g} {:>6} ({:>5.1f}%)  {}{}\n",
                         t.name, tol::format_name(t.format), c.max_abs, c.max_rel, c.max_ulp, c.rms, c.worst_ratio, c.worst_index, c.worst_candidate,
                         c.worst_expected, c.violations, pct, text, t.note.empty() ? "" : " (" + t.note + ")");
    }
    for (const invariant_report& i : r.invariants)
        s += fmt::format("invariant {:<36} checked {:>8}  violations {:>6}  worst {:.3e} (bound {:.3e})  {}\n", i.name, i.checked,
                         i.violations, i.worst, i.bound, !i.ok ? "FAIL" : i.vacuous ? "INCONCLUSIVE (vacuous bound)" : "pass");
    s += r.overall == verdict::pass ? std::string("PASS\n") : fmt::format("{}: {}\n", verdict_name(r.overall), r.reason);
    return s;
}

/// The verdict as JSON (`--json`): the result's fields, and each tensor's and invariant's.
ATTNREF_GOLDEN_FN std::string report_json(const check_result& r) {
    nlohmann::ordered_json j;
    j["case"] = r.case_name;
    j["candidate_dtype"] = check_detail::candidate_formats(r);  // "mixed": see each tensor's dtype
    j["tolerance"] = tol::model_name(r.model);
    if (r.declared_backward) j["backward_algorithm"] = backward_algorithm_name(*r.declared_backward);  // as declared
    j["verdict"] = verdict_name(r.overall);  // PASS, FAIL or INCONCLUSIVE (exit 0, 1, 1)
    j["reason"] = r.reason;
    j["passed"] = r.passed;
    auto num = [](double x) -> nlohmann::ordered_json { return std::isfinite(x) ? nlohmann::ordered_json(x) : nlohmann::ordered_json(fmt::format("{}", x)); };
    for (const tensor_report& t : r.tensors) {
        const tol::comparison& c = t.cmp;
        j["tensors"].push_back({{"name", t.name}, {"dtype", tol::format_name(t.format)}, {"elements", c.elements}, {"max_abs_error", num(c.max_abs)},
                                {"max_rel_error", num(c.max_rel)}, {"max_ulp", num(c.max_ulp)}, {"rms", num(c.rms)},
                                {"worst_in_bound_units", num(c.worst_ratio)}, {"worst_index", c.worst_index},
                                {"worst_candidate", num(c.worst_candidate)}, {"worst_expected", num(c.worst_expected)},
                                {"worst_bound", num(c.worst_bound)}, {"violations", c.violations},
                                {"nonfinite_mismatches", c.nonfinite_mismatches}, {"vacuous_bounds", t.vacuous.elements},
                                {"verdict", verdict_text(t)}, {"note", t.note}});
    }
    j["invariants"] = nlohmann::ordered_json::array();
    for (const invariant_report& i : r.invariants)
        j["invariants"].push_back({{"name", i.name}, {"ok", i.ok}, {"vacuous_bound", i.vacuous}, {"checked", i.checked},
                                   {"violations", i.violations}, {"worst", num(i.worst)}, {"bound", num(i.bound)}});
    return j.dump(2) + "\n";
}

namespace check_detail {
inline std::string xml_escape(const std::string& s) {
    std::string r;
    for (char c : s) {
        switch (c) {
            case '<': r += "&lt;"; break;
            case '>': r += "&gt;"; break;
            case '&': r += "&amp;"; break;
            case '"': r += "&quot;"; break;
            default: r += c;
        }
    }
    return r;
}
}  // namespace check_detail
/// The verdict as JUnit XML (`--junit`): one test case per tensor and invariant.
ATTNREF_GOLDEN_FN std::string report_junit(const check_result& r) {
    std::size_t failures = 0;
    std::string cases;
    // A test case that is not a pass is a <failure>; its type says which verdict: FAIL, or
    // INCONCLUSIVE (a vacuous bound, an untrustworthy output) — neither may let CI go green.
    auto add = [&](const std::string& name, const std::string& type, const std::string& detail) {
        cases += fmt::format("    <testcase classname=\"attnref.check.{}\" name=\"{}\">\n", check_detail::xml_escape(r.case_name), check_detail::xml_escape(name));
        if (!type.empty()) {
            ++failures;
            cases += fmt::format("      <failure type=\"{}\" message=\"{}\">{}</failure>\n", type, check_detail::xml_escape(detail), check_detail::xml_escape(detail));
        }
        cases += fmt::format("      <system-out>{}</system-out>\n    </testcase>\n", check_detail::xml_escape(detail));
    };
    for (const tensor_report& t : r.tensors) {
        const tol::comparison& c = t.cmp;
        add(t.name + " (" + std::string(tol::model_name(r.model)) + ")",
            t.verdict == verdict::pass ? "" : verdict_name(t.verdict),
            fmt::format("{} (judged as {}): max abs {:.3e}, max rel {:.3e}, max ULP {:.3g}, RMS {:.3e}, worst {:.3g} bounds at {} ({:.6g} vs {:.6g}), "
                        "{} violations of {}{}",
                        verdict_text(t), tol::format_name(t.format), c.max_abs, c.max_rel, c.max_ulp, c.rms, c.worst_ratio, c.worst_index, c.worst_candidate,
                        c.worst_expected, c.violations, c.elements, t.note.empty() ? "" : "; " + t.note));
    }
    for (const invariant_report& i : r.invariants)
        add(i.name, verdict_of(i) == verdict::pass ? "" : verdict_name(verdict_of(i)),
            fmt::format("{} checked, {} violations, worst {:.3e} (bound {:.3e}){}", i.checked, i.violations, i.worst, i.bound,
                        i.ok && i.vacuous ? "; the bound is vacuous: a pass proves nothing" : ""));
    const std::size_t tests = r.tensors.size() + r.invariants.size();
    return fmt::format("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites tests=\"{0}\" failures=\"{1}\">\n"
                       "  <testsuite name=\"attnref check {2}\" tests=\"{0}\" failures=\"{1}\">\n"
                       "    <properties><property name=\"verdict\" value=\"{4}\"/><property name=\"reason\" value=\"{5}\"/></properties>\n"
                       "{3}  </testsuite>\n</testsuites>\n",
                       tests, failures, check_detail::xml_escape(r.case_name), cases, verdict_name(r.overall), check_detail::xml_escape(r.reason));
}

}  // namespace attnref::golden
#endif
