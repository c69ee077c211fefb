#pragma once
/// \file golden/memory.hpp
/// Owns the memory estimates of every command (`generate`, `run`, `check`; every load_case also applies
/// case_memory_estimate), from the shapes alone and before anything is allocated. `generate`'s needs two
/// facts it is given (generate_memory_estimate_of; golden/generate.hpp's generate_memory_estimate passes
/// them): whether the fast path declines the case (the values) and MPFR's size of an interval. Each
/// estimate counts what the command holds at its peak, saturates at 2^64 − 1, and adds program_bytes
/// for the process itself. The limit they are compared with is max_memory() (safe_io.hpp: half the
/// machine's physical memory, at least 4 GiB, capped by RLIMIT_AS, unless --max-memory sets it).

#include <algorithm>
#include <cstdint>
#include <string>

#include "attnref/golden/manifest.hpp"
#include "attnref/golden/safe_io.hpp"

namespace attnref::golden {

/// The process itself (code, libraries, MPFR's constant caches, thread stacks in use): a two-element
/// case's `generate` peaks at about 12 MB resident; every command's estimate adds this once.
inline constexpr std::uint64_t program_bytes = std::uint64_t{32} << 20;

/// How generate_case certifies: the fast path with MPFI for what it cannot decide (default), or the
/// MPFI ladder alone (`attnref generate --method mpfi`; the reference the fast path is tested against).
enum class certification_method { fast, mpfi };

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
    return sat_add(bytes, program_bytes);
}

/// Estimated peak memory of `attnref check` on `spec`: what loading the case holds
/// (case_memory_estimate: the inputs and golden tensors with their working copies), per candidate
/// element judged its values read as doubles and its per-element bound (16 bytes each; the output
/// always counted, weights and lse when given, `gradient_values` gradient elements), for judged
/// weights or lse the exact logits and weights recomputed for their bounds and the invariant
/// P = exp(S − lse) (16 bytes per weight element), and program_bytes. Measured against peak
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
    return sat_add(bytes, program_bytes);
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

/// Estimated peak memory (bytes) of generate_case for `spec` by `method` on `threads` threads, from
/// the shapes alone (saturating at 2^64 − 1), with its parts for messages and docs.
///
/// fast (certify/fast.hpp): the inputs (the case's values, a copy, their .npy bytes: 24 bytes per
/// input value); per output element (output, weights, lse) its certified value for each of the nk
/// targets, the undecided flag and the serialised .npy (kept, and once more while comparing with a
/// case on disk): 8·nk + 1 + 2·(8 + 4·(nk − 1)); mha: the double-word projections Q, K, V, the merged
/// heads and the output (24 bytes per value) and the inputs' copy; per worker thread (at most B·H) one
/// head's double-word q, kᵀ, v (24 bytes per value) and a row workspace (200 bytes per key).
///
/// escalation: undecided elements are recomputed in MPFI (mpfi_runner): a full-size output and lse of
/// intervals, and for mha the interval projections (q, k, v and their per-head copies), the heads'
/// outputs and their merge — at the first escalation rung (133 bits, interval_bytes<40>), where
/// undecided elements almost always certify. Not counted: the weights' intervals (B·H·Sq·Sk, allocated
/// only when some weight is undecided after the fast path) and higher rungs (at most 2.6× the first).
///
/// gradients (certify_gradients, MPFI only): 256 bytes per value of 4 copies of the gradient tensors
/// and of 4 (B·H·Sq·Sk) intermediates of the backward; through the fast backward (fast_gradients):
/// gradients_fast_bytes and one (batch, kv head) group's MPFI ladder (gradients_group_mpfi_bytes),
/// the least its escalation needs (more groups run at once only where they fit).
///
/// mpfi, and a case the fast path declines as a whole (fast_path_declines): 256 bytes for every value
/// case_memory_estimate counts. Every estimate adds program_bytes.
struct generate_memory {
    std::uint64_t fast = 0, escalation = 0, gradients = 0, total = 0;
};

/// The MPFI ladder's gradients (certify_gradients): 256 bytes per value of 4 copies of the gradient
/// tensors and of 4 (B·H·Sq·Sk) intermediates of the backward.
inline std::uint64_t gradients_mpfi_bytes(const case_spec& spec) {
    using safe_io_detail::sat_add, safe_io_detail::sat_mul, safe_io_detail::sat_count;
    const case_shapes& d = spec.shapes;
    std::uint64_t g = 0;
    for (const gradient_tensor_layout& t : gradient_layout(spec)) g = sat_add(g, sat_count(t.shape));
    return sat_mul(256, sat_add(sat_mul(4, g), sat_mul(4, sat_mul(sat_mul(d.batch, d.heads), sat_mul(d.query_length, d.key_length)))));
}

/// The MPFI ladder of one (batch, kv head) group of an SDPA backward (certify_gradients_groups): 256
/// bytes per value of 4 copies of the group's gradients (G query heads' dQ, the kv head's dK, dV) and
/// of 4 (G·Sq·Sk) intermediates of its backward: gradients_mpfi_bytes for a case of one batch and one
/// kv head.
inline std::uint64_t gradients_group_mpfi_bytes(const case_spec& spec) {
    using safe_io_detail::sat_add, safe_io_detail::sat_mul;
    const case_shapes& d = spec.shapes;
    const std::uint64_t G = d.heads / std::max<std::size_t>(d.kv_heads, 1), Sq = d.query_length, Sk = d.key_length, dk = d.head_dim_qk,
                        dv = d.head_dim_v;
    const std::uint64_t g = sat_add(sat_mul(sat_mul(G, Sq), dk), sat_mul(Sk, sat_add(dk, dv)));
    return sat_mul(256, sat_add(sat_mul(4, g), sat_mul(4, sat_mul(G, sat_mul(Sq, Sk)))));
}

/// The fast backward (certify_gradients_fast): per gradient element its value for each of the nk
/// targets, the undecided flag and the serialised .npy (as for the outputs); per worker thread (at
/// most B·Hkv) one kv head's Pᵀ and dSᵀ with their bounds (48 bytes per (key, row of the group)), the
/// group's stacked dO and q and one head's buffers (24 bytes per value). The MPFI ladder for undecided
/// elements is gradients_group_mpfi_bytes per (batch, kv head) group computed at once
/// (certify_gradients_groups); generate_memory_estimate counts one. Multi-head attention adds its
/// projections' and gradients' double-word buffers; its MPFI ladder (the whole case) is checked
/// against max_memory() only when an element is left undecided.
inline std::uint64_t gradients_fast_bytes(const case_spec& spec, std::size_t threads) {
    using safe_io_detail::sat_add, safe_io_detail::sat_mul, safe_io_detail::sat_count;
    const case_shapes& d = spec.shapes;
    const std::uint64_t nk = 1 + spec.outputs.targets.size();
    std::uint64_t g = 0;
    for (const gradient_tensor_layout& t : gradient_layout(spec)) g = sat_add(g, sat_count(t.shape));
    const std::uint64_t B = d.batch, H = d.heads, Hkv = std::max<std::size_t>(d.kv_heads, 1), Sq = d.query_length, Sk = d.key_length,
                        dk = d.head_dim_qk, dv = d.head_dim_v, G = H / Hkv;
    const std::uint64_t workers = std::max<std::uint64_t>(1, std::min<std::uint64_t>(std::max<std::size_t>(threads, 1), sat_mul(B, Hkv)));
    const std::uint64_t per_worker = sat_add(sat_mul(48, sat_mul(Sk, sat_mul(G, Sq))),
                                             sat_mul(24, sat_add(sat_mul(sat_mul(G, Sq), sat_add(dk, dv)), sat_mul(Sk, sat_add(dk, dv)))));
    std::uint64_t total = sat_add(sat_mul(g, 8 * nk + 1 + 2 * (8 + 4 * (nk - 1))), sat_mul(workers, per_worker));
    if (spec.kind == case_kind::mha) {
        // mha_gradients_fast: Q, K, V (7), d(heads), dQ, dK, dV and the merged heads as double-words with
        // bounds (24 bytes per value), while the input and weight gradients are formed: one transposed
        // copy and one product of the largest of them at a time, [x | 1] and the transposed weights.
        const std::uint64_t q = sat_mul(sat_mul(B, Sq), sat_mul(H, dk)), k = sat_mul(sat_mul(B, Sk), sat_mul(Hkv, dk)),
                            v = sat_mul(sat_mul(B, Sk), sat_mul(Hkv, dv)), m = sat_mul(sat_mul(B, Sq), sat_mul(H, dv));
        const std::uint64_t largest = std::max({q, k, v, m});
        std::uint64_t xw = 0;
        for (const input_tensor_layout& t : input_layout(spec)) xw = sat_add(xw, sat_count(t.shape));
        total = sat_add(total, sat_mul(24, sat_add(sat_add(sat_mul(2, sat_add(sat_add(q, k), v)), sat_mul(2, m)), sat_mul(2, largest))));
        total = sat_add(total, sat_mul(16, xw));
    }
    return total;
}

/// Whether generate_case certifies the gradients of `spec` through the fast backward when asked to
/// (fast_gradients): SDPA and multi-head attention under the fast method.
inline bool uses_fast_gradients(const case_spec& spec, certification_method method, bool fast_gradients) {
    return fast_gradients && method == certification_method::fast && spec.outputs.gradients;
}

/// generate_memory_estimate with the two facts that need the case's values and MPFR: whether the fast
/// path declines the whole case (golden/generate.hpp fast_path_declines) and the bytes of one MPFI
/// interval at the ladder's first rung (generate.hpp interval_bytes).
inline generate_memory generate_memory_estimate_of(const case_spec& spec, certification_method method, std::size_t threads, bool declines,
                                                   bool fast_gradients, std::uint64_t first_rung_interval_bytes) {
    using safe_io_detail::sat_add, safe_io_detail::sat_mul, safe_io_detail::sat_count;
    constexpr std::uint64_t interval_bytes_per_value = 256;
    generate_memory m;
    if (method == certification_method::mpfi || declines) {
        m.total = sat_add(case_memory_estimate(spec, interval_bytes_per_value), program_bytes);
        return m;
    }
    const case_shapes& d = spec.shapes;
    const std::uint64_t nk = 1 + spec.outputs.targets.size();
    std::uint64_t inputs = 0;
    for (const input_tensor_layout& t : input_layout(spec)) inputs = sat_add(inputs, sat_count(t.shape));
    const std::uint64_t out = sat_count(output_shape(spec));
    const std::uint64_t weights = spec.outputs.weights ? sat_count(weights_shape(spec)) : 0;
    const std::uint64_t lse = spec.outputs.lse ? sat_count(lse_shape(spec)) : 0;
    const std::uint64_t per_output = 8 * nk + 1 + 2 * (8 + 4 * (nk - 1));
    m.fast = sat_add(sat_mul(inputs, 24), sat_mul(sat_add(sat_add(out, weights), lse), per_output));
    const std::uint64_t B = d.batch, H = d.heads, Hkv = d.kv_heads, Sq = d.query_length, Sk = d.key_length, dk = d.head_dim_qk,
                        dv = d.head_dim_v;
    const std::uint64_t q_proj = sat_mul(sat_mul(B, Sq), sat_mul(H, dk)), k_proj = sat_mul(sat_mul(B, Sk), sat_mul(Hkv, dk)),
                        v_proj = sat_mul(sat_mul(B, Sk), sat_mul(Hkv, dv)), merged = sat_mul(sat_mul(B, Sq), sat_mul(H, dv));
    if (spec.kind == case_kind::mha)
        m.fast = sat_add(m.fast, sat_add(sat_mul(24, sat_add(sat_add(q_proj, k_proj), sat_add(sat_add(v_proj, merged), out))),
                                         sat_mul(8, inputs)));
    const std::uint64_t workers = std::max<std::uint64_t>(1, std::min<std::uint64_t>(std::max<std::size_t>(threads, 1), sat_mul(B, H)));
    const std::uint64_t head = sat_add(sat_mul(24, sat_add(sat_mul(Sq, dk), sat_mul(Sk, sat_add(dk, dv)))), sat_mul(200, Sk));
    m.fast = sat_add(m.fast, sat_mul(workers, head));
    std::uint64_t escalated = sat_add(out, lse);
    if (spec.kind == case_kind::mha)
        escalated = sat_add(escalated, sat_add(sat_mul(2, sat_add(sat_add(q_proj, k_proj), v_proj)), sat_mul(2, merged)));
    m.escalation = sat_mul(escalated, first_rung_interval_bytes);
    if (spec.outputs.gradients)
        m.gradients = !uses_fast_gradients(spec, method, fast_gradients) ? gradients_mpfi_bytes(spec)
                      : spec.kind == case_kind::mha
                          ? gradients_fast_bytes(spec, threads)  // the whole-case MPFI ladder is checked when needed
                          : safe_io_detail::sat_add(gradients_fast_bytes(spec, threads), gradients_group_mpfi_bytes(spec));
    m.total = sat_add(sat_add(sat_add(m.fast, m.escalation), m.gradients), program_bytes);
    return m;
}

/// Refuses (data_error "<what>: field 'shapes': ...", naming the estimate, its parts and the limit)
/// a case whose generate_memory_estimate exceeds max_memory().
inline void require_generate_memory(const generate_memory& m, const case_spec& spec, certification_method method, const std::string& what,
                                    bool fast_gradients) {
    if (m.total <= max_memory()) return;
    const case_shapes& d = spec.shapes;
    auto size = [](std::uint64_t b) { return b == UINT64_MAX ? std::string("more than 2^64 bytes") : safe_io_detail::gib(b); };
    const std::string parts = method == certification_method::mpfi ? std::string("the MPFI ladder, 256 bytes per value")
                              : m.fast == 0 ? std::string("the MPFI ladder for the whole case, which the fast path declines; 256 bytes per value")
                                  : "fast path " + size(m.fast) + " + escalation in MPFI " + size(m.escalation) +
                                        (m.gradients ? (uses_fast_gradients(spec, method, fast_gradients) ? " + gradients by the fast backward " : " + gradients in MPFI ") +
                                                           size(m.gradients)
                                                     : std::string());
    throw data_error(what + ": field 'shapes': the case would need about " + size(m.total) + " (" + parts + "; B=" + std::to_string(d.batch) +
                     " H=" + std::to_string(d.heads) + " Sq=" + std::to_string(d.query_length) + " Sk=" + std::to_string(d.key_length) +
                     " dk=" + std::to_string(d.head_dim_qk) + " dv=" + std::to_string(d.head_dim_v) + "), above the limit of " +
                     safe_io_detail::gib(max_memory()) + " (raise it with --max-memory)");
}

}  // namespace attnref::golden
