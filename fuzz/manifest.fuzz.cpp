// libFuzzer target for attnref::golden::parse_manifest, the strict golden-case manifest parser
// (include/attnref/golden/manifest.hpp, header-only). Any input must either parse or throw
// golden::data_error, the parser's one documented error; anything else (a crash, a sanitizer
// report, another exception such as one of nlohmann::json's) is a bug. A parsed manifest must also
// survive manifest_text -> parse_manifest -> manifest_text unchanged.

#include "attnref/golden/manifest.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    namespace v = attnref::golden;
    const std::string text(reinterpret_cast<const char*>(data), size);
    v::manifest parsed;
    try {
        parsed = v::parse_manifest(text, "fuzz-input/manifest.json");
    } catch (const v::data_error&) {
        return 0;
    }
    // What the parser accepted, written back in canonical form, must parse to the same thing.
    const std::string canonical = v::manifest_text(parsed);
    if (v::manifest_text(v::parse_manifest(canonical, "round-trip")) != canonical) std::abort();
    return 0;
}
