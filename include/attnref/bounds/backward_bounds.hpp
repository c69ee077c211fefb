#pragma once
/// \file bounds/backward_bounds.hpp
/// The first-order data-aware error bounds of SDPA and multi-head attention gradients, one header for
/// its includers (the checker, the studies, the tests); each part owns one family:
///   backward_row_kernels.hpp  the per-row terms (B1)–(B4), (B14), (B2s), (B4s) and the row updates;
///   backward_sdpa.hpp         SDPA: (B1)–(B7), (B5t), inputs with errors (B9)–(B11), rounded inputs;
///   backward_predicted.hpp    a declared policy's predicted inputs (B16) and stored weights (B17);
///   backward_mha.hpp          multi-head attention: (B8)–(B13), (B15), (B15v).
/// The checker uses them to judge a candidate's gradients and the tests to judge attnref's own. The
/// derivation, with every (Bn) these headers cite: docs/backward.md, "Backward pass: the gradient
/// error bound, and checking gradients" ((B1)–(B7), (B2s), (B4s), (B5t), (B14)) and its sections
/// "Multi-head attention: (B8)–(B13)", (B15), (B15v), (B16) and (B17).

#include "attnref/bounds/backward_mha.hpp"
#include "attnref/bounds/backward_predicted.hpp"
#include "attnref/bounds/backward_row_kernels.hpp"
#include "attnref/bounds/backward_sdpa.hpp"
