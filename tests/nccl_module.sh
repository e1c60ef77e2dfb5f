#!/bin/sh
# nccl_module.sh: the packaging promises of the nccl backend, checked on the
# built tree: libdcomm.so depends on no CUDA or NCCL library (a CPU-only
# user never needs CUDA), dcomm_nccl.so exports its one table, references
# ncclCommSplit / ncclCommShrink / ncclCommRevoke weakly (so it still loads
# against an NCCL older than 2.18 / 2.27 / 2.28.7 and init reports them
# missing), dcomm-info lists the module with the reason it cannot run ("no
# CUDA device" here), and the GPU check programs of tests/gpu/run.sh
# compile and link here without a warning, so the prepared script does not
# rot on machines without a GPU.
# Environment: top_builddir (default .). Exit: 0 pass, 1 fail, 77 skip
# (no nm/ldd, or the module is not built).
b=${top_builddir:-.}
lib=$b/.libs/libdcomm.so
mod=$b/.libs/dcomm_nccl.so
for t in nm ldd; do
  command -v $t >/dev/null 2>&1 || { echo "nccl_module: no $t; skipping"; exit 77; }
done
[ -f "$mod" ] || { echo "nccl_module: $mod not built; skipping"; exit 77; }
status=0
fail() { echo "FAIL: $*"; status=1; }

if ldd "$lib" | grep -Ei 'libcuda|libnccl'; then fail "libdcomm.so depends on CUDA/NCCL"
else echo "ok: libdcomm.so needs no CUDA library"; fi
syms=$(nm -D "$mod")
echo "$syms" | grep -qE ' D dcomm_backend_v1$' && echo "ok: dcomm_backend_v1 exported" || fail "dcomm_backend_v1 not exported"
# Only when built against a header that has them (NCCL >= 2.18 / 2.27 / 2.28.7).
for f in ncclCommSplit ncclCommShrink ncclCommRevoke; do
  line=$(echo "$syms" | grep -E " $f\$")
  if [ -z "$line" ]; then echo "note: $f not referenced (older NCCL header)"
  elif echo "$line" | grep -qE '^ +w '; then echo "ok: $f is weak"
  else fail "$f is a strong reference ($line): the module would not load against an older NCCL"; fi
done
info=$(DCOMM_PLUGIN_PATH=$b/.libs "$b/dcomm-info" 2>&1)
line=$(echo "$info" | grep -i nccl | head -n 1)
echo "dcomm-info: $line"
case "$line" in
*"no CUDA device"* | *"CUDA device(s)"*) echo "ok: dcomm-info describes the nccl module" ;;
*) fail "dcomm-info does not describe the nccl module" ;;
esac
cuda=${CUDA_HOME:-/usr/local/cuda}
src=${top_srcdir:-.}
if [ -f "$cuda/include/cuda_runtime_api.h" ] && [ -f "$cuda/include/nccl.h" ]; then
  out=$(mktemp -d)
  g=$src/tests/gpu
  if ${CC:-cc} -Wall -Wextra -Werror -I "$src/include" -I "$src/tools" -I "$b" -I "$cuda/include" "$g/gpu_coll.c" \
    "$g/gpu_nccl_ref.c" "$g/gpu_harness.c" "$src/tools/bench_util.c" -L"$b/.libs" -ldcomm -L"$cuda/lib64" -lnccl -lcudart \
    -lm -o "$out/gpu_coll" 2>"$out/log" &&
    ${CC:-cc} -Wall -Wextra -Werror -I "$src/include" -I "$cuda/include" "$g/gpu_shrink.c" "$g/gpu_harness.c" \
      -L"$cuda/lib64" -lcudart -ldl -lpthread -o "$out/gpu_shrink" 2>>"$out/log" &&
    ${CC:-cc} -Wall -Wextra -Werror -I "$src/include" -I "$cuda/include" "$g/gpu_elastic.c" -L"$b/.libs" -ldcomm \
      -L"$cuda/lib64" -lcudart -o "$out/gpu_elastic" 2>>"$out/log"; then
    echo "ok: tests/gpu programs compile and link"
  else
    fail "tests/gpu programs do not build: $(head -n 5 "$out/log")"
  fi
  rm -rf "$out"
else
  echo "note: no CUDA headers under $cuda; tests/gpu programs not compiled"
fi
exit $status
