/// The `attnref` command: golden data for attention (see golden/README.md).
/// Exit codes: 0 success, 1 a check failed, 2 usage or data error (one line on stderr).

#include <cstdio>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

#include "commands.hpp"
#include "manifest.hpp"

int main(int argc, char** argv) {
    CLI::App app{"attnref: certified golden data for Transformer attention"};
    app.require_subcommand(1);
    attnref::verify::register_generate(app);
    attnref::verify::register_list(app);
    attnref::verify::register_run(app);
    attnref::verify::register_check(app);
    attnref::verify::register_study(app);
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::fprintf(stderr, "attnref: %s (see --help)\n", e.what());
        return 2;
    } catch (const attnref::verify::check_failure& e) {
        std::fprintf(stderr, "attnref: %s\n", e.what());
        return 1;
    } catch (const attnref::verify::data_error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "attnref: %s\n", e.what());
        return 2;
    }
    return 0;
}
