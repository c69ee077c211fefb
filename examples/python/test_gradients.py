"""Gating PyTorch autograd gradients in pytest (docs/python.md, "Gradients").

attnref.sdpa(..., grad_output=do) certifies dQ, dK, dV of the very inputs the kernel reads (every
element the correctly rounded float64 of the exact gradient); assert_attention_close judges the
kernel's gradients with the checker's gradient bound for their format, as `attnref check --grad-*`
does. The "kernel" here is PyTorch autograd through an explicit causal GQA attention; replace it
with yours.
"""
import pytest
import torch

import attnref
import attnref.testing


def my_attention(q, k, v):
    """The implementation under test: causal (top-left) GQA attention, kv heads repeated per group."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    logits = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    causal = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
    return torch.softmax(logits.masked_fill(~causal, float("-inf")), -1) @ v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_autograd_gradients(dtype):
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 4, 24, 16, generator=g, dtype=dtype, requires_grad=True)
    k = torch.randn(1, 2, 24, 16, generator=g, dtype=dtype, requires_grad=True)
    v = torch.randn(1, 2, 24, 16, generator=g, dtype=dtype, requires_grad=True)
    do = torch.randn(1, 4, 24, 16, generator=g, dtype=dtype)
    out = my_attention(q, k, v)
    out.backward(do)
    # The reference of the same inputs and dO (tensors that require grad are read through .detach()).
    ref = attnref.sdpa(q, k, v, causal="top_left", grad_output=do)
    # autograd through softmax forms dS from the forward's own weights: "textbook".
    attnref.testing.assert_attention_close(out, ref, grad_query=q.grad, grad_key=k.grad, grad_value=v.grad,
                                           backward_algorithm="textbook")


def test_a_wrong_gradient_fails():
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, h, 24, 16, generator=g, requires_grad=True) for h in (4, 2, 2))
    do = torch.randn(1, 4, 24, 16, generator=g)
    my_attention(q, k, v).backward(do)
    ref = attnref.sdpa(q, k, v, causal="top_left", grad_output=do)
    with pytest.raises(AssertionError, match="grad_value is not close"):
        attnref.testing.assert_attention_close(None, ref, grad_value=v.grad * 1.01)
