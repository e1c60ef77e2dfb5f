#!/bin/bash
# slurm_cluster.sh: pmix:// and slurm:// end to end on a private
# single-node SLURM cluster (the recipe of docs environment.md): munged
# with its own socket, slurmctld and slurmd with a slurm.conf in a temp
# dir (SLURM_CONF). Then 4 tasks of tests/pmix_coll (oversubscribed, -O):
#   (a) srun --mpi=pmix: pmix:// through SLURM's PMIx server;
#   (b) srun --mpi=none -K0, init method detected: slurm:// (no PMIx, no
#       MASTER_ADDR in the tasks), rank 0 hosts the store on the first node;
#   (c) srun --mpi=none with slurm:// and DCOMM_STORE_PORT.
#   (d) srun --mpi=none -K0 with examples/elastic_sgd in elastic mode, one
#       task SIGKILLed: the others shrink in place (no launcher: the round
#       closes after DCOMM_ELASTIC_SETTLE) and finish with the failure-free
#       loss;
#   (e) examples/slurm/dcomm-restart.sbatch under sbatch --wait (srun
#       --mpi=pmix; SLURM cancels the step when a task dies): the second
#       step resumes from rank 0's checkpoint and the job finishes right;
#   (f) examples/slurm/dcomm-shrink.sbatch with task 0, the store host,
#       killed: the in-step recovery cannot go on, the script reruns the
#       step, which resumes from the checkpoint and finishes right.
# Every daemon it starts is stopped by its own pid (pid files), never by
# name (tests/lib.sh), and the temp dir is removed, also on failure. Needs root.
# Environment: top_builddir (default .). Every step is bounded by timeout(1).
# Exit status: 0 pass, 1 fail, 77 skip (no SLURM / munge, not root, the
# daemons cannot start here).

B=${top_builddir:-.}
S=${top_srcdir:-.}
PROG=$B/tests/pmix_coll
SGD=$B/examples/elastic_sgd

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
. "${top_srcdir:-.}/tests/lib.sh"
trap 'slurm_cluster_stop "$T"; rm -rf "$T"' EXIT
trap 'exit 1' INT TERM HUP

# Nothing from an enclosing job or launcher may leak into ours.
while read -r v; do unset "$v"; done < <(compgen -e | grep -E '^(SLURM_|PMIX_|PMI_|OMPI_)')
unset DCOMM_INIT_METHOD DCOMM_STORE_PORT DCOMM_ELASTIC DCOMM_RESTART_COUNT MASTER_ADDR MASTER_PORT RANK WORLD_SIZE \
  LOCAL_RANK LOCAL_WORLD_SIZE
export DCOMM_TIMEOUT=60 DCOMM_CONNECT_TIMEOUT=30
export PMIX_MCA_psec=native PMIX_MCA_gds=hash

slurm_cluster_start "$T" || skip "$SLURM_WHY"

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
timeout 30 "$PROG" pmix:// >"$T/out" 2>"$T/pmix.err" </dev/null
if grep -q "built without PMIx" "$T/pmix.err"; then
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

# ---- recovery ----
if [ ! -x "$SGD" ]; then
  echo "# $SGD not built: (d) to (f) not run"
  finish
fi
SGD_ARGS=(--steps 40 --checkpoint-every 5)
ABS_SGD=$(cd "$(dirname "$SGD")" && pwd)/elastic_sgd # the batch job runs in $T
ABS_S=$(cd "$S" && pwd)
export DCOMM_ELASTIC_SETTLE=2

# (d) in-step shrink
timeout -k 5 120 srun --mpi=none -K0 -n 4 -O env DCOMM_ELASTIC=1 "$SGD" "${SGD_ARGS[@]}" --checkpoint-dir "$T/ck-ref" \
  >"$T/out" 2>"$T/err" </dev/null
rc=$?
REF=$(loss_of "$T/out")
if [ "$rc" = 0 ] && [ -n "$REF" ]; then
  result 0 "srun --mpi=none -K0 -n 4 elastic_sgd, failure-free (loss $REF)"
else
  result 1 "srun --mpi=none -K0 -n 4 elastic_sgd, failure-free" "exit $rc"
  finish
fi

name="srun --mpi=none -K0 -n 4: kill -9 of task 2, the others shrink in place"
timeout -k 5 120 srun --mpi=none -K0 -n 4 -O env DCOMM_ELASTIC=1 "$SGD" "${SGD_ARGS[@]}" --checkpoint-dir "$T/ck-d" \
  --kill-rank 2 --kill-at-step 13 >"$T/out" 2>"$T/err" </dev/null
rc=$?
f=$(final_line "$T/out")
if [ "$rc" = 124 ] || ! grep -q 'task 2: Killed' "$T/err"; then
  result 1 "$name" "srun exit $rc, task 2 not reported killed"
elif ! echo "$f" | grep -q 'step=40 world=3 generation=1 '; then
  result 1 "$name" "final line '$f'"
elif ! same_loss "$(loss_of "$T/out")" "$REF"; then
  result 1 "$name" "loss $(loss_of "$T/out") != $REF"
else
  result 0 "$name ($(grep -o 'recovered: [^(]*' "$T/out"))"
fi

# sbatch_recipe NAME SCRIPT KILL-RANK: the recipe under sbatch --wait; the
# second attempt must read a checkpoint and finish with the reference loss.
sbatch_recipe() {
  local name=$1 script=$2 kill=$3 f
  rm -f "$T/job.out" "$T/done"
  DONE_FILE=$T/done DCOMM_LOG_LEVEL=info DCOMM_LOG_SUBSYS=elastic timeout -k 5 150 sbatch --wait -N 1 -n 4 -O -D "$T" -o "$T/job.out" \
    "$ABS_S/examples/slurm/$script" "$ABS_SGD" "${SGD_ARGS[@]}" --checkpoint-dir "$T/ck-$script" --kill-rank "$kill" \
    --kill-at-step 13 --done-file '{done}' >"$T/err" 2>&1 </dev/null
  rc=$?
  cp "$T/job.out" "$T/out" 2>/dev/null
  f=$(final_line "$T/out")
  # What the second attempt printed: it must have resumed from step 9's checkpoint.
  local second
  second=$(sed -n '/attempt 2:/,$p' "$T/out")
  if [ "$rc" != 0 ]; then
    result 1 "$name" "sbatch --wait exited $rc"
  elif ! grep -q 'finished after 2 attempt' "$T/out"; then
    result 1 "$name" "not finished by the second attempt"
  elif ! echo "$second" | grep -q 'checkpoint: read step 9 '; then
    result 1 "$name" "the second attempt did not resume from the checkpoint of step 9"
  elif echo "$second" | grep -q '^step=0 '; then
    result 1 "$name" "the second attempt started over at step 0"
  elif ! echo "$f" | grep -q 'step=40 world=4 '; then
    result 1 "$name" "final line '$f'"
  elif ! same_loss "$(loss_of "$T/out")" "$REF"; then
    result 1 "$name" "loss $(loss_of "$T/out") != $REF"
  else
    result 0 "$name"
  fi
}

# (e) restart-based recovery under srun --mpi=pmix
if timeout 20 srun --mpi=list 2>&1 | grep -q pmix && ! grep -q "built without PMIx" "$T/pmix.err" 2>/dev/null; then
  sbatch_recipe "sbatch dcomm-restart.sbatch: task 1 killed, the step reruns and resumes from the checkpoint" \
    dcomm-restart.sbatch 1
else
  echo "# no PMIx: (e) not run"
fi

# (f) the store host dies: the shrink recipe falls back to a restart
sbatch_recipe "sbatch dcomm-shrink.sbatch: task 0 (the store host) killed, the step reruns and resumes" \
  dcomm-shrink.sbatch 0

finish
