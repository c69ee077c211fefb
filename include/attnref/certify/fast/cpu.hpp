#pragma once
/// \file certify/fast/cpu.hpp
/// Which vector kernels of the fast certified path exist (ATTNREF_FAST_AVX2: x86-64, GCC or Clang,
/// not the sanitizer build) and whether the processor running them has AVX2 and FMA. Every AVX2
/// kernel performs its scalar reference's operations in the same order, so the choice never
/// changes a bit (tests/runtime/fast_certify.test.cpp checks this).

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(ATTNREF_SANITIZE_BUILD)
#define ATTNREF_FAST_AVX2 1
#endif

namespace attnref::fast::detail {

/// True when the AVX2+FMA kernels are compiled in and the processor has both extensions (asked once).
inline bool has_avx2_fma() {
#ifdef ATTNREF_FAST_AVX2
    static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return yes;
#else
    return false;
#endif
}

}  // namespace attnref::fast::detail
