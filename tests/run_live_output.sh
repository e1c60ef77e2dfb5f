#!/bin/bash
# run_live_output.sh: worker output under dcomm-run is live. A C worker
# (tests/live_worker) prints a line with printf (no fflush) after
# dcomm_init, then sleeps 4 s: the line must reach dcomm-run's output while
# the worker still sleeps (dcomm-run sets DCOMM_LINE_BUFFERED=1, and
# dcomm_init makes stdout line-buffered), not at its exit.
# Environment: DCOMM_RUN (default ./dcomm-run), top_builddir (default .).
# Exit status: 0 pass, 1 fail, 77 skip (no dcomm-run or worker).

DCOMM_RUN=${DCOMM_RUN:-./dcomm-run}
W=${top_builddir:-.}/tests/live_worker
if [ ! -x "$DCOMM_RUN" ] || [ ! -x "$W" ] || ! command -v timeout >/dev/null 2>&1; then
  echo "run_live_output: $DCOMM_RUN, $W or timeout(1) missing; skipping"
  exit 77
fi

T=$(mktemp -d "${TMPDIR:-/tmp}/run_live_output.XXXXXX") || exit 1
bg_pid=
cleanup() {
  [ -n "$bg_pid" ] && kill -KILL "$bg_pid" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
. "${top_srcdir:-.}/tests/lib.sh"

timeout -k 5 60 "$DCOMM_RUN" --nproc-per-node 2 -- "$W" 4 >"$T/out" 2>"$T/err" </dev/null &
bg_pid=$!
SECONDS=0
seen=
while [ "$SECONDS" -lt 30 ] && kill -0 "$bg_pid" 2>/dev/null; do
  if [ "$(grep -c '^\[[01]\]: live line from rank [01]$' "$T/out")" = 2 ]; then
    seen=1
    break
  fi
  sleep 0.1
done
# The workers sleep 4 s after their line: it is live if it came while
# dcomm-run (and so the workers) still ran, before any "done" line.
alive=0
kill -0 "$bg_pid" 2>/dev/null && ! grep -q 'done$' "$T/out" && alive=1
wait "$bg_pid"
rc=$?
bg_pid=
why=
[ -n "$seen" ] || why="the lines never came while the job ran"
[ "$alive" = 1 ] || why="${why:+$why; }the lines came only when the workers exited"
[ "$rc" = 0 ] || why="${why:+$why; }dcomm-run exited $rc"
grep -q '^\[0\]: rank 0 done$' "$T/out" || why="${why:+$why; }no 'done' line from rank 0"
result "$([ -z "$why" ]; echo $?)" "printf lines of C workers reach dcomm-run's output live (before the worker exits)" "$why"
finish
