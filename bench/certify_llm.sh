#!/bin/bash
# Certification at LLM size, MHA (1, 2048, 1024, 16), side by side with PyTorch's float64 forward
# (bench/torch_mha.py: multi_head_attention_forward with biases and per-head weights, 2 threads,
# best of 3). Prints one line per run:
#   1. golden.bench --only-large for seeds 0-4 (certify_fast with its escalation, PyTorch in the same run);
#   2. `attnref generate` (inputs, certification, .npy files and hashes) for seeds 0-4 and the two
#      adversarial cases of bench/llm_adversarial_suite.json, under /usr/bin/time, then torch_mha.py.
# Usage: bench/certify_llm.sh [BUILD_DIR (default build/default)] [SCRATCH_DIR (default a fresh mktemp -d)]
# Needs /usr/bin/python3 with torch (python3-torch) and GNU time (time). A benchmark, not a test.
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build/default}" && pwd)
scratch=${2:-$(mktemp -d)}
mkdir -p "$scratch"
for s in 0 1 2 3 4; do
  echo "== golden.bench --only-large --seed $s"
  "$build/bench/golden.bench" --threads 2 --only-large --seed "$s" 2>&1 | tail -2
done
run_generate() {  # label, then generate's arguments
  local label=$1
  shift
  rm -rf "$scratch/out" && mkdir -p "$scratch/out"
  local load
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  /usr/bin/time -f "%e %U %S %M" -o "$scratch/time.txt" "$build/verify/attnref" generate "$@" --out "$scratch/out" --threads 2 \
    > "$scratch/generate.log" 2>&1
  local rc=$? escalated wall user sys rss twall tcpu
  escalated=$(grep -E " written$" "$scratch/generate.log" | tail -1 | awk '{print $(NF-2)}')
  read -r wall user sys rss < "$scratch/time.txt"
  read -r twall tcpu < <(/usr/bin/python3 "$here/torch_mha.py" 1 2048 1024 16 2 3)
  /usr/bin/python3 - "$label" "$rc" "$load" "$wall" "$user" "$sys" "$rss" "${escalated:-?}" "$twall" "$tcpu" <<'PY'
import sys
label, rc, load, w, u, s, r, esc, tw, tc = sys.argv[1:]
w, u, s, r, tw, tc = float(w), float(u), float(s), float(r), float(tw), float(tc)
print(f"{label}: exit {rc}, load {load} | attnref generate wall {w:.1f} s CPU {u + s:.1f} s peak {r / 2**20:.2f} GiB, "
      f"escalated {esc} | PyTorch wall {tw:.3f} s CPU {tc:.3f} s | ratio wall {w / tw:.1f}x CPU {(u + s) / tc:.1f}x")
PY
}
for s in 0 1 2 3 4; do
  run_generate "generate seed $s" --name x --kind mha --batch 1 --heads 16 --sq 2048 --dk 64 --model-dim 1024 --seed "$s"
done
for c in llm_large_logits llm_positive_values; do
  run_generate "generate $c" --suite "$here/llm_adversarial_suite.json" --case "$c"
done
