#pragma once
/// \file backward_case.hpp
/// A call of the Python module and its upstream gradient dO as a golden backward case: the case
/// description (conventions, shapes, outputs.gradients) and its data (the inputs and dO; masks
/// broadcast to (B, H, Sq, Sk) as golden cases store them). The certified gradients
/// (gradients.cpp) and the gradient checks of assert_attention_close (judge_gradients.cpp) both
/// read the call through it, so both see the case `attnref generate` would certify.

#include "attnref/golden/case.hpp"
#include "core.hpp"

namespace attnref::python {

/// Fills `spec` and `data` (replacing their contents). Throws std::invalid_argument naming
/// grad_output for an mha call whose gradients are not defined here (x_q, x_k, x_v of different
/// widths, or some biases but not all four).
void backward_case_of(const call& c, const array_ref& grad_output, golden::case_spec& spec, golden::case_data& data);

}  // namespace attnref::python
