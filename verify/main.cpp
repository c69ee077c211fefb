/// The `attnref` command: golden data for attention (see golden/README.md).
/// Exit codes: 0 success, 1 a check failed, 2 usage or data error (one line on stderr: control
/// characters in it, e.g. a newline in a file name, are escaped by golden::printable).

#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "commands.hpp"
#include "attnref/golden/manifest.hpp"
#include "attnref/golden/safe_io.hpp"

namespace {
void say(const std::string& prefix, const char* what) {
    std::fprintf(stderr, "%s%s\n", prefix.c_str(), attnref::golden::printable(what).c_str());
}
}  // namespace

int main(int argc, char** argv) {
    // A closed stdout (`attnref check ... | head -c1`) must not kill the process before the reports
    // are written: writes to it fail with EPIPE instead, and the table is best effort.
    std::signal(SIGPIPE, SIG_IGN);
    CLI::App app{"attnref: certified golden data for Transformer attention"};
    app.require_subcommand(1);
    attnref::verify::register_generate(app);
    attnref::verify::register_list(app);
    attnref::verify::register_run(app);
    attnref::verify::register_check(app);
    attnref::verify::register_study(app);
    attnref::verify::register_merge(app);
    // CLI11 reports an unknown first word as "A subcommand is required": name it instead.
    if (argc > 1 && argv[1][0] != '-') {
        bool known = false;
        for (const CLI::App* sub : app.get_subcommands({})) known = known || sub->check_name(argv[1]);
        if (!known) {
            // The list comes from the registered subcommands, so a new one is never left out.
            std::string names;
            const std::vector<CLI::App*> subs = app.get_subcommands({});
            for (std::size_t i = 0; i < subs.size(); ++i)
                names += (i == 0 ? "" : i + 1 == subs.size() ? " or " : ", ") + subs[i]->get_name();
            say("attnref: unknown subcommand '", (std::string(argv[1]) + "' (expected " + names + "; see --help)").c_str());
            return 2;
        }
    }
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        say("attnref: ", (std::string(e.what()) + " (see --help)").c_str());
        return 2;
    } catch (const attnref::golden::check_failure& e) {
        say("attnref: ", e.what());
        return 1;
    } catch (const attnref::golden::data_error& e) {
        say("", e.what());
        return 2;
    } catch (const std::bad_alloc&) {
        say("attnref: ", "out of memory (a case or file larger than the machine allows; see --max-memory)");
        return 2;
    } catch (const std::exception& e) {
        say("attnref: ", e.what());
        return 2;
    }
    return 0;
}
