#pragma once
/// \file certify/fast/problem.hpp
/// What the fast certified path is asked (fast_problem, fast_options), what it reports
/// (fast_stats), the observer through which a caller profiles it (fast_observer; the kernels hold
/// no timing code), and where each bounded element goes (element_sink: the rounding check).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attnref/core/attention.hpp"
#include "attnref/certify/fast/bounded.hpp"
#include "attnref/certify/fast/round_check.hpp"
#include "attnref/certify/report.hpp"
#include "attnref/core/multi_head_attention.hpp"
#include "attnref/core/tensor.hpp"

namespace attnref::fast {

/// The fast certified forward pass's input; `mha` selects multi-head attention.
struct fast_problem {
    bool mha = false;
    // SDPA
    tensor_view<const double, 4> q{}, k{}, v{};
    // MHA
    tensor_view<const double, 3> x_q{}, x_k{}, x_v{};
    mha_parameters<double> params{};
    std::size_t heads = 0, kv_heads = 0;
    attention_options options{};
};

/// The stages of a fast certification, as an observer sees them.
enum class fast_stage {
    projections,        ///< Q, K, V projections (multi-head), calling thread
    attention,          ///< the per-(b, h) attention core, calling thread (wall)
    logits,             ///< per row on a worker: q·kᵀ, scale, ALiBi, masks (8)
    softmax,            ///< per row on a worker: exp, sum, reciprocal, weights, lse (8a)–(8e)
    values,             ///< per row on a worker: P·V and its bounds (8f)
    output_projection,  ///< merged heads · W_o and the output checks (multi-head), calling thread
    escalation,         ///< the undecided elements through the ladder, calling thread
};
inline constexpr std::size_t fast_stage_count = 7;

/// Profiling hook: begin/end of every stage, on the thread that runs it (worker stages from several
/// threads at once). The default does nothing; certify/fast/profile.hpp has a timing observer.
struct fast_observer {
    virtual ~fast_observer() = default;
    virtual void begin(fast_stage) {}
    virtual void end(fast_stage) {}
};

/// Knobs for tests and benchmarks.
struct fast_options {
    std::size_t threads = 0;  ///< 0 = all hardware threads; results do not depend on it
    /// Multiplies every final bound before the rounding check. 1 in production. Tests set it below
    /// 1 to show that a weakened bound is caught by the comparison with MPFR.
    double bound_scale = 1.0;
    bool fallback = true;  ///< false: leave undecided elements undecided (tests of the fast rung)
    /// false: escalated multi-head rows go straight to the whole-batch MPFI ladder instead of first
    /// trying the row rung (row_rung.hpp; tests compare the two; the bytes are the same).
    bool row_rung = true;
    /// false: undecided SDPA gradient elements go straight to the (batch, kv head) group ladder
    /// instead of first trying the gradient rung (gradient_rung.hpp; same bytes, tested).
    bool gradient_rung = true;
    /// Tests: called with (tensor, element, value and bound after bound_scale) for every element the
    /// fast rung bounds (not for exact-by-construction ones). Called from worker threads.
    std::function<void(std::size_t, std::size_t, const bounded&)> observe;
    fast_observer* observer = nullptr;  ///< profiling (may be null)
};

struct fast_stats {
    std::string whole_case_reason;     ///< non-empty: the case went to MPFI as a whole, and why
    std::size_t escalated_elements = 0;  ///< elements (over tensors) the fast rung left undecided
    std::size_t escalated_rows = 0;    ///< (b, h, i) rows recomputed through the MPFI ladder
    std::size_t row_rung_rows = 0;         ///< (b, h, i) attention rows the row rung computed
    std::size_t row_rung_query_rows = 0;   ///< query rows the row rung computed (their Q projection)
    std::size_t row_rung_output_rows = 0;  ///< query rows with undecided outputs the row rung computed
    std::size_t ladder_rows = 0;       ///< (b, h, i) rows recomputed by the whole-batch MPFI ladder
};

namespace detail {

/// Calls observer->begin(s) now and observer->end(s) when it goes out of scope (no-op when null).
class stage_scope {
public:
    stage_scope(fast_observer* o, fast_stage s) : o_(o), s_(s) {
        if (o_) o_->begin(s_);
    }
    ~stage_scope() {
        if (o_) o_->end(s_);
    }
    stage_scope(const stage_scope&) = delete;
    stage_scope& operator=(const stage_scope&) = delete;

private:
    fast_observer* o_;
    fast_stage s_;
};

/// The certified tensors of one call, in order: output, then weights and lse when asked.
struct tensor_layout {
    bool weights = false, lse = false;
    std::size_t count() const { return 1 + weights + lse; }
    static constexpr std::size_t output = 0;
    std::size_t weights_index() const { return 1; }             ///< valid when weights
    std::size_t lse_index() const { return weights ? 2 : 1; }   ///< valid when lse
};

/// Where the bounded elements of one tensor go: the rounding check (9) per target.
struct element_sink {
    std::vector<std::vector<double>>* values;  ///< [target][n]
    std::vector<std::uint8_t>* undecided;      ///< [n]
    const std::vector<format_description>* targets;
    double bound_scale;
    std::size_t tensor;
    const std::function<void(std::size_t, std::size_t, const bounded&)>* observe;
    void put(std::size_t n, bounded x) const {
        x.bound = x.bound * bound_scale;
        if (*observe) (*observe)(tensor, n, x);
        bool all = true;
        for (std::size_t t = 0; t < targets->size(); ++t) all = round_check(x, (*targets)[t], (*values)[t][n]) && all;
        if (!all) (*undecided)[n] = 1;
    }
    /// True when the only target is float64 and no test observes the elements: then put_float64
    /// may decide an element without round_check.
    bool plain_float64() const {
        return targets->size() == 1 && (*targets)[0].precision == 53 && (*targets)[0].min_exponent == -1022 && !*observe;
    }
    void put_exact(std::size_t n, double v) const {
        for (std::size_t t = 0; t < targets->size(); ++t) (*values)[t][n] = v;
    }
};

}  // namespace detail
}  // namespace attnref::fast
