"""PyTorch CPU adapters (python3-torch 1.13): eager attention written out, nn.MultiheadAttention and
F.multi_head_attention_forward; autograd for the backward cases.

Convention mapping (golden/README.md field → PyTorch):
  scale, scale_placement   eager: s applied as the case places it; MHA: fixed q / sqrt(head_dim) (on_query),
                           an explicit scale is not expressible
  softcap                  eager: cap * tanh(x / cap) before any mask; MHA: not expressible
  alibi_slopes, additive   eager: added in the compute dtype; MHA: one float attn_mask (B*H, Sq, Sk), exact or skipped
  seed_mask                eager: x + m * (-1e9); MHA: float attn_mask m * (-1e9)
  causal, window, boolean  eager: masked_fill(-inf); MHA: -inf entries of the float attn_mask
  key_lengths              eager: masked_fill(-inf); MHA: key_padding_mask (True = ignore)
  mask_polarity            true_means_masked is inverted explicitly
  gqa_mapping              eager: repeat_interleave(H / H_kv) on the head axis; MHA: the kv projection's head
                           blocks repeated (exact)
  empty_rows               softmax of an all -inf row: NaN (the implementation's own convention)
  sdpa cases under MHA     identity projections (exact), heads split from the embedding (head h owns columns h*d…)
"""
import numpy as np

from common import Unsupported, save_bf16

_torch = None


def torch():
    global _torch
    if _torch is None:
        import torch as t
        t.set_num_threads(1)
        _torch = t
    return _torch


def _dtype(fmt):
    t = torch()
    return {"float32": t.float32, "bfloat16": t.bfloat16}[fmt]


def _save(path, t, fmt):
    if fmt == "bfloat16":
        save_bf16(path, t)
    else:
        np.save(path, t.detach().numpy().astype("<f4"))
    return path


class Eager:
    name = "pytorch-eager"
    title = "PyTorch 1.13 CPU, eager attention written out (matmul, masked_fill, softmax, matmul; autograd)"
    formats = ("float32", "bfloat16")
    empty_rows = "nan"
    empty_rows_backward = "zero"

    def run(self, case, fmt, out):
        t = torch()
        if case.kind != "sdpa":
            raise Unsupported("an mha case (projections): see nn.MultiheadAttention")
        dt = _dtype(fmt)
        H, Hkv = case.H, case.Hkv
        q = t.tensor(case.load("query"), dtype=dt, requires_grad=case.backward)
        k = t.tensor(case.load("key"), dtype=dt, requires_grad=case.backward)
        v = t.tensor(case.load("value"), dtype=dt, requires_grad=case.backward)
        kk = k.repeat_interleave(H // Hkv, dim=1)
        vv = v.repeat_interleave(H // Hkv, dim=1)
        s = case.scale()
        placement = case.cv["scale_placement"]
        if placement == "on_product":
            x = (q @ kk.transpose(-1, -2)) * s
        elif placement == "on_query":
            x = (q * s) @ kk.transpose(-1, -2)
        else:
            r = float(np.sqrt(s))
            x = (q * r) @ (kk * r).transpose(-1, -2)
        cap = case.cv["softcap"]
        if cap is not None:
            x = cap * t.tanh(x / cap)
        ab = case.alibi_bias()
        if ab is not None:
            x = x + t.tensor(ab, dtype=dt)
        add = case.additive()
        if add is not None:
            x = x + t.tensor(add, dtype=dt)
        if case.cv["seed_mask"]:
            x = x + t.tensor(case.load("seed_mask"), dtype=dt) * -1e9
        allowed = case.structural_allowed()
        if not allowed.all():
            x = x.masked_fill(~t.tensor(allowed), float("-inf"))
        p = t.softmax(x, dim=-1)
        o = p @ vv
        files = {"output": _save(f"{out}/output.npy", o, fmt), "weights": _save(f"{out}/weights.npy", p, fmt)}
        if fmt == "float32":         # the eager form has no lse of its own; logsumexp of the same logits
            files["lse"] = _save(f"{out}/lse.npy", t.logsumexp(x, dim=-1), fmt)
        if case.backward:
            do = t.tensor(case.load("grad_output"), dtype=dt)
            (o * do).sum().backward()
            for role, leaf in (("grad_query", q), ("grad_key", k), ("grad_value", v)):
                files[role] = _save(f"{out}/{role}.npy", leaf.grad, fmt)
        return files, ["--backward-algorithm", "textbook"] if case.backward else []


def _mha_inputs(case, dt, requires_grad):
    """Embeddings, per-role projection weights in PyTorch's (out, in) layout, biases, and the leaves the
    gradients are read from. sdpa cases get identity projections."""
    t = torch()
    H, Hkv, dk, dv = case.H, case.Hkv, case.dk, case.dv
    leaves = {}

    def leaf(role, a):
        x = t.tensor(a, dtype=dt, requires_grad=requires_grad)
        leaves[role] = x
        return x

    # head blocks of kv columns repeated: query head h reads kv head h // (H / Hkv)
    def expand_cols(x, d):                       # (..., Hkv*d) -> (..., H*d)
        idx = t.tensor([(h // (H // Hkv)) * d + c for h in range(H) for c in range(d)])
        return x.index_select(-1, idx)

    if case.kind == "sdpa":
        B, Sq, Sk = case.B, case.Sq, case.Sk
        q = leaf("query", case.load("query"))
        k = leaf("key", case.load("key"))
        v = leaf("value", case.load("value"))
        xq = q.transpose(1, 2).reshape(B, Sq, H * dk)
        xk = expand_cols(k.transpose(1, 2).reshape(B, Sk, Hkv * dk), dk)
        xv = expand_cols(v.transpose(1, 2).reshape(B, Sk, Hkv * dv), dv)
        eye = t.eye(H * dk, dtype=dt)
        w = {"q": eye, "k": eye, "v": t.eye(H * dv, dtype=dt), "o": t.eye(H * dv, dtype=dt)}
        b = None
    else:
        if case.sh["model_dim"] != H * dk:
            raise Unsupported("model_dim ≠ heads·head_dim_qk (embed_dim is split into the heads)")
        if case.sh["output_dim"] != case.sh["model_dim"]:
            raise Unsupported("output_dim ≠ model_dim (out_proj is embed_dim × embed_dim)")
        xq = leaf("query", case.load("query"))
        xk = leaf("key", case.load("key"))
        xv = leaf("value", case.load("value"))
        w = {"q": leaf("w_q", case.load("w_q")).t(), "k": expand_cols(leaf("w_k", case.load("w_k")), dk).t(),
             "v": expand_cols(leaf("w_v", case.load("w_v")), dv).t(), "o": leaf("w_o", case.load("w_o")).t()}
        b = None
        if case.cv["projection_bias"]:
            b = {"q": leaf("b_q", case.load("b_q")), "k": expand_cols(leaf("b_k", case.load("b_k")), dk),
                 "v": expand_cols(leaf("b_v", case.load("b_v")), dv), "o": leaf("b_o", case.load("b_o"))}
    return xq, xk, xv, w, b, leaves


def _mha_masks(case, dt):
    """(attn_mask (B*H, Sq, Sk) float or None, key_padding_mask (B, Sk) bool or None)."""
    t = torch()
    if case.cv["scale"] is not None:
        raise Unsupported("explicit scale (fixed q / sqrt(head_dim))")
    if case.cv["softcap"] is not None:
        raise Unsupported("softcap (no soft-capping)")
    if case.dk != case.dv:
        raise Unsupported("head_dim_qk ≠ head_dim_v (one head_dim = embed_dim / num_heads)")
    allowed = case.structural_allowed(include_key_lengths=False)
    bias = None
    if case.cv["seed_mask"]:
        bias = (case.load("seed_mask") * -1e9).astype(np.float32)
        if not allowed.all():
            bias = np.where(allowed, bias, -np.inf).astype(np.float32)
    else:
        from common import combined_float_bias
        bias = combined_float_bias(case, np.float32, allowed, "attn_mask values")
    am = None
    if bias is not None:
        am = t.tensor(np.ascontiguousarray(bias).reshape(case.B * case.H, case.Sq, case.Sk), dtype=dt)
    kpm = None
    if case.cv["key_lengths"]:
        kpm = t.tensor(np.arange(case.Sk)[None, :] >= np.asarray(case.cv["key_lengths"])[:, None])
    return am, kpm


def _mha_outputs(case, o, p, fmt, out):
    t = torch()
    if case.kind == "sdpa":          # (B, Sq, H*dv) -> (B, H, Sq, dv)
        o = o.reshape(case.B, case.Sq, case.H, case.dv).transpose(1, 2)
    return {"output": _save(f"{out}/output.npy", o, fmt), "weights": _save(f"{out}/weights.npy", p, fmt)}, o


class Module:
    name = "pytorch-nn-mha"
    title = "PyTorch 1.13 CPU, torch.nn.MultiheadAttention (batch_first, need_weights, average_attn_weights=False)"
    formats = ("float32",)
    empty_rows = "nan"

    def run(self, case, fmt, out):
        t = torch()
        if case.backward:
            raise Unsupported("backward cases are run through F.multi_head_attention_forward")
        dt = _dtype(fmt)
        am, kpm = _mha_masks(case, dt)
        xq, xk, xv, w, b, _ = _mha_inputs(case, dt, False)
        E = w["q"].shape[0]
        m = t.nn.MultiheadAttention(E, case.H, bias=b is not None, batch_first=True, dtype=dt)
        with t.no_grad():
            m.in_proj_weight.copy_(t.cat([w["q"], w["k"], w["v"]], 0))
            m.out_proj.weight.copy_(w["o"])
            if b is not None:
                m.in_proj_bias.copy_(t.cat([b["q"], b["k"], b["v"]]))
                m.out_proj.bias.copy_(b["o"])
            o, p = m(xq, xk, xv, key_padding_mask=kpm, attn_mask=am, need_weights=True, average_attn_weights=False)
        files, _ = _mha_outputs(case, o, p, fmt, out)
        return files, []


class Functional:
    name = "pytorch-f-mha"
    title = ("PyTorch 1.13 CPU, torch.nn.functional.multi_head_attention_forward (use_separate_proj_weight; "
             "autograd for the backward cases)")
    formats = ("float32",)
    empty_rows = "nan"
    empty_rows_backward = "zero"

    def run(self, case, fmt, out):
        t = torch()
        F = t.nn.functional
        dt = _dtype(fmt)
        am, kpm = _mha_masks(case, dt)
        xq, xk, xv, w, b, leaves = _mha_inputs(case, dt, case.backward)
        E = w["q"].shape[0]
        tb = lambda x: x.transpose(0, 1)           # (B, S, E) -> (S, B, E): the functional form is seq-first
        in_bias = t.cat([b["q"], b["k"], b["v"]]) if b is not None else None
        o, p = F.multi_head_attention_forward(
            tb(xq), tb(xk), tb(xv), E, case.H, None, in_bias, None, None, False, 0.0, w["o"],
            b["o"] if b is not None else None, training=False, key_padding_mask=kpm, need_weights=True,
            attn_mask=am, use_separate_proj_weight=True, q_proj_weight=w["q"], k_proj_weight=w["k"],
            v_proj_weight=w["v"], average_attn_weights=False)
        files, o4 = _mha_outputs(case, tb(o), p, fmt, out)
        if case.backward:
            do = t.tensor(case.load("grad_output"), dtype=dt)
            (o4 * do).sum().backward()
            for role, x in leaves.items():
                files["grad_" + role] = _save(f"{out}/grad_{role}.npy", x.grad, fmt)
        return files, ["--backward-algorithm", "textbook"] if case.backward else []
