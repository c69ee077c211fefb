#pragma once
/// \file io/npy_format.hpp
/// Owns: the .npy format in memory — the dtype table, the header parser and its checks, parse()
/// (bytes → npy::array) and serialize() (npy::array → bytes) — standard library only, no file
/// I/O. npy.hpp (which includes this header) reads and writes files and converts elements; its
/// file comment states what is accepted and why (NEP 1, numpy/lib/format.py).

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "attnref/core/binary_format.hpp"

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

}  // namespace attnref::npy
