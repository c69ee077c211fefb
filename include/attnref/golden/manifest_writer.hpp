#pragma once
/// \file golden/manifest_writer.hpp
/// The one writer of golden/manifest.hpp's JSON: to_json (a case description, every field explicit,
/// in a stable order) and manifest_text (a case's manifest.json). Included by golden/manifest.hpp.

#include <string>

#include <nlohmann/json.hpp>

#include "attnref/golden/manifest.hpp"

#if ATTNREF_GOLDEN_BODIES  // golden/compiled.hpp: defined once in attnref::golden_compiled, or inline
namespace attnref::golden {

ATTNREF_GOLDEN_FN json to_json(const case_spec& s) {
    json j;
    j["name"] = s.name;
    j["description"] = s.description;
    j["kind"] = kind_name(s.kind);
    const case_shapes& d = s.shapes;
    json sh;
    sh["batch"] = d.batch;
    sh["heads"] = d.heads;
    sh["kv_heads"] = d.kv_heads;
    sh["query_length"] = d.query_length;
    sh["key_length"] = d.key_length;
    sh["head_dim_qk"] = d.head_dim_qk;
    sh["head_dim_v"] = d.head_dim_v;
    sh["model_dim"] = s.kind == case_kind::mha ? json(d.model_dim) : json(nullptr);
    sh["output_dim"] = s.kind == case_kind::mha ? json(d.output_dim) : json(nullptr);
    j["shapes"] = sh;
    const case_conventions& c = s.conventions;
    json cv;
    cv["scale"] = manifest_detail::optional_number(c.scale);
    cv["scale_placement"] = placement_name(c.placement);
    cv["softcap"] = manifest_detail::optional_number(c.softcap);
    cv["alibi_slopes"] = c.alibi_slopes;
    cv["causal"] = c.causal;
    cv["causal_alignment"] = alignment_name(c.alignment);
    cv["diagonal_offset"] = static_cast<std::int64_t>(c.diagonal_offset);
    if (c.window) {
        json w;
        w["left"] = c.window->left ? json(*c.window->left) : json(nullptr);
        w["right"] = c.window->right ? json(*c.window->right) : json(nullptr);
        cv["window"] = w;
    } else {
        cv["window"] = nullptr;
    }
    cv["key_lengths"] = c.key_lengths;
    cv["boolean_mask"] = c.boolean_mask;
    cv["mask_polarity"] = polarity_name(c.polarity);
    cv["additive_mask"] = c.additive_mask;
    cv["seed_mask"] = c.seed_mask;
    cv["empty_rows"] = empty_rows_name(c.empty_rows);
    cv["softmax_algorithm"] = "shifted_division";
    cv["projection"] = manifest_detail::projection_layout;
    cv["projection_bias"] = c.projection_bias;
    cv["gqa_mapping"] = manifest_detail::gqa_mapping;
    j["conventions"] = cv;
    const generator::input_family& f = s.inputs.family;
    json fam;
    fam["name"] = f.name;
    json roles = json::object();
    for (const input_tensor_layout& t : input_layout(s)) {
        const std::string n(generator::role_name(t.role));
        if (auto it = f.roles.find(n); it != f.roles.end()) roles[n] = json{{"scale", it->second.scale}, {"offset", it->second.offset}};
    }
    fam["roles"] = roles;
    fam["query_feature0"] = manifest_detail::optional_number(f.query_feature0);
    fam["key_feature0"] = manifest_detail::optional_number(f.key_feature0);
    fam["key_feature0_keys"] = f.key_feature0_keys;
    fam["tied_keys"] = f.tied_keys;
    fam["negate_odd_value_rows"] = f.negate_odd_value_rows;
    fam["mask_true_probability"] = f.mask_true_probability;
    fam["additive_inf_probability"] = f.additive_inf_probability;
    json in;
    in["format"] = generator::format_name(s.inputs.format);
    if (s.inputs.from_files) {
        in["generator"] = files_generator;
        in["seed"] = nullptr;
        in["family"] = nullptr;
        json files = json::array();
        for (const input_file_record& e : s.inputs.files) files.push_back(json{{"role", e.role}, {"dtype", e.dtype}, {"sha256", e.sha256}});
        in["files"] = files;
    } else {
        in["generator"] = generator::name;
        in["seed"] = s.inputs.seed;
        in["family"] = fam;
    }
    j["inputs"] = in;
    json outputs{{"weights", s.outputs.weights}, {"lse", s.outputs.lse}};
    if (s.outputs.gradients) outputs["gradients"] = true;
    outputs["targets"] = s.outputs.targets;
    j["outputs"] = outputs;
    return j;
}

ATTNREF_GOLDEN_FN std::string manifest_text(const manifest& m) {
    json j;
    j["schema"] = manifest_schema;
    j["schema_version"] = schema_version;
    const json spec = to_json(m.spec);
    for (auto it = spec.begin(); it != spec.end(); ++it) j[it.key()] = it.value();
    json ref;
    ref["method"] = m.reference.method;
    ref["precisions_bits"] = m.reference.precisions_bits;
    json cert = json::array();
    for (const certify::tensor_report& r : m.reference.certification)
        cert.push_back(json{{"role", r.tensor}, {"target", r.target}, {"elements", r.elements}, {"certified", r.certified},
                            {"escalated", r.escalated}, {"precisions_bits", r.precisions_bits}});
    ref["certification"] = cert;
    j["reference"] = ref;
    json tensors = json::array();
    for (const tensor_entry& t : m.tensors) {
        json e;
        e["role"] = t.role;
        if (t.target) e["target"] = *t.target;
        e["file"] = t.file;
        e["dtype"] = t.dtype;
        e["shape"] = t.shape;
        e["sha256"] = t.sha256;
        tensors.push_back(e);
    }
    j["tensors"] = tensors;
    return j.dump(2) + "\n";
}

}  // namespace attnref::golden
#endif  // ATTNREF_GOLDEN_BODIES
