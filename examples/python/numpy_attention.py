"""A plain NumPy scaled dot-product attention with attnref's conventions: the implementation the
examples gate (in float32), and an independent float64 cross-check of attnref.sdpa's conventions.
Written from the conventions' definitions (attnref's README table), not from attnref's code."""
import numpy as np


def sdpa(q, k, v, *, dtype=np.float32, scale=None, causal=None, alignment=None, diagonal_offset=0, window=None, key_lengths=None,
         mask=None, mask_polarity="true_means_attend", additive_mask=None, empty_rows="zero", softcap=None,
         alibi_slopes=None):
    q, k, v = (np.asarray(x, dtype=dtype) for x in (q, k, v))
    B, H, Sq, dk = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    k = np.repeat(k, H // Hkv, axis=1)  # GQA: query head h reads kv head h // (H // Hkv)
    v = np.repeat(v, H // Hkv, axis=1)
    s = dtype(1 / np.sqrt(dk) if scale is None else scale)
    logits = (q @ k.transpose(0, 1, 3, 2)) * s
    if softcap is not None:
        logits = dtype(softcap) * np.tanh(logits / dtype(softcap))
    diag = np.arange(Sq)[:, None] + diagonal_offset + (Sk - Sq if (alignment or causal) == "bottom_right" else 0)
    j = np.arange(Sk)[None, :]
    if alibi_slopes is not None:
        logits = logits - np.asarray(alibi_slopes, dtype=dtype)[None, :, None, None] * np.abs(diag - j).astype(dtype)
    allowed = np.ones((B, H, Sq, Sk), dtype=bool)
    if causal is not None:
        allowed &= j <= diag
    if window is not None:
        left, right = window
        if left is not None:
            allowed &= j >= diag - left
        if right is not None:
            allowed &= j <= diag + right
    if key_lengths is not None:
        allowed &= np.arange(Sk)[None, None, None, :] < np.asarray(key_lengths)[:, None, None, None]
    if mask is not None:
        m = np.broadcast_to(mask, (B, H, Sq, Sk))
        allowed &= m if mask_polarity == "true_means_attend" else ~m
    if additive_mask is not None:
        a = np.broadcast_to(np.asarray(additive_mask, dtype=dtype), (B, H, Sq, Sk))
        allowed &= a != -np.inf
        logits = logits + np.where(np.isneginf(a), 0, a)
    logits = np.where(allowed, logits, -np.inf)
    empty = ~allowed.any(axis=-1, keepdims=True)
    m = np.where(empty, 0, logits.max(axis=-1, keepdims=True))
    e = np.exp(logits - m)
    total = e.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = e / total
    if empty_rows == "zero":
        p = np.where(empty, dtype(0), p)
    elif empty_rows == "nan":
        p = np.where(empty, dtype(np.nan), p)
    else:
        p = np.where(empty, dtype(1 / Sk), p)
    with np.errstate(divide="ignore"):
        lse = (m + np.log(total))[..., 0]
    return p @ v, p, lse
