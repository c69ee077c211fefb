#pragma once
/// \file golden_case.hpp
/// Building, writing, comparing and loading golden case directories (golden/<case>/).

#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "attnref/npy.hpp"
#include "compute.hpp"
#include "manifest.hpp"

namespace attnref::verify {

/// One file of a case directory, fully serialised in memory.
struct case_file {
    std::string name;
    std::vector<std::byte> bytes;
};

/// A generated case: the manifest and the bytes of every file (manifest.json last).
struct generated_case {
    manifest m;
    std::vector<case_file> files;
    double seconds = 0;
    std::size_t certified_elements = 0;
    std::size_t escalated_elements = 0;
};

/// The inputs of a case from the generator (no I/O).
case_data generate_inputs(const case_spec& spec);

/// Generates the inputs, certifies the reference (threads for attnref's parallel_for) and
/// serialises everything. `progress` receives one-line messages (may be empty).
generated_case generate_case(const case_spec& spec, std::size_t threads,
                             const std::function<void(const std::string&)>& progress = {});

/// How a directory compares with a generated case.
struct comparison {
    bool exists = false;      ///< the directory exists
    bool identical = false;   ///< every file present with identical bytes
    std::string first_difference;  ///< file name of the first difference (or "missing file.npy")
};
comparison compare_case(const std::filesystem::path& dir, const generated_case& g);

/// Writes the case atomically file by file (npy::write-style temp + rename), manifest last.
void write_case(const std::filesystem::path& dir, const generated_case& g);

/// A case read back from disk for `attnref run`: manifest (strictly parsed), every file's sha256
/// checked against it, and the inputs decoded. data_error names the file and field on any problem.
struct loaded_case {
    manifest m;
    case_data data;
};
loaded_case load_case(const std::filesystem::path& dir);

}  // namespace attnref::verify
