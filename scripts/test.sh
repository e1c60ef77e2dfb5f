#!/usr/bin/env bash
# scripts/test.sh: the project's test command. Installs the packages, builds
# from scratch with warnings as errors, runs `make check` (every suite
# bounds its own time), then the same suites under AddressSanitizer and
# UndefinedBehaviorSanitizer in a separate build tree, the suites with
# threads of their own (the store server's loop, the elastic watcher,
# client threads) under ThreadSanitizer, then every libFuzzer target for
# FUZZ_SECONDS (default 5) seconds from its committed corpus.
#   scripts/test.sh            full run
#   SKIP_SANITIZERS=1 scripts/test.sh   plain build only
#   SKIP_TSAN=1 scripts/test.sh         no ThreadSanitizer step
#   SKIP_FUZZ=1 scripts/test.sh         no fuzzing step
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
bash scripts/install-deps.sh
[ -x configure ] || ./autogen.sh
jobs=$(nproc)

# The suites whose processes run threads of their own.
threaded_tests="tests/check_shm_ring tests/check_store tests/check_init tests/check_faults tests/check_checkpoint tests/check_groups tests/check_p2p tests/elastic_recovery.sh"

run_build() { # dir, configure args... (TESTS=... in the environment: only those)
  local dir=$1; shift
  mkdir -p "$dir"
  (cd "$dir" && "$top/configure" --enable-werror "$@" >configure.out 2>&1 || { cat configure.out; exit 1; }
   tail -12 configure.out
   make -j"$jobs" >make.out 2>&1 || { cat make.out; exit 1; }
   set +e
   rm -f tests/times.txt
   make -j1 check ${TESTS:+TESTS="$TESTS"} 2>&1 | tee check.out
   rc=${PIPESTATUS[0]}
   set -e
   [ -f tests/times.txt ] && { echo "$(basename "$dir"): the slowest tests"; sort -rn tests/times.txt | head -12; }
   echo "$(basename "$dir"): $(grep -c '^PASS:' check.out) passed, $(grep -c '^FAIL:' check.out) failed, $(grep -c '^SKIP:' check.out) skipped"
   exit "$rc")
}

run_build "$top/build"
if [ "${SKIP_SANITIZERS:-0}" != 1 ]; then
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
  export LSAN_OPTIONS=suppressions=$top/tests/lsan.supp:print_suppressions=0
  run_build "$top/build-asan" --enable-sanitizers
  unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS
fi
if [ "${SKIP_SANITIZERS:-0}" != 1 ] && [ "${SKIP_TSAN:-0}" != 1 ]; then
  # A report fails the process (exit 66), and with it the suite.
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 TESTS=$threaded_tests run_build "$top/build-tsan" --enable-sanitizers=thread
fi
if [ "${SKIP_SANITIZERS:-0}" != 1 ] && [ "${SKIP_FUZZ:-0}" != 1 ]; then
  # libFuzzer sets its own sanitizer options
  mkdir -p "$top/build-fuzz"
  (cd "$top/build-fuzz" && CC=clang-14 "$top/configure" --enable-werror --enable-fuzzing >configure.out 2>&1 ||
     { cat configure.out; exit 1; }
   make -j"$jobs" fuzz >make.out 2>&1 || { cat make.out; exit 1; }
   FUZZ_ARTIFACTS=$top/build-fuzz/artifacts make fuzz FUZZ_SECONDS="${FUZZ_SECONDS:-5}")
fi
total_pass=$(cat "$top"/build*/check.out | grep -c '^PASS:' || true)
echo "dcomm: $total_pass passed, 0 failed"
