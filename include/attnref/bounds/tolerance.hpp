#pragma once
/// \file bounds/tolerance.hpp
/// Owns nothing itself: the umbrella of attnref::tolerance, the tolerance models for gating another
/// implementation's outputs against a golden reference. All models work on plain double arrays
/// (candidate values converted exactly to double) and return, per element, whether the error is
/// within the model's bound, and the bound itself. The derivations, with the equation numbers the
/// code cites, are in docs/error-bounds.md.
///
/// Models (tolerance_model):
/// - assert_close: |a − e| ≤ atol + rtol·|e| with torch.testing.assert_close's per-dtype defaults
///   (rtol, atol): fp16 (1e-3, 1e-5), bf16 (1.6e-2, 1e-5), fp32 (1.3e-6, 1e-5), fp64 (1e-7, 1e-7).
/// - ulp: distance in units in the last place of the candidate's format (the reference first rounded
///   to that format); default limit 4 ULP. Meaningless near cancellation; offered for comparison.
/// - data_aware (the default): an a-priori probabilistic rounding-error bound per element, or the
///   worst-case bound where that is smaller (docs/error-bounds.md §4).
/// - worst_case: a rigorous a-priori bound per element, valid to every order (§3).
/// - baseline: FlashAttention's rule |a − e| ≤ 2·max|naive − e| + floor, where `naive` is attnref's
///   own straightforward implementation in the candidate's precision and the floor is FA3's
///   2·max|(e + 0.3 − 0.3) − e| evaluated in the candidate's format, so it never collapses to 0.
///
/// The parts, one concern each:
///   tolerance/names.hpp        candidate formats, model names, accumulation assumed, rtol/atol, ULP
///   tolerance/worst_case.hpp   the worst-case bound (SDPA and MHA)
///   tolerance/data_aware.hpp   the data-aware bound (SDPA and MHA)
///   tolerance/compare.hpp      the compare engine; assert-close, ulp, baseline, Scales bounds
///   tolerance/weights_lse.hpp  weights and lse bounds and comparisons
///   tolerance/zero_trust.hpp   vacuity and zero-trust
/// (invariants.hpp, which the checker applies to weights and lse alongside, is included too.)

#include "attnref/bounds/invariants.hpp"
#include "attnref/bounds/tolerance/compare.hpp"
#include "attnref/bounds/tolerance/data_aware.hpp"
#include "attnref/bounds/tolerance/names.hpp"
#include "attnref/bounds/tolerance/weights_lse.hpp"
#include "attnref/bounds/tolerance/worst_case.hpp"
#include "attnref/bounds/tolerance/zero_trust.hpp"
