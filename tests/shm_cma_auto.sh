#!/usr/bin/env bash
# tests/shm_cma_auto.sh: DCOMM_SHM_CMA_FWD_MIN=auto (the default) decides
# from a measurement whether forwarded data of 1 MiB and more is read with
# one process_vm_readv or goes through the rings (tcp_cma.c), on 2 ranks:
#   1. a 4 MiB all_reduce measures once per rank, logs the figures and the
#      verdict, the verdict follows from the figures (on iff the kernel's
#      rate is at least 75% of memcpy's), and the results are right;
#   2. collectives below 1 MiB never measure (no cost for small jobs);
#   3. a size in DCOMM_SHM_CMA_FWD_MIN, and DCOMM_TRANSPORT=tcp, never
#      measure, and the results are right.
# Which verdict comes out depends on the machine: the test checks that it
# is the one the logged figures give.
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
bench() { # OUT FIRST LAST [VAR=VALUE...]: all_reduce on 2 ranks, results checked
  local out=$1 first=$2 last=$3; shift 3
  env "$@" timeout 120 "$b/dcomm-run" --quiet-prefix --nproc-per-node 2 -- "$b/dcomm-bench" -o all_reduce \
    -b "$first" -e "$last" -f 4 -n 3 -w 1 >"$out" 2>&1
}
line='single copy of forwarded data'

f=$work/auto.log
if bench "$f" 4M 4M && grep -q '^# wrong elements: 0$' "$f"; then ok "auto: 4 MiB all_reduce right"; else bad "auto: 4 MiB all_reduce right" "$f"; fi
n=$(grep -c "$line" "$f")
if [ "$n" = 2 ]; then ok "auto: one measurement per rank"; else bad "auto: one measurement per rank (found $n lines)" "$f"; fi
# "...: on (process_vm_readv 18.63 GB/s, memcpy 51.33 GB/s, ..."
if grep "$line" "$f" | sed -E 's/.*data: (on|off) \(process_vm_readv ([0-9.]+) GB\/s, memcpy ([0-9.]+) GB\/s.*/\1 \2 \3/' |
  awk 'NF != 3 || $2 <= 0 || $3 <= 0 || (($2 >= 0.75 * $3) != ($1 == "on")) { bad = 1 } END { exit bad || NR != 2 }'; then
  ok "auto: the verdict follows from the measured rates"
else
  bad "auto: the verdict follows from the measured rates" "$f"
fi

f=$work/small.log
if bench "$f" 64K 512K && grep -q '^# wrong elements: 0$' "$f" && ! grep -q "$line" "$f"; then
  ok "auto: no measurement below 1 MiB"
else
  bad "auto: no measurement below 1 MiB" "$f"
fi

f=$work/size.log
if bench "$f" 4M 4M DCOMM_SHM_CMA_FWD_MIN=1M && grep -q '^# wrong elements: 0$' "$f" && ! grep -q "$line" "$f"; then
  ok "a size in DCOMM_SHM_CMA_FWD_MIN: no measurement, results right"
else
  bad "a size in DCOMM_SHM_CMA_FWD_MIN: no measurement, results right" "$f"
fi

f=$work/tcp.log
if bench "$f" 4M 4M DCOMM_TRANSPORT=tcp && grep -q '^# wrong elements: 0$' "$f" && ! grep -q "$line" "$f"; then
  ok "DCOMM_TRANSPORT=tcp: no measurement"
else
  bad "DCOMM_TRANSPORT=tcp: no measurement" "$f"
fi

echo "shm_cma_auto: $pass passed, $fail failed"
[ "$fail" = 0 ]
