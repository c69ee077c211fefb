/// The non-certified arithmetics of the Python module: every named precision policy of
/// policies.hpp (inputs first rounded to the policy's storage format, as `attnref run` does) and
/// MPFR at the compiled precisions below.
#include <string>

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
    return visit_policy(arith, [&]<class P>(std::type_identity<P>) { compute<P, typename P::storage_type>(c, weights, lse, r); });
}

}  // namespace attnref::python
