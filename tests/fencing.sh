#!/usr/bin/env bash
# tests/fencing.sh: a node or process that is cut off or frozen must never
# come back as a second world, and no checkpoint of a fenced member may be
# committed or restored. Real etcd, real dcomm-run agents, each node a
# network namespace joined to etcd's by a bridge; links cut with
# `ip link set down`, processes frozen with SIGSTOP / SIGCONT.
#
# Cases (FENCING_CASES picks some, default: the make-check set; "all" runs
# every one; REPEAT=N runs each N times and reports any second world with
# the seed, as tests/perf/fencing-bench.sh does):
#   link-0.5 link-1 link-1.5 link-3   node 2's link down for that many TTLs
#   stop-0.5 stop-1 stop-1.5 stop-3   node 2 (agent + workers) SIGSTOPped
#   agent-stop                        node 2's agent alone stopped 1.5 TTL
#   worker-stop                       one worker of node 2 stopped > heartbeat timeout
#   static-run-stop                   static dcomm-run SIGSTOPped 7 s (> heartbeat timeout, and > a store request's 5 s bound: the watchers must connect again)
#   static-worker-short               a worker stopped 1 s (< heartbeat timeout)
#   static-worker-long                a worker stopped 6 s (> heartbeat timeout)
# Each asserts, from the logs (DCOMM_LOG_LEVEL=info) and the checkpoint
# directory: at most one world per generation ((generation, rank) never
# twice); every generation that formed is one the job's finishers went
# through (no second lineage); every committed or restored checkpoint and
# every record in COMMITTED belongs to that lineage; the finishers' loss
# equals the failure-free run's; the other node exited 0 too or exited 1
# saying it left the job (fenced); nothing is left running.
# Needs root and network namespaces for the etcd cases (skipped otherwise).
set -u
b=${top_builddir:-.}
run=$(cd "$b" && pwd)/dcomm-run
sgd=$(cd "$b" && pwd)/examples/elastic_sgd
[ -x "$run" ] && [ -x "$sgd" ] || { echo "skip: dcomm-run or elastic_sgd not built"; exit 77; }
work=$(mktemp -d /tmp/dcomm-fence.XXXXXX)
pids=()
tag=df$$
netns=0
cleanup() {
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  if [ $netns = 1 ]; then for i in 0 1 2; do ip netns del "${tag}n$i" 2>/dev/null; done; fi
  [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
pass=0 fail=0 n=0 skipped=0 second_worlds=0
TTL=3
export DCOMM_TIMEOUT=30 DCOMM_CONNECT_TIMEOUT=10 DCOMM_ELASTIC_SETTLE=1 DCOMM_RDZV_TTL=$TTL DCOMM_HEARTBEAT_TIMEOUT=3
export DCOMM_LOG_LEVEL=info DCOMM_LOG_SUBSYS=elastic,init
steps=${FENCING_STEPS:-300}
cases=${FENCING_CASES:-link-1.5 stop-1.5 agent-stop static-run-stop static-worker-long}
[ "$cases" = all ] && cases="link-0.5 link-1 link-1.5 link-3 stop-0.5 stop-1 stop-1.5 stop-3 agent-stop worker-stop static-run-stop static-worker-short static-worker-long"
repeat=${REPEAT:-1}
seed=${SEED:-$$}
RANDOM=$seed

if [ "$(id -u)" = 0 ] && command -v etcd >/dev/null && ip netns add "${tag}n0" 2>/dev/null; then
  netns=1
  ip -n "${tag}n0" link set lo up
  ip -n "${tag}n0" link add br0 type bridge
  ip -n "${tag}n0" addr add 10.232.0.1/24 dev br0
  ip -n "${tag}n0" link set br0 up
  for i in 1 2; do
    ns=${tag}n$i
    ip netns add "$ns" || { echo "not ok - cannot create namespace $ns"; exit 1; }
    ip -n "$ns" link set lo up
    ip link add "v$i$tag" netns "$ns" type veth peer name "p$i$tag" netns "${tag}n0"
    ip -n "${tag}n0" link set "p$i$tag" master br0 up
    ip -n "$ns" addr add "10.232.0.$((10 + i))/24" dev "v$i$tag"
    ip -n "$ns" link set "v$i$tag" up
  done
  ip netns exec "${tag}n0" etcd --name f0 --data-dir "$work/etcd" \
    --listen-client-urls http://10.232.0.1:2379 --advertise-client-urls http://10.232.0.1:2379 \
    --listen-peer-urls http://10.232.0.1:2380 --initial-advertise-peer-urls http://10.232.0.1:2380 \
    --initial-cluster f0=http://10.232.0.1:2380 --heartbeat-interval 50 --election-timeout 500 \
    >"$work/etcd.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 100); do
    ip netns exec "${tag}n1" curl -s -m 1 -X POST http://10.232.0.1:2379/v3/kv/range -d '{"key":"AA=="}' 2>/dev/null |
      grep -q header && break
    sleep 0.1
  done
fi

final() { grep -ho 'final step=.*' "$@" | tail -1; }
same_loss() { awk -v a="$1" -v b="$2" 'BEGIN{d=a-b; if(d<0)d=-d; exit !(a != "" && d <= 1e-6 * (b<0?-b:b))}'; }
ok() { pass=$((pass + 1)); echo "ok $n - $*"; }
notok() {
  fail=$((fail + 1))
  echo "not ok $n - $1 (seed $seed)"
  shift
  for f in "$@"; do [ -f "$f" ] && grep -v ' INFO ' "$f" | tail -n 15 | sed "s|^|    $(basename "$f"): |"; done
}
left_behind() { pgrep -f -- "--checkpoint-dir $ckdir" >/dev/null 2>&1; }

# check_lineage FINISHER-LOGS -- ALL-LOGS: prints why it fails, if it does.
# A process logs "initialized: rank R of N ... generation G" or
# "generation G: rank R of N" once for each world it is in.
check_lineage() {
  local fin=() all=()
  while [ "$1" != -- ]; do fin+=("$1"); shift; done
  shift
  all=("$@")
  local worlds lineage dup
  worlds=$(cat "${all[@]}" | sed -n 's/.*initialized: rank \([0-9]*\) of \([0-9]*\).* generation \([0-9]*\),.*/\3 \1 \2/p;
    s/.*generation \([0-9]*\): rank \([0-9]*\) of \([0-9]*\) .*/\1 \2 \3/p')
  dup=$(echo "$worlds" | awk 'NF{print $1, $2}' | sort | uniq -d | head -1)
  [ -n "$dup" ] && { echo "two worlds: generation/rank '$dup' held twice"; return 1; }
  dup=$(echo "$worlds" | awk 'NF{print $1, $3}' | sort -u | awk '{print $1}' | uniq -d | head -1)
  [ -n "$dup" ] && { echo "two worlds: generation $dup has two sizes"; return 1; }
  lineage=$(cat "${fin[@]}" | sed -n 's/.*initialized: .* generation \([0-9]*\),.*/\1/p; s/.*generation \([0-9]*\): rank .*/\1/p' | sort -u)
  local g
  for g in $(echo "$worlds" | awk 'NF{print $1}' | sort -u); do
    echo "$lineage" | grep -qx "$g" || { echo "a second lineage: generation $g formed but the job never went through it"; return 1; }
  done
  for g in $(cat "${all[@]}" | sed -n 's/.*checkpoint: \(committed\|read\) step [0-9]* (generation \([0-9]*\).*/\2/p' | sort -u); do
    echo "$lineage" | grep -qx "$g" || { echo "a checkpoint of generation $g (outside the job's lineage) was committed or read"; return 1; }
  done
  if [ -f "$ckdir/COMMITTED" ]; then
    for g in $(sed -n '2,$p' "$ckdir/COMMITTED" | awk '{print $2}'); do
      echo "$lineage" | grep -qx "$g" || { echo "COMMITTED names generation $g, outside the job's lineage"; return 1; }
    done
  fi
  return 0
}

# ---- failure-free reference (static launcher) ----
ckdir=$work/ref
timeout 120 "$run" --nproc-per-node 4 -- "$sgd" --steps $steps --checkpoint-every 10 --checkpoint-dir "$ckdir" \
  >"$work/ref.out" 2>"$work/ref.err"
ref=$(final "$work/ref.out" | sed 's/.*loss=//')
[ -n "$ref" ] || { echo "not ok - the reference run failed"; tail "$work/ref.err"; exit 1; }

# start_node NODE OUT -> timeout's pid in $node_pid. timeout(1) makes its
# own process group, so the node (agent + workers) can be frozen at once.
start_node() {
  local node=$1 out=$2
  timeout -s KILL 200 ip netns exec "${tag}n$node" "$run" --rdzv-backend etcd --rdzv-endpoint 10.232.0.1:2379 \
    --rdzv-id "$job" --nnodes 1:2 --nproc-per-node 2 -- "$sgd" --steps $steps --checkpoint-every 10 \
    --checkpoint-dir "$ckdir" --sleep-ms 40 >"$out.out" 2>"$out.err" &
  node_pid=$!
  pids+=("$node_pid")
}
wait_step() { # step files...
  local s=$1; shift
  for _ in $(seq 1 400); do grep -qs "step=$s " "$@" && return 0; sleep 0.05; done
  return 1
}

etcd_case() { # name: link-F, stop-F, agent-stop, worker-stop
  local c=$1 secs a b ra rb
  job=j$n.$RANDOM
  ckdir=$work/c$n
  start_node 1 "$work/$n.a"; a=$node_pid
  start_node 2 "$work/$n.b"; b=$node_pid
  wait_step $((20 + 10 * (RANDOM % 3))) "$work/$n.a.out" "$work/$n.b.out"
  sleep "0.$((RANDOM % 10))"
  case $c in
    link-*) secs=$(awk -v f="${c#link-}" -v t=$TTL 'BEGIN{print f*t}')
      ip -n "${tag}n0" link set "p2$tag" down; sleep "$secs"; ip -n "${tag}n0" link set "p2$tag" up ;;
    stop-*) secs=$(awk -v f="${c#stop-}" -v t=$TTL 'BEGIN{print f*t}')
      kill -STOP -- "-$b"; sleep "$secs"; kill -CONT -- "-$b" ;;
    agent-stop) local agent; agent=$(pgrep -P "$b" | head -1); agent=${agent:-$b}
      kill -STOP "$agent"; sleep "$(awk -v t=$TTL 'BEGIN{print 1.5*t}')"; kill -CONT "$agent" ;;
    worker-stop) local agent wk; agent=$(pgrep -P "$b" | head -1); wk=$(pgrep -P "${agent:-$b}" | head -1)
      kill -STOP "$wk"; sleep 6; kill -CONT "$wk" 2>/dev/null ;;
  esac
  wait "$a"; ra=$?; wait "$b"; rb=$?
  local fin=() why
  [ $ra = 0 ] && fin+=("$work/$n.a.err")
  [ $rb = 0 ] && fin+=("$work/$n.b.err")
  local f; f=$(final "$work/$n.a.out" "$work/$n.b.out")
  if [ ${#fin[@]} = 0 ]; then notok "$c: no node finished (exit $ra $rb)" "$work/$n.a.err" "$work/$n.b.err"; return; fi
  for r in $ra $rb; do
    [ "$r" = 0 ] || [ "$r" = 1 ] || { notok "$c: a node exited $r" "$work/$n.a.err" "$work/$n.b.err"; return; }
  done
  if [ $rb = 1 ] && ! grep -q "left the job" "$work/$n.b.err"; then
    notok "$c: node 2 exited 1 without saying it left the job" "$work/$n.b.err"; return
  fi
  if ! why=$(check_lineage "${fin[@]}" -- "$work/$n.a.err" "$work/$n.b.err"); then
    second_worlds=$((second_worlds + 1))
    notok "$c: $why" "$work/$n.a.err" "$work/$n.b.err"; return
  fi
  if ! same_loss "$(echo "$f" | sed 's/.*loss=//')" "$ref"; then
    notok "$c: final '$f', want loss $ref" "$work/$n.a.err" "$work/$n.b.err"; return
  fi
  if left_behind; then notok "$c: workers left running" "$work/$n.b.err"; return; fi
  ok "$c (${secs:+$secs s; }node 2 $([ $rb = 0 ] && echo "stayed in the job" || echo "fenced itself and exited 1"); $f)"
}

static_case() { # static-run-stop, static-worker-short, static-worker-long
  local c=$1 p rc want_world=4
  ckdir=$work/c$n
  timeout -s KILL 200 "$run" --nproc-per-node 4 -- "$sgd" --steps $steps --checkpoint-every 10 \
    --checkpoint-dir "$ckdir" --sleep-ms 40 >"$work/$n.out" 2>"$work/$n.err" &
  p=$!
  pids+=("$p")
  wait_step $((20 + 10 * (RANDOM % 3))) "$work/$n.out"
  local agent wk; agent=$(pgrep -P "$p" | head -1); agent=${agent:-$p}; wk=$(pgrep -P "$agent" | sed -n 2p)
  case $c in
    static-run-stop) kill -STOP "$agent"; sleep 7; kill -CONT "$agent" ;;
    static-worker-short) kill -STOP "$wk"; sleep 1; kill -CONT "$wk" ;;
    static-worker-long) kill -STOP "$wk"; sleep 6; kill -CONT "$wk" 2>/dev/null; want_world=3 ;;
  esac
  wait "$p"; rc=$?
  local f why; f=$(final "$work/$n.out")
  if [ $rc != 0 ]; then notok "$c: dcomm-run exited $rc" "$work/$n.err"; return; fi
  if ! why=$(check_lineage "$work/$n.err" -- "$work/$n.err"); then
    second_worlds=$((second_worlds + 1)); notok "$c: $why" "$work/$n.err"; return
  fi
  if ! echo "$f" | grep -q "world=$want_world " || ! same_loss "$(echo "$f" | sed 's/.*loss=//')" "$ref"; then
    notok "$c: final '$f', want world=$want_world and loss $ref" "$work/$n.err"; return
  fi
  if left_behind; then notok "$c: workers left running" "$work/$n.err"; return; fi
  ok "$c ($f)"
}

for _ in $(seq 1 "$repeat"); do
  for c in $cases; do
    n=$((n + 1))
    case $c in
      static-*) static_case "$c" ;;
      *) if [ $netns = 1 ]; then etcd_case "$c"; else
           skipped=$((skipped + 1)); echo "ok $n - # SKIP $c: needs root, etcd and network namespaces"; fi ;;
    esac
  done
done
echo "# second worlds: $second_worlds (seed $seed)"
echo "$pass passed, $fail failed, $skipped skipped"
[ $fail = 0 ]
