#!/usr/bin/env bash
# scripts/demo.sh: the main job. Builds dcomm if needed, then runs the
# elastic demo (examples/elastic_sgd) under dcomm-run with 4 ranks on the
# embedded defaults, with rank 2 killed by SIGKILL at step 57; then runs the
# same job without a failure and compares the final losses.
#   STEPS=200 KILL_RANK=2 KILL_AT=57 POLICY=shrink bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
steps=${STEPS:-200}
kill_rank=${KILL_RANK:-2}
kill_at=${KILL_AT:-57}
policy=${POLICY:-shrink}

if [ ! -x "$top/build/dcomm-run" ] || [ ! -x "$top/build/examples/elastic_sgd" ]; then
  bash scripts/install-deps.sh
  [ -x configure ] || ./autogen.sh
  mkdir -p build
  (cd build && { [ -f Makefile ] || "$top/configure" >configure.out; } && make -j"$(nproc)" >make.out 2>&1) ||
    { tail -40 build/make.out; exit 1; }
fi
run=$top/build/dcomm-run
sgd=$top/build/examples/elastic_sgd
work=$(mktemp -d /tmp/dcomm-demo.XXXXXX)
trap 'rm -rf "$work"' EXIT

echo "== elastic run: 4 ranks, rank $kill_rank killed at step $kill_at, policy $policy"
start=$(date +%s.%N)
"$run" --nproc-per-node 4 --restart-policy "$policy" -- \
  "$sgd" --steps "$steps" --checkpoint-every 10 --checkpoint-dir "$work/ckpt" \
  --kill-rank "$kill_rank" --kill-at-step "$kill_at" | tee "$work/elastic.out"
end=$(date +%s.%N)
echo "== reference run: 4 ranks, no failure"
"$run" --nproc-per-node 4 -- "$sgd" --steps "$steps" --checkpoint-every 10 --checkpoint-dir "$work/ref" \
  >"$work/ref.out"
tail -1 "$work/ref.out"

a=$(grep -o 'final .*loss=[^ ]*' "$work/elastic.out" | sed 's/.*loss=//')
b=$(grep -o 'final .*loss=[^ ]*' "$work/ref.out" | sed 's/.*loss=//')
awk -v a="$a" -v b="$b" -v t="$(echo "$end - $start" | bc 2>/dev/null || echo '?')" 'BEGIN {
  d = a - b; if (d < 0) d = -d; r = (b != 0) ? d / (b < 0 ? -b : b) : d;
  printf "final loss with failure %s, without %s, relative difference %.3g (elastic run %s s)\n", a, b, r, t;
  if (r > 1e-6) { print "DEMO FAILED: the losses differ"; exit 1 }
  print "DEMO OK: the job survived the failure and matches the failure-free run" }'
