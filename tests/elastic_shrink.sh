#!/usr/bin/env bash
# tests/elastic_shrink.sh: the shrink path of recovery, with real processes
# under dcomm-run and real SIGKILLs (examples/elastic_sgd, 4 ranks, tcp
# backend). A recovery that only loses members shrinks in place: every
# survivor's INFO line says "shrunk in place"; the parity sub-group that
# lost a member says "shrunk group", the one that lost none "rebuilt
# group ... (0 lost)". elastic_sgd checks the world all_reduce (the batch
# is covered) and the parity all_reduce (its sum equals the shares of the
# members the group says it has) at every step, and the final loss must
# equal the failure-free run's. A plan with a joiner (replace policy) takes
# the full rebuild; DCOMM_ELASTIC_SHRINK=0 never tries; parity groups made
# with dcomm_new_group_named (--named-parity) shrink and rebuild the same;
# a shrink that fails (DCOMM_TCP_SHRINK=0: not supported; fail:group: a
# sub-group fails after the world shrank) falls back to the rebuild on
# every survivor.
set -u
b=${top_builddir:-.}
run=$b/dcomm-run
sgd=$b/examples/elastic_sgd
[ -x "$run" ] && [ -x "$sgd" ] || { echo "skip: dcomm-run or elastic_sgd not built"; exit 77; }
T=$(mktemp -d /tmp/dcomm-shrink.XXXXXX)
trap 'rm -rf "$T"' EXIT
. "${top_srcdir:-.}/tests/lib.sh"
export DCOMM_TIMEOUT=60 DCOMM_HEARTBEAT_TIMEOUT=2 DCOMM_LOG_LEVEL=info DCOMM_LOG_SUBSYS=elastic,group
steps=60

timeout 120 "$run" --nproc-per-node 4 -- "$sgd" --steps $steps --checkpoint-every 5 --checkpoint-dir "$T/ref" \
  >"$T/out" 2>"$T/err"
ref=$(loss_of "$T/out")
[ -n "$ref" ] || { result 1 "failure-free reference run"; finish; }

# sgd NAME [VAR=VALUE...] -- [dcomm-run options] -- [elastic_sgd options]: runs
# the job into $T/out, $T/err; sets $why to "" when it ended well with
# world $world and generation $gen (set by the caller).
sgd() {
  local envs=() ropts=() dir=$T/ckpt$n
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  while [ "$1" != -- ]; do ropts+=("$1"); shift; done
  shift
  why=""
  env ${envs[@]+"${envs[@]}"} timeout 150 "$run" --nproc-per-node 4 ${ropts[@]+"${ropts[@]}"} -- "$sgd" \
    --steps $steps --checkpoint-every 5 --checkpoint-dir "$dir" "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  [ $rc -eq 0 ] || why="dcomm-run exited $rc"
  [ -z "$why" ] && ! final_line "$T/out" | grep -q "world=$world generation=$gen " &&
    why="expected world=$world generation=$gen, got '$(final_line "$T/out")'"
  [ -z "$why" ] && ! same_loss "$(loss_of "$T/out")" "$ref" && why="loss $(loss_of "$T/out") is not the failure-free $ref"
  if pgrep -f -- "--checkpoint-dir $dir" >/dev/null 2>&1; then why="workers left behind"; fi
}

# count PATTERN: lines of the workers' log matching the extended regex.
count() { grep -cE "$1" "$T/err"; }
# expect N PATTERN: appends to $why unless exactly N lines match.
expect() { [ -n "$why" ] || [ "$(count "$2")" -eq "$1" ] || why="$1 lines '$2' expected, $(count "$2") found"; }

world=3 gen=1
sgd -- -- --kill-rank 2 --kill-at-step 23
expect 3 'generation 1: rank .* shrunk in place'
expect 0 'rebuilt in|failed shrink'
expect 1 'shrunk group [0-9a-f]+: 1 members \(1 lost\), my rank 0'
expect 2 'rebuilt group [0-9a-f]+: 2 members \(0 lost\)'
[ -z "$why" ]; result $? "kill -9 of rank 2: world and both parity groups shrink in place" "$why"

world=3 gen=1
sgd -- -- --kill-rank 0 --kill-at-step 23
expect 3 'generation 1: rank .* shrunk in place'
expect 1 'shrunk group [0-9a-f]+: 1 members \(1 lost\), my rank 0'
[ -z "$why" ]; result $? "kill -9 of rank 0 (the launcher hosts the store): shrink in place" "$why"

world=2 gen=1
sgd -- -- --kill-rank 1,3 --kill-at-step 31
expect 2 'generation 1: rank .* shrunk in place'
expect 2 'rebuilt group [0-9a-f]+: 2 members \(0 lost\)'
[ -z "$why" ]; result $? "kill -9 of ranks 1 and 3: the odd group loses every member" "$why"

world=2 gen=2
sgd -- -- --kill-rank 2 --kill-at-step 23 --kill-in-recovery 2
expect 3 'generation 1: rank .* shrunk in place'
expect 2 'generation 2: rank .* shrunk in place'
[ -z "$why" ]; result $? "a second kill right after the first shrink: the shrunk world shrinks again" "$why"

# Parity groups made by their members alone (dcomm_new_group_named):
# shrunk in place, or rebuilt, among their members only.
world=3 gen=1
sgd -- -- --kill-rank 2 --kill-at-step 23 --named-parity 1
expect 3 'generation 1: rank .* shrunk in place'
expect 1 'shrunk group "even": 1 members \(1 lost\), my rank 0'
expect 2 'rebuilt group "odd": 2 members \(0 lost\)'
[ -z "$why" ]; result $? "named parity groups (created on their members only) shrink in place" "$why"

world=3 gen=1
sgd DCOMM_ELASTIC_SHRINK=0 -- -- --kill-rank 1 --kill-at-step 23 --named-parity 1
expect 3 'generation 1: rank .* rebuilt in'
expect 1 'rebuilt group "odd": 1 members, my rank 0'
expect 2 'rebuilt group "even": 2 members, my rank [01]'
[ -z "$why" ]; result $? "named parity groups are rebuilt among their surviving members" "$why"

world=4 gen=1
sgd -- --restart-policy replace -- --kill-rank 3 --kill-at-step 23
expect 0 'shrunk in place|failed shrink'
expect 3 'generation 1: rank .* rebuilt in'
[ -z "$why" ]; result $? "replace policy: a plan with a joiner takes the full rebuild" "$why"

world=3 gen=1
sgd DCOMM_ELASTIC_SHRINK=0 -- -- --kill-rank 2 --kill-at-step 23
expect 0 'shrunk in place|failed shrink'
expect 3 'generation 1: rank .* rebuilt in'
[ -z "$why" ]; result $? "DCOMM_ELASTIC_SHRINK=0: no shrink is tried" "$why"

world=3 gen=1
sgd DCOMM_TCP_SHRINK=0 -- -- --kill-rank 2 --kill-at-step 23
expect 3 'shrink of generation 1 failed, rebuilding: .*DCOMM_TCP_SHRINK=0'
expect 3 'generation 1: rank .* rebuilt after a failed shrink'
[ -z "$why" ]; result $? "DCOMM_TCP_SHRINK=0 (DCOMM_ENOTSUP): every survivor falls back to the rebuild" "$why"

world=3 gen=1
sgd DCOMM_TCP_SHRINK=fail:group -- -- --kill-rank 2 --kill-at-step 23
expect 1 'shrink of generation 1 failed, rebuilding'
expect 3 'generation 1: rank .* rebuilt after a failed shrink'
[ -z "$why" ]; result $? "a sub-group's shrink fails on one rank after the world shrank: all fall back" "$why"

finish
