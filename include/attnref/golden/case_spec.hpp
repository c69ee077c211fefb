#pragma once
/// \file golden/case_spec.hpp
/// A golden case described in memory: the attention problem it poses (problem.hpp's kind, shapes
/// and conventions) with how its inputs are made (case_inputs) and what it stores (case_outputs),
/// and its manifest (case_spec, reference_info, tensor_entry). golden/manifest.hpp reads and writes
/// them as JSON; golden/layout.hpp lists the tensors a case implies.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnref/certify/report.hpp"
#include "attnref/io/generator.hpp"
#include "attnref/core/problem.hpp"

namespace attnref::golden {

/// A case's kind, shapes and conventions are those of an attention problem (problem.hpp); JSON
/// writes model_dim and output_dim as null for sdpa.
using case_kind = problem_kind;
using case_shapes = problem_shapes;
using case_conventions = problem_conventions;

/// One input file a "files" case was made from (`attnref generate --inputs-from`, user_inputs.hpp):
/// its role, the dtype it was given in ('<f8', '<f4', '<f2', bfloat16 bits '<u2', masks '|b1') and the
/// sha256 of the file as given. The case stores the values themselves as '<f8' like any other case.
struct input_file_record {
    std::string role, dtype, sha256;
};

/// Name of inputs.generator for a case whose inputs came from the user's files.
inline constexpr const char* files_generator = "files";

struct case_inputs {
    generator::input_format format = generator::input_format::float64;
    std::uint64_t seed = 0;
    generator::input_family family;
    /// Inputs from the user's files (inputs.generator "files": no seed, no family; the stored
    /// inputs are the case's own .npy files), not from the generator.
    bool from_files = false;
    std::vector<input_file_record> files;  ///< from_files only: one per input role, in input_layout order
};

struct case_outputs {
    bool weights = true;
    bool lse = true;
    std::vector<std::string> targets;  ///< extra correctly rounded copies: float32, bfloat16, float16
    /// Backward case (schema version 2): the grad_output input and the certified gradients
    /// (gradient_layout). Needs weights and lse. Written to JSON only when true, so a forward
    /// case's manifest differs from version 1 in schema_version alone.
    bool gradients = false;
};

/// Everything needed to regenerate a case: the attention problem (kind, shapes, conventions;
/// problem.hpp) and how the case names, generates and stores it.
struct case_spec : attention_problem {
    std::string name;
    std::string description;
    case_inputs inputs;
    case_outputs outputs;
    /// The optional tensors the case stores (weights, lse, gradients), for the role table.
    role_selection selection() const { return {outputs.weights, outputs.lse, outputs.gradients}; }
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
    std::string method;                ///< how the values were certified (reference_method_fast or _mpfi text)
    std::vector<int> precisions_bits;  ///< every precision the certification computed at
    std::vector<certify::tensor_report> certification;  ///< reference.certification[]; JSON "role" is .tensor
};

/// The manifest's reference.method text for each way generate certifies (certification_method). The
/// texts identify the method in every manifest written since schema 2 and the reader accepts only them:
/// they are frozen, so they still name the headers by their paths of that time (fast_certify.hpp is now
/// certify/fast.hpp, backward.hpp core/backward.hpp).
inline constexpr const char* reference_method_mpfi =
    "mpfi-interval: attnref's templates in MPFI interval arithmetic; each stored value is the common rounding "
    "(to nearest even) of both interval ends, precision raised Ziv-style until every element agrees";
inline constexpr const char* reference_method_fast =
    "double-double then mpfi-interval: every element computed in double-double with a rigorous error bound "
    "(include/attnref/fast_certify.hpp; 106 in precisions_bits) and stored where value +- bound rounds (to nearest "
    "even) to one value; the query rows holding undecided elements recomputed in MPFI interval arithmetic through "
    "attnref's templates, each stored value the common rounding of both interval ends, precision raised Ziv-style";

/// Backward cases append this to reference.method when their gradients are certified by the MPFI
/// ladder (the committed suite's), whichever method certified output, weights and lse.
inline constexpr const char* reference_method_gradients_suffix =
    "; gradients: mpfi-interval through attnref's templated backward (include/attnref/backward.hpp), each stored value the "
    "common rounding (to nearest even) of both interval ends, the whole backward recomputed Ziv-style at the next precision "
    "until every element agrees; exact zeros of the backward decided from the mask alone (golden/README.md)";

/// Backward cases whose gradients went through the fast backward (golden::certify_gradients_fast:
/// SDPA, ad-hoc cases of `attnref generate --name ... --gradients`, with or without --inputs-from) append this
/// instead; the values are the same (a correctly rounded value is unique).
inline constexpr const char* reference_method_fast_gradients_suffix =
    "; gradients: double-double then mpfi-interval: every gradient element computed in double-double with a rigorous "
    "error bound (include/attnref/certify/fast/backward.hpp; 106 in precisions_bits) and stored where value +- bound "
    "rounds (to nearest even) to one value; undecided elements from attnref's templated backward in MPFI interval "
    "arithmetic, precision raised Ziv-style; exact zeros of the backward decided from the mask alone (golden/README.md)";

struct manifest {
    case_spec spec;
    reference_info reference;
    std::vector<tensor_entry> tensors;
};

}  // namespace attnref::golden
