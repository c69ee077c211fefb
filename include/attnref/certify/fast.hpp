#pragma once
/// \file certify/fast.hpp
/// Fast certified reference values: the double-word forward pass with rigorous error bounds (SDPA
/// and multi-head attention), the fast rounding check, and the hand-off of the undecided elements
/// to the MPFI ladder of certify.hpp. This header gathers the parts in include/attnref/certify/fast/:
///
///   bounded.hpp        a double-word element with its bound; the input ranges of (1)
///   constants.hpp      ln 2, 1/i!, 1/√n as double-words from MPFR (4)
///   cpu.hpp            which AVX2 kernels exist and whether the processor runs them
///   dot.hpp            double-word dot products with the bounds (5a)/(5b), scalar and AVX2
///   exp.hpp            the bounded double-word exponential (6), scalar and AVX2 cores
///   round_check.hpp    the rounding check (9)
///   projection.hpp     the projections (7)
///   problem.hpp        fast_problem, fast_options, fast_stats, the profiling observer, the sinks
///   attention_row.hpp  one query row (8)–(8f) in steps
///   escalation.hpp     the undecided elements through the MPFI ladder
///   certify_fast.hpp   certify_fast, end to end
///   profile.hpp        a timing observer for benchmarks
///
/// Ziv's strategy with a cheap first rung. Every element v (output, weight, lse) is computed as a
/// double-word ṽ with a bound b ≥ |v − ṽ| on the distance to the exact value of the exact inputs
/// (docs/fast-certify.md, whose numbered equations the code cites). If every real number in
/// [ṽ − b, ṽ + b] rounds to the same value of a target format (round_check, (9)), that value is
/// the correctly rounded exact result — the same unique value the MPFI path certifies, so the bytes
/// are the same. Elements that do not pass for some target are "escalated" to the MPFI ladder and
/// their certified values stored. The result has certify::certify's shape, with
/// tensor_report::escalated counting the elements the fast rung left to MPFI.
///
/// Conventions: every scale placement (equal in exact arithmetic: s·(q·k)), causal/window/padding,
/// boolean, additive and seed masks, empty rows (zero, NaN, uniform), ALiBi, GQA/MQA, projection
/// biases. Sent whole to the MPFI path (`fast_stats::whole_case_reason` says why): soft-capping
/// (no double-word tanh bound yet), and inputs outside the ranges the error analysis assumes (a
/// nonzero |input| outside [2^-400, 2^40], a non-finite additive mask entry other than −inf,
/// projected values outside that range; docs/fast-certify.md (1)).

#include "attnref/certify/fast/certify_fast.hpp"
#include "attnref/certify/fast/round_check.hpp"
