"""Where the golden suite is, and its cases by name and by property.

    import attnref
    attnref.suite_dir()                          # the suite directory (holding suite.json)
    attnref.load_case("sdpa_gqa")                # a suite case by name
    attnref.suite_cases(kind="sdpa", gradients=False, causal=True)   # names, for pytest.mark.parametrize

The suite is looked up in the order the ``attnref`` command uses for its default ``--suite``
(docs/cli.md, "Where the suite is"):

1. ``$ATTNREF_SUITE`` when set and not empty: a suite directory (used even when it holds no
   suite.json, so that a wrong setting is an error naming it, never a silent fallback);
2. ``./golden`` when it holds a suite.json (a checkout of attnref, or your copy of the suite);
3. the installed suite ``<prefix>/share/attnref/golden``, ``<prefix>`` found from this package's own
   location (``<prefix>/lib/python3.X/dist-packages/attnref`` after ``cmake --install``, or the build
   tree's ``build/default/python/attnref``, whose ``build/default/share/attnref/golden`` links to the
   checkout), then from the ``attnref`` command on PATH (``<prefix>/bin/attnref``).
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Any, Dict, List, Optional

__all__ = ["suite_dir", "suite_cases", "case_path"]

_SUITE_FILE = "suite.json"
_SHARE = os.path.join("share", "attnref", "golden")


def _has_suite(d: str) -> bool:
    return os.path.isfile(os.path.join(d, _SUITE_FILE))


def _installed_candidates() -> List[str]:
    found: List[str] = []
    here = os.path.dirname(os.path.realpath(__file__))
    d = here
    for _ in range(4):  # attnref → dist-packages → python3.X → lib → <prefix>
        d = os.path.dirname(d)
        found.append(os.path.join(d, _SHARE))
    exe = shutil.which("attnref")
    if exe:
        found.append(os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(exe))), _SHARE))
    return found


def suite_dir() -> str:
    """The golden suite's directory (absolute), found in the order the module docstring gives.

    Raises FileNotFoundError naming every place looked at when no suite is found, or naming
    $ATTNREF_SUITE when that variable points to a directory without suite.json."""
    env = os.environ.get("ATTNREF_SUITE", "")
    if env:
        if not _has_suite(env):
            raise FileNotFoundError(f"$ATTNREF_SUITE: no {_SUITE_FILE} in {env!r}")
        return os.path.abspath(env)
    if _has_suite("golden"):
        return os.path.abspath("golden")
    tried = _installed_candidates()
    for d in tried:
        if _has_suite(d):
            return os.path.abspath(d)
    raise FileNotFoundError("no golden suite found: set $ATTNREF_SUITE to a suite directory, run from a directory holding "
                            f"golden/{_SUITE_FILE}, or install attnref (cmake --install); looked in " + ", ".join(tried))


def case_path(name: str) -> Optional[str]:
    """The directory of the suite case ``name`` (a bare case name such as "sdpa_gqa"), or None when
    ``name`` is not a bare name or the suite has no such directory."""
    if not isinstance(name, str) or not name or name in (".", "..") or os.sep in name or (os.altsep and os.altsep in name):
        return None
    try:
        d = os.path.join(suite_dir(), name)
    except FileNotFoundError:
        return None
    return d if os.path.isdir(d) else None


def _manifests(suite: str) -> List[Dict[str, Any]]:
    with open(os.path.join(suite, _SUITE_FILE), encoding="utf-8") as f:
        names = [c["name"] for c in json.load(f)["cases"]]
    out = []
    for n in names:
        with open(os.path.join(suite, n, "manifest.json"), encoding="utf-8") as f:
            out.append(json.load(f))
    return out


def suite_cases(kind: Optional[str] = None, *, gradients: Optional[bool] = None, input_format: Optional[str] = None,
                suite: Any = None, **conventions: Any) -> List[str]:
    """Names of the suite's cases, in suite order, filtered by what their manifests say; for
    ``pytest.mark.parametrize("name", attnref.suite_cases(...))`` and ``attnref.load_case(name)``.

    ``kind``: "sdpa" or "mha". ``gradients``: True for the backward cases (certified gradients),
    False for the forward-only ones. ``input_format``: "float64", "float32", "bfloat16", "float16".
    Every other keyword is a field of the manifest's ``conventions`` and must equal it, e.g.
    ``causal=True``, ``causal_alignment="bottom_right"``, ``seed_mask=False``, ``softcap=None``,
    ``empty_rows="nan"`` (golden/README.md lists the fields). ``suite``: a suite directory
    (default: ``suite_dir()``). Reads only the manifests (no tensors).

    Raises ValueError for an unknown kind or convention field, FileNotFoundError when no suite is found."""
    if kind not in (None, "sdpa", "mha"):
        raise ValueError(f"kind: expected 'sdpa', 'mha' or None, got {kind!r}")
    if gradients not in (None, True, False):
        raise TypeError(f"gradients: expected True, False or None, got {gradients!r}")
    root = os.fspath(suite) if suite is not None else suite_dir()
    manifests = _manifests(root)
    known = set().union(*(m.get("conventions", {}).keys() for m in manifests)) if manifests else set()
    for key in conventions:
        if key not in known:
            raise ValueError(f"{key}: not a convention field of the suite's manifests (known: {', '.join(sorted(known))})")
    names = []
    for m in manifests:
        if kind is not None and m["kind"] != kind:
            continue
        if gradients is not None and bool(m.get("outputs", {}).get("gradients", False)) != gradients:
            continue
        if input_format is not None and m.get("inputs", {}).get("format") != input_format:
            continue
        conv = m.get("conventions", {})
        if any(conv.get(k) != v for k, v in conventions.items()):
            continue
        names.append(m["name"])
    return names
