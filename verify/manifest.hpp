#pragma once
/// \file manifest.hpp
/// Golden case descriptions: the suite file (golden/suite.json, schema "attnref.suite") and the
/// per-case manifest (golden/<case>/manifest.json, schema "attnref.golden"), both version 1, both
/// documented field by field in golden/README.md.
///
/// Parsing is strict: unknown fields, wrong types and out-of-range values are errors, and every
/// error is one line naming the file and the field, e.g.
///     golden/x/manifest.json: field 'shapes.heads': expected a positive integer, got -1
/// In a suite, omitted fields take the defaults documented in golden/README.md; in a manifest every
/// field must be present.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnref/attention.hpp"
#include "attnref/certify.hpp"
#include "attnref/generator.hpp"

namespace attnref::verify {

/// Usage or data error: exit code 2, what() is the one-line message.
class data_error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};
/// A check failed (e.g. --verify found a difference): exit code 1.
class check_failure : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

inline constexpr const char* manifest_schema = "attnref.golden";
inline constexpr const char* suite_schema = "attnref.suite";
inline constexpr int schema_version = 1;

enum class case_kind { sdpa, mha };

struct case_shapes {
    std::size_t batch = 1, heads = 2, kv_heads = 2, query_length = 8, key_length = 8, head_dim_qk = 8, head_dim_v = 8;
    std::size_t model_dim = 0, output_dim = 0;  ///< mha only (0 and JSON null for sdpa)
};

struct case_conventions {
    std::optional<double> scale;  ///< nullopt: 1/√dk
    scale_placement placement = scale_placement::on_product;
    std::optional<double> softcap;
    std::vector<double> alibi_slopes;
    bool causal = false;
    causal_alignment alignment = causal_alignment::top_left;
    std::ptrdiff_t diagonal_offset = 0;
    std::optional<sliding_window> window;
    std::vector<std::size_t> key_lengths;
    bool boolean_mask = false;
    mask_polarity polarity = mask_polarity::true_means_attend;
    bool additive_mask = false;
    bool seed_mask = false;
    empty_row_policy empty_rows = empty_row_policy::zero;
    bool projection_bias = false;  ///< mha only
};

struct case_inputs {
    generator::input_format format = generator::input_format::float64;
    std::uint64_t seed = 0;
    generator::input_family family;
};

struct case_outputs {
    bool weights = true;
    bool lse = true;
    std::vector<std::string> targets;  ///< extra correctly rounded copies: float32, bfloat16, float16
};

/// Everything needed to regenerate a case.
struct case_spec {
    std::string name;
    std::string description;
    case_kind kind = case_kind::sdpa;
    case_shapes shapes;
    case_conventions conventions;
    case_inputs inputs;
    case_outputs outputs;
};

/// One stored tensor.
struct tensor_entry {
    std::string role;
    std::optional<std::string> target;  ///< correctly rounded copies only
    std::string file;
    std::string dtype;
    std::vector<std::size_t> shape;
    std::string sha256;
};

struct reference_info {
    std::vector<int> precisions_bits;  ///< every precision the certification computed at
    std::vector<certify::tensor_report> certification;
};

struct manifest {
    case_spec spec;
    reference_info reference;
    std::vector<tensor_entry> tensors;
};

/// The roles a case generates as inputs, in file order, with their stored shapes.
struct input_tensor_layout {
    generator::role role;
    std::vector<std::size_t> shape;
};
std::vector<input_tensor_layout> input_layout(const case_spec& spec);
/// Shapes of output, weights and lse.
std::vector<std::size_t> output_shape(const case_spec& spec);
std::vector<std::size_t> weights_shape(const case_spec& spec);
std::vector<std::size_t> lse_shape(const case_spec& spec);

/// A tensor a case's manifest must list: role, target copy (nullopt: the float64 values), the
/// '.npy' descr and the shape, all implied by the case description. Inputs are '<f8' (the boolean
/// mask '|b1'); outputs '<f8', their float32 copies '<f4', float16 '<f2', bfloat16 '<u2' (bits).
struct expected_tensor {
    std::string role;
    std::optional<std::string> target;
    std::string dtype;
    std::vector<std::size_t> shape;
};
std::vector<expected_tensor> expected_tensors(const case_spec& spec);

/// Fills the family's affine map for every real-valued role the case generates (defaults from
/// generator::default_affine where the suite gave none) and validates the whole spec.
/// Errors name `file` and the field.
void complete_and_validate(case_spec& spec, const std::string& file, const std::string& prefix = "");

/// JSON of the case description (all fields explicit, stable order).
nlohmann::ordered_json to_json(const case_spec& spec);
/// The manifest's text: JSON with 2-space indentation and a final newline; deterministic.
std::string manifest_text(const manifest& m);

/// Strict parsers. `file` names the source in error messages.
manifest parse_manifest(const std::string& text, const std::string& file);
std::vector<case_spec> parse_suite(const std::string& text, const std::string& file);
/// Reads a whole JSON file (regular files only, at most max_json_bytes, see safe_io.hpp);
/// data_error naming it if it cannot be read.
std::string read_text(const std::string& file);

/// Names used in JSON for the enums.
const char* kind_name(case_kind k);
const char* placement_name(scale_placement p);
const char* alignment_name(causal_alignment a);
const char* polarity_name(mask_polarity p);
const char* empty_rows_name(empty_row_policy p);
const char* softmax_name(softmax_algorithm a);
std::optional<softmax_algorithm> softmax_from_name(const std::string& n);
const certify::binary_format* target_format(const std::string& name);

}  // namespace attnref::verify
