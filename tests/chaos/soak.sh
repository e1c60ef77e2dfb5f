#!/usr/bin/env bash
# tests/chaos/soak.sh [SECONDS [SEED]]: the chaos soak. The elastic demo
# (examples/elastic_sgd) trains on three hosts (network namespaces, two
# workers each, one dcomm-run agent per host, --restart-policy replace)
# through the etcd rendezvous on a three-member etcd cluster, while a
# driver injects faults at random times drawn from a seeded generator, the
# kinds in shuffled rounds (each kind once a round, in a random order):
#   worker-kill   SIGKILL of a random worker (its agent starts a replacement)
#   worker-hang   SIGSTOP of a random worker past the heartbeat timeout
#   worker-slow   SIGSTOP of a random worker for 1 s (a slow rank)
#   host-kill     SIGKILL of a whole host (agent and workers); once the job
#                 went on, a replacement agent starts on that host and must
#                 be admitted (host-join)
#   partition     the host's link down for 4.5 s, then healed; an agent that
#                 fenced itself is replaced as above
#   etcd-kill     SIGKILL of one etcd member, restarted 2-3 s later
#   ckpt-kill     the worker writing the next checkpoint dies with its temp
#                 file half written (DCOMM_CHECKPOINT_TEST_DIE_FILE)
# After every fault the job must make progress (two printed steps beyond
# the last one printed before the fault) and grow back to six workers; at most one host
# and one etcd member are down at a time. When SECONDS are over (and at
# least SOAK_MIN_FAULTS faults were injected) the pacing file is removed,
# the job runs to its end, and the soak checks: every agent still running
# exits 0, the final loss equals a failure-free run's within 1e-9 relative,
# and nothing is left: no process, no socket in the hosts' namespaces, no
# new /dev/shm entry, no temp file in the checkpoint directory, no key of
# the job in etcd. It prints a table of the faults by kind, the recoveries,
# the worst detection and recovery times and the steps redone.
#
# Run from a build tree as root (network namespaces):
#   tests/chaos/soak.sh 1800            # a long soak, random seed
#   tests/chaos/soak.sh 120 4242        # replay seed 4242
# Environment: SOAK_MIN_FAULTS (default 0), SOAK_KINDS (a space-separated
# subset of the kinds above), SOAK_KEEP=1 keeps the work directory.
set -u
secs=${1:-${SOAK_SECONDS:-120}}
seed=${2:-${SOAK_SEED:-$(( ($(date +%s%N) / 1000) % 32768 ))}}
min_faults=${SOAK_MIN_FAULTS:-0}
kinds=${SOAK_KINDS:-worker-kill worker-hang worker-slow host-kill partition etcd-kill ckpt-kill}
RANDOM=$seed
b=${top_builddir:-.}
run=$(cd "$b" && pwd)/dcomm-run
sgd=$(cd "$b" && pwd)/examples/elastic_sgd
echo "# chaos soak: seed $seed (replay: tests/chaos/soak.sh $secs $seed), $secs s, kinds: $kinds"
[ -x "$run" ] && [ -x "$sgd" ] || { echo "skip: dcomm-run or elastic_sgd not built"; exit 77; }
command -v etcd >/dev/null || { echo "skip: etcd is not installed (package etcd-server)"; exit 77; }
command -v curl >/dev/null || { echo "skip: curl is not installed"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "skip: the soak needs root for its network namespaces"; exit 77; }
tag=sk$$
ip netns add "${tag}n0" 2>/dev/null || { echo "skip: cannot create network namespaces here"; exit 77; }
work=$(mktemp -d /tmp/dcomm-soak.XXXXXX)
pids=()
cleanup() { # agents before etcd: newest first
  local k
  for ((k = ${#pids[@]} - 1; k >= 0; k--)); do kill -9 "${pids[k]}" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  for i in 0 1 2 3; do ip netns del "${tag}n$i" 2>/dev/null; done
  if [ "${SOAK_KEEP:-0}" = 1 ]; then echo "# kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
fail=0
bad() { fail=$((fail + 1)); echo "not ok - $*"; }

# ---- the network: n0 holds etcd and a bridge, n1..n3 are the hosts ----
ip -n "${tag}n0" link set lo up
ip -n "${tag}n0" link add br0 type bridge
ip -n "${tag}n0" addr add 10.233.0.1/24 dev br0
ip -n "${tag}n0" link set br0 up
for i in 1 2 3; do
  ns=${tag}n$i
  ip netns add "$ns" || { echo "not ok - cannot create namespace $ns"; exit 1; }
  ip -n "$ns" link set lo up
  ip link add "v$i$tag" netns "$ns" type veth peer name "p$i$tag" netns "${tag}n0"
  ip -n "${tag}n0" link set "p$i$tag" master br0 up
  ip -n "$ns" addr add "10.233.0.$((10 + i))/24" dev "v$i$tag"
  ip -n "$ns" link set "v$i$tag" up
done
ehost=10.233.0.1
# `timeout` cannot call a shell function: a launcher that execs in a host.
cat >"$work/in_ns_exec" <<EOF
#!/usr/bin/env bash
node=\$1; shift
exec ip netns exec "${tag}n\$node" "\$@"
EOF
chmod +x "$work/in_ns_exec"
PATH=$work:$PATH

# ---- etcd: three members ----
cluster="m1=http://$ehost:2380,m2=http://$ehost:2382,m3=http://$ehost:2384"
declare -A etcd_pid
start_etcd() { # member 1..3
  local m=$1 c=$((2377 + 2 * $1))
  ip netns exec "${tag}n0" etcd --name "m$m" --data-dir "$work/etcd-m$m" \
    --listen-client-urls "http://$ehost:$c" --advertise-client-urls "http://$ehost:$c" \
    --listen-peer-urls "http://$ehost:$((c + 1))" --initial-advertise-peer-urls "http://$ehost:$((c + 1))" \
    --initial-cluster "$cluster" --initial-cluster-token "$tag" \
    --heartbeat-interval 50 --election-timeout 500 >>"$work/etcd-m$m.log" 2>&1 &
  etcd_pid[$m]=$!
  pids+=("$!")
}
etcd_up() { # member
  ip netns exec "${tag}n1" curl -s -m 1 -X POST "http://$ehost:$((2377 + 2 * $1))/v3/kv/range" \
    -d '{"key":"AA=="}' 2>/dev/null | grep -q header
}
wait_etcd() { for _ in $(seq 1 150); do etcd_up "$1" && return 0; sleep 0.1; done; return 1; }
for m in 1 2 3; do start_etcd $m; done
for m in 1 2 3; do wait_etcd $m || { echo "not ok - etcd member m$m did not start"; tail "$work/etcd-m$m.log"; exit 1; }; done
eps=$ehost:2379,$ehost:2381,$ehost:2383

# ---- the job ----
export DCOMM_TIMEOUT=60 DCOMM_CONNECT_TIMEOUT=10 DCOMM_ELASTIC_SETTLE=1 DCOMM_RDZV_TTL=3 DCOMM_HEARTBEAT_TIMEOUT=3
export DCOMM_ELASTIC_MAX_RECOVERIES=100000 DCOMM_CHECKPOINT_TEST_DIE_FILE=$work/die-in-save
ckdir=$work/ckpt
cap=$((secs * 2 + 60))       # the driver's own bound on the fault phase
steps=$(( (cap + 60) * 25 ))  # 40 ms a step while paced: the job outlives the fault phase
every=20
# The learning rate shrinks with the steps so that the loss stays far above
# float64's noise (about 1e-5 at the end): a meaningful comparison.
lr=$(awk -v n="$steps" 'BEGIN{printf "%.3g", 9 / n}')
sgd_args=(--steps "$steps" --lr "$lr" --checkpoint-every "$every" --checkpoint-dir "$ckdir" --sleep-ms 40 --pace-file "$work/pace")

# The failure-free reference: static launcher, no pacing.
timeout 300 "$run" --nproc-per-node 4 -- "$sgd" --steps "$steps" --lr "$lr" --checkpoint-every "$every" \
  --checkpoint-dir "$work/ref" >"$work/ref.out" 2>"$work/ref.err"
ref=$(grep -o 'final step=.*' "$work/ref.out" | tail -1 | sed 's/.*loss=//')
[ -n "$ref" ] || { echo "not ok - the failure-free reference run failed"; tail "$work/ref.err"; exit 1; }

shm_before=$(ls /dev/shm | sort)
touch "$work/pace"
declare -A host_pid host_up host_inc
start_host() { # host 1..3
  local i=$1
  host_inc[$i]=$(( ${host_inc[$i]:-0} + 1 ))
  local out=$work/h$i.${host_inc[$i]}
  timeout -s KILL $((cap + 600)) in_ns_exec "$i" "$run" --rdzv-backend etcd --rdzv-endpoint "$eps" \
    --rdzv-id soak --nnodes 2:3 --nproc-per-node 2 --restart-policy replace --max-restarts 100000 -- "$sgd" "${sgd_args[@]}" \
    >"$out.out" 2>"$out.err" &
  host_pid[$i]=$!
  host_up[$i]=1
  pids+=("$!")
}
agent_of() { pgrep -P "${host_pid[$1]}" | head -1; }
workers_of() { local a; a=$(agent_of "$1"); [ -n "$a" ] && pgrep -P "$a" -x elastic_sgd; }
# Every host's output, without dcomm-run's "[rank]: " prefixes.
outs() { cat "$work"/h*.out 2>/dev/null | sed 's/^\[[0-9]*\]: //'; }
# The newest generation's last printed step, world and generation: "S W G".
now() {
  outs | sed -n 's/^step=\([0-9]*\) world=\([0-9]*\) generation=\([0-9]*\) .*/\1 \2 \3/p' |
    sort -k3,3n -k1,1n | tail -1
}
max_step() { outs | sed -n 's/^step=\([0-9]*\) .*/\1/p' | sort -n | tail -1; }
recoveries() { outs | grep -c '^recovered:'; }
last_recovery() { # "seconds resume-step" of the newest recovered line
  outs | sed -n 's/^recovered: .*generation \([0-9]*\), in \([0-9.]*\) s, resuming at step \([0-9]*\).*/\1 \2 \3/p' |
    sort -n | tail -1 | cut -d' ' -f2-
}
ms() { date +%s%3N; }
# wait_progress BEFORE SECONDS: a step beyond BEFORE printed within SECONDS.
wait_progress() {
  local until=$(( $(ms) + $2 * 1000 )) s
  while [ "$(ms)" -lt $until ]; do
    s=$(max_step); [ -n "$s" ] && [ "$s" -gt "$1" ] && return 0
    sleep 0.1
  done
  return 1
}
wait_world() { # WORLD SECONDS
  local until=$(( $(ms) + $2 * 1000 )) w
  while [ "$(ms)" -lt $until ]; do
    w=$(now | cut -d' ' -f2); [ "$w" = "$1" ] && return 0
    sleep 0.1
  done
  return 1
}
# An agent that ended without being killed by the driver is a failure
# unless the driver cut its host off (it may fence itself then).
check_agents() {
  local i
  for i in 1 2 3; do
    [ "${host_up[$i]}" = 1 ] || continue
    kill -0 "${host_pid[$i]}" 2>/dev/null && continue
    wait "${host_pid[$i]}"; local rc=$?
    host_up[$i]=0
    bad "the agent of host $i (incarnation ${host_inc[$i]}) ended with exit $rc during the soak"
    tail -n 8 "$work/h$i.${host_inc[$i]}.err" | sed 's/^/    /'
  done
}
up_hosts() { local i n=0; for i in 1 2 3; do [ "${host_up[$i]}" = 1 ] && n=$((n + 1)); done; echo $n; }
pick() { local a=("$@"); echo "${a[RANDOM % ${#a[@]}]}"; }

for i in 1 2 3; do start_host $i; done
if ! wait_world 6 60; then
  bad "the job did not form a world of 6 within 60 s"
  for f in "$work"/h*.err; do tail -n 5 "$f" | sed "s|^|    $(basename "$f"): |"; done
  exit 1
fi

declare -A injected survived
worst_detect=0 worst_rec=0 worst_prog=0 redone=0 worst_redone=0 joins=0 worst_join=0
faults=0
kindlist=($kinds)
deck=()
t0=$(ms)
fmax() { awk -v a="$1" -v b="$2" 'BEGIN{print (a > b ? a : b)}'; }

# Waits for progress after a fault and records its figures; 1 on failure.
after_fault() { # KIND BEFORE-STEP INJECT-MS RECOVERIES-BEFORE
  local kind=$1 before=$2 t=$3 r0=$4
  # Two printed steps beyond: a line of the step under way may still land.
  if ! wait_progress $((before + 10)) 90; then
    bad "no progress within 90 s after fault $faults ($kind) at step $before"
    return 1
  fi
  local prog; prog=$(awk -v a="$(ms)" -v b="$t" 'BEGIN{printf "%.1f", (a - b) / 1000}')
  worst_prog=$(fmax "$worst_prog" "$prog")
  if [ "$(recoveries)" -gt "$r0" ]; then
    local lr secs_r resume
    lr=$(last_recovery); secs_r=${lr% *}; resume=${lr#* }
    worst_rec=$(fmax "$worst_rec" "$secs_r")
    worst_detect=$(fmax "$worst_detect" "$(awk -v p="$prog" -v r="$secs_r" 'BEGIN{d=p-r; printf "%.1f", d < 0 ? 0 : d}')")
    if [ "$before" -gt "$resume" ]; then
      redone=$((redone + before - resume))
      [ $((before - resume)) -gt $worst_redone ] && worst_redone=$((before - resume))
    fi
  fi
  survived[$kind]=$(( ${survived[$kind]:-0} + 1 ))
  return 0
}
# A host whose agent is gone gets a new one, which must be admitted.
rejoin() { # host
  local i=$1 t before
  wait "${host_pid[$i]}" 2>/dev/null
  t=$(ms); before=$(max_step)
  start_host "$i"
  injected[host-join]=$(( ${injected[host-join]:-0} + 1 ))
  if wait_world 6 60; then
    local took; took=$(awk -v a="$(ms)" -v b="$t" 'BEGIN{printf "%.1f", (a - b) / 1000}')
    worst_join=$(fmax "$worst_join" "$took")
    joins=$((joins + 1))
    survived[host-join]=$(( ${survived[host-join]:-0} + 1 ))
  else
    bad "the replacement agent on host $i was not admitted within 60 s (world $(now | cut -d' ' -f2))"
    return 1
  fi
}

while :; do
  el=$(( ($(ms) - t0) / 1000 ))
  [ $el -ge "$secs" ] && [ $faults -ge "$min_faults" ] && break
  if [ $el -ge $cap ]; then bad "only $faults faults in $cap s (SOAK_MIN_FAULTS=$min_faults)"; break; fi
  check_agents
  [ $fail = 0 ] || break
  # Steady state first: every host up, six workers.
  for i in 1 2 3; do [ "${host_up[$i]}" = 1 ] || rejoin $i || break 2; done
  wait_world 6 60 || { bad "the job did not grow back to 6 workers within 60 s after fault $faults"; break; }
  sleep "$((RANDOM % 2)).$((RANDOM % 10))"
  # Kinds come in shuffled rounds: every kind once a round, in a seeded order.
  if [ ${#deck[@]} -eq 0 ]; then
    deck=("${kindlist[@]}")
    for ((k = ${#deck[@]} - 1; k > 0; k--)); do j=$((RANDOM % (k + 1))); x=${deck[k]}; deck[k]=${deck[j]}; deck[j]=$x; done
  fi
  kind=${deck[0]}
  deck=("${deck[@]:1}")
  host=$(( RANDOM % 3 + 1 ))
  before=$(max_step); r0=$(recoveries); t=$(ms)
  faults=$((faults + 1))
  injected[$kind]=$(( ${injected[$kind]:-0} + 1 ))
  case $kind in
    worker-kill|worker-hang|worker-slow)
      ws=($(workers_of $host))
      [ ${#ws[@]} -gt 0 ] || { bad "host $host has no worker to hit"; break; }
      w=$(pick "${ws[@]}")
      case $kind in
        worker-kill) kill -KILL "$w" ;;
        worker-hang) kill -STOP "$w"; (sleep 6; kill -CONT "$w" 2>/dev/null) & ;;
        worker-slow) kill -STOP "$w"; sleep 1; kill -CONT "$w" ;;
      esac
      echo "# $((el))s fault $faults: $kind (pid $w on host $host) at step $before"
      after_fault "$kind" "$before" "$t" "$r0" || break
      ;;
    host-kill)
      a=$(agent_of $host)
      kill -KILL $a $(workers_of $host) 2>/dev/null
      wait "${host_pid[$host]}" 2>/dev/null
      host_up[$host]=0
      echo "# $((el))s fault $faults: host-kill (host $host) at step $before"
      after_fault "$kind" "$before" "$t" "$r0" || break
      rejoin $host || break
      ;;
    partition)
      ip -n "${tag}n$host" link set "v$host$tag" down
      sleep 4.5
      ip -n "${tag}n$host" link set "v$host$tag" up
      echo "# $((el))s fault $faults: partition (host $host, 4.5 s) at step $before"
      after_fault "$kind" "$before" "$t" "$r0" || break
      # Fenced agents exit 1 ("this node left the job"); give it the time.
      for _ in $(seq 1 50); do kill -0 "${host_pid[$host]}" 2>/dev/null || break; sleep 0.1; done
      if ! kill -0 "${host_pid[$host]}" 2>/dev/null; then
        wait "${host_pid[$host]}"; rc=$?
        host_up[$host]=0
        if [ $rc != 1 ] || ! grep -q "left the job" "$work/h$host.${host_inc[$host]}.err"; then
          bad "the cut-off agent of host $host ended with exit $rc, not a fenced exit 1"
          break
        fi
        rejoin $host || break
      fi
      ;;
    etcd-kill)
      m=$(( RANDOM % 3 + 1 ))
      kill -KILL "${etcd_pid[$m]}"; wait "${etcd_pid[$m]}" 2>/dev/null
      echo "# $((el))s fault $faults: etcd-kill (member m$m) at step $before"
      sleep "$((2 + RANDOM % 2))"
      start_etcd $m
      wait_etcd $m || { bad "etcd member m$m did not come back"; break; }
      after_fault "$kind" "$before" "$t" "$r0" || break
      ;;
    ckpt-kill)
      touch "$work/die-in-save"
      echo "# $((el))s fault $faults: ckpt-kill at step $before"
      for _ in $(seq 1 300); do [ -e "$work/die-in-save" ] || break; sleep 0.1; done
      [ -e "$work/die-in-save" ] && { bad "no checkpoint was written within 30 s"; break; }
      after_fault "$kind" "$before" "$t" "$r0" || break
      ;;
  esac
done
fault_phase=$(( ($(ms) - t0) / 1000 ))

# ---- the end: the job runs to its last step ----
rm -f "$work/pace"
rcs=""
for i in 1 2 3; do
  [ "${host_up[$i]}" = 1 ] || continue
  for _ in $(seq 1 1800); do kill -0 "${host_pid[$i]}" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "${host_pid[$i]}" 2>/dev/null; then
    bad "the agent of host $i did not finish within 180 s of the end of the fault phase"
    kill -KILL "$(agent_of $i)" $(workers_of $i) 2>/dev/null
  fi
  wait "${host_pid[$i]}"; rc=$?
  rcs="$rcs $rc"
  [ $rc = 0 ] || { bad "the agent of host $i exited $rc at the end"; tail -n 8 "$work/h$i.${host_inc[$i]}.err" | sed 's/^/    /'; }
done
final=$(outs | grep -o 'final step=.*' | tail -1)
loss=${final##*loss=}
if [ -z "$final" ] || ! echo "$final" | grep -q "final step=$steps "; then
  bad "no final line of step $steps ('$final')"
elif ! awk -v a="$loss" -v b="$ref" 'BEGIN{d=a-b; if(d<0)d=-d; exit !(d <= 1e-9 * (b<0?-b:b))}'; then
  bad "final loss $loss differs from the failure-free run's $ref"
fi
# Nothing left behind.
sleep 0.5
left=$(pgrep -f -- "--checkpoint-dir $ckdir" | tr '\n' ' ')
[ -z "$left" ] || bad "processes left behind: $left"
for i in 1 2 3; do
  s=$(ip netns exec "${tag}n$i" ss -tanpH 2>/dev/null | grep -c 'users:')
  [ "$s" = 0 ] || bad "$s sockets still owned by processes in host $i"
done
[ "$(ls /dev/shm | sort)" = "$shm_before" ] || bad "new /dev/shm entries: $(comm -13 <(echo "$shm_before") <(ls /dev/shm | sort) | tr '\n' ' ')"
tmps=$(ls -A "$ckdir" | grep '\.tmp' | tr '\n' ' ')
[ -z "$tmps" ] || bad "temp files left in the checkpoint directory: $tmps"
keys=$(ip netns exec "${tag}n1" curl -s -m 2 -X POST "http://$ehost:2379/v3/kv/range" \
  -d "{\"key\":\"$(printf /dcomm/soak/ | base64)\",\"range_end\":\"$(printf /dcomm/soak0 | base64)\",\"count_only\":true}" |
  grep -o '"count":"[0-9]*"' | grep -o '[0-9]*')
[ -z "$keys" ] || bad "$keys keys of the job left in etcd"

# ---- the report ----
echo "# chaos soak, seed $seed: $fault_phase s of faults, 3 hosts x 2 workers, 3 etcd members"
printf '# %-12s %9s %9s\n' kind injected survived
total=0
for k in $kinds host-join; do
  printf '# %-12s %9d %9d\n' "$k" "${injected[$k]:-0}" "${survived[$k]:-0}"
  total=$((total + ${survived[$k]:-0}))
done
echo "# recoveries: $(recoveries), scale-ups: $(outs | grep -c '^scaled up:')"
echo "# worst: detection ${worst_detect} s, recovery ${worst_rec} s (library), fault to progress ${worst_prog} s, host admitted ${worst_join} s"
echo "# steps redone: $redone in all, at most $worst_redone after one fault (by printed steps)"
echo "# final: ${final:-none} (failure-free loss $ref)"
echo "faults survived: $total"
if [ $fail = 0 ]; then echo "ok - chaos soak, seed $seed"; exit 0; fi
echo "not ok - chaos soak, seed $seed: $fail failures (replay: tests/chaos/soak.sh $secs $seed)"
for f in "$work"/h*.err; do tail -n 4 "$f" | sed "s|^|    $(basename "$f"): |"; done
exit 1
