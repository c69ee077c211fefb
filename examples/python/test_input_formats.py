"""Which inputs a verdict is about, and declared precision policies, from Python.

A bfloat16 kernel reads the golden inputs rounded to bfloat16; ``attnref.load_case(name,
input_format="bfloat16")`` gives it exactly those values with the certified reference of *those*
inputs, and ``attnref.check`` (input_format "auto", the default) judges a bfloat16 candidate against
it. Every verdict here is compared with the one ``attnref check`` gives on the same files (the
binary: $ATTNREF_BIN, set by CTest), and the rounded inputs and their reference with independent
NumPy computations.
"""
import json
import math
import os
import shutil
import subprocess

import numpy as np
import pytest

import attnref
from attnref.testing import InconclusiveError, assert_attention_close

# Plain SDPA (B=2, H=2, Sq=8, Sk=16, d=8, no mask), values in [1, 3): a correct bf16 kernel is
# INCONCLUSIVE against the float64 inputs (their rounding to bf16 moves the output by about the
# bf16 bound) and PASSes against the inputs it actually read.
CASE = "sdpa_adv_positive_mean_values"
# Plain SDPA with centred values: the kernel that forgets the scale FAILs there under every input
# format and every declared policy (on CASE the fp8 policies' bounds are too wide to tell: INCONCLUSIVE).
WRONG_CASE = "sdpa_basic"
FORMATS = ("float64", "float32", "bfloat16", "float16")
# (significand bits incl. the implicit one, smallest normal exponent) for rounding in NumPy.
_BITS = {"float64": (53, -1022), "float32": (24, -126), "bfloat16": (8, -126), "float16": (11, -14)}


def round_to(x, fmt):
    """Round-to-nearest-even of float64 values to `fmt`, written from the IEEE definition: the
    spacing of fmt at |x| is 2**(e - p + 1) (e the exponent of x, at least the smallest normal's);
    x / spacing is exact (a power of two), and np.round rounds halves to even. No overflow here."""
    x = np.asarray(x, dtype=np.float64)
    p, emin = _BITS[fmt]
    _, e = np.frexp(x)  # x = m * 2**e, 0.5 <= |m| < 1: exponent e - 1
    spacing = np.ldexp(1.0, np.maximum(e - 1, emin) - (p - 1))
    return np.where(x == 0, x, np.round(x / spacing) * spacing)


def kernel(q, k, v, fmt, *, scale=True):
    """A `fmt` attention kernel: inputs in fmt, logits, softmax and P·V in float32 (float64 for
    float64), the output rounded to fmt. scale=False forgets 1/sqrt(d)."""
    work = np.float64 if fmt == "float64" else np.float32
    q, k, v = (round_to(a, fmt).astype(work) for a in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2)
    if scale:
        s = s * work(1 / math.sqrt(q.shape[-1]))
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p = p / p.sum(axis=-1, keepdims=True)
    return round_to((p @ v).astype(np.float64), fmt)


def reference_float64(q, k, v):
    """The same attention in float64 (for the certified reference of given inputs, to ~1e-15)."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def _binary():
    b = os.environ.get("ATTNREF_BIN")
    if b:
        assert os.access(b, os.X_OK), f"ATTNREF_BIN={b} is not an executable"
        return b
    here = os.path.dirname(os.path.dirname(os.path.abspath(attnref.__file__)))  # build/<preset>/python
    for c in (os.path.join(os.path.dirname(here), "verify", "attnref"), shutil.which("attnref")):
        if c and os.access(c, os.X_OK):
            return c
    pytest.skip("the attnref command is needed (set ATTNREF_BIN)")


def command_verdict(tmp_path, out, dtype, *args, case=CASE):
    """`attnref check` on the same candidate: (verdict, reason, inputs line) from its --json report.
    The candidate is saved as '<f4' (exact for bfloat16 and float16 values) or '<f8'."""
    tag = "_".join([case, dtype, *(a.lstrip("-") for a in args)])
    f = tmp_path / f"out_{tag}.npy"
    np.save(f, out.astype(np.float64 if dtype == "float64" else np.float32))
    j = tmp_path / f"r_{tag}.json"
    r = subprocess.run([_binary(), "check", "--golden", os.path.join(attnref.suite_dir(), case), "--output", str(f), "--dtype", dtype,
                        "--json", str(j), "--force", *args], capture_output=True, text=True)
    assert r.returncode in (0, 1), r.stderr
    rep = json.loads(j.read_text())
    return rep["verdict"], rep.get("reason", ""), rep["inputs"]


@pytest.fixture(scope="module")
def golden():
    return attnref.load_case(CASE)


@pytest.fixture(scope="module")
def rounded():
    return attnref.load_case(CASE, input_format="bfloat16")


def test_load_case_rounds_the_inputs_and_certifies_their_reference(golden, rounded):
    assert golden.input_format == "case" and rounded.input_format == "bfloat16"
    assert rounded.name == CASE + "_inputs_bfloat16" and "rounded to nearest even to bfloat16" in rounded.inputs_description
    for role in ("query", "key", "value"):
        expected = round_to(golden.inputs[role], "bfloat16")
        np.testing.assert_array_equal(rounded.inputs[role], expected)
        assert not np.array_equal(rounded.inputs[role], golden.inputs[role])  # the rounding did something
    q, k, v = (rounded.inputs[r] for r in ("query", "key", "value"))
    out = rounded.reference["output"]
    np.testing.assert_allclose(out, reference_float64(q, k, v), rtol=1e-13, atol=0)
    # The rounded inputs' exact output differs from the float64 inputs' by far more than its own accuracy.
    assert np.max(np.abs(out - golden.reference["output"])) > 1e-4


def test_bf16_kernel_passes_on_the_inputs_it_read(tmp_path, golden, rounded):
    q, k, v = (golden.inputs[r] for r in ("query", "key", "value"))
    out = kernel(q, k, v, "bfloat16").astype(np.float32)  # bf16 values in a float32 array
    auto = attnref.check(CASE, out, dtype="bfloat16")
    case = attnref.check(CASE, out, dtype="bfloat16", input_format="case")
    assert (auto.verdict, auto.inputs) == ("PASS", "bfloat16-rounded"), auto.text
    assert case.verdict in ("INCONCLUSIVE", "FAIL") and case.inputs == "case", case.text
    # The command gives the same verdicts on the same file.
    for v, args in ((auto, ()), (case, ("--input-format", "case"))):
        verdict, reason, inputs = command_verdict(tmp_path, out, "bfloat16", *args)
        assert (verdict, reason) == (v.verdict, v.reason)
        assert ("rounded to nearest even to bfloat16" in inputs) == (v.inputs == "bfloat16-rounded")
    # The GoldenCase of the rounded inputs is judged against them; the case's own inputs are not.
    assert attnref.check(rounded, out, dtype="bfloat16").inputs == "bfloat16-rounded"
    assert_attention_close(out, rounded, dtype="bfloat16")
    with pytest.raises(AssertionError):
        assert_attention_close(out, golden, dtype="bfloat16", input_format="case")


def test_float32_candidate_follows_the_commands_default(tmp_path, golden):
    q, k, v = (golden.inputs[r] for r in ("query", "key", "value"))
    out = kernel(q, k, v, "float32").astype(np.float32)
    v32 = attnref.check(CASE, out)
    verdict, reason, inputs = command_verdict(tmp_path, out, "float32")
    assert (v32.verdict, v32.reason) == (verdict, reason) and v32.verdict == "PASS"
    assert ("rounded to nearest even" in inputs) == (v32.inputs != "case")
    assert v32.inputs == "case"  # auto rounds only for 16-bit candidates and declared policies
    r32 = attnref.check(CASE, out, input_format="float32")
    assert r32.inputs == "float32-rounded" and r32.verdict == command_verdict(tmp_path, out, "float32", "--input-format", "float32")[0]


@pytest.fixture(scope="module")
def wrong_case():
    return attnref.load_case(WRONG_CASE)


@pytest.mark.parametrize("input_format", [None, "auto", "case", *FORMATS])
def test_missing_scale_fails_under_every_input_format(wrong_case, input_format):
    q, k, v = (wrong_case.inputs[r] for r in ("query", "key", "value"))
    for fmt in FORMATS:
        r = attnref.check(WRONG_CASE, kernel(q, k, v, fmt, scale=False), dtype=fmt, input_format=input_format)
        assert r.verdict == "FAIL", (fmt, str(r))
    with pytest.raises(AssertionError) as e:
        assert_attention_close(kernel(q, k, v, "bfloat16", scale=False), wrong_case, dtype="bfloat16", input_format=input_format)
    assert not isinstance(e.value, InconclusiveError)


def test_missing_scale_fails_under_every_declared_policy(tmp_path, wrong_case):
    q, k, v = (wrong_case.inputs[r] for r in ("query", "key", "value"))
    wrong = {fmt: kernel(q, k, v, fmt, scale=False) for fmt in FORMATS}
    accepted = {}
    for policy in attnref._attnref._policy_names():
        for fmt in FORMATS:
            try:
                r = attnref.check(WRONG_CASE, wrong[fmt], dtype=fmt, policy=policy)
            except ValueError as e:  # the policy writes its results in another format
                assert str(e).startswith("policy: "), str(e)
                continue
            assert r.verdict == "FAIL" and r.policy == policy, (policy, fmt, str(r))
            accepted.setdefault(policy, []).append(fmt)
    # Every policy whose output is one of the candidate formats was judged (longdouble, bin50 and
    # float128 write wider results than any candidate file).
    assert {"float32", "float64", "bf16", "fp16", "bf16_fp32acc", "fp16_fp32acc", "fp32_p_bf16", "fp32_p_fp8e4m3",
            "fp32_p_fp8e5m2"} <= set(accepted)
    assert accepted["bf16_fp32acc"] == ["bfloat16"] and accepted["fp32_p_bf16"] == ["float32"]
    for policy, fmt in (("bf16_fp32acc", "bfloat16"), ("fp32_p_fp8e5m2", "float32")):
        assert command_verdict(tmp_path, wrong[fmt], fmt, "--policy", policy, case=WRONG_CASE)[0] == "FAIL"
    with pytest.raises(AssertionError) as e:
        assert_attention_close(wrong["float32"], wrong_case, dtype="float32", policy="fp32_p_bf16")
    assert not isinstance(e.value, InconclusiveError)


def test_declared_policy_of_a_correct_kernel(tmp_path, golden, rounded):
    # attnref's own bf16_fp32acc kernel on the rounded inputs, declared: PASS, as the command says.
    q, k, v = (rounded.inputs[r] for r in ("query", "key", "value"))
    out = attnref.sdpa(q, k, v, arith="bf16_fp32acc").output
    r = attnref.check(CASE, out, dtype="bfloat16", policy="bf16_fp32acc")
    verdict, reason, inputs = command_verdict(tmp_path, np.asarray(out), "bfloat16", "--policy", "bf16_fp32acc")
    assert (r.verdict, r.reason) == (verdict, reason) and r.verdict == "PASS"
    assert r.inputs == "bfloat16-rounded" and r.policy == "bf16_fp32acc"
    assert "policy: bf16_fp32acc (declared)" in r.text and json.loads(r.json)["policy"] == "bf16_fp32acc"
    assert_attention_close(out, golden, dtype="bfloat16", policy="bf16_fp32acc")


def test_the_verdict_names_its_inputs(golden):
    out = golden.reference["output"].astype(np.float32)
    r = attnref.check(CASE, out, dtype="bfloat16", input_format="float16")
    assert r.inputs == "float16-rounded"
    assert "rounded to nearest even to float16" in str(r) and "input_format='float16'" in str(r)
    assert r.text.startswith("inputs: the golden inputs rounded to nearest even to float16")
    assert json.loads(r.json)["inputs"] == r.inputs_description
    c = attnref.check(CASE, out, input_format="case")
    assert c.inputs == "case" and "the golden inputs, the case's own" in str(c) and r.policy is None
    exact = attnref.check("sdpa_input_bfloat16", attnref.load_case("sdpa_input_bfloat16").reference["output"].astype(np.float32),
                          dtype="bfloat16")
    assert exact.inputs == "case" and "exact in bfloat16" in exact.inputs_description


def test_bad_input_format_and_policy_name_the_argument(golden, rounded):
    out = golden.reference["output"]
    for bad in ("bf16", "fp8", "", "AUTO"):
        with pytest.raises(ValueError, match="^input_format: "):
            attnref.check(CASE, out, input_format=bad)
    with pytest.raises(TypeError, match="^input_format: "):
        attnref.check(CASE, out, input_format=16)
    for bad in ("bogus", "", "bf16-fp32acc"):
        with pytest.raises(ValueError, match="^policy: "):
            attnref.check(CASE, out, policy=bad)
    with pytest.raises(ValueError, match="^policy: "):  # float64 results, a bf16-output policy
        attnref.check(CASE, out, policy="bf16_fp32acc")
    with pytest.raises(ValueError, match="^policy: "):
        attnref.check(CASE, out.astype(np.float32), policy="float32", tolerance="ulp")
    with pytest.raises(ValueError, match="^input_format: "):
        attnref.load_case(CASE, input_format="bf16")
    with pytest.raises(ValueError, match="^input_format: "):  # the GoldenCase holds bf16-rounded inputs
        attnref.check(rounded, out.astype(np.float32), dtype="bfloat16", input_format="case")
    ref = attnref.sdpa(*(golden.inputs[r] for r in ("query", "key", "value")))
    with pytest.raises(ValueError, match="^policy: "):
        assert_attention_close(out, ref, policy="float64")
    with pytest.raises(ValueError, match="^input_format: "):
        assert_attention_close(out, ref, input_format="bfloat16")
    with pytest.raises(ValueError, match="^policy: "):
        assert_attention_close(out.astype(np.float32), golden, policy="nope")
