#!/usr/bin/env python3
"""Which inputs a verdict is about, and declared policies, through the `attnref` CLI.

    test_rounded_inputs.py ATTNREF GOLDEN_DIR WORK_DIR

- A bf16 kernel (attnref run --arith bf16_fp32acc: it reads the golden inputs rounded to nearest even
  to bf16) is judged by default against the certified result of those rounded inputs: PASS on
  sdpa_bwd_basic, forward and gradients (against the float64 inputs' result it is INCONCLUSIVE:
  the inputs' rounding moves the gradients by about their own size); the report says which inputs.
- The same output with one row off by 10% FAILs against the rounded inputs' reference: declaring the
  inputs does not let a wrong answer pass.
- `attnref generate --golden CASE --input-format bfloat16 --out DIR` writes the derived case: its
  inputs are the rounded ones (checked here independently with NumPy's bf16 rounding), and it
  regenerates byte for byte from its own manifest (`generate --golden DERIVED --verify`).
- A kernel casting P to bf16 before P·V (fp32_p_bf16) is not a float32 kernel: undeclared it FAILs;
  declared (--policy fp32_p_bf16) it PASSes; a float32 output off by 10% in one row still FAILs when it
  declares fp32_p_bf16; a policy whose output format is not the candidate's is exit 2.
- Declared policies put each rounding in its own format: an fp8 P-cast kernel PASSes declared (and a row
  off by 10% FAILs), its textbook gradients too (and dQ times 1.01 FAILs), a bf16_fp32acc kernel PASSes on logits near 1000, and the implied invariant
  sum over keys of dK = 0 does not make a bf16 gradient check INCONCLUSIVE (dK times 1.5 FAILs).
- P = exp(S - lse) pins weights whose logits are pushed down by 1e9 to the underflow floor: a float32
  kernel's weights and lse PASS on sdpa_seed_mask, a seed-masked key with weight 1e-3 FAILs.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import attnref, golden, work, failures, expect, run, finish  # noqa: E402,F401

case = os.path.join(golden, "sdpa_bwd_basic")


def check(*args):
    j = os.path.join(work, "r.json")
    if os.path.exists(j):
        os.remove(j)
    p = run("check", "--golden", case, "--json", j, *args)
    verdict = json.load(open(j)) if os.path.exists(j) else {}
    return p, verdict


def grads(d):
    return ["--grad-query", f"{d}/grad_query.npy", "--grad-key", f"{d}/grad_key.npy", "--grad-value", f"{d}/grad_value.npy"]


# 1. bf16 kernel against the rounded inputs' reference (the default) and against the case's own.
bf = os.path.join(work, "bf16")
p = run("run", "--golden", case, "--arith", "bf16_fp32acc", "--out", bf)
expect(p.returncode == 0, "run bf16_fp32acc: " + p.stderr)
p, v = check("--output", f"{bf}/output.npy", *grads(bf), "--backward-algorithm", "textbook", "--policy", "bf16_fp32acc")
expect(v.get("verdict") == "PASS", f"bf16 kernel declaring its policy, default inputs: PASS (got {v.get('verdict')}: {v.get('reason')})")
# Undeclared, the bound also covers kernels storing logits, dP, D and dS in bf16 (docs/backward.md (B2s),
# (B4s)): looser, never a FAIL for this correct kernel.
p, v = check("--output", f"{bf}/output.npy", *grads(bf), "--backward-algorithm", "textbook")
expect(v.get("verdict") in ("PASS", "INCONCLUSIVE"), f"bf16 kernel, undeclared: not FAIL (got {v.get('verdict')}: {v.get('reason')})")
expect("rounded to nearest even to bfloat16" in v.get("inputs", "") and "inputs: the golden inputs rounded" in p.stdout,
       "the report says the verdict is about the inputs rounded to bf16")
p, v = check("--output", f"{bf}/output.npy", *grads(bf), "--backward-algorithm", "textbook", "--input-format", "case")
expect(v.get("verdict") == "INCONCLUSIVE", f"bf16 kernel against the float64 inputs: INCONCLUSIVE (got {v.get('verdict')})")

# 2. A wrong bf16 output (one row ×1.10, rounded to bf16) FAILs against the rounded inputs' reference.
out = np.load(f"{bf}/output.npy")  # '<u2' bf16 bit patterns
vals = (out.astype(np.uint32) << 16).view(np.float32).copy()
vals[0, 0, 0, :] *= np.float32(1.10)
bits = (vals.view(np.uint32) + 0x7FFF + ((vals.view(np.uint32) >> 16) & 1)) >> 16  # round to nearest even
np.save(f"{work}/wrong.npy", bits.astype(np.uint16))
p, v = check("--output", f"{work}/wrong.npy")
expect(v.get("verdict") == "FAIL", f"bf16 output with a row off by 10%: FAIL (got {v.get('verdict')})")

# 3. The derived case as files: rounded inputs, reproducible from its manifest.
derived_root = os.path.join(work, "derived")
p = run("generate", "--golden", case, "--input-format", "bfloat16", "--out", derived_root, "--quiet")
expect(p.returncode == 0, "generate --golden --input-format bfloat16: " + p.stderr)
derived = os.path.join(derived_root, "sdpa_bwd_basic_inputs_bfloat16")
for role in ("query", "key", "value", "grad_output"):
    x = np.load(os.path.join(case, role + ".npy"))
    y = np.load(os.path.join(derived, role + ".npy"))
    m, e = np.frexp(x)  # x = m·2^e, 0.5 ≤ |m| < 1: bf16 keeps 8 significant bits, np.rint rounds half to even
    r = np.ldexp(np.rint(m * 256), e - 8)
    expect(np.array_equal(y, r), f"derived {role}: the case's inputs rounded to nearest even to bf16")
p = run("generate", "--golden", derived, "--verify", "--quiet")
expect(p.returncode == 0, "the derived case regenerates byte for byte from its manifest: " + p.stderr + p.stdout)
p = run("check", "--golden", derived, "--output", f"{bf}/output.npy")
expect(p.returncode == 0 and "exact in bfloat16" in p.stdout, "the bf16 kernel PASSes on the derived case, its inputs exact in bf16")

# 4. Declared policy: P cast to bf16 before P·V in a float32 kernel.
pb = os.path.join(work, "p_bf16")
run("run", "--golden", case, "--arith", "fp32_p_bf16", "--out", pb)
p, v = check("--output", f"{pb}/output.npy", *grads(pb), "--backward-algorithm", "textbook")
expect(v.get("verdict") == "FAIL", f"fp32_p_bf16 undeclared (a float32 candidate): FAIL (got {v.get('verdict')})")
p, v = check("--output", f"{pb}/output.npy", *grads(pb), "--backward-algorithm", "textbook", "--policy", "fp32_p_bf16")
expect(v.get("verdict") == "PASS" and v.get("policy") == "fp32_p_bf16", f"fp32_p_bf16 declared: PASS (got {v.get('verdict')}: {v.get('reason')})")
o = np.load(f"{pb}/output.npy")
o[0, 0, 0, :] *= np.float32(1.10)
np.save(f"{work}/wrong32.npy", o)
p, v = check("--output", f"{work}/wrong32.npy", "--policy", "fp32_p_bf16")
expect(v.get("verdict") == "FAIL", f"a float32 output off by 10% in one row declaring fp32_p_bf16: FAIL (got {v.get('verdict')})")
p, v = check("--output", f"{pb}/output.npy", "--policy", "bf16_fp32acc")
expect(p.returncode == 2 and "--policy" in p.stderr, "a policy whose output format is not the candidate's: exit 2 naming --policy")
p, v = check("--output", f"{pb}/output.npy", "--policy", "no_such_policy")
expect(p.returncode == 2 and "--policy" in p.stderr, "an unknown policy: exit 2 naming --policy")

# 5. Declared policies, each rounding in its own format (docs/verdicts-by-format.md): an fp8 P-cast kernel
# (P·256 rounded to e4m3 before P·V, float32 otherwise) PASSes declared (its bound was vacuous when every
# storage rounding was counted at e4m3's 2^-4); the same output off by 10% in one row FAILs.
f8 = os.path.join(work, "p_fp8")
run("run", "--golden", case, "--arith", "fp32_p_fp8e4m3_s256", "--out", f8)
p, v = check("--output", f"{f8}/output.npy", "--policy", "fp32_p_fp8e4m3_s256")
expect(v.get("verdict") == "PASS", f"fp8 P-cast kernel declared: PASS (got {v.get('verdict')}: {v.get('reason')})")
o = np.load(f"{f8}/output.npy")
o[0, 0, 0, :] *= np.float32(1.10)
np.save(f"{work}/wrong_fp8.npy", o)
p, v = check("--output", f"{work}/wrong_fp8.npy", "--policy", "fp32_p_fp8e4m3_s256")
expect(v.get("verdict") == "FAIL", f"an fp8 P-cast output off by 10% in one row, declared: FAIL (got {v.get('verdict')})")
# Its textbook gradients (P stored in e4m3 for D, dS and dV) PASS declared: the stored weights are
# predicted, docs/backward.md (B17) (INCONCLUSIVE when every weight carried a relative error 2^-4);
# dQ times 1.01 FAILs.
p, v = check(*grads(f8), "--backward-algorithm", "textbook", "--policy", "fp32_p_fp8e4m3_s256")
expect(v.get("verdict") == "PASS", f"fp8 P-cast gradients declared: PASS (got {v.get('verdict')}: {v.get('reason')})")
dq = np.load(f"{f8}/grad_query.npy")
np.save(f"{work}/wrong_fp8_dq.npy", (dq * np.float32(1.01)).astype(dq.dtype))
p, v = check("--grad-query", f"{work}/wrong_fp8_dq.npy", "--grad-key", f"{f8}/grad_key.npy", "--grad-value", f"{f8}/grad_value.npy",
             "--backward-algorithm", "textbook", "--policy", "fp32_p_fp8e4m3_s256")
expect(v.get("verdict") == "FAIL", f"fp8 P-cast dQ times 1.01, declared: FAIL (got {v.get('verdict')})")
# A bf16 kernel with float32 logits (declared bf16_fp32acc) on logits near 1000: the scale constant rounds
# in float32, not bf16, so the bound is no longer vacuous.
offset = os.path.join(golden, "sdpa_adv_logit_offset_1000")
lo = os.path.join(work, "offset_bf16")
run("run", "--golden", offset, "--arith", "bf16_fp32acc", "--out", lo)
p = run("check", "--golden", offset, "--output", f"{lo}/output.npy", "--policy", "bf16_fp32acc")
expect(p.returncode == 0 and "PASS" in p.stdout, "bf16_fp32acc declared on logits near 1000: PASS (" + p.stdout[-300:] + p.stderr + ")")
# The sum over keys of dK = 0 is implied by dK's own comparison: its vacuous bound on a bf16 kernel's
# gradients no longer makes the check INCONCLUSIVE, while a wrong dK (x1.5) still FAILs.
ez = os.path.join(golden, "sdpa_bwd_empty_rows_zero")
eb = os.path.join(work, "empty_bf16")
run("run", "--golden", ez, "--arith", "bf16_fp32acc", "--out", eb)
j = os.path.join(work, "ez.json")
p = run("check", "--golden", ez, "--json", j, *grads(eb), "--backward-algorithm", "textbook", "--policy", "bf16_fp32acc")
v = json.load(open(j)) if os.path.exists(j) else {}
expect(v.get("verdict") == "PASS", f"bf16 gradients on sdpa_bwd_empty_rows_zero, declared: PASS (got {v.get('verdict')}: {v.get('reason')})")
dk = np.load(f"{eb}/grad_key.npy")
dkv = (dk.astype(np.uint32) << 16).view(np.float32).copy()
dkv *= np.float32(1.5)
np.save(f"{work}/dk_wrong.npy", ((dkv.view(np.uint32) + 0x7FFF + ((dkv.view(np.uint32) >> 16) & 1)) >> 16).astype(np.uint16))
os.remove(j)
p = run("check", "--golden", ez, "--json", j, "--grad-query", f"{eb}/grad_query.npy", "--grad-key", f"{work}/dk_wrong.npy",
        "--grad-value", f"{eb}/grad_value.npy", "--backward-algorithm", "textbook", "--policy", "bf16_fp32acc")
v = json.load(open(j)) if os.path.exists(j) else {}
expect(v.get("verdict") == "FAIL", f"bf16 dK times 1.5: FAIL (got {v.get('verdict')})")

# 6. A float32 kernel with its weights and lse on sdpa_seed_mask (logits pushed down by 1e9): the invariant
# P = exp(S - lse) pins those keys' weights to the underflow floor (to every order) instead of reporting a
# vacuous relative bound: PASS; the same weights with one such key given weight 1e-3 FAIL.
sm = os.path.join(golden, "sdpa_seed_mask")
sf = os.path.join(work, "seed_f32")
run("run", "--golden", sm, "--arith", "float32", "--out", sf)
p = run("check", "--golden", sm, "--output", f"{sf}/output.npy", "--weights", f"{sf}/weights.npy", "--lse", f"{sf}/lse.npy")
expect(p.returncode == 0 and p.stdout.rstrip().endswith("PASS"), "float32 with --weights --lse on sdpa_seed_mask: PASS (" + p.stdout[-200:] + p.stderr[-200:] + ")")
w = np.load(f"{sf}/weights.npy")
gw = np.load(os.path.join(sm, "weights.npy"))
at = tuple(np.argwhere(gw == 0)[0])
w[at] = np.float32(1e-3)
np.save(f"{work}/seed_w_wrong.npy", w)
p = run("check", "--golden", sm, "--output", f"{sf}/output.npy", "--weights", f"{work}/seed_w_wrong.npy", "--lse", f"{sf}/lse.npy")
expect(p.returncode == 1 and "FAIL" in p.stdout, "a seed-masked key given weight 1e-3: FAIL (" + p.stdout[-300:] + ")")

finish()
