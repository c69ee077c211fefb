#!/bin/bash
# Sharded generation without a scheduler: N concurrent `attnref generate --shard I/N` processes, then
# `attnref merge`; the merged directory must equal the committed golden suite file for file, and
# merge must refuse incomplete, duplicated, foreign and tampered shards (exit 2, naming the file).
#   local.sh ATTNREF SUITE WORKDIR
set -uo pipefail
attnref=$1 committed=$2 work=$3
golden=$(dirname "$committed")
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }
# Nine cases of every kind (forward and backward, SDPA and MHA, bf16 inputs and targets, a mask
# leaving rows empty): the shards' work and merge's re-verification scale with the cases.
suite=$work/suite.json
/usr/bin/python3 "$(dirname "$0")/subset_suite.py" "$committed" "$suite" sdpa_basic sdpa_input_bfloat16 sdpa_empty_rows_nan \
  sdpa_gqa sdpa_softcap mha_seed_example mha_causal_bfloat16 sdpa_bwd_gqa mha_bwd_bias_gqa || fail "subset_suite.py"
n=3
pids=()
for ((i = 0; i < n; ++i)); do
  "$attnref" generate --suite "$suite" --shard "$i/$n" --out "$work/shards/$i" --threads 1 --quiet > "$work/shard-$i.log" 2>&1 &
  pids+=($!)
done
for ((i = 0; i < n; ++i)); do wait "${pids[$i]}" || { cat "$work/shard-$i.log"; fail "shard $i exited $?"; }; done
"$attnref" merge --suite "$suite" --out "$work/merged" --quiet "$work/shards/0" "$work/shards/1" "$work/shards/2" || fail "merge exited $?"
cases=0
for name in $(/usr/bin/python3 -c 'import json,sys; print(" ".join(c["name"] for c in json.load(open(sys.argv[1]))["cases"]))' "$suite"); do
  diff -r "$golden/$name" "$work/merged/$name" > /dev/null || fail "merged case $name differs from $golden/$name"
  cases=$((cases + 1))
done
[ "$cases" -eq 9 ] || fail "the subset suite has $cases cases, expected 9"
[ "$(ls "$work/merged" | wc -l)" -eq "$cases" ] || fail "merged directory has $(ls "$work/merged" | wc -l) entries, the suite $cases cases"
echo "merged $n shards: $cases cases identical to $golden"
# Each shard holds a third or so of the cases, none twice.
total=0
for ((i = 0; i < n; ++i)); do total=$((total + $(find "$work/shards/$i" -mindepth 1 -maxdepth 1 -type d | wc -l))); done
[ "$total" -eq "$cases" ] || fail "shards hold $total case directories, the suite $cases"

expect_2() {  # expect_2 PATTERN ARGS...: merge must exit 2 with a one-line message matching PATTERN
  local pattern=$1; shift
  "$attnref" merge --suite "$suite" --out "$work/refused" --quiet "$@" > "$work/err.log" 2>&1
  local rc=$?
  [ "$rc" -eq 2 ] || { cat "$work/err.log"; fail "merge $* exited $rc, expected 2"; }
  grep -q -- "$pattern" "$work/err.log" || { cat "$work/err.log"; fail "merge $*: message does not match '$pattern'"; }
  [ ! -e "$work/refused" ] || [ -z "$(ls "$work/refused")" ] || fail "merge $* wrote cases before refusing"
}
expect_2 "shard 2 of 3 is missing" "$work/shards/0" "$work/shards/1"
expect_2 "shard 1 is also" "$work/shards/0" "$work/shards/1" "$work/shards/1"
cp -r "$work/shards/1" "$work/incomplete" && rm "$work/incomplete/shard.json"
expect_2 "incomplete/shard.json: missing" "$work/shards/0" "$work/incomplete" "$work/shards/2"
cp -r "$work/shards/1" "$work/foreign"
sed -i 's/"suite_sha256": "[0-9a-f]*"/"suite_sha256": "0000"/' "$work/foreign/shard.json"
expect_2 "field 'suite_sha256'" "$work/shards/0" "$work/foreign" "$work/shards/2"
cp -r "$work/shards/1" "$work/tampered"
victim=$(find "$work/tampered" -name output.npy | head -1)
printf '\x01' | dd of="$victim" bs=1 seek=200 conv=notrunc status=none
expect_2 "does not match" "$work/shards/0" "$work/tampered" "$work/shards/2"
cp -r "$work/shards/1" "$work/moved"
other=$(find "$work/shards/0" -mindepth 1 -maxdepth 1 -type d | head -1)
cp -r "$other" "$work/moved/"
python_edit='import json,sys; p=sys.argv[1]; r=json.load(open(p)); r["cases"].append(sys.argv[2]); open(p,"w").write(json.dumps(r))'
/usr/bin/python3 -c "$python_edit" "$work/moved/shard.json" "$(basename "$other")"
expect_2 "field 'cases'" "$work/shards/0" "$work/moved" "$work/shards/2"
"$attnref" generate --suite "$suite" --shard 3/3 --out "$work/bad" > "$work/err.log" 2>&1
[ $? -eq 2 ] && grep -q "expected I/N" "$work/err.log" || { cat "$work/err.log"; fail "--shard 3/3 was not refused with exit 2"; }
echo "merge refused 6 bad shard sets and --shard 3/3 with exit 2"

# A forger edits a tensor and its sha256 in manifest.json together: every checksum agrees, the manifest
# is canonical, yet merge re-derives the case (inputs from the recipe, reference re-certified) and
# refuses it. The backward case sdpa_bwd_gqa has an output, gradients and generated inputs.
victim=sdpa_bwd_gqa
holder=$(for ((i = 0; i < n; ++i)); do [ -d "$work/shards/$i/$victim" ] && echo "$i"; done)
[ -n "$holder" ] || fail "no shard holds $victim"
shard_args() {  # the three shard directories with shard $holder replaced by $1
  for ((i = 0; i < n; ++i)); do if [ "$i" = "$holder" ]; then echo "$1"; else echo "$work/shards/$i"; fi; done
}
forged=0
for edit in "output 1.001 not the certified reference" "grad_query 2 not the certified reference" \
            "query 1.5 not the inputs the suite's recipe generates"; do
  read -r role factor pattern <<< "$edit"
  rm -rf "$work/forged" && cp -r "$work/shards/$holder" "$work/forged"
  /usr/bin/python3 "$(dirname "$0")/tamper.py" "$work/forged/$victim" "$role" "$factor" || fail "tamper.py $role failed"
  # The forgery passes every checksum: the case loads as a golden case.
  "$attnref" check --golden "$work/forged/$victim" --output "$work/forged/$victim/output.npy" > /dev/null 2>&1
  [ $? -ne 2 ] || fail "forged $role: the case does not even load (the forgery is not checksum-consistent)"
  mapfile -t args < <(shard_args "$work/forged")
  expect_2 "$victim/$role.npy: $pattern" "${args[@]}"
  if [ "$role" = output ]; then
    "$attnref" merge --suite "$suite" --verify --quiet "${args[@]}" > "$work/err.log" 2>&1
    [ $? -eq 2 ] && grep -q "$role.npy" "$work/err.log" || { cat "$work/err.log"; fail "merge --verify accepted the forged $role"; }
  fi
  forged=$((forged + 1))
done
# merge --verify on the honest shards: exit 0, nothing written.
"$attnref" merge --suite "$suite" --verify --out "$work/verified" --quiet "$work/shards/0" "$work/shards/1" "$work/shards/2" > "$work/err.log" 2>&1 \
  || { cat "$work/err.log"; fail "merge --verify refused honest shards"; }
[ ! -e "$work/verified" ] || fail "merge --verify wrote $work/verified"
echo "merge refused $forged forged shards (tensor and sha256 edited together); --verify accepted the honest ones, wrote nothing"
