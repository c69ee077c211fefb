"""Shared pieces of the conformance adapters: a golden case read with NumPy, its conventions turned
into arrays (which keys a query may attend, the additive terms), and the result types.

Every adapter maps a case's conventions (golden/README.md, "manifest.json, field by field") onto
its implementation's API explicitly and raises Unsupported with the reason for any it cannot express.
"""
import json
import os

import numpy as np


class Unsupported(Exception):
    """A convention of the case the implementation cannot express (the reason is the message)."""


class Case:
    def __init__(self, directory):
        self.dir = os.path.abspath(directory)
        with open(os.path.join(self.dir, "manifest.json")) as f:
            self.m = json.load(f)
        self.name = self.m["name"]
        self.kind = self.m["kind"]
        self.sh = self.m["shapes"]
        self.cv = self.m["conventions"]
        self.format = self.m["inputs"]["format"]
        self.backward = bool(self.m["outputs"].get("gradients", False))
        self.roles = {t["role"] for t in self.m["tensors"] if "target" not in t}
        self._cache = {}

    def load(self, role):
        if role not in self._cache:
            self._cache[role] = np.load(os.path.join(self.dir, role + ".npy"))
        return self._cache[role]

    def has(self, role):
        return role in self.roles

    # shapes
    @property
    def B(self):
        return self.sh["batch"]

    @property
    def H(self):
        return self.sh["heads"]

    @property
    def Hkv(self):
        return self.sh["kv_heads"]

    @property
    def Sq(self):
        return self.sh["query_length"]

    @property
    def Sk(self):
        return self.sh["key_length"]

    @property
    def dk(self):
        return self.sh["head_dim_qk"]

    @property
    def dv(self):
        return self.sh["head_dim_v"]

    def scale(self):
        """The logit scale s as a double (1/sqrt(dk) when the manifest has null)."""
        s = self.cv["scale"]
        return float(s) if s is not None else 1.0 / float(np.sqrt(self.dk))

    def offset(self):
        """diagonal(i) = i + offset (golden/README.md: the causal, window and ALiBi diagonal)."""
        off = self.cv["diagonal_offset"]
        if self.cv["causal_alignment"] == "bottom_right":
            off += self.Sk - self.Sq
        return off

    def diagonal(self):
        return np.arange(self.Sq)[:, None] + self.offset()            # (Sq, 1)

    def structural_allowed(self, include_bool=True, include_key_lengths=True, include_causal=True):
        """(B, H, Sq, Sk) bool: the keys the causal mask, window, key lengths and boolean mask allow."""
        B, H, Sq, Sk = self.B, self.H, self.Sq, self.Sk
        j = np.arange(Sk)[None, :]
        d = self.diagonal()
        ok = np.ones((Sq, Sk), dtype=bool)
        if self.cv["causal"] and include_causal:
            ok &= j <= d
        w = self.cv["window"]
        if w is not None:
            if w.get("left") is not None:
                ok &= j >= d - w["left"]
            if w.get("right") is not None:
                ok &= j <= d + w["right"]
        allowed = np.broadcast_to(ok, (B, H, Sq, Sk)).copy()
        if include_key_lengths and self.cv["key_lengths"]:
            for b, n in enumerate(self.cv["key_lengths"]):
                allowed[b, :, :, n:] = False
        if include_bool and self.cv["boolean_mask"]:
            m = self.load("mask").astype(bool)
            allowed &= m if self.cv["mask_polarity"] == "true_means_attend" else ~m
        return allowed

    def alibi_bias(self):
        """(1, H, Sq, Sk) float64: -slope_h * |diagonal(i) - j|, or None."""
        slopes = self.cv["alibi_slopes"]
        if not slopes:
            return None
        dist = np.abs(self.diagonal() - np.arange(self.Sk)[None, :]).astype(np.float64)
        return -np.asarray(slopes, dtype=np.float64)[None, :, None, None] * dist[None, None]

    def additive(self):
        return self.load("additive_mask") if self.cv["additive_mask"] else None

    def attendable(self):
        """(B, H, Sq, Sk) bool: structurally allowed and not -inf in the additive mask."""
        a = self.structural_allowed()
        add = self.additive()
        if add is not None:
            a &= ~np.isneginf(add)
        return a

    def has_empty_rows(self):
        return not self.cv["seed_mask"] and bool((~self.attendable().any(axis=-1)).any())

    def has_masking(self):
        return bool((~self.structural_allowed()).any())


def combined_float_bias(case, dtype, allowed=None, what="the additive terms"):
    """ALiBi + additive mask + structural masks (-inf) as one float bias of dtype, or None when there is
    nothing to add. Raises Unsupported when the sum is not exactly representable in dtype (an
    implementation that takes one mask tensor in its compute dtype would then round it)."""
    parts = [p for p in (case.alibi_bias(), case.additive()) if p is not None]
    if allowed is None:
        allowed = case.structural_allowed()
    if not parts and allowed.all():
        return None
    total = np.zeros((case.B, case.H, case.Sq, case.Sk))
    for p in parts:
        with np.errstate(invalid="ignore"):
            total = total + p
    total = np.where(allowed, total, -np.inf)
    cast = total.astype(dtype)
    with np.errstate(invalid="ignore"):
        # float32: rounded like q, k, v of a float64 case (the checker's bounds cover input rounding);
        # float16: attnref rounds q, k, v to the candidate's 16-bit format but not an additive mask
        if np.dtype(dtype).itemsize < 4 and not np.array_equal(cast.astype(np.float64), total):
            raise Unsupported(f"{what} are not exactly representable in {np.dtype(dtype).name} "
                              "(the mask is taken in the compute dtype; attnref rounds q, k, v but not an additive mask)")
    return cast


def save_bf16(path, t):
    """A torch bfloat16 tensor as '<u2' bit patterns (the checker reads '<u2' as bfloat16)."""
    import torch
    np.save(path, t.detach().contiguous().view(torch.int16).numpy().view(np.uint16))


def list_cases(golden_dir):
    out = []
    for name in sorted(os.listdir(golden_dir)):
        if os.path.isfile(os.path.join(golden_dir, name, "manifest.json")):
            out.append(name)
    return out
