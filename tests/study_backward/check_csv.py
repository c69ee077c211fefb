#!/usr/bin/python3
"""Checks the CSV of `attnref study --backward` on tests/study_backward.cmake's tiny sweep."""
import csv
import math
import sys

rows = list(csv.DictReader(open(sys.argv[1])))
want = {(p, a, n) for p in ("longdouble", "float64", "float32") for a in ("textbook", "flash") for n in ("8", "32")}
got = [(r["policy"], r["backward_algorithm"], r["seq"]) for r in rows]
errors = []
if sorted(got) != sorted(want) or any(r["backward"] != "1" for r in rows):
    errors.append(f"expected one backward row per policy x algorithm x n, got {got}")
norm = {}
for r in rows:
    for g in ("dq", "dk", "dv"):
        ratio, rel = float(r[g + "_bound_ratio"]), float(r[g + "_norm_rel"])
        if not 0 < ratio <= 1:
            errors.append(f"{r['policy']} {r['backward_algorithm']} n={r['seq']} {g}: err/bound {ratio} not in (0, 1]")
        if not float(r[g + "_bound_norm_rel"]) < 1:
            errors.append(f"{r['policy']} {r['backward_algorithm']} n={r['seq']} {g}: bound as large as the gradient (vacuous)")
        if not (math.isfinite(rel) and rel > 0):
            errors.append(f"{r['policy']} {r['backward_algorithm']} n={r['seq']} {g}: normwise error {rel}")
        norm.setdefault(r["policy"], []).append(rel)
    if not math.isnan(float(r["out_rms"])):
        errors.append("a backward row has forward measurements")
# The normwise errors sit near each format's unit roundoff: every float64 one below every float32 one
# (2^-53 and 2^-24, orders of magnitude apart).
if rows and not max(norm["float64"]) < min(norm["float32"]):
    errors.append(f"normwise errors not ordered by precision: {norm}")
if max((r for r in norm.get("float32", [])), default=1) > 2**-24 * 64:
    errors.append(f"float32 normwise error above 64 u: {norm['float32']}")
print("\n".join(errors) if errors else f"ok: {len(rows)} backward rows, every err/bound <= 1")
sys.exit(1 if errors else 0)
