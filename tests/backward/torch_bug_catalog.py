"""The backward bug catalog through `attnref check` (docs/backward.md).

Usage: torch_bug_catalog.py ATTNREF GOLDEN_DIR OUT_DIR [--loose CASE,…] [CASE ...]

A hand-written textbook backward (no autograd: dP = dO·Vᵀ, D = rowsum(P∘dP), dS = P∘(dP − D), dQ = s·dS·K,
dK = s·dSᵀ·Q, dV = Pᵀ·dO, GQA summed over the group; MHA around it: dW_o = mergedᵀ·dOut, dH = dOut·W_oᵀ,
then dX = dH·Wᵀ, dW = xᵀ·dH, db = Σ dH), with the forward's masks and offsets from
torch_check_client.masks, run in three formats: float32, and bf16 or fp16 storage with float32 accumulation
(inputs, projections and gradients rounded to bfloat16 or float16, arithmetic in float32; files '<f4' holding
the 16-bit values, checked with --dtype bfloat16 or float16, so against the certified result of the inputs
rounded to that format). Each of five bugs is injected in turn:
  no_scale         dS not multiplied by the scale s in dQ and dK
  wrong_transpose  dQ = s·dSᵀ·K (only where Sq = Sk, else it does not type-check: not applicable)
  dropped_d_term   dS = P∘dP
  gqa_not_summed   dK, dV of a kv head from the first query head of its group only
  masked_key_leak  P recomputed without the structural masks (keys masked by causality, window, padding,
                   boolean mask, −inf additive entries get weight and gradient)
A bug is visible on a case when its float64 gradients differ from the correct float64 gradients (by more
than 1e-9 of the largest |gradient|); there it must FAIL `attnref check` (exit 1, verdict FAIL) in float32, and in bf16 and fp16 on SDPA cases; on
multi-head cases in bf16 and fp16 it must FAIL or be INCONCLUSIVE (the first-order bound (B8)–(B13) is vacuous for
bf16 projections on some tensors; measured and listed in docs/backward.md), never PASS. The correct
implementation must PASS in float32 and never FAIL in bf16 or fp16 (PASS or INCONCLUSIVE: counted and printed). On the cases named by
--loose (adversarial ones where the first-order bound is measured too loose to decide), the correct
float32 kernel may be INCONCLUSIVE and a 16-bit bug may be INCONCLUSIVE; nothing wrong may ever PASS. Prints a table; exit 0 when all that holds.
"""
import json
import pathlib
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from torch_check_client import backward_cases, masks  # noqa: E402

BUGS = ("no_scale", "wrong_transpose", "dropped_d_term", "gqa_not_summed", "masked_key_leak")
# (name, the storage format the kernel rounds to or None, check's flags): 16-bit files are '<f4' holding
# values of the format, declared with --dtype; check then judges them against the certified result of
# the golden inputs rounded to that format (--input-format auto), the inputs this kernel computed on.
FORMATS = (("float32", None, []), ("bf16", torch.bfloat16, ["--dtype", "bfloat16"]), ("fp16", torch.float16, ["--dtype", "float16"]))


def sdpa_backward(q, k, v, dO, m, d, bug, store):
    sh, cv = m["shapes"], m["conventions"]
    B, H, Hkv, Sq, Sk, dk = sh["batch"], sh["heads"], sh["kv_heads"], sh["query_length"], sh["key_length"], sh["head_dim_qk"]
    group = H // Hkv
    k_rep, v_rep = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = cv["scale"] if cv["scale"] is not None else 1 / np.sqrt(dk)
    raw = (q @ k_rep.transpose(-2, -1)) * scale
    s = cv["softcap"] * torch.tanh(raw / cv["softcap"]) if cv["softcap"] is not None else raw
    masked, offsets = masks(m, d)
    masked = torch.from_numpy(masked)
    s = s + torch.from_numpy(offsets).to(q.dtype)
    empty = masked.all(dim=-1, keepdim=True)
    if bug == "masked_key_leak":  # the structural masks forgotten; −inf additive entries stay −inf offsets
        p = torch.softmax(s.masked_fill(empty, 0.0), dim=-1)
    else:
        p = torch.softmax(s.masked_fill(masked, float("-inf")).masked_fill(empty, 0.0), dim=-1)
    p = torch.nan_to_num(p, nan=0.0)
    policy = cv["empty_rows"]
    p_dv = torch.where(empty, torch.full_like(p, 1.0 / Sk if policy == "uniform" else 0.0), p)
    p_ds = torch.where(empty, torch.zeros_like(p), p)
    dP = dO @ v_rep.transpose(-2, -1)
    D = torch.zeros_like(dP[..., :1]) if bug == "dropped_d_term" else (p_ds * dP).sum(-1, keepdim=True)
    dS = p_ds * (dP - D)
    if cv["softcap"] is not None:
        t = torch.tanh(raw / cv["softcap"])
        dS = dS * (1 - t) * (1 + t)
    sc = 1.0 if bug == "no_scale" else scale
    dQ = sc * (dS.transpose(-2, -1) if bug == "wrong_transpose" else dS) @ k_rep
    dK_rep, dV_rep = sc * dS.transpose(-2, -1) @ q, p_dv.transpose(-2, -1) @ dO
    if bug == "gqa_not_summed":
        dK, dV = dK_rep[:, ::group], dV_rep[:, ::group]
    else:
        dK = dK_rep.reshape(B, Hkv, group, Sk, -1).sum(2)
        dV = dV_rep.reshape(B, Hkv, group, Sk, -1).sum(2)
    if policy == "nan" and bool(empty.any()):
        e = empty[..., 0]
        dQ[e] = float("nan")
        heads_nan = e.any(dim=-1).reshape(B, Hkv, group).any(dim=-1)
        dK[heads_nan] = float("nan")
        dV[heads_nan] = float("nan")
    return store(dQ), store(dK), store(dV), p_dv @ v_rep


def gradients(d, m, bug, dtype, low):
    store = (lambda t: t.to(low).to(dtype)) if low is not None else (lambda t: t)
    load = lambda role: store(torch.from_numpy(np.load(d / f"{role}.npy")).to(dtype))
    sh, cv = m["shapes"], m["conventions"]
    B, H, Hkv, Sq, Sk, dk, dv = (sh[x] for x in ("batch", "heads", "kv_heads", "query_length", "key_length", "head_dim_qk", "head_dim_v"))
    if m["kind"] == "sdpa":
        dQ, dK, dV, _ = sdpa_backward(load("query"), load("key"), load("value"), load("grad_output"), m, d, bug, store)
        return {"grad_query": dQ, "grad_key": dK, "grad_value": dV}
    bias = cv["projection_bias"]
    x = {r: load(r) for r in ("query", "key", "value")}
    w = {r: load(r) for r in ("w_q", "w_k", "w_v", "w_o")}
    b = {r: (load(r) if bias else torch.zeros(w["w" + r[1:]].shape[1], dtype=dtype)) for r in ("b_q", "b_k", "b_v", "b_o")}
    q = store(x["query"] @ w["w_q"] + b["b_q"]).reshape(B, Sq, H, dk).transpose(1, 2)
    k = store(x["key"] @ w["w_k"] + b["b_k"]).reshape(B, Sk, Hkv, dk).transpose(1, 2)
    v = store(x["value"] @ w["w_v"] + b["b_v"]).reshape(B, Sk, Hkv, dv).transpose(1, 2)
    dOut = load("grad_output")
    dH = store(dOut @ w["w_o"].T).reshape(B, Sq, H, dv).transpose(1, 2)
    dQ, dK, dV, heads = sdpa_backward(q, k, v, dH, m, d, bug, store)
    merged = store(heads.transpose(1, 2).reshape(B * Sq, H * dv))
    g = {"grad_w_o": store(merged.T @ dOut.reshape(B * Sq, -1))}
    if bias:
        g["grad_b_o"] = store(dOut.reshape(B * Sq, -1).sum(0))
    for role, t, xr, wr, br in (("query", dQ, "query", "w_q", "b_q"), ("key", dK, "key", "w_k", "b_k"), ("value", dV, "value", "w_v", "b_v")):
        S = t.shape[2]
        flat = t.transpose(1, 2).reshape(B * S, -1)
        g["grad_" + role] = store((flat @ w[wr].T).reshape(B, S, -1))
        g["grad_w" + wr[1:]] = store(x[xr].reshape(B * S, -1).T @ flat)
        if bias:
            g["grad_b" + br[1:]] = store(flat.sum(0))
    if bias and cv["softcap"] is None and cv["empty_rows"] != "nan":
        g["grad_b_k"] = torch.zeros_like(g["grad_b_k"])  # exactly 0 (backward.hpp); any kernel may return its rounding noise
    return g


def check(attnref, d, g, o, dtype_args):
    o.mkdir(parents=True, exist_ok=True)
    # The kernel here forms dS from the forward's own normalised P (the textbook backward), and says so.
    args = [attnref, "check", "--golden", str(d), "--backward-algorithm", "textbook"] + dtype_args
    for role, t in g.items():
        f = o / f"{role}.npy"
        np.save(f, t.to(torch.float32).numpy())
        args += ["--" + role.replace("_", "-"), str(f)]
    r = subprocess.run(args, capture_output=True, text=True)
    verdict = "PASS" if r.returncode == 0 else (r.stdout.strip().splitlines() or ["?"])[-1].split(":")[0] if r.returncode == 1 else f"exit {r.returncode}"
    return verdict, r


def main() -> int:
    attnref, golden, out = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
    torch.set_num_threads(1)
    rest, loose = sys.argv[4:], set()
    if rest[:1] == ["--loose"]:
        loose, rest = set(rest[1].split(",")), rest[2:]
    names = rest or backward_cases(golden)
    bad, invisible, counts = [], [], {}
    for name in names:
        d = golden / name
        m = json.loads((d / "manifest.json").read_text())
        sh = m["shapes"]
        ref = gradients(d, m, "none", torch.float64, None)
        for bug in ("none",) + BUGS:
            if bug == "wrong_transpose" and sh["query_length"] != sh["key_length"]:
                invisible.append(f"{name}/{bug} (Sq != Sk: not applicable)")
                continue
            if bug != "none":
                g64 = gradients(d, m, bug, torch.float64, None)
                diff = max(float(torch.nan_to_num((g64[r] - ref[r]).abs(), nan=0.0).max()) for r in ref)
                scale = max(float(torch.nan_to_num(ref[r].abs(), nan=0.0).max()) for r in ref)
                if not diff > 1e-9 * scale:
                    invisible.append(f"{name}/{bug}")
                    continue
            for fmt, low, extra in FORMATS:
                verdict, r = check(attnref, d, gradients(d, m, bug, torch.float32, low), out / fmt / name / bug, extra)
                counts[(bug, fmt, verdict)] = counts.get((bug, fmt, verdict), 0) + 1
                if bug == "none":  # never FAIL; PASS in float32 (bf16, fp16: the bound may be too loose to decide)
                    ok = verdict == "PASS" if fmt == "float32" and name not in loose else verdict in ("PASS", "INCONCLUSIVE")
                elif fmt == "float32" or (m["kind"] == "sdpa" and name not in loose):
                    ok = verdict == "FAIL"
                else:  # 16-bit multi-head: FAIL, or INCONCLUSIVE where (B8)-(B13) is vacuous for 16-bit projections; never PASS
                    ok = verdict in ("FAIL", "INCONCLUSIVE")
                print(f"{name:45s} {bug:16s} {fmt:8s} {verdict}")
                if not ok:
                    bad.append(f"{name}/{bug}/{fmt}: {verdict}")
                    print(r.stdout + r.stderr)
    print("verdict counts (bug, format, verdict):")
    for key in sorted(counts):
        print("  ", *key, counts[key])
    print("bugs invisible on a case (float64 gradients identical to the correct ones), not judged:", "; ".join(invisible) or "none")
    print("unexpected verdicts:", "; ".join(bad) or "none")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
