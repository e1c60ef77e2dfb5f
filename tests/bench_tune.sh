#!/usr/bin/env bash
# tests/bench_tune.sh: dcomm-bench --tune writes a tuning file the library
# reads, on 2 ranks under dcomm-run:
#   1. over shared memory: exit 0, the four settings with values of their
#      type, comments naming this CPU and the world;
#   2. over tcp (DCOMM_TRANSPORT=tcp): no DCOMM_SHM_CMA_MIN nor
#      DCOMM_SHM_CMA_FWD_MIN, and it says why;
#   3. dcomm-info names the file in force and marks the values it gave;
#      dcomm-bench runs with it and its check passes;
#   4. a bad line and a bad value in a tuning file fail dcomm_init naming
#      the file and line or the variable.
#   5. -e below 1M is refused naming -e, before joining any job.
# Which values it picks depends on the machine: the test checks their form.
# A sanitizer build tunes up to 4M only (-e 4M): its 64 MiB all_reduce
# takes 0.2-0.3 s, and the full range needs 50-90 s on 2 cores.
set -u
b=${top_builddir:-.}
[ -x "$b/dcomm-bench" ] && [ -x "$b/dcomm-run" ] && [ -x "$b/dcomm-info" ] || { echo "skip: dcomm-bench not built"; exit 77; }
cap=() top=64M next=16M
lib=$(ls "$b"/.libs/libdcomm.so.0 2>/dev/null)
if [ -n "$lib" ] && ldd "$lib" | grep -q 'libasan\|libtsan'; then
  cap=(-e 4M) top=4M next=1M
fi
work=$(mktemp -d /tmp/dcomm-bench-tune.XXXXXX)
trap 'rm -rf "$work"' EXIT
unset DCOMM_TUNING_FILE DCOMM_SHM_SPIN DCOMM_TCP_SMALL_THRESHOLD DCOMM_SHM_CMA_MIN DCOMM_SHM_CMA_FWD_MIN DCOMM_ALGO
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok - $1"; }
bad() { fail=$((fail + 1)); echo "not ok - $1"; shift; for f in "$@"; do tail -n 12 "$f" | sed 's/^/    /'; done; }
tune() { # FILE [VAR=VALUE...]: runs the tuning on 2 ranks
  local f=$1; shift
  env "$@" timeout 240 "$b/dcomm-run" --quiet-prefix --nproc-per-node 2 -- "$b/dcomm-bench" --tune "$f" ${cap[@]+"${cap[@]}"} \
    >"$f.out" 2>"$f.err"
}
cpu=$(sed -n 's/^model name[[:space:]]*: *//p' /proc/cpuinfo | head -1)

f=$work/shm.conf
tune "$f"
rc=$?
settings=$(grep -v '^#' "$f" 2>/dev/null)
if [ $rc -eq 0 ] && [ "$(echo "$settings" | wc -l)" -eq 4 ] &&
   echo "$settings" | grep -qx 'DCOMM_SHM_SPIN=\(0\|10\|50\|200\)' &&
   echo "$settings" | grep -qx 'DCOMM_TCP_SMALL_THRESHOLD=[0-9]\+' &&
   echo "$settings" | grep -qx 'DCOMM_SHM_CMA_MIN=[0-9]\+' &&
   echo "$settings" | grep -qx 'DCOMM_SHM_CMA_FWD_MIN=[0-9]\+' &&
   grep -q "^#   *$top  *[0-9.]\\+  *[0-9.]\\+\$" "$f" &&
   grep -qF "# CPU: ${cpu:-unknown}; 2 ranks on one host (shared memory)" "$f" &&
   grep -q "^#   *$next  *[0-9.]\\+  *[0-9.]\\+\$" "$f" &&
   if [ ${#cap[@]} -gt 0 ]; then grep -qxF "# Sizes measured up to $top only (-e $top)" "$f" &&
     ! grep -q '^#   *16M ' "$f"; else ! grep -q '^# Sizes measured' "$f"; fi; then
  ok "shared memory: the four settings, the CPU, the world and the tables to $top ($(echo $settings))"
else
  bad "shared memory: exit $rc" "$f.out" "$f.err" "$f"
fi

g=$work/tcp.conf
tune "$g" DCOMM_TRANSPORT=tcp
rc=$?
if [ $rc -eq 0 ] && [ "$(grep -vc '^#' "$g")" -eq 2 ] && ! grep -q '^DCOMM_SHM_CMA' "$g" &&
   grep -q 'DCOMM_SHM_CMA_MIN and DCOMM_SHM_CMA_FWD_MIN not tuned' "$g"; then
  ok "tcp: no single-copy setting, and the file says why"
else
  bad "tcp: exit $rc" "$g.out" "$g.err" "$g"
fi

spin=$(sed -n 's/^DCOMM_SHM_SPIN=//p' "$f")
info=$(DCOMM_TUNING_FILE=$f "$b/dcomm-info" 2>&1)
infoe=$(DCOMM_TUNING_FILE=$f "$b/dcomm-info" -e 2>&1 | grep -A1 '^DCOMM_SHM_SPIN$')
out=$(DCOMM_TUNING_FILE=$f timeout 60 "$b/dcomm-run" --quiet-prefix --nproc-per-node 2 -- "$b/dcomm-bench" \
  -o all_reduce -b 8 -e 4M -f 8 -n 3 -w 1 2>&1)
rc=$?
if echo "$info" | grep -qxF "tuning file: $f (4 settings)" && echo "$infoe" | grep -qF "value: \"$spin\" (tuning file)" &&
   [ $rc -eq 0 ] && [ "$(echo "$out" | awk '!/^#/ && NF == 7' | wc -l)" -ge 7 ] &&
   [ "$(echo "$out" | awk '!/^#/ && NF == 7 && $7 != 0' | wc -l)" -eq 0 ]; then
  ok "dcomm-info names the file and marks its values; dcomm-bench runs with it, every result right"
else
  bad "using the file: exit $rc; dcomm-info: $info / $infoe" /dev/null
  echo "$out" | tail -5 | sed 's/^/    /'
fi

printf '# hand-written\nDCOMM_SHM_SPIN=10\nspin harder\n' >"$work/badline.conf"
printf 'DCOMM_ALGO=fastest\n' >"$work/badvalue.conf"
e1=$(DCOMM_TUNING_FILE=$work/badline.conf timeout 60 "$b/dcomm-run" --quiet-prefix --nproc-per-node 1 -- \
  "$b/dcomm-bench" -o all_reduce -b 8 -e 8 2>&1)
rc1=$?
e2=$(DCOMM_TUNING_FILE=$work/badvalue.conf timeout 60 "$b/dcomm-run" --quiet-prefix --nproc-per-node 1 -- \
  "$b/dcomm-bench" -o all_reduce -b 8 -e 8 2>&1)
rc2=$?
if [ $rc1 -ne 0 ] && echo "$e1" | grep -qF "tuning file $work/badline.conf, line 3: 'spin harder' is not DCOMM_NAME=VALUE" &&
   [ $rc2 -ne 0 ] && echo "$e2" | grep -qF "DCOMM_ALGO='fastest' is not"; then
  ok "a bad line names the file and line, a bad value the variable; dcomm_init fails"
else
  bad "bad tuning files: exits $rc1 $rc2" /dev/null
  printf '%s\n%s\n' "$e1" "$e2" | tail -8 | sed 's/^/    /'
fi
e3=$("$b/dcomm-bench" --tune "$work/never.conf" -e 512K 2>&1)
rc3=$?
if [ $rc3 -eq 2 ] && echo "$e3" | grep -qF "bad size '512K' for -e (at least 1M" && [ ! -e "$work/never.conf" ]; then
  ok "-e 512K is refused naming -e and the least size; no file written"
else
  bad "-e 512K: exit $rc3: $e3" /dev/null
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
