#!/usr/bin/env bash
# Writes every `attnref check` report (text, JSON, JUnit) of the committed suite for attnref's own
# kernels in float32, bf16, fp16, bf16_fp32acc and float64, with paths normalised, so that two trees'
# checkers can be compared byte for byte (a refactor must leave every report unchanged):
#
#   tests/decisive/check_reports.sh ATTNREF_BINARY OUT_DIR
#   diff -r OUT_DIR_BEFORE OUT_DIR_AFTER
#
# Forward: the output, weights and lse; gradient cases: every gradient file `run` writes too.
set -u
bin=$1
out=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for p in float32 bf16 fp16 bf16_fp32acc float64; do
    for m in "$root"/golden/*/manifest.json; do
        dir=$(dirname "$m")
        name=$(basename "$dir")
        cand="$work/$p/$name"
        "$bin" run --golden "$dir" --arith "$p" --out "$cand" > /dev/null 2>&1 || { echo "run failed: $p $name" > "$out/$p.$name.txt"; continue; }
        args=(--output "$cand/output.npy")
        [ -f "$cand/weights.npy" ] && args+=(--weights "$cand/weights.npy")
        [ -f "$cand/lse.npy" ] && args+=(--lse "$cand/lse.npy")
        for g in "$cand"/grad_*.npy; do
            [ -f "$g" ] || continue
            role=$(basename "$g" .npy)
            args+=("--${role//_/-}" "$g")
        done
        rm -f "$work/r.json" "$work/r.xml"
        "$bin" check --golden "$dir" "${args[@]}" --json "$work/r.json" --junit "$work/r.xml" > "$work/r.txt" 2>&1
        echo "exit $?" >> "$work/r.txt"
        for f in r.txt r.json r.xml; do
            [ -f "$work/$f" ] || continue
            sed -e "s#$work#CAND#g" -e "s#$root#ROOT#g" "$work/$f" > "$out/$p.$name.${f#r.}"
        done
    done
done
