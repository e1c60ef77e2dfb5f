#!/usr/bin/env bash
# tests/perf/scale-bench.sh: how dcomm's cost grows with the world, on one
# host (run from a build tree: ./dcomm-run and .libs/libdcomm.so). It
# builds tests/perf/scale_probe.c into a private temp dir and runs it under
# dcomm-run for each world size, printing one row per run: dcomm_init of
# the slowest rank, the first barrier (which waits for the last rank to
# start), an 8-byte and a 1 MiB all_reduce, new_group of the even ranks +
# its barrier, the largest descriptor count and RSS of a rank, the host's
# shared memory in use (/dev/shm and memfd, from `free`'s "shared" column)
# and the whole job's wall time. A benchmark: it prints and asserts nothing.
#
#   tests/perf/scale-bench.sh                       tcp: 64 128 256 512
#   SIZES="16 32 64" TRANSPORT=auto tests/perf/scale-bench.sh
# Knobs: SIZES, TRANSPORT (tcp | auto | shm), REPS (1; the fastest is kept).
set -u
src=$(cd "$(dirname "$0")/../.." && pwd)
[ -x ./dcomm-run ] && [ -e .libs/libdcomm.so ] || { echo "scale-bench: run it from a build tree (./dcomm-run, .libs/libdcomm.so)"; exit 1; }
SIZES=${SIZES:-64 128 256 512}
TRANSPORT=${TRANSPORT:-tcp}
REPS=${REPS:-1}
work=$(mktemp -d /tmp/dcomm-scale-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
probe=$work/scale_probe
cc -O2 -I "$src/include" "$src/tests/perf/scale_probe.c" -L .libs -ldcomm "-Wl,-rpath,$PWD/.libs" -o "$probe" ||
  { echo "scale-bench: cannot build the probe"; exit 1; }
echo "# cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) processors; DCOMM_TRANSPORT=$TRANSPORT; ulimit -n $(ulimit -n)"
printf '# %6s %8s %8s %9s %9s %8s %6s %9s %10s %8s\n' ranks init_s first_s ar8_ms ar1m_ms group_s fds rss_MiB shm_MiB wall_s
for n in $SIZES; do
  best=""
  for _ in $(seq 1 "$REPS"); do
    shm0=$(free -m | awk '/^Mem:/ {print $5}')
    t0=$(date +%s.%N)
    DCOMM_TRANSPORT=$TRANSPORT timeout 900 ./dcomm-run --quiet-prefix --nproc-per-node "$n" -- "$probe" >"$work/out" 2>"$work/err" &
    pid=$!
    peak=0
    while kill -0 $pid 2>/dev/null; do
      s=$(free -m | awk '/^Mem:/ {print $5}')
      [ "$s" -gt "$peak" ] && peak=$s
      sleep 0.2
    done
    wait $pid
    rc=$?
    t1=$(date +%s.%N)
    line=$(grep '^scale ' "$work/out")
    if [ $rc -ne 0 ] || [ -z "$line" ]; then
      keep=/tmp/dcomm-scale-bench-$n-failed.err
      cp "$work/err" "$keep"
      echo "  $n: failed (exit $rc): $(tail -n 2 "$work/err" | tr '\n' ' ') (all of its stderr: $keep)"
      continue
    fi
    wall=$(echo "$t1 - $t0" | bc)
    row=$(echo "$line" | awk -v wall="$wall" -v shm=$((peak - shm0)) '{
      for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
      printf "  %6d %8.3f %8.3f %9.2f %9.2f %8.3f %6d %9.1f %10d %8.2f",
        v["ranks"], v["init"], v["first"], v["ar8"] * 1000, v["ar1m"] * 1000, v["group"], v["fds"],
        v["rss_kib"] / 1024, shm, wall }')
    if [ -z "$best" ] || awk -v a="$wall" -v b="$(echo "$best" | awk '{print $NF}')" 'BEGIN{exit !(a < b)}'; then best=$row; fi
  done
  [ -n "$best" ] && echo "$best"
done
