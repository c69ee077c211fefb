#!/usr/bin/python3
"""Independent re-implementation of attnref's input generator ("splitmix64-v1", golden/README.md)
with numpy only. Usage: generator_reference.py CASE_DIR...  Regenerates every input tensor of each
case from its manifest and compares it bit for bit with the stored .npy; exit 0 when all match."""
import json
import math
import sys

import numpy as np

M64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15
ROLE_ID = {"query": 1, "key": 2, "value": 3, "w_q": 4, "w_k": 5, "w_v": 6, "w_o": 7, "b_q": 8, "b_k": 9,
           "b_v": 10, "b_o": 11, "mask": 12, "additive_mask": 13, "seed_mask": 14, "grad_output": 15}
# Certified results (not generated): the forward's outputs and a backward case's gradients.
OUTPUT_ROLES = ("output", "weights", "lse", "grad_query", "grad_key", "grad_value", "grad_w_q", "grad_w_k", "grad_w_v",
                "grad_w_o", "grad_b_q", "grad_b_k", "grad_b_v", "grad_b_o")


def mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def uniform(seed, role, n):
    """u in [0, 1) for element n (C order) of `role`: exact, 53 random bits."""
    stream = mix(seed ^ ((ROLE_ID[role] * GAMMA) & M64))
    return (mix((stream + (n + 1) * GAMMA) & M64) >> 11) * 2.0**-53


def round_to_format(x, fmt):
    """Round a double once, to nearest even, into the input format; return it as a double."""
    if fmt == "float64":
        return x
    if fmt == "float32":
        return float(np.float32(x))   # numpy rounds float64 -> float32 to nearest even
    if fmt == "float16":
        return float(np.float16(x))   # numpy rounds float64 -> float16 directly (no double rounding)
    if fmt == "bfloat16":             # RNE on the float64 bits: keep 7 of 52 fraction bits
        assert x == 0 or 2.0**-126 <= abs(x) < 2.0**127, "outside bfloat16's normal range"
        b = int(np.float64(x).view(np.uint64))
        b = (b + (1 << 44) - 1 + ((b >> 45) & 1)) & ~((1 << 45) - 1) & M64
        return float(np.uint64(b).view(np.float64))
    raise ValueError(fmt)


def generate(manifest, role, shape):
    """One input tensor, as attnref generates it (see include/attnref/io/generator.hpp)."""
    inputs = manifest["inputs"]
    seed, fmt, fam = inputs["seed"], inputs["format"], inputs["family"]
    count = math.prod(shape)
    if role == "mask":
        return np.array([uniform(seed, role, n) < fam["mask_true_probability"] for n in range(count)]).reshape(shape)
    if role == "seed_mask":
        return np.array([1.0 if uniform(seed, role, n) < fam["mask_true_probability"] else 0.0
                         for n in range(count)]).reshape(shape)
    if role == "additive_mask":
        scale = fam["roles"]["additive_mask"]["scale"]
        return np.array([-math.inf if (u := uniform(seed, role, n)) < fam["additive_inf_probability"]
                         else (2 * u - 1) * scale for n in range(count)]).reshape(shape)
    a = fam["roles"][role]

    def plain(n):
        return round_to_format((2 * uniform(seed, role, n) - 1) * a["scale"] + a["offset"], fmt)

    structured = len(shape) == 4
    length, features = (shape[2], shape[3]) if structured else (1, 1)
    out = []
    for n in range(count):
        c, j = n % features, (n // features) % length
        if structured and role == "key" and j < fam["tied_keys"]:
            x = plain(n - j * features)
        elif structured and role == "value" and fam["negate_odd_value_rows"] and j % 2 == 1:
            x = -plain(n - features)
        else:
            x = plain(n)
        if structured and c == 0 and role == "query" and fam["query_feature0"] is not None:
            x = round_to_format(fam["query_feature0"], fmt)
        if (structured and c == 0 and role == "key" and fam["key_feature0"] is not None
                and (fam["key_feature0_keys"] == 0 or j < fam["key_feature0_keys"])):
            x = round_to_format(fam["key_feature0"], fmt)
        out.append(x)
    return np.array(out, dtype=np.float64).reshape(shape)


def check_case(case_dir):
    with open(f"{case_dir}/manifest.json") as f:
        manifest = json.load(f)
    ok = True
    for t in manifest["tensors"]:
        if t["role"] in OUTPUT_ROLES:
            continue
        stored = np.load(f"{case_dir}/{t['file']}")
        mine = generate(manifest, t["role"], t["shape"])
        same = stored.shape == mine.shape and stored.dtype == mine.dtype and stored.tobytes() == mine.tobytes()
        print(f"{case_dir}/{t['file']}: {'identical' if same else 'DIFFERS'}")
        ok = ok and same
    return ok


if __name__ == "__main__":
    results = [check_case(d) for d in sys.argv[1:]]
    sys.exit(0 if results and all(results) else 1)
