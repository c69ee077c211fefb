#pragma once
// Whole-file reads and writes for tests that edit committed files in a scratch copy.

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace attnref::test {

/// The bytes of the file at p ("" when it cannot be opened).
inline std::string read_file(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

/// Replaces the file at p with `text`.
inline void write_file(const std::filesystem::path& p, const std::string& text) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << text;
}

}  // namespace attnref::test
