#pragma once
/// \file safe_io.hpp
/// The one path by which the `attnref` command reads and writes files it did not create itself
/// (candidate .npy files, golden cases, suites, study descriptions) and writes reports. Files come
/// from other people's kernels, artifact caches and pull requests, so every reader here:
/// - accepts regular files only (after following symlinks): a FIFO, socket or device (/dev/zero,
///   /dev/stdin) is refused before anything is read from it, so nothing blocks or streams forever;
/// - inside a golden case directory, refuses a symlink that resolves outside that directory
///   (without reading, hashing or naming what it points to);
/// - bounds memory before spending it: JSON files are capped at max_json_bytes, .npy files are read
///   through npy::read with the expected descr and shape (npy::expectation), and a case whose
///   shapes imply more than max_memory() bytes is refused up front (case_memory_estimate).
/// Every failure is a data_error (exit 2) with one line naming the file and the field.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "manifest.hpp"

namespace attnref::verify {

/// Largest JSON file (manifest.json, suite, study description) read: 16 MiB. The largest committed
/// manifest is below 16 KiB and the suite below 64 KiB; a file near the cap is not a real manifest.
inline constexpr std::size_t max_json_bytes = std::size_t{16} << 20;
/// Deepest nesting of JSON arrays and objects accepted (a manifest needs 5 levels): deeper input is
/// refused by a non-recursive pre-pass before any recursive code (JSON DOM, error formatting) sees it.
inline constexpr std::size_t max_json_depth = 64;
/// Default limit on the memory one case may make a command spend: 4 GiB (--max-memory raises it).
inline constexpr std::uint64_t default_max_memory = std::uint64_t{4} << 30;

/// The process-wide memory limit for a case (bytes), set from --max-memory.
std::uint64_t max_memory();
void set_max_memory(std::uint64_t bytes);
/// Parses a --max-memory value: bytes with an optional K, M, G or T suffix (powers of 1024), e.g.
/// "8G". Throws data_error naming the flag.
std::uint64_t parse_memory_size(const std::string& text, const std::string& flag);

/// `text` for a one-line message: bytes 0x00-0x1f and 0x7f as \n, \t, \r or \xNN, backslash doubled.
std::string printable(std::string_view text);

/// Checks that `path` is a regular file (following symlinks) and returns its size. With
/// `case_dir`, a symlink must resolve to a file inside `case_dir` (after resolving `case_dir`'s
/// own symlinks). `what` names the role in the message, e.g. "--output" or "manifest.json field
/// 'tensors[3].file'". Throws data_error naming the path.
std::uintmax_t require_regular_file(const std::filesystem::path& path, const std::string& what,
                                    const std::optional<std::filesystem::path>& case_dir = std::nullopt);

/// Reads a whole regular file of at most `cap` bytes (opened non-blocking and checked with fstat, so
/// a FIFO swapped in after require_regular_file cannot block either). Throws data_error naming it.
std::string read_file_capped(const std::filesystem::path& path, std::size_t cap,
                             const std::optional<std::filesystem::path>& case_dir = std::nullopt);

/// Non-recursive pre-pass over JSON text: refuses NUL bytes anywhere (e.g. bytes after a NUL at the
/// end of a manifest), nesting deeper than max_json_depth and duplicate keys in an object, each
/// with data_error "<file>: ..." naming the offset or field. Syntax errors are left to the parser.
void json_prepass(const std::string& text, const std::string& file);

/// a × b, or nullopt if it overflows 64 bits.
std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b);
/// a + b, or nullopt if it overflows 64 bits.
std::optional<std::uint64_t> checked_add(std::uint64_t a, std::uint64_t b);

/// Estimated peak memory (bytes) of loading and checking a case, from its shapes alone:
/// 8 bytes per value of the inputs, plus 4 copies of the output (golden, candidate, bounds and
/// their terms), 4 of the weights B·H·Sq·Sk (golden, candidate, exact logits, per-element terms)
/// and 2 of lse; `bytes_per_value` replaces 8 for `generate`'s interval arithmetic. Saturates at
/// 2^64 − 1 instead of overflowing.
std::uint64_t case_memory_estimate(const case_spec& spec, std::uint64_t bytes_per_value = 8);
/// Throws data_error "<file>: field 'shapes': ..." naming the estimate and the limit if the case's
/// estimate exceeds max_memory().
void check_case_memory(const case_spec& spec, const std::string& file, std::uint64_t bytes_per_value = 8);

/// An exclusive advisory lock (flock) on a directory, held until destruction; blocks while another
/// process holds it. Serialises concurrent `generate` runs publishing into the same --out.
class directory_lock {
public:
    explicit directory_lock(const std::filesystem::path& dir);
    ~directory_lock();
    directory_lock(const directory_lock&) = delete;
    directory_lock& operator=(const directory_lock&) = delete;

private:
    int fd_ = -1;
};

/// Writes `text` to `path` atomically (temporary file in the same directory, then rename). Without
/// `overwrite`, an existing `path` is an error and is left untouched (the final step is link(2),
/// which fails if the name exists, so a file that appears concurrently is not replaced either).
void write_file_atomic(const std::filesystem::path& path, const std::string& text, bool overwrite);

/// True if `a` and `b` name the same existing file (same device and inode).
bool same_file(const std::filesystem::path& a, const std::filesystem::path& b);

}  // namespace attnref::verify
