#pragma once
/// \file check/candidate.hpp
/// What the checker judges: a candidate's tensors in memory (candidate, gradient_tensor) or as .npy
/// files (check_request), how to judge them (check_options), and the reader of a candidate file
/// (read_candidate: npy.hpp's header checks, then the data straight into doubles). Every tensor
/// carries the format it is judged in: a file's own descr ('<f8', '<f4', '<f2', '<u2' = bfloat16
/// bit patterns), or --dtype when given.

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>
#include <sys/mman.h>

#include "attnref/core/backward.hpp"
#include "attnref/core/formats.hpp"
#include "attnref/bounds/invariants.hpp"
#include "attnref/io/npy.hpp"
#include "attnref/bounds/tolerance.hpp"
#include "attnref/golden/case.hpp"
#include "attnref/golden/input_selection.hpp"

namespace attnref::golden {

/// How to judge: the tolerance model (tolerance.hpp) and the candidate's empty-row lse convention.
struct check_options {
    tolerance::tolerance_model model = tolerance::tolerance_model::data_aware;
    /// The lse the candidate writes for rows whose keys are all masked (FlashAttention 2/3: +inf).
    empty_row_lse empty_lse = empty_row_lse::minus_inf;
    /// The candidate's backward algorithm, when it declares one. textbook (dS from the forward's own
    /// normalised P) lets dQ's bound centre the keys ((B5t), docs/backward.md); flash or unknown keep
    /// (B5), valid for any algorithm. A false declaration can only make a correct kernel FAIL.
    std::optional<backward_algorithm> declared_backward;
    /// A declared precision policy (attnref check --policy NAME): the data-aware bounds follow its
    /// roundoffs instead of the candidate format's defaults. nullopt: the format's bound, valid for any kernel of it.
    std::optional<tolerance::policy_roundoffs> policy;
};

/// One gradient of a candidate, by role, as doubles in C order with the role's shape (gradient_roles).
struct gradient_tensor {
    std::string role;  ///< grad_query, grad_key, grad_value (sdpa and mha); mha also grad_w_q … grad_w_o, grad_b_q … grad_b_o
    std::span<const double> values;
    std::optional<tolerance::candidate_format> format;  ///< the format it is judged in; nullopt: the candidate's `format`
};

/// A candidate in memory: its outputs as doubles in C order with the case's shapes (output_shape,
/// weights_shape, lse_shape), holding values of `format` (a float32 kernel's outputs widened to
/// double). weights and lse are optional (empty: not given); their formats default to `format`,
/// and they are judged as computed in `format` and stored in theirs.
struct candidate {
    std::span<const double> output, weights, lse;  ///< output may be empty when gradients are given
    tolerance::candidate_format format = tolerance::candidate_format::float64;
    std::optional<tolerance::candidate_format> weights_format, lse_format;
    std::vector<gradient_tensor> gradients;  ///< optional, by role; each in its own format (default `format`)
};

/// A candidate given as .npy files (`attnref check`): paths, and the dtype when the files' descr
/// does not say it (bfloat16 stored as '<f4').
struct check_request {
    std::string golden, output, weights, lse;  ///< empty output/weights/lse: not given
    std::vector<std::pair<std::string, std::string>> gradients;  ///< (role, .npy file); role as in gradient_roles
    std::optional<tolerance::candidate_format> dtype;  ///< nullopt: each file's format from its own descr
    tolerance::tolerance_model model = tolerance::tolerance_model::data_aware;
    /// The lse the candidate writes for rows whose keys are all masked (FlashAttention 2/3: +inf).
    empty_row_lse empty_lse = empty_row_lse::minus_inf;
    std::optional<backward_algorithm> declared_backward;  ///< as check_options::declared_backward
    std::optional<tolerance::policy_roundoffs> policy;    ///< as check_options::policy (check/request.hpp resolve_policy)
    /// Which inputs the verdict is about (check/request.hpp resolve_check; run_check itself judges
    /// against the case it is given).
    input_selection inputs;
};

/// A shape as Python writes it: (2, 3), (4,).
inline std::string shape_text(const std::vector<std::size_t>& s) {
    std::string r = "(";
    for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + (s.size() == 1 ? ",)" : ")");
}

/// The `attnref check` flag of a gradient role: grad_w_q → grad-w-q.
inline std::string flag_of(std::string role) {
    std::replace(role.begin(), role.end(), '_', '-');
    return role;
}

namespace check_detail {

inline void advise_huge_pages([[maybe_unused]] void* p, [[maybe_unused]] std::size_t bytes) {
#ifdef MADV_HUGEPAGE
    const std::uintptr_t page = 4096, begin = (reinterpret_cast<std::uintptr_t>(p) + page - 1) & ~(page - 1),
                         end = (reinterpret_cast<std::uintptr_t>(p) + bytes) & ~(page - 1);
    if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);  // a hint: failure is harmless
#endif
}

/// The hot path for '<f8' and '<f4' candidates: the preamble and header are checked by
/// npy::parse_layout (the rules npy::read applies, including the file's size against the header),
/// then the data block is fread straight into the result — a '<f4' block into the upper half of
/// the doubles' storage and widened in place, front to back (double n ends at byte 8n + 8 ≤ 4N +
/// 4n + 4, where float n ends). One buffer, touched once. Returns nullopt whenever anything is not
/// plainly valid: the caller then takes the strict npy::read path, which accepts or rejects it
/// with its one-line message.
inline std::optional<std::vector<double>> read_in_place(const std::string& file, const std::vector<std::size_t>& shape,
                                                        std::string& descr) {
    if constexpr (std::endian::native != std::endian::little) return std::nullopt;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(file, ec)) return std::nullopt;
    const std::uintmax_t size = std::filesystem::file_size(file, ec);
    if (ec) return std::nullopt;
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(file.c_str(), "rb"), &std::fclose);
    if (!f) return std::nullopt;
    std::vector<std::byte> prefix(static_cast<std::size_t>(std::min<std::uintmax_t>(size, npy::max_prefix_bytes)));
    if (std::fread(prefix.data(), 1, prefix.size(), f.get()) != prefix.size()) return std::nullopt;
    npy::layout h;
    try {
        h = npy::parse_layout(prefix, size, file, npy::expectation{{"<f8", "<f4"}, shape});
    } catch (const npy::error&) {
        return std::nullopt;
    }
    const std::size_t item = h.meta.descr == "<f8" ? 8 : 4;
    const std::size_t count = h.data_bytes / item;
    if (count > std::numeric_limits<std::size_t>::max() / 8 || std::fseek(f.get(), static_cast<long>(h.data_offset), SEEK_SET) != 0)
        return std::nullopt;
    std::vector<double> r;
    r.reserve(count);  // allocated, not yet touched: ask for transparent huge pages (first-touch
    advise_huge_pages(r.data(), count * 8);  // page faults dominate reading into fresh memory)
    r.resize(count);
    std::byte* bytes = reinterpret_cast<std::byte*>(r.data());
    std::byte* block = item == 8 ? bytes : bytes + 4 * count;
    if (std::fread(block, 1, count * item, f.get()) != count * item || std::fgetc(f.get()) != EOF) return std::nullopt;
    if (item == 4) {
        for (std::size_t n = 0; n < count; ++n) {
            float v;
            std::memcpy(&v, block + 4 * n, 4);
            r[n] = static_cast<double>(v);
        }
    }
    descr = h.meta.descr;
    return r;
}

}  // namespace check_detail

/// Reads a candidate .npy as doubles ('<u2' = bfloat16 bit patterns). The shape must be `shape`;
/// an unset `format` is set from the file's descr. Throws data_error (one line) for a bad file.
inline std::vector<double> read_candidate(const std::string& file, const std::vector<std::size_t>& shape,
                                          std::optional<tolerance::candidate_format>& format) {
    namespace tol = attnref::tolerance;
    // Regular files only (a FIFO or device would block or stream forever), and nothing is allocated
    // before the header has been checked against `shape` and the file's size.
    require_regular_file(file, "candidate file");
    std::string fast_descr;
    if (std::optional<std::vector<double>> r = check_detail::read_in_place(file, shape, fast_descr)) {
        const auto from_descr = fast_descr == "<f8" ? tol::candidate_format::float64 : tol::candidate_format::float32;
        if (!format) format = from_descr;
        return std::move(*r);
    }
    npy::array a;
    try {
        a = npy::read(file, npy::expectation{{"<f8", "<f4", "<f2", "<u2"}, shape});
    } catch (const npy::error& e) {
        throw data_error(e.what());
    }
    std::optional<tol::candidate_format> from_descr;
    if (a.descr == "<f8") from_descr = tol::candidate_format::float64;
    else if (a.descr == "<f4") from_descr = tol::candidate_format::float32;
    else if (a.descr == "<f2") from_descr = tol::candidate_format::float16;
    else if (a.descr == "<u2") from_descr = tol::candidate_format::bfloat16;
    else throw data_error(file + ": header field 'descr': expected '<f8', '<f4', '<f2' or '<u2' (bfloat16 bits), got '" + a.descr + "'");
    if (!format) format = from_descr;
    if (a.descr == "<u2") {
        if (*format != tol::candidate_format::bfloat16)
            throw data_error(file + ": header field 'descr': '<u2' holds bfloat16 bit patterns, but --dtype is " +
                             std::string(tol::format_name(*format)));
        std::vector<double> r;
        for (std::uint16_t b : npy::to_vector<std::uint16_t>(a)) r.push_back(static_cast<double>(formats::bfloat16::from_bits(b)));
        return r;
    }
    return npy::to_double(a);
}

}  // namespace attnref::golden
