"""Gate torch.nn.functional.multi_head_attention_forward (float32 and float64) with attnref.mha."""
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import attnref
from attnref.testing import InconclusiveError, assert_attention_close

E, H, B, SQ, SK = 32, 4, 2, 7, 11


def draw(seed):
    g = torch.Generator().manual_seed(seed)  # new inputs per test, reproducible from the seed
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    return dict(x_q=r(SQ, B, E), x_k=r(SK, B, E), x_v=r(SK, B, E), in_w=r(3 * E, E) / E ** 0.5, in_b=r(3 * E) * 0.1,
                out_w=r(E, E) / E ** 0.5, out_b=r(E) * 0.1)


def torch_mha(t, dtype, **kw):
    c = {n: x.to(dtype) for n, x in t.items()}
    out, w = F.multi_head_attention_forward(c["x_q"], c["x_k"], c["x_v"], E, H, c["in_w"], c["in_b"], None, None, False, 0.0,
                                            c["out_w"], c["out_b"], training=False, need_weights=True,
                                            average_attn_weights=False, **kw)
    return out.transpose(0, 1), w  # (B, Sq, E), weights (B, H, Sq, Sk)


def reference(t, **kw):
    # attnref's layout y = x @ W + b: W = in_proj_weight[i*E:(i+1)*E].T, W_o = out_proj.weight.T
    w = t["in_w"]
    b = t["in_b"]
    return attnref.mha(t["x_q"].transpose(0, 1), t["x_k"].transpose(0, 1), t["x_v"].transpose(0, 1), w[:E].T, w[E:2 * E].T,
                       w[2 * E:].T, t["out_w"].T, b[:E], b[E:2 * E], b[2 * E:], t["out_b"], heads=H, return_weights=True, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", [1, 2])
def test_torch_mha_passes(dtype, seed):
    t = draw(seed)
    ref = reference(t)
    out, w = torch_mha(t, dtype)
    assert_attention_close(out, ref, weights=w)


def test_torch_mha_key_padding_mask_passes():
    t = draw(3)
    pad = torch.zeros(B, SK, dtype=torch.bool)
    pad[1, 8:] = True  # True = ignore (nn.MultiheadAttention)
    ref = reference(t, key_lengths=[SK, 8])
    out, _ = torch_mha(t, torch.float32, key_padding_mask=pad)
    assert_attention_close(out, ref)


def test_torch_mha_against_wrong_convention_fails():
    # PyTorch's bool attn_mask means True = masked; gating it against a reference built with the SDPA
    # polarity (True = attend) must fail.
    t = draw(4)
    m = torch.rand(SQ, SK, generator=torch.Generator().manual_seed(5)) < 0.3
    out, _ = torch_mha(t, torch.float32, attn_mask=m)
    assert_attention_close(out, reference(t, mask=m.numpy(), mask_polarity="true_means_masked"))
    with pytest.raises(AssertionError, match="is not close") as e:
        assert_attention_close(out, reference(t, mask=m.numpy(), mask_polarity="true_means_attend"))
    assert not isinstance(e.value, InconclusiveError)


def test_tensor_that_requires_grad_is_read_detached():
    # The leaves of an autograd test are accepted as they are: their values are read, the graph untouched.
    t = draw(6)
    q = t["x_q"].transpose(0, 1).clone().requires_grad_()
    w = (t["in_w"][:E].T, t["in_w"][E:2 * E].T, t["in_w"][2 * E:].T, t["out_w"].T)
    a = attnref.mha(q, q, q, *w, heads=H)
    b = attnref.mha(q.detach().numpy(), q.detach().numpy(), q.detach().numpy(), *w, heads=H)
    assert (a.output == b.output).all()
    assert q.requires_grad and q.grad is None


def test_bfloat16_tensors():
    # NumPy has no bfloat16: the reference reads a bfloat16 tensor through .float() (exact), and the
    # assert judges a bfloat16 output as bfloat16.
    t = draw(7)
    x = t["x_q"].transpose(0, 1).to(torch.bfloat16)
    w = (t["in_w"][:E].T, t["in_w"][E:2 * E].T, t["in_w"][2 * E:].T, t["out_w"].T)
    a = attnref.mha(x, x, x, *w, heads=H)
    assert (a.output == attnref.mha(x.float(), x.float(), x.float(), *w, heads=H).output).all()
    q = torch.randn(1, 2, 5, 8, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    ref = attnref.sdpa(q, q, q)
    b = q.to(torch.bfloat16)  # torch 1.13 (Debian 12) has no F.scaled_dot_product_attention
    out = torch.softmax((b @ b.transpose(-1, -2)) * 8 ** -0.5, dim=-1) @ b
    assert_attention_close(out, ref)  # dtype bfloat16 from the tensor
