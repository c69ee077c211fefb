#!/usr/bin/python3
"""Plots of an `attnref study` CSV (see docs/studies.md). Needs matplotlib (Debian: python3-matplotlib).

    /usr/bin/python3 tools/plot_study.py DIR/study.csv DIR

writes, for the rows present in the CSV:
  error_vs_length.svg   output RMS error vs sequence length, one line per precision policy
                        (shifted softmax, no offset; log-log)
  error_vs_offset.svg   max relative error of P vs logit offset, one line per softmax algorithm
  bound_vs_observed.svg observed max output error against the a-priori bound (err/bound), every point
                        labelled by its n; points whose bound is infinite somewhere drawn as "vacuous"
  backward_vs_length.svg  backward points (attnref study --backward): normwise relative error of dQ, dK,
                        dV (top) and max |error| / first-order bound (bottom) vs sequence length, one
                        line per policy (colour) and backward algorithm (solid textbook, dashed flash)
SVG output is deterministic (fixed hashsalt, no date).
"""
import csv
import math
import os
import sys
import tempfile
from collections import defaultdict

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402

plt.rcParams["svg.hashsalt"] = "attnref"
plt.rcParams["svg.fonttype"] = "path"


def save(fig, path):
    """Writes the figure atomically: a temporary file beside it, then rename, so a symlink planted
    at `path` is replaced, never written through, and no half-written file is left."""
    fig.tight_layout()
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".tmp-", dir=os.path.dirname(path) or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="svg", metadata={"Date": None, "Creator": "attnref tools/plot_study.py"})
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    plt.close(fig)


def main(argv):
    if len(argv) != 3:
        sys.exit("usage: plot_study.py STUDY.csv OUTDIR")
    all_rows = list(csv.DictReader(open(argv[1])))
    out = argv[2]
    # Backward points (a CSV from before the backward columns has none) have their own plot.
    backward = [r for r in all_rows if r.get("backward", "0") == "1"]
    rows = [r for r in all_rows if r.get("backward", "0") != "1"]
    f = lambda r, k: float(r[k])

    # 1. error vs sequence length per policy
    lines = defaultdict(list)
    for r in rows:
        if r["algorithm"] == "shifted" and f(r, "offset") == 0 and f(r, "ramp") == 0 and r["direct_logits"] == "0":
            lines[(r["policy"], r["head_dim"])].append((int(r["seq"]), f(r, "out_rms"), f(r, "out_max")))
    if any(len(v) > 1 for v in lines.values()):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for (policy, dk), pts in sorted(lines.items()):
            pts = sorted(set(pts))
            if len(pts) < 2:
                continue
            (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"{policy} (RMS)")
            ax.plot([p[0] for p in pts], [p[2] for p in pts], "^:", color=line.get_color(), alpha=0.6)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length n (keys)")
        ax.set_ylabel("output error / Σ_j p_j|v_jl|")
        ax.set_title("Attention output error vs sequence length\n(solid: RMS, dotted: max; vs MPFR 133-bit reference)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1, 0.5))
        save(fig, f"{out}/error_vs_length.svg")

    # 2. error vs logit offset per softmax algorithm
    lines = defaultdict(list)
    for r in rows:
        if f(r, "ramp") == 0:
            lines[(r["policy"], r["algorithm"], r["block"], r["seq"])].append((f(r, "offset"), f(r, "p_max")))
    lines = {k: sorted(set(v)) for k, v in lines.items() if len({p[0] for p in v}) > 1}
    if lines:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for (policy, alg, block, n), pts in sorted(lines.items()):
            label = f"{alg} ({policy}, n={n}" + (f", block {block})" if alg == "online" else ")")
            ax.plot([max(p[0], 1) for p in pts], [p[1] for p in pts], "o-", label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("logit offset (0 plotted at 1)")
        ax.set_ylabel("max relative error of P")
        ax.set_title("Softmax error vs logit offset")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, f"{out}/error_vs_offset.svg")

    # 3. bound vs observed: every forward point, labelled by n. A point whose bound is infinite for
    # some element (bound_infinite > 0; bound_ratio nan) is drawn as "vacuous" on the top edge, one
    # with no error at all on the bottom edge: neither is dropped.
    def bound_point(r):
        vacuous = int(r.get("bound_infinite", "0") or 0) > 0 or math.isnan(f(r, "bound_ratio"))
        return r["policy"], int(r["seq"]), None if vacuous else f(r, "bound_ratio")
    pts = [bound_point(r) for r in rows]
    if pts:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        policies = sorted({p for p, _, _ in pts})
        finite = [v for _, _, v in pts if v is not None and v > 0]
        top = max(finite + [1.0]) * 10
        bottom = min(finite + [1.0]) / 10
        labelled = set()
        for i, pol in enumerate(policies):
            for p, n, v in pts:
                if p != pol:
                    continue
                if v is None:
                    kind, y, marker, text = "vacuous (bound = inf)", top, "x", f"n={n} vacuous"
                elif v == 0:
                    kind, y, marker, text = "error exactly 0", bottom, "v", f"n={n} err 0"
                else:
                    kind, y, marker, text = "err / bound", v, "o", f"n={n}"
                ax.plot([i], [y], marker, color="C0" if marker == "o" else "C3" if marker == "x" else "C2", alpha=0.7,
                        label=None if kind in labelled else kind)
                labelled.add(kind)
                ax.annotate(text, (i, y), textcoords="offset points", xytext=(6, 0), fontsize=7, va="center")
        ax.axhline(1.0, color="red", linestyle="--", label="a-priori bound")
        ax.set_xticks(range(len(policies)), policies, rotation=20)
        ax.set_xlim(-0.5, len(policies) - 0.2)
        ax.set_yscale("log")
        ax.set_ylim(bottom / 3, top * 3)
        ax.set_ylabel("max over elements of |error| / bound")
        ax.set_title("Observed error in units of the a-priori bound (below 1: bound holds)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, f"{out}/bound_vs_observed.svg")

    # 4. backward: error of dQ, dK, dV vs sequence length
    lines = defaultdict(list)
    for r in backward:
        lines[(r["policy"], r["backward_algorithm"], r["head_dim"])].append(
            (int(r["seq"]), [f(r, g + "_norm_rel") for g in ("dq", "dk", "dv")], [f(r, g + "_bound_ratio") for g in ("dq", "dk", "dv")]))
    if any(len(v) > 1 for v in lines.values()):
        fig, axes = plt.subplots(2, 3, figsize=(12, 7), sharex=True)
        colours = {}
        for (policy, alg, dk), pts in sorted(lines.items()):
            pts = sorted(pts)
            colour = colours.setdefault(policy, f"C{len(colours)}")
            style = "o-" if alg == "textbook" else "s--"
            for g in range(3):
                axes[0][g].plot([p[0] for p in pts], [p[1][g] for p in pts], style, color=colour, label=f"{policy} {alg}")
                axes[1][g].plot([p[0] for p in pts], [max(p[2][g], 1e-300) for p in pts], style, color=colour)
        for g, name in enumerate(("dQ", "dK", "dV")):
            axes[0][g].set_title(f"{name}: ‖ĝ − g‖₂ / ‖g‖₂")
            axes[1][g].set_title(f"{name}: max |ĝ − g| / first-order bound")
            axes[1][g].axhline(1.0, color="red", linestyle=":")
            axes[1][g].set_xlabel("sequence length n (keys)")
            for row in (0, 1):
                axes[row][g].set_xscale("log", base=2)
                axes[row][g].set_yscale("log")
                axes[row][g].grid(True, which="both", alpha=0.3)
        axes[0][2].legend(fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))
        fig.suptitle("Attention backward error vs sequence length (vs attnref's backward in MPFR, 133 bits)")
        save(fig, f"{out}/backward_vs_length.svg")


if __name__ == "__main__":
    main(sys.argv)
