#!/usr/bin/env bash
# tests/checkpoint_disk.sh: a checkpoint directory that stops taking
# checkpoints during a job. The elastic demo (3 workers under dcomm-run,
# a checkpoint every 5 steps) writes to a small tmpfs mounted in a private
# mount namespace; once the checkpoint of step 9 is in, the test fills the
# file system, remounts it read-only, or removes the directory. Asserted:
#   - DCOMM_CHECKPOINT_ON_ERROR=stop (the default): the job ends with an
#     error naming the directory and the cause, leaves no temp file, and a
#     new run on the same directory (once it has room) restores a committed
#     checkpoint and ends with the failure-free loss;
#   - skip: the job warns, trains on and ends with the failure-free loss;
#     checkpoints resume when the directory has room again; a worker killed
#     while the disk is full is recovered from the last committed one;
#   - a removed directory is created again by the next checkpoint;
#   - a bad DCOMM_CHECKPOINT_ON_ERROR is refused by name.
# Needs root for the mount namespace (skipped, 77, without it).
set -u
b=${top_builddir:-.}
run=$b/dcomm-run
sgd=$b/examples/elastic_sgd
[ -x "$run" ] && [ -x "$sgd" ] || { echo "skip: dcomm-run or elastic_sgd not built"; exit 77; }
if [ -z "${DCOMM_CKPT_DISK_NS:-}" ]; then
  unshare -m --propagation private true 2>/dev/null || { echo "skip: no mount namespace here (needs root)"; exit 77; }
  DCOMM_CKPT_DISK_NS=1 exec unshare -m --propagation private "$BASH" "$0" "$@"
fi
T=$(mktemp -d /tmp/dcomm-ckdisk.XXXXXX) || exit 1
job=
cleanup() {
  [ -n "$job" ] && kill -KILL "$job" 2>/dev/null
  umount "$T/fs" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
. "${top_srcdir:-.}/tests/lib.sh"
export DCOMM_TIMEOUT=30 DCOMM_HEARTBEAT_TIMEOUT=2
unset DCOMM_CHECKPOINT_ON_ERROR
steps=60

# start DIR [elastic_sgd options]: the job in the background ($job); its
# output in $T/out and $T/err.
start() {
  local dir=$1; shift
  timeout -k 5 90 "$run" --nproc-per-node 3 -- "$sgd" --steps $steps --checkpoint-every 5 --checkpoint-dir "$dir" \
    --sleep-ms 40 "$@" >"$T/out" 2>"$T/err" </dev/null &
  job=$!
}
finish_job() { wait "$job"; local rc=$?; job=; return $rc; }
# Waits (10 s at most) until DIR holds the checkpoint of step 9.
wait_ckpt9() {
  for _ in $(seq 200); do
    ls "$1" 2>/dev/null | grep -q '^ckpt-0*9-g' && return 0
    sleep 0.05
  done
  return 1
}
fresh_fs() { # a new 256 KiB tmpfs at $T/fs
  umount "$T/fs" 2>/dev/null
  mkdir -p "$T/fs" && mount -t tmpfs -o size=256k tmpfs "$T/fs"
}
fill() { dd if=/dev/zero of="$T/fs/fill" bs=4k >/dev/null 2>&1; }
loss() { loss_of "$T/out"; }

# Reference: no fault.
start "$T/ref"
finish_job
ref=$(loss)
[ -n "$ref" ] || { result 1 "failure-free reference run" "no final line"; finish; }

# case_stop NAME BREAK CAUSE REPAIR: the default policy.
case_stop() {
  local name=$1 brk=$2 cause=$3 repair=$4 why=
  fresh_fs || { result 1 "$name" "cannot mount a tmpfs"; return; }
  start "$T/fs"
  wait_ckpt9 "$T/fs" || why="no checkpoint of step 9 after 10 s"
  $brk
  finish_job && why="${why:-the job exited 0}"
  [ -z "$why" ] && ! grep -q "$cause" "$T/err" && why="no '$cause' in the job's output"
  [ -z "$why" ] && ! grep -q "$T/fs" "$T/err" && why="the error does not name the directory"
  [ -z "$why" ] && ! grep -q "DCOMM_CHECKPOINT_ON_ERROR=skip" "$T/err" && why="the error does not name the policy"
  $repair
  [ -z "$why" ] && ls -a "$T/fs" | grep -q '\.tmp\.' && why="a temp file was left: $(ls -a "$T/fs" | tr '\n' ' ')"
  local failed_err; failed_err=$(grep -m1 "$cause" "$T/err")
  # The checkpoints committed before are restored by the next run.
  if [ -z "$why" ]; then
    start "$T/fs"
    finish_job || why="the run after the repair failed"
    local from; from=$(sed -n 's/.*restored the checkpoint of step \([0-9]*\) .*/\1/p' "$T/err" | head -1)
    [ -z "$why" ] && { [ -n "$from" ] && [ "$from" -ge 9 ]; } || why="${why:-the next run restored no checkpoint of step >= 9}"
    [ -z "$why" ] && ! same_loss "$(loss)" "$ref" && why="loss $(loss) after the restore, $ref without a fault"
  fi
  result "$([ -z "$why" ]; echo $?)" "$name: the job stops naming it; the next run restores step ${from:-?} (same loss)" "$why"
  [ -n "$why" ] || echo "#   $(echo "$failed_err" | cut -c1-240)"
}
unfill() { rm -f "$T/fs/fill"; }
make_ro() { mount -o remount,ro "$T/fs"; }
make_rw() { mount -o remount,rw "$T/fs"; }
case_stop "checkpoint directory full" fill "No space left on device" unfill
case_stop "checkpoint directory read-only" make_ro "Read-only file system" make_rw

# skip: the disk fills at step ~10 and has room again 0.6 s later.
why=
fresh_fs
DCOMM_CHECKPOINT_ON_ERROR=skip start "$T/fs"
wait_ckpt9 "$T/fs" || why="no checkpoint of step 9 after 10 s"
fill
for _ in $(seq 100); do grep -q "training goes on without it" "$T/err" && break; sleep 0.05; done
sleep 0.3
unfill
finish_job || why="${why:-the job failed}"
[ -z "$why" ] && ! grep -q "No space left on device.*training goes on without it" "$T/err" && why="no warning for a skipped checkpoint"
[ -z "$why" ] && ! grep -q "checkpoints to $T/fs work again" "$T/err" && why="no word that checkpoints work again"
[ -z "$why" ] && ! same_loss "$(loss)" "$ref" && why="loss $(loss), $ref without a fault"
[ -z "$why" ] && ! ls "$T/fs" | grep -q "^ckpt-0*$((steps - 1))-g" && why="no checkpoint of the last step: $(ls "$T/fs" | tr '\n' ' ')"
result "$([ -z "$why" ]; echo $?)" "DCOMM_CHECKPOINT_ON_ERROR=skip, directory full for a while: warned $(grep -c 'training goes on without it' "$T/err") times, trained on, checkpoints resumed, same loss" "$why"

# skip, and a worker dies while the disk is full: recovery goes back to
# the last committed checkpoint (step 9).
why=
fresh_fs
DCOMM_CHECKPOINT_ON_ERROR=skip start "$T/fs" --kill-rank 2 --kill-at-step 22
wait_ckpt9 "$T/fs" || why="no checkpoint of step 9 after 10 s"
fill
finish_job || why="${why:-the job failed}"
from=$(sed -n 's/.*restored the checkpoint of step \([0-9]*\) .*/\1/p' "$T/err" | head -1)
[ -z "$why" ] && [ "$from" != 9 ] && why="recovery restored step '${from}', not the last committed 9"
[ -z "$why" ] && ! grep -q "final step=$steps world=2 " "$T/out" && why="expected to end on 2 workers: $(final_line "$T/out")"
[ -z "$why" ] && ! same_loss "$(loss)" "$ref" && why="loss $(loss), $ref without a fault"
result "$([ -z "$why" ]; echo $?)" "skip, a worker killed while the directory is full: recovered from step ${from:-?}, same loss" "$why"

# The directory is removed during the job: the next checkpoint creates it.
why=
start "$T/gone"
wait_ckpt9 "$T/gone" || why="no checkpoint of step 9 after 10 s"
rm -rf "$T/gone"
finish_job || why="${why:-the job failed}"
[ -z "$why" ] && ! ls "$T/gone" 2>/dev/null | grep -q "^ckpt-0*$((steps - 1))-g" && why="no checkpoint of the last step in the recreated directory"
[ -z "$why" ] && ! same_loss "$(loss)" "$ref" && why="loss $(loss), $ref without a fault"
result "$([ -z "$why" ]; echo $?)" "checkpoint directory removed during the job: created again, the last step committed, same loss" "$why"

# A policy that does not exist is refused before any step.
why=
DCOMM_CHECKPOINT_ON_ERROR=maybe timeout 60 "$run" --nproc-per-node 2 -- "$sgd" --steps 5 --checkpoint-every 5 \
  --checkpoint-dir "$T/bad" >"$T/out" 2>"$T/err" </dev/null && why="the job exited 0"
[ -z "$why" ] && ! grep -q "DCOMM_CHECKPOINT_ON_ERROR='maybe' is not stop or skip" "$T/err" && why="no message naming the variable"
result "$([ -z "$why" ]; echo $?)" "DCOMM_CHECKPOINT_ON_ERROR=maybe is refused by name" "$why"
finish
