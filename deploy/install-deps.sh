#!/usr/bin/env bash
# Install the Debian packages Lynx-C builds and tests with.
# Idempotent: it asks dpkg first and calls apt-get only for what is missing,
# so a second run on a ready machine takes well under a second.
#
#   deploy/install-deps.sh          install what is missing
#   deploy/install-deps.sh --all    hand apt the whole list (installed
#                                   packages are left at their version:
#                                   repairs half-installed ones)
#
# Another package manager at work (unattended-upgrades, an apt in another
# terminal) holds the dpkg lock: apt-get waits for it up to
# LYNX_APT_LOCK_WAIT seconds (default 600), saying who holds it, instead of
# failing at once.
set -euo pipefail

ALL=0
case ${1:-} in
--all) ALL=1 ;;
"") ;;
*) echo "usage: $0 [--all]" >&2; exit 2 ;;
esac
LOCK_WAIT=${LYNX_APT_LOCK_WAIT:-600}
[[ $LOCK_WAIT =~ ^[0-9]+$ ]] ||
  { echo "install-deps: LYNX_APT_LOCK_WAIT='$LOCK_WAIT' is not a number of seconds" >&2; exit 2; }

PKGS=(
  build-essential cmake pkg-config
  libuv1-dev liburing-dev libjson-c-dev libprotobuf-c-dev protobuf-c-compiler
  libibverbs-dev librdmacm-dev
  libmicrohttpd-dev libjansson-dev libcmocka-dev libcurl4-openssl-dev libssl-dev
  libmemcached-dev
  sockperf memcached iproute2 procps jq
  # the coordinator's store for several coordinators (--etcd, issue 16):
  # the server for tests and make run-ha, etcdctl for operators and tests
  etcd-server etcd-client
  # tests: an agent whose wall clock was stepped back (libfaketime)
  faketime
  # the lenet app (docs/lenet.md): its test images, its training script, and
  # zlib for the tools and tests that read the gzipped images
  dataset-fashion-mnist python3-numpy zlib1g-dev
  # TLS on the API and the control connections (docs/tls.md): GnuTLS, and
  # certtool for deploy/make-test-ca.sh; gnutls-cli for the tls test
  libgnutls28-dev gnutls-bin
  # fuzzing (docs/fuzzing.md): clang and its libFuzzer runtime for make fuzz
  # and the fuzz_*.libfuzzer tests (the runtime is only recommended by
  # clang, and recommends are not installed here)
  clang libclang-rt-dev
)

missing=()
for p in "${PKGS[@]}"; do
  st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$st" == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]} == 0 && !ALL)); then
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
# apt-get waiting for the dpkg lock (and saying who holds it)
apt_get() {
  $SUDO apt-get -o DPkg::Lock::Timeout="$LOCK_WAIT" "$@"
}
if ((ALL)); then
  echo "install-deps: checking all ${#PKGS[@]} packages with apt" >&2
  set -- --no-upgrade "${PKGS[@]}"
else
  echo "install-deps: installing ${missing[*]}" >&2
  set -- "${missing[@]}"
fi
# Update the package index only when the first attempt cannot find a package.
if ! apt_get install -y --no-install-recommends "$@"; then
  apt_get update
  apt_get install -y --no-install-recommends "$@"
fi
