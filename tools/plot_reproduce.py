#!/usr/bin/python3
"""Plots of `attnref study --reproduce` (docs/studies-reproduced.md). Needs matplotlib (Debian:
python3-matplotlib).

    /usr/bin/python3 tools/plot_reproduce.py DIR/pcast_fp8.csv DIR [--png]
    /usr/bin/python3 tools/plot_reproduce.py DIR/flash_bf16.csv DIR [--png]

pcast_fp8.csv  -> pcast_fp8_underflow.svg   underflow fraction vs sink strength D: the paper's closed form
                                             Phi(D + d_k - c_F - ln S) (lines), attnref's forward order
                                             (filled, 95% CI bars) and reverse order (hollow), per S
                  pcast_fp8_mse.svg         output MSE forward / reverse vs D with 95% CI, the paper's 3-10x band
                  pcast_fp8_sensitivity.svg forward e4m3 underflow minus the closed form, per variant
                                             (n, block, sinks, placement, inputs), and the reverse-order
                                             flushed fraction at S = 256
flash_bf16.csv -> flash_bf16.svg            RMS deviation ratio flash / baseline vs n with 95% CI, the
                                             paper's ~10x drawn in; per variant
--png also writes a PNG of each figure (for looking at them). SVG output is deterministic.
"""
import csv
import math
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402

plt.rcParams["svg.hashsalt"] = "attnref"
plt.rcParams["svg.fonttype"] = "path"

PNG = False


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None, "Creator": "attnref tools/plot_reproduce.py"})
    if PNG:
        fig.savefig(path[:-4] + ".png", dpi=80)
    plt.close(fig)


def finish_axes(ax, xlabel, ylabel, title, legend=None, xlog2=False, ylog=True):
    """Axis scales (log2 x when xlog2, log y when ylog), labels, title, legend (its keyword
    arguments) and the light grid every figure uses."""
    if xlog2:
        ax.set_xscale("log", base=2)
    if ylog:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(**(legend or {}))
    ax.grid(True, alpha=0.3)


def phi(x):
    return 0.5 * math.erfc(-x / math.sqrt(2))


def pcast(rows, out):
    f = lambda r, k: float(r[k])  # noqa: E731
    main = [r for r in rows if r["label"] == "main"]
    kernels = sorted({(r["format"], f(r, "scale")) for r in main}, key=lambda k: (k[0], k[1]))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    # 1. underflow vs D, linear and log axes
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, log in zip(axes, (False, True)):
        for i, (fmt, s) in enumerate(kernels):
            c = colours[i % len(colours)]
            fw = sorted([r for r in main if r["format"] == fmt and f(r, "scale") == s and r["order"] == "forward"], key=lambda r: f(r, "delta"))
            rv = sorted([r for r in main if r["format"] == fmt and f(r, "scale") == s and r["order"] == "reverse"], key=lambda r: f(r, "delta"))
            d = [f(r, "delta") for r in fw]
            dense = [x / 10 for x in range(int(d[0] * 10), int(d[-1] * 10) + 1)]
            # closed form from the CSV's own curve parameters: c_F + ln S - d_k recovered at the first point
            shift = f(fw[0], "delta") - inverse_phi(f(fw[0], "closed_form")) if 0 < f(fw[0], "closed_form") < 1 else None
            if shift is not None:
                ax.plot(dense, [phi(x - shift) for x in dense], "-", color=c, lw=1.2,
                        label=f"paper: Φ(Δ+δ_k−c_F−ln S), {fmt} S={s:g}")
            y = [f(r, "underflow") for r in fw]
            err = [[max(f(r, "underflow") - f(r, "underflow_lo"), 0) for r in fw], [f(r, "underflow_hi") - f(r, "underflow") for r in fw]]
            ax.errorbar(d, y, yerr=err, fmt="o", color=c, ms=4, capsize=2, label=f"attnref forward, {fmt} S={s:g}")
            ax.plot([f(r, "delta") for r in rv], [f(r, "underflow") for r in rv], "s", mfc="none", color=c, ms=6,
                    label=f"attnref reverse, {fmt} S={s:g}")
        ax.set_xlabel("sink strength Δ (sink logits Δ above the others)")
        ax.set_ylabel("fraction of non-sink P values flushed to 0")
        if log:
            ax.set_yscale("log")
            ax.set_ylim(1e-6, 1.5)
            ax.set_title("log scale (zeros not shown)")
        else:
            ax.set_title("FP8 P-cast underflow, forward vs reverse key-block order")
            ax.legend(fontsize=6, ncol=1, loc="lower right")
        ax.grid(True, alpha=0.3)
    r0 = main[0]
    fig.text(0.01, 0.005, f"n={r0['seq']}, blocks of {r0['block']}, k_sink={r0['sinks']} ({r0['placement']}), logits N(0,1), "
             f"{r0['rows']} rows; bars: 95% CI over rows", fontsize=7)
    save(fig, f"{out}/pcast_fp8_underflow.svg")

    # 2. MSE ratio forward / reverse
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    ax.axhspan(3, 10, color="0.85", label="paper: 3–10× at moderate Δ")
    for i, (fmt, s) in enumerate(kernels):
        c = colours[i % len(colours)]
        fw = sorted([r for r in main if r["format"] == fmt and f(r, "scale") == s and r["order"] == "forward"], key=lambda r: f(r, "delta"))
        d = [f(r, "delta") for r in fw]
        y = [f(r, "mse_ratio") for r in fw]
        err = [[max(f(r, "mse_ratio") - max(f(r, "mse_ratio_lo"), 1e-3), 0) for r in fw], [f(r, "mse_ratio_hi") - f(r, "mse_ratio") for r in fw]]
        ax.errorbar(d, y, yerr=err, fmt="o-", color=c, ms=4, capsize=2, label=f"attnref {fmt} S={s:g}")
    ax.axhline(1, color="k", lw=0.6)
    finish_axes(ax, "sink strength Δ", "output MSE, forward / reverse order",
                "FP8 P-cast: forward vs reverse key-block order (95% CI)", {"fontsize": 7})
    save(fig, f"{out}/pcast_fp8_mse.svg")

    # 3. sensitivity: forward e4m3 S=1 minus closed form; reverse S=256 flushed fraction
    labels = []
    for r in rows:
        if r["label"] not in labels:
            labels.append(r["label"])
    if len(labels) > 1:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
        for i, lab in enumerate(labels):
            sel = [r for r in rows if r["label"] == lab and r["format"] == "e4m3"]
            fw = sorted([r for r in sel if f(r, "scale") == 1 and r["order"] == "forward"], key=lambda r: f(r, "delta"))
            rv = sorted([r for r in sel if f(r, "scale") == 256 and r["order"] == "reverse"], key=lambda r: f(r, "delta"))
            r0 = fw[0]
            name = f"{lab} (n={r0['seq']}, b={r0['block']}, k={r0['sinks']}, {r0['placement']})"
            style = "-" if i < 10 else "--"
            axes[0].plot([f(r, "delta") for r in fw], [f(r, "underflow") - f(r, "closed_form") for r in fw], "o" + style, ms=3,
                         label=name, color=colours[i % len(colours)])
            axes[1].plot([f(r, "delta") for r in rv], [max(f(r, "underflow"), 1e-7) for r in rv], "o" + style, ms=3,
                         label=name, color=colours[i % len(colours)])
        axes[0].axhline(0, color="k", lw=1, label="paper's closed form (difference 0)")
        axes[0].set_xlabel("sink strength Δ")
        axes[0].set_ylabel("measured − Φ(Δ+δ_k−6.93)")
        axes[0].set_title("forward order, e4m3, S = 1")
        axes[0].legend(fontsize=6)
        axes[1].set_yscale("log")
        axes[1].axhline(1e-7, color="k", lw=1, ls=":", label="paper: no underflow (drawn at 1e-7)")
        axes[1].set_xlabel("sink strength Δ")
        axes[1].set_ylabel("fraction of non-sink P values flushed to 0")
        axes[1].set_title("reverse order, e4m3, S = 256")
        axes[1].legend(fontsize=6)
        for ax in axes:
            ax.grid(True, alpha=0.3)
        save(fig, f"{out}/pcast_fp8_sensitivity.svg")


def inverse_phi(p):
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if phi(mid) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def flash(rows, out):
    f = lambda r, k: float(r[k])  # noqa: E731
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    ax = axes[0]
    ax.axhline(10, color="0.3", lw=6, alpha=0.25, label="paper: flash ≈ 10× baseline")
    ax.axhline(1, color="k", lw=0.6)
    groups = defaultdict(list)
    for r in rows:
        if r["kernel"] in ("flash", "flash_pure", "baseline_p"):
            groups[(r["label"], r["kernel"])].append(r)
    drawn = [kv for kv in sorted(groups.items(), key=lambda kv: (kv[0][0] != "main", kv[0])) if kv[0][1] == "flash" or kv[0][0] == "main"]
    for i, ((lab, kern), rs) in enumerate(drawn):
        rs = sorted(rs, key=lambda r: int(r["seq"]))
        n = [int(r["seq"]) for r in rs]
        y = [f(r, "rms_ratio") for r in rs]
        err = [[f(r, "rms_ratio") - f(r, "rms_ratio_lo") for r in rs], [f(r, "rms_ratio_hi") - f(r, "rms_ratio") for r in rs]]
        name = {"flash": "flash / baseline", "flash_pure": "flash / baseline, all ops in bf16",
                "baseline_p": "baseline with S in fp32 / baseline"}[kern]
        ax.errorbar(n, y, yerr=err, fmt="o-" if lab == "main" else "s--", ms=4, capsize=2, color=colours[i % len(colours)],
                    label=f"attnref {name} [{lab}]")
        for x, v in zip(n, y):
            if lab == "main":
                ax.annotate(f"{v:.2g}", (x, v), textcoords="offset points", xytext=(4, 4), fontsize=6)
    finish_axes(ax, "sequence length n (keys)", "RMS deviation from float64, ratio",
                "bf16 FlashAttention vs materialised baseline (95% CI)", {"fontsize": 6}, xlog2=True)
    ax = axes[1]
    main = [r for r in rows if r["label"] == "main"]
    for i, kern in enumerate(["flash", "baseline", "baseline_p", "flash_pure", "baseline_pure"]):
        rs = sorted([r for r in main if r["kernel"] == kern], key=lambda r: int(r["seq"]))
        if not rs:
            continue
        ax.plot([int(r["seq"]) for r in rs], [f(r, "rms_dev") for r in rs], "o-" if "pure" not in kern else "^--", ms=4,
                color=colours[i % len(colours)], label=f"{kern} RMS")
        ax.plot([int(r["seq"]) for r in rs], [f(r, "max_dev") for r in rs], ":", color=colours[i % len(colours)], alpha=0.7,
                label=f"{kern} max")
    finish_axes(ax, "sequence length n (keys)", "|output − float64 reference|",
                f"deviation per kernel (main: dk = {main[0]['head_dim']}, blocks of {main[0]['block']})", {"fontsize": 6, "ncol": 2},
                xlog2=True)
    save(fig, f"{out}/flash_bf16.svg")


def main(argv):
    global PNG
    args = [a for a in argv[1:] if a != "--png"]
    PNG = "--png" in argv
    if len(args) != 2:
        sys.exit("usage: plot_reproduce.py pcast_fp8.csv|flash_bf16.csv OUTDIR [--png]")
    rows = list(csv.DictReader(open(args[0])))
    if not rows:
        sys.exit("plot_reproduce.py: no rows in " + args[0])
    if "closed_form" in rows[0]:
        pcast(rows, args[1])
    else:
        flash(rows, args[1])


if __name__ == "__main__":
    main(sys.argv)
