#!/usr/bin/env bash
# Install the Debian packages Lynx-C builds and tests with.
# Idempotent: it asks dpkg first and calls apt-get only for what is missing,
# so a second run on a ready machine takes well under a second.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config
  libuv1-dev libjson-c-dev libprotobuf-c-dev protobuf-c-compiler
  libibverbs-dev librdmacm-dev
  libmicrohttpd-dev libjansson-dev libcmocka-dev libcurl4-openssl-dev
  libmemcached-dev
  sockperf memcached iproute2 procps jq
)

missing=()
for p in "${PKGS[@]}"; do
  st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$st" == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
# Update the package index only when the first attempt cannot find a package.
if ! $SUDO apt-get install -y --no-install-recommends "${missing[@]}"; then
  $SUDO apt-get update
  $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi
