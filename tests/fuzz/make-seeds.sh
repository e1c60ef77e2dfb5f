#!/usr/bin/env bash
# tests/fuzz/make-seeds.sh: rebuilds the seed corpora under
# tests/fuzz/corpus/<target> from real traffic: a 2-rank elastic_sgd job
# whose rank 1 reaches rank 0's store through a recording proxy (store
# requests and answers, handshakes), a dcomm-run job over etcd through the
# proxy (etcd's HTTP answers, watch streams), the checkpoints that job
# writes, and hand-written values for the parsers of names and arguments
# (hostlists, init URLs and environments, dcomm-run command lines). The
# node records (launcher records, tickets, plans, worker lists, ckpt/last)
# are the values the dcomm-run job wrote to etcd; the tcp peer seeds come
# from fuzz_tcp_peer's own recorder (both ranks real, rank 1's link
# recorded), so they need a fuzzing build: FUZZ_BUILD=DIR (else the
# committed tcp_peer seeds are kept).
#   bash tests/fuzz/make-seeds.sh [BUILD_DIR]     (default ./build; needs etcd)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
B=$(cd "${1:-build}" && pwd)
top=$(cd "$here/../.." && pwd)
. "$top/tests/lib.sh"
T=$(mktemp -d "${TMPDIR:-/tmp}/dcomm-seeds.XXXXXX")
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$T"; }
trap cleanup EXIT
C=$here/corpus
[ -n "${FUZZ_BUILD:-}" ] || cp -r "$C/tcp_peer" "$T/tcp_peer-kept"
rm -rf "$C"
mkdir -p "$C"/{hostlist,init_method,checkpoint,store_server,store_client,etcd_client,run_args,tcp_peer,node_records}
if [ -n "${FUZZ_BUILD:-}" ]; then
  DCOMM_FUZZ_TCP_RECORD="$C/tcp_peer" "$FUZZ_BUILD/tests/fuzz/fuzz_tcp_peer" -runs=0 >/dev/null
else
  cp "$T/tcp_peer-kept"/* "$C/tcp_peer/"
fi
unset DCOMM_INIT_METHOD DCOMM_STORE_PORT DCOMM_USE_AGENT_STORE
export DCOMM_TIMEOUT=30 DCOMM_CONNECT_TIMEOUT=20

# --- store traffic: rank 1 talks to rank 0's store through the proxy
sport=$(free_port); pport=$(free_port)
python3 "$here/record_proxy.py" "$pport" "$sport" "$T/store" & pids+=($!)
sleep 0.5
for r in 0 1; do
  port=$sport; [ $r = 1 ] && port=$pport
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    DCOMM_ELASTIC=1 DCOMM_JOB_ID=seeds DCOMM_AUTH_TOKEN=seed-token \
    "$B/examples/elastic_sgd" --steps 30 --checkpoint-every 10 --checkpoint-dir "$T/ckpt" >"$T/sgd$r.out" 2>&1 &
  pids+=($!)
done
wait "${pids[-1]}" "${pids[-2]}"

# --- etcd traffic: a dcomm-run job over etcd, through the proxy
eport=$(free_port); epeer=$(free_port); xport=$(free_port)
etcd --name s0 --data-dir "$T/etcd" --listen-client-urls "http://127.0.0.1:$eport" \
  --advertise-client-urls "http://127.0.0.1:$eport" --listen-peer-urls "http://127.0.0.1:$epeer" \
  --initial-advertise-peer-urls "http://127.0.0.1:$epeer" --initial-cluster "s0=http://127.0.0.1:$epeer" \
  >"$T/etcd.log" 2>&1 & pids+=($!)
for _ in $(seq 50); do curl -s "http://127.0.0.1:$eport/health" | grep -q true && break; sleep 0.2; done
python3 "$here/record_proxy.py" "$xport" "$eport" "$T/etcd-rec" & pids+=($!)
sleep 0.5
timeout 120 "$B/dcomm-run" --rdzv-backend etcd --rdzv-endpoint "127.0.0.1:$xport" --rdzv-id seeds \
  --nproc-per-node 2 -- "$B/examples/elastic_sgd" --steps 20 --checkpoint-every 10 \
  --checkpoint-dir "$T/ckpt2" >"$T/run.out" 2>&1

python3 - "$T" "$C" <<'PY'
import glob, os, struct, sys
T, C = sys.argv[1], sys.argv[2]
def put(target, name, data):
    with open(os.path.join(C, target, name), "wb") as f:
        f.write(data[:65536])
n = 0
for c2s in sorted(glob.glob(T + "/store/*.c2s")):
    a, b = open(c2s, "rb").read(), open(c2s[:-4] + ".s2c", "rb").read()
    if len(a) < 16 or len(b) < 32:
        continue
    magic, ver, purpose, jl, hl = struct.unpack(">IIIHH", a[:16])
    if purpose != 1:
        continue  # a peer link, not a store client
    reqs = a[16 + jl + hl + 32:]
    ml = struct.unpack(">H", b[24 + 4:24 + 6])[0]
    answers = b[24 + 8 + ml:]
    tag = os.path.basename(c2s)[:-4]
    put("store_server", tag + "-raw", b"\x01" + a[:4096])
    put("store_client", tag + "-raw", b"\x01" + b[:4096])
    if reqs:
        put("store_server", tag, b"\x00" + reqs)
    if answers:
        put("store_client", tag, b"\x00" + answers)
    n += 1
ops = {"/v3/kv/range": [0, 1], "/v3/kv/put": [2], "/v3/kv/deleterange": [3], "/v3/kv/txn": [4, 5, 6, 7],
       "/v3/lease/grant": [8], "/v3/lease/keepalive": [9], "/v3/lease/revoke": [10], "/v3/watch": [11],
       "/v3/auth/authenticate": [12]}
def http_split(data, request):
    """Splits a recorded HTTP/1.1 stream into messages (a chunked body
    that never ends, a watch stream, is the rest of the stream)."""
    out = []
    while data:
        head_end = data.find(b"\r\n\r\n")
        if head_end < 0:
            out.append(data)
            break
        head = data[:head_end].decode("latin-1").lower()
        pos = head_end + 4
        if "transfer-encoding: chunked" in head:
            while True:
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    pos = len(data)
                    break
                size = int(data[pos:eol].split(b";")[0] or b"0", 16)
                pos = eol + 2 + size + 2
                if size == 0 or pos >= len(data):
                    pos = min(pos, len(data))
                    break
        else:
            for line in head.split("\r\n"):
                if line.startswith("content-length:"):
                    pos += int(line.split(":", 1)[1])
        out.append(data[:pos])
        data = data[pos:]
    return out
seen = {}
for c2s in sorted(glob.glob(T + "/etcd-rec/*.c2s")):
    reqs = http_split(open(c2s, "rb").read(), True)
    resps = http_split(open(c2s[:-4] + ".s2c", "rb").read(), False)
    for req, resp in zip(reqs, resps):
        path = req.split(b"\r\n", 1)[0].split(b" ")[1].decode()
        for op in ops.get(path, []):
            k = seen.get(op, 0)
            if k < 4:  # a few answers of each kind
                put("etcd_client", "op%02d-%d" % (op, k), bytes([op]) + resp)
                seen[op] = k + 1
# the values dcomm-run and the rounds put into etcd (put and txn bodies)
import base64, json, re
def kvs(obj):
    if isinstance(obj, dict):
        if "key" in obj and "value" in obj:
            yield base64.b64decode(obj["key"]), base64.b64decode(obj["value"])
        for v in obj.values():
            yield from kvs(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from kvs(v)
kinds = [(rb"rdzv/agent/\d+$", 0, "agent"), (rb"elastic/join/\d+/m/\d+$", 1, "ticket"),
         (rb"elastic/plan/\d+$", 2, "plan"), (rb"rdzv/workers/\d+$", 3, "workers"), (rb"ckpt/last$", 4, "ckpt-last")]
got = {}
for c2s in sorted(glob.glob(T + "/etcd-rec/*.c2s")):
    for req in http_split(open(c2s, "rb").read(), True):
        body = req[req.find(b"\r\n\r\n") + 4:]
        try:
            pairs = list(kvs(json.loads(body)))
        except ValueError:
            continue
        for k, v in pairs:
            for pat, mode, tag in kinds:
                if re.search(pat, k) and v not in got.setdefault(tag, []) and len(got[tag]) < 6:
                    got[tag].append(v)
                    if mode == 2:  # a member of the plan, then one that is not
                        ids = v.split(b"\n")
                        me = ids[1] if len(ids) > 2 else b"nobody"
                        put("node_records", "%s-%d" % (tag, len(got[tag])), bytes([mode]) + me + b"\0" + v)
                        put("node_records", "%s-%d-out" % (tag, len(got[tag])), bytes([mode]) + b"x\0" + v)
                    else:
                        put("node_records", "%s-%d" % (tag, len(got[tag])), bytes([mode]) + v)
print("node records: %s" % {k: len(v) for k, v in got.items()})
for d in (T + "/ckpt", T + "/ckpt2"):
    for f in sorted(glob.glob(d + "/ckpt-*.dcp"))[:3]:
        put("checkpoint", "file-" + os.path.basename(f), b"\x00" + open(f, "rb").read())
    if os.path.exists(d + "/COMMITTED"):
        text = open(d + "/COMMITTED", "rb").read()
        put("checkpoint", "list-" + os.path.basename(d), b"\x01" + text)
        put("checkpoint", "rec-" + os.path.basename(d), b"\x02" + text.split(b"\n")[1])
print("store connections recorded: %d; etcd answers by op: %s" % (n, dict(sorted(seen.items()))))
PY

# --- hand-written values
i=0
while IFS= read -r h; do printf '%s' "$h" >"$C/hostlist/h$((i++))"; done <<'V'
node[01-04,07],gpu3
a[1-3]b
rack[1-2]-n[01-02]
node[08-10]
n1 n2	n3
host
x[0-65535]
V
i=0
while IFS= read -r u; do printf '%b' "$u" >"$C/init_method/u$((i++))"; done <<'V'
env://\0127.0.0.1\029500\01\04\01\02
tcp://127.0.0.1:29500?rank=1&world_size=4
tcp://[::1]:29500?rank=0&world_size=1
file:///tmp/dcomm-store?rank=0&world_size=2
etcd://127.0.0.1:2379,127.0.0.1:22379?rank=0&world_size=2
etcd://https://[::1]:2379
slurm://\0\0\0\0\0\0\03\08\01\01\0node[01-04]\0node[01-04]\02(x4)\02(x4)\01234\00\0node01\029400
pmix://
\0node1\012345\00\02\00\02
V
i=0
while IFS= read -r a; do printf '%b' "$a" >"$C/run_args/a$((i++))"; done <<'V'
--nproc-per-node\04\0--\0./prog\0--flag
--nproc-per-node=2\0--restart-policy\0replace\0--max-restarts=5\0prog
--rdzv-backend\0etcd\0--rdzv-endpoint\0127.0.0.1:2379,h2:2379\0--rdzv-id\0job\0--nnodes\02:4\0--nproc-per-node\02\0prog
--nproc-per-node\01\0--rdzv-endpoint\0[::1]:29500\0--bind-to\0core\0--quiet-prefix\0prog
--help
V
for d in "$C"/*; do echo "$(basename "$d"): $(ls "$d" | wc -l) seeds"; done
