#pragma once
/// \file attnref.hpp
/// Umbrella header: the core library (standard library only). Boost.Multiprecision glue lives in
/// attnref/multiprecision/multiprecision.hpp, the emulated formats in attnref/core/formats.hpp.
#include "attnref/core/attention.hpp"
#include "attnref/core/backward.hpp"
#include "attnref/core/fixed_shape.hpp"
#include "attnref/core/fp_environment.hpp"
#include "attnref/bounds/invariants.hpp"
#include "attnref/core/mask.hpp"
#include "attnref/core/math.hpp"
#include "attnref/core/multi_head_attention.hpp"
#include "attnref/core/precision.hpp"
#include "attnref/core/scalar.hpp"
#include "attnref/core/softmax.hpp"
#include "attnref/core/tensor.hpp"
