#!/usr/bin/env bash
# Install the Debian (12, bookworm) packages Lynx-C needs for what you are
# about to do: each make goal installs its target's list, no more.
#
#   deploy/install-deps.sh [--all] [TARGET...]   install what is missing
#   deploy/install-deps.sh --list [TARGET...]    print the packages, one a
#                                                line; installs nothing
#   deploy/install-deps.sh --help                the targets and their lists
#
# TARGET (several: the union of their lists; every one includes build):
#   build   what compiling takes (part of every target): the toolchain,
#           cmake, protoc-c, and the libraries the daemons, lynxctl (ncurses
#           for lynxctl top), the unit tests (cmocka) and the test and bench
#           tools (libmemcached) link; CMake requires every one of them
#   run     build + sockperf and curl, the commands make run's banner and
#           the README tell you to send the demo traffic and read its
#           metrics with (make, make build, make run)
#   run-ha  run + etcd (etcd-server, and etcdctl) and procps (pgrep): make
#           run-ha's cluster and its banner's commands (make run-ha)
#   test    run + every tool the test suite runs or skips without: jq,
#           memcached, etcd, libfaketime, gnutls-bin, systemd-analyze,
#           debootstrap, Python's yaml and jsonschema, Chromium with
#           chromedriver and Selenium, clang's libFuzzer, the Fashion-MNIST
#           images, promtool, clang-format 14 and cppcheck (make test, test-all, test-sanitize, test-faults, test-busy)
#   fuzz    build + clang and its libFuzzer runtime (make fuzz)
#   deb     build + dpkg-dev, and debootstrap and sockperf for the
#           packages' install test in a clean root (make deb)
#   bench   run + jq, memcached, etcd and the Fashion-MNIST images
#           (make bench, bench-*, bench/*.sh)
#   lenet   build + the Fashion-MNIST images and python3-numpy, for the
#           model's training script (docs/lenet.md)
#   arm64   build + what cross-compiling for arm64 and testing under
#           emulation take (make test-arm64, make LYNX_ARCH=arm64): the
#           arm64 architecture for dpkg, Debian's cross toolchain, the arm64
#           development packages (multiarch), qemu-user, and what those
#           tests run beside the programs (sockperf, curl, jq, the images)
# No TARGET: every target but arm64 (what the script installed before it
# had targets). --arm64 is the target arm64 (alone: with every other one,
# as before).
#
#   --all   hand apt every package of the targets (installed ones are left
#           at their version: repairs half-installed ones)
#
# Idempotent: it asks dpkg first and calls apt-get only for what is missing,
# so a second run on a ready machine makes no apt call (a tenth of a
# second), and says nothing. When it installs, it says for which target
# and what: "install-deps (run): installing sockperf curl".
#
# Nothing it installs replaces the init system (of a container, a minimal
# VM, a machine booted with sysvinit or runit), whichever target: packages
# go in without their Recommends, and no list pulls systemd-sysv (the
# package that makes systemd the init) or another init. On Debian 12 one
# did: Chromium's GTK needs a D-Bus session bus, apt's first choice of it is
# dbus-user-session, which depends on libpam-systemd, which depends on
# systemd-sysv. dbus-x11, listed with chromium, is the other session bus and
# pulls no such thing. The test target's `systemd` (for systemd-analyze) is
# the service manager's package only: installed, it neither becomes init
# nor starts. integration.install_deps_lists resolves every target's list
# with apt as on a fresh machine and fails on any init package
# (docs/install.md).
#
# Another package manager at work (unattended-upgrades, an apt in another
# terminal) holds the dpkg lock: apt-get waits for it up to
# LYNX_APT_LOCK_WAIT seconds (default 600), saying who holds it, instead of
# failing at once.
# shellcheck disable=SC2034
set -euo pipefail

TARGETS=(build run run-ha test fuzz deb bench lenet arm64)
DEFAULT_TARGETS=(build run run-ha test fuzz deb bench lenet)
# what each target includes besides its own list (build: all of them)
declare -A INCLUDES=([build]="" [run]=build [run-ha]=run [test]=run [fuzz]=build
  [deb]=build [bench]=run [lenet]=build [arm64]=build)
# Each target's own packages: P_<target> ('-' as '_'), and Q_<target> for
# those with a service (below); read through `own` (a nameref: hence
# the check for unused variables, SC2034, is off for the file).

P_build=(
  build-essential cmake pkg-config
  libuv1-dev liburing-dev libjson-c-dev libprotobuf-c-dev protobuf-c-compiler
  libibverbs-dev librdmacm-dev
  libmicrohttpd-dev libjansson-dev libcurl4-openssl-dev libssl-dev
  # TLS on the API and the control connections (docs/tls.md)
  libgnutls28-dev
  # systemd readiness (sd_notify, Type=notify units: deploy/systemd/)
  libsystemd-dev
  # lynxctl top's screen (ncurses: cli/top_view.c)
  libncurses-dev
  # the LeNet weights' CRC-32, and the tools that read gzipped images
  zlib1g-dev
  # the unit tests (cmocka) and the face-verify tools (libmemcached),
  # built with everything else
  libcmocka-dev libmemcached-dev
)
P_run=(
  # what make run's banner and the README's make run section run
  sockperf curl
)
P_run_ha=(
  # the coordinators' store (--etcd: docs/etcd.md), etcdctl for operators;
  # pgrep in the banner's "kill the leader"
  etcd-server etcd-client procps
)
P_test=(
  jq memcached iproute2 procps python3
  # the coordinator's store for several coordinators (--etcd, issue 16)
  etcd-server etcd-client
  # an agent whose wall clock was stepped back (libfaketime)
  faketime
  # the lenet app's test images (unit_lenet, integration.lenet)
  dataset-fashion-mnist
  # certtool for deploy/make-test-ca.sh, gnutls-cli for the tls test
  gnutls-bin
  # systemd-analyze, which checks the units (integration.systemd_units):
  # the service manager's package, not systemd-sysv (see above)
  systemd
  # the packages' install test in a clean bookworm root
  # (integration.deb_install: cpack's dpkg-shlibdeps, debootstrap)
  dpkg-dev debootstrap
  # the Kubernetes manifests' check (deploy/k8s/check.py), and the API's
  # OpenAPI description checked against the code and a live coordinator
  # (docs/openapi.yaml, integration.openapi)
  python3-yaml python3-jsonschema
  # the web console's test in a real browser (integration.console): headless
  # Chromium driven through chromedriver by Debian's Selenium; dbus-x11 is
  # the D-Bus session bus GTK wants that does not pull systemd-sysv (see
  # above)
  chromium chromium-driver python3-selenium dbus-x11
  # the fuzz_*.libfuzzer tests (docs/fuzzing.md)
  clang libclang-rt-dev
  # the code's own checks (HACKING.md, "Checks"): its format (lint.format:
  # clang-format 14, the version .clang-format was written for) and
  # static analysis (lint.cppcheck)
  clang-format-14 cppcheck
)
P_fuzz=(
  # clang and its libFuzzer runtime (only recommended by clang, and
  # recommends are not installed here): docs/fuzzing.md
  clang libclang-rt-dev
)
P_deb=(
  # dpkg-shlibdeps for cpack's Depends; the install test's clean root
  # (integration.deb_install) and its traffic
  dpkg-dev debootstrap sockperf
)
P_bench=(
  jq memcached etcd-server dataset-fashion-mnist
)
P_lenet=(
  # tools/train-lenet.py and its data (docs/lenet.md)
  dataset-fashion-mnist python3-numpy
)
# the cross toolchain, qemu-user, and every library the build links, for
# arm64 (docs/bluefield.md); the host's sockperf, curl and jq talk to the
# emulated programs, and unit_lenet reads the images
P_arm64=(
  crossbuild-essential-arm64 qemu-user-static
  libuv1-dev:arm64 liburing-dev:arm64 libjson-c-dev:arm64
  libprotobuf-c-dev:arm64 libibverbs-dev:arm64 librdmacm-dev:arm64
  libmicrohttpd-dev:arm64 libjansson-dev:arm64 libcmocka-dev:arm64
  libcurl4-openssl-dev:arm64 libssl-dev:arm64
  zlib1g-dev:arm64 libgnutls28-dev:arm64 libsystemd-dev:arm64
  libncurses-dev:arm64
  sockperf curl jq dataset-fashion-mnist
)
# (not libmemcached-dev:arm64: Debian's is not co-installable with the
# host's, which the native build needs; the arm64 build goes without the
# benchmark tools that use it)

# Packages that ship a server Lynx-C does not want running: installed in an
# apt call of their own with service starts refused (a policy-rc.d for the
# duration of the call, where the machine has none: invoke-rc.d and
# deb-systemd-invoke obey it), then their units disabled, so neither the
# install (in CI, on a developer's machine) nor a reboot starts them.
Q_test=(
  # promtool only, never the server: integration.monitoring checks the alert
  # rules, the example configuration, the dashboard's queries and the
  # daemons' /metrics with it (deploy/monitoring/)
  prometheus
)

usage() {
  cat <<EOF
usage: $0 [--all] [--list] [TARGET...]
Installs the Debian packages Lynx-C needs for TARGET (several: all their
packages; each includes build), only those missing; without TARGET, for
every target but arm64. --all hands apt every package of the targets (a
repair); --list prints them, one a line, and installs nothing. --arm64 is
the target arm64. Nothing installed replaces the init system.

targets (the make goals that install them) and their packages:
EOF
  local t
  declare -A GOAL=([build]="in every target" [run]="make, make build, run" [run-ha]="run-ha"
    [test]="test, test-all, test-sanitize, test-faults, test-busy" [fuzz]="fuzz" [deb]="deb" [bench]="bench*"
    [lenet]="no goal: docs/lenet.md" [arm64]="test-arm64, LYNX_ARCH=arm64")
  for t in "${TARGETS[@]}"; do
    own "$t"
    printf '%s\n' "$t (${GOAL[$t]}):" ${INCLUDES[$t]:+"${INCLUDES[$t]} +"} "${OWN[@]}" \
      ${OWNQ[@]:+"${OWNQ[@]/%/ (no service started)}"} |
      awk 'NR == 1 { printf "  %s\n   ", $0; w = 3; next }
           { if (w + length($0) + 1 > 78) { printf "\n   "; w = 3 }
             printf " %s", $0; w += length($0) + 1 }
           END { print "" }'
  done
}

# own TARGET: OWN, OWNQ = the target's own packages and no-service ones
own() {
  local -n l=P_${1//-/_}
  OWN=("${l[@]}") OWNQ=()
  if declare -p "Q_${1//-/_}" >/dev/null 2>&1; then
    local -n q=Q_${1//-/_}
    OWNQ=("${q[@]}")
  fi
}

ALL=0 LIST=0 ARM64_OPT=0 WANT=()
for a in "$@"; do
  case $a in
  --all) ALL=1 ;;
  --list) LIST=1 ;;
  --arm64) ARM64_OPT=1 ;;
  -h | --help) usage; exit 0 ;;
  -*) echo "install-deps: unknown option '$a'" >&2; usage >&2; exit 2 ;;
  *)
    [[ -v INCLUDES[$a] ]] || { echo "install-deps: unknown target '$a'" >&2; usage >&2; exit 2; }
    WANT+=("$a") ;;
  esac
done
if ((${#WANT[@]})); then
  ((ARM64_OPT)) && WANT+=(arm64)
  LABEL=${WANT[*]}
elif ((ARM64_OPT)); then
  WANT=("${DEFAULT_TARGETS[@]}" arm64) LABEL="every target"
else
  WANT=("${DEFAULT_TARGETS[@]}") LABEL="every target but arm64"
fi
LOCK_WAIT=${LYNX_APT_LOCK_WAIT:-600}
[[ $LOCK_WAIT =~ ^[0-9]+$ ]] ||
  { echo "install-deps: LYNX_APT_LOCK_WAIT='$LOCK_WAIT' is not a number of seconds" >&2; exit 2; }

# PKGS, QUIET_PKGS: the targets' packages with what they include, each once
PKGS=() QUIET_PKGS=()
declare -A SEEN=() ADDED=()
add_target() {
  local t=$1 p
  [[ -n ${ADDED[$t]:-} ]] && return 0
  ADDED[$t]=1
  [[ -n ${INCLUDES[$t]} ]] && add_target "${INCLUDES[$t]}"
  own "$t"
  for p in "${OWN[@]}"; do
    [[ -n ${SEEN[$p]:-} ]] || { SEEN[$p]=1; PKGS+=("$p"); }
  done
  for p in "${OWNQ[@]}"; do
    [[ -n ${SEEN[$p]:-} ]] || { SEEN[$p]=1; QUIET_PKGS+=("$p"); }
  done
}
for t in "${WANT[@]}"; do add_target "$t"; done
ARM64=${ADDED[arm64]:-0}

if ((LIST)); then
  printf '%s\n' "${PKGS[@]}" "${QUIET_PKGS[@]}"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
if ((ARM64)); then
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    echo "install-deps ($LABEL): adding the arm64 architecture to dpkg (multiarch)" >&2
    $SUDO dpkg --add-architecture arm64
    ARM64_NEW=1
  fi
fi

# installed: for a name without an architecture, the host's (or "all")
# instance, not another architecture's (multiarch: arm64). One
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
  echo "install-deps ($LABEL): checking all ${#PKGS[@]} packages with apt: ${PKGS[*]}" >&2
  apt_install --no-upgrade "${PKGS[@]}"
elif ((${#missing[@]})); then
  echo "install-deps ($LABEL): installing ${missing[*]}" >&2
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
echo "install-deps ($LABEL): installing ${quiet[*]} (no service of theirs started)" >&2
apt_install "${opts[@]}" "${quiet[@]}"
for p in "${quiet_missing[@]}"; do # newly installed: keep them from boot too
  if command -v systemctl >/dev/null 2>&1; then
    $SUDO systemctl disable --quiet "$p.service" 2>/dev/null || true
  fi
  if [[ -x /etc/init.d/$p ]] && command -v update-rc.d >/dev/null 2>&1; then
    $SUDO update-rc.d "$p" disable >/dev/null 2>&1 || true
  fi
done
