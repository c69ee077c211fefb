#!/usr/bin/python3
"""GPU conformance: PyTorch 2.x SDPA backends (flash, memory-efficient, cuDNN, math) and JAX
`dot_product_attention` on CUDA, judged like the CPU adapters (conform.py). Without CUDA it prints one
line and exits 0. Not yet run (docs/conformance.md):

    /usr/bin/python3 tools/conform/gpu.py --markdown docs/conformance-gpu.md --json docs/conformance-gpu.json

Mapping: scale → `scale=`; causal top_left (offset 0) → `is_causal=True`, any other causal, window,
key lengths, boolean and additive masks, ALiBi → one `attn_mask` (bool when only a boolean mask,
else float in the compute dtype, -inf where masked); GQA → `enable_gqa=True` (torch ≥ 2.5);
softcap and the seed mask are not expressible; empty rows: the backend's own (re-judged).
"""
import argparse
import datetime
import json
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

from common import Unsupported, combined_float_bias  # noqa: E402


def _torch_dt(t, fmt):
    return {"float32": t.float32, "bfloat16": t.bfloat16, "float16": t.float16}[fmt]


class TorchSDPA:
    formats = ("float32", "bfloat16", "float16")
    empty_rows = ("zero", "nan")

    def __init__(self, backend):
        self.backend = backend
        self.name = f"pytorch-sdpa-{backend}"
        self.title = f"PyTorch SDPA on CUDA, backend {backend} (torch.nn.attention.sdpa_kernel)"

    def run(self, case, fmt, out):
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from common import save_bf16
        if case.kind != "sdpa" or case.backward:
            raise Unsupported("forward sdpa cases only")
        cv = case.cv
        if cv["softcap"] is not None:
            raise Unsupported("softcap")
        if cv["seed_mask"]:
            raise Unsupported("seed mask")
        dt = _torch_dt(torch, fmt)
        dev = "cuda"
        q, k, v = (torch.tensor(case.load(r), dtype=dt, device=dev) for r in ("query", "key", "value"))
        is_causal = bool(cv["causal"]) and case.offset() == 0 and cv["causal_alignment"] == "top_left"
        allowed = case.structural_allowed(include_causal=not is_causal)
        mask = None
        if cv["boolean_mask"] and not (cv["additive_mask"] or cv["alibi_slopes"]):
            mask = torch.tensor(allowed, device=dev)
        else:
            b = combined_float_bias(case, {"float32": np.float32, "float16": np.float16, "bfloat16": np.float32}[fmt],
                                    allowed, "attn_mask values")
            if b is not None:
                mask = torch.tensor(b, dtype=dt, device=dev)
        be = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
              "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[self.backend]
        try:
            with sdpa_kernel(be):
                o = torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, is_causal=is_causal, scale=case.scale() if cv["scale"] is not None else None,
                    enable_gqa=case.H != case.Hkv)
        except RuntimeError as e:
            raise Unsupported(f"backend refused: {str(e).splitlines()[0][:120]}")
        o = o.cpu()
        path = f"{out}/output.npy"
        if fmt == "bfloat16":
            save_bf16(path, o)
        else:
            np.save(path, o.numpy())
        return {"output": path}, []


class JaxDPA:
    formats = ("float32", "bfloat16", "float16")
    empty_rows = ("zero", "nan")
    name = "jax-dot-product-attention"
    title = "JAX jax.nn.dot_product_attention on CUDA (B, S, H, d layout, transposed explicitly)"

    def run(self, case, fmt, out):
        import jax
        import jax.numpy as jnp
        if case.kind != "sdpa" or case.backward:
            raise Unsupported("forward sdpa cases only")
        cv = case.cv
        if cv["softcap"] is not None or cv["seed_mask"]:
            raise Unsupported("softcap or seed mask")
        dt = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}[fmt]
        t = lambda r: jnp.asarray(case.load(r).transpose(0, 2, 1, 3), dtype=dt)
        is_causal = bool(cv["causal"]) and case.offset() == 0
        allowed = case.structural_allowed(include_causal=not is_causal)
        bias = combined_float_bias(case, np.float32 if fmt != "float16" else np.float16, allowed, "bias values")
        o = jax.nn.dot_product_attention(t("query"), t("key"), t("value"),
                                         bias=None if bias is None else jnp.asarray(bias, dtype=dt),
                                         scale=case.scale() if cv["scale"] is not None else None, is_causal=is_causal)
        o = np.asarray(o.astype(jnp.float32)).transpose(0, 2, 1, 3)
        path = f"{out}/output.npy"
        if fmt == "bfloat16":
            import torch
            from common import save_bf16
            save_bf16(path, torch.tensor(o).to(torch.bfloat16))
        else:
            np.save(path, o.astype("<f4" if fmt == "float32" else "<f2"))
        return {"output": path}, []


def main():
    import conform
    import report
    ap = argparse.ArgumentParser(description="GPU conformance (CUDA)")
    ap.add_argument("--attnref", default=os.path.join(conform.ROOT, "build", "default", "verify", "attnref"))
    ap.add_argument("--golden-dir", default=os.path.join(conform.ROOT, "golden"))
    ap.add_argument("--markdown")
    ap.add_argument("--json")
    ap.add_argument("--work")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    impls, missing = [], []
    try:
        import torch
        if torch.cuda.is_available():
            impls += [TorchSDPA(b) for b in ("flash", "efficient", "cudnn", "math")]
        else:
            missing.append("PyTorch CUDA: not available")
    except ImportError:
        missing.append("PyTorch: not installed")
    try:
        import jax
        if any(d.platform == "gpu" for d in jax.devices()):
            impls.append(JaxDPA())
        else:
            missing.append("JAX CUDA: not available")
    except Exception:
        missing.append("JAX: not installed")
    if not impls:
        print("gpu.py: skipped (no CUDA: " + "; ".join(missing) + ")")
        return 0
    args.impl = args.case = args.only = None
    impls, entries, _, work = conform.run_all(args, impls, missing)
    import explanations
    res = {"schema": "attnref.conformance", "schema_version": 1, "date": datetime.date.today().isoformat(),
           "machine": platform.machine() + " " + platform.system() + " + CUDA",
           "command": "/usr/bin/python3 tools/conform/gpu.py --markdown docs/conformance-gpu.md --json docs/conformance-gpu.json",
           "versions": conform.versions(), "skipped_implementations": missing, "tables": []}
    for impl in impls:
        for fmt in impl.formats:
            rows = [conform.row_of(e, explanations.explain) for e in entries if e["impl"] is impl and e["format"] == fmt]
            res["tables"].append({"implementation": impl.name, "title": impl.title, "format": fmt, "rows": rows})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report.markdown(res))
    print(f"gpu.py: {sum(len(t['rows']) for t in res['tables'])} rows (work: {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
