// libFuzzer target for attnref::npy::parse. Any input must either parse or throw npy::error;
// anything else (a crash, a sanitizer report, another exception) is a bug. A parsed array must
// also survive serialize -> parse unchanged, and the typed accessors must not misbehave on it.

#include <attnref/npy.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    namespace npy = attnref::npy;
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
