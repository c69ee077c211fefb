#pragma once
/// \file attnref.hpp
/// Umbrella header: the core library (standard library only). Boost.Multiprecision glue lives in
/// attnref/multiprecision.hpp, the emulated formats in attnref/formats.hpp.
#include "attnref/attention.hpp"
#include "attnref/backward.hpp"
#include "attnref/fixed_shape.hpp"
#include "attnref/fp_environment.hpp"
#include "attnref/invariants.hpp"
#include "attnref/mask.hpp"
#include "attnref/math.hpp"
#include "attnref/multi_head_attention.hpp"
#include "attnref/precision.hpp"
#include "attnref/scalar.hpp"
#include "attnref/softmax.hpp"
#include "attnref/tensor.hpp"
