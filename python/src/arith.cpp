/// The non-certified arithmetics of the Python module: every named precision policy of
/// policies.hpp (inputs first rounded to the policy's storage format, or quantised per tensor for the
/// policies with FP8 inputs, as `attnref run` does) and
/// MPFR at the compiled precisions below.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnref/multiprecision/multiprecision.hpp"
#include "attnref/multiprecision/policies.hpp"
#include "core.hpp"
#include "run.hpp"

namespace attnref::python {

namespace {
template <class T>
std::vector<double> to_double(const std::vector<T>& x) {
    std::vector<double> r(x.size());
    for (std::size_t n = 0; n < x.size(); ++n) r[n] = static_cast<double>(x[n]);  // exact for ≤ 53-bit formats
    return r;
}

template <class Policy, class Input>
void compute(const call& c, bool weights, bool lse, result& r) {
    const outputs_of<Policy> o = run_call<Policy, Input>(c, weights, lse);
    r.output = to_double(o.output);
    r.weights = to_double(o.weights);
    r.lse = to_double(o.lse);
    // float32 (or narrower) results come back as float32 arrays: every value is exact there.
    r.single = scalar_traits<typename Policy::output_type>::digits <= 24 && scalar_traits<typename Policy::weights_type>::digits <= 24 &&
               scalar_traits<typename Policy::accumulate_type>::digits <= 24;
    r.arith_bits = scalar_traits<typename Policy::accumulate_type>::digits;
}

/// A policy with FP8 inputs (policies.hpp with_fp8_inputs, e.g. fp8e4m3_fa3_bf16) computes on the
/// inputs quantised per tensor as `attnref run` does (core/formats.hpp fp8_scale_for: the largest
/// power-of-two scale with amax·scale <= max; codes rounded to nearest even, saturating; effective
/// input code·descale); other policies on the inputs rounded to their storage format.
template <class Policy>
void compute_policy(const call& c, bool weights, bool lse, result& r) {
    if constexpr (has_fp8_inputs<Policy>) {
        using F = typename Policy::fp8_input_type;
        call quantised = c;
        std::vector<std::vector<double>> owned;
        owned.reserve(11);
        for (array_ref* a : {&quantised.q, &quantised.k, &quantised.v, &quantised.w_q, &quantised.w_k, &quantised.w_v, &quantised.w_o,
                             &quantised.b_q, &quantised.b_k, &quantised.b_v, &quantised.b_o}) {
            if (!a->given()) continue;
            std::size_t n = 1;
            for (std::size_t e : a->shape) n *= e;
            std::vector<double>& x = owned.emplace_back(a->data, a->data + n);
            double amax = 0;
            for (double v : x) {
                if (!std::isfinite(v)) throw std::invalid_argument("arith: the FP8 policy's per-tensor scale (amax) needs finite inputs");
                amax = std::max(amax, std::abs(v));
            }
            const fp8_tensor_scale s = fp8_scale_for<F>(amax);
            for (double& v : x) v = fp8_dequantise(fp8_quantise<F>(v, s), s);
            a->data = x.data();
        }
        compute<Policy, typename Policy::storage_type>(quantised, weights, lse, r);
    } else {
        compute<Policy, typename Policy::storage_type>(c, weights, lse, r);
    }
}

// MPFR precisions compiled in (decimal digits → bits as Boost maps them): 134 and 267 bits, the
// first two rungs of the certification ladder.
constexpr unsigned mpfr_digits[] = {40, 80};
}  // namespace

std::vector<int> mpfr_bits() { return {std::numeric_limits<mpfr_real<40>>::digits, std::numeric_limits<mpfr_real<80>>::digits}; }

bool compute_arith(const call& c, const std::string& arith, bool weights, bool lse, result& r) {
    c.validate();
    if (arith.rfind("mpfr:", 0) == 0) {
        const std::string bits = arith.substr(5);
        if (bits == std::to_string(std::numeric_limits<mpfr_real<mpfr_digits[0]>>::digits)) {
            compute<uniform_precision<mpfr_real<mpfr_digits[0]>>, double>(c, weights, lse, r);
            return true;
        }
        if (bits == std::to_string(std::numeric_limits<mpfr_real<mpfr_digits[1]>>::digits)) {
            compute<uniform_precision<mpfr_real<mpfr_digits[1]>>, double>(c, weights, lse, r);
            return true;
        }
        return false;
    }
    return visit_policy(arith, [&]<class P>(std::type_identity<P>) { compute_policy<P>(c, weights, lse, r); });
}

}  // namespace attnref::python
