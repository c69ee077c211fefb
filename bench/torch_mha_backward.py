"""PyTorch float64 multi-head attention forward + backward, timed (for bench/golden.bench --gradients --kind mha).

Usage: torch_mha_backward.py BATCH LENGTH MODEL_DIM HEADS THREADS REPEATS
torch.nn.functional.multi_head_attention_forward in float64 with biases (self-attention, x of shape
(LENGTH, BATCH, MODEL_DIM), PyTorch's layout), then the backward of sum(dO ∘ out) by autograd with
respect to x, the in-projection and out-projection weights and biases — the gradient roles attnref
certifies for an mha case (grad_x_q, grad_x_k, grad_x_v are one x here, so PyTorch sums them).
Prints one line: the best wall time in seconds of forward + backward over REPEATS runs after one
warm-up, with torch.set_num_threads(THREADS), and the process CPU time (all threads,
time.process_time) of that run.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_timing import arguments, best_of  # noqa: E402


def main():
    batch, length, model_dim, heads, repeats, g, dt = arguments()
    x = torch.rand(length, batch, model_dim, generator=g, dtype=dt) * 2 - 1
    w_in = (torch.rand(3 * model_dim, model_dim, generator=g, dtype=dt) * 2 - 1) / model_dim ** 0.5
    b_in = torch.rand(3 * model_dim, generator=g, dtype=dt) * 0.2 - 0.1
    w_out = (torch.rand(model_dim, model_dim, generator=g, dtype=dt) * 2 - 1) / model_dim ** 0.5
    b_out = torch.rand(model_dim, generator=g, dtype=dt) * 0.2 - 0.1
    grad_out = torch.rand(length, batch, model_dim, generator=g, dtype=dt) * 2 - 1

    def run():
        xx, wi, bi, wo, bo = (t.clone().requires_grad_(True) for t in (x, w_in, b_in, w_out, b_out))
        out, _ = torch.nn.functional.multi_head_attention_forward(
            xx, xx, xx, model_dim, heads, wi, bi, None, None, False, 0.0, wo, bo,
            training=False, need_weights=False)
        out.backward(grad_out)
        return xx.grad, wi.grad, wo.grad

    best, best_cpu, (dx, dwi, dwo) = best_of(run, repeats)
    assert dx.dtype == dt and dx.shape == x.shape
    print(f"{best:.6f} {best_cpu:.6f}")


if __name__ == "__main__":
    main()
