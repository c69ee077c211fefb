#!/bin/bash
# The Slurm path on one node: starts a private slurmctld and slurmd (auth/none, state in WORKDIR, the
# current user as SlurmUser), submits deploy/slurm/submit.sh's job array of N shards and its merge
# job, waits, and compares the merged suite with the committed one file for file. Exits 77 (CTest:
# skipped) with the reason when Slurm is not installed or its daemons cannot start here.
#   slurm.sh ATTNREF SUITE WORKDIR SOURCE_DIR
set -uo pipefail
attnref=$1 committed=$2 work=$3 source=$4
golden=$(dirname "$committed")
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
for b in slurmctld slurmd sbatch squeue sinfo scontrol; do
  command -v "$b" > /dev/null || [ -x "/usr/sbin/$b" ] || skip "Slurm is not installed ($b missing; Debian package slurm-wlm)"
done
PATH=$PATH:/usr/sbin
rm -rf "$work" && mkdir -p "$work/state" "$work/spool" "$work/log"
# Six cases of every kind (forward and backward, SDPA and MHA, bf16 targets): the jobs' work scales
# with the cases, and local.sh tests merge's refusals.
suite=$work/suite.json
/usr/bin/python3 "$(dirname "$0")/subset_suite.py" "$committed" "$suite" sdpa_basic sdpa_input_bfloat16 sdpa_gqa \
  mha_causal_bfloat16 sdpa_bwd_gqa mha_bwd_bias_gqa || fail "subset_suite.py"
node=$(hostname -s)
user=$(id -un)
port=$((47000 + $$ % 1000 * 2))
export SLURM_CONF=$work/slurm.conf
cat > "$SLURM_CONF" <<CONF
ClusterName=attnreftest
SlurmctldHost=$node
AuthType=auth/none
CredType=cred/none
SlurmUser=$user
SlurmdUser=$user
SlurmctldPort=$port
SlurmdPort=$((port + 1))
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$node CPUs=2 State=UNKNOWN
PartitionName=attnref Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF
cleanup() {
  for f in "$work/slurmd.pid" "$work/slurmctld.pid"; do [ -f "$f" ] && kill "$(cat "$f")" 2> /dev/null; done
  sleep 1
  for f in "$work/slurmd.pid" "$work/slurmctld.pid"; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2> /dev/null; done
}
trap cleanup EXIT
slurmctld -c -i > "$work/log/slurmctld.out" 2>&1 || skip "slurmctld could not start: $(tail -1 "$work/log/slurmctld.out")"
slurmd > "$work/log/slurmd.out" 2>&1 || skip "slurmd could not start: $(tail -1 "$work/log/slurmd.out")"
up=0
for _ in $(seq 1 40); do
  if sinfo -h -o %T 2> /dev/null | grep -q idle; then up=1; break; fi
  sleep 0.5
done
[ $up -eq 1 ] || skip "the Slurm node did not become idle in 20 s: $(tail -2 "$work/log/slurmctld.log" 2> /dev/null)"
merge_job=$("$source/deploy/slurm/submit.sh" "$attnref" "$suite" "$work/shards" 3 "$work/merged" --partition=attnref) ||
  fail "submit.sh failed"
for _ in $(seq 1 600); do
  [ -z "$(squeue -h -o %i 2> /dev/null)" ] && break
  sleep 0.5
done
[ -z "$(squeue -h -o %i)" ] || fail "jobs still queued after 300 s: $(squeue)"
state=$(scontrol show job "$merge_job" 2> /dev/null | grep -o 'JobState=[A-Z]*' || true)
cases=0
for name in $(/usr/bin/python3 -c 'import json,sys; print(" ".join(c["name"] for c in json.load(open(sys.argv[1]))["cases"]))' "$suite"); do
  diff -r "$golden/$name" "$work/merged/$name" > /dev/null || { cat "$work/shards"/*.log; fail "merged case $name differs from $golden/$name ($state)"; }
  cases=$((cases + 1))
done
[ "$cases" -eq 6 ] && [ "$(ls "$work/merged" | wc -l)" -eq 6 ] || fail "merged $(ls "$work/merged" | wc -l) cases, the subset suite $cases, expected 6"
echo "Slurm: 3-task job array + merge job (merge job $merge_job): $cases cases identical to $golden"
