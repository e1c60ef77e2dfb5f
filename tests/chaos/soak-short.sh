#!/usr/bin/env bash
# tests/chaos/soak-short.sh: the chaos soak's make-check form: at least 20
# faults of every kind over about two minutes (tests/chaos/soak.sh says what
# it injects and checks). SOAK_SEED replays a run.
here=$(cd "$(dirname "$0")" && pwd)
SOAK_MIN_FAULTS=${SOAK_MIN_FAULTS:-20} exec bash "$here/soak.sh" "${SOAK_SECONDS:-100}" ${SOAK_SEED:+"$SOAK_SEED"}
