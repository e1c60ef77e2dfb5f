#!/bin/bash
# run_launcher.sh: end-to-end checks of dcomm-run, the launcher/agent, with
# small shell workers: output prefixes and environment, policy all with
# --max-restarts, SIGTERM forwarding, shrink after a SIGKILLed worker, and
# replace with a joining replacement, --bind-to.
# Environment: DCOMM_RUN (default ./dcomm-run). Every run is bounded by
# timeout(1); anything started is stopped by its own pid.
# Exit status: 0 pass, 1 fail, 77 skip (no dcomm-run, no timeout).

# The worker bodies below are single-quoted on purpose: they expand in the worker.
# shellcheck disable=SC2016

DCOMM_RUN=${DCOMM_RUN:-./dcomm-run}

if [ ! -x "$DCOMM_RUN" ]; then
  echo "run_launcher: $DCOMM_RUN not found or not executable; skipping"
  exit 77
fi
if ! command -v timeout >/dev/null 2>&1; then
  echo "run_launcher: timeout(1) not found; skipping"
  exit 77
fi

T=$(mktemp -d "${TMPDIR:-/tmp}/run_launcher.XXXXXX") || exit 1
bg_pid=

cleanup() {
  [ -n "$bg_pid" ] && kill -KILL "$bg_pid" 2>/dev/null
  for f in "$T"/pid*; do
    [ -f "$f" ] || continue
    p=$(cat "$f" 2>/dev/null)
    case $p in '' | *[!0-9]*) ;; *) kill -KILL "$p" 2>/dev/null ;; esac
  done
  rm -rf "$T"
}
trap cleanup EXIT

. "${top_srcdir:-.}/tests/lib.sh"

# run_job ARGS...: runs dcomm-run bounded, output in $T/out and $T/err; sets rc.
run_job() {
  timeout -k 5 60 "$DCOMM_RUN" "$@" >"$T/out" 2>"$T/err" </dev/null
  rc=$?
}

worker() { # worker NAME BODY: writes an executable bash script, prints its path
  printf '#!/bin/bash\nT=%q\n%s\n' "$T" "$2" >"$T/$1"
  chmod +x "$T/$1"
  echo "$T/$1"
}

# ---- 1: three workers, prefixes and environment ----
w=$(worker w1.sh 'echo hi $RANK $WORLD_SIZE $LOCAL_RANK; [ -n "$DCOMM_AUTH_TOKEN" ]')
run_job --nproc-per-node 3 -- "$w"
why=
[ "$rc" = 0 ] || why="exit status $rc, expected 0"
for r in 0 1 2; do
  grep -qFx "[$r]: hi $r 3 $r" "$T/out" || why="${why:+$why; }no line '[$r]: hi $r 3 $r'"
done
result "$([ -z "$why" ]; echo $?)" "3 workers print prefixed lines with RANK, WORLD_SIZE, LOCAL_RANK" "$why"

# ---- 1b: OMP_NUM_THREADS, as torchrun sets it: 1 for several workers when
# unset; a value the user set is kept; a lone worker gets none ----
w=$(worker w1b.sh 'echo "omp=${OMP_NUM_THREADS-unset}"')
why=
(unset OMP_NUM_THREADS; run_job --nproc-per-node 2 -- "$w"; echo "$rc" >"$T/rc1b")
[ "$(cat "$T/rc1b")" = 0 ] && [ "$(grep -c ': omp=1$' "$T/out")" = 2 ] || why="2 workers, unset: $(tr '\n' ' ' <"$T/out")"
grep -q "OMP_NUM_THREADS=1 for each" "$T/err" || why="${why:+$why; }the start message does not say so"
OMP_NUM_THREADS=3 run_job --nproc-per-node 2 -- "$w"
[ "$rc" = 0 ] && [ "$(grep -c ': omp=3$' "$T/out")" = 2 ] && ! grep -q "OMP_NUM_THREADS=1" "$T/err" ||
  why="${why:+$why; }2 workers, OMP_NUM_THREADS=3: $(tr '\n' ' ' <"$T/out")"
(unset OMP_NUM_THREADS; run_job --nproc-per-node 1 -- "$w"; echo "$rc" >"$T/rc1b")
[ "$(cat "$T/rc1b")" = 0 ] && grep -q 'omp=unset$' "$T/out" || why="${why:+$why; }1 worker: $(tr '\n' ' ' <"$T/out")"
result "$([ -z "$why" ]; echo $?)" "OMP_NUM_THREADS=1 for each of several workers when unset (as torchrun); a set value is kept; one worker gets none" "$why"

# ---- 2: policy all, --max-restarts 2: three launches, then exit 1 ----
w=$(worker w2.sh 'echo "$DCOMM_RESTART_COUNT" >>"$T/count2"; exit 3')
run_job --nproc-per-node 2 --restart-policy all --max-restarts 2 -- "$w"
why=
[ "$rc" = 1 ] || why="exit status $rc, expected 1"
launches=$(sort -u "$T/count2" 2>/dev/null | tr '\n' ' ')
[ "$launches" = "0 1 2 " ] || why="${why:+$why; }restart counts seen: '$launches', expected '0 1 2 '"
result "$([ -z "$why" ]; echo $?)" "policy all restarts a failing job twice, then exits 1" "$why"

# ---- 3: SIGTERM is forwarded; exit 143; no worker left ----
w=$(worker w3.sh 'echo $$ >"$T/pid3.$RANK"; exec sleep 100')
"$DCOMM_RUN" --nproc-per-node 3 -- "$w" >"$T/out" 2>"$T/err" </dev/null &
bg_pid=$!
why=
for _ in $(seq 100); do
  [ -s "$T/pid3.0" ] && [ -s "$T/pid3.1" ] && [ -s "$T/pid3.2" ] && break
  sleep 0.1
done
[ -s "$T/pid3.0" ] && [ -s "$T/pid3.1" ] && [ -s "$T/pid3.2" ] || why="the workers did not start"
kill -TERM "$bg_pid" 2>/dev/null
gone=
for _ in $(seq 150); do
  if ! kill -0 "$bg_pid" 2>/dev/null; then gone=1; break; fi
  sleep 0.1
done
if [ -n "$gone" ]; then
  wait "$bg_pid"
  rc=$?
  [ "$rc" = 143 ] || why="${why:+$why; }exit status $rc, expected 143"
else
  kill -KILL "$bg_pid" 2>/dev/null
  wait "$bg_pid" 2>/dev/null
  why="${why:+$why; }still running 15 s after SIGTERM"
fi
bg_pid=
for r in 0 1 2; do
  p=$(cat "$T/pid3.$r" 2>/dev/null)
  if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then why="${why:+$why; }worker $r (pid $p) still alive"; fi
done
result "$([ -z "$why" ]; echo $?)" "SIGTERM stops the job with 143 and leaves no worker" "$why"

# ---- 4: shrink: a SIGKILLed worker, the others finish -> exit 0 ----
w=$(worker w4.sh 'echo $$ >"$T/pid4.$RANK"; [ "$RANK" = 1 ] && kill -KILL $$; sleep 1; exit 0')
run_job --nproc-per-node 3 --restart-policy shrink -- "$w"
why=
[ "$rc" = 0 ] || why="exit status $rc, expected 0"
grep -qE 'worker 1 \(pid [0-9]+\) died \(killed by signal 9' "$T/err" || why="${why:+$why; }stderr does not name the death"
result "$([ -z "$why" ]; echo $?)" "shrink: survivors of a SIGKILLed worker finish, exit 0" "$why"

# ---- 5: replace: the first incarnation of rank 1 dies; the replacement joins ----
w=$(worker w5.sh '
if [ "$DCOMM_ELASTIC_JOIN" = 1 ]; then echo "$RANK" >"$T/joined5"; exit 0; fi
if [ "$RANK" = 1 ] && [ ! -e "$T/died5" ]; then : >"$T/died5"; kill -KILL $$; fi
sleep 2; exit 0')
run_job --nproc-per-node 3 --restart-policy replace --max-restarts 2 -- "$w"
why=
[ "$rc" = 0 ] || why="exit status $rc, expected 0"
[ -e "$T/died5" ] || why="${why:+$why; }the first incarnation did not run"
if [ -s "$T/joined5" ]; then
  [ "$(cat "$T/joined5")" = 3 ] || why="${why:+$why; }replacement got RANK $(cat "$T/joined5"), expected 3"
else
  why="${why:+$why; }no replacement with DCOMM_ELASTIC_JOIN=1 started"
fi
result "$([ -z "$why" ]; echo $?)" "replace: a replacement joins with DCOMM_ELASTIC_JOIN=1, exit 0" "$why"

# ---- 6: --bind-to: core gives each worker one processor of its own, none
# and auto with more workers than processors leave them unbound ----
w=$(worker w6.sh 'echo "cpus $(sed -n "s/^Cpus_allowed_list:[[:space:]]*//p" /proc/self/status)"')
all=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
ncpu=$(nproc)
why=
run_job --bind-to core --nproc-per-node "$ncpu" -- "$w"
[ "$rc" = 0 ] || why="core: exit status $rc"
got=$(sed -n 's/^\[[0-9]*\]: cpus //p' "$T/out" | sort -u)
[ "$(echo "$got" | wc -l)" = "$ncpu" ] || why="${why:+$why; }core: $ncpu workers did not get $ncpu distinct processors: $(echo $got)"
echo "$got" | grep -q '[,-]' && why="${why:+$why; }core: a worker may run on several processors: $(echo $got)"
for mode in none auto; do
  run_job --bind-to "$mode" --nproc-per-node $((ncpu + 1)) -- "$w"
  [ "$rc" = 0 ] || why="${why:+$why; }$mode: exit status $rc"
  n_all=$(grep -c "^\[[0-9]*\]: cpus $all\$" "$T/out")
  [ "$n_all" = $((ncpu + 1)) ] || why="${why:+$why; }$mode: $n_all of $((ncpu + 1)) workers kept all processors ($all)"
done
run_job --bind-to socket --nproc-per-node 1 -- "$w"
[ "$rc" = 2 ] && grep -q "expected core, none or auto" "$T/err" || why="${why:+$why; }--bind-to socket: exit $rc, no clear error"
result "$([ -z "$why" ]; echo $?)" "--bind-to core binds each worker to its own processor; none and oversubscribed auto do not" "$why"

# ---- 7: dcomm-run status of a static job (the agent's endpoint, job id and
# token: DCOMM_AUTH_TOKEN given to the agent); a wrong token is refused ----
why=
sgd=$(cd "${top_builddir:-.}" && pwd)/examples/elastic_sgd
if [ -x "$sgd" ]; then
  port=$(free_port)
  DCOMM_AUTH_TOKEN=opstok timeout -k 5 60 "$DCOMM_RUN" --nproc-per-node 2 --rdzv-endpoint 127.0.0.1:$port --rdzv-id st7 \
    -- "$sgd" --steps 200 --checkpoint-every 5 --checkpoint-dir "$T/ck7" --sleep-ms 20 >"$T/out" 2>"$T/err" </dev/null &
  bg_pid=$!
  for _ in $(seq 100); do grep -q "step=20 " "$T/out" 2>/dev/null && break; sleep 0.1; done
  timeout 20 "$DCOMM_RUN" status --rdzv-endpoint 127.0.0.1:$port --rdzv-id st7 --token opstok >"$T/st" 2>&1 || why="status failed"
  DCOMM_AUTH_TOKEN=opstok timeout 20 "$DCOMM_RUN" status --rdzv-endpoint 127.0.0.1:$port --rdzv-id st7 --json >"$T/stj" 2>&1 ||
    why="${why:+$why; }status --json failed"
  timeout 20 "$DCOMM_RUN" status --rdzv-endpoint 127.0.0.1:$port --rdzv-id st7 --token wrong >"$T/stw" 2>&1 &&
    why="${why:+$why; }a wrong token was accepted"
  wait "$bg_pid"; rc=$?; bg_pid=
  [ "$rc" = 0 ] || why="${why:+$why; }the job exited $rc"
  grep -q "^job st7 (static 127.0.0.1:$port): generation 0, world size 2" "$T/st" || why="${why:+$why; }no generation/world line"
  grep -qE "^last checkpoint: step [0-9]+ \(generation 0\), ckpt-" "$T/st" || why="${why:+$why; }no checkpoint line"
  [ "$(grep -cE '^  rank [01] +pid [0-9]+ +member [0-9a-f-]{36}  heartbeat [0-9.]+ s ago' "$T/st")" = 2 ] ||
    why="${why:+$why; }not 2 members with heartbeat ages"
  if command -v jq >/dev/null; then
    j=$(jq -r '[.generation, .world_size, (.nodes[0].members|length), (.checkpoint.step > 0)] | join(" ")' "$T/stj" 2>/dev/null)
    [ "$j" = "0 2 2 true" ] || why="${why:+$why; }--json gave '$j'"
  fi
  grep -q "bad auth token" "$T/stw" || why="${why:+$why; }no clear error for a wrong token"
  [ -n "$why" ] && cat "$T/st" "$T/stj" "$T/stw" >>"$T/err"
  result "$([ -z "$why" ]; echo $?)" "status of a static job: generation, world, members with pids and heartbeat ages, last checkpoint; --json; a wrong token refused" "$why"

  # ---- 8: the restored checkpoint is logged at the default level; a run
  # asking for fewer steps than the checkpoint holds is warned about ----
  why=
  run_job --nproc-per-node 2 -- "$sgd" --steps 50 --checkpoint-every 5 --checkpoint-dir "$T/ck7"
  [ "$rc" = 0 ] || why="exit status $rc"
  grep -q "restored the checkpoint of step 199 from $T/ck7: resuming at step 200" "$T/err" || why="${why:+$why; }restore not logged"
  grep -q "is at or past the 50 steps asked for" "$T/err" || why="${why:+$why; }no warning from dcomm_elastic_run"
  grep -q "elastic_sgd: warning: the checkpoint restored from the directory is of step 199" "$T/err" ||
    why="${why:+$why; }no warning from elastic_sgd"
  result "$([ -z "$why" ]; echo $?)" "the restored checkpoint is logged by default; a restored step past --steps is warned about" "$why"
else
  result 0 "# SKIP status of a static job: examples/elastic_sgd not built"
fi

# ---- 9: dcomm_finalize returns promptly under dcomm-run: it does not wait
# out the watcher's blocking heartbeat get (DCOMM_HEARTBEAT_INTERVAL=20
# here; the whole job must end well within one interval) ----
bench=$(dirname "$DCOMM_RUN")/dcomm-bench
if [ -x "$bench" ]; then
  t0=$(date +%s.%N)
  DCOMM_HEARTBEAT_INTERVAL=20 DCOMM_HEARTBEAT_TIMEOUT=60 run_job --nproc-per-node 2 -- "$bench" -o barrier -b 8 -e 8 -n 1 -w 0
  t1=$(date +%s.%N)
  why=
  [ "$rc" = 0 ] || why="exit status $rc"
  awk -v a="$t0" -v b="$t1" 'BEGIN { exit !(b - a < 10) }' || why="${why:+$why; }the job took $(echo "$t1 - $t0" | bc) s (>= 10 s): finalize waited for the heartbeat get"
  result "$([ -z "$why" ]; echo $?)" "dcomm_finalize under dcomm-run returns without waiting a heartbeat interval" "$why"
else
  result 0 "# SKIP prompt finalize: dcomm-bench not built"
fi


# ---- 10: a worker that starts slowly because it waits for a processor
# (it shares processor 0 with two spinning processes for 13 s before it
# runs the program) is not killed at the 10 s start-up grace: the
# starvation rule of late heartbeats covers the first one too ----
if [ -x "$sgd" ] && command -v taskset >/dev/null; then
  cat >"$T/slowstart.sh" <<EOF
#!/usr/bin/env bash
if [ "\$RANK" = 1 ]; then
  taskset -pc 0 \$\$ >/dev/null
  (while :; do :; done) & b1=\$!
  (while :; do :; done) & b2=\$!
  while [ \$SECONDS -lt 13 ]; do :; done
  kill \$b1 \$b2
fi
exec "$sgd" --steps 30 --checkpoint-every 10 --checkpoint-dir "$T/ck10"
EOF
  chmod +x "$T/slowstart.sh"
  run_job --nproc-per-node 2 -- "$T/slowstart.sh"
  why=
  [ "$rc" = 0 ] || why="exit status $rc"
  grep -q "final step=30 world=2 generation=0 " "$T/out" || why="${why:+$why; }not finished by both ranks in generation 0"
  grep -q "worker 1 (pid [0-9]*): it has sent no heartbeat in the [0-9.]* s since its start, but it .* waited for a processor" "$T/err" ||
    why="${why:+$why; }the starved start was not logged"
  ! grep -q "is hung" "$T/err" || why="${why:+$why; }$(grep -m1 'is hung' "$T/err")"
  result "$([ -z "$why" ]; echo $?)" "a worker starved of processors while it starts is not killed at the 10 s start-up grace" "$why"
else
  result 0 "# SKIP starved start: examples/elastic_sgd or taskset missing"
fi
finish
