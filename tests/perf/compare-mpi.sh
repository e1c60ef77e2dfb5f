#!/usr/bin/env bash
# tests/perf/compare-mpi.sh: puts dcomm's collectives (tcp backend, through
# dcomm-bench; shared memory between the ranks unless DCOMM_TRANSPORT=tcp)
# next to Open MPI's (through tests/perf/mpi_bench) and torch.distributed's
# gloo backend (through tests/perf/gloo-bench.py) on this machine. For each
# op and each rank count it runs
#   mpirun --allow-run-as-root --oversubscribe -np N tests/perf/mpi_bench ...
#   $BUILD/dcomm-run --nproc-per-node N -- $BUILD/dcomm-bench ...
#   $BUILD/dcomm-run --nproc-per-node N -- $PYTHON tests/perf/gloo-bench.py ...
# on the same sizes (same flags, same measurement, same rows) and prints,
# per size, a side-by-side table: dcomm and MPI time per iteration, the
# time ratio dcomm/mpi, both bus bandwidths, the busbw ratio dcomm/mpi, the
# gloo time and the time ratio dcomm/gloo. It also measures memcpy
# bandwidth (64 MiB copies, a tiny C helper compiled on the fly) as the
# physical reference.
# The gloo side runs for all_reduce, all_gather, broadcast and all_to_all
# when $PYTHON can import torch and DTYPE is not uint32, uint64 or
# bfloat16; gloo has no reduce_scatter on CPU (torch 1.13), so its gloo
# columns are "-", and so are all of them, with one line saying why, when
# torch cannot be imported or lacks the dtype.
# It is a benchmark, run by hand and before a release, not in CI (it takes
# minutes and its figures depend on the machine and its load). Without
# --check it prints figures and asserts nothing about speed. Exit 0 when
# every run worked (exit 0, one row per size, no wrong elements), 1
# otherwise.
#
#   [BUILD=build-dir] tests/perf/compare-mpi.sh [--check]   (from anywhere; BUILD defaults to the source tree)
# --check: also a speed check against Open MPI. REPS defaults to 3, and for
#   every op, rank count and size where dcomm's fastest time is more than
#   CHECK_RATIO (1.5) times Open MPI's fastest it prints
#     slower: OP N ranks SIZE: dcomm X us, Open MPI Y us (Zx)
#   and exits 3 (1 still wins when a run failed); when none is, it prints
#   "check: every size within 1.5x of Open MPI". gloo is not checked.
# Knobs (environment):
#   OPS      ops to run (default: all_reduce all_gather broadcast reduce_scatter all_to_all)
#   NPS      rank counts (default: 2 4)
#   MINSIZE  smallest size (default 8)
#   MAXSIZE  largest size for every op (default: 64M for all_reduce, 4M for the others)
#   FACTOR   size step (default 4)    DTYPE (float32)   ITERS (20)   WARMUP (16)
#   REPS     runs of each side, interleaved (mpi, dcomm, gloo, then again);
#            per size the fastest is shown (default 1, 3 with --check; 3 is
#            steadier on a busy machine)
#   TIMEOUT  seconds allowed for each run (default 300)
#   MPIFLAGS extra mpirun options, e.g. "--mca btl self,tcp" to make Open MPI
#            use TCP loopback like dcomm instead of shared memory (default none)
#   PYTHON   the Python with torch for the gloo side (default /usr/bin/python3)
#   CHECK_RATIO  the --check limit on dcomm time / Open MPI time (default 1.5)
#   OUTDIR   keep the raw outputs there (default: a temporary folder, removed)
set -u
check=0
for a in "$@"; do
  case $a in
    --check) check=1 ;;
    -h | --help) sed -n '2,/^set -u/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    *) echo "compare-mpi: unknown argument '$a' (usage: compare-mpi.sh [--check])" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/../.." || exit 1
OPS=${OPS:-all_reduce all_gather broadcast reduce_scatter all_to_all}
NPS=${NPS:-2 4}
MINSIZE=${MINSIZE:-8}
FACTOR=${FACTOR:-4}
DTYPE=${DTYPE:-float32}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-16}
TIMEOUT=${TIMEOUT:-300}
if [ "$check" -eq 1 ]; then REPS=${REPS:-3}; else REPS=${REPS:-1}; fi
MPIFLAGS=${MPIFLAGS:-}
PYTHON=${PYTHON:-/usr/bin/python3}
CHECK_RATIO=${CHECK_RATIO:-1.5}
GLOO_OPS="all_reduce all_gather broadcast all_to_all"

if [ -n "${OUTDIR:-}" ]; then
  mkdir -p "$OUTDIR" || exit 1
  work=$OUTDIR
else
  work=$(mktemp -d /tmp/dcomm-compare.XXXXXX) || exit 1
  trap 'rm -rf "$work"' EXIT
fi
rm -f "$work/slower"
bad=0

# ---- build ----
# BUILD: the build tree (default: the source tree, for an in-tree build).
B=${BUILD:-.}
if [ ! -x "$B/dcomm-run" ] || [ ! -x "$B/dcomm-bench" ] || [ ! -e "$B/.libs/libdcomm.so" ]; then
  echo "compare-mpi: build dcomm first (make; $B/dcomm-run, $B/dcomm-bench, $B/.libs/libdcomm.so), or set BUILD"
  exit 1
fi
if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
  echo "compare-mpi: mpicc and mpirun are needed (Open MPI)"
  exit 1
fi
echo "build: mpicc -std=gnu11 -O2 -Iinclude -Itools tests/perf/mpi_bench.c tools/bench_util.c -lm -o tests/perf/mpi_bench"
mpicc -std=gnu11 -O2 -Iinclude -Itools tests/perf/mpi_bench.c tools/bench_util.c -lm -o tests/perf/mpi_bench || { echo "compare-mpi: cannot build mpi_bench"; exit 1; }

echo
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'); $(uname -sr)"
echo "mpi:     $(mpirun --version 2>&1 | head -n 1)${MPIFLAGS:+, mpirun $MPIFLAGS}"
echo "dcomm:   $("$B/dcomm-info" 2>/dev/null | head -n 1), backend ${DCOMM_BACKEND:-tcp}, DCOMM_TRANSPORT=${DCOMM_TRANSPORT:-auto}${DCOMM_ALGO:+, DCOMM_ALGO=$DCOMM_ALGO}"
# The gloo side: torch.distributed on $PYTHON, when it can import torch
# (and gloo-bench.py has the dtype: not uint32, uint64, bfloat16).
if case $DTYPE in uint32 | uint64 | bfloat16 | bf16) true ;; *) false ;; esac; then
  gloo=0
  echo "gloo:    - (not run: gloo-bench.py has no $DTYPE: torch 1.13 has no uint32/uint64, its gloo no bfloat16 sum)"
elif why=$("$PYTHON" -c 'import torch, torch.distributed as d; assert d.is_available(), "no torch.distributed"; print(torch.__version__)' 2>&1); then
  gloo=1
  echo "gloo:    torch $why (gloo backend), $PYTHON"
else
  gloo=0
  echo "gloo:    - (not run: $PYTHON cannot import torch: $(printf '%s\n' "$why" | tail -n 1))"
fi

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
    g=$work/gloo-$op-$np
    rungloo=0
    [ "$gloo" -eq 1 ] && case " $GLOO_OPS " in *" $op "*) rungloo=1 ;; esac
    echo
    echo "== $op, $np ranks, $DTYPE$([ "$REPS" -gt 1 ] && echo ", fastest of $REPS runs per size") =="
    echo "mpi:   timeout $TIMEOUT mpirun --allow-run-as-root --oversubscribe ${MPIFLAGS:+$MPIFLAGS }-np $np tests/perf/mpi_bench $args"
    echo "dcomm: timeout $TIMEOUT $B/dcomm-run --quiet-prefix --nproc-per-node $np -- $B/dcomm-bench $args"
    if [ "$rungloo" -eq 1 ]; then
      echo "gloo:  timeout $TIMEOUT $B/dcomm-run --quiet-prefix --nproc-per-node $np -- $PYTHON tests/perf/gloo-bench.py $args"
    elif [ "$gloo" -eq 1 ]; then
      echo "gloo:  - (gloo has no $op on CPU)"
    fi
    mfiles=() dfiles=() gfiles=()
    for rep in $(seq 1 "$REPS"); do
      # shellcheck disable=SC2086
      timeout "$TIMEOUT" mpirun --allow-run-as-root --oversubscribe $MPIFLAGS -np "$np" tests/perf/mpi_bench $args \
        >"$m.$rep.txt" 2>"$m.$rep.txt.err"
      check_run mpi $? "$m.$rep.txt"
      # shellcheck disable=SC2086
      timeout "$TIMEOUT" "$B/dcomm-run" --quiet-prefix --nproc-per-node "$np" -- "$B/dcomm-bench" $args \
        >"$d.$rep.txt" 2>"$d.$rep.txt.err"
      check_run dcomm $? "$d.$rep.txt"
      mfiles+=("$m.$rep.txt")
      dfiles+=("$d.$rep.txt")
      if [ "$rungloo" -eq 1 ]; then
        # shellcheck disable=SC2086
        timeout "$TIMEOUT" "$B/dcomm-run" --quiet-prefix --nproc-per-node "$np" -- "$PYTHON" tests/perf/gloo-bench.py $args \
          >"$g.$rep.txt" 2>"$g.$rep.txt.err"
        check_run gloo $? "$g.$rep.txt"
        gfiles+=("$g.$rep.txt")
      fi
    done
    best "${mfiles[@]}" >"$m.rows" || { echo "  mpi runs disagree on the sizes"; bad=1; }
    best "${dfiles[@]}" >"$d.rows" || { echo "  dcomm runs disagree on the sizes"; bad=1; }
    : >"$g.rows"
    if [ "$rungloo" -eq 1 ]; then
      best "${gfiles[@]}" >"$g.rows" || { echo "  gloo runs disagree on the sizes"; bad=1; }
      if [ "$(wc -l <"$g.rows")" -ne "$(wc -l <"$d.rows")" ]; then
        echo "  gloo: $(wc -l <"$g.rows") rows for dcomm's $(wc -l <"$d.rows")"
        bad=1
      fi
    fi
    if [ ! -s "$m.rows" ] || [ ! -s "$d.rows" ] || [ "$(wc -l <"$m.rows")" -ne "$(wc -l <"$d.rows")" ]; then
      echo "  no comparable rows (mpi $(wc -l <"$m.rows"), dcomm $(wc -l <"$d.rows"))"
      bad=1
      continue
    fi
    awk '{ if ($4 != "0" && $4 != "N/A") e = 1 } END { exit e }' "$m.rows" "$d.rows" "$g.rows" || { echo "  wrong elements reported"; bad=1; }
    # busbw ratio = mpi time / dcomm time (same size and factor), exact even
    # where the printed busbw rounds to 0.0000. gloo's time is matched by
    # size ("-" where gloo has no row). With --check, a size where dcomm
    # takes more than CHECK_RATIO times Open MPI's time goes to $work/slower.
    paste -d' ' "$d.rows" "$m.rows" | awk -v gf="$g.rows" -v op="$op" -v np="$np" -v lim="$CHECK_RATIO" \
      -v chk="$check" -v sf="$work/slower" '
      BEGIN {
        while ((getline l < gf) > 0) { split(l, a, " "); gt[a[1]] = a[2] + 0 }
        printf "%12s %12s %12s %8s %12s %12s %8s %12s %10s\n", "size", "dcomm_us", "mpi_us", "t_ratio", "dcomm_busbw", "mpi_busbw", "bw_ratio", "gloo_us", "dcomm/gloo"
      }
      $1 != $5 { printf "size mismatch: %s vs %s\n", $1, $5; bad = 1; next }
      {
        gl = ($1 in gt && gt[$1] > 0) ? sprintf("%12.2f %10.3f", gt[$1], $2 / gt[$1]) : sprintf("%12s %10s", "-", "-")
        printf "%12s %12.2f %12.2f %8.2f %12.4f %12.4f %8.2f %s\n", $1, $2, $6, $2 / $6, $3, $7, $6 / $2, gl
        if (chk && $2 > lim * $6)
          printf "slower: %s %s ranks %s: dcomm %.2f us, Open MPI %.2f us (%.2fx)\n", op, np, $1, $2, $6, $2 / $6 >> sf
      }
      END { exit bad }' || bad=1
  done
done

echo
[ -n "${OUTDIR:-}" ] && echo "raw outputs: $OUTDIR"
status=$bad
if [ "$check" -eq 1 ]; then
  if [ -s "$work/slower" ]; then
    cat "$work/slower"
    [ "$status" -eq 0 ] && status=3
  elif [ "$bad" -eq 0 ]; then
    echo "check: every size within ${CHECK_RATIO}x of Open MPI"
  else
    echo "check: no size slower than ${CHECK_RATIO}x Open MPI among those compared (some runs failed)"
  fi
fi
if [ "$bad" -eq 0 ]; then echo "compare-mpi: every run worked"; else echo "compare-mpi: some runs failed"; fi
exit "$status"
