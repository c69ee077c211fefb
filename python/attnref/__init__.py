"""attnref: certified reference values of Transformer attention for your own tensors.

    import attnref
    ref = attnref.sdpa(q, k, v, causal="bottom_right")        # correctly rounded float64
    attnref.testing.assert_attention_close(my_out, ref, dtype="float32")

``attnref.sdpa`` and ``attnref.mha`` compute scaled dot-product and multi-head attention with every
convention an explicit keyword (``help(attnref.sdpa)`` lists them with their PyTorch,
FlashAttention and ONNX equivalents) in a chosen arithmetic; the default, ``arith="certified"``,
returns every element correctly rounded to float64. ``attnref.testing.assert_attention_close``
gates an implementation's output against such a reference with a per-element, data-aware bound.

Inputs: NumPy arrays or anything NumPy can read through ``__array__`` or DLPack (PyTorch CPU
tensors). Float64 C-contiguous arrays are read in place; others are converted to float64 once
(exact for float16/float32). Computations release the GIL.

Committed golden cases: ``attnref.load_case(path)`` returns a case's inputs, conventions and
certified outputs; ``attnref.check(case, output=...)`` judges a candidate against it exactly as the
``attnref check`` command does and returns the verdict (text, JSON and JUnit reports).
"""
from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _attnref
from ._attnref import UncertifiedError
from ._conventions import CONVENTIONS
from .suite import case_path as _suite_case_path, suite_cases, suite_dir

__all__ = ["sdpa", "mha", "Reference", "UncertifiedError", "POLICIES", "MPFR_BITS", "testing"]

#: Precision policy names accepted by ``arith=`` (attnref/policies.hpp).
POLICIES: Tuple[str, ...] = ("float32", "float64", "longdouble", "float128", "bin50", "bf16", "fp16", "bf16_fp32acc",
                             "fp16_fp32acc", "fp32_p_bf16", "fp32_p_fp8e4m3", "fp32_p_fp8e5m2")
#: The MPFR precisions (bits) ``arith="mpfr:BITS"`` accepts.
MPFR_BITS: Tuple[int, ...] = tuple(_attnref._mpfr_bits())

ArrayLike = Any  # numpy.ndarray, torch.Tensor (CPU), anything with __array__ or __dlpack__


@dataclass(frozen=True, eq=False)
class Reference:
    """What ``attnref.sdpa`` / ``attnref.mha`` return.

    Attributes:
        output: (B, H, Sq, dv) for sdpa, (B, Sq, E_out) for mha.
        weights: attention weights P (B, H, Sq, Sk) when ``return_weights=True`` (else None).
        lse: log-sum-exp of the logits (B, H, Sq), natural log, when ``return_lse=True`` (else None).
        arith: the arithmetic that computed the values.
        certification: arith="certified" only: per tensor (output, weights, lse) a dict with
            ``elements``, ``certified`` (== elements), ``escalated`` (elements that needed more than
            the first precision) and ``precisions_bits`` (the precisions elements were certified at).
        kind: "sdpa" or "mha".
    The object also keeps a snapshot of the call's inputs and conventions (and, for certified
    references, the certified weights even when not returned), from which
    ``attnref.testing.assert_attention_close`` derives its per-element bounds.
    """

    output: np.ndarray
    weights: Optional[np.ndarray]
    lse: Optional[np.ndarray]
    arith: str
    certification: List[Dict[str, Any]]
    kind: str
    _call: Any = field(repr=False, compare=False)
    _bound_weights: Optional[np.ndarray] = field(repr=False, compare=False)
    _bound_lse: Optional[np.ndarray] = field(repr=False, compare=False)

    @property
    def certified(self) -> bool:
        """True when every element is the correctly rounded float64 of the exact result."""
        return self.arith == "certified"


def _as_float64(x: ArrayLike, name: str, *, allow_neg_inf: bool = False, allow_nonfinite: bool = False) -> np.ndarray:
    """x as a float64 C-contiguous array without copying when it already is one. Inputs of a
    reference must be finite; a candidate's outputs (allow_nonfinite) may hold NaN and inf."""
    if x is None:
        raise TypeError(f"{name}: expected an array, got None")
    a = None
    err: Optional[Exception] = None
    if isinstance(x, np.ndarray):
        a = x
    else:
        try:
            a = np.asarray(x)
        except Exception as e:  # e.g. a torch tensor that requires grad, or in bfloat16
            err = e
        if (a is None or a.dtype == object) and hasattr(x, "__dlpack__"):
            try:
                a = np.from_dlpack(x)
                err = None
            except Exception as e:
                err = e
    if a is None or err is not None:
        hint = ""
        text = str(err)
        if "bfloat16" in str(getattr(x, "dtype", "")):
            hint = f" (pass {name}.float(): exact for bfloat16)"
        elif "grad" in text:
            hint = f" (pass {name}.detach())"
        elif "BFloat16" in text or "bfloat16" in text:
            hint = f" (pass {name}.float(): exact for bfloat16)"
        raise TypeError(f"{name}: cannot read {type(x).__name__} as an array: {text}{hint}")
    if a.dtype == np.bool_ or not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise TypeError(f"{name}: expected real floating-point (or integer) values, got dtype {a.dtype}")
    a = np.ascontiguousarray(a, dtype=np.float64)
    if allow_nonfinite:
        return a
    bad = ~np.isfinite(a)
    if allow_neg_inf:
        bad &= ~np.isneginf(a)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        what = "NaN or +inf" if allow_neg_inf else "NaN or inf"
        raise ValueError(f"{name}: {what} at index {idx} ({a[idx]}); a reference needs finite inputs")
    return a


def _mask4(x: ArrayLike, name: str, dtype: Any) -> np.ndarray:
    if dtype is np.uint8:
        a = np.asarray(x)
        if a.dtype != np.bool_:
            raise TypeError(f"{name}: expected a boolean array, got dtype {a.dtype}")
        a = a.astype(np.uint8)
    else:
        a = _as_float64(x, name, allow_neg_inf=True)
    if a.ndim < 2 or a.ndim > 4:
        raise ValueError(f"{name}: expected 2 to 4 dimensions ((Sq, Sk) up to (B, H, Sq, Sk)), got shape {a.shape}")
    return np.ascontiguousarray(a.reshape((1,) * (4 - a.ndim) + a.shape))


def _optional_int(x: Any, name: str) -> Optional[int]:
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{name}: expected an int or None, got {type(x).__name__}")
    if x < 0:
        raise ValueError(f"{name}: expected a nonnegative int, got {x}")
    return int(x)


def _optional_float(x: Any, name: str, positive: bool = False) -> Optional[float]:
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name}: expected a float or None, got {type(x).__name__}")
    v = float(x)
    if not math.isfinite(v) or (positive and v <= 0):
        raise ValueError(f"{name}: expected a finite{' positive' if positive else ''} float, got {v}")
    return v


def _choice(x: Any, name: str, options: Sequence[str]) -> str:
    if not isinstance(x, str) or x not in options:
        raise ValueError(f"{name}: expected one of {', '.join(repr(o) for o in options)}, got {x!r}")
    return x


def _conventions(scale: Any, scale_placement: Any, causal: Any, alignment: Any, diagonal_offset: Any, window: Any, key_lengths: Any,
                 mask: Any, mask_polarity: Any, additive_mask: Any, empty_rows: Any, softcap: Any, alibi_slopes: Any,
                 threads: Any) -> Dict[str, Any]:
    if causal is True or causal is False:
        raise TypeError('causal: expected None, "top_left" (PyTorch is_causal) or "bottom_right" (FlashAttention), got a bool')
    if causal is not None:
        _choice(causal, "causal", ("top_left", "bottom_right"))
    if alignment is not None:
        _choice(alignment, "alignment", ("top_left", "bottom_right"))
        if causal is not None and alignment != causal:
            raise ValueError(f"alignment: {alignment!r} contradicts causal={causal!r} (they share one diagonal)")
    align = alignment or causal or "top_left"
    if isinstance(diagonal_offset, bool) or not isinstance(diagonal_offset, (int, np.integer)):
        raise TypeError(f"diagonal_offset: expected an int, got {type(diagonal_offset).__name__}")
    if abs(int(diagonal_offset)) > 2**53:
        raise ValueError(f"diagonal_offset: expected |offset| <= 2**53, got {diagonal_offset}")
    left = right = None
    if window is not None:
        if not isinstance(window, (tuple, list)) or len(window) != 2:
            raise TypeError("window: expected None or a pair (left, right) of ints or None")
        left, right = _optional_int(window[0], "window[0]"), _optional_int(window[1], "window[1]")
    lengths = None
    if key_lengths is not None:
        kl = np.asarray(key_lengths)
        if kl.ndim != 1 or not (np.issubdtype(kl.dtype, np.integer) or kl.size == 0):
            raise TypeError(f"key_lengths: expected a 1-d sequence of ints, got dtype {kl.dtype} shape {kl.shape}")
        if (kl < 0).any():
            raise ValueError(f"key_lengths: expected nonnegative lengths, got {kl.tolist()}")
        lengths = [int(n) for n in kl]
    slopes = None
    if alibi_slopes is not None:
        s = _as_float64(alibi_slopes, "alibi_slopes")
        if s.ndim != 1:
            raise ValueError(f"alibi_slopes: expected one slope per query head (1-d), got shape {s.shape}")
        slopes = [float(v) for v in s]
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 0:
        raise ValueError(f"threads: expected an int >= 0 (0 = all cores), got {threads!r}")
    return dict(scale=_optional_float(scale, "scale"),
                scale_placement=_choice(scale_placement, "scale_placement", ("on_product", "on_query", "split_sqrt")),
                causal="none" if causal is None else "causal", alignment=align, diagonal_offset=int(diagonal_offset),
                window_left=left, window_right=right, window=window is not None, key_lengths=lengths,
                mask=None if mask is None else _mask4(mask, "mask", np.uint8),
                mask_polarity=_choice(mask_polarity, "mask_polarity", ("true_means_attend", "true_means_masked")),
                additive_mask=None if additive_mask is None else _mask4(additive_mask, "additive_mask", np.float64),
                empty_rows=_choice(empty_rows, "empty_rows", ("zero", "nan", "uniform")),
                softcap=_optional_float(softcap, "softcap", positive=True), alibi_slopes=slopes, threads=int(threads))


def _arith(arith: Any) -> str:
    if not isinstance(arith, str):
        raise TypeError(f"arith: expected a string, got {type(arith).__name__}")
    if arith == "certified" or arith in POLICIES:
        return arith
    if arith.startswith("mpfr:"):
        bits = arith[5:]
        if bits.isdigit() and int(bits) in MPFR_BITS:
            return arith
        raise ValueError(f"arith: {arith!r}: the compiled MPFR precisions are {', '.join(f'mpfr:{b}' for b in MPFR_BITS)}")
    raise ValueError(f"arith: expected 'certified', a policy name ({', '.join(POLICIES)}) or 'mpfr:BITS', got {arith!r}")


def _run(kind: str, arrays: Dict[str, Optional[np.ndarray]], heads: int, kv_heads: int, conv: Dict[str, Any], arith: str,
         return_weights: bool, return_lse: bool) -> Reference:
    call = _attnref._make_call(kind, arrays["q"], arrays["k"], arrays["v"], arrays.get("w_q"), arrays.get("w_k"),
                               arrays.get("w_v"), arrays.get("w_o"), arrays.get("b_q"), arrays.get("b_k"), arrays.get("b_v"),
                               arrays.get("b_o"), heads, kv_heads, **conv)
    # Weights and lse are always computed: the weights feed the data-aware bound of assert_attention_close.
    r = _attnref._compute(call, arith, True, True)
    # The snapshot the bounds are derived from: copies, so later in-place changes to the caller's
    # arrays cannot change a bound.
    snapshot = {n: (None if a is None else a.copy()) for n, a in arrays.items()}
    conv_copy = dict(conv)
    for n in ("mask", "additive_mask"):
        if conv_copy[n] is not None:
            conv_copy[n] = conv_copy[n].copy()
    kept = _attnref._make_call(kind, snapshot["q"], snapshot["k"], snapshot["v"], snapshot.get("w_q"), snapshot.get("w_k"),
                               snapshot.get("w_v"), snapshot.get("w_o"), snapshot.get("b_q"), snapshot.get("b_k"),
                               snapshot.get("b_v"), snapshot.get("b_o"), heads, kv_heads, **conv_copy)
    for a in (r["output"], r["weights"], r["lse"]):
        if a is not None:
            a.setflags(write=False)
    return Reference(output=r["output"], weights=r["weights"] if return_weights else None,
                     lse=r["lse"] if return_lse else None, arith=arith, certification=list(r["certification"]), kind=kind,
                     _call=kept, _bound_weights=r["weights"], _bound_lse=r["lse"])


def sdpa(q: ArrayLike, k: ArrayLike, v: ArrayLike, *, scale: Optional[float] = None, scale_placement: str = "on_product",
         causal: Optional[str] = None, alignment: Optional[str] = None, diagonal_offset: int = 0,
         window: Optional[Tuple[Optional[int], Optional[int]]] = None, key_lengths: Optional[Sequence[int]] = None, mask: Optional[ArrayLike] = None,
         mask_polarity: str = "true_means_attend", additive_mask: Optional[ArrayLike] = None, empty_rows: str = "zero",
         softcap: Optional[float] = None, alibi_slopes: Optional[ArrayLike] = None, arith: str = "certified",
         return_weights: bool = False, return_lse: bool = False, threads: int = 0) -> Reference:
    """Scaled dot-product attention of q (B, H, Sq, dk), k (B, Hkv, Sk, dk), v (B, Hkv, Sk, dv).

    Returns a Reference: ``.output`` (B, H, Sq, dv), and ``.weights`` (B, H, Sq, Sk) / ``.lse``
    (B, H, Sq) when asked for. With the default ``arith="certified"`` every element is the
    correctly rounded float64 of the exact attention of the given inputs.

    Raises ValueError or TypeError naming the argument for bad shapes, dtypes or options, and
    attnref.UncertifiedError for an element that no precision certifies.
    """
    conv = _conventions(scale, scale_placement, causal, alignment, diagonal_offset, window, key_lengths, mask, mask_polarity,
                        additive_mask, empty_rows, softcap, alibi_slopes, threads)
    arrays = {"q": _as_float64(q, "q"), "k": _as_float64(k, "k"), "v": _as_float64(v, "v")}
    for n in ("q", "k", "v"):
        if arrays[n].ndim != 4:
            raise ValueError(f"{n}: expected 4 dimensions (B, H, S, d), got shape {arrays[n].shape}")
    return _run("sdpa", arrays, 0, 0, conv, _arith(arith), return_weights, return_lse)


def mha(x_q: ArrayLike, x_k: ArrayLike, x_v: ArrayLike, w_q: ArrayLike, w_k: ArrayLike, w_v: ArrayLike, w_o: ArrayLike,
        b_q: Optional[ArrayLike] = None, b_k: Optional[ArrayLike] = None, b_v: Optional[ArrayLike] = None,
        b_o: Optional[ArrayLike] = None, *, heads: int, kv_heads: Optional[int] = None, scale: Optional[float] = None,
        scale_placement: str = "on_product", causal: Optional[str] = None, alignment: Optional[str] = None,
        diagonal_offset: int = 0,
        window: Optional[Tuple[Optional[int], Optional[int]]] = None, key_lengths: Optional[Sequence[int]] = None,
        mask: Optional[ArrayLike] = None, mask_polarity: str = "true_means_attend", additive_mask: Optional[ArrayLike] = None,
        empty_rows: str = "zero", softcap: Optional[float] = None, alibi_slopes: Optional[ArrayLike] = None,
        arith: str = "certified", return_weights: bool = False, return_lse: bool = False, threads: int = 0) -> Reference:
    """Multi-head attention: projections, heads, scaled dot-product attention, output projection.

    Layout y = x @ W + b (attnref's): x_q (B, Sq, E), x_k, x_v (B, Sk, E_k), (B, Sk, E_v);
    w_q (E, H*dk), w_k (E_k, Hkv*dk), w_v (E_v, Hkv*dv), w_o (H*dv, E_out); biases optional
    (H*dk,), (Hkv*dk,), (Hkv*dv,), (E_out,). Head h owns columns [h*d, (h+1)*d).
    From PyTorch ``nn.MultiheadAttention`` / ``F.multi_head_attention_forward`` (E = embed_dim):
    w_q = in_proj_weight[:E].T, w_k = in_proj_weight[E:2E].T, w_v = in_proj_weight[2E:].T,
    (b_q, b_k, b_v) = in_proj_bias.split(E), w_o = out_proj.weight.T, b_o = out_proj.bias; its
    bool ``attn_mask``/``key_padding_mask`` are mask_polarity="true_means_masked", and its
    weights with ``need_weights=True`` use empty_rows="nan".

    ``heads`` query heads, ``kv_heads`` key/value heads (None = heads; 1 = MQA; else GQA).
    Returns a Reference: ``.output`` (B, Sq, E_out), ``.weights`` (B, H, Sq, Sk), ``.lse`` (B, H, Sq).
    Raises ValueError or TypeError naming the argument for bad shapes, dtypes or options.
    """
    h = _optional_int(heads, "heads")
    if not h:
        raise ValueError(f"heads: expected an int >= 1, got {heads!r}")
    kvh = h if kv_heads is None else _optional_int(kv_heads, "kv_heads")
    if not kvh or h % kvh:
        raise ValueError(f"kv_heads: expected a divisor of heads={h}, got {kv_heads!r}")
    conv = _conventions(scale, scale_placement, causal, alignment, diagonal_offset, window, key_lengths, mask, mask_polarity,
                        additive_mask, empty_rows, softcap, alibi_slopes, threads)
    arrays: Dict[str, Optional[np.ndarray]] = {
        "q": _as_float64(x_q, "x_q"), "k": _as_float64(x_k, "x_k"), "v": _as_float64(x_v, "x_v"),
        "w_q": _as_float64(w_q, "w_q"), "w_k": _as_float64(w_k, "w_k"), "w_v": _as_float64(w_v, "w_v"),
        "w_o": _as_float64(w_o, "w_o")}
    for n, b in (("b_q", b_q), ("b_k", b_k), ("b_v", b_v), ("b_o", b_o)):
        arrays[n] = None if b is None else _as_float64(b, n)
    for n, rank, label in (("q", 3, "x_q"), ("k", 3, "x_k"), ("v", 3, "x_v"), ("w_q", 2, "w_q"), ("w_k", 2, "w_k"),
                           ("w_v", 2, "w_v"), ("w_o", 2, "w_o"), ("b_q", 1, "b_q"), ("b_k", 1, "b_k"), ("b_v", 1, "b_v"),
                           ("b_o", 1, "b_o")):
        a = arrays[n]
        if a is not None and a.ndim != rank:
            raise ValueError(f"{label}: expected {rank} dimensions, got shape {a.shape}")
    return _run("mha", arrays, h, kvh, conv, _arith(arith), return_weights, return_lse)


sdpa.__doc__ = (sdpa.__doc__ or "") + textwrap.indent(CONVENTIONS, "    ")
mha.__doc__ = (mha.__doc__ or "") + textwrap.indent(CONVENTIONS, "    ")


@dataclass(frozen=True)
class GoldenCase:
    """A committed golden case (golden/<name>/), verified on loading: the manifest strictly parsed,
    every file's sha256, dtype and shape checked.

    Attributes: ``path``; ``name``; ``kind`` ("sdpa" or "mha"); ``conventions``: the case description
    as in its manifest.json (shapes, conventions, inputs, outputs); ``inputs``: role → array (q, k, v
    or x_q, x_k, x_v and the projections, masks), float64 (the boolean mask as bool);
    ``reference``: "output", "weights", "lse" → certified float64 arrays (those the case stores).
    """

    path: str
    name: str
    kind: str
    conventions: Dict[str, Any]
    inputs: Dict[str, np.ndarray]
    reference: Dict[str, np.ndarray]


def load_case(path: Any) -> GoldenCase:
    """Loads and verifies the golden case directory ``path`` (e.g. ``golden/mha_seed_example``), or
    the suite case of that name when ``path`` is a bare name that is not a directory here
    (``load_case("sdpa_gqa")``; the suite is ``attnref.suite_dir()``).

    Raises ValueError naming the file and field when the directory is not a valid case (the same
    checks as ``attnref check``: regular files only, sha256, headers, shapes, memory limit)."""
    import json
    import os
    p = os.fspath(path)
    p = p if os.path.exists(p) else (_suite_case_path(p) or p)
    name, kind, conventions, inputs, reference = _attnref._load_case(p)
    return GoldenCase(p, name, kind, json.loads(conventions), dict(inputs), dict(reference))


@dataclass(frozen=True)
class Verdict:
    """The checker's verdict: ``verdict`` is "PASS", "FAIL" or "INCONCLUSIVE" (a bound too loose to
    tell right from wrong, or an untrustworthy output: never a pass); ``reason`` says what decided a
    FAIL or INCONCLUSIVE; ``text``, ``json`` and ``junit`` are the reports ``attnref check`` writes."""

    verdict: str
    reason: str
    text: str
    json: str
    junit: str

    @property
    def passed(self) -> bool:
        return self.verdict == "PASS"

    def __bool__(self) -> bool:
        return self.passed


def check(case: Any, output: Any = None, *, weights: Any = None, lse: Any = None, dtype: str = "float64",
          tolerance: str = "data-aware", empty_row_lse: str = "-inf", backward_algorithm: Optional[str] = None,
          **gradients: Any) -> Verdict:
    """Judges a candidate's outputs against a committed golden case, as ``attnref check`` does.

    ``case``: a GoldenCase or a case directory. ``output`` (and optionally ``weights`` (B, H, Sq, Sk)
    and ``lse`` (B, H, Sq)): arrays in the case's shapes holding values of ``dtype`` ("float64",
    "float32", "bfloat16", "float16"; bfloat16 tensors: pass ``.float()``). ``tolerance``: the model
    (``attnref.testing`` lists them; default "data-aware"). ``empty_row_lse``: the lse your kernel
    writes for fully masked rows ("-inf", "+inf" as FlashAttention 2/3, or "any").
    Backward cases (``golden/*_bwd_*``): gradients by role as keywords — ``grad_query``, ``grad_key``,
    ``grad_value`` (sdpa dQ, dK, dV; mha the gradients of x_q, x_k, x_v), and for mha ``grad_w_q`` …
    ``grad_w_o``, ``grad_b_q`` … ``grad_b_o`` — judged against the certified gradients with the
    gradient bound (docs/backward.md; "data-aware" or "baseline"); ``output`` is then optional.
    ``backward_algorithm``: "textbook" when your backward forms dS from the forward's own normalised
    weights (autograd through softmax does): dQ's bound then centres the keys ((B5t)), much tighter for
    large logits; "flash" or None (unknown) keep the bound valid for any algorithm.
    Returns a Verdict (truthy when it is PASS); raises ValueError for unusable input."""
    path = case.path if isinstance(case, GoldenCase) else __import__("os").fspath(case)

    def arr(x: Any, what: str) -> Optional[np.ndarray]:
        if x is None:
            return None
        return _as_float64(x, what, allow_nonfinite=True)

    for role in gradients:
        if not role.startswith("grad_"):
            raise TypeError(f"check() got an unexpected keyword argument '{role}'")
    if output is None and not gradients:
        raise ValueError("output: give the output, or at least one gradient (grad_query=…, …)")
    grads = [(role, arr(g, role)) for role, g in gradients.items() if g is not None]
    result = _attnref._check(path, arr(output, "output"), arr(weights, "weights"), arr(lse, "lse"), dtype, tolerance,
                             empty_row_lse, grads, "unknown" if backward_algorithm is None else backward_algorithm)
    return Verdict(*result)


from . import testing  # noqa: E402  (after the definitions testing imports)
