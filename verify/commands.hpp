#pragma once
/// \file commands.hpp
/// Subcommands of the `attnref` executable. Each lives in its own file and adds itself to the
/// application with register_<name>; main.cpp calls them. Commands report usage and data errors by
/// throwing data_error (exit 2, one line on stderr) and failed checks by throwing check_failure
/// (exit 1).

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>
#include <system_error>

#include <CLI/CLI.hpp>

namespace attnref::golden {}

namespace attnref::verify {

// The commands are the library's golden module (include/attnref/golden/) behind a command line.
using namespace attnref::golden;

/// <prefix>/share/attnref, found from the executable's own path (/proc/self/exe, symlinks
/// resolved): the installed layout is <prefix>/bin/attnref beside <prefix>/share/attnref/golden
/// (the default suite) and <prefix>/share/attnref/tools (the plot script). The build tree mirrors
/// it (<build>/verify/attnref, <build>/share/attnref/* linking to the source tree; verify/
/// CMakeLists.txt). No path of the build machine is compiled in. Empty if /proc is not mounted.
inline std::filesystem::path data_dir() {
    std::error_code ec;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec || exe.empty()) return {};
    return exe.parent_path().parent_path() / "share" / "attnref";
}
/// The default --suite, the first of: $ATTNREF_SUITE/suite.json when the variable is set and not
/// empty (a suite directory; used even if the file is missing, so a wrong setting is an error
/// naming it rather than a silent fallback); ./golden/suite.json when it is a regular file (a
/// checkout's own suite); data_dir()/golden/suite.json (the installed suite). docs/cli.md, "Where
/// the suite is"; python/attnref/suite.py follows the same order.
inline std::string default_suite() {
    if (const char* env = std::getenv("ATTNREF_SUITE"); env != nullptr && *env != '\0')
        return (std::filesystem::path(env) / "suite.json").string();
    std::error_code ec;
    if (std::filesystem::is_regular_file("golden/suite.json", ec)) return "golden/suite.json";
    return (data_dir() / "golden" / "suite.json").string();
}
/// The default --plot-script of `study`: data_dir()/tools/plot_study.py.
inline std::string default_plot_script() { return (data_dir() / "tools" / "plot_study.py").string(); }

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

/// Runs argv[0] with arguments argv[1..] (no shell, no PATH lookup), stdout and stderr to
/// /dev/null; true if it exited with status 0 (verify/study.cpp; the plot scripts of study and
/// study --reproduce).
bool run_quietly(const std::vector<std::string>& argv);

}  // namespace attnref::verify
