#!/usr/bin/env bash
# tests/plugin_oot.sh: dcomm installs what a backend written outside the
# tree needs, and loads such a backend. The script installs the build into
# a scratch root (make install DESTDIR=...), builds tests/plugin/selfloop.c
# against the installed dcomm_plugin.h alone and a small program through
# `pkg-config --cflags --libs dcomm`, then checks that:
#   - DCOMM_BACKEND=selfloop runs the program's collectives in the module
#     (its log lines, under its own subsystem "selfloop");
#   - dcomm_probe on it, which has no probe op, says DCOMM_ENOTSUP;
#   - dcomm-info -e lists the parameter the module declares;
#   - a module with only the mandatory part of the table loads;
#   - a table shorter than that is refused, naming the file.
# Environment: top_builddir (default .). Exit 0 pass, 1 fail, 77 skip.
set -u
b=$(cd "${top_builddir:-.}" && pwd)
src=$(cd "${top_srcdir:-.}" && pwd)
[ -f "$b/Makefile" ] || { echo "skip: no build tree at $b"; exit 77; }
command -v pkg-config >/dev/null || { echo "skip: pkg-config is not installed"; exit 77; }
T=$(mktemp -d /tmp/dcomm-plugin.XXXXXX)
trap 'rm -rf "$T"' EXIT
. "$src/tests/lib.sh"
CC=${CC:-cc}

if ! install_scratch; then
  result 1 "make install into a scratch root" "$(tail -5 "$T/install.log")"
  finish
fi
export PKG_CONFIG_PATH=$(dirname "$pc")
inc=$(pkg-config --variable=includedir dcomm)
lib=$(pkg-config --variable=libdir dcomm)
bindir=$(pkg-config --variable=exec_prefix dcomm)/bin
export PKG_CONFIG_SYSROOT_DIR=$T/root
hdrs=$(ls "$T/root$inc")
if [ -f "$T/root$inc/dcomm.h" ] && [ -f "$T/root$inc/dcomm_plugin.h" ] && [ -f "$T/root$inc/dcomm_elastic.h" ]; then
  result 0 "make install puts the public and plugin headers in includedir ($(echo $hdrs))"
else
  result 1 "make install puts the public and plugin headers in includedir" "found: $hdrs"
fi

# The module, from the installed header only (no -I into the source tree).
build_mod() { # name extra-cflags...
  local name=$1; shift
  $CC -std=c99 -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden -I"$T/root$inc" "$@" \
    "$src/tests/plugin/selfloop.c" -o "$T/mods/$name/dcomm_selfloop.so" 2>"$T/cc.$name"
}
mkdir -p "$T/mods/full" "$T/mods/short" "$T/mods/tooshort"
if build_mod full && build_mod short '-DSELFLOOP_SIZE=DCOMM_BACKEND_V1_MIN_SIZE' &&
  build_mod tooshort '-DSELFLOOP_SIZE=(DCOMM_BACKEND_V1_MIN_SIZE-sizeof(void*))'; then
  result 0 "a backend builds out of the tree against the installed dcomm_plugin.h alone (-std=c99 -Werror)"
else
  result 1 "a backend builds out of the tree against the installed dcomm_plugin.h" "$(cat "$T"/cc.* | head -20)"
  finish
fi

cat >"$T/prog.c" <<'PROG'
#include <dcomm.h>
#include <stdio.h>
#include <string.h>
int main(void) {
  if (dcomm_init("selfloop", NULL) != 0) {
    printf("init failed: %s\n", dcomm_last_error());
    return 1;
  }
  float x[4] = {1, 2, 3, 4};
  int rc = dcomm_all_reduce(x, 4, DCOMM_FLOAT32, DCOMM_SUM, NULL);
  if (rc == 0) rc = dcomm_barrier(NULL);
  printf("backend=%s rc=%d x=%g,%g,%g,%g\n", dcomm_backend_name(), rc, x[0], x[1], x[2], x[3]);
  int src;
  size_t nb;
  int pr = dcomm_probe(DCOMM_ANY_SOURCE, 0, NULL, 0, &src, &nb);
  printf("probe=%s (%s)\n", dcomm_error_name(pr), dcomm_last_error());
  dcomm_finalize();
  return rc != 0;
}
PROG
# A sanitizer build's library needs its runtime loaded first: the program
# is linked with the same flags.
if ! $CC -Wall -Werror $san "$T/prog.c" $(pkg-config --cflags --libs dcomm) -o "$T/prog" 2>"$T/cc.prog"; then
  result 1 "a program builds with pkg-config --cflags --libs dcomm" "$(head -5 "$T/cc.prog")"
  finish
fi
result 0 "a program builds with pkg-config --cflags --libs dcomm ($(pkg-config --cflags --libs dcomm))"

run_prog() { # module-dir
  env LD_LIBRARY_PATH="$T/root$lib" DCOMM_PLUGIN_PATH="$1" DCOMM_LOG_LEVEL=info DCOMM_LOG_SUBSYS=selfloop \
    RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$(free_port) \
    timeout 30 "$T/prog" >"$T/out" 2>"$T/err"
}
for m in full short; do
  run_prog "$T/mods/$m"
  if grep -q "backend=selfloop rc=0 x=1,2,3,4" "$T/out" && [ "$(grep -c 'selfloop: selfloop ran collective' "$T/err")" -ge 2 ]; then
    result 0 "DCOMM_BACKEND=selfloop ($m table) runs the collectives in the module, logging as 'selfloop'"
  else
    result 1 "DCOMM_BACKEND=selfloop ($m table) runs the collectives in the module"
  fi
  if grep -q "probe=DCOMM_ENOTSUP (.*the selfloop backend" "$T/out"; then
    result 0 "dcomm_probe on a backend without the probe op ($m table): DCOMM_ENOTSUP naming it"
  else
    result 1 "dcomm_probe on a backend without the probe op ($m table): DCOMM_ENOTSUP naming it" "$(grep probe= "$T/out")"
  fi
done
run_prog "$T/mods/tooshort"
if grep -q "init failed: .*dcomm_selfloop.so is not a dcomm backend of ABI version 1" "$T/out"; then
  result 0 "a table shorter than its mandatory ops is refused, naming the file"
else
  result 1 "a table shorter than its mandatory ops is refused, naming the file"
fi
# The elastic demo and the examples' sources are installed, and the demo
# runs from the install under the installed dcomm-run (what the pages show).
libexec=${bindir%/bin}/libexec/dcomm  # exec_prefix = prefix here
docex=${bindir%/bin}/share/doc/dcomm/examples
if [ -x "$T/root$libexec/elastic_sgd" ] && [ -f "$T/root$docex/elastic_sgd.c" ] && [ -f "$T/root$docex/torch/elastic_ddp.py" ] &&
  [ -f "$T/root$docex/k8s/job.yaml" ] && [ -f "$T/root$docex/slurm/dcomm-shrink.sbatch" ]; then
  out=$(LD_LIBRARY_PATH="$T/root$lib" timeout 60 "$T/root$bindir/dcomm-run" --nproc-per-node 2 -- \
    "$T/root$libexec/elastic_sgd" --steps 10 --checkpoint-every 5 --checkpoint-dir "$T/ck" 2>&1)
  if echo "$out" | grep -q "final step=10 world=2 generation=0 "; then
    result 0 "make install puts the elastic demo in libexec/dcomm and the examples in share/doc/dcomm/examples; the demo runs from there"
  else
    result 1 "the installed elastic demo runs under the installed dcomm-run" "$(echo "$out" | tail -5)"
  fi
else
  result 1 "make install puts the elastic demo in libexec/dcomm and the examples in share/doc/dcomm/examples" \
    "$(cd "$T/root" && find . -path '*libexec*' -o -path '*examples*' | head)"
fi
if DCOMM_PLUGIN_PATH=$T/mods/full LD_LIBRARY_PATH="$T/root$lib" "$T/root$bindir/dcomm-info" -e \
    >"$T/out" 2>"$T/err" && grep -q "DCOMM_SHM_SPIN" "$T/out"; then
  result 0 "dcomm-info -e lists the tcp backend's own parameters"
else
  result 1 "dcomm-info -e lists the tcp backend's own parameters"
fi
finish
