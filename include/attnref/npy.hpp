#pragma once
/// \file npy.hpp
/// Owns: reading and writing NumPy .npy files (header checks, dtypes, element conversion). float16
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
#include <array>
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
#include <optional>
#include <ranges>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

#include "attnref/binary_format.hpp"

namespace attnref::npy {

/// Thrown for every malformed file, unsupported feature, failed I/O or inconsistent array.
/// what() is one line: "<file>: <field>: <what was expected>, got '<what was found>'".
class error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// An n-dimensional array as stored in a .npy file: dtype descriptor (canonical form, e.g. '<f8',
/// '|b1'), shape (empty for a scalar) and the raw element bytes in C order, little-endian.
struct array {
    std::string descr;
    std::vector<std::size_t> shape;
    std::vector<std::byte> data;

    /// Number of elements: the product of shape (1 for a scalar, 0 if any extent is 0).
    /// Throws npy::error if the product overflows std::size_t.
    std::size_t size() const;
};

namespace detail {

/// One supported element type.
struct dtype_info {
    std::string_view descr;  // canonical descriptor
    char kind;               // 'f' float, 'u' unsigned, 'i' signed, 'b' bool
    std::size_t itemsize;
};

inline constexpr std::array<dtype_info, 9> supported_dtypes{{
    {"<f8", 'f', 8}, {"<f4", 'f', 4}, {"<f2", 'f', 2}, {"<u2", 'u', 2}, {"|u1", 'u', 1},
    {"|i1", 'i', 1}, {"<i4", 'i', 4}, {"<i8", 'i', 8}, {"|b1", 'b', 1},
}};

inline constexpr std::size_t max_header_length = 64 * 1024;
inline constexpr std::size_t max_dimensions = 64;  // NPY_MAXDIMS in numpy 2
inline constexpr std::string_view magic = "\x93NUMPY";
inline constexpr std::string_view in_memory = "<in-memory array>";

/// Renders untrusted text for an error message: printable ASCII kept, everything else as \xNN,
/// at most 60 characters of input, so that what() stays one readable line.
inline std::string quote_excerpt(std::string_view text) {
    constexpr std::size_t limit = 60;
    std::string out;
    const std::size_t n = std::min(text.size(), limit);
    for (std::size_t i = 0; i < n; ++i) {
        const auto c = static_cast<unsigned char>(text[i]);
        if (c >= 0x20 && c < 0x7f) {
            out += static_cast<char>(c);
        } else {
            constexpr char hex[] = "0123456789abcdef";
            out += "\\x";
            out += hex[c >> 4];
            out += hex[c & 0xf];
        }
    }
    if (text.size() > limit) out += "...";
    return out;
}

[[noreturn]] inline void fail(std::string_view source, std::string_view field, const std::string& message) {
    std::string text(source);
    text += ": ";
    text += field;
    text += ": ";
    text += message;
    throw error(text);
}

/// Maps any accepted spelling of a descriptor to its canonical entry, or throws npy::error with
/// the reason (unsupported type, big-endian, byte order unstated for a multi-byte type).
inline const dtype_info& lookup_dtype(std::string_view descr, std::string_view source,
                                      std::string_view field) {
    const std::string supported =
        "(supported: '<f8', '<f4', '<f2', '<u2', '|u1', '|i1', '<i4', '<i8', '|b1')";
    if (descr.size() >= 2) {
        const char order = descr.front();
        const std::string_view type = descr.substr(1);
        for (const dtype_info& info : supported_dtypes) {
            if (info.descr.substr(1) != type) continue;
            if (order == '<' || (info.itemsize == 1 && (order == '|' || order == '=' || order == '>')))
                return info;
            if (order == '>')
                fail(source, field, "big-endian data is unsupported, got '" + quote_excerpt(descr) +
                                        "' (save with arr.astype('" + std::string(info.descr) + "'))");
            if (order == '=' || order == '|')
                fail(source, field, "byte order '" + std::string(1, order) +
                                        "' does not say the byte order of a multi-byte type, expected '" +
                                        std::string(info.descr) + "'");
            break;
        }
    }
    fail(source, field, "unsupported dtype '" + quote_excerpt(descr) + "' " + supported);
}

/// Product of the extents, or nullopt on std::size_t overflow. Zero if any extent is zero,
/// whatever the others are (numpy computes it in unbounded integers).
inline std::optional<std::size_t> element_count(std::span<const std::size_t> shape) {
    if (std::find(shape.begin(), shape.end(), std::size_t{0}) != shape.end()) return 0;
    std::size_t count = 1;
    for (std::size_t extent : shape) {
        if (count > std::numeric_limits<std::size_t>::max() / extent) return std::nullopt;
        count *= extent;
    }
    return count;
}

inline std::string shape_repr(std::span<const std::size_t> shape) {
    std::string out = "(";
    for (std::size_t i = 0; i < shape.size(); ++i) {
        if (i > 0) out += ", ";
        out += std::to_string(shape[i]);
    }
    if (shape.size() == 1) out += ",";
    out += ")";
    return out;
}

/// Checks that an array is writable/readable as it claims: supported descr, at most 64
/// dimensions, data length equal to size() * itemsize. Returns the dtype.
inline const dtype_info& check_array(const array& a, std::string_view source) {
    const dtype_info& info = lookup_dtype(a.descr, source, "descr");
    if (a.shape.size() > max_dimensions)
        fail(source, "shape", "at most " + std::to_string(max_dimensions) + " dimensions, got " +
                                  std::to_string(a.shape.size()));
    const std::optional<std::size_t> count = element_count(a.shape);
    if (!count || *count > std::numeric_limits<std::size_t>::max() / info.itemsize)
        fail(source, "shape", "element count overflows, got '" + quote_excerpt(shape_repr(a.shape)) + "'");
    if (a.data.size() != *count * info.itemsize)
        fail(source, "data", "holds " + std::to_string(a.data.size()) + " bytes, shape " +
                                 shape_repr(a.shape) + " of '" + std::string(info.descr) + "' needs " +
                                 std::to_string(*count * info.itemsize));
    return info;
}

inline std::uint64_t load_le(const std::byte* p, std::size_t n) {
    std::uint64_t bits = 0;
    for (std::size_t i = 0; i < n; ++i) bits |= std::uint64_t(std::to_integer<unsigned>(p[i])) << (8 * i);
    return bits;
}

inline void store_le(std::byte* p, std::uint64_t bits, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) p[i] = std::byte((bits >> (8 * i)) & 0xff);
}

/// The descriptor of each C++ element type make_array and to_vector accept.
template <class T>
inline constexpr std::string_view descr_of = "";
template <> inline constexpr std::string_view descr_of<double> = "<f8";
template <> inline constexpr std::string_view descr_of<float> = "<f4";
template <> inline constexpr std::string_view descr_of<bool> = "|b1";
template <> inline constexpr std::string_view descr_of<std::uint16_t> = "<u2";
template <> inline constexpr std::string_view descr_of<std::uint8_t> = "|u1";
template <> inline constexpr std::string_view descr_of<std::int8_t> = "|i1";
template <> inline constexpr std::string_view descr_of<std::int32_t> = "<i4";
template <> inline constexpr std::string_view descr_of<std::int64_t> = "<i8";

template <class T>
std::uint64_t to_bits(T value) {
    if constexpr (std::is_same_v<T, double>) return std::bit_cast<std::uint64_t>(value);
    else if constexpr (std::is_same_v<T, float>) return std::bit_cast<std::uint32_t>(value);
    else if constexpr (std::is_same_v<T, bool>) return value ? 1u : 0u;
    else return static_cast<std::uint64_t>(static_cast<std::make_unsigned_t<T>>(value));
}

template <class T>
T from_bits(std::uint64_t bits) {
    if constexpr (std::is_same_v<T, double>) return std::bit_cast<double>(bits);
    else if constexpr (std::is_same_v<T, float>) return std::bit_cast<float>(static_cast<std::uint32_t>(bits));
    else if constexpr (std::is_same_v<T, bool>) return bits != 0;
    else return static_cast<T>(static_cast<std::make_unsigned_t<T>>(bits));  // modular, C++20
}

/// Parser for the header dict. Positions index into `text`, the header without its final '\n'.
class header_parser {
public:
    header_parser(std::string_view text, std::string_view source) : text_(text), source_(source) {}

    array parse() {
        skip_spaces();
        if (peek() != '{')
            fail(source_, "header", "expected a Python dict literal starting with '{', got '" +
                                        quote_excerpt(text_.substr(pos_)) + "'");
        ++pos_;
        bool have_descr = false, have_fortran = false, have_shape = false;
        array result;
        while (true) {
            skip_spaces();
            if (peek() == '}') break;
            const std::size_t key_start = pos_;
            const std::optional<std::string_view> key = string_literal();
            if (!key)
                fail(source_, "header", "expected a quoted key or '}', got '" +
                                            quote_excerpt(text_.substr(key_start)) + "'");
            bool* seen = *key == "descr"           ? &have_descr
                         : *key == "fortran_order" ? &have_fortran
                         : *key == "shape"         ? &have_shape
                                                   : nullptr;
            if (!seen)
                fail(source_, "header", "unexpected key '" + quote_excerpt(*key) +
                                            "' (expected exactly 'descr', 'fortran_order', 'shape')");
            if (*seen) fail(source_, "header", "duplicate key '" + std::string(*key) + "'");
            *seen = true;
            skip_spaces();
            if (peek() != ':')
                fail(source_, "header", "expected ':' after key '" + std::string(*key) + "', got '" +
                                            quote_excerpt(text_.substr(pos_)) + "'");
            ++pos_;
            skip_spaces();
            if (*key == "descr") result.descr = descr_value();
            else if (*key == "fortran_order") fortran_order_value();
            else result.shape = shape_value();
            skip_spaces();
            if (peek() == ',') {
                ++pos_;
            } else if (peek() != '}') {
                fail(source_, "header", "expected ',' or '}' after the value of '" + std::string(*key) +
                                            "', got '" + quote_excerpt(text_.substr(pos_)) + "'");
            }
        }
        ++pos_;  // '}'
        skip_spaces();
        if (pos_ != text_.size())
            fail(source_, "header", "unexpected text after the dict: '" + quote_excerpt(text_.substr(pos_)) + "'");
        if (!have_descr) fail(source_, "header", "missing key 'descr'");
        if (!have_fortran) fail(source_, "header", "missing key 'fortran_order'");
        if (!have_shape) fail(source_, "header", "missing key 'shape'");
        return result;
    }

private:
    char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }

    void skip_spaces() {
        while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t')) ++pos_;
    }

    /// A single- or double-quoted string without escapes (no supported key or value has one).
    std::optional<std::string_view> string_literal() {
        const char quote = peek();
        if (quote != '\'' && quote != '"') return std::nullopt;
        const std::size_t end = text_.find(quote, pos_ + 1);
        if (end == std::string_view::npos) return std::nullopt;
        const std::string_view content = text_.substr(pos_ + 1, end - pos_ - 1);
        if (content.find('\\') != std::string_view::npos) return std::nullopt;
        pos_ = end + 1;
        return content;
    }

    /// The source text of the value starting at pos_, for error messages: up to the first ',' or
    /// '}' outside brackets and quotes.
    std::string_view raw_value() const {
        int depth = 0;
        char quote = 0;
        std::size_t i = pos_;
        for (; i < text_.size(); ++i) {
            const char c = text_[i];
            if (quote) {
                if (c == quote) quote = 0;
            } else if (c == '\'' || c == '"') {
                quote = c;
            } else if (c == '(' || c == '[' || c == '{') {
                ++depth;
            } else if (c == ')' || c == ']' || c == '}') {
                if (depth == 0) break;
                if (--depth == 0 && c == ')') {
                    ++i;
                    break;
                }
            } else if (c == ',' && depth == 0) {
                break;
            }
        }
        return text_.substr(pos_, i - pos_);
    }

    std::string descr_value() {
        const std::string_view raw = raw_value();
        const std::optional<std::string_view> value = string_literal();
        if (!value)
            fail(source_, "header field 'descr'",
                 "expected a string such as '<f8', got '" + quote_excerpt(raw) + "'");
        return std::string(lookup_dtype(*value, source_, "header field 'descr'").descr);
    }

    void fortran_order_value() {
        const std::string_view raw = raw_value();
        std::size_t end = pos_;
        while (end < text_.size() && ((text_[end] >= 'A' && text_[end] <= 'Z') ||
                                      (text_[end] >= 'a' && text_[end] <= 'z')))
            ++end;
        const std::string_view word = text_.substr(pos_, end - pos_);
        if (word == "True")
            fail(source_, "header field 'fortran_order'",
                 "Fortran-ordered arrays are unsupported, got 'True' (save with np.ascontiguousarray)");
        if (word != "False")
            fail(source_, "header field 'fortran_order'", "expected False, got '" + quote_excerpt(raw) + "'");
        pos_ = end;
    }

    std::vector<std::size_t> shape_value() {
        const std::string_view raw = raw_value();
        auto bad = [&](const std::string& why) -> void {
            fail(source_, "header field 'shape'",
                 why + ", got '" + quote_excerpt(raw) + "'");
        };
        const std::string expected = "expected a tuple of non-negative integers";
        std::vector<std::size_t> shape;
        if (peek() != '(') bad(expected);
        ++pos_;
        skip_spaces();
        bool trailing_comma = false;
        while (peek() != ')') {
            if (!(peek() >= '0' && peek() <= '9')) bad(expected);
            if (peek() == '0' && pos_ + 1 < text_.size() && text_[pos_ + 1] >= '0' && text_[pos_ + 1] <= '9')
                bad(expected + " (no leading zeros)");
            std::size_t extent = 0;
            while (peek() >= '0' && peek() <= '9') {
                const auto digit = static_cast<std::size_t>(peek() - '0');
                if (extent > (std::numeric_limits<std::size_t>::max() - digit) / 10)
                    bad("extent " + std::to_string(shape.size()) + " overflows std::size_t");
                extent = extent * 10 + digit;
                ++pos_;
            }
            if (shape.size() == max_dimensions)
                bad("more than " + std::to_string(max_dimensions) + " dimensions");
            shape.push_back(extent);
            skip_spaces();
            trailing_comma = false;
            if (peek() == ',') {
                ++pos_;
                trailing_comma = true;
                skip_spaces();
            } else if (peek() != ')') {
                bad(expected);
            }
        }
        // "(3)" is the integer 3 in Python, not a tuple.
        if (shape.size() == 1 && !trailing_comma) bad(expected + " (a 1-tuple needs a trailing comma)");
        ++pos_;  // ')'
        if (!element_count(shape)) bad("element count overflows std::size_t");
        return shape;
    }

    std::string_view text_;
    std::string_view source_;
    std::size_t pos_ = 0;
};

}  // namespace detail

inline std::size_t array::size() const {
    const std::optional<std::size_t> count = detail::element_count(shape);
    if (!count)
        detail::fail(detail::in_memory, "shape",
                     "element count overflows, got '" + detail::quote_excerpt(detail::shape_repr(shape)) + "'");
    return *count;
}

/// What a reader requires of a file before it allocates memory for its data (see read()).
/// Every requirement is checked against the header and the file's size, before the data block is
/// read, so a file that does not fit costs at most the 64 KiB header read, whatever it claims.
struct expectation {
    /// Accepted descriptors in canonical form ('<f8', '|b1', ...); empty: any supported one.
    std::vector<std::string> descrs;
    /// The exact shape; nullopt: any.
    std::optional<std::vector<std::size_t>> shape;
    /// Largest data block (bytes) the caller is willing to allocate.
    std::size_t max_data_bytes = std::numeric_limits<std::size_t>::max();
};

namespace detail {

/// The header of a file: descr and shape (data empty), where the data block starts and how long
/// the header says it is.
struct header_info {
    array meta;
    std::size_t data_offset = 0;
    std::size_t data_bytes = 0;
};

/// Parses the preamble and header from `prefix`, the first bytes of a file of `file_size` bytes
/// (prefix holds the whole file or at least its first 12 + max_header_length bytes), and checks
/// that the data block the header promises is exactly what the rest of the file holds.
inline header_info parse_header(std::span<const std::byte> bytes, std::uint64_t file_size, std::string_view source) {
    auto text_at = [&](std::size_t offset, std::size_t length) {
        return std::string_view(reinterpret_cast<const char*>(bytes.data()) + offset, length);
    };
    if (bytes.size() < 6 || text_at(0, 6) != magic)
        fail(source, "magic", "expected \"\\x93NUMPY\", got '" +
                                  quote_excerpt(text_at(0, std::min<std::size_t>(bytes.size(), 6))) +
                                  "' (not an .npy file)");
    if (bytes.size() < 8) fail(source, "version", "file ends after the magic, inside the version field");
    const unsigned major = std::to_integer<unsigned>(bytes[6]);
    const unsigned minor = std::to_integer<unsigned>(bytes[7]);
    if (!(major >= 1 && major <= 3 && minor == 0))
        fail(source, "version", "unsupported format version " + std::to_string(major) + "." +
                                    std::to_string(minor) + " (supported: 1.0, 2.0, 3.0)");
    const std::size_t length_bytes = major == 1 ? 2 : 4;
    const std::size_t preamble = 8 + length_bytes;
    if (bytes.size() < preamble)
        fail(source, "header length", "file ends after " + std::to_string(bytes.size()) +
                                          " bytes, inside the header length field");
    const std::uint64_t header_length = load_le(bytes.data() + 8, length_bytes);
    if (header_length > max_header_length)
        fail(source, "header length", "at most " + std::to_string(max_header_length) +
                                          " bytes expected, got " + std::to_string(header_length));
    if (header_length > file_size - preamble || header_length > bytes.size() - preamble)
        fail(source, "header length", "header claims " + std::to_string(header_length) +
                                          " bytes, the file holds only " +
                                          std::to_string(file_size - preamble) + " after the preamble");
    std::string_view header = text_at(preamble, static_cast<std::size_t>(header_length));
    if (header.empty() || header.back() != '\n')
        fail(source, "header", "not terminated by '\\n': '" + quote_excerpt(header.substr(header.size() > 60 ? header.size() - 60 : 0)) + "'");
    header.remove_suffix(1);
    while (!header.empty() && header.back() == ' ') header.remove_suffix(1);  // padding
    for (std::size_t i = 0; i < header.size(); ++i) {
        const auto c = static_cast<unsigned char>(header[i]);
        if (!((c >= 0x20 && c < 0x7f) || c == '\t'))
            fail(source, "header", "byte " + quote_excerpt(header.substr(i, 1)) + " at offset " +
                                       std::to_string(i) + " is not printable ASCII (the header is one line)");
    }

    header_info h;
    h.meta = header_parser(header, source).parse();
    const dtype_info& info = lookup_dtype(h.meta.descr, source, "header field 'descr'");
    const std::size_t count = *element_count(h.meta.shape);
    if (count > std::numeric_limits<std::size_t>::max() / info.itemsize)
        fail(source, "header field 'shape'", "element count times itemsize overflows std::size_t, got '" +
                                                 quote_excerpt(shape_repr(h.meta.shape)) + "'");
    h.data_bytes = count * info.itemsize;
    h.data_offset = preamble + static_cast<std::size_t>(header_length);
    const std::uint64_t held = file_size - h.data_offset;
    if (held != h.data_bytes)
        fail(source, "data", "file holds " + std::to_string(held) + " bytes, header promises " +
                                 std::to_string(h.data_bytes) + " (shape " + shape_repr(h.meta.shape) +
                                 " of '" + h.meta.descr + "')" +
                                 (held < h.data_bytes ? ", the file is truncated" : ", trailing bytes after the data"));
    return h;
}

/// Throws npy::error naming the header field unless `h` meets `want`.
inline void check_expectation(const header_info& h, const expectation& want, std::string_view source) {
    if (!want.descrs.empty() && std::find(want.descrs.begin(), want.descrs.end(), h.meta.descr) == want.descrs.end()) {
        std::string list;
        for (const std::string& d : want.descrs) list += (list.empty() ? "'" : ", '") + d + "'";
        fail(source, "header field 'descr'", "expected " + list + ", got '" + h.meta.descr + "'");
    }
    if (want.shape && h.meta.shape != *want.shape)
        fail(source, "header field 'shape'", "expected " + shape_repr(*want.shape) + ", got " + shape_repr(h.meta.shape));
    if (h.data_bytes > want.max_data_bytes)
        fail(source, "header field 'shape'", "the data block of " + std::to_string(h.data_bytes) +
                                                 " bytes exceeds the reader's limit of " +
                                                 std::to_string(want.max_data_bytes) + " bytes");
}

inline void check_bool_bytes(std::span<const std::byte> data, std::string_view source) {
    for (std::size_t i = 0; i < data.size(); ++i)
        if (std::to_integer<unsigned>(data[i]) > 1)
            fail(source, "data", "element " + std::to_string(i) + " of a '|b1' array is byte " +
                                     std::to_string(std::to_integer<unsigned>(data[i])) + ", expected 0 or 1");
}

}  // namespace detail

/// Where a file's data block lies, as read() finds it: the header's descr and shape (data empty),
/// the block's offset from the start of the file and its length in bytes.
struct layout {
    array meta;
    std::size_t data_offset = 0;
    std::size_t data_bytes = 0;
};

/// The most bytes the preamble and header can occupy: parse_layout needs this many (or the whole file).
inline constexpr std::size_t max_prefix_bytes = 12 + detail::max_header_length;

/// Parses the preamble and header in `prefix` (the first min(file_size, max_prefix_bytes) bytes of a
/// file of `file_size` bytes) with read()'s checks — the data block's length against the file's,
/// and `want` — for a reader that reads the data block itself. Throws npy::error as read() does.
inline layout parse_layout(std::span<const std::byte> prefix, std::uint64_t file_size, std::string_view source, const expectation& want = {}) {
    detail::header_info h = detail::parse_header(prefix, file_size, source);
    detail::check_expectation(h, want, source);
    return {std::move(h.meta), h.data_offset, h.data_bytes};
}

/// Parses the bytes of a complete .npy file. `source_name` (usually the path) prefixes every
/// error message. The returned descr is canonical ('|u1' for '<u1', '=u1', ...).
/// Throws npy::error on anything outside the contract in the file comment, or if the array does not
/// meet `want`; never reads out of bounds, whatever the bytes.
inline array parse(std::span<const std::byte> bytes, std::string_view source_name, const expectation& want = {}) {
    detail::header_info h = detail::parse_header(bytes, bytes.size(), source_name);
    detail::check_expectation(h, want, source_name);
    const auto data = bytes.subspan(h.data_offset);
    if (h.meta.descr == "|b1") detail::check_bool_bytes(data, source_name);
    h.meta.data.assign(data.begin(), data.end());
    return std::move(h.meta);
}

/// Reads and parses a .npy file. Errors name the path. Memory is bounded before it is spent:
/// - the path must be a regular file (after following symlinks): a directory, FIFO, socket or
///   device (/dev/zero, /dev/stdin) is refused before it is opened, so nothing blocks or streams
///   forever (a file swapped for a FIFO between the check and the open is not defended against);
/// - only the preamble and header (at most 12 + 64 KiB) are read before the header has been
///   checked against the file's size and against `want` (descr, shape, byte cap);
/// - then exactly the promised data block is allocated and read, and the file must end there (a
///   file that grows while being read is an error, not a larger allocation).
inline array read(const std::filesystem::path& path, const expectation& want = {});

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

inline array read(const std::filesystem::path& path, const expectation& want) {
    namespace fs = std::filesystem;
    const std::string source = path.string();
    std::error_code ec;
    const fs::file_status status = fs::status(path, ec);
    if (ec || !fs::exists(status)) detail::fail(source, "file", "cannot open for reading");
    if (fs::is_directory(status)) detail::fail(source, "file", "is a directory");
    if (!fs::is_regular_file(status))
        detail::fail(source, "file", "not a regular file (a FIFO, socket or device is refused)");
    const std::uintmax_t file_size = fs::file_size(path, ec);
    if (ec) detail::fail(source, "file", "cannot read its size: " + ec.message());
    std::ifstream in(path, std::ios::binary);
    if (!in) detail::fail(source, "file", "cannot open for reading");
    const std::size_t prefix_size =
        static_cast<std::size_t>(std::min<std::uintmax_t>(file_size, 12 + detail::max_header_length));
    std::vector<std::byte> prefix(prefix_size);
    in.read(reinterpret_cast<char*>(prefix.data()), static_cast<std::streamsize>(prefix_size));
    if (static_cast<std::size_t>(in.gcount()) != prefix_size)
        detail::fail(source, "file", "read error (the file shrank while being read)");
    detail::header_info h = detail::parse_header(prefix, file_size, source);
    detail::check_expectation(h, want, source);
    h.meta.data.resize(h.data_bytes);
    const std::size_t in_prefix = std::min(prefix_size - std::min(prefix_size, h.data_offset), h.data_bytes);
    if (in_prefix) std::copy_n(prefix.begin() + static_cast<std::ptrdiff_t>(h.data_offset), in_prefix, h.meta.data.begin());
    const std::size_t rest = h.data_bytes - in_prefix;
    if (rest) {
        in.read(reinterpret_cast<char*>(h.meta.data.data() + in_prefix), static_cast<std::streamsize>(rest));
        if (static_cast<std::size_t>(in.gcount()) != rest)
            detail::fail(source, "file", "read error (the file shrank while being read)");
    }
    if (in.peek() != std::char_traits<char>::eof())
        detail::fail(source, "data", "trailing bytes after the data (the file grew while being read)");
    if (h.meta.descr == "|b1") detail::check_bool_bytes(h.meta.data, source);
    return std::move(h.meta);
}

/// The bytes of a version 1.0 .npy file holding `a`, laid out as np.save lays it out: the dict
/// text "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }" exactly as numpy writes
/// it, padded with spaces so that preamble + header is a multiple of 64 bytes, ending in '\n'
/// (numpy >= 1.23 may pad with up to 64 more spaces; readers do not care). Throws npy::error if `a` is
/// inconsistent (unsupported descr, data length not size() * itemsize, '|b1' byte not 0 or 1).
inline std::vector<std::byte> serialize(const array& a) {
    const detail::dtype_info& info = detail::check_array(a, detail::in_memory);
    if (info.kind == 'b') {
        for (std::size_t i = 0; i < a.data.size(); ++i)
            if (std::to_integer<unsigned>(a.data[i]) > 1)
                detail::fail(detail::in_memory, "data", "element " + std::to_string(i) +
                                                            " of a '|b1' array is not 0 or 1");
    }
    std::string header = "{'descr': '" + std::string(info.descr) + "', 'fortran_order': False, 'shape': " +
                         detail::shape_repr(a.shape) + ", }";
    constexpr std::size_t preamble = 10;  // magic, version 1.0, uint16 header length
    const std::size_t unpadded = preamble + header.size() + 1;
    header.append((64 - unpadded % 64) % 64, ' ');
    header += '\n';
    // 64 dimensions of 20 digits each stay far below the uint16 limit.
    std::vector<std::byte> out;
    out.reserve(preamble + header.size() + a.data.size());
    for (char c : detail::magic) out.push_back(std::byte(static_cast<unsigned char>(c)));
    out.push_back(std::byte{1});
    out.push_back(std::byte{0});
    out.push_back(std::byte(header.size() & 0xff));
    out.push_back(std::byte(header.size() >> 8));
    for (char c : header) out.push_back(std::byte(static_cast<unsigned char>(c)));
    out.insert(out.end(), a.data.begin(), a.data.end());
    return out;
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
