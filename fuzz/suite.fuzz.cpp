// libFuzzer target for attnref::golden::parse_suite (golden/suite.json's strict reader, with the
// JSON pre-pass of include/attnref/golden/safe_io.hpp: NUL bytes, depth, duplicate keys). Any input must either
// parse or throw golden::data_error; anything else (a crash, a sanitizer report, another
// exception) is a bug. For every accepted case the memory estimate must not overflow (it
// saturates), and a case under the default limit must have a well-formed tensor list; the case
// written back as JSON must parse to the same JSON.

#include "attnref/golden/manifest.hpp"
#include "attnref/golden/safe_io.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    namespace v = attnref::golden;
    const std::string text(reinterpret_cast<const char*>(data), size);
    std::vector<v::case_spec> cases;
    try {
        cases = v::parse_suite(text, "fuzz-input/suite.json");
    } catch (const v::data_error&) {
        return 0;
    }
    for (const v::case_spec& c : cases) {
        if (v::case_memory_estimate(c) > v::min_default_max_memory) continue;
        for (const v::expected_tensor& t : v::expected_tensors(c))
            if (t.dtype.empty() || t.shape.empty()) std::abort();
        nlohmann::ordered_json suite{{"schema", v::suite_schema}, {"schema_version", v::schema_version}, {"cases", {v::to_json(c)}}};
        const std::vector<v::case_spec> again = v::parse_suite(suite.dump(), "round-trip");
        if (again.size() != 1 || v::to_json(again[0]) != v::to_json(c)) std::abort();
    }
    return 0;
}
