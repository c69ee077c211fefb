"""The arguments and the timing loop of the PyTorch reference benches (torch_sdpa_backward.py,
torch_mha_backward.py)."""
import sys
import time

import torch


def arguments():
    """BATCH LENGTH MODEL_DIM HEADS THREADS REPEATS from the command line, torch's threads set:
    (batch, length, model_dim, heads, repeats, a generator seeded 1, float64)."""
    batch, length, model_dim, heads, threads, repeats = (int(a) for a in sys.argv[1:7])
    torch.set_num_threads(threads)
    return batch, length, model_dim, heads, repeats, torch.Generator().manual_seed(1), torch.float64


def best_of(run, repeats):
    """Runs `run` once to warm up, then `repeats` times; returns (best wall seconds, the process CPU
    seconds of that run, its result)."""
    run()
    best, best_cpu, result = float("inf"), float("inf"), None
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        r = run()
        t, c = time.perf_counter() - t0, time.process_time() - c0
        if t < best:
            best, best_cpu, result = t, c, r
    return best, best_cpu, result
