#!/usr/bin/env bash
# tests/perf/compare-torch.sh: torch.distributed with the dcomm backend beside
# gloo in the same run, interleaved, fastest of REPS (default 3), at NPROC
# ranks (default 2), plus dcomm-bench's own all_reduce time for the
# overhead of the Python layer. Run from a build tree:
#   NPROC=2 tests/perf/compare-torch.sh [build-dir]
# Knobs: NPROC (2), REPS (3), MAXBYTES (64 MiB), TIMEOUT (900 s per run),
# PYTHON (/usr/bin/python3).
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$PWD}
py=${PYTHON:-/usr/bin/python3}
n=${NPROC:-2}; reps=${REPS:-3}; max=${MAXBYTES:-67108864}
export DCOMM_LIBRARY=$build/.libs/libdcomm.so.0 PYTHONPATH=$src/python
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
limit=${TIMEOUT:-900}
# run OUT CMD...: one run under dcomm-run, at most $limit s. A run that
# printed its last row (ddp_step, or dcomm-bench's largest size) but did
# not exit is kept with a warning: torch 1.13's gloo sometimes hangs in
# one rank's teardown after the benchmark is done.
run() {
  local out=$1
  shift
  timeout "$limit" "$build/dcomm-run" --quiet-prefix --nproc-per-node "$n" -- "$@" >"$out" && return 0
  if grep -q -e "^ddp_step " -e "^$max " "$out"; then
    echo "compare-torch: '$*' printed every row but did not exit cleanly within $limit s: its rows are kept" >&2
    return 0
  fi
  echo "compare-torch: '$*' failed" >&2
  exit 1
}
for r in $(seq "$reps"); do
  run "$tmp/dcomm.$r" "$py" "$src/tests/perf/torch-bench.py" dcomm "$max"
  run "$tmp/gloo.$r" "$py" "$src/tests/perf/torch-bench.py" gloo "$max"
  run "$tmp/bench.$r" "$build/dcomm-bench" -o all_reduce -b 8 -e "$max" -f 4
done
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
