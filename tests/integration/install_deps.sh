#!/usr/bin/env bash
# install_deps: deploy/install-deps.sh while another package manager holds
# the dpkg lock (unattended-upgrades at boot, an apt in another terminal)
# waits for it and then succeeds, instead of failing at once. The lock is
# held the way apt and dpkg hold it (an fcntl write lock on
# /var/lib/dpkg/lock-frontend) until the script's `apt-get install` has
# been running for 3 s (apt tries the lock once a second), so the test does
# not race apt on a loaded machine; `--all build` makes it hand apt the
# build's package list (part of every target's: whichever make goal built
# this, those are installed), installed packages left at their version, so
# apt runs (and needs the lock) on a ready machine too, without the network.
#
# Passing: the script succeeds, took at least those 3 s, and apt never
# failed on the lock (no "E:" line: the script's fallback, `apt-get update`
# and a second try, would otherwise hide an apt that gave up at once). apt
# usually says "Waiting for cache lock: ... held by process N" meanwhile,
# but not always: in a full suite run here it waited 60 s without a word
# (and most likely so in CI), so that line is logged, not required.
#
# It takes the machine's dpkg lock and runs apt: it runs only when asked
# (LYNX_TEST_EXTRA=host, as CI does; docs/testing.md).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

it_init install_deps
it_extra host "takes the machine's dpkg lock and runs apt-get install"
it_require python3 apt-get dpkg-query
[[ $(id -u) -eq 0 ]] || skip "needs root to take the dpkg lock and run apt-get"
LOCK=/var/lib/dpkg/lock-frontend
[[ -e $LOCK ]] || skip "no $LOCK: not a Debian-like system"
SCRIPT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../deploy" && pwd)/install-deps.sh
HOLD_S=3

python3 - "$LOCK" "$IT_DIR/locked" "$IT_DIR/apt-seen" "$HOLD_S" <<'PY' &
import fcntl, os, sys, time
f = open(sys.argv[1], "w")
# another package manager at work (unattended-upgrades at boot): wait for
# it, as apt would, rather than skip
fcntl.lockf(f, fcntl.LOCK_EX)
open(sys.argv[2], "w").close()

def apt_install_running():
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"apt-get" and b"install" in argv:
            return True
    return False

end = time.monotonic() + 60
while time.monotonic() < end and not apt_install_running():
    time.sleep(0.05)
open(sys.argv[3], "w").close()
time.sleep(float(sys.argv[4]))
PY
HOLDER=$!
track "$HOLDER" lock-holder
end=$(($(now_ms) + $(ts_ms 60000)))
until [[ -e $IT_DIR/locked ]]; do
  is_alive "$HOLDER" || fail "the lock holder could not take $LOCK"
  (($(now_ms) < end)) || fail "$LOCK stayed held by another package manager for $(ts_s 60) s"
  sleep 0.05
done
t0=$(now_ms)
LYNX_APT_LOCK_WAIT=60 timeout -k 5 "$(ts_s 120)" bash "$SCRIPT" --all build >"$IT_DIR/out.txt" 2>&1
rc=$?
took=$(($(now_ms) - t0))
cat "$IT_DIR/out.txt" >&2
if grep -q '^E: ' "$IT_DIR/out.txt"; then
  it_check_failed "apt failed on the held lock instead of waiting for it: $(grep '^E: ' "$IT_DIR/out.txt")"
fi
assert_eq "$rc" 0 "install-deps.sh --all build exit status with the lock held ${HOLD_S} s into its apt-get install"
[[ -e $IT_DIR/apt-seen ]] || it_check_failed "the lock holder never saw apt-get install run"
assert_ge "$took" $((HOLD_S * 1000)) "ms install-deps.sh took (it waited for the lock)"
if grep -q 'Could not get lock' "$IT_DIR/out.txt"; then
  log "apt said who held the lock: $(grep -m1 -o 'Could not get lock.*' "$IT_DIR/out.txt")"
else
  log "apt waited without saying so (it does not always)"
fi
wait_exit "$HOLDER" 10
exit 0
