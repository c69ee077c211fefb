#pragma once
/// \file golden/generate_memory.hpp
/// The two facts of `generate`'s memory estimate that golden/memory.hpp cannot know from the shapes:
/// MPFR's size of an interval (interval_bytes) and whether the fast path declines the case from its
/// conventions and values (fast_path_declines); generate_memory_estimate and check_generate_memory
/// pass them to memory.hpp's generate_memory_estimate_of. Needs MPFR and MPFI (certify/certify.hpp).

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attnref/certify/certify.hpp"
#include "attnref/golden/case.hpp"
#include "attnref/golden/memory.hpp"
#include "attnref/multiprecision/multiprecision.hpp"

namespace attnref::golden {

/// Bytes one mpfr_interval<D> occupies: the object (two mpfr_t) and its two heap limb arrays, each
/// rounded up to glibc's 16-byte malloc granularity plus its 16-byte chunk header.
template <unsigned D>
inline std::uint64_t interval_bytes() {
    const std::uint64_t limbs = mpfr_custom_get_size(static_cast<mpfr_prec_t>(certify::bits_of<D>));
    return sizeof(mpfr_interval<D>) + 2 * ((limbs + 15) / 16 * 16 + 16);
}

/// True when the fast path sends the whole case to the MPFI ladder whatever the data (its
/// whole-case conditions, certify/fast.hpp): soft-capping, or a scale or ALiBi slope of nonzero
/// magnitude outside [2^-400, 2^40]; with `data`, also an input value so.
inline bool fast_path_declines(const case_spec& spec, const case_data* data = nullptr) {
    auto out_of_range = [](double x) { return x != 0 && !(std::fabs(x) >= 0x1p-400 && std::fabs(x) <= 0x1p40); };
    const case_conventions& c = spec.conventions;
    if (c.softcap) return true;
    if (c.scale && out_of_range(*c.scale)) return true;
    for (double a : c.alibi_slopes)
        if (out_of_range(a)) return true;
    if (data)
        for (const std::vector<double>* v : {&data->query, &data->key, &data->value, &data->w_q, &data->w_k, &data->w_v, &data->w_o,
                                             &data->b_q, &data->b_k, &data->b_v, &data->b_o})
            for (double x : *v)
                if (out_of_range(x)) return true;
    return false;
}

/// Estimated peak memory of generate_case (golden/memory.hpp generate_memory_estimate_of: the parts
/// and what they count), with the case's values (`data`) when known.
inline generate_memory generate_memory_estimate(const case_spec& spec, certification_method method, std::size_t threads,
                                                const case_data* data = nullptr, bool fast_gradients = false) {
    return generate_memory_estimate_of(spec, method, threads, fast_path_declines(spec, data), fast_gradients,
                                       interval_bytes<certify::ladder[0]>());
}

/// Refuses (data_error "<what>: field 'shapes': ...", naming the estimate, its parts and the limit)
/// a case whose generate_memory_estimate exceeds max_memory().
inline void check_generate_memory(const case_spec& spec, certification_method method, std::size_t threads, const std::string& what,
                                  const case_data* data = nullptr, bool fast_gradients = false) {
    require_generate_memory(generate_memory_estimate(spec, method, threads, data, fast_gradients), spec, method, what, fast_gradients);
}

}  // namespace attnref::golden
