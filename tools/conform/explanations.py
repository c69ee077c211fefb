"""FAILs and INCONCLUSIVEs that re-judging does not turn into PASS, explained after reading the
implementation and its outputs. explain(impl, fmt, case, failing) returns (label, explanation) or
None ("unexplained" in the tables, with its reproducer). Labels start with "convention:", "policy:",
"bug:" or "inconclusive:". Each rule says how it was verified.
"""

ADVERSARIAL_PRECISION = ("sdpa_adv_bf16_exp_overflow", "sdpa_adv_fp16_exp_overflow", "sdpa_adv_logit_offset_1000",
                         "sdpa_adv_weights_underflow", "sdpa_adv_tied_maxima", "sdpa_bwd_adv_logit_offset_1000",
                         "sdpa_bwd_adv_tied_maxima")


def explain(impl, fmt, case, failing):
    name = case.name
    empty = case.has_empty_rows()
    f = set(failing)
    if impl in ("pytorch-nn-mha", "pytorch-f-mha") and empty and case.kind == "sdpa" and case.cv["empty_rows"] == "nan" \
            or impl in ("pytorch-nn-mha", "pytorch-f-mha") and name.endswith("nearly_all_masked"):
        return ("convention: empty rows nan; NaN crosses heads",
                "an empty row's NaN reaches every head's features of that query row through out_proj "
                "(0·NaN = NaN in the identity projection an sdpa case runs with); the reference's NaN is "
                "per head (verified on sdpa_adv_nearly_all_masked: every mismatch is a NaN, and the NaNs are exactly "
                "the query rows that hold an empty row of some head)")
    if impl == "pytorch-eager" and fmt == "float32" and case.backward and empty:
        return ("convention: empty rows nan forward; dQ, dK zero, dV NaN",
                "softmax of an all −inf row is NaN; masked_fill's backward zeroes the masked logits' "
                "gradient, so dQ and dK of empty rows are 0 and finite, while dV = Pᵀ·dO sums the NaN P "
                "into every key of the head (verified: the gradients re-judged against the empty_rows zero "
                "copy fail on grad_value alone, every mismatch NaN)")
    if impl == "pytorch-eager" and fmt == "bfloat16":
        words = ("the CPU kernels round the logits to bfloat16 before the softmax and P to bfloat16 before P·V; "
                 "the data-aware bounds of a bfloat16 candidate (and --policy bf16, bf16_materialised) do not "
                 "bound weights computed from bfloat16 logits")
        if f <= {"weights"}:
            return ("policy: bf16 logits materialised", "weights only; output PASS: " + words)
        if empty:
            return ("policy: bf16 logits materialised; empty rows nan", words + "; empty rows NaN as in float32")
        if name in ADVERSARIAL_PRECISION or f <= {"weights", "grad_key", "grad_query", "grad_value"}:
            return ("policy: bf16 logits materialised",
                    words + "; the gradients through autograd of the same bfloat16 tensors")
    if impl == "pytorch-eager" and case.name.startswith("sdpa_adv_cancelling") or \
            impl.startswith("ort-") and name == "sdpa_adv_cancelling_outputs":
        return ("inconclusive: cancelling outputs",
                "outputs that cancel to ≈ 0 under near-uniform weights: the bound is wider than the value "
                "(docs/checker.md, vacuous bounds); no verdict either way")
    if name == "sdpa_bwd_adv_tied_maxima" and f <= {"grad_query"}:
        return ("inconclusive: tied maxima dQ",
                "six identical dominant keys make dQ a residue of cancellation (docs/backward.md, "
                "\"Why tied maxima stays INCONCLUSIVE in float32\")")
    if impl == "seed-numpy" and fmt == "float32" and empty:
        return ("convention: −1e9 in float32 absorbs the logits",
                "logits − 1e9 rounds to multiples of 64 in float32, so a fully masked row has equal logits: "
                "uniform weights (the float64 class keeps softmax(logits), re-judged PASS; the float32 class "
                "PASSes sdpa_empty_rows_uniform)")
    if fmt == "float16" and name in ADVERSARIAL_PRECISION and not f - {"output"} and impl == "ort-contrib-mha":
        return ("inconclusive: bound vacuous in float16",
                "the inputs rounded to float16 leave a bound that admits a trivially wrong output (the "
                "check's own reason); the contrib op keeps its scores in float32, so the error stays small")
    if impl == "ort-attention" and fmt == "float16" and name in ADVERSARIAL_PRECISION:
        return ("policy: fp16 scores and P stored",
                "the CPU float16 kernel stores the scaled scores and P in float16; no precision policy "
                "describes it (logits ≈ 10.5–1000 lose their O(1) differences, P underflows)")
    if impl == "ort-contrib-mha" and name == "sdpa_causal_top_left_sq_lt_sk":
        return ("bug: unidirectional with Sq < Sk",
                "unidirectional=1 with Sq = 5 < Sk = 9: rows 0–3 are top-left causal, the last query row attends "
                "every key (verified: its output equals unmasked attention to 5e-8) — neither alignment")
    if impl == "ort-contrib-mha" and case.cv["key_lengths"] and empty:
        return ("convention: key_padding_mask adds −10000",
                "masked keys get mask_filter_value (−10000) added, not −inf: a row with no valid key is "
                "softmax over all keys (the same output as the seed class's −1e9 mask, max error 0.4748 on "
                "sdpa_empty_rows_zero for both)")
    return None
