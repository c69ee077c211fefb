#!/usr/bin/python3
"""`attnref generate --name N ... --gradients` (an ad-hoc backward case), end to end.

    generate_gradients.py ATTNREF WORKDIR

For a small SDPA case (causal GQA) and a small MHA case with biases:
1. the case has the suite's backward layout: outputs.gradients, grad_output among the inputs (from
   the generator: the seed decides it), one certified file per gradient role of the kind;
2. `attnref run --arith float64` (attnref's textbook backward in float64, an independent
   computation of the gradients) PASSes `attnref check --grad-*`; the same gradients with one element
   moved by 1e-6 relative FAIL it (exit 1);
3. `generate --inputs-from DIR` with the case's stored inputs and grad_output (without --gradients:
   the MPFI ladder's gradients) gives the same gradient and output bytes;
4. --gradients with --no-lse, and with --inputs-from lacking grad_output.npy, exit 2 naming the flag;
5. SDPA: the manifest records the fast backward, `--method mpfi` (the MPFI ladder's gradients) gives
   the same gradient bytes, `generate --golden CASE --verify` is identical; a (1, 16, 2048, 64) case
   above --max-memory is refused with the estimate naming the fast backward, whose MPFI escalation
   counts one (batch, kv head) group.
"""
import json
import os
import re
import shutil
import sys

import numpy as np

ATTNREF, WORK = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from cli_checks import Checks, fresh  # noqa: E402

checks = Checks(ATTNREF)
expect, run, failures = checks.expect, checks.run, checks.failures


ROLES = {"sdpa": ["grad_query", "grad_key", "grad_value"],
         "mha": ["grad_query", "grad_key", "grad_value", "grad_w_q", "grad_w_k", "grad_w_v", "grad_w_o",
                 "grad_b_q", "grad_b_k", "grad_b_v", "grad_b_o"]}
FLAGS = {r: "--" + r.replace("_", "-") for r in sum(ROLES.values(), [])}

FAST_SUFFIX_START = "; gradients: double-double then mpfi-interval"

CASES = [
    ("gsdpa", "sdpa", ["--batch", "1", "--heads", "4", "--kv-heads", "2", "--sq", "6", "--sk", "7", "--dk", "8", "--dv", "5",
                       "--causal", "bottom_right", "--seed", "11"]),
    ("gmha", "mha", ["--batch", "2", "--heads", "2", "--sq", "5", "--dk", "4", "--bias", "--seed", "12"]),
]

for name, kind, flags in CASES:
    out = fresh(os.path.join(WORK, "gen_" + name))
    rc, so, se = run("generate", "--name", name, "--kind", kind, *flags, "--gradients", "--out", out, "--quiet")
    expect(rc == 0, f"{name}: generate --gradients (exit {rc}) {se.strip()}")
    if rc != 0:
        continue
    case = os.path.join(out, name)
    m = json.load(open(os.path.join(case, "manifest.json")))
    roles = [t["role"] for t in m["tensors"]]
    expect(m["outputs"].get("gradients") is True, f"{name}: manifest outputs.gradients")
    expect("grad_output" in roles and m["inputs"]["generator"] != "files", f"{name}: grad_output from the generator among the inputs")
    expect(all(r in roles for r in ROLES[kind]), f"{name}: a certified file for every gradient role of {kind}: {ROLES[kind]}")

    if kind == "sdpa":
        # Through the fast backward (the manifest says so); --method mpfi gives the same gradient bytes,
        # and generate --golden --verify regenerates the case identically.
        expect(FAST_SUFFIX_START in m["reference"]["method"], f"{name}: manifest records the fast backward")
        out_m = fresh(os.path.join(WORK, "genm_" + name))
        rc, so, se = run("generate", "--name", name, "--kind", kind, *flags, "--gradients", "--method", "mpfi", "--out", out_m, "--quiet")
        expect(rc == 0, f"{name}: generate --gradients --method mpfi (exit {rc}) {se.strip()}")
        if rc == 0:
            mm = json.load(open(os.path.join(out_m, name, "manifest.json")))
            sha = {t["role"]: t["sha256"] for t in m["tensors"]}
            shm = {t["role"]: t["sha256"] for t in mm["tensors"]}
            expect(all(sha[r] == shm[r] for r in ROLES[kind]), f"{name}: fast and MPFI gradients byte for byte")
            expect(FAST_SUFFIX_START not in mm["reference"]["method"], f"{name}: --method mpfi records the MPFI ladder's gradients")
        rc, so, se = run("generate", "--golden", case, "--verify")
        expect(rc == 0 and "identical" in so, f"{name}: generate --golden --verify regenerates it identically (exit {rc}) {se.strip()}")

    # attnref's float64 textbook backward as the candidate.
    cand = fresh(os.path.join(WORK, "cand_" + name))
    rc, so, se = run("run", "--golden", case, "--arith", "float64", "--out", cand)
    expect(rc == 0, f"{name}: attnref run --arith float64 (exit {rc}) {se.strip()}")
    present = [r for r in ROLES[kind] if os.path.exists(os.path.join(cand, r + ".npy"))]
    expect(present == ROLES[kind], f"{name}: run wrote every gradient ({present})")
    args = ["check", "--golden", case]
    for r in present:
        args += [FLAGS[r], os.path.join(cand, r + ".npy")]
    rc, so, se = run(*args)
    expect(rc == 0 and "PASS" in so, f"{name}: check --grad-* of the float64 textbook gradients PASSes (exit {rc}) {se.strip()}")
    # One element of the first gradient moved by 1e-6 relative (far above float64's bound).
    g = np.load(os.path.join(cand, present[0] + ".npy"))
    flat = g.reshape(-1)
    k = int(np.argmax(np.abs(flat)))
    flat[k] *= 1 + 1e-6
    bad = os.path.join(cand, present[0] + "_perturbed.npy")
    np.save(bad, g)
    rc, so, se = run("check", "--golden", case, FLAGS[present[0]], bad)
    expect(rc == 1 and "FAIL" in so, f"{name}: a perturbed {present[0]} FAILs (exit {rc})")

    # The same inputs and grad_output through --inputs-from: the same certified bytes.
    src = fresh(os.path.join(WORK, "src_" + name))
    for t in m["tensors"]:
        if t["role"] in ("query", "key", "value", "w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o", "grad_output", "mask"):
            shutil.copy(os.path.join(case, t["file"]), os.path.join(src, t["role"] + ".npy"))
    extra = ["--heads", "4", "--kv-heads", "2", "--causal", "bottom_right"] if kind == "sdpa" else ["--heads", "2", "--bias"]
    out2 = fresh(os.path.join(WORK, "gen2_" + name))
    rc, so, se = run("generate", "--name", name, "--kind", kind, "--inputs-from", src, *extra, "--out", out2, "--quiet")
    expect(rc == 0, f"{name}: generate --inputs-from the stored inputs and grad_output (exit {rc}) {se.strip()}")
    if rc == 0:
        m2 = json.load(open(os.path.join(out2, name, "manifest.json")))
        sha = {t["role"]: t["sha256"] for t in m["tensors"] if not t.get("target")}
        sha2 = {t["role"]: t["sha256"] for t in m2["tensors"] if not t.get("target")}
        same = [r for r in ROLES[kind] + ["output", "weights", "lse"] if sha.get(r) == sha2.get(r)]
        expect(len(same) == len(ROLES[kind]) + 3, f"{name}: --inputs-from gives the same gradient, output, weights and lse bytes ({same})")

rc, so, se = run("generate", "--name", "x", "--gradients", "--no-lse", "--out", fresh(os.path.join(WORK, "bad1")), "--quiet")
expect(rc == 2 and "--gradients" in se and len(se.strip().splitlines()) == 1, f"--gradients --no-lse: exit 2 naming the flag (exit {rc}) {se.strip()}")
src = fresh(os.path.join(WORK, "nograd"))
rng = np.random.default_rng(3)
for r in ("query", "key", "value"):
    np.save(os.path.join(src, r + ".npy"), rng.standard_normal((1, 1, 3, 4)))
rc, so, se = run("generate", "--name", "x", "--inputs-from", src, "--gradients", "--out", fresh(os.path.join(WORK, "bad2")), "--quiet")
expect(rc == 2 and "--gradients" in se and "grad_output.npy" in se, f"--gradients with --inputs-from without grad_output.npy: exit 2 (exit {rc}) {se.strip()}")

# The memory estimate covers the fast backward: a (1, 16, 2048, 64) case under --max-memory 1G is refused
# naming it, before anything is computed.
rc, so, se = run("generate", "--name", "big", "--heads", "16", "--sq", "2048", "--dk", "64", "--gradients", "--max-memory", "1G",
                 "--out", fresh(os.path.join(WORK, "bad3")), "--quiet")
expect(rc == 2 and "gradients by the fast backward" in se and "GiB" in se, f"a large --gradients case above --max-memory: exit 2 with the estimate (exit {rc}) {se.strip()}")
# Its gradient part follows the escalation by (batch, kv head) group: at least one group's MPFI backward
# (256 bytes per value of 4 copies of dQ, dK, dV of one head and of 4 Sq·Sk intermediates), far below the
# whole backward's 16 groups.
m = re.search(r"gradients by the fast backward ([0-9.e+]+) GiB", se)
one_group = 256 * 4 * (2048 * 64 * 3 + 2048 * 2048) / 2**30
expect(m is not None and one_group <= float(m.group(1)) < 2 * one_group,
       f"the fast backward's estimate counts one (batch, kv head) group's MPFI ladder ({one_group:.3g} GiB), not 16: {se.strip()}")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
