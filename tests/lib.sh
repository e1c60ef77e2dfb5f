# tests/lib.sh: shell helpers shared by the launcher and scheduler test
# scripts (run_launcher.sh, pmix_mpirun.sh, slurm_cluster.sh, ...). Source
# it after setting T (the script's temp dir). It gives:
#   result STATUS NAME [WHY]   one TAP-style line; on failure the first
#                              lines of $T/out and $T/err are shown
#   finish                     "P passed, F failed"; exit status 0 iff none failed
#   stop_pid FILE|PID          TERM, then KILL after 10 s (a daemon we started)
#   free_port                  a loopback TCP port nobody listens on
#   final_line FILE, loss_of FILE, same_loss A B   elastic_sgd's result
#   install_scratch            make install of the build tree $b into $T/root:
#                              sets R, pc (its dcomm.pc), prefix, libdir and
#                              san (the build's sanitizer flags); 1 on failure
#                              ($T/install.log says why)
#   slurm_cluster_start DIR / slurm_cluster_stop DIR
#                              a private single-node SLURM cluster (munged,
#                              slurmctld, slurmd; SLURM_CONF=DIR/slurm.conf)
# Every daemon is stopped by its own pid (pid files), never by name.

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
      [ -s "$f" ] && sed "s/^/#   $(basename "$f"): /" "$f" | tail -n 40
    done
  fi
}

finish() {
  echo "$passed passed, $failed failed"
  [ "$failed" = 0 ]
  exit $?
}

install_scratch() {
  R=$T/root
  make -C "$b" install DESTDIR="$R" >"$T/install.log" 2>&1 || return 1
  pc=$(find "$R" -name dcomm.pc | head -1)
  [ -n "$pc" ] || { echo "make install put no dcomm.pc under $R" >>"$T/install.log"; return 1; }
  prefix=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --variable=prefix dcomm)
  libdir=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --variable=libdir dcomm)
  san=$(sed -n 's/^SAN_FLAGS = //p' "$b/Makefile")
}

stop_pid() { # stop_pid PID-FILE | PID
  local p=$1
  if [ -f "$p" ]; then p=$(cat "$p" 2>/dev/null); elif [ ! "${p##*/}" = "$p" ]; then return 0; fi
  case $p in '' | *[!0-9]*) return 0 ;; esac
  kill -TERM "$p" 2>/dev/null || return 0
  for _ in $(seq 1 50); do
    kill -0 "$p" 2>/dev/null || return 0
    sleep 0.2
  done
  kill -KILL "$p" 2>/dev/null
}

free_port() { # bash's /dev/tcp connect as the probe
  local p
  for _ in $(seq 1 50); do
    p=$((10000 + RANDOM % 10000))
    (echo >"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return 0; }
  done
  echo 16817
}

# elastic_sgd's rank 0 prints "final step=N world=W generation=G loss=L".
final_line() { grep -o 'final step=.*' "$1" 2>/dev/null | tail -n 1; }
loss_of() { final_line "$1" | sed -n 's/.*loss=//p'; }
same_loss() { # equal within 1e-9 relative (identical digits in practice)
  [ -n "$1" ] && [ -n "$2" ] &&
    awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; exit !(d <= 1e-9 * m) }'
}

# ---- a private SLURM cluster ----

slurm_last_error() { # the last error-looking line of the daemons' logs
  grep -hiE 'error|fatal' "$1"/ctld.log "$1"/slurmd.log "$1"/*.out "$1"/munge/*.log 2>/dev/null | tail -n 1
}

# slurm_cluster_start DIR: 0 when the node is idle; else 1 with the reason
# in $SLURM_WHY. Needs root; exports SLURM_CONF.
slurm_cluster_start() {
  local D=$1 key=/etc/munge/munge.key
  SLURM_WHY=
  if [ ! -e "$key" ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of="$key" bs=1024 count=1 status=none || { SLURM_WHY="cannot create $key"; return 1; }
    chown munge: "$key" 2>/dev/null
    chmod 400 "$key"
  fi
  mkdir -p "$D/munge" "$D/state" "$D/spool"
  chmod 755 "$D"
  chown munge: "$D/munge" 2>/dev/null
  chmod 700 "$D/munge"
  local msock=$D/munge/munge.socket.2
  if ! timeout 20 munged --force --socket="$msock" --pid-file="$D/munge/munged.pid" \
    --log-file="$D/munge/munged.log" --seed-file="$D/munge/munged.seed" --key-file="$key" >"$D/munge/start.out" 2>&1; then
    SLURM_WHY="munged does not start: $(slurm_last_error "$D")"
    return 1
  fi
  for _ in $(seq 1 50); do [ -S "$msock" ] && break; sleep 0.1; done
  [ -S "$msock" ] || { SLURM_WHY="munged made no socket at $msock"; return 1; }

  local host mem
  host=$(hostname)
  mem=$(awk '/^MemTotal:/ { m = int($2 / 1024 * 0.9); print (m < 20000 ? m : 20000) }' /proc/meminfo)
  export SLURM_CONF=$D/slurm.conf
  cat >"$SLURM_CONF" <<EOF
ClusterName=local
SlurmctldHost=$host
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$msock
CredType=cred/munge
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldLogFile=$D/ctld.log
SlurmdLogFile=$D/slurmd.log
JobAcctGatherType=jobacct_gather/none
NodeName=$host CPUs=$(nproc) RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
EOF
  timeout 30 slurmctld -i >"$D/ctld.out" 2>&1 || { SLURM_WHY="slurmctld does not start: $(slurm_last_error "$D")"; return 1; }
  for _ in $(seq 1 50); do [ -s "$D/slurmctld.pid" ] && break; sleep 0.2; done
  timeout 30 slurmd >"$D/slurmd.out" 2>&1 || { SLURM_WHY="slurmd does not start: $(slurm_last_error "$D")"; return 1; }
  local state= until_s=$((SECONDS + 60))
  while [ "$SECONDS" -lt "$until_s" ]; do
    state=$(timeout 5 sinfo -h -N -o %T 2>/dev/null | head -n 1)
    [ "$state" = idle ] && return 0
    sleep 1
  done
  SLURM_WHY="node $host is '${state:-not reported}' after 60 s: $(slurm_last_error "$D")"
  return 1
}

# slurm_cluster_stop DIR: cancels our cluster's jobs, stops its daemons.
slurm_cluster_stop() {
  local D=$1 j
  if [ -s "$D/slurmctld.pid" ]; then # jobs still there belong to our cluster only
    for j in $(timeout 10 squeue -h -o %i 2>/dev/null); do timeout 10 scancel "$j" 2>/dev/null; done
  fi
  stop_pid "$D/slurmd.pid"
  stop_pid "$D/slurmctld.pid"
  stop_pid "$D/munge/munged.pid"
}
