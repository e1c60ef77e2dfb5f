#!/usr/bin/env bash
# tests/chaos/soak-short.sh: the chaos soak's make-check form: at least 20
# faults of every kind over about two minutes (tests/chaos/soak.sh says what
# it injects and checks). SOAK_SEED replays a run. A sanitizer build runs
# 60 s and at least 12 faults (the plain build runs the full form; CI's
# time budget).
here=$(cd "$(dirname "$0")" && pwd)
secs=100 min=20
if [ -n "${DCOMM_RUN:-}" ] && ldd "$DCOMM_RUN" 2>/dev/null | grep -q 'libasan\|libtsan'; then
  secs=60 min=12
fi
SOAK_MIN_FAULTS=${SOAK_MIN_FAULTS:-$min} exec bash "$here/soak.sh" "${SOAK_SECONDS:-$secs}" ${SOAK_SEED:+"$SOAK_SEED"}
