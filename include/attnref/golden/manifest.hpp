#pragma once
/// \file golden/manifest.hpp
/// Owns golden case descriptions' JSON — the one strict reader (parse_manifest, parse_suite) and
/// the enum names both ways (kind_name …, from_name); the writer (to_json, manifest_text) is
/// golden/manifest_writer.hpp — for the suite file (golden/suite.json, schema "attnref.suite") and
/// the per-case manifest (golden/<case>/manifest.json, schema "attnref.golden"), both written as
/// version 2 and read in versions 1 and 2 (version 1 has no gradients), both documented field by
/// field in golden/README.md. The case types are golden/case_spec.hpp's, the tensors a case implies
/// golden/layout.hpp's (views of problem.hpp's role table), its memory estimate golden/memory.hpp's.
///
/// Parsing is strict: unknown fields, wrong types and out-of-range values are errors, and every
/// error is one line naming the file and the field, e.g.
///     golden/x/manifest.json: field 'shapes.heads': expected a positive integer, got -1
/// In a suite, omitted fields take the defaults documented in golden/README.md; in a manifest every
/// field must be present. A manifest's inputs.generator is "splitmix64-v1" or, for a case made from
/// the user's files (`attnref generate --inputs-from`, user_inputs.hpp), "files" with inputs.files.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnref/core/attention.hpp"
#include "attnref/core/binary_format.hpp"
#include "attnref/certify/report.hpp"
#include "attnref/io/generator.hpp"
#include "attnref/golden/case_spec.hpp"
#include "attnref/golden/compiled.hpp"  // the reader and writer below: ATTNREF_GOLDEN_FN, ATTNREF_GOLDEN_BODIES
#include "attnref/golden/layout.hpp"

// Used by the definitions below.
#include "attnref/golden/safe_io.hpp"
#include <algorithm>
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <map>
#include <set>
#include <sstream>
#include <utility>

namespace attnref::golden {

inline constexpr const char* manifest_schema = "attnref.golden";
inline constexpr const char* suite_schema = "attnref.suite";
/// The version written. Readers accept min_schema_version … schema_version: version 2 added
/// outputs.gradients (backward cases: the grad_output input and the certified gradient roles).
inline constexpr int schema_version = 2;
inline constexpr int min_schema_version = 1;

/// Fills the family's affine map for every real-valued role the case generates (defaults from
/// generator::default_affine where the suite gave none) and validates the whole spec.
/// Errors name `file` and the field.
ATTNREF_GOLDEN_FN void complete_and_validate(case_spec& spec, const std::string& file, const std::string& prefix = "");

/// JSON of the case description (all fields explicit, stable order).
ATTNREF_GOLDEN_FN nlohmann::ordered_json to_json(const case_spec& spec);
/// The manifest's text: JSON with 2-space indentation and a final newline; deterministic.
ATTNREF_GOLDEN_FN std::string manifest_text(const manifest& m);

/// Strict parsers. `file` names the source in error messages.
ATTNREF_GOLDEN_FN manifest parse_manifest(const std::string& text, const std::string& file);
ATTNREF_GOLDEN_FN std::vector<case_spec> parse_suite(const std::string& text, const std::string& file);
/// Reads a whole JSON file (regular files only, at most max_json_bytes, see safe_io.hpp);
/// data_error naming it if it cannot be read.
inline std::string read_text(const std::string& file);

/// Estimated peak memory (bytes) of loading and checking a case, from its shapes alone:
/// 8 bytes per value of the inputs, plus 4 copies of the output (golden, candidate, bounds and
/// their terms), 4 of the weights B·H·Sq·Sk (golden, candidate, exact logits, per-element terms)
/// and 2 of lse; `bytes_per_value` replaces 8 for `generate`'s interval arithmetic. Saturates at
/// 2^64 − 1 instead of overflowing.
inline std::uint64_t case_memory_estimate(const case_spec& spec, std::uint64_t bytes_per_value = 8);
/// Throws data_error "<file>: field 'shapes': ..." naming the estimate and the limit if the case's
/// estimate exceeds max_memory().
inline void check_case_memory(const case_spec& spec, const std::string& file, std::uint64_t bytes_per_value = 8);

/// Names used in JSON for the enums.
inline const char* kind_name(case_kind k);
inline const char* placement_name(scale_placement p);
inline const char* alignment_name(causal_alignment a);
inline const char* polarity_name(mask_polarity p);
inline const char* empty_rows_name(empty_row_policy p);
inline const char* softmax_name(softmax_algorithm a);
inline std::optional<softmax_algorithm> softmax_from_name(const std::string& n);
/// The value a JSON name stands for (the inverse of the names above), or nullopt: E is case_kind,
/// scale_placement, causal_alignment, mask_polarity, empty_row_policy or generator::input_format.
template <class E>
std::optional<E> from_name(std::string_view n);


// ---------------------------------------------------------------------------------------------
// Definitions.


using json = nlohmann::ordered_json;

namespace manifest_detail {

/// The formats a case may ask correctly rounded output copies in (outputs.targets).
/// A name of an extra correctly rounded copy: any binary_format but float64 (which every case stores).
inline bool is_target_name(const std::string& t) {
    const auto f = format_from_name(t);
    return f && *f != binary_format::float64;
}

// ---------------------------------------------------------------------------------------------
// Strict reader: a JSON value, the file it came from and its dotted field path.

inline std::string excerpt(const json& j) {
    std::string s = j.dump();
    if (s.size() > 40) s = s.substr(0, 37) + "...";
    return s;
}

class reader {
public:
    reader(const json& value, std::string file, std::string path, bool strict)
        : value_(&value), file_(std::move(file)), path_(std::move(path)), strict_(strict) {}

    [[noreturn]] void fail(const std::string& what) const {
        throw data_error(file_ + ": field '" + path_ + "': " + what);
    }
    [[noreturn]] void expected(const std::string& what) const { fail("expected " + what + ", got " + excerpt(*value_)); }

    const json& value() const { return *value_; }
    bool strict() const { return strict_; }
    std::string child_path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

    /// Checks this is an object holding only `allowed` keys.
    void object(std::initializer_list<const char*> allowed) const {
        if (!value_->is_object()) expected("an object");
        for (auto it = value_->begin(); it != value_->end(); ++it) {
            bool ok = false;
            for (const char* a : allowed) ok = ok || it.key() == a;
            if (!ok) throw data_error(file_ + ": field '" + child_path(it.key()) + "': unknown field");
        }
    }
    bool has(const char* key) const { return value_->contains(key); }
    /// The child; in strict mode a missing child is an error, else nullopt.
    std::optional<reader> get(const char* key) const {
        if (!value_->contains(key)) {
            if (strict_) throw data_error(file_ + ": field '" + child_path(key) + "': missing");
            return std::nullopt;
        }
        return reader(value_->at(key), file_, child_path(key), strict_);
    }
    reader required(const char* key) const {
        if (!value_->contains(key)) throw data_error(file_ + ": field '" + child_path(key) + "': missing");
        return reader(value_->at(key), file_, child_path(key), strict_);
    }
    reader at(std::size_t i) const { return reader(value_->at(i), file_, path_ + "[" + std::to_string(i) + "]", strict_); }

    std::string string() const {
        if (!value_->is_string()) expected("a string");
        return value_->get<std::string>();
    }
    bool boolean() const {
        if (!value_->is_boolean()) expected("true or false");
        return value_->get<bool>();
    }
    double number() const {
        if (!value_->is_number()) expected("a number");
        const double d = value_->get<double>();
        if (!std::isfinite(d)) expected("a finite number");
        return d;
    }
    std::uint64_t unsigned_integer() const {
        if (!value_->is_number_unsigned()) expected("a non-negative integer");
        return value_->get<std::uint64_t>();
    }
    std::size_t size(bool positive) const {
        if (!value_->is_number_unsigned() || (positive && value_->get<std::uint64_t>() == 0))
            expected(positive ? "a positive integer" : "a non-negative integer");
        return static_cast<std::size_t>(value_->get<std::uint64_t>());
    }
    std::ptrdiff_t signed_integer() const {
        if (!value_->is_number_integer()) expected("an integer");
        // An unsigned value above INT64_MAX would wrap in get<int64_t>().
        if (value_->is_number_unsigned() && value_->get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
            expected("an integer in [-2^63, 2^63)");
        return static_cast<std::ptrdiff_t>(value_->get<std::int64_t>());
    }
    const json& array() const {
        if (!value_->is_array()) expected("an array");
        return *value_;
    }
    template <class E, std::size_t N>
    E choice(const std::pair<const char*, E> (&options)[N]) const {
        std::string list;
        if (value_->is_string())
            for (const auto& [n, e] : options)
                if (value_->get<std::string>() == n) return e;
        for (const auto& [n, e] : options) list += std::string(list.empty() ? "" : ", ") + n;
        expected("one of " + list);
    }

private:
    const json* value_;
    std::string file_, path_;
    bool strict_;
};

// The JSON names of the enums: the tables beside each enum (name_table.hpp's form), under the short
// names the reader uses.
inline constexpr std::pair<const char*, case_kind> kinds[] = {{"sdpa", case_kind::sdpa}, {"mha", case_kind::mha}};
inline constexpr const auto& placements = scale_placement_names;
inline constexpr const auto& alignments = causal_alignment_names;
inline constexpr const auto& polarities = mask_polarity_names;
inline constexpr const auto& empty_policies = empty_row_policy_names;
inline constexpr const auto& softmaxes = softmax_algorithm_names;

inline constexpr const char* projection_layout = "y = x·W + b";
inline constexpr const char* gqa_mapping = "h / (H / H_kv)";

inline json optional_number(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }
inline std::optional<double> read_optional_number(const reader& r) {
    if (r.value().is_null()) return std::nullopt;
    return r.number();
}

// ---------------------------------------------------------------------------------------------
// case_spec ⇄ JSON

inline void read_shapes(const reader& r, case_spec& s) {
    r.object({"batch", "heads", "kv_heads", "query_length", "key_length", "head_dim_qk", "head_dim_v", "model_dim", "output_dim"});
    case_shapes& sh = s.shapes;
    if (auto v = r.get("batch")) sh.batch = v->size(true);
    if (auto v = r.get("heads")) sh.heads = v->size(true);
    sh.kv_heads = sh.heads;
    if (auto v = r.get("kv_heads")) sh.kv_heads = v->size(true);
    if (auto v = r.get("query_length")) sh.query_length = v->size(true);
    sh.key_length = sh.query_length;
    if (auto v = r.get("key_length")) sh.key_length = v->size(true);
    if (auto v = r.get("head_dim_qk")) sh.head_dim_qk = v->size(true);
    sh.head_dim_v = sh.head_dim_qk;
    if (auto v = r.get("head_dim_v")) sh.head_dim_v = v->size(true);
    for (const char* key : {"model_dim", "output_dim"}) {
        std::size_t& dst = std::string(key) == "model_dim" ? sh.model_dim : sh.output_dim;
        auto v = r.get(key);
        if (s.kind == case_kind::sdpa) {
            if (v && !v->value().is_null()) v->fail("must be null for kind 'sdpa'");
            dst = 0;
        } else if (v) {
            dst = v->size(true);
        } else {
            if (key == std::string("model_dim")) {
                const std::optional<std::uint64_t> e = checked_mul(sh.heads, sh.head_dim_qk);
                if (!e) r.fail("model_dim defaults to heads × head_dim_qk, which overflows 64 bits");
                dst = static_cast<std::size_t>(*e);
            } else {
                dst = sh.model_dim;
            }
        }
    }
    if (sh.heads % sh.kv_heads != 0) r.required("kv_heads").fail("expected a divisor of heads " + std::to_string(sh.heads) + ", got " + std::to_string(sh.kv_heads));
}

inline void read_conventions(const reader& r, case_spec& s) {
    r.object({"scale", "scale_placement", "softcap", "alibi_slopes", "causal", "causal_alignment", "diagonal_offset", "window",
              "key_lengths", "boolean_mask", "mask_polarity", "additive_mask", "seed_mask", "empty_rows", "softmax_algorithm",
              "projection", "projection_bias", "gqa_mapping"});
    case_conventions& c = s.conventions;
    if (auto v = r.get("scale")) {
        c.scale = read_optional_number(*v);
        if (c.scale && !(*c.scale > 0)) v->expected("a positive number or null");
    }
    if (auto v = r.get("scale_placement")) c.placement = v->choice(placements);
    if (auto v = r.get("softcap")) {
        c.softcap = read_optional_number(*v);
        if (c.softcap && !(*c.softcap > 0)) v->expected("a positive number or null");
    }
    if (auto v = r.get("alibi_slopes")) {
        c.alibi_slopes.clear();
        for (std::size_t i = 0; i < v->array().size(); ++i) c.alibi_slopes.push_back(v->at(i).number());
        if (!c.alibi_slopes.empty() && c.alibi_slopes.size() != s.shapes.heads)
            v->fail("expected " + std::to_string(s.shapes.heads) + " slopes (one per head) or none, got " + std::to_string(c.alibi_slopes.size()));
    }
    if (auto v = r.get("causal")) c.causal = v->boolean();
    if (auto v = r.get("causal_alignment")) c.alignment = v->choice(alignments);
    if (auto v = r.get("diagonal_offset")) {
        c.diagonal_offset = v->signed_integer();
        // Diagonal distances (ALiBi) are used as doubles: keep every one exact.
        constexpr std::ptrdiff_t limit = std::ptrdiff_t{1} << 53;
        if (c.diagonal_offset > limit || c.diagonal_offset < -limit) v->expected("an integer of magnitude at most 2^53");
    }
    if (auto v = r.get("window")) {
        if (v->value().is_null()) {
            c.window.reset();
        } else {
            v->object({"left", "right"});
            sliding_window w;
            for (const char* key : {"left", "right"}) {
                const reader side = v->required(key);
                std::optional<std::size_t> bound;
                if (!side.value().is_null()) bound = side.size(false);
                (std::string(key) == "left" ? w.left : w.right) = bound;
            }
            c.window = w;
        }
    }
    if (auto v = r.get("key_lengths")) {
        c.key_lengths.clear();
        for (std::size_t i = 0; i < v->array().size(); ++i) {
            const std::size_t len = v->at(i).size(false);
            if (len > s.shapes.key_length) v->at(i).fail("expected at most the key length " + std::to_string(s.shapes.key_length) + ", got " + std::to_string(len));
            c.key_lengths.push_back(len);
        }
        if (!c.key_lengths.empty() && c.key_lengths.size() != s.shapes.batch)
            v->fail("expected " + std::to_string(s.shapes.batch) + " lengths (one per batch) or none, got " + std::to_string(c.key_lengths.size()));
    }
    if (auto v = r.get("boolean_mask")) c.boolean_mask = v->boolean();
    if (auto v = r.get("mask_polarity")) c.polarity = v->choice(polarities);
    if (auto v = r.get("additive_mask")) c.additive_mask = v->boolean();
    if (auto v = r.get("seed_mask")) c.seed_mask = v->boolean();
    if (auto v = r.get("empty_rows")) c.empty_rows = v->choice(empty_policies);
    if (auto v = r.get("softmax_algorithm")) {
        if (v->choice(softmaxes) != softmax_algorithm::shifted_division)
            v->fail("the reference is computed with 'shifted_division' (exact arithmetic makes all algorithms equal)");
    }
    if (auto v = r.get("projection"))
        if (v->string() != projection_layout) v->expected(std::string("'") + projection_layout + "'");
    if (auto v = r.get("projection_bias")) {
        c.projection_bias = v->boolean();
        if (c.projection_bias && s.kind == case_kind::sdpa) v->fail("must be false for kind 'sdpa'");
    }
    if (auto v = r.get("gqa_mapping"))
        if (v->string() != gqa_mapping) v->expected(std::string("'") + gqa_mapping + "'");
}

inline void read_family(const reader& r, generator::input_family& f) {
    r.object({"name", "roles", "query_feature0", "key_feature0", "key_feature0_keys", "tied_keys", "negate_odd_value_rows",
              "mask_true_probability", "additive_inf_probability"});
    if (auto v = r.get("name")) f.name = v->string();
    if (auto v = r.get("roles")) {
        v->object({"query", "key", "value", "w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o", "additive_mask", "grad_output"});
        for (auto it = v->value().begin(); it != v->value().end(); ++it) {
            const reader role = v->required(it.key().c_str());
            role.object({"scale", "offset"});
            generator::affine a{std::nan(""), 0};
            if (auto x = role.get("scale")) a.scale = x->number();
            if (auto x = role.get("offset")) a.offset = x->number();
            f.roles[it.key()] = a;
        }
    }
    if (auto v = r.get("query_feature0")) f.query_feature0 = read_optional_number(*v);
    if (auto v = r.get("key_feature0")) f.key_feature0 = read_optional_number(*v);
    if (auto v = r.get("key_feature0_keys")) f.key_feature0_keys = v->size(false);
    if (auto v = r.get("tied_keys")) f.tied_keys = v->size(false);
    if (auto v = r.get("negate_odd_value_rows")) f.negate_odd_value_rows = v->boolean();
    for (const char* key : {"mask_true_probability", "additive_inf_probability"})
        if (auto v = r.get(key)) {
            const double p = v->number();
            if (p < 0 || p > 1) v->expected("a probability in [0, 1]");
            (std::string(key) == "mask_true_probability" ? f.mask_true_probability : f.additive_inf_probability) = p;
        }
}

inline void read_inputs(const reader& r, case_spec& s) {
    r.object({"format", "generator", "seed", "family", "files"});
    if (auto v = r.get("format")) s.inputs.format = v->choice(attnref::binary_format_names);
    if (auto v = r.get("generator")) {
        const std::string g = v->string();
        // "files" (attnref generate --inputs-from) only in a case's manifest: a suite has no inputs to read.
        s.inputs.from_files = g == files_generator && r.strict();
        if (g != generator::name && !s.inputs.from_files)
            v->expected("'" + std::string(generator::name) + "'" + (r.strict() ? std::string(" or '") + files_generator + "'" : std::string()));
    }
    if (s.inputs.from_files) {
        // No seed and no family: null. The user's files: role, dtype as given, sha256 as given.
        for (const char* key : {"seed", "family"})
            if (!r.required(key).value().is_null()) r.required(key).expected(std::string("null for generator '") + files_generator + "'");
        const reader files = r.required("files");
        for (std::size_t i = 0; i < files.array().size(); ++i) {
            const reader f = files.at(i);
            f.object({"role", "dtype", "sha256"});
            input_file_record e{f.required("role").string(), f.required("dtype").string(), f.required("sha256").string()};
            if (e.dtype != "<f8" && e.dtype != "<f4" && e.dtype != "<f2" && e.dtype != "<u2" && e.dtype != "|b1")
                f.required("dtype").expected("one of '<f8', '<f4', '<f2', '<u2' (bfloat16 bits), '|b1'");
            if (e.sha256.size() != 64 || e.sha256.find_first_not_of("0123456789abcdef") != std::string::npos)
                f.required("sha256").expected("64 lowercase hex digits");
            s.inputs.files.push_back(std::move(e));
        }
        return;
    }
    if (r.has("files")) r.required("files").fail(std::string("only for generator '") + files_generator + "'");
    if (auto v = r.get("seed")) s.inputs.seed = v->unsigned_integer();
    if (auto v = r.get("family")) read_family(*v, s.inputs.family);
}

inline void read_outputs(const reader& r, case_spec& s) {
    r.object({"weights", "lse", "gradients", "targets"});
    if (auto v = r.get("weights")) s.outputs.weights = v->boolean();
    if (auto v = r.get("lse")) s.outputs.lse = v->boolean();
    // Optional in manifests too (absent = false): a forward case writes it only when true.
    if (r.has("gradients")) s.outputs.gradients = r.required("gradients").boolean();
    if (auto v = r.get("targets")) {
        s.outputs.targets.clear();
        for (std::size_t i = 0; i < v->array().size(); ++i) {
            const std::string t = v->at(i).string();
            if (!is_target_name(t)) v->at(i).expected("one of float32, bfloat16, float16");
            if (std::find(s.outputs.targets.begin(), s.outputs.targets.end(), t) != s.outputs.targets.end())
                v->at(i).fail("target '" + t + "' listed twice");
            s.outputs.targets.push_back(t);
        }
    }
}

inline case_spec read_case(const reader& r, std::initializer_list<const char*> extra_allowed) {
    std::vector<const char*> allowed{"name", "description", "kind", "shapes", "conventions", "inputs", "outputs"};
    allowed.insert(allowed.end(), extra_allowed.begin(), extra_allowed.end());
    if (!r.value().is_object()) r.expected("an object");
    for (auto it = r.value().begin(); it != r.value().end(); ++it) {
        bool ok = false;
        for (const char* a : allowed) ok = ok || it.key() == a;
        if (!ok) r.required(it.key().c_str()).fail("unknown field");
    }
    case_spec s;
    s.name = r.required("name").string();
    if (s.name.empty() || s.name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos)
        r.required("name").expected("a name of [a-z0-9_] characters");
    if (auto v = r.get("description")) s.description = v->string();
    if (auto v = r.get("kind")) s.kind = v->choice(kinds);
    if (auto v = r.get("shapes")) read_shapes(*v, s);
    else if (s.kind == case_kind::mha) { s.shapes.model_dim = s.shapes.heads * s.shapes.head_dim_qk; s.shapes.output_dim = s.shapes.model_dim; }
    if (auto v = r.get("conventions")) read_conventions(*v, s);
    if (auto v = r.get("inputs")) read_inputs(*v, s);
    if (auto v = r.get("outputs")) read_outputs(*v, s);
    return s;
}

inline json parse_json(const std::string& text, const std::string& file) {
    json_prepass(text, file);  // NUL bytes, depth and duplicate keys, without recursion
    try {
        return json::parse(text);
    } catch (const json::exception& e) {
        // parse_error for bad syntax, but also out_of_range (406) for a number no double holds
        // (e.g. 1e400): every failure of the JSON layer is this file's one-line data error.
        std::string what = e.what();
        const auto pos = what.find("] ");
        if (pos != std::string::npos) what = what.substr(pos + 2);
        throw data_error(file + ": not valid JSON: " + what);
    }
}

/// Checks schema and schema_version (min_schema_version … schema_version); returns the version.
inline int check_schema(const reader& root, const char* schema) {
    const reader name = root.required("schema");
    if (name.string() != schema) name.expected(std::string("'") + schema + "'");
    const reader version = root.required("schema_version");
    const bool ok = version.value().is_number_unsigned() && version.value().get<std::uint64_t>() >= static_cast<std::uint64_t>(min_schema_version) &&
                    version.value().get<std::uint64_t>() <= static_cast<std::uint64_t>(schema_version);
    if (!ok) version.expected(std::to_string(min_schema_version) + " or " + std::to_string(schema_version));
    return static_cast<int>(version.value().get<std::uint64_t>());
}

/// Version 1 knows no gradients: a version-1 file that asks for them is an error naming the field.
inline void check_version_features(const reader& r_case, const case_spec& s, int version) {
    if (version < 2 && s.outputs.gradients)
        r_case.required("outputs").required("gradients").fail("gradients need schema_version 2, the file says " + std::to_string(version));
}

}  // namespace manifest_detail
inline const char* kind_name(case_kind k) { return name_in(manifest_detail::kinds, k).data(); }
inline const char* placement_name(scale_placement p) { return name_in(scale_placement_names, p).data(); }
inline const char* alignment_name(causal_alignment a) { return name_in(causal_alignment_names, a).data(); }
inline const char* polarity_name(mask_polarity p) { return name_in(mask_polarity_names, p).data(); }
inline const char* empty_rows_name(empty_row_policy p) { return name_in(empty_row_policy_names, p).data(); }
inline const char* softmax_name(softmax_algorithm a) { return name_in(softmax_algorithm_names, a).data(); }
inline std::optional<softmax_algorithm> softmax_from_name(const std::string& n) { return value_in(softmax_algorithm_names, n); }
template <class E>
std::optional<E> from_name(std::string_view n) {
    if constexpr (std::is_same_v<E, case_kind>) return value_in(manifest_detail::kinds, n);
    else if constexpr (std::is_same_v<E, scale_placement>) return value_in(scale_placement_names, n);
    else if constexpr (std::is_same_v<E, causal_alignment>) return value_in(causal_alignment_names, n);
    else if constexpr (std::is_same_v<E, mask_polarity>) return value_in(mask_polarity_names, n);
    else if constexpr (std::is_same_v<E, empty_row_policy>) return value_in(empty_row_policy_names, n);
    else {
        static_assert(std::is_same_v<E, generator::input_format>, "no JSON names for this type");
        return value_in(attnref::binary_format_names, n);
    }
}

inline std::vector<input_tensor_layout> input_layout(const case_spec& s) {
    std::vector<input_tensor_layout> out;
    for (const role_tensor& t : roles_of(s, role_direction::input, s.selection())) out.push_back({generator_role(t.role), t.shape});
    return out;
}

#if ATTNREF_GOLDEN_BODIES
ATTNREF_GOLDEN_FN void complete_and_validate(case_spec& s, const std::string& file, const std::string& prefix) {
    auto fail = [&](const std::string& field, const std::string& what) {
        throw data_error(file + ": field '" + prefix + field + "': " + what);
    };
    // Every size product the program forms (projection widths, element and byte counts of every
    // tensor) must fit in 64 bits; nothing downstream may see a wrapped-around size.
    const case_shapes& d = s.shapes;
    const std::pair<const char*, std::pair<std::size_t, std::size_t>> widths[] = {
        {"heads × head_dim_qk", {d.heads, d.head_dim_qk}}, {"heads × head_dim_v", {d.heads, d.head_dim_v}},
        {"kv_heads × head_dim_qk", {d.kv_heads, d.head_dim_qk}}, {"kv_heads × head_dim_v", {d.kv_heads, d.head_dim_v}}};
    for (const auto& [what, ab] : widths)
        if (!checked_mul(ab.first, ab.second)) fail("shapes", std::string(what) + " overflows 64 bits");
    auto check_count = [&](const std::string& what, const std::vector<std::size_t>& shape) {
        std::uint64_t n = 8;  // bytes: the widest stored element
        for (std::size_t e : shape) {
            const std::optional<std::uint64_t> m = checked_mul(n, e);
            if (!m) fail("shapes", "the byte count of " + what + " overflows 64 bits");
            n = *m;
        }
    };
    for (const input_tensor_layout& t : input_layout(s)) check_count("role '" + std::string(generator::role_name(t.role)) + "'", t.shape);
    check_count("the output", output_shape(s));
    check_count("the weights (B·H·Sq·Sk)", weights_shape(s));
    for (const gradient_tensor_layout& g : gradient_layout(s)) check_count("the gradient '" + g.role + "'", g.shape);
    // The gradients' bound (check/checker.hpp) needs the stored weights and lse.
    if (s.outputs.gradients && !s.outputs.weights) fail("outputs.weights", "must be true when outputs.gradients is true");
    if (s.outputs.gradients && !s.outputs.lse) fail("outputs.lse", "must be true when outputs.gradients is true");
    if (s.inputs.from_files) {
        // One record per input role, in input_layout order (the roles the case reads from files).
        const std::vector<input_tensor_layout> layout = input_layout(s);
        if (s.inputs.files.size() != layout.size()) fail("inputs.files", "expected one entry per input of the case (" + std::to_string(layout.size()) + ")");
        for (std::size_t i = 0; i < layout.size(); ++i) {
            const std::string role(generator::role_name(layout[i].role));
            if (s.inputs.files[i].role != role)
                fail("inputs.files[" + std::to_string(i) + "].role", "expected '" + role + "', got '" + printable(s.inputs.files[i].role) + "'");
            if ((s.inputs.files[i].dtype == "|b1") != (layout[i].role == generator::role::mask))
                fail("inputs.files[" + std::to_string(i) + "].dtype", "'|b1' is the boolean mask's dtype, and only its");
        }
        s.inputs.family = {};
    }
    std::map<std::string, generator::affine> roles;
    for (const input_tensor_layout& t : (s.inputs.from_files ? std::vector<input_tensor_layout>{} : input_layout(s))) {
        using generator::role;
        if (t.role == role::mask || t.role == role::seed_mask) continue;
        const std::string n(generator::role_name(t.role));
        generator::affine a = generator::default_affine(t.role, t.shape[0]);
        if (t.role == role::additive_mask) a = {1, 0};
        if (auto it = s.inputs.family.roles.find(n); it != s.inputs.family.roles.end()) {
            if (!std::isnan(it->second.scale)) a.scale = it->second.scale;
            a.offset = it->second.offset;
        }
        roles[n] = a;
    }
    for (const auto& [n, a] : s.inputs.family.roles)
        if (!roles.count(n)) fail("inputs.family.roles." + n, "this case has no input with role '" + n + "'");
    s.inputs.family.roles = roles;
    if (s.conventions.alibi_slopes.size() != 0 && s.conventions.alibi_slopes.size() != s.shapes.heads)
        fail("conventions.alibi_slopes", "expected one slope per head");
    if (s.conventions.key_lengths.size() != 0 && s.conventions.key_lengths.size() != s.shapes.batch)
        fail("conventions.key_lengths", "expected one length per batch");
}

ATTNREF_GOLDEN_FN manifest parse_manifest(const std::string& text, const std::string& file) {
    const json j = manifest_detail::parse_json(text, file);
    const manifest_detail::reader root(j, file, "", true);
    if (!j.is_object()) root.expected("an object");
    const int version = manifest_detail::check_schema(root, manifest_schema);
    manifest m;
    m.spec = manifest_detail::read_case(root, {"schema", "schema_version", "reference", "tensors"});
    manifest_detail::check_version_features(root, m.spec, version);
    complete_and_validate(m.spec, file);

    const manifest_detail::reader ref = root.required("reference");
    ref.object({"method", "precisions_bits", "certification"});
    {
        const manifest_detail::reader method = ref.required("method");
        m.reference.method = method.string();
        const std::string suffix = m.spec.outputs.gradients ? reference_method_gradients_suffix : "";
        const bool fast_gradients = m.spec.outputs.gradients && m.reference.method == reference_method_fast + std::string(reference_method_fast_gradients_suffix);
        if (m.reference.method != reference_method_mpfi + suffix && m.reference.method != reference_method_fast + suffix && !fast_gradients)
            method.expected(std::string("the text of one of attnref's certification methods") +
                            (m.spec.outputs.gradients ? " with the gradients' suffix" : "") + " (golden/README.md)");
    }
    const manifest_detail::reader bits = ref.required("precisions_bits");
    for (std::size_t i = 0; i < bits.array().size(); ++i) m.reference.precisions_bits.push_back(static_cast<int>(bits.at(i).size(true)));
    const manifest_detail::reader cert = ref.required("certification");
    for (std::size_t i = 0; i < cert.array().size(); ++i) {
        const manifest_detail::reader c = cert.at(i);
        c.object({"role", "target", "elements", "certified", "escalated", "precisions_bits"});
        certify::tensor_report r;
        r.tensor = c.required("role").string();
        r.target = c.required("target").string();
        r.elements = c.required("elements").size(false);
        r.certified = c.required("certified").size(false);
        r.escalated = c.required("escalated").size(false);
        if (r.certified != r.elements) c.required("certified").expected("all " + std::to_string(r.elements) + " elements certified");
        const manifest_detail::reader p = c.required("precisions_bits");
        for (std::size_t k = 0; k < p.array().size(); ++k) r.precisions_bits.push_back(static_cast<int>(p.at(k).size(true)));
        m.reference.certification.push_back(r);
    }

    const manifest_detail::reader tensors = root.required("tensors");
    std::set<std::string> files;
    for (std::size_t i = 0; i < tensors.array().size(); ++i) {
        const manifest_detail::reader t = tensors.at(i);
        t.object({"role", "target", "file", "dtype", "shape", "sha256"});
        tensor_entry e;
        e.role = t.required("role").string();
        if (t.has("target")) {
            e.target = t.required("target").string();
            if (!manifest_detail::is_target_name(*e.target)) t.required("target").expected("one of float32, bfloat16, float16");
        }
        const manifest_detail::reader f = t.required("file");
        e.file = f.string();
        if (e.file.empty() || e.file.find('/') != std::string::npos || e.file.find('\\') != std::string::npos || e.file[0] == '.' ||
            e.file.size() < 5 || e.file.substr(e.file.size() - 4) != ".npy" ||
            std::any_of(e.file.begin(), e.file.end(), [](char ch) { return static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f; }))
            f.expected("a plain file name ending in .npy (no '/', '\\', leading '.', NUL or control characters)");
        if (!files.insert(e.file).second) f.fail("file listed twice");
        e.dtype = t.required("dtype").string();
        const manifest_detail::reader sh = t.required("shape");
        for (std::size_t k = 0; k < sh.array().size(); ++k) e.shape.push_back(sh.at(k).size(false));
        const manifest_detail::reader h = t.required("sha256");
        e.sha256 = h.string();
        if (e.sha256.size() != 64 || e.sha256.find_first_not_of("0123456789abcdef") != std::string::npos)
            h.expected("64 lowercase hex digits");
        m.tensors.push_back(e);
    }
    // The tensors must be exactly those the case's description implies, each once, with the dtype
    // and shape it implies: a file's header is later checked against these, so nothing read
    // downstream can disagree with the case's shapes.
    const std::vector<expected_tensor> want = expected_tensors(m.spec);
    std::vector<bool> seen(want.size(), false);
    for (std::size_t i = 0; i < m.tensors.size(); ++i) {
        const tensor_entry& e = m.tensors[i];
        const manifest_detail::reader t = tensors.at(i);
        std::size_t k = 0;
        while (k < want.size() && !(want[k].role == e.role && want[k].target == e.target)) ++k;
        if (k == want.size())
            t.required(e.target ? "target" : "role")
                .fail("this case has no tensor with role '" + printable(e.role) + "'" + (e.target ? " and target '" + *e.target + "'" : std::string()));
        if (seen[k]) t.required("role").fail("role '" + e.role + "'" + (e.target ? " with target '" + *e.target + "'" : std::string()) + " listed twice");
        seen[k] = true;
        if (e.dtype != want[k].dtype) t.required("dtype").expected("'" + want[k].dtype + "' for role '" + e.role + "'");
        if (e.shape != want[k].shape) {
            std::string shape_text = "[";
            for (std::size_t x = 0; x < want[k].shape.size(); ++x) shape_text += (x ? ", " : "") + std::to_string(want[k].shape[x]);
            t.required("shape").expected(shape_text + "] (from the case's shapes)");
        }
    }
    for (std::size_t k = 0; k < want.size(); ++k)
        if (!seen[k])
            tensors.fail("no tensor with role '" + want[k].role + "'" + (want[k].target ? " and target '" + *want[k].target + "'" : std::string()));
    return m;
}

ATTNREF_GOLDEN_FN std::vector<case_spec> parse_suite(const std::string& text, const std::string& file) {
    const json j = manifest_detail::parse_json(text, file);
    const manifest_detail::reader root(j, file, "", false);
    root.object({"schema", "schema_version", "description", "cases"});
    const int version = manifest_detail::check_schema(root, suite_schema);
    const manifest_detail::reader cases = root.required("cases");
    std::vector<case_spec> out;
    std::set<std::string> names;
    for (std::size_t i = 0; i < cases.array().size(); ++i) {
        case_spec s = manifest_detail::read_case(cases.at(i), {});
        manifest_detail::check_version_features(cases.at(i), s, version);
        if (!names.insert(s.name).second) cases.at(i).required("name").fail("duplicate case name '" + s.name + "'");
        complete_and_validate(s, file, "cases[" + std::to_string(i) + "].");
        out.push_back(std::move(s));
    }
    return out;
}
#endif  // ATTNREF_GOLDEN_BODIES

inline std::string read_text(const std::string& file) { return read_file_capped(file, max_json_bytes); }

}  // namespace attnref::golden

// The writer and the memory estimates (declared above).
#include "attnref/golden/manifest_writer.hpp"
#include "attnref/golden/memory.hpp"
