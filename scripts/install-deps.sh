#!/usr/bin/env bash
# scripts/install-deps.sh: installs what building and testing dcomm needs
# on a fresh Debian 12 machine (run as root). Safe to run again.
set -euo pipefail
pkgs=(build-essential autoconf automake libtool pkg-config check uuid-dev nettle-dev zlib1g-dev
      libcurl4-openssl-dev libjansson-dev libpmix-dev libpmix-bin openmpi-bin libopenmpi-dev
      iproute2 groff-base man-db procps bc strace etcd-server etcd-client curl python3-yaml openssl slurm-wlm munge
      python3-torch python3-numpy python3-pytest clang-14 libclang-rt-14-dev)
command -v npm >/dev/null 2>&1 || pkgs+=(nodejs npm) # tests/k8s_yaml.sh: schema check (a nodejs that brings its own npm is kept)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
