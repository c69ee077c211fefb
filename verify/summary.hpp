#pragma once
/// \file summary.hpp
/// The summary table `attnref generate` prints: case, shapes, conventions, certified elements, time.

#include <cstddef>
#include <string>
#include <vector>

#include "attnref/golden/manifest.hpp"

namespace attnref::golden {}
namespace attnref::verify {
using namespace attnref::golden;

struct summary_row {
    const case_spec* spec;
    std::string status;
    std::size_t certified = 0, escalated = 0;
    double seconds = 0;
};

/// "B2 H8/8 S10x10 d64/64 E512" style shape summary.
std::string shapes_text(const case_spec& s);
/// Short list of the non-default conventions, e.g. "causal=br mask=attend fmt=bf16".
std::string conventions_text(const case_spec& s);
/// The whole table with a totals line, ending in a newline.
std::string summary_table(const std::vector<summary_row>& rows);

}  // namespace attnref::verify
