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
import os
import textwrap
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _attnref
from ._attnref import UncertifiedError
from ._conventions import CONVENTIONS
from .suite import case_path as _suite_case_path, suite_cases, suite_dir

__all__ = ["sdpa", "mha", "Reference", "UncertifiedError", "MemoryLimitError", "POLICIES", "INPUT_FORMATS", "MPFR_BITS", "testing"]

#: The largest int an option (window sides, key lengths, heads, threads, offsets) accepts: 2**53.
_MAX_INT = 2**53


def _default_max_memory() -> int:
    """The command line's default ``--max-memory``: half the machine's physical memory, at least
    4 GiB, never above the process's address-space limit (RLIMIT_AS) when one is set."""
    limit = 4 << 30
    try:
        limit = max(limit, os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2)
    except (ValueError, OSError, AttributeError):
        pass
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            limit = min(limit, soft)
    except (ImportError, OSError, ValueError):
        pass
    return limit


#: ``max_memory``'s default, bytes, as the command line's ``--max-memory``: half the machine's
#: physical memory, at least 4 GiB (12 GiB on a 24 GiB machine), capped by RLIMIT_AS.
DEFAULT_MAX_MEMORY = _default_max_memory()


class MemoryLimitError(ValueError, MemoryError):
    """A call whose memory estimate exceeds ``max_memory`` (a ValueError and a MemoryError): refused
    before anything is allocated, the message giving the estimate and the limit."""

#: Precision policy names accepted by ``arith=`` (attnref/multiprecision/policies.hpp).
POLICIES: Tuple[str, ...] = tuple(_attnref._policy_names())
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
        gradients: with ``grad_output=``: the certified gradients by role (every element the
            correctly rounded float64 of the exact gradient, like the output): sdpa ``grad_query``,
            ``grad_key``, ``grad_value`` (dQ, dK, dV; dK and dV summed over each kv head's group);
            mha ``grad_query``, ``grad_key``, ``grad_value`` (of x_q, x_k, x_v), ``grad_w_q`` …
            ``grad_w_o`` and with biases ``grad_b_q`` … ``grad_b_o``. Also attributes
            (``ref.grad_query``); their certification reports are appended to ``certification``.
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
    gradients: Dict[str, np.ndarray] = field(default_factory=dict)
    _grad_output: Optional[np.ndarray] = field(default=None, repr=False, compare=False)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("grad_") and name in _GRADIENT_ROLES:
            g = self.__dict__.get("gradients") or {}
            if name in g:
                return g[name]
            raise AttributeError(f"{name}: this Reference has no gradients (pass grad_output= to attnref.{self.kind})")
        raise AttributeError(name)

    @property
    def certified(self) -> bool:
        """True when every element is the correctly rounded float64 of the exact result."""
        return self.arith == "certified"


_GRADIENT_ROLES = ("grad_query", "grad_key", "grad_value", "grad_w_q", "grad_w_k", "grad_w_v", "grad_w_o", "grad_b_q",
                   "grad_b_k", "grad_b_v", "grad_b_o")


def _inexact_in_float64(a: np.ndarray) -> Optional[np.ndarray]:
    """Flags of the elements of `a` (a real array) that float64 cannot hold exactly, or None when
    its dtype converts exactly (float16/32/64, integers of at most 32 bits)."""
    if np.issubdtype(a.dtype, np.integer):
        if a.dtype.itemsize < 8:
            return None
        a64 = a.astype(np.float64)
        # float64 rounds |x| > 2**53 to 53 significant bits; back-conversion detects the rounding.
        # A value rounded up to 2**63 (int64) or 2**64 (uint64) is outside the integer type.
        top = 2.0**64 if np.issubdtype(a.dtype, np.unsignedinteger) else 2.0**63
        inside = a64 < top
        back = np.where(inside, a64, 0).astype(a.dtype)
        return ~inside | (back != a)
    if a.dtype.itemsize <= 8:
        return None
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        back = a.astype(np.float64).astype(a.dtype)
    return (back != a) & ~np.isnan(a)


def _require_fits(a: np.ndarray, name: str) -> None:
    """Refuses an array (a broadcast view costs no memory until it is copied) whose float64 copy could
    not fit in this machine's memory, before numpy is asked to copy or iterate it."""
    values = 1
    for e in a.shape:
        values *= int(e)
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        physical = 1 << 62
    if values * 8 > physical:
        raise MemoryLimitError(f"{name}: shape {tuple(int(e) for e in a.shape)} holds {values} values ({_gib(values * 8)} as float64), "
                               f"more than this machine's memory ({_gib(physical)}); no reference of it can be computed here")


def _as_float64(x: ArrayLike, name: str, *, allow_neg_inf: bool = False, allow_nonfinite: bool = False) -> np.ndarray:
    """x as a float64 C-contiguous array without copying when it already is one. Values float64
    cannot hold exactly (long double, int64 beyond 2**53) are refused, never rounded. Inputs of a
    reference must be finite; a candidate's outputs (allow_nonfinite) may hold NaN and inf.
    A PyTorch tensor that requires grad is read through ``.detach()`` (its values, not its graph)."""
    if x is None:
        raise TypeError(f"{name}: expected an array, got None")
    if getattr(x, "requires_grad", False) is True and callable(getattr(x, "detach", None)):
        x = x.detach()
    if str(getattr(x, "dtype", "")) == "torch.bfloat16" and callable(getattr(x, "float", None)):
        x = x.float()  # every bfloat16 value is a float32 value: exact (DLPack has no bfloat16 for numpy)
    a = None
    err: Optional[Exception] = None
    if isinstance(x, np.ndarray):
        a = x
    else:
        try:
            a = np.asarray(x)
        except Exception as e:  # e.g. a torch tensor in bfloat16
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
    _require_fits(a, name)
    inexact = _inexact_in_float64(a)
    if inexact is not None and inexact.any():
        idx = tuple(int(i) for i in np.argwhere(inexact)[0]) if a.ndim else ()
        raise ValueError(f"{name}: the {a.dtype} value at index {idx} ({a[idx]!r}) is not exactly representable in float64; "
                         f"attnref would compute the reference of other inputs. Round it yourself ({name}.astype(numpy.float64)) "
                         "if that is what you mean")
    a = np.asarray(a, dtype=np.float64, order="C")  # keeps a 0-d array 0-d (ascontiguousarray would not)
    if allow_nonfinite:
        return a
    bad = ~np.isfinite(a)
    if allow_neg_inf:
        bad &= ~np.isneginf(a)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0]) if a.ndim else ()
        what = "NaN or +inf" if allow_neg_inf else "NaN or inf"
        raise ValueError(f"{name}: {what} at index {idx} ({a[idx]}); a reference needs finite inputs")
    return a


def _mask4(x: ArrayLike, name: str, dtype: Any) -> np.ndarray:
    if dtype is np.uint8:
        a = np.asarray(x)
        if a.dtype != np.bool_:
            raise TypeError(f"{name}: expected a boolean array, got dtype {a.dtype}")
        _require_fits(a, name)
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
    if x < 0 or x > _MAX_INT:
        raise ValueError(f"{name}: expected an int from 0 to 2**53, got {x}")
    return int(x)


def _optional_float(x: Any, name: str, positive: bool = False) -> Optional[float]:
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name}: expected a float or None, got {type(x).__name__}")
    try:
        v = float(x)
    except OverflowError:
        raise ValueError(f"{name}: expected a finite{' positive' if positive else ''} float, got {x}") from None
    if not math.isfinite(v) or (positive and v <= 0):
        raise ValueError(f"{name}: expected a finite{' positive' if positive else ''} float, got {v}")
    if isinstance(x, (int, np.integer)) and int(v) != int(x) or isinstance(x, np.floating) and np.longdouble(v) != np.longdouble(x):
        raise ValueError(f"{name}: {x!r} is not exactly representable in float64")
    return v


# The names of the conventions' enums: the C++ tables beside each enum (name_table.hpp).
_NAMES: Dict[str, List[str]] = _attnref._enum_names


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
        _choice(causal, "causal", _NAMES["causal_alignment"])
    if alignment is not None:
        _choice(alignment, "alignment", _NAMES["causal_alignment"])
        if causal is not None and alignment != causal:
            raise ValueError(f"alignment: {alignment!r} contradicts causal={causal!r} (they share one diagonal)")
    align = alignment or causal or "top_left"
    if isinstance(diagonal_offset, bool) or not isinstance(diagonal_offset, (int, np.integer)):
        raise TypeError(f"diagonal_offset: expected an int, got {type(diagonal_offset).__name__}")
    if abs(int(diagonal_offset)) > _MAX_INT:
        raise ValueError(f"diagonal_offset: expected |offset| <= 2**53, got {diagonal_offset}")
    left = right = None
    if window is not None:
        if not isinstance(window, (tuple, list)) or len(window) != 2:
            raise TypeError("window: expected None or a pair (left, right) of ints or None")
        left, right = _optional_int(window[0], "window[0]"), _optional_int(window[1], "window[1]")
    lengths = None
    if key_lengths is not None:
        kl = np.asarray(key_lengths)
        if kl.dtype == object and kl.ndim == 1 and all(isinstance(n, int) and not isinstance(n, bool) for n in kl):
            raise ValueError(f"key_lengths: expected lengths from 0 to 2**53, got {kl.tolist()}")
        if kl.ndim != 1 or not (np.issubdtype(kl.dtype, np.integer) or kl.size == 0):
            raise TypeError(f"key_lengths: expected a 1-d sequence of ints, got dtype {kl.dtype} shape {kl.shape}")
        if (kl < 0).any() or (kl > _MAX_INT).any():
            raise ValueError(f"key_lengths: expected lengths from 0 to 2**53, got {kl.tolist()}")
        lengths = [int(n) for n in kl]
    slopes = None
    if alibi_slopes is not None:
        s = _as_float64(alibi_slopes, "alibi_slopes")
        if s.ndim != 1:
            raise ValueError(f"alibi_slopes: expected one slope per query head (1-d), got shape {s.shape}")
        slopes = [float(v) for v in s]
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 0 or threads > _MAX_INT:
        raise ValueError(f"threads: expected an int from 0 (all cores) to 2**53, got {threads!r}")
    return dict(scale=_optional_float(scale, "scale", positive=True),
                scale_placement=_choice(scale_placement, "scale_placement", _NAMES["scale_placement"]),
                causal="none" if causal is None else "causal", alignment=align, diagonal_offset=int(diagonal_offset),
                window_left=left, window_right=right, window=window is not None, key_lengths=lengths,
                mask=None if mask is None else _mask4(mask, "mask", np.uint8),
                mask_polarity=_choice(mask_polarity, "mask_polarity", _NAMES["mask_polarity"]),
                additive_mask=None if additive_mask is None else _mask4(additive_mask, "additive_mask", np.float64),
                empty_rows=_choice(empty_rows, "empty_rows", _NAMES["empty_row_policy"]),
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


def _max_memory(x: Any) -> int:
    """max_memory= as bytes: an int, or a string with a K, M, G or T suffix (powers of 1024)."""
    if isinstance(x, bool) or not isinstance(x, (int, np.integer, str)):
        raise TypeError(f"max_memory: expected bytes as an int or a string such as '8G', got {type(x).__name__}")
    if isinstance(x, str):
        t = x.strip()
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:].upper(), 1)
        digits = t[:-1] if mult > 1 else t
        if not digits.isdigit():
            raise ValueError(f"max_memory: expected bytes such as 4294967296 or '4G', got {x!r}")
        v = int(digits) * mult
    else:
        v = int(x)
    if v <= 0:
        raise ValueError(f"max_memory: expected a positive number of bytes, got {x!r}")
    return v


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.3g} GiB"


# Bytes per value of the arithmetics' element types with their working copies, rounded up (heap
# limbs of MPFR/MPFI included; checked against the measured peak RSS in tests/python): policies of
# IEEE and extended types 16, cpp_bin_float<50> 80, MPFR at 134/267 bits 96/112, the fast certified
# path 12 (a float64 value and an undecided flag), and an MPFI interval at the certification
# ladder's last rung (1065 bits) 368.
_BYTES_POLICY, _BYTES_BIN50, _BYTES_MPFR, _BYTES_FAST = 16, 80, {134: 96, 267: 112}, 12
_BYTES_INTERVAL = 368


def _python_copies(arrays: Dict[str, Optional[np.ndarray]], conv: Dict[str, Any], gradients: bool) -> int:
    """This package's own copies around a certified call: the inputs' snapshot and the masks' copies,
    the float64 output, weights and lse it returns, and with gradients the backward case's copies."""
    inputs = sum(0 if a is None else int(a.size) for a in arrays.values())
    masks = sum(0 if conv[n] is None else int(conv[n].size) for n in ("mask", "additive_mask"))
    return 2 * 8 * (inputs + masks) + (8 * 2 * inputs if gradients else 0)


def _memory_estimate(kind: str, arrays: Dict[str, Optional[np.ndarray]], heads: int, kv_heads: int, conv: Dict[str, Any],
                     arith: str, gradients: bool = False) -> Tuple[int, int]:
    """(bytes the call allocates, bytes the certified path's MPFI escalation can add), from the shapes.

    Counted: the reference's snapshot of the inputs and masks; output, weights and lse (always
    computed) in the arithmetic's type and as float64; for mha the projected heads; for the
    certified path its per-thread copies of one head's q, k, v (double-double with error terms).
    The escalation recomputes undecided rows in MPFI intervals over whole tensors. With gradients:
    the backward case's copies of the inputs and dO here; the fast certified backward's own buffers
    and its MPFI escalation are the library's estimate (golden/memory.hpp), which _run adds."""
    def count(a: Optional[np.ndarray]) -> int:
        return 0 if a is None else int(a.size)
    inputs = sum(count(a) for a in arrays.values())
    masks = sum(count(conv[n]) for n in ("mask", "additive_mask"))
    if kind == "sdpa":
        b, h, sq, dk = arrays["q"].shape
        hkv, sk, dv = arrays["k"].shape[1], arrays["k"].shape[2], arrays["v"].shape[3]
        out = b * h * sq * dv
        heads_values = 0
    else:
        b, sq, _ = arrays["q"].shape
        sk = arrays["k"].shape[1]
        h, hkv = heads, kv_heads
        dk, dv = arrays["w_q"].shape[1] // max(h, 1), arrays["w_v"].shape[1] // max(hkv, 1)
        out = b * sq * arrays["w_o"].shape[1]
        heads_values = b * h * sq * dk + b * hkv * sk * (dk + dv) + b * sq * h * dv
    values = out + b * h * sq * sk + b * h * sq
    threads = conv["threads"] or (os.cpu_count() or 1)
    base = 2 * 8 * (inputs + masks)  # the snapshot, and the masks' copies in the conventions
    escalation = 0
    if arith == "certified":
        per_thread = 24 * (sq * dk + sk * (dk + dv)) + 256 * sk + 64 * dv
        base += _BYTES_FAST * values + 32 * heads_values + min(threads, max(b * h, 1)) * per_thread
        escalation = _BYTES_INTERVAL * (values + heads_values)
        if gradients:
            # The backward case's copies of the inputs, dO and the broadcast masks (the gradients'
            # own buffers are the library's estimate, _run adds it).
            base += 8 * (2 * inputs + 2 * out + 2 * (masks + b * h * sq * sk * (1 if masks else 0)))
    else:
        size = _BYTES_MPFR[int(arith[5:])] if arith.startswith("mpfr:") else _BYTES_BIN50 if arith == "bin50" else _BYTES_POLICY
        base += (size + 12) * values + size * (heads_values + inputs)
    return base, escalation


def _run(kind: str, arrays: Dict[str, Optional[np.ndarray]], heads: int, kv_heads: int, conv: Dict[str, Any], arith: str,
         return_weights: bool, return_lse: bool, max_memory: Any, grad_output: Any = None) -> Reference:
    limit = _max_memory(max_memory)
    do = None
    if grad_output is not None:
        if arith != "certified":
            raise ValueError(f"grad_output: gradients are computed with arith='certified' only, got arith={arith!r}")
        do = _as_float64(grad_output, "grad_output")
        if kind == "sdpa":
            out_shape = arrays["q"].shape[:3] + arrays["v"].shape[3:]
        else:
            out_shape = arrays["q"].shape[:2] + arrays["w_o"].shape[1:]
        if do.shape != out_shape:
            raise ValueError(f"grad_output: expected the output's shape {out_shape}, got {do.shape}")
    call = _attnref._make_call(kind, arrays["q"], arrays["k"], arrays["v"], arrays.get("w_q"), arrays.get("w_k"),
                               arrays.get("w_v"), arrays.get("w_o"), arrays.get("b_q"), arrays.get("b_k"), arrays.get("b_v"),
                               arrays.get("b_o"), heads, kv_heads, **conv)
    estimate, escalation = _memory_estimate(kind, arrays, heads, kv_heads, conv, arith, do is not None)
    if arith == "certified":
        # The certified path's buffers and escalation: the library's estimate of the case the call is,
        # as `attnref generate [--gradients]` makes it (golden/memory.hpp); here only this package's copies.
        library = _attnref._certified_memory(call, do)
        if library is not None:
            estimate, escalation = _python_copies(arrays, conv, do is not None) + library[0], library[1]
    if estimate > limit:
        raise MemoryLimitError(f"max_memory: this call would need about {_gib(estimate)} ({estimate} bytes; output, weights "
                               f"and lse of {arith!r}), above max_memory={_gib(limit)}; raise max_memory= or make the call smaller")
    # Weights and lse are always computed: the weights feed the data-aware bound of assert_attention_close.
    # The certified path escalates undecided elements to MPFI only when that fits the limit too.
    r = _attnref._compute(call, arith, True, True, estimate + escalation <= limit)
    if r["undecided"]:
        raise MemoryLimitError(f"max_memory: {r['undecided']} element(s) were not decided by the fast certified path; "
                               f"certifying them through the MPFI ladder needs about {_gib(estimate + escalation)} "
                               f"({estimate + escalation} bytes), above max_memory={_gib(limit)}; raise max_memory=")
    gradients: Dict[str, np.ndarray] = {}
    certification = list(r["certification"])
    if do is not None:
        g = _attnref._gradients(call, do, limit)
        gradients = dict(g["gradients"])
        for a in gradients.values():
            a.setflags(write=False)
        certification += list(g["certification"])
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
                     lse=r["lse"] if return_lse else None, arith=arith, certification=certification, kind=kind,
                     _call=kept, _bound_weights=r["weights"], _bound_lse=r["lse"], gradients=gradients,
                     _grad_output=None if do is None else do.copy())


def sdpa(q: ArrayLike, k: ArrayLike, v: ArrayLike, *, scale: Optional[float] = None, scale_placement: str = "on_product",
         causal: Optional[str] = None, alignment: Optional[str] = None, diagonal_offset: int = 0,
         window: Optional[Tuple[Optional[int], Optional[int]]] = None, key_lengths: Optional[Sequence[int]] = None, mask: Optional[ArrayLike] = None,
         mask_polarity: str = "true_means_attend", additive_mask: Optional[ArrayLike] = None, empty_rows: str = "zero",
         softcap: Optional[float] = None, alibi_slopes: Optional[ArrayLike] = None, arith: str = "certified",
         return_weights: bool = False, return_lse: bool = False, threads: int = 0,
         max_memory: Any = DEFAULT_MAX_MEMORY, grad_output: Optional[ArrayLike] = None) -> Reference:
    """Scaled dot-product attention of q (B, H, Sq, dk), k (B, Hkv, Sk, dk), v (B, Hkv, Sk, dv).

    Returns a Reference: ``.output`` (B, H, Sq, dv), and ``.weights`` (B, H, Sq, Sk) / ``.lse``
    (B, H, Sq) when asked for. With the default ``arith="certified"`` every element is the
    correctly rounded float64 of the exact attention of the given inputs.

    Inputs must be exactly representable in float64 (float16/32/64, integers up to 2**53 in
    magnitude); a long double or int64 value that float64 would round is a ValueError naming the
    argument and index. The head dimension dk must be at least 1. ``max_memory`` (bytes, or a
    string such as "8G"; default half the machine's memory, at least 4 GiB): a call whose estimated memory exceeds it raises
    attnref.MemoryLimitError (a ValueError and MemoryError) with the estimate, before computing.

    ``grad_output`` (dO, the output's shape; arith="certified" only): also the certified gradients
    ``.grad_query``, ``.grad_key``, ``.grad_value`` (every element the correctly rounded float64 of
    the exact gradient of sum(dO * output), same conventions; dK and dV summed over each kv head's
    group), through the MPFI backward that certifies the golden suite's backward cases (slower than
    the forward: about the MPFI forward's cost, several times). PyTorch tensors that require grad may be passed
    for any input: their values are read through ``.detach()``.

    Raises ValueError or TypeError naming the argument for bad shapes, dtypes or options, and
    attnref.UncertifiedError for an element that no precision certifies.
    """
    conv = _conventions(scale, scale_placement, causal, alignment, diagonal_offset, window, key_lengths, mask, mask_polarity,
                        additive_mask, empty_rows, softcap, alibi_slopes, threads)
    arrays = {"q": _as_float64(q, "q"), "k": _as_float64(k, "k"), "v": _as_float64(v, "v")}
    for n in ("q", "k", "v"):
        if arrays[n].ndim != 4:
            raise ValueError(f"{n}: expected 4 dimensions (B, H, S, d), got shape {arrays[n].shape}")
    if arrays["q"].shape[3] == 0:
        raise ValueError(f"q: the head dimension (axis 3) is 0, got shape {arrays['q'].shape}; attention needs dk >= 1")
    return _run("sdpa", arrays, 0, 0, conv, _arith(arith), return_weights, return_lse, max_memory, grad_output)


def mha(x_q: ArrayLike, x_k: ArrayLike, x_v: ArrayLike, w_q: ArrayLike, w_k: ArrayLike, w_v: ArrayLike, w_o: ArrayLike,
        b_q: Optional[ArrayLike] = None, b_k: Optional[ArrayLike] = None, b_v: Optional[ArrayLike] = None,
        b_o: Optional[ArrayLike] = None, *, heads: int, kv_heads: Optional[int] = None, scale: Optional[float] = None,
        scale_placement: str = "on_product", causal: Optional[str] = None, alignment: Optional[str] = None,
        diagonal_offset: int = 0,
        window: Optional[Tuple[Optional[int], Optional[int]]] = None, key_lengths: Optional[Sequence[int]] = None,
        mask: Optional[ArrayLike] = None, mask_polarity: str = "true_means_attend", additive_mask: Optional[ArrayLike] = None,
        empty_rows: str = "zero", softcap: Optional[float] = None, alibi_slopes: Optional[ArrayLike] = None,
        arith: str = "certified", return_weights: bool = False, return_lse: bool = False, threads: int = 0,
        max_memory: Any = DEFAULT_MAX_MEMORY, grad_output: Optional[ArrayLike] = None) -> Reference:
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
    Inputs, max_memory, grad_output and the head dimension (w_q's width / heads >= 1) as for
    attnref.sdpa; with grad_output the gradients of x_q, x_k, x_v (``grad_query``, ``grad_key``,
    ``grad_value``; x_q, x_k, x_v of one width), ``grad_w_q`` … ``grad_w_o`` and, with all four
    biases, ``grad_b_q`` … ``grad_b_o``.
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
    if arrays["w_q"].shape[1] == 0:
        raise ValueError(f"w_q: the head dimension (axis 1 / heads) is 0, got shape {arrays['w_q'].shape}; attention needs dk >= 1")
    return _run("mha", arrays, h, kvh, conv, _arith(arith), return_weights, return_lse, max_memory, grad_output)


sdpa.__doc__ = (sdpa.__doc__ or "") + textwrap.indent(CONVENTIONS, "    ")
mha.__doc__ = (mha.__doc__ or "") + textwrap.indent(CONVENTIONS, "    ")


@dataclass(frozen=True)
class GoldenCase:
    """A committed golden case (golden/<name>/), verified on loading: the manifest strictly parsed,
    every file's sha256, dtype and shape checked.

    Attributes: ``path``: the case directory; ``name``; ``kind`` ("sdpa" or "mha"); ``conventions``:
    the case description as in its manifest.json (shapes, conventions, inputs, outputs); ``inputs``:
    role → array (q, k, v or x_q, x_k, x_v and the projections, masks), float64 (the boolean mask as
    bool); ``reference``: "output", "weights", "lse" → certified float64 arrays (those the case
    stores) — of exactly those inputs; ``input_format``: "case" (the case's own inputs) or the format
    F they were rounded to (``load_case(..., input_format=F)``: ``name`` is then the derived case's,
    ``<case>_inputs_<F>``); ``inputs_description``: the line saying which inputs these are.
    For ``input_format`` "fp8e4m3" or "fp8e5m2": ``inputs`` holds the effective values a kernel
    computes on (code·descale, float64, exact), ``fp8_codes`` role → the uint8 bit patterns (view
    them as ``ml_dtypes.float8_e4m3fn`` / ``float8_e5m2``), ``descales`` role → the per-tensor
    descale (a power of two; the kernel multiplies its fp32 accumulators by it). Empty otherwise.
    """

    path: str
    name: str
    kind: str
    conventions: Dict[str, Any]
    inputs: Dict[str, np.ndarray]
    reference: Dict[str, np.ndarray]
    input_format: str = "case"
    inputs_description: str = ""
    fp8_codes: Dict[str, np.ndarray] = field(default_factory=dict)
    descales: Dict[str, float] = field(default_factory=dict)


#: The input formats of ``load_case(input_format=)`` and ``check(input_format=)`` (besides "auto" and
#: "case"), from the library's one list (golden/input_selection.hpp), as ``attnref check --input-format``.
INPUT_FORMATS: Tuple[str, ...] = tuple(_attnref._input_format_names())
_INPUT_FORMATS = INPUT_FORMATS


def _input_format(x: Any, choices: Sequence[str]) -> str:
    """input_format= checked: a string among `choices` (TypeError/ValueError naming the argument)."""
    if not isinstance(x, str):
        raise TypeError(f"input_format: expected a string, got {type(x).__name__}")
    if x not in choices:
        raise ValueError(f"input_format: expected one of {', '.join(repr(c) for c in choices)}, got {x!r}")
    return x


def _path(x: Any, name: str) -> str:
    """A case directory argument as a str; a NUL (which no file name holds) is a ValueError naming
    the argument, with the path escaped in full."""
    try:
        p = os.fsdecode(os.fspath(x))
    except TypeError:
        raise TypeError(f"{name}: expected a path (str, bytes or os.PathLike), got {type(x).__name__}") from None
    if "\0" in p:
        raise ValueError(f"{name}: the path holds a NUL character at position {p.index(chr(0))}: {p!r}")
    return p


def load_case(path: Any, input_format: Optional[str] = None) -> GoldenCase:
    """Loads and verifies the golden case directory ``path`` (e.g. ``golden/mha_seed_example``), or
    the suite case of that name when ``path`` is a bare name that is not a directory here
    (``load_case("sdpa_gqa")``; the suite is ``attnref.suite_dir()``).

    ``input_format`` (None, "float64", "float32", "bfloat16", "float16", "fp8e4m3", "fp8e5m2"): None keeps the case's own
    inputs; a format F gives the inputs a kernel in F reads — the golden inputs rounded once to
    nearest even to F (float64 arrays holding F values: ``.astype(numpy.float32)`` is exact for
    float32, bfloat16 and float16; a backward case's grad_output too) — and the certified output,
    weights and lse *of those rounded inputs* (golden/rounded_inputs.hpp's rounded_case, through the
    fast certified path, as ``attnref generate --golden DIR --input-format F`` writes them).
    ``attnref.check`` and ``attnref.testing.assert_attention_close`` given this GoldenCase judge
    against the same rounded inputs. "fp8e4m3" and "fp8e5m2" quantise each input tensor with a
    power-of-two per-tensor scale (the largest with amax·scale <= the format's max; OCP saturating
    round to nearest even), as FP8 kernels read them: see GoldenCase.fp8_codes and .descales.

    Raises ValueError naming the file and field when the directory is not a valid case (the same
    checks as ``attnref check``: regular files only, sha256, headers, shapes, memory limit), and
    naming ``input_format`` for an unknown format or inputs that overflow in it."""
    import json
    p = _path(path, "path")
    p = p if os.path.exists(p) else (_suite_case_path(p) or p)
    f = "" if input_format is None else _input_format(input_format, _INPUT_FORMATS)
    name, kind, conventions, inputs, reference, described, codes, descales = _attnref._load_case(p, f)
    return GoldenCase(p, name, kind, json.loads(conventions), dict(inputs), dict(reference), f or "case", described,
                      dict(codes), dict(descales))


@dataclass(frozen=True)
class Verdict:
    """The checker's verdict: ``verdict`` is "PASS", "FAIL" or "INCONCLUSIVE" (a bound too loose to
    tell right from wrong, or an untrustworthy output: never a pass); ``reason`` says what decided a
    FAIL or INCONCLUSIVE; ``text``, ``json`` and ``junit`` are the reports ``attnref check`` writes
    (text and json with its "inputs" line and declared policy).
    ``inputs``: which inputs the verdict is about — "case" (the golden inputs as the case stores them)
    or "<F>-rounded" (e.g. "bfloat16-rounded": the golden inputs rounded to nearest even to F, judged
    against the certified result of those); ``inputs_description``: the report's line saying so (and
    why the case's own inputs were kept, when they were); ``policy``: the declared policy or None."""

    verdict: str
    reason: str
    text: str
    json: str
    junit: str
    inputs: str = "case"
    inputs_description: str = ""
    policy: Optional[str] = None

    def __str__(self) -> str:
        policy = f"; policy {self.policy} (declared)" if self.policy else ""
        reason = f": {self.reason}" if self.reason and self.verdict != "PASS" else ""
        return f"{self.verdict}{reason} [inputs: {self.inputs_description}{policy}]"

    @property
    def passed(self) -> bool:
        return self.verdict == "PASS"

    def __bool__(self) -> bool:
        return self.passed


def check(case: Any, output: Any = None, *, weights: Any = None, lse: Any = None, dtype: Optional[str] = None,
          tolerance: str = "data-aware", empty_row_lse: str = "-inf", backward_algorithm: Optional[str] = None,
          input_format: Optional[str] = None, policy: Optional[str] = None, **gradients: Any) -> Verdict:
    """Judges a candidate's outputs against a committed golden case, as ``attnref check`` does.

    ``case``: a GoldenCase or a case directory. ``output`` (and optionally ``weights`` (B, H, Sq, Sk)
    and ``lse`` (B, H, Sq)): arrays in the case's shapes. ``dtype``: the candidate's format
    ("float64", "float32", "bfloat16", "float16"); default: from the arrays' dtype, as
    ``attnref check`` reads it from the files (float64, float32, float16 arrays; bfloat16 torch
    tensors), each array judged in its own format; arrays of another dtype need ``dtype=``, which
    then applies to all. ``tolerance``: the model
    (``attnref.testing`` lists them; default "data-aware"). ``empty_row_lse``: the lse your kernel
    writes for fully masked rows ("-inf", "+inf" as FlashAttention 2/3, or "any").
    Backward cases (``golden/*_bwd_*``): gradients by role as keywords — ``grad_query``, ``grad_key``,
    ``grad_value`` (sdpa dQ, dK, dV; mha the gradients of x_q, x_k, x_v), and for mha ``grad_w_q`` …
    ``grad_w_o``, ``grad_b_q`` … ``grad_b_o`` — judged against the certified gradients with the
    gradient bound (docs/backward.md; "data-aware" or "baseline"); ``output`` is then optional.
    ``backward_algorithm``: "textbook" when your backward forms dS from the forward's own normalised
    weights (autograd through softmax does): dQ's bound then centres the keys ((B5t)), much tighter for
    large logits; "flash" or None (unknown) keep the bound valid for any algorithm.
    ``input_format``: which inputs the candidate computed on, as ``attnref check --input-format``:
    "auto" (the default) — the candidate's format (``dtype``, else the output's, else the first
    gradient's) when it is bfloat16 or float16, or any format when a ``policy`` is declared: the
    reference is then the certified result of the golden inputs rounded to nearest even to it,
    certified on the fly (golden/rounded_inputs.hpp); float32 and float64 candidates keep the case's
    inputs —; "case": the case's own inputs; or a format ("float64", "float32", "bfloat16",
    "float16"). The case's own inputs stay when they are exact in it, overflow in it, or their
    rounded reference cannot be certified; ``Verdict.inputs`` says which. None: "auto", or for a
    GoldenCase from ``load_case(..., input_format=F)`` its F (another value is a ValueError).
    "fp8e4m3" / "fp8e5m2": the golden inputs quantised per tensor with power-of-two descales, as an
    FP8 kernel reads them (``Verdict.inputs`` "fp8e4m3-rounded"); a policy with FP8 inputs
    ("fp8e4m3_fa3_bf16", "fp8e4m3_fa3_fp32") implies "fp8e4m3".
    ``policy``: a declared precision policy, the names of ``attnref run --arith`` / ``check --policy``
    (e.g. "bf16_fp32acc", "fp32_p_bf16"): the data-aware bounds follow where it rounds; its output
    format must be the candidate's. None: the format's bound, valid for any kernel of that format.
    Returns a Verdict (truthy when it is PASS); raises ValueError for unusable input."""
    from .testing import _candidate, _format
    path = case.path if isinstance(case, GoldenCase) else _path(case, "case")
    path = path if os.path.exists(path) else (_suite_case_path(path) or path)
    held = case.input_format if isinstance(case, GoldenCase) else "case"
    if input_format is None:
        input_format = held if held != "case" else "auto"
    else:
        _input_format(input_format, ("auto", "case") + _INPUT_FORMATS)
        if held != "case" and input_format != held:
            raise ValueError(f"input_format: the GoldenCase holds the golden inputs rounded to {held} (load_case(..., "
                             f"input_format={held!r})); judging it with input_format={input_format!r} would be about other "
                             "inputs. Pass None or the same format, or load the case again")
    if policy is not None and not isinstance(policy, str):
        raise TypeError(f"policy: expected a policy name (a string) or None, got {type(policy).__name__}")
    if policy == "":
        raise ValueError("policy: expected a policy name or None, got ''")
    for what, value, options in (("tolerance", tolerance, None), ("empty_row_lse", empty_row_lse, ("-inf", "+inf", "any")),
                                 ("backward_algorithm", backward_algorithm, ("textbook", "flash"))):
        if what == "backward_algorithm" and value is None:
            continue
        if not isinstance(value, str):
            raise TypeError(f"{what}: expected a string, got {type(value).__name__}")
        if options is not None and value not in options:
            raise ValueError(f"{what}: expected one of {', '.join(repr(o) for o in options)}"
                             f"{' or None' if what == 'backward_algorithm' else ''}, got {value!r}")
    for role in gradients:
        if not role.startswith("grad_"):
            raise TypeError(f"check() got an unexpected keyword argument '{role}'")
    gradients = {role: g for role, g in gradients.items() if g is not None}  # None: not given, as for weights=
    if output is None and not gradients:
        raise ValueError("output: give the output, or at least one gradient (grad_query=…, …)")
    given = [(n, x) for n, x in [("output", output), ("weights", weights), ("lse", lse)] + list(gradients.items())
             if x is not None]
    formats: Dict[str, Optional[str]] = {}
    arrays: Dict[str, np.ndarray] = {}
    for n, x in given:
        if isinstance(x, np.ndarray) and np.issubdtype(x.dtype, np.integer):
            a, implied = _as_float64(x, n, allow_nonfinite=True), None  # integers: exact values, no format of their own
        else:
            a, implied = _candidate(x, n)
        arrays[n], formats[n] = a, implied
    own: Dict[str, str] = {}
    if dtype is None:
        # Each array is judged in its own format, as `attnref check` judges each file in its own.
        if None in formats.values():
            unknown = next(n for n, f in formats.items() if f is None)
            raise TypeError(f"dtype: cannot tell the format of {unknown} from its dtype; pass dtype='float32' "
                            "(or float64, bfloat16, float16)")
        fmt = formats[given[0][0]]
        own = {n: f for n, f in formats.items() if f != fmt}
    else:
        fmt = _format(dtype, None)
    grads = [(role, arrays[role]) for role in gradients if role in arrays]
    verdict, reason, text, json_report, junit, rounded_to, described = _attnref._check(
        path, arrays.get("output"), arrays.get("weights"), arrays.get("lse"), fmt, tolerance, empty_row_lse, grads,
        "unknown" if backward_algorithm is None else backward_algorithm, own, input_format, policy or "")
    return Verdict(verdict, reason, text, json_report, junit, f"{rounded_to}-rounded" if rounded_to else "case", described,
                   policy)


from . import testing  # noqa: E402  (after the definitions testing imports)
