"""Gating in pytest: ``assert_attention_close``.

    ref = attnref.sdpa(q, k, v, causal="top_left")                 # certified float64
    attnref.testing.assert_attention_close(my_kernel(q32, k32, v32), ref, dtype="float32")

The default tolerance, "data-aware", is attnref's per-element a-priori bound on the rounding error
of any correct implementation in the candidate's precision (include/attnref/bounds/tolerance.hpp:
probabilistic rounding-error analysis, lambda = 8, or the rigorous worst-case bound where that is
smaller), computed from the reference's own inputs and weights. A check that finds no violation
still fails, with InconclusiveError (an AssertionError), when a pass would prove nothing: a bound is
vacuous (as large as the row's largest |expected|, or not finite) or the output is untrustworthy
(> 30% exact zeros outside empty rows, or all rows identical). Never a silent pass.

Gradients: with a Reference computed with ``grad_output=``, ``grad_query=``, ``grad_key=``,
``grad_value=`` (mha also ``grad_w_q`` ... ``grad_b_o``) are judged by the checker's own gradient
rules (check/checker.hpp check_gradients: the data-aware gradient bound of docs/backward.md, its
vacuity and decoy rules, the gradient invariants), exactly as ``attnref check --grad-*`` judges a
backward case; ``actual`` may then be None.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

import numpy as np

from . import _attnref

from .suite import suite_cases  # noqa: F401  (attnref.suite_cases, re-exported for pytest.mark.parametrize)

__all__ = ["assert_attention_close", "InconclusiveError", "suite_cases"]

_FORMATS = ("float64", "float32", "bfloat16", "float16")
_MODELS = ("data-aware", "worst-case", "assert-close", "ulp")
_MODEL_TEXT = {
    "data-aware": "data-aware (probabilistic rounding-error bound, lambda=8, per element; tolerance.hpp)",
    "worst-case": "worst-case (rigorous first-order a-priori bound per element; tolerance.hpp)",
    "assert-close": "assert-close (torch.testing.assert_close's default rtol/atol for the dtype)",
    "ulp": "ulp (distance in units in the last place of the dtype)",
}


class InconclusiveError(AssertionError):
    """No element exceeded its bound, but a pass would prove nothing (vacuous bound or untrustworthy output)."""


def _candidate(x: Any, name: str) -> "tuple[np.ndarray, Optional[str]]":
    """(float64 C-contiguous values, the format its dtype implies or None). A tensor that requires
    grad is read through ``.detach()``; values float64 cannot hold exactly are a ValueError."""
    from . import _inexact_in_float64, _require_fits  # the package imports this module at its end
    if getattr(x, "requires_grad", False) is True and callable(getattr(x, "detach", None)):
        x = x.detach()
    fmt = None
    dt = str(getattr(x, "dtype", ""))
    if dt in ("torch.bfloat16", "bfloat16"):
        fmt = "bfloat16"
        x = x.float()  # exact
    try:
        a = np.asarray(x)
    except Exception:
        try:
            a = np.from_dlpack(x)
        except Exception as e:
            raise TypeError(f"{name}: cannot read {type(x).__name__} as an array: {e}"
                            f"{' (pass ' + name + '.detach())' if 'grad' in str(e) else ''}") from None
    if not (np.issubdtype(a.dtype, np.floating)):
        raise TypeError(f"{name}: expected floating-point values, got dtype {a.dtype}")
    _require_fits(a, name)
    inexact = _inexact_in_float64(a)
    if inexact is not None and inexact.any():
        idx = _index(int(np.flatnonzero(inexact)[0]), a.shape)
        raise ValueError(f"{name}: the {a.dtype} value at index {idx} is not exactly representable in float64")
    if fmt is None:
        fmt = {np.dtype(np.float64): "float64", np.dtype(np.float32): "float32", np.dtype(np.float16): "float16"}.get(a.dtype)
    return np.asarray(a, dtype=np.float64, order="C"), fmt


def _format(dtype: Any, implied: Optional[str]) -> str:
    if dtype is None:
        if implied is None:
            raise TypeError("dtype: cannot tell the candidate's format from its dtype; pass dtype='float32' (or float64, "
                            "bfloat16, float16)")
        return implied
    name = str(dtype).replace("torch.", "").replace("numpy.", "")
    name = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32", "double": "float64",
            "fp32": "float32", "fp64": "float64"}.get(name, name)
    if name not in _FORMATS:
        raise ValueError(f"dtype: expected one of {', '.join(_FORMATS)}, got {dtype!r}")
    return name


def _index(flat: int, shape: "tuple[int, ...]") -> "tuple[int, ...]":
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


_GRADIENT_ROLES = ("grad_query", "grad_key", "grad_value", "grad_w_q", "grad_w_k", "grad_w_v", "grad_w_o", "grad_b_q",
                   "grad_b_k", "grad_b_v", "grad_b_o")


def assert_attention_close(actual: Any, expected_or_reference: Any, *, dtype: Any = None, tolerance: str = "data-aware",
                           weights: Any = None, lse: Any = None, empty_row_lse: str = "-inf", ulp: float = 4,
                           msg: Optional[str] = None, backward_algorithm: Optional[str] = None, grad_query: Any = None,
                           grad_key: Any = None, grad_value: Any = None, grad_w_q: Any = None, grad_w_k: Any = None,
                           grad_w_v: Any = None, grad_w_o: Any = None, grad_b_q: Any = None, grad_b_k: Any = None,
                           grad_b_v: Any = None, grad_b_o: Any = None, policy: Optional[str] = None,
                           input_format: Optional[str] = None) -> None:
    """Asserts that ``actual`` is a correct attention output for the reference's inputs, and the
    gradients given are correct gradients for its ``grad_output``.

    Args:
        actual: the implementation's output (NumPy array or CPU tensor), the reference's shape; None
            when only gradients are judged.
        expected_or_reference: an ``attnref.Reference`` from ``attnref.sdpa``/``attnref.mha``
            (needed by the data-aware and worst-case models, which derive the bounds from its
            inputs, and by gradients), a plain array of expected values (only with
            tolerance="assert-close" or "ulp"), or an ``attnref.GoldenCase`` from
            ``attnref.load_case`` (judged by ``attnref.check``, exactly as ``attnref check``).
        dtype: the candidate's narrowest storage format ("float64", "float32", "bfloat16",
            "float16", or a NumPy/PyTorch dtype); default: from the arrays' dtype (all of them
            must then agree). 16-bit formats are assumed to accumulate in float32.
        tolerance: "data-aware" (default), "worst-case", "assert-close" or "ulp"; gradients are
            judged with the data-aware gradient bound only.
        weights: the implementation's attention weights (B, H, Sq, Sk), compared too if given,
            and checked for invariants.hpp's invariants (rows sum to 1, masked weights exactly 0,
            0 <= P <= 1; with ``lse`` also P = exp(S - lse)).
        lse: the implementation's log-sum-exp (B, H, Sq), compared too if given.
        empty_row_lse: the lse the implementation writes for a row whose keys are all masked:
            "-inf" (attnref, PyTorch, FlashAttention's split-KV path), "+inf" (FlashAttention 2/3),
            or "any".
        ulp: the limit of the "ulp" model.
        msg: prefixed to the failure message.
        backward_algorithm: how the gradients were computed: "textbook" when dS is formed from the
            forward's own normalised weights (PyTorch autograd through softmax is), which lets dQ's
            bound centre the keys ((B5t) in docs/backward.md, much tighter for large logits);
            "flash" or None (unknown) keep the bound valid for any algorithm. A false
            "textbook" can only make a correct kernel fail.
        grad_query, grad_key, grad_value: the implementation's gradients of the Reference's inputs
            for its ``grad_output`` (sdpa dQ, dK, dV, dK and dV summed over each kv head's group;
            mha the gradients of x_q, x_k, x_v), in the shapes of ``ref.grad_query`` etc.
        grad_w_q, grad_w_k, grad_w_v, grad_w_o, grad_b_q, grad_b_k, grad_b_v, grad_b_o: mha only,
            the projections' gradients (biases: when the Reference has them).
            Gradients need a Reference computed with ``grad_output=``; they are judged exactly as
            ``attnref check --grad-*`` judges a golden backward case. Tensors that require grad
            (``q.grad`` does not, a non-leaf may) are read through ``.detach()``.
        policy: golden cases only: a declared precision policy (``attnref check --policy``'s names,
            e.g. "bf16_fp32acc"); the bounds follow where it rounds. None: any kernel of the format.
        input_format: golden cases only: which inputs the candidate computed on, as
            ``attnref.check``'s ``input_format`` ("auto", "case" or a format; None: "auto", or the
            GoldenCase's own rounded format). A Reference is already of exactly the inputs it was given.

    Raises:
        AssertionError: an element exceeds its bound (the message names the tensor and gives the
            count, the worst index, actual vs expected, the bound and the model), in the style of
            torch.testing.assert_close, or a gradient invariant is violated.
        InconclusiveError (an AssertionError): nothing exceeded a bound but a pass would prove
            nothing: some bound is vacuous, the bounds would also pass a trivially wrong output
            (the mean of V, the softmax at scale x2 or x1/2) or gradient (zero, twice the
            gradient, the gradient without the scale), or the output is untrustworthy.
        TypeError, ValueError: unusable arguments (named).
    """
    model = tolerance
    from . import GoldenCase  # the package imports this module at its end
    if isinstance(expected_or_reference, GoldenCase):
        return _assert_golden(actual, expected_or_reference, dtype, tolerance, weights, lse, empty_row_lse, msg, backward_algorithm,
                              policy, input_format, dict(grad_query=grad_query, grad_key=grad_key, grad_value=grad_value,
                                                         grad_w_q=grad_w_q, grad_w_k=grad_w_k, grad_w_v=grad_w_v, grad_w_o=grad_w_o,
                                                         grad_b_q=grad_b_q, grad_b_k=grad_b_k, grad_b_v=grad_b_v, grad_b_o=grad_b_o))
    if input_format is not None:
        raise ValueError("input_format: a Reference is the certified result of exactly the inputs it was given; compute it from "
                         "the inputs your kernel read (input_format= applies to golden cases from attnref.load_case)")
    if policy is not None:
        raise ValueError("policy: a declared policy is judged against golden cases (pass the GoldenCase of attnref.load_case, "
                         "judged as attnref.check(..., policy=) does); a Reference's bounds hold for any kernel of the format")
    grads_given = {role: x for role, x in zip(_GRADIENT_ROLES, (grad_query, grad_key, grad_value, grad_w_q, grad_w_k, grad_w_v,
                                                                 grad_w_o, grad_b_q, grad_b_k, grad_b_v, grad_b_o)) if x is not None}
    if isinstance(ulp, bool) or not isinstance(ulp, (int, float, np.integer, np.floating)):
        raise TypeError(f"ulp: expected a number, got {type(ulp).__name__}")
    if not (math.isfinite(float(ulp)) and float(ulp) >= 0):
        raise ValueError(f"ulp: expected a finite number >= 0, got {ulp!r}")
    if not isinstance(tolerance, str) or model not in _MODELS:
        raise ValueError(f"tolerance: expected one of {', '.join(_MODELS)}, got {tolerance!r}")
    if backward_algorithm is not None and backward_algorithm not in ("textbook", "flash"):
        raise ValueError(f"backward_algorithm: expected 'textbook', 'flash' or None, got {backward_algorithm!r}")
    if actual is None and not grads_given:
        raise TypeError("actual: expected the output, got None (None is allowed only when gradients are given: grad_query=…)")
    if actual is None and (weights is not None or lse is not None):
        raise TypeError("weights, lse: judged beside the output; pass actual too")
    ref = expected_or_reference
    from . import Reference  # the package imports this module at its end
    if grads_given:
        if not isinstance(ref, Reference):
            raise TypeError("expected_or_reference: gradients are judged against a Reference computed with grad_output= "
                            "(attnref.sdpa(q, k, v, …, grad_output=do)); got a " + type(ref).__name__)
        if not ref.gradients:
            raise ValueError(f"expected_or_reference: this Reference has no gradients; compute it with "
                             f"attnref.{ref.kind}(…, grad_output=do), dO being the upstream gradient your gradients are for")
        if model != "data-aware":
            raise ValueError(f"tolerance: gradients are judged with the data-aware gradient bound only, got {tolerance!r}")
        for role in grads_given:
            if role not in ref.gradients:
                raise ValueError(f"{role}: not a gradient of this {ref.kind} Reference (it has "
                                 f"{', '.join(ref.gradients)})")
    a = implied = None
    if actual is not None:
        a, implied = _candidate(actual, "actual")
    grads: Dict[str, np.ndarray] = {}
    implied_formats: Dict[str, Optional[str]] = {} if actual is None else {"actual": implied}
    for role, x in grads_given.items():
        grads[role], implied_formats[role] = _candidate(x, role)
    if dtype is None and len(set(implied_formats.values())) > 1 and None not in implied_formats.values():
        raise ValueError("dtype: the arrays hold different formats (" +
                         ", ".join(f"{n} {f}" for n, f in implied_formats.items()) + "); pass dtype= to name the one to judge in")
    unknown = [n for n, f in implied_formats.items() if f is None]
    if dtype is None and unknown and (actual is None or unknown != ["actual"]):
        raise TypeError(f"dtype: cannot tell the format of {unknown[0]} from its dtype; pass dtype='float32' "
                        "(or float64, bfloat16, float16)")
    fmt = _format(dtype, next(iter(implied_formats.values())))
    prefix = (msg + ": ") if msg else ""

    forward = None
    if a is not None:
        forward = _judge_forward(a, ref, fmt, model, weights, lse, empty_row_lse, ulp, msg)
    gradient = None
    if grads:
        shapes = {role: ref.gradients[role].shape for role in grads}
        for role, g in grads.items():
            if g.shape != shapes[role]:
                raise AssertionError(f"{prefix}The values for attribute 'shape' do not match: {role} {g.shape} != "
                                     f"{shapes[role]}.")
        certified = [(role, np.asarray(v, dtype=np.float64)) for role, v in ref.gradients.items()]
        judged = _attnref._judge_gradients(ref._call, ref._grad_output, ref._bound_weights, ref._bound_lse, certified, fmt,
                                           list(grads.items()), "unknown" if backward_algorithm is None else backward_algorithm)
        gradient = (judged, shapes)
    how_g = (f"model: the data-aware gradient bound (docs/backward.md, as attnref check --grad-*); candidate format {fmt}; "
             f"backward algorithm {backward_algorithm or 'unknown'}")
    # FAIL before INCONCLUSIVE, output before gradients, as `attnref check` decides.
    if forward is not None:
        forward(False)
    if gradient is not None and gradient[0]["verdict"] == "FAIL":
        _raise_gradient_failure(gradient[0], gradient[1], prefix, how_g)
    if forward is not None:
        forward(True)
    if gradient is not None and gradient[0]["verdict"] == "INCONCLUSIVE":
        _raise_gradient_inconclusive(gradient[0], gradient[1], prefix, how_g)


def _assert_golden(actual: Any, case: Any, dtype: Any, tolerance: str, weights: Any, lse: Any, empty_row_lse: str,
                   msg: Optional[str], backward_algorithm: Optional[str], policy: Optional[str], input_format: Optional[str],
                   gradients: Dict[str, Any]) -> None:
    """A golden case: attnref.check's verdict (the checker's, inputs and policy included); FAIL raises
    AssertionError, INCONCLUSIVE InconclusiveError, each with the report."""
    from . import check  # the package imports this module at its end
    v = check(case, actual, weights=weights, lse=lse, dtype=None if dtype is None else _format(dtype, None), tolerance=tolerance,
              empty_row_lse=empty_row_lse, backward_algorithm=backward_algorithm, input_format=input_format, policy=policy,
              **{role: x for role, x in gradients.items() if x is not None})
    if v.passed:
        return
    prefix = (msg + ": ") if msg else ""
    error = InconclusiveError if v.verdict == "INCONCLUSIVE" else AssertionError
    raise error(f"{prefix}Attention {v.verdict} against golden case {case.name}: {v.reason}\n{v.text}")


def _not_close(prefix: str, what: str, r: Dict[str, Any], shapes: Dict[str, Any], unit: str = "", note: str = "") -> str:
    """The first lines of an AssertionError for a tensor the checker found not close: the count, the
    worst element relative to its bound (with its index in the tensor's shape) and the largest
    differences; each line ends in a newline."""
    bad, n = r["violations"], r["elements"]
    idx = _index(r["worst_index"], shapes[r["name"]])
    return (f"{prefix}{what} {r['name']} is not close!\n\n"
            f"Mismatched elements: {bad} / {n} ({100.0 * bad / max(n, 1):.1f}%)\n"
            f"Greatest error relative to its bound: {r['worst_ratio']:.3g} at index {idx}\n"
            f"  actual {r['worst_actual']!r} vs expected {r['worst_expected']!r}: "
            f"|difference| {abs(r['worst_actual'] - r['worst_expected']):.3g}, bound {r['worst_bound']:.3g}{unit}\n"
            f"Greatest absolute difference: {r['max_abs']:.3g}; greatest relative difference: {r['max_rel']:.3g}{note}\n")


def _raise_broken_invariant(judged: Dict[str, Any], prefix: str, what: str, at: str, suffix: str, how: str) -> None:
    """An AssertionError for the first invariant the checker found violated, if any: `what` names
    the tensors, `at` the index's axes, `suffix` follows the bound."""
    for i in judged["invariants"]:
        if not i["ok"]:
            raise AssertionError(f"{prefix}{what} violate the invariant '{i['name']}': {i['violations']} of "
                                 f"{i['checked']} checks fail; the first at {at}{i['index']}: deviation {i['worst']:.3g}, "
                                 f"bound {i['bound']:.3g}{suffix}\n{how}")


def _raise_gradient_failure(judged: Dict[str, Any], shapes: Dict[str, Any], prefix: str, how: str) -> None:
    """An AssertionError for the checker's FAIL of the gradients: the first failing tensor, else
    the first violated invariant."""
    for r in judged["tensors"]:
        if r["verdict"] != "FAIL":
            continue
        bad, n = r["violations"], r["elements"]
        # The checker's note starts with the count given above; keep what it adds (the bound used, GQA).
        extra = r["note"].split("; ", 1)[1] if r["note"].startswith(f"{bad} of {n} elements") and "; " in r["note"] else (
            "" if r["note"].startswith(f"{bad} of {n} elements") else r["note"])
        note = f" ({extra})" if extra else ""
        raise AssertionError(_not_close(prefix, "Attention gradient", r, shapes, note=note) + how)
    _raise_broken_invariant(judged, prefix, "Attention gradients", "(batch, kv head, key or feature, feature) ", "", how)
    raise AssertionError(f"{prefix}Attention gradients: FAIL: {judged['reason']}\n{how}")


def _raise_gradient_inconclusive(judged: Dict[str, Any], shapes: Dict[str, Any], prefix: str, how: str) -> None:
    for r in judged["tensors"]:
        if r["verdict"] == "PASS":
            continue
        where = ""
        if r["vacuous_elements"]:
            where = f" (first vacuous element at index {_index(r['vacuous_index'], shapes[r['name']])})"
        raise InconclusiveError(f"{prefix}INCONCLUSIVE: attention gradient {r['name']}: no element exceeded its bound, but "
                                f"{r['note']}{where}. This format cannot be judged on these inputs; test it on "
                                f"better-conditioned ones or in a wider format.\n{how}")
    raise InconclusiveError(f"{prefix}INCONCLUSIVE: attention gradients: {judged['reason']}\n{how}")


def _judge_forward(a: np.ndarray, ref: Any, fmt: str, model: str, weights: Any, lse: Any, empty_row_lse: str, ulp: float,
                   msg: Optional[str]) -> Any:
    """Judges the output (and weights, lse); returns raise_(inconclusive: bool), which raises the
    AssertionError of a failure (False) or the InconclusiveError (True), if any."""
    from . import Reference  # the package imports this module at its end
    if isinstance(ref, Reference):
        expected = np.asarray(ref.output, dtype=np.float64)
        call = ref._call
        if ref.arith == "certified":
            reference_u = 0.0
        elif ref.arith in ("float64", "longdouble", "float128", "bin50") or ref.arith.startswith("mpfr:"):
            # Not correctly rounded: its own error (at most a float64 computation's, rounding to
            # float64 included) is bounded by the same model and added to the candidate's bound.
            reference_u = 2.0 ** -53
            if fmt == "float64":
                raise ValueError(f"expected_or_reference: a reference computed with arith={ref.arith!r} is not accurate "
                                 "enough to gate a float64 candidate; use arith='certified'")
        else:
            raise ValueError(f"expected_or_reference: a reference computed with arith={ref.arith!r} is itself a low-precision "
                             "result; use arith='certified' (or 'float64', 'mpfr:BITS')")
        exp_w = None if ref._bound_weights is None else np.asarray(ref._bound_weights, dtype=np.float64)
        exp_l = None if ref._bound_lse is None else np.asarray(ref._bound_lse, dtype=np.float64)
        wshape = None if exp_w is None else exp_w.shape
        lshape = None if exp_l is None else exp_l.shape
    else:
        if model in ("data-aware", "worst-case"):
            raise TypeError(f"expected_or_reference: the {model} tolerance derives its bounds from the reference's inputs; "
                            "pass the Reference returned by attnref.sdpa/attnref.mha (a plain array works with "
                            "tolerance='assert-close' or 'ulp')")
        expected, _ = _candidate(ref, "expected_or_reference")
        call, reference_u, exp_w, exp_l, wshape, lshape = None, 0.0, None, None, None, None
        if weights is not None or lse is not None:
            raise TypeError("weights, lse: comparing them needs a Reference (its weights and lse)")
    if a.shape != expected.shape:
        raise AssertionError(f"{msg + ': ' if msg else ''}The values for attribute 'shape' do not match: "
                             f"{a.shape} != {expected.shape}.")
    aw = al = None
    if weights is not None:
        aw, _ = _candidate(weights, "weights")
        if aw.shape != wshape:
            raise AssertionError(f"weights: shape {aw.shape} != {wshape}")
    if lse is not None:
        al, _ = _candidate(lse, "lse")
        if al.shape != lshape:
            raise AssertionError(f"lse: shape {al.shape} != {lshape}")
    row = expected.shape[-1] if expected.ndim else 1
    if empty_row_lse not in ("-inf", "+inf", "any"):
        raise ValueError(f"empty_row_lse: expected '-inf', '+inf' or 'any', got {empty_row_lse!r}")
    judged: Dict[str, Any] = _attnref._judge(call, model, fmt, reference_u, expected, exp_w, exp_l, a, aw, al, row, float(ulp),
                                             empty_row_lse)
    results: List[Dict[str, Any]] = judged["tensors"]
    shapes = {"output": expected.shape, "weights": wshape, "lse": lshape}
    prefix = (msg + ": ") if msg else ""
    how = f"model: {_MODEL_TEXT[model]}; candidate format {fmt}" + (
        f"; reference {ref.arith}" if isinstance(ref, Reference) else "")

    def raise_(inconclusive: bool) -> None:
        # The verdict is the checker's (check/judge_forward.hpp's decide); this only words it.
        verdict = judged["verdict"]
        if not inconclusive:
            if verdict != "FAIL":
                return
            for r in results:
                if r["wrong_empty_lse"]:
                    raise AssertionError(f"{prefix}Attention lse: {r['wrong_empty_lse']} rows with every key masked do not hold the "
                                         f"declared empty_row_lse={empty_row_lse!r}\n{how}")
                bad = r["violations"]  # non-finite mismatches (NaN or inf where the reference has another value) included
                if bad:
                    unit = " ULP" if model == "ulp" else ""
                    raise AssertionError(_not_close(prefix, "Attention", r, shapes, unit=unit) + how)
            _raise_broken_invariant(judged, prefix, "Attention weights", "index ", " (include/attnref/bounds/invariants.hpp)", how)
            raise AssertionError(f"{prefix}Attention FAIL: {judged['reason']}\n{how}")
        if verdict != "INCONCLUSIVE":
            return
        for r in results:
            if r["vacuous_elements"]:
                idx = _index(r["vacuous_index"], shapes[r["name"]])
                raise InconclusiveError(
                    f"{prefix}INCONCLUSIVE: attention {r['name']}: no element exceeded its bound, but the bound of "
                    f"{r['vacuous_elements']} of {r['elements']} elements is vacuous (first at index {idx}: bound "
                    f"{r['vacuous_bound']:.3g} vs scale {r['vacuous_scale']:.3g}, "
                    f"{'ln 2' if r['name'] == 'lse' else 'the largest |expected| of its row'}): a pass would prove nothing. "
                    f"This format cannot be judged on these inputs; test it on better-conditioned ones or in a wider format.\n{how}")
            if r["decoy"]:
                raise InconclusiveError(
                    f"{prefix}INCONCLUSIVE: attention {r['name']}: no element exceeded its bound, but the bounds also admit a "
                    f"trivially wrong output ({r['decoy']}): a pass would prove nothing.\n{how}")
            if r["untrustworthy"]:
                raise InconclusiveError(f"{prefix}INCONCLUSIVE: attention {r['name']} is untrustworthy: {r['untrustworthy']} "
                                        f"(zero-trust, as benchdnn): a pass would prove nothing.\n{how}")
        for i in judged["invariants"]:
            if i["vacuous"]:
                raise InconclusiveError(f"{prefix}INCONCLUSIVE: the bound of the invariant '{i['name']}' is vacuous: "
                                        f"a pass would prove nothing.\n{how}")
        raise InconclusiveError(f"{prefix}INCONCLUSIVE: {judged['reason']}: a pass would prove nothing.\n{how}")

    return raise_
