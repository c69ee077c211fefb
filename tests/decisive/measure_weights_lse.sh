#!/usr/bin/env bash
# attnref's own kernels' weights and lse under their own declared policy and undeclared in their format,
# on every committed forward case: `attnref run --arith P`, then `attnref check --policy P` and
# `attnref check` (no policy) with --output, --weights and --lse. Prints, per policy, how many cases
# give PASS / FAIL / INCONCLUSIVE for the output, the weights and the lse (docs/verdicts-by-format.md,
# "Weights and lse"), and exits 1 if a weights or lse tensor FAILs under the declared policy, or
# undeclared for the policies that are kernels of their files' format (every intermediate in it or wider:
# float32, float64, bf16, fp16, bf16_fp32acc, fp16_fp32acc, bf16_materialised). A float32 file of a
# kernel that rounds P to bf16 or FP8, or reads FP8 inputs, is no float32 kernel: undeclared, its output
# FAILs too (printed, not counted). Nor is a kernel whose own output FAILs on a case (fp16 overflowing the
# seed mask's -1e9 to NaN): its weights and lse may FAIL there too.
#
#   tests/decisive/measure_weights_lse.sh ATTNREF [CASE_GLOB] [POLICY...]
set -u
bin=$1
shift
glob=${1:-"*"}
[ $# -gt 0 ] && shift
root=$(cd "$(dirname "$0")/../.." && pwd)
policies=("$@")
if [ ${#policies[@]} -eq 0 ]; then
    policies=(float32 float64 bf16 fp16 bf16_fp32acc fp16_fp32acc fp32_p_bf16 fp32_p_fp8e4m3 fp32_p_fp8e5m2 fp32_p_fp8e4m3_s256
              fp32_p_fp8e5m2_s256 bf16_materialised fp8e4m3_fa3_bf16 fp8e4m3_fa3_fp32)
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
in_format=" float32 float64 bf16 fp16 bf16_fp32acc fp16_fp32acc bf16_materialised "
fails=0
printf '%-22s %-10s %-22s %-22s %-22s\n' policy check "output P/F/I" "weights P/F/I" "lse P/F/I"
for p in "${policies[@]}"; do
    for mode in declared undeclared; do
        op=0 of=0 oi=0 wp=0 wf=0 wi=0 lp=0 lf=0 li=0
        for m in "$root"/golden/$glob/manifest.json; do
            dir=$(dirname "$m")
            case $(basename "$dir") in *_bwd_*) continue ;; esac
            cand="$work/$p/$(basename "$dir")"
            "$bin" run --golden "$dir" --arith "$p" --out "$cand" > /dev/null 2>&1 || continue
            [ -f "$cand/weights.npy" ] && [ -f "$cand/lse.npy" ] || continue
            args=(check --golden "$dir" --output "$cand/output.npy" --weights "$cand/weights.npy" --lse "$cand/lse.npy" --json "$work/r.json" --force)
            [ $mode = declared ] && args+=(--policy "$p")
            "$bin" "${args[@]}" > "$work/out.txt" 2>&1
            ov=none
            for t in output weights lse; do
                v=$(/usr/bin/python3 -c "import json,sys;r=json.load(open('$work/r.json'));print(next((x['verdict'] for x in r['tensors'] if x['name']=='$t'),'none'))" 2>/dev/null || echo none)
                [ $t = output ] && ov=$v
                # undeclared, a FAIL counts against the bound only where the output passes
                counts=1
                [ $mode = undeclared ] && [[ "$in_format" != *" $p "* ]] && counts=0
                [ "$ov" = FAIL ] && counts=0  # the kernel's own output fails there (e.g. fp16 overflowing -1e9): not a correct kernel
                case "$t:$v" in
                    output:pass) op=$((op+1)) ;; output:FAIL) of=$((of+1)) ;; output:*) oi=$((oi+1)) ;;
                    weights:pass) wp=$((wp+1)) ;;
                    weights:FAIL) wf=$((wf+1)); [ $counts = 1 ] && { fails=$((fails+1)); echo "  FAIL weights: $p $mode $(basename "$dir")"; } ;;
                    weights:*) wi=$((wi+1)) ;;
                    lse:pass) lp=$((lp+1)) ;;
                    lse:FAIL) lf=$((lf+1)); [ $counts = 1 ] && { fails=$((fails+1)); echo "  FAIL lse: $p $mode $(basename "$dir")"; } ;;
                    lse:*) li=$((li+1)) ;;
                esac
            done
            rm -f "$work/r.json"
        done
        printf '%-22s %-10s %-22s %-22s %-22s\n' "$p" "$mode" "$op/$of/$oi" "$wp/$wf/$wi" "$lp/$lf/$li"
    done
done
echo "weights or lse FAIL (declared, or undeclared for a kernel of its files' format): $fails"
[ $fails -eq 0 ]
