"""One test function, the whole golden suite: a kernel author's pytest gate over every SDPA forward
case, found by attnref.suite_cases (the suite is attnref.suite_dir(): $ATTNREF_SUITE, ./golden, or the
installed suite) and loaded by name with attnref.load_case.

The kernel gated here is numpy_attention.sdpa in float32; replace it with yours. The only glue is
my_conventions, which maps a case's manifest conventions (golden/README.md, "manifest.json, field by
field") to the kernel's keywords."""
import numpy as np
import pytest

import attnref
import numpy_attention


def my_conventions(case):
    """The case's conventions as numpy_attention.sdpa keywords."""
    c = case.conventions["conventions"]
    window = c["window"]
    return dict(
        scale=c["scale"],
        causal=c["causal_alignment"] if c["causal"] else None,
        alignment=c["causal_alignment"],
        diagonal_offset=c["diagonal_offset"],
        window=None if window is None else (window.get("left"), window.get("right")),
        key_lengths=c["key_lengths"] or None,
        mask=case.inputs.get("mask") if c["boolean_mask"] else None,
        mask_polarity=c["mask_polarity"],
        additive_mask=case.inputs.get("additive_mask") if c["additive_mask"] else None,
        empty_rows=c["empty_rows"],
        softcap=c["softcap"],
        alibi_slopes=c["alibi_slopes"] or None,
    )


# Every SDPA forward case but the seed-mask ones (numpy_attention has no seed mask: logits += m·(−1e9)).
CASES = attnref.suite_cases(kind="sdpa", gradients=False, seed_mask=False)


@pytest.mark.parametrize("name", CASES)
def test_my_float32_kernel_on_the_suite(name):
    case = attnref.load_case(name)
    q, k, v = (case.inputs[r] for r in ("query", "key", "value"))
    out = numpy_attention.sdpa(q, k, v, dtype=np.float32, **my_conventions(case))[0]
    verdict = attnref.check(case, out, dtype="float32")  # PASS, FAIL or INCONCLUSIVE, as `attnref check`
    assert verdict.passed, verdict.text


def test_the_selection_is_the_suite_filtered():
    every = attnref.suite_cases()
    assert set(CASES) < set(every) and "sdpa_gqa" in CASES
    assert not any("_bwd_" in n or n.startswith("mha_") or n == "sdpa_seed_mask" for n in CASES)
    assert attnref.suite_cases(kind="sdpa", causal=True, causal_alignment="bottom_right")  # a convention filter
    with pytest.raises(ValueError, match="no_such_field"):
        attnref.suite_cases(no_such_field=1)


def test_a_wrong_kernel_fails_a_suite_case():
    case = attnref.load_case("sdpa_causal_bottom_right_sq_lt_sk")
    q, k, v = (case.inputs[r] for r in ("query", "key", "value"))
    kw = my_conventions(case)
    kw.update(causal="top_left", alignment="top_left")  # the other causal alignment
    out = numpy_attention.sdpa(q, k, v, dtype=np.float32, **kw)[0]
    assert attnref.check(case, out, dtype="float32").verdict == "FAIL"


def test_the_certified_docstring_names_the_precision_the_reference_reports():
    # help(attnref.sdpa) describes arith="certified"; the first precision it names is the one a
    # certified reference reports in Reference.certification (the fast path's double-double).
    case = attnref.load_case("sdpa_basic")
    ref = attnref.sdpa(case.inputs["query"], case.inputs["key"], case.inputs["value"])
    first = ref.certification[0]["precisions_bits"][0]
    doc = attnref.sdpa.__doc__
    certified = doc[doc.index('"certified" (default)'):doc.index('"float64", "float32"')]
    assert f"({first}" in certified.replace("\n", " ").replace("  ", " ") or f"{first} bits" in certified, certified
