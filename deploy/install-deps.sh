#!/usr/bin/env bash
# Install the Debian packages Lynx-C builds and tests with.
# Idempotent: it asks dpkg first and calls apt-get only for what is missing,
# so a second run on a ready machine makes no apt call (a second or two).
#
#   deploy/install-deps.sh          install what is missing
#   deploy/install-deps.sh --all    hand apt the whole list (installed
#                                   packages are left at their version:
#                                   repairs half-installed ones)
#   deploy/install-deps.sh --arm64  also what cross-compiling for arm64 and
#                                   testing under emulation take (make
#                                   LYNX_ARCH=arm64, make test-arm64): the
#                                   arm64 architecture for dpkg, Debian's
#                                   cross toolchain, the arm64 development
#                                   packages (multiarch) and qemu-user
#
# Another package manager at work (unattended-upgrades, an apt in another
# terminal) holds the dpkg lock: apt-get waits for it up to
# LYNX_APT_LOCK_WAIT seconds (default 600), saying who holds it, instead of
# failing at once.
set -euo pipefail

ALL=0 ARM64=0
for a in "$@"; do
  case $a in
  --all) ALL=1 ;;
  --arm64) ARM64=1 ;;
  *) echo "usage: $0 [--all] [--arm64]" >&2; exit 2 ;;
  esac
done
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
  # systemd readiness (sd_notify, Type=notify units: deploy/systemd/), and
  # systemd-analyze, which checks the units (integration.systemd_units)
  libsystemd-dev systemd
  # packages (make deb: dpkg-shlibdeps) and their install test in a clean
  # bookworm root (integration.deb_install)
  dpkg-dev debootstrap
  # the Kubernetes manifests' check (deploy/k8s/check.py), and the API's
  # OpenAPI description checked against the code and a live coordinator
  # (docs/openapi.yaml, integration.openapi)
  python3-yaml python3-jsonschema
  # the web console's test in a real browser (integration.console): headless
  # Chromium driven through chromedriver by Debian's Selenium
  chromium chromium-driver python3-selenium
  # lynxctl top's screen (ncurses: coordinator/top_view.c)
  libncurses-dev
  # fuzzing (docs/fuzzing.md): clang and its libFuzzer runtime for make fuzz
  # and the fuzz_*.libfuzzer tests (the runtime is only recommended by
  # clang, and recommends are not installed here)
  clang libclang-rt-dev
)

# Packages that ship a server Lynx-C does not want running: installed in an
# apt call of their own with service starts refused (a policy-rc.d for the
# duration of the call, where the machine has none: invoke-rc.d and
# deb-systemd-invoke obey it), then their units disabled, so neither the
# install (in CI, on a developer's machine) nor a reboot starts them.
QUIET_PKGS=(
  # promtool only, never the server: integration.monitoring checks the alert
  # rules, the example configuration, the dashboard's queries and the
  # daemons' /metrics with it (deploy/monitoring/)
  prometheus
)

# --arm64: the cross toolchain, qemu-user, and every library the build
# links, for arm64 (docs/bluefield.md)
ARM64_PKGS=(
  crossbuild-essential-arm64 qemu-user-static
  libuv1-dev:arm64 liburing-dev:arm64 libjson-c-dev:arm64
  libprotobuf-c-dev:arm64 libibverbs-dev:arm64 librdmacm-dev:arm64
  libmicrohttpd-dev:arm64 libjansson-dev:arm64 libcmocka-dev:arm64
  libcurl4-openssl-dev:arm64 libssl-dev:arm64
  zlib1g-dev:arm64 libgnutls28-dev:arm64 libsystemd-dev:arm64
  libncurses-dev:arm64
)
# (not libmemcached-dev:arm64: Debian's is not co-installable with the
# host's, which the native build needs; the arm64 build goes without the
# benchmark tools that use it)
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
if ((ARM64)); then
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    echo "install-deps: adding the arm64 architecture to dpkg (multiarch)" >&2
    $SUDO dpkg --add-architecture arm64
    ARM64_NEW=1
  fi
  PKGS+=("${ARM64_PKGS[@]}")
fi

# installed: for a name without an architecture, the host's (or "all")
# instance, not another architecture's (multiarch: --arm64). One
# dpkg-query for every package (one per package took 3 s).
NATIVE=$(dpkg --print-architecture)
declare -A HAVE=()
while read -r want ok state pkg arch; do
  [[ "$want $ok $state" == "install ok installed" ]] && HAVE[$pkg:$arch]=1
done < <(dpkg-query -W -f='${Status} ${Package} ${Architecture}\n' 2>/dev/null)
installed() {
  local want=$1 arch=$NATIVE
  if [[ $want == *:* ]]; then
    arch=${want#*:} want=${want%%:*}
  fi
  [[ -n ${HAVE[$want:$arch]:-} || -n ${HAVE[$want:all]:-} ]]
}
missing=() quiet_missing=()
for p in "${PKGS[@]}"; do
  installed "$p" || missing+=("$p")
done
for p in "${QUIET_PKGS[@]}"; do
  installed "$p" || quiet_missing+=("$p")
done

if ((${#missing[@]} == 0 && ${#quiet_missing[@]} == 0 && !ALL)); then
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
# apt-get waiting for the dpkg lock (and saying who holds it)
apt_get() {
  $SUDO apt-get -o DPkg::Lock::Timeout="$LOCK_WAIT" "$@"
}
# Update the package index only when the first attempt cannot find a
# package (or the arm64 architecture was just added: its index is needed).
if ((${ARM64_NEW:-0})); then
  apt_get update
fi
apt_install() {
  if ! apt_get install -y --no-install-recommends "$@"; then
    apt_get update
    apt_get install -y --no-install-recommends "$@"
  fi
}
if ((ALL)); then
  echo "install-deps: checking all ${#PKGS[@]} packages with apt" >&2
  apt_install --no-upgrade "${PKGS[@]}"
elif ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}" >&2
  apt_install "${missing[@]}"
fi

# The QUIET_PKGS (all of them with --all, at their installed version).
quiet=("${quiet_missing[@]}") opts=()
((ALL)) && quiet=("${QUIET_PKGS[@]}") opts=(--no-upgrade)
((${#quiet[@]})) || exit 0
POLICY=/usr/sbin/policy-rc.d
if [[ ! -e $POLICY ]]; then
  trap '$SUDO rm -f "$POLICY"' EXIT
  printf '#!/bin/sh\n# deploy/install-deps.sh: no service starts during its apt call\nexit 101\n' |
    $SUDO tee "$POLICY" >/dev/null
  $SUDO chmod 755 "$POLICY"
fi
echo "install-deps: installing ${quiet[*]} (no service of theirs started)" >&2
apt_install "${opts[@]}" "${quiet[@]}"
for p in "${quiet_missing[@]}"; do # newly installed: keep them from boot too
  if command -v systemctl >/dev/null 2>&1; then
    $SUDO systemctl disable --quiet "$p.service" 2>/dev/null || true
  fi
  if [[ -x /etc/init.d/$p ]] && command -v update-rc.d >/dev/null 2>&1; then
    $SUDO update-rc.d "$p" disable >/dev/null 2>&1 || true
  fi
done
