#pragma once
/// \file golden/input_selection.hpp
/// Owns the names of the inputs a verdict can be about, once: the FP8 input formats (OCP 8-bit
/// floating point) and input_selection (the case's own inputs, auto, the golden inputs rounded to a
/// binary format, or quantised to an FP8 format) with its name table. The rules that act on them
/// are golden/rounded_inputs.hpp's (resolve_inputs; it needs MPFR, this header does not), so a
/// check_request (check/candidate.hpp) can carry a selection in the compiled checker.

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attnref/core/binary_format.hpp"

namespace attnref::golden {

/// The FP8 input formats (OCP 8-bit floating point, 2023): E4M3FN (max 448, no infinity) and E5M2.
enum class fp8_input_format { e4m3, e5m2 };
inline constexpr std::pair<const char*, fp8_input_format> fp8_input_format_names[] = {
    {"fp8e4m3", fp8_input_format::e4m3},
    {"fp8e5m2", fp8_input_format::e5m2},
};
inline std::string fp8_format_name(fp8_input_format f) { return f == fp8_input_format::e4m3 ? "fp8e4m3" : "fp8e5m2"; }
inline std::optional<fp8_input_format> fp8_format_from_name(std::string_view n) {
    for (const auto& [name, f] : fp8_input_format_names)
        if (n == name) return f;
    return std::nullopt;
}

/// Which inputs a verdict is about, as a front end asks for it (`attnref check --input-format`,
/// attnref.check's input_format=): the case's own, auto (the rule of resolve_inputs), the golden
/// inputs rounded to a format, or quantised to an FP8 format.
struct input_selection {
    enum class kind { case_inputs, automatic, rounded, fp8 };
    kind k = kind::case_inputs;
    binary_format format = binary_format::float64;  ///< kind::rounded
    fp8_input_format fp8 = fp8_input_format::e4m3;  ///< kind::fp8
};

/// The names of every input selection, once: "auto", "case", the binary formats (binary_format_names),
/// the FP8 formats (fp8_input_format_names). The command's choices and Python's INPUT_FORMATS read it.
inline std::vector<std::string> input_selection_names(bool with_auto_and_case = true) {
    std::vector<std::string> n;
    if (with_auto_and_case) n = {"auto", "case"};
    for (const auto& [name, f] : binary_format_names) n.emplace_back(name);
    for (const auto& [name, f] : fp8_input_format_names) n.emplace_back(name);
    return n;
}
inline std::optional<input_selection> input_selection_from_name(std::string_view n) {
    if (n == "auto") return input_selection{input_selection::kind::automatic};
    if (n == "case") return input_selection{input_selection::kind::case_inputs};
    if (const std::optional<binary_format> f = format_from_name(n)) return input_selection{input_selection::kind::rounded, *f};
    if (const std::optional<fp8_input_format> f = fp8_format_from_name(n))
        return input_selection{input_selection::kind::fp8, binary_format::float64, *f};
    return std::nullopt;
}
inline std::string input_selection_name(const input_selection& s) {
    switch (s.k) {
        case input_selection::kind::automatic: return "auto";
        case input_selection::kind::case_inputs: return "case";
        case input_selection::kind::rounded: return std::string(format_name(s.format));
        case input_selection::kind::fp8: return fp8_format_name(s.fp8);
    }
    return "case";
}
/// "auto, case, float64, …, fp8e4m3 or fp8e5m2", for messages.
inline std::string input_selection_list(bool with_auto_and_case = true) {
    const std::vector<std::string> n = input_selection_names(with_auto_and_case);
    std::string t;
    for (std::size_t i = 0; i < n.size(); ++i) t += (i == 0 ? "" : i + 1 == n.size() ? " or " : ", ") + n[i];
    return t;
}

}  // namespace attnref::golden
