#pragma once
/// \file commands.hpp
/// Subcommands of the `attnref` executable. Each lives in its own file and adds itself to the
/// application with register_<name>; main.cpp calls them. Commands report usage and data errors by
/// throwing data_error (exit 2, one line on stderr) and failed checks by throwing check_failure
/// (exit 1).

#include <CLI/CLI.hpp>

namespace attnref::verify {

void register_generate(CLI::App& app);
void register_list(CLI::App& app);
void register_run(CLI::App& app);
void register_check(CLI::App& app);
void register_study(CLI::App& app);

}  // namespace attnref::verify
