#pragma once
/// \file certify/fast/lanes.hpp
/// The double-word operations of double_double.hpp (add, mul, mag, up; two_sum and fast_two_sum are
/// double_double.hpp's own templates and double-word type, instantiated for the lane type) and
/// the helpers the per-key softmax work needs (fma, |x|, round to nearest, 2^k), written once for
/// a lane type V: `double` (the scalar reference) or four doubles (`v4d`, AVX2+FMA). Each
/// operation is the same IEEE operation on every lane, in the same order, so a kernel written with
/// these gives the same bits on the scalar and the vector path (docs/fast-certify.md (2), (3)).
/// The v4d overloads carry target("avx2,fma"); a kernel over v4d must be a target("avx2,fma")
/// function with `flatten`, so that the generic templates and these overloads are inlined into it.

#include <bit>
#include <cmath>
#include <cstdint>

#include "attnref/certify/fast/cpu.hpp"
#include "attnref/core/double_double.hpp"

namespace attnref::fast::detail::lanes {

// The lane templates (here and in attention_row.hpp) take and return four-double vectors when
// instantiated for the AVX2 kernels, into which they are always inlined (flatten); no such
// instantiation is called across a translation unit or ABI boundary, so GCC's -Wpsabi warning that
// a vector signature compiled without AVX changes the ABI does not apply. Some of these warnings are
// located at the end of the including translation unit (where the templates are instantiated:
// measured, attention_row.hpp's splat<v4d> "AVX vector return" with a push/pop pair around the
// templates), beyond the reach of a push/pop pair, so the warning is silenced for the rest of the
// translation unit. (The note "the ABI for passing parameters with 32-byte alignment has changed in
// GCC 4.6" is printed once per translation unit regardless.)
#pragma GCC diagnostic ignored "-Wpsabi"

/// A double-word of lanes: core/double_double.hpp's double-word type over the lane type.
template <class V>
using dwv = dw::double_word<V>;

inline double fma_l(double a, double b, double c) { return std::fma(a, b, c); }
inline double abs_l(double x) { return std::fabs(x); }
/// Round to nearest, ties to even (the reference environment's std::nearbyint).
inline double round_l(double x) { return std::nearbyint(x); }
/// 2^k for an integer-valued k in [−1022, 1023], exactly (the bits of k + 1023 in the exponent field).
inline double pow2_l(double k) {
    const double t = k + (1023.0 + 0x1p52);  // exact: an integer below 2^53; its low mantissa bits hold k + 1023
    return std::bit_cast<double>(std::bit_cast<std::uint64_t>(t) << 52);
}
/// 2^⌊log₂|x|⌋ for a normal x (the exponent field alone).
inline double binade_l(double x) { return std::bit_cast<double>(std::bit_cast<std::uint64_t>(x) & 0x7ff0000000000000ULL); }
/// ⌊x⌋ (exact).
inline double floor_l(double x) { return std::floor(x); }
/// Entry j (an integer-valued j in [0, 63]) of a table of 64 double-words.
inline dw::double_word<double> table_l(const dw::dd* t, double j) { return {t[static_cast<int>(j)].hi, t[static_cast<int>(j)].lo}; }

#ifdef ATTNREF_FAST_AVX2
typedef double v4d __attribute__((vector_size(32)));
typedef long long v4i __attribute__((vector_size(32)));
typedef double v4u __attribute__((vector_size(32), aligned(8), may_alias));  ///< unaligned loads and stores

__attribute__((target("avx2,fma"))) inline v4d fma_l(v4d a, v4d b, v4d c) { return __builtin_ia32_vfmaddpd256(a, b, c); }
__attribute__((target("avx2,fma"))) inline v4d abs_l(v4d x) {
    const v4i m = {0x7fffffffffffffffLL, 0x7fffffffffffffffLL, 0x7fffffffffffffffLL, 0x7fffffffffffffffLL};
    return v4d(v4i(x) & m);
}
__attribute__((target("avx2,fma"))) inline v4d round_l(v4d x) { return __builtin_ia32_roundpd256(x, 8); }  // nearest even, no exceptions
__attribute__((target("avx2,fma"))) inline v4d pow2_l(v4d k) {
    const v4d t = k + (1023.0 + 0x1p52);
    return v4d(v4i(t) << 52);
}
__attribute__((target("avx2,fma"))) inline v4d binade_l(v4d x) {
    const v4i m = {0x7ff0000000000000LL, 0x7ff0000000000000LL, 0x7ff0000000000000LL, 0x7ff0000000000000LL};
    return v4d(v4i(x) & m);
}
__attribute__((target("avx2,fma"))) inline v4d floor_l(v4d x) { return __builtin_ia32_roundpd256(x, 9); }  // toward −∞, no exceptions
/// Entry j of a table of 64 double-words, per lane (j integer-valued in [0, 63]: its bits from j + 2^52).
__attribute__((target("avx2,fma"))) inline dw::double_word<v4d> table_l(const dw::dd* t, v4d j) {
    const v4i k = v4i(j + 0x1p52) & 63;
    return {v4d{t[k[0]].hi, t[k[1]].hi, t[k[2]].hi, t[k[3]].hi}, v4d{t[k[0]].lo, t[k[1]].lo, t[k[2]].lo, t[k[3]].lo}};
}
#endif

// TwoSum and Fast2Sum are core/double_double.hpp's templates, instantiated for the lane type: the
// same operations on every lane.
using dw::fast_two_sum;
using dw::two_sum;
/// dw::add (JMP 2017 Algorithm 6).
template <class V>
inline dwv<V> add(dwv<V> x, dwv<V> y) {
    const dwv<V> s = two_sum(x.hi, y.hi);
    const dwv<V> t = two_sum(x.lo, y.lo);
    const V c = s.lo + t.hi;
    const dwv<V> v = fast_two_sum(s.hi, c);
    const V w = t.lo + v.lo;
    return fast_two_sum(v.hi, w);
}
template <class V>
inline dwv<V> sub(dwv<V> x, dwv<V> y) {
    return add(x, dwv<V>{-y.hi, -y.lo});
}
/// dw::mul of two double-words (JMP 2017 Algorithm 12).
template <class V>
inline dwv<V> mul(dwv<V> x, dwv<V> y) {
    const V p = x.hi * y.hi;
    const V e = fma_l(x.hi, y.hi, -p);
    const V tl0 = x.lo * y.lo;
    const V tl1 = fma_l(x.hi, y.lo, tl0);
    const V cl2 = fma_l(x.lo, y.hi, tl1);
    const V cl3 = e + cl2;
    return fast_two_sum(p, cl3);
}
/// dw::mul of a double-word by a double (JMP 2017 Algorithm 9).
template <class V>
inline dwv<V> mul(dwv<V> x, V y) {
    const V p = x.hi * y;
    const V e = fma_l(x.hi, y, -p);
    const V cl3 = fma_l(x.lo, y, e);
    return fast_two_sum(p, cl3);
}
template <class V>
inline V mag(dwv<V> x) {
    return abs_l(x.hi) * (1 + 0x1p-52);
}
/// dw::up for a finite computed bound (an infinite or NaN one gives infinity or NaN here, where
/// dw::up gives infinity: callers treat both as "not regular").
template <class V>
inline V up(V c) {
    return c * (1 + 0x1p-45) + 0x1p-999;
}

}  // namespace attnref::fast::detail::lanes
