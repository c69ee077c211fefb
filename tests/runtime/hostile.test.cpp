#define BOOST_TEST_MODULE hostile
// Unit tests for the hostile-input defences (docs/hostile.md): bounded npy reads, checked tensor sizes,
// exact masks at extreme offsets, and golden/safe_io.hpp (regular files, symlink escapes, JSON
// pre-pass, atomic no-clobber writes). The CLI-level probes are tests/hostile/hostile.py.
#include <boost/test/unit_test.hpp>

#include <attnref/core/mask.hpp>
#include <attnref/io/npy.hpp>
#include <attnref/core/tensor.hpp>

#include "attnref/golden/manifest.hpp"
#include "attnref/golden/safe_io.hpp"
#include "attnref/golden/sha256.hpp"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <sys/stat.h>

namespace npy = attnref::npy;
namespace fs = std::filesystem;
namespace v = attnref::golden;

namespace {

fs::path scratch(const std::string& name) {
    const fs::path dir = fs::path(ATTNREF_BINARY_DIR) / "hostile-test" / name;
    fs::remove_all(dir);
    fs::create_directories(dir);
    return dir;
}

void write_text(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::string read_text(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// A version 1.0 header (padded to 64 bytes, '\n'-terminated) for `dict`, without data.
std::string header(const std::string& dict) {
    std::string h = dict;
    h.append((64 - (10 + h.size() + 1) % 64) % 64, ' ');
    h += '\n';
    std::string out = "\x93NUMPY\x01";
    out += '\0';
    out += static_cast<char>(h.size() & 0xff);
    out += static_cast<char>(h.size() >> 8);
    return out + h;
}

template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const std::exception& e) {
        return e.what();
    }
    return "(no error)";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

BOOST_AUTO_TEST_SUITE(npy_reads_are_bounded)

// A sparse 16 GiB file whose header is consistent with its size: the expectation refuses it from
// the header alone (before the fix, read() pulled all 16 GiB into memory first).
BOOST_AUTO_TEST_CASE(expectation_is_checked_before_allocating) {
    const fs::path dir = scratch("sparse");
    const fs::path p = dir / "big.npy";
    const std::string h = header("{'descr': '<f8', 'fortran_order': False, 'shape': (2147483648,), }");
    write_text(p, h);
    fs::resize_file(p, h.size() + (std::uintmax_t{2147483648} * 8));
    const std::string shape_error = error_of([&] { npy::read(p, npy::expectation{{"<f8"}, std::vector<std::size_t>{4}}); });
    BOOST_TEST(shape_error == p.string() + ": header field 'shape': expected (4,), got (2147483648,)");
    const std::string cap_error = error_of([&] { npy::read(p, npy::expectation{{}, std::nullopt, 1 << 20}); });
    BOOST_TEST(contains(cap_error, "exceeds the reader's limit of 1048576 bytes"));
    const std::string descr_error = error_of([&] { npy::read(p, npy::expectation{{"<f4", "<u2"}, std::nullopt}); });
    BOOST_TEST(descr_error == p.string() + ": header field 'descr': expected '<f4', '<u2', got '<f8'");
}

BOOST_AUTO_TEST_CASE(non_regular_files_are_refused_without_blocking) {
    const fs::path dir = scratch("fifo");
    const fs::path fifo = dir / "fifo.npy";
    BOOST_REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    // Before the fix, opening the FIFO blocked forever (no writer).
    BOOST_TEST(error_of([&] { npy::read(fifo); }) == fifo.string() + ": file: not a regular file (a FIFO, socket or device is refused)");
    BOOST_TEST(contains(error_of([] { npy::read("/dev/zero"); }), "not a regular file"));
    BOOST_TEST(contains(error_of([&] { v::sha256_file(fifo); }), "not a regular file"));
}

BOOST_AUTO_TEST_CASE(streamed_read_equals_parse) {
    const fs::path dir = scratch("stream");
    // Larger than the 64 KiB header prefix, so the data is read in two parts.
    std::vector<double> values(20000);
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = 0.5 * static_cast<double>(i) - 7;
    const npy::array a = npy::make_array("<f8", {100, 200}, values);
    npy::write(dir / "a.npy", a);
    const npy::array b = npy::read(dir / "a.npy", npy::expectation{{"<f8"}, std::vector<std::size_t>{100, 200}});
    BOOST_TEST((b.shape == a.shape && b.descr == a.descr && b.data == a.data));
    std::ofstream(dir / "a.npy", std::ios::binary | std::ios::app) << 'x';
    BOOST_TEST(contains(error_of([&] { npy::read(dir / "a.npy"); }), "trailing bytes after the data"));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(sizes_never_wrap)

BOOST_AUTO_TEST_CASE(tensor_extents_products_are_checked) {
    const std::size_t big = std::size_t{1} << 32;
    // 2^32 · 2^32 = 2^64 wraps to 0: before the fix this built an empty tensor silently.
    BOOST_CHECK_THROW((attnref::tensor<double, 2>({big, big})), attnref::shape_error);
    BOOST_CHECK_THROW(attnref::element_count<3>({big, big, 3}), attnref::shape_error);
    BOOST_TEST(attnref::element_count<3>({big, big, 0}) == 0u);  // an empty axis makes it 0, as numpy
    BOOST_TEST(attnref::element_count<2>({big, big - 1}) == big * (big - 1));
}

// Causal with diagonal_offset = 2^63 − 1 attends to every key (diagonal(i) = i + 2^63 − 1 ≥ j for
// all j); before the fix i + offset overflowed (UB) and masked keys at random.
BOOST_AUTO_TEST_CASE(masks_are_exact_at_extreme_offsets) {
    attnref::mask_options m;
    m.causal = true;
    m.diagonal_offset = std::numeric_limits<std::ptrdiff_t>::max();
    for (std::size_t i = 0; i < 4; ++i)
        for (std::size_t j = 0; j < 4; ++j) BOOST_TEST(!attnref::structurally_masked(m, 0, 0, i, j, 4, 4));
    // Bottom-right with Sk − Sq = −3 from the most negative offset: diagonal < 0, every key masked.
    m.alignment = attnref::causal_alignment::bottom_right;
    m.diagonal_offset = std::numeric_limits<std::ptrdiff_t>::min();
    BOOST_TEST(attnref::structurally_masked(m, 0, 0, 3, 0, 4, 1));
    // Window of SIZE_MAX keys to the left of a diagonal at 2^63 − 1 + i: left edge = i + 2^63 − 1 −
    // (2^64 − 1) = i − 2^63 < 0, so key 0 is inside; right edge 0 keys after: j ≤ diagonal.
    m.causal = false;
    m.alignment = attnref::causal_alignment::top_left;
    m.diagonal_offset = std::numeric_limits<std::ptrdiff_t>::max();
    m.window = attnref::sliding_window{std::numeric_limits<std::size_t>::max(), 0};
    BOOST_TEST(!attnref::structurally_masked(m, 0, 0, 0, 0, 2, 2));
    // The diagonal itself saturates at ±2^62, so diagonal − j never overflows for callers.
    BOOST_TEST(attnref::diagonal(m, 1, 2, 2) == std::ptrdiff_t{1} << 62);
}

BOOST_AUTO_TEST_CASE(checked_arithmetic) {
    BOOST_TEST(!v::checked_mul(std::uint64_t{1} << 32, std::uint64_t{1} << 32).has_value());
    BOOST_TEST(*v::checked_mul(3, 5) == 15u);
    BOOST_TEST(!v::checked_add(UINT64_MAX, 1).has_value());
    BOOST_TEST(v::parse_memory_size("8G", "--max-memory") == std::uint64_t{8} << 30);
    BOOST_TEST(v::parse_memory_size("1000", "--max-memory") == 1000u);
    for (const char* bad : {"-1", "", "0", "5X", "99999999999999999999", "20000000000T"})
        BOOST_TEST(contains(error_of([&] { v::parse_memory_size(bad, "--max-memory"); }), "--max-memory"), bad);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(safe_io)

BOOST_AUTO_TEST_CASE(json_prepass) {
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    BOOST_TEST(contains(error_of([&] { v::json_prepass(deep, "f.json"); }), "f.json: field '[0][0][0]"));
    BOOST_TEST(contains(error_of([&] { v::json_prepass(deep, "f.json"); }), "nested deeper than 64 levels"));
    // Depth 64 itself is fine (a manifest needs 5).
    BOOST_TEST(error_of([] { v::json_prepass(std::string(64, '[') + std::string(64, ']'), "f"); }) == "(no error)");
    BOOST_TEST(error_of([] { v::json_prepass(R"({"a": {"b": 1, "b": 2}})", "f.json"); }) ==
               "f.json: field 'a.b': duplicate key (each key may appear once in an object)");
    BOOST_TEST(error_of([] { v::json_prepass(R"({"a": [1, {"c": 1, "c": 1}]})", "f.json"); }) ==
               "f.json: field 'a[1].c': duplicate key (each key may appear once in an object)");
    BOOST_TEST(error_of([] { v::json_prepass(std::string("{}\0{}", 5), "f.json"); }) == "f.json: byte 2: NUL byte in a JSON text (refused)");
    // Syntax errors are left to the parser proper.
    BOOST_TEST(error_of([] { v::json_prepass("{", "f"); }) == "(no error)");
    // ...which reports them, deep or not, as one line naming the file.
    BOOST_TEST(contains(error_of([&] { v::parse_suite(deep, "s.json"); }), "s.json: field"));
}

BOOST_AUTO_TEST_CASE(printable_escapes_control_characters) {
    BOOST_TEST(v::printable("a\nb\tc\x1b[0m\\") == "a\\nb\\tc\\x1b[0m\\\\");
    BOOST_TEST(v::printable(std::string("x\0y", 3)) == "x\\x00y");
}

BOOST_AUTO_TEST_CASE(regular_files_and_symlink_escapes) {
    const fs::path dir = scratch("links");
    const fs::path cased = dir / "case";
    fs::create_directories(cased);
    write_text(dir / "outside.npy", "secret");
    write_text(cased / "inside.npy", "ok");
    fs::create_symlink(dir / "outside.npy", cased / "away.npy");
    fs::create_symlink("inside.npy", cased / "near.npy");
    fs::create_symlink("/dev/zero", cased / "zero.npy");
    BOOST_TEST(v::require_regular_file(cased / "near.npy", "t", cased) == 2u);
    BOOST_TEST(contains(error_of([&] { v::require_regular_file(cased / "away.npy", "t", cased); }), "outside the case directory"));
    BOOST_TEST(contains(error_of([&] { v::require_regular_file(cased / "zero.npy", "t", cased); }), "outside the case directory"));
    BOOST_TEST(contains(error_of([&] { v::require_regular_file(cased / "zero.npy", "t"); }), "not a regular file"));
    // Without a case directory, a link to a regular file is just that file.
    BOOST_TEST(v::require_regular_file(cased / "away.npy", "t") == 6u);
    BOOST_TEST(contains(error_of([] { v::read_file_capped("/dev/zero", 100); }), "not a regular file"));
    write_text(dir / "big.json", std::string(101, ' '));
    BOOST_TEST(contains(error_of([&] { v::read_file_capped(dir / "big.json", 100); }), "above the limit of 100 bytes"));
    BOOST_TEST(v::read_file_capped(dir / "big.json", 101).size() == 101u);
}

BOOST_AUTO_TEST_CASE(atomic_writes_never_clobber_without_overwrite) {
    const fs::path dir = scratch("writes");
    write_text(dir / "r.json", "old");
    BOOST_TEST(contains(error_of([&] { v::write_file_atomic(dir / "r.json", "new", false); }), "exists; not overwritten"));
    BOOST_TEST(read_text(dir / "r.json") == "old");
    v::write_file_atomic(dir / "r.json", "new", true);
    BOOST_TEST(read_text(dir / "r.json") == "new");
    v::write_file_atomic(dir / "fresh.json", "x", false);
    BOOST_TEST(read_text(dir / "fresh.json") == "x");
    BOOST_TEST(contains(error_of([&] { v::write_file_atomic(dir / "no" / "such.json", "x", true); }), "cannot create a temporary"));
    std::size_t files = 0;
    for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file();
    BOOST_TEST(files == 2u);  // no temporary left behind
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(manifest_strictness)

std::string committed(const std::string& name) { return read_text(fs::path(ATTNREF_SOURCE_DIR) / "golden" / name / "manifest.json"); }

void replace_once(std::string& text, const std::string& from, const std::string& to) {
    const std::size_t at = text.find(from);
    BOOST_REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
}

BOOST_AUTO_TEST_CASE(committed_manifests_parse) {
    for (const auto& e : fs::directory_iterator(fs::path(ATTNREF_SOURCE_DIR) / "golden"))
        if (e.is_directory()) BOOST_TEST(error_of([&] { v::parse_manifest(committed(e.path().filename()), "m"); }) == "(no error)", e.path());
}

BOOST_AUTO_TEST_CASE(tensor_fields_are_checked_against_the_case) {
    std::string text = committed("sdpa_basic");
    std::string garbage = text;
    replace_once(garbage, "\"dtype\": \"<f8\"", "\"dtype\": \"garbage\"");
    BOOST_TEST(contains(error_of([&] { v::parse_manifest(garbage, "m.json"); }), "m.json: field 'tensors[0].dtype': expected '<f8'"));
    std::string i4 = text;
    replace_once(i4, "\"file\": \"output.npy\",\n      \"dtype\": \"<f8\"", "\"file\": \"output.npy\",\n      \"dtype\": \"<i4\"");
    BOOST_TEST(contains(error_of([&] { v::parse_manifest(i4, "m.json"); }), ".dtype': expected '<f8' for role 'output'"));
    std::string nul = text;
    replace_once(nul, "\"file\": \"output.npy\"", "\"file\": \"out\\u0000put.npy\"");
    BOOST_TEST(contains(error_of([&] { v::parse_manifest(nul, "m.json"); }), ".file': expected a plain file name"));
}

BOOST_AUTO_TEST_CASE(memory_estimate_names_the_field) {
    v::manifest m = v::parse_manifest(committed("sdpa_basic"), "m");
    m.spec.shapes.query_length = m.spec.shapes.key_length = 25000;
    // weights alone: 4 copies × 25000² × 8 bytes = 20 GB > 4 GiB.
    BOOST_TEST(v::case_memory_estimate(m.spec) >= std::uint64_t{4} * 25000 * 25000 * 8);
    BOOST_TEST(contains(error_of([&] { v::check_case_memory(m.spec, "m.json"); }), "m.json: field 'shapes': the case would need about"));
    v::set_max_memory(std::uint64_t{128} << 30);
    BOOST_TEST(error_of([&] { v::check_case_memory(m.spec, "m.json"); }) == "(no error)");
    v::set_max_memory(v::default_max_memory());
}

BOOST_AUTO_TEST_SUITE_END()
