// Every operation the certified path (uniform_precision<mpfr_interval<D>>) reaches returns an
// enclosure of its exact result: the proof obligation listed in include/attnref/certify/certify.hpp's
// table. Each operation is called exactly as the library calls it (attnref::math::f dispatch for
// the functions, the operators of the Boost number type, the constants built by attention.hpp),
// on adversarial intervals, and its result must contain MPFR's value of the exact function at 4×
// the bits (and more), evaluated at the input interval's ends and midpoint (all monotone pieces:
// those are the extremes, plus an inner point).
//
// Why the check is exact, not approximate: the input ends are representable at both precisions,
// the result's ends are numbers of the low precision, hence of the high one, and rounding to
// nearest is monotonic: lo ≤ v ≤ hi implies lo = RN(lo) ≤ RN(v) ≤ RN(hi) = hi. So a correct
// enclosure always contains the high-precision value, and a reported miss is a real miss.
//
// The negative tests run the same checker on deliberately non-enclosing stand-ins (a
// round-to-nearest "interval" of zero width, and the true enclosure shifted up by one ulp) and
// require it to report misses: the checker can fail.
#define BOOST_TEST_MODULE enclosure
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <mpfr.h>

#include "attnref/core/attention.hpp"
#include "attnref/core/math.hpp"
#include "attnref/multiprecision/multiprecision.hpp"

using namespace attnref;

namespace {

/// A high-precision real (bits), RAII.
struct hp {
    mpfr_t v;
    explicit hp(mpfr_prec_t bits) { mpfr_init2(v, bits); }
    ~hp() { mpfr_clear(v); }
    hp(const hp&) = delete;
    hp& operator=(const hp&) = delete;
};

using ref_unary = std::function<void(mpfr_ptr, mpfr_srcptr)>;
using ref_binary = std::function<void(mpfr_ptr, mpfr_srcptr, mpfr_srcptr)>;

/// The stand-ins the negative tests plug in: the genuine result, a zero-width round-to-nearest
/// point, or the genuine enclosure shifted up by one ulp of its precision.
enum class stand_in { genuine, round_to_nearest, shifted_one_ulp };

template <unsigned D>
mpfr_interval<D> make(const mpfr_real<D>& a, const mpfr_real<D>& b) {
    return mpfr_interval<D>(a, b);
}

/// Applies the stand-in to a genuine interval result `r`; `point` is f at the interval's midpoint,
/// rounded to nearest at the interval's precision.
template <unsigned D>
mpfr_interval<D> apply(stand_in s, const mpfr_interval<D>& r, const mpfr_real<D>& point) {
    switch (s) {
        case stand_in::genuine: return r;
        case stand_in::round_to_nearest: return make<D>(point, point);
        case stand_in::shifted_one_ulp: {
            mpfr_real<D> lo = lower_end(r), hi = upper_end(r);
            mpfr_nextabove(lo.backend().data());
            mpfr_nextabove(hi.backend().data());
            return make<D>(lo, hi);
        }
    }
    return r;
}

/// True if [lo, hi] of x contains the high-precision value y (NaN: both must be NaN).
template <unsigned D>
bool contains(const mpfr_interval<D>& x, mpfr_srcptr y) {
    mpfr_srcptr lo = &x.backend().data()[0].left, hi = &x.backend().data()[0].right;
    if (mpfr_nan_p(y)) return mpfr_nan_p(lo) && mpfr_nan_p(hi);
    if (mpfr_nan_p(lo) || mpfr_nan_p(hi)) return true;  // NaN ends enclose nothing in particular: MPFI's "undefined"
    return mpfr_lessequal_p(lo, y) && mpfr_lessequal_p(y, hi);
}

/// Input intervals around each point x: [x, x], [x·(1 − 2^-60), x·(1 + 2^-60)] (exact at 134 bits:
/// 53 + 60 significant bits), and for x ≠ 0 one straddling 0, [−|x|/2, |x|].
template <unsigned D>
std::vector<mpfr_interval<D>> inputs_around(const std::vector<double>& points, bool straddle) {
    std::vector<mpfr_interval<D>> r;
    for (double x : points) {
        const mpfr_real<D> p(x);
        r.push_back(make<D>(p, p));
        if (x != 0 && std::isfinite(x)) {
            const mpfr_real<D> e = mpfr_real<D>(std::fabs(x)) * mpfr_real<D>(0x1p-60);
            r.push_back(make<D>(p - e, p + e));
            if (straddle) r.push_back(make<D>(-mpfr_real<D>(std::fabs(x)) / 2, mpfr_real<D>(std::fabs(x))));
        }
    }
    return r;
}

/// (lo + hi)/2 of x into m (exact at m's precision, which exceeds x's by more than one bit); the
/// finite end if the other is infinite.
template <unsigned D>
void midpoint(mpfr_ptr m, const mpfr_interval<D>& x) {
    mpfr_srcptr lo = &x.backend().data()[0].left, hi = &x.backend().data()[0].right;
    if (!mpfr_number_p(lo)) mpfr_set(m, hi, MPFR_RNDN);
    else if (!mpfr_number_p(hi)) mpfr_set(m, lo, MPFR_RNDN);
    else {
        mpfr_add(m, lo, hi, MPFR_RNDN);
        mpfr_div_2ui(m, m, 1, MPFR_RNDN);
    }
}

/// Ends and midpoint of x, as high-precision values (exact).
template <unsigned D>
std::vector<hp*> probe_points(const mpfr_interval<D>& x, mpfr_prec_t bits) {
    std::vector<hp*> r{new hp(bits), new hp(bits), new hp(bits)};
    mpfr_set(r[0]->v, &x.backend().data()[0].left, MPFR_RNDN);
    mpfr_set(r[1]->v, &x.backend().data()[0].right, MPFR_RNDN);
    midpoint<D>(r[2]->v, x);
    return r;
}
void release(std::vector<hp*>& v) {
    for (hp* p : v) delete p;
    v.clear();
}

/// Counts the probes whose high-precision value (bits) the operation's result fails to contain.
template <unsigned D>
int unary_misses(const std::string& name, const std::function<mpfr_interval<D>(const mpfr_interval<D>&)>& f,
                 const ref_unary& reference, const std::vector<mpfr_interval<D>>& inputs, mpfr_prec_t bits, stand_in s,
                 bool report) {
    int misses = 0;
    hp xin(bits), y(bits);
    for (const mpfr_interval<D>& x : inputs) {
        const mpfr_interval<D> genuine = f(x);
        mpfr_real<D> point;
        {
            hp mid(bits);
            midpoint<D>(mid.v, x);
            reference(y.v, mid.v);
            mpfr_set(point.backend().data(), y.v, MPFR_RNDN);
        }
        const mpfr_interval<D> r = apply<D>(s, genuine, point);
        std::vector<hp*> probes = probe_points<D>(x, bits);
        for (hp* p : probes) {
            mpfr_set(xin.v, p->v, MPFR_RNDN);
            reference(y.v, xin.v);
            if (!contains(r, y.v)) {
                ++misses;
                if (report)
                    BOOST_ERROR(name << ": result [" << lower_end(r) << ", " << upper_end(r) << "] misses f("
                                     << mpfr_get_d(p->v, MPFR_RNDN) << ") at " << bits << " bits");
            }
        }
        release(probes);
    }
    return misses;
}

template <unsigned D>
int binary_misses(const std::string& name,
                  const std::function<mpfr_interval<D>(const mpfr_interval<D>&, const mpfr_interval<D>&)>& f,
                  const ref_binary& reference, const std::vector<mpfr_interval<D>>& inputs, mpfr_prec_t bits, stand_in s,
                  bool report) {
    int misses = 0;
    hp a(bits), b(bits), y(bits);
    for (const mpfr_interval<D>& x : inputs)
        for (const mpfr_interval<D>& z : inputs) {
            // Distinct objects: with one object, Boost's a * a is mpfi_sqr (the same exact value on
            // both sides), which must not be probed at two independent points ("square" covers it).
            const mpfr_interval<D> xa = x, za = z;
            const mpfr_interval<D> genuine = f(xa, za);
            mpfr_real<D> point;
            midpoint<D>(a.v, x);
            midpoint<D>(b.v, z);
            reference(y.v, a.v, b.v);
            mpfr_set(point.backend().data(), y.v, MPFR_RNDN);
            const mpfr_interval<D> r = apply<D>(s, genuine, point);
            std::vector<hp*> px = probe_points<D>(x, bits), pz = probe_points<D>(z, bits);
            for (hp* p : px)
                for (hp* q : pz) {
                    reference(y.v, p->v, q->v);
                    if (mpfr_nan_p(y.v)) continue;  // 0·inf, inf − inf, x/0: no exact value to enclose
                    if (!contains(r, y.v)) {
                        ++misses;
                        if (report)
                            BOOST_ERROR(name << ": result [" << lower_end(r) << ", " << upper_end(r) << "] misses f("
                                             << mpfr_get_d(p->v, MPFR_RNDN) << ", " << mpfr_get_d(q->v, MPFR_RNDN)
                                             << ") at " << bits << " bits");
                    }
                }
            release(px);
            release(pz);
        }
    return misses;
}

// Adversarial points: 0, tiny (the smallest double subnormal, 2^-140 below the 134-bit ulp of 1),
// huge, near the series/reduction cut-overs of the functions, and MPFR's own exponent-range borders
// (exp of ±7.5e8 over/underflows MPFR's default exponent range of ±2^30: the softmax of a seed-masked
// key, logit ≈ −1e9, lands there).
const std::vector<double> exp_points{0.0, 0x1p-1074, -0x1p-1074, 0x1p-140, -0x1p-140, 0x1p-60, 1e-300, 0.5, -0.5,
                                     0.6931471805599453, 1.0, -1.0, 10.5, 11.09, 88.72, 709.78, -745.13, 7.44e8,
                                     -7.45e8, -1e9, 1e9, 1e300, -1e300};
const std::vector<double> log_points{0x1p-1074, 0x1p-140, 1e-300, 0.5, 0.7071067811865476, 1.0 - 0x1p-53, 1.0,
                                     1.0 + 0x1p-52, 1.4142135623730951, 2.0, 1e10, 1e300, 0x1.fffffffffffffp1023};
const std::vector<double> log1p_points{0.0, 0x1p-1074, -0x1p-1074, 0x1p-140, -0x1p-140, 1e-300, 1e-10, -0.25, 0.4142135623730951,
                                       -0.2928932188134524, -1.0 + 0x1p-53, -0.999999, 1.0, 1e10, 1e300};
const std::vector<double> expm1_points{0.0, 0x1p-1074, -0x1p-1074, 0x1p-140, -0x1p-140, 1e-300, 1e-10, -1e-10, 0.34657359,
                                       -0.34657359, 1.0, -40.0, 709.0, -1e9, 7.44e8};
const std::vector<double> tanh_points{0.0, 0x1p-1074, -0x1p-1074, 0x1p-140, -0x1p-140, 1e-300, 1e-8, 0.5, -0.5,
                                      0.55, 1.0, 19.0, -19.0, 40.0, 1e6, -1e300};
const std::vector<double> sqrt_points{0.0, 0x1p-1074, 0x1p-140, 1e-300, 0.25, 1.0, 2.0, 3.0, 64.0, 1023.0, 1e300};
const std::vector<double> arith_points{0.0, 0x1p-1074, -0x1p-140, 1.0, -1.0 - 0x1p-52, 3.0, 1e-300, -1e300, 1e9};

template <unsigned D>
int all_misses(mpfr_prec_t bits, stand_in s, bool report) {
    using I = mpfr_interval<D>;
    int m = 0;
    auto unary = [&](const char* name, std::function<I(const I&)> f, ref_unary ref, const std::vector<double>& pts, bool straddle) {
        m += unary_misses<D>(name, f, ref, inputs_around<D>(pts, straddle), bits, s, report);
    };
    // Elementary functions, through attnref::math's dispatch (ADL → Boost's mpfi overloads).
    unary("exp", [](const I& x) { return math::exp(x); }, [](mpfr_ptr y, mpfr_srcptr x) { mpfr_exp(y, x, MPFR_RNDN); }, exp_points, true);
    unary("expm1", [](const I& x) { return math::expm1(x); }, [](mpfr_ptr y, mpfr_srcptr x) { mpfr_expm1(y, x, MPFR_RNDN); }, expm1_points, true);
    unary("log", [](const I& x) { return math::log(x); }, [](mpfr_ptr y, mpfr_srcptr x) { mpfr_log(y, x, MPFR_RNDN); }, log_points, false);
    unary("log1p", [](const I& x) { return math::log1p(x); }, [](mpfr_ptr y, mpfr_srcptr x) { mpfr_log1p(y, x, MPFR_RNDN); }, log1p_points, false);
    unary("tanh", [](const I& x) { return math::tanh(x); }, [](mpfr_ptr y, mpfr_srcptr x) { mpfr_tanh(y, x, MPFR_RNDN); }, tanh_points, true);
    unary("sqrt", [](const I& x) { return math::sqrt(x); }, [](mpfr_ptr y, mpfr_srcptr x) { mpfr_sqrt(y, x, MPFR_RNDN); }, sqrt_points, false);
    unary("neg", [](const I& x) { return -x; }, [](mpfr_ptr y, mpfr_srcptr x) { mpfr_neg(y, x, MPFR_RNDN); }, arith_points, true);
    // x·x with one object: Boost calls mpfi_sqr (the same exact value on both sides).
    unary("square", [](const I& x) { return x * x; }, [](mpfr_ptr y, mpfr_srcptr x) { mpfr_sqr(y, x, MPFR_RNDN); }, arith_points, true);
    auto binary = [&](const char* name, std::function<I(const I&, const I&)> f, ref_binary ref) {
        m += binary_misses<D>(name, f, ref, inputs_around<D>(arith_points, true), bits, s, report);
    };
    binary("add", [](const I& a, const I& b) { return a + b; }, [](mpfr_ptr y, mpfr_srcptr a, mpfr_srcptr b) { mpfr_add(y, a, b, MPFR_RNDN); });
    binary("sub", [](const I& a, const I& b) { return a - b; }, [](mpfr_ptr y, mpfr_srcptr a, mpfr_srcptr b) { mpfr_sub(y, a, b, MPFR_RNDN); });
    binary("mul", [](const I& a, const I& b) { return a * b; }, [](mpfr_ptr y, mpfr_srcptr a, mpfr_srcptr b) { mpfr_mul(y, a, b, MPFR_RNDN); });
    binary("div", [](const I& a, const I& b) { return a / b; }, [](mpfr_ptr y, mpfr_srcptr a, mpfr_srcptr b) {
        if (mpfr_zero_p(b)) mpfr_set_nan(y);  // x/0: the forward pass never divides by an exact 0
        else mpfr_div(y, a, b, MPFR_RNDN);
    });
    // The composite constants the forward pass builds, exactly as attention.hpp builds them.
    std::vector<I> dks;
    for (int dk : {1, 2, 3, 5, 7, 8, 64, 96, 127, 128, 1000, 4096}) dks.push_back(I(dk));
    m += unary_misses<D>("1/sqrt(dk)", [](const I& dk) {
            return logit_stage::logit_scale<I>(attention_options{}, static_cast<std::size_t>(static_cast<double>(dk)));
        }, [](mpfr_ptr y, mpfr_srcptr x) { mpfr_rec_sqrt(y, x, MPFR_RNDN); }, dks, bits, s, report);
    // Conversion from double (inputs, scale, softcap, ALiBi slopes, masks) and from int: exact.
    std::vector<I> doubles;
    for (double x : {0.1, -1e9, 0x1p-1074, 1e300, -0.0, 0.125}) doubles.push_back(I(x));
    m += unary_misses<D>("from double", [](const I& x) { return I(static_cast<double>(x)); },
                         [](mpfr_ptr y, mpfr_srcptr x) { mpfr_set(y, x, MPFR_RNDN); }, doubles, bits, s, report);
    // Soft-capping cap·tanh(s/cap) and the ALiBi bias slope·|d|, composed as logits_row does.
    m += binary_misses<D>("softcap", [](const I& s_, const I& cap) { return cap * math::tanh(s_ / cap); },
                          [](mpfr_ptr y, mpfr_srcptr s_, mpfr_srcptr cap) {
                              if (mpfr_zero_p(cap)) { mpfr_set_nan(y); return; }
                              mpfr_t t;
                              mpfr_init2(t, mpfr_get_prec(y) + 64);
                              mpfr_div(t, s_, cap, MPFR_RNDN);
                              mpfr_tanh(t, t, MPFR_RNDN);
                              mpfr_mul(y, t, cap, MPFR_RNDN);
                              mpfr_clear(t);
                          }, inputs_around<D>({0.0, 1e-300, 0x1p-140, 3.0, 30.0, 50.0, -1e4, 1e9}, false), bits, s, report);
    return m;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_operation_encloses_at_134_bits_against_535_bits) {
    BOOST_TEST(all_misses<40>(535, stand_in::genuine, true) == 0);
}

BOOST_AUTO_TEST_CASE(every_operation_encloses_at_1065_bits_against_4300_bits) {
    BOOST_TEST(all_misses<320>(4300, stand_in::genuine, true) == 0);
}

// The checker itself can fail: a round-to-nearest point "interval" and the true enclosure moved
// up by one ulp are reported as misses (on many probes: every inexact result for the first, every
// tight enclosure for the second).
BOOST_AUTO_TEST_CASE(the_checker_rejects_non_enclosing_stand_ins) {
    const int rn = all_misses<40>(535, stand_in::round_to_nearest, false);
    const int shifted = all_misses<40>(535, stand_in::shifted_one_ulp, false);
    BOOST_TEST_MESSAGE("misses found: round-to-nearest stand-in " << rn << ", shifted by one ulp " << shifted);
    BOOST_TEST(rn > 50);
    BOOST_TEST(shifted > 50);
}

// The stored −1e9 seed-mask constant and the ALiBi distance are exact conversions (the products
// are covered by "mul" above): a double converts to the point interval [x, x].
BOOST_AUTO_TEST_CASE(constants_convert_exactly) {
    const mpfr_interval<40> m(-1e9), d(static_cast<double>(std::ptrdiff_t{123456789}));
    BOOST_TEST(lower_end(m) == upper_end(m));
    BOOST_TEST(lower_end(m) == mpfr_real<40>(-1000000000));
    BOOST_TEST(lower_end(d) == upper_end(d));
}
