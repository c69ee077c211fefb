#pragma once
/// \file io/npy.hpp
/// Owns: reading and writing NumPy .npy files and converting their elements (the format itself —
/// dtypes, header checks, parse and serialize — is npy_format.hpp, included here). float16
/// elements are decoded by binary_format.hpp's encoding::widen_to_double.
/// A strict reader and writer for NumPy's .npy format (NEP 1, numpy/lib/format.py), standard
/// library only. attnref's golden data is stored as .npy files; this header is how C++ reads and
/// writes them.
///
/// File layout:
///
///     "\x93NUMPY" major minor  header_length (uint16 LE for 1.0, uint32 LE for 2.0 and 3.0)
///     header: "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }" + spaces + "\n"
///     data:   product(shape) * itemsize bytes, C order, little-endian
///
/// What is accepted, and why it is narrow: golden files must mean the same thing to every reader,
/// so anything numpy could write but whose meaning depends on the reader (big-endian data, native
/// '=' byte order on multi-byte types, Fortran order, structured or object dtypes, a file with
/// bytes after the data) is an error rather than a guess.
///
/// - versions 1.0, 2.0 and 3.0; header length at most 64 KiB;
/// - the header is a one-line Python dict literal with exactly the keys 'descr', 'fortran_order'
///   and 'shape' (any order, optional trailing comma, spaces), then optional padding spaces, then
///   '\n';
/// - descr is one of '<f8' '<f4' '<f2' '<u2' '<i4' '<i8' '|u1' '|i1' '|b1'; for the one-byte
///   types any byte-order mark ('<', '>', '=', '|') is accepted and normalised to '|';
/// - fortran_order is False; shape is a tuple of non-negative integers, '()' for a scalar;
/// - the data is exactly product(shape) * itemsize bytes, and every '|b1' byte is 0 or 1.
///
/// Every failure throws attnref::npy::error with a one-line message naming the file and the
/// field, e.g.
///
///     golden/x/output.npy: header field 'shape': expected a tuple of non-negative integers, got '(3, -1)'
///     golden/x/output.npy: data: file holds 80 bytes, header promises 96 (the file is truncated)
///
/// No input, however malformed, causes undefined behaviour or a crash (the parser is fuzzed, see
/// fuzz/npy.fuzz.cpp), and no allocation is sized by the header before it has been checked against
/// the file's actual length and the caller's expectation (npy::expectation: descr, shape, byte cap).
///
/// Example:
///
///     namespace npy = attnref::npy;
///     std::vector<double> v{1, 2, 3, 4, 5, 6};
///     npy::write("out.npy", npy::make_array("<f8", {2, 3}, v));
///     npy::array a = npy::read("out.npy");       // a.shape == {2, 3}
///     std::vector<double> back = npy::to_double(a);


#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "attnref/core/binary_format.hpp"
#include "attnref/io/npy_format.hpp"

namespace attnref::npy {

/// Reads and parses a .npy file. Errors name the path. Memory is bounded before it is spent:
/// - the path must be a regular file (after following symlinks): a directory, FIFO, socket or
///   device (/dev/zero, /dev/stdin) is refused before it is opened, so nothing blocks or streams
///   forever (a file swapped for a FIFO between the check and the open is not defended against);
/// - only the preamble and header (at most 12 + 64 KiB) are read before the header has been
///   checked against the file's size and against `want` (descr, shape, byte cap);
/// - then exactly the promised data block is allocated and read, and the file must end there (a
///   file that grows while being read is an error, not a larger allocation).
inline array read(const std::filesystem::path& path, const expectation& want = {});
inline std::vector<double> to_double(const array& a);

/// What read() checks before reading the data block (regular file, header, size, `want`), without
/// reading it: the returned array has its descr and shape and no data.
inline array read_header(const std::filesystem::path& path, const expectation& want = {}) {
    expectation header_only = want;
    header_only.max_data_bytes = 0;  // never read data: a non-empty block ends the read below
    try {
        return read(path, header_only);
    } catch (const error& e) {
        // Only the byte cap, which read_header itself added, may refuse: re-check with the caller's.
        if (std::string_view(e.what()).find("exceeds the reader's limit of 0 bytes") == std::string_view::npos) throw;
    }
    array a;
    {
        namespace fs = std::filesystem;
        std::error_code ec;
        const std::uintmax_t file_size = fs::file_size(path, ec);
        std::ifstream in(path, std::ios::binary);
        const std::size_t prefix_size = static_cast<std::size_t>(std::min<std::uintmax_t>(file_size, 12 + detail::max_header_length));
        std::vector<std::byte> prefix(prefix_size);
        in.read(reinterpret_cast<char*>(prefix.data()), static_cast<std::streamsize>(prefix_size));
        if (ec || static_cast<std::size_t>(in.gcount()) != prefix_size)
            detail::fail(path.string(), "file", "read error (the file changed while being read)");
        detail::header_info h = detail::parse_header(prefix, file_size, path.string());
        detail::check_expectation(h, want, path.string());
        a = std::move(h.meta);
    }
    return a;
}

namespace detail {
/// read()'s steps — a regular file, its header against `want`, exactly the header's data bytes,
/// nothing after them — with the data read into sink(h), which returns where h.data_bytes bytes go.
template <class Sink>
header_info read_file(const std::filesystem::path& path, const expectation& want, Sink&& sink) {
    namespace fs = std::filesystem;
    const std::string source = path.string();
    std::error_code ec;
    const fs::file_status status = fs::status(path, ec);
    if (ec || !fs::exists(status)) fail(source, "file", "cannot open for reading");
    if (fs::is_directory(status)) fail(source, "file", "is a directory");
    if (!fs::is_regular_file(status)) fail(source, "file", "not a regular file (a FIFO, socket or device is refused)");
    const std::uintmax_t file_size = fs::file_size(path, ec);
    if (ec) fail(source, "file", "cannot read its size: " + ec.message());
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(source, "file", "cannot open for reading");
    const std::size_t prefix_size = static_cast<std::size_t>(std::min<std::uintmax_t>(file_size, 12 + max_header_length));
    std::vector<std::byte> prefix(prefix_size);
    in.read(reinterpret_cast<char*>(prefix.data()), static_cast<std::streamsize>(prefix_size));
    if (static_cast<std::size_t>(in.gcount()) != prefix_size) fail(source, "file", "read error (the file shrank while being read)");
    header_info h = parse_header(prefix, file_size, source);
    check_expectation(h, want, source);
    std::byte* out = sink(h);
    const std::size_t in_prefix = std::min(prefix_size - std::min(prefix_size, h.data_offset), h.data_bytes);
    if (in_prefix) std::copy_n(prefix.begin() + static_cast<std::ptrdiff_t>(h.data_offset), in_prefix, out);
    const std::size_t rest = h.data_bytes - in_prefix;
    if (rest) {
        in.read(reinterpret_cast<char*>(out + in_prefix), static_cast<std::streamsize>(rest));
        if (static_cast<std::size_t>(in.gcount()) != rest) fail(source, "file", "read error (the file shrank while being read)");
    }
    if (in.peek() != std::char_traits<char>::eof()) fail(source, "data", "trailing bytes after the data (the file grew while being read)");
    return h;
}
/// read_file's sink for an array: the data into h.meta.data.
inline std::byte* into_array(header_info& h) {
    h.meta.data.resize(h.data_bytes);
    return h.meta.data.data();
}
/// The array read into h.meta, its '|b1' bytes checked (0 or 1).
inline array checked_array(header_info&& h, const std::string& source) {
    if (h.meta.descr == "|b1") check_bool_bytes(h.meta.data, source);
    return std::move(h.meta);
}
}  // namespace detail

inline array read(const std::filesystem::path& path, const expectation& want) {
    return detail::checked_array(detail::read_file(path, want, detail::into_array), path.string());
}

/// read() then to_double(), with the same checks; a little-endian float64 file ('<f8' on a
/// little-endian machine) is read straight into the doubles, without the byte copy in between
/// (a golden weights tensor at LLM size is 537 MB).
inline std::vector<double> read_double(const std::filesystem::path& path, const expectation& want = {}) {
    if constexpr (std::endian::native == std::endian::little) {
        std::vector<double> out;
        bool direct = false;
        detail::header_info h = detail::read_file(path, want, [&](detail::header_info& hi) {
            if (!(direct = hi.meta.descr == "<f8")) return detail::into_array(hi);
            out.resize(hi.data_bytes / sizeof(double));
            return reinterpret_cast<std::byte*>(out.data());
        });
        if (direct) return out;
        return to_double(detail::checked_array(std::move(h), path.string()));
    } else {
        return to_double(read(path, want));
    }
}


/// Writes `a` to `path` atomically: the bytes go to a new temporary file in the same directory
/// (created exclusively), which is flushed, closed and then renamed over `path`. Readers see the
/// old file or the complete new one, never a partial write; on any failure the temporary file is
/// removed, `path` is untouched, and npy::error names the path.
inline void write(const std::filesystem::path& path, const array& a) {
    const std::string source = path.string();
    const std::vector<std::byte> bytes = serialize(a);
    namespace fs = std::filesystem;
    if (path.filename().empty()) detail::fail(source, "file", "path has no file name");
    std::error_code ec;
    if (fs::is_directory(path, ec)) detail::fail(source, "file", "is a directory");

    static std::atomic<unsigned long long> counter{0};
    const auto stamp = static_cast<unsigned long long>(
        std::chrono::steady_clock::now().time_since_epoch().count());
    fs::path temporary;
    std::FILE* file = nullptr;
    for (int attempt = 0; attempt < 16 && !file; ++attempt) {
        std::string name = ".";  // appends, not operator+: GCC 12 -Wrestrict false positive
        name += path.filename().string();
        name += ".tmp-";
        name += std::to_string(stamp);
        name += '-';
        name += std::to_string(counter.fetch_add(1));
        temporary = path;
        temporary.replace_filename(name);
        file = std::fopen(temporary.c_str(), "wbx");  // 'x': fail if it exists (C11)
        if (!file && fs::exists(temporary, ec)) continue;
        if (!file) break;
    }
    if (!file) detail::fail(source, "file", "cannot create a temporary file in the target directory");
    bool ok = std::fwrite(bytes.data(), 1, bytes.size(), file) == bytes.size();
    ok = std::fflush(file) == 0 && ok;
    ok = std::fclose(file) == 0 && ok;
    if (!ok) {
        fs::remove(temporary, ec);
        detail::fail(source, "file", "write failed");
    }
    fs::rename(temporary, path, ec);
    if (ec) {
        std::error_code ignored;
        fs::remove(temporary, ignored);
        detail::fail(source, "file", "cannot rename the temporary file over it: " + ec.message());
    }
}

/// The element types make_array and to_vector map to descriptors: double '<f8', float '<f4',
/// bool '|b1', uint16_t '<u2', uint8_t '|u1', int8_t '|i1', int32_t '<i4', int64_t '<i8'.
template <class T>
concept Element = !detail::descr_of<T>.empty();

/// Builds an array of descriptor `descr` from values of the matching C++ type (see Element), or
/// '|b1' from uint8_t values that are 0 or 1. `values.size()` must equal the product of `shape`.
/// Example: make_array("<f8", {2, 3}, std::vector<double>(6, 0.5)).
template <std::ranges::contiguous_range Values>
    requires Element<std::ranges::range_value_t<Values>>
array make_array(std::string_view descr, std::vector<std::size_t> shape, const Values& values) {
    using T = std::ranges::range_value_t<Values>;
    const detail::dtype_info& info = detail::lookup_dtype(descr, detail::in_memory, "descr");
    const bool bool_from_bytes = info.descr == "|b1" && std::is_same_v<T, std::uint8_t>;
    if (info.descr != detail::descr_of<T> && !bool_from_bytes)
        detail::fail(detail::in_memory, "descr",
                     std::string("'").append(info.descr).append("' does not match the element type, '").append(detail::descr_of<T>).append("' expected"));
    array a{std::string(info.descr), std::move(shape), {}};
    const std::size_t count = a.size();
    const std::span<const T> span(std::ranges::data(values), std::ranges::size(values));
    if (span.size() != count)
        detail::fail(detail::in_memory, "data", std::to_string(span.size()) + " values, shape " +
                                                    detail::shape_repr(a.shape) + " needs " + std::to_string(count));
    a.data.resize(count * info.itemsize);
    for (std::size_t i = 0; i < count; ++i) {
        const std::uint64_t bits = detail::to_bits(span[i]);
        if (bool_from_bytes && bits > 1)
            detail::fail(detail::in_memory, "data", "value " + std::to_string(i) + " of a '|b1' array is " +
                                                        std::to_string(bits) + ", expected 0 or 1");
        detail::store_le(a.data.data() + i * info.itemsize, bits, info.itemsize);
    }
    return a;
}

/// make_array for std::vector<bool> (not a contiguous range): descr must be '|b1'.
inline array make_array(std::string_view descr, std::vector<std::size_t> shape, const std::vector<bool>& values) {
    std::vector<std::uint8_t> bytes(values.begin(), values.end());
    if (detail::lookup_dtype(descr, detail::in_memory, "descr").descr != "|b1")
        detail::fail(detail::in_memory, "descr", "'" + std::string(descr) + "' does not match bool, '|b1' expected");
    return make_array(descr, std::move(shape), bytes);
}

/// The elements converted exactly to double: '<f8', '<f4', '<f2' (NaN, infinities, signed zero
/// and subnormals preserved), all integer types and '|b1' (0 or 1). Throws npy::error for an
/// '<i8' value that double cannot hold exactly (|v| > 2^53 and not representable).
inline std::vector<double> to_double(const array& a) {
    const detail::dtype_info& info = detail::check_array(a, detail::in_memory);
    const std::size_t count = a.data.size() / info.itemsize;
    std::vector<double> out(count);
    for (std::size_t i = 0; i < count; ++i) {
        const std::uint64_t bits = detail::load_le(a.data.data() + i * info.itemsize, info.itemsize);
        double value = 0;
        switch (info.kind) {
        case 'f':
            value = info.itemsize == 8   ? std::bit_cast<double>(bits)
                    : info.itemsize == 4 ? double(std::bit_cast<float>(static_cast<std::uint32_t>(bits)))
                                         : encoding::widen_to_double<encoding::float16>(bits);  // NaN payloads kept, as numpy does
            break;
        case 'u':
        case 'b':
            value = double(bits);  // at most 16 bits: exact
            break;
        default: {
            const unsigned shift = unsigned(64 - 8 * info.itemsize);
            const auto v = static_cast<std::int64_t>(bits << shift) >> shift;  // sign-extend
            value = double(v);
            // 2^63 itself is out of int64 range, so test before converting back.
            if (value >= 0x1p63 || static_cast<std::int64_t>(value) != v)
                detail::fail(detail::in_memory, "data", "element " + std::to_string(i) + " (" + std::to_string(v) +
                                                            ") of a '<i8' array is not exactly a double");
        }
        }
        out[i] = value;
    }
    return out;
}

/// The elements of a '|b1' array (e.g. an attention mask) as bool.
inline std::vector<bool> to_bool(const array& a) {
    const detail::dtype_info& info = detail::check_array(a, detail::in_memory);
    if (info.kind != 'b')
        detail::fail(detail::in_memory, "descr", "expected '|b1' for a bool array, got '" + std::string(info.descr) + "'");
    std::vector<bool> out(a.data.size());
    for (std::size_t i = 0; i < a.data.size(); ++i) out[i] = std::to_integer<unsigned>(a.data[i]) != 0;
    return out;
}

/// The bytes of a '|b1' (0 or 1) or '|u1' array as uint8_t.
inline std::vector<std::uint8_t> to_uint8(const array& a) {
    const detail::dtype_info& info = detail::check_array(a, detail::in_memory);
    if (info.itemsize != 1 || info.kind == 'i')
        detail::fail(detail::in_memory, "descr", "expected '|b1' or '|u1', got '" + std::string(info.descr) + "'");
    std::vector<std::uint8_t> out(a.data.size());
    for (std::size_t i = 0; i < a.data.size(); ++i) out[i] = std::to_integer<std::uint8_t>(a.data[i]);
    return out;
}

/// The elements as T, whose descriptor (see Element) must equal a.descr: no conversion.
template <Element T>
std::vector<T> to_vector(const array& a) {
    const detail::dtype_info& info = detail::check_array(a, detail::in_memory);
    if (info.descr != detail::descr_of<T>)
        detail::fail(detail::in_memory, "descr", "expected '" + std::string(detail::descr_of<T>) + "', got '" +
                                                     std::string(info.descr) + "'");
    std::vector<T> out;
    out.reserve(a.data.size() / info.itemsize);
    for (std::size_t i = 0; i < a.data.size(); i += info.itemsize)
        out.push_back(detail::from_bits<T>(detail::load_le(a.data.data() + i, info.itemsize)));
    return out;
}

}  // namespace attnref::npy