#!/usr/bin/env python3
"""FP8 inputs with per-tensor descales through the `attnref` CLI.

    test_fp8_inputs.py ATTNREF GOLDEN_DIR WORK_DIR

- `attnref generate --golden sdpa_basic --input-format fp8e4m3 --out DIR` writes the derived case and
  fp8/: the scale of each tensor follows the rule (the largest power of two with amax·scale <= 448),
  the uint8 codes equal an independent E4M3 quantisation done here (nearest value of a table of every
  finite E4M3 value built from the format's definition, ties to the even code, saturating), the
  derived case's '<f8' inputs are value(code)·descale, and it regenerates byte for byte (--verify).
- A NumPy float32 kernel computing on the decoded codes and descales PASSes `check --input-format
  fp8e4m3`; the same kernel with q's descale forgotten, or v's descale applied twice, FAILs.
- attnref's own FP8 kernel (run --arith fp8e4m3_fa3_bf16) PASSes `check --policy fp8e4m3_fa3_bf16`
  (which implies --input-format fp8e4m3; the report names the format and the descales); its output
  with the static P scale 256 not divided out FAILs; --policy fp8e4m3_fa3_bf16 with --input-format
  bfloat16 is exit 2.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import attnref, golden, work, failures, expect, run, finish  # noqa: E402,F401

case = os.path.join(golden, "sdpa_basic")


# Every E4M3FN code and its value, from the format's definition (OCP 8-bit FP, 2023): S.EEEE.MMM,
# bias 7; E = 0: subnormal M/8·2^-6; S.1111.111 is NaN (no infinity).
def e4m3_value(c):
    s, e, m = (c >> 7) & 1, (c >> 3) & 15, c & 7
    if e == 15 and m == 7:
        return float("nan")
    v = (m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -v if s else v


VALUES = np.array([e4m3_value(c) for c in range(256)])
FINITE = [c for c in range(256) if not np.isnan(VALUES[c])]


def quantise_here(x, scale):
    """Round x·scale to the nearest finite E4M3 value, ties to the even code, beyond 448 saturating."""
    out = np.empty(x.shape, dtype=np.uint8)
    for i, v in enumerate((x * scale).ravel()):
        v = min(max(v, -448.0), 448.0)
        best = min(FINITE, key=lambda c: (abs(VALUES[c] - v), c & 1, c))  # nearest; on a tie the even code
        if VALUES[best] == 0:
            best = 0x80 if np.signbit(v) else 0  # ±0 keeps the sign
        out.flat[i] = best
    return out


# 1. generate --input-format fp8e4m3
p = run("generate", "--golden", case, "--input-format", "fp8e4m3", "--out", work, "--quiet")
expect(p.returncode == 0, "generate --golden sdpa_basic --input-format fp8e4m3: " + p.stderr.strip())
derived = os.path.join(work, "sdpa_basic_inputs_fp8e4m3")
meta = json.load(open(os.path.join(derived, "fp8", "fp8.json")))
expect(meta["format"] == "fp8e4m3" and [t["role"] for t in meta["tensors"]] == ["query", "key", "value"],
       "fp8.json names the format and q, k, v")
for t in meta["tensors"]:
    x = np.load(os.path.join(case, t["role"] + ".npy"))
    amax = float(np.max(np.abs(x)))
    scale = t["scale"]
    expect(amax * scale <= 448 < amax * scale * 2 and t["descale"] * scale == 1 and scale == 2.0 ** t["scale_exponent"],
           f"{t['role']}: scale 2^{t['scale_exponent']} is the largest power of two with amax·scale <= 448 (amax {amax})")
    codes = np.load(os.path.join(derived, "fp8", t["file"]))
    expect(codes.dtype == np.uint8 and codes.shape == x.shape, f"{t['role']}: codes are uint8 in the input's shape")
    expect(np.array_equal(codes, quantise_here(x, scale)), f"{t['role']}: codes equal the independent E4M3 quantisation")
    eff = np.load(os.path.join(derived, t["role"] + ".npy"))
    expect(np.array_equal(eff, VALUES[codes] * t["descale"]), f"{t['role']}: the derived case's inputs are value(code)·descale")
p = run("generate", "--golden", derived, "--verify", "--quiet")
expect(p.returncode == 0, "the derived case regenerates byte for byte: " + p.stderr.strip())

# 2. A NumPy float32 kernel on the codes and descales.
dec = {t["role"]: (VALUES[np.load(os.path.join(derived, "fp8", t["file"]))].astype(np.float32), np.float32(t["descale"]))
       for t in meta["tensors"]}


def kernel(q_descale=True, v_descale_times=1):
    (q, dq), (k, dk), (v, dv) = dec["query"], dec["key"], dec["value"]
    s = np.einsum("bhqd,bhkd->bhqk", q, k, dtype=np.float32) * ((dq if q_descale else np.float32(1)) * dk)
    s = s * np.float32(1 / np.sqrt(q.shape[-1]))
    p = np.exp(s - s.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    o = np.einsum("bhqk,bhkd->bhqd", p, v, dtype=np.float32) * dv ** v_descale_times
    return o.astype(np.float32)


def check(output, *extra):
    f = os.path.join(work, "candidate.npy")
    np.save(f, output)
    j = os.path.join(work, "r.json")
    if os.path.exists(j):
        os.remove(j)
    p = run("check", "--golden", case, "--output", f, "--json", j, *extra)
    return p, (json.load(open(j)) if os.path.exists(j) else {})


p, v = check(kernel(), "--input-format", "fp8e4m3")
expect(v.get("verdict") == "PASS", f"NumPy fp32 kernel on the FP8 inputs: PASS (got {v.get('verdict')}: {v.get('reason')})")
expect("quantised to fp8e4m3" in v.get("inputs", "") and "value 2^" in v.get("inputs", ""), "the inputs line names fp8e4m3 and the descales")
p, v = check(kernel(q_descale=False), "--input-format", "fp8e4m3")
expect(v.get("verdict") == "FAIL", f"q's descale forgotten: FAIL (got {v.get('verdict')})")
p, v = check(kernel(v_descale_times=2), "--input-format", "fp8e4m3")
expect(v.get("verdict") == "FAIL", f"v's descale applied twice: FAIL (got {v.get('verdict')})")

# 3. attnref's own FP8 kernel, declared.
out = os.path.join(work, "fp8run")
p = run("run", "--golden", case, "--arith", "fp8e4m3_fa3_bf16", "--out", out)
expect(p.returncode == 0 and "quantised to fp8e4m3" in p.stdout, "run --arith fp8e4m3_fa3_bf16: " + p.stdout.strip() + p.stderr.strip())
bits = np.load(os.path.join(out, "output.npy"))  # bf16 bit patterns '<u2'
p, v = check(bits, "--policy", "fp8e4m3_fa3_bf16")
expect(v.get("verdict") == "PASS", f"fp8e4m3_fa3_bf16 declared: PASS (got {v.get('verdict')}: {v.get('reason')})")
expect("quantised to fp8e4m3" in v.get("inputs", ""), "--policy fp8e4m3_fa3_bf16 implies --input-format fp8e4m3")
o = (bits.astype(np.uint32) << 16).view(np.float32) * np.float32(256)  # the P scale not divided out (exact)
p, v = check((o.view(np.uint32) >> 16).astype(np.uint16), "--policy", "fp8e4m3_fa3_bf16")
expect(v.get("verdict") == "FAIL", f"P's static scale 256 not divided out: FAIL (got {v.get('verdict')})")
p, v = check(bits, "--policy", "fp8e4m3_fa3_bf16", "--input-format", "bfloat16")
expect(p.returncode == 2 and "fp8e4m3" in p.stderr, "--policy fp8e4m3_fa3_bf16 --input-format bfloat16: exit 2 (" + p.stderr.strip() + ")")

finish()
