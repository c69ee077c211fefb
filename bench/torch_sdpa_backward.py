"""PyTorch float64 SDPA forward + backward, timed (for bench/golden.bench --gradients).

Usage: torch_sdpa_backward.py BATCH LENGTH MODEL_DIM HEADS THREADS REPEATS
q, k, v of shape (BATCH, HEADS, LENGTH, MODEL_DIM / HEADS) in float64 with requires_grad; the forward
softmax(q·kᵀ/√d)·v and the backward of sum(dO ∘ out) (autograd: dQ, dK, dV). Prints one line: the best
wall time in seconds of forward + backward over REPEATS runs after one warm-up, with
torch.set_num_threads(THREADS), and the process CPU time (all threads, time.process_time) of that run.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_timing import arguments, best_of  # noqa: E402


def main():
    batch, length, model_dim, heads, repeats, g, dt = arguments()
    d = model_dim // heads
    shape = (batch, heads, length, d)
    q, k, v = (torch.rand(shape, generator=g, dtype=dt) * 2 - 1 for _ in range(3))
    grad_out = torch.rand(shape, generator=g, dtype=dt) * 2 - 1

    def run():
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        p = torch.softmax(qq @ kk.transpose(-1, -2) / d ** 0.5, dim=-1)
        out = p @ vv
        out.backward(grad_out)
        return qq.grad, kk.grad, vv.grad

    best, best_cpu, (dq, dk, dv) = best_of(run, repeats)
    assert dq.dtype == dt and dq.shape == shape
    print(f"{best:.6f} {best_cpu:.6f}")


if __name__ == "__main__":
    main()
