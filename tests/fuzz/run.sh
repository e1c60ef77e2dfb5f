#!/usr/bin/env bash
# tests/fuzz/run.sh: runs libFuzzer targets, each for FUZZ_SECONDS seconds
# (default 30), starting from its committed corpus tests/fuzz/corpus/<name>
# (read only: new inputs go to a temp dir, kept with FUZZ_KEEP=DIR), and
# prints a table: executions, exec/s, coverage (edges), features, corpus.
# A crash, leak, timeout or out-of-memory stops that target; its input is
# saved as crash-*/leak-*/timeout-*/oom-* under FUZZ_ARTIFACTS (default
# ./fuzz-artifacts) and the script exits 1 naming it.
#   bash tests/fuzz/run.sh build/tests/fuzz/fuzz_hostlist ...   (make fuzz FUZZ_SECONDS=N calls it)
#   FUZZ_MERGE=1: afterwards merge what each run found into the committed
#   corpus (minimized with -merge=1), for a maintainer's campaign.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
secs=${FUZZ_SECONDS:-30}
arts=$(mkdir -p "${FUZZ_ARTIFACTS:-fuzz-artifacts}" && cd "${FUZZ_ARTIFACTS:-fuzz-artifacts}" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/dcomm-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
[ $# -gt 0 ] || { echo "usage: FUZZ_SECONDS=N $0 path/to/fuzz_<target>..." >&2; exit 2; }
status=0
rows=()
for t in "$@"; do
  case $t in *.o|*.c|*.h) continue ;; esac # a glob of the build folder
  [ -x "$t" ] || { echo "run.sh: $t is not a built fuzz target" >&2; status=1; continue; }
  name=$(basename "$t"); name=${name#fuzz_}
  seeds=$here/corpus/$name
  [ -d "$seeds" ] || { echo "run.sh: no corpus $seeds" >&2; status=1; continue; }
  out=${FUZZ_KEEP:-$work}/$name
  mkdir -p "$out"
  opts=(-max_total_time="$secs" -timeout=25 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$arts/$name-" -dict="$here/dcomm.dict")
  [ "$name" = run_args ] && opts+=(-close_fd_mask=2) # usage text on every refusal
  log=$work/$name.log
  echo "== fuzz_$name: $secs s from $(ls "$seeds" | wc -l) seeds"
  "$t" "${opts[@]}" "$out" "$seeds" >"$log" 2>&1
  rc=$?
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<<"$last")
  if [ $rc -ne 0 ]; then
    status=1
    echo "FAIL: fuzz_$name (exit $rc); its input: $(ls "$arts/$name"-* 2>/dev/null | head -1)"
    grep -E 'ERROR|SUMMARY|==[0-9]+==|fuzz:|Test unit written' "$log" | head -20
    rows+=("$(printf '%-14s %10s %8s %6s %7s %6s  FAIL' "$name" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}")")
  else
    rows+=("$(printf '%-14s %10s %8s %6s %7s %6s  ok' "$name" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}")")
  fi
  if [ "${FUZZ_MERGE:-0}" = 1 ] && [ $rc -eq 0 ]; then
    "$t" -merge=1 -timeout=25 -dict="$here/dcomm.dict" "$seeds" "$out" >"$work/$name.merge" 2>&1 || true
  fi
done
echo
printf '%-14s %10s %8s %6s %7s %6s  %s\n' target execs exec/s cov ft corpus result
printf '%s\n' "${rows[@]}"
exit $status
