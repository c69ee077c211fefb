#!/usr/bin/python3
"""Benchmark: the certified reference of a PyTorch-test-sized call (B=2, H=4, S=128, d=64) through
the Python package, plus float64 and the assert, timed with time.perf_counter (best and median of N).

    PYTHONPATH=build/default/python /usr/bin/python3 bench/python_sdpa.bench.py [repetitions]
"""
import os
import statistics
import sys
import time

import numpy as np

import attnref
from attnref.testing import assert_attention_close


def timed(f, n):
    t = []
    for _ in range(n):
        s = time.perf_counter()
        r = f()
        t.append(time.perf_counter() - s)
    return r, min(t), statistics.median(t)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 4, 128, 64)) for _ in range(3))
    print(f"B=2 H=4 Sq=Sk=128 d=64, {os.cpu_count()} cores, {n} repetitions, load average {os.getloadavg()[0]:.1f}")
    ref, best, med = timed(lambda: attnref.sdpa(q, k, v, causal="top_left"), n)
    esc = sum(c["escalated"] for c in ref.certification)
    print(f"certified (arith='certified', output+weights+lse): best {best:.3f} s, median {med:.3f} s; "
          f"{sum(c['certified'] for c in ref.certification)} elements certified, {esc} escalated")
    f64, best, med = timed(lambda: attnref.sdpa(q, k, v, causal="top_left", arith="float64"), n)
    print(f"float64 (arith='float64'): best {best:.3f} s, median {med:.3f} s")
    out = attnref.sdpa(q, k, v, causal="top_left", arith="float32").output
    _, best, med = timed(lambda: assert_attention_close(out, ref), n)
    print(f"assert_attention_close (float32 candidate, data-aware): best {best:.3f} s, median {med:.3f} s")


if __name__ == "__main__":
    main()
