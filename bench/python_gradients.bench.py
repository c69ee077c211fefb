#!/usr/bin/python3
"""Certified gradients from Python against PyTorch's float64 forward + backward, same shape, same run.

    PYTHONPATH=build/default/python /usr/bin/python3 bench/python_gradients.bench.py [seeds...]

Prints one line per (shape, seed): attnref.sdpa / attnref.mha with grad_output= (the fast certified
backward) and PyTorch 1.13 float64 autograd (best of 3), and their ratio (docs/measurements.md, "Python")."""
import sys
import time

import numpy as np
import torch

import attnref

seeds = [int(s) for s in sys.argv[1:]] or [0, 1]


def torch_sdpa(q, k, v, do):
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        o = torch.softmax((tq @ tk.transpose(-1, -2)) * q.shape[-1] ** -0.5, -1) @ tv
        o.backward(torch.tensor(do))
        best = min(best, time.perf_counter() - t)
        tq.grad = tk.grad = tv.grad = None
    return best


def torch_mha(x, w, heads, do):
    B, S, E = x.shape
    tx = torch.tensor(x, requires_grad=True)
    tw = [torch.tensor(a, requires_grad=True) for a in w]
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        q, k, v = ((tx @ tw[i]).view(B, S, heads, E // heads).transpose(1, 2) for i in range(3))
        p = torch.softmax((q @ k.transpose(-1, -2)) * (E // heads) ** -0.5, -1)
        o = (p @ v).transpose(1, 2).reshape(B, S, E) @ tw[3]
        o.backward(torch.tensor(do))
        best = min(best, time.perf_counter() - t)
        tx.grad = None
        for a in tw:
            a.grad = None
    return best


for shape in ((1, 4, 256, 64), (1, 16, 1024, 64)):
    for seed in seeds:
        g = np.random.default_rng(seed)
        q, k, v, do = (g.standard_normal(shape) for _ in range(4))
        t = time.perf_counter()
        attnref.sdpa(q, k, v, grad_output=do)
        ta = time.perf_counter() - t
        tp = torch_sdpa(q, k, v, do)
        print(f"sdpa {shape} seed {seed}: attnref {ta:.2f} s, PyTorch float64 fwd+bwd {tp:.3f} s, {ta / tp:.1f}x", flush=True)
B, S, E, H = 1, 2048, 1024, 16
for seed in seeds:
    g = np.random.default_rng(seed)
    x = g.standard_normal((B, S, E))
    w = [g.standard_normal((E, E)) / np.sqrt(E) for _ in range(4)]
    do = g.standard_normal((B, S, E))
    t = time.perf_counter()
    try:
        attnref.mha(x, x, x, *w, heads=H, grad_output=do)
        ta = time.perf_counter() - t
        tp = torch_mha(x, w, H, do)
        print(f"mha {(B, S, E, H)} seed {seed}: attnref {ta:.1f} s, PyTorch float64 fwd+bwd {tp:.2f} s, {ta / tp:.1f}x", flush=True)
    except Exception as e:  # noqa: BLE001 — the figure is the outcome, printed
        print(f"mha {(B, S, E, H)} seed {seed}: {type(e).__name__}: {e}", flush=True)
