"""The seed chapter's NumPy MultiHeadAttention class, re-implemented from its conventions:

  q = x_q · W_q, k = x_k · W_k, v = x_v · W_v       (y = x·W, no biases, W is d_model × d_model)
  split heads: (B, S, d_model) -> (B, H, S, depth), depth = d_model / H
  logits = (q · kᵀ) / sqrt(depth)                   (divided, on the product)
  logits += mask · (−1e9)                            (mask value 1 = masked; broadcast over the heads)
  softmax: subtract the row max, exp, divide by the sum
  out = P · v, heads merged, · W_o

Its `k_h.transpose(0, 2, 1)` fails on the 4-D head-split tensors the class itself passes
(ValueError: axes don't match array); the adapter swaps the last two axes instead, as the
chapter's text intends. Nothing else is changed: the -1e9 mask convention is kept.

Mapping: sdpa cases run with identity projections (exact) and d_model = H·dk; GQA repeats the kv
heads' columns (exact). Boolean masks, causal, window and key lengths become the class's 0/1 mask
(1 where the case masks a key) — a fully masked row then keeps softmax(logits − 1e9), which is
what the seed_mask convention certifies; the adapter re-judges such a FAIL against that case.
"""
import numpy as np

from common import Unsupported


class SeedMultiHeadAttention:
    def __init__(self, W_q, W_k, W_v, W_o, num_heads):
        self.W_q, self.W_k, self.W_v, self.W_o = W_q, W_k, W_v, W_o
        self.d_model = W_q.shape[0]
        self.num_heads = num_heads
        self.depth = self.d_model // num_heads

    def _scaled_dot_product_attention(self, q_h, k_h, v_h, mask=None):
        matmul_qk = np.matmul(q_h, k_h.swapaxes(-1, -2))          # the fix: was k_h.transpose(0, 2, 1)
        dk = k_h.shape[-1]
        scaled_attention_logits = matmul_qk / np.sqrt(dk)
        if mask is not None:
            scaled_attention_logits += (mask * -1e9)
        stabilized = scaled_attention_logits - np.max(scaled_attention_logits, axis=-1, keepdims=True)
        attention_weights = np.exp(stabilized)
        attention_weights /= np.sum(attention_weights, axis=-1, keepdims=True)
        return np.matmul(attention_weights, v_h), attention_weights

    def _split_heads(self, x, batch_size):
        x = np.reshape(x, (batch_size, x.shape[1], self.num_heads, self.depth))
        return x.transpose(0, 2, 1, 3)

    def call(self, q_in, k_in, v_in, mask=None):
        batch_size = q_in.shape[0]
        q = self._split_heads(np.dot(q_in, self.W_q), batch_size)
        k = self._split_heads(np.dot(k_in, self.W_k), batch_size)
        v = self._split_heads(np.dot(v_in, self.W_v), batch_size)
        o, w = self._scaled_dot_product_attention(q, k, v, mask)
        o = np.reshape(o.transpose(0, 2, 1, 3), (batch_size, q_in.shape[1], self.d_model))
        return np.dot(o, self.W_o), w


def seed_mask_of(case):
    """The 0/1 mask the class is given: the case's seed_mask, or 1 wherever the case masks a key."""
    if case.cv["seed_mask"]:
        return case.load("seed_mask")
    allowed = case.structural_allowed()
    return None if allowed.all() else (~allowed).astype(np.float64)


class Seed:
    name = "seed-numpy"
    title = "The seed chapter's NumPy MultiHeadAttention class (transpose fixed, −1e9 mask kept)"
    formats = ("float64", "float32")
    empty_rows = None          # a fully masked row is softmax(logits − 1e9): judged as the seed_mask convention
    mask_words = "−1e9 (seed mask), never −inf"

    def seed_style_mask(self, case):
        return None if case.cv["seed_mask"] else seed_mask_of(case)

    def run(self, case, fmt, out):
        dt = np.float64 if fmt == "float64" else np.float32
        cv = case.cv
        if case.backward:
            raise Unsupported("no backward (NumPy, no autograd)")
        if cv["scale"] is not None:
            raise Unsupported("explicit scale (fixed / sqrt(depth))")
        if cv["softcap"] is not None:
            raise Unsupported("softcap")
        if cv["alibi_slopes"]:
            raise Unsupported("ALiBi")
        if cv["additive_mask"]:
            raise Unsupported("additive mask (only a 0/1 mask scaled by −1e9)")
        if case.dk != case.dv:
            raise Unsupported("head_dim_qk ≠ head_dim_v (one depth = d_model / num_heads)")
        H, Hkv, dk = case.H, case.Hkv, case.dk
        cols = np.array([(h // (H // Hkv)) * dk + c for h in range(H) for c in range(dk)])
        if case.kind == "sdpa":
            B, Sq, Sk = case.B, case.Sq, case.Sk
            xq = case.load("query").transpose(0, 2, 1, 3).reshape(B, Sq, H * dk)
            xk = case.load("key").transpose(0, 2, 1, 3).reshape(B, Sk, Hkv * dk)[..., cols]
            xv = case.load("value").transpose(0, 2, 1, 3).reshape(B, Sk, Hkv * dk)[..., cols]
            eye = np.eye(H * dk)
            W = (eye, eye, eye, eye)
        else:
            if cv["projection_bias"]:
                raise Unsupported("projection biases (y = x·W only)")
            E = case.sh["model_dim"]
            if E != H * dk or case.sh["output_dim"] != E:
                raise Unsupported("d_model ≠ heads·depth or output_dim ≠ d_model (square weights)")
            xq, xk, xv = case.load("query"), case.load("key"), case.load("value")
            W = (case.load("w_q"), case.load("w_k")[:, cols], case.load("w_v")[:, cols], case.load("w_o"))
        mask = seed_mask_of(case)
        mha = SeedMultiHeadAttention(*(w.astype(dt) for w in W), num_heads=H)
        o, p = mha.call(xq.astype(dt), xk.astype(dt), xv.astype(dt), None if mask is None else mask.astype(dt))
        if case.kind == "sdpa":
            o = o.reshape(case.B, case.Sq, H, case.dv).transpose(0, 2, 1, 3)
        npd = "<f8" if fmt == "float64" else "<f4"
        np.save(f"{out}/output.npy", np.ascontiguousarray(o).astype(npd))
        np.save(f"{out}/weights.npy", np.ascontiguousarray(p).astype(npd))
        return {"output": f"{out}/output.npy", "weights": f"{out}/weights.npy"}, []
