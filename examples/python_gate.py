#!/usr/bin/python3
"""Gate your own attention implementation in CI with `attnref check`.

Loads a golden case with numpy only, computes multi-head attention its own way (float32, numpy's
matmul summation order), writes the output as .npy and runs `attnref check` on it. Exit status is
attnref's: 0 PASS, 1 FAIL or INCONCLUSIVE (a bound too wide to prove anything, or an untrustworthy
output: never a pass), 2 usage or data error. The JUnit report marks every tensor that did not pass
as a <failure> whose type is FAIL or INCONCLUSIVE.

    python3 examples/python_gate.py ATTNREF_BINARY [CASE_DIR] [OUT_DIR]
"""
import json
import os
import subprocess
import sys

import numpy as np


def mha(case_dir, dtype=np.float32):
    m = json.load(open(os.path.join(case_dir, "manifest.json")))
    sh, cv = m["shapes"], m["conventions"]
    assert m["kind"] == "mha", "this example implements multi-head attention cases"
    load = lambda role: np.load(os.path.join(case_dir, role + ".npy")).astype(dtype)
    H, Hkv, dk, dv = sh["heads"], sh["kv_heads"], sh["head_dim_qk"], sh["head_dim_v"]
    bias = cv["projection_bias"]
    proj = lambda x, w, b: x @ load(w) + (load(b) if bias else 0)
    q = proj(load("query"), "w_q", "b_q")      # (B, Sq, H*dk)
    k = proj(load("key"), "w_k", "b_k")        # (B, Sk, Hkv*dk)
    v = proj(load("value"), "w_v", "b_v")      # (B, Sk, Hkv*dv)
    B, Sq, Sk = q.shape[0], q.shape[1], k.shape[1]
    q = q.reshape(B, Sq, H, dk).transpose(0, 2, 1, 3)
    k = k.reshape(B, Sk, Hkv, dk).transpose(0, 2, 1, 3)
    v = v.reshape(B, Sk, Hkv, dv).transpose(0, 2, 1, 3)
    k = np.repeat(k, H // Hkv, axis=1)         # GQA: query head h reads kv head h // (H / Hkv)
    v = np.repeat(v, H // Hkv, axis=1)
    scale = cv["scale"] if cv["scale"] is not None else 1 / np.sqrt(dk)
    s = (q @ k.transpose(0, 1, 3, 2)) * dtype(scale)
    if cv["causal"]:
        off = (Sk - Sq if cv["causal_alignment"] == "bottom_right" else 0) + cv["diagonal_offset"]
        allowed = np.arange(Sk)[None, :] <= np.arange(Sq)[:, None] + off
        s = np.where(allowed, s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p = p / p.sum(axis=-1, keepdims=True)
    o = (p @ v).transpose(0, 2, 1, 3).reshape(B, Sq, H * dv)
    return o @ load("w_o") + (load("b_o") if bias else 0)


def main():
    binary = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    case_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "..", "golden", "mha_bias_gqa")
    out_dir = sys.argv[3] if len(sys.argv) > 3 else "."
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, "python_gate_output.npy")
    np.save(out, mha(case_dir).astype(np.float32))
    return subprocess.call([binary, "check", "--golden", case_dir, "--output", out,
                            "--junit", os.path.join(out_dir, "python_gate.junit.xml"), "--force"])


if __name__ == "__main__":
    sys.exit(main())
