"""A PyTorch autograd client of `attnref check` for gradients (docs/backward.md).

Usage: torch_check_client.py ATTNREF GOLDEN_DIR OUT_DIR DTYPE [--expect-inconclusive CASE,…] [CASE ...]

For every backward case of GOLDEN_DIR (manifest outputs.gradients true; or the CASEs named), computes
the gradients of the case's attention with torch.autograd in DTYPE (float32 or float64) from the case's
inputs, by explicit math written here from the manifest's conventions (golden/README.md): logits
(q·kᵀ)·scale, soft-capped, minus ALiBi slope·|diagonal(i) − j|, plus the additive mask and the seed
mask·(−1e9); keys masked by causality (top_left / bottom_right plus diagonal_offset), the window, key
padding, the boolean mask (either polarity) and −inf additive entries; empty rows by the case's policy
(zero: output 0; uniform: the mean of V; nan: NaN, whose gradients the client sets as backward.hpp
documents: dQ of the row, dK and dV of every key of the kv head, and for MHA everything downstream);
GQA by repeat_interleave; MHA as y = x·W + b with head h owning columns [h·d, (h+1)·d). Writes
grad_<role>.npy in DTYPE and runs `attnref check --golden CASE --grad-… …`. Prints one line per case;
exit 0 when every case PASSes — except the cases named by --expect-inconclusive, which must be
INCONCLUSIVE (the bound measured too loose there to decide; never FAIL, and a PASS there means the
list is stale) — 1 otherwise.
"""
import json
import pathlib
import subprocess
import sys

import numpy as np
import torch


def masks(m, d):
    sh, cv = m["shapes"], m["conventions"]
    B, H, Sq, Sk = sh["batch"], sh["heads"], sh["query_length"], sh["key_length"]
    i = np.arange(Sq)[:, None]
    j = np.arange(Sk)[None, :]
    diag = i + cv["diagonal_offset"] + (Sk - Sq if cv["causal_alignment"] == "bottom_right" else 0)
    masked = np.zeros((B, H, Sq, Sk), dtype=bool)
    if cv["causal"]:
        masked |= (j > diag)[None, None]
    w = cv["window"]
    if w is not None:
        if w.get("left") is not None:
            masked |= (j < diag - w["left"])[None, None]
        if w.get("right") is not None:
            masked |= (j > diag + w["right"])[None, None]
    for b, n in enumerate(cv["key_lengths"]):
        masked[b, :, :, n:] = True
    if cv["boolean_mask"]:
        flag = np.load(d / "mask.npy")
        masked |= flag == (cv["mask_polarity"] == "true_means_masked")
    offsets = np.zeros((B, H, Sq, Sk))
    if cv["additive_mask"]:
        a = np.load(d / "additive_mask.npy")
        masked |= np.isneginf(a)
        offsets += np.where(np.isfinite(a), a, 0)
    if cv["seed_mask"]:
        offsets += np.load(d / "seed_mask.npy") * -1e9
    if cv["alibi_slopes"]:
        slopes = np.array(cv["alibi_slopes"])[None, :, None, None]
        offsets -= slopes * np.abs(diag - j)[None, None]
    return masked, offsets


def gradients(d: pathlib.Path, dtype):
    m = json.loads((d / "manifest.json").read_text())
    sh, cv = m["shapes"], m["conventions"]
    B, H, Hkv, Sq, Sk = sh["batch"], sh["heads"], sh["kv_heads"], sh["query_length"], sh["key_length"]
    dk, dv = sh["head_dim_qk"], sh["head_dim_v"]
    leaf = lambda role: torch.from_numpy(np.load(d / f"{role}.npy")).to(dtype).requires_grad_()
    const = lambda role: torch.from_numpy(np.load(d / f"{role}.npy")).to(dtype)
    mha = m["kind"] == "mha"
    bias = mha and cv["projection_bias"]
    leaves = {}
    if mha:
        for r in ("query", "key", "value", "w_q", "w_k", "w_v", "w_o") + (("b_q", "b_k", "b_v", "b_o") if bias else ()):
            leaves[r] = leaf(r)
        proj = lambda x, w, b: x @ leaves[w] + (leaves[b] if bias else 0)
        q = proj(leaves["query"], "w_q", "b_q").reshape(B, Sq, H, dk).transpose(1, 2)
        k = proj(leaves["key"], "w_k", "b_k").reshape(B, Sk, Hkv, dk).transpose(1, 2)
        v = proj(leaves["value"], "w_v", "b_v").reshape(B, Sk, Hkv, dv).transpose(1, 2)
    else:
        for r in ("query", "key", "value"):
            leaves[r] = leaf(r)
        q, k, v = leaves["query"], leaves["key"], leaves["value"]
    group = H // Hkv
    k_rep, v_rep = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = cv["scale"] if cv["scale"] is not None else 1 / np.sqrt(dk)
    s = (q @ k_rep.transpose(-2, -1)) * scale
    if cv["softcap"] is not None:
        s = cv["softcap"] * torch.tanh(s / cv["softcap"])
    masked, offsets = masks(m, d)
    masked_t = torch.from_numpy(masked)
    s = (s + torch.from_numpy(offsets).to(dtype)).masked_fill(masked_t, float("-inf"))
    empty = masked_t.all(dim=-1, keepdim=True)
    p = torch.softmax(s.masked_fill(empty, 0.0), dim=-1)
    policy = cv["empty_rows"]
    if policy == "zero":
        p = p.masked_fill(empty, 0.0)
    elif policy == "uniform":
        p = torch.where(empty, torch.full_like(p, 1.0 / Sk), p)
    out = p @ v_rep
    if mha:
        out = out.transpose(1, 2).reshape(B, Sq, H * dv) @ leaves["w_o"] + (leaves["b_o"] if bias else 0)
    out.backward(const("grad_output"))
    roles = {"query": "grad_query", "key": "grad_key", "value": "grad_value", "w_q": "grad_w_q", "w_k": "grad_w_k",
             "w_v": "grad_w_v", "w_o": "grad_w_o", "b_q": "grad_b_q", "b_k": "grad_b_k", "b_v": "grad_b_v", "b_o": "grad_b_o"}
    g = {roles[r]: t.grad.detach().clone() for r, t in leaves.items()}
    if policy == "nan" and bool(empty.any()):
        e = empty[..., 0]  # (B, H, Sq)
        if mha:
            for t in g.values():
                t.fill_(float("nan"))
        else:
            g["grad_query"][e] = float("nan")
            heads_nan = e.any(dim=-1).reshape(B, Hkv, group).any(dim=-1)  # (B, Hkv)
            g["grad_key"][heads_nan] = float("nan")
            g["grad_value"][heads_nan] = float("nan")
    return g


def backward_cases(golden: pathlib.Path) -> list:
    """The names of GOLDEN's cases whose manifest has outputs.gradients true, sorted."""
    return sorted(p.parent.name for p in golden.glob("*/manifest.json") if json.loads(p.read_text())["outputs"].get("gradients"))


def main() -> int:
    attnref, golden, out, dtype_name = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3]), sys.argv[4]
    dtype = {"float32": torch.float32, "float64": torch.float64}[dtype_name]
    torch.set_num_threads(1)
    rest, expect_inconclusive = sys.argv[5:], set()
    if rest[:1] == ["--expect-inconclusive"]:
        expect_inconclusive, rest = set(rest[1].split(",")), rest[2:]
    names = rest or backward_cases(golden)
    failed = 0
    for name in names:
        d = golden / name
        o = out / dtype_name / name
        o.mkdir(parents=True, exist_ok=True)
        # torch.softmax's backward forms dS = P∘(dP − rowsum(dP∘P)) from its own output P: the textbook backward.
        args = [attnref, "check", "--golden", str(d), "--backward-algorithm", "textbook"]
        for role, t in gradients(d, dtype).items():
            f = o / f"{role}.npy"
            np.save(f, t.numpy())
            args += ["--" + role.replace("_", "-"), str(f)]
        r = subprocess.run(args, capture_output=True, text=True)
        last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr.strip()
        print(f"{dtype_name} {name}: exit {r.returncode}: {last}")
        expected_ok = (r.returncode == 1 and last.startswith("INCONCLUSIVE")) if name in expect_inconclusive else r.returncode == 0
        if not expected_ok:
            failed += 1
            print(r.stdout + r.stderr)
    print(f"{len(names)} backward cases ({dtype_name}): {failed} not as expected; {len(expect_inconclusive & set(names))} expected INCONCLUSIVE")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
