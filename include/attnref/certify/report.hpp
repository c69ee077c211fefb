#pragma once
/// \file certify/report.hpp
/// Owns: the light vocabulary of certification — its target formats (binary_format.hpp's
/// format_description) and the per-tensor report — for code that records or reads certification
/// results without computing them: no MPFR, MPFI or Boost.Multiprecision (certify.hpp computes).

#include <cstddef>
#include <string>
#include <vector>

#include "attnref/core/binary_format.hpp"

namespace attnref::certify {

/// The target formats of certification, as format_description values (binary_format.hpp).
inline constexpr format_description float64_target = describe(attnref::binary_format::float64);
inline constexpr format_description float32_target = describe(attnref::binary_format::float32);
inline constexpr format_description bfloat16_target = describe(attnref::binary_format::bfloat16);
inline constexpr format_description float16_target = describe(attnref::binary_format::float16);

/// Per tensor and target: how many elements were certified, how many needed escalation, and at
/// which precisions (bits) elements were certified.
struct tensor_report {
    std::string tensor;
    std::string target;
    std::size_t elements = 0;
    std::size_t certified = 0;
    std::size_t escalated = 0;
    std::vector<int> precisions_bits;
};

}  // namespace attnref::certify
