#!/usr/bin/env bash
# tests/perf/recovery-bench.sh: the recovery-time benchmark of dcomm's
# elastic layer (4 ranks under dcomm-run, one host). It builds
# tests/perf/recovery_probe.c, then measures, over REPS runs per case:
#   detection latency = max over survivors of (t_detect - kill.time)
#   recovery latency  = max over survivors of (t_first_ok - kill.time)
# for a SIGKILLed rank 2, a SIGKILLed rank 0, and a SIGSTOPped (hung) rank
# 1 that the launcher's heartbeat check kills, and prints min / median /
# max in milliseconds, plus the failure-free time of the same all_reduce.
# It is a benchmark: it prints figures and asserts nothing about speed.
# Exit 0 if every run produced results, 1 otherwise.
#
#   REPS=5 tests/perf/recovery-bench.sh     (from an in-tree build, or from a build tree
#   as ../tests/perf/recovery-bench.sh)
# Knobs: REPS (5), BYTES (4194304: 4 MiB of float32), KILL_AT (10), ITERS (30),
# NPROC (4; e.g. NPROC=256 DCOMM_TRANSPORT=tcp for recovery at scale),
# CASES (kill2 kill0 stop1: which of the three to run).
set -u
src=$(cd "$(dirname "$0")/../.." && pwd)
[ -x ./dcomm-run ] || cd "$src" || exit 1 # a build tree (the current directory) or an in-tree build
REPS=${REPS:-5}
BYTES=${BYTES:-4194304}
KILL_AT=${KILL_AT:-10}
ITERS=${ITERS:-30}
NPROC=${NPROC:-4}
LIMIT=$((60 + NPROC / 2)) # seconds a run may take
work=$(mktemp -d /tmp/dcomm-recovery.XXXXXX)
trap 'rm -rf "$work"' EXIT
probe=$work/recovery_probe

[ -x ./dcomm-run ] && [ -e .libs/libdcomm.so ] || { echo "recovery-bench: build dcomm first (./dcomm-run, .libs/libdcomm.so)"; exit 1; }
build="cc -O2 -I $src/include $src/tests/perf/recovery_probe.c -L .libs -ldcomm -Wl,-rpath,$PWD/.libs -o $probe"  # printed as run
echo "build: $build"
cc -O2 -I "$src/include" "$src/tests/perf/recovery_probe.c" -L .libs -ldcomm "-Wl,-rpath,$PWD/.libs" -o "$probe" || { echo "recovery-bench: cannot build the probe"; exit 1; }

bad=0

# min / median / max (ms) of the seconds on stdin, one a line.
stats() {
  sort -g | awk '{v[NR] = $1 * 1000} END {
    if (NR == 0) { printf "%10s %10s %10s", "-", "-", "-"; exit }
    m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "%10.1f %10.1f %10.1f", v[1], m, v[NR] }'
}

echo
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'); $(uname -sr)"
echo "buffer: $BYTES bytes of float32 (SUM all_reduce), $NPROC ranks, tcp backend (DCOMM_TRANSPORT=${DCOMM_TRANSPORT:-auto})"

# ---- failure-free reference: the same all_reduce, no failure ----
ref=$work/ref
mkdir -p "$ref"
cmd="timeout $LIMIT ./dcomm-run --nproc-per-node $NPROC -- $probe --mode none --iters $ITERS --warmup 5 --bytes $BYTES --out DIR"
echo
echo "== failure-free all_reduce (iteration time) =="
echo "command: $cmd"
iter_med=""
if timeout $LIMIT ./dcomm-run --nproc-per-node $NPROC -- $probe --mode none --iters "$ITERS" --warmup 5 --bytes "$BYTES" \
  --out "$ref" >"$work/ref.log" 2>&1 && [ -s "$ref/iter.time" ]; then
  read -r iter_med iter_mean iter_min iter_max iter_n _ <"$ref/iter.time"
  awk -v a="$iter_med" -v b="$iter_mean" -v c="$iter_min" -v d="$iter_max" -v n="$iter_n" 'BEGIN {
    printf "iteration time over %d all_reduces (ms): median %.2f, mean %.2f, min %.2f, max %.2f\n", n, a*1e3, b*1e3, c*1e3, d*1e3 }'
else
  echo "no result"
  tail -n 20 "$work/ref.log" | sed 's/^/    /'
  bad=1
fi

# case NAME MODE VICTIM [VAR=VALUE...]
run_case() {
  local name=$1 mode=$2 victim=$3
  shift 3
  local envs=("$@")
  local pre=""
  [ ${#envs[@]} -gt 0 ] && pre="${envs[*]} "
  echo
  echo "== $name ($REPS runs) =="
  echo "command: ${pre}timeout $LIMIT ./dcomm-run --nproc-per-node $NPROC -- $probe --mode $mode --victim $victim --kill-at $KILL_AT --iters $ITERS --bytes $BYTES --out DIR"
  : >"$work/det" && : >"$work/rec" && : >"$work/only" && : >"$work/errs"
  local ok=0
  for r in $(seq 1 "$REPS"); do
    local d=$work/$mode-$victim-$r
    mkdir -p "$d"
    env "${envs[@]}" timeout $LIMIT ./dcomm-run --nproc-per-node $NPROC -- $probe --mode "$mode" --victim "$victim" \
      --kill-at "$KILL_AT" --iters "$ITERS" --bytes "$BYTES" --out "$d" >"$d.log" 2>&1
    local rc=$?
    local nsurv
    nsurv=$(find "$d" -maxdepth 1 -name 'rank.*' ! -name '*.tmp' | wc -l)
    if [ ! -s "$d/kill.time" ] || [ "$nsurv" -ne $((NPROC - 1)) ]; then
      echo "run $r: no result (dcomm-run exit $rc, kill.time $([ -s "$d/kill.time" ] && echo present || echo missing), $nsurv of $((NPROC - 1)) survivor files)"
      tail -n 20 "$d.log" | sed 's/^/    /'
      bad=1
      continue
    fi
    [ $rc -eq 0 ] || echo "run $r: note: dcomm-run exited $rc although every survivor wrote its result"
    ok=$((ok + 1))
    local k
    k=$(cat "$d/kill.time")
    cat "$d"/rank.* | awk -v k="$k" -v det="$work/det" -v rec="$work/rec" -v only="$work/only" -v errs="$work/errs" '
      { if (NR == 1 || $2 > md) md = $2; if (NR == 1 || $3 > mr) mr = $3; if (NR == 1 || $3 - $2 > mo) mo = $3 - $2
        print $4 >> errs }
      END { printf "%.6f\n", md - k >> det; printf "%.6f\n", mr - k >> rec; printf "%.6f\n", mo >> only }'
  done
  printf '%-44s %10s %10s %10s\n' "ms, over $ok runs" min median max
  printf '%-44s %s\n' "detection latency (max t_detect - kill)" "$(stats <"$work/det")"
  printf '%-44s %s\n' "recovery latency (max t_first_ok - kill)" "$(stats <"$work/rec")"
  printf '%-44s %s\n' "  of which recover + first all_reduce" "$(stats <"$work/only")"
  echo "survivors' first errors: $(sort "$work/errs" | uniq -c | awk '{printf "%s%s x%d", (NR > 1 ? ", " : ""), $2, $1}')"
}

CASES=${CASES:-kill2 kill0 stop1}
case " $CASES " in *" kill2 "*) run_case "SIGKILL of rank 2" kill 2 ;; esac
case " $CASES " in *" kill0 "*) run_case "SIGKILL of rank 0" kill 0 ;; esac
case " $CASES " in *" stop1 "*)
  run_case "SIGSTOP of rank 1 (hung; killed by the heartbeat check)" stop 1 DCOMM_HEARTBEAT_INTERVAL=0.2 DCOMM_HEARTBEAT_TIMEOUT=1 ;;
esac

echo
echo "'recover + first all_reduce' is max over survivors of (t_first_ok - t_detect): dcomm_elastic_recover() plus one"
echo "all_reduce on the new world; the probe reads no checkpoint, so a real job adds its checkpoint read time."
if [ -n "$iter_med" ]; then
  awk -v t="$iter_med" 'BEGIN {
    printf "work redone: with dcomm_elastic_run and a checkpoint every K steps, a failure redoes K/2 steps on average\n"
    printf "(the steps since the last checkpoint); at one such all_reduce per step (%.2f ms) that is K/2 x %.2f ms,\n", t*1e3, t*1e3
    printf "e.g. K=10: %.1f ms, K=100: %.1f ms, on top of the recovery latency.\n", 5*t*1e3, 50*t*1e3 }'
fi
exit $bad
