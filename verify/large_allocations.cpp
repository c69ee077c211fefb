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

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace {

constexpr std::size_t huge_page = std::size_t{2} << 20;

/// n bytes, or nullptr when the system has none: whole 2 MiB pages on a 2 MiB boundary, advised as
/// huge, from 2 MiB up; malloc below.
void* allocate(std::size_t n) noexcept {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (n >= huge_page && n <= SIZE_MAX - huge_page) {
        const std::size_t rounded = (n + huge_page - 1) / huge_page * huge_page;
        void* p = std::aligned_alloc(huge_page, rounded);
        if (p) (void)::madvise(p, rounded, MADV_HUGEPAGE);  // advice only: if refused, the pages are small
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
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
