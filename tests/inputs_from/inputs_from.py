#!/usr/bin/python3
"""`attnref generate --inputs-from DIR` (golden/README.md, "Your own inputs"), end to end.

    inputs_from.py ATTNREF WORKDIR [PYTHONPATH_OF_THE_attnref_MODULE]

1. NumPy writes random float32 SDPA inputs (GQA, causal bottom_right); generate --inputs-from makes a
   case; its output/weights/lse equal an independent computation: mpmath at 256 bits rounded to
   float64 (a different code base and algorithm), and, when the Python module is given,
   attnref.sdpa(..., arith="certified") bit for bit. The stored inputs are the user's values as '<f8',
   inputs.format is float32, the manifest records generator "files" and each file's sha256.
2. A float32 NumPy implementation passes `attnref check` against the case; the same with one element
   moved by 1% fails it (exit 1).
3. `generate --golden CASE --verify` regenerates the case from its own stored inputs (identical); a
   tampered stored input is refused (exit 2).
4. An mha case with biases (float16 inputs, detected as float16) equals mpmath too.
5. Hostile inputs: each exits 2 with one line naming the offending file (or flag).
6. A grad_output.npy makes a backward case (causal GQA, float32 files): the manifest has the suite's
   backward schema (outputs.gradients, grad_output among the inputs, the certified gradient tensors);
   the gradients agree with PyTorch float64 autograd (an independent computation) to 1e-12 normwise
   and equal attnref.sdpa(grad_output=) bit for bit; `generate --golden CASE` rewrites every file
   byte for byte; `attnref check --grad-*` PASSes the float64 autograd gradients; a tampered
   grad_output.npy is exit 2. bf16 inputs: `attnref check` of PyTorch bf16 autograd gives the same
   verdict as attnref.testing.assert_attention_close (printed).
"""
import hashlib
import json
import os
import shutil
import sys

import mpmath
import numpy as np

ATTNREF, WORK = sys.argv[1], sys.argv[2]
PYPATH = sys.argv[3] if len(sys.argv) > 3 else ""
mpmath.mp.prec = 256
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from cli_checks import Checks, fresh  # noqa: E402

checks = Checks(ATTNREF)
expect, run, failures = checks.expect, checks.run, checks.failures


def tampered_copy(case, where, name, tensor, index, delta):
    """A copy of `case` at WORK/where/name with one element of `tensor`.npy moved by `delta` (the
    manifest's sha256 no longer matches); returns the copy's directory."""
    d = os.path.join(WORK, where, name)
    shutil.rmtree(os.path.join(WORK, where), ignore_errors=True)
    shutil.copytree(case, d)
    x = np.load(os.path.join(d, tensor + ".npy"))
    x[index] += delta
    np.save(os.path.join(d, tensor + ".npy"), x)
    return d


# ---- an independent reference: mpmath at 256 bits --------------------------------------------

def mp_softmax_rows(logits, allowed):
    """Rows of (P, lse) for a list of logit rows; masked entries get P = 0."""
    out = []
    for row, ok in zip(logits, allowed):
        keep = [x for x, a in zip(row, ok) if a]
        m = max(keep)
        z = mpmath.fsum(mpmath.exp(x - m) for x in keep)
        out.append(([mpmath.exp(x - m) / z if a else mpmath.mpf(0) for x, a in zip(row, ok)], m + mpmath.log(z)))
    return out


def mp_sdpa(q, k, v, bottom_right):
    B, H, Sq, dk = q.shape
    Hkv, Sk, dv = k.shape[1], k.shape[2], v.shape[3]
    s = 1 / mpmath.sqrt(dk)
    o = np.zeros((B, H, Sq, dv)); p = np.zeros((B, H, Sq, Sk)); l = np.zeros((B, H, Sq))
    for b in range(B):
        for h in range(H):
            hk = h // (H // Hkv)
            logits = [[s * mpmath.fsum(mpmath.mpf(float(q[b, h, i, c])) * float(k[b, hk, j, c]) for c in range(dk)) for j in range(Sk)]
                      for i in range(Sq)]
            allowed = [[(j <= i + (Sk - Sq)) if bottom_right else True for j in range(Sk)] for i in range(Sq)]
            for i, (pr, lse) in enumerate(mp_softmax_rows(logits, allowed)):
                l[b, h, i] = float(lse)
                for j in range(Sk):
                    p[b, h, i, j] = float(pr[j])
                for c in range(dv):
                    o[b, h, i, c] = float(mpmath.fsum(pr[j] * float(v[b, hk, j, c]) for j in range(Sk)))
    return o, p, l


def mp_mha(x, w, heads):
    """y = x·W + b projections, heads of width d, softmax(QKᵀ/√d)·V, merge, output projection."""
    xq, xk, xv = x
    B, Sq, E = xq.shape
    Sk = xk.shape[1]
    dk = w["w_q"].shape[1] // heads
    dv = w["w_v"].shape[1] // heads
    M = lambda a: [[mpmath.mpf(float(e)) for e in row] for row in a]

    def proj(xb, W, bias):
        Wm = M(W)
        return [[mpmath.fsum(r[e] * Wm[e][n] for e in range(len(r))) + float(bias[n]) for n in range(len(Wm[0]))] for r in xb]

    out = np.zeros((B, Sq, w["w_o"].shape[1])); wts = np.zeros((B, heads, Sq, Sk)); lses = np.zeros((B, heads, Sq))
    for b in range(B):
        Q = proj(M(xq[b]), w["w_q"], w["b_q"]); K = proj(M(xk[b]), w["w_k"], w["b_k"]); V = proj(M(xv[b]), w["w_v"], w["b_v"])
        merged = [[None] * (heads * dv) for _ in range(Sq)]
        for h in range(heads):
            s = 1 / mpmath.sqrt(dk)
            logits = [[s * mpmath.fsum(Q[i][h * dk + c] * K[j][h * dk + c] for c in range(dk)) for j in range(Sk)] for i in range(Sq)]
            for i, (pr, lse) in enumerate(mp_softmax_rows(logits, [[True] * Sk] * Sq)):
                lses[b, h, i] = float(lse)
                for j in range(Sk):
                    wts[b, h, i, j] = float(pr[j])
                for c in range(dv):
                    merged[i][h * dv + c] = mpmath.fsum(pr[j] * V[j][h * dv + c] for j in range(Sk))
        Wo = M(w["w_o"])
        for i in range(Sq):
            for n in range(len(Wo[0])):
                out[b, i, n] = float(mpmath.fsum(merged[i][e] * Wo[e][n] for e in range(heads * dv)) + float(w["b_o"][n]))
    return out, wts, lses


def same_bits(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint64), b.view(np.uint64))


# ---- 1. SDPA from float32 files ----------------------------------------------------------------

rng = np.random.default_rng(20261201)
inp = fresh(os.path.join(WORK, "sdpa_in"))
out = fresh(os.path.join(WORK, "out"))
q = rng.standard_normal((2, 4, 5, 8)).astype(np.float32)
k = rng.standard_normal((2, 2, 7, 8)).astype(np.float32)
v = rng.standard_normal((2, 2, 7, 6)).astype(np.float32)
for n, a in (("query", q), ("key", k), ("value", v)):
    np.save(os.path.join(inp, n + ".npy"), a)
rc, so, se = run("generate", "--quiet", "--inputs-from", inp, "--name", "mine", "--causal", "bottom_right", "--out", out)
expect(rc == 0, f"generate --inputs-from (sdpa, float32 files) exits 0 [{se.strip()}]")
case = os.path.join(out, "mine")
m = json.load(open(os.path.join(case, "manifest.json")))
expect(m["inputs"]["generator"] == "files" and m["inputs"]["seed"] is None and m["inputs"]["family"] is None,
       "manifest: inputs.generator 'files', seed and family null")
expect(m["inputs"]["format"] == "float32", "manifest: inputs.format float32 (the narrowest holding every value)")
expect([(f["role"], f["dtype"], f["sha256"]) for f in m["inputs"]["files"]] ==
       [(n, "<f4", hashlib.sha256(open(os.path.join(inp, n + ".npy"), "rb").read()).hexdigest()) for n in ("query", "key", "value")],
       "manifest: each user file's dtype and sha256 as given")
for n, a in (("query", q), ("key", k), ("value", v)):
    stored = np.load(os.path.join(case, n + ".npy"))
    expect(stored.dtype == np.float64 and np.array_equal(stored, a.astype(np.float64)), f"stored {n}.npy is '<f8' holding the given values")
o_ref, p_ref, l_ref = mp_sdpa(q, k, v, bottom_right=True)
got = {n: np.load(os.path.join(case, n + ".npy")) for n in ("output", "weights", "lse")}
expect(same_bits(got["output"], o_ref), "output.npy equals mpmath at 256 bits rounded to float64, bit for bit")
expect(same_bits(got["weights"], p_ref), "weights.npy equals mpmath, bit for bit")
expect(same_bits(got["lse"], l_ref), "lse.npy equals mpmath, bit for bit")
if PYPATH:
    sys.path.insert(0, PYPATH)
    import attnref  # noqa: E402
    r = attnref.sdpa(q, k, v, causal="bottom_right", arith="certified", return_weights=True, return_lse=True)
    expect(same_bits(np.asarray(r.output), got["output"]) and same_bits(np.asarray(r.weights), got["weights"]) and
           same_bits(np.asarray(r.lse), got["lse"]), "output/weights/lse equal attnref.sdpa(arith='certified') bit for bit")
else:
    print("note attnref Python module not built: compared with mpmath only")

# ---- 2. a float32 implementation is gated by the case ------------------------------------------


def numpy_sdpa_float32(q, k, v):
    B, H, Sq, dk = q.shape
    Sk = k.shape[2]
    rep = H // k.shape[1]
    kk, vv = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = (q @ kk.transpose(0, 1, 3, 2)) * np.float32(1 / np.sqrt(np.float32(dk)))
    s = np.where(np.arange(Sk)[None, :] <= np.arange(Sq)[:, None] + (Sk - Sq), s, np.float32(-np.inf)).astype(np.float32)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return ((e / e.sum(axis=-1, keepdims=True)) @ vv).astype(np.float32)


cand = numpy_sdpa_float32(q, k, v)
np.save(os.path.join(WORK, "cand.npy"), cand)
rc, so, se = run("check", "--golden", case, "--output", os.path.join(WORK, "cand.npy"))
expect(rc == 0, f"a float32 NumPy SDPA passes `attnref check` (exit {rc})")
bad = cand.copy()
bad[1, 3, 4, 2] *= np.float32(1.01)
np.save(os.path.join(WORK, "bad.npy"), bad)
rc, so, se = run("check", "--golden", case, "--output", os.path.join(WORK, "bad.npy"))
expect(rc == 1, f"the same with one element moved by 1% fails `attnref check` (exit {rc})")

# ---- 3. regeneration from the case's own stored inputs -----------------------------------------

rc, so, se = run("generate", "--golden", case, "--verify")
expect(rc == 0 and "identical" in so, f"generate --golden CASE --verify: identical (exit {rc})")
tampered = tampered_copy(case, "tampered", "mine", "key", (0, 0, 0, 0), 1)
rc, so, se = run("generate", "--quiet", "--golden", tampered, "--verify")
expect(rc == 2 and "key.npy" in se and "sha256" in se, f"a tampered stored input is refused (exit {rc}): {se.strip()}")

# ---- 4. an mha case with biases, float16 files -------------------------------------------------

mha_in = fresh(os.path.join(WORK, "mha_in"))
E, heads = 6, 2
arrays = {"query": rng.standard_normal((1, 4, E)), "key": rng.standard_normal((1, 5, E)), "value": rng.standard_normal((1, 5, E)),
          "w_q": rng.standard_normal((E, 4)) / 2, "w_k": rng.standard_normal((E, 4)) / 2, "w_v": rng.standard_normal((E, 6)) / 2,
          "w_o": rng.standard_normal((6, 3)) / 2, "b_q": rng.standard_normal(4) / 4, "b_k": rng.standard_normal(4) / 4,
          "b_v": rng.standard_normal(6) / 4, "b_o": rng.standard_normal(3) / 4}
arrays = {n: a.astype(np.float16) for n, a in arrays.items()}
for n, a in arrays.items():
    np.save(os.path.join(mha_in, n + ".npy"), a)
rc, so, se = run("generate", "--quiet", "--inputs-from", mha_in, "--name", "mine_mha", "--kind", "mha", "--heads", str(heads), "--bias",
                 "--out", out)
expect(rc == 0, f"generate --inputs-from (mha with biases, float16 files) exits 0 [{se.strip()}]")
mm = json.load(open(os.path.join(out, "mine_mha", "manifest.json")))
expect(mm["inputs"]["format"] == "float16" and mm["shapes"]["head_dim_qk"] == 2 and mm["shapes"]["head_dim_v"] == 3 and
       mm["shapes"]["output_dim"] == 3, "mha manifest: float16 format, dk 2, dv 3, output_dim 3 from the files")
mo, mw, ml = mp_mha((arrays["query"], arrays["key"], arrays["value"]), arrays, heads)
expect(same_bits(np.load(os.path.join(out, "mine_mha", "output.npy")), mo) and
       same_bits(np.load(os.path.join(out, "mine_mha", "weights.npy")), mw) and
       same_bits(np.load(os.path.join(out, "mine_mha", "lse.npy")), ml), "mha output/weights/lse equal mpmath bit for bit")

# bfloat16 inputs as '<u2' bit patterns (golden/README.md's convention) with --input-dtype bfloat16.
bf_in = fresh(os.path.join(WORK, "bf16_in"))
bits = {n: (a.view(np.uint32) >> 16).astype(np.uint16) for n, a in (("query", q), ("key", k), ("value", v))}  # truncation: exact bf16
for n, b in bits.items():
    np.save(os.path.join(bf_in, n + ".npy"), b)
rc, so, se = run("generate", "--quiet", "--inputs-from", bf_in, "--input-dtype", "bfloat16", "--name", "mine_bf16", "--out", out)
bm = json.load(open(os.path.join(out, "mine_bf16", "manifest.json"))) if rc == 0 else {}
decoded = (bits["query"].astype(np.uint32) << 16).view(np.float32).astype(np.float64)
expect(rc == 0 and bm["inputs"]["format"] == "bfloat16" and [f["dtype"] for f in bm["inputs"]["files"]] == ["<u2"] * 3 and
       np.array_equal(np.load(os.path.join(out, "mine_bf16", "query.npy")), decoded),
       f"'<u2' files with --input-dtype bfloat16: format bfloat16, the decoded values stored [{se.strip()}]")

# Masks from files: a boolean mask ('|b1'), an additive mask with -inf entries, a seed mask.
mask_in = fresh(os.path.join(WORK, "mask_in"))
for n, a in (("query", q), ("key", k), ("value", v)):
    np.save(os.path.join(mask_in, n + ".npy"), a)
bmask = rng.random((2, 4, 5, 7)) < 0.7
bmask[..., 0] = True  # no empty row
amask = np.where(rng.random((2, 4, 5, 7)) < 0.2, -np.inf, rng.standard_normal((2, 4, 5, 7))).astype(np.float32)
amask[..., 0] = 0
np.save(os.path.join(mask_in, "mask.npy"), bmask)
np.save(os.path.join(mask_in, "additive_mask.npy"), amask)
rc, so, se = run("generate", "--quiet", "--inputs-from", mask_in, "--name", "mine_masks", "--boolean-mask", "--additive-mask",
                 "--out", out)
expect(rc == 0, f"generate --inputs-from with mask.npy and additive_mask.npy (-inf entries) exits 0 [{se.strip()}]")
if rc == 0:
    mk = json.load(open(os.path.join(out, "mine_masks", "manifest.json")))
    expect([f["dtype"] for f in mk["inputs"]["files"]] == ["<f4", "<f4", "<f4", "|b1", "<f4"] and
           np.array_equal(np.load(os.path.join(out, "mine_masks", "additive_mask.npy")), amask.astype(np.float64)),
           "masks: recorded dtypes, additive mask stored as given (-inf kept)")
    if PYPATH:
        r = attnref.sdpa(q, k, v, mask=bmask, additive_mask=amask.astype(np.float64), arith="certified")
        expect(same_bits(np.asarray(r.output), np.load(os.path.join(out, "mine_masks", "output.npy"))),
               "masked case: output equals attnref.sdpa(mask=..., additive_mask=...) bit for bit")
smask = (rng.random((2, 4, 5, 7)) < 0.3).astype(np.float64)
seed_in = fresh(os.path.join(WORK, "seed_in"))
for n, a in (("query", q), ("key", k), ("value", v), ("seed_mask", smask)):
    np.save(os.path.join(seed_in, n + ".npy"), a)
rc, so, se = run("generate", "--quiet", "--inputs-from", seed_in, "--name", "mine_seed", "--seed-mask", "--out", out)
expect(rc == 0, f"generate --inputs-from with seed_mask.npy exits 0 [{se.strip()}]")

# ---- 6. a backward case from grad_output.npy ---------------------------------------------------

import torch  # noqa: E402  (Debian's python3-torch; only this part needs it)

B6, H6, HKV6, S6, D6 = 1, 4, 2, 12, 8


def torch_causal_gqa(qt, kt, vt, dot):
    """PyTorch autograd of causal (top-left) GQA attention written out (kv heads repeated per group)."""
    qt, kt, vt = (x.clone().requires_grad_(True) for x in (qt, kt, vt))
    g = qt.shape[1] // kt.shape[1]
    logits = (qt @ kt.repeat_interleave(g, 1).transpose(-1, -2)) / qt.shape[-1] ** 0.5
    logits = logits.masked_fill(~torch.ones(S6, S6, dtype=torch.bool).tril(), float("-inf"))
    o = torch.softmax(logits, -1) @ vt.repeat_interleave(g, 1)
    o.backward(dot)
    return {"grad_query": qt.grad, "grad_key": kt.grad, "grad_value": vt.grad}


def write_inputs(d, arrays):
    for n, a in arrays.items():
        np.save(os.path.join(d, n + ".npy"), a)


ROLES = ("grad_query", "grad_key", "grad_value")
bwd_in = fresh(os.path.join(WORK, "bwd_in"))
b_arrays = {"query": rng.standard_normal((B6, H6, S6, D6)), "key": rng.standard_normal((B6, HKV6, S6, D6)),
            "value": rng.standard_normal((B6, HKV6, S6, D6)), "grad_output": rng.standard_normal((B6, H6, S6, D6))}
b_arrays = {n: a.astype(np.float32) for n, a in b_arrays.items()}
write_inputs(bwd_in, b_arrays)
rc, so, se = run("generate", "--quiet", "--inputs-from", bwd_in, "--name", "mine_bwd", "--causal", "top_left", "--out", out)
expect(rc == 0, f"generate --inputs-from with grad_output.npy (causal GQA, float32 files) exits 0 [{se.strip()}]")
bcase = os.path.join(out, "mine_bwd")
if rc == 0:
    bm = json.load(open(os.path.join(bcase, "manifest.json")))
    suite_bwd = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "golden", "sdpa_bwd_gqa",
                                            "manifest.json")))
    expect(bm["schema_version"] == suite_bwd["schema_version"] == 2 and list(bm) == list(suite_bwd) and
           bm["outputs"] == suite_bwd["outputs"] and bm["reference"]["method"] == suite_bwd["reference"]["method"] and
           [t["role"] for t in bm["tensors"]] == [t["role"] for t in suite_bwd["tensors"]],
           "backward manifest: the suite's backward schema (schema_version 2, outputs.gradients, reference method, tensors)")
    expect([(f["role"], f["dtype"]) for f in bm["inputs"]["files"]] == [(n, "<f4") for n in ("query", "key", "value", "grad_output")]
           and bm["inputs"]["files"][3]["sha256"] == hashlib.sha256(open(os.path.join(bwd_in, "grad_output.npy"), "rb").read()).hexdigest(),
           "backward manifest: grad_output.npy recorded among the files with its dtype and sha256")
    certified = {r: np.load(os.path.join(bcase, r + ".npy")) for r in ROLES}
    t64 = {n: torch.from_numpy(a.astype(np.float64)) for n, a in b_arrays.items()}
    auto64 = torch_causal_gqa(t64["query"], t64["key"], t64["value"], t64["grad_output"])
    worst = max(float(np.linalg.norm(auto64[r].numpy() - certified[r]) / np.linalg.norm(certified[r])) for r in ROLES)
    expect(worst <= 1e-12, f"certified gradients agree with PyTorch float64 autograd: normwise {worst:.2e} <= 1e-12")
    if PYPATH:
        r = attnref.sdpa(b_arrays["query"], b_arrays["key"], b_arrays["value"], causal="top_left", grad_output=b_arrays["grad_output"])
        expect(all(same_bits(np.asarray(r.gradients[n]), certified[n]) for n in ROLES),
               "backward case: gradients equal attnref.sdpa(grad_output=) bit for bit")
    # Regeneration from the case's own stored inputs, every file byte for byte.
    regen = fresh(os.path.join(WORK, "bwd_regen"))
    rc, so, se = run("generate", "--quiet", "--golden", bcase, "--out", regen)
    names = sorted(os.listdir(bcase))
    expect(rc == 0 and names == sorted(os.listdir(os.path.join(regen, "mine_bwd"))) and
           all(open(os.path.join(bcase, n), "rb").read() == open(os.path.join(regen, "mine_bwd", n), "rb").read() for n in names),
           f"generate --golden CASE --out OTHER rewrites the backward case byte for byte ({len(names)} files) [{se.strip()}]")
    rc, so, se = run("generate", "--golden", bcase, "--verify")
    expect(rc == 0 and "identical" in so, f"generate --golden CASE --verify: identical (exit {rc})")
    # A float64 autograd candidate through `attnref check --grad-*`.
    flags = []
    for n in ROLES:
        np.save(os.path.join(WORK, f"t64_{n}.npy"), auto64[n].numpy())
        flags += ["--" + n.replace("_", "-"), os.path.join(WORK, f"t64_{n}.npy")]
    rc, so, se = run("check", "--golden", bcase, *flags)
    expect(rc == 0 and "PASS" in so, f"attnref check --grad-* of PyTorch float64 autograd: PASS (exit {rc}) {se.strip()}")
    swapped = auto64["grad_key"].numpy().copy()
    swapped[:, :, [2, 5]] = swapped[:, :, [5, 2]]
    np.save(os.path.join(WORK, "t64_swapped.npy"), swapped)
    rc, so, se = run("check", "--golden", bcase, "--grad-key", os.path.join(WORK, "t64_swapped.npy"))
    expect(rc == 1 and "FAIL" in so, f"...and dK with two keys swapped FAILs (exit {rc})")
    # A tampered grad_output.npy: the sha256 in the manifest refuses it, for generate and check.
    tb = tampered_copy(bcase, "tampered_bwd", "mine_bwd", "grad_output", (0, 1, 2, 3), 0.5)
    rc, so, se = run("generate", "--quiet", "--golden", tb, "--verify")
    expect(rc == 2 and "grad_output.npy" in se and "sha256" in se, f"a tampered grad_output.npy is refused by generate (exit {rc}): {se.strip()}")
    rc, so, se = run("check", "--golden", tb, *flags)
    expect(rc == 2 and "grad_output.npy" in se, f"...and by check (exit {rc}): {se.strip()}")

# bf16 inputs (float32 files holding bf16 values): the verdict of PyTorch bf16 autograd, two routes.
bf_bwd = fresh(os.path.join(WORK, "bwd_bf16_in"))
t_bf = {n: torch.from_numpy(a).to(torch.bfloat16) for n, a in b_arrays.items()}
write_inputs(bf_bwd, {n: t.float().numpy() for n, t in t_bf.items()})
rc, so, se = run("generate", "--quiet", "--inputs-from", bf_bwd, "--name", "mine_bwd_bf16", "--causal", "top_left", "--out", out)
bfm = json.load(open(os.path.join(out, "mine_bwd_bf16", "manifest.json"))) if rc == 0 else {}
expect(rc == 0 and bfm["inputs"]["format"] == "bfloat16", f"bf16 backward case: format bfloat16 [{se.strip()}]")
if rc == 0:
    auto_bf = torch_causal_gqa(t_bf["query"], t_bf["key"], t_bf["value"], t_bf["grad_output"])
    flags = []
    for n in ROLES:  # bfloat16 candidates as '<u2' bit patterns (attnref check reads them so)
        np.save(os.path.join(WORK, f"bf_{n}.npy"), auto_bf[n].view(torch.int16).numpy().view(np.uint16))
        flags += ["--" + n.replace("_", "-"), os.path.join(WORK, f"bf_{n}.npy")]
    rc, so, se = run("check", "--golden", os.path.join(out, "mine_bwd_bf16"), "--backward-algorithm", "textbook", *flags)
    cli = {0: "PASS"}.get(rc, "INCONCLUSIVE" if "INCONCLUSIVE" in so else "FAIL" if rc == 1 else f"exit {rc}")
    print(f"note PyTorch bf16 autograd on bf16 causal GQA inputs, attnref check: {cli}")
    expect(rc in (0, 1), f"attnref check of bf16 autograd gradients gives a verdict (exit {rc}) {se.strip()}")
    if PYPATH:
        import attnref.testing  # noqa: E402
        ref = attnref.sdpa(*(t_bf[n].float() for n in ("query", "key", "value")), causal="top_left",
                           grad_output=t_bf["grad_output"].float())
        try:
            attnref.testing.assert_attention_close(None, ref, backward_algorithm="textbook", **auto_bf)
            py = "PASS"
        except attnref.testing.InconclusiveError:
            py = "INCONCLUSIVE"
        except AssertionError:
            py = "FAIL"
        expect(py == cli, f"assert_attention_close gives the same verdict as attnref check on bf16 autograd: {py} / {cli}")

# ---- 5. hostile inputs: exit 2, the file (or flag) named ---------------------------------------


def hostile(label, mutate, named, extra=()):
    d = fresh(os.path.join(WORK, "hostile", label))
    for n, a in (("query", q), ("key", k), ("value", v)):
        np.save(os.path.join(d, n + ".npy"), a)
    mutate(d)
    rc, so, se = run("generate", "--quiet", "--inputs-from", d, "--name", "h", *extra, "--out", os.path.join(d, "out"))
    lines = se.strip().splitlines()
    expect(rc == 2 and len(lines) == 1 and named in lines[0], f"hostile {label}: exit {rc}, one line naming {named}: {se.strip()}")


def put(name, a):
    return lambda d: np.save(os.path.join(d, name), a)


nan_q = q.copy()
nan_q[0, 1, 2, 3] = np.nan
outside = fresh(os.path.join(WORK, "outside"))
np.save(os.path.join(outside, "key.npy"), k)


def symlink_out(d):
    os.remove(os.path.join(d, "key.npy"))
    os.symlink(os.path.join(outside, "key.npy"), os.path.join(d, "key.npy"))


def big_endian(d):
    np.save(os.path.join(d, "value.npy"), v.astype(">f4"))


hostile("wrong_shape", put("key.npy", k[:, :, :, :7]), "key.npy")
hostile("nan", put("query.npy", nan_q), "query.npy")
hostile("missing", lambda d: os.remove(os.path.join(d, "value.npy")), "value.npy")
hostile("bad_dtype", put("query.npy", q.astype(np.int32)), "query.npy")
hostile("symlink_out", symlink_out, "key.npy")
hostile("big_endian", big_endian, "value.npy")
hostile("inexact_format", lambda d: None, "query.npy", ("--input-format", "float16"))
hostile("mask_shape", put("mask.npy", np.ones((2, 4, 5, 6), dtype=bool)), "mask.npy", ("--boolean-mask",))
hostile("unasked_mask", put("mask.npy", np.ones((2, 4, 5, 7), dtype=bool)), "mask.npy")
hostile("shape_flag", lambda d: None, "--sq", ("--sq", "6"))
pinf = amask.copy()
pinf[1, 2, 3, 4] = np.inf
hostile("additive_plus_inf", put("additive_mask.npy", pinf), "additive_mask.npy", ("--additive-mask",))
hostile("seed_mask_half", put("seed_mask.npy", smask * 0.5), "seed_mask.npy", ("--seed-mask",))
hostile("max_memory", lambda d: None, "--max-memory", ("--max-memory", "64K"))
hostile("grad_output_shape", put("grad_output.npy", np.zeros((2, 4, 5, 7), dtype=np.float32)), "grad_output.npy")
nan_do = np.zeros((2, 4, 5, 6), dtype=np.float32)
nan_do[1, 2, 3, 4] = np.inf
hostile("grad_output_inf", put("grad_output.npy", nan_do), "grad_output.npy")
hostile("grad_output_no_lse", put("grad_output.npy", np.zeros((2, 4, 5, 6), dtype=np.float32)), "grad_output.npy", ("--no-lse",))
hostile("u2_without_dtype", put("query.npy", q.view(np.uint16)[..., ::2].copy()), "query.npy")
# Other inputs under the name of the case written in 1.: OUT/mine exists and differs.
other = fresh(os.path.join(WORK, "hostile", "existing_out"))
for n, a in (("query", q * np.float32(2)), ("key", k), ("value", v)):
    np.save(os.path.join(other, n + ".npy"), a)
rc, so, se = run("generate", "--quiet", "--inputs-from", other, "--name", "mine", "--causal", "bottom_right", "--out", out)
expect(rc == 2 and "mine" in se and "--force" in se, f"an existing, different OUT/NAME is not overwritten (exit {rc}): {se.strip()}")
expect(same_bits(np.load(os.path.join(case, "output.npy")), o_ref), "...and its files are untouched")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("all passed")
