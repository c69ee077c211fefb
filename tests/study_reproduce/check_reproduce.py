#!/usr/bin/python3
"""Checks `attnref study --reproduce ... --reduced` against independent computations (tests/study_reproduce.cmake).

    check_reproduce.py pcast DIR/pcast_fp8.csv
    check_reproduce.py flash DIR/flash_bf16.csv

pcast: the expected underflow fraction of a row is P(z < M - c_F - ln S) with z ~ N(0, 1) a non-sink logit
       and M = Δ + max of k_sink N(0, 1) the running max the sinks set (forward order, sinks in the first
       key block). Its mean over rows, E_M[Φ(M − c_F − ln S)], and its standard error over `rows` rows are
       computed here by quadrature (statistics.NormalDist); the measured fraction must lie within 4.5
       standard errors plus the bound (n − k)·E_M[Q(M)] on the chance that a non-sink logit exceeds the
       sinks' max and raises the running max. The CSV's closed form must equal Φ(Δ + δ_k − c_F − ln S) with
       c_F = 10 ln 2 (e4m3) or 17 ln 2 (e5m2) and δ_k = E[max], and the measured fraction must lie within
       |E_M[Φ] − closed form| + the same tolerance of it (the paper's curve, as far as sampling and the
       sinks' random max allow). Reverse order, S = 256: no flushed weight outside the sinks' key block, and the
       fraction within the model's (b − k)/(n − k) share. Sinks last: forward order flushes nothing at
       S = 256 outside the sinks' block. MSE (e4m3, S = 1): the largest forward/reverse ratio's 95% interval
       above 1, and the ratio within [0.5, 2] at Δ = 0 (no sink effect).
flash: recomputes flash (online softmax in blocks, fp32, P rounded to bf16 per block) and the
       materialised baseline (S and P rounded to bf16) in numpy float32 from the same generated inputs
       (the generator's normal recipe re-implemented here) and checks attnref's RMS deviations from the
       float64 reference agree within 10%, and that numpy's flash/baseline ratio lies in attnref's 95%
       interval widened by 10%.
"""
import csv
import math
import statistics
import sys

N01 = statistics.NormalDist()
LN2 = math.log(2)
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


def max_density(t, k):
    return k * N01.pdf(t) * N01.cdf(t) ** (k - 1)


def quad(fun, k, lo=-9.0, hi=9.0, steps=9000):
    h = (hi - lo) / steps
    s = 0.0
    for i in range(steps + 1):
        t = lo + i * h
        s += (0.5 if i in (0, steps) else 1.0) * fun(t) * max_density(t, k)
    return s * h


def pcast(path):
    rows = list(csv.DictReader(open(path)))
    check(len(rows) > 0, "no rows")
    f = lambda r, key: float(r[key])  # noqa: E731
    deltas_k = {}
    for r in rows:
        k, n, b, rows_n = int(r["sinks"]), int(r["seq"]), int(r["block"]), int(r["rows"])
        if k not in deltas_k:
            deltas_k[k] = quad(lambda t: t, k)
        c = (10 if r["format"] == "e4m3" else 17) * LN2 + math.log(f(r, "scale"))
        delta = f(r, "delta")
        closed = N01.cdf(delta + deltas_k[k] - c)
        check(abs(f(r, "closed_form") - closed) <= 1e-6 + 1e-4 * closed, f"closed form {r['label']} {r['format']} S={r['scale']} Δ={delta}: CSV {r['closed_form']} vs {closed}")
        if r["placement"] != "first" and not (r["placement"] == "last" and r["order"] == "forward"):
            continue
        # model for the rows whose non-sink keys are rounded after the sinks set the running max
        mean = quad(lambda t: N01.cdf(delta + t - c), k)
        second = quad(lambda t: N01.cdf(delta + t - c) ** 2, k)
        within = quad(lambda t: N01.cdf(delta + t - c) * (1 - N01.cdf(delta + t - c)), k) / (n - k)
        se = math.sqrt(max(second - mean * mean + within, 0) / rows_n)
        raise_max = min(1.0, (n - k) * quad(lambda t: 1 - N01.cdf(delta + t), k))
        tol = 4.5 * se + raise_max + 1e-9
        got = f(r, "underflow")
        where = f"{r['label']} {r['format']} S={r['scale']} {r['order']} Δ={delta}"
        if r["placement"] == "first" and r["order"] == "forward":
            check(abs(got - mean) <= tol, f"forward underflow {where}: {got} vs model {mean} ± {tol}")
            check(abs(got - closed) <= abs(mean - closed) + tol, f"forward underflow vs closed form {where}: {got} vs {closed}")
        elif r["placement"] == "first" and r["order"] == "reverse" and f(r, "scale") == 256:
            check(f(r, "underflow_outside") == 0, f"reverse order flushed weights outside the sinks' block: {where}")
            share = (b - k) / (n - k)
            check(abs(got - share * mean) <= share * tol + 1e-9, f"reverse underflow {where}: {got} vs model {share * mean}")
        elif r["placement"] == "last" and f(r, "scale") == 256:
            check(f(r, "underflow_outside") == 0, f"sinks last, forward order, S = 256 flushed weights outside the sinks' block: {where}")
        if r["order"] == "forward" and r["placement"] == "first" and r["format"] == "e4m3" and f(r, "scale") == 1:
            if delta == 0:
                check(0.5 <= f(r, "mse_ratio") <= 2, f"MSE ratio at Δ = 0 not near 1: {where}: {r['mse_ratio']}")
    # forward order is worse somewhere (reverse order implemented): the largest ratio's interval above 1
    fw = [r for r in rows if r["label"] == "main" and r["order"] == "forward" and r["format"] == "e4m3" and f(r, "scale") == 1]
    best = max(fw, key=lambda r: f(r, "mse_ratio"))
    check(f(best, "mse_ratio_lo") > 1, f"MSE forward/reverse: no Δ with the interval above 1 (largest {best['mse_ratio']} at Δ={best['delta']})")


# ---- flash vs baseline, numpy emulation -------------------------------------------------------
M64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15
ROLE = {"query": 1, "key": 2, "value": 3}


def mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


A = [-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02, 1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00]
B = [-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02, 6.680131188771972e+01, -1.328068155288572e+01]
C = [-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00, -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00]
D = [7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00]


def inv_normal(p):
    def tail(t):
        q = math.sqrt(-2 * math.log(t))
        return (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5]) / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1)
    if p < 0.02425:
        return tail(p)
    if p > 1 - 0.02425:
        return -tail(1 - p)
    q = p - 0.5
    r = q * q
    return (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1)


def normals(seed, role, count):
    stream = mix(seed ^ ((ROLE[role] * GAMMA) & M64))
    return [inv_normal(((mix((stream + (i + 1) * GAMMA) & M64) >> 12) + 0.5) * 2.0**-52) for i in range(count)]


def flash(path):
    import numpy as np

    def bf16(x):
        b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
        b = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
        return b.view(np.float32)

    rows = list(csv.DictReader(open(path)))
    main = [r for r in rows if r["label"] == "main"]
    check(len(main) > 0, "no main rows")
    seqs = sorted({int(r["seq"]) for r in main})
    d, block = int(main[0]["head_dim"]), int(main[0]["block"])
    nrows = int(main[0]["rows"])
    seeds = [1, 2] if nrows == 32 else None
    check(seeds is not None, f"expected the reduced sample (2 seeds × 16 rows), got {nrows} rows")
    if seeds is None:
        return
    sq = 16
    for n in seqs:
        err = {"flash": [], "baseline": []}
        for seed in seeds:
            q = bf16(np.array(normals(seed, "query", sq * d)).reshape(sq, d))
            k = bf16(np.array(normals(seed, "key", n * d)).reshape(n, d))
            v = bf16(np.array(normals(seed, "value", n * d)).reshape(n, d))
            q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
            s64 = (q64 @ k64.T) / math.sqrt(d)
            p64 = np.exp(s64 - s64.max(axis=1, keepdims=True))
            ref = (p64 / p64.sum(axis=1, keepdims=True)) @ v64
            scale = np.float32(1 / math.sqrt(d))
            s = (q @ k.T).astype(np.float32) * scale
            # baseline: S and P in bf16, fp32 arithmetic, bf16 output
            sb = bf16(s)
            e = np.exp(sb - sb.max(axis=1, keepdims=True))
            pb = bf16(e / e.sum(axis=1, keepdims=True, dtype=np.float32))
            ob = bf16(pb @ v)
            # flash: online softmax over key blocks, P rounded to bf16 per block
            m = np.full((sq, 1), -np.inf, dtype=np.float32)
            l = np.zeros((sq, 1), dtype=np.float32)
            o = np.zeros((sq, d), dtype=np.float32)
            for j in range(0, n, block):
                sj = s[:, j:j + block]
                mn = np.maximum(m, sj.max(axis=1, keepdims=True))
                factor = np.exp(m - mn).astype(np.float32)
                pj = np.exp(sj - mn).astype(np.float32)
                l = l * factor + pj.sum(axis=1, keepdims=True, dtype=np.float32)
                o = o * factor + bf16(pj) @ v[j:j + block]
                m = mn
            of = bf16(o / l)
            err["flash"].append((of.astype(np.float64) - ref) ** 2)
            err["baseline"].append((ob.astype(np.float64) - ref) ** 2)
        rms = {key: math.sqrt(float(np.mean(np.concatenate(val)))) for key, val in err.items()}
        got = {r["kernel"]: r for r in main if int(r["seq"]) == n}
        for key in ("flash", "baseline"):
            a = float(got[key]["rms_dev"])
            check(abs(a / rms[key] - 1) <= 0.10, f"n={n} {key}: attnref RMS deviation {a:.4e} vs numpy {rms[key]:.4e}")
        ratio = rms["flash"] / rms["baseline"]
        lo, hi = float(got["flash"]["rms_ratio_lo"]), float(got["flash"]["rms_ratio_hi"])
        check(lo / 1.1 <= ratio <= hi * 1.1, f"n={n}: numpy flash/baseline ratio {ratio:.3f} outside attnref's interval [{lo:.3f}, {hi:.3f}]")
        print(f"n={n}: RMS flash {rms['flash']:.3e} baseline {rms['baseline']:.3e} (numpy); attnref ratio {got['flash']['rms_ratio']}, numpy {ratio:.3f}")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("pcast", "flash"):
        sys.exit("usage: check_reproduce.py pcast|flash CSV")
    (pcast if sys.argv[1] == "pcast" else flash)(sys.argv[2])
    for fail in failures:
        print("FAIL:", fail)
    print(f"{len(failures)} failure(s)")
    sys.exit(1 if failures else 0)
