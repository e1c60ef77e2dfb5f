#!/usr/bin/env bash
# tests/shm_cma_auto.sh: DCOMM_SHM_CMA_FWD_MIN=auto (the default) decides
# from a communicator's own calls whether forwarded data of 1 MiB and more
# is read with one process_vm_readv or goes through the rings (tcp_cma.c),
# on 2 ranks:
#   1. a 4 MiB all_reduce tries both ways on its first calls, then each
#      rank logs one decision for its size class; the decision is the way
#      with the faster logged call, and the results are right;
#   2. the trial really reads by single copy (process_vm_readv counted with
#      strace: more than with DCOMM_SHM_CMA_FWD_MIN=1G, the rings only,
#      where only the link's check of the permission reads);
#   3. collectives below 1 MiB never try (no cost for small jobs);
#   4. a size in DCOMM_SHM_CMA_FWD_MIN, and DCOMM_TRANSPORT=tcp, never try,
#      and the results are right.
# Which way wins depends on the machine: the test checks that the decision
# is the one the logged times give.
set -u
b=${top_builddir:-.}
[ -x "$b/dcomm-bench" ] && [ -x "$b/dcomm-run" ] || { echo "skip: dcomm-bench not built"; exit 77; }
work=$(mktemp -d /tmp/dcomm-cma-auto.XXXXXX)
trap 'rm -rf "$work"' EXIT
unset DCOMM_TUNING_FILE DCOMM_SHM_CMA_MIN DCOMM_SHM_CMA_FWD_MIN DCOMM_TRANSPORT DCOMM_ALGO
export DCOMM_TUNING_FILE=none DCOMM_LOG_LEVEL=info DCOMM_LOG_SUBSYS=tcp
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok - $1"; }
bad() { fail=$((fail + 1)); echo "not ok - $1"; tail -n 12 "$2" | sed 's/^/    /'; }
bench() { # OUT FIRST LAST WARMUP [VAR=VALUE...]: all_reduce on 2 ranks, results checked
  local out=$1 first=$2 last=$3 warm=$4; shift 4
  env "$@" timeout 120 ${TRACE:-} "$b/dcomm-run" --quiet-prefix --nproc-per-node 2 -- "$b/dcomm-bench" -o all_reduce \
    -b "$first" -e "$last" -f 4 -n 3 -w "$warm" >"$out" 2>&1
}
line='single copy of forwarded data'

f=$work/auto.log
if bench "$f" 4M 4M 16 && grep -q '^# wrong elements: 0$' "$f"; then ok "auto: 4 MiB all_reduce right"; else bad "auto: 4 MiB all_reduce right" "$f"; fi
n=$(grep -c "$line in all_reduce of 4-8 MiB per rank: " "$f")
if [ "$n" = 2 ] && [ "$(grep -c "$line" "$f")" = 2 ]; then ok "auto: one decision per rank"; else bad "auto: one decision per rank (found $n lines)" "$f"; fi
# "...: on (fastest call 510.9 us with it, 653.2 us through the rings; ..."
if grep "$line" "$f" | sed -E 's/.* rank: (on|off) \(fastest call ([0-9.]+) us with it, ([0-9.]+) us through the rings.*/\1 \2 \3/' |
  awk 'NF != 3 || $2 <= 0 || $3 <= 0 || (($2 < $3) != ($1 == "on")) { bad = 1 } END { exit bad || NR != 2 }'; then
  ok "auto: the decision is the way with the faster call"
else
  bad "auto: the decision is the way with the faster call" "$f"
fi

# process_vm_readv calls of the workers (strace -f): the trial's single
# copies, and none when a size above the data keeps it on the rings
if command -v strace >/dev/null && strace -f -qq -e trace=none true 2>/dev/null; then
  f=$work/trace.log
  TRACE="strace -f -qq -e trace=process_vm_readv -o $work/auto.strace" bench "$f" 4M 4M 0
  ra=$(grep -c 'process_vm_readv(' "$work/auto.strace")
  TRACE="strace -f -qq -e trace=process_vm_readv -o $work/rings.strace" bench "$work/rings.log" 4M 4M 0 DCOMM_SHM_CMA_FWD_MIN=1G
  rr=$(grep -c 'process_vm_readv(' "$work/rings.strace")
  if grep -q '^# wrong elements: 0$' "$f" && grep -q '^# wrong elements: 0$' "$work/rings.log" && [ "$ra" -gt "$rr" ]; then
    ok "auto: the trial reads by single copy ($ra process_vm_readv calls in the first calls; $rr with DCOMM_SHM_CMA_FWD_MIN=1G)"
  else
    bad "auto: the trial reads by single copy ($ra process_vm_readv calls; $rr with DCOMM_SHM_CMA_FWD_MIN=1G)" "$f"
  fi
else
  echo "# strace cannot trace here: the single copy of the trial not counted"
fi

f=$work/small.log
if bench "$f" 64K 512K 16 && grep -q '^# wrong elements: 0$' "$f" && ! grep -q "$line" "$f"; then
  ok "auto: no trial below 1 MiB"
else
  bad "auto: no trial below 1 MiB" "$f"
fi

f=$work/size.log
if bench "$f" 4M 4M 16 DCOMM_SHM_CMA_FWD_MIN=1M && grep -q '^# wrong elements: 0$' "$f" && ! grep -q "$line" "$f"; then
  ok "a size in DCOMM_SHM_CMA_FWD_MIN: no trial, results right"
else
  bad "a size in DCOMM_SHM_CMA_FWD_MIN: no trial, results right" "$f"
fi

f=$work/tcp.log
if bench "$f" 4M 4M 16 DCOMM_TRANSPORT=tcp && grep -q '^# wrong elements: 0$' "$f" && ! grep -q "$line" "$f"; then
  ok "DCOMM_TRANSPORT=tcp: no trial"
else
  bad "DCOMM_TRANSPORT=tcp: no trial" "$f"
fi

echo "shm_cma_auto: $pass passed, $fail failed"
[ "$fail" = 0 ]
