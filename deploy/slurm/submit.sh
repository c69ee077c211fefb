#!/bin/bash
# Submits a sharded golden generation to Slurm: an N-task job array and a merge job that runs after
# all of them succeed. Prints the merge job's id.
#   deploy/slurm/submit.sh ATTNREF SUITE SHARD_ROOT N OUT [extra sbatch options...]
set -euo pipefail
if (($# < 5)); then
  echo "usage: $0 ATTNREF SUITE SHARD_ROOT N OUT [sbatch options...]" >&2
  exit 2
fi
attnref=$1 suite=$2 root=$3 shards=$4 out=$5
shift 5
[[ $shards =~ ^[1-9][0-9]*$ ]] || { echo "$0: N: expected a positive integer, got '$shards'" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$root"
array=$(sbatch --parsable "$@" --array="0-$((shards - 1))" --output="$root/shard-%a.log" \
  "$here/generate-shards.sbatch" "$attnref" "$suite" "$root")
array=${array%%;*}
sbatch --parsable "$@" --dependency="afterok:$array" --output="$root/merge.log" \
  "$here/merge-shards.sbatch" "$attnref" "$suite" "$root" "$shards" "$out"
