#!/usr/bin/env bash
# tests/k8s_yaml.sh: checks the Kubernetes example (examples/k8s/*.yaml)
# for what a user of it relies on.
#
# Plain checks (python3-yaml): every document is a well-formed object; each
# Job is Indexed with parallelism == completions, ends when one pod
# succeeded, replaces lost pods, fails at once on dcomm-run's exit 2 (bad
# arguments) and ignores disruptions (podFailurePolicy), has
# ttlSecondsAfterFinished and an activeDeadlineSeconds above DCOMM_TIMEOUT,
# spreads its pods one per machine (topologySpreadConstraints DoNotSchedule
# on kubernetes.io/hostname); its pods run dcomm-run with the etcd
# rendezvous, an --rdzv-endpoint that is the client Service of etcd.yaml (or
# its members) on a port that reaches etcd's client port, --rdzv-id,
# --nnodes MIN:MAX with MAX == parallelism and --nproc-per-node (== the
# nvidia.com/gpu limit with DCOMM_BACKEND=nccl); the checkpoint directory is
# the mount of a ReadWriteMany claim defined in a file without a Job; the
# grace period covers dcomm-run's 10 s SIGTERM forwarding; the images are
# registry.example.com placeholders named in README.md; the etcd
# StatefulSet has as many replicas as --initial-cluster has members, named
# after its pods and its headless Service, and a required anti-affinity;
# the NetworkPolicies let the jobs' pods reach each other on any port and
# etcd on its client port, the members reach each other on the peer port,
# and keep other pods out; every $(VAR) in the arguments is defined.
#
# Schema check: every document is validated against the Kubernetes 1.33 API
# schema by the npm package kubernetes-models 4.5.1 (its generated
# validate(): types, enums, required fields), made strict here (a field
# that the schema does not know is an error, as the API server's strict
# field validation says); broken copies of job.yaml (misspelled fields, a
# wrong enum value) must be rejected. The package is installed with npm
# (timeout K8S_NPM_TIMEOUT, default 120 s) into K8S_SCHEMA_DIR, else
# $top_builddir/tests/k8s-schema for a separate build tree, else a temporary
# folder; with no node/npm or no registry the test ends with 77 (skip)
# after the plain checks, or 1 if one of them failed.
#
# The checks are Python under tests/k8s/: check.py (the driver),
# manifests.py (loading, TAP counters), plain_checks.py, schema_check.py
# and validate.js (run by node).
#
# Environment: top_srcdir or srcdir (the source tree; default: this
# script's ..), top_builddir, PYTHON (a python3 with the yaml module,
# Debian's python3-yaml), NODE, NPM, DCOMM_LIBRARY (a sanitizer build of it: skip).
# Exit status: 0 pass, 1 fail, 77 skip.
set -u
src=${top_srcdir:-${srcdir:-$(dirname "$0")/..}}
dir=$src/examples/k8s
# The manifests do not touch the library: a sanitizer build has nothing to add.
if [ -n "${DCOMM_LIBRARY:-}" ] && ldd "$DCOMM_LIBRARY" 2>/dev/null | grep -q 'libasan\|libtsan'; then
  echo "skip: sanitizer build (the plain build checks the manifests)"
  exit 77
fi

py=
for c in ${PYTHON:-} python3 /usr/bin/python3; do
  if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import yaml' 2>/dev/null; then
    py=$c
    break
  fi
done
if [ -z "$py" ]; then
  echo "skip: no python3 with the yaml module (apt-get install python3-yaml)"
  exit 77
fi

exec "$py" "$src/tests/k8s/check.py" "$dir" "$src" "${top_builddir:-}"
