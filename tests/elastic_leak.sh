#!/bin/bash
# elastic_leak.sh: no leak across generations. A 3-worker elastic job
# (dcomm-run --restart-policy replace, tests/leak_worker) is hit KILLS times
# (default 6; LEAK_KILLS=50 for the long measurement): each time a worker
# other than rank 0 is SIGKILLed, the survivors recover and the launcher's
# replacement joins in the same round. Rank 0's process lives through all of it and prints,
# after every change, its open descriptors, threads, mappings and heap
# bytes. After the last change none of the counts may exceed its value
# after the first recovery (which creates what later ones reuse), and the
# heap may not have grown by more than 64 KiB (measured: it settles after
# about 12 generations, ~16 KiB above the first recovery's).
# Exit status: 0 pass, 1 fail, 77 skip.
DCOMM_RUN=${DCOMM_RUN:-./dcomm-run}
W=${top_builddir:-.}/tests/leak_worker
KILLS=${LEAK_KILLS:-6}
[ -x "$DCOMM_RUN" ] && [ -x "$W" ] || { echo "elastic_leak: dcomm-run or $W not built; skipping"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/elastic_leak.XXXXXX") || exit 1
run_pid=
cleanup() { [ -n "$run_pid" ] && kill -KILL "$run_pid" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
. "${top_srcdir:-.}/tests/lib.sh"
export DCOMM_TIMEOUT=30 DCOMM_HEARTBEAT_TIMEOUT=2 DCOMM_ELASTIC_MAX_RECOVERIES=$((KILLS * 2 + 5))

timeout -k 5 $((60 + KILLS * 15)) "$DCOMM_RUN" --nproc-per-node 3 --restart-policy replace \
  --max-restarts $((KILLS + 5)) --quiet-prefix -- "$W" "$T/stop" "$T/ckpt" >"$T/out" 2>"$T/err" </dev/null &
run_pid=$!

lines_of() { grep -c "^res pid=$1 " "$T/out" 2>/dev/null; }
wait_for() { # wait_for SECONDS CONDITION...: polls every 0.1 s
  local end=$((SECONDS + $1)); shift
  until "$@"; do [ $SECONDS -ge $end ] && return 1; sleep 0.1; done
}
have_rank0() { grep -q '^res pid=[0-9]* rank=0 ' "$T/out"; }
wait_for 30 have_rank0
p0=$(sed -n 's/^res pid=\([0-9]*\) rank=0 .*/\1/p' "$T/out" | head -1)
why=
[ -n "$p0" ] || why="rank 0 never reported"
killed=0
for k in $(seq 1 "$KILLS"); do
  [ -z "$why" ] || break
  before=$(lines_of "$p0")
  # A victim: a worker of this job (a child of dcomm-run) that is not rank 0.
  victim=
  for c in $(pgrep -P "$run_pid" 2>/dev/null; pgrep -P "$(pgrep -P "$run_pid" | head -1)" 2>/dev/null); do
    exe=$(tr '\0' '\n' <"/proc/$c/cmdline" 2>/dev/null | head -1)
    [ "$c" != "$p0" ] && [ "${exe##*/}" = leak_worker ] && { victim=$c; break; }
  done
  [ -n "$victim" ] || { why="no worker to kill at round $k"; break; }
  sleep 0.3 # a few steps of the new generation
  kill -KILL "$victim"
  killed=$((killed + 1))
  # The replacement joins in the recovery's own round: one report.
  more() { [ "$(lines_of "$p0")" -ge $((before + 1)) ]; }
  wait_for 40 more || { why="round $k: rank 0 did not report the recovery"; break; }
  wait_for 10 bash -c "[ \$(pgrep -P $run_pid | wc -l) -ge 3 ]" 2>/dev/null
done
touch "$T/stop"
wait "$run_pid"
rc=$?
run_pid=
[ -z "$why" ] && [ "$rc" != 0 ] && why="dcomm-run exited $rc"
grep "^res pid=$p0 " "$T/out" >"$T/res"
field() { sed -n "$1s/.* $2=\([0-9]*\).*/\2/p" "$T/res" | sed "s/^\(.*\)$/\1/"; }
# A sanitizer's allocator maps a region per size class as it first fills
# one and keeps freed blocks in quarantine: mappings and heap are measured
# in the plain build only (LeakSanitizer checks the heap at exit here).
counted="fds threads maps"
sanitized=
if ldd "${DCOMM_LIBRARY:-${top_builddir:-.}/.libs/libdcomm.so.0}" 2>/dev/null | grep -q 'libasan\|libtsan'; then counted="fds threads"; sanitized=1; fi
if [ -z "$why" ]; then
  nl=$(wc -l <"$T/res")
  first=2 # after the first recovery
  for f in $counted; do
    a=$(sed -n "${first}s/.* $f=\([0-9]*\).*/\1/p" "$T/res"); b=$(sed -n "${nl}s/.* $f=\([0-9]*\).*/\1/p" "$T/res")
    [ "$b" -le "$a" ] || why="${why:+$why; }$f: $a after the first recovery, $b after $((nl - 1)) changes"
  done
  a=$(sed -n "${first}s/.* heap=\([0-9]*\).*/\1/p" "$T/res"); b=$(sed -n "${nl}s/.* heap=\([0-9]*\).*/\1/p" "$T/res")
  # 64 KiB of slack: malloc's own bookkeeping moves; a leak of one
  # communicator's worth per generation is larger.
  [ -z "$sanitized" ] && [ "$a" -gt 0 ] && [ $((b - a)) -gt 65536 ] && why="${why:+$why; }heap grew from $a to $b bytes"
fi
sed 's/^/# /' "$T/res"
# On a failure, what rank 0's process said (result shows only the tail).
[ -z "$why" ] || grep -E ":$p0 |pid $p0\b|leak_worker: rank" "$T/err" | tail -n 30 | sed 's/^/# rank 0: /'
if [ -n "$sanitized" ]; then what="no more fds, threads (sanitizer build: maps and heap not compared)"
else what="no more fds, threads, maps; heap flat"; fi
result "$([ -z "$why" ]; echo $?)" "$killed kills, rank 0 through $(($(wc -l <"$T/res") - 1)) changes: $what" "$why"
finish
