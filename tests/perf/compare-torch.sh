#!/usr/bin/env bash
# tests/perf/compare-torch.sh: torch.distributed with the dcomm backend beside
# gloo in the same run, interleaved, fastest of REPS (default 3), at NPROC
# ranks (default 2), plus dcomm-bench's own all_reduce time for the
# overhead of the Python layer. Run from a build tree:
#   NPROC=2 tests/perf/compare-torch.sh [build-dir]
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$PWD}
py=${PYTHON:-/usr/bin/python3}
n=${NPROC:-2}; reps=${REPS:-3}; max=${MAXBYTES:-67108864}
export DCOMM_LIBRARY=$build/.libs/libdcomm.so.0 PYTHONPATH=$src/python
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
run() { "$build/dcomm-run" --quiet-prefix --nproc-per-node "$n" -- "$@"; }
for r in $(seq "$reps"); do
  run "$py" "$src/tests/perf/torch-bench.py" dcomm "$max" >"$tmp/dcomm.$r"
  run "$py" "$src/tests/perf/torch-bench.py" gloo "$max" >"$tmp/gloo.$r"
  run "$build/dcomm-bench" -o all_reduce -b 8 -e "$max" -f 4 >"$tmp/bench.$r"
done
best() { # file-glob key column -> min per key
  cat $1 | awk -v k="$2" -v c="$3" '$1 == k || k == "" {print}' ; }
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $n ranks, fastest of $reps"
echo "# bytes  torch+dcomm_us  torch+gloo_us  dcomm-bench_us  dcomm/gloo  torch+dcomm/dcomm-bench"
for size in $(awk '$1 == "allreduce" {print $2}' "$tmp/dcomm.1"); do
  d=$(cat "$tmp"/dcomm.* | awk -v s="$size" '$1 == "allreduce" && $2 == s {print $3}' | sort -g | head -1)
  g=$(cat "$tmp"/gloo.* | awk -v s="$size" '$1 == "allreduce" && $2 == s {print $3}' | sort -g | head -1)
  b=$(cat "$tmp"/bench.* | awk -v s="$size" '$1 == s {print $4}' | sort -g | head -1)
  awk -v s="$size" -v d="$d" -v g="$g" -v b="$b" 'BEGIN {printf "%9d %14.2f %14.2f %15s %11.2f %24s\n", s, d, g, b, d / g, (b > 0 ? sprintf("%.2f", d / b) : "-")}'
done
d=$(cat "$tmp"/dcomm.* | awk '$1 == "ddp_step" {print $2}' | sort -g | head -1)
g=$(cat "$tmp"/gloo.* | awk '$1 == "ddp_step" {print $2}' | sort -g | head -1)
awk -v d="$d" -v g="$g" 'BEGIN {printf "ddp_step_us dcomm %.1f gloo %.1f ratio %.2f\n", d, g, d / g}'
