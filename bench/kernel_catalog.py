#!/usr/bin/python3
"""The kernel-size catalog: FlashAttention-style bf16 kernels, correct and buggy, through `attnref check`
at the shapes kernel suites test (head dims 64-256 and an odd one, lengths that are not multiples of a
tile, decode against many keys with GQA, causal top-left and bottom-right).

    /usr/bin/python3 bench/kernel_catalog.py ATTNREF WORK [--full | --reduced]

For each shape it certifies a case (`attnref generate --name ... --kind sdpa`), runs every kernel below
on the case's inputs (PyTorch 1.13 on the CPU; bf16 inputs, fp32 logits and online softmax over key
tiles, P rounded to bf16 before an fp32 P.V, output rounded once to bf16: the bf16_fp32acc policy; the
case's inputs are bf16 values, `generate --input-format bfloat16`) and
judges its output declared (`--policy bf16_fp32acc`) and undeclared (a bf16 file). A bug is
*detectable* when its max error is at least 4x the largest max error of the correct kernels (tiles of
64, 128 and 256 keys, reversed key order, split-KV with an lse merge) on that shape. Prints the matrix
(verdict, worst error/bound, max error) and writes WORK/catalog.csv. The default grid has six shapes;
--full adds (1, 16, 2048, 2048, 64) and the decode shape at 8192 keys; --reduced (CTest
kernel_catalog_reduced) takes the first two. Exit 1 when a correct kernel is not PASS declared or
FAILs undeclared, or a detectable bug PASSes declared outside KNOWN_MISSES (the gate's known blind
spots at these sizes, docs/measurements.md "Kernel-size catalog").
"""
import csv
import json
import os
import subprocess
import sys

import numpy as np
import torch

ATTNREF, WORK = sys.argv[1], sys.argv[2]
FULL = "--full" in sys.argv[3:]
REDUCED = "--reduced" in sys.argv[3:]
# Detectable bugs the declared bound passes today (docs/measurements.md, "Kernel-size catalog").
KNOWN_MISSES = {"drop_last_key", "bf16_accumulation", "scale_twice"}
os.makedirs(WORK, exist_ok=True)

# name, B, H, H_kv, Sq, Sk, d, causal alignment or None
SHAPES = [("s113x203_d64", 1, 4, 4, 113, 203, 64, None),
          ("s256_d80_causal_tl", 1, 2, 2, 256, 256, 80, "top_left"),
          ("s255x512_d128_causal_br", 1, 2, 2, 255, 512, 128, "bottom_right"),
          ("s1000_d64_gqa", 1, 4, 2, 1000, 1000, 64, None),
          ("s1023x1024_d256", 1, 1, 1, 1023, 1024, 256, None),
          ("decode_sk2048_gqa_d128", 1, 8, 2, 1, 2048, 128, None)]
if REDUCED:
    SHAPES = SHAPES[:2]
if FULL:
    SHAPES += [("s2048_d64", 1, 16, 16, 2048, 2048, 64, None), ("decode_sk8192_gqa_d128", 1, 8, 2, 1, 8192, 128, None)]


def bf16(x):
    return x.to(torch.bfloat16).to(torch.float32)


def flash(q, k, v, causal, tile=128, order="forward", bug=None, split=None):
    """q (H, Sq, d), k and v (H_kv, Sk, d) float32 holding bf16 values; returns the bf16 output (float32)."""
    H, Sq, d = q.shape
    Hkv, Sk, _ = k.shape
    G = H // Hkv
    kv_of = [(h % Hkv) if bug == "kv_heads_mod" else h // G for h in range(H)]
    k, v = k[kv_of], v[kv_of]
    scale = d ** -0.5
    i = torch.arange(Sq)[:, None]
    j = torch.arange(Sk)[None, :]
    offset = (Sk - Sq) if causal == "bottom_right" else 0
    allowed = torch.ones(Sq, Sk, dtype=torch.bool) if causal is None else (j <= i + offset + (1 if bug == "causal_off_by_one" else 0))
    last = Sk - (1 if bug == "drop_last_key" else 0)
    if bug == "drop_last_tile":
        last = (Sk // tile) * tile if Sk % tile else Sk - tile
    starts = list(range(0, Sk, tile))
    if order == "reversed":
        starts = starts[::-1]

    def partial(tiles):
        m = torch.full((H, Sq, 1), -float("inf"))
        s_ = torch.zeros(H, Sq, 1)
        acc = torch.zeros(H, Sq, v.shape[-1])
        for n, t0 in enumerate(tiles):
            t1 = min(t0 + tile, last)
            if t1 <= t0:
                continue
            sc = (q @ k[:, t0:t1].transpose(-1, -2)) * (scale * (scale if bug == "scale_twice" and n == 0 else 1))
            sc = sc.masked_fill(~allowed[None, :, t0:t1], -float("inf"))
            m_new = torch.maximum(m, sc.amax(-1, keepdim=True))
            safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            p = torch.exp(sc - safe)
            alpha = torch.exp(torch.where(torch.isinf(m), torch.full_like(m, -float("inf")), m - safe))
            s_ = (s_ if bug == "no_sum_rescale" else s_ * alpha) + p.sum(-1, keepdim=True)
            pv = bf16(p) @ v[:, t0:t1]
            if bug == "bf16_accumulation":
                acc = bf16(bf16(acc * alpha) + bf16(pv))
            else:
                acc = (acc if bug == "no_acc_rescale" else acc * alpha) + pv
            m = m_new
        return m, s_, acc

    if split:
        parts = [partial([t for t in starts if a <= t < b]) for a, b in split(Sk, tile)]
        m = torch.stack([p[0] for p in parts]).amax(0)
        safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        s_ = sum(p[1] * (torch.ones_like(p[0]) if bug == "split_merge_no_max" else torch.exp(p[0] - safe)) for p in parts)
        acc = sum(p[2] * (torch.ones_like(p[0]) if bug == "split_merge_no_max" else torch.exp(p[0] - safe)) for p in parts)
    else:
        m, s_, acc = partial(starts)
    return bf16(acc / s_)


def halves(Sk, tile):
    mid = ((Sk // 2) // tile) * tile or tile
    return [(0, mid), (mid, Sk)]


CORRECT = {"tiles64": dict(tile=64), "tiles128": dict(tile=128), "tiles256": dict(tile=256),
           "reversed128": dict(tile=128, order="reversed"), "splitkv128": dict(tile=128, split=halves)}
BUGS = {b: dict(tile=128, bug=b) for b in ("drop_last_key", "drop_last_tile", "causal_off_by_one", "no_acc_rescale", "no_sum_rescale",
                                             "scale_twice", "bf16_accumulation", "kv_heads_mod")}
BUGS["split_merge_no_max"] = dict(tile=128, split=halves, bug="split_merge_no_max")


def check(case, out_bits, declared):
    f = os.path.join(WORK, "cand.npy")
    np.save(f, out_bits)
    j = os.path.join(WORK, "r.json")
    if os.path.exists(j):
        os.remove(j)
    args = [ATTNREF, "check", "--golden", case, "--output", f, "--json", j]
    if declared:
        args += ["--policy", "bf16_fp32acc"]
    p = subprocess.run(args, capture_output=True, text=True)
    if not os.path.exists(j):
        return "ERROR", float("nan"), p.stderr.strip()[:200]
    r = json.load(open(j))
    t = r["tensors"][0]
    ratio = t["worst_in_bound_units"]
    return r["verdict"], float(ratio) if not isinstance(ratio, str) else float("nan"), ""


rows = []
for name, B, H, Hkv, Sq, Sk, d, causal in SHAPES:
    case = os.path.join(WORK, "cat_" + name)
    if not os.path.exists(os.path.join(case, "manifest.json")):
        args = [ATTNREF, "generate", "--name", "cat_" + name, "--kind", "sdpa", "--batch", str(B), "--heads", str(H), "--kv-heads", str(Hkv),
                "--sq", str(Sq), "--sk", str(Sk), "--dk", str(d), "--seed", "7", "--out", WORK, "--quiet", "--no-weights", "--input-format", "bfloat16"]
        if causal:
            args += ["--causal", causal]
        subprocess.run(args, check=True)
    q, k, v = (torch.from_numpy(np.load(os.path.join(case, f + ".npy")))[0] for f in ("query", "key", "value"))
    ref = torch.from_numpy(np.load(os.path.join(case, "output.npy")))[0]
    qb, kb, vb = bf16(q.float()), bf16(k.float()), bf16(v.float())
    results = {}
    for label, kw in list(CORRECT.items()) + list(BUGS.items()):
        if kw.get("bug") == "kv_heads_mod" and H == Hkv:
            continue  # the same map without GQA
        if kw.get("bug") == "causal_off_by_one" and causal is None:
            continue
        out = flash(qb, kb, vb, causal, **kw)
        err = float((out.double() - ref).abs().max())
        bits = out.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)[None]
        dv, dr, _ = check(case, bits, True)
        uv, ur, _ = check(case, bits, False)
        results[label] = (err, dv, dr, uv, ur)
    envelope = max(results[c][0] for c in CORRECT)
    for label, (err, dv, dr, uv, ur) in results.items():
        kind = "correct" if label in CORRECT else ("detectable" if err >= 4 * envelope else "not detectable (< 4x)")
        rows.append([name, label, kind, f"{err:.3g}", f"{err / envelope:.2f}", dv, f"{dr:.3g}", uv, f"{ur:.3g}"])
        print(f"{name:26} {label:20} {kind:22} max err {err:9.3g} ({err / envelope:6.2f}x)  declared {dv:12} {dr:8.3g}  undeclared {uv:12} {ur:8.3g}",
              flush=True)

with open(os.path.join(WORK, "catalog.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["shape", "kernel", "kind", "max_error", "error_over_correct_envelope", "declared_verdict", "declared_worst_over_bound",
                "undeclared_verdict", "undeclared_worst_over_bound"])
    w.writerows(rows)
bad = [r for r in rows if r[2] == "correct" and (r[5] != "PASS" or r[7] == "FAIL")]
missed = [r for r in rows if r[2] == "detectable" and r[5] == "PASS"]
unknown = [r for r in missed if r[1] not in KNOWN_MISSES]
print(f"{len(rows)} cells; correct kernels not PASS declared or FAIL undeclared: {len(bad)}; detectable bugs PASS declared: "
      f"{len(missed)} ({', '.join(sorted({r[1] for r in missed})) or 'none'}), outside the known misses: {len(unknown)}")
sys.exit(1 if bad or unknown else 0)
