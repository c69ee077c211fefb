#pragma once
/// \file certify/fast/profile.hpp
/// A fast_observer that measures where the time goes: seconds per stage, summed over the threads
/// that ran it (for the worker stages: thread-seconds; for the others: wall seconds of the calling
/// thread). For benchmarks; the kernels themselves hold no timing code.

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>

#include "attnref/certify/fast/problem.hpp"

namespace attnref::fast {

class stage_timer final : public fast_observer {
public:
    void begin(fast_stage s) override { started()[index(s)] = clock::now(); }
    void end(fast_stage s) override {
        const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - started()[index(s)]).count();
        total_[index(s)].fetch_add(static_cast<long long>(ns), std::memory_order_relaxed);
    }
    /// Seconds spent in stage s so far (summed over threads).
    double seconds(fast_stage s) const { return static_cast<double>(total_[index(s)].load()) * 1e-9; }

private:
    using clock = std::chrono::steady_clock;
    static std::size_t index(fast_stage s) { return static_cast<std::size_t>(s); }
    static std::array<clock::time_point, fast_stage_count>& started() {
        thread_local std::array<clock::time_point, fast_stage_count> t{};
        return t;
    }
    std::array<std::atomic<long long>, fast_stage_count> total_{};
};

}  // namespace attnref::fast
