#pragma once
/// \file reproduce.hpp
/// `attnref study --reproduce NAME`: reproductions of published numerics claims
/// (include/attnref/study/reproduce.hpp, docs/studies-reproduced.md).

#include <cstddef>
#include <string>

namespace attnref::verify {

/// Runs reproduction `name` (pcast-fp8 or flash-bf16; data_error otherwise), writes DIR/<name>.csv,
/// DIR/<name>.txt and the plots (tools/plot_reproduce.py, unless no_plot), prints the table and the
/// verdict lines. `reduced`: the CTest sample (fewer seeds, lengths and variants).
void run_reproduction(const std::string& name, const std::string& out, std::size_t threads, bool reduced, bool no_plot);

}  // namespace attnref::verify
