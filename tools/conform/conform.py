#!/usr/bin/python3
"""Conformance of real attention implementations, judged by `attnref check` on the golden suite.

    /usr/bin/python3 tools/conform/conform.py --attnref build/default/verify/attnref \
        --markdown docs/conformance.md --json docs/conformance.json

runs every adapter (PyTorch CPU, the seed chapter's NumPy class, ONNX Runtime through Node when
tools/conform/node_modules holds onnxruntime-node) over every committed case whose conventions it can
express, in each format it supports, writes each implementation's outputs as .npy in its own dtype,
and judges them with `attnref check --json`. A FAIL that re-judging under the implementation's own
convention turns into PASS is labelled "convention: …" (the re-judged case is derived from the
committed one: `attnref generate --golden` on a copy whose manifest names the implementation's
convention, or an ad-hoc `--inputs-from` case). `--compare FILE` compares the verdicts with a
committed JSON and exits 1 on any change (CTest conformance_cpu). `--only IMPL:FORMAT:CASE` reruns one
entry and prints the check's table (the reproducer of the tables' rows).
"""
import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import Case, Unsupported, list_cases  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))


def implementations(want):
    impls, missing = [], []
    try:
        import torch  # noqa: F401
        import adapter_torch
        impls += [adapter_torch.Eager(), adapter_torch.Module(), adapter_torch.Functional()]
    except ImportError:
        missing.append("PyTorch: skipped (python3-torch is not installed)")
    import adapter_seed
    impls.append(adapter_seed.Seed())
    import adapter_ort
    why = adapter_ort.unavailable()
    if why:
        missing.append("ONNX Runtime: skipped (" + why + ")")
    else:
        impls += adapter_ort.implementations()
    if want:
        impls = [i for i in impls if i.name in want]
    return impls, missing


def versions():
    v = {"python": platform.python_version()}
    import numpy
    v["numpy"] = numpy.__version__
    try:
        import torch
        v["torch"] = torch.__version__
    except ImportError:
        pass
    import adapter_ort
    ort = adapter_ort.version()
    if ort:
        v["onnxruntime-node"] = ort
    return v


class Judge:
    def __init__(self, attnref):
        self.attnref = attnref

    def check(self, golden, files, extra, report):
        argv = [self.attnref, "check", "--golden", golden]
        for role, path in files.items():
            argv += ["--" + role.replace("_", "-"), path]
        argv += extra + ["--json", report, "--force"]
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode not in (0, 1) or not os.path.exists(report):
            return {"verdict": "ERROR", "reason": (r.stderr or r.stdout).strip().splitlines()[-1:]}, argv, r.stdout
        with open(report) as f:
            return json.load(f), argv, r.stdout

    def generate_variant(self, case, edits, out_root):
        """The committed case with some conventions changed, regenerated and certified by attnref."""
        d = os.path.join(out_root, case.name)
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(case.dir, d)
        with open(os.path.join(d, "manifest.json")) as f:
            m = json.load(f)
        m["conventions"].update(edits)
        with open(os.path.join(d, "manifest.json"), "w") as f:
            json.dump(m, f, indent=2)
        r = subprocess.run([self.attnref, "generate", "--golden", d, "--force", "--quiet"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise RuntimeError("generate --golden failed: " + r.stderr.strip())
        return d

    def generate_ad_hoc(self, name, inputs_dir, flags, out_root):
        r = subprocess.run([self.attnref, "generate", "--name", name, "--inputs-from", inputs_dir, "--out", out_root,
                            "--force", "--quiet"] + flags, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise RuntimeError("generate --inputs-from failed: " + r.stderr.strip())
        return os.path.join(out_root, name)


def summary_of(report):
    ts = report.get("tensors", [])
    out = [t for t in ts if t["name"] == "output"]
    def num(x):
        try:
            return float(x)
        except (TypeError, ValueError):
            return float("nan")
    worst = max((num(t.get("worst_in_bound_units")) for t in ts), default=None, key=lambda x: -1 if x != x else x)
    failing = [t["name"] for t in ts if t.get("verdict") not in ("pass", None)]
    failing += [i.get("name", "?") for i in report.get("invariants", []) if i.get("verdict") not in ("pass", None)]
    return {"max_abs_error": out[0]["max_abs_error"] if out else (ts[0]["max_abs_error"] if ts else None),
            "worst_in_bound_units": worst, "failing": failing, "reason": report.get("reason", "")}


FORWARD_ROLES = ("output", "weights", "lse")


def rejudge(judge, impl, case, fmt, files, extra, work):
    """A FAIL re-judged under the implementation's own convention: (label, detail) or None."""
    vroot = os.path.join(work, "variants", impl.name, fmt)
    os.makedirs(vroot, exist_ok=True)
    conventions = getattr(impl, "empty_rows", None) or ()
    if isinstance(conventions, str):
        conventions = (conventions,)
    if case.has_empty_rows():
        for conv in conventions:
            if conv == case.cv["empty_rows"]:
                continue
            d = judge.generate_variant(case, {"empty_rows": conv}, os.path.join(vroot, conv))
            rep, _, _ = judge.check(d, files, extra, os.path.join(vroot, conv, case.name + ".json"))
            if rep.get("verdict") == "PASS":
                return (f"convention: empty rows {conv} only",
                        f"PASS when the case's empty rows are {conv} (attnref generate --golden on a copy "
                        f"with conventions.empty_rows = \"{conv}\")")
        back = getattr(impl, "empty_rows_backward", None)
        if case.backward and back and conventions:
            fwd = {r: p for r, p in files.items() if r in FORWARD_ROLES}
            grads = {r: p for r, p in files.items() if r not in FORWARD_ROLES}
            df = judge.generate_variant(case, {"empty_rows": conventions[0]}, os.path.join(vroot, "f-" + conventions[0]))
            db = judge.generate_variant(case, {"empty_rows": back}, os.path.join(vroot, "b-" + back))
            rf, _, _ = judge.check(df, fwd, [], os.path.join(vroot, "f-" + conventions[0], case.name + ".json"))
            rb, _, _ = judge.check(db, grads, extra, os.path.join(vroot, "b-" + back, case.name + ".json"))
            if rf.get("verdict") == "PASS" and rb.get("verdict") == "PASS":
                return (f"convention: empty rows {conventions[0]} forward, {back} gradients",
                        f"the forward PASSes against the case with empty rows {conventions[0]}, the gradients "
                        f"against the case with empty rows {back} (masked_fill's backward zeroes the masked "
                        "logits' gradient)")
    mask01 = getattr(impl, "seed_style_mask", None)
    if mask01 and case.kind == "sdpa":
        m = mask01(case)
        if m is not None:
            d = seed_style_case(judge, case, m, vroot)
            rep, _, _ = judge.check(d, files, extra, os.path.join(vroot, case.name + "_seed.json"))
            if rep.get("verdict") == "PASS":
                return (f"convention: masked keys {impl.mask_words}",
                        "PASS against the ad-hoc case (generate --inputs-from --seed-mask) whose seed mask is 1 "
                        "where this case masks a key: a fully masked row keeps softmax(logits)")
    return None


def seed_style_case(judge, case, mask01, vroot):
    import numpy as np
    inputs = os.path.join(vroot, case.name + "_inputs")
    os.makedirs(inputs, exist_ok=True)
    for r in ("query", "key", "value"):
        shutil.copy(os.path.join(case.dir, r + ".npy"), inputs)
    np.save(os.path.join(inputs, "seed_mask.npy"), mask01.astype("<f8"))
    flags = ["--kind", "sdpa", "--seed-mask"]
    if case.cv["scale"] is not None:
        flags += ["--scale", repr(float(case.cv["scale"]))]
    return judge.generate_ad_hoc(case.name + "_seed", inputs, flags, vroot)


def run_all(args, impls=None, missing=()):
    if impls is None:
        impls, missing = implementations(args.impl)
    judge = Judge(args.attnref)
    only = None
    if args.only:
        parts = args.only.split(":")
        if len(parts) != 3:
            sys.exit("--only takes IMPL:FORMAT:CASE")
        only = parts
        impls = [i for i in impls if i.name == parts[0]]
        if not impls:
            sys.exit(f"--only: no implementation {parts[0]} here ({'; '.join(missing) or 'unknown name'})")
    names = list_cases(args.golden_dir)
    if args.case:
        names = [n for n in names if n in args.case]
    if only:
        names = [only[2]]
    work = args.work or tempfile.mkdtemp(prefix="attnref-conform-")
    entries = []
    for impl in impls:
        for fmt in impl.formats:
            if only and fmt != only[1]:
                continue
            for name in names:
                case = Case(os.path.join(args.golden_dir, name))
                out = os.path.join(work, impl.name, fmt, name)
                os.makedirs(out, exist_ok=True)
                e = {"impl": impl, "format": fmt, "case": case, "out": out}
                try:
                    e["files"], e["extra"] = impl.run(case, fmt, out)
                except Unsupported as u:
                    e["skip"] = str(u)
                entries.append(e)
        finish = getattr(impl, "finish", None)
        if finish:
            finish(work)

    def judge_one(e):
        if "skip" in e:
            return
        missing = [p for p in e["files"].values() if not os.path.exists(p)]
        if missing:
            err = os.path.join(e["out"], "error.txt")
            why = open(err).read().strip() if os.path.exists(err) else "no output written"
            e["report"] = {"verdict": "ERROR", "reason": why}
            return
        rep, argv, text = judge.check(e["case"].dir, e["files"], e["extra"], os.path.join(e["out"], "check.json"))
        e["report"], e["argv"], e["text"] = rep, argv, text
        if rep.get("verdict") == "FAIL":
            try:
                e["rejudged"] = rejudge(judge, e["impl"], e["case"], e["format"], e["files"], e["extra"], work)
            except RuntimeError as err:
                e["rejudged"] = None
                e["rejudge_error"] = str(err)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(judge_one, entries))
    return impls, entries, missing, work


def row_of(e, explain):
    case, impl = e["case"], e["impl"]
    r = {"case": case.name}
    if "skip" in e and e["skip"] is not None:
        r.update(verdict="SKIP", label="not expressible", explanation=e["skip"])
        return r
    rep = e["report"]
    s = summary_of(rep) if rep.get("verdict") != "ERROR" else {}
    r["verdict"] = rep.get("verdict", "ERROR")
    r["max_abs_error"] = s.get("max_abs_error")
    r["worst_in_bound_units"] = s.get("worst_in_bound_units")
    if r["verdict"] == "PASS":
        r["label"], r["explanation"] = "pass", ""
    elif r["verdict"] == "ERROR":
        why = rep.get("reason")
        r["label"], r["explanation"] = "error", " ".join(why) if isinstance(why, list) else str(why)
    elif e.get("rejudged"):
        r["label"], r["explanation"] = e["rejudged"]
    else:
        known = explain(impl.name, e["format"], case, s.get("failing", []))
        what = ", ".join(s.get("failing", [])) or "?"
        if known:
            r["label"], r["explanation"] = known[0], f"{what} {r['verdict']}: {known[1]}"
        else:
            r["label"] = "unexplained"
            r["explanation"] = f"{what} {r['verdict']}"
        r["explanation"] += (f" — reproduce: /usr/bin/python3 tools/conform/conform.py --only "
                             f"{impl.name}:{e['format']}:{case.name}")
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attnref", default=os.path.join(ROOT, "build", "default", "verify", "attnref"))
    ap.add_argument("--golden-dir", default=os.path.join(ROOT, "golden"))
    ap.add_argument("--impl", action="append", help="only these implementations (repeatable)")
    ap.add_argument("--case", action="append", help="only these cases (repeatable)")
    ap.add_argument("--only", help="IMPL:FORMAT:CASE: run one entry and print attnref check's table")
    ap.add_argument("--work", help="directory for candidates and reports (default: a new temporary one)")
    ap.add_argument("--markdown", help="write the tables (docs/conformance.md)")
    ap.add_argument("--json", help="write the results (docs/conformance.json)")
    ap.add_argument("--compare", help="compare the verdicts with this JSON; exit 1 on any change")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    if not os.access(args.attnref, os.X_OK):
        sys.exit(f"conform: {args.attnref} is not an executable attnref")
    import explanations
    impls, entries, missing, work = run_all(args)
    for m in missing:
        print(m)
    if args.only:
        for e in entries:
            if "skip" in e and e["skip"] is not None:
                print(f"{e['impl'].name} {e['format']} {e['case'].name}: not expressible: {e['skip']}")
                return 0
            print("$ " + " ".join(e.get("argv", [])))
            print(e.get("text", ""), end="")
            r = row_of(e, explanations.explain)
            print(f"{r['verdict']}  {r['label']}: {r['explanation']}")
            return 0 if r["verdict"] == "PASS" else 1
    result = {"schema": "attnref.conformance", "schema_version": 1,
              "date": datetime.date.today().isoformat(), "machine": platform.machine() + " " + platform.system(),
              "command": "/usr/bin/python3 tools/conform/conform.py --markdown docs/conformance.md --json docs/conformance.json",
              "versions": versions(), "skipped_implementations": missing, "tables": []}
    for impl in impls:
        for fmt in impl.formats:
            rows = [row_of(e, explanations.explain) for e in entries if e["impl"] is impl and e["format"] == fmt]
            result["tables"].append({"implementation": impl.name, "title": impl.title, "format": fmt, "rows": rows})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, sort_keys=False)
            f.write("\n")
    if args.markdown:
        import report
        with open(args.markdown, "w") as f:
            f.write(report.markdown(result))
    status = 0
    if args.compare:
        status = compare(result, args.compare)
    counts = {}
    for t in result["tables"]:
        for r in t["rows"]:
            counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    print("conform: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + f" (work: {work})")
    if not args.work and status == 0:
        shutil.rmtree(work, ignore_errors=True)
    return status


def compare(result, path):
    with open(path) as f:
        old = json.load(f)
    def index(res):
        return {(t["implementation"], t["format"], r["case"]): (r["verdict"], r["label"])
                for t in res["tables"] for r in t["rows"]}
    a, b = index(old), index(result)
    ran = {(t["implementation"], t["format"]) for t in result["tables"]}
    changed = 0
    for key, v in sorted(a.items()):
        if (key[0], key[1]) not in ran:
            continue
        if key not in b:
            print(f"conform: {':'.join(key)} missing (committed {v[0]} {v[1]})")
            changed += 1
        elif b[key] != v:
            print(f"conform: {':'.join(key)} changed: committed {v[0]} ({v[1]}), now {b[key][0]} ({b[key][1]})")
            changed += 1
    for key in sorted(set(b) - set(a)):
        print(f"conform: {':'.join(key)} new: {b[key][0]} ({b[key][1]})")
        changed += 1
    skipped = {(t["implementation"], t["format"]) for t in old["tables"]} - ran
    for s in sorted(skipped):
        print(f"conform: {s[0]} {s[1]} not run here (not compared)")
    print(f"conform: {len(b)} verdicts compared with {path}: {changed} changed")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
