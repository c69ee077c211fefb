#!/usr/bin/python3
"""Tampers with one tensor of a golden case directory the way a forger would: multiplies the float64
file of ROLE by FACTOR and rewrites its sha256 in manifest.json to match (the manifest stays the
canonical text: only the 64 hex digits change), so every checksum agrees.

    tamper.py CASE_DIR ROLE FACTOR
"""
import hashlib
import json
import os
import sys

import numpy as np

case, role, factor = sys.argv[1], sys.argv[2], float(sys.argv[3])
manifest_path = os.path.join(case, 'manifest.json')
with open(manifest_path) as f:
    text = f.read()
entry = next(t for t in json.loads(text)['tensors'] if t['role'] == role and 'target' not in t)
path = os.path.join(case, entry['file'])
a = np.load(path)
b = a * factor
assert (b != a).any(), f'{role} x {factor} changes nothing'
np.save(path, b)
with open(path, 'rb') as f:
    digest = hashlib.sha256(f.read()).hexdigest()
assert text.count(entry['sha256']) == 1
with open(manifest_path, 'w') as f:
    f.write(text.replace(entry['sha256'], digest))
