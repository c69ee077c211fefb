"""ONNX Runtime (CPU, onnxruntime-node from the npm registry) adapters: the standard Attention op
(opset 24), com.microsoft MultiHeadAttention and com.microsoft GroupQueryAttention, in float32 and
float16. Models are built with Debian's python3-onnx (onnx.helper; opset and IR version set by hand,
no checker: python3-onnx 1.12 predates the Attention schema) and run by ort_run.js under Node.

Convention mapping (golden/README.md field → ONNX):
  Attention (ai.onnx 24)
    scale                 `scale` attribute only for an explicit scale (a float32 attribute: 0.1 is
                          rounded); otherwise the op's own 1/sqrt(head_size); placement the op's own
    softcap               `softcap` attribute (the op caps before the mask, as attnref does)
    causal                `is_causal=1`; the diagonal offset (bottom_right: Sk − Sq; diagonal_offset)
                          through `past_key`/`past_value` holding the first `offset` keys; a negative
                          offset (bottom_right with Sq > Sk) is not expressible
    key_lengths           `nonpad_kv_seqlen` (opset 24) when no past is used, else -inf mask entries
    boolean mask          a bool `attn_mask` (true = attend; true_means_masked inverted) when it is the
                          only mask; otherwise every mask is one float `attn_mask` in the compute dtype
                          (window, boolean, ALiBi, additive: -inf where masked), refused when not exact
    seed_mask             float `attn_mask` m · (−1e9) (float32 only: −1e9 overflows float16)
    gqa                   4-D inputs with H and H_kv heads (the op repeats kv heads as np.repeat)
    weights               `qk_matmul_output_mode=3` (after softmax) as `--weights`
    empty rows            zero (the op's own convention)
  MultiHeadAttention (com.microsoft): (B, S, H·d) inputs, kv heads repeated for GQA (exact),
    `unidirectional=1` for a causal mask with diagonal(i) = i (top_left, offset 0; or Sq = Sk),
    key_lengths as `key_padding_mask` (B, Sk) int32 (masked logits get `mask_filter_value`, −10000 by
    default), other masks as float `attention_bias` (1, H, Sq, Sk) with -inf; no softcap.
  GroupQueryAttention (com.microsoft): always causal with diagonal(i) = i + Sk − Sq; Sq < Sk through
    past_key/past_value (B, H_kv, Sk − Sq, d); `seqlens_k` = Sk − 1, `total_sequence_length` = Sk;
    `softcap`, `scale`; other masks as float `attention_bias`; dk = dv only.
"""
import json
import os
import shutil
import subprocess

import numpy as np

from common import Unsupported, combined_float_bias

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.join(HERE, "node_modules", "onnxruntime-node", "package.json")


def unavailable():
    if not shutil.which("node"):
        return "node is not installed"
    if not os.path.exists(PKG):
        return "tools/conform/node_modules has no onnxruntime-node: scripts/install-deps.sh installs it"
    try:
        import onnx  # noqa: F401
    except ImportError:
        return "python3-onnx is not installed"
    return None


def version():
    if not os.path.exists(PKG):
        return None
    with open(PKG) as f:
        return json.load(f)["version"]


def _np(fmt):
    return np.float32 if fmt == "float32" else np.float16


def _elem(fmt):
    from onnx import TensorProto as T
    return T.FLOAT if fmt == "float32" else T.FLOAT16


class _Base:
    formats = ("float32", "float16")

    def __init__(self):
        self.jobs = []

    def _job(self, case, fmt, out, node, inputs, outputs, domain_ms=False):
        """Write the model and the raw inputs; the outputs appear after finish()."""
        from onnx import helper, TensorProto as T
        types = {np.dtype(np.float32): (T.FLOAT, "float32"), np.dtype(np.float16): (T.FLOAT16, "float16"),
                 np.dtype(bool): (T.BOOL, "bool"), np.dtype(np.int32): (T.INT32, "int32"),
                 np.dtype(np.int64): (T.INT64, "int64")}
        vis, feeds = [], []
        for name, a in inputs:
            et, tn = types[a.dtype]
            vis.append(helper.make_tensor_value_info(name, et, list(a.shape)))
            path = os.path.join(out, name + ".bin")
            np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tofile(path)
            feeds.append({"name": name, "type": tn, "dims": list(a.shape), "file": path})
        outs = [helper.make_tensor_value_info(n, _elem(fmt), None) for n, _ in outputs]
        g = helper.make_graph([node], case.name, vis, outs)
        ops = [helper.make_opsetid("", 24)]
        if domain_ms:
            ops.append(helper.make_opsetid("com.microsoft", 1))
        m = helper.make_model(g, opset_imports=ops, producer_name="attnref-conform")
        m.ir_version = 10
        with open(os.path.join(out, "model.onnx"), "wb") as f:
            f.write(m.SerializeToString())
        self.jobs.append({"model": os.path.join(out, "model.onnx"), "inputs": feeds,
                          "outputs": [{"name": n, "file": os.path.join(out, n + ".out")} for n, _ in outputs],
                          "result": os.path.join(out, "ort_result.json"), "fmt": fmt,
                          "npy": {n: os.path.join(out, role + ".npy") for n, role in outputs},
                          "reshape": getattr(self, "_reshape", None) and self._reshape(case)})

    def finish(self, work):
        if not self.jobs:
            return
        path = os.path.join(work, self.name + "-jobs.json")
        with open(path, "w") as f:
            json.dump(self.jobs, f)
        subprocess.run(["node", os.path.join(HERE, "ort_run.js"), path], check=False)
        for job in self.jobs:
            try:
                with open(job["result"]) as f:
                    res = json.load(f)
            except (OSError, ValueError):
                res = {"ok": False, "error": "ort_run.js wrote no result"}
            out_dir = os.path.dirname(job["model"])
            if not res["ok"]:
                with open(os.path.join(out_dir, "error.txt"), "w") as f:
                    f.write(res["error"])
                continue
            for o in job["outputs"]:
                info = res["outputs"][o["name"]]
                dt = "<f4" if info["type"] == "float32" else "<f2"
                a = np.fromfile(o["file"], dtype=dt).reshape(info["dims"])
                if job["reshape"] and o["name"] == "Y":
                    B, Sq, H, dv = job["reshape"]
                    a = a.reshape(B, Sq, H, dv).transpose(0, 2, 1, 3)
                np.save(job["npy"][o["name"]], np.ascontiguousarray(a))
        self.jobs = []


class Attention(_Base):
    name = "ort-attention"
    title = "ONNX Runtime CPU (onnxruntime-node), standard Attention op (opset 24)"
    empty_rows = "zero"

    def run(self, case, fmt, out):
        from onnx import helper
        if case.kind != "sdpa":
            raise Unsupported("an mha case (the op takes per-head q, k, v)")
        if case.backward:
            raise Unsupported("no backward")
        dt = _np(fmt)
        cv = case.cv
        attrs = {"qk_matmul_output_mode": 3}
        if cv["scale"] is not None:
            attrs["scale"] = float(cv["scale"])
        if cv["softcap"] is not None:
            attrs["softcap"] = float(cv["softcap"])
        q, k, v = (case.load(r).astype(dt) for r in ("query", "key", "value"))
        past = 0
        allowed = case.structural_allowed(include_key_lengths=False)
        if cv["causal"]:
            past = case.offset()
            if past < 0:
                raise Unsupported("causal diagonal before key 0 (bottom_right with Sq > Sk): past_key offsets are ≥ 0")
            if past > case.Sk:
                raise Unsupported("diagonal offset beyond the keys")
            attrs["is_causal"] = 1
            allowed = case.structural_allowed(include_key_lengths=False, include_causal=False)
        use_nonpad = bool(cv["key_lengths"]) and past == 0
        if cv["key_lengths"] and not use_nonpad:
            for b, n in enumerate(cv["key_lengths"]):
                allowed[b, :, :, n:] = False
        inputs = []
        mask = None
        if cv["seed_mask"]:
            if fmt == "float16":
                raise Unsupported("seed mask −1e9 is not representable in float16 (it would be −inf)")
            mask = np.where(allowed, case.load("seed_mask") * -1e9, -np.inf).astype(np.float32)
        elif cv["boolean_mask"] and not cv["alibi_slopes"] and not cv["additive_mask"] and \
                cv["window"] is None and not cv["causal"]:
            mask = allowed.copy()
        else:
            mask = combined_float_bias(case, dt, allowed, "attn_mask values")
        if past:
            pk, pv = k[:, :, :past], v[:, :, :past]
            k, v = k[:, :, past:], v[:, :, past:]
        inputs = [("Q", q), ("K", k), ("V", v)]
        names = ["Q", "K", "V"]
        names.append("attn_mask" if mask is not None else "")
        if mask is not None:
            inputs.append(("attn_mask", mask))
        if past:
            names += ["past_key", "past_value"]
            inputs += [("past_key", pk), ("past_value", pv)]
        elif use_nonpad:
            names += ["", ""]
        if use_nonpad:
            names.append("nonpad_kv_seqlen")
            inputs.append(("nonpad_kv_seqlen", np.asarray(cv["key_lengths"], dtype=np.int64)))
        while names and names[-1] == "":
            names.pop()
        pres = ["present_key", "present_value"] if past else ["", ""]
        node = helper.make_node("Attention", names, ["Y"] + pres + ["QK"], **attrs)
        self._job(case, fmt, out, node, inputs, [("Y", "output"), ("QK", "weights")])
        return {"output": f"{out}/output.npy", "weights": f"{out}/weights.npy"}, []


def _bsd(x):
    """(B, H, S, d) -> (B, S, H·d)."""
    B, H, S, d = x.shape
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3)).reshape(B, S, H * d)


class MultiHeadAttention(_Base):
    name = "ort-contrib-mha"
    title = "ONNX Runtime CPU (onnxruntime-node), com.microsoft MultiHeadAttention"
    empty_rows = ("zero", "nan", "uniform")
    mask_words = "by key_padding_mask get mask_filter_value (−10000), not −inf"

    def seed_style_mask(self, case):
        """Only when key padding is the case's only mask (it goes through key_padding_mask)."""
        if not case.cv["key_lengths"] or not case.structural_allowed(include_key_lengths=False).all() \
                or case.cv["additive_mask"] or case.cv["alibi_slopes"] or case.cv["seed_mask"]:
            return None
        return (~case.structural_allowed()).astype(float)

    def _reshape(self, case):
        return [case.B, case.Sq, case.H, case.dv]

    def run(self, case, fmt, out):
        from onnx import helper
        cv = case.cv
        if case.kind != "sdpa":
            raise Unsupported("an mha case (the op takes projected q, k, v)")
        if case.backward:
            raise Unsupported("no backward")
        if cv["softcap"] is not None:
            raise Unsupported("softcap")
        dt = _np(fmt)
        attrs = {"num_heads": case.H}
        if cv["scale"] is not None:
            attrs["scale"] = float(cv["scale"])
        rep = case.H // case.Hkv
        q = case.load("query").astype(dt)
        k = np.repeat(case.load("key"), rep, axis=1).astype(dt)
        v = np.repeat(case.load("value"), rep, axis=1).astype(dt)
        allowed = case.structural_allowed(include_key_lengths=False)
        if cv["causal"] and case.offset() == 0 and cv["diagonal_offset"] == 0:
            attrs["unidirectional"] = 1
            allowed = case.structural_allowed(include_key_lengths=False, include_causal=False)
        inputs = [("query", _bsd(q)), ("key", _bsd(k)), ("value", _bsd(v))]
        names = ["query", "key", "value", ""]
        if cv["key_lengths"]:
            kpm = (np.arange(case.Sk)[None, :] < np.asarray(cv["key_lengths"])[:, None]).astype(np.int32)
            names.append("key_padding_mask")
            inputs.append(("key_padding_mask", kpm))
        if cv["seed_mask"]:
            if fmt == "float16":
                raise Unsupported("seed mask −1e9 is not representable in float16 (it would be −inf)")
            bias = np.where(allowed, case.load("seed_mask") * -1e9, -np.inf).astype(np.float32)
        else:
            bias = combined_float_bias(case, dt, allowed, "attention_bias values")
        if bias is not None:
            if len(names) == 4:
                names.append("")
            names.append("attention_bias")
            inputs.append(("attention_bias", bias))
        node = helper.make_node("MultiHeadAttention", names, ["Y"], domain="com.microsoft", **attrs)
        self._job(case, fmt, out, node, inputs, [("Y", "output")], domain_ms=True)
        return {"output": f"{out}/output.npy"}, []


class GroupQueryAttention(_Base):
    name = "ort-contrib-gqa"
    title = "ONNX Runtime CPU (onnxruntime-node), com.microsoft GroupQueryAttention"
    empty_rows = "zero"

    def _reshape(self, case):
        return [case.B, case.Sq, case.H, case.dv]

    def run(self, case, fmt, out):
        from onnx import helper
        cv = case.cv
        if case.kind != "sdpa":
            raise Unsupported("an mha case (the op takes projected q, k, v)")
        if case.backward:
            raise Unsupported("no backward")
        if not cv["causal"]:
            raise Unsupported("not causal (the op is always causal)")
        if case.offset() != case.Sk - case.Sq:
            raise Unsupported("causal diagonal other than i + Sk − Sq (the op's alignment)")
        if case.Sq > case.Sk:
            raise Unsupported("Sq > Sk")
        if case.Sk > case.Sq and case.B > 1 and case.Sq > 1:
            raise Unsupported("Sq < Sk needs past context, which the CPU kernel takes only with batch 1")
        if case.dk != case.dv:
            raise Unsupported("head_dim_qk ≠ head_dim_v")
        dt = _np(fmt)
        attrs = {"num_heads": case.H, "kv_num_heads": case.Hkv}
        if cv["scale"] is not None:
            attrs["scale"] = float(cv["scale"])
        if cv["softcap"] is not None:
            attrs["softcap"] = float(cv["softcap"])
        q, k, v = (case.load(r).astype(dt) for r in ("query", "key", "value"))
        past = case.Sk - case.Sq
        allowed = case.structural_allowed(include_causal=False)
        inputs = [("query", _bsd(q)), ("key", _bsd(k[:, :, past:])), ("value", _bsd(v[:, :, past:]))]
        names = ["query", "key", "value"]
        if past:
            names += ["past_key", "past_value"]
            inputs += [("past_key", np.ascontiguousarray(k[:, :, :past])),
                       ("past_value", np.ascontiguousarray(v[:, :, :past]))]
        else:
            names += ["", ""]
        names += ["seqlens_k", "total_sequence_length"]
        inputs += [("seqlens_k", np.full((case.B,), case.Sk - 1, dtype=np.int32)),
                   ("total_sequence_length", np.asarray(case.Sk, dtype=np.int32).reshape(()))]
        if cv["seed_mask"]:
            if fmt == "float16":
                raise Unsupported("seed mask −1e9 is not representable in float16 (it would be −inf)")
            bias = np.where(allowed, case.load("seed_mask") * -1e9, -np.inf).astype(np.float32)
        else:
            bias = combined_float_bias(case, dt, allowed, "attention_bias values")
        if bias is not None:
            names += ["", "", "", "attention_bias"]
            inputs.append(("attention_bias", bias))
        node = helper.make_node("GroupQueryAttention", names, ["Y", "present_key", "present_value"],
                                domain="com.microsoft", **attrs)
        self._job(case, fmt, out, node, inputs, [("Y", "output")], domain_ms=True)
        return {"output": f"{out}/output.npy"}, []


def implementations():
    return [Attention(), MultiHeadAttention(), GroupQueryAttention()]
