"""attnref.load_case(..., input_format="fp8e4m3"/"fp8e5m2") and attnref.check on FP8 inputs.

- load_case gives the derived case: .fp8_codes (uint8, the inputs' shapes), .descales (powers of two
  by the amax rule) and .inputs holding value(code)·descale, decoded here from the OCP encodings by an
  independent decoder; its reference is the certified result of those inputs (the name says so).
- attnref.check of a NumPy float32 kernel computing on the codes and descales PASSes given the
  GoldenCase; with q's descale forgotten it FAILs; Verdict.inputs says "fp8e4m3-rounded".
- attnref.sdpa(arith="fp8e4m3_fa3_fp32") quantises its inputs as `attnref run` does and PASSes check(policy=).
- An unknown input_format is a ValueError naming input_format.
"""
import os

import numpy as np
import pytest

import attnref

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "golden", "sdpa_basic")


def decode(codes, exponent_bits, mantissa_bits, has_inf):
    """The value of each OCP FP8 code, from the definition (bias 2^(E-1) - 1, subnormals at E = 0)."""
    bias = 2 ** (exponent_bits - 1) - 1
    out = np.empty(codes.shape)
    for i, c in enumerate(codes.ravel()):
        c = int(c)
        s, e, m = c >> (exponent_bits + mantissa_bits), (c >> mantissa_bits) & (2 ** exponent_bits - 1), c & (2 ** mantissa_bits - 1)
        if e == 2 ** exponent_bits - 1 and (has_inf or m == 2 ** mantissa_bits - 1):
            v = np.nan if (m or not has_inf) else np.inf
        elif e == 0:
            v = m / 2 ** mantissa_bits * 2.0 ** (1 - bias)
        else:
            v = (1 + m / 2 ** mantissa_bits) * 2.0 ** (e - bias)
        out.flat[i] = -v if s else v
    return out


@pytest.mark.parametrize("fmt,bits,largest", [("fp8e4m3", (4, 3, False), 448.0), ("fp8e5m2", (5, 2, True), 57344.0)])
def test_load_case_fp8(fmt, bits, largest):
    golden = attnref.load_case(GOLDEN)
    c = attnref.load_case(GOLDEN, input_format=fmt)
    assert c.name == "sdpa_basic_inputs_" + fmt and c.input_format == fmt
    assert sorted(c.fp8_codes) == ["key", "query", "value"] and sorted(c.descales) == ["key", "query", "value"]
    for role in ("query", "key", "value"):
        codes, descale = c.fp8_codes[role], c.descales[role]
        assert codes.dtype == np.uint8 and codes.shape == golden.inputs[role].shape
        amax = np.max(np.abs(golden.inputs[role]))
        assert amax / descale <= largest < 2 * amax / descale  # the largest power-of-two scale that fits
        assert np.log2(descale) == int(np.log2(descale))
        assert np.array_equal(c.inputs[role], decode(codes, *bits) * descale)
    assert "quantised to " + fmt in c.inputs_description
    assert set(c.reference) >= {"output", "weights", "lse"}


def kernel(c, q_descale=True):
    q, k, v = (c.inputs[r].astype(np.float32) for r in ("query", "key", "value"))
    if not q_descale:
        q = q / np.float32(c.descales["query"])
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * np.float32(1 / np.sqrt(q.shape[-1]))
    p = np.exp(s - s.max(-1, keepdims=True))
    return (np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v)).astype(np.float32)


def test_check_fp8_inputs():
    c = attnref.load_case(GOLDEN, input_format="fp8e4m3")
    r = attnref.check(c, kernel(c))
    assert r.verdict == "PASS", str(r)
    assert r.inputs == "fp8e4m3-rounded" and "descale query 2^" in r.inputs_description
    assert attnref.check(c, kernel(c, q_descale=False)).verdict == "FAIL"


def test_unknown_input_format():
    with pytest.raises(ValueError, match="input_format"):
        attnref.load_case(GOLDEN, input_format="fp8e4m4")


def test_sdpa_arith_fp8_policy_quantises_its_inputs():
    # attnref.sdpa(arith="fp8e4m3_fa3_fp32") quantises q, k, v per tensor as `attnref run` does: on the
    # golden inputs it gives what it gives on their FP8 effective values (quantising those again changes
    # nothing), differs from the same arithmetic without FP8 inputs, and PASSes check(policy=...).
    golden = attnref.load_case(GOLDEN)
    c = attnref.load_case(GOLDEN, input_format="fp8e4m3")
    a = attnref.sdpa(*(golden.inputs[r] for r in ("query", "key", "value")), arith="fp8e4m3_fa3_fp32").output
    b = attnref.sdpa(*(c.inputs[r] for r in ("query", "key", "value")), arith="fp8e4m3_fa3_fp32").output
    d = attnref.sdpa(*(golden.inputs[r] for r in ("query", "key", "value")), arith="fp32_p_fp8e4m3_s256").output
    assert np.array_equal(a, b) and not np.array_equal(a, d)
    r = attnref.check(GOLDEN, np.asarray(a, dtype=np.float32), policy="fp8e4m3_fa3_fp32")
    assert r.verdict == "PASS" and r.inputs == "fp8e4m3-rounded", str(r)
