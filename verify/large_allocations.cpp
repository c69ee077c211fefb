/// Owns: how attnref's programs (the `attnref` command, bench/check.bench, bench/golden.bench) get
/// their large blocks of memory. Linked into those executables only, never into the header-only
/// library: a program that includes attnref keeps its own allocator.
///
/// A case at LLM size works on tensors of hundreds of MB (the weights of MHA (1, 2048, 1024, 16) are
/// 537 MB in double), most allocated, filled and freed in turn. With 4 KiB pages each fresh block
/// costs one page fault per 4 KiB; on a virtual machine a fault is a trap to the hypervisor, and
/// `perf` showed the faults of fresh memory taking 13% of an `attnref check` at that size, most of
/// it on the main thread while the other core waited. Blocks of 2 MiB and more are therefore
/// allocated on 2 MiB boundaries and marked MADV_HUGEPAGE, so that a kernel whose transparent huge
/// pages are in `madvise` mode (Debian's default) backs them with 2 MiB pages: one fault where there
/// were 512. Where the kernel has them `always` or `never`, the advice changes nothing; it never
/// changes a value, only where the pages come from (measured in docs/measurements.md).
///
/// A fresh page is zeroed by the kernel in the thread that first touches it, and on a virtual
/// machine that costs about a second per GB (`perf`, an `attnref check` at LLM size: 2.5 GB of fresh
/// pages, 3 s of clear_page on the main thread while the other core waited). Blocks of 32 MiB and
/// more are therefore touched, one byte per 2 MiB page, by several threads at once (as many as the
/// process may run on, at most 8) before they are returned: the zeroing is spread over the cores,
/// and the caller's own fill finds its pages present. Touching writes a zero byte into memory whose
/// contents are indeterminate anyway; no value depends on it or on the number of threads.
///
/// Freed large blocks whose size the caller gives back (sized delete: std::vector's, tensor's) are
/// kept, up to 16 of them, for the next allocation of the same whole number of 2 MiB pages: the
/// bound drivers allocate and free arrays of one shape in turn (66 blocks of 16 MiB in one check at
/// LLM size), and a kept block's pages are present. The first large allocation that none of them
/// fits frees them all before it asks the system, so kept blocks never coexist with a fresh large
/// one (the peak RSS of a check at LLM size is unchanged: docs/measurements.md). Only where large
/// blocks come from this file's path (Linux); elsewhere every delete frees.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>

#if defined(__linux__)
#include <sched.h>
#include <sys/mman.h>
#endif

namespace {

constexpr std::size_t huge_page = std::size_t{2} << 20;
constexpr std::size_t touched_in_parallel = std::size_t{32} << 20;

#if defined(__linux__) && defined(MADV_HUGEPAGE)
/// Writes a zero byte into each 2 MiB page of [p, p + n) (p on a page boundary, n whole pages),
/// the pages split into contiguous ranges over up to 8 threads (the CPUs this process may run on);
/// serially where no thread can be started.
void touch_pages(char* p, std::size_t n) noexcept {
    const std::size_t pages = n / huge_page;
    std::size_t cpus = 1;
    cpu_set_t set;
    if (::sched_getaffinity(0, sizeof set, &set) == 0) cpus = static_cast<std::size_t>(CPU_COUNT(&set));
    const std::size_t workers = std::clamp<std::size_t>(std::min(cpus, pages / 8), 1, 8);
    auto touch = [p, pages, workers](std::size_t w) {
        for (std::size_t k = pages * w / workers; k < pages * (w + 1) / workers; ++k) *static_cast<volatile char*>(p + k * huge_page) = 0;
    };
    std::size_t started = 0;
    std::thread threads[8];
    try {
        for (; started + 1 < workers; ++started) threads[started] = std::thread(touch, started + 1);
    } catch (const std::system_error&) {  // no more threads: this one touches what they would have
    } catch (const std::bad_alloc&) {
    }
    touch(0);
    for (std::size_t w = started + 1; w < workers; ++w) touch(w);
    for (std::size_t w = 0; w < started; ++w) threads[w].join();
}

/// Freed large blocks for reuse (see above), under a mutex (any thread allocates and frees).
struct kept_blocks {
    static constexpr std::size_t slots = 16;
    std::mutex m;
    void* block[slots] = {};
    std::size_t bytes[slots] = {};  ///< whole 2 MiB pages
    std::size_t count = 0;
};
constinit kept_blocks kept;

std::size_t whole_pages(std::size_t n) { return (n + huge_page - 1) / huge_page * huge_page; }

/// A kept block of exactly `rounded` bytes, or nullptr after freeing every kept block.
void* reuse_or_release(std::size_t rounded) noexcept {
    const std::lock_guard<std::mutex> lock(kept.m);
    for (std::size_t k = 0; k < kept.count; ++k)
        if (kept.bytes[k] == rounded) {
            void* p = kept.block[k];
            --kept.count;
            kept.block[k] = kept.block[kept.count], kept.bytes[k] = kept.bytes[kept.count];
            return p;
        }
    for (std::size_t k = 0; k < kept.count; ++k) std::free(kept.block[k]);
    kept.count = 0;
    return nullptr;
}
#endif

/// Frees p (allocated for n bytes), or keeps it for reuse when it is a large block and a slot is free.
void release(void* p, std::size_t n) noexcept {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (p && n >= huge_page && n <= SIZE_MAX - huge_page) {
        const std::lock_guard<std::mutex> lock(kept.m);
        if (kept.count < kept_blocks::slots) {
            kept.block[kept.count] = p, kept.bytes[kept.count] = whole_pages(n);
            ++kept.count;
            return;
        }
    }
#else
    (void)n;
#endif
    std::free(p);
}

/// n bytes, or nullptr when the system has none: whole 2 MiB pages on a 2 MiB boundary, advised as
/// huge, from 2 MiB up; malloc below.
void* allocate(std::size_t n) noexcept {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (n >= huge_page && n <= SIZE_MAX - huge_page) {
        const std::size_t rounded = whole_pages(n);
        if (void* reused = reuse_or_release(rounded)) return reused;
        void* p = std::aligned_alloc(huge_page, rounded);
        if (!p) return nullptr;
        (void)::madvise(p, rounded, MADV_HUGEPAGE);  // advice only: if refused, the pages are small
        if (rounded >= touched_in_parallel) touch_pages(static_cast<char*>(p), rounded);
        return p;
    }
#endif
    return std::malloc(n == 0 ? 1 : n);
}

/// The throwing form: the installed new-handler gets its chances, then std::bad_alloc.
void* allocate_or_throw(std::size_t n) {
    for (;;) {
        if (void* p = allocate(n)) return p;
        const std::new_handler handler = std::get_new_handler();
        if (!handler) throw std::bad_alloc();
        handler();
    }
}

}  // namespace

// The replaceable global allocation functions ([new.delete]); the aligned (std::align_val_t) forms
// keep the standard library's, which allocate with aligned_alloc and free with free as these do.
void* operator new(std::size_t n) { return allocate_or_throw(n); }
void* operator new[](std::size_t n) { return allocate_or_throw(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return allocate(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return allocate(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t n) noexcept { release(p, n); }
void operator delete[](void* p, std::size_t n) noexcept { release(p, n); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
