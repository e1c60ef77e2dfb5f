#!/usr/bin/env bash
# tests/bench_smoke.sh: dcomm-bench runs every op on 3 ranks under dcomm-run
# and its own check finds no wrong element (the errors column and exit 0).
# It times nothing: speed is for tests/perf/compare-mpi.sh.
set -u
b=${top_builddir:-.}
[ -x "$b/dcomm-bench" ] && [ -x "$b/dcomm-run" ] || { echo "skip: dcomm-bench not built"; exit 77; }
pass=0 fail=0
for op in all_reduce all_gather broadcast reduce_scatter all_to_all barrier; do
  for dt in float32 bfloat16 int64; do
    [ "$op" = barrier ] && [ "$dt" != float32 ] && continue
    out=$(timeout 60 "$b/dcomm-run" --nproc-per-node 3 --quiet-prefix -- "$b/dcomm-bench" -o "$op" -d "$dt" \
      -b 8 -e 1M -f 32 -n 3 -w 1 2>&1)
    rc=$?
    bad=$(echo "$out" | awk '!/^#/ && NF == 7 && $7 != 0' | wc -l)
    rows=$(echo "$out" | awk '!/^#/ && NF == 7' | wc -l)
    if [ $rc -eq 0 ] && [ "$bad" -eq 0 ] && [ "$rows" -gt 0 ]; then
      pass=$((pass + 1))
    else
      fail=$((fail + 1))
      echo "not ok - $op $dt: exit $rc, $rows rows, $bad with errors"
      echo "$out" | tail -5
    fi
  done
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
