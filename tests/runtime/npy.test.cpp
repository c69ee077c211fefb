#define BOOST_TEST_MODULE npy
#include <boost/test/unit_test.hpp>

#include <attnref/io/npy.hpp>

#include "attnref/golden/sha256.hpp"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <bit>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace npy = attnref::npy;
namespace fs = std::filesystem;
namespace utf = boost::unit_test;

namespace {

std::vector<std::byte> bytes_of(std::string_view text) {
    const auto* first = reinterpret_cast<const std::byte*>(text.data());
    return {first, first + text.size()};
}

std::string string_of(std::span<const std::byte> bytes) {
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

/// A file with the given version, header text (used verbatim, caller supplies the '\n') and data;
/// the header length field holds `header.size()` unless `claimed_length` is given.
std::vector<std::byte> raw_file(unsigned major, unsigned minor, std::string_view header, std::string_view data,
                                std::optional<std::uint32_t> claimed_length = std::nullopt) {
    std::string out = "\x93NUMPY";
    out += static_cast<char>(major);
    out += static_cast<char>(minor);
    const std::uint32_t length = claimed_length.value_or(static_cast<std::uint32_t>(header.size()));
    const int length_bytes = major == 1 ? 2 : 4;
    for (int i = 0; i < length_bytes; ++i) out += static_cast<char>((length >> (8 * i)) & 0xff);
    out += header;
    out += data;
    return bytes_of(out);
}

/// Version 1.0 file with `dict` as the header dict, padded numpy-style, and `data`.
std::vector<std::byte> file_with(std::string_view dict, std::string_view data) {
    std::string header(dict);
    header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
    header += '\n';
    return raw_file(1, 0, header, data);
}

/// A version 1.0 file whose header dict holds these value texts verbatim, in numpy's key order.
std::vector<std::byte> header_file(std::string_view descr, std::string_view fortran_order, std::string_view shape,
                                   std::string_view data) {
    std::string dict = "{'descr': ";
    dict += descr;
    dict += ", 'fortran_order': ";
    dict += fortran_order;
    dict += ", 'shape': ";
    dict += shape;
    dict += ", }";
    return file_with(dict, data);
}

std::string zeros(std::size_t n) { return std::string(n, '\0'); }

/// parse must throw npy::error with a one-line message starting with the source name and
/// containing `fragment`.
void check_rejected(const std::vector<std::byte>& bytes, std::string_view fragment) {
    try {
        npy::parse(bytes, "case.npy");
        BOOST_ERROR("accepted a file that should fail with '" << fragment << "'");
    } catch (const npy::error& e) {
        const std::string message = e.what();
        BOOST_TEST_INFO("message: " << message);
        BOOST_TEST(message.find(fragment) != std::string::npos, "expected fragment: " << fragment);
        BOOST_TEST(message.find('\n') == std::string::npos);
        BOOST_TEST(message.rfind("case.npy: ", 0) == 0);
    }
}

std::string message_of(const std::vector<std::byte>& bytes, std::string_view source) {
    try {
        npy::parse(bytes, source);
    } catch (const npy::error& e) {
        return e.what();
    }
    return "(accepted)";
}

const std::vector<std::string> all_descrs{"<f8", "<f4", "<f2", "<u2", "|u1", "|i1", "<i4", "<i8", "|b1"};

std::size_t itemsize_of(const std::string& descr) { return static_cast<std::size_t>(descr.back() - '0'); }

/// An array whose bytes follow a fixed pattern (0/1 for '|b1'), for round trips.
npy::array patterned(const std::string& descr, std::vector<std::size_t> shape) {
    npy::array a{descr, std::move(shape), {}};
    a.data.resize(a.size() * itemsize_of(descr));
    for (std::size_t i = 0; i < a.data.size(); ++i)
        a.data[i] = std::byte(descr == "|b1" ? i % 2 : (i * 37 + 11) & 0xff);
    return a;
}

bool same(const npy::array& a, const npy::array& b) {
    return a.descr == b.descr && a.shape == b.shape && a.data == b.data;
}

bool same_double(double a, double b) {
    return (std::isnan(a) && std::isnan(b)) || std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}

fs::path scratch(const std::string& name) {
    const fs::path dir = fs::path(ATTNREF_BINARY_DIR) / "npy-test" / name;
    fs::remove_all(dir);
    fs::create_directories(dir);
    return dir;
}

std::vector<std::string> listing(const fs::path& dir) {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

void write_text(const fs::path& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
}

std::string read_text(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}

constexpr const char* python = "/usr/bin/python3";

struct numpy_available {
    boost::test_tools::assertion_result operator()(utf::test_unit_id) const {
        const std::string command = std::string(python) + " -c 'import numpy' > /dev/null 2>&1";
        boost::test_tools::assertion_result result(std::system(command.c_str()) == 0);
        if (!result) result.message() << "skipped: " << python << " cannot import numpy";
        return result;
    }
};

int run_python(const fs::path& script, const fs::path& dir) {
    const std::string command = std::string(python) + " '" + script.string() + "' '" + dir.string() + "'";
    return std::system(command.c_str());
}

}  // namespace

BOOST_AUTO_TEST_SUITE(round_trip)

BOOST_AUTO_TEST_CASE(every_descr_and_shape_in_memory_and_on_disk) {
    const fs::path dir = scratch("round_trip");
    const std::vector<std::vector<std::size_t>> shapes{{}, {0}, {3}, {2, 3}, {2, 0, 4}, {1, 1, 1, 1}, {5, 1, 7}};
    for (const std::string& descr : all_descrs) {
        for (const auto& shape : shapes) {
            const npy::array original = patterned(descr, shape);
            BOOST_TEST_CONTEXT(descr << " " << original.shape.size() << "-d, " << original.size() << " elements") {
                const npy::array parsed = npy::parse(npy::serialize(original), "memory");
                BOOST_TEST(same(parsed, original));
                const fs::path path = dir / "a.npy";
                npy::write(path, original);
                BOOST_TEST(same(npy::read(path), original));
                BOOST_TEST((listing(dir) == std::vector<std::string>{"a.npy"}));
                // read_double (straight into doubles for '<f8', read + to_double otherwise): the same
                // bits as to_double of the original, or the same refusal.
                std::optional<std::vector<double>> want;
                try {
                    want = npy::to_double(original);
                } catch (const npy::error&) {
                }
                if (want) {
                    const std::vector<double> got = npy::read_double(path);
                    BOOST_TEST_REQUIRE(got.size() == want->size());
                    for (std::size_t n = 0; n < got.size(); ++n)
                        BOOST_TEST(std::bit_cast<std::uint64_t>(got[n]) == std::bit_cast<std::uint64_t>((*want)[n]));
                } else {
                    BOOST_CHECK_THROW(npy::read_double(path), npy::error);
                }
            }
        }
    }
}

BOOST_AUTO_TEST_CASE(header_is_written_as_numpy_writes_it) {
    const auto check = [](const npy::array& a, std::string_view dict) {
        const std::string text = string_of(npy::serialize(a));
        BOOST_TEST(text.substr(0, 8) == std::string_view("\x93NUMPY\x01\x00", 8));
        const std::size_t header_length = static_cast<unsigned char>(text[8]) + 256u * static_cast<unsigned char>(text[9]);
        BOOST_TEST((10 + header_length) % 64 == 0u);
        const std::string header = text.substr(10, header_length);
        BOOST_TEST(header.substr(0, dict.size()) == dict);
        BOOST_TEST(header.back() == '\n');
        BOOST_TEST(header.find_first_not_of(' ', dict.size()) == header_length - 1);
        BOOST_TEST(text.size() == 10 + header_length + a.data.size());
    };
    check(patterned("<f8", {2, 3}), "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }");
    check(patterned("<f4", {3}), "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }");
    check(patterned("|b1", {}), "{'descr': '|b1', 'fortran_order': False, 'shape': (), }");
    check(patterned("<i8", {0, 5}), "{'descr': '<i8', 'fortran_order': False, 'shape': (0, 5), }");
    check(patterned("|u1", std::vector<std::size_t>(64, 1)),
          "{'descr': '|u1', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, "
          "1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, "
          "1, 1, 1, 1, 1, 1, 1), }");
}

BOOST_AUTO_TEST_CASE(accepted_header_spellings) {
    const std::string data = zeros(48);
    const std::vector<std::string> dicts{
        "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }",
        "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3)}",
        "{'shape': (2, 3), 'descr': '<f8', 'fortran_order': False}",
        "{\"fortran_order\": False, \"shape\": (2, 3), \"descr\": \"<f8\"}",
        "{'descr':'<f8','fortran_order':False,'shape':(2,3)}",
        "  {  'descr' :  '<f8' ,\t'fortran_order' : False , 'shape' : ( 2 , 3 , ) , }  ",
    };
    for (const std::string& dict : dicts) {
        BOOST_TEST_CONTEXT(dict) {
            const npy::array a = npy::parse(file_with(dict, data), "ok.npy");
            BOOST_TEST(a.descr == "<f8");
            BOOST_TEST((a.shape == std::vector<std::size_t>{2, 3}));
        }
    }
    // No padding at all, and numpy < 1.9's 16-byte alignment: alignment is not checked on read.
    const std::string dict = "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }";
    BOOST_TEST(npy::parse(raw_file(1, 0, dict + "\n", data), "ok.npy").size() == 6u);
    BOOST_TEST(npy::parse(raw_file(1, 0, dict + "   \n", data), "ok.npy").size() == 6u);
    // Versions 2.0 and 3.0 differ only in the 4-byte length.
    BOOST_TEST(npy::parse(raw_file(2, 0, dict + "\n", data), "ok.npy").size() == 6u);
    BOOST_TEST(npy::parse(raw_file(3, 0, dict + "\n", data), "ok.npy").size() == 6u);
}

BOOST_AUTO_TEST_CASE(one_byte_types_accept_every_byte_order_mark) {
    for (std::string type : {"u1", "i1", "b1"}) {
        for (char order : {'<', '>', '=', '|'}) {
            const std::string dict = "{'descr': '" + std::string(1, order) + type + "', 'fortran_order': False, 'shape': (2,), }";
            const npy::array a = npy::parse(file_with(dict, zeros(2)), "ok.npy");
            BOOST_TEST(a.descr == "|" + type);
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(malformed)

const std::string good_dict = "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }";

BOOST_AUTO_TEST_CASE(magic_and_version) {
    check_rejected({}, "magic: expected");
    check_rejected(bytes_of("\x93NUM"), "magic: expected");
    check_rejected(bytes_of("PK\x03\x04 this is a zip file"), "not an .npy file");
    std::vector<std::byte> bad_magic = file_with(good_dict, zeros(48));
    bad_magic[5] = std::byte{'X'};
    check_rejected(bad_magic, "magic: expected");
    check_rejected(bytes_of("\x93NUMPY"), "version: file ends");
    check_rejected(raw_file(4, 0, good_dict + "\n", zeros(48)), "version: unsupported format version 4.0");
    check_rejected(raw_file(1, 1, good_dict + "\n", zeros(48)), "version: unsupported format version 1.1");
    check_rejected(raw_file(0, 0, good_dict + "\n", zeros(48)), "version: unsupported format version 0.0");
    check_rejected(bytes_of(std::string_view("\x93NUMPY\x02\x00\x10\x00", 10)), "header length: file ends");
    check_rejected(bytes_of(std::string_view("\x93NUMPY\x01\x00\x10", 9)), "header length: file ends");
}

BOOST_AUTO_TEST_CASE(header_length) {
    // Lying upwards: more header than file.
    check_rejected(raw_file(1, 0, good_dict + "\n", "", 500), "header length: header claims 500 bytes, the file holds only");
    // Absurd: over 64 KiB (version 2.0 can say up to 4 GiB).
    check_rejected(raw_file(2, 0, good_dict + "\n", zeros(48), 70000), "header length: at most 65536 bytes expected, got 70000");
    check_rejected(raw_file(2, 0, good_dict + "\n", zeros(48), 0xffffffffu), "header length: at most");
    // Lying downwards: the header is cut short inside the dict.
    check_rejected(raw_file(1, 0, good_dict + "\n", zeros(48), 20), "header: not terminated by '\\n'");
    check_rejected(raw_file(1, 0, "", "", 0), "header: not terminated by '\\n'");
}

BOOST_AUTO_TEST_CASE(header_structure) {
    check_rejected(raw_file(1, 0, good_dict + "     ", zeros(48)), "header: not terminated by '\\n'");
    check_rejected(file_with("[1, 2]", ""), "header: expected a Python dict literal starting with '{', got '[1, 2]");
    check_rejected(file_with("", ""), "header: expected a Python dict literal");
    check_rejected(file_with("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), ", zeros(48)), "header: expected a quoted key or '}'");
    check_rejected(file_with("{'descr': '<f8', 'fortran_order': False}", ""), "header: missing key 'shape'");
    check_rejected(file_with("{'fortran_order': False, 'shape': (2, 3)}", zeros(48)), "header: missing key 'descr'");
    check_rejected(file_with("{'descr': '<f8', 'shape': (2, 3)}", zeros(48)), "header: missing key 'fortran_order'");
    check_rejected(file_with("{}", ""), "header: missing key 'descr'");
    check_rejected(file_with("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), 'extra': 1}", zeros(48)),
                   "header: unexpected key 'extra'");
    check_rejected(file_with("{'descr': '<f8', 'descr': '<f8', 'fortran_order': False, 'shape': (2, 3)}", zeros(48)),
                   "header: duplicate key 'descr'");
    check_rejected(file_with("{'descr' '<f8', 'fortran_order': False, 'shape': (2, 3)}", zeros(48)), "header: expected ':' after key 'descr'");
    check_rejected(file_with("{'descr': '<f8' 'fortran_order': False, 'shape': (2, 3)}", zeros(48)),
                   "header: expected ',' or '}' after the value of 'descr'");
    check_rejected(file_with("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3),, }", zeros(48)), "header: expected a quoted key");
    check_rejected(file_with("{descr: '<f8', 'fortran_order': False, 'shape': (2, 3)}", zeros(48)), "header: expected a quoted key");
    check_rejected(file_with("{'descr: '<f8', 'fortran_order': False, 'shape': (2, 3)}", zeros(48)), "header: unexpected key 'descr: '");
    check_rejected(file_with(good_dict + " x", zeros(48)), "header: unexpected text after the dict: 'x'");
    check_rejected(file_with(good_dict + "}", zeros(48)), "header: unexpected text after the dict");
    check_rejected(raw_file(1, 0, "{'descr': '<f8',\n 'fortran_order': False, 'shape': (2, 3)}\n", zeros(48)),
                   "header: byte \\x0a at offset 16 is not printable ASCII");
    check_rejected(file_with("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), '\xc3\xa9': 1}", zeros(48)),
                   "header: byte \\xc3");
    check_rejected(file_with(std::string("{'descr': '<f8'\0", 16), zeros(48)), "header: byte \\x00");
}

BOOST_AUTO_TEST_CASE(descr_and_fortran_order) {
    const std::vector<std::pair<std::string, std::string>> descr_cases{
        {"'>f8'", "header field 'descr': big-endian data is unsupported, got '>f8'"},
        {"'>i4'", "header field 'descr': big-endian data is unsupported"},
        {"'=f8'", "header field 'descr': byte order '=' does not say the byte order"},
        {"'|f8'", "header field 'descr': byte order '|'"},
        {"[('a', '<f8')]", "header field 'descr': expected a string such as '<f8', got '[('a', '<f8')]'"},
        {"8", "header field 'descr': expected a string such as '<f8', got '8'"},
    };
    for (const auto& [descr, fragment] : descr_cases) check_rejected(header_file(descr, "False", "(2, 3)", zeros(48)), fragment);
    for (std::string descr : {"<c16", "|O", "<U3", "<f16", "f8", "<", "", "<u4", "|S1", "<i2"})
        check_rejected(header_file("'" + descr + "'", "False", "(2, 3)", zeros(48)),
                       "header field 'descr': unsupported dtype '" + descr + "' (supported:");
    const std::vector<std::pair<std::string, std::string>> fortran_cases{
        {"True", "header field 'fortran_order': Fortran-ordered arrays are unsupported"},
        {"0", "header field 'fortran_order': expected False, got '0'"},
        {"Falsey", "header field 'fortran_order': expected False, got 'Falsey'"},
        {"'False'", "header field 'fortran_order': expected False, got ''False''"},
    };
    for (const auto& [fortran_order, fragment] : fortran_cases)
        check_rejected(header_file("'<f8'", fortran_order, "(2, 3)", zeros(48)), fragment);
}

BOOST_AUTO_TEST_CASE(shape) {
    const auto with_shape = [](std::string_view shape, std::string_view data = "") {
        return header_file("'<f8'", "False", shape, data);
    };
    // The exact message, as promised in npy.hpp.
    BOOST_TEST(message_of(with_shape("(3, -1)"), "golden/x/output.npy") ==
               "golden/x/output.npy: header field 'shape': expected a tuple of non-negative integers, got '(3, -1)'");
    check_rejected(with_shape("(3)", zeros(24)), "(a 1-tuple needs a trailing comma), got '(3)'");
    check_rejected(with_shape("3"), "expected a tuple of non-negative integers, got '3'");
    check_rejected(with_shape("[2, 3]"), "expected a tuple of non-negative integers, got '[2, 3]'");
    check_rejected(with_shape("(2.5,)"), "expected a tuple of non-negative integers, got '(2.5,)'");
    check_rejected(with_shape("(+2,)"), "expected a tuple of non-negative integers");
    check_rejected(with_shape("(0x2,)"), "expected a tuple of non-negative integers");
    check_rejected(with_shape("(2L,)"), "expected a tuple of non-negative integers");
    check_rejected(with_shape("(,)"), "expected a tuple of non-negative integers");
    check_rejected(with_shape("(2 3)"), "expected a tuple of non-negative integers");
    check_rejected(with_shape("(2, 3"), "expected a tuple of non-negative integers");
    check_rejected(with_shape("(03,)"), "no leading zeros");
    check_rejected(with_shape("(99999999999999999999999,)"), "extent 0 overflows std::size_t");
    check_rejected(with_shape("(18446744073709551616,)"), "extent 0 overflows std::size_t");
    check_rejected(with_shape("(4294967296, 4294967296)"), "header field 'shape': element count overflows std::size_t");
    check_rejected(with_shape("(4611686018427387904, 4)"), "header field 'shape': element count overflows");
    check_rejected(with_shape("(2305843009213693952, 4)"), "element count times itemsize overflows std::size_t");
    // A huge but representable promise is checked against the file, never allocated.
    check_rejected(with_shape("(1000000000000,)"), "data: file holds 0 bytes, header promises 8000000000000");
    // A zero extent makes the count zero whatever the others are.
    BOOST_TEST(npy::parse(with_shape("(18446744073709551615, 0)"), "ok.npy").size() == 0u);
    std::string many = "(";
    for (int i = 0; i < 65; ++i) many += "1, ";
    check_rejected(with_shape(many + ")", zeros(8)), "more than 64 dimensions");
}

BOOST_AUTO_TEST_CASE(data_length_and_content) {
    const std::string truncated =
        message_of(file_with("{'descr': '<f8', 'fortran_order': False, 'shape': (3, 4), }", zeros(80)), "golden/x/output.npy");
    BOOST_TEST(truncated.rfind("golden/x/output.npy: data: file holds 80 bytes, header promises 96", 0) == 0u, truncated);
    check_rejected(file_with("{'descr': '<f8', 'fortran_order': False, 'shape': (3, 4), }", zeros(80)),
                   "data: file holds 80 bytes, header promises 96 (shape (3, 4) of '<f8'), the file is truncated");
    check_rejected(file_with(good_dict, zeros(47)), "data: file holds 47 bytes, header promises 48");
    check_rejected(file_with(good_dict, ""), "data: file holds 0 bytes, header promises 48");
    check_rejected(file_with(good_dict, zeros(49)), "data: file holds 49 bytes, header promises 48 (shape (2, 3) of '<f8'), trailing bytes");
    check_rejected(file_with("{'descr': '<f8', 'fortran_order': False, 'shape': (), }", zeros(16)), "header promises 8");
    check_rejected(file_with("{'descr': '<f8', 'fortran_order': False, 'shape': (0,), }", "x"), "data: file holds 1 bytes, header promises 0");
    check_rejected(file_with("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", std::string("\x01\x00\x02", 3)),
                   "data: element 2 of a '|b1' array is byte 2, expected 0 or 1");
}

BOOST_AUTO_TEST_CASE(messages_of_untrusted_text_stay_on_one_short_line) {
    const std::string junk(5000, '\x07');
    check_rejected(file_with("{'descr': '" + junk + "', 'fortran_order': False, 'shape': (2, 3), }", zeros(48)),
                   "header: byte \\x07");
    const std::string long_key(5000, 'k');
    try {
        npy::parse(file_with("{'" + long_key + "': 1}", ""), "case.npy");
        BOOST_ERROR("accepted");
    } catch (const npy::error& e) {
        BOOST_TEST(std::string_view(e.what()).size() < 300u);
    }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(conversions)

BOOST_AUTO_TEST_CASE(half_to_double_is_exact) {
    const std::vector<std::uint16_t> halves{0x0000, 0x8000, 0x3c00, 0xc000, 0x7bff, 0x0001, 0x03ff, 0x0400, 0x3555,
                                            0x7c00, 0xfc00};
    const std::vector<double> expected{0.0, -0.0, 1.0, -2.0, 65504.0, 0x1p-24, 1023 * 0x1p-24, 0x1p-14, 0.333251953125,
                                       INFINITY, -INFINITY};
    npy::array a{"<f2", {halves.size()}, {}};
    for (std::uint16_t h : halves) {
        a.data.push_back(std::byte(h & 0xff));
        a.data.push_back(std::byte(h >> 8));
    }
    const std::vector<double> got = npy::to_double(a);
    for (std::size_t i = 0; i < halves.size(); ++i)
        BOOST_TEST(same_double(got[i], expected[i]), "half 0x" << std::hex << halves[i] << " -> " << got[i]);
    npy::array nans{"<f2", {2}, {std::byte{0x00}, std::byte{0x7e}, std::byte{0x01}, std::byte{0xfc}}};
    const std::vector<double> nan_values = npy::to_double(nans);
    BOOST_TEST(std::isnan(nan_values[0]));
    BOOST_TEST(std::isnan(nan_values[1]));
    BOOST_TEST(std::signbit(nan_values[1]));
}

BOOST_AUTO_TEST_CASE(make_array_and_typed_access) {
    const std::vector<double> f8{0.5, -1.25, 1e300, -0.0, 3, 4};
    const npy::array a = npy::make_array("<f8", {2, 3}, f8);
    BOOST_TEST(npy::to_double(a) == f8);
    BOOST_TEST(npy::to_vector<double>(a) == f8);
    const std::vector<float> f4{0.1f, -2.0f};
    BOOST_TEST(npy::to_double(npy::make_array("<f4", {2}, f4)) == (std::vector<double>{double(0.1f), -2.0}));
    const std::vector<std::uint16_t> u2{0, 1, 65535};
    BOOST_TEST(npy::to_double(npy::make_array("<u2", {3}, u2)) == (std::vector<double>{0, 1, 65535}));
    const std::vector<std::uint8_t> u1{0, 7, 255};
    BOOST_TEST(npy::to_uint8(npy::make_array("|u1", {3}, u1)) == u1);
    BOOST_TEST(npy::make_array("<u1", {3}, u1).descr == "|u1");
    const std::vector<std::int64_t> i8{-(std::int64_t(1) << 53), -1, 0, std::int64_t(1) << 62, INT64_MIN};
    const npy::array ints = npy::make_array("<i8", {5}, i8);
    BOOST_TEST(npy::to_vector<std::int64_t>(ints) == i8);
    BOOST_TEST(npy::to_double(ints) == (std::vector<double>{-0x1p53, -1, 0, 0x1p62, -0x1p63}));
    const std::vector<std::int8_t> i1{-128, -1, 127};
    BOOST_TEST(npy::to_double(npy::make_array("|i1", {3}, i1)) == (std::vector<double>{-128, -1, 127}));
    const std::vector<std::int32_t> i4{INT32_MIN, INT32_MAX};
    BOOST_TEST(npy::to_double(npy::make_array("<i4", {2}, i4)) == (std::vector<double>{-2147483648.0, 2147483647.0}));

    const std::vector<bool> mask{true, false, false, true};
    const npy::array m = npy::make_array("|b1", {2, 2}, mask);
    BOOST_TEST(npy::to_bool(m) == mask);
    BOOST_TEST(npy::to_uint8(m) == (std::vector<std::uint8_t>{1, 0, 0, 1}));
    BOOST_TEST(npy::to_double(m) == (std::vector<double>{1, 0, 0, 1}));
    const std::array<bool, 2> plain_bools{false, true};
    BOOST_TEST(npy::to_bool(npy::make_array("|b1", {2}, plain_bools)) == (std::vector<bool>{false, true}));
    BOOST_TEST(npy::to_bool(npy::make_array("|b1", {2}, std::vector<std::uint8_t>{1, 0})) == (std::vector<bool>{true, false}));
    BOOST_TEST(npy::make_array("<f8", {}, std::vector<double>{2.5}).size() == 1u);
    BOOST_TEST(npy::make_array("<f8", {0, 3}, std::vector<double>{}).data.empty());
}

BOOST_AUTO_TEST_CASE(inconsistent_arrays_are_rejected) {
    const auto fails_with = [](auto&& action, std::string_view fragment) {
        try {
            action();
            BOOST_ERROR("no error; expected '" << fragment << "'");
        } catch (const npy::error& e) {
            BOOST_TEST(std::string(e.what()).find(fragment) != std::string::npos, e.what());
        }
    };
    fails_with([] { npy::make_array("<f4", {1}, std::vector<double>{1}); }, "'<f4' does not match the element type, '<f8' expected");
    fails_with([] { npy::make_array("<f8", {2, 2}, std::vector<double>{1, 2, 3}); }, "3 values, shape (2, 2) needs 4");
    fails_with([] { npy::make_array("|b1", {1}, std::vector<std::uint8_t>{2}); }, "value 0 of a '|b1' array is 2");
    fails_with([] { npy::make_array(">f8", {1}, std::vector<double>{1}); }, "big-endian");
    fails_with([] { npy::make_array("<f8", {1}, std::vector<bool>{true}); }, "'|b1' expected");
    fails_with([] { npy::serialize(npy::array{"<f8", {2}, std::vector<std::byte>(15)}); }, "data: holds 15 bytes, shape (2,) of '<f8' needs 16");
    fails_with([] { npy::serialize(npy::array{"<c8", {}, {}}); }, "unsupported dtype '<c8'");
    fails_with([] { npy::serialize(npy::array{"|b1", {1}, {std::byte{3}}}); }, "not 0 or 1");
    fails_with([] { npy::serialize(npy::array{"|u1", std::vector<std::size_t>(65, 1), {std::byte{3}}}); }, "at most 64 dimensions");
    fails_with([] { (void)npy::array{"<f8", {std::size_t(1) << 40, std::size_t(1) << 40}, {}}.size(); }, "element count overflows");
    fails_with([] { npy::to_double(npy::make_array("<i8", {1}, std::vector<std::int64_t>{(std::int64_t(1) << 53) + 1})); },
               "element 0 (9007199254740993) of a '<i8' array is not exactly a double");
    fails_with([] { npy::to_double(npy::make_array("<i8", {1}, std::vector<std::int64_t>{INT64_MAX})); }, "not exactly a double");
    fails_with([] { npy::to_bool(npy::make_array("|u1", {1}, std::vector<std::uint8_t>{1})); }, "expected '|b1'");
    fails_with([] { npy::to_uint8(npy::make_array("|i1", {1}, std::vector<std::int8_t>{1})); }, "expected '|b1' or '|u1'");
    fails_with([] { npy::to_vector<float>(npy::make_array("<f8", {1}, std::vector<double>{1})); }, "expected '<f4', got '<f8'");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(atomic_write)

BOOST_AUTO_TEST_CASE(overwrite_replaces_the_file_and_leaves_no_temporary) {
    const fs::path dir = scratch("overwrite");
    const fs::path path = dir / "x.npy";
    npy::write(path, patterned("<f8", {100}));
    npy::write(path, patterned("|u1", {3}));
    BOOST_TEST(same(npy::read(path), patterned("|u1", {3})));
    BOOST_TEST((listing(dir) == std::vector<std::string>{"x.npy"}));
}

BOOST_AUTO_TEST_CASE(failures_leave_no_partial_target_and_no_temporary) {
    const fs::path dir = scratch("failures");
    const npy::array a = patterned("<f8", {4});
    const auto fails_with = [&](const fs::path& path, std::string_view fragment) {
        try {
            npy::write(path, a);
            BOOST_ERROR("write to " << path << " succeeded");
        } catch (const npy::error& e) {
            const std::string message = e.what();
            BOOST_TEST(message.find(fragment) != std::string::npos, message);
            BOOST_TEST(message.rfind(path.string(), 0) == 0u, message);
        }
    };
    // Target is a directory (non-empty, so rename could not replace it either).
    fs::create_directories(dir / "is_dir.npy");
    write_text(dir / "is_dir.npy" / "keep", "keep");
    fails_with(dir / "is_dir.npy", "file: is a directory");
    BOOST_TEST(fs::is_directory(dir / "is_dir.npy"));
    BOOST_TEST(read_text(dir / "is_dir.npy" / "keep") == "keep");
    // Parent directory missing, or a regular file.
    fails_with(dir / "missing" / "x.npy", "cannot create a temporary file");
    write_text(dir / "plain", "plain");
    fails_with(dir / "plain" / "x.npy", "cannot create a temporary file");
    BOOST_TEST((listing(dir) == std::vector<std::string>{"is_dir.npy", "plain"}));
    // Serialization failures happen before anything touches the disk.
    try {
        npy::write(dir / "bad.npy", npy::array{"<f8", {2}, {}});
        BOOST_ERROR("inconsistent array written");
    } catch (const npy::error&) {
    }
    BOOST_TEST(!fs::exists(dir / "bad.npy"));
    BOOST_TEST((listing(dir) == std::vector<std::string>{"is_dir.npy", "plain"}));
}

BOOST_AUTO_TEST_CASE(read_only_directory_keeps_the_old_target) {
    const fs::path dir = scratch("read_only");
    const fs::path path = dir / "x.npy";
    npy::write(path, patterned("<f8", {4}));
    fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read | fs::perms::others_read);
    // Permission bits do not bind root: find out whether this process can still create files here.
    const bool enforced = !std::ofstream(dir / "probe");
    fs::remove(dir / "probe");
    if (enforced) {
        try {
            npy::write(path, patterned("|u1", {3}));
            BOOST_ERROR("write into a read-only directory succeeded");
        } catch (const npy::error& e) {
            BOOST_TEST(std::string(e.what()).find("cannot create a temporary file") != std::string::npos, e.what());
        }
        BOOST_TEST(same(npy::read(path), patterned("<f8", {4})));
    } else {
        BOOST_TEST_MESSAGE("skipped the read-only directory check: permission bits are not enforced for this user");
    }
    fs::permissions(dir, fs::perms::owner_all);
    BOOST_TEST((listing(dir) == std::vector<std::string>{"x.npy"}));
}

BOOST_AUTO_TEST_CASE(read_errors_name_the_file) {
    const fs::path dir = scratch("read_errors");
    try {
        npy::read(dir / "absent.npy");
        BOOST_ERROR("read a missing file");
    } catch (const npy::error& e) {
        BOOST_TEST(std::string(e.what()) == (dir / "absent.npy").string() + ": file: cannot open for reading");
    }
    try {
        npy::read(dir);
        BOOST_ERROR("read a directory");
    } catch (const npy::error& e) {
        BOOST_TEST(std::string(e.what()).find("is a directory") != std::string::npos);
    }
    write_text(dir / "short.npy", "\x93NUMPY\x01");
    try {
        npy::read(dir / "short.npy");
        BOOST_ERROR("read a truncated file");
    } catch (const npy::error& e) {
        BOOST_TEST(std::string(e.what()) == (dir / "short.npy").string() + ": version: file ends after the magic, inside the version field");
    }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(numpy_interop, *utf::precondition(numpy_available()))

// numpy writes, we read: every dtype, a scalar, a zero-size array, versions 2.0 and 3.0. For each
// case numpy also stores the C-order bytes (.bin), descr and shape (.meta) and the values as '<f8'
// (_as_f8.npy), so that both the raw bytes and our exact conversion to double are checked.
BOOST_AUTO_TEST_CASE(files_numpy_writes_parse_to_the_same_values) {
    const fs::path dir = scratch("numpy_writes");
    write_text(dir / "make.py", R"(import sys
import numpy as np
from numpy.lib import format as npformat

d = sys.argv[1]
rng = np.random.default_rng(20240611)
special32 = np.array([0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 1.17549435e-38, 3.4028235e38], dtype=np.float32)
cases = {
    'f8': rng.standard_normal((3, 4, 5)),
    'f4': np.concatenate([rng.standard_normal(500).astype(np.float32), special32]).reshape(4, -1),
    'f2_all': np.arange(65536, dtype=np.uint16).view(np.float16),
    'b1': rng.random((7, 9)) < 0.5,
    'u1': np.arange(256, dtype=np.uint8).reshape(16, 16),
    'i1': np.arange(-128, 128, dtype=np.int8),
    'u2': np.arange(0, 65536, 257, dtype=np.uint16),
    'i4': np.array([-2**31, -1, 0, 1, 2**31 - 1], dtype=np.int32),
    'i8': np.array([-2**63, -2**53, -1, 0, 2**53, 2**62], dtype=np.int64),
    'scalar': np.array(3.5),
    'empty': np.zeros((0, 3)),
    'empty_b1': np.zeros((2, 0), dtype=bool),
}
for name, a in cases.items():
    np.save(f'{d}/{name}.npy', a)
    np.save(f'{d}/{name}_as_f8.npy', a.astype(np.float64))
    open(f'{d}/{name}.bin', 'wb').write(a.tobytes())
    open(f'{d}/{name}.meta', 'w').write(a.dtype.str + ' ' + ' '.join(map(str, a.shape)))
for version in [(2, 0), (3, 0)]:
    name = f'v{version[0]}'
    a = rng.standard_normal((2, 3)).astype(np.float32)
    with open(f'{d}/{name}.npy', 'wb') as f:
        npformat.write_array(f, a, version=version)
    np.save(f'{d}/{name}_as_f8.npy', a.astype(np.float64))
    open(f'{d}/{name}.bin', 'wb').write(a.tobytes())
    open(f'{d}/{name}.meta', 'w').write(a.dtype.str + ' ' + ' '.join(map(str, a.shape)))
)");
    BOOST_REQUIRE(run_python(dir / "make.py", dir) == 0);
    int cases = 0;
    for (const auto& entry : fs::directory_iterator(dir)) {
        if (entry.path().extension() != ".meta") continue;
        ++cases;
        const std::string name = entry.path().stem().string();
        BOOST_TEST_CONTEXT(name) {
            std::istringstream meta(read_text(entry.path()));
            std::string descr;
            meta >> descr;
            std::vector<std::size_t> shape;
            for (std::size_t extent; meta >> extent;) shape.push_back(extent);
            const npy::array a = npy::read(dir / (name + ".npy"));
            BOOST_TEST(a.descr == descr);
            BOOST_TEST(a.shape == shape);
            BOOST_TEST(string_of(a.data) == read_text(dir / (name + ".bin")));
            const std::vector<double> ours = npy::to_double(a);
            const std::vector<double> theirs = npy::to_double(npy::read(dir / (name + "_as_f8.npy")));
            BOOST_REQUIRE(ours.size() == theirs.size());
            std::size_t mismatches = 0;
            for (std::size_t i = 0; i < ours.size(); ++i) mismatches += !same_double(ours[i], theirs[i]);
            BOOST_TEST(mismatches == 0u);
            if (name == "v2" || name == "v3") {
                const std::string text = read_text(dir / (name + ".npy"));
                BOOST_TEST(int(text[6]) == (name == "v2" ? 2 : 3));
            }
        }
    }
    BOOST_TEST(cases == 14);
}

// We write, numpy reads: np.load must see the same dtype, shape and bytes, a version 1.0 file
// whose data starts on a 64-byte boundary, and a header numpy itself would write.
BOOST_AUTO_TEST_CASE(files_we_write_load_in_numpy) {
    const fs::path dir = scratch("we_write");
    const std::vector<std::vector<std::size_t>> shapes{{}, {0}, {3}, {2, 3}, {2, 0, 4}};
    int index = 0;
    for (const std::string& descr : all_descrs) {
        for (const auto& shape : shapes) {
            const npy::array a = patterned(descr, shape);
            std::string name = "case";
            name += std::to_string(index++);
            npy::write(dir / (name + ".npy"), a);
            write_text(dir / (name + ".bin"), string_of(a.data));
            std::string meta = descr;
            for (std::size_t extent : shape) {
                meta += ' ';
                meta += std::to_string(extent);
            }
            write_text(dir / (name + ".meta"), meta);
        }
    }
    npy::write(dir / "values.npy", npy::make_array("<f8", {2, 2}, std::vector<double>{0.1, -2.5, 1e-310, 7}));
    write_text(dir / "check.py", R"(import sys, glob, os, ast
import numpy as np
from numpy.lib import format as npformat

d = sys.argv[1]
failures = 0
metas = sorted(glob.glob(f'{d}/case*.meta'))
for meta in metas:
    base = meta[:-5]
    fields = open(meta).read().split()
    descr, shape = fields[0], tuple(int(x) for x in fields[1:])
    a = np.load(base + '.npy', allow_pickle=False)
    with open(base + '.npy', 'rb') as f:
        version = npformat.read_magic(f)
        header_shape, fortran, dtype = npformat.read_array_header_1_0(f)
        offset = f.tell()
    ok = (a.dtype.str == descr and a.shape == shape and a.tobytes() == open(base + '.bin', 'rb').read()
          and version == (1, 0) and offset % 64 == 0 and not fortran and a.flags.c_contiguous)
    if not ok:
        failures += 1
        print('mismatch', base, a.dtype.str, descr, a.shape, shape, version, offset)
v = np.load(f'{d}/values.npy')
if not (v.dtype == np.float64 and v.shape == (2, 2) and v.ravel().tolist() == [0.1, -2.5, 1e-310, 7.0]):
    failures += 1
    print('values mismatch', v)
print(f'{len(metas)} files checked, {failures} failures')
sys.exit(1 if failures or len(metas) != 45 else 0)
)");
    BOOST_TEST(run_python(dir / "check.py", dir) == 0);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(sha256)

// FIPS 180-2 / NIST CSRC example vectors.
BOOST_AUTO_TEST_CASE(nist_vectors) {
    using attnref::golden::sha256_hex;
    const auto hash = [](std::string_view text) { return sha256_hex(std::as_bytes(std::span(text.data(), text.size()))); };
    BOOST_TEST(hash("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    BOOST_TEST(hash("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    BOOST_TEST(hash("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
               "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    BOOST_TEST(hash(std::string(1000000, 'a')) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

BOOST_AUTO_TEST_CASE(file_digest_matches_memory_digest) {
    const fs::path dir = scratch("sha256");
    std::string text;
    for (int i = 0; i < 200000; ++i) text += static_cast<char>((i * 131 + 7) & 0xff);  // spans several read blocks
    write_text(dir / "blob", text);
    BOOST_TEST(attnref::golden::sha256_file(dir / "blob") == attnref::golden::sha256_hex(bytes_of(text)));
    write_text(dir / "empty", "");
    BOOST_TEST(attnref::golden::sha256_file(dir / "empty") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    BOOST_CHECK_THROW(attnref::golden::sha256_file(dir / "absent"), std::runtime_error);
    BOOST_CHECK_THROW(attnref::golden::sha256_file(dir), std::runtime_error);
}

BOOST_AUTO_TEST_SUITE_END()
