"""The Python API keeps its promises on hostile arguments: verdicts in the candidate's own format,
validated numeric options, inputs refused rather than rounded, head dimension 0 refused, one-line
errors naming the argument, and an up-front memory estimate with max_memory=."""
import os
import subprocess
import sys

import numpy as np
import pytest

import attnref
from attnref.testing import assert_attention_close

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "golden")
rng = np.random.default_rng(22)
Q, K, V = rng.standard_normal((1, 2, 5, 4)), rng.standard_normal((1, 2, 6, 4)), rng.standard_normal((1, 2, 6, 3))


def one_line(e):
    text = str(e.value)
    assert "\n" not in text and "incompatible function arguments" not in text, text
    return text


# --- attnref.check takes the format from the data -------------------------------------------------

def test_check_takes_the_format_from_the_arrays():
    case = os.path.join(GOLDEN, "sdpa_basic")
    exact = np.load(os.path.join(case, "output.npy"))
    # The certified output rounded to float32 is the correctly rounded float32 result: any valid
    # float32 bound passes it; judged as float64 it is 2^-24-relative wrong and must fail.
    out32 = exact.astype(np.float32)
    v = attnref.check(case, out32)
    assert v.verdict == "PASS", v.text
    assert "float32" in v.text
    assert attnref.check(case, exact).verdict == "PASS"
    assert attnref.check(case, out32, dtype="float64").verdict == "FAIL"  # an explicit dtype still decides
    # Arrays of different formats: each judged in its own, as `attnref check` judges each file.
    lse64 = np.load(os.path.join(case, "lse.npy"))
    v = attnref.check(case, out32, lse=lse64)
    assert v.verdict == "PASS", v.text
    assert "float32" in v.text and "float64" in v.text
    bwd = os.path.join(GOLDEN, "sdpa_bwd_gqa")
    wrong = np.load(os.path.join(bwd, "output.npy")).copy()
    wrong.flat[0] *= 1.001  # a float64 output 0.1% off in one element
    dq16 = np.load(os.path.join(bwd, "grad_query.npy")).astype(np.float16)  # a correct float16 dQ
    assert attnref.check(bwd, wrong).verdict == "FAIL"
    assert attnref.check(bwd, wrong, grad_query=dq16).verdict == "FAIL"  # the float16 dQ must not widen the output's bound
    with pytest.raises(TypeError, match="dtype"):
        attnref.check(case, out32.astype(np.int32))


# --- numeric options are validated ----------------------------------------------------------------

@pytest.mark.parametrize("ulp", [float("nan"), -1, float("inf"), -0.5])
def test_ulp_option_is_validated(ulp):
    expected = rng.standard_normal((2, 3)).astype(np.float32)
    with pytest.raises(ValueError, match="ulp") as e:
        assert_attention_close(expected * 2, expected, tolerance="ulp", ulp=ulp)
    one_line(e)
    with pytest.raises(TypeError, match="ulp"):
        assert_attention_close(expected * 2, expected, tolerance="ulp", ulp="4")
    with pytest.raises(AssertionError, match="not close"):
        assert_attention_close(expected * 2, expected, tolerance="ulp", ulp=4)


def test_float_options_are_validated():
    for kw in (dict(scale=float("nan")), dict(scale=float("inf")), dict(scale=-0.5), dict(scale=0.0), dict(softcap=-1.0),
               dict(softcap=float("nan")),
               dict(scale=2**1024), dict(alibi_slopes=[float("nan"), 1.0])):
        name = next(iter(kw))
        with pytest.raises(ValueError, match=name):
            attnref.sdpa(Q, K, V, **kw)


# --- inexact inputs are refused, not rounded ------------------------------------------------------

@pytest.mark.skipif(np.finfo(np.longdouble).nmant <= 52, reason="long double is float64 here")
def test_long_double_inputs_are_refused():
    q = Q.astype(np.longdouble)
    q[0, 1, 2, 3] += np.longdouble(2.0) ** -60
    with pytest.raises(ValueError, match=r"q: .*index \(0, 1, 2, 3\).*not exactly representable"):
        attnref.sdpa(q, K, V)
    attnref.sdpa(Q.astype(np.longdouble), K, V)  # exact long doubles are fine
    with pytest.raises(ValueError, match="scale"):
        attnref.sdpa(Q, K, V, scale=np.longdouble(1) / 3)
    with pytest.raises(ValueError, match="actual"):
        ref = attnref.sdpa(Q, K, V)
        assert_attention_close(q[..., :3] * 0 + np.longdouble(1) / 3, ref, dtype="float64")


def test_large_integers_are_refused():
    k = np.zeros(K.shape, dtype=np.int64)
    k[0, 0, 4, 1] = 2**53 + 1
    with pytest.raises(ValueError, match=r"k: .*index \(0, 0, 4, 1\)"):
        attnref.sdpa(Q, k, V)
    k[0, 0, 4, 1] = 2**60  # a power of two is exact
    attnref.sdpa(Q, k * 0 + 1, V, arith="float64")
    u = np.zeros(V.shape, dtype=np.uint64)
    u[0, 1, 0, 2] = 2**64 - 1  # rounds to 2^64, outside uint64
    with pytest.raises(ValueError, match=r"v: .*index \(0, 1, 0, 2\)"):
        attnref.sdpa(Q, K, u)
    with pytest.raises(ValueError, match="scale"):
        attnref.sdpa(Q, K, V, scale=2**53 + 1)


# --- head dimension 0 -----------------------------------------------------------------------------

@pytest.mark.parametrize("arith", ["certified", "float64", "float32", "bf16", "mpfr:134"])
def test_head_dimension_zero_is_refused(arith):
    with pytest.raises(ValueError, match=r"q: the head dimension"):
        attnref.sdpa(np.zeros((1, 1, 3, 0)), np.zeros((1, 1, 4, 0)), np.ones((1, 1, 4, 2)), arith=arith)
    x = np.ones((1, 3, 4))
    with pytest.raises(ValueError, match=r"w_q: the head dimension"):
        attnref.mha(x, x, x, np.zeros((4, 0)), np.zeros((4, 0)), np.ones((4, 2)), np.ones((2, 4)), heads=1, arith=arith)


# --- one-line errors naming the argument -----------------------------------------------------------

def test_zero_dimensional_input_reports_its_shape():
    with pytest.raises(ValueError, match=r"q: expected 4 dimensions.*got shape \(\)") as e:
        attnref.sdpa(np.float64(1.0), K, V)
    one_line(e)


@pytest.mark.parametrize("kw, name", [(dict(threads=2**64), "threads"), (dict(window=(2**64, 0)), r"window\[0\]"),
                                      (dict(window=(0, 2**63)), r"window\[1\]"), (dict(key_lengths=[2**64]), "key_lengths"),
                                      (dict(key_lengths=np.array([2**63], dtype=np.uint64)), "key_lengths"),
                                      (dict(diagonal_offset=2**64), "diagonal_offset")])
def test_huge_ints_name_the_argument(kw, name):
    with pytest.raises(ValueError, match=name) as e:
        attnref.sdpa(Q, K, V, **kw)
    one_line(e)


def test_huge_heads_name_the_argument():
    x = np.ones((1, 3, 4))
    for kw, name in ((dict(heads=2**64), "heads"), (dict(heads=1, kv_heads=2**64), "kv_heads")):
        with pytest.raises(ValueError, match=name) as e:
            attnref.mha(x, x, x, np.ones((4, 2)), np.ones((4, 2)), np.ones((4, 2)), np.ones((2, 4)), **kw)
        one_line(e)


def test_check_options_name_the_argument():
    case = os.path.join(GOLDEN, "sdpa_bwd_gqa")
    dq = np.load(os.path.join(case, "grad_query.npy")).astype(np.float32)
    for kw, name in ((dict(backward_algorithm=1), "backward_algorithm"), (dict(tolerance=3), "tolerance"),
                     (dict(empty_row_lse=None), "empty_row_lse"), (dict(backward_algorithm="fast"), "backward_algorithm")):
        with pytest.raises((TypeError, ValueError), match=name) as e:
            attnref.check(case, grad_query=dq, **kw)
        one_line(e)


def test_nul_in_a_path_is_named_and_escaped():
    for call, name in ((lambda p: attnref.load_case(p), "path"), (lambda p: attnref.check(p, np.zeros(3)), "case")):
        with pytest.raises(ValueError, match=name) as e:
            call(GOLDEN + "/sdpa_basic\0/after")
        text = one_line(e)
        assert "\\x00/after" in text


# --- memory ---------------------------------------------------------------------------------------

def test_memory_is_estimated_and_refused_up_front():
    q = np.zeros((1, 1, 20000, 2))
    for arith in ("certified", "float64", "mpfr:134"):
        with pytest.raises(attnref.MemoryLimitError, match=r"max_memory: .*GiB") as e:
            attnref.sdpa(q, q, q, arith=arith, max_memory="1G")
        one_line(e)
        assert isinstance(e.value, ValueError) and isinstance(e.value, MemoryError)
    big = np.zeros((1, 1, 300000, 2))
    with pytest.raises(attnref.MemoryLimitError, match="max_memory"):
        attnref.sdpa(big, big, big)  # 9e10 weights at 9 bytes exceed any default limit (half the machine, at least 4 GiB)
    for bad in (0, -1, "4X", "", 1.5, True):
        with pytest.raises((TypeError, ValueError), match="max_memory"):
            attnref.sdpa(Q, K, V, max_memory=bad)


MEASURE = r"""
import json, sys
import numpy as np, attnref
shape, arith = json.loads(sys.argv[1]), sys.argv[2]
q = np.random.default_rng(0).standard_normal(shape)
kw = {}
if arith == "gradients":  # certified, with the fast certified backward
    arith, kw = "certified", {"grad_output": q[::-1].copy()}
small = {n: a[:, :, :4] for n, a in kw.items()}
attnref.sdpa(q[:, :, :4], q[:, :, :4], q[:, :, :4], arith=arith, **small)  # warm up: code, thread pools, MPFR caches
try:
    attnref.sdpa(q, q, q, arith=arith, max_memory=1, **kw)
except attnref.MemoryLimitError as e:
    estimate = int(str(e).split("(")[1].split(" bytes")[0])
def status(field):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(field + ":"))
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets the peak RSS (VmHWM) to the current RSS (Linux >= 4.0)
before = status("VmRSS")
ref = attnref.sdpa(q, q, q, arith=arith, **kw)
print(json.dumps([estimate, status("VmHWM") - before]))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's peak-RSS reset")
@pytest.mark.parametrize("shape, arith", [((1, 2, 1200, 8), "certified"), ((1, 2, 1200, 8), "float64"),
                                          ((1, 2, 700, 8), "bf16"), ((1, 1, 400, 4), "bin50"),
                                          ((1, 1, 500, 4), "mpfr:134"), ((1, 1, 500, 4), "mpfr:267"),
                                          ((1, 4, 256, 32), "gradients")])
def test_memory_estimate_covers_the_measured_peak(shape, arith):
    import json
    r = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(shape), arith], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    estimate, grown = json.loads(r.stdout)
    assert 4 << 20 <= grown <= estimate, (estimate, grown)  # a call large enough to measure, within its estimate
    assert estimate <= 4 * grown, (estimate, grown)  # and not uselessly loose


def test_escalation_beyond_the_limit_is_refused_not_run():
    # Every key masked, empty_rows="uniform": the output is the mean of V's two rows; feature 1,
    # (1 + (1 + 2^-52)) / 2 = 1 + 2^-53, lies exactly halfway between the doubles 1 and 1 + 2^-52:
    # the fast path's enclosure straddles the midpoint, so it escalates to MPFI, whose exact point
    # interval rounds (ties to even) to 1.0.
    v = np.array([[[[1.0, 1.0], [1.0, 1.0 + 2.0 ** -52]]]])
    q, k = np.zeros((1, 1, 1, 2)), np.zeros((1, 1, 2, 2))
    kw = dict(key_lengths=[0], empty_rows="uniform")
    ref = attnref.sdpa(q, k, v, **kw)
    assert ref.output.tolist() == [[[[1.0, 1.0]]]] and ref.certification[0]["escalated"] == 1
    # A limit just above the fast path's estimate (read from its refusal) but below what escalating
    # the undecided row adds: refused when the escalation is needed, never run past the limit.
    with pytest.raises(attnref.MemoryLimitError) as e:
        attnref.sdpa(q, k, v, max_memory=1, **kw)
    base = int(one_line(e).split("(")[1].split(" bytes")[0])
    with pytest.raises(attnref.MemoryLimitError, match=r"max_memory: 1 element\(s\) .*MPFI") as e:
        attnref.sdpa(q, k, v, max_memory=base + 1, **kw)
    one_line(e)


# --- argument errors say what is wrong, before any estimate or copy ---------------------------------

def test_check_treats_a_gradient_of_none_as_not_given():
    case = os.path.join(GOLDEN, "sdpa_basic")
    with pytest.raises(ValueError) as e:
        attnref.check(case, grad_query=None)
    assert "output: give the output" in one_line(e)
    # With the output given, a None gradient is simply absent.
    out = np.load(os.path.join(case, "output.npy"))
    assert attnref.check(case, out, grad_query=None).verdict == "PASS"


def test_mha_heads_that_do_not_divide_w_q_are_a_shape_error_not_a_memory_limit():
    x = rng.standard_normal((1, 2, 4))
    w = rng.standard_normal((4, 4))
    for heads in (3, 2**40):
        with pytest.raises(ValueError) as e:
            attnref.mha(x, x, x, w_q=w, w_k=w, w_v=w, w_o=w, heads=heads)
        text = one_line(e)
        assert "w_q axis 1" in text and f"multiple of heads {heads}" in text, text
        assert not isinstance(e.value, attnref.MemoryLimitError)


def test_a_huge_broadcast_view_is_refused_naming_the_argument():
    huge = np.broadcast_to(np.zeros(2), (2**20, 2**20, 1, 2))  # 2^41 values, no memory until copied
    small = np.zeros((1, 1, 1, 2))
    for args, name in (((huge, small, small), "q"), ((small, huge, small), "k")):
        with pytest.raises(attnref.MemoryLimitError) as e:
            attnref.sdpa(*args)
        text = one_line(e)
        assert text.startswith(f"{name}: shape (1048576, 1048576, 1, 2)") and "machine's memory" in text, text
    with pytest.raises(attnref.MemoryLimitError) as e:
        attnref.sdpa(small, small, small, mask=np.broadcast_to(True, (2**20, 2**20, 1, 1)))
    assert one_line(e).startswith("mask: shape")
    with pytest.raises(attnref.MemoryLimitError) as e:
        attnref.check(os.path.join(GOLDEN, "sdpa_basic"), np.broadcast_to(np.zeros(8), (2**20, 2**20, 8, 8)))
    assert one_line(e).startswith("output: shape")


def test_bfloat16_torch_tensors_are_read_exactly():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=g).bfloat16() for _ in range(3))
    r = attnref.sdpa(q, k, v)
    # The same values as float64 (bfloat16 -> float32 -> float64 is exact): the same certified output.
    r64 = attnref.sdpa(q.double().numpy(), k.double().numpy(), v.double().numpy())
    assert np.array_equal(r.output, r64.output)


# --- certified gradients take the fast certified backward, as `attnref generate --gradients` --------

def test_certified_gradients_take_the_fast_backward_and_match_the_mpfi_ladder(tmp_path):
    g = np.random.default_rng(5)
    q, k, v = g.standard_normal((1, 2, 6, 4)), g.standard_normal((1, 2, 7, 4)), g.standard_normal((1, 2, 7, 3))
    do = g.standard_normal((1, 2, 6, 3))
    r = attnref.sdpa(q, k, v, causal="bottom_right", grad_output=do)
    grads = [c for c in r.certification if c["tensor"].startswith("grad_")]
    assert grads and all(c["precisions_bits"] == [106] for c in grads), grads  # decided by the fast rung
    # The same gradients from the MPFI ladder alone (a different algorithm), through the command.
    src = tmp_path / "in"
    src.mkdir()
    for name, a in (("query", q), ("key", k), ("value", v), ("grad_output", do)):
        np.save(src / f"{name}.npy", a)
    exe = os.environ.get("ATTNREF_BIN", "attnref")
    subprocess.run([exe, "generate", "--name", "g", "--kind", "sdpa", "--inputs-from", str(src), "--causal", "bottom_right",
                    "--gradients", "--method", "mpfi", "--out", str(tmp_path), "--quiet"], check=True)
    for role in ("grad_query", "grad_key", "grad_value"):
        assert np.array_equal(r.gradients[role], np.load(tmp_path / "g" / f"{role}.npy")), role
