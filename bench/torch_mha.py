"""PyTorch float64 multi-head attention forward pass, timed (for bench/golden.bench).

Usage: torch_mha.py BATCH LENGTH MODEL_DIM HEADS THREADS REPEATS
Prints one line: the best wall time in seconds of torch.nn.functional.multi_head_attention_forward
(float64, biases, need_weights=True with per-head weights, as attnref certifies output and weights)
over REPEATS runs after one warm-up, with torch.set_num_threads(THREADS), and the process CPU time
(all threads, time.process_time) of that same run.
"""
import sys
import time

import torch


def main():
    batch, length, model_dim, heads, threads, repeats = (int(a) for a in sys.argv[1:7])
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(1)
    dt = torch.float64
    x = torch.rand(length, batch, model_dim, generator=g, dtype=dt) * 2 - 1  # (L, B, E): PyTorch's layout
    w_in = (torch.rand(3 * model_dim, model_dim, generator=g, dtype=dt) * 2 - 1) / model_dim ** 0.5
    b_in = torch.rand(3 * model_dim, generator=g, dtype=dt) * 0.2 - 0.1
    w_out = (torch.rand(model_dim, model_dim, generator=g, dtype=dt) * 2 - 1) / model_dim ** 0.5
    b_out = torch.rand(model_dim, generator=g, dtype=dt) * 0.2 - 0.1

    def run():
        return torch.nn.functional.multi_head_attention_forward(
            x, x, x, model_dim, heads, w_in, b_in, None, None, False, 0.0, w_out, b_out,
            training=False, need_weights=True, average_attn_weights=False)

    with torch.no_grad():
        run()
        best, best_cpu = float("inf"), float("inf")
        for _ in range(repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            out, weights = run()
            t, c = time.perf_counter() - t0, time.process_time() - c0
            if t < best:
                best, best_cpu = t, c
    assert out.dtype == dt and weights.shape == (batch, heads, length, length)
    print(f"{best:.6f} {best_cpu:.6f}")


if __name__ == "__main__":
    main()
