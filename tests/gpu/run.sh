#!/usr/bin/env bash
# tests/gpu/run.sh: the GPU checks of the nccl backend, for a machine with a
# CUDA GPU (not part of "make check"). Builds the tree if needed
# (./autogen.sh, ./configure, make), compiles tests/gpu/gpu_coll.c against
# the public API (with gpu_nccl_ref.c: dcomm's all_reduce timed beside
# NCCL's own), runs it as a world of 1 and, with 2 or more GPUs, as one
# process per GPU through env://; with 2 or more GPUs it also runs
# tests/gpu/gpu_shrink.c, one process per GPU on the backend ABI: the last
# rank is SIGKILLed, the survivors revoke, shrink (ncclCommShrink) and
# check the smaller world, and the shrink is timed against abort + re-init;
# and tests/gpu/gpu_elastic.c under dcomm-run: the same failure through
# dcomm_elastic_run (shrink in place, checkpoint restored through the store);
# then dcomm-bench all_reduce on device buffers, one worker per GPU; last,
# tests/gpu/gpu_torch.py: the torch backend on CUDA tensors (when torch has CUDA).
# Everything runs under `timeout` within GPU_CHECK_BUDGET seconds (default
# 300). The last line is
#   GPU checks: N passed, M failed
# Exit: 0 all passed, 1 something failed, 77 no GPU (only the no-GPU error
# was checked).
set -u

cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
CUDA=${CUDA_HOME:-/usr/local/cuda}
# NCCL from pip (nvidia-nccl-cu*, as PyTorch images ship it) rather than
# beside CUDA: a private CUDA_HOME that holds both, for the compiles below.
if [ ! -e "$CUDA/include/nccl.h" ]; then
  pipnccl=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
  if [ -n "$pipnccl" ] && [ -e "$pipnccl/lib/libnccl.so.2" ]; then
    cu=$(mktemp -d /tmp/dcomm-cuda.XXXXXX)
    mkdir -p "$cu/include" "$cu/lib64"
    ln -sf "$CUDA"/include/* "$pipnccl"/include/* "$cu/include/"
    ln -sf "$pipnccl/lib/libnccl.so.2" "$cu/lib64/libnccl.so.2"
    ln -sf "$pipnccl/lib/libnccl.so.2" "$cu/lib64/libnccl.so"
    for f in $(find "$CUDA/lib64/" "$CUDA/targets/" -name 'libcudart.so*' 2>/dev/null); do ln -sf "$f" "$cu/lib64/"; done
    [ -e "$cu/lib64/libcudart.so" ] || ln -sf "$(ls "$cu"/lib64/libcudart.so.* | head -1)" "$cu/lib64/libcudart.so"
    echo "NCCL from $pipnccl; CUDA_HOME for the compiles: $cu"
    CUDA=$cu
  fi
fi
BUDGET=${GPU_CHECK_BUDGET:-300}
END=$((SECONDS + BUDGET))
LOGDIR=$(mktemp -d /tmp/dcomm-gpu.XXXXXX)
PASS=0
FAIL=0

left() { # seconds left in the budget, capped by $1 if given
  local l=$((END - SECONDS))
  [ "$l" -lt 1 ] && l=1
  if [ $# -gt 0 ] && [ "$1" -lt "$l" ]; then l=$1; fi
  echo "$l"
}
ok() { PASS=$((PASS + 1)); echo "ok   $*"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL $*"; }
finish() {
  echo "logs: $LOGDIR"
  echo "GPU checks: $PASS passed, $FAIL failed${1:+ ($1)}"
  if [ $# -gt 0 ] && [ "$1" = "no GPU" ]; then exit 77; fi
  [ "$FAIL" -eq 0 ]
  exit $?
}
# Adds the "[rank R] GPU checks: N passed, M failed" line of a log to the
# totals; a log without it counts as one failure.
tally() {
  local log=$1 what=$2 rc=$3 line n m
  line=$(grep -E 'GPU checks: [0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
  if [ -z "$line" ]; then
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then bad "$what: killed by timeout (no summary)"
    else bad "$what: exited $rc without a summary"; fi
    return
  fi
  n=$(echo "$line" | sed -E 's/.*GPU checks: ([0-9]+) passed.*/\1/')
  m=$(echo "$line" | sed -E 's/.*passed, ([0-9]+) failed.*/\1/')
  PASS=$((PASS + n))
  FAIL=$((FAIL + m))
  [ "$rc" -eq 124 ] && bad "$what: killed by timeout"
  echo "---- $what: $n passed, $m failed (exit $rc)"
}

# 1. Build if needed.
if [ ! -f .libs/libdcomm.so ] || [ ! -f .libs/dcomm_nccl.so ]; then
  echo "building (log: $LOGDIR/build.log)"
  if [ ! -x configure ]; then
    timeout "$(left 120)" ./autogen.sh >>"$LOGDIR/build.log" 2>&1 || { bad "./autogen.sh"; tail -n 20 "$LOGDIR/build.log"; finish; }
  fi
  # Automake writes "HAVE_NCCL_TRUE = " (empty) when the nccl module is enabled.
  if [ ! -f Makefile ] || ! grep -qE '^HAVE_NCCL_TRUE = *$' Makefile; then
    timeout "$(left 120)" ./configure --with-cuda="$CUDA" >>"$LOGDIR/build.log" 2>&1 || { bad "./configure"; tail -n 20 "$LOGDIR/build.log"; finish; }
  fi
  if ! grep -qE '^HAVE_NCCL_TRUE = *$' Makefile; then
    bad "configure did not enable the nccl backend: $(grep -E 'nccl backend' "$LOGDIR/build.log" | tail -n 1)"
    finish
  fi
  timeout "$(left 240)" make -j"$(nproc)" >>"$LOGDIR/build.log" 2>&1 || { bad "make"; tail -n 30 "$LOGDIR/build.log"; finish; }
fi
if [ -f .libs/libdcomm.so ] && [ -f .libs/dcomm_nccl.so ]; then ok "build: .libs/libdcomm.so and .libs/dcomm_nccl.so"
else bad "build: .libs/libdcomm.so or .libs/dcomm_nccl.so missing"; finish; fi
if nm -D .libs/dcomm_nccl.so 2>/dev/null | grep -qE ' D dcomm_backend_v1$'; then ok "dcomm_nccl.so exports dcomm_backend_v1"
else bad "dcomm_nccl.so does not export dcomm_backend_v1"; fi

# 2. Compile the check programs: gpu_coll against the public API,
# gpu_shrink against the backend ABI (it loads dcomm_nccl.so itself), both
# with gpu_harness.c (check lines, summary, clock, CUDA error checks).
GPU_COLL=$LOGDIR/gpu_coll
GPU_SHRINK=$LOGDIR/gpu_shrink
GPU_ELASTIC=$LOGDIR/gpu_elastic
if timeout "$(left 60)" gcc -I include -I tools -I "$CUDA/include" tests/gpu/gpu_coll.c tests/gpu/gpu_nccl_ref.c \
  tests/gpu/gpu_harness.c tools/bench_util.c -L.libs -ldcomm -L"$CUDA/lib64" -lnccl -lcudart -lm -Wl,-rpath,"$PWD/.libs" \
  -Wl,-rpath,"$CUDA/lib64" -o "$GPU_COLL" >"$LOGDIR/compile.log" 2>&1; then
  ok "compile tests/gpu/gpu_coll.c"
else
  bad "compile tests/gpu/gpu_coll.c"; cat "$LOGDIR/compile.log"; finish
fi
if timeout "$(left 60)" gcc -Wall -Wextra -I include -I "$CUDA/include" tests/gpu/gpu_shrink.c tests/gpu/gpu_harness.c \
  -L"$CUDA/lib64" -lcudart -ldl -lpthread -Wl,-rpath,"$CUDA/lib64" -o "$GPU_SHRINK" >>"$LOGDIR/compile.log" 2>&1; then
  ok "compile tests/gpu/gpu_shrink.c"
else
  bad "compile tests/gpu/gpu_shrink.c"; cat "$LOGDIR/compile.log"; finish
fi
if timeout "$(left 60)" gcc -Wall -Wextra -I include -I "$CUDA/include" tests/gpu/gpu_elastic.c -L.libs -ldcomm -L"$CUDA/lib64" \
  -lcudart -Wl,-rpath,"$PWD/.libs" -o "$GPU_ELASTIC" >>"$LOGDIR/compile.log" 2>&1; then
  ok "compile tests/gpu/gpu_elastic.c"
else
  bad "compile tests/gpu/gpu_elastic.c"; cat "$LOGDIR/compile.log"; finish
fi

export LD_LIBRARY_PATH="$CUDA/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export DCOMM_PLUGIN_PATH="$ROOT/.libs"
export DCOMM_TIMEOUT=${DCOMM_TIMEOUT:-60}
export DCOMM_CONNECT_TIMEOUT=${DCOMM_CONNECT_TIMEOUT:-30}
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export GPU_CKPT_DIR=$LOGDIR
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT DCOMM_INIT_METHOD

# 3. How many GPUs.
NDEV=$(timeout "$(left 30)" "$GPU_COLL" --count-devices 2>"$LOGDIR/devices.log" | tail -n 1)
case "$NDEV" in '' | *[!0-9]*) NDEV=0 ;; esac
command -v nvidia-smi >/dev/null 2>&1 && timeout "$(left 20)" nvidia-smi -L 2>/dev/null | sed 's/^/  /'
echo "CUDA devices: $NDEV $(cat "$LOGDIR/devices.log" 2>/dev/null)"
if [ "$NDEV" -eq 0 ]; then
  # Without a GPU the backend must refuse clearly, not pretend.
  out=$(timeout "$(left 60)" ./dcomm-info 2>&1 || true)
  echo "$out" | grep -i nccl | sed 's/^/  /'
  if echo "$out" | grep -q 'no CUDA device'; then ok "dcomm-info names the missing GPU"; else bad "dcomm-info does not say 'no CUDA device'"; fi
  d=$(mktemp -d "$LOGDIR/store.XXXXXX")
  out=$(timeout "$(left 30)" "$GPU_SHRINK" "$ROOT/.libs/dcomm_nccl.so" "$d" 0 2 2>&1)
  if echo "$out" | grep -q 'backend init.*no CUDA device'; then ok "the backend's init names the missing GPU"
  else bad "the backend's init does not say 'no CUDA device': $out"; fi
  finish "no GPU"
fi

# 4. World of 1.
PORT=$((29500 + RANDOM % 2000))
GPU_COLL_PORT=$PORT timeout "$(left 150)" "$GPU_COLL" >"$LOGDIR/world1.log" 2>&1
rc=$?
cat "$LOGDIR/world1.log"
tally "$LOGDIR/world1.log" "world of 1" "$rc"

# 5. One process per GPU.
if [ "$NDEV" -ge 2 ]; then
  N=$NDEV
  MAXR=${GPU_CHECK_MAX_RANKS:-8}
  [ "$N" -gt "$MAXR" ] && N=$MAXR
  PORT=$((31500 + RANDOM % 2000))
  T=$(left 150)
  pids=()
  for ((r = 0; r < N; r++)); do
    DCOMM_LOG_LEVEL=info DCOMM_LOG_SUBSYS=nccl RANK=$r LOCAL_RANK=$r WORLD_SIZE=$N LOCAL_WORLD_SIZE=$N \
      MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT timeout "$T" "$GPU_COLL" >"$LOGDIR/rank$r.log" 2>&1 &
    pids+=($!)
  done
  for ((r = 0; r < N; r++)); do
    wait "${pids[$r]}"
    rcs[r]=$?
  done
  for ((r = 0; r < N; r++)); do
    grep -v 'nccl backend:' "$LOGDIR/rank$r.log"
    tally "$LOGDIR/rank$r.log" "world of $N, rank $r" "${rcs[$r]}"
  done
  # Sub-groups come from ncclCommSplit (NCCL >= 2.18): the backend logs
  # each split; rank 0 is in the reversed world, the subset and its parity.
  nsplit=$(grep -c 'split from .* by ncclCommSplit' "$LOGDIR/rank0.log")
  grep -h 'by ncclCommSplit\|ready: rank' "$LOGDIR/rank0.log" | sed 's/^/  /'
  if [ "$nsplit" -ge 3 ]; then ok "rank 0's $nsplit sub-groups were split from their parent (ncclCommSplit)"
  else bad "rank 0 split $nsplit sub-groups with ncclCommSplit, expected 3 (see rank0.log)"; fi
else
  echo "skip: one GPU, no multi-process run"
fi

# 6. Kill one rank, the survivors shrink (2 or more GPUs).
# Waits until ready.0 .. ready.$(($2 - 1)) exist in directory $1, at most $3 s.
wait_files() {
  local d=$1 n=$2 t=$3 end=$((SECONDS + $3)) r missing
  while :; do
    missing=0
    for ((r = 0; r < n; r++)); do [ -e "$d/ready.$r" ] || missing=1; done
    [ "$missing" -eq 0 ] && return 0
    [ "$SECONDS" -ge "$end" ] && return 1
    sleep 0.1
  done
}
if [ "$NDEV" -ge 2 ]; then
  N=$NDEV
  MAXR=${GPU_CHECK_MAX_RANKS:-8}
  [ "$N" -gt "$MAXR" ] && N=$MAXR
  V=$((N - 1))
  STORE=$(mktemp -d "$LOGDIR/shrink-store.XXXXXX")
  T=$(left 120)
  t_start=$SECONDS
  pids=()
  for ((r = 0; r < N; r++)); do
    timeout "$T" "$GPU_SHRINK" "$ROOT/.libs/dcomm_nccl.so" "$STORE" "$r" "$N" >"$LOGDIR/shrink$r.log" 2>&1 &
    pids+=($!)
  done
  # Each rank writes its pid into ready.<rank> (under timeout, $! is
  # timeout's pid, not the rank's).
  if wait_files "$STORE" "$N" "$(left 60)"; then
    vpid=$(cat "$STORE/ready.$V")
    if [ -n "$vpid" ] && kill -KILL "$vpid" 2>/dev/null; then
      wait "${pids[$V]}" 2>/dev/null
      touch "$STORE/killed"
      ok "SIGKILLed rank $V (pid $vpid) of $N"
    else
      bad "could not find or kill rank $V"
      kill -TERM "${pids[@]}" 2>/dev/null
    fi
  else
    bad "not every rank got its world working within the budget"
    kill -TERM "${pids[@]}" 2>/dev/null
  fi
  for ((r = 0; r < V; r++)); do
    wait "${pids[$r]}"
    rcs[r]=$?
  done
  for ((r = 0; r < V; r++)); do
    cat "$LOGDIR/shrink$r.log"
    tally "$LOGDIR/shrink$r.log" "kill one of $N, survivor $r" "${rcs[$r]}"
  done
  echo "---- kill-one-rank recovery: $((SECONDS - t_start)) s in all"
  grep -h 'figure: kill-one-rank' "$LOGDIR"/shrink*.log | sed 's/^/  /'
else
  echo "skip: one GPU, no kill-one-rank shrink"
fi

# 7. The same through the whole elastic layer: dcomm-run, one worker per
# GPU, dcomm_elastic_run with checkpoints; the last rank SIGKILLs itself at
# step 23; the survivors must shrink in place (ncclCommShrink), restore the
# step-19 checkpoint through the store and finish 60 steps in generation 1.
if [ "$NDEV" -ge 2 ]; then
  N=$NDEV
  MAXR=${GPU_CHECK_MAX_RANKS:-8}
  [ "$N" -gt "$MAXR" ] && N=$MAXR
  V=$((N - 1))
  want_sum=$((20 * N + 40 * V))
  t_start=$SECONDS
  DCOMM_LOG_LEVEL=info DCOMM_LOG_SUBSYS=nccl,elastic timeout "$(left 120)" ./dcomm-run --nproc-per-node "$N" -- \
    "$GPU_ELASTIC" "$LOGDIR/elastic-ckpt" "$V" >"$LOGDIR/elastic.log" 2>&1
  rc=$?
  grep -E 'final step|recovered:|shrunk|through the store|job (finished|failed)' "$LOGDIR/elastic.log" | sed 's/^/  /'
  echo "---- elastic kill-one-rank run: $((SECONDS - t_start)) s, exit $rc"
  final=$(grep -o 'final step=.*' "$LOGDIR/elastic.log" | tail -n 1)
  if [ "$rc" -eq 0 ] && [ "$final" = "final step=60 world=$V generation=1 sum=$want_sum" ]; then
    ok "elastic run: rank $V killed, the $V survivors finished 60 steps (sum $want_sum)"
  else
    bad "elastic run: exit $rc, '$final', want 'final step=60 world=$V generation=1 sum=$want_sum' (see $LOGDIR/elastic.log)"
  fi
  if grep -q 'shrunk by 1 rank' "$LOGDIR/elastic.log"; then ok "elastic run: the world was shrunk in place (ncclCommShrink)"
  else bad "elastic run: no 'shrunk by 1 rank' line: the world was re-created instead (NCCL < 2.27, or the shrink failed)"; fi
  if grep -q 'control values from rank 0 go through the store' "$LOGDIR/elastic.log"; then ok "elastic run: checkpoint values went through the store"
  else bad "elastic run: checkpoint values did not go through the store"; fi
else
  echo "skip: one GPU, no elastic kill-one-rank run"
fi

# 8. dcomm-bench itself on the GPUs (device buffers with the nccl backend),
# one worker per GPU; its errors column checks every size.
NB=$NDEV
[ "$NB" -gt "${GPU_CHECK_MAX_RANKS:-8}" ] && NB=${GPU_CHECK_MAX_RANKS:-8}
DCOMM_BACKEND=nccl timeout "$(left 90)" ./dcomm-run --quiet-prefix --nproc-per-node "$NB" -- \
  ./dcomm-bench -o all_reduce -b 8 -e 256M -f 8 -n 20 -w 5 >"$LOGDIR/bench.log" 2>&1
rc=$?
sed 's/^/  /' "$LOGDIR/bench.log" | grep -v 'dcomm-run:'
if [ "$rc" -eq 0 ] && grep -q '^# wrong elements: 0$' "$LOGDIR/bench.log"; then ok "dcomm-bench all_reduce on $NB GPU(s), 8 B to 256 MiB, no wrong element"
else bad "dcomm-bench on $NB GPU(s): exit $rc (see $LOGDIR/bench.log)"; fi

# 9. The torch backend on CUDA tensors (needs a CUDA build of torch), one
# worker per GPU under dcomm-run.
PY=${PYTHON:-python3}
if "$PY" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  DCOMM_BACKEND=nccl DCOMM_LIBRARY=$ROOT/.libs/libdcomm.so.0 PYTHONPATH=$ROOT/python \
    timeout "$(left 120)" ./dcomm-run --quiet-prefix --nproc-per-node "$NB" -- "$PY" tests/gpu/gpu_torch.py \
    >"$LOGDIR/torch.log" 2>&1
  rc=$?
  grep -E '^(ok|FAIL) ' "$LOGDIR/torch.log" | sort | uniq -c | sed 's/^/  /'
  tally "$LOGDIR/torch.log" "torch backend on $NB GPU(s)" "$rc"
else
  echo "skip: $PY has no CUDA-enabled torch (the torch backend's GPU checks need one)"
fi

finish
