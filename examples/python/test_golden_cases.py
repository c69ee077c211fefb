"""Gating against committed golden cases from Python: attnref.load_case and attnref.check, the same
verdicts as the `attnref check` command (include/attnref/check/checker.hpp)."""
import os
import shutil

import numpy as np
import pytest

import attnref
import numpy_attention

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "golden")


@pytest.mark.parametrize("name", ["sdpa_basic", "sdpa_gqa"])
def test_numpy_float32_passes_a_committed_case(name):
    case = attnref.load_case(os.path.join(GOLDEN, name))
    assert case.name == name and case.kind == "sdpa"
    assert case.conventions["shapes"]["heads"] == case.inputs["query"].shape[1]
    q, k, v = case.inputs["query"], case.inputs["key"], case.inputs["value"]
    assert case.reference["output"].shape == (q.shape[0], q.shape[1], q.shape[2], v.shape[3])
    out = numpy_attention.sdpa(q, k, v, dtype=np.float32)[0]
    verdict = attnref.check(case, out, dtype="float32")
    assert verdict.passed, verdict.text
    assert verdict.verdict == "PASS" and "<testsuite" in verdict.junit and '"PASS"' in verdict.json


def test_wrong_scale_fails_a_committed_case():
    case = attnref.load_case(os.path.join(GOLDEN, "sdpa_basic"))
    q, k, v = case.inputs["query"], case.inputs["key"], case.inputs["value"]
    wrong = numpy_attention.sdpa(q, k, v, dtype=np.float32, scale=1.0)[0]  # the 1/sqrt(dk) scale forgotten
    verdict = attnref.check(os.path.join(GOLDEN, "sdpa_basic"), wrong, dtype="float32")
    assert not verdict and verdict.verdict == "FAIL", verdict.text
    assert verdict.reason


def test_certified_reference_of_a_case_is_the_committed_one():
    # attnref.sdpa on the case's inputs reproduces the committed golden output bit for bit (both are the
    # correctly rounded float64 of the same exact values).
    case = attnref.load_case(os.path.join(GOLDEN, "sdpa_gqa"))
    ref = attnref.sdpa(case.inputs["query"], case.inputs["key"], case.inputs["value"], return_weights=True, return_lse=True)
    assert np.array_equal(ref.output, case.reference["output"])
    assert np.array_equal(ref.weights, case.reference["weights"])
    assert np.array_equal(ref.lse, case.reference["lse"])


def test_bad_inputs_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match="not a golden case directory"):
        attnref.load_case(tmp_path / "missing")
    bad = tmp_path / "sdpa_basic"
    shutil.copytree(os.path.join(GOLDEN, "sdpa_basic"), bad)
    with open(bad / "output.npy", "r+b") as f:
        f.seek(200)
        f.write(b"\x01")
    with pytest.raises(ValueError, match="sha256"):
        attnref.load_case(bad)
    case = attnref.load_case(os.path.join(GOLDEN, "sdpa_basic"))
    with pytest.raises(ValueError, match="output: expected shape"):
        attnref.check(case, np.zeros((1, 2, 3)), dtype="float32")
    with pytest.raises(ValueError, match="dtype"):
        attnref.check(case, case.reference["output"], dtype="float8")
