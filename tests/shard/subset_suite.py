#!/usr/bin/python3
"""Writes a suite file holding the named cases of a suite, in the suite's order (the shard tests
generate, merge and compare these rather than all 77: CI time; the committed suite regenerates
whole in golden_suite_regenerates).
    subset_suite.py SUITE OUT CASE...   (exit 2 naming a case the suite lacks)"""
import json
import sys

suite, out, wanted = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(suite) as f:
    s = json.load(f)
names = [c["name"] for c in s["cases"]]
for w in wanted:
    if w not in names:
        sys.exit(f"{suite}: no case '{w}'")
s["cases"] = [c for c in s["cases"] if c["name"] in wanted]
with open(out, "x") as f:
    json.dump(s, f, indent=1)
