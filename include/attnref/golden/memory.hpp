#pragma once
/// \file golden/memory.hpp
/// Owns the memory estimates of `run` and `check` (the commands that compute with a case's shapes; every
/// load_case also applies case_memory_estimate), from the shapes alone and before anything is allocated; `generate`'s is
/// golden/generate.hpp's generate_memory_estimate (it needs MPFR's sizes). Each estimate counts
/// what the command holds at its peak, saturates at 2^64 − 1, and adds command_program_bytes for
/// the process itself. The limit they are compared with is max_memory() (safe_io.hpp: half the
/// machine's physical memory, at least 4 GiB, capped by RLIMIT_AS, unless --max-memory sets it).

#include <algorithm>
#include <cstdint>
#include <string>

#include "attnref/golden/manifest.hpp"
#include "attnref/golden/safe_io.hpp"

namespace attnref::golden {

/// The process itself (code, libraries, thread stacks in use): measured about 12 MB resident.
inline constexpr std::uint64_t command_program_bytes = std::uint64_t{32} << 20;

/// Estimated peak memory of `attnref run` on `spec` with a policy whose widest type takes
/// `value_bytes` bytes: the inputs as doubles (8 bytes each); per output element (output, weights,
/// lse) the policy's result and one intermediate (2·value_bytes) and its encoded copy and .npy bytes
/// (16); for gradient cases the gradients likewise and the backward's P, dP and dS (3 copies of
/// B·H·Sq·Sk in value_bytes); one more .npy image (16 bytes per value) of the largest file, read
/// while hashing the golden case.
inline std::uint64_t run_memory_estimate(const case_spec& spec, std::uint64_t value_bytes) {
    using safe_io_detail::sat_add, safe_io_detail::sat_mul, safe_io_detail::sat_count;
    std::uint64_t inputs = 0, largest = 0;
    for (const input_tensor_layout& t : input_layout(spec)) {
        inputs = sat_add(inputs, sat_count(t.shape));
        largest = std::max(largest, sat_count(t.shape));
    }
    std::uint64_t outputs = sat_count(output_shape(spec));
    largest = std::max(largest, outputs);
    if (spec.outputs.weights) outputs = sat_add(outputs, sat_count(weights_shape(spec)));
    largest = std::max(largest, sat_count(weights_shape(spec)));
    if (spec.outputs.lse) outputs = sat_add(outputs, sat_count(lse_shape(spec)));
    std::uint64_t backward = 0;
    for (const gradient_tensor_layout& g : gradient_layout(spec)) outputs = sat_add(outputs, sat_count(g.shape));
    if (!gradient_layout(spec).empty()) backward = sat_mul(3, sat_count(weights_shape(spec)));
    std::uint64_t bytes = sat_mul(8, inputs);
    bytes = sat_add(bytes, sat_mul(outputs, sat_add(sat_mul(2, value_bytes), 16)));
    bytes = sat_add(bytes, sat_mul(backward, value_bytes));
    bytes = sat_add(bytes, sat_mul(16, largest));
    return sat_add(bytes, command_program_bytes);
}

/// Estimated peak memory of `attnref check` on `spec`: what loading the case holds
/// (case_memory_estimate: the inputs and golden tensors with their working copies), per candidate
/// element judged its values read as doubles and its per-element bound (16 bytes each; the output
/// always counted, weights and lse when given, `gradient_values` gradient elements), for judged
/// weights or lse the exact logits and weights recomputed for their bounds and the invariant
/// P = exp(S − lse) (16 bytes per weight element), and command_program_bytes. Measured against peak
/// RSS in tests/hostile/hostile.py (estimates). declared_policy (`check --policy`): judged gradients'
/// bounds predict the policy's rounded heads or inputs (docs/backward.md (B15), (B16)) and run a
/// forward and two backwards in double besides (8 bytes per weight element for each of their P, dP,
/// dS and the forward's weights: 8 copies; 6 per gradient value: the two runs' gradients and the
/// extra bounds; 2 per input: the rounded copies); the forward's bound of a multi-head case holds
/// V·W_o per (batch, head, key) (data_aware_scales::sigma_weights, at most 2^22 values) and σ_P per output.
inline std::uint64_t check_memory_estimate(const case_spec& spec, bool weights, bool lse, std::uint64_t gradient_values,
                                           bool declared_policy = false) {
    using safe_io_detail::sat_add, safe_io_detail::sat_mul, safe_io_detail::sat_count;
    std::uint64_t judged = sat_add(sat_count(output_shape(spec)), gradient_values);
    const std::uint64_t w = sat_count(weights_shape(spec));
    if (weights) judged = sat_add(judged, w);
    if (lse) judged = sat_add(judged, sat_count(lse_shape(spec)));
    std::uint64_t bytes = sat_add(case_memory_estimate(spec), sat_mul(16, judged));
    if (weights || lse) bytes = sat_add(bytes, sat_mul(16, w));
    if (declared_policy) {
        std::uint64_t inputs = 0;
        for (const input_tensor_layout& t : input_layout(spec)) inputs = sat_add(inputs, sat_count(t.shape));
        std::uint64_t values = sat_add(sat_mul(2, inputs), sat_count(output_shape(spec)));
        if (gradient_values > 0) values = sat_add(values, sat_add(sat_mul(8, w), sat_mul(6, gradient_values)));
        if (spec.kind != case_kind::sdpa) values = sat_add(values, std::uint64_t{1} << 22);
        bytes = sat_add(bytes, sat_mul(8, values));
    }
    return sat_add(bytes, command_program_bytes);
}

/// Throws data_error "<file>: field 'shapes': the case would need about X for `command` ..., above the
/// limit of Y (raise it with --max-memory)" when `estimate` exceeds max_memory().
inline void require_memory(std::uint64_t estimate, const case_spec& spec, const std::string& file, const std::string& command) {
    if (estimate <= max_memory()) return;
    const case_shapes& d = spec.shapes;
    throw data_error(file + ": field 'shapes': " + command + " would need about " +
                     (estimate == UINT64_MAX ? std::string("more than 2^64 bytes") : safe_io_detail::gib(estimate)) + " (B=" +
                     std::to_string(d.batch) + " H=" + std::to_string(d.heads) + " Sq=" + std::to_string(d.query_length) +
                     " Sk=" + std::to_string(d.key_length) + " dk=" + std::to_string(d.head_dim_qk) + " dv=" + std::to_string(d.head_dim_v) +
                     "), above the limit of " + safe_io_detail::gib(max_memory()) + " (raise it with --max-memory)");
}

inline std::uint64_t case_memory_estimate(const case_spec& spec, std::uint64_t bytes_per_value) {
    std::uint64_t values = 0;
    for (const input_tensor_layout& t : input_layout(spec)) values = safe_io_detail::sat_add(values, safe_io_detail::sat_count(t.shape));
    values = safe_io_detail::sat_add(values, safe_io_detail::sat_mul(4, safe_io_detail::sat_count(output_shape(spec))));
    values = safe_io_detail::sat_add(values, safe_io_detail::sat_mul(4, safe_io_detail::sat_count(weights_shape(spec))));
    values = safe_io_detail::sat_add(values, safe_io_detail::sat_mul(2, safe_io_detail::sat_count(lse_shape(spec))));
    for (const gradient_tensor_layout& g : gradient_layout(spec))  // golden, candidate, bounds and their terms
        values = safe_io_detail::sat_add(values, safe_io_detail::sat_mul(4, safe_io_detail::sat_count(g.shape)));
    return safe_io_detail::sat_mul(values, bytes_per_value);
}

inline void check_case_memory(const case_spec& spec, const std::string& file, std::uint64_t bytes_per_value) {
    const std::uint64_t estimate = case_memory_estimate(spec, bytes_per_value);
    if (estimate <= max_memory()) return;
    const case_shapes& d = spec.shapes;
    throw data_error(file + ": field 'shapes': the case would need about " +
                     (estimate == UINT64_MAX ? std::string("more than 2^64 bytes") : safe_io_detail::gib(estimate)) + " (B=" + std::to_string(d.batch) +
                     " H=" + std::to_string(d.heads) + " Sq=" + std::to_string(d.query_length) + " Sk=" + std::to_string(d.key_length) +
                     " dk=" + std::to_string(d.head_dim_qk) + " dv=" + std::to_string(d.head_dim_v) + "), above the limit of " +
                     safe_io_detail::gib(max_memory()) + " (raise it with --max-memory)");
}

}  // namespace attnref::golden
