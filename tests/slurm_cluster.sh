#!/bin/bash
# slurm_cluster.sh: pmix:// and slurm:// end to end on a private
# single-node SLURM cluster (the recipe of docs environment.md): munged
# with its own socket, slurmctld and slurmd with a slurm.conf in a temp
# dir (SLURM_CONF). Then 4 tasks of tests/pmix_coll (oversubscribed, -O):
#   (a) srun --mpi=pmix: pmix:// through SLURM's PMIx server;
#   (b) srun --mpi=none -K0, init method detected: slurm:// (no PMIx, no
#       MASTER_ADDR in the tasks), rank 0 hosts the store on the first node;
#   (c) srun --mpi=none with slurm:// and DCOMM_STORE_PORT.
# Every daemon it starts is stopped by its own pid (pid files), never by
# name, and the temp dir is removed, also on failure. Needs root.
# Environment: top_builddir (default .). Every step is bounded by timeout(1).
# Exit status: 0 pass, 1 fail, 77 skip (no SLURM / munge, not root, the
# daemons cannot start here).

B=${top_builddir:-.}
PROG=$B/tests/pmix_coll

skip() {
  echo "slurm_cluster: $*; skipping"
  exit 77
}

for c in slurmctld slurmd srun sinfo scancel squeue munged timeout; do
  command -v "$c" >/dev/null 2>&1 || skip "$c not found (apt-get install slurm-wlm munge)"
done
[ "$(id -u)" = 0 ] || skip "slurmd must run as root"
[ -x "$PROG" ] || skip "$PROG not built (make check builds it)"

T=$(mktemp -d "${TMPDIR:-/tmp}/slurm_cluster.XXXXXX") || exit 1
chmod 755 "$T"

stop_pid_file() { # stop_pid_file FILE: TERM, then KILL after 10 s
  local f=$1 p
  [ -f "$f" ] || return 0
  p=$(cat "$f" 2>/dev/null)
  case $p in '' | *[!0-9]*) return 0 ;; esac
  kill -TERM "$p" 2>/dev/null || return 0
  for _ in $(seq 1 50); do
    kill -0 "$p" 2>/dev/null || return 0
    sleep 0.2
  done
  kill -KILL "$p" 2>/dev/null
}

cleanup() {
  if [ -f "$T/slurmctld.pid" ]; then # steps still running belong to our cluster only
    for j in $(timeout 10 squeue -h -o %i 2>/dev/null); do timeout 10 scancel "$j" 2>/dev/null; done
  fi
  stop_pid_file "$T/slurmd.pid"
  stop_pid_file "$T/slurmctld.pid"
  stop_pid_file "$T/munge/munged.pid"
  rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# Nothing from an enclosing job or launcher may leak into ours.
while read -r v; do unset "$v"; done < <(compgen -e | grep -E '^(SLURM_|PMIX_|PMI_|OMPI_)')
unset DCOMM_INIT_METHOD DCOMM_STORE_PORT MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
export DCOMM_TIMEOUT=60 DCOMM_CONNECT_TIMEOUT=30
export PMIX_MCA_psec=native PMIX_MCA_gds=hash

# A TCP port nobody listens on (bash's /dev/tcp connect as the probe).
free_port() {
  local p
  for _ in $(seq 1 50); do
    p=$((10000 + RANDOM % 10000))
    (echo >"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return 0; }
  done
  echo 16817
}

# ---- munge ----
KEY=/etc/munge/munge.key
if [ ! -e "$KEY" ]; then
  mkdir -p /etc/munge
  dd if=/dev/urandom of="$KEY" bs=1024 count=1 status=none || skip "cannot create $KEY"
  chown munge: "$KEY" 2>/dev/null
  chmod 400 "$KEY"
fi
mkdir -p "$T/munge"
chown munge: "$T/munge" 2>/dev/null
chmod 700 "$T/munge"
MSOCK=$T/munge/munge.socket.2
timeout 20 munged --force --socket="$MSOCK" --pid-file="$T/munge/munged.pid" --log-file="$T/munge/munged.log" \
  --seed-file="$T/munge/munged.seed" --key-file="$KEY" >"$T/munge/start.out" 2>&1 ||
  skip "munged does not start: $(tail -n 1 "$T/munge/start.out" "$T/munge/munged.log" 2>/dev/null | grep -v '^==>' | grep . | tail -n 1)"
for _ in $(seq 1 50); do [ -S "$MSOCK" ] && break; sleep 0.1; done
[ -S "$MSOCK" ] || skip "munged made no socket at $MSOCK"

# ---- slurm ----
HOST=$(hostname)
MEM=$(awk '/^MemTotal:/ { m = int($2 / 1024 * 0.9); print (m < 20000 ? m : 20000) }' /proc/meminfo)
CPUS=$(nproc)
mkdir -p "$T/state" "$T/spool"
export SLURM_CONF=$T/slurm.conf
cat >"$SLURM_CONF" <<EOF
ClusterName=local
SlurmctldHost=$HOST
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MSOCK
CredType=cred/munge
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldLogFile=$T/ctld.log
SlurmdLogFile=$T/slurmd.log
JobAcctGatherType=jobacct_gather/none
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
EOF

last_log_line() { # the last error-looking line of the daemons' logs
  grep -hiE 'error|fatal' "$T/ctld.log" "$T/slurmd.log" "$T"/*.out 2>/dev/null | tail -n 1
}

timeout 30 slurmctld -i >"$T/ctld.out" 2>&1 || skip "slurmctld does not start: $(last_log_line)"
for _ in $(seq 1 50); do [ -s "$T/slurmctld.pid" ] && break; sleep 0.2; done
timeout 30 slurmd >"$T/slurmd.out" 2>&1 || skip "slurmd does not start: $(last_log_line)"

state=
until_s=$((SECONDS + 60))
while [ "$SECONDS" -lt "$until_s" ]; do
  state=$(timeout 5 sinfo -h -N -o %T 2>/dev/null | head -n 1)
  [ "$state" = idle ] && break
  sleep 1
done
[ "$state" = idle ] || skip "node $HOST is '${state:-not reported}' after 60 s: $(last_log_line)"

passed=0
failed=0
n=0

result() { # result STATUS NAME [why]
  n=$((n + 1))
  if [ "$1" = 0 ]; then
    echo "ok $n - $2"
    passed=$((passed + 1))
  else
    echo "not ok $n - $2${3:+ ($3)}"
    failed=$((failed + 1))
    for f in "$T/out" "$T/err"; do
      [ -s "$f" ] && sed "s/^/#   $(basename "$f"): /" "$f" | head -40
    done
  fi
}

# expect_ok NTASKS NAME SRUN-ARGS... -- PROG-ARGS...: NTASKS "ok" lines, exit 0.
expect_ok() {
  local np=$1 name=$2 oks
  shift 2
  local sargs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do sargs+=("$1"); shift; done
  [ "$1" = -- ] && shift
  timeout -k 5 120 srun "${sargs[@]}" -n "$np" -O "$PROG" "$@" >"$T/out" 2>"$T/err" </dev/null
  rc=$?
  oks=$(grep -c '^rank [0-9]* ok$' "$T/out")
  if [ "$rc" = 0 ] && [ "$oks" = "$np" ]; then
    result 0 "$name"
  else
    result 1 "$name" "exit $rc, $oks of $np tasks ok"
  fi
}

# (a) PMIx through slurmstepd
timeout 30 "$PROG" pmix:// >"$T/out" 2>"$T/err" </dev/null
if grep -q "built without PMIx" "$T/err"; then
  echo "# dcomm was built without PMIx: (a) not run"
elif timeout 20 srun --mpi=list 2>&1 | grep -q pmix; then
  expect_ok 4 "srun --mpi=pmix -n 4: pmix://" --mpi=pmix -- pmix://
  expect_ok 2 "srun --mpi=pmix -n 2: init / finalize twice in one process" --mpi=pmix -- pmix:// 2
else
  echo "# srun has no pmix plugin: (a) not run"
fi

# (b) detection picks slurm://: the tasks see no PMIx and no MASTER_ADDR.
timeout 60 srun --mpi=none -n 1 env >"$T/env" 2>&1
if grep -qE '^(PMIX_NAMESPACE|PMIX_SERVER_URI|MASTER_ADDR)' "$T/env"; then
  result 1 "srun --mpi=none tasks have no PMIx server" "$(grep -E '^(PMIX_NAMESPACE|MASTER_ADDR)' "$T/env" | head -n 1)"
else
  expect_ok 4 "srun --mpi=none -n 4 -K0: detected slurm://" --mpi=none -K0 -- auto
fi

# (c) explicit slurm:// on a chosen port
DCOMM_STORE_PORT=$(free_port) expect_ok 3 "srun --mpi=none -n 3: slurm:// with DCOMM_STORE_PORT" --mpi=none -K0 -- slurm://

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
