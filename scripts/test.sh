#!/usr/bin/env bash
# scripts/test.sh: the project's test command. Installs the packages, builds
# from scratch with warnings as errors, runs `make check` (every suite
# bounds its own time), then the same suites under AddressSanitizer and
# UndefinedBehaviorSanitizer in a separate build tree, then every libFuzzer
# target for FUZZ_SECONDS (default 20) seconds from its committed corpus.
#   scripts/test.sh            full run
#   SKIP_SANITIZERS=1 scripts/test.sh   plain build only
#   SKIP_FUZZ=1 scripts/test.sh         no fuzzing step
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
bash scripts/install-deps.sh
[ -x configure ] || ./autogen.sh
jobs=$(nproc)

run_build() { # dir, configure args...
  local dir=$1; shift
  mkdir -p "$dir"
  (cd "$dir" && "$top/configure" --enable-werror "$@" >configure.out 2>&1 || { cat configure.out; exit 1; }
   tail -12 configure.out
   make -j"$jobs" >make.out 2>&1 || { cat make.out; exit 1; }
   set +e
   make -j1 check 2>&1 | tee check.out
   rc=${PIPESTATUS[0]}
   set -e
   echo "$(basename "$dir"): $(grep -c '^PASS:' check.out) passed, $(grep -c '^FAIL:' check.out) failed, $(grep -c '^SKIP:' check.out) skipped"
   exit "$rc")
}

run_build "$top/build"
if [ "${SKIP_SANITIZERS:-0}" != 1 ]; then
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
  export LSAN_OPTIONS=suppressions=$top/tests/lsan.supp:print_suppressions=0
  run_build "$top/build-asan" --enable-sanitizers
fi
if [ "${SKIP_SANITIZERS:-0}" != 1 ] && [ "${SKIP_FUZZ:-0}" != 1 ]; then
  unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS # libFuzzer sets its own
  mkdir -p "$top/build-fuzz"
  (cd "$top/build-fuzz" && CC=clang-14 "$top/configure" --enable-werror --enable-fuzzing >configure.out 2>&1 ||
     { cat configure.out; exit 1; }
   make -j"$jobs" fuzz >make.out 2>&1 || { cat make.out; exit 1; }
   FUZZ_ARTIFACTS=$top/build-fuzz/artifacts make fuzz FUZZ_SECONDS="${FUZZ_SECONDS:-20}")
fi
total_pass=$(cat "$top"/build*/check.out | grep -c '^PASS:' || true)
echo "dcomm: $total_pass passed, 0 failed"
