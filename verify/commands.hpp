#pragma once
/// \file commands.hpp
/// Subcommands of the `attnref` executable. Each lives in its own file and adds itself to the
/// application with register_<name>; main.cpp calls them. Commands report usage and data errors by
/// throwing data_error (exit 2, one line on stderr) and failed checks by throwing check_failure
/// (exit 1).

#include <string>

#include <CLI/CLI.hpp>

namespace attnref::verify {

/// Validator for options stored in unsigned integers: the text must be decimal digits only, so
/// "-1" is refused with the flag's name instead of wrapping to 2^64 − 1.
inline CLI::Validator unsigned_text() {
    return CLI::Validator(
        [](std::string& s) -> std::string {
            if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return "expected a non-negative integer, got '" + s + "'";
            return {};
        },
        "UINT");
}

void register_generate(CLI::App& app);
void register_list(CLI::App& app);
void register_run(CLI::App& app);
void register_check(CLI::App& app);
void register_study(CLI::App& app);
void register_merge(CLI::App& app);

}  // namespace attnref::verify
