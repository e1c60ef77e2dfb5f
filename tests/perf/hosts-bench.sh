#!/usr/bin/env bash
# tests/perf/hosts-bench.sh: all_reduce on a world split into HOSTS hosts of
# PER ranks each on this one machine (DCOMM_HOST_ID = h<rank / PER>: shared
# memory within a host, TCP on loopback between hosts), the flat recursive
# doubling (DCOMM_ALGO=rd) against the hierarchical one (hier) and the
# automatic choice, interleaved, fastest of REPS (default 3). Prints
# microseconds per call by size. With RATE (for example 1gbit; needs root
# and iproute2) each job runs in a network namespace of its own whose
# loopback, the only path between the hosts (a host's ranks use shared
# memory), is limited to RATE by tc's token bucket: a network slower than
# memory, as between real hosts. A benchmark, not a test. Run from a build
# tree:
#   HOSTS=2 PER=2 [RATE=1gbit] tests/perf/hosts-bench.sh [build-dir]
set -euo pipefail
build=${1:-$PWD}
hosts=${HOSTS:-2}; per=${PER:-2}; reps=${REPS:-3}
min=${MINBYTES:-8}; max=${MAXBYTES:-262144}; iters=${ITERS:-200}
n=$((hosts * per))
rate=${RATE:-}
ns=dcomm-hosts-$$
tmp=$(mktemp -d); trap 'rm -rf "$tmp"; [ -z "$rate" ] || ip netns del "$ns" 2>/dev/null' EXIT
inns=()
if [ -n "$rate" ]; then
  ip netns add "$ns" && ip -n "$ns" link set lo up &&
    ip netns exec "$ns" tc qdisc add dev lo root tbf rate "$rate" burst 256kb latency 100ms ||
    { echo "hosts-bench: cannot make a namespace with a $rate loopback (root and iproute2 needed)" >&2; exit 1; }
  inns=(ip netns exec "$ns")
fi
cat >"$tmp/host.sh" <<EOF
#!/bin/sh
export DCOMM_HOST_ID=h\$((RANK / $per))
exec "\$@"
EOF
chmod +x "$tmp/host.sh"
algos="rd hier auto"
for r in $(seq "$reps"); do
  for a in $algos; do
    DCOMM_ALGO=$a "${inns[@]}" "$build/dcomm-run" --quiet-prefix --nproc-per-node "$n" -- "$tmp/host.sh" \
      "$build/dcomm-bench" -o all_reduce -b "$min" -e "$max" -f 4 -n "$iters" -w 20 -c 0 >"$tmp/$a.$r" 2>/dev/null
  done
done
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $hosts hosts x $per ranks (DCOMM_HOST_ID), between hosts ${rate:-loopback}, all_reduce float32, fastest of $reps, us"
printf "# %9s %10s %10s %10s %9s\n" bytes rd hier auto hier/rd
for size in $(awk '$1 ~ /^[0-9]+$/ {print $1}' "$tmp/rd.1"); do
  line=$(printf "%11s" "$size")
  for a in $algos; do
    t=$(cat "$tmp"/"$a".* | awk -v s="$size" '$1 == s {print $4}' | sort -g | head -1)
    line="$line $(printf "%10s" "$t")"
    eval "t_$a=$t"
  done
  echo "$line $(awk -v h="$t_hier" -v d="$t_rd" 'BEGIN {printf "%9.2f", h / d}')"
done
