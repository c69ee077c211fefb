#!/bin/sh
# Compile-time benchmark (not a test): constant-evaluates fixed-shape multi-head attention whole
# (tests/static/seed_example.constexpr.cpp: B = 2, S = 10, H = 8, head dim d_model/8, seed mask, its
# static_asserts) at each d_model with each compiler, -fsyntax-only, and prints wall-clock and CPU
# seconds, peak memory (GNU time's maximum resident set size) and constant-evaluated multiply-adds per
# second: (80·d² + 400·d) / (CPU seconds − the CPU seconds of parsing the same headers without the
# evaluation). Usage, from anywhere:
#   bench/compile_time.sh [d_model ...]        (default 64 128 256 512)
# Environment: CLANGXX (default clang++-14), GXX (default g++-12); set either to "" to skip it;
# LIMIT_S (default 1800) caps each compile (timeout), LIMIT_KB (default 16000000) its memory (ulimit -v).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
src=$root/tests/static/seed_example.constexpr.cpp
dims=${*:-64 128 256 512}
clangxx=${CLANGXX-clang++-14}
gxx=${GXX-g++-12}
limit_s=${LIMIT_S:-1800}
limit_kb=${LIMIT_KB:-16000000}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '#include "%s"\n#include "attnref/attnref.hpp"\nint main() {}\n' "$root/tests/support/fixed_inputs.hpp" > "$tmp/parse_only.cpp"

# measure <compiler> <source> <extra flags...>: prints "status elapsed_s cpu_s max_kb"
measure() {
    cxx=$1
    source=$2
    shift 2
    case $cxx in
        *clang*) limits="-fconstexpr-steps=2147483647" ;;
        *) limits="-fconstexpr-ops-limit=1099511627776 -fconstexpr-loop-limit=2147483647" ;;
    esac
    # shellcheck disable=SC2086  # $limits is a list of flags
    (ulimit -v "$limit_kb"; /usr/bin/time -f '%e %U %S %M' -o "$tmp/time" timeout "$limit_s" \
        "$cxx" -std=c++20 -fsyntax-only -ffp-contract=off $limits -I"$root/include" "$@" "$source" > "$tmp/log" 2>&1)
    status=$?
    read -r elapsed user sys kb < "$tmp/time" 2>/dev/null || { elapsed=0; user=0; sys=0; kb=0; }
    cpu=$(echo "$user + $sys" | bc)
    if [ $status -eq 0 ]; then word=ok; elif [ $status -eq 124 ]; then word=timeout; else word="failed($status)"; fi
    if [ "$word" != ok ]; then tail -n 3 "$tmp/log" | cut -c1-200 >&2; fi
    echo "$word $elapsed $cpu $kb"
}

echo "compile-time benchmark: fixed-shape MHA constant-evaluated whole (B=2, S=10, H=8), -fsyntax-only"
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-12s %8s %9s %9s %9s %11s %14s  %s\n' compiler d_model "MMAC" "wall s" "CPU s" "peak MB" "MAC/s (eval)" status
for cxx in $clangxx $gxx; do
    [ -n "$cxx" ] || continue
    command -v "$cxx" > /dev/null || { echo "$cxx: not found"; continue; }
    set -- $(measure "$cxx" "$tmp/parse_only.cpp")
    parse_cpu=$3
    printf '%-12s %8s %9s %9s %9s %11s %14s  %s\n' "$cxx" "(parse)" - "$2" "$3" "$(($4 / 1024))" - "$1"
    for d in $dims; do
        macs=$((80 * d * d + 400 * d))
        set -- $(measure "$cxx" "$src" -DATTNREF_SEED_MODEL_DIM="$d")
        rate=$(echo "scale=0; $macs / ($3 - $parse_cpu)" | bc 2>/dev/null || echo -)
        [ "$1" = ok ] || rate=-
        printf '%-12s %8s %9s %9s %9s %11s %14s  %s\n' "$cxx" "$d" "$(echo "scale=2; $macs / 1000000" | bc)" "$2" "$3" \
            "$(($4 / 1024))" "$rate" "$1"
    done
done
