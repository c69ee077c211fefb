#pragma once
/// \file core/mask.hpp
/// Which keys each query may attend to, and what masked or empty rows produce.
///
/// Every mask kind below is optional and they combine: a key is attended to only if every
/// structural mask allows it (causal, sliding window, key padding, boolean mask, an additive mask
/// entry of −inf). Additive masks with finite values (and the seed's `mask · −1e9`) do not exclude a
/// key; they shift its logit, exactly as the libraries that use them do.
///
/// Alignment of the diagonal when Sq ≠ Sk (causal, sliding window and ALiBi share it):
///   diagonal(i) = i + diagonal_offset + (alignment == bottom_right ? Sk − Sq : 0)
///   causal:          key j allowed iff j ≤ diagonal(i)
///   sliding window:  key j allowed iff diagonal(i) − left ≤ j ≤ diagonal(i) + right
/// top_left is PyTorch's `is_causal` (tril(ones(Sq, Sk))), ONNX without a KV cache and JAX;
/// bottom_right is FlashAttention ≥ 2.1, PyTorch's `causal_lower_right` and cuDNN BOTTOM_RIGHT.
/// A positive diagonal_offset is ONNX's past-length offset.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <span>

#include "attnref/core/name_table.hpp"
#include "attnref/core/tensor.hpp"

namespace attnref {

enum class causal_alignment { top_left, bottom_right };
/// The names of the mask conventions (golden manifests, the CLI, the Python keywords), for
/// name_in / value_in (name_table.hpp).
inline constexpr std::pair<const char*, causal_alignment> causal_alignment_names[] = {
    {"top_left", causal_alignment::top_left}, {"bottom_right", causal_alignment::bottom_right}};

/// Meaning of a `true` (nonzero) entry of a boolean mask.
enum class mask_polarity {
    true_means_attend,  ///< PyTorch SDPA attn_mask, ONNX Attention, JAX, FlashAttention key_padding_mask
    true_means_masked,  ///< nn.MultiheadAttention key_padding_mask and bool attn_mask
};
inline constexpr std::pair<const char*, mask_polarity> mask_polarity_names[] = {
    {"true_means_attend", mask_polarity::true_means_attend}, {"true_means_masked", mask_polarity::true_means_masked}};

/// What a query row with no attendable key produces.
enum class empty_row_policy {
    zero,     ///< weights 0, output 0, lse −inf: PyTorch _safe_softmax, ONNX, FlashAttention, cuDNN (default)
    nan,      ///< weights NaN, output NaN, lse −inf: softmax over a row of −inf
    uniform,  ///< weights 1/Sk over all keys, output mean of V, lse −inf: what a finite fill (−1e9, JAX) gives
};
inline constexpr std::pair<const char*, empty_row_policy> empty_row_policy_names[] = {
    {"zero", empty_row_policy::zero}, {"nan", empty_row_policy::nan}, {"uniform", empty_row_policy::uniform}};

/// A mask tensor of logical shape (B, H, Sq, Sk) stored with extents (B or 1, H or 1, Sq, Sk):
/// axes of extent 1 broadcast. `E` is std::uint8_t for boolean masks (nonzero = true) and double for
/// additive masks. An empty view means "no mask of this kind".
template <class E>
struct broadcast_mask {
    tensor_view<const E, 4> values{};

    constexpr bool present() const { return !values.empty(); }
    constexpr E at(std::size_t b, std::size_t h, std::size_t i, std::size_t j) const {
        const std::size_t bb = values.extents[0] == 1 ? 0 : b;
        const std::size_t hh = values.extents[1] == 1 ? 0 : h;
        return values(bb, hh, i, j);
    }
};

struct sliding_window {
    std::optional<std::size_t> left;   ///< keys at most `left` before the diagonal; nullopt = unbounded
    std::optional<std::size_t> right;  ///< keys at most `right` after the diagonal; nullopt = unbounded
};

/// All masks of one attention call. Default: nothing masked.
struct mask_options {
    bool causal = false;
    causal_alignment alignment = causal_alignment::top_left;
    std::ptrdiff_t diagonal_offset = 0;
    std::optional<sliding_window> window;
    /// Per batch: number of valid keys (keys j ≥ length are masked). Empty span = no padding.
    std::span<const std::size_t> key_lengths{};
    broadcast_mask<std::uint8_t> boolean{};
    mask_polarity polarity = mask_polarity::true_means_attend;
    /// Added to the logits; −inf entries mask the key. Applied after soft-capping.
    broadcast_mask<double> additive{};
    /// The seed chapter's convention: logits += value · seed_mask_value (value 1 = masked). Never empties a row.
    broadcast_mask<double> seed{};
};

/// The seed chapter's seed-mask factor: a seed-mask entry m adds m · seed_mask_value to the logit.
inline constexpr double seed_mask_value = -1e9;

namespace detail {
/// A signed integer wide enough for i + diagonal_offset + (Sk − Sq) ± window (each term below 2^64
/// in magnitude): the mask decisions are exact for every representable input, never overflow.
__extension__ using wide_int = __int128;

constexpr wide_int wide_diagonal(const mask_options& m, std::size_t i, std::size_t sq, std::size_t sk) {
    wide_int d = static_cast<wide_int>(i) + static_cast<wide_int>(m.diagonal_offset);
    if (m.alignment == causal_alignment::bottom_right) d += static_cast<wide_int>(sk) - static_cast<wide_int>(sq);
    return d;
}
}  // namespace detail

/// Signed position of the diagonal for query row i (see file comment), saturated to ±2^62 so that
/// callers may subtract a key index from it without overflow (the exact value only matters for
/// |diagonal| < 2^62; masks use the exact wide value, structurally_masked below).
constexpr std::ptrdiff_t diagonal(const mask_options& m, std::size_t i, std::size_t sq, std::size_t sk) {
    constexpr detail::wide_int limit = detail::wide_int{1} << 62;
    const detail::wide_int d = detail::wide_diagonal(m, i, sq, sk);
    return static_cast<std::ptrdiff_t>(d > limit ? limit : d < -limit ? -limit : d);
}

/// ALiBi's distance of key j from the diagonal of query row i, |diagonal(i) − j|, as the double the
/// logit's ALiBi term slope·distance multiplies.
constexpr double alibi_distance(const mask_options& m, std::size_t i, std::size_t j, std::size_t sq, std::size_t sk) {
    const std::ptrdiff_t distance = diagonal(m, i, sq, sk) - static_cast<std::ptrdiff_t>(j);
    return static_cast<double>(distance < 0 ? -distance : distance);
}

/// True if key j is excluded for query (b, h, i) by a structural mask (everything except finite
/// additive/seed offsets). `sq`, `sk` are the sequence lengths. Exact for every diagonal_offset and
/// window (computed in a 128-bit integer).
constexpr bool structurally_masked(const mask_options& m, std::size_t b, std::size_t h, std::size_t i,
                                   std::size_t j, std::size_t sq, std::size_t sk) {
    const detail::wide_int d = detail::wide_diagonal(m, i, sq, sk);
    const auto sj = static_cast<detail::wide_int>(j);
    if (m.causal && sj > d) return true;
    if (m.window) {
        if (m.window->left && sj < d - static_cast<detail::wide_int>(*m.window->left)) return true;
        if (m.window->right && sj > d + static_cast<detail::wide_int>(*m.window->right)) return true;
    }
    if (!m.key_lengths.empty() && j >= m.key_lengths[b]) return true;
    if (m.boolean.present()) {
        const bool flag = m.boolean.at(b, h, i, j) != 0;
        if (flag == (m.polarity == mask_polarity::true_means_masked)) return true;
    }
    if (m.additive.present()) {
        const double a = m.additive.at(b, h, i, j);
        if (a == -std::numeric_limits<double>::infinity()) return true;
    }
    return false;
}

/// Validates mask shapes against (B, H, Sq, Sk); throws shape_error naming the field.
constexpr void validate_masks(const mask_options& m, std::size_t batch, std::size_t heads, std::size_t sq,
                              std::size_t sk) {
    auto check = [&](const auto& mask, const char* name) {
        if (!mask.present()) return;
        const auto& e = mask.values.extents;
        if (e[0] != 1 && e[0] != batch) throw shape_error(std::string(name) + " mask axis 0 (batch): expected 1 or " + std::to_string(batch) + ", got " + std::to_string(e[0]));
        if (e[1] != 1 && e[1] != heads) throw shape_error(std::string(name) + " mask axis 1 (heads): expected 1 or " + std::to_string(heads) + ", got " + std::to_string(e[1]));
        require_extent("mask axis 2 (query length)", e[2], sq, name);
        require_extent("mask axis 3 (key length)", e[3], sk, name);
    };
    check(m.boolean, "boolean");
    check(m.additive, "additive");
    check(m.seed, "seed");
    if (!m.key_lengths.empty()) {
        require_extent("key_lengths size (batch)", m.key_lengths.size(), batch);
        for (std::size_t b = 0; b < batch; ++b)
            if (m.key_lengths[b] > sk)
                throw shape_error("key_lengths[" + std::to_string(b) + "]: expected at most the key length " + std::to_string(sk) + ", got " + std::to_string(m.key_lengths[b]));
    }
}

}  // namespace attnref
