"""A multi-head gradient check that only the data-aware bound (B18) decides (docs/backward.md (B18)):
an ad-hoc MHA case (B 1, S 256, E 128, 4 heads of 32) with certified gradients, attnref's float32
candidate (`attnref run --arith float32`). Under the first-order bound alone (`--tolerance
worst-case`) grad_w_q and grad_w_k are vacuous on some elements (INCONCLUSIVE, exit 1; measured: 14
and 31 of 16,384 elements); under the default model every role PASSes and the report's note names
(B18); one grad_w_q element moved by 2^-7 of its value FAILs (exit 1), so the PASS is not a bound too
loose to tell. Usage: mha_decides.py ATTNREF WORKDIR"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np

attnref, work = sys.argv[1], sys.argv[2]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)


def run(*args):
    p = subprocess.run([attnref, *args], capture_output=True, text=True)
    print("$ attnref", " ".join(args), "->", p.returncode)
    return p


p = run("generate", "--name", "mha_s256", "--kind", "mha", "--batch", "1", "--heads", "4", "--dk", "32", "--model-dim", "128",
        "--sq", "256", "--gradients", "--out", work, "--quiet")
assert p.returncode == 0, p.stderr
case, cand = os.path.join(work, "mha_s256"), os.path.join(work, "cand")
assert run("run", "--golden", case, "--arith", "float32", "--out", cand).returncode == 0
roles = ["query", "key", "value", "w_q", "w_k", "w_v", "w_o"]


def grads(directory):
    out = []
    for r in roles:
        out += ["--grad-" + r.replace("_", "-"), os.path.join(directory, "grad_" + r + ".npy")]
    return out


report = os.path.join(work, "default.json")
p = run("check", "--golden", case, *grads(cand), "--json", report)
print(p.stdout)
assert p.returncode == 0, "the float32 candidate should PASS under the default model"
rows = json.load(open(report))["tensors"]
assert len(rows) == len(roles) and all(t["verdict"] == "pass" for t in rows), rows
assert all("(B18)" in t.get("note", "") for t in rows), [t.get("note") for t in rows]

p = run("check", "--golden", case, *grads(cand), "--tolerance", "worst-case")
print(p.stdout)
assert p.returncode == 1 and "INCONCLUSIVE" in p.stdout and "vacuous" in p.stdout, "the first-order bound alone should be vacuous here"

bad = os.path.join(work, "bad")
shutil.copytree(cand, bad)
g = np.load(os.path.join(cand, "grad_w_q.npy"))
i = np.unravel_index(np.argmax(np.abs(g)), g.shape)
g[i] = g[i] * np.float32(1 + 2.0**-7)
np.save(os.path.join(bad, "grad_w_q.npy"), g)
p = run("check", "--golden", case, "--grad-w-q", os.path.join(bad, "grad_w_q.npy"))
print(p.stdout)
assert p.returncode == 1 and p.stdout.rstrip().splitlines()[-1].startswith("FAIL"), "a grad_w_q element off by 2^-7 should FAIL"
print("ok")
