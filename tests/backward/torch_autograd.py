"""PyTorch autograd gradients of attention, for attnref's backward comparison (backward_torch.test).

Usage: torch_autograd.py DIR. DIR holds q.npy (B,H,Sq,dk), k.npy and v.npy (B,Hkv,Sk,·),
grad_output.npy (B,H,Sq,dv), attend.npy (B,H,Sq,Sk bool: True = the key is attended),
additive.npy (B,H,Sq,Sk) and params.json {"scale": s, "softcap": null|cap}. Writes
grad_{query,key,value}_{float64,float32}.npy (float64 arrays). The forward is the textbook one
FlashAttention's tests use as attention_ref (softmax of (q·kᵀ)·s, soft-capped, plus the additive
mask, masked keys set to −inf; GQA by repeat_interleave over the head axis), differentiated by
torch.autograd in each dtype.
"""
import json
import pathlib
import sys

import numpy as np
import torch


def gradients(d: pathlib.Path, dtype: torch.dtype):
    load = lambda name: torch.from_numpy(np.load(d / f"{name}.npy"))
    params = json.loads((d / "params.json").read_text())
    q, k, v = (load(n).to(dtype).requires_grad_() for n in ("q", "k", "v"))
    grad_output = load("grad_output").to(dtype)
    attend = load("attend")
    additive = load("additive").to(dtype)
    group = q.shape[1] // k.shape[1]
    k_rep, v_rep = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = (q @ k_rep.transpose(-2, -1)) * params["scale"]
    if params["softcap"] is not None:
        s = params["softcap"] * torch.tanh(s / params["softcap"])
    s = (s + additive).masked_fill(~attend, float("-inf"))
    out = torch.softmax(s, dim=-1) @ v_rep
    out.backward(grad_output)
    return q.grad, k.grad, v.grad


def main() -> int:
    d = pathlib.Path(sys.argv[1])
    torch.set_num_threads(1)
    for name, dtype in (("float64", torch.float64), ("float32", torch.float32)):
        for role, g in zip(("query", "key", "value"), gradients(d, dtype)):
            np.save(d / f"grad_{role}_{name}.npy", g.to(torch.float64).numpy())
    return 0


if __name__ == "__main__":
    sys.exit(main())
