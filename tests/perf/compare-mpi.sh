#!/usr/bin/env bash
# tests/perf/compare-mpi.sh: puts dcomm's collectives (tcp backend, through
# dcomm-bench; shared memory between the ranks unless DCOMM_TRANSPORT=tcp)
# next to Open MPI's (through tests/perf/mpi_bench) on this machine. For each op and each rank count it runs
#   mpirun --allow-run-as-root --oversubscribe -np N tests/perf/mpi_bench ...
#   ./dcomm-run --nproc-per-node N -- ./dcomm-bench ...
# on the same sizes and prints, per size, a side-by-side table: dcomm and
# MPI time per iteration, the time ratio dcomm/mpi, both bus bandwidths and
# the busbw ratio dcomm/mpi. It also measures memcpy bandwidth (64 MiB
# copies, a tiny C helper compiled on the fly) as the physical reference.
# It is a benchmark: it prints figures and asserts nothing about speed.
# Exit 0 when every run worked (exit 0, one row per size, no wrong
# elements), 1 otherwise.
#
#   tests/perf/compare-mpi.sh                      (from anywhere)
# Knobs (environment):
#   OPS      ops to run (default: all_reduce all_gather broadcast reduce_scatter all_to_all)
#   NPS      rank counts (default: 2 4)
#   MINSIZE  smallest size (default 8)
#   MAXSIZE  largest size for every op (default: 64M for all_reduce, 4M for the others)
#   FACTOR   size step (default 4)    DTYPE (float32)   ITERS (20)   WARMUP (5)
#   REPS     runs of each side, interleaved; per size the fastest is shown
#            (default 1; 3 is steadier on a busy machine)
#   TIMEOUT  seconds allowed for each run (default 300)
#   MPIFLAGS extra mpirun options, e.g. "--mca btl self,tcp" to make Open MPI
#            use TCP loopback like dcomm instead of shared memory (default none)
#   OUTDIR   keep the raw outputs there (default: a temporary folder, removed)
set -u
cd "$(dirname "$0")/../.." || exit 1
OPS=${OPS:-all_reduce all_gather broadcast reduce_scatter all_to_all}
NPS=${NPS:-2 4}
MINSIZE=${MINSIZE:-8}
FACTOR=${FACTOR:-4}
DTYPE=${DTYPE:-float32}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
TIMEOUT=${TIMEOUT:-300}
REPS=${REPS:-1}
MPIFLAGS=${MPIFLAGS:-}

if [ -n "${OUTDIR:-}" ]; then
  mkdir -p "$OUTDIR" || exit 1
  work=$OUTDIR
else
  work=$(mktemp -d /tmp/dcomm-compare.XXXXXX) || exit 1
  trap 'rm -rf "$work"' EXIT
fi
bad=0

# ---- build ----
if [ ! -x ./dcomm-run ] || [ ! -e .libs/libdcomm.so ]; then
  echo "compare-mpi: build dcomm first (./dcomm-run, .libs/libdcomm.so)"
  exit 1
fi
if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
  echo "compare-mpi: mpicc and mpirun are needed (Open MPI)"
  exit 1
fi
if [ ! -x ./dcomm-bench ] || [ tools/dcomm_bench.c -nt ./dcomm-bench ] || [ tools/bench_util.c -nt ./dcomm-bench ]; then
  echo "build: gcc -std=gnu11 -O2 -I. -Iinclude -Itools tools/dcomm_bench.c tools/bench_util.c tools/bench_cuda.c -L.libs -ldcomm -Wl,-rpath,\$PWD/.libs -lm -ldl -o dcomm-bench"
  gcc -std=gnu11 -O2 -I. -Iinclude -Itools tools/dcomm_bench.c tools/bench_util.c tools/bench_cuda.c -L.libs -ldcomm "-Wl,-rpath,$PWD/.libs" -lm -ldl -o dcomm-bench ||
    { echo "compare-mpi: cannot build dcomm-bench"; exit 1; }
fi
echo "build: mpicc -std=gnu11 -O2 -Itools tests/perf/mpi_bench.c tools/bench_util.c -lm -o tests/perf/mpi_bench"
mpicc -std=gnu11 -O2 -Itools tests/perf/mpi_bench.c tools/bench_util.c -lm -o tests/perf/mpi_bench || { echo "compare-mpi: cannot build mpi_bench"; exit 1; }

echo
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'); $(uname -sr)"
echo "mpi:     $(mpirun --version 2>&1 | head -n 1)${MPIFLAGS:+, mpirun $MPIFLAGS}"
echo "dcomm:   $(./dcomm-info 2>/dev/null | head -n 1), backend ${DCOMM_BACKEND:-tcp}, DCOMM_TRANSPORT=${DCOMM_TRANSPORT:-auto}${DCOMM_ALGO:+, DCOMM_ALGO=$DCOMM_ALGO}"

# ---- memcpy bandwidth: the physical reference ----
cat >"$work/memcpy_bw.c" <<'EOF'
/* memcpy_bw.c: best-of-10 bandwidth of one 64 MiB memcpy (compare-mpi.sh). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(void) {
  size_t n = (size_t)64 << 20;
  char *a = malloc(n), *b = malloc(n);
  if (!a || !b) return 1;
  memset(a, 1, n);
  memset(b, 2, n);
  double best = 1e30;
  for (int i = 0; i < 10; i++) {
    double t = now();
    memcpy(b, a, n);
    t = now() - t;
    if (t < best) best = t;
    a[i] = b[n - 1 - (size_t)i]; /* keep the copies observable */
  }
  printf("%.2f %.1f\n", (double)n / best / 1e9, best * 1e6);
  return b[7] == 3;
}
EOF
if cc -O2 "$work/memcpy_bw.c" -o "$work/memcpy_bw" && read -r mbw mus < <("$work/memcpy_bw"); then
  echo "memcpy:  ${mbw} GB/s (64 MiB copied in ${mus} us, best of 10; bytes copied per second, so memory moves twice that)"
else
  echo "memcpy:  no result"
  bad=1
fi

# best FILE...: per row index, the data row (size time busbw errors) with the
# smallest time over the given bench outputs; errors: any nonzero count
# seen. Fails when the outputs do not have the same rows.
best() {
  awk '!/^#/ && NF == 7 {
      i = ++n[FILENAME]
      if (i in s && s[i] != $1) bad = 1
      if (!(i in t) || $4 + 0 < t[i]) { s[i] = $1; t[i] = $4 + 0; b[i] = $6 }
      if (!(i in e) || $7 != "0") e[i] = $7
      if (i > rows) rows = i
    }
    END {
      for (f in n) if (n[f] != rows) bad = 1
      for (i = 1; i <= rows; i++) print s[i], t[i], b[i], e[i]
      exit bad
    }' "$@"
}

# check_run SIDE RC FILE: reports a run that failed.
check_run() {
  if [ "$2" -ne 0 ]; then
    echo "  $1 run failed (exit $2$([ "$2" -ge 124 ] && echo ', timed out'))"
    tail -n 8 "$3.err" | sed 's/^/    /'
    bad=1
  fi
}

for op in $OPS; do
  if [ -n "${MAXSIZE:-}" ]; then max=$MAXSIZE
  elif [ "$op" = all_reduce ]; then max=64M
  else max=4M; fi
  for np in $NPS; do
    args="-o $op -b $MINSIZE -e $max -f $FACTOR -d $DTYPE -n $ITERS -w $WARMUP"
    m=$work/mpi-$op-$np
    d=$work/dcomm-$op-$np
    echo
    echo "== $op, $np ranks, $DTYPE$([ "$REPS" -gt 1 ] && echo ", fastest of $REPS runs per size") =="
    echo "mpi:   timeout $TIMEOUT mpirun --allow-run-as-root --oversubscribe ${MPIFLAGS:+$MPIFLAGS }-np $np tests/perf/mpi_bench $args"
    echo "dcomm: timeout $TIMEOUT ./dcomm-run --quiet-prefix --nproc-per-node $np -- ./dcomm-bench $args"
    mfiles=() dfiles=()
    for rep in $(seq 1 "$REPS"); do
      # shellcheck disable=SC2086
      timeout "$TIMEOUT" mpirun --allow-run-as-root --oversubscribe $MPIFLAGS -np "$np" tests/perf/mpi_bench $args \
        >"$m.$rep.txt" 2>"$m.$rep.txt.err"
      check_run mpi $? "$m.$rep.txt"
      # shellcheck disable=SC2086
      timeout "$TIMEOUT" ./dcomm-run --quiet-prefix --nproc-per-node "$np" -- ./dcomm-bench $args \
        >"$d.$rep.txt" 2>"$d.$rep.txt.err"
      check_run dcomm $? "$d.$rep.txt"
      mfiles+=("$m.$rep.txt")
      dfiles+=("$d.$rep.txt")
    done
    best "${mfiles[@]}" >"$m.rows" || { echo "  mpi runs disagree on the sizes"; bad=1; }
    best "${dfiles[@]}" >"$d.rows" || { echo "  dcomm runs disagree on the sizes"; bad=1; }
    if [ ! -s "$m.rows" ] || [ ! -s "$d.rows" ] || [ "$(wc -l <"$m.rows")" -ne "$(wc -l <"$d.rows")" ]; then
      echo "  no comparable rows (mpi $(wc -l <"$m.rows"), dcomm $(wc -l <"$d.rows"))"
      bad=1
      continue
    fi
    awk '{ if ($4 != "0" && $4 != "N/A") e = 1 } END { exit e }' "$m.rows" "$d.rows" || { echo "  wrong elements reported"; bad=1; }
    # busbw ratio = mpi time / dcomm time (same size and factor), exact even
    # where the printed busbw rounds to 0.0000.
    paste -d' ' "$d.rows" "$m.rows" | awk '
      BEGIN { printf "%12s %12s %12s %8s %12s %12s %8s\n", "size", "dcomm_us", "mpi_us", "t_ratio", "dcomm_busbw", "mpi_busbw", "bw_ratio" }
      $1 != $5 { printf "size mismatch: %s vs %s\n", $1, $5; bad = 1; next }
      { printf "%12s %12.2f %12.2f %8.2f %12.4f %12.4f %8.2f\n", $1, $2, $6, $2 / $6, $3, $7, $6 / $2 }
      END { exit bad }' || bad=1
  done
done

echo
[ -n "${OUTDIR:-}" ] && echo "raw outputs: $OUTDIR"
if [ "$bad" -eq 0 ]; then echo "compare-mpi: every run worked"; else echo "compare-mpi: some runs failed"; fi
exit "$bad"
