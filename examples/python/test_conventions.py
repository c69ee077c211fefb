"""attnref.sdpa's conventions and arithmetics against independent computations, and its errors."""
import numpy as np
import pytest

import attnref
from numpy_attention import sdpa as numpy_sdpa

rng = np.random.default_rng(2024)
Q, K, V = rng.standard_normal((2, 4, 6, 8)), rng.standard_normal((2, 2, 9, 8)), rng.standard_normal((2, 2, 9, 5))
BOOL = rng.random((2, 1, 6, 9)) < 0.7
ADD = np.where(rng.random((6, 9)) < 0.2, -np.inf, rng.standard_normal((6, 9)))

CASES = [
    dict(), dict(scale=0.7), dict(causal="top_left"), dict(causal="bottom_right"), dict(causal="top_left", diagonal_offset=-2),
    dict(window=(2, 1)), dict(window=(None, 0)), dict(window=(3, 0), alignment="bottom_right"),
    dict(alibi_slopes=[0.5, 0.25, 0.125, 0.0625], alignment="bottom_right"), dict(key_lengths=[3, 9]), dict(mask=BOOL),
    dict(mask=BOOL, mask_polarity="true_means_masked"), dict(additive_mask=ADD), dict(softcap=1.5),
    dict(alibi_slopes=[0.5, 0.25, 0.125, 0.0625], causal="bottom_right"),
    dict(causal="top_left", diagonal_offset=-7, empty_rows="zero"),
    dict(causal="top_left", diagonal_offset=-7, empty_rows="nan"),
    dict(causal="top_left", diagonal_offset=-7, empty_rows="uniform"),
]


@pytest.mark.parametrize("conv", CASES, ids=[",".join(f"{k}" for k in c) or "plain" for c in CASES])
def test_certified_matches_numpy_float64(conv):
    # Independent: NumPy float64 (different algorithm and order) agrees to float64 accuracy.
    # (V * 3 for the empty-row cases: with V itself one uniform row's mean is an exact rounding
    # midpoint, see test_exact_midpoint_is_uncertified_not_guessed.)
    v = V * 3 if "empty_rows" in conv else V
    ref = attnref.sdpa(Q, K, v, return_weights=True, return_lse=True, **conv)
    out, p, lse = numpy_sdpa(Q, K, v, dtype=np.float64, **conv)
    for a, e in ((ref.output, out), (ref.weights, p), (ref.lse, lse)):
        assert a.shape == e.shape
        assert np.array_equal(np.isnan(a), np.isnan(e)) and np.array_equal(np.isinf(a), np.isinf(e))
        fin = np.isfinite(e)
        assert np.abs(a[fin] - e[fin]).max(initial=0) <= 1e-13


def test_exact_midpoint_is_uncertified_not_guessed():
    # Every key masked, empty_rows="uniform": output = mean of V's 9 rows. For head 0, feature 1 that
    # mean is exactly halfway between two doubles (checked here with exact rationals), so no
    # precision decides its rounding: attnref raises, naming the element, instead of guessing.
    from fractions import Fraction
    import math
    x = sum(Fraction(float(t)) for t in V[0, 0, :, 1]) / 9
    lo = math.nextafter(float(x), -math.inf) if Fraction(float(x)) > x else float(x)
    assert x == (Fraction(lo) + Fraction(math.nextafter(lo, math.inf))) / 2
    with pytest.raises(attnref.UncertifiedError, match=r"element \(0, 0, 0, 1\)"):
        attnref.sdpa(Q[:1, :1, :1], K[:1, :1], V[:1, :1], causal="top_left", diagonal_offset=-7, empty_rows="uniform")


def test_certified_equals_mpfr_267_rounded():
    # A 267-bit MPFR computation rounded to float64 is the correctly rounded value unless it lies
    # within 2^-200 of a rounding boundary; for these inputs they agree bit for bit.
    a = attnref.sdpa(Q, K, V, causal="bottom_right", return_weights=True)
    b = attnref.sdpa(Q, K, V, causal="bottom_right", return_weights=True, arith="mpfr:267")
    assert np.array_equal(a.output, b.output) and np.array_equal(a.weights, b.weights)
    assert all(c["certified"] == c["elements"] for c in a.certification)


def test_scale_placements_equal_when_certified_differ_in_float32():
    r = [attnref.sdpa(Q, K, V, scale_placement=p, scale=0.3) for p in ("on_product", "on_query", "split_sqrt")]
    assert np.array_equal(r[0].output, r[1].output) and np.array_equal(r[0].output, r[2].output)
    f = [attnref.sdpa(Q, K, V, scale_placement=p, scale=0.3, arith="float32").output for p in ("on_product", "split_sqrt")]
    assert f[0].dtype == np.float32 and not np.array_equal(f[0], f[1])


def test_float32_input_is_read_exactly_and_torch_tensors_work():
    torch = pytest.importorskip("torch")
    q32 = Q.astype(np.float32)
    a = attnref.sdpa(q32, K, V)
    b = attnref.sdpa(torch.from_numpy(q32), torch.from_numpy(K), torch.from_numpy(V))
    c = attnref.sdpa(q32.astype(np.float64), K, V)
    assert np.array_equal(a.output, b.output) and np.array_equal(a.output, c.output)


@pytest.mark.parametrize("call,exc,text", [
    (lambda: attnref.sdpa(Q[0], K, V), ValueError, "q: expected 4 dimensions"),
    (lambda: attnref.sdpa(Q, K[:, :, :4], V), ValueError, "value axis 2"),
    (lambda: attnref.sdpa(Q, K[:, :1].repeat(3, axis=1), V), ValueError, "kv heads"),
    (lambda: attnref.sdpa(Q, K, V, causal=True), TypeError, "causal"),
    (lambda: attnref.sdpa(Q, K, V, causal="lower"), ValueError, "causal"),
    (lambda: attnref.sdpa(Q, K, V, causal="top_left", alignment="bottom_right"), ValueError, "alignment"),
    (lambda: attnref.sdpa(Q, K, V, arith="float8"), ValueError, "arith"),
    (lambda: attnref.sdpa(Q, K, V, arith="mpfr:100"), ValueError, "mpfr:134"),
    (lambda: attnref.sdpa(Q, K, V, scale=float("nan")), ValueError, "scale"),
    (lambda: attnref.sdpa(Q, K, V, key_lengths=[3, 10]), ValueError, "key_lengths"),
    (lambda: attnref.sdpa(Q, K, V, key_lengths=[3]), ValueError, "key_lengths"),
    (lambda: attnref.sdpa(Q, K, V, mask=BOOL.astype(float)), TypeError, "mask: expected a boolean"),
    (lambda: attnref.sdpa(Q, K, V, mask=BOOL[:, :, :3]), ValueError, "mask axis 2"),
    (lambda: attnref.sdpa(Q, K, V, alibi_slopes=[1.0]), ValueError, "alibi_slopes"),
    (lambda: attnref.sdpa(Q, K, V, window=(-1, 2)), ValueError, r"window\[0\]"),
    (lambda: attnref.sdpa(np.where(Q > 2, np.nan, Q), K, V), ValueError, "q: NaN"),
    (lambda: attnref.sdpa(Q.astype(complex), K, V), TypeError, "q: expected real"),
    (lambda: attnref.sdpa(Q, K, V, empty_rows="skip"), ValueError, "empty_rows"),
    (lambda: attnref.testing.assert_attention_close(Q, Q), TypeError, "expected_or_reference"),
    (lambda: attnref.testing.assert_attention_close(Q, attnref.sdpa(Q, K, V, arith="float32")), ValueError, "low-precision"),
    (lambda: attnref.testing.assert_attention_close(Q, attnref.sdpa(Q, K, V), tolerance="loose"), ValueError, "tolerance"),
])
def test_bad_input_is_named(call, exc, text):
    with pytest.raises(exc, match=text):
        call()


def test_plain_expected_with_assert_close_model():
    ref = attnref.sdpa(Q, K, V)
    out = attnref.sdpa(Q, K, V, arith="float32").output
    attnref.testing.assert_attention_close(out, ref.output, tolerance="assert-close")
    with pytest.raises(AssertionError, match="is not close"):
        attnref.testing.assert_attention_close(out * np.float32(1.01), ref.output, tolerance="assert-close")


def test_help_lists_every_convention():
    doc = attnref.sdpa.__doc__
    for word in ("scale_placement", "split_sqrt", "bottom_right", "alignment", "diagonal_offset", "window", "key_lengths",
                 "mask_polarity", "additive_mask", "empty_rows", "softcap", "alibi_slopes", "GQA", "return_lse",
                 "PyTorch", "FlashAttention", "ONNX", "certified", "mpfr:BITS"):
        assert word in doc, word


def test_computation_releases_the_gil():
    # While a long call (MPFR; the certified one is now fast) runs in a worker thread, this thread keeps executing Python: with the
    # GIL held for the whole computation it would get no more than a switch interval's worth of steps.
    import threading
    rng2 = np.random.default_rng(5)
    q, k, v = (rng2.standard_normal((1, 2, 72, 32)) for _ in range(3))  # ~0.5-1.3 s in 134-bit MPFR
    worker = threading.Thread(target=lambda: attnref.sdpa(q, k, v, arith="mpfr:134"))
    steps = 0
    worker.start()
    while worker.is_alive():
        steps += 1
    worker.join()
    # Holding the GIL, the call would leave this thread at most one switch interval (5 ms, a few
    # thousand steps) before it starts; released, this thread runs all along (> 100,000 steps/s even
    # on the loaded 2-core machine).
    assert steps > 30000, steps


def test_dlpack_only_object_is_read():
    class OnlyDLPack:  # exposes nothing but the DLPack protocol
        def __init__(self, a):
            self._a = a

        def __dlpack__(self, stream=None):
            return self._a.__dlpack__()

        def __dlpack_device__(self):
            return self._a.__dlpack_device__()

    a = attnref.sdpa(OnlyDLPack(Q), OnlyDLPack(K), OnlyDLPack(V))
    assert np.array_equal(a.output, attnref.sdpa(Q, K, V).output)


def numpy_mha(xq, xk, xv, wq, wk, wv, wo, bq, bk, bv, bo, heads, kv_heads, dtype, **conv):
    # Written from multi_head_attention.hpp's layout comment: y = x @ W + b, head h owns columns
    # [h*d, (h+1)*d), query head h reads kv head h // (heads // kv_heads).
    c = lambda a: np.asarray(a, dtype=dtype)
    q, k, v = c(xq) @ c(wq) + c(bq), c(xk) @ c(wk) + c(bk), c(xv) @ c(wv) + c(bv)
    B, Sq = q.shape[0], q.shape[1]
    split = lambda x, h: x.reshape(B, x.shape[1], h, -1).transpose(0, 2, 1, 3)
    o, p, lse = numpy_sdpa(split(q, heads), split(k, kv_heads), split(v, kv_heads), dtype=dtype, **conv)
    return o.transpose(0, 2, 1, 3).reshape(B, Sq, -1) @ c(wo) + c(bo), p, lse


@pytest.mark.parametrize("conv", [dict(), dict(causal="bottom_right"), dict(key_lengths=[4, 7])], ids=["plain", "causal", "padding"])
def test_mha_gqa_against_numpy(conv):
    g = np.random.default_rng(31)
    E, H, Hkv, d = 24, 6, 2, 4
    xq, xk = g.standard_normal((2, 5, E)), g.standard_normal((2, 7, E))
    wq, wk, wv = g.standard_normal((E, H * d)) / 5, g.standard_normal((E, Hkv * d)) / 5, g.standard_normal((E, Hkv * d)) / 5
    wo = g.standard_normal((H * d, 10)) / 5
    bq, bk, bv, bo = g.standard_normal(H * d), g.standard_normal(Hkv * d), g.standard_normal(Hkv * d), g.standard_normal(10)
    ref = attnref.mha(xq, xk, xk, wq, wk, wv, wo, bq, bk, bv, bo, heads=H, kv_heads=Hkv, return_weights=True, **conv)
    o64, p64, _ = numpy_mha(xq, xk, xk, wq, wk, wv, wo, bq, bk, bv, bo, H, Hkv, np.float64, **conv)
    assert ref.output.shape == (2, 5, 10) and ref.weights.shape == (2, H, 5, 7)
    assert np.abs(ref.output - o64).max() <= 1e-12 and np.abs(ref.weights - p64).max() <= 1e-13  # independent float64
    o32, p32, _ = numpy_mha(xq, xk, xk, wq, wk, wv, wo, bq, bk, bv, bo, H, Hkv, np.float32, **conv)
    attnref.testing.assert_attention_close(o32, ref, weights=p32)
    # Deliberately wrong: the merged heads meet W_o's rows in reverse order (a head-merge bug).
    wrong = numpy_mha(xq, xk, xk, wq, wk, wv, wo[::-1].copy(), bq, bk, bv, bo, H, Hkv, np.float32, **conv)[0]
    with pytest.raises(AssertionError, match="is not close"):
        attnref.testing.assert_attention_close(wrong, ref)
