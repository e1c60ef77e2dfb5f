#!/usr/bin/env bash
# tests/rdzv_ops.sh: the operator's side of an etcd job, against a real
# etcd started here, one dcomm-run agent per "node" (network namespaces
# where the suite may create them, as in rdzv_etcd.sh; else loopback):
#   - a spare node above --nnodes MAX causes no recovery; dcomm-run status
#     (text and --json) shows the generation, world, nodes, members,
#     heartbeats and the last checkpoint; the finished job's keys are gone;
#   - an agent stopped by SIGTERM: the survivors say that the node left;
#   - dcomm-run clean refuses a job whose lease is alive, then removes a
#     dead job's keys;
#   - a round that times out names the member that never joined.
# Every process is bounded by `timeout` and stopped by its own pid.
set -u
b=${top_builddir:-.}
run=$(cd "$b" && pwd)/dcomm-run
sgd=$(cd "$b" && pwd)/examples/elastic_sgd
[ -x "$run" ] && [ -x "$sgd" ] || { echo "skip: dcomm-run or elastic_sgd not built"; exit 77; }
for c in etcd etcdctl curl jq; do
  command -v $c >/dev/null || { echo "skip: $c is not installed"; exit 77; }
done
work=$(mktemp -d /tmp/dcomm-ops.XXXXXX)
pids=()
tag=do$$
netns=0
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  if [ $netns = 1 ]; then
    for i in 0 1 2 3; do ip netns del "${tag}n$i" 2>/dev/null; done
  fi
  rm -rf "$work"
}
trap cleanup EXIT
pass=0 fail=0 n=0
export DCOMM_TIMEOUT=60 DCOMM_CONNECT_TIMEOUT=10 DCOMM_ELASTIC_SETTLE=1 DCOMM_RDZV_TTL=3 DCOMM_HEARTBEAT_TIMEOUT=3

if [ "$(id -u)" = 0 ] && ip netns add "${tag}n0" 2>/dev/null; then
  netns=1
  ip -n "${tag}n0" link set lo up
  ip -n "${tag}n0" link add br0 type bridge
  ip -n "${tag}n0" addr add 10.232.0.1/24 dev br0
  ip -n "${tag}n0" link set br0 up
  for i in 1 2 3; do
    ns=${tag}n$i
    ip netns add "$ns" || { echo "not ok - cannot create namespace $ns"; exit 1; }
    ip -n "$ns" link set lo up
    ip link add "v$i$tag" netns "$ns" type veth peer name "p$i$tag" netns "${tag}n0"
    ip -n "${tag}n0" link set "p$i$tag" master br0 up
    ip -n "$ns" addr add "10.232.0.$((10 + i))/24" dev "v$i$tag"
    ip -n "$ns" link set "v$i$tag" up
  done
  ehost=10.232.0.1
  echo "# nodes are network namespaces ${tag}n1..3, etcd in ${tag}n0"
else
  ehost=127.0.0.1
  echo "# no network namespaces here: nodes share loopback"
fi
in_ns() {
  local node=$1; shift
  if [ $netns = 1 ]; then ip netns exec "${tag}n$node" "$@"; else "$@"; fi
}
cat >"$work/in_ns_exec" <<EOS
#!/usr/bin/env bash
node=\$1; shift
if [ $netns = 1 ]; then exec ip netns exec "${tag}n\$node" "\$@"; else exec "\$@"; fi
EOS
chmod +x "$work/in_ns_exec"
PATH=$work:$PATH

port=$((30000 + ($$ % 20000)))
[ $netns = 1 ] && port=2379
# in_ns_exec execs: $! is etcd itself, whom cleanup kills
in_ns_exec 0 etcd --name o0 --data-dir "$work/etcd" \
  --listen-client-urls "http://$ehost:$port" --advertise-client-urls "http://$ehost:$port" \
  --listen-peer-urls "http://$ehost:$((port + 1))" --initial-advertise-peer-urls "http://$ehost:$((port + 1))" \
  --initial-cluster "o0=http://$ehost:$((port + 1))" >"$work/etcd.log" 2>&1 &
pids+=("$!")
up=0
for _ in $(seq 1 100); do
  in_ns 1 curl -s -m 1 -X POST "http://$ehost:$port/v3/kv/range" -d '{"key":"AA=="}' 2>/dev/null | grep -q header && { up=1; break; }
  sleep 0.1
done
[ $up = 1 ] || { echo "not ok - etcd did not start"; tail -20 "$work/etcd.log"; exit 1; }
ep=$ehost:$port
keys_of() { in_ns 1 env ETCDCTL_API=3 etcdctl --endpoints "http://$ep" get --prefix "/dcomm/$1/" --keys-only 2>/dev/null | grep -c . ; }

final() { grep -o 'final step=.*' "$1" | tail -1; }
# start_node NODE JOB NNODES OUT [sgd options] -> pid in $node_pid
start_node() {
  local node=$1 job=$2 nn=$3 out=$4; shift 4
  timeout -s KILL 120 in_ns_exec "$node" "$run" --rdzv-backend etcd --rdzv-endpoint "$ep" --rdzv-id "$job" \
    --nnodes "$nn" --nproc-per-node 2 -- "$sgd" --steps ${steps:-60} --checkpoint-every 5 --checkpoint-dir "$ckdir" \
    "$@" >"$out.out" 2>"$out.err" &
  node_pid=$!
  pids+=("$node_pid")
}
agent_of() { local a; a=$(pgrep -P "$1" | head -1); echo "${a:-$1}"; }
ok() { pass=$((pass + 1)); echo "ok $n - $*"; }
notok() {
  fail=$((fail + 1))
  echo "not ok $n - $1"
  shift
  for f in "$@"; do tail -n 15 "$f" | sed "s|^|    $(basename "$f"): |"; done
}
status() { in_ns 1 "$run" status --rdzv-backend etcd --rdzv-endpoint "$ep" "$@"; }

# ---- 1: a spare node above MAX; status; the finished job's keys go ----
# (Cases 1 and 2 want both nodes in the first world: the first round closes
# as soon as both joined, and a long settle window keeps it open for a node
# that a loaded machine started late, which would otherwise join later as
# a scale-up, one generation more.)
n=$((n + 1)); ckdir=$work/c1
DCOMM_ELASTIC_SETTLE=10 steps=100 start_node 1 jobS 1:2 "$work/1a" --sleep-ms 60; a=$node_pid
DCOMM_ELASTIC_SETTLE=10 steps=100 start_node 2 jobS 1:2 "$work/1b" --sleep-ms 60; b=$node_pid
for _ in $(seq 1 200); do grep -qs "step=10 " "$work/1a.out" "$work/1b.out" && break; sleep 0.05; done
steps=100 start_node 3 jobS 1:2 "$work/1c" --sleep-ms 60; c=$node_pid
sleep 2.5 # several checkpoints with the spare waiting
status --rdzv-id jobS >"$work/st.txt" 2>&1; rs=$?
status --rdzv-id jobS --json >"$work/st.json" 2>&1; rj=$?
wait $a; ra=$?; wait $b; rb=$?; wait $c; rc=$?
f=$(final "$work/1a.out")$(final "$work/1b.out")
js=$(jq -r '[.generation, .world_size, (.nodes|length), ([.nodes[].members[] | select(.in_world)] | length),
  ([.nodes[].members[] | select(.in_world | not)] | length), (.checkpoint.step > 0),
  ([.nodes[].members[] | select(.heartbeat_age != null and .heartbeat_age < 3)] | length)] | join(" ")' "$work/st.json" 2>/dev/null)
left=$(keys_of jobS)
if [ $ra$rb = 00 ] && echo "$f" | grep -q "world=4 generation=1 " &&
  ! grep -qE "recovered|scaled up" "$work/1a.out" "$work/1b.out" && ! grep -q "revoked" "$work/1a.err" "$work/1b.err" &&
  [ $rs = 0 ] && grep -q "generation 1, world size 4, 3 nodes (--nnodes 1:2)" "$work/st.txt" &&
  grep -q "last checkpoint: step" "$work/st.txt" && [ "$(grep -c '^  rank ' "$work/st.txt")" = 4 ] &&
  [ "$(grep -c '^  waiting ' "$work/st.txt")" = 2 ] && [ $rj = 0 ] && [ "$js" = "1 4 3 4 2 true 6" ] && [ "$left" = 0 ]; then
  ok "a spare third node (--nnodes 1:2) causes no recovery (world 4, generation 1); status shows 3 nodes, 4 ranks, 2 waiting, checkpoint, heartbeats; the finished job leaves no key (spare exit $rc)"
else
  notok "spare node / status / cleanup (exit $ra $rb $rc, status $rs $rj '$js', keys left $left; '$f')" \
    "$work/st.txt" "$work/st.json" "$work/1a.err" "$work/1b.err" "$work/1c.err"
fi

# ---- 2: an orderly stop (SIGTERM to an agent): the node left ----
n=$((n + 1)); ckdir=$work/c2
DCOMM_ELASTIC_SETTLE=10 start_node 1 jobT 1:2 "$work/2a" --sleep-ms 60; a=$node_pid
DCOMM_ELASTIC_SETTLE=10 start_node 2 jobT 1:2 "$work/2b" --sleep-ms 60; b=$node_pid
for _ in $(seq 1 200); do grep -qs "step=20 " "$work/2a.out" "$work/2b.out" && break; sleep 0.05; done
if grep -q "node slot 2 " "$work/2b.err"; then victim=$b survivor=$a s=2a v=2b; else victim=$a survivor=$b s=2b v=2a; fi
kill -TERM "$(agent_of $victim)"
wait $survivor; rs=$?; wait $victim; rv=$?
f=$(final "$work/$s.out")
if [ $rs = 0 ] && echo "$f" | grep -q "world=2 generation=2 " && grep -q "node slot 2 left the job (stopped by SIGTERM)" "$work/$s.err" &&
  ! grep -q "lost its etcd lease" "$work/$s.err" "$work/$s.out"; then
  ok "SIGTERM to an agent: the survivors log 'node slot 2 left the job (stopped by SIGTERM)' and finish with 2 (it exits $rv)"
else
  notok "orderly stop (exit $rs $rv; '$f')" "$work/$s.err" "$work/$v.err"
fi

# ---- 3: clean: refused while the lease lives, then removes a dead job ----
n=$((n + 1)); ckdir=$work/c3
start_node 1 jobK 1 "$work/3a" --sleep-ms 100; a=$node_pid
for _ in $(seq 1 200); do grep -qs "step=10 " "$work/3a.out" && break; sleep 0.05; done
ag=$(agent_of $a)
kill -9 "$ag" $(pgrep -P "$ag") 2>/dev/null
wait $a 2>/dev/null
before=$(keys_of jobK)
in_ns 1 "$run" clean --rdzv-backend etcd --rdzv-endpoint "$ep" --rdzv-id jobK >"$work/3c1.out" 2>"$work/3c1.err"; r1=$?
r2=1
for _ in $(seq 1 40); do
  sleep 0.25
  in_ns 1 "$run" clean --rdzv-backend etcd --rdzv-endpoint "$ep" --rdzv-id jobK >"$work/3c2.out" 2>"$work/3c2.err" && { r2=0; break; }
done
after=$(keys_of jobK)
status --rdzv-id jobK >"$work/3s.out" 2>"$work/3s.err"; r3=$?
if [ "$before" -gt 0 ] && [ $r1 = 1 ] && grep -q "still has 1 live node" "$work/3c1.err" && [ $r2 = 0 ] &&
  grep -qE "removed [0-9]+ keys of job 'jobK'" "$work/3c2.out" && [ "$after" = 0 ] && [ $r3 = 1 ] && grep -q "no job 'jobK'" "$work/3s.err"; then
  ok "clean: refused while the dead node's lease lives, then removes the keys ($before before the lease ended); status then finds no job"
else
  notok "clean (before $before after $after, exits $r1 $r2 $r3)" "$work/3c1.err" "$work/3c2.out" "$work/3c2.err" "$work/3s.err"
fi

# ---- 4: a round's timeout names the member that never joined ----
n=$((n + 1)); ckdir=$work/c4
cat >"$work/late.sh" <<EOS
#!/bin/sh
[ "\$LOCAL_RANK" = 1 ] && sleep 30
exec "$sgd" --steps 20 --checkpoint-every 5 --checkpoint-dir "$ckdir"
EOS
chmod +x "$work/late.sh"
DCOMM_TIMEOUT=4 timeout -s KILL 60 in_ns_exec 1 "$run" --rdzv-backend etcd --rdzv-endpoint "$ep" --rdzv-id jobL \
  --nproc-per-node 2 -- "$work/late.sh" >"$work/4.out" 2>"$work/4.err" &
a=$!; pids+=("$a")
for _ in $(seq 1 200); do grep -q "before the timeout" "$work/4.err" && break; sleep 0.1; done
kill -TERM "$(agent_of $a)" 2>/dev/null
wait $a 2>/dev/null
line=$(grep -o "round 1: only 1 of 2 members joined before the timeout.*" "$work/4.err" | head -1)
if echo "$line" | grep -qE "missing: member [0-9a-f-]{36} \(node slot 1, host [^,]+, pid [0-9]+\)"; then
  ok "a round's timeout names the missing member ('$line')"
else
  notok "missing member not named ('$line')" "$work/4.err"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
