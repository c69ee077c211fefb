#pragma once
/// \file core/parallel.hpp
/// attnref's one thread pool: work splitting over independent tasks (parallel_for: task n on thread
/// n mod threads; parallel_for_dynamic: tasks handed out in order as threads become free). Each task writes only its own outputs and computes them in a
/// fixed order, so results do not depend on the number of threads. In constant evaluation (and with
/// threads == 1) tasks run in order on the calling thread.
///
/// Boost.Multiprecision types with run-time precision (mpfr_float, mpfi_float with 0 digits) keep
/// their default precision per thread; use the fixed-precision types with threads > 1.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace attnref {

namespace parallel_detail {
/// The first exception caught by any worker of a pool (run(f): f(), recording what it throws).
class pool_failure {
public:
    template <class F>
    void run(F&& f) {
        try {
            f();
        } catch (...) {
            const std::lock_guard<std::mutex> lock(mutex_);
            if (!failure_) failure_ = std::current_exception();
        }
    }
    void rethrow() const {
        if (failure_) std::rethrow_exception(failure_);
    }

private:
    std::exception_ptr failure_;
    std::mutex mutex_;
};

/// Starts `threads` workers, each running worker(t, failure) and then at_thread_exit (may be null),
/// joins them, and rethrows the first exception recorded in `failure`.
template <class W>
void run_workers(std::size_t threads, W&& worker, void (*at_thread_exit)()) {
    pool_failure failure;
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (std::size_t t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
            worker(t, failure);
            if (at_thread_exit) at_thread_exit();
        });
    for (std::thread& th : pool) th.join();
    failure.rethrow();
}
}  // namespace parallel_detail

/// Task n on thread n mod threads; a thread stops at its first exception, the others finish.
template <class F>
void parallel_for_threads(std::size_t count, std::size_t threads, F& task, void (*at_thread_exit)()) {
    parallel_detail::run_workers(
        threads,
        [&](std::size_t t, parallel_detail::pool_failure& failure) {
            failure.run([&] {
                for (std::size_t n = t; n < count; n += threads) task(n);
            });
        },
        at_thread_exit);
}

/// Runs task(0) … task(count − 1). threads == 0: std::thread::hardware_concurrency().
/// `at_thread_exit` (may be null) runs at the end of each worker thread started here, e.g.
/// thread_cleanup<T>::run to free an arithmetic's thread-local caches.
template <class F>
constexpr void parallel_for(std::size_t count, std::size_t threads, F&& task, void (*at_thread_exit)() = nullptr) {
    if (std::is_constant_evaluated()) {
        for (std::size_t n = 0; n < count; ++n) task(n);
        return;
    }
    if (threads == 0) threads = std::max<std::size_t>(1, std::thread::hardware_concurrency());
    threads = std::min(threads, count);
    if (threads <= 1) {
        for (std::size_t n = 0; n < count; ++n) task(n);
        return;
    }
    parallel_for_threads(count, threads, task, at_thread_exit);
}

/// Runs task(0) … task(count − 1) on up to `threads` threads (0: all hardware threads), handing
/// the tasks out in index order as threads become free: for tasks of uneven cost. With several
/// threads every task runs even when another throws, and the first exception caught is rethrown
/// when all have finished; with one thread the tasks run in order on the calling thread and an
/// exception leaves at once. `at_thread_exit` (may be null) runs at the end of each worker thread.
template <class F>
void parallel_for_dynamic(std::size_t count, std::size_t threads, F&& task, void (*at_thread_exit)() = nullptr) {
    if (threads == 0) threads = std::max<std::size_t>(1, std::thread::hardware_concurrency());
    threads = std::min(threads, count);
    if (threads <= 1) {
        for (std::size_t n = 0; n < count; ++n) task(n);
        return;
    }
    std::atomic<std::size_t> next{0};
    parallel_detail::run_workers(
        threads,
        [&](std::size_t, parallel_detail::pool_failure& failure) {
            for (std::size_t n = next++; n < count; n = next++) failure.run([&] { task(n); });
        },
        at_thread_exit);
}

}  // namespace attnref
