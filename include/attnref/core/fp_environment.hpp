#pragma once
/// \file core/fp_environment.hpp
/// Run-time check of the floating-point environment attnref's results are defined in.
///
/// attnref's builtin-type results (float, double, long double, __float128 and the emulated 16- and
/// 8-bit formats, which compute in float) are defined as IEEE 754 operations, each rounded once to
/// nearest, in the order the code spells out; the constant-evaluated path gives exactly those bits.
/// The run-time path gives them only in the environment below, which the compiler flags and the
/// thread's floating-point state decide, not the headers:
///
///   condition                   what breaks it                               fix
///   no contraction of a·b + c   GCC's default -ffp-contract=fast (and        compile with -ffp-contract=off (the
///                               Clang's -ffp-contract=fast) with an FMA      attnref::attnref CMake target adds it)
///                               target, e.g. -march=x86-64-v3 or native
///   round to nearest            fesetround(FE_UPWARD/DOWNWARD/TOWARDZERO)    fesetround(FE_TONEAREST) before the call
///   subnormals kept             flush-to-zero / denormals-are-zero (MXCSR    clear FTZ/DAZ (do not link with
///                               FTZ/DAZ; -ffast-math's crtfastmath.o)        -ffast-math / -Ofast)
///   FLT_EVAL_METHOD == 0        x87 arithmetic (-m32 -mfpmath=387): float    compile for SSE2 (-mfpmath=sse)
///                               and double evaluated in extended precision
///
/// check_fp_environment() probes each condition with volatile operands through inline code of this
/// header, i.e. with the same compiler flags as the attnref code the caller's translation unit
/// instantiates, and returns what is wrong; require_reference_fp_environment() throws
/// fp_environment_error naming the problem and the fix. The run-time entry points
/// (scaled_dot_product_attention_into and multi_head_attention_into, and everything built on
/// them) call it before computing; constant evaluation skips it (no environment is involved).
///
/// Contraction probe: a = 1 + 2^-30, b = 1 − 2^-30, c = −1. Exactly, a·b = 1 − 2^-60, which rounds
/// to 1, so a·b + c is 0 when the product is rounded (the reference semantics) and −2^-60 when it
/// is fused. The same for float with 2^-13 (−2^-26 fused). FTZ: 2^-126 · 2^-1 (float) must be the
/// subnormal 2^-127, not 0; DAZ: a subnormal operand must not read as 0. Interval, MPFR and
/// cpp_bin_float arithmetic do not depend on any of this, but one check per call costs a few
/// nanoseconds and keeps the rule simple.
///
/// Example:
///     if (auto problems = attnref::check_fp_environment(); !problems.empty()) std::puts(problems.c_str());

#include <bit>
#include <cfenv>
#include <cfloat>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace attnref {

/// Thrown by require_reference_fp_environment(); the message names each problem and its fix.
class fp_environment_error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

namespace detail {

// The probes are deliberately plain inline functions: a·b + c written the way attnref's kernels
// write their dot products, so the compiler treats them alike.
inline double fp_probe_multiply_add(double a, double b, double c) { return a * b + c; }
inline float fp_probe_multiply_add(float a, float b, float c) { return a * b + c; }

}  // namespace detail

/// Empty if the environment is the reference one; otherwise one sentence per problem, with its fix.
inline std::string check_fp_environment() {
    std::string problems;
    auto add = [&](const char* what) {
        if (!problems.empty()) problems += "; ";
        problems += what;
    };
    volatile double da = 1.0 + 0x1p-30, db = 1.0 - 0x1p-30, dc = -1.0;
    volatile float fa = 1.0f + 0x1p-13f, fb = 1.0f - 0x1p-13f, fc = -1.0f;
    const double d = detail::fp_probe_multiply_add(da, db, dc);
    const float f = detail::fp_probe_multiply_add(fa, fb, fc);
    if (d != 0.0 || f != 0.0f)
        add("floating-point contraction is on (a*b + c is fused into an FMA, so run-time results differ from "
            "attnref's reference and constant-evaluated ones): compile with -ffp-contract=off (the attnref::attnref "
            "CMake target adds it)");
    if (std::fegetround() != FE_TONEAREST)
        add("the rounding mode is not round-to-nearest: call std::fesetround(FE_TONEAREST) before calling attnref");
    volatile float smallest_normal = FLT_MIN, half = 0.5f;
    volatile float subnormal = smallest_normal * half;  // 2^-127: 0 under flush-to-zero
    const float s = subnormal;
    volatile float two = 2.0f;
    const float back = subnormal * two;  // 2^-126 unless the subnormal operand reads as 0 (DAZ)
    // FTZ is read off the stored bits: comparing s with 0 would itself treat s as 0 under DAZ.
    if (std::bit_cast<std::uint32_t>(s) == 0)
        add("subnormal results are flushed to zero (FTZ, e.g. MXCSR set by -ffast-math/-Ofast): clear flush-to-zero");
    else if (back != FLT_MIN)
        add("subnormal operands are treated as zero (DAZ, e.g. MXCSR set by -ffast-math/-Ofast): clear denormals-are-zero");
#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
    add("FLT_EVAL_METHOD is not 0 (float and double are evaluated in wider precision, e.g. x87 with -mfpmath=387): "
        "compile for SSE2 arithmetic (-mfpmath=sse)");
#endif
    return problems;
}

/// Throws fp_environment_error unless check_fp_environment() finds nothing.
inline void require_reference_fp_environment() {
    const std::string problems = check_fp_environment();
    if (!problems.empty()) throw fp_environment_error("attnref: unsupported floating-point environment: " + problems);
}

}  // namespace attnref
