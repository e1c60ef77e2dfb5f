#!/usr/bin/env bash
# tests/perf/fencing-bench.sh: the fencing campaign. Repeats every case of
# tests/fencing.sh (cut links and frozen nodes, agents and workers under a
# real etcd in network namespaces; the static launcher frozen) REPEAT times
# (default 20) and reports, per case, how often the cut-off node stayed in
# the job or fenced itself, and any second world with the seed to replay
# it (SEED=S FENCING_CASES=CASE REPEAT=1 tests/fencing.sh). Needs root,
# etcd and `ip netns`; run from a build directory (top_builddir=.):
#   REPEAT=20 bash ../tests/perf/fencing-bench.sh
# It takes about 20 s a case and repeat (13 cases x 20: about 90 minutes).
set -u
here=$(cd "$(dirname "$0")" && pwd)
export top_builddir=${top_builddir:-.} FENCING_CASES=${FENCING_CASES:-all} REPEAT=${REPEAT:-20}
log=$(mktemp /tmp/dcomm-fencing-bench.XXXXXX)
bash "$here/../fencing.sh" | tee "$log"
rc=${PIPESTATUS[0]}
echo "# per case: passed / stayed in the job / fenced itself"
for c in $(grep -o '^ok [0-9]* - [a-z0-9.-]*' "$log" | awk '{print $4}' | sort -u); do
  printf '#   %-20s %3d / %3d / %3d\n' "$c" "$(grep -c "^ok [0-9]* - $c " "$log")" \
    "$(grep "^ok [0-9]* - $c " "$log" | grep -c 'stayed in the job')" \
    "$(grep "^ok [0-9]* - $c " "$log" | grep -c 'fenced itself')"
done
grep '^not ok' "$log" | sed 's/^/# FAILED: /'
grep '^# second worlds' "$log"
rm -f "$log"
exit "$rc"
