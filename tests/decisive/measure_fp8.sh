#!/usr/bin/env bash
# Measures an FP8 kernel policy through the gate on the forward suite (the committed cases without
# gradients): `attnref run --arith P` (inputs quantised per tensor to E4M3 with power-of-two descales,
# fp32 accumulation, P·256 in E4M3, output in P's format), then `attnref check --policy P` (which
# implies --input-format fp8e4m3: the reference is certified for the quantised inputs). Also three
# wrong kernels made from the correct output, each a bug of an FP8 kernel's epilogue:
#   v_descale_missing   O·s_v        the P·V accumulator not multiplied by V's descale
#   v_descale_twice     O·descale_v  V's descale applied twice
#   p_unscale_missing   O·256        the static P scale 256 not divided out
# (O is linear in V, so these are exact transforms of the correct kernel's output; powers of two are
# exact in bf16 and fp32 unless they overflow.)
#
#   tests/decisive/measure_fp8.sh ATTNREF_BINARY OUT_DIR [POLICY]     (default fp8e4m3_fa3_bf16)
# Writes OUT_DIR/verdicts.tsv (policy, case, kernel, verdict, reason) and prints the counts.
set -u
bin=$1
out=$2
policy=${3:-fp8e4m3_fa3_bf16}
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
tsv="$out/verdicts.tsv"
: > "$tsv"
. "$(dirname "$0")/verdict_of.sh"
for m in "$root"/golden/*/manifest.json; do
    dir=$(dirname "$m")
    name=$(basename "$dir")
    [ -f "$dir/grad_query.npy" ] && continue
    cand="$out/cand/$name"
    rm -rf "$cand"
    if ! "$bin" run --golden "$dir" --arith "$policy" --out "$cand" > "$out/run.txt" 2> "$out/err"; then
        printf '%s\t%s\tcorrect\tERROR\trun: %s\n' "$policy" "$name" "$(head -c 200 "$out/err")" >> "$tsv"
        continue
    fi
    # V's descale exponent from run's line "... descale query 2^-8, key 2^-8, value 2^-7 ..."
    ev=$(sed -n 's/.*value 2^\(-\{0,1\}[0-9]*\).*/\1/p' "$out/run.txt")
    /usr/bin/python3 - "$cand" "$ev" <<'PY'
import sys, numpy as np
cand, ev = sys.argv[1], int(sys.argv[2])
o = np.load(f"{cand}/output.npy")
bits = o.dtype == np.uint16
x = (o.astype(np.uint32) << 16).view(np.float32).astype(np.float64) if bits else o.astype(np.float64)
for name, factor in (("v_descale_missing", 2.0 ** -ev), ("v_descale_twice", 2.0 ** ev), ("p_unscale_missing", 256.0)):
    y = x * factor  # exact (a power of two) unless it overflows
    if bits:
        y = (y.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # exact: y is a bf16 value
    else:
        y = y.astype(o.dtype)
    np.save(f"{cand}/{name}.npy", y)
PY
    for kernel in correct v_descale_missing v_descale_twice p_unscale_missing; do
        file="$cand/output.npy"
        [ "$kernel" != correct ] && file="$cand/$kernel.npy"
        rm -f "$out/f.json"
        "$bin" check --golden "$dir" --output "$file" --policy "$policy" --json "$out/f.json" > /dev/null 2> "$out/err"
        printf '%s\t%s\t%s\t%s\n' "$policy" "$name" "$kernel" "$(verdict_of "$out/f.json")" >> "$tsv"
    done
done
/usr/bin/python3 - "$tsv" <<'PY'
import sys, collections
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
count = collections.Counter((r[2], r[3]) for r in rows)
total = collections.Counter(r[2] for r in rows)
print("| kernel | PASS | FAIL | INCONCLUSIVE | ERROR |")
print("|---|---|---|---|---|")
for k in dict.fromkeys(r[2] for r in rows):
    print(f"| {k} | " + " | ".join(f"{count[(k, v)]} / {total[k]}" for v in ("PASS", "FAIL", "INCONCLUSIVE", "ERROR")) + " |")
for r in rows:
    if (r[2] == "correct") != (r[3] == "PASS"):
        print("  ", *r[:4], r[4][:140] if len(r) > 4 else "")
PY
