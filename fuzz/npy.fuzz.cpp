// libFuzzer target for attnref::npy::parse. Any input must either parse or throw npy::error;
// anything else (a crash, a sanitizer report, another exception) is a bug. A parsed array must
// also survive serialize -> parse unchanged, and the typed accessors must not misbehave on it.
// The same bytes are also parsed with an expectation (npy::expectation: descr, shape, byte cap),
// which must either refuse them or return an array meeting it, and the streaming reader's header
// parser is run on a 64 KiB prefix with a larger claimed file size (as npy::read does).

#include <attnref/io/npy.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    namespace npy = attnref::npy;
    const auto bytes = std::as_bytes(std::span(data, size));
    try {
        const npy::expectation want{{"<f8", "<f4"}, std::vector<std::size_t>{2, 3}, 48};
        const npy::array a = npy::parse(bytes, "fuzz-input", want);
        if ((a.descr != "<f8" && a.descr != "<f4") || a.shape != *want.shape || a.data.size() > 48) std::abort();
    } catch (const npy::error&) {
    }
    try {
        const auto h = npy::detail::parse_header(bytes.first(std::min<std::size_t>(size, 12 + 65536)), std::uint64_t{size} + 7, "fuzz-input");
        if (h.data_offset + h.data_bytes != size + 7) std::abort();
    } catch (const npy::error&) {
    }
    npy::array parsed;
    try {
        parsed = npy::parse(std::as_bytes(std::span(data, size)), "fuzz-input");
    } catch (const npy::error&) {
        return 0;
    }
    const npy::array again = npy::parse(npy::serialize(parsed), "round-trip");
    if (again.descr != parsed.descr || again.shape != parsed.shape || again.data != parsed.data) std::abort();
    try {
        (void)npy::to_double(parsed);  // throws only for '<i8' values no double holds exactly
    } catch (const npy::error&) {
        if (parsed.descr != "<i8") std::abort();
    }
    return 0;
}
