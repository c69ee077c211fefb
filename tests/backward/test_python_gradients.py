"""attnref.check with gradients (python/attnref/__init__.py): the certified gradients rounded to
float32 PASS, one element moved by 1% FAILs, a role the case lacks and a wrong shape are errors."""
import os

import numpy as np
import pytest

import attnref

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "golden")


def certified(case, role):
    return np.load(os.path.join(GOLDEN, case, role + ".npy")).astype(np.float32)


def test_sdpa_gradients_pass_and_a_moved_element_fails():
    g = {r: certified("sdpa_bwd_gqa", r) for r in ("grad_query", "grad_key", "grad_value")}
    v = attnref.check(os.path.join(GOLDEN, "sdpa_bwd_gqa"), dtype="float32", **g)
    assert v, v.text
    g["grad_key"] = g["grad_key"].copy()
    g["grad_key"][0, 1, 2, 3] *= np.float32(1.01)
    v = attnref.check(os.path.join(GOLDEN, "sdpa_bwd_gqa"), dtype="float32", **g)
    assert v.verdict == "FAIL" and "grad_key" in v.reason


def test_mha_weight_gradient_with_output():
    case = os.path.join(GOLDEN, "mha_bwd_bias_gqa")
    out = np.load(os.path.join(case, "output.npy")).astype(np.float32)
    v = attnref.check(case, out, dtype="float32", grad_w_o=certified("mha_bwd_bias_gqa", "grad_w_o"))
    assert v, v.text
    assert "grad_w_o" in v.text


def test_bad_gradients_are_errors():
    case = os.path.join(GOLDEN, "sdpa_bwd_gqa")
    with pytest.raises(ValueError, match="grad_w_q"):
        attnref.check(case, dtype="float32", grad_w_q=np.zeros((8, 8), dtype=np.float32))
    with pytest.raises(ValueError, match="grad_query"):
        attnref.check(case, dtype="float32", grad_query=np.zeros((1, 2), dtype=np.float32))
    with pytest.raises(TypeError):
        attnref.check(case, dtype="float32", gradquery=np.zeros((1, 2)))
    with pytest.raises(ValueError, match="at least one gradient"):
        attnref.check(case)


def numpy_textbook_grad_query(case):
    """dQ of a float32 textbook backward written here in NumPy (no masks: the case has none)."""
    d = os.path.join(GOLDEN, case)
    q, k, v, do = (np.load(os.path.join(d, r + ".npy")).astype(np.float32) for r in ("query", "key", "value", "grad_output"))
    s = np.float32(1 / np.sqrt(q.shape[-1]))
    logits = (q @ k.swapaxes(-1, -2)) * s
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    dp = do @ v.swapaxes(-1, -2)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    return (ds @ k) * s


def test_declared_textbook_backward_tightens_grad_query():
    # Logits near 1000 (keys offset by 100): dQ's bound valid for any algorithm is vacuous; the
    # declared textbook backward's centred bound (B5t) decides, and a dropped scale still fails.
    case = os.path.join(GOLDEN, "sdpa_bwd_adv_logit_offset_1000")
    dq = numpy_textbook_grad_query("sdpa_bwd_adv_logit_offset_1000")
    assert attnref.check(case, dtype="float32", grad_query=dq).verdict == "INCONCLUSIVE"
    v = attnref.check(case, dtype="float32", grad_query=dq, backward_algorithm="textbook")
    assert v, v.text
    assert "(B5t)" in v.text and "textbook" in v.json
    s = np.float32(1 / np.sqrt(dq.shape[-1]))
    assert attnref.check(case, dtype="float32", grad_query=dq / s, backward_algorithm="textbook").verdict == "FAIL"
    with pytest.raises(ValueError, match="backward_algorithm"):
        attnref.check(case, dtype="float32", grad_query=dq, backward_algorithm="fast")
