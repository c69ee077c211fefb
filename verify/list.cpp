/// `attnref list`: the suite's cases with one-line descriptions. The suite is --suite, else the
/// default_suite() lookup (commands.hpp): $ATTNREF_SUITE, ./golden, the installed suite.

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "commands.hpp"
#include "attnref/golden/manifest.hpp"
#include "summary.hpp"

namespace attnref::verify {

void register_list(CLI::App& app) {
    auto suite = std::make_shared<std::string>(default_suite());
    auto verbose = std::make_shared<bool>(false);
    CLI::App* l = app.add_subcommand("list", "List the suite's cases with one-line descriptions");
    l->add_option("--suite", *suite, "suite definition (default: the first of $ATTNREF_SUITE/suite.json, ./golden/suite.json, the installed suite)")
        ->capture_default_str();
    l->add_flag("--verbose,-v", *verbose, "also print shapes and conventions");
    l->callback([suite, verbose] {
        const std::vector<case_spec> cases = parse_suite(read_text(*suite), *suite);
        std::size_t w = 0;
        for (const case_spec& c : cases) w = std::max(w, c.name.size());
        for (const case_spec& c : cases) {
            std::string line = fmt::format("{:<{}}  {}", c.name, w, c.description);
            if (*verbose) line += fmt::format("  [{}; {}]", shapes_text(c), conventions_text(c));
            std::puts(line.c_str());
        }
    });
}

}  // namespace attnref::verify
