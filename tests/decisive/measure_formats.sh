#!/usr/bin/env bash
# Measures attnref's own correct kernels through the gate: `attnref run --arith P` on every committed
# case, then `attnref check` of the output (forward) and of the gradients (backward, declared
# --backward-algorithm textbook), counting PASS / FAIL / INCONCLUSIVE per precision policy.
#
#   tests/decisive/measure_formats.sh ATTNREF_BINARY OUT_DIR [extra check flags...]
#
# e.g. tests/decisive/measure_formats.sh build/default/verify/attnref /tmp/m            (default inputs)
#      tests/decisive/measure_formats.sh build/default/verify/attnref /tmp/m --input-format case
# Writes OUT_DIR/verdicts.tsv (policy, case, direction, verdict, reason) and prints the table:
# forward on the cases without gradients, backward on the gradient cases, and the forward of the
# gradient cases separately.
# POLICIES (environment) overrides the policy list; DECLARE=1 adds `--policy P` to every check (a
# policy with FP8 inputs, e.g. fp8e4m3_fa3_bf16, then implies --input-format fp8e4m3); FORWARD_ONLY=1
# skips the gradient cases (the forward suite alone).
#   e.g. POLICIES=fp8e4m3_fa3_bf16 DECLARE=1 FORWARD_ONLY=1 tests/decisive/measure_formats.sh build/default/verify/attnref /tmp/m8
set -u
bin=$1
out=$2
shift 2
extra=("$@")
policies=${POLICIES:-"float32 bf16_fp32acc fp16_fp32acc fp32_p_bf16"}
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
tsv="$out/verdicts.tsv"
: > "$tsv"
. "$(dirname "$0")/verdict_of.sh"
for p in $policies; do
    for m in "$root"/golden/*/manifest.json; do
        dir=$(dirname "$m")
        name=$(basename "$dir")
        [ "${FORWARD_ONLY:-0}" = 1 ] && [ -f "$dir/grad_query.npy" ] && continue
        declared=()
        [ "${DECLARE:-0}" = 1 ] && declared=(--policy "$p")
        cand="$out/cand/$p/$name"
        rm -rf "$cand"
        if ! "$bin" run --golden "$dir" --arith "$p" --out "$cand" > /dev/null 2> "$out/err"; then
            printf '%s\t%s\t%s\tERROR\trun: %s\n' "$p" "$name" forward "$(head -c 200 "$out/err")" >> "$tsv"
            continue
        fi
        rm -f "$out/f.json" "$out/b.json"
        "$bin" check --golden "$dir" --output "$cand/output.npy" --json "$out/f.json" "${declared[@]}" "${extra[@]}" > /dev/null 2> "$out/err"
        direction=forward
        [ -f "$cand/grad_query.npy" ] && direction=forward_of_backward_case
        printf '%s\t%s\t%s\t%s\n' "$p" "$name" "$direction" "$(verdict_of "$out/f.json")" >> "$tsv"
        if [ -f "$cand/grad_query.npy" ]; then
            args=()
            for g in "$cand"/grad_*.npy; do
                role=$(basename "$g" .npy)
                args+=("--${role//_/-}" "$g")
            done
            "$bin" check --golden "$dir" "${args[@]}" --backward-algorithm textbook --json "$out/b.json" "${declared[@]}" "${extra[@]}" > /dev/null 2> "$out/err"
            printf '%s\t%s\tbackward\t%s\n' "$p" "$name" "$(verdict_of "$out/b.json")" >> "$tsv"
        fi
    done
done
/usr/bin/python3 - "$tsv" <<'PY'
import sys, collections
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
count = collections.Counter((r[0], r[2], r[3]) for r in rows)
total = collections.Counter((r[0], r[2]) for r in rows)
print("| policy | forward PASS | FAIL | INCONCLUSIVE | backward PASS | FAIL | INCONCLUSIVE | forward of backward cases PASS | FAIL | INCONCLUSIVE |")
print("|---|---|---|---|---|---|---|---|---|---|")
for p in dict.fromkeys(r[0] for r in rows):
    cells = []
    for d in ("forward", "backward", "forward_of_backward_case"):
        n = total[(p, d)]
        cells += [f"{count[(p, d, v)]} / {n}" for v in ("PASS", "FAIL", "INCONCLUSIVE")]
    print(f"| {p} | " + " | ".join(cells) + " |")
for r in rows:
    if r[3] not in ("PASS",):
        print("  ", *r[:4], r[4][:140] if len(r) > 4 else "")
PY
