"""Gate a NumPy float32 attention with certified references for inputs drawn per test."""
import numpy as np
import pytest

import attnref
from attnref.testing import InconclusiveError, assert_attention_close
from numpy_attention import sdpa as numpy_sdpa

CONVENTIONS = [
    dict(),
    dict(causal="top_left"),
    dict(causal="bottom_right", diagonal_offset=1),
    dict(window=(3, 2)),
    dict(key_lengths=[5, 12]),
    dict(softcap=2.0, alibi_slopes=[0.5, 0.25, 0.125, 0.0625]),
    dict(scale=0.3),
]


def draw(seed, sq=9, sk=12, gqa=2):
    rng = np.random.default_rng(seed)  # new inputs per test, reproducible from the seed in the test id
    return (rng.standard_normal((2, 4, sq, 16)), rng.standard_normal((2, 4 // gqa, sk, 16)),
            rng.standard_normal((2, 4 // gqa, sk, 8)))


@pytest.mark.parametrize("seed,conv", list(enumerate(CONVENTIONS)), ids=lambda c: ",".join(c) if isinstance(c, dict) else str(c))
def test_numpy_float32_passes(seed, conv):
    q, k, v = draw(100 + seed)
    ref = attnref.sdpa(q, k, v, return_weights=True, return_lse=True, **conv)
    out, p, lse = numpy_sdpa(q, k, v, dtype=np.float32, **conv)
    assert out.dtype == np.float32
    assert_attention_close(out, ref, weights=p, lse=lse)  # dtype float32, from the arrays


def test_float64_implementation_against_certified():
    q, k, v = draw(7)
    ref = attnref.sdpa(q, k, v, causal="bottom_right")
    out, _, _ = numpy_sdpa(q, k, v, dtype=np.float64, causal="bottom_right")
    assert_attention_close(out, ref)  # float64 candidate: certified reference required


def test_wrong_implementation_fails():
    # Deliberately wrong: top-left causal alignment where the reference uses bottom-right (Sq != Sk).
    q, k, v = draw(11)
    ref = attnref.sdpa(q, k, v, causal="bottom_right")
    wrong, _, _ = numpy_sdpa(q, k, v, dtype=np.float32, causal="top_left")
    with pytest.raises(AssertionError, match="is not close") as e:
        assert_attention_close(wrong, ref)
    assert not isinstance(e.value, InconclusiveError)


def test_missing_scale_fails():
    q, k, v = draw(12)
    ref = attnref.sdpa(q, k, v)
    wrong, _, _ = numpy_sdpa(q, k, v, dtype=np.float32, scale=1.0)  # forgot 1/sqrt(dk)
    with pytest.raises(AssertionError, match="Mismatched elements"):
        assert_attention_close(wrong, ref)


def test_one_row_off_by_a_thousandth_fails():
    q, k, v = draw(13)
    ref = attnref.sdpa(q, k, v)
    out, _, _ = numpy_sdpa(q, k, v, dtype=np.float32)
    out[1, 2, 3] *= np.float32(1.001)
    with pytest.raises(AssertionError, match=r"index \(1, 2, 3, "):
        assert_attention_close(out, ref)


def test_wrong_weights_fail():
    q, k, v = draw(14)
    ref = attnref.sdpa(q, k, v, return_weights=True)
    out, p, _ = numpy_sdpa(q, k, v, dtype=np.float32)
    p = p.copy()
    p[0, 0, 0, 0] *= np.float32(1.001)
    with pytest.raises(AssertionError, match="Attention weights is not close"):
        assert_attention_close(out, ref, weights=p)


def test_vacuous_bound_is_inconclusive_not_pass():
    # Logits near 1000 (q large): bf16 holds 2-3 significant digits there, so the bf16 bound exceeds
    # the outputs themselves. A correct bf16 candidate and the mean of V both end INCONCLUSIVE.
    q, k, v = draw(15)
    q = q * 400
    ref = attnref.sdpa(q, k, v)
    cand = attnref.sdpa(q, k, v, arith="bf16_fp32acc").output
    with pytest.raises(InconclusiveError, match="vacuous"):
        assert_attention_close(cand, ref, dtype="bfloat16")
    mean_v = np.repeat(v.mean(axis=2, keepdims=True), 2, axis=1).repeat(9, axis=2)
    with pytest.raises(InconclusiveError):
        assert_attention_close(mean_v.astype(np.float32), ref, dtype="bfloat16")


def test_all_zero_output_is_untrustworthy():
    q, k, v = draw(16)
    v = np.zeros_like(v)
    v[..., 0] = 1e-30  # outputs 0 except one column: > 30% exact zeros everywhere
    ref = attnref.sdpa(q, k, v)
    out, _, _ = numpy_sdpa(q, k, v, dtype=np.float32)
    with pytest.raises(InconclusiveError, match="untrustworthy"):
        assert_attention_close(out, ref)


def test_bound_admitting_a_decoy_is_inconclusive():
    # fp16 with logits scaled by 100: no bound reaches its row's scale (not vacuous by
    # find_vacuous), yet the bounds would pass the softmax at twice the scale, which is visibly
    # wrong: `attnref check`'s decoy rule makes that INCONCLUSIVE (found by sweeping the scale).
    rng = np.random.default_rng(15)
    q, k, v = rng.standard_normal((2, 4, 9, 16)) * 100, rng.standard_normal((2, 2, 12, 16)), rng.standard_normal((2, 2, 12, 8))
    ref = attnref.sdpa(q, k, v)
    cand = attnref.sdpa(q, k, v, arith="fp16_fp32acc").output
    with pytest.raises(InconclusiveError, match="trivially wrong output"):
        assert_attention_close(cand, ref, dtype="float16")


def test_empty_row_lse_convention():
    # Batch 0 has no valid key: FlashAttention 2/3 write lse = +inf there, attnref and PyTorch -inf.
    q, k, v = draw(17)
    ref = attnref.sdpa(q, k, v, key_lengths=[0, 12], return_lse=True)
    out, p, lse = numpy_sdpa(q, k, v, dtype=np.float32, key_lengths=[0, 12])
    assert np.isneginf(lse[0]).all()
    assert_attention_close(out, ref, weights=p, lse=lse)
    fa_lse = lse.copy()
    fa_lse[0] = np.inf
    assert_attention_close(out, ref, weights=p, lse=fa_lse, empty_row_lse="+inf")
    with pytest.raises(AssertionError, match="empty_row_lse"):
        assert_attention_close(out, ref, weights=p, lse=fa_lse)


def test_weight_on_a_masked_key_fails():
    q, k, v = draw(18)
    ref = attnref.sdpa(q, k, v, causal="top_left", return_weights=True)
    out, p, _ = numpy_sdpa(q, k, v, dtype=np.float32, causal="top_left")
    p = p.copy()
    p[1, 1, 4, 5] = np.float32(0.01)  # a masked key (j > i) given weight
    with pytest.raises(AssertionError, match=r"Attention weights is not close(.|\n)*index \(1, 1, 4, 5\)"):
        assert_attention_close(out, ref, weights=p)
