#pragma once
/// \file core/softmax.hpp
/// The softmax algorithms. Each turns one row of logits x_j (with a flag per key: attendable or
/// masked) into weights p_j and the row's log-sum-exp. They are the same function in exact
/// arithmetic and round differently; all sums run over keys in ascending order, starting from 0.
///
///   naive             e_j = exp(x_j);  S = Σ e_j;  p_j = e_j / S;  lse = log(S)
///                     (overflows once x_j > log(max of T): kept because kernels do this)
///   shifted_division  m = max_j x_j;  e_j = exp(x_j − m);  S' = Σ_{j ≠ j*} e_j  (j* = first argmax)
///                     p_j = e_j / (1 + S');  lse = m + log1p(S')                      [default]
///                     Blanchard, Higham & Higham (2021): relative error of p_j ≤ (n + 3)u;
///                     summing the non-max terms apart and using log1p keeps lse accurate.
///   division_free     m, S' as above;  lse = m + log1p(S');  p_j = exp(x_j − lse)
///                     error grows with |lse| (the subtraction x_j − lse loses |lse|·u absolutely).
///   online(block b)   keys in blocks of b (FlashAttention's rescaling, Milakov & Gimelshein 2018):
///                     per block m' = max(m, block max);  S = S·exp(m − m') + Σ_block exp(x_j − m');
///                     at the end lse = m + log(S);  p_j = exp(x_j − m) / S.
///                     block_order reverse visits the same blocks [0, b), [b, 2b), ... last to first
///                     (keys within a block still ascending).
///
/// The shift m is chosen by shift_order<T> (scalar.hpp): `>` for point types, upper ends for
/// intervals; any m is exact in exact arithmetic (p_j = e^(x_j − m) / Σ e^(x_k − m), lse = m +
/// log Σ e^(x_k − m) for every m), so an interval computation stays an enclosure whichever m it picks,
/// and e_{j*} = 1 is exact for the key j* whose logit is m.
///
/// Masked keys get weight exactly 0. A row with no attendable key is "empty"; its weights follow the
/// empty_row_policy and its lse is −inf.

#include <cstddef>
#include <cstdint>
#include <span>

#include "attnref/core/mask.hpp"
#include "attnref/core/name_table.hpp"
#include "attnref/core/math.hpp"
#include "attnref/core/scalar.hpp"

namespace attnref {

enum class softmax_algorithm { naive, shifted_division, division_free, online };
/// The names of the softmax algorithms (golden manifests, `attnref run --softmax`), for name_in /
/// value_in (name_table.hpp). Studies print shifted_division as "shifted" (study.hpp).
inline constexpr std::pair<const char*, softmax_algorithm> softmax_algorithm_names[] = {
    {"naive", softmax_algorithm::naive},
    {"shifted_division", softmax_algorithm::shifted_division},
    {"division_free", softmax_algorithm::division_free},
    {"online", softmax_algorithm::online}};

/// Order in which the online algorithm visits the key blocks [0, b), [b, 2b), ...
enum class key_block_order { forward, reverse };

struct softmax_options {
    softmax_algorithm algorithm = softmax_algorithm::shifted_division;
    std::size_t block_size = 64;  ///< online only: keys per block (FlashAttention's kBlockN)
    key_block_order block_order = key_block_order::forward;  ///< online only: order of the key blocks
    empty_row_policy empty_rows = empty_row_policy::zero;
};

/// Running state of the online algorithm: the current max m and the sum S of exp(x_j − m).
template <Scalar T>
struct online_softmax {
    T max = T(0);
    T sum = T(0);
    bool started = false;

    /// Absorbs keys [begin, end). Writes e_j = exp(x_j − m') to terms[j] for attendable keys (0 for
    /// masked ones) and returns the factor exp(m − m') by which anything accumulated so far must be
    /// rescaled (1 before the first attendable key). A block with no attendable key changes nothing.
    constexpr T absorb(std::span<const T> logits_span, std::span<const std::uint8_t> allowed_span, std::size_t begin,
                       std::size_t end, std::span<T> terms_span) {
        const T* logits = logits_span.data();
        const std::uint8_t* allowed = allowed_span.data();
        T* terms = terms_span.data();
        bool any = false;
        T block_max = T(0);
        for (std::size_t j = begin; j < end; ++j) {
            terms[j] = T(0);
            if (!allowed[j]) continue;
            if (!any || shift_order<T>::greater(logits[j], block_max)) block_max = logits[j];
            any = true;
        }
        if (!any) return T(1);
        T factor = T(1);
        if (!started) {
            max = block_max;
            started = true;
        } else if (shift_order<T>::greater(block_max, max)) {
            const T delta = max - block_max;
            factor = math::exp(delta);
            max = block_max;
            const T rescaled = sum * factor;
            sum = rescaled;
        }
        for (std::size_t j = begin; j < end; ++j) {
            if (!allowed[j]) continue;
            const T shifted = logits[j] - max;
            terms[j] = math::exp(shifted);
            const T next = sum + terms[j];
            sum = next;
        }
        return factor;
    }

    constexpr T lse() const {
        const T log_sum = math::log(sum);
        return max + log_sum;
    }
    /// Final weights p_j = exp(x_j − m) / S.
    constexpr void weights(std::span<const T> logits_span, std::span<const std::uint8_t> allowed_span, std::span<T> out_span) const {
        const T* logits = logits_span.data();
        const std::uint8_t* allowed = allowed_span.data();
        T* out = out_span.data();
        for (std::size_t j = 0; j < logits_span.size(); ++j) {
            if (!allowed[j]) {
                out[j] = T(0);
                continue;
            }
            const T shifted = logits[j] - max;
            const T e = math::exp(shifted);
            out[j] = e / sum;
        }
    }
};

/// Weights of an empty row under `policy` (n = number of keys).
template <Scalar T>
constexpr T empty_row_weight(empty_row_policy policy, std::size_t n) {
    switch (policy) {
        case empty_row_policy::zero: return T(0);
        case empty_row_policy::nan: return quiet_NaN<T>();
        case empty_row_policy::uniform: return T(1) / T(static_cast<int>(n));
    }
    return T(0);
}

/// Number of attendable keys.
constexpr std::size_t count_allowed(std::span<const std::uint8_t> allowed) {
    std::size_t n = 0;
    const std::uint8_t* a = allowed.data();
    for (std::size_t j = 0; j < allowed.size(); ++j) n += a[j] ? 1 : 0;
    return n;
}

/// Softmax of one row: writes weights (same length as logits) and returns the lse.
/// Logits of masked keys are not read. See the file comment for each algorithm's formula.
template <Scalar T>
constexpr T softmax_row(const softmax_options& options, std::span<const T> logits_span,
                        std::span<const std::uint8_t> allowed_span, std::span<T> weights_span) {
    // Raw pointers in the loops: the constant evaluator pays for every span::operator[] call.
    const std::size_t n = logits_span.size();
    const T* logits = logits_span.data();
    const std::uint8_t* allowed = allowed_span.data();
    T* weights = weights_span.data();
    if (count_allowed(allowed_span) == 0) {
        for (std::size_t j = 0; j < n; ++j) weights[j] = empty_row_weight<T>(options.empty_rows, n);
        return -infinity<T>();
    }
    switch (options.algorithm) {
        case softmax_algorithm::naive: {
            T sum = T(0);
            for (std::size_t j = 0; j < n; ++j) {
                weights[j] = T(0);
                if (!allowed[j]) continue;
                weights[j] = math::exp(logits[j]);
                const T next = sum + weights[j];
                sum = next;
            }
            for (std::size_t j = 0; j < n; ++j)
                if (allowed[j]) weights[j] = weights[j] / sum;
            return math::log(sum);
        }
        case softmax_algorithm::shifted_division:
        case softmax_algorithm::division_free: {
            std::size_t argmax = n;
            for (std::size_t j = 0; j < n; ++j)
                if (allowed[j] && (argmax == n || shift_order<T>::greater(logits[j], logits[argmax]))) argmax = j;
            const T max = logits[argmax];
            T rest = T(0);  // S' = Σ_{j ≠ argmax} exp(x_j − m)
            for (std::size_t j = 0; j < n; ++j) {
                weights[j] = T(0);
                if (!allowed[j]) continue;
                if (j == argmax) {
                    weights[j] = T(1);
                    continue;
                }
                const T shifted = logits[j] - max;
                weights[j] = math::exp(shifted);
                const T next = rest + weights[j];
                rest = next;
            }
            const T log_sum = math::log1p(rest);
            const T lse = max + log_sum;
            if (options.algorithm == softmax_algorithm::shifted_division) {
                const T sum = T(1) + rest;
                for (std::size_t j = 0; j < n; ++j)
                    if (allowed[j]) weights[j] = weights[j] / sum;
            } else {
                for (std::size_t j = 0; j < n; ++j) {
                    if (!allowed[j]) continue;
                    const T shifted = logits[j] - lse;
                    weights[j] = math::exp(shifted);
                }
            }
            return lse;
        }
        case softmax_algorithm::online: {
            online_softmax<T> state;
            const std::size_t block = options.block_size == 0 ? n : options.block_size;
            const std::size_t blocks = (n + block - 1) / block;
            for (std::size_t t = 0; t < blocks; ++t) {
                const std::size_t begin = (options.block_order == key_block_order::reverse ? blocks - 1 - t : t) * block;
                const std::size_t end = begin + block < n ? begin + block : n;
                state.absorb(logits_span, allowed_span, begin, end, weights_span);
            }
            state.weights(logits_span, allowed_span, weights_span);
            return state.lse();
        }
    }
    return T(0);
}

}  // namespace attnref
