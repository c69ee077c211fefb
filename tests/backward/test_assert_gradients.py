"""attnref.testing.assert_attention_close with gradients: on random causal GQA inputs, PyTorch's float32
autograd gradients PASS against attnref.sdpa(..., grad_output=do) (declared textbook, and undeclared);
a dQ without the scale and a dK with two keys swapped FAIL with AssertionError (not InconclusiveError)
naming the tensor and index; a zero dV is never a pass; bf16 autograd on bf16 inputs gets the
checker's verdict (printed); bad arguments are named errors."""
import numpy as np
import pytest
import torch

import attnref
import attnref.testing as T

B, H, HKV, S, D = 1, 4, 2, 32, 16


def causal_gqa_inputs(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, H, S, D), (B, HKV, S, D), (B, HKV, S, D), (B, H, S, D)]
    return [torch.randn(*s, generator=g).to(dtype) for s in shapes]


def autograd(q, k, v, do):
    """PyTorch autograd of causal (top-left) GQA attention written out: the kv heads repeated over
    each group, softmax of the scaled logits, weighted values."""
    q, k, v = (x.clone().requires_grad_(True) for x in (q, k, v))
    group = H // HKV
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    logits = (q @ kk.transpose(-1, -2)) / D**0.5
    logits = logits.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
    o = torch.softmax(logits, -1) @ vv
    o.backward(do)
    return o, q.grad, k.grad, v.grad  # o still requires grad: assert_attention_close detaches it


@pytest.fixture(scope="module")
def float32_case():
    q, k, v, do = causal_gqa_inputs(torch.float32, 0)
    ref = attnref.sdpa(q, k, v, causal="top_left", grad_output=do)
    return ref, autograd(q, k, v, do)


def test_float32_autograd_passes(float32_case):
    ref, (o, dq, dk, dv) = float32_case
    assert o.requires_grad and dq.dtype == torch.float32
    T.assert_attention_close(o, ref, grad_query=dq, grad_key=dk, grad_value=dv, backward_algorithm="textbook")
    T.assert_attention_close(None, ref, grad_query=dq, grad_key=dk, grad_value=dv)  # (B5): valid for any algorithm


def test_unscaled_grad_query_fails(float32_case):
    ref, (o, dq, dk, dv) = float32_case
    with pytest.raises(AssertionError) as e:
        T.assert_attention_close(o, ref, grad_query=dq * D**0.5, grad_key=dk, grad_value=dv, backward_algorithm="textbook")
    assert not isinstance(e.value, T.InconclusiveError), str(e.value)
    assert "Attention gradient grad_query is not close" in str(e.value) and "at index (0, " in str(e.value)


def test_swapped_keys_grad_key_fails(float32_case):
    ref, (o, dq, dk, dv) = float32_case
    swapped = dk.clone()
    swapped[:, :, [3, 7]] = dk[:, :, [7, 3]]
    with pytest.raises(AssertionError) as e:
        T.assert_attention_close(None, ref, grad_key=swapped, backward_algorithm="textbook")
    assert not isinstance(e.value, T.InconclusiveError), str(e.value)
    text = str(e.value)
    assert "Attention gradient grad_key is not close" in text
    idx = text.split("at index ")[1].split(")")[0] + ")"
    assert eval(idx)[2] in (3, 7), text  # the worst element is on a swapped key


def test_zero_grad_value_is_not_a_pass(float32_case):
    ref, (o, dq, dk, dv) = float32_case
    with pytest.raises(AssertionError):
        T.assert_attention_close(None, ref, grad_value=torch.zeros_like(dv))


def test_failure_is_reported_before_inconclusive(float32_case):
    """An output that fails and gradients that pass: the output's AssertionError."""
    ref, (o, dq, dk, dv) = float32_case
    with pytest.raises(AssertionError, match="Attention output is not close") as e:
        T.assert_attention_close(o.detach() * 1.01, ref, grad_query=dq)
    assert not isinstance(e.value, T.InconclusiveError)


def test_bfloat16_autograd_on_bfloat16_inputs():
    q, k, v, do = causal_gqa_inputs(torch.bfloat16, 3)
    # bf16 values are exact in float32: the reference is for the very inputs the bf16 kernel reads.
    ref = attnref.sdpa(q.float(), k.float(), v.float(), causal="top_left", grad_output=do.float())
    # The certified gradients rounded to bf16 are within any valid bf16 bound: never FAIL.
    rounded = {r: torch.from_numpy(np.array(ref.gradients[r])).to(torch.bfloat16) for r in ("grad_query", "grad_key", "grad_value")}
    try:
        T.assert_attention_close(None, ref, backward_algorithm="textbook", **rounded)
        print("certified gradients rounded to bf16: PASS")
    except T.InconclusiveError as e:
        print("certified gradients rounded to bf16: INCONCLUSIVE:", str(e).splitlines()[0])
    o, dq, dk, dv = autograd(q, k, v, do)
    assert dq.dtype == torch.bfloat16
    try:
        T.assert_attention_close(o, ref, grad_query=dq, grad_key=dk, grad_value=dv, backward_algorithm="textbook")
        verdict = "PASS"
    except T.InconclusiveError as e:
        verdict = "INCONCLUSIVE: " + str(e).splitlines()[0]
    except AssertionError as e:
        verdict = "FAIL: " + " ".join(str(e).splitlines()[:3])
        assert "grad_" in verdict or "output" in verdict, verdict
    print("PyTorch bf16 autograd on bf16 inputs:", verdict)


def test_bad_arguments_are_named(float32_case):
    ref, (o, dq, dk, dv) = float32_case
    with pytest.raises(TypeError, match="actual"):
        T.assert_attention_close(None, ref)
    with pytest.raises(ValueError, match="grad_w_q"):
        T.assert_attention_close(None, ref, grad_w_q=np.zeros((4, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="backward_algorithm"):
        T.assert_attention_close(None, ref, grad_query=dq, backward_algorithm="fast")
    with pytest.raises(ValueError, match="tolerance"):
        T.assert_attention_close(None, ref, grad_query=dq, tolerance="ulp")
    with pytest.raises(AssertionError, match="shape"):
        T.assert_attention_close(None, ref, grad_query=dq[:, :2])
    with pytest.raises(ValueError, match="dtype"):
        T.assert_attention_close(None, ref, grad_query=dq, grad_key=dk.double())
    no_grads = attnref.sdpa(*causal_gqa_inputs(torch.float32, 0)[:3], causal="top_left")
    with pytest.raises(ValueError, match="grad_output"):
        T.assert_attention_close(None, no_grads, grad_query=dq)
    with pytest.raises(TypeError, match="Reference"):
        T.assert_attention_close(None, ref.output, grad_query=dq, tolerance="assert-close")
