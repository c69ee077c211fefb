"""attnref.check with gradients (python/attnref/__init__.py): the certified gradients rounded to
float32 PASS, one element moved by 1% FAILs, a role the case lacks and a wrong shape are errors."""
import os

import numpy as np
import pytest

import attnref

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "golden")


def certified(case, role):
    return np.load(os.path.join(GOLDEN, case, role + ".npy")).astype(np.float32)


def test_sdpa_gradients_pass_and_a_moved_element_fails():
    g = {r: certified("sdpa_bwd_gqa", r) for r in ("grad_query", "grad_key", "grad_value")}
    v = attnref.check(os.path.join(GOLDEN, "sdpa_bwd_gqa"), dtype="float32", **g)
    assert v, v.text
    g["grad_key"] = g["grad_key"].copy()
    g["grad_key"][0, 1, 2, 3] *= np.float32(1.01)
    v = attnref.check(os.path.join(GOLDEN, "sdpa_bwd_gqa"), dtype="float32", **g)
    assert v.verdict == "FAIL" and "grad_key" in v.reason


def test_mha_weight_gradient_with_output():
    case = os.path.join(GOLDEN, "mha_bwd_bias_gqa")
    out = np.load(os.path.join(case, "output.npy")).astype(np.float32)
    v = attnref.check(case, out, dtype="float32", grad_w_o=certified("mha_bwd_bias_gqa", "grad_w_o"))
    assert v, v.text
    assert "grad_w_o" in v.text


def test_bad_gradients_are_errors():
    case = os.path.join(GOLDEN, "sdpa_bwd_gqa")
    with pytest.raises(ValueError, match="grad_w_q"):
        attnref.check(case, dtype="float32", grad_w_q=np.zeros((8, 8), dtype=np.float32))
    with pytest.raises(ValueError, match="grad_query"):
        attnref.check(case, dtype="float32", grad_query=np.zeros((1, 2), dtype=np.float32))
    with pytest.raises(TypeError):
        attnref.check(case, dtype="float32", gradquery=np.zeros((1, 2)))
    with pytest.raises(ValueError, match="at least one gradient"):
        attnref.check(case)


def numpy_textbook_grad_query(case):
    """dQ of a float32 textbook backward written here in NumPy (no masks: the case has none)."""
    d = os.path.join(GOLDEN, case)
    q, k, v, do = (np.load(os.path.join(d, r + ".npy")).astype(np.float32) for r in ("query", "key", "value", "grad_output"))
    s = np.float32(1 / np.sqrt(q.shape[-1]))
    logits = (q @ k.swapaxes(-1, -2)) * s
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    dp = do @ v.swapaxes(-1, -2)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    return (ds @ k) * s


def test_declared_textbook_backward_tightens_grad_query():
    # Logits near 1000 (keys offset by 100): dQ's bound valid for any algorithm is vacuous; the
    # declared textbook backward's centred bound (B5t) decides, and a dropped scale still fails.
    case = os.path.join(GOLDEN, "sdpa_bwd_adv_logit_offset_1000")
    dq = numpy_textbook_grad_query("sdpa_bwd_adv_logit_offset_1000")
    assert attnref.check(case, dtype="float32", grad_query=dq).verdict == "INCONCLUSIVE"
    v = attnref.check(case, dtype="float32", grad_query=dq, backward_algorithm="textbook")
    assert v, v.text
    assert "(B5t)" in v.text and "textbook" in v.json
    s = np.float32(1 / np.sqrt(dq.shape[-1]))
    assert attnref.check(case, dtype="float32", grad_query=dq / s, backward_algorithm="textbook").verdict == "FAIL"
    with pytest.raises(ValueError, match="backward_algorithm"):
        attnref.check(case, dtype="float32", grad_query=dq, backward_algorithm="fast")


# --- attnref.sdpa(..., grad_output=): certified gradients for the caller's own tensors -------------

def torch_sdpa_float64_gradients(q, k, v, do, causal):
    """PyTorch float64 autograd through explicit attention math (not attnref's code): GQA by
    repeating each kv head over its group (autograd sums the group), causal by a boolean mask."""
    import torch
    t = {n: torch.tensor(a, dtype=torch.float64, requires_grad=True) for n, a in (("q", q), ("k", k), ("v", v))}
    group = q.shape[1] // k.shape[1]
    kk, vv = (t[n].repeat_interleave(group, dim=1) for n in ("k", "v"))
    sq, sk = q.shape[2], k.shape[2]
    shift = sk - sq if causal == "bottom_right" else 0
    allowed = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + shift
    logits = (t["q"] @ kk.transpose(-1, -2)) / np.sqrt(q.shape[-1])
    p = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    (p @ vv).backward(torch.tensor(do))
    return {"grad_query": t["q"].grad.numpy(), "grad_key": t["k"].grad.numpy(), "grad_value": t["v"].grad.numpy()}, t


def test_sdpa_gradients_agree_with_torch_float64_autograd():
    pytest.importorskip("torch")
    rng = np.random.default_rng(24)
    q, k, v = rng.standard_normal((2, 4, 7, 8)), rng.standard_normal((2, 2, 9, 8)), rng.standard_normal((2, 2, 9, 5))
    do = rng.standard_normal((2, 4, 7, 5))
    expected, leaves = torch_sdpa_float64_gradients(q, k, v, do, "bottom_right")
    # The tensors a test holds (requiring grad) are accepted: their values are read, detached.
    ref = attnref.sdpa(leaves["q"], leaves["k"], leaves["v"], causal="bottom_right", grad_output=do)
    for role, e in expected.items():
        g = getattr(ref, role)
        assert g.shape == e.shape and g.dtype == np.float64
        assert np.linalg.norm(g - e) <= 1e-12 * np.linalg.norm(e), role
    reports = {c["tensor"]: c for c in ref.certification}
    assert set(expected) <= set(reports)
    assert all(c["certified"] == c["elements"] for c in ref.certification)


def mpmath_sdpa_gradients(q, k, v, do, causal, bits=200):
    """The exact gradients at `bits` bits (mpmath, textbook formulas of docs/backward.md: dP = dO Vᵀ,
    D = rowsum(P∘dP), dS = P∘(dP − D), dQ = s dS K, dK = s Σ_group dSᵀ Q, dV = Σ_group Pᵀ dO), each
    rounded to the nearest double."""
    import mpmath
    mp = mpmath.mp
    B, H, Sq, dk = q.shape
    Hkv, Sk, dv = k.shape[1], k.shape[2], v.shape[3]
    group = H // Hkv
    shift = Sk - Sq if causal == "bottom_right" else 0
    gq, gk, gv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    with mp.workprec(bits):
        s = 1 / mpmath.sqrt(dk)
        M = lambda a: [[mpmath.mpf(float(x)) for x in row] for row in a]
        acc_k = {}
        acc_v = {}
        for b in range(B):
            for h in range(H):
                kv = h // group
                Q, K, V, DO = M(q[b, h]), M(k[b, kv]), M(v[b, kv]), M(do[b, h])
                for i in range(Sq):
                    keys = [j for j in range(Sk) if j <= i + shift]
                    S = {j: s * mpmath.fsum(Q[i][c] * K[j][c] for c in range(dk)) for j in keys}
                    m = max(S.values())
                    e = {j: mpmath.exp(S[j] - m) for j in keys}
                    z = mpmath.fsum(e.values())
                    P = {j: e[j] / z for j in keys}
                    dP = {j: mpmath.fsum(DO[i][c] * V[j][c] for c in range(dv)) for j in keys}
                    D = mpmath.fsum(P[j] * dP[j] for j in keys)
                    dS = {j: P[j] * (dP[j] - D) for j in keys}
                    for c in range(dk):
                        gq[b, h, i, c] = float(round53(mp, s * mpmath.fsum(dS[j] * K[j][c] for j in keys)))
                    for j in keys:
                        for c in range(dk):
                            acc_k.setdefault((b, kv, j, c), []).append(s * dS[j] * Q[i][c])
                        for c in range(dv):
                            acc_v.setdefault((b, kv, j, c), []).append(P[j] * DO[i][c])
        for idx, terms in acc_k.items():
            gk[idx] = float(round53(mp, mpmath.fsum(terms)))
        for idx, terms in acc_v.items():
            gv[idx] = float(round53(mp, mpmath.fsum(terms)))
    return {"grad_query": gq, "grad_key": gk, "grad_value": gv}


def round53(mp, x):
    with mp.workprec(53):
        return +x  # rounds to nearest (mpmath's default rounding), a double's 53 bits


def test_sdpa_gradients_are_correctly_rounded():
    pytest.importorskip("mpmath")
    rng = np.random.default_rng(2401)
    q, k, v = rng.standard_normal((1, 2, 3, 4)), rng.standard_normal((1, 1, 5, 4)), rng.standard_normal((1, 1, 5, 3))
    do = rng.standard_normal((1, 2, 3, 3))
    for causal in ("top_left", "bottom_right"):
        ref = attnref.sdpa(q, k, v, causal=causal, grad_output=do)
        exact = mpmath_sdpa_gradients(q, k, v, do, causal)
        for role, e in exact.items():
            assert np.array_equal(getattr(ref, role), e), (causal, role, getattr(ref, role) - e)


def test_gradient_arguments_are_checked():
    q = np.ones((1, 1, 2, 4))
    with pytest.raises(ValueError, match=r"grad_output: expected the output's shape \(1, 1, 2, 4\)"):
        attnref.sdpa(q, q, q, grad_output=np.ones((1, 1, 2, 3)))
    with pytest.raises(ValueError, match="grad_output: .*certified"):
        attnref.sdpa(q, q, q, arith="float64", grad_output=np.ones((1, 1, 2, 4)))
    with pytest.raises(ValueError, match="grad_output: NaN"):
        attnref.sdpa(q, q, q, grad_output=np.full((1, 1, 2, 4), np.nan))
    with pytest.raises(AttributeError, match="grad_query: .*grad_output="):
        attnref.sdpa(q, q, q).grad_query


def test_mha_gradients_agree_with_torch_float64_autograd():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2402)
    B, Sq, Sk, E, H, Hkv, dk, dv, Eo = 1, 4, 5, 6, 2, 1, 3, 2, 5
    arrays = {"x_q": (B, Sq, E), "x_k": (B, Sk, E), "x_v": (B, Sk, E), "w_q": (E, H * dk), "w_k": (E, Hkv * dk),
              "w_v": (E, Hkv * dv), "w_o": (H * dv, Eo), "b_q": (H * dk,), "b_k": (Hkv * dk,), "b_v": (Hkv * dv,), "b_o": (Eo,)}
    t = {n: torch.tensor(rng.standard_normal(s), requires_grad=True) for n, s in arrays.items()}
    do = rng.standard_normal((B, Sq, Eo))
    # Explicit math in attnref's layout y = x W + b, head h owning columns [h d, (h + 1) d), GQA groups.
    split = lambda y, n, d: y.reshape(y.shape[0], y.shape[1], n, d).transpose(1, 2)
    q = split(t["x_q"] @ t["w_q"] + t["b_q"], H, dk)
    k = split(t["x_k"] @ t["w_k"] + t["b_k"], Hkv, dk).repeat_interleave(H // Hkv, dim=1)
    v = split(t["x_v"] @ t["w_v"] + t["b_v"], Hkv, dv).repeat_interleave(H // Hkv, dim=1)
    o = torch.softmax((q @ k.transpose(-1, -2)) / np.sqrt(dk), dim=-1) @ v
    (o.transpose(1, 2).reshape(B, Sq, H * dv) @ t["w_o"] + t["b_o"]).backward(torch.tensor(do))
    ref = attnref.mha(*(t[n] for n in arrays), heads=H, kv_heads=Hkv, grad_output=do)
    roles = {"x_q": "grad_query", "x_k": "grad_key", "x_v": "grad_value"}
    for n in arrays:
        g, e = getattr(ref, roles.get(n, "grad_" + n)), t[n].grad.numpy()
        assert g.shape == e.shape
        if n == "b_k":  # exactly 0 (the softmax ignores a per-row shift); autograd leaves rounding noise
            assert not g.any() and np.linalg.norm(e) <= 1e-12 * np.linalg.norm(t["w_k"].grad.numpy())
            continue
        assert np.linalg.norm(g - e) <= 1e-12 * np.linalg.norm(e), n


def test_sdpa_gradients_certify_keys_equal_in_a_feature():
    """bf16 inputs whose keys share a feature (all keys: feature 1; keys 0-2: feature 2, the only keys
    causal rows 0-2 see): dQ of those features is exactly 0 (Σ_j dS_ij = 0), certified as +0, not
    UncertifiedError; the other elements agree with a float64 numpy backward."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    q, k, v, do = (np.round(rng.standard_normal((1, 2, 6, 4)) * 8) / 8 for _ in range(4))
    k[..., 1] = 0.375
    k[..., :3, 2] = -1.25
    t = lambda a: torch.tensor(a, dtype=torch.bfloat16)
    r = attnref.sdpa(t(q), t(k), t(v), causal="top_left", grad_output=t(do))
    g = r.grad_query
    assert np.all(g[..., 1] == 0) and not np.any(np.signbit(g[..., 1]))
    assert np.all(g[..., 1:3, 2] == 0) and not np.any(np.signbit(g[..., 1:3, 2]))
    s = 1 / np.sqrt(4)
    ref = np.zeros_like(q)
    for h in range(2):
        for i in range(6):
            lg = s * k[0, h, :i + 1] @ q[0, h, i]
            p = np.exp(lg - lg.max())
            p /= p.sum()
            dp = v[0, h, :i + 1] @ do[0, h, i]
            ref[0, h, i] = s * (p * (dp - p @ dp)) @ k[0, h, :i + 1]
    np.testing.assert_allclose(g, ref, rtol=0, atol=1e-12)


def test_mha_gradients_certify_under_the_nan_policy():
    """empty_rows="nan" with biases: grad_b_k is +0 (the softmax's shift invariance); with rows empty in
    every head (batch 1 keeps 3 keys, causal bottom_right, window 1/1), the gradients certify, NaN
    exactly where the nan rule carries the empty rows' NaN (rows of grad_query of those positions)."""
    rng = np.random.default_rng(5)
    B, S, E, H = 2, 8, 8, 2
    x = [np.round(rng.standard_normal((B, S, E)) * 8) / 8 for _ in range(3)]
    w = [np.round(rng.standard_normal((E, E)) * 4) / 16 for _ in range(4)]
    b = [np.round(rng.standard_normal(E) * 4) / 16 for _ in range(4)]
    do = np.round(rng.standard_normal((B, S, E)) * 8) / 8
    r = attnref.mha(*x, *w, *b, heads=H, empty_rows="nan", grad_output=do)
    assert np.all(r.grad_b_k == 0) and not np.any(np.signbit(r.grad_b_k))
    assert all(np.all(np.isfinite(getattr(r, n))) for n in ("grad_query", "grad_key", "grad_w_q", "grad_w_o"))
    r = attnref.mha(*x, *w, *b, heads=H, empty_rows="nan", key_lengths=[8, 3], causal="bottom_right", window=(1, 1),
                    grad_output=do)
    assert np.all(r.grad_b_k == 0) and not np.any(np.signbit(r.grad_b_k))
    # Batch 1: row i sees keys i-1 .. i of the first 3, so rows 4-7 are empty in both heads.
    nan_rows = np.isnan(r.grad_query).all(axis=2)
    assert nan_rows[1, 4:].all() and not nan_rows[0].any() and not nan_rows[1, :4].any()
    assert np.isfinite(r.grad_query[np.logical_not(nan_rows)]).all()
    assert np.isnan(r.grad_key[1]).all() and np.isfinite(r.grad_key[0]).all()
    assert np.isfinite(r.grad_b_o).all() and np.isnan(r.grad_w_o).all()
