#!/usr/bin/env bash
# deb_install: the Debian packages (make deb: deploy/packaging.cmake) in a
# clean Debian 12 root.
#
#  1. A minimal bookworm root (debootstrap --variant=minbase, from the
#     machine's Debian mirror); skipped (77) when the mirror cannot be
#     reached; a debootstrap that fails with the mirror there is a failure.
#  2. lynx-coordinator, lynx-agent, lynx-frontend and lynxctl installed
#     there with apt, which brings the runtime libraries their Depends
#     name: the lynx system user exists, each daemon's program, unit and
#     configuration file (a conffile) are in place.
#  3. The daemons started as the units start them (their ExecStart lines,
#     as the lynx user, the state directory made as StateDirectory= makes
#     it), after the operator's edit of the configuration files (ports of
#     this test); a service serves sockperf from outside the root.
#  4. Purged: programs, units, configuration and the coordinator's state
#     are gone.
#
# The root gets a mount namespace of its own (proc, dev), gone with it.
# LYNX_DEB_DIR: where the .deb files are (default: BIN/../packages, made
# by `make deb`; built here with cpack when missing). It fetches a Debian
# root over the network and mounts in it: it runs only when asked
# (LYNX_TEST_EXTRA=host, as CI does; docs/testing.md).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

IT_DEADLINE_S=560
it_init deb_install
it_extra host "fetches a Debian root from the network and mounts in it"
it_require debootstrap sockperf unshare chroot curl
((EUID == 0)) || skip "a root file system needs root (running as uid $EUID)"
[[ ${LYNX_SANITIZED:-0} == 1 ]] &&
  skip "a sanitizer build: packages are made of the release build (make deb)"
pick_ports COORD_PORT API_PORT UDP_PORT
DEBS=${LYNX_DEB_DIR:-$LYNX_BIN_DIR/../packages}
if ! compgen -G "$DEBS/lynx-agent_*.deb" >/dev/null; then
  log "no packages in $DEBS: cpack -G DEB in $LYNX_BIN_DIR/.."
  (cd "$LYNX_BIN_DIR/.." && cpack -G DEB >"$IT_DIR/cpack.log" 2>&1) ||
    { cat "$IT_DIR/cpack.log"; fail "cpack -G DEB failed"; }
fi
PKGS=(lynx-coordinator lynx-agent lynx-frontend lynxctl)

# ---- 1. a clean Debian 12 root --------------------------------------------
ROOT=$IT_DIR/root
MIRROR=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)
MIRROR=${MIRROR:-http://deb.debian.org/debian}
t0=$(now_ms)
curl -sf -o /dev/null --max-time "$(ts_s 20)" "$MIRROR/dists/bookworm/Release" ||
  skip "the Debian mirror $MIRROR cannot be reached (no network): no root to install into"
if ! debootstrap --variant=minbase bookworm "$ROOT" "$MIRROR" >"$IT_DIR/debootstrap.log" 2>&1; then
  tail -n 20 "$IT_DIR/debootstrap.log"
  fail "debootstrap could not make a bookworm root from $MIRROR, which answers (above: its log's end)"
fi
log "ok: a minbase bookworm root in $(($(now_ms) - t0)) ms"

# in_root CMD...: CMD inside the root, with /proc and /dev mounted in a
# mount namespace of its own (the host's network: loopback is shared).
IN_ROOT=(unshare -m --propagation private sh -c '
    r=$1; shift
    mount -t proc proc "$r/proc" && mount --rbind /dev "$r/dev" &&
      exec chroot "$r" "$@"' sh)
in_root() { "${IN_ROOT[@]}" "$ROOT" "$@"; }

# ---- 2. installed with apt ----------------------------------------------------
mkdir -p "$ROOT/tmp/debs"
for p in "${PKGS[@]}"; do cp "$DEBS/${p}_"*.deb "$ROOT/tmp/debs/"; done
in_root apt-get update >"$IT_DIR/apt-update.log" 2>&1 ||
  { tail "$IT_DIR/apt-update.log"; fail "apt-get update in the root failed"; }
in_root sh -c 'DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends /tmp/debs/*.deb' \
  >"$IT_DIR/apt-install.log" 2>&1 ||
  { tail -n 30 "$IT_DIR/apt-install.log"; fail "apt-get install of the packages failed"; }
for p in "${PKGS[@]}"; do
  assert_str "$(in_root dpkg-query -W -f='${Status}' "$p")" "install ok installed" "$p's status"
done
in_root getent passwd lynx >/dev/null || fail "no lynx user after the install"
for d in coordinator agent frontend; do
  [[ -x $ROOT/usr/bin/lynx-$d ]] || fail "no /usr/bin/lynx-$d"
  [[ -f $ROOT/usr/lib/systemd/system/lynx-$d.service ]] || fail "no lynx-$d.service"
  in_root dpkg-query -W -f='${Conffiles}' "lynx-$d" | grep -q "/etc/lynx/$d.conf" ||
    fail "/etc/lynx/$d.conf is not a conffile of lynx-$d"
done
[[ -x $ROOT/usr/bin/lynxctl ]] || fail "no /usr/bin/lynxctl"
log "ok: the four packages installed, the lynx user made, programs, units and conffiles in place"

# ---- 3. the daemons as the units start them -----------------------------------
# the operator's edit: this test's ports, the frontend on loopback
sed -i "s/^listen = .*/listen = 127.0.0.1:$COORD_PORT/; s/^http = .*/http = 127.0.0.1:$API_PORT/" \
  "$ROOT/etc/lynx/coordinator.conf"
sed -i "s/^coordinator = .*/coordinator = 127.0.0.1:$COORD_PORT/" \
  "$ROOT/etc/lynx/agent.conf" "$ROOT/etc/lynx/frontend.conf"
echo "node-id = $IT_NODE" >>"$ROOT/etc/lynx/agent.conf"
mkdir -p "$ROOT/var/lib/lynx" # what StateDirectory=lynx makes
in_root chown lynx:lynx /var/lib/lynx
chmod 0750 "$ROOT/var/lib/lynx"

exec_start() { sed -n 's/^ExecStart=//p' "$ROOT/usr/lib/systemd/system/lynx-$1.service"; }
start_unit() { # NAME: its ExecStart line, as User=lynx, in the background
  local cmd
  cmd=$(exec_start "$1")
  # (not through the function: $! must be unshare's pid, which sh,
  # chroot and setpriv exec on to the daemon)
  # shellcheck disable=SC2086 # the ExecStart line's words
  "${IN_ROOT[@]}" "$ROOT" setpriv --reuid=lynx --regid=lynx --init-groups $cmd \
    >"$IT_DIR/unit-$1.log" 2>&1 </dev/null &
  UNIT_PID[$1]=$!
  track $! "lynx-$1 (root)"
  log "started lynx-$1 in the root: $cmd"
}
declare -A UNIT_PID=()
start_unit coordinator
wait_log "$IT_DIR/unit-coordinator.log" "serving control on" 15
start_unit agent
wait_log "$IT_DIR/unit-agent.log" "registered with coordinator" 15
start_unit frontend
wait_log "$IT_DIR/unit-frontend.log" " applied" 15
in_root lynxctl --api "http://127.0.0.1:$API_PORT" service create --name echo \
  --port "$UDP_PORT" --app sockperf-echo --placement all >"$IT_DIR/create.out" 2>&1 ||
  { cat "$IT_DIR/create.out"; fail "lynxctl service create in the root failed"; }
wait_log "$IT_DIR/unit-frontend.log" "serving service echo" 15
out=$IT_DIR/pingpong.out
run_sockperf "$out" ping-pong -i 127.0.0.1 -p "$UDP_PORT" -m 64 -t 1
check_sockperf "$out"
[[ -f $ROOT/var/lib/lynx/state.json ]] || fail "the coordinator kept no state in /var/lib/lynx"
assert_str "$(stat -c %u "$ROOT/var/lib/lynx/state.json")" "$(in_root getent passwd lynx | cut -d: -f3)" \
  "owner (uid) of /var/lib/lynx/state.json"
for d in frontend agent coordinator; do
  stop "${UNIT_PID[$d]}" 10
  assert_eq "$WAIT_RC" 0 "lynx-$d (as its unit starts it) exit status on SIGTERM"
done

# ---- 4. purged ------------------------------------------------------------------
in_root sh -c 'DEBIAN_FRONTEND=noninteractive apt-get purge -y lynx-coordinator lynx-agent lynx-frontend lynxctl' \
  >"$IT_DIR/apt-purge.log" 2>&1 ||
  { tail -n 20 "$IT_DIR/apt-purge.log"; fail "apt-get purge failed"; }
for f in usr/bin/lynx-coordinator usr/bin/lynx-agent usr/bin/lynx-frontend usr/bin/lynxctl \
  usr/lib/systemd/system/lynx-agent.service etc/lynx/agent.conf var/lib/lynx; do
  [[ ! -e $ROOT/$f ]] || fail "/$f is still there after the purge"
done
log "ok: purged: programs, units, configuration files and /var/lib/lynx gone (the lynx user stays, as Debian keeps system users)"
it_done
