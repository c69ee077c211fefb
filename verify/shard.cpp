/// Sharded generation: case assignment and shard.json (see shard.hpp).
#include "shard.hpp"

#include <algorithm>
#include <numeric>

#include "attnref/golden/safe_io.hpp"

namespace attnref::verify {

using namespace attnref::golden;

shard_id parse_shard(const std::string& text, const std::string& flag) {
    const std::size_t slash = text.find('/');
    auto number = [&](const std::string& s) -> std::size_t {
        if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string::npos)
            throw data_error("command line: " + flag + ": expected I/N with 0 <= I < N <= 100000, got '" + printable(text) + "'");
        return static_cast<std::size_t>(std::stoul(s));
    };
    if (slash == std::string::npos)
        throw data_error("command line: " + flag + ": expected I/N with 0 <= I < N <= 100000, got '" + printable(text) + "'");
    const shard_id s{number(text.substr(0, slash)), number(text.substr(slash + 1))};
    if (s.count == 0 || s.count > 100000 || s.index >= s.count)
        throw data_error("command line: " + flag + ": expected I/N with 0 <= I < N <= 100000, got '" + printable(text) + "'");
    return s;
}

double case_cost(const case_spec& s) {
    const case_shapes& d = s.shapes;
    double c = double(d.batch) * d.heads * d.query_length * d.key_length * (d.head_dim_qk + d.head_dim_v);
    if (s.kind == case_kind::mha)
        c += double(d.batch) * d.model_dim *
                 (d.query_length * d.heads * d.head_dim_qk + d.key_length * d.kv_heads * (d.head_dim_qk + d.head_dim_v)) +
             double(d.batch) * d.query_length * d.heads * d.head_dim_v * d.output_dim;
    return c;
}

std::vector<std::size_t> shard_cases(const std::vector<case_spec>& cases, shard_id s) {
    std::vector<std::size_t> order(cases.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return case_cost(cases[a]) > case_cost(cases[b]); });
    std::vector<double> load(s.count, 0.0);
    std::vector<std::size_t> mine;
    for (std::size_t i : order) {
        const std::size_t target = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
        load[target] += case_cost(cases[i]) + 1;  // + 1: empty-cost cases still spread
        if (target == s.index) mine.push_back(i);
    }
    std::sort(mine.begin(), mine.end());
    return mine;
}

std::string shard_text(const shard_record& r) {
    nlohmann::ordered_json j{{"schema", shard_schema},       {"schema_version", 1},     {"suite_sha256", r.suite_sha256},
                             {"selection", r.selection},     {"shard", r.shard.index}, {"shards", r.shard.count},
                             {"cases", r.cases}};
    return j.dump(2) + "\n";
}

shard_record read_shard(const std::filesystem::path& dir) {
    const std::string file = (dir / shard_file).string();
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) throw data_error(dir.string() + ": not a shard directory");
    if (!std::filesystem::exists(dir / shard_file, ec))
        throw data_error(file + ": missing (the shard is incomplete or not a shard directory)");
    const std::string text = read_file_capped(file, max_json_bytes, dir);
    json_prepass(text, file);
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        throw data_error(file + ": not valid JSON: " + printable(e.what()));
    }
    auto field = [&](const char* name) -> const nlohmann::json& {
        if (!j.is_object() || !j.contains(name)) throw data_error(file + ": field '" + name + "': missing");
        return j.at(name);
    };
    auto names = [&](const char* name) {
        const nlohmann::json& v = field(name);
        if (!v.is_array()) throw data_error(file + ": field '" + name + "': expected an array of case names");
        std::vector<std::string> r;
        for (const nlohmann::json& x : v) {
            if (!x.is_string()) throw data_error(file + ": field '" + name + "': expected an array of case names");
            r.push_back(x.get<std::string>());
        }
        return r;
    };
    auto count = [&](const char* name) {
        const nlohmann::json& v = field(name);
        if (!v.is_number_unsigned()) throw data_error(file + ": field '" + name + "': expected a non-negative integer");
        return v.get<std::size_t>();
    };
    for (const auto& [key, value] : j.items())
        if (key != "schema" && key != "schema_version" && key != "suite_sha256" && key != "selection" && key != "shard" &&
            key != "shards" && key != "cases")
            throw data_error(file + ": field '" + printable(key) + "': unknown field");
    if (field("schema") != shard_schema) throw data_error(file + ": field 'schema': expected \"attnref.shard\"");
    if (field("schema_version") != 1) throw data_error(file + ": field 'schema_version': expected 1");
    if (!field("suite_sha256").is_string()) throw data_error(file + ": field 'suite_sha256': expected a string");
    shard_record r{field("suite_sha256").get<std::string>(), names("selection"), {count("shard"), count("shards")}, names("cases")};
    if (r.shard.count == 0 || r.shard.index >= r.shard.count)
        throw data_error(file + ": field 'shard': expected 0 <= shard < shards");
    return r;
}

}  // namespace attnref::verify
