#!/usr/bin/python3
"""Writes a forged entry of the bound cache `attnref check` used to keep (since removed), keyed
exactly as that cache keyed it, so that a build that still read the cache would use it.

    checker_forge_cache.py CACHE_HOME TOLERANCE_HPP CASE_DIR N_ELEMENTS BOUND

The entry (CACHE_HOME/attnref/<sha256 of the key text>.npy, '<f8') held [3 (layout version), the key
digest as eight 32-bit words, N, 0 × 6, then N bounds]; the key text named the layout version,
tolerance.hpp's sha256, the case's manifest.json sha256, the format (float32) and the model."""
import hashlib
import os
import sys

import numpy as np

home, tolerance, case, n, bound = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
sha = lambda f: hashlib.sha256(open(f, "rb").read()).hexdigest()
key = ("attnref check bound cache v3\ntolerance.hpp sha256 %s\nmanifest.json sha256 %s\nformat float32\nmodel data-aware\n"
       % (sha(tolerance), sha(os.path.join(case, "manifest.json"))))
digest = hashlib.sha256(key.encode()).hexdigest()
entry = np.zeros(16 + n)
entry[0] = 3
entry[1:9] = [int(digest[8 * i:8 * i + 8], 16) for i in range(8)]
entry[9] = n
entry[16:] = bound
os.makedirs(os.path.join(home, "attnref"), exist_ok=True)
np.save(os.path.join(home, "attnref", digest + ".npy"), entry)
