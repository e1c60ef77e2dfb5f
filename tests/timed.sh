#!/usr/bin/env bash
# tests/timed.sh: the LOG_COMPILER of make check. Runs one test as it is
# and adds its wall time to tests/times.txt in the build tree, which
# scripts/test.sh prints slowest first (the CI budget is kept with it).
start=$(date +%s.%N)
"$@"
rc=$?
mkdir -p tests
awk -v s="$start" -v e="$(date +%s.%N)" -v t="$1" -v rc=$rc 'BEGIN { printf "%7.1f s  %s (exit %d)\n", e - s, t, rc }' >>tests/times.txt
exit $rc
